"""``sparserl bench``: benchmarks, one subcommand a module: :mod:`.rollout` (``bench rollout``),
:mod:`.learner` (``bench learner``), :mod:`.step` (``bench step``), :mod:`.step_cost`
(``bench step-cost``), :mod:`.setup_openvino`
(``bench setup-openvino``)."""

from __future__ import annotations

from . import learner, rollout, setup_openvino, step, step_cost

#: the subcommands in the order ``sparserl bench --help`` lists them
SUBCOMMANDS = (rollout, learner, step, step_cost, setup_openvino)


def add_parser(subparsers, parents=()):
    b = subparsers.add_parser("bench", parents=list(parents), help="benchmarks")
    bsub = b.add_subparsers(dest="bench", required=True)
    for command in SUBCOMMANDS:
        command.add_parser(bsub, parents)
    return b
