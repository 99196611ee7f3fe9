"""The default of ``train.max_tokens_per_micro_batch``: one update (forward + backward over every
micro-batch, then AdamW) of the embedded SmolLM2-135M on a synthetic long-reasoning batch, timed, with the
process's peak RSS, per token budget, with and without gradient checkpointing; and the update's forward
through the chunked LM head against ``logits_to_keep`` full logits, on one micro-batch.

    nice -n 5 python3 experiments/training/micro_batch_tokens.py --out /tmp/micro_batch_tokens.json

The batch: 4 prompts of 90-110 tokens x 8 responses of 300-1024 random tokens (seeded), laid out as the
trainer's (:meth:`sparserl.batch.RolloutBatch.from_rollout`), 32 x ~1,100 columns; learner float32 with
bfloat16 autocast (what ``model.mixed_precision: auto`` picks on this CPU). The loss: PPO's clipped
surrogate at ratio 1 (the gradient of ``-A·log p``, token-mean over the batch) with the entropy computed,
as the update does; by default only the first micro-batch (the longest rows, where the peak is) runs
and the whole update's time is extrapolated from its seconds per computed token (``--micro-batches all``:
every one). Each configuration runs in its own process (``--one``), so ``ru_maxrss`` is its own peak; a
configuration whose peak, extrapolated from the smaller budgets' (linear in the budget), would pass
``--max-rss-gb`` is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

BUDGETS = (4096, 8192, 16384, 32768)


def synthetic_batch(seed: int = 0, prompts: int = 4, n: int = 8, vocab: int = 49152):
    """The RolloutBatch of the module docstring."""
    import torch

    from sparserl.batch import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    p_ids, r_ids, groups = [], [], []
    for gi in range(prompts):
        p = torch.randint(10, vocab, (int(torch.randint(90, 111, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n):
            length = int(torch.randint(300, 1025, (1,), generator=g))
            p_ids.append(p)
            r_ids.append(torch.randint(10, vocab, (length,), generator=g).tolist())
            groups.append(gi)
    batch = RolloutBatch.from_rollout(p_ids, r_ids, [[0.0] * len(r) for r in r_ids], groups)
    batch.advantages = torch.randn(batch.size, generator=g)
    return batch


def rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # Linux: KiB


def one(budget: int | None, checkpointing: bool, head: str, micro_batches_run: int | None) -> dict:
    """One configuration in this process: its update's time and the process's peak RSS."""
    import torch

    from sparserl.models.loading import load_model
    from sparserl.models.mixed_precision import autocast_for
    from sparserl.packing import RowLengths, micro_batch_tokens
    from sparserl.score import forward_response, forward_response_shared
    from sparserl.score.dense import micro_batches
    from sparserl.score.shared_prompt import shares_prompt_with_grad
    from sparserl.train.gradient_checkpointing import use_gradient_checkpointing

    torch.manual_seed(0)
    model = load_model("smollm2-135m", dtype="float32").model.train()
    use_gradient_checkpointing(model, checkpointing)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    batch = synthetic_batch()
    shared = shares_prompt_with_grad(model, True) and head == "chunked"  # chunked-rows / logits: every row whole
    parts = micro_batches(batch, batch.size, budget, shared)
    lengths = RowLengths.of_batch(batch)
    tokens_all = sum(micro_batch_tokens(lengths, p, shared) for p in parts)
    all_parts = len(parts)
    if micro_batches_run is not None:
        parts = parts[:micro_batches_run]
    tokens_run = sum(micro_batch_tokens(lengths, p, shared) for p in parts)
    tokens_total = int(batch.response_mask.sum())
    loaded = rss_gb()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    for rows in parts:
        with autocast_for("bfloat16", torch.device("cpu")):
            if head in ("chunked", "chunked-rows"):  # the hidden states through the chunked head (custom backward)
                forward = forward_response_shared if shared else forward_response
                kw = {"return_hidden": True} if not shared else {}
                out = forward(model, batch, rows, return_entropy=True, **kw)
                lp, ent = out[0], out[1]
            else:  # logits_to_keep: [n, T+1, V] logits kept for autograd
                lp, ent = forward_response(model, batch, rows, return_entropy=True)
        mask = batch.response_mask[rows]
        loss = -(lp * batch.advantages[rows, None] * mask).sum() / tokens_total
        loss.backward()
        del lp, ent, loss
    fb = time.perf_counter() - t0
    opt.step()
    total = time.perf_counter() - t0
    return {
        "budget": budget,
        "checkpointing": checkpointing,
        "head": head,
        "shared_prompt": shared,
        "micro_batches": all_parts,
        "micro_batches_run": len(parts),
        "rows_run": [len(p) for p in parts],
        "tokens_run": tokens_run,
        "tokens_all": tokens_all,
        "forward_backward_s": round(fb, 1),
        "adamw_s": round(total - fb, 1),
        "s_per_1k_tokens": round(fb / tokens_run * 1000, 3),
        "update_s_extrapolated": round(fb / tokens_run * tokens_all + (total - fb), 1),
        "rss_after_load_gb": round(loaded, 2),
        "peak_rss_gb": round(rss_gb(), 2),
    }


def run_child(args: list[str], timeout: int) -> dict | None:
    cmd = [sys.executable, __file__, "--one", *args]
    print("$", " ".join(cmd[1:]), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        print(p.stderr[-3000:], flush=True)
        return {"args": args, "error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}
    row = json.loads(p.stdout.strip().splitlines()[-1])
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", nargs=4, metavar=("BUDGET", "CKPT", "HEAD", "MICRO"), help="(internal) one configuration")
    ap.add_argument("--out", default="/tmp/micro_batch_tokens.json")
    ap.add_argument("--max-rss-gb", type=float, default=10.0)
    ap.add_argument("--budgets", type=int, nargs="*", default=list(BUDGETS))
    ap.add_argument(
        "--configs", nargs="*", help="BUDGET:on|off pairs to run instead of every budget with and without checkpointing"
    )
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument(
        "--micro-batches",
        default="1",
        help="micro-batches of the update to run (the first: the longest rows, the peak); 'all' = the whole "
        "update. The update's time is extrapolated from their seconds per computed token",
    )
    ap.add_argument("--skip-head", action="store_true", help="skip the chunked-head / full-logits comparison")
    a = ap.parse_args()
    if a.one:
        budget, ckpt, head, micro = a.one
        row = one(
            None if budget == "none" else int(budget),
            ckpt == "on",
            head,
            None if micro == "all" else int(micro),
        )
        print(json.dumps(row))
        return
    import platform

    rows = []
    if not a.skip_head:  # one micro-batch of 4 rows (~4,400 tokens) through either head
        for head in ("chunked-rows", "logits"):
            rows.append(run_child(["4400", "off", head, "1"], a.timeout))
    for budget, ckpt in (c.split(":") for c in a.configs or []):
        rows.append(run_child([budget, ckpt, "chunked", a.micro_batches], a.timeout))
    for ckpt in ("on", "off") if not a.configs else ():
        done: list[dict] = []
        for budget in sorted(a.budgets):
            if len(done) >= 2:  # peak = base + slope x budget, from the two largest measured
                (b1, r1), (b2, r2) = [(d["budget"], d["peak_rss_gb"]) for d in done[-2:]]
                predicted = r2 + (r2 - r1) / (b2 - b1) * (budget - b2)
                if predicted > a.max_rss_gb:
                    print(f"skip budget {budget} checkpointing {ckpt}: predicted {predicted:.1f} GB", flush=True)
                    rows.append({"budget": budget, "checkpointing": ckpt == "on", "skipped_predicted_gb": predicted})
                    continue
            row = run_child([str(budget), ckpt, "chunked", a.micro_batches], a.timeout)
            rows.append(row)
            if "peak_rss_gb" in row:
                done.append(row)
    out = {"cpu": platform.processor() or platform.machine(), "threads": os.cpu_count(), "rows": rows}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
