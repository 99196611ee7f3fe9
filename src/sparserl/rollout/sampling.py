"""Token sampling with the log-probability of each sampled token under the distribution actually
sampled from (temperature, then top-k, then top-p), as RL corrections need ``log q``.

Randomness: one uniform per response per step, a counter-based draw (:func:`row_uniforms`: SplitMix64 of
the seed, the response's row id and the step), integer arithmetic with the same bits on every device.
A response's draws depend on nothing else: not on the device (a CPU run and a GPU run differ only by the
arithmetic of the logits), not on which other responses share its batch, how the batch is chunked, when
its neighbours end, or which rollout worker runs it (``sparserl.cluster`` shards a step's prompts and
passes their global row ids)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    """What to sample. ``temperature=0`` is greedy (the sampled distribution is then a point mass:
    its log-prob is 0). ``top_k=0`` and ``top_p=1`` disable those filters."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False  # generate exactly max_new_tokens (benchmarks)
    min_new_tokens: int = 0  # EOS and stop strings do not end a response shorter than this (calibration)
    seed: int = 0
    logprobs_topk: int = 0  # also return the top-k log-probs of each position
    # also return each response's whole sampled distributions [T, V] (the tempered, filtered log-probs each
    # token was drawn from): the exact α without a replay (sparserl.mismatch.measure)
    keep_distributions: bool = False
    # also return each response's final hidden states [T, H] (the input of the LM head at each position a token
    # was drawn from): q recomputed from them by the sampler's own head (sparserl.mismatch.exact_alpha.hidden_alpha)
    keep_hidden: bool = False

    def validate(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens must be in [0, max_new_tokens={self.max_new_tokens}], got {self.min_new_tokens}"
            )


def sampling_logprobs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Log-probs [B, V] (float32) of the distribution sampled from; filtered tokens get -inf."""
    logits = logits.float()
    if p.temperature > 0 and p.temperature != 1.0:
        logits = logits / p.temperature
    if p.top_k and p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass before it already reaches top_p (the first is always kept)
        drop = (probs.cumsum(-1) - probs) >= p.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    return torch.log_softmax(logits, dim=-1)


_MASK64 = (1 << 64) - 1


def _int64(x: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN, _MIX1, _MIX2 = _int64(0x9E3779B97F4A7C15), _int64(0xBF58476D1CE4E5B9), _int64(0x94D049BB133111EB)


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def _splitmix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser (Steele, Lea & Flood 2014) on int64 tensors (multiplication wraps mod 2^64)."""
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def row_uniforms(seed: int | torch.Tensor, rows: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
    """Uniforms in [0, 1) (float32, 24 random bits, as ``torch.rand``), one per entry of ``rows`` (int64
    row ids): ``mix(mix(seed + γ·(row + 1)) + γ·(step + 1))`` with SplitMix64's ``mix`` and increment γ.
    A pure function of (seed, row, step): the counter-based draw that makes a response's tokens
    independent of its batch. ``step`` may be a 0-dim int64 tensor on the rows' device (the static decode
    step's counter, never read on the host): int64 products wrap mod 2^64, so the bits are the same.
    ``seed`` may be an int64 tensor of one seed per row (rows of several rollouts in one batch)."""
    offset = seed.to(torch.long) + _GOLDEN if isinstance(seed, torch.Tensor) else _int64(seed + _GOLDEN)
    base = _splitmix64(rows.to(torch.long) * _GOLDEN + offset)
    increment = (step.to(torch.long) + 1) * _GOLDEN if isinstance(step, torch.Tensor) else _int64((step + 1) * _GOLDEN)
    z = _splitmix64(base + increment)
    return _shr(z, 40).to(torch.float32) * (2.0**-24)


def sampled_distribution(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Log-probs [..., V] (float32) of the distribution :func:`sample` draws from, from the logits: tempered
    and filtered (:func:`sampling_logprobs`); under greedy decoding (``temperature=0``) the untempered softmax.
    The one logits -> ``q`` transform, shared by sampling and by the exact α's ``q`` recomputed from kept
    hidden states (:func:`sparserl.mismatch.exact_alpha.hidden_alpha`)."""
    if p.temperature == 0:
        return torch.log_softmax(logits.float(), -1)
    return sampling_logprobs(logits, p)


def sample(logits: torch.Tensor, p: SamplingParams, uniforms: torch.Tensor):
    """Returns (tokens [B], logprob of each token [B], log-probs [B, V] of the sampled distribution,
    :func:`sampled_distribution`). ``uniforms`` [B]: each row's draw in [0, 1) (:func:`row_uniforms`)."""
    logprobs = sampled_distribution(logits, p)
    if p.temperature == 0:
        tokens = logits.argmax(dim=-1)
        return tokens, torch.zeros(tokens.shape, dtype=torch.float32, device=logits.device), logprobs
    # inverse-CDF sampling with one uniform draw per row
    # (torch.multinomial draws an exponential per vocabulary entry: ~10x slower here)
    cdf = logprobs.exp().cumsum_(dim=-1)
    u = uniforms.to(device=cdf.device, dtype=cdf.dtype)[:, None] * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, u, right=True)[:, 0].clamp_(max=cdf.shape[-1] - 1)
    # a token of probability 0 has a flat CDF step and can never be hit by `right=True`
    return tokens, logprobs.gather(-1, tokens[:, None])[:, 0], logprobs
