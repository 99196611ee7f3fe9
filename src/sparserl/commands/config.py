"""``sparserl config``: the resolved, validated config a ``sparserl train`` with the same arguments would
run (YAML that ``sparserl train FILE`` reads back), or with ``--keys`` every key's type, default and help.

Before it prints, the config passes every check ``train`` makes before it loads the model
(:func:`sparserl.preflight.preflight`: the model's path, reward modules, LoRA targets, the data, the
predicted peak memory), so a config that prints is one that starts; the prediction and its limit are a
comment line of the header."""

from __future__ import annotations

import shlex

from ..errors import OptionError
from .options import add_config_arguments, split_config_arg


def add_parser(subparsers, parents=()):
    cf = subparsers.add_parser(
        "config",
        parents=list(parents),
        help="the resolved config a train command would run, or every key's help (--keys)",
    )
    add_config_arguments(cf)
    cf.add_argument(
        "--keys",
        nargs="?",
        const="",
        default=None,
        metavar="TEXT",
        help="list every key (type, default, help) instead; with TEXT, only the lines that hold it",
    )
    cf.set_defaults(fn=run)
    return cf


def run(args) -> int:
    from ..config import config_help, config_yaml, load_config, validate
    from ..memory import memory_line
    from ..preflight import preflight

    if args.keys is not None:
        if args.config is not None or args.overrides:
            raise OptionError(
                "--keys lists every key's default and help: give it no config or override "
                "(leave --keys out to see a config resolved)"
            )
        text = config_help(args.keys or None)
        if not text:
            raise OptionError(f"--keys {args.keys!r}: no key or help text holds it")
        print(text)
        return 0
    split_config_arg(args)
    cfg = validate(load_config(args.config or "default", args.overrides))
    prediction = preflight(cfg)
    command = shlex.join(["sparserl", "config", *([args.config] if args.config else []), *args.overrides])
    print(
        config_yaml(
            cfg,
            [
                command,
                "'auto' values (rollout.dtype, model.mixed_precision, algorithm.old_logprobs) "
                "resolve when a run starts; its config.yaml says to what",
                memory_line(cfg, prediction),
            ],
            title="sparserl config",
        ),
        end="",
    )
    return 0
