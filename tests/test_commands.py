"""The command line as modules: every ``sparserl`` subcommand is one module of ``sparserl.commands`` with its
``add_parser`` and ``run``; ``sparserl eval``'s checks name the option at fault; ``sparserl config`` runs
the checks ``train`` runs before it loads the model."""

from __future__ import annotations

import argparse

import pytest

from sparserl import cli, commands
from sparserl.commands import bench


def run_cli(argv, capsys) -> tuple[int, str]:
    rc = cli.main(argv)
    return rc, capsys.readouterr().err


def test_every_command_is_one_module_with_add_parser_and_run():
    names = []
    for module in (*commands.COMMANDS, *bench.SUBCOMMANDS):
        assert callable(module.add_parser), module.__name__
        if module is not bench:
            assert callable(module.run), module.__name__
        names.append(module.__name__.rpartition(".")[2])
    assert names == [
        "train",
        "config",
        "rollout",
        "demo",
        "eval",
        "report",
        "compare",
        "calibrate",
        "bench",
        "rollout",
        "learner",
        "step",
        "step_cost",
        "setup_openvino",
    ]


def test_the_parser_runs_each_commands_own_run():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == [
        "train",
        "config",
        "rollout",
        "demo",
        "eval",
        "report",
        "compare",
        "calibrate",
        "bench",
    ]
    assert parser.parse_args(["eval"]).fn is commands.eval.run
    assert parser.parse_args(["bench", "learner"]).fn is bench.learner.run
    assert parser.parse_args(["bench", "setup-openvino"]).fn is bench.setup_openvino.run
    assert parser.parse_args(["train", "--debug"]).debug  # the common options reach every command


@pytest.mark.parametrize(
    "argv, option",
    [
        (["--prompt-key", ""], "--prompt-key"),
        (["--label-key", " "], "--label-key"),
        (["--template", "Solve this."], "--template"),
    ],
)
def test_eval_blames_the_option_not_the_data(argv, option, capsys, tmp_path):
    """A bad data option is named, before --data (a file that does not exist) is read."""
    rc, err = run_cli(["eval", "--model", "tiny", "--data", str(tmp_path / "none.jsonl"), *argv], capsys)
    assert rc == 1
    assert err.startswith(f"error: {option} ") and "--data" not in err and len(err.strip().splitlines()) == 1


def test_eval_takes_a_template_with_problem(capsys, tmp_path):
    rc, err = run_cli(
        ["eval", "--model", "tiny", "--data", str(tmp_path / "none.jsonl"), "--template", "Q: {problem}"], capsys
    )
    assert rc == 1 and err.startswith("error: --data ")  # the template passed; the missing file is next


def test_config_runs_trains_checks_before_printing(capsys):
    """``sparserl config`` fails where ``train`` would before loading the model: a reward module that does not
    import ends in one line naming reward.fn, and nothing is printed."""
    rc = cli.main(
        ["config", "rollout.dtype=float32", "model.mixed_precision=off", "reward.fn=sparserl_no_such_module:score"]
    )
    out, err = capsys.readouterr()
    assert rc == 1 and "reward:" not in out  # no config printed
    assert err.startswith("error: reward.fn") and len(err.strip().splitlines()) == 1
