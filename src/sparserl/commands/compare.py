"""``sparserl compare``: every arm × seed as an ordinary training run, then one comparison.

    sparserl compare CONFIG [key=value ...] --arms dense,sparse_naive,sparse_rl --seeds 3 \\
        [--steps N] [--eval DATA [--eval-limit N] [--eval-n N]] [--collapse-k3 X] [--paired-against ARM,...] --out DIR

The checks and the runs are :func:`sparserl.compare.comparison.compare`'s; this module holds the options.
"""

from __future__ import annotations

import shlex

from ..compare.aggregate import COLLAPSE_K3
from ..compare.comparison import DEFAULT_ARMS


def add_parser(subparsers, parents=()):
    c = subparsers.add_parser(
        "compare", parents=list(parents), help="arms x seeds as training runs, then one comparison (plots, table)"
    )
    c.add_argument("config", nargs="?", default="default", help="a YAML file or a preset name (every arm's base)")
    c.add_argument("overrides", nargs="*", help="dotted overrides shared by every arm")
    c.add_argument(
        "--arms",
        action="append",
        help="comma-separated: dense, sparse_naive, sparse_rl, base, "
        "preset:<name>, NAME=key=value;key=value, or NAME=preset:<name>;key=value (a variant of a preset) "
        "(default dense,sparse_naive,sparse_rl)",
    )
    c.add_argument("--seeds", type=int, default=3, help="runs per arm, train.seed = 0 .. N-1")
    c.add_argument("--seed-list", default=None, help="explicit seeds instead, e.g. 0,1,2")
    c.add_argument("--steps", type=int, default=None, help="train.steps of every run")
    c.add_argument("--eval", default=None, help="held-out set: evaluate each final model, dense and sparse")
    c.add_argument("--eval-limit", type=int, default=None)
    c.add_argument("--eval-n", type=int, default=1)
    c.add_argument("--eval-temperature", type=float, default=0.0)
    c.add_argument("--collapse-k3", type=float, default=1.0, help="k3 KL above which a seed counts as collapsed")
    c.add_argument(
        "--paired-against",
        default=None,
        metavar="ARM[,ARM]",
        help="arms every other arm is also compared with seed by seed (as with the dense arm), e.g. "
        "sparse_rl; finished runs and evaluations are reused, so adding it later only rewrites the report",
    )
    c.add_argument("--out", required=True, help="folder of the runs (runs/) and the comparison")
    c.set_defaults(fn=run)
    return c


def command_line(args) -> str:
    """The ``sparserl compare`` command the parsed ``args`` stand for."""
    parts = ["sparserl", "compare", args.config, *args.overrides, "--arms", ",".join(args.arms or [DEFAULT_ARMS])]
    parts += ["--seed-list", args.seed_list] if args.seed_list else ["--seeds", str(args.seeds)]
    for opt, val in (("--steps", args.steps), ("--eval", args.eval), ("--eval-limit", args.eval_limit)):
        if val is not None:
            parts += [opt, str(val)]
    if args.eval is not None:
        parts += ["--eval-n", str(args.eval_n), "--eval-temperature", f"{args.eval_temperature:g}"]
    if args.collapse_k3 != COLLAPSE_K3:
        parts += ["--collapse-k3", f"{args.collapse_k3:g}"]
    if getattr(args, "paired_against", None):
        parts += ["--paired-against", args.paired_against]
    return shlex.join([*parts, "--out", str(args.out)])


def run(args) -> int:
    """``sparserl compare``: the parsed arguments to :func:`~sparserl.compare.comparison.compare` (errors are
    SparserlErrors)."""
    from ..compare.comparison import compare

    compare(
        args.config,
        args.overrides,
        args.arms or DEFAULT_ARMS,
        args.seeds,
        out=args.out,
        seed_list=args.seed_list,
        steps=args.steps,
        eval_data=args.eval,
        eval_limit=args.eval_limit,
        eval_n=args.eval_n,
        eval_temperature=args.eval_temperature,
        collapse_k3=args.collapse_k3,
        command=command_line(args),
        paired_against=args.paired_against,
    )
    return 0
