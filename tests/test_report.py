"""Metrics logger (jsonl + TensorBoard), tolerant reading and the run report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparserl.eval.evaluate import write_eval_record
from sparserl.eval.report import load_run, make_report
from sparserl.runlog import read_metrics
from sparserl.train.metrics import MetricsLogger, format_step_line

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _rows(n: int = 5, scale: float = 1.0) -> list[dict]:
    rows = []
    for s in range(1, n + 1):
        rows.append(
            {
                "step": s,
                "reward/mean": round(0.1 * s * scale, 4),
                "reward/std": 0.05,
                "reward/accuracy": round(0.1 * s * scale, 4),
                "mismatch/log_ratio_abs_mean": 0.01 * s,
                "mismatch/k3_kl": 0.001 * s,
                "is/weight_min": 0.5,
                "is/weight_max": 1.5,
                "rs/token_masked_frac": 0.02,
                "rs/seq_vetoed_frac": 0.0,
                "kv/sampler_alloc_bytes": 2 * 2**20 * scale,
                "kv/dense_alloc_bytes": 8 * 2**20,
                "kv/kept_frac_final": 0.25 * scale,
                "kv/kept_tokens_final": 20 * scale,
                "kv/dense_tokens_final": 80,
                "time/rollout_s": 2.0,
                "time/reward_s": 0.5,
                "time/score_s": 1.0,
                "time/update_s": 1.5,
                "policy/loss": -0.01 * s,
                "grad_norm": 0.3,
                "policy/entropy": 1.2,
                "policy/kl_ref": 0.0,
                "time": 1_700_000_000.0 + s,
            }
        )
    return rows


def _write_run(run_dir: Path, rows: list[dict], truncated_tail: bool = True, config: str | None = None) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if truncated_tail:
        text += '{"step": 6, "reward/mean": 0.9'  # killed mid-write
    (run_dir / "metrics.jsonl").write_text(text)
    if config is not None:
        (run_dir / "config.yaml").write_text(config)
    return run_dir


def test_read_metrics_skips_truncated_last_line(tmp_path):
    run = _write_run(tmp_path / "r", _rows())
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert read_metrics(run / "metrics.jsonl") == rows
    assert read_metrics(tmp_path / "missing") == []


def test_make_report_writes_plots_and_numbers(tmp_path):
    from sparserl.config import Config, save_config

    run = _write_run(tmp_path / "run1", _rows())
    save_config(Config(name="default"), run / "config.yaml")
    # the file the trainer writes: evaluate()'s results per inference mode
    ev = {"problems": 64, "n": 1, "pass@1": 0.625, "avg@1": 0.625}
    write_eval_record(run, 5, "arith", {"dense": ev, "sparse": dict(ev, **{"pass@1": 0.5})})
    path = make_report(run)
    assert path == run / "report.md"
    for png in ("reward.png", "mismatch.png", "kv_memory.png", "time.png", "loss.png"):
        data = (run / png).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 2000, png
    md = path.read_text()
    assert "# Run report: run1" in md
    assert "5 steps logged (step 1 to 5)" in md
    assert "| reward/mean | 0.1 | 0.5 | 0.5 (5) |" in md  # first, last, best (step)
    assert "| rollout | 2 | 40% |" in md  # 2 s of 5 s per step
    assert "Total time 25 s, 5 s per step" in md
    # like with like: allocation vs allocation, kept tokens vs dense tokens
    assert "2.00 MiB vs 8.00 MiB (4x less" in md
    assert "kept vs dense: mean 20 vs 80; kept fraction mean 0.25 (4x fewer), worst step 0.25" in md
    assert "saved" not in md and "dense equivalent" not in md
    # the headline first: a single run states no verdict against dense, it names the comparison that measures it
    assert md.index("## Headline") < md.index("## Configuration")
    assert "- KV allocated: 1/4.0 of a dense engine's for the same batches" in md
    assert "- verdict: no dense run to compare with: `sparserl compare default --arms dense,default --seeds 6`" in md
    assert "| mismatch/k3_kl | 0.003 | 0.005 | 0.005 |" in md
    assert "| rs/token_masked_frac | 0.02 |" in md
    assert "| step | problems | dense/pass@1 | dense/avg@1 | sparse/pass@1 | sparse/avg@1 |" in md
    assert "| 5 | 64 | 0.625 | 0.625 | 0.5 | 0.625 |" in md
    assert "| compressor | rkv |" in md and "| KV budget | 64 |" in md
    assert "![reward](reward.png)" in md and "(time.png)" in md
    # no α logged (mismatch.alpha=off): no α plot, no α rows
    assert not (run / "alpha.png").exists() and "alpha.png" not in md and "mismatch/alpha" not in md


def _alpha_rows(n: int = 4) -> list[dict]:
    """Rows of a run that measured α: bins 0 and 128 every step, bin 256 from step 3 (longer responses)."""
    rows = _rows(n)
    for r in rows:
        s = r["step"]
        r.update(
            {
                "mismatch/alpha_mean": round(0.95 - 0.01 * s, 4),
                "mismatch/alpha_p5": round(0.9 - 0.02 * s, 4),
                "mismatch/alpha_p5_bin/0": round(0.92 - 0.01 * s, 4),
                "mismatch/alpha_p5_bin/128": round(0.88 - 0.03 * s, 4),
                "mismatch/replay_err": 0.0,
                "time/alpha_s": 0.5,
            }
        )
        if s >= 3:
            r["mismatch/alpha_p5_bin/256"] = round(0.8 - 0.01 * s, 4)
    return rows


def test_report_plots_alpha_tail_per_bin(tmp_path):
    from sparserl.eval.report import SPARROW_ALPHA_P5_THRESHOLD, alpha_figure

    run = _write_run(
        tmp_path / "alpha", _alpha_rows(), truncated_tail=False, config="mismatch:\n  alpha: exact\n  alpha_bin: 128\n"
    )
    md = make_report(run).read_text()
    data = (run / "alpha.png").read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 2000
    assert "![alpha](alpha.png)" in md
    # the summary table: first, last, best (step), mean of the last 5
    assert "| mismatch/alpha_mean | 0.94 | 0.91 | 0.94 (1) | 0.925 |" in md
    assert "| mismatch/alpha_p5 | 0.88 | 0.82 | 0.88 (1) | 0.85 |" in md
    # the tail against Sparrow's threshold: last, worst (step), steps below 0.86
    assert "| metric | last | worst (step) | steps below 0.86 |" in md
    assert "| mismatch/alpha_p5 | 0.82 | 0.82 (4) | 2/4 |" in md
    assert "| mismatch/alpha_p5_bin/0 | 0.88 | 0.88 (4) | 0/4 |" in md
    assert "| mismatch/alpha_p5_bin/128 | 0.76 | 0.76 (4) | 4/4 |" in md
    assert "| mismatch/alpha_p5_bin/256 | 0.76 | 0.76 (4) | 2/2 |" in md
    # α is not repeated in the mismatch table (its replay error is); its time is a station
    mismatch = md.split("## Mismatch and correction")[1].split("##")[0]
    assert "mismatch/replay_err" in mismatch and "alpha" not in mismatch
    assert "| alpha |" in md

    fig = alpha_figure(load_run(run))
    (ax,) = fig.axes
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == [
        "mismatch/alpha_p5_bin/0",
        "mismatch/alpha_p5_bin/128",
        "mismatch/alpha_p5_bin/256",
        "mismatch/alpha_p5",
        "mismatch/alpha_mean",
        "Sparrow's threshold 0.86",
    ]
    threshold = ax.get_lines()[-1]
    assert SPARROW_ALPHA_P5_THRESHOLD == 0.86
    assert list(threshold.get_ydata()) == [0.86, 0.86] and threshold.get_linestyle() == "--"
    bin256 = ax.get_lines()[2]
    assert list(bin256.get_xdata()) == [3, 4] and list(bin256.get_ydata()) == pytest.approx([0.77, 0.76])
    assert "per length bin (128 tokens)" in ax.get_title()
    assert alpha_figure(load_run(_write_run(tmp_path / "off", _rows(), truncated_tail=False))) is None


def test_report_skips_plots_without_data(tmp_path):
    rows = [{"step": s, "reward/mean": 0.2 * s} for s in range(1, 4)]
    run = _write_run(tmp_path / "bare", rows, truncated_tail=False)
    md = make_report(run).read_text()
    assert (run / "reward.png").exists()
    for png in ("mismatch.png", "alpha.png", "kv_memory.png", "time.png", "loss.png"):
        assert not (run / png).exists() and png not in md
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "No metrics logged yet" in make_report(empty).read_text()


def test_report_dedupes_resumed_steps(tmp_path):
    rows = _rows(3) + [dict(_rows(3)[2], **{"reward/mean": 0.99})]  # step 3 logged twice
    run = _write_run(tmp_path / "res", rows, truncated_tail=False)
    data = load_run(run)
    assert [r["step"] for r in data.rows] == [1, 2, 3]
    assert data.series("reward/mean")[1][-1] == 0.99


def test_metrics_logger_writes_jsonl_and_tensorboard(tmp_path, capsys):
    import torch

    from sparserl.runlog import UnregisteredMetricWarning

    run = tmp_path / "log"
    # "bad" and "note" are not registered metric names: a warning each (an error elsewhere in the tests), still written
    with (
        MetricsLogger(run, tensorboard=True, progress="plain", total_steps=3) as log,
        pytest.warns(UnregisteredMetricWarning, match="'(bad|note)' is not registered"),
    ):
        for s in (1, 2, 3):
            log.log(
                s,
                {
                    "reward/mean": torch.tensor(0.25 * s),
                    "kv/kept_frac_final": 0.314,
                    "time/rollout_s": 1.0,
                    "time/update_s": 0.5,
                    "bad": float("nan"),
                    "note": "x",
                },
            )
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[1]["reward/mean"] == 0.5 and rows[0]["bad"] is None and rows[0]["note"] == "x"
    assert all(isinstance(r["time"], float) for r in rows)
    assert list((run / "tb").glob("events.out.tfevents.*"))
    out = capsys.readouterr().out
    assert "step 2/3 reward 0.500 kv kept 31% 1.5s" in out

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("reward/mean")] == pytest.approx([0.25, 0.5, 0.75])


def test_metrics_logger_resume_truncates(tmp_path):
    run = tmp_path / "resume"
    _write_run(run, _rows(5))  # ends with a partial line
    log = MetricsLogger(run, tensorboard=False, progress="none")
    assert log.truncate_after(3) == 3
    log.log(4, {"reward/mean": 0.7})
    log.close()
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[-1]["reward/mean"] == 0.7
    assert (run / "metrics.jsonl").read_text().endswith("\n")


def test_logger_repairs_partial_line_on_open(tmp_path):
    run = _write_run(tmp_path / "p", _rows(2))
    with MetricsLogger(run, tensorboard=False, progress="none") as log:
        log.log(3, {"reward/mean": 0.3})
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]


def test_format_step_line():
    line = format_step_line(
        3,
        {
            "reward/mean": 0.41,
            "reward/accuracy": 0.41,
            "mismatch/k3_kl": 0.002,
            "rs/masked_frac": 0.05,
            "kv/kept_frac_final": 0.34,
            "kv/alloc_reduction": 4.5,
            "time/step_s": 12.3,
        },
        20,
    )
    assert line == "step 3/20 reward 0.410 acc 0.410 k3 0.002 masked 5.0% kv kept 34% kv alloc 1/4.5 12.3s"


def test_a_step_time_counts_each_second_once(tmp_path):
    """The step's time is ``time/step_s`` when logged, else the stations' sum (α's among them): a part of a
    station (generate in the rollout, push in the update) is never added again, in the step line, the
    report's total and its table."""
    from sparserl.runlog import step_seconds

    row = {
        "time/rollout_s": 2.0,
        "time/generate_s": 1.9,
        "time/reward_s": 0.5,
        "time/score_s": 1.0,
        "time/alpha_s": 1.25,
        "time/update_s": 1.5,
        "time/push_s": 0.25,
    }
    assert step_seconds(row) == 6.25
    assert step_seconds({**row, "time/step_s": 6.5}) == 6.5
    assert step_seconds({"reward/mean": 1.0}) is None
    assert format_step_line(1, row).endswith(" 6.2s")
    rows = [{"step": s, "reward/mean": 0.1, **row} for s in (1, 2)]
    run = _write_run(tmp_path / "r", rows, truncated_tail=False)
    make_report(run)
    text = (run / "report.md").read_text()
    assert "Total time 12.5 s, 6.25 s per step." in text
    assert "| push (part of update) | 0.25 |" in text and "| alpha | 1.25 | 20% |" in text
