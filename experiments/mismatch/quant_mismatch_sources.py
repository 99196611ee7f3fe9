"""Where does the int8 sampler's mismatch come from? Teacher-forced acceptance α = Σ_x min(p, q) of
sampler variants against the dense float32 sampler on real text (8 GSM8K questions with their
solutions, 160 tokens each, α over positions 20-159): one projection quantized at a time, weights
only at 7 and 8 bits, SmoothQuant at several strengths (calibrated on 16 other GSM8K texts), W8A7,
the exact symmetric W8A8 of the CUDA path, the LM head, and activation scales per token and group of
G inputs (``int8_group``'s maths, emulated in float: G = 192 / 64 / 32, 7- and 8-bit weights, weight
scales per channel or per channel and group of G, one projection at a time, SmoothQuant strengths,
the LM head on the same maths), and the sampler itself with SmoothQuant and outlier channels in
float32 (``sampler ...`` cases: rollout.quant_smooth, rollout.quant_outliers, calibrated as at a push).
Results: docs/results/smoothquant.md.

    python3 experiments/mismatch/quant_mismatch_sources.py            # every case (~2 min on 2 cores)
    python3 experiments/mismatch/quant_mismatch_sources.py "smooth 0.5" "sym"   # some
    python3 experiments/mismatch/quant_mismatch_sources.py "sampler int8" "sampler int8 outliers 16"
"""

import copy
import json
import sys
import time

import torch

from sparserl.models.loading import load_model
from sparserl.rollout.model import SamplerModel
from sparserl.rollout.quant.base import QuantizedLinear
from sparserl.rollout.quant.int8 import (
    QMAX_FBGEMM,
    Int8Linear,
    _fbgemm_prepack,
    int8_matmul_per_token,
    quantize_int8_per_channel,
)
from sparserl.rollout.quant.smooth import CALIBRATION_TEXT, CALIBRATION_TOKENS

torch.manual_seed(0)
lm = load_model("smollm2-135m", dtype="float32")
tok = lm.tokenizer
rows = [json.loads(l) for l in open("../shared/data/gsm8k/test.jsonl")]
texts = [r["question"] + "\n" + r["answer"] for r in rows]


def batch(ts, P=160):
    ids = [tok(t)["input_ids"][:P] for t in ts]
    ids = [i + [tok.eos_token_id or 0] * (P - len(i)) for i in ids]
    return torch.tensor(ids)


calib = batch(texts[100:116])
evalb = batch(texts[:8])

dense = SamplerModel(lm.model, torch.float32, pack_weights=False)
FIELDS = ("qkv", "o", "gate_up", "down")


class Rec(QuantizedLinear):
    def __init__(self, w):
        super().__init__(*w.shape)
        self.w = w
        self.amax = torch.zeros(w.shape[1])

    def matmul(self, x2):
        self.amax = torch.maximum(self.amax, x2.abs().amax(0))
        return x2 @ self.w.t()


class Smooth(QuantizedLinear):
    def __init__(self, inner, inv_s):
        super().__init__(*inner.shape)
        self.inner, self.inv_s = inner, inv_s

    def matmul(self, x2):
        return self.inner.matmul(x2 * self.inv_s)


def run(model, ids):
    valid = torch.ones_like(ids, dtype=torch.bool)
    pos = torch.arange(ids.shape[1])[None].expand_as(ids)
    h = model.hidden_states(ids, valid, pos)
    return torch.log_softmax(model.logits(h).float(), -1)


# calibration stats
rec = copy.copy(dense)
rec.layers = [copy.copy(lw) for lw in dense.layers]
for lw in rec.layers:
    for f in FIELDS:
        setattr(lw, f, Rec(getattr(lw, f)))
run(rec, calib)
stats = [{f: getattr(lw, f).amax.clone() for f in FIELDS} for lw in rec.layers]
for f in FIELDS:
    r = torch.stack([st[f].max() / st[f].median() for st in stats])
    print(f"act max/median per-channel amax, {f}: mean {r.mean():.1f} max {r.max():.1f}")

ref = run(dense, evalb)


class W8A7(QuantizedLinear):
    def __init__(self, q, s):
        super().__init__(*q.shape)
        self.packed = _fbgemm_prepack(q, s)

    def matmul(self, x2):
        m = x2.abs().amax(-1, keepdim=True).clamp(min=1e-30)
        return torch.ops.quantized.linear_dynamic(x2 / m, self.packed, True) * m


class Sym(QuantizedLinear):
    def __init__(self, q, s):
        super().__init__(*q.shape)
        self.q, self.s = q, s

    def matmul(self, x2):
        return int8_matmul_per_token(x2, self.q.t(), self.s)


KERN = {"w7a8": (Int8Linear, QMAX_FBGEMM), "w8a7": (W8A7, 127), "sym": (Sym, 127)}


class Grouped(QuantizedLinear):
    """Fake-quantized: per-channel weights on a grid of ``qm``, activations per token and group."""

    def __init__(self, q, s, group):
        super().__init__(*q.shape)
        self.w, self.group = q.float() * s[:, None], group

    def matmul(self, x2):
        n, k = x2.shape
        xg = x2.view(n, k // self.group, self.group)
        a = xg.abs().amax(-1, keepdim=True).clamp(min=1e-30) / 127
        return (torch.round(xg / a).clamp(-127, 127) * a).view(n, k) @ self.w.t()


class GroupedW(Grouped):
    """As :class:`Grouped`, the weights too on 8 bits per output channel and group of G inputs."""

    def __init__(self, q, s, group):
        super().__init__(q, s, group)
        wg = self.w.view(q.shape[0], -1, group)
        ws = wg.abs().amax(-1, keepdim=True).clamp(min=1e-30) / 127
        self.w = (torch.round(wg / ws) * ws).view_as(self.w)


for G in (192, 64, 32):
    KERN[f"g{G}w7"] = (lambda q, s, G=G: Grouped(q, s, G), 64)
    KERN[f"g{G}w8"] = (lambda q, s, G=G: Grouped(q, s, G), 127)
    KERN[f"g{G}wg"] = (lambda q, s, G=G: GroupedW(q, s, G), 127)


def variant(fields=FIELDS, smooth=0.0, wonly_bits=None, head=False, kern="w7a8"):
    K, QM = KERN[kern]
    m = copy.copy(dense)
    m.layers = [copy.copy(lw) for lw in dense.layers]
    for lw, st in zip(m.layers, stats):
        for f in fields:
            w = getattr(lw, f)
            if wonly_bits:
                q, s = quantize_int8_per_channel(w, wonly_bits)
                setattr(lw, f, q.float() * s[:, None])
                continue
            if smooth:
                sx = st[f].clamp(min=1e-5)
                sw = w.abs().amax(0).clamp(min=1e-5)
                sc = (sx.pow(smooth) / sw.pow(1 - smooth)).clamp(min=1e-5)
                setattr(lw, f, Smooth(K(*quantize_int8_per_channel(w * sc[None], QM)), 1 / sc))
            else:
                setattr(lw, f, K(*quantize_int8_per_channel(w, QM)))
    if head is True:
        m.lm_head = Int8Linear(*quantize_int8_per_channel(dense.lm_head, QMAX_FBGEMM))
    elif head:  # a KERN name: the LM head on that kernel's maths
        HK, HQM = KERN[head]
        m.lm_head = HK(*quantize_int8_per_channel(dense.lm_head, HQM))
    return m


def alpha(m):
    lq = run(m, evalb)
    a = torch.minimum(ref, lq).exp().sum(-1)[:, 20:].flatten()
    return float(a.mean()), float(torch.quantile(a, 0.05))


cases = {
    "int8 all (W7A8, today)": dict(),
    "int8 qkv only": dict(fields=("qkv",)),
    "int8 o only": dict(fields=("o",)),
    "int8 gate_up only": dict(fields=("gate_up",)),
    "int8 down only": dict(fields=("down",)),
    "weight-only 7-bit all": dict(wonly_bits=64),
    "weight-only 8-bit all": dict(wonly_bits=127),
    "smooth 0.5": dict(smooth=0.5),
    "smooth 0.65": dict(smooth=0.65),
    "smooth 0.8": dict(smooth=0.8),
    "int8 all + head": dict(head=True),
    "head only": dict(fields=(), head=True),
    "smooth 0.3": dict(smooth=0.3),
    "smooth 0.4": dict(smooth=0.4),
    "w8a7": dict(kern="w8a7"),
    "w8a7 smooth 0.3": dict(kern="w8a7", smooth=0.3),
    "w8a7 smooth 0.5": dict(kern="w8a7", smooth=0.5),
    "sym": dict(kern="sym"),
    "sym smooth 0.5": dict(kern="sym", smooth=0.5),
    "sym smooth 0.3": dict(kern="sym", smooth=0.3),
    "group 192 W7": dict(kern="g192w7"),
    "group 64 W7": dict(kern="g64w7"),
    "group 64 W8": dict(kern="g64w8"),
    "group 64 W8 smooth 0.5": dict(kern="g64w8", smooth=0.5),
    "group 32 W8": dict(kern="g32w8"),
    "group 64 W8 per group": dict(kern="g64wg"),
    "group 64 W8 per group smooth 0.5": dict(kern="g64wg", smooth=0.5),
    "group 32 W8 per group": dict(kern="g32wg"),
    "group 64 W8 smooth 0.5 + head group 64": dict(kern="g64w8", smooth=0.5, head="g64w8"),
    "head only, group 64 W8": dict(fields=(), head="g64w8"),
    **{f"group 64 W8 smooth {a}": dict(kern="g64w8", smooth=a) for a in (0.3, 0.4, 0.6, 0.7)},
    **{f"group 32 W8 smooth {a}": dict(kern="g32w8", smooth=a) for a in (0.5, 0.6)},
    **{f"group 64 W8 {f} only": dict(kern="g64w8", fields=(f,)) for f in FIELDS},
    **{f"group 64 W8 smooth 0.5 {f} only": dict(kern="g64w8", smooth=0.5, fields=(f,)) for f in FIELDS},
}
# the sampler itself (rollout.quant, quant_smooth, quant_outliers), calibrated as at a push on the
# engine's CALIBRATION_TEXT, not on the GSM8K texts above
calibration_ids = torch.tensor(tok(CALIBRATION_TEXT, add_special_tokens=False)["input_ids"][:CALIBRATION_TOKENS])[None]


def sampler(quant="int8", smooth=0.0, outliers=0):
    return SamplerModel(
        lm.model,
        torch.float32,
        pack_weights=False,
        quant=quant,
        quant_smooth=smooth,
        quant_outliers=outliers,
        calibration_ids=calibration_ids,
    )


samplers = {
    "sampler int8": dict(),
    "sampler int8 smooth 0.5": dict(smooth=0.5),
    **{f"sampler int8 outliers {k}": dict(outliers=k) for k in (4, 8, 16, 32)},
    **{f"sampler int8 outliers {k} smooth 0.5": dict(outliers=k, smooth=0.5) for k in (4, 8, 16, 32)},
    "sampler int8_group smooth 0.5": dict(quant="int8_group", smooth=0.5),
    "sampler int8_group outliers 8 smooth 0.5": dict(quant="int8_group", outliers=8, smooth=0.5),
}
for name in sys.argv[1:] or [*cases, *samplers]:
    t = time.time()
    a = alpha(sampler(**samplers[name]) if name in samplers else variant(**cases[name]))
    print(f"{name:28s} alpha mean {a[0]:.4f} p5 {a[1]:.4f}  ({time.time() - t:.0f}s)", flush=True)
