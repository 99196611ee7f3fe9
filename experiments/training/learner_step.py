"""Time the learner's two passes on a batch shaped like the default job, plain against shared-prompt.

The batch: 4 arith prompts under the default system prompt and SmolLM2's chat template (~80 tokens
each), 8 responses per prompt of 30-48 random tokens (mean ~40); the real default model
(``smollm2-135m``, float32). Per mode, after one warm-up of each, the two passes alternating in rounds
(:func:`sparserl.bench.measure.time_rounds`):

- ``score``: :func:`sparserl.score.score_logprobs` (no grad, micro-batches of 16) -- median of 3;
- ``update``: one optimizer step as the trainer takes it: micro-batches of 16 through the mode's
  forward (log-probs and entropy), the PPO-clip loss, backward, grad-norm clip, AdamW -- median of 3;
- ``peak_rss_above_base_mib``: the process's peak resident memory above what it held with the model,
  its gradients' and Adam's state allocated (each mode runs in its own process).

Modes: ``plain`` (forward_response: every row whole, full-vocabulary logits), ``shared`` (each prompt
once, chunked LM head), ``shared_plain_head`` (each prompt once, full-vocabulary logits: what the
chunked head alone adds).

    flock /work/exp/cpu.lock python3 experiments/training/learner_step.py --mode plain --out /tmp/ls_plain.json
    python3 experiments/training/learner_step.py --table /tmp/ls_plain.json /tmp/ls_shared.json ...
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys

import torch

from sparserl.bench.measure import time_rounds

MODES = ("plain", "shared", "shared_plain_head")
SYSTEM_PROMPT = (
    "You are a careful math tutor. Read the problem, add or subtract the numbers it gives, and reply "
    "with one short sentence that ends with the final answer as a number in \\boxed{}."
)


def default_like_batch(tokenizer, prompts: int = 4, n: int = 8, seed: int = 0):
    from sparserl.batch import RolloutBatch
    from sparserl.data import load_dataset

    examples = list(load_dataset("arith", system_prompt=SYSTEM_PROMPT, limit=prompts))
    g = torch.Generator().manual_seed(seed)
    prompt_ids, responses, groups = [], [], []
    for gi, ex in enumerate(examples):
        ids = tokenizer.apply_chat_template(ex.prompt, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        for _ in range(n):
            length = int(torch.randint(30, 49, (1,), generator=g))
            prompt_ids.append(ids)
            responses.append(torch.randint(100, len(tokenizer), (length,), generator=g).tolist())
            groups.append(gi)
    batch = RolloutBatch.from_rollout(
        prompt_ids, responses, [[0.0] * len(r) for r in responses], groups, pad_id=tokenizer.pad_token_id or 0
    )
    return batch, [len(p) for p in prompt_ids[::n]]


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_mode(mode: str, repeats: int = 3, micro: int = 16, model_name: str = "smollm2-135m") -> dict:
    from sparserl.models.loading import load_model
    from sparserl.score import forward_response, forward_response_shared, score_logprobs
    from sparserl.train.losses import loss_normalizers, policy_loss

    torch.manual_seed(0)
    lm = load_model(model_name, dtype="float32", device="cpu")
    model = lm.model.train()
    batch, prompt_lens = default_like_batch(lm.tokenizer)
    forward = {
        "plain": forward_response,
        "shared": forward_response_shared,
        "shared_plain_head": lambda *a, **k: forward_response_shared(*a, chunk_size=None, **k),
    }[mode]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-7, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0)
    for p in model.parameters():  # gradients and Adam's state exist before the base line is read
        p.grad = torch.zeros_like(p)
    opt.step()
    base = peak_rss_mib()
    mask = batch.response_mask
    adv = torch.randn(batch.size, generator=torch.Generator().manual_seed(1))

    def score():
        if mode == "shared_plain_head":  # score_logprobs has no switch for the plain head
            model.eval()
            with torch.no_grad():
                return (
                    torch.cat([forward(model, batch, slice(s, s + micro))[0] for s in range(0, batch.size, micro)])
                    * mask
                )
        return score_logprobs(model, batch, micro, 1.0, shared_prompt=mode == "shared")

    old = score()

    def update():
        model.train()
        norms = loss_normalizers(mask, "seq_mean_token_mean", max_len=48)
        opt.zero_grad(set_to_none=True)
        for s in range(0, batch.size, micro):
            r = slice(s, s + micro)
            lp, ent = forward(model, batch, r, return_entropy=True, entropy_grad=False, temperature=1.0)
            loss, _ = policy_loss(lp, old[r], adv[r], mask[r], **norms)
            loss.backward()
            float((ent * mask[r]).sum())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    res = time_rounds({"score": score, "update": update}, repeats, warmup=1)
    score_s, update_s = res.seconds["score"], res.seconds["update"]
    N, L = batch.input_ids.shape
    T = batch.response_ids.shape[1]
    return {
        "mode": mode,
        "model": model_name,
        "score_s": score_s,
        "score_median_s": statistics.median(score_s),
        "update_s": update_s,
        "update_median_s": statistics.median(update_s),
        "peak_rss_mib": peak_rss_mib(),
        "base_rss_mib": base,
        "peak_rss_above_base_mib": peak_rss_mib() - base,
        "batch": {
            "sequences": N,
            "columns": L,
            "response_columns": T,
            "prompt_tokens": prompt_lens,
            "response_tokens_mean": float(mask.sum(-1).mean()),
            "micro_batch": micro,
        },
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def table(paths: list[str]) -> str:
    rows = [json.loads(open(p).read()) for p in paths]
    base = next((r for r in rows if r["mode"] == "plain"), rows[0])
    lines = [
        (
            "| mode | score_logprobs (s) | update (s) | score + update (s) | vs plain | "
            "peak RSS above model+grads+Adam (MiB) |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        tot = r["score_median_s"] + r["update_median_s"]
        ref = base["score_median_s"] + base["update_median_s"]
        lines.append(
            f"| {r['mode']} | {r['score_median_s']:.2f} ({', '.join(f'{x:.2f}' for x in r['score_s'])}) | "
            f"{r['update_median_s']:.2f} ({', '.join(f'{x:.2f}' for x in r['update_s'])}) | {tot:.2f} | "
            f"{tot / ref:.2f}x | {r['peak_rss_above_base_mib']:.0f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=MODES)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="smollm2-135m", help="tiny for a smoke test")
    ap.add_argument("--out")
    ap.add_argument("--table", nargs="+", help="JSON files of earlier runs: print the markdown table")
    a = ap.parse_args(argv)
    if a.table:
        print(table(a.table))
        return 0
    if not a.mode:
        ap.error("give --mode or --table")
    res = run_mode(a.mode, a.repeats, model_name=a.model)
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        open(a.out, "w").write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
