"""Which W8A8 grid reaches α ≥ 0.97 on the bench's tokens? An emulation, in float32 on exactly the
rounded values, of the int8 samplers' roundings, before writing a kernel for one.

The dense float32 sampler writes 4 × 1,024 tokens of the bench's story prompt (seed 0); the HF model,
every decoder linear's weight and input rounded as the variant says, is teacher-forced on them, and
α = Σ_x min(p, q) is averaged over the 4,092 predicted tokens. SmoothQuant's factors come from the
sampler's calibration text (``CALIBRATION_TEXT``, as at a push); outlier channels are the inputs of
largest smoothed calibration max, kept in float. Weight grids: per output channel or per (output,
group of G inputs); activation grids: per token or per (token, group). The first rows reproduce the
bench's α for `int8` (0.914) and `int8` + SmoothQuant + 16 outliers (0.957-0.961). With ``7bit``
only the group rows on the 8-bit and on the 7-bit weight grid (|Q| ≤ 64: what AVX2 without VNNI
multiplies exactly on the unsigned-code tile).

    python3 experiments/mismatch/w8a8_grid_emulation.py [7bit]

Results: docs/results/smoothquant.md.
"""

import sys

import torch

from sparserl.models.loading import load_model
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.profile import BENCH_PROMPT
from sparserl.rollout.quant.smooth import CALIBRATION_TEXT, smoothing_factors
from sparserl.rollout.sampling import SamplingParams

torch.manual_seed(0)
lm = load_model("smollm2", dtype=torch.float32)
model = lm.model
eng = RolloutEngine(lm, build_compressor("none"), dtype=torch.float32)
out = eng.generate([BENCH_PROMPT], SamplingParams(n=4, max_new_tokens=1024, ignore_eos=True, seed=0))
seq = torch.tensor([out.prompt_ids[0] + r for r in out.response_ids])
P = len(out.prompt_ids[0])
lin = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n}
amax = {}


def obs(n):
    def h(m, inp):
        x = inp[0].detach().reshape(-1, inp[0].shape[-1]).abs().amax(0)
        amax[n] = torch.maximum(amax[n], x) if n in amax else x

    return h


hs = [m.register_forward_pre_hook(obs(n)) for n, m in lin.items()]
ids = torch.tensor(lm.tokenizer(CALIBRATION_TEXT, add_special_tokens=False)["input_ids"][:256])[None]
with torch.no_grad():
    model(ids)
for h in hs:
    h.remove()
orig = {n: m.weight.data.clone() for n, m in lin.items()}


@torch.no_grad()
def logp():
    return torch.log_softmax(model(seq).logits[:, P:-1].float(), -1)


ref = logp()


def q8(x, group=None, qmax=127):  # symmetric along last dim, per row or per group, |codes| <= qmax
    sh = x.shape
    if group:
        x = x.reshape(*sh[:-1], sh[-1] // group, group)
    s = x.abs().amax(-1, keepdim=True) / qmax
    s = torch.where(s > 0, s, torch.ones_like(s))
    return (torch.round(x / s).clamp(-qmax, qmax) * s).reshape(sh)


def run(label, wgroup, agroup, smooth, outliers=0, wqmax=127):
    hs = []
    for n, m in lin.items():
        W = orig[n]
        s = smoothing_factors(amax[n], W, smooth) if smooth else torch.ones(W.shape[1])
        Ws = W * s[None]
        am = amax[n] / s
        idx = torch.topk(am, outliers).indices if outliers else torch.tensor([], dtype=torch.long)
        keep = torch.ones(W.shape[1], dtype=torch.bool)
        keep[idx] = False
        Wq = Ws.clone()
        Wq[:, ~keep] = 0
        Wq = q8(Wq, wgroup, wqmax)  # outlier cols zero in the quantized part: scales over the rest
        Wq[:, ~keep] = Ws[:, ~keep]  # outliers float
        m.weight.data.copy_(Wq)

        def pre(mod, inp, s=s, keep=keep, ag=agroup):
            x = inp[0] / s
            xr = x.clone()
            xr[..., ~keep] = 0
            xq = q8(xr, ag)
            xq[..., ~keep] = x[..., ~keep]
            return (xq,)

        hs.append(m.register_forward_pre_hook(pre))
    a = float(torch.minimum(ref, logp()).exp().sum(-1).mean())
    for h in hs:
        h.remove()
    for n, m in lin.items():
        m.weight.data.copy_(orig[n])
    print(f"{label:60s} alpha {a:.4f}", flush=True)


if sys.argv[1:] == ["7bit"]:
    run("W g64, A g64 + SQ0.5", 64, 64, 0.5)
    run("W g64 7-bit, A g64 + SQ0.5", 64, 64, 0.5, wqmax=64)
    run("W g32 7-bit, A g32 + SQ0.5", 32, 32, 0.5, wqmax=64)
    sys.exit()
run("int8: W ch, A tok", None, None, 0)
run("int8 + SQ0.5 + 16 outliers", None, None, 0.5, 16)
run("int8_group: W ch, A g64 + SQ0.5", None, 64, 0.5)
run("W g64, A tok + SQ0.5 + 16 outliers", 64, None, 0.5, 16)
run("W g64, A g64 + SQ0.5", 64, 64, 0.5)
run("W g64, A g64 + SQ0.5 + 16 outliers", 64, 64, 0.5, 16)
run("W g32, A g32 + SQ0.5", 32, 32, 0.5)
run("W ch, A g32 + SQ0.5", None, 32, 0.5)
