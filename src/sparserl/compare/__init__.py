"""``sparserl compare``: arms × seeds as ordinary training runs, then one comparison.

- ``arms.py``: parse ``--arms`` and expand arms × seeds into run specs (configs validated first);
- ``runner.py``: run them one at a time, skipping finished runs and resuming killed ones;
- ``aggregate.py``: per arm, seeds aligned by step (mean, min-max band), final reward, best step,
  the collapse rule, KV and time means (pure functions);
- ``evals.py``: ``--eval``: final models under dense and sparse inference;
- ``report.py``: plots, ``comparison.md``, ``comparison.json``;
- ``comparison.py``: :func:`plan` and :func:`compare` (the Python API; the command is
  :mod:`sparserl.commands.compare`).
"""

from .arms import BUILTIN_ARMS, Arm, CompareError, RunSpec, expand, parse_arms
from .comparison import compare, plan

__all__ = ["Arm", "BUILTIN_ARMS", "CompareError", "RunSpec", "compare", "expand", "parse_arms", "plan"]
