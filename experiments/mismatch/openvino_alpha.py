"""α of OpenVINO GenAI's int8 sampler next to sparserl's, on the same tokens: how close each is to
the float32 model, teacher-forced, exact over the vocabulary.

The float32 dense sampler writes 4 × 1,024 tokens of the bench's story prompt (seed 0, temperature
1). Each model then scores those sequences in one forward, and per predicted token
``α_t = Σ_x min(p_t(x), q_t(x))`` against the float32 model's ``p_t`` (the bench's α, except that
the dense sampler, not each quantized one, wrote the tokens; ``w8a8_grid_emulation.py`` does the
same). Models:
- OpenVINO's IRs of the bench's peer (``~/.cache/sparserl/openvino``, converted by ``bench rollout
  --peers openvino``): float32, and int8 weights (NNCF ``INT8_SYM`` per channel), on the CPU plugin
  with ``INFERENCE_PRECISION_HINT=f32`` as in the bench, its other settings at their defaults (the
  plugin's dynamic quantization of activations included, where it applies);
- sparserl's samplers teacher-forced (``SamplerModel.hidden_states``): ``int8`` and ``int8_group``
  (groups of 64 and of 32, the LM head quantized or not), all with SmoothQuant 0.5.

Run with the Python that has the ``bench`` extra (OpenVINO); elsewhere the OpenVINO rows are skipped:

    /work/venvs/ov/bin/python experiments/mismatch/openvino_alpha.py

Results: docs/results/bench_openvino.md and bench_quant.md.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch

from sparserl.models.loading import load_model
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.profile import BENCH_PROMPT
from sparserl.rollout.sampling import SamplingParams

IR = Path.home() / ".cache" / "sparserl" / "openvino"
ROWS, TOKENS = 4, 1024


def alpha(ref: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Per-token α of the log-softmax ``ref`` [T, V] and ``logits`` [T, V]."""
    return torch.minimum(ref, torch.log_softmax(logits.float(), -1)).exp().sum(-1)


def openvino_logits(folder: Path, seq: torch.Tensor):
    """A function row -> logits [T, V] of the IR in ``folder`` on the CPU plugin (a fresh state per
    row: the stateful model's KV starts empty), f32 inference precision."""
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(
        folder / "openvino_model.xml", "CPU", {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    )
    names = {p.get_any_name() for p in compiled.inputs}

    def run(row: int) -> torch.Tensor:
        req = compiled.create_infer_request()
        req.reset_state()
        ids = seq[row : row + 1].numpy().astype(np.int64)
        feed = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "position_ids": np.arange(ids.shape[1], dtype=np.int64)[None],
        }
        if "beam_idx" in names:
            feed["beam_idx"] = np.zeros(1, dtype=np.int32)
        req.infer({k: v for k, v in feed.items() if k in names})
        return torch.from_numpy(req.get_output_tensor(0).data.copy())[0]

    return run


def sparserl_logits(lm, quant: str, seq: torch.Tensor, group: int | None = None, head: bool = True):
    m = RolloutEngine(
        lm,
        build_compressor("none"),
        dtype=torch.float32,
        quant=quant,
        quant_smooth=0.5,
        quant_group=group,
        quant_head=head,
    ).model

    @torch.inference_mode()
    def run(row: int) -> torch.Tensor:
        s = seq[row : row + 1]
        h = m.hidden_states(s, torch.ones_like(s, dtype=torch.bool), torch.arange(s.shape[1])[None])
        return m.logits(h)[0]

    return run


@torch.inference_mode()
def main() -> None:
    lm = load_model("smollm2", dtype=torch.float32)
    dense = RolloutEngine(lm, build_compressor("none"), dtype=torch.float32)
    out = dense.generate([BENCH_PROMPT], SamplingParams(n=ROWS, max_new_tokens=TOKENS, ignore_eos=True, seed=0))
    seq = torch.tensor([out.prompt_ids[0] + r for r in out.response_ids])
    P = len(out.prompt_ids[0])
    refs = [torch.log_softmax(lm.model(seq[r : r + 1]).logits[0, P - 1 : -1].float(), -1) for r in range(ROWS)]
    models = {}
    if importlib.util.find_spec("openvino") and (IR / "smollm2-135m-fp32-int8").is_dir():
        models["openvino f32"] = lambda: openvino_logits(IR / "smollm2-135m-fp32", seq)
        models["openvino int8 (NNCF INT8_SYM)"] = lambda: openvino_logits(IR / "smollm2-135m-fp32-int8", seq)
    else:
        print(f"openvino rows skipped: no openvino module or no converted IR under {IR}")
    models["sparserl int8 + SmoothQuant 0.5 + head"] = lambda: sparserl_logits(lm, "int8", seq)
    for group in (64, 32):
        for head in (True, False):
            name = f"sparserl int8_group g{group} + SmoothQuant 0.5" + (" + head" if head else "")
            models[name] = lambda group=group, head=head: sparserl_logits(lm, "int8_group", seq, group, head)
    for name, build in models.items():
        run = build()
        a = torch.cat([alpha(refs[r], run(r)[P - 1 : -1]) for r in range(ROWS)]).double()
        print(
            f"{name:48s} alpha mean {float(a.mean()):.4f}  p5 {float(torch.quantile(a, 0.05)):.4f}  "
            f"over {a.numel()} tokens",
            flush=True,
        )


if __name__ == "__main__":
    main()
