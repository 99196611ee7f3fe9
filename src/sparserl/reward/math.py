"""Verifiable math reward: 1.0 if the response's final answer equals the label, else 0.0.

The rule follows Sparse-RL (Luo et al., 2026, arXiv 2601.10079; digest in docs/algorithms.md §1):
"reward 1 if the last ``\\boxed{}`` equals the label (string-normalised or symbolic), else 0;
no format reward".

What math-verify does (``math_verify.parse`` with ``LatexExtractionConfig(boxed_match_priority=0)``
for LaTeX answers and ``ExprExtractionConfig`` for a bare number, then ``math_verify.verify``):
LaTeX normalisation (``\\text``, ``\\left``/``\\right``, ``\\dfrac``, units, degrees, percent),
parsing to sympy, and equivalence (numeric to 6 decimals, symbolic, sets, tuples, intervals,
equations): ``\\frac{1}{2}`` ≡ ``0.5`` ≡ ``1/2``, ``(3,\\pi/2)`` ≡ ``\\left(3,\\frac{\\pi}{2}\\right)``,
``69, 84`` ≡ ``84, 69``.

What stays ours, and why:

* **Which answer**: the content of the LAST complete ``\\boxed{...}``/``\\fbox{...}`` (braces
  balanced; a box cut off by the length limit does not count), else the LAST number of the
  response. math-verify run on a whole response reads several boxes as one set
  (``\\boxed{3} ... \\boxed{4}`` → ``{3, 4}``), ignores ``\\fbox`` and prefers an expression to
  the last number (``10 - 3`` → 7), so it only ever sees the span chosen here.
* **Strict numbers**: a numeric label is not matched by a bare unevaluated arithmetic expression
  (``\\boxed{3+4}`` vs ``7`` scores 0; math-verify would evaluate it, which pays a policy for
  copying the question into the box). Plain numbers (``8`` ≡ ``8.0`` ≡ ``08``, ``1,234``, ``3/4``,
  ``\\frac{3}{4}``) are compared exactly here, in-process, without sympy.
* **Magnitude guard**: a parsed expression whose evaluation needs astronomically large numbers
  (``2^{10^{10}}``, ``(10^{10})!``, ``\\binom{10^8}{5\\cdot 10^7}``) is never handed to ``verify``.
* **Deadline**: every math-verify check runs in a checker process (:mod:`.pool`) under
  ``timeout`` seconds; one that overruns scores 0 and its worker is interrupted or killed, so no
  thread or process keeps burning CPU. math-verify's own ``signal.alarm`` timeouts are switched off
  (they work only in the main thread). Batches (:meth:`MathReward.score_batch`) submit all their
  checks at once, so the workers run in parallel.

A cheap in-process path decides first and cannot hang (linear scans, short regexes, integer
arithmetic): equal answer strings (after removing ``$`` and spacing) score 1, two plain numbers are
compared exactly. Only the rest goes to math-verify. ``workers=0`` runs math-verify in-process
with no time limit (tests, debugging).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any

from . import pool as _pool

__all__ = [
    "math_reward",
    "MathReward",
    "extract_answer",
    "extract_boxed",
    "extract_last_number",
    "normalize_label",
    "answers_equal",
    "symbolic_equal",
    "DEFAULT_TIMEOUT_S",
]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
#: answers longer than this are compared as strings only (no sympy).
MAX_SYMBOLIC_CHARS = 1000
#: answers nested deeper than this (brackets) are compared as strings only.
MAX_NESTING = 30
#: an expression whose estimated magnitude exceeds 10**this is not verified symbolically.
MAX_LOG10_MAGNITUDE = 100_000.0
#: the math-verify check run by the workers: ``symbolic_equal(pred, gold) -> bool``.
CHECK_REF = "sparserl.reward.math:symbolic_equal"


# ---------------------------------------------------------------------------------------------
# Which answer (ours): the last complete box, else the last number
# ---------------------------------------------------------------------------------------------

_BOX_TOKEN_RE = re.compile(r"\\[{}]|\\(?:boxed|fbox)\s*\{|[{}]")
_BOX_NOBRACE_RE = re.compile(r"\\boxed +([^\s${}]+)")
_NUMBER_RE = re.compile(
    r"(?<![\w)\]}])-?\s*\\[dt]?frac\s*\{\s*\d+\s*\}\s*\{\s*\d+\s*\}"  # \frac{3}{4}
    r"|(?<![\w.)\]}])-?\d+(?:\.\d+)?\s*/\s*\d+(?:\.\d+)?(?![\d.])"  # 3/4
    r"|(?<![\w.,)\]}])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)"  # 1,234.5
    r"|(?<![\w.)\]}])-?\d+(?:\.\d+)?"  # 12, -3.5
    r"|(?<![\w.)\]}])-?\.\d+"  # .5
)


def extract_boxed(text: str) -> str | None:
    """Content of the last complete, non-empty ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``.

    Braces are matched (nested braces allowed, ``\\{`` ignored) in one linear pass. A box that
    never closes (a response truncated at the length limit) or an empty box does not count.
    ``\\boxed 5`` (no braces) is accepted too. Returns None when there is no such box.
    """
    if not text or ("\\boxed" not in text and "\\fbox" not in text):
        return None
    best: tuple[int, str] | None = None
    depth = 0
    open_boxes: list[tuple[int, int, int]] = []  # (depth inside the box, content start, box start)
    for m in _BOX_TOKEN_RE.finditer(text):
        tok = m.group(0)
        if tok[0] == "\\" and len(tok) == 2:
            continue  # \{ or \}
        if tok == "}":
            if open_boxes and open_boxes[-1][0] == depth:
                _, cstart, bstart = open_boxes.pop()
                content = text[cstart : m.start()].strip()
                if content and (best is None or bstart > best[0]):
                    best = (bstart, content)
            depth = max(depth - 1, 0)
            continue
        depth += 1
        if tok != "{":
            open_boxes.append((depth, m.end(), m.start()))
    for m in _BOX_NOBRACE_RE.finditer(text):
        if best is None or m.start() > best[0]:
            best = (m.start(), m.group(1).strip())
    return None if best is None else best[1]


def extract_last_number(text: str) -> str | None:
    """The last number written in ``text`` (int, decimal, negative, ``3/4``, ``\\frac{3}{4}``,
    ``1,234``), as written (whitespace removed), or None. ``3 + 5 = 8`` → ``8``; ``10 - 3`` → ``3``."""
    if not text:
        return None
    last = None
    for m in _NUMBER_RE.finditer(text):
        last = m.group(0)
    return None if last is None else re.sub(r"\s+", "", last)


def extract_answer(response: str) -> str | None:
    """The final answer of a response: last ``\\boxed{}`` content, else the last number."""
    boxed = extract_boxed(response)
    return boxed if boxed is not None else extract_last_number(response)


# ---------------------------------------------------------------------------------------------
# Labels, and the cheap in-process comparison (ours)
# ---------------------------------------------------------------------------------------------


def _format_number(x: float | int) -> str:
    if isinstance(x, (bool, int)):
        return str(x)
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _strip_dollars(s: str) -> str:
    """Remove ``$`` math delimiters (and ``\\$`` currency signs)."""
    return re.sub(r"(?<!\\)\$", "", s).replace("\\$", "").strip()


def normalize_label(label: Any) -> list[str]:
    """The parts of a reference answer, as strings: the answer is all of them, in any order.

    An answer may have several parts ("determine all x": ``1, 3``). OlympiadBench's
    ``final_answer`` writes them either as list elements or comma-separated in one string
    (``["$69$,$84$"]``), so both give the same parts: a list gives its elements' parts, a string
    its comma-separated pieces outside brackets (``(1,2), (3,4)`` has two parts, ``(1,2)`` one;
    ``1,234`` is one number, ``1234``). A GSM8K answer keeps the number after ``####``, a solution
    its last ``\\boxed{}``; ``$`` delimiters go; numbers lose a trailing ``.0`` (``27.0`` →
    ``"27"``). ``", ".join(parts)`` gives the same parts back. An empty list means the label is
    unusable (None, NaN, empty text, a box never closed).
    """
    if label is None:
        return []
    if isinstance(label, (list, tuple)):
        return [s for item in label for s in normalize_label(item)]
    if isinstance(label, (int, float)):
        if isinstance(label, float) and not math.isfinite(label):
            return []
        return [_format_number(label)]
    s = str(label)
    if "####" in s:
        s = s.rsplit("####", 1)[1]
    elif "\\boxed" in s or "\\fbox" in s:
        s = extract_boxed(s)
        if s is None:
            return []
    s = _strip_dollars(s)
    if _THOUSANDS_RE.match(s):
        return [s.replace(",", "")]
    return _split_top_level(s)


def _canon(s: str) -> str:
    """Spacing-free form for the cheap comparison (math-verify does the real normalisation)."""
    s = _strip_dollars(s)
    s = re.sub(r"\\[!,;: ]", "", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return re.sub(r"\s+", "", s).rstrip(".")


_INT_RE = re.compile(r"^[+-]?\d+$")
_DEC_RE = re.compile(r"^[+-]?(?:\d+\.\d*|\.\d+)$")
_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_SLASH_RE = re.compile(r"^([+-]?\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)$")
_FRAC_RE = re.compile(r"^([+-]?)\\frac\{([+-]?\d+)\}\{(\d+)\}$")
_FRAC_SHORT_RE = re.compile(r"^([+-]?)\\frac(\d)(\d)$")


def _as_number(s: str) -> Fraction | None:
    """Exact value of a plain number string (after :func:`_canon`), or None."""
    if not s or len(s) > 100:
        return None
    try:
        if _INT_RE.match(s) or _DEC_RE.match(s):
            return Fraction(s)
        if _THOUSANDS_RE.match(s):
            return Fraction(s.replace(",", ""))
        m = _SLASH_RE.match(s)
        if m:
            den = Fraction(m.group(2))
            return Fraction(m.group(1)) / den if den else None
        m = _FRAC_RE.match(s) or _FRAC_SHORT_RE.match(s)
        if m:
            den = Fraction(m.group(3))
            if not den:
                return None
            v = Fraction(m.group(2)) / den
            return -v if m.group(1) == "-" else v
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _same_number(a: Fraction, b: Fraction) -> bool:
    return round(a, 6) == round(b, 6)  # math-verify's default float_rounding=6


_ARITH_CHARS = re.compile(r"^[\d.()+\-*/]+$")
_ARITH_OP = re.compile(r"[\d)]\s*[-+*/]\s*[\d(]")


def _is_unevaluated_arithmetic(s: str) -> bool:
    """Whether ``s`` is a bare arithmetic expression of numbers such as ``3+4`` or ``2\\cdot 5``
    (but not a single number or fraction)."""
    t = _canon(s)
    for a, b in (
        ("\\times", "*"),
        ("\\cdot", "*"),
        ("\\div", "/"),
        ("\u00d7", "*"),
        ("\u00b7", "*"),
        ("\u00f7", "/"),
        ("\\left", ""),
        ("\\right", ""),
    ):
        t = t.replace(a, b)
    return bool(_ARITH_CHARS.match(t) and _ARITH_OP.search(t)) and _as_number(t) is None


def _nesting(s: str) -> int:
    """Deepest bracket nesting of ``s`` (parsers are slow on deeply nested junk)."""
    depth = best = 0
    for c in s:
        if c in "([{":
            depth += 1
            best = max(best, depth)
        elif c in ")]}":
            depth = max(depth - 1, 0)
    return best


def _split_top_level(s: str) -> list[str]:
    """Split at commas that are not inside (), [], {}."""
    parts, depth, cur = [], 0, []
    for c in s:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(depth - 1, 0)
        if c == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def _plan_one(pred: str, gold: str, strict_numbers: bool):
    a, b = _canon(pred), _canon(gold)
    if a == b:
        return 1.0
    na, nb = _as_number(a), _as_number(b)
    if na is not None and nb is not None:
        return 1.0 if _same_number(na, nb) else 0.0
    if strict_numbers and nb is not None and _is_unevaluated_arithmetic(pred):
        return 0.0  # "3+4" does not answer "7"
    if (
        len(pred) > MAX_SYMBOLIC_CHARS
        or len(gold) > MAX_SYMBOLIC_CHARS
        or _nesting(pred) > MAX_NESTING
        or _nesting(gold) > MAX_NESTING
    ):
        return 0.0
    return (pred, gold)


def _plan_answer(pred: Any, label: Any, strict_numbers: bool):
    """Decide an extracted answer against a label in-process (a float), or return the
    ``(pred, gold)`` pair math-verify must check."""
    golds = normalize_label(label)
    if not golds or pred is None:
        return 0.0
    pred = _strip_dollars(str(pred))
    if not pred:
        return 0.0
    if len(golds) == 1:
        return _plan_one(pred, golds[0], strict_numbers)
    # several parts: all must appear, comma-separated, in any order
    parts = _split_top_level(pred)
    if sorted(map(_canon, parts)) == sorted(map(_canon, golds)):
        return 1.0
    nums_p = [_as_number(_canon(p)) for p in parts]
    nums_g = [_as_number(_canon(g)) for g in golds]
    if None not in nums_p and None not in nums_g:
        return 1.0 if (sorted(round(x, 6) for x in nums_p) == sorted(round(x, 6) for x in nums_g)) else 0.0
    return _plan_one(pred, ", ".join(golds), strict_numbers)  # math-verify compares them as sets


# ---------------------------------------------------------------------------------------------
# The math-verify check (runs in a worker) and the magnitude guard (ours)
# ---------------------------------------------------------------------------------------------


class _DropTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


_mv_ready = False


def _mv():
    """Import math_verify lazily (it pulls in sympy) and silence its 'timeout disabled' notice:
    the deadline is the pool's."""
    global _mv_ready
    import math_verify

    if not _mv_ready:
        for name in ("math_verify", "math_verify.parser", "math_verify.grader", "math_verify.utils"):
            logging.getLogger(name).addFilter(_DropTimeoutWarning())
        _mv_ready = True
    return math_verify


def _log10(v: int) -> float:
    v = abs(int(v))
    return math.log10(v) if v else 0.0


_FACTORIALS = ("factorial", "factorial2", "subfactorial", "gamma", "RisingFactorial", "FallingFactorial", "binomial")


def _log10_mag(node: Any, depth: int = 0) -> float | None:
    """Rough log10 of the size of the numbers met when evaluating a numeric sympy expression
    (``inf`` when hopeless), or None when unknown (symbols)."""
    import sympy

    if depth > 50:
        return math.inf
    if isinstance(node, sympy.Integer):
        return _log10(node)
    if isinstance(node, sympy.Rational):
        return max(_log10(node.p), _log10(node.q))
    if isinstance(node, sympy.Float):
        try:
            x = abs(float(node))
            return math.log10(x) if x else 0.0
        except (OverflowError, ValueError):
            return math.inf
    if isinstance(node, sympy.Pow):
        mb = _log10_mag(node.args[0], depth + 1)
        me = _log10_mag(node.args[1], depth + 1)
        if me is None:
            return None
        if me > 8:
            return math.inf
        return (10.0**me) * max(mb if mb is not None else 1.0, 0.0)
    if type(node).__name__ in _FACTORIALS:
        mn = _log10_mag(node.args[0], depth + 1)
        if mn is None:
            return None
        if mn > 8:
            return math.inf
        n = 10.0**mn
        return n * max(math.log10(n), 1.0)
    known = [m for m in (_log10_mag(a, depth + 1) for a in getattr(node, "args", ())) if m is not None]
    if not known:
        return None
    if isinstance(node, sympy.Mul):
        return sum(known)
    return max(known) + 1.0


def _too_expensive(parsed: Sequence[Any]) -> bool:
    """Whether any parsed expression would need an astronomically large number to evaluate."""
    import sympy

    for expr in parsed:
        if not isinstance(expr, sympy.Basic):
            continue
        try:
            for node in sympy.preorder_traversal(expr):
                if isinstance(node, sympy.Pow) or type(node).__name__ in _FACTORIALS:
                    m = _log10_mag(node)
                    if m is not None and m > MAX_LOG10_MAGNITUDE:
                        return True
        except Exception:  # a weird tree: be safe
            return True
    return False


def _parse(answer: str) -> list:
    """math-verify's parse of one answer span: LaTeX (as the content of a box), else a plain
    expression/number."""
    mv = _mv()
    parsed = mv.parse(
        "\\boxed{" + answer + "}", [mv.LatexExtractionConfig(boxed_match_priority=0)], parsing_timeout=None
    )
    if not parsed:
        parsed = mv.parse(answer, [mv.ExprExtractionConfig()], parsing_timeout=None)
    return parsed


@lru_cache(maxsize=4096)
def _parse_cached(answer: str) -> tuple:
    return tuple(_parse(answer))


def symbolic_equal(pred: str, gold: str) -> bool:
    """math-verify equivalence of two answer spans (``parse`` both, ``verify``), with the
    magnitude guard in between. No time limit of its own: the pool's worker runs it under the
    deadline. False when either side does not parse."""
    g = list(_parse_cached(gold))
    if not g:
        return False
    p = list(_parse_cached(pred))
    if not p or _too_expensive(g) or _too_expensive(p):
        return False
    return bool(_mv().verify(g, p, timeout_seconds=None))


def warm_up() -> None:
    """Import math-verify and run one check (the workers call this before they say ready)."""
    symbolic_equal("\\frac{1}{2}", "0.5")


def _run_checks(pairs: Sequence[tuple[str, str]], timeout: float | None, workers: int | None) -> list[bool]:
    """math-verify on each ``(pred, gold)``: in the pool under ``timeout`` (an overrun, a failure
    or a dead worker is False), or in-process with no limit when ``workers == 0`` or when already
    inside a worker."""
    if workers == 0 or _pool.in_worker():
        out = []
        for pred, gold in pairs:
            try:
                out.append(symbolic_equal(pred, gold))
            except Exception as e:  # any sympy/parser failure means "not verified"
                log.debug("math_reward: verification failed for %r vs %r: %s", pred[:80], gold[:80], e)
                out.append(False)
        return out
    outcomes = _pool.get_pool(workers).run([(CHECK_REF, pair) for pair in pairs], timeout)
    result = []
    for (pred, gold), (status, value) in zip(pairs, outcomes):
        if status != "ok":
            log.debug("math_reward: %s for %r vs %r (%s)", status, pred[:80], gold[:80], value)
        result.append(status == "ok" and bool(value))
    return result


# ---------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------


def _score(
    items: Sequence[tuple[Any, Any]], *, timeout: float | None, strict_numbers: bool, workers: int | None, extract: bool
) -> list[float]:
    """Score ``(response_or_answer, label)`` pairs: cheap path in-process, the rest in one batch of
    math-verify checks (identical checks are run once)."""
    scores = [0.0] * len(items)
    pending: dict[tuple[str, str], list[int]] = {}
    for i, (text, label) in enumerate(items):
        try:
            if extract:
                if not isinstance(text, str):
                    text = "" if text is None else str(text)
                text = extract_answer(text)
            plan = _plan_answer(text, label, strict_numbers)
        except Exception as e:  # odd input scores 0, never raises
            log.debug("math_reward: cannot read response %d: %s", i, e)
            plan = 0.0
        if isinstance(plan, tuple):
            pending.setdefault(plan, []).append(i)
        else:
            scores[i] = plan
    if pending:
        try:
            results = _run_checks(list(pending), timeout, workers)
        except Exception as e:  # e.g. no process can be started: not verified
            log.warning("math_reward: checks failed: %s: %s", type(e).__name__, e)
            results = [False] * len(pending)
        for idx, ok in zip(pending.values(), results):
            for i in idx:
                scores[i] = 1.0 if ok else 0.0
    return scores


def answers_equal(
    pred: str,
    label: Any,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    *,
    strict_numbers: bool = True,
    workers: int | None = None,
) -> bool:
    """Whether an extracted answer string equals a label (see :func:`math_reward`)."""
    return (
        _score([(pred, label)], timeout=timeout, strict_numbers=strict_numbers, workers=workers, extract=False)[0]
        == 1.0
    )


def math_reward(
    response: str,
    label: Any,
    prompt: Any = None,
    *,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    strict_numbers: bool = True,
    workers: int | None = None,
) -> float:
    """Sparse-RL verifiable reward (arXiv 2601.10079, docs/algorithms.md §1): 1.0 if the final answer
    of ``response`` equals ``label``, else 0.0.

    The final answer is the last complete ``\\boxed{}``/``\\fbox{}`` of the response, else its last
    number. ``label`` may be a LaTeX string, a number (``27.0`` ≡ ``27``) or a list; a label of
    several parts (:func:`normalize_label`: list elements, or comma-separated in a string) needs
    all of them, comma-separated, in the response's box, in any order. Equal strings and plain
    numbers are decided in-process; anything else by math-verify (``\\frac{1}{2}`` ≡ ``0.5`` ≡
    ``1/2``) in a checker process under ``timeout`` seconds (None: no limit); ``workers=0``:
    in-process, no limit. Never raises on odd input: a check that overruns or fails counts as "not
    equal". With ``strict_numbers`` (default) a numeric label is not matched by a bare unevaluated
    arithmetic expression (``\\boxed{3+4}`` vs ``7`` scores 0); ``3 + 4 = 7`` still scores 1.
    ``prompt`` is unused (it is there for the :class:`~sparserl.reward.registry.RewardFn`
    protocol). For many responses use :class:`MathReward` (``score_batch`` runs the checks in
    parallel).
    """
    return _score([(response, label)], timeout=timeout, strict_numbers=strict_numbers, workers=workers, extract=True)[0]


class MathReward:
    """The built-in ``"math"`` reward with its settings bound: ``timeout_s`` per math-verify check
    (``reward.timeout_s``), ``workers`` (None: the shared pool's default size; 0: in-process, no
    time limit) and ``strict_numbers``. Callable like :func:`math_reward`; :meth:`score_batch`
    scores a whole batch with all its checks submitted at once."""

    __name__ = "math_reward"

    def __init__(
        self, timeout_s: float | None = DEFAULT_TIMEOUT_S, *, workers: int | None = None, strict_numbers: bool = True
    ):
        self.timeout_s = timeout_s
        self.workers = workers
        self.strict_numbers = strict_numbers

    def __repr__(self) -> str:
        return f"MathReward(timeout_s={self.timeout_s}, workers={self.workers}, strict_numbers={self.strict_numbers})"

    def start(self) -> None:
        """Start the checker processes now, in the background (they take about a second)."""
        if self.workers != 0 and not _pool.in_worker():
            _pool.get_pool(self.workers).start()

    def __call__(self, response: str, label: Any, prompt: Any = None) -> float:
        return self.score_batch([response], [label])[0]

    def score_batch(
        self, responses: Sequence[str], labels: Sequence[Any], prompts: Sequence[Any] | None = None
    ) -> list[float]:
        """Scores of ``responses`` against ``labels`` (``prompts`` is unused)."""
        return _score(
            list(zip(responses, labels)),
            timeout=self.timeout_s,
            strict_numbers=self.strict_numbers,
            workers=self.workers,
            extract=True,
        )
