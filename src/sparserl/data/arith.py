"""A seeded generator of small arithmetic word problems with tunable difficulty.

Meant as a task that a tiny model (SmolLM2-135M-Instruct) partly solves, so that a GRPO run on a
CPU shows a reward signal: it gets one-digit sums right roughly 40% of the time at temperature
0.7 and two-digit sums about 3%. Each example is a short chat prompt that asks for the answer in
``\\boxed{}``; the label is the exact integer result as a string, and ``meta["expression"]`` is a
Python expression that evaluates to it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from .example import Example

__all__ = ["make_arith", "ARITH_DIFFICULTY", "BOXED_SUFFIX"]

BOXED_SUFFIX = "Put the final answer in \\boxed{}."

#: presets for ``difficulty=``: digits per operand, operations, number of terms.
ARITH_DIFFICULTY: dict[int, dict] = {
    1: dict(digits=1, ops=("+",), terms=2),
    2: dict(digits=1, ops=("+", "-"), terms=2),
    3: dict(digits=1, ops=("+", "-"), terms=3),
    4: dict(digits=2, ops=("+",), terms=2),
    5: dict(digits=2, ops=("+", "-"), terms=2),
    6: dict(digits=2, ops=("+", "-"), terms=3),
    7: dict(digits=2, ops=("+", "-", "*"), terms=3),
}

_NAMES = ["Tom", "Anna", "Ben", "Mia", "Sam", "Lily", "Max", "Emma", "Leo", "Zoe", "Jack", "Ella"]
_ITEMS = [
    "apples",
    "marbles",
    "stickers",
    "books",
    "pencils",
    "cookies",
    "coins",
    "cards",
    "toy cars",
    "shells",
    "balloons",
    "stamps",
]
_FOOD = {"apples", "cookies"}

_ADD_CLAUSES = [
    "{name} gets {b} more.",
    "{name} buys {b} more.",
    "A friend gives {name} {b} more.",
    "Then {name} finds {b} more.",
]
_SUB_CLAUSES = [
    "{name} gives away {b}.",
    "{name} loses {b}.",
    "{name} gives {b} to a friend.",
]
_QUESTIONS = [
    "How many {items} does {name} have now?",
    "How many {items} does {name} have?",
    "How many {items} does {name} have in the end?",
]
_PLAIN = [
    "What is {expr}?",
    "Compute {expr}.",
    "Calculate {expr}.",
    "What is the value of {expr}?",
    "Find {expr}.",
]
_SYMBOL = {"+": "+", "-": "-", "*": "\u00d7"}


def _operand(rng: random.Random, digits: int) -> int:
    lo = 1 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(lo, 10**digits - 1)


def _make_terms(rng: random.Random, digits: int, ops: Sequence[str], terms: int):
    """Operands and operators applied left to right; subtraction never goes below zero."""
    lo = 1 if digits == 1 else 10 ** (digits - 1)
    value = _operand(rng, digits)
    nums, chosen = [value], []
    for _ in range(terms - 1):
        op = rng.choice(list(ops))
        if op == "-" and value < lo and "+" in ops:
            op = "+"
        if op == "-":
            b = rng.randint(min(lo, value), min(10**digits - 1, value))
            value -= b
        elif op == "*":
            b = rng.randint(lo, 10**digits - 1) if digits > 1 else rng.randint(2, 9)
            value *= b
        else:
            b = _operand(rng, digits)
            value += b
        nums.append(b)
        chosen.append(op)
    return nums, chosen, value


def _expression(nums: Sequence[int], ops: Sequence[str], symbols: bool) -> str:
    """Left-to-right expression, parenthesised where precedence would differ."""
    expr = str(nums[0])
    low = False  # whether expr is a sum/difference at top level
    for op, b in zip(ops, nums[1:]):
        if op == "*" and low:
            expr = f"({expr})"
        expr = f"{expr} {_SYMBOL[op] if symbols else op} {b}"
        low = op in "+-"
    return expr


def make_arith(
    n: int,
    seed: int = 0,
    digits: int = 1,
    ops: Sequence[str] = ("+",),
    terms: int = 2,
    word_problems: bool = True,
    *,
    difficulty: int | None = None,
) -> list[Example]:
    """Generate ``n`` arithmetic problems, deterministically for a given ``seed``.

    ``digits``: digits per operand (1 → 1..9, 2 → 10..99, ...); ``ops``: operations among
    ``"+"``, ``"-"`` (results never negative) and ``"*"``; ``terms``: operands per problem;
    ``word_problems``: mix short word problems ("Tom has 3 apples and gets 4 more...") with plain
    ones ("What is 3 + 4?"), about two word problems for one plain one; False gives plain ones
    only (multiplication and 3+ terms also use the plain form). ``difficulty`` (1..7) selects a
    preset from :data:`ARITH_DIFFICULTY` instead (1 = one-digit addition, the default task).
    The first ``k`` problems of ``make_arith(n, seed)`` do not depend on ``n``.
    Returns :class:`Example` s whose prompt is ``[{"role": "user", "content": ...}]`` ending in
    "Put the final answer in \\boxed{}.", whose label is the integer result, and whose meta
    holds ``expression`` (Python, evaluates to the label), ``question`` (without the suffix) and
    ``index``.
    """
    if difficulty is not None:
        if difficulty not in ARITH_DIFFICULTY:
            raise ValueError(f"arith: difficulty must be one of {sorted(ARITH_DIFFICULTY)}, got {difficulty}")
        preset = ARITH_DIFFICULTY[difficulty]
        digits, ops, terms = preset["digits"], preset["ops"], preset["terms"]
    if isinstance(ops, str):
        ops = tuple(ops)
    ops = tuple(ops)
    if n < 0:
        raise ValueError(f"arith: n must be >= 0, got {n}")
    if digits < 1 or digits > 9:
        raise ValueError(f"arith: digits must be in 1..9, got {digits}")
    if terms < 2:
        raise ValueError(f"arith: terms must be >= 2, got {terms}")
    if not ops or any(op not in _SYMBOL for op in ops):
        raise ValueError(f"arith: ops must be a non-empty subset of {sorted(_SYMBOL)}, got {ops!r}")

    rng = random.Random(seed)
    out: list[Example] = []
    for i in range(n):
        nums, chosen, value = _make_terms(rng, digits, ops, terms)
        expr_py = _expression(nums, chosen, symbols=False)
        word_ok = word_problems and "*" not in chosen
        use_word = word_ok and rng.random() < 2 / 3
        if use_word:
            name = rng.choice(_NAMES)
            items = rng.choice(_ITEMS)
            first_items = items[:-1] if nums[0] == 1 else items  # "1 apple"
            parts = [f"{name} has {nums[0]} {first_items}."]
            for op, b in zip(chosen, nums[1:]):
                pool = _ADD_CLAUSES if op == "+" else _SUB_CLAUSES
                if op == "-" and items in _FOOD:
                    pool = pool + ["{name} eats {b}."]
                parts.append(rng.choice(pool).format(name=name, b=b))
            if len(nums) == 2 and rng.random() < 0.5:  # "Tom has 3 apples and gets 4 more."
                second = parts[1]
                if second.startswith(name + " "):
                    parts = [parts[0][:-1] + " and " + second[len(name) + 1 :]]
            parts.append(rng.choice(_QUESTIONS).format(items=items, name=name))
            question = " ".join(parts)
        else:
            question = rng.choice(_PLAIN).format(expr=_expression(nums, chosen, symbols=True))
        content = f"{question} {BOXED_SUFFIX}"
        out.append(
            Example(
                prompt=[{"role": "user", "content": content}],
                label=str(value),
                meta={"source": "arith", "index": i, "expression": expr_py, "question": question, "seed": seed},
            )
        )
    return out
