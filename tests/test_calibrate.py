"""``sparserl calibrate``: the schedule search on constructed tables, α per length bin,
the shared exact-α core on the tiny model, the command end to end (JSON whose schedules load, PNG), and
one clear error line for each bad option before any work."""

from __future__ import annotations

import json

import pytest
import torch

from sparserl import cli
from sparserl.calibrate.measure import bin_rows
from sparserl.calibrate.search import cheapest_schedule
from sparserl.rollout.kv.schedule import load_schedule


@pytest.fixture(autouse=True)
def one_thread():
    """The tiny model gains nothing from a second thread, and on a shared 2-core machine two threads
    wait on each other (about 40x slower decode steps here): one thread while these tests run."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _rows(table: dict, compressor: str = "rkv", width: int = 100) -> list[dict]:
    """Rows from ``{budget: [p5 per bin, or None for no row]}``, bins of ``width`` from 0."""
    rows = []
    for budget, p5s in table.items():
        for i, p5 in enumerate(p5s):
            if p5 is not None:
                rows.append(
                    {
                        "compressor": compressor,
                        "budget": budget,
                        "bin_start": i * width,
                        "bin_end": (i + 1) * width,
                        "alpha_mean": 1.0,
                        "alpha_p5": p5,
                        "n_tokens": 10,
                    }
                )
    return rows


# --- the search ------------------------------------------------------------------------------------
def test_search_picks_the_cheapest_non_decreasing_schedule_and_marks_a_bin_no_budget_meets():
    rows = _rows(
        {
            8: [0.99, 0.80, 0.90, 0.50],  # bin 2: 8 meets again (noise), but 16 came before
            16: [0.99, 0.88, 0.91, 0.60],
            32: [0.99, 0.95, 0.97, 0.70],
        }
    )  # bin 3: no budget meets 0.86
    rows += _rows({8: [0.10, 0.10, 0.10, 0.10]}, compressor="snapkv")  # ignored for rkv
    s = cheapest_schedule(rows, "rkv", 0.86)
    assert s["budget_by_bin"] == [[0, 8], [100, 16], [200, 16], [300, 32]]
    assert s["unmet_bins"] == [300] and s["nonmonotone_bins"] == []
    assert s["alpha_p5_by_bin"] == [[0, 0.99], [100, 0.88], [200, 0.91], [300, 0.70]]
    assert s["compressor"] == "rkv" and s["threshold"] == 0.86
    # the budgets never decrease, and the result loads as a schedule
    budgets = [b for _, b in s["budget_by_bin"]]
    assert budgets == sorted(budgets)
    assert load_schedule({"schedules": [s]}, "rkv").budget_for(250) == 16


def test_search_an_unmet_bin_holds_the_largest_budget_from_there_on():
    rows = _rows({8: [0.99, 0.50, 0.99], 16: [0.99, 0.60, 0.99], 32: [0.99, 0.70, 0.85]})
    s = cheapest_schedule(rows, "rkv", 0.86)
    assert s["budget_by_bin"] == [[0, 8], [100, 32], [200, 32]]
    assert s["unmet_bins"] == [100]
    assert s["nonmonotone_bins"] == [200]  # 8 and 16 met bin 200, the forced 32 measured under


def test_search_threshold_edges_missing_rows_and_nan():
    rows = _rows({8: [0.86, float("nan"), None], 16: [0.5, 0.9, 0.9]})
    s = cheapest_schedule(rows, "rkv", 0.86)
    assert s["budget_by_bin"] == [[0, 8], [100, 16], [200, 16]]  # p5 == threshold meets; NaN and no row do not
    assert s["unmet_bins"] == []
    assert cheapest_schedule(_rows({8: [1.0, 1.0]}), "rkv", 1.0)["budget_by_bin"] == [[0, 8], [100, 8]]
    with pytest.raises(ValueError, match="no rows for compressor 'h2o'"):
        cheapest_schedule(rows, "h2o", 0.86)


# --- α per bin and the exact-α core ----------------------------------------------------------------
def test_bin_rows_mean_and_p5_per_length_bin():
    alpha = torch.tensor([[1.0, 0.9, 0.5, 0.8], [0.95, 0.7, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    seq_len = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]])
    rows = bin_rows(alpha, seq_len, mask, 12)
    assert [(r["bin_start"], r["bin_end"], r["n_tokens"]) for r in rows] == [(0, 12, 2), (12, 24, 4)]
    assert rows[0]["alpha_mean"] == pytest.approx(0.95)
    assert rows[1]["alpha_mean"] == pytest.approx((0.5 + 0.8 + 0.95 + 0.7) / 4)
    expected = torch.quantile(torch.tensor([0.5, 0.8, 0.95, 0.7], dtype=torch.float64), 0.05).item()
    assert rows[1]["alpha_p5"] == pytest.approx(expected)


def test_exact_alpha_on_the_tiny_model(tiny):
    """The shared core: α = 1 for the dense float32 sampler of the dense model's own weights; under a
    compressor α ≤ 1, lower once it evicts; the replay reproduces the sampler (error 0) in both."""
    from sparserl.batch import RolloutBatch
    from sparserl.mismatch.acceptance import token_seq_len
    from sparserl.mismatch.exact_alpha import exact_alpha
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import build_compressor
    from sparserl.rollout.sampling import SamplingParams
    from sparserl.score.hidden import dense_hidden
    from sparserl.score.shared_prompt import lm_head_weight

    params = SamplingParams(n=2, max_new_tokens=12, min_new_tokens=12, temperature=1.0, seed=3)
    prompts = [[{"role": "user", "content": "What is 3 + 5?"}]]
    weight = lm_head_weight(tiny.model)
    found = {}
    for name in ("none", "streaming"):
        comp = (
            build_compressor(name) if name == "none" else build_compressor(name, kv_budget=6, step_length=2, window=2)
        )
        engine = RolloutEngine(tiny, comp, dtype="float32")
        out = engine.generate(prompts, params)
        batch = RolloutBatch.from_rollout(out.prompt_ids, out.response_ids, out.sampler_logprobs, out.prompt_index)
        T = batch.response_ids.shape[1]
        hidden = dense_hidden(tiny.model, batch.input_ids, batch.attention_mask, batch.position_ids, T, 1)
        alpha, err = exact_alpha(
            engine, out.prompt_ids, out.response_ids, params, hidden, weight, 1.0, recorded=batch.sampler_logprobs
        )
        assert alpha.shape == (2, 12) and alpha.dtype == torch.float64 and err <= 1e-5
        found[name] = alpha
    assert torch.allclose(found["none"], torch.ones(2, 12, dtype=torch.float64), atol=1e-4)
    assert (found["streaming"] <= 1 + 1e-6).all() and found["streaming"].min() < 1 - 1e-4
    seq = token_seq_len([[1, 2, 3], [4]], 2)
    assert seq.tolist() == [[3, 4], [1, 2]]


# --- the command -------------------------------------------------------------------------------------
@pytest.fixture
def data_file(tmp_path):
    rows = [
        {"problem": "What is 2 + 3?", "answer": "5"},
        {"problem": "Tom has 3 apples and buys 4. How many?", "answer": "7"},
        {"problem": "unused", "answer": "0"},
    ]
    path = tmp_path / "calib.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _argv(data_file, out, *extra):
    return [
        "calibrate",
        "--model",
        "tiny",
        "--data",
        str(data_file),
        "--limit",
        "2",
        "--n",
        "2",
        "--compressors",
        "rkv,streaming",
        "--budgets",
        "6,10",
        "--max-new-tokens",
        "12",
        "--min-new-tokens",
        "12",
        "--bin",
        "8",
        "--step-length",
        "2",
        "--window",
        "2",
        "--json",
        str(out),
        *extra,
    ]


def _check_document(doc: dict, out, threshold: float, compressors=("rkv", "streaming"), budgets=(6, 10)):
    assert set(doc) >= {"rows", "schedules", "meta"}
    rows = doc["rows"]
    assert {(r["compressor"], r["budget"]) for r in rows} == {(c, b) for c in compressors for b in budgets}
    for r in rows:
        assert set(r) == {"compressor", "budget", "bin_start", "bin_end", "alpha_mean", "alpha_p5", "n_tokens"}
        assert r["bin_end"] - r["bin_start"] == 8 and r["bin_start"] % 8 == 0 and r["n_tokens"] > 0
        assert 0.0 <= r["alpha_p5"] <= r["alpha_mean"] + 1e-9 <= 1.0 + 1e-6
    # 2 prompts x 2 responses x 12 tokens per sampler
    for c in compressors:
        for b in budgets:
            assert sum(r["n_tokens"] for r in rows if r["compressor"] == c and r["budget"] == b) == 48
    assert [s["compressor"] for s in doc["schedules"]] == list(compressors)
    for s in doc["schedules"]:
        assert set(s) >= {
            "compressor",
            "threshold",
            "budget_by_bin",
            "unmet_bins",
            "predicted_cost_vs_dense",
            "measured_tokens_per_s_vs_dense",
            "measured_rounds",
        }
        assert s["measured_rounds"] == 1 and s["measured_tokens_per_s_vs_dense"] > 0
        assert s["measured_tokens_per_s"] > 0 and s["measured_dense_tokens_per_s"] > 0
        assert s["predicted_cost_vs_dense"] is None or s["predicted_cost_vs_dense"] > 0
        pairs = s["budget_by_bin"]
        starts = sorted({r["bin_start"] for r in rows if r["compressor"] == s["compressor"]})
        assert [a for a, _ in pairs] == starts
        assert [b for _, b in pairs] == sorted(b for _, b in pairs)  # non-decreasing
        expected = cheapest_schedule(rows, s["compressor"], threshold)
        assert pairs == expected["budget_by_bin"] and s["unmet_bins"] == expected["unmet_bins"]
        sched = load_schedule(str(out), s["compressor"])  # calibrate's output is a schedule as it stands
        assert sched.pairs == pairs
    meta = doc["meta"]
    assert meta["command"].startswith("sparserl calibrate --model tiny") and meta["model"] == "tiny"
    assert meta["cpu"] and meta["seed"] == 0 and meta["sampling"]["min_new_tokens"] == 12
    assert meta["measured_rounds"] == 1
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_calibrate_end_to_end_sampler_tokens(tmp_path, data_file, capsys):
    out = tmp_path / "calib" / "out.json"
    every = ("rkv", "snapkv", "streaming", "h2o")
    argv = _argv(data_file, out, "--threshold", "0.999", "--compressors", ",".join(every), "--alpha-record-mib", "0")
    assert cli.main(argv) == 0
    doc = json.loads(out.read_text())
    _check_document(doc, out, 0.999, compressors=every)
    assert any(s["predicted_cost_vs_dense"] is not None for s in doc["schedules"])  # sparserl.cost is wired
    assert doc["meta"]["tokens"] == "sampler" and doc["meta"]["replay_err_max"] <= 1e-5
    assert doc["meta"]["q"] == "replayed" and "--alpha-record-mib 0" in doc["meta"]["command"]
    assert all(s["replay_err"] <= 1e-5 and s["q"] == "replayed" for s in doc["samplers"])
    printed = capsys.readouterr().out
    assert "p5 of α per sequence-length bin" in printed and f"wrote {out}" in printed
    for s in doc["schedules"]:
        largest = max(b for _, b in s["budget_by_bin"])
        for start in s["unmet_bins"]:  # no budget met it: the largest, and the console says so
            assert dict(s["budget_by_bin"])[start] == largest
            assert f"{s['compressor']}: no measured budget" in printed


def test_calibrate_keeps_q_while_sampling_and_finds_the_replays_alpha(tmp_path, data_file, capsys):
    """By default each sampler keeps q while it samples (2 x 2 x 12 tokens x the tiny vocabulary fit in
    the default 2048 MiB): nothing is replayed, and every row is the replay's (``--alpha-record-mib 0``): the
    same tokens, the same q, so the same α up to the rounding of p's head product, which runs per response
    here and per step in the replay."""
    docs = {}
    for label, record in (("replayed", ("--alpha-record-mib", "0")), ("kept", ())):
        out = tmp_path / f"{label}.json"
        assert cli.main(_argv(data_file, out, "--compressors", "rkv,streaming", *record)) == 0
        docs[label] = json.loads(out.read_text())
    printed = capsys.readouterr().out
    kept, replayed = docs["kept"], docs["replayed"]
    _check_document(kept, tmp_path / "kept.json", 0.86)
    assert kept["meta"]["q"] == "kept" and kept["meta"]["replay_err_max"] is None
    assert all(s["q"] == "kept" and s["replay_err"] is None for s in kept["samplers"])
    assert "q kept while sampling" in printed and "replay check: none needed" in printed
    assert replayed["meta"]["q"] == "replayed" and replayed["meta"]["replay_err_max"] <= 1e-5
    assert len(kept["rows"]) == len(replayed["rows"])
    for a, b in zip(kept["rows"], replayed["rows"]):
        assert {k: v for k, v in a.items() if not k.startswith("alpha")} == {
            k: v for k, v in b.items() if not k.startswith("alpha")
        }
        assert a["alpha_mean"] == pytest.approx(b["alpha_mean"], abs=1e-6)
        assert a["alpha_p5"] == pytest.approx(b["alpha_p5"], abs=1e-6)
    assert any(r["alpha_p5"] < 1 for r in kept["rows"])  # the samplers evicted: α measured something


def test_calibrate_end_to_end_dense_tokens_with_bins_no_budget_meets(tmp_path, data_file, capsys):
    """Threshold 1: every bin where the samplers evicted is unmet (both budgets evict before the end)."""
    out = tmp_path / "dense.json"
    argv = _argv(data_file, out, "--tokens", "dense", "--compressors", "rkv", "--budgets", "6,8", "--threshold", "1")
    assert cli.main(argv) == 0
    doc = json.loads(out.read_text())
    _check_document(doc, out, 1.0, compressors=("rkv",), budgets=(6, 8))
    assert doc["meta"]["tokens"] == "dense" and doc["meta"]["replay_err_max"] is None
    assert all(s["replay_err"] is None for s in doc["samplers"])
    (s,) = doc["schedules"]
    assert s["unmet_bins"], s
    pairs = dict(s["budget_by_bin"])
    assert all(pairs[b] == 8 for b in s["unmet_bins"])
    assert all(b == 8 for start, b in s["budget_by_bin"] if start >= s["unmet_bins"][0])  # non-decreasing after
    printed = capsys.readouterr().out
    assert "rkv: no measured budget keeps the p5 of α >= 1" in printed and "(unmet_bins)" in printed
    assert "replay check: none" in printed


# --- bad input: one error line, before any work ------------------------------------------------------
BAD = [
    (["--threshold", "0"], "--threshold 0.0"),
    (["--threshold", "1.5"], "--threshold 1.5"),
    (["--budgets", ""], "--budgets ''"),
    (["--budgets", " , "], "--budgets"),
    (["--budgets", "32,-1"], "-1 must be >= 1"),
    (["--budgets", "32,abc"], "'abc' is not a whole number"),
    (["--bin", "0"], "--bin 0"),
    (["--min-new-tokens", "30"], "--min-new-tokens 30: must be <= --max-new-tokens 12"),
    (["--compressors", "rvk"], "did you mean 'rkv'"),
    (["--compressors", "rkv,none"], "'none' is the dense policy"),
    (["--n", "0"], "--n 0"),
    (["--limit", "0"], "--limit 0"),
    (["--tokens", "sparse"], "--tokens 'sparse'"),
    (["--alpha-record-mib", "-1"], "--alpha-record-mib -1"),
    (["--budgets", "2"], "must be larger than the observation window"),
    (["--data", "MISSING"], "--data"),
    (["--dtype", "fp64"], "--dtype 'fp64'"),
    (["--template", "Solve it."], "--template 'Solve it.': must contain '{problem}'"),
]


def test_calibrate_measures_the_prompts_training_sees(tmp_path, data_file):
    """--template and --system-prompt shape the prompts as data.template / data.system_prompt do in a run:
    the sequences start later (the bins are by prompt + response length) and the JSON records both."""
    firsts = {}
    system = "You are a careful math tutor. Read the problem and reply with one short sentence. " * 2
    for label, extra in (
        ("plain", ("--template", "Problem: {problem}")),
        ("run", ("--template", "Problem: {problem}", "--system-prompt", system)),
    ):
        out = tmp_path / f"{label}.json"
        argv = _argv(data_file, out, "--tokens", "dense", "--compressors", "rkv", "--budgets", "6", *extra)
        assert cli.main(argv) == 0
        doc = json.loads(out.read_text())
        firsts[label] = min(r["bin_start"] for r in doc["rows"])
        meta = doc["meta"]
    assert firsts["run"] > firsts["plain"]
    assert meta["system_prompt"] == system and meta["template"] == "Problem: {problem}"
    assert "--template 'Problem: {problem}' --system-prompt 'You are a careful" in meta["command"]


@pytest.mark.parametrize("extra,message", BAD, ids=[" ".join(b[0]) or "empty" for b in BAD])
def test_bad_input_is_one_error_line_before_any_work(tmp_path, data_file, capsys, monkeypatch, extra, message):
    import sparserl.models.loading as loading

    def no_work(*a, **k):
        raise AssertionError("the model loaded before the options were checked")

    monkeypatch.setattr(loading, "load_model", no_work)
    extra = [str(tmp_path / "missing.jsonl") if x == "MISSING" else x for x in extra]
    out = tmp_path / "out.json"
    assert cli.main(_argv(data_file, out) + extra) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    assert message in err, err
    if "MISSING" in " ".join(extra) or "missing" in " ".join(extra):
        assert "missing.jsonl" in err
    assert not out.exists()


def test_calibrate_imports_neither_train_nor_cli():
    from test_dependencies import files, imports_of, module_name, refers_to

    for path in files("calibrate"):
        names = imports_of(path)
        bad = refers_to(names, "sparserl.train") | refers_to(names, "sparserl.cli")
        assert not bad, f"{module_name(path)} imports {sorted(bad)}"
    assert files("calibrate")


def test_the_default_compressors_and_budgets_fit_together(tmp_path):
    """SnapKV's own 32-query window does not fit under the default smallest budget (32): without --window it is
    cut to a quarter of it, one window per compressor; the others keep their own."""
    import argparse

    from sparserl.commands.calibrate import add_parser, check, sampler, window_for

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["calibrate", "--data", "gsm8k", "--json", str(tmp_path / "c.json")])
    plan = check(args)
    assert plan.compressors == ["rkv", "snapkv", "streaming", "h2o"] and plan.budgets == [32, 64, 128, 256]
    assert window_for("snapkv", args) == 8 and window_for("rkv", args) is None
    assert {sampler("snapkv", b, args).window for b in plan.budgets} == {8}
    assert sampler("rkv", 256, args).window == 8  # R-KV's own
    args.window = 16
    assert sampler("snapkv", 64, args).window == 16
