"""Options and checks that several commands share."""

from __future__ import annotations

from pathlib import Path

from ..checks import check_choice, check_int, check_number
from ..errors import OptionError

#: the sampler dtypes a command's ``--dtype`` takes
DTYPES = ("auto", "float32", "bfloat16", "float16")


def add_sampler_options(p, budget_default=256, step_default=128) -> None:
    """The sampler's KV compression options (``--compressor``, ``--kv-budget``, ...) on ``p``; they are read
    by :func:`sparserl.checks.check_sampler_options`."""
    p.add_argument("--compressor", default="none", help="none, rkv, snapkv, streaming, h2o")
    p.add_argument("--kv-budget", type=int, default=budget_default)
    p.add_argument("--step-length", type=int, default=step_default)
    p.add_argument("--trigger", default="step_length", choices=["step_length", "newline"])
    p.add_argument("--window", type=int, default=None)
    p.add_argument(
        "--tail-slack",
        type=int,
        default=None,
        help="spare KV slots past budget + step length: a "
        "compression due when the rest of the generation fits in them is skipped",
    )
    p.add_argument("--compressor-options", default=None, help="JSON, e.g. '{\"lam\": 0.1}'")


def add_config_arguments(p, overrides_help: str = "dotted overrides, e.g. rollout.kv_budget=64") -> None:
    """The positional ``config`` (a YAML file or a preset name) and ``overrides`` of the commands that
    resolve a config (``sparserl config``, ``sparserl bench learner``)."""
    p.add_argument("config", nargs="?", default=None, help="a YAML file or a preset name (default: 'default')")
    p.add_argument("overrides", nargs="*", help=overrides_help)


def split_config_arg(args) -> None:
    """``sparserl train key=value ...``: a first positional that is an override (not a file) joins the
    overrides, so the config is left out (``default``, or the run's own with ``--resume``)."""
    if args.config is not None and "=" in args.config and not Path(args.config).exists():
        args.overrides = [args.config, *args.overrides]
        args.config = None


def check_generation_args(args, *, top: bool = False) -> None:
    """``--n``, ``--max-new-tokens``, ``--temperature``, ``--dtype`` (and with ``top``: ``--top-p``,
    ``--top-k``, ``--stop``)."""
    check_int(args.n, "--n", 1, what="samples per prompt")
    check_int(args.max_new_tokens, "--max-new-tokens", 1)
    check_number(args.temperature, "--temperature", ge=0, what="0 = greedy")
    if top:
        check_number(args.top_p, "--top-p", gt=0, le=1)
        check_int(args.top_k, "--top-k", 0, what="0 = off")
        for s in args.stop or []:
            if not s:
                raise OptionError("--stop '': a stop string must not be empty")
    check_choice(args.dtype, "--dtype", DTYPES)
