"""QuRL's invariant scaling on the default model: how much of one real AdamW step an INT8 sampler sees.

For each ``s``: load SmolLM2-135M (float32), fold ``s`` into its RMSNorms
(:func:`sparserl.models.invariant_scaling.apply_invariant_scaling`), check the logits did not move,
take one AdamW step (the default config's lr 3e-5, betas (0.9, 0.98), eps 1e-8, no weight decay,
grad-norm clip 1.0) on the negative log-likelihood of a fixed short text, and report
``quant/update_visible_frac`` (:func:`sparserl.train.update_visible.update_visible_frac`, INT8
per-output-channel codes of :func:`sparserl.rollout.quant.int8.quantize_int8_per_channel`) over every
decoder linear weight, and split into the weights ``s`` rescales (q/k/v/gate/up) and the rest
(o/down). Then the metric's cost: the snapshot of the quantized weights and the metric over the whole
model, and the metric on one [1536, 576] weight (median of 5).

    flock /work/exp/cpu.lock python3 experiments/training/invariant_scaling.py --out /tmp/invariant_scaling.json
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch

from sparserl.bench.measure import time_rounds

TEXT = (
    "Tom has 17 apples. He gives 5 apples to his sister and buys 8 more at the market. "
    "How many apples does Tom have now? Tom has 17 - 5 + 8 = 20 apples, so the answer is \\boxed{20}."
)
RESCALED = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def one_step(model, ids: torch.Tensor, lr: float) -> dict:
    from sparserl.train.update_visible import quantized_weight_snapshot, update_visible_frac

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    t0 = time.perf_counter()
    before = quantized_weight_snapshot(model)
    snapshot_s = time.perf_counter() - t0
    opt.step()
    after = dict(model.named_parameters())
    t0 = time.perf_counter()
    frac = update_visible_frac(before, after)
    metric_s = time.perf_counter() - t0
    rescaled = {n: t for n, t in before.items() if any(f"{p}.weight" in n for p in RESCALED)}
    rest = {n: t for n, t in before.items() if n not in rescaled}
    changed = sum(int((after[n] != b).sum()) for n, b in before.items())
    total = sum(b.numel() for b in before.values())
    return {
        "loss": float(loss.detach()),
        "grad_norm": grad_norm,
        "update_visible_frac": frac,
        "update_visible_frac_qkv_gate_up": update_visible_frac(rescaled, after),
        "update_visible_frac_o_down": update_visible_frac(rest, after),
        "changed_frac": changed / total,
        "quantized_elements": total,
        "snapshot_s": snapshot_s,
        "metric_s": metric_s,
    }


def metric_cost(repeats: int = 5) -> dict:
    from sparserl.rollout.quant.int8 import quantize_int8_per_channel
    from sparserl.train.update_visible import update_visible_frac

    g = torch.Generator().manual_seed(0)
    w = 0.02 * torch.randn(1536, 576, generator=g)
    name = "model.layers.0.mlp.gate_proj.weight"
    before, after = {name: w}, {name: w + 3e-5 * torch.sign(torch.randn(w.shape, generator=g))}
    res = time_rounds(
        {"metric": lambda: update_visible_frac(before, after), "quantize": lambda: quantize_int8_per_channel(w)},
        repeats,
    )
    return {
        "shape": [1536, 576],
        "metric_ms": 1e3 * res.median("metric"),
        "quantize_ms": 1e3 * res.median("quantize"),
        "threads": torch.get_num_threads(),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--scales", default="1,1.5")
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from sparserl.models.invariant_scaling import apply_invariant_scaling
    from sparserl.models.loading import load_model

    torch.manual_seed(0)
    lm = load_model(args.model, dtype="float32")
    ids = torch.tensor([lm.tokenizer(TEXT)["input_ids"]])
    with torch.no_grad():
        ref = lm.model.eval()(input_ids=ids).logits
    rows = []
    for s in (float(x) for x in args.scales.split(",")):
        model = copy.deepcopy(lm.model)
        apply_invariant_scaling(model, s)
        with torch.no_grad():
            diff = float((model.eval()(input_ids=ids).logits - ref).abs().max())
        row = {"s": s, "tokens": ids.shape[1], "logits_max_abs_diff": diff, **one_step(model, ids, args.lr)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del model
    cost = metric_cost()
    print(json.dumps(cost), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "lr": args.lr, "rows": rows, "cost": cost}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
