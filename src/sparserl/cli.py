"""The ``sparserl`` command: train, config, rollout, eval, report, compare, calibrate, bench, demo (each
a module of :mod:`sparserl.commands`, which registers its options and runs it).

Every command checks its options (numbers, output paths, files) before it loads a model or generates
anything. A problem with the user's input is a :class:`~sparserl.errors.SparserlError`: ``main`` prints
``error: <message>`` and returns 1, without a traceback (``--debug`` or ``SPARSERL_DEBUG=1`` shows it).
Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from .commands import COMMANDS
from .errors import SparserlError

DEBUG_ENV = "SPARSERL_DEBUG"
_DEBUG_HELP = f"show the traceback of an error (or set {DEBUG_ENV}=1)"


DESCRIPTION = """\
Reinforcement learning of language models with verifiable rewards on a compressed sampler (sparse KV
cache, quantized weights), with the sampler/policy mismatch corrected.

  sparserl train                      the main job on the embedded model (a preset, a YAML file, key=value)
  sparserl config --keys [TEXT]       every config key, its default and help

Every command checks its options before it loads a model. A problem with the input ends in one
'error:' line; --debug (or SPARSERL_DEBUG=1) shows the traceback."""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: ``--debug``, and every command's own (:data:`sparserl.commands.COMMANDS`)."""
    ap = argparse.ArgumentParser(
        prog="sparserl", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    common = argparse.ArgumentParser(add_help=False)  # --debug after the command too
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for command in COMMANDS:
        command.add_parser(sub, parents=[common])
    return ap


def _debug(args) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "").strip().lower() not in (
        "",
        "0",
        "false",
        "no",
    )


def quiet_progress_bars_off_terminal() -> None:
    """Where stderr is not a terminal (a log file, CI), turn off the Hugging Face libraries' progress bars
    ("Loading weights", "Writing model shards"): there they are carriage-return noise in the log, as the
    run's own live display would be (``log.progress: auto`` prints a line per step instead). A value the
    user set for ``HF_HUB_DISABLE_PROGRESS_BARS`` wins; transformers reads it when first imported."""
    isatty = getattr(sys.stderr, "isatty", None)
    if not (isatty and isatty()):
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code. A :class:`SparserlError` (bad input) prints ``error:
    <message>`` on stderr and returns 1 (with ``--debug`` / ``SPARSERL_DEBUG=1`` after its traceback);
    any other exception propagates with its traceback: it is a bug."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # overrides after an option (train default --run-dir R train.steps=5) join the others
        if isinstance(getattr(args, "overrides", None), list) and all(
            "=" in x and not x.startswith("-") for x in extra
        ):
            args.overrides = [*args.overrides, *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    quiet_progress_bars_off_terminal()
    try:
        if os.environ.get("SPARSERL_NATIVE_ARCH"):  # a build the user asked for fails before any work
            from .rollout import native

            native.library()
        return args.fn(args)
    except SparserlError as e:
        if _debug(args):
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
