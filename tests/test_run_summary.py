"""The run summary (:mod:`sparserl.train.summary`) on constructed metrics: the headline's lines in place of its
own KV lines, the held-out line naming the sampler the evaluation ran, the skipped non-finite steps, and a
correction that silences most tokens."""

import json

from sparserl import runlog as names
from sparserl.train.summary import run_summary

ROWS = [
    {
        "step": s,
        names.REWARD_MEAN: r,
        names.KV_KEPT_FRAC: 0.25,
        names.KV_SAMPLER_ALLOC: 2**20,
        names.KV_DENSE_ALLOC: 4 * 2**20,
        names.KV_ALLOC_REDUCTION: 4.0,
        names.TIME_STEP: 30.0,
        names.SKIPPED_NONFINITE: k,
        names.eval_metric("sparse"): 0.5,
    }
    for s, r, k in ((1, 0.1, 1), (2, 0.3, 0))
]


def test_the_headline_replaces_the_kv_lines_and_the_eval_names_its_sampler(tmp_path):
    sampler = "rkv, per-bin budgets 0:12, 64:16 (the KV controller's budgets at this step)"
    record = {"step": 2, "sparse": {"pass@1": 0.5, "sampler": sampler}}
    (tmp_path / "eval-step00002.json").write_text(json.dumps(record))
    headline = ["KV allocated: 1/4.0 of a dense engine's", "verdict: no dense run to compare with"]
    text = run_summary(ROWS, tmp_path, tmp_path / "report.md", None, headline)
    assert "KV bytes" not in text and "KV tokens" not in text
    assert all(f"  {line}" in text.splitlines() for line in headline)
    assert f"pass@1 0.500 with sparse inference ({sampler})" in text
    assert "skipped     1 optimizer step(s)" in text
    plain = run_summary(ROWS, tmp_path, tmp_path / "report.md", None)  # no headline: the summary's own KV lines
    assert "KV bytes" in plain and "KV tokens" in plain


def test_a_correction_that_silences_most_tokens_is_named_with_the_keys_that_widen_it(tmp_path):
    silent = [{**row, names.MASKED_FRAC: 0.95} for row in ROWS]
    text = run_summary(silent, tmp_path, tmp_path / "report.md", None)
    assert "warning     95% of the tokens gave no gradient" in text and "algorithm.correction_options" in text
    usual = [{**row, names.MASKED_FRAC: 0.08} for row in ROWS]  # Sparse-RL's share on the main job
    assert "warning" not in run_summary(usual, tmp_path, tmp_path / "report.md", None)
