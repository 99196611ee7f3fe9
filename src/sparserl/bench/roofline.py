"""The decode step's roofline: the fastest this machine could run one decode step of a batch.

One decode step of ``batch`` sequences must read every weight it multiplies once and each kept K/V
entry once (``bytes_read``), and do ``flops`` floating-point operations: 2 per weight element per
row (the q/k/v, o, gate/up, down and LM-head GEMMs) plus 4 per kept token per query head and head
dimension per layer (q·kᵀ and p·v). With the measured read bandwidth ``bandwidth`` (bytes/s) and
the measured throughput of the decode's own GEMMs ``gemm_flops`` (FLOP/s, see
:func:`sparserl.bench.machine.gemm_flops_per_s`), a step takes at least the slower of the two::

    step_seconds       = max(bytes_read / bandwidth, flops / gemm_flops)
    bound_tokens_per_s = batch / step_seconds
    roofline_fraction  = tokens_per_s / bound_tokens_per_s        (1.0 = at this machine's limit)

``roofline_bound`` is ``"memory"`` when the reads take longer, ``"compute"`` when the FLOPs do.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Roofline:
    tokens_per_s: float  # bound_tokens_per_s
    bound: str  # "memory" | "compute"
    memory_seconds: float  # bytes_read / bandwidth
    compute_seconds: float  # flops / gemm_flops


def roofline(batch: int, bytes_read: float, flops: float, bandwidth: float, gemm_flops: float) -> Roofline:
    """The bound of one decode step (formula in the module docstring)."""
    if batch < 1 or bandwidth <= 0 or gemm_flops <= 0:
        raise ValueError(f"roofline: batch {batch}, bandwidth {bandwidth} and gemm_flops {gemm_flops} must be > 0")
    memory_s, compute_s = bytes_read / bandwidth, flops / gemm_flops
    step = max(memory_s, compute_s)
    return Roofline(batch / step, "memory" if memory_s >= compute_s else "compute", memory_s, compute_s)


def decode_step_flops(
    batch: int, linear_weight_elements: int, n_layers: int, n_heads: int, head_dim: int, kv_tokens_avg: float
) -> float:
    """FLOPs of one decode step: the GEMMs over ``linear_weight_elements`` (all layers' q/k/v, o,
    gate/up, down and the LM head) and attention over ``kv_tokens_avg`` kept tokens per sequence."""
    return 2.0 * batch * linear_weight_elements + 4.0 * batch * n_layers * n_heads * head_dim * kv_tokens_avg


def mean_kv_tokens(prompt_tokens: int, new_tokens: int, cap: float | None = None) -> float:
    """Mean number of cached tokens per sequence over the ``new_tokens`` decode steps: the cache
    grows from the prompt by one token a step up to ``cap`` (None: dense, no cap), where a
    compressing cache stays on average."""
    total = 0.0
    for t in range(new_tokens):
        kept = prompt_tokens + t
        total += kept if cap is None else min(kept, cap)
    return total / max(1, new_tokens)
