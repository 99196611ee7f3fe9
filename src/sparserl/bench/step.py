"""``sparserl bench step``: whole RL steps of one job under several samplers, in one process, split by station.

Each arm is the job's config with its own overrides (dense, a fixed R-KV budget, the controller, block
top-k, int8 weights, ...). Per round, every arm (the order rotated round to round,
:func:`sparserl.bench.measure.round_order`) builds its trainer, runs one step of it (:func:`sparserl.train.step.
train_step`: rollout, reward, old-policy scoring, α, update, push), and lets it go; the step's own clocks give
the split (``time/rollout_s``, ``time/score_s``, ``time/alpha_s``, ``time/update_s``, ``time/step_s``), its
metrics the KV bytes and the rollout's tokens per second.

Peak memory per arm: before an arm is built, the previous arm's memory is handed back to the system
(``gc.collect`` and glibc's ``malloc_trim``) and the kernel's high-water mark of this process is reset
(``/proc/self/clear_refs`` ← 5, Linux ≥ 4.0); the arm's peak is ``VmHWM`` after its step. Where the reset is not
available the peak is that of a 5 ms sampling thread (:class:`~sparserl.bench.measure.RssSampler`).

Ratios against the baseline arm are the median over rounds of each round's ratio
(:func:`sparserl.bench.measure.median_round_ratio`). Arms sample their own responses, so their lengths differ:
the report also gives seconds per 1,000 response tokens.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable

from .. import runlog as names
from ..memory import peak_resident_bytes
from ..memory.allocator import resident_bytes, trim_freed_memory
from .measure import RssSampler, median_round_ratio, round_order

#: the step's stations as the run log names them, in the order of a step
STATIONS = (names.TIME_ROLLOUT, names.TIME_REWARD, names.TIME_SCORE, names.TIME_ALPHA, names.TIME_UPDATE)
#: what each arm's report keeps of its step's metrics
KEPT = (
    *STATIONS,
    names.TIME_STEP,
    names.ROLLOUT_TOKENS_PER_S,
    names.KV_SAMPLER_ALLOC,
    names.KV_DENSE_ALLOC,
    names.KV_KEPT_TOKENS,
    names.LENGTH_MEAN,
    names.LENGTH_MAX,
    names.REWARD_MEAN,
    names.MISMATCH_ALPHA_MEAN,
    names.MISMATCH_ALPHA_P5,
    names.MEMORY_PREDICTED_PEAK,
)


def _release_memory() -> None:
    """Hand freed memory back to the system, so the next arm's resident memory starts from what is live."""
    gc.collect()
    trim_freed_memory()


def _reset_peak() -> bool:
    """Reset this process's resident high-water mark (``VmHWM``); False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def run_arm(cfg, step: int = 1) -> dict:
    """Build ``cfg``'s trainer, run its step ``step`` and return the kept metrics, with the arm's peak resident
    memory (``rss_peak_bytes``: build and step) and the memory live before it (``rss_before_bytes``)."""
    from ..train.build import build_trainer
    from ..train.step import train_step

    _release_memory()
    before = resident_bytes()
    hwm = _reset_peak()
    with RssSampler() as rss:
        trainer = build_trainer(cfg)
        t = time.perf_counter()
        metrics = train_step(trainer, step)
        wall = time.perf_counter() - t
    peak = peak_resident_bytes() if hwm else rss.peak
    del trainer
    _release_memory()
    out = {k: float(metrics[k]) for k in KEPT if k in metrics}
    tokens = metrics[names.LENGTH_MEAN] * cfg.train.prompts_per_step * cfg.rollout.n
    out.update(wall_s=wall, rss_peak_bytes=peak, rss_before_bytes=before, response_tokens=tokens)
    out["step_s_per_1k_tokens"] = out[names.TIME_STEP] / max(tokens, 1.0) * 1000
    return out


def run_rounds(
    arms: dict[str, object], rounds: int, on_run: Callable[[int, str, dict], None] | None = None
) -> dict[str, list[dict]]:
    """Every arm (name → config) once per round, the order rotated each round; each arm's per-round results."""
    results: dict[str, list[dict]] = {name: [] for name in arms}
    for r in range(rounds):
        for name in round_order(list(arms), r):
            out = run_arm(arms[name])
            results[name].append(out)
            if on_run is not None:
                on_run(r, name, out)
    return results


def summarize(results: dict[str, list[dict]], baseline: str) -> dict[str, dict]:
    """Per arm: the median of each kept figure over rounds, the step's and the rollout's time as the median of
    per-round ratios to ``baseline``, the rollout's fraction of the step, and the peak memory (largest round)."""
    out = {}
    base = results[baseline]
    for name, runs in results.items():
        row = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "rss_peak_bytes"}
        row["rss_peak_bytes"] = max(r["rss_peak_bytes"] for r in runs)
        row["rounds"] = len(runs)
        step = [r[names.TIME_STEP] for r in runs]
        row["step_vs_baseline"] = median_round_ratio(step, [r[names.TIME_STEP] for r in base])
        if all(names.TIME_ROLLOUT in r for r in runs + base):
            row["rollout_vs_baseline"] = median_round_ratio(
                [r[names.TIME_ROLLOUT] for r in runs], [r[names.TIME_ROLLOUT] for r in base]
            )
            row["rollout_frac"] = statistics.median(r[names.TIME_ROLLOUT] / r[names.TIME_STEP] for r in runs)
        if all(names.TIME_ALPHA in r and names.TIME_ROLLOUT in r for r in runs):
            row["alpha_over_rollout"] = statistics.median(r[names.TIME_ALPHA] / r[names.TIME_ROLLOUT] for r in runs)
        out[name] = row
    return out
