"""What a person reads at the end of a run (:func:`run_summary`): reward first → last, KV saved (like with
like), the mismatch and the fraction masked, held-out accuracy with the sampler it ran, the headline lines
(:mod:`.headline`), and where everything is."""

from __future__ import annotations

import json
from pathlib import Path

from .. import runlog as names

#: a run whose correction silenced more than this share of its tokens (``rs/masked_frac``, mean over steps) is told
#: so: on the main job, seq-mask-TIS's published band silenced 95% of a compressed sampler's responses
#: (docs/results/corrections/), Sparse-RL's correction 8% of the tokens
MOSTLY_SILENT = 0.5


def last_eval_samplers(run: Path) -> dict[str, str]:
    """{mode: the sampler it ran} of the run's last held-out evaluation (``eval-step<N>.json``), {} when
    there is none or it names none."""
    records = sorted(run.glob("eval-step*.json"))
    if not records:
        return {}
    try:
        record = json.loads(records[-1].read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {
        mode: record[mode]["sampler"]
        for mode in names.EVAL_MODES
        if isinstance(record.get(mode), dict) and isinstance(record[mode].get("sampler"), str)
    }


def run_summary(rows: list[dict], run: Path, report: Path, checkpoint: Path | None, headline: list[str] = ()) -> str:
    """The end-of-run summary of ``rows`` (the run's metrics); ``headline``: the lines that state the run's
    result against its claim (:func:`.headline.headline_lines`: KV allocated and kept against dense, α's
    tail against the controller's threshold, the final reward, a verdict only where measured), printed
    after the reward, mismatch and held-out lines, in place of the summary's own KV lines."""

    def series(key):
        return [r[key] for r in rows if isinstance(r.get(key), (int, float))]

    def mean(key):
        xs = series(key)
        return sum(xs) / len(xs) if xs else float("nan")

    reward = series(names.REWARD_MEAN)
    seconds = [x for x in map(names.step_seconds, rows) if x is not None]
    lines = [f"run finished: {len(rows)} steps in {sum(seconds) / 60:.1f} min"]
    if reward:
        k = min(3, len(reward))
        lines.append(
            f"  reward      {reward[0]:.2f} (step 1) -> {reward[-1]:.2f} (last); mean of first {k} "
            f"{sum(reward[:k]) / k:.2f}, of last {k} {sum(reward[-k:]) / k:.2f}"
        )
    kept = series(names.KV_KEPT_FRAC)
    if kept and not headline:  # the headline states KV allocated and kept against dense
        lines.append(
            f"  KV tokens   the sampler held {mean(names.KV_KEPT_FRAC):.0%} of a dense cache's tokens at "
            f"each response's end ({1 / mean(names.KV_KEPT_FRAC):.1f}x fewer; worst step {max(kept):.0%})"
        )
        lines.append(
            f"  KV bytes    allocated {mean(names.KV_SAMPLER_ALLOC) / 2**20:.1f} MiB vs "
            f"{mean(names.KV_DENSE_ALLOC) / 2**20:.1f} MiB for the dense engine on the same batches "
            f"({mean(names.KV_ALLOC_REDUCTION):.1f}x less)"
        )
    if series(names.MISMATCH_K3):
        lines.append(
            f"  mismatch    k3 KL(sampler, dense) mean {mean(names.MISMATCH_K3):.3f}, max "
            f"{max(series(names.MISMATCH_K3)):.3f}; tokens masked by the correction "
            f"{mean(names.MASKED_FRAC):.1%}"
        )
    if series(names.MASKED_FRAC) and mean(names.MASKED_FRAC) > MOSTLY_SILENT:
        lines.append(
            f"  warning     {mean(names.MASKED_FRAC):.0%} of the tokens gave no gradient (out of the correction's "
            "mask, or weight 0 in it): its bounds are tight for this sampler's mismatch; widen them "
            "(algorithm.correction_options) or choose another algorithm.correction"
        )
    skipped = sum(series(names.SKIPPED_NONFINITE))
    if skipped:
        lines.append(
            f"  skipped     {skipped:g} optimizer step(s) with a non-finite loss or gradient norm "
            f"({names.SKIPPED_NONFINITE})"
        )
    samplers = last_eval_samplers(run)
    for mode in names.EVAL_MODES:
        ev = series(names.eval_metric(mode))
        if ev:
            on = f" ({samplers[mode]})" if mode in samplers else ""
            lines.append(f"  held-out    pass@1 {ev[-1]:.3f} with {mode} inference{on}")
    lines += [f"  {line}" for line in headline]
    lines += [
        f"  run folder  {run}",
        f"  metrics     {run / names.METRICS_FILE} (TensorBoard: {run / 'tb'})",
        f"  checkpoint  {checkpoint / 'model' if checkpoint else None}",
        f"  report      {report}",
    ]
    return "\n".join(lines)
