"""``sparserl report``: plots and a markdown summary of a run folder."""

from __future__ import annotations

from pathlib import Path

from ..checks import check_output_dir
from ..errors import OptionError


def add_parser(subparsers, parents=()):
    rp = subparsers.add_parser("report", parents=list(parents), help="plots and a markdown summary of a run")
    rp.add_argument("run_dir")
    rp.set_defaults(fn=run)
    return rp


def run(args) -> int:
    from ..eval.report import make_report
    from ..train.run_folder import is_run_folder

    folder = Path(args.run_dir)
    if not folder.exists():
        raise OptionError(f"report: run folder {folder} does not exist")
    if not is_run_folder(folder):
        raise OptionError(f"report: {folder} is not a run folder (no config.yaml, metrics.jsonl or checkpoints/)")
    check_output_dir(folder, "report: run folder")
    path = make_report(folder)
    print(f"report: {path}")
    return 0
