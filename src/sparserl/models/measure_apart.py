"""A one-time measurement run in a child process, so that what it allocates never counts in the run's memory.

The ``auto`` settings measure once per machine (:mod:`sparserl.rollout.dtype_choice`'s sampler dtype,
:mod:`sparserl.rollout.bf16_kernel_choice`'s bf16 kernel, :mod:`sparserl.models.mixed_precision`'s learner
precision): each builds a model of SmolLM2-135M's shape with random weights and engines over it, about 3 GB
at its height on a CPU beside the run's own learner. Freed in the run's process, most of it stays in the
process's resident set (glibc keeps freed heap pages), so a run's peak RSS carried it to the end.
:func:`run_apart` runs the measurement in a child process started with ``spawn`` (a fresh interpreter: no
fork of the run's threads or memory) under the parent's torch thread count, and returns its answer; the
child's memory goes back to the system when it exits. The child costs an interpreter start and the imports
(a few seconds), once per machine.

A measurement inside the child (the sampler's bf16 engine times its kernels while the dtype is being
measured) runs in place: one child at a time.
"""

from __future__ import annotations

import multiprocessing

_IN_CHILD = False  # set in the child: measurements nested in it run in place


def _child(fn, args, threads: int):
    global _IN_CHILD
    import torch

    _IN_CHILD = True
    torch.set_num_threads(threads)
    return fn(*args)


def run_apart(fn, *args):
    """``fn(*args)`` in a spawned child process (``fn`` a module-level function, its arguments and answer
    picklable), with this process's torch thread count; in place when this process is such a child already.
    An exception in the child is raised here."""
    if _IN_CHILD:
        return fn(*args)
    import torch

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(_child, (fn, args, torch.get_num_threads()))
