"""The run's headline: KV allocated and kept against dense, α's tail against the controller's threshold (else
Sparrow's), the final reward, and a verdict only where one is measured; the report opens with the same lines."""

import json

from sparserl.config import Config, config_to_dict
from sparserl.eval.report import headline, make_report
from sparserl.train.headline import headline_lines

NO_DENSE = "no dense run to compare with: `sparserl compare default --arms dense,default --seeds 6` measures it"


def _rows(n=8, reward=0.1, alpha=True, alloc=2**21, dense_alloc=2**23, kept=0.25):
    rows = []
    for s in range(1, n + 1):
        r = {
            "step": s,
            "reward/mean": round(reward * s, 4),
            "reward/verifier_mean": round(reward * s, 4),
            "kv/sampler_alloc_bytes": alloc,
            "kv/dense_alloc_bytes": dense_alloc,
            "kv/alloc_reduction": dense_alloc / alloc,
            "kv/kept_frac_final": kept,
            "kv/kept_tokens_final": 80 * kept,
            "kv/dense_tokens_final": 80,
        }
        if alpha:
            r.update(
                {
                    "mismatch/alpha_p5": 0.9,
                    "mismatch/alpha_p5_bin/0": 0.95,
                    "mismatch/alpha_p5_bin/128": 0.8 if s in (2, 7, 8) else 0.9,
                }
            )
            if s >= 4:
                r["mismatch/alpha_p5_bin/256"] = 0.84
        rows.append(r)
    return rows


def _controller_cfg(threshold=0.86):
    return Config.model_validate(
        {
            "name": "default",
            "rollout": {
                "compressor": "rkv",
                "kv_controller": {"threshold": threshold, "min_budget": 48, "max_budget": 128},
            },
        }
    )


def test_a_controller_run_reads_its_alpha_tail_against_the_controller_threshold():
    lines = headline_lines(_rows(), _controller_cfg(0.85))
    assert (
        lines[0] == "KV allocated: 1/4.0 of a dense engine's for the same batches (mean 2.00 MiB vs 8.00 MiB per step)"
    )
    assert lines[1] == "KV tokens held at each response's end: 20 kept vs 80 dense, 25% (1/4.0)"
    assert lines[2] == (
        "α tail (5th percentile per length bin) against the controller's threshold 0.85 "
        "(rollout.kv_controller.threshold): at the last step (8) 2 of 3 bins below (bin 128: 0.8, "
        "bin 256: 0.84); 6 of 8 steps had a bin below"
    )
    assert lines[3] == "final reward (reward/verifier_mean, mean of the last 5 steps): 0.6 (first step 0.1, last 0.8)"
    assert lines[4] == f"verdict: {NO_DENSE} (a single run cannot tell whether its compression costs reward)"
    assert len(lines) == 5 and not any("parity" in line or "as good as" in line for line in lines)
    # the same lines from the config as config.yaml holds it
    assert headline_lines(_rows(), config_to_dict(_controller_cfg(0.85))) == lines


def test_a_dense_run_says_it_is_the_reference_and_claims_no_saving():
    cfg = Config.model_validate({"name": "default", "rollout": {"compressor": "none"}})
    rows = _rows(alloc=2**23, kept=1.0)
    lines = headline_lines(rows, cfg)
    assert lines[0] == "KV allocated: as much as a dense engine (1/1.0; rollout.compressor=none keeps every token)"
    assert lines[1] == "KV tokens held at each response's end: 80 kept vs 80 dense, 100% (1/1.0)"
    assert "against Sparrow's threshold 0.86 (no controller: rollout.kv_controller is unset)" in lines[2]
    assert lines[-1].startswith("verdict: none, this run is the dense reference")
    assert not any("no dense run" in line for line in lines)


def test_a_run_without_alpha_says_it_was_not_measured():
    lines = headline_lines(_rows(alpha=False), Config(name="default"))
    assert lines[2] == (
        "α tail: not measured (mismatch.alpha=off): how far the sampler is from the dense policy is unknown"
    )
    assert lines[-1] == f"verdict: {NO_DENSE} (a single run cannot tell whether its compression costs reward)"
    assert headline(_rows(alpha=False), None)["alpha"] is None


def test_a_dense_run_given_states_the_paired_difference():
    dense = _rows(reward=0.12, alloc=2**23, kept=1.0)
    lines = headline_lines(_rows(), _controller_cfg(), dense_rows=dense)
    assert lines[-1] == (
        "versus the dense run (same seed, the last 5 steps both logged): final reward 0.6 vs 0.72, "
        "paired difference -0.120; KV allocated 1/4.0 of the dense run's; one seed pair gives no 95% "
        "interval: `sparserl compare default --arms dense,default --seeds 6` gives one"
    )
    assert not any(line.startswith("verdict: no dense run") for line in lines)
    h = headline(_rows(), None, dense_rows=dense)
    assert h["versus_dense"]["pairs"] == 5 and h["versus_dense"]["steps"] == [4, 5, 6, 7, 8]


def test_the_reward_read_is_the_verifiers_and_a_resumed_step_counts_once():
    rows = [{"step": 1, "reward/mean": 0.5}, {"step": 2, "reward/mean": 0.1}, {"step": 2, "reward/mean": 0.3}]
    lines = headline_lines(rows, None)
    assert "final reward (reward/mean, mean of the last 2 steps): 0.4 (first step 0.5, last 0.3)" in lines
    assert lines[0] == "KV allocated: not logged"
    assert lines[-1].startswith("verdict: no dense run to compare with: `sparserl compare CONFIG --arms dense,base")


def test_the_report_opens_with_the_same_headline(tmp_path):
    from sparserl.config import save_config

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    save_config(_controller_cfg(0.85), run / "config.yaml")
    md = make_report(run).read_text()
    section = md.split("## Headline\n\n")[1].split("\n\n")[0].splitlines()
    assert section == [f"- {line}" for line in headline_lines(_rows(), _controller_cfg(0.85))]
    assert md.index("## Headline") < md.index("## Training")
    # the α table reads the same threshold as the headline
    assert (
        "against the controller's threshold 0.85" in md and "| metric | last | worst (step) | steps below 0.85 |" in md
    )
