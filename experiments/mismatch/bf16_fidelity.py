"""How far the bf16 sampler's log-probs are from transformers' forward (float32 and bfloat16) on the
embedded model: python experiments/mismatch/bf16_fidelity.py"""

import torch

from sparserl.models.loading import load_model
from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.sampling import SamplingParams

lm32 = load_model("smollm2-135m", dtype="float32")
lm16 = load_model("smollm2-135m", dtype="bfloat16")
prompt = [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does he have?"}]
for name, lm in (("float32", lm32), ("bfloat16", lm16)):
    out = RolloutEngine(lm, None).generate([prompt], SamplingParams(n=4, max_new_tokens=48, seed=0, ignore_eos=True))
    for ref_name, ref in (("hf float32", lm32.model), ("hf bfloat16", lm16.model)):
        diffs = []
        for i in range(4):
            ids = torch.tensor(out.prompt_ids[i] + out.response_ids[i])[None]
            with torch.no_grad():
                lp = ref(ids).logits[0].float().log_softmax(-1)
            P = len(out.prompt_ids[i])
            diffs.append(
                (lp[P - 1 : -1].gather(-1, ids[0, P:, None])[:, 0] - torch.tensor(out.sampler_logprobs[i])).abs()
            )
        d = torch.cat(diffs)
        print(
            f"sampler {name:8s} vs {ref_name:11s}: mean |diff| {d.mean():.2e}  p99 {d.quantile(0.99):.2e}  "
            f"max {d.max():.2e}  ({d.numel()} tokens)"
        )
