"""Machines the cost model assumes rather than measures: a GPU's rates as a fraction of its peaks.

The prediction on such a machine is for an engine running at that pace (a vLLM / SGLang-class decode, a
tuned FSDP learner), not for sparserl's own CUDA path, which is launch-bound at small models.

**H200** (NVIDIA H200 SXM, datasheet): HBM3e 4.8 TB/s, 141 GB; bfloat16 dense tensor-core peak 989 TFLOP/s
(1,979 with 2:4 sparsity, not used). Assumed reachable:

- decode reads at 60 % of the bandwidth (2.9 TB/s): vLLM-class decode kernels reach 50-70 % of HBM
  bandwidth on the weight and KV reads of a step (paged-KV gathers, launch gaps between the ~30 layers'
  kernels, the sampler's passes over the logits);
- the decode's GEMMs at 60 % of peak: a decode step is far below the ridge point (a few hundred rows),
  so this rate rarely binds;
- the learner's (and prefill's) GEMMs at 40 % of peak (396 TFLOP/s): model FLOPs utilisation of FSDP
  training of 1-8B decoders with gradient checkpointing is typically 30-50 % (attention, norms and
  optimizer kernels around the GEMMs, communication not hidden).
"""

from __future__ import annotations

from dataclasses import dataclass

from .rollout import MachineRates

__all__ = ["AssumedMachine", "H200", "MACHINES"]


@dataclass(frozen=True)
class AssumedMachine:
    """A machine's peaks and the fractions of them assumed reachable; :attr:`rates` the cost model's."""

    name: str
    description: str
    peak_bandwidth: float  # bytes/s
    peak_flops: float  # FLOP/s, the GEMMs' dtype
    bandwidth_fraction: float
    decode_flops_fraction: float
    learner_flops_fraction: float

    @property
    def rates(self) -> MachineRates:
        return MachineRates(
            self.peak_bandwidth * self.bandwidth_fraction,
            self.peak_flops * self.decode_flops_fraction,
            self.peak_flops * self.learner_flops_fraction,
        )

    def to_dict(self) -> dict:
        r = self.rates
        return {
            "name": self.name,
            "description": self.description,
            "peak_bandwidth_bytes_per_s": self.peak_bandwidth,
            "peak_flops_per_s": self.peak_flops,
            "bandwidth_fraction": self.bandwidth_fraction,
            "decode_flops_fraction": self.decode_flops_fraction,
            "learner_flops_fraction": self.learner_flops_fraction,
            "memory_bandwidth_bytes_per_s": r.bandwidth,
            "gemm_flops_per_s": r.gemm_flops,
            "prefill_flops_per_s": r.prefill_rate,
        }


H200 = AssumedMachine(
    name="h200",
    description="NVIDIA H200 SXM (HBM3e 4.8 TB/s, bf16 dense 989 TFLOP/s), one GPU",
    peak_bandwidth=4.8e12,
    peak_flops=989e12,
    bandwidth_fraction=0.6,
    decode_flops_fraction=0.6,
    learner_flops_fraction=0.4,
)

#: the assumed machines by name
MACHINES: dict[str, AssumedMachine] = {H200.name: H200}
