"""Per-token mismatch of a sampler against a reference sampler (the bench's quantized rows):
teacher-forced on the same tokens, exact over the vocabulary.

The sampler ``q`` (e.g. quantized weights and/or KV) generates; its full next-token distribution at
every decode step is captured as it samples (the engine's ``step_hook``, so whatever the sampler
does to its cache, compression and quantization included, is in it). The reference ``p`` (the
dense float32 sampler) scores the same tokens with one teacher-forced forward. Per token ``x_t``
(from the second generated token on: the first comes from the prefill)::

    α_t = Σ_x min(p_t(x), q_t(x))           (acceptance: speculative decoding's, 1 = identical)
    k3_t = ρ_t - 1 - log ρ_t,  ρ_t = p_t(x_t) / q_t(x_t)   (Schulman's k3 estimate of KL(q ‖ p))

at temperature 1 (the distribution ``softmax(logits)`` both samplers sample from).
"""

from __future__ import annotations

import torch

from ..rollout.engine import RolloutEngine
from ..rollout.model import SamplerModel
from ..rollout.sampling import SamplingParams

__all__ = ["sampler_mismatch", "stepwise_logprobs"]


def stepwise_logprobs(
    engine: RolloutEngine,
    prompts,
    params: SamplingParams,
    tokens: torch.Tensor | None = None,
    prompt_ids: list[list[int]] | None = None,
):
    """Generate with ``engine`` and capture, through its ``step_hook``, the full next-token
    log-softmax of every decode step: (the engine's output, [B, T, V] float32). With ``tokens``
    [B, T] each decode step is fed those tokens instead of the sampled ones, so two engines are
    compared on the same sequences, each with its own cache as it runs (compression, KV rounding)."""
    steps: list[torch.Tensor] = []

    def capture(event, t=None, cache=None, logits=None, **kw):
        if event == "before_decode" and tokens is not None:
            kw["tokens"].copy_(tokens[:, t])
        elif event == "after_decode":
            steps.append(torch.log_softmax(logits.float(), dim=-1))

    hook, engine.step_hook = engine.step_hook, capture
    try:
        out = engine.generate(prompts, params, prompt_ids=prompt_ids)
    finally:
        engine.step_hook = hook
    return out, torch.stack(steps, 1)


@torch.inference_mode()
def sampler_mismatch(
    engine: RolloutEngine,
    reference: SamplerModel,
    prompt,
    rows: int,
    max_new_tokens: int,
    seed: int = 0,
    chunk: int = 32,
) -> dict:
    """``engine`` generates ``rows`` sequences of ``max_new_tokens`` from ``prompt`` (EOS ignored);
    returns {alpha_mean, alpha_p5, k3_kl, mismatch_tokens} against ``reference``."""
    params = SamplingParams(n=rows, max_new_tokens=max_new_tokens, ignore_eos=True, seed=seed)
    out, steps = stepwise_logprobs(engine, [prompt], params)  # steps[:, t]: the distribution of token t + 1
    dev = reference.device
    prompt_ids = torch.tensor(out.prompt_ids[0], device=dev)
    resp = torch.tensor(out.response_ids, device=dev)  # [rows, L]
    T = steps.shape[1]
    P = len(prompt_ids)
    seq = torch.cat([prompt_ids[None].expand(rows, P), resp[:, :T]], dim=1)
    valid = torch.ones_like(seq, dtype=torch.bool)
    h = reference.hidden_states(seq, valid, torch.arange(seq.shape[1], device=dev)[None].expand_as(seq))
    alphas, k3s = [], []
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        lp = torch.log_softmax(reference.logits(h[:, P + t0 : P + t1]).float(), dim=-1)  # [rows, c, V]
        lq = steps[:, t0:t1].to(dev)
        alphas.append(torch.minimum(lp, lq).exp().sum(-1).flatten())
        tok = resp[:, t0 + 1 : t1 + 1, None]
        log_rho = (lp.gather(-1, tok) - lq.gather(-1, tok)).flatten()
        k3s.append(log_rho.exp() - 1 - log_rho)
    alpha, k3 = torch.cat(alphas).double(), torch.cat(k3s).double()
    return {
        "alpha_mean": float(alpha.mean()),
        "alpha_p5": float(torch.quantile(alpha, 0.05)),
        "k3_kl": float(k3.mean()),
        "mismatch_tokens": int(alpha.numel()),
    }
