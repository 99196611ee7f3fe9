"""Peak memory predicted from the config and the model's shape, before any weight loads.

- :func:`predict_peak`: the training process's peak resident bytes as named parts (:mod:`.predict`, with
  the decoder's saved activations per token in :mod:`.activations`);
- :func:`memory_limit`: ``train.max_memory_gb`` or the machine's available memory less a margin (:mod:`.limit`);
  :func:`peak_resident_bytes`: the process's measured peak, logged each step beside the prediction;
- :func:`~.allocator.trim_freed_memory`: the C heap's freed pages handed back to the kernel where a step's phases
  have freed their transients (:mod:`.allocator`), so a run's peak follows its live tensors;
- :func:`check_fits`: preflight's refusal of a run that would not fit, naming the changes that would
  (:mod:`.fit`); :func:`gradient_checkpointing_on`: ``train.gradient_checkpointing: auto``'s answer.
"""

from .fit import check_fits, gradient_checkpointing_on, memory_line, suggestions
from .limit import available_bytes, memory_limit, peak_resident_bytes
from .predict import BASELINE_BYTES, MemoryPrediction, predict_peak, sampler_bytes

__all__ = [
    "BASELINE_BYTES",
    "MemoryPrediction",
    "available_bytes",
    "check_fits",
    "gradient_checkpointing_on",
    "memory_limit",
    "memory_line",
    "peak_resident_bytes",
    "predict_peak",
    "sampler_bytes",
    "suggestions",
]
