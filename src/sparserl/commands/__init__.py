"""The ``sparserl`` subcommands, one module each: ``add_parser(subparsers, parents)`` registers the
command's options and help (and sets ``fn`` to its :func:`run`), ``run(args) -> int`` checks the options
before any work and runs it. :mod:`sparserl.cli` assembles the parser from them, in :data:`COMMANDS`'s
order, and holds the error policy; nothing else imports this package.

- :mod:`.train`, :mod:`.config`, :mod:`.rollout`, :mod:`.demo`, :mod:`.eval`, :mod:`.report`,
  :mod:`.compare`, :mod:`.calibrate`;
- :mod:`.bench`: ``sparserl bench`` with its own subcommands (``rollout``, ``learner``, ``setup-openvino``),
  one module each;
- :mod:`.options`: the options and checks several commands share.
"""

from . import bench, calibrate, compare, config, demo, eval, report, rollout, train

#: the commands in the order ``sparserl --help`` lists them
COMMANDS = (train, config, rollout, demo, eval, report, compare, calibrate, bench)

__all__ = ["COMMANDS"]
