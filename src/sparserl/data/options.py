"""The command-line options that say how a data set reads, shared by the commands that read one
(``sparserl eval``, ``sparserl calibrate``): which columns hold the prompt and the label, and the
prompt's form. They mean what the config's ``data.*`` keys of the same names mean."""

from __future__ import annotations

import argparse

from .loaders import DataError, LoadedData, load_dataset

__all__ = ["add_data_options", "load_from_options"]


def add_data_options(parser: argparse.ArgumentParser, *, system_prompt_help: str = "") -> None:
    """``--prompt-key``, ``--label-key``, ``--template`` and ``--system-prompt`` on ``parser``."""
    parser.add_argument(
        "--prompt-key",
        default=None,
        help="as data.prompt_key: the column holding the prompt "
        "(default: a built-in set's own, else guessed: prompt, problem, question, ...)",
    )
    parser.add_argument(
        "--label-key",
        default=None,
        help="as data.label_key: the column holding the reference "
        "answer (default: a built-in set's own, else guessed: label, answer, solution, ...)",
    )
    parser.add_argument("--template", default=None, help="as data.template: the text around a problem, with {problem}")
    parser.add_argument(
        "--system-prompt",
        default=None,
        help="as data.system_prompt: a system message put first"
        + (f" ({system_prompt_help})" if system_prompt_help else ""),
    )


def load_from_options(args: argparse.Namespace) -> LoadedData:
    """``args.data`` (at most ``args.limit`` examples) read with the options above (an option ``args`` lacks
    is left at its default); an error names
    ``--data`` and, for a column that cannot be guessed, the option to set."""
    try:
        return load_dataset(
            args.data,
            limit=getattr(args, "limit", None),
            **{key: getattr(args, key, None) for key in ("prompt_key", "label_key", "template", "system_prompt")},
            key_options=("--prompt-key", "--label-key"),
        )
    except DataError as e:
        raise type(e)(f"--data {args.data}: {e}") from None
