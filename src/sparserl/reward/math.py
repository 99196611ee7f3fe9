"""Verifiable math reward: 1.0 if the response's final answer equals the label, else 0.0.

The rule follows Sparse-RL (Luo et al., 2026, arXiv 2601.10079; digest in ALGORITHMS.md §1):
"reward 1 if the last ``\\boxed{}`` equals the label (string-normalised or symbolic), else 0;
no format reward". Here:

1. The answer is the content of the LAST complete ``\\boxed{...}`` (or ``\\fbox{...}``, braces
   balanced) of the response; if there is none, the last number of the response (integers,
   decimals, negatives, fractions ``3/4`` or ``\\frac{3}{4}``, thousands commas ``1,234``).
2. A cheap comparison first: string-normalised equality, or, when both sides are plain numbers,
   equality after rounding to 6 decimals (so ``27.0 == 27``, ``\\frac{1}{2} == 0.5 == 1/2``).
3. Otherwise symbolic equivalence with ``math_verify`` (``parse`` + ``verify``).

Robustness: the whole call runs under one deadline (``timeout``, default 5 s). math_verify's own
timeouts (``parsing_timeout`` / ``timeout_seconds``) are built on ``signal.alarm``, which raises
in any thread but the main one and shares its timer with any other alarm, so they are switched off
here and replaced by a single per-call deadline: in the main thread a ``signal.setitimer`` timer
that interrupts sympy; in other threads the symbolic check runs in a helper thread that is
abandoned when the deadline passes. Parsed expressions whose evaluation would be astronomically
expensive (``2^{10^{10}}``, ``(10^{10})!``) are never handed to ``verify``. When verification
times out, raises or is skipped, the result of the string-normalised comparison stands.
"""

from __future__ import annotations

import logging
import math
import re
import signal
import threading
import time
from fractions import Fraction
from functools import lru_cache
from typing import Any, Callable, Sequence

__all__ = ["math_reward", "extract_answer", "extract_boxed", "extract_last_number",
           "normalize_label", "answers_equal", "DEFAULT_TIMEOUT_S"]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
#: answers longer than this are compared as strings only (no sympy).
MAX_SYMBOLIC_CHARS = 1000
#: answers nested deeper than this (brackets) are compared as strings only.
MAX_NESTING = 30
#: an expression whose estimated magnitude exceeds 10**this is not verified symbolically.
MAX_LOG10_MAGNITUDE = 100_000.0


class _Deadline(BaseException):
    """Raised when a reward call runs past its deadline (BaseException so that library code
    catching ``Exception`` cannot swallow it)."""


# ---------------------------------------------------------------------------------------------
# Answer extraction
# ---------------------------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOX_NOBRACE_RE = re.compile(r"\\boxed +([^\s${}]+)")
_NUMBER_RE = re.compile(
    r"(?<![\w)\]}])-?\s*\\[dt]?frac\s*\{\s*\d+\s*\}\s*\{\s*\d+\s*\}"  # \frac{3}{4}
    r"|(?<![\w.)\]}])-?\d+(?:\.\d+)?\s*/\s*\d+(?:\.\d+)?(?![\d.])"  # 3/4
    r"|(?<![\w.,)\]}])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)"  # 1,234.5
    r"|(?<![\w.)\]}])-?\d+(?:\.\d+)?"  # 12, -3.5
    r"|(?<![\w.)\]}])-?\.\d+"  # .5
)


def _balanced(text: str, start: int) -> int | None:
    """Index of the '}' closing the '{' at ``start - 1``, or None if it never closes."""
    depth = 1
    i = start
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in "{}":
            i += 2  # escaped brace \{ \} does not count
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last complete, non-empty ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``.

    Braces are matched (nested braces allowed, ``\\{`` ignored). A box that never closes (a
    response truncated at the length limit) or an empty box does not count. ``\\boxed 5`` (no
    braces) is accepted too. Returns None when there is no such box.
    """
    if not text:
        return None
    best: tuple[int, str] | None = None
    for m in _BOX_RE.finditer(text):
        end = _balanced(text, m.end())
        if end is None:
            continue
        content = text[m.end():end].strip()
        if content and (best is None or m.start() > best[0]):
            best = (m.start(), content)
    for m in _BOX_NOBRACE_RE.finditer(text):
        if best is None or m.start() > best[0]:
            best = (m.start(), m.group(1).strip())
    return None if best is None else best[1]


def extract_last_number(text: str) -> str | None:
    """The last number written in ``text`` (int, decimal, negative, ``3/4``, ``\\frac{3}{4}``,
    ``1,234``), as written (whitespace removed), or None."""
    if not text:
        return None
    last = None
    for m in _NUMBER_RE.finditer(text):
        last = m.group(0)
    if last is None:
        return None
    return re.sub(r"\s+", "", last)


def extract_answer(response: str) -> str | None:
    """The final answer of a response: last ``\\boxed{}`` content, else the last number."""
    boxed = extract_boxed(response)
    if boxed is not None:
        return boxed
    return extract_last_number(response)


# ---------------------------------------------------------------------------------------------
# Label normalisation and cheap comparison
# ---------------------------------------------------------------------------------------------

def _format_number(x: float | int) -> str:
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    if math.isfinite(x) and float(x).is_integer():
        return str(int(x))
    return repr(float(x))


def _strip_dollars(s: str) -> str:
    # remove unescaped $ (math delimiters); keep "\$" (currency) out as well: currency is noise
    s = re.sub(r"(?<!\\)\$", "", s)
    s = s.replace("\\$", "")
    return s.strip()


def normalize_label(label: Any) -> list[str]:
    """Turn a label into a list of answer strings.

    Numbers become strings without a trailing ``.0`` (``27.0`` → ``"27"``); strings lose ``$``
    delimiters; a label holding a whole solution uses its last ``\\boxed{}``; a list
    (OlympiadBench ``final_answer``) becomes one string per element. An empty result means the
    label is unusable.
    """
    if label is None:
        return []
    if isinstance(label, (list, tuple)):
        out: list[str] = []
        for item in label:
            out.extend(normalize_label(item))
        return out
    if isinstance(label, (int, float)):
        if isinstance(label, float) and not math.isfinite(label):
            return []
        return [_format_number(label)]
    s = str(label)
    boxed = extract_boxed(s) if ("\\boxed" in s or "\\fbox" in s) else None
    if boxed is not None:
        s = boxed
    s = _strip_dollars(s)
    return [s] if s else []


_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")


def _normalize_str(s: str) -> str:
    """String normalisation for the cheap comparison (and the fallback when sympy fails)."""
    s = _strip_dollars(s)
    s = _TEXT_CMD_RE.sub(r"\1", s)
    s = re.sub(r"\\(?:left|right|displaystyle)(?![a-zA-Z])", "", s)
    s = re.sub(r"\\[!,;: ]", "", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s)
    s = s.replace("\\%", "").replace("%", "")
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    return s


_INT_RE = re.compile(r"^[+-]?\d+$")
_DEC_RE = re.compile(r"^[+-]?(?:\d+\.\d*|\.\d+)$")
_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_SLASH_RE = re.compile(r"^([+-]?\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)$")
_FRAC_RE = re.compile(r"^([+-]?)\\frac\{([+-]?\d+)\}\{(\d+)\}$")
_FRAC_SHORT_RE = re.compile(r"^([+-]?)\\frac(\d)(\d)$")


def _as_number(s: str) -> Fraction | None:
    """Exact value of a plain number string (after ``_normalize_str``), or None."""
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
            return Fraction(m.group(1)) / den if den != 0 else None
        m = _FRAC_RE.match(s) or _FRAC_SHORT_RE.match(s)
        if m:
            den = Fraction(m.group(3))
            if den == 0:
                return None
            v = Fraction(m.group(2)) / den
            return -v if m.group(1) == "-" else v
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _cheap_equal(pred: str, gold: str) -> bool | None:
    """True/False when the cheap comparison decides, None when sympy should be asked."""
    a, b = _normalize_str(pred), _normalize_str(gold)
    if a == b:
        return True
    na, nb = _as_number(a), _as_number(b)
    if na is not None and nb is not None:
        # same rounding rule as math_verify's default (float_rounding=6)
        return round(na, 6) == round(nb, 6)
    return None


# ---------------------------------------------------------------------------------------------
# Symbolic comparison (math_verify) under a deadline
# ---------------------------------------------------------------------------------------------

class _DropTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:  # noqa: A003
        return "Timeout is disabled" not in record.getMessage()


_mv_ready = False


def _mv():
    """Import math_verify lazily (it pulls in sympy) and silence its 'timeout disabled' notice:
    the timeout is handled here."""
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
        base, exp = node.args
        mb = _log10_mag(base, depth + 1)
        me = _log10_mag(exp, depth + 1)
        if me is None:
            return None
        if me > 8:
            return math.inf
        return (10.0 ** me) * max(mb if mb is not None else 1.0, 0.0)
    if type(node).__name__ in _FACTORIALS:
        mn = _log10_mag(node.args[0], depth + 1)
        if mn is None:
            return None
        if mn > 8:
            return math.inf
        n = 10.0 ** mn
        return n * max(math.log10(n), 1.0)
    mags = [_log10_mag(a, depth + 1) for a in getattr(node, "args", ())]
    known = [m for m in mags if m is not None]
    if not known:
        return None
    if isinstance(node, sympy.Mul):
        return sum(known)
    return max(known) + 1.0


_FACTORIALS = ("factorial", "factorial2", "subfactorial", "gamma", "RisingFactorial",
               "FallingFactorial", "binomial")


def _too_expensive(parsed: Sequence[Any]) -> bool:
    """Whether any parsed expression would need an astronomically large number to evaluate."""
    try:
        import sympy
    except ImportError:  # pragma: no cover
        return False
    for expr in parsed:
        if not isinstance(expr, sympy.Basic):
            continue
        try:
            for node in sympy.preorder_traversal(expr):
                if isinstance(node, sympy.Pow) or type(node).__name__ in _FACTORIALS:
                    m = _log10_mag(node)
                    if m is not None and m > MAX_LOG10_MAGNITUDE:
                        return True
        except Exception:  # noqa: BLE001 - a weird tree: be safe
            return True
    return False


@lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple:
    mv = _mv()
    return tuple(mv.parse("\\boxed{" + gold + "}", parsing_timeout=None))


def _symbolic_equal(pred: str, gold: str) -> bool:
    """math_verify equivalence of two answer strings (no timeout of its own)."""
    mv = _mv()
    g = list(_parse_gold(gold))
    if not g:
        return False
    p = mv.parse("\\boxed{" + pred + "}", parsing_timeout=None)
    if not p:
        return False
    if _too_expensive(g) or _too_expensive(p):
        return False
    return bool(mv.verify(g, p, timeout_seconds=None))


def _call_with_deadline(fn: Callable[[], Any], seconds: float | None) -> Any:
    """Run ``fn()``; raise ``_Deadline`` if it has not returned after ``seconds``.

    Main thread: an ITIMER_REAL timer whose handler raises inside ``fn`` (a previously armed
    timer and handler are restored afterwards). Other threads: ``fn`` runs in a daemon helper
    thread that is abandoned on timeout (it may keep running in the background until it ends).
    """
    if seconds is None or seconds <= 0:
        return fn()
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        def _handler(signum, frame):  # noqa: ARG001
            raise _Deadline()

        old_handler = signal.signal(signal.SIGALRM, _handler)
        old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
        t0 = time.monotonic()
        try:
            return fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_handler)
            if old_delay > 0:  # re-arm the caller's timer with what was left of it
                left = max(old_delay - (time.monotonic() - t0), 1e-3)
                signal.setitimer(signal.ITIMER_REAL, left, old_interval)

    box: dict[str, Any] = {}

    def _run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    worker = threading.Thread(target=_run, name="sparserl-math-verify", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise _Deadline()
    if "error" in box:
        raise box["error"]
    return box.get("value")


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


_ARITH_CHARS = re.compile(r"^[\d.()+\-*/]+$")
_ARITH_OP = re.compile(r"[\d)]\s*[-+*/]\s*[\d(]")


def _is_unevaluated_arithmetic(s: str) -> bool:
    """Whether ``s`` is a bare arithmetic expression of numbers such as ``3+4`` or ``2\\cdot 5``
    (but not a single number or fraction)."""
    t = _normalize_str(s)
    for a, b in (("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"), ("\u00d7", "*"),
                 ("\u00b7", "*"), ("\u00f7", "/")):
        t = t.replace(a, b)
    return bool(_ARITH_CHARS.match(t) and _ARITH_OP.search(t)) and _as_number(t) is None


def _equal_one(pred: str, gold: str, deadline: float | None, strict_numbers: bool = True) -> bool:
    """Cheap comparison, then (time permitting) symbolic; failures fall back to the cheap one."""
    cheap = _cheap_equal(pred, gold)
    if cheap is not None:
        return cheap
    if strict_numbers and _as_number(_normalize_str(gold)) is not None \
            and _is_unevaluated_arithmetic(pred):
        return False  # "3+4" does not answer "7": sympy would evaluate it (a reward hack)
    if (len(pred) > MAX_SYMBOLIC_CHARS or len(gold) > MAX_SYMBOLIC_CHARS
            or _nesting(pred) > MAX_NESTING or _nesting(gold) > MAX_NESTING):
        return False
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
        return False
    try:
        return bool(_call_with_deadline(lambda: _symbolic_equal(pred, gold), left))
    except _Deadline:
        log.debug("math_reward: verification timed out for %r vs %r", pred[:80], gold[:80])
        return False
    except Exception as e:  # noqa: BLE001 - any sympy/parser failure means "not verified"
        log.debug("math_reward: verification failed for %r vs %r: %s", pred[:80], gold[:80], e)
        return False


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


def answers_equal(pred: str, label: Any, timeout: float | None = DEFAULT_TIMEOUT_S, *,
                  strict_numbers: bool = True) -> bool:
    """Whether an extracted answer string equals a label (see :func:`math_reward`)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    golds = normalize_label(label)
    if not golds or pred is None:
        return False
    pred = _strip_dollars(str(pred))
    if not pred:
        return False
    if len(golds) == 1:
        return _equal_one(pred, golds[0], deadline, strict_numbers)
    # several answers: each must match a distinct comma-separated part of the prediction
    parts = _split_top_level(pred)
    if len(parts) == len(golds):
        if all(_equal_one(p, g, deadline, strict_numbers) for p, g in zip(parts, golds)):
            return True
        remaining = list(parts)
        for g in golds:
            hit = next((i for i, p in enumerate(remaining)
                        if _equal_one(p, g, deadline, strict_numbers)), None)
            if hit is None:
                break
            remaining.pop(hit)
        else:
            return True
    # last resort: compare as one set, e.g. "1, 2" vs ["2", "1"] parsed as {1, 2}
    return _equal_one(pred, ", ".join(golds), deadline, strict_numbers)


def math_reward(response: str, label: Any, prompt: Any = None, *,
                timeout: float | None = DEFAULT_TIMEOUT_S, strict_numbers: bool = True) -> float:
    """Sparse-RL verifiable reward (arXiv 2601.10079, ALGORITHMS.md §1): 1.0 if the final answer
    of ``response`` equals ``label``, else 0.0.

    The final answer is the last complete ``\\boxed{}``/``\\fbox{}`` of the response, else its
    last number. ``label`` may be a LaTeX string, a number (``27.0`` ≡ ``27``) or a list (a
    one-element list is its element; with several elements all must appear, comma-separated, in
    the response's box, in any order). Equivalence: string-normalised or numeric equality first,
    then ``math_verify`` symbolic equivalence (``\\frac{1}{2}`` ≡ ``0.5`` ≡ ``1/2``). The call
    never takes much longer than ``timeout`` seconds (None: no limit) and never raises on odd
    input: a verification that times out or fails counts as "not equal". With
    ``strict_numbers`` (default), a numeric label is not matched by a bare unevaluated arithmetic
    expression (``\\boxed{3+4}`` vs ``7`` scores 0; sympy would evaluate it, which lets a policy
    copy the question into the box); ``3 + 4 = 7`` still scores 1. ``prompt`` is unused
    (it is there for the :class:`~sparserl.reward.registry.RewardFn` protocol).
    """
    if not isinstance(response, str):
        response = "" if response is None else str(response)
    try:
        pred = extract_answer(response)
        if pred is None:
            return 0.0
        return 1.0 if answers_equal(pred, label, timeout=timeout,
                                    strict_numbers=strict_numbers) else 0.0
    except _Deadline:
        return 0.0
