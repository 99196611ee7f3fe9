"""Tests of the verifiable math reward (docs/algorithms.md §1) and the reward registry."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sparserl.errors import SparserlError
from sparserl.reward import (
    CheckPool,
    MathReward,
    RewardSpecError,
    RewardTimeout,
    answers_equal,
    extract_answer,
    extract_boxed,
    extract_last_number,
    get_pool,
    load_reward,
    math_reward,
    score_responses,
)
from sparserl.reward import math as reward_math
from sparserl.reward import pool as reward_pool

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
MATH500 = DATA / "math500" / "test.jsonl"


def _math500_answers() -> list[str]:
    if not MATH500.exists():
        pytest.skip(f"{MATH500} not found")
    return [json.loads(line)["answer"] for line in MATH500.read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------
# MATH-500: every answer matches itself, and not its neighbour's answer
# --------------------------------------------------------------------------------------------


def test_math500_answer_matches_itself():
    answers = _math500_answers()
    assert len(answers) == 500
    ok = [math_reward(f"Thus the answer is $\\boxed{{{a}}}$.", a) for a in answers]
    assert sum(ok) >= 0.99 * len(answers), [a for a, r in zip(answers, ok) if r != 1.0]


def test_math500_answer_parses_symbolically():
    # the cheap string path decides the test above; here the math-verify check must agree too
    # (in-process: its parses are cached for the next test)
    answers = _math500_answers()
    ok = [reward_math.symbolic_equal(a, a) for a in answers]
    assert sum(ok) >= 0.99 * len(answers), [a for a, r in zip(answers, ok) if not r]


def _neighbour_pairs(answers):
    pairs = [(a, answers[(i + 1) % len(answers)]) for i, a in enumerate(answers)]
    return [(a, b) for a, b in pairs if a.strip() != b.strip()]


def test_math500_answer_differs_from_next_problem():
    pairs = _neighbour_pairs(_math500_answers())
    scores, n_err = score_responses(
        load_reward("math", workers=0), [f"\\boxed{{{a}}}" for a, _ in pairs], [b for _, b in pairs]
    )
    assert n_err == 0
    assert len(scores) >= 490
    assert sum(scores) <= 0.01 * len(scores)


def test_math500_pool_agrees_with_in_process():
    pairs = _neighbour_pairs(_math500_answers())[:24]
    pairs += [(a, a.replace(" ", "")) for a, _ in pairs]
    responses, labels = [f"\\boxed{{{a}}}" for a, _ in pairs], [b for _, b in pairs]
    # one batch: the math-verify checks run in parallel in the checker processes
    pooled, n_err = score_responses(load_reward("math"), responses, labels)
    assert n_err == 0
    assert pooled == MathReward(workers=0).score_batch(responses, labels)
    assert sum(pooled) >= 20


# --------------------------------------------------------------------------------------------
# Hand cases
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pred,label",
    [
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{0.5}", "\\frac{1}{2}"),
        ("\\boxed{1/2}", "\\frac{1}{2}"),
        ("\\boxed{\\dfrac12}", "1/2"),
        ("\\boxed{27.0}", "27"),
        ("\\boxed{27}", 27.0),
        ("\\boxed{27}", "27.0"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}"),  # symbolic path
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "(3,\\pi/2)"),
        ("\\boxed{1,234}", "1234"),
        ("\\fbox{7}", "7"),
        ("The answer is $\\boxed{\\text{Evelyn}}$.", "\\text{Evelyn}"),
    ],
)
def test_equivalent_answers_score_one(pred, label):
    assert math_reward(pred, label) == 1.0


@pytest.mark.parametrize(
    "pred,label",
    [
        ("\\boxed{\\frac{1}{3}}", "0.5"),
        ("\\boxed{28}", "27"),
        ("\\boxed{-27}", "27"),
        ("\\boxed{x+1}", "x-1"),
    ],
)
def test_different_answers_score_zero(pred, label):
    assert math_reward(pred, label) == 0.0


def test_last_box_wins():
    r = "First I thought \\boxed{3}, but wait, it is \\boxed{4}."
    assert extract_boxed(r) == "4"
    assert math_reward(r, "4") == 1.0
    assert math_reward(r, "3") == 0.0


def test_nested_braces_in_box():
    r = "so \\boxed{\\frac{a^{2}}{b}} is it"
    assert extract_boxed(r) == "\\frac{a^{2}}{b}"


def test_unclosed_box_is_ignored():
    # a truncated response: the unfinished last box does not count
    assert extract_boxed("\\boxed{5} and then \\boxed{6") == "5"


def test_no_box_uses_last_number():
    assert extract_last_number("She has 3 apples, then 12. So 1,234 total") == "1,234"
    assert extract_last_number("x = -5.") == "-5"
    assert extract_last_number("The ratio is 3/4") == "3/4"
    assert extract_last_number("10 - 3") == "3"
    assert extract_answer("Janet makes 9 * 2 = $18 every day.") == "18"
    assert math_reward("Janet makes 9 * 2 = $18 every day.", "18") == 1.0
    assert math_reward("2 + 2 = 4 and the answer is 3.5", "7/2") == 1.0
    assert math_reward("the answer is 1,234", "1234") == 1.0


@pytest.mark.parametrize(
    "response",
    ["", "no idea", "\\boxed{}", "}}{{\\boxed{", "\x00\x01", "\\boxed{\\frac{}{}}", "\\boxed{" + "(" * 500 + "}"],
)
def test_garbage_scores_zero(response):
    assert math_reward(response, "5") == 0.0


def test_list_labels():
    assert math_reward("\\boxed{2}", ["2"]) == 1.0
    assert math_reward("\\boxed{69, 84}", ["$69$", "$84$"]) == 1.0
    assert math_reward("\\boxed{84, 69}", ["69", "84"]) == 1.0
    assert math_reward("\\boxed{69}", ["69", "84"]) == 0.0
    assert math_reward("\\boxed{69, 85}", ["69", "84"]) == 0.0
    assert math_reward("\\boxed{5}", []) == 0.0
    # one answer of two parts, written in one string (OlympiadBench ["$69$,$84$"]): the same
    assert math_reward("\\boxed{84, 69}", "$69$,$84$", workers=0) == 1.0
    assert math_reward("\\boxed{69}", ["$69$,$84$"], workers=0) == 0.0


@pytest.mark.parametrize(
    "label,parts",
    [
        (["$69$", "$84$"], ["69", "84"]),
        (["$69$,$84$"], ["69", "84"]),  # OlympiadBench: the parts in one element
        ("(1,8,19), (2,7,13)", ["(1,8,19)", "(2,7,13)"]),  # commas inside brackets do not split
        ("\\left(3,\\frac{\\pi}{2}\\right)", ["\\left(3,\\frac{\\pi}{2}\\right)"]),
        ("1,234", ["1234"]),  # one number with thousands commas
        ("work... #### 1,250", ["1250"]),  # GSM8K
        ("so \\boxed{\\frac{1}{2}}.", ["\\frac{1}{2}"]),
        ([27.0, 3, "x"], ["27", "3", "x"]),
        (True, ["True"]),
        ("\\boxed{3", []),
        (float("nan"), []),
        ("  $ $ ", []),
        (None, []),
        ([], []),
    ],
)
def test_normalize_label_parts(label, parts):
    assert reward_math.normalize_label(label) == parts
    assert reward_math.normalize_label(", ".join(parts)) == parts  # the joined form reads back


LIST_LABELS = [
    ["$69$", "$84$"],
    ["$69$,$84$"],
    ["(6,3),(9,3)", "(54,5)"],
    ["2"],
    [27.0, "\\frac{1}{2}"],
    ["so \\boxed{5}.", "#### 1,234"],
    ["$f(x)=x$,$f(x)=2-x$"],
]


@pytest.mark.parametrize("raw", LIST_LABELS, ids=range(len(LIST_LABELS)))
def test_a_list_label_is_the_same_answer_through_the_loader_and_the_reward(tmp_path, raw):
    from sparserl.data import load_dataset

    path = tmp_path / "l.jsonl"
    path.write_text(json.dumps({"question": "q", "final_answer": raw}) + "\n")
    (ex,) = load_dataset(str(path), prompt_key="question", label_key="final_answer")
    assert isinstance(ex.label, str)
    parts = reward_math.normalize_label(raw)
    assert reward_math.normalize_label(ex.label) == parts and parts
    responses = [
        f"\\boxed{{{', '.join(parts)}}}",
        f"\\boxed{{{', '.join(reversed(parts))}}}",
        f"\\boxed{{{parts[0]}}}",
        f"\\boxed{{{', '.join(parts)}, 7}}",
    ]
    by_loader = [math_reward(r, ex.label, workers=0) for r in responses]
    assert by_loader == [math_reward(r, raw, workers=0) for r in responses]
    assert by_loader[:2] == [1.0, 1.0] and by_loader[3] == 0.0


def test_olympiadbench_labels_keep_their_parts_through_the_loader():
    from sparserl.data import load_dataset

    path = DATA / "olympiadbench" / "test.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not found")
    raw = [json.loads(line)["final_answer"] for line in path.read_text().splitlines() if line.strip()]
    data = load_dataset("olympiadbench", data_dir=DATA)
    assert len(data) == len(raw)
    for ex, label in zip(data, raw):
        assert reward_math.normalize_label(ex.label) == reward_math.normalize_label(label), label


def test_label_with_dollars_and_solution():
    assert math_reward("\\boxed{2^{1009}}", "$2^{1009}$") == 1.0
    assert math_reward("\\boxed{1.6}", "s = ... = \\boxed{1.6} \\mathrm{~cm}") == 1.0


def test_expensive_expression_is_not_evaluated():
    import math_verify

    parsed = math_verify.parse("\\boxed{2^{10^{10}}}", parsing_timeout=None)
    assert reward_math._too_expensive(parsed)
    assert not reward_math._too_expensive(math_verify.parse("\\boxed{2^{1009}}", parsing_timeout=None))
    t0 = time.monotonic()
    assert math_reward("\\boxed{9^{9^{9}}}", "5") == 0.0
    assert math_reward("\\boxed{(10^{10})!}", "5") == 0.0
    assert time.monotonic() - t0 < 10.0


# --------------------------------------------------------------------------------------------
# What math-verify decides, and what stays ours
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pred,label",
    [
        ("\\boxed{30^\\circ}", "30"),  # degrees dropped
        ("\\boxed{50\\%}", "50"),  # percent
        ("\\boxed{x \\in [-2,7]}", "[-2,7]"),  # interval, with its variable
        ("\\boxed{\\text{(B)}}", "B"),  # text answers
        ("\\boxed{\\{1,2\\}}", "\\{2,1\\}"),  # sets
        ("\\boxed{\\frac{x+1}{2}}", "\\frac{1}{2}x+\\frac12"),  # symbolic
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
        ("\\boxed{y=2x+1}", "2x+1"),  # an equation's right-hand side
        ("\\boxed{0.333333}", "\\frac13"),  # 6 decimals
        ("\\boxed{\\frac{1}{2}, 3}", ["0.5", "3"]),  # several answers
    ],
)
def test_math_verify_equivalences(pred, label):
    assert math_reward(pred, label) == 1.0
    assert math_reward(pred, label, workers=0) == 1.0  # in-process: the same verdict


@pytest.mark.parametrize(
    "pred,label",
    [
        ("\\boxed{(1,2)}", "(2,1)"),  # tuples are ordered
        ("\\boxed{0.3333}", "\\frac13"),
        ("\\boxed{\\pi/2}", "90^\\circ"),
    ],
)
def test_math_verify_differences(pred, label):
    assert math_reward(pred, label) == 0.0


def test_last_number_wins_over_an_expression():
    # math-verify alone would read "10 - 3" as 7 and two boxes as the set {3, 4}: ours picks the span
    assert extract_answer("So 3 + 5 = 8") == "8"
    assert math_reward("So 3 + 5 = 8", "8") == 1.0
    assert math_reward("The answer is 10 - 3", "7") == 0.0
    assert math_reward("The answer is 10 - 3", "3") == 1.0
    assert math_reward("\\boxed{3} no wait \\boxed{4}", "\\{3, 4\\}") == 0.0


def test_plain_numbers_never_reach_the_pool(monkeypatch):
    seen = []
    monkeypatch.setattr(reward_math, "_run_checks", lambda pairs, *a: seen.extend(pairs) or [False] * len(pairs))
    for pred, label, want in [
        ("\\boxed{8}", "8", 1.0),
        ("\\boxed{8.0}", "8", 1.0),
        ("\\boxed{08}", "8", 1.0),
        ("\\boxed{8.5}", "8", 0.0),
        ("\\boxed{1,234}", 1234, 1.0),
        ("\\boxed{3/4}", "0.75", 1.0),
        ("\\boxed{\\dfrac{3}{4}}", "3/4", 1.0),
        ("\\boxed{3+4}", "7", 0.0),
        ("\\boxed{\\text{Evelyn}}", "\\text{Evelyn}", 1.0),
        ("\\boxed{69, 84}", ["84", "69"], 1.0),
    ]:
        assert math_reward(pred, label) == want, (pred, label)
    assert seen == []


@pytest.mark.parametrize(
    "response",
    ["\\boxed{" * 20000, "1/" * 50000, "-  \\frac {  " * 20000, "1" * 100000, "{" * 50000 + "\\boxed{5}" + "}" * 50000],
)
def test_long_adversarial_text_is_cheap(response):
    t0 = time.monotonic()
    math_reward(response, "x+1")
    assert time.monotonic() - t0 < 3.0


# --------------------------------------------------------------------------------------------
# Deadline: checker processes
# --------------------------------------------------------------------------------------------

ADVERSARIAL = "\\boxed{\\sum_{k=1}^{10^{7}} k^k}"  # passes the magnitude guard; sympy would loop for minutes


def test_adversarial_answer_times_out_and_pool_recovers():
    reward = load_reward("math", timeout_s=0.5)
    assert reward.timeout_s == 0.5
    reward("\\boxed{\\sqrt{4}}", "2")  # the workers are up
    t0 = time.monotonic()
    assert reward(ADVERSARIAL, "5") == 0.0
    assert time.monotonic() - t0 < 0.5 + reward_pool.KILL_GRACE_S + 1.5
    t0 = time.monotonic()
    assert reward("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}") == 1.0  # the pool still works
    assert reward("\\boxed{x+1}", "1+x") == 1.0
    assert time.monotonic() - t0 < 5.0


def test_timeout_in_worker_thread():
    out = {}

    def run():
        t0 = time.monotonic()
        out["r"] = math_reward(ADVERSARIAL, "5", timeout=0.3)
        out["dt"] = time.monotonic() - t0

    th = threading.Thread(target=run)
    th.start()
    th.join(20.0)
    assert out["r"] == 0.0 and out["dt"] < 0.3 + reward_pool.KILL_GRACE_S + 2.5


def test_batch_submits_all_checks_at_once(monkeypatch):
    batches = []
    run = CheckPool.run

    def spy(self, calls, timeout):
        batches.append((len(calls), timeout))
        return run(self, calls, timeout)

    monkeypatch.setattr(CheckPool, "run", spy)
    responses = ["\\boxed{\\sqrt{4}}", "\\boxed{2}", "\\boxed{\\sqrt{4}}", "\\boxed{x+1}", ADVERSARIAL, "\\boxed{7}"]
    labels = ["2", "2", "2", "1+x", "5", "8"]
    rewards, n_err = score_responses(load_reward("math", timeout_s=0.5), responses, labels)
    assert (rewards, n_err) == ([1.0, 1.0, 1.0, 1.0, 0.0, 0.0], 0)
    assert batches == [(3, 0.5)]  # one batch; the two identical checks run once


SLOW_REWARDS = """
import signal, time

def slow(response, label):
    time.sleep(float(response))
    return 1.0

def stuck(response, label):
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # deaf to the worker's own timer
    time.sleep(float(response))
    return 1.0

def boom(response, label):
    raise RuntimeError("bad reward")

def crash(response, label):
    import os
    os._exit(3)

def echo(response, label, prompt=None):
    return float(response == label) + (prompt == "bonus")

def wild(response, label):
    return {"huge": 1e300, "nan": float("nan"), "-inf": float("-inf"), "max": 3.4028234663852886e38}.get(response, 1.0)

NOT_CALLABLE = 3
"""


@pytest.fixture
def custom_module(tmp_path, monkeypatch):
    name = f"sparserl_test_rewards_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(SLOW_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_custom_reward_timeout_is_honoured(custom_module):
    fn = load_reward(f"{custom_module}:slow", timeout_s=0.3)
    t0 = time.monotonic()
    rewards, n_err = score_responses(fn, ["0", "20", "0.01"], ["x", "x", "x"])
    assert (rewards, n_err) == ([1.0, 0.0, 1.0], 1)  # the slow call scores 0 and is counted
    assert time.monotonic() - t0 < 0.3 + reward_pool.KILL_GRACE_S + 2.0
    with pytest.raises(RewardTimeout):
        fn("20", "x")
    assert load_reward(f"{custom_module}:slow", timeout_s=5.0)("0.01", "x") == 1.0


def test_stuck_worker_is_killed_and_replaced(custom_module):
    fn = load_reward(f"{custom_module}:stuck", timeout_s=0.3)
    assert fn("0", "x") == 1.0  # warm
    before = set(get_pool().pids())
    t0 = time.monotonic()
    rewards, n_err = score_responses(fn, ["30"], ["x"])
    assert (rewards, n_err) == ([0.0], 1)
    assert time.monotonic() - t0 < 0.3 + reward_pool.KILL_GRACE_S + 2.0
    gone = before - set(get_pool().pids())
    assert len(gone) == 1
    with pytest.raises(ProcessLookupError):
        os.kill(gone.pop(), 0)  # killed and reaped: not burning CPU
    assert len(get_pool().pids()) == len(before)  # replaced
    assert math_reward("\\boxed{\\sqrt{9}}", "3") == 1.0


def test_custom_reward_in_pool_errors_crash_and_prompt(custom_module):
    boom = load_reward(f"{custom_module}:boom", timeout_s=2.0)
    assert score_responses(boom, ["a", "b"], ["a", "b"]) == ([0.0, 0.0], 2)
    with pytest.raises(RuntimeError, match="bad reward"):
        boom("a", "b")
    crash = load_reward(f"{custom_module}:crash", timeout_s=2.0)
    with pytest.raises(RuntimeError, match="worker died"):
        crash("a", "b")
    echo = load_reward(f"{custom_module}:echo", timeout_s=2.0)
    assert score_responses(echo, ["a", "b"], ["a", "c"], prompts=["bonus", None]) == ([2.0, 0.0], 0)
    # without a timeout (or with workers=0) the function runs in this process
    assert load_reward(f"{custom_module}:echo")("a", "a") == 1.0
    assert load_reward(f"{custom_module}:echo", timeout_s=2.0, workers=0)("a", "a") == 1.0


def test_pool_is_shut_down_at_exit():
    code = (
        "from sparserl.reward import load_reward, get_pool\n"
        "load_reward('math')  # starts the workers in the background\n"
        "print(*get_pool().pids())\n"
    )
    env = {**os.environ, "SPARSERL_REWARD_WORKERS": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 1
    for pid in pids:
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "zombie" in status.read_text()


def test_in_process_mode():
    assert MathReward(workers=0)("\\boxed{\\sqrt{3}/2}", "\\frac{\\sqrt3}{2}") == 1.0
    assert MathReward(workers=0).score_batch(["\\boxed{9^{9^{9}}}", "\\boxed{x}"], ["5", "x"]) == [0.0, 1.0]


def test_symbolic_path_works_in_worker_thread():
    out = []
    th = threading.Thread(target=lambda: out.append(math_reward("\\boxed{\\sqrt{3}/2}", "\\frac{\\sqrt3}{2}")))
    th.start()
    th.join(30.0)
    assert out == [1.0]


CALLER_ALARM = """
import signal, time
from sparserl.reward.math import math_reward
fired = []
signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
signal.setitimer(signal.ITIMER_REAL, 0.5)
assert math_reward("\\\\boxed{\\\\sqrt{3}/2}", "\\\\frac{\\\\sqrt3}{2}") == 1.0
time.sleep(1.0)
print("fired", fired)
"""


def test_caller_alarm_is_restored():
    # The caller's SIGALRM handler and timer survive a reward check: the check's own deadline runs in a
    # checker process. Run in a fresh interpreter: a test worker that has loaded other libraries
    # (OpenVINO, torch's thread pools) is not the process this is about, and a stray SIGALRM there
    # would take the whole worker down instead of failing this test.
    done = subprocess.run([sys.executable, "-c", CALLER_ALARM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == "fired [1]", done.stdout


def test_unevaluated_arithmetic_does_not_answer_a_number():
    # math_verify would evaluate "3+4" to 7; copying the question into the box must not pay
    assert math_reward("\\boxed{3+4}", "7") == 0.0
    assert math_reward("\\boxed{3 \\times 4}", "12") == 0.0
    assert math_reward("\\boxed{3 + 4 = 7}", "7") == 1.0
    assert math_reward("\\boxed{(7)}", "7") == 1.0
    assert math_reward("\\boxed{3+4}", "7", strict_numbers=False) == 1.0


def test_answers_equal_direct():
    assert answers_equal("0.5", "\\frac12")
    assert not answers_equal("0.6", "\\frac12")


# --------------------------------------------------------------------------------------------
# Registry and batch scoring
# --------------------------------------------------------------------------------------------


def test_load_reward_math():
    fn = load_reward("math")
    assert fn("\\boxed{4}", "4") == 1.0
    assert fn("\\boxed{4}", "4", "prompt") == 1.0
    fn2 = load_reward("sparserl.reward.math:math_reward")
    assert fn2("\\boxed{4}", "4", None) == 1.0


@pytest.mark.parametrize(
    "spec,why",
    [
        ("no_such_reward", "unknown reward"),
        ("maths", "did you mean 'math'"),
        ("no_such_module_xyz:fn", "not found"),
        ("sparserl.reward.math:no_such_fn", "no attribute"),
        ("sparserl.reward.math:DEFAULT_TIMEOUT_S", "not callable"),
        ("", "expected"),
        ("sparserl.reward.math:", "expected 'module:function'"),
        (":math_reward", "expected 'module:function'"),
        ("a:b:c", "expected 'module:function'"),
        ("sparserl.reward.math:MathReward.", "expected 'module:function'"),
        (42, "expected"),
    ],
)
def test_load_reward_errors(spec, why):
    with pytest.raises(RewardSpecError) as e:
        load_reward(spec)
    assert isinstance(e.value, SparserlError) and isinstance(e.value, ValueError)
    msg = str(e.value)
    assert why in msg and repr(spec) in msg and "reward.fn" in msg
    assert "valid:" in msg and "'math'" in msg and "module:function" in msg


@pytest.mark.parametrize("timeout_s", [0, -1.0, "soon", float("nan")])
def test_load_reward_bad_timeout(timeout_s):
    with pytest.raises(RewardSpecError, match="reward.timeout_s"):
        load_reward("math", timeout_s=timeout_s)


def test_score_responses_two_and_three_params():
    def two(response, label):
        return float(response == label)

    seen = []

    def three(response, label, prompt=None):
        seen.append(prompt)
        return 1.0

    rewards, n_err = score_responses(two, ["a", "b"], ["a", "c"])
    assert (rewards, n_err) == ([1.0, 0.0], 0)
    rewards, n_err = score_responses(three, ["a", "b"], ["a", "c"], prompts=["p1", "p2"])
    assert (rewards, n_err, seen) == ([1.0, 1.0], 0, ["p1", "p2"])


def test_score_responses_counts_errors():
    def flaky(response, label):
        if response == "boom":
            raise RuntimeError("bad reward")
        if response == "nan":
            return math.nan
        if response == "inf":
            return math.inf
        if response == "none":
            return None
        return 1.0

    rewards, n_err = score_responses(flaky, ["ok", "boom", "nan", "inf", "none", "ok"], ["x"] * 6)
    assert rewards == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert n_err == 4


def wild(response, label):
    """1e300 is finite in Python and inf in float32, the dtype of the trainer's reward tensors."""
    return {
        "huge": 1e300,
        "nan": math.nan,
        "-inf": -math.inf,
        "-huge": -1e39,
        "max": 3.4028234663852886e38,
        "int": 10**400,
    }.get(response, 1.0)


def test_a_reward_not_finite_in_float32_scores_zero_counts_and_is_named_once(caplog):
    caplog.set_level("WARNING", logger="sparserl.reward.registry")
    responses = ["ok", "huge", "nan", "-inf", "-huge", "max", "ok"]
    rewards, n_err = score_responses(wild, responses, ["x"] * len(responses))
    assert rewards == [1.0, 0.0, 0.0, 0.0, 0.0, 3.4028234663852886e38, 1.0]  # float32's largest value stays
    assert n_err == 4
    assert score_responses(wild, ["huge", "int"], ["x", "x"]) == ([0.0, 0.0], 2)  # 10**400: float() overflows
    warned = [r.getMessage() for r in caplog.records if "not finite in float32" in r.getMessage()]
    assert len(warned) == 1 and "wild" in warned[0] and "1e+300" in warned[0] and "reward/errors" in warned[0]
    import torch

    assert torch.isfinite(torch.tensor(rewards, dtype=torch.float32)).all()


def test_a_weighted_sum_that_overflows_float32_scores_zero_and_counts():
    from sparserl.reward.weighted import WeightedReward

    def big(response, label):
        return 3e38

    scores = WeightedReward([("big", big), ("one", lambda r, lab: 1.0)], [10.0, 1.0]).score(["a"], ["x"])
    assert scores.total == [0.0] and scores.errors == 1 and scores.parts["big"] == [3e38]
    scores = WeightedReward([("wild", wild), ("one", lambda r, lab: 1.0)], [1.0, 0.5]).score(["nan", "a"], ["x", "x"])
    assert scores.total == [0.5, 1.5] and scores.errors == 1


def test_a_reward_not_finite_in_float32_in_the_checker_processes(custom_module):
    fn = load_reward(f"{custom_module}:wild", timeout_s=5.0)
    rewards, n_err = score_responses(fn, ["huge", "nan", "-inf", "ok", "max"], ["x"] * 5)
    assert (rewards, n_err) == ([0.0, 0.0, 0.0, 1.0, 3.4028234663852886e38], 3)


def test_score_responses_length_mismatch():
    with pytest.raises(ValueError):
        score_responses(math_reward, ["a"], ["a", "b"])


def test_score_responses_math():
    rewards, n_err = score_responses(load_reward("math"), ["\\boxed{4}", "5", "junk"], ["4", "5", "6"])
    assert (rewards, n_err) == ([1.0, 1.0, 0.0], 0)


def test_gsm8k_labels_from_hashes():
    from sparserl.data import clean_label, load_dataset

    path = DATA / "gsm8k" / "test.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not found")
    assert clean_label("so 2 + 2 = 4\n#### 1,234") == "1234"
    data = load_dataset("gsm8k", limit=100, data_dir=DATA)
    raw = [json.loads(line) for line in path.read_text().splitlines()[:100]]
    for ex, row in zip(data, raw):
        expected = row["answer"].split("####")[-1].strip().replace(",", "")
        assert ex.label == expected
        assert re.fullmatch(r"-?\d+(\.\d+)?", ex.label)
        # the label checks against its own solution's number
        assert math_reward(f"... so the answer is {expected}.", ex.label) == 1.0


def test_a_training_step_with_a_1e300_reward_keeps_every_weight_finite(tmp_path):
    """The reward 1e300 is finite in Python and inf in the float32 reward tensor: in a group with finite rewards it
    would make the group's advantages, then every weight, NaN. It scores 0 and is counted instead."""
    import torch
    from test_train import cfg_for

    from sparserl.train.trainer import build_trainer, train_step

    calls = []

    def half_huge(response, label):
        calls.append(response)
        return 1e300 if len(calls) % 2 else 1.0

    trainer = build_trainer(cfg_for(tmp_path, "rollout.max_new_tokens=8"))
    trainer.reward_fn = half_huge
    before = {k: v.detach().clone() for k, v in trainer.learner.state_dict().items()}
    metrics = train_step(trainer, 1)
    assert metrics["reward/errors"] == (len(calls) + 1) // 2 > 0
    assert metrics["reward/mean"] == pytest.approx(len(calls) // 2 / len(calls))
    after = trainer.learner.state_dict()
    assert all(torch.isfinite(v).all() for v in after.values() if v.is_floating_point())
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the step was applied
