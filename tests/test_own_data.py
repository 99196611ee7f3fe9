"""A user's own data and reward reach every command that reads a data set: the columns of the training
set, of the run's evaluation set (``data.eval_prompt_key`` / ``data.eval_label_key``, else the training
set's columns where the evaluation file has them), ``sparserl eval`` (``--prompt-key``, ``--label-key``,
``--reward``), ``sparserl rollout --prompt-key``, ``sparserl calibrate`` and ``sparserl compare --eval``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparserl import cli
from sparserl.config import DataConfig, load_config
from sparserl.data import DataError, load_dataset
from sparserl.train.eval_set import load_eval_set
from sparserl.train.trainer import train

ROWS = [{"q": f"What is {a} + {b}?", "ans": str(a + b), "id": a} for a, b in ((1, 2), (3, 4), (2, 2))]


def asked_a_sum(response: str, label: str, prompt: str | None = None) -> float:
    """1 when the reward is handed the problem as asked (the third parameter), else 0."""
    return float(isinstance(prompt, str) and prompt.startswith("Q: What is") and "+" in prompt)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_preferred_columns_are_tried_before_the_common_names(tmp_path):
    both = _jsonl(tmp_path / "both.jsonl", [{"prompt": "p", "q": "question?", "answer": "1", "ans": "7"}])
    (ex,) = load_dataset(str(both), preferred_keys=("q", "ans"))
    assert "question?" in ex.prompt[-1]["content"]
    assert ex.label == "7"
    (plain,) = load_dataset(str(both))  # without a preference: the common names
    assert plain.label == "1"
    (ex,) = load_dataset(str(both), preferred_keys=("missing", "gone"))  # absent preferences: the guess
    assert ex.label == "1"


def test_a_column_that_cannot_be_guessed_names_the_callers_option(tmp_path):
    own = _jsonl(tmp_path / "own.jsonl", ROWS)
    with pytest.raises(DataError, match=r"columns are \['ans', 'id', 'q'\]\); name it with prompt_key=<column>"):
        load_dataset(str(own))
    with pytest.raises(DataError, match=r"name it with data\.prompt_key=<column>"):
        load_dataset(str(own), key_options=("data.prompt_key", "data.label_key"))
    with pytest.raises(DataError, match=r"name it with --label-key <column>"):
        load_dataset(str(own), prompt_key="q", key_options=("--prompt-key", "--label-key"))


def test_the_evaluation_file_gets_the_training_sets_columns(tmp_path):
    own = _jsonl(tmp_path / "own.jsonl", ROWS)
    other = _jsonl(tmp_path / "other.jsonl", [{"problem": "1+1", "answer": "2"}])
    data = DataConfig(prompt_key="q", label_key="ans", eval=str(own), eval_limit=2, template="Q: {problem}")
    examples = load_eval_set(data)
    assert [e.label for e in examples] == ["3", "7"]  # data.eval_limit
    assert examples[0].prompt[-1]["content"] == "Q: What is 1 + 2?"  # the training set's prompt form
    assert len(load_eval_set(data, limit=None)) == 3
    # a file without the training set's columns: its own, guessed
    assert [e.label for e in load_eval_set(data, str(other))] == ["2"]
    # eval keys of its own win; an absent one is an error naming it
    assert [
        e.label
        for e in load_eval_set(
            DataConfig(eval_prompt_key="problem", eval_label_key="answer", prompt_key="q", label_key="ans"), str(other)
        )
    ] == ["2"]
    with pytest.raises(DataError, match="missing key 'q'"):
        load_eval_set(DataConfig(eval_prompt_key="q"), str(other))
    with pytest.raises(DataError, match=r"name it with data\.eval_prompt_key=<column>"):
        load_eval_set(DataConfig(), str(own))


def test_a_run_trains_and_evaluates_on_its_own_columns(tmp_path):
    """data.train and data.eval are files with the columns q / ans: set once, for both (before, the
    evaluation set's columns were guessed and the run stopped at its preflight)."""
    from test_train import cfg_for

    own = _jsonl(tmp_path / "own.jsonl", ROWS)
    cfg = cfg_for(
        tmp_path,
        "train.steps=1",
        f"data.train={own}",
        f"data.eval={own}",
        "data.prompt_key=q",
        "data.label_key=ans",
        "data.eval_limit=2",
        "eval.max_new_tokens=2",
        "data.template='Q: {problem}'",
        "reward.fn=test_own_data:asked_a_sum",
    )
    run = train(cfg, run_dir=tmp_path / "run", log=lambda *_: None)
    record = json.loads((run / "eval-step00001.json").read_text())
    assert record["dense"]["problems"] == 2 and record["dense"]["pass@1"] == 1.0
    (row,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["reward/mean"] == 1.0  # training's reward got the prompt too


def test_eval_command_reads_its_columns_and_scores_with_the_reward_named(tmp_path):
    own = _jsonl(tmp_path / "own.jsonl", ROWS)
    out = tmp_path / "eval.json"
    assert (
        cli.main(
            [
                "eval",
                "--model",
                "tiny",
                "--data",
                str(own),
                "--prompt-key",
                "q",
                "--label-key",
                "ans",
                "--template",
                "Q: {problem}",
                "--reward",
                "test_own_data:asked_a_sum",
                "--max-new-tokens",
                "2",
                "--dtype",
                "float32",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    record = json.loads(out.read_text())
    assert record["reward"] == "test_own_data:asked_a_sum"
    assert [(r["problems"], r["pass@1"]) for r in record["runs"]] == [(3, 1.0)]  # the math reward would give 0


def test_rollout_command_reads_the_prompt_key(tmp_path):
    own = _jsonl(tmp_path / "own.jsonl", ROWS)
    out = tmp_path / "r.jsonl"
    assert (
        cli.main(
            [
                "rollout",
                "--model",
                "tiny",
                "--prompts",
                str(own),
                "--prompt-key",
                "q",
                "--n",
                "1",
                "--max-new-tokens",
                "2",
                "--dtype",
                "float32",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert len(out.read_text().splitlines()) == 3


def test_calibrate_and_compare_read_the_same_columns(tmp_path):
    from test_compare import TINY

    from sparserl.commands.calibrate import command_line
    from sparserl.compare import CompareError
    from sparserl.compare.comparison import plan
    from sparserl.data.options import load_from_options

    own = _jsonl(tmp_path / "own.jsonl", ROWS)
    args = cli.build_parser().parse_args(
        [
            "calibrate",
            "--model",
            "tiny",
            "--data",
            str(own),
            "--prompt-key",
            "q",
            "--label-key",
            "ans",
            "--json",
            str(tmp_path / "c.json"),
        ]
    )
    assert [e.label for e in load_from_options(args)] == ["3", "7", "4"]
    assert "--prompt-key q --label-key ans" in command_line(args)
    # compare --eval checks the set as each run's evaluation will read it: with the runs' columns
    p = plan(
        "default",
        [*TINY, "data.prompt_key=q", "data.label_key=ans", f"data.train={own}"],
        "dense",
        1,
        out=tmp_path / "o",
        eval_data=str(own),
    )
    assert p.specs[0].cfg.data.prompt_key == "q"
    with pytest.raises(CompareError, match=r"--eval .*own\.jsonl.*data\.eval_prompt_key=<column>"):
        plan("default", TINY, "dense", 1, out=tmp_path / "o2", eval_data=str(own))
    assert load_config("sparse_rl_fixed40", ["data.eval_label_key=ans"]).data.eval_label_key == "ans"


def half_point(response: str, label: str) -> float:
    return 0.5


def raises(response: str, label: str) -> float:
    raise ValueError("a broken reward")


def test_weighted_rewards_sum_their_parts_and_the_first_is_the_verifier():
    """reward.fn as a list with reward.weights (TRL's reward_funcs / reward_weights): R = Σ w_k r_k, each
    part's values kept, failed calls counted over the parts, the first part the verifier."""
    from sparserl.reward.weighted import WeightedReward, load_rewards, score_rewards, verifier

    reward = load_rewards(
        ["test_own_data:asked_a_sum", "test_own_data:half_point", "test_own_data:raises"], [1.0, 0.4, 2.0]
    )
    assert isinstance(reward, WeightedReward)
    scores = score_rewards(reward, ["a", "b"], ["3", "7"], ["Q: What is 1 + 2?", "no sum here"])
    assert scores.total == pytest.approx([1.0 + 0.4 * 0.5, 0.4 * 0.5])
    assert scores.parts == {
        "test_own_data:asked_a_sum": [1.0, 0.0],
        "test_own_data:half_point": [0.5, 0.5],
        "test_own_data:raises": [0.0, 0.0],
    }
    assert scores.errors == 2
    assert verifier(reward) is reward.parts[0][1]
    one = load_rewards("test_own_data:half_point")  # a name with weight 1: the reward itself
    assert not isinstance(one, WeightedReward) and verifier(one) is one
    assert score_rewards(one, ["a"], ["1"]).total == [0.5] and score_rewards(one, ["a"], ["1"]).parts == {}
    scaled = load_rewards("test_own_data:half_point", [3.0])
    assert score_rewards(scaled, ["a"], ["1"]).total == [1.5]


@pytest.mark.parametrize(
    "overrides, problem",
    [
        (["reward.fn=[math, test_own_data:half_point]", "reward.weights=[1.0]"], "1 weights for the 2 reward"),
        (["reward.fn=[math, math]"], "'math' twice"),
        (["reward.fn=[]"], r"reward.fn=\[\]"),
        (["reward.weights=[1.0, 2.0]"], "2 weights for the 1 reward"),
    ],
)
def test_reward_lists_that_do_not_add_up_are_config_errors(overrides, problem):
    from sparserl.config import ConfigError, validate

    with pytest.raises(ConfigError, match=problem):
        validate(load_config("sparse_rl_fixed40", overrides))


def test_a_run_logs_each_part_of_its_weighted_reward(tmp_path):
    from test_train import cfg_for

    own = _jsonl(tmp_path / "own.jsonl", ROWS)
    cfg = cfg_for(
        tmp_path,
        "train.steps=1",
        f"data.train={own}",
        "data.prompt_key=q",
        "data.label_key=ans",
        "data.template='Q: {problem}'",
        f"data.eval={own}",
        "data.eval_limit=1",
        "eval.max_new_tokens=2",
        "reward.fn=[test_own_data:half_point, test_own_data:asked_a_sum]",
        "reward.weights=[2.0, 0.25]",
    )
    run = train(cfg, run_dir=tmp_path / "run", log=lambda *_: None)
    (row,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["reward/part/test_own_data:half_point"] == 0.5 and row["reward/part/test_own_data:asked_a_sum"] == 1.0
    assert row["reward/mean"] == pytest.approx(2.0 * 0.5 + 0.25 * 1.0)
    assert row["reward/accuracy"] == 0.0  # the verifier (the first part) gives 0.5: no response passes
    record = json.loads((run / "eval-step00001.json").read_text())
    # held-out evaluation reads the verifier alone (the weighted sum would average 1.25); its 0.5 is no pass
    assert record["dense"]["avg@1"] == 0.5 and record["dense"]["pass@1"] == 0.0


@pytest.mark.parametrize("n", [1, 2])
def test_pass_at_1_counts_passes_at_any_n(tmp_path, n):
    """A partial-credit reward (0.5 a response): avg@n is its mean and pass@1 the fraction of samples with
    reward >= 1, at n = 1 as at n > 1 (pass@1 used to be the mean at n > 1 and the pass fraction at n = 1)."""
    own = _jsonl(tmp_path / "own.jsonl", ROWS)
    out = tmp_path / "eval.json"
    assert (
        cli.main(
            [
                "eval",
                "--model",
                "tiny",
                "--data",
                str(own),
                "--prompt-key",
                "q",
                "--label-key",
                "ans",
                "--reward",
                "test_own_data:half_point",
                "--n",
                str(n),
                "--temperature",
                "1.0",
                "--max-new-tokens",
                "2",
                "--dtype",
                "float32",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    (run,) = json.loads(out.read_text())["runs"]
    assert (run[f"avg@{n}"], run["pass@1"], run[f"pass@{n}"]) == (0.5, 0.0, 0.0)
