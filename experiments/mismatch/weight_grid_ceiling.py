"""How much of the `int8` sampler's mismatch is the weights' 8-bit grid, and what would a finer one buy?

The dense float32 sampler writes 4 x 1,024 tokens of the bench's story prompt (batch rows, seed 0,
temperature 1: the bench's mismatch tokens). Then the same HF model, its decoder linears' weights
replaced by a rounded copy and its activations left in float (weight-only: the ceiling of any W8A8
sampler on that weight grid), is teacher-forced on them; α = Σ_x min(p, q) per token, mean over
the 4,092 predicted tokens (as `sparserl.bench.mismatch`, there on the quantized sampler's own
tokens). Roundings:

- per output channel, 8 bits (`int8` and `int8_group`'s weights: s_o = max|W_o| / 127);
- per group of 64 / 32 inputs, 8 bits (a scale per (output, group));
- GPTQ (Frantar et al. 2022, arXiv 2210.17323) on the per-channel grid: columns rounded in order of
  decreasing H_jj, each one's error spread over the columns not yet rounded through the Cholesky
  factor of H⁻¹, H = XᵀX + 1% mean(diag) I from 2,048 tokens of GSM8K question + answer text
  (the test file's last 80 problems; a probe, not a calibration the library ships), blocks of 128;
- per-channel rounding of only some linears (one kind, or five layers), the rest float: where the
  mismatch comes from.

    python3 experiments/mismatch/weight_grid_ceiling.py

Results: docs/results/smoothquant.md.
"""

import json
import time
from pathlib import Path

import torch

from sparserl.models.loading import load_model
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.profile import BENCH_PROMPT
from sparserl.rollout.sampling import SamplingParams

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "gsm8k" / "test.jsonl"


def round_per_channel(w, qmax=127, group=None):
    if group:
        wg = w.reshape(w.shape[0], -1, group)
        s = wg.abs().amax(-1, keepdim=True) / qmax
        return (torch.round(wg / s).clamp(-qmax, qmax) * s).reshape(w.shape)
    s = w.abs().amax(1, keepdim=True) / qmax
    return torch.round(w / s).clamp(-qmax, qmax) * s


def gptq(w, hessian, qmax=127, block=128, damp=0.01):
    """GPTQ's rounding of ``w`` [out, in] onto the per-channel grid of :func:`round_per_channel`."""
    w, h = w.float().clone(), hessian.float().clone()
    n = w.shape[1]
    s = (w.abs().amax(1) / qmax)[:, None]
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    perm = torch.argsort(torch.diag(h), descending=True)
    w, h = w[:, perm], h[perm][:, perm]
    h += damp * torch.diag(h).mean() * torch.eye(n)
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    q = torch.zeros_like(w)
    for i1 in range(0, n, block):
        i2 = min(i1 + block, n)
        w1, err, u1 = w[:, i1:i2].clone(), torch.zeros(w.shape[0], i2 - i1), u[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = w1[:, i]
            q[:, i1 + i] = (torch.round(col[:, None] / s).clamp(-qmax, qmax) * s)[:, 0]
            e = (col - q[:, i1 + i]) / u1[i, i]
            w1[:, i:] -= e[:, None] * u1[i, i:][None, :]
            err[:, i] = e
        w[:, i2:] -= err @ u[i1:i2, i2:]
    out = torch.empty_like(q)
    out[:, perm] = q
    return out


def main():
    torch.manual_seed(0)
    lm = load_model("smollm2", dtype=torch.float32)
    model, tok = lm.model, lm.tokenizer
    engine = RolloutEngine(lm, build_compressor("none"), dtype=torch.float32)
    out = engine.generate([BENCH_PROMPT], SamplingParams(n=4, max_new_tokens=1024, ignore_eos=True, seed=0))
    seq = torch.tensor([out.prompt_ids[0] + r for r in out.response_ids])
    n_prompt = len(out.prompt_ids[0])

    @torch.no_grad()
    def logp():
        return torch.log_softmax(model(seq).logits[:, n_prompt:-1].float(), -1)

    ref = logp()
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n}
    original = {n: m.weight.data.clone() for n, m in linears.items()}
    layer_of = {n: int(n.split(".layers.")[1].split(".")[0]) for n in linears}

    def alpha(label, rounded):
        for n, m in linears.items():
            m.weight.data.copy_(rounded.get(n, original[n]))
        a = float(torch.minimum(ref, logp()).exp().sum(-1).mean())
        for n, m in linears.items():
            m.weight.data.copy_(original[n])
        print(f"{label:48s} alpha {a:.4f}", flush=True)

    per_channel = {n: round_per_channel(w) for n, w in original.items()}
    alpha("float32 (the reference itself)", {})
    alpha("8-bit per output channel (int8's weights)", per_channel)
    for g in (64, 32):
        alpha(f"8-bit per group of {g} inputs", {n: round_per_channel(w, group=g) for n, w in original.items()})

    rows = [json.loads(line) for line in DATA.open()][-80:]
    ids = tok("\n".join(r["question"] + " " + r["answer"] for r in rows), add_special_tokens=False)["input_ids"][:2048]
    ids = torch.tensor(ids)[None]
    hessians = {}

    def observe(name):
        def hook(module, inputs, output):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).double()
            hessians[name] = hessians.get(name, 0) + x.T @ x

        return hook

    hooks = [m.register_forward_hook(observe(n)) for n, m in linears.items()]
    with torch.no_grad():
        for i in range(0, ids.shape[1], 512):
            model(ids[:, i : i + 512])
    for h in hooks:
        h.remove()
    t0 = time.perf_counter()
    rounded = {n: gptq(w, hessians[n]) for n, w in original.items()}
    print(f"GPTQ over {len(rounded)} linears: {time.perf_counter() - t0:.1f} s", flush=True)
    alpha(f"GPTQ, 8-bit per output channel ({ids.shape[1]} calibration tokens)", rounded)

    for kind in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        alpha(f"per channel, only {kind}", {n: w for n, w in per_channel.items() if n.endswith(kind)})
    n_layers = max(layer_of.values()) + 1
    for lo in range(0, n_layers, 5):
        alpha(
            f"per channel, only layers {lo}-{min(lo + 4, n_layers - 1)}",
            {n: w for n, w in per_channel.items() if lo <= layer_of[n] < lo + 5},
        )


if __name__ == "__main__":
    main()
