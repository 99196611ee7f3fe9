"""Teacher-forced log-probs of given responses under the sampler's own weights with a dense,
full-precision cache (one forward over prompt + response): the "quantized-dense" sampler that splits
a quantized and compressed sampler's mismatch into its two sources (``rollout.mismatch_split``).

With ``p`` the dense learner (old policy), ``q_w`` the sampler's (quantized) weights on a dense
full-precision cache, and ``q`` the sampler as it ran (eviction and KV rounding on top)::

    log p/q = log p/q_w  (weights: quantization)  +  log q_w/q  (cache: eviction, KV quantization)

Each part's k3 (``ρ - 1 - log ρ``) is averaged over the sampled tokens. The tokens were drawn from
``q``, not ``q_w``, so the weights part is a sample estimate under ``q`` of a quantity defined for
``q_w``: a diagnostic of where the mismatch comes from, not an unbiased KL.
"""
from __future__ import annotations

import torch

from ..batch import RolloutBatch
from .model import SamplerModel


@torch.inference_mode()
def teacher_forced_logprobs(model: SamplerModel, batch: RolloutBatch, temperature: float = 1.0,
                            micro_batch_size: int = 16) -> torch.Tensor:
    """[N, T] float32 ``log softmax(logits / τ)`` of each response token under ``model``, teacher
    forced on ``batch`` (``[left pad | prompt | response | right pad]``), 0 where the response mask is 0."""
    N, T = batch.response_ids.shape
    P = batch.input_ids.shape[1] - T
    tau = temperature if temperature > 0 else 1.0
    out = torch.zeros(N, T, dtype=torch.float32, device=batch.response_ids.device)
    dev = model.device
    for s in range(0, N, micro_batch_size):
        rows = slice(s, min(N, s + micro_batch_size))
        h = model.hidden_states(batch.input_ids[rows].to(dev), batch.attention_mask[rows].to(dev).bool(),
                                batch.position_ids[rows].to(dev))
        logits = model.logits(h[:, P - 1 : P + T - 1]).float() / tau  # position t predicts token t + 1
        lp = torch.log_softmax(logits, dim=-1).gather(-1, batch.response_ids[rows, :, None].to(dev))[..., 0]
        out[rows] = lp.to(out.device) * batch.response_mask[rows]
    return out
