"""``sparserl bench step``: the per-arm summary (ratios as medians of per-round ratios, the rollout's share, the
peak as the largest round's) and one real round on the tiny model."""

from __future__ import annotations

import json

import pytest

from sparserl import runlog as names
from sparserl.bench.step import STATIONS, summarize
from sparserl.commands.bench.step import DEFAULT_ARMS, default_arms
from sparserl.config import load_config


def _run(step, rollout, alpha, peak):
    return {
        names.TIME_STEP: step,
        names.TIME_ROLLOUT: rollout,
        names.TIME_ALPHA: alpha,
        "rss_peak_bytes": peak,
        "response_tokens": 1000.0,
    }


def test_summary_ratios_are_medians_of_per_round_ratios():
    results = {
        "dense": [_run(10, 4, 1, 5), _run(20, 8, 2, 6), _run(10, 4, 1, 5)],
        "rkv": [_run(5, 1, 1, 3), _run(30, 6, 3, 4), _run(6, 2, 1, 9)],
    }
    out = summarize(results, "dense")
    # per-round step ratios 0.5, 1.5, 0.6 (median 0.6); rollout 0.25, 0.75, 0.5 (median 0.5)
    assert out["rkv"]["step_vs_baseline"] == pytest.approx(0.6)
    assert out["rkv"]["rollout_vs_baseline"] == pytest.approx(0.5)
    assert out["dense"]["step_vs_baseline"] == 1.0
    assert out["rkv"]["rss_peak_bytes"] == 9  # the largest round, not the median
    assert out["rkv"]["rollout_frac"] == pytest.approx(0.2)  # median of 0.2, 0.2, 1/3
    assert out["rkv"]["alpha_over_rollout"] == pytest.approx(0.5)  # median of 1.0, 0.5, 0.5
    assert out["rkv"][names.TIME_STEP] == 6


def test_default_arms_round_block_top_k_budget_to_pages():
    cfg = load_config("default")
    arms = default_arms(cfg)
    assert set(arms) == set(DEFAULT_ARMS)
    assert "rollout.kv_budget=48" in arms["blocktopk"]  # the default starts at 40 tokens
    assert not any("kv_budget" in o for n, o in arms.items() if n != "blocktopk")


def test_bench_step_runs_each_arm_on_tiny(tmp_path, capsys):
    from sparserl.cli import main

    out = tmp_path / "step.json"
    rc = main(
        [
            "bench",
            "step",
            "default",
            "model.name=tiny",
            "rollout.max_new_tokens=12",
            "train.prompts_per_step=2",
            "rollout.n=2",
            "data.eval=null",
            f"log.out_dir={tmp_path}",
            "--arm",
            "dense",
            "rollout.compressor=none",
            "rollout.kv_controller=null",
            "--arm",
            "rkv",
            "rollout.kv_controller=null",
            "--repeat",
            "2",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["baseline"] == "dense" and set(report["summary"]) == {"dense", "rkv"}
    for name in ("dense", "rkv"):
        assert len(report["rounds"][name]) == 2
        row = report["summary"][name]
        assert row["rss_peak_bytes"] > 100 * 2**20  # a trainer's weights and torch itself
        assert row[names.MEMORY_PREDICTED_PEAK] > 100 * 2**20  # preflight's prediction, logged by the step
        assert all(s in row for s in (names.TIME_ROLLOUT, names.TIME_UPDATE))
        assert sum(row[s] for s in STATIONS if s in row) <= row[names.TIME_STEP] * 1.05
    # the compressed arm's sampler holds less KV than the dense one
    assert report["summary"]["rkv"][names.KV_SAMPLER_ALLOC] < report["summary"]["dense"][names.KV_SAMPLER_ALLOC]
