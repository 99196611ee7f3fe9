"""``sparserl bench rollout``: the roofline bound, repeated runs and their medians, batch limits, and
the OpenVINO peer (a clear error naming ``sparserl bench setup-openvino`` when it is not set up; run
on the tiny model when it is)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest
import torch

from sparserl import cli
from sparserl.bench import machine, rollout
from sparserl.bench.measure import Row, Run, best_seconds, median_round_ratio, round_order, run_rounds, time_rounds
from sparserl.bench.openvino_peer import KV_BLOCK, PeerUnavailable, eviction_sizes, import_openvino_genai
from sparserl.bench.openvino_setup import OpenVINOSetupError, check_ready
from sparserl.bench.roofline import decode_step_flops, mean_kv_tokens, roofline
from sparserl.errors import OptionError, SparserlError
from sparserl.rollout import native

TINY_BENCH = [
    "bench",
    "rollout",
    "--model",
    "tiny",
    "--no-hf",
    "--max-new-tokens",
    "3",
    "--batch",
    "2",
    "--kv-budget",
    "8",
    "--step-length",
    "2",
]


@pytest.fixture
def fast_machine(monkeypatch):
    """The machine's ceilings as constants (the real measurement reads 512 MB several times)."""
    monkeypatch.setattr(rollout, "memory_bandwidth", lambda **kw: 20e9)


# --- roofline -----------------------------------------------------------------------------------
def test_roofline_memory_bound():
    # 1 GB read at 10 GB/s = 0.1 s; 1 GFLOP at 100 GFLOP/s = 0.01 s: the reads bind, 16 / 0.1 s
    r = roofline(batch=16, bytes_read=1e9, flops=1e9, bandwidth=10e9, gemm_flops=100e9)
    assert r.bound == "memory"
    assert r.tokens_per_s == pytest.approx(160.0)
    assert (r.memory_seconds, r.compute_seconds) == (pytest.approx(0.1), pytest.approx(0.01))


def test_roofline_compute_bound():
    # 0.5 GB at 25 GB/s = 0.02 s; 4 GFLOP at 50 GFLOP/s = 0.08 s: the GEMMs bind, 8 / 0.08 s
    r = roofline(batch=8, bytes_read=0.5e9, flops=4e9, bandwidth=25e9, gemm_flops=50e9)
    assert r.bound == "compute"
    assert r.tokens_per_s == pytest.approx(100.0)


def test_roofline_rejects_zero_ceilings():
    with pytest.raises(ValueError):
        roofline(batch=1, bytes_read=1, flops=1, bandwidth=0, gemm_flops=1)


def test_decode_step_flops_and_mean_kv_tokens():
    # 2 per weight element per row + 4 · layers · heads · head_dim per kept token per row
    assert (
        decode_step_flops(2, 1000, n_layers=3, n_heads=4, head_dim=8, kv_tokens_avg=10)
        == 2 * 2 * 1000 + 4 * 2 * 3 * 4 * 8 * 10
    )
    assert mean_kv_tokens(10, 4) == pytest.approx((10 + 11 + 12 + 13) / 4)  # dense: grows a token a step
    assert mean_kv_tokens(10, 4, cap=11.5) == pytest.approx((10 + 11 + 11.5 + 11.5) / 4)


def test_gemm_flops_runs_the_decode_weights_through_linear(tiny):
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import build_compressor

    sm = RolloutEngine(tiny, build_compressor("none")).model
    weights = machine.decode_linear_weights(sm)
    assert len(weights) == 4 * sm.n_layers + 1 and weights[-1] is sm.lm_head
    calls = []
    real = sm.linear
    sm.linear = lambda x, w, b=None: calls.append((tuple(x.shape), w.data_ptr())) or real(x, w, b)
    assert machine.gemm_flops_per_s(sm, rows=3, repeats=2) > 0
    assert len(calls) == 3 * len(weights)  # a warm-up pass and two timed ones
    assert all(shape[0] == 3 for shape, _ in calls)
    assert [p for _, p in calls[: len(weights)]] == [w.data_ptr() for w in weights]  # the model's own tensors


@pytest.mark.skipif(not native.active(), reason="native kernels unavailable")
def test_gemm_flops_of_a_bf16_sampler_time_its_panels_kernel(tiny, monkeypatch):
    """The bf16 ceiling is the rate of the products the fused step runs (linear_bf16.c on the panels,
    float32 activations), not torch's bf16 product (0.4x ours on an AVX512-BF16 EPYC: rooflines over 1)."""
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import build_compressor
    from sparserl.rollout.model import NATIVE_BF16

    sm = RolloutEngine(tiny, build_compressor("none"), dtype="bfloat16").model
    weights = machine.decode_linear_weights(sm)
    calls, real = [], native.linear_bf16
    monkeypatch.setattr(
        native, "linear_bf16", lambda x, p, *a, **k: calls.append((x.dtype, p.data_ptr())) or real(x, p, *a, **k)
    )
    sm.linear = lambda *a, **k: pytest.fail("torch's product timed instead of the panels")
    assert machine.gemm_flops_per_s(sm, rows=2, repeats=1) > 0
    assert calls == [(torch.float32, getattr(w, NATIVE_BF16).data_ptr()) for w in weights] * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemm_flops_of_a_quantized_sampler_feeds_each_weight_its_own_dtype(tiny, dtype):
    """int8 layers take float32 activations while the LM head stays in the model's dtype: with a
    bf16 model both have the same in-features, and one shared input crashed the bench (found on an
    avx512_bf16 CPU, where ``auto`` is bf16)."""
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import build_compressor

    sm = RolloutEngine(tiny, build_compressor("none"), dtype=dtype, quant="int8").model
    assert sm.lm_head.dtype == dtype
    assert machine.gemm_flops_per_s(sm, rows=2, repeats=1) > 0


# --- repeated runs ------------------------------------------------------------------------------
def test_run_rounds_interleaves_rows_and_reports_the_median():
    order = []

    def runner(name, seconds):
        it = iter(seconds)

        def run():
            order.append(name)
            return Run(seconds=next(it), tokens=100, kv_bytes_peak=1, kv_bytes_theory=1)

        return run

    a = Row({"engine": "a"}, runner("a", [1.0, 4.0, 2.0]), 0.0)
    b = Row({"engine": "b"}, runner("b", [0.5, 0.5, 1.0]), 0.0)
    run_rounds([a, b], 3)
    # rounds, so a drift of the machine falls on every row; each row opens a round in turn
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert a.tokens_per_s_runs == [100.0, 25.0, 50.0]
    assert a.tokens_per_s == 50.0 and b.tokens_per_s == 200.0
    assert all(r.rss_peak_bytes > 0 for r in a.runs)


class FakeClock:
    """A clock that each arm advances by its own duration for the round (no real time passes)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_time_rounds_rotates_the_order_and_warms_up_untimed():
    calls, clock = [], FakeClock()

    def arm(name):
        def fn():
            calls.append(name)
            clock.now += 1.0
            return name

        return fn

    r = time_rounds({"a": arm("a"), "b": arm("b"), "c": arm("c")}, rounds=3, warmup=1, clock=clock)
    assert calls == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]  # warm-up, then rotated rounds
    assert r.seconds == {"a": [1.0] * 3, "b": [1.0] * 3, "c": [1.0] * 3} and r.results["b"] == ["b"] * 3
    assert round_order(["a", "b", "c"], 4) == ["b", "c", "a"]
    fixed = []
    time_rounds({"a": lambda: fixed.append("a"), "b": lambda: fixed.append("b")}, rounds=2, rotate=False)
    assert fixed == ["a", "b", "a", "b"]


def test_time_rounds_ratios_are_the_median_of_per_round_ratios():
    """The machine runs round 2 at a quarter of round 1's speed: each round's ratio, and their median, stay 1.5."""
    clock = FakeClock()
    durations = {"dense": iter([1.0, 4.0, 2.0]), "sparse": iter([2.0 / 3, 8.0 / 3, 4.0 / 3])}
    seen = []

    def arm(name):
        def fn():
            clock.now += next(durations[name])
            return {"tokens": 100}

        return fn

    r = time_rounds(
        {"dense": arm("dense"), "sparse": arm("sparse")},
        rounds=3,
        clock=clock,
        on_run=lambda i, name, s, res: seen.append((i, name)),
    )
    assert r.ratios("dense", "sparse") == pytest.approx([1.5, 1.5, 1.5])
    assert r.median_ratio("dense", "sparse") == pytest.approx(1.5)
    assert r.median("dense") == 2.0
    assert seen == [(0, "dense"), (0, "sparse"), (1, "sparse"), (1, "dense"), (2, "dense"), (2, "sparse")]
    assert r.values("dense", lambda res: res["tokens"]) == [100, 100, 100]


def test_best_seconds_is_the_fastest_pass_per_call():
    clock = FakeClock()
    durations = iter([1.5, 1.5, 0.5, 0.5, 1.0, 1.0])  # three passes of two calls: 3.0, 1.0, 2.0 seconds

    def call():
        clock.now += next(durations)

    assert best_seconds(call, passes=3, calls=2, clock=clock) == pytest.approx(0.5)


def test_median_round_ratio_is_not_a_ratio_of_medians():
    """The median of the per-round ratios against a median divided by a median: they agree while every
    round runs both sides at one speed (a drift cancels within a round), and part when they do not."""
    ours, peer = [205.0, 115.0, 90.0], [100.0, 100.0, 100.0]
    ours_drift, peer_drift = [410.0, 115.0, 45.0], [200.0, 100.0, 50.0]  # the machine ran at 2x, 1x, 0.5x
    assert median_round_ratio(ours, peer) == pytest.approx(1.15)
    assert median_round_ratio(ours_drift, peer_drift) == pytest.approx(1.15)  # drift cancels within a round
    assert statistics.median(ours_drift) / statistics.median(peer_drift) == pytest.approx(1.15)
    assert median_round_ratio([300.0, 100.0, 90.0], [100.0, 100.0, 100.0]) == pytest.approx(1.0)
    assert statistics.median([300.0, 100.0, 90.0]) / 100.0 == pytest.approx(1.0)
    assert median_round_ratio([205.0, 115.0, 90.0], [100.0, 60.0, 100.0]) == pytest.approx(1.917, abs=1e-3)
    assert statistics.median([205.0, 115.0, 90.0]) / statistics.median([100.0, 60.0, 100.0]) == pytest.approx(1.15)
    with pytest.raises(ValueError, match="rounds differ"):
        median_round_ratio([1.0, 2.0], [1.0])


def test_bench_repeat_reports_median_and_ratios_of_rounds(tiny, fast_machine, monkeypatch, capsys):
    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: tiny)
    report = rollout.run_bench(
        model="tiny",
        batch=2,
        max_new_tokens=3,
        kv_budget=8,
        step_length=2,
        compressors=["streaming"],
        dtype="float32",
        hf_baseline=True,
        repeat=3,
    )
    m = report["machine"]
    assert m["repeat"] == 3 and m["gemm_flops_per_s"] > 0 and m["gemm_rows"] == 2
    assert m["memory_bandwidth_bytes_per_s"] == 20e9
    rows = {(r["engine"], r["compressor"]): r for r in report["results"]}
    assert set(rows) == {("hf_generate", "none"), ("sparserl", "none"), ("sparserl", "streaming")}
    for r in rows.values():
        assert len(r["tokens_per_s_runs"]) == 3
        assert r["tokens_per_s"] == statistics.median(r["tokens_per_s_runs"])
        assert r["roofline_bound"] in ("memory", "compute")
        assert r["roofline_fraction"] == pytest.approx(r["tokens_per_s"] / r["roofline_tokens_per_s"])
    dense, hf = rows["sparserl", "none"], rows["hf_generate", "none"]
    stream = rows["sparserl", "streaming"]
    per_round = [s / d for s, d in zip(stream["tokens_per_s_runs"], dense["tokens_per_s_runs"])]
    assert stream["ratio_vs_sparserl_dense"] == pytest.approx(statistics.median(per_round))
    per_round = [d / h for d, h in zip(dense["tokens_per_s_runs"], hf["tokens_per_s_runs"])]
    assert dense["ratio_vs_hf_generate"] == pytest.approx(statistics.median(per_round))
    assert m["isa"] == [f for f in m["isa"] if f in open("/proc/cpuinfo").read()]  # named from the CPU's flags
    assert "peers_skipped" not in report


def test_bench_compile_adds_compiled_rows_beside_eager(tiny, fast_machine, monkeypatch):
    """``--compile``: every sparserl row once eager and once compiled, in the same process; the
    ratios stay against the eager dense row; compiled generation gives the same tokens."""
    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: tiny)
    report = rollout.run_bench(
        model="tiny",
        batch=2,
        max_new_tokens=3,
        kv_budget=8,
        step_length=2,
        compressors=["rkv"],
        dtype="float32",
        hf_baseline=False,
        compile=True,
    )
    rows = {(r["compressor"], r["compiled"]): r for r in report["results"]}
    assert set(rows) == {("none", False), ("rkv", False), ("none", True), ("rkv", True)}
    eager_dense = rows["none", False]["tokens_per_s"]
    for r in rows.values():
        assert r["ratio_vs_sparserl_dense"] == pytest.approx(r["tokens_per_s"] / eager_dense)
    assert rows["rkv", True]["kv_bytes_peak"] == rows["rkv", False]["kv_bytes_peak"]


def test_bench_compress_prompt_bounds_the_buffer_to_budget_plus_period(tiny, fast_machine, monkeypatch, tmp_path):
    """``--compress-prompt``: the compressing rows' buffers hold budget + step length slots (the
    prompt evicted too, like OpenVINO's eviction), fewer KV bytes than with the prompt kept whole."""
    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: tiny)
    peaks = {}
    for flag in ([], ["--compress-prompt"]):
        out = tmp_path / f"b{len(flag)}.json"
        assert cli.main([*TINY_BENCH, "--max-new-tokens", "12", "--compressors", "rkv", "--json", str(out), *flag]) == 0
        report = json.loads(out.read_text())
        rows = {r["compressor"]: r for r in report["results"]}
        assert rows["rkv"]["compress_prompt"] is bool(flag) and rows["none"]["compress_prompt"] is False
        peaks[bool(flag)] = rows["rkv"]["kv_bytes_peak"]
    # the bench's own dtype (``auto``: bfloat16 on a CPU with bf16 units, float32 elsewhere)
    engine = rollout.RolloutEngine(
        tiny, rollout.build_compressor("none"), dtype=getattr(torch, report["machine"]["dtype"])
    )
    per_slot = engine.model.kv_bytes_per_token() * 2  # batch 2
    assert peaks[True] == (8 + 2) * per_slot  # budget + step length
    assert peaks[False] == (len(engine.encode(rollout.BENCH_PROMPT)) + 8 + 2) * per_slot


@pytest.mark.skipif(not native.active(), reason="native kernels unavailable")
def test_bench_bf16_rows_name_their_kernel_and_why(tiny, fast_machine, monkeypatch, tmp_path):
    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: tiny)
    out = tmp_path / "b.json"
    assert cli.main([*TINY_BENCH, "--compressors", "rkv", "--dtype", "bfloat16", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    kernels = {r["bf16_kernel"] for r in report["results"] if r["engine"] == "sparserl"}
    choice = report["machine"]["bf16_kernel_choice"]
    assert kernels == {choice["kernel"]} and choice["kernel"] in native.bf16_kernels() and choice["reason"]
    assert cli.main([*TINY_BENCH, "--compressors", "rkv", "--dtype", "float32", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["machine"]["bf16_kernel_choice"] is None
    assert {r["bf16_kernel"] for r in report["results"] if r["engine"] == "sparserl"} == {None}


def test_bench_kv_schedule_adds_a_row_per_compressor_it_fits(tiny, fast_machine, monkeypatch, tmp_path, capsys):
    """``--kv-schedule FILE``: calibrate's output gives a row for each compressor it calibrated, with the
    schedule's largest budget sizing the buffer; a file that fits none of --compressors fails first."""
    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: tiny)
    sched = tmp_path / "calib.json"
    sched.write_text(json.dumps({"schedules": [{"compressor": "rkv", "budget_by_bin": [[0, 4], [30, 6]]}]}))
    out = tmp_path / "b.json"
    argv = [*TINY_BENCH, "--max-new-tokens", "12", "--compressors", "rkv,snapkv", "--compress-prompt"]
    assert cli.main([*argv, "--kv-schedule", str(sched), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    scheduled = [r for r in rows if r.get("kv_schedule")]
    assert [(r["compressor"], r["kv_schedule"], r["kv_budget"]) for r in scheduled] == [("rkv", [[0, 4], [30, 6]], 6)]
    fixed = next(r for r in rows if r["compressor"] == "rkv" and not r.get("kv_schedule"))
    assert scheduled[0]["kv_bytes_peak"] < fixed["kv_bytes_peak"]  # budget 6 + 2 slots against 8 + 2
    assert scheduled[0]["ratio_vs_sparserl_dense"] > 0
    capsys.readouterr()
    assert cli.main([*TINY_BENCH, "--compressors", "h2o", "--kv-schedule", str(sched)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--kv-schedule: " in err[0] and "no schedule for compressor 'h2o'; it has: rkv" in err[0]


# --- options ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "option,value", [("--batch", "0"), ("--batch", "-3"), ("--repeat", "0"), ("--repeat", "-1"), ("--peers", "vllm")]
)
def test_bench_rejects_bad_numbers_and_peers(option, value):
    args = cli.build_parser().parse_args([*TINY_BENCH, option, value])
    with pytest.raises(OptionError, match=option):
        args.fn(args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device,message", [("cuda", "CUDA is not available"), ("tpu9", "not a device")])
def test_bench_device_this_machine_lacks_fails_before_loading(monkeypatch, device, message):
    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: pytest.fail("loaded"))
    args = cli.build_parser().parse_args([*TINY_BENCH, "--device", device])
    with pytest.raises(SparserlError, match=f"--device={device!r}.*{message}"):
        args.fn(args)


def test_bench_runs_on_the_device_asked_and_skips_cpu_peers_elsewhere(tiny, fast_machine, monkeypatch):
    """--device reaches the model's loading and the JSON's machine; a CPU-only peer is skipped with
    its reason when the rows run elsewhere (a stand-in device here: no GPU on this machine)."""
    seen = []
    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: seen.append(k["device"]) or tiny)
    kw = dict(
        model="tiny",
        batch=2,
        max_new_tokens=3,
        kv_budget=8,
        step_length=2,
        compressors=[],
        dtype="float32",
        hf_baseline=False,
        log=lambda *a: None,
    )
    report = rollout.run_bench(device="cpu", **kw)
    assert seen == [torch.device("cpu")] and report["machine"]["device"] == "cpu"
    assert report["machine"]["gpu"] is None
    monkeypatch.setattr(rollout, "resolve_device", lambda *a, **k: torch.device("meta"))
    report = rollout.run_bench(device="meta", peers=["openvino"], **kw)
    assert "--device cpu" in report["peers_skipped"]["openvino"]
    assert report["machine"]["device"] == "meta"


def test_bench_batch_64_runs(tiny, fast_machine, monkeypatch, tmp_path):
    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: tiny)
    out = tmp_path / "b.json"
    rc = cli.main([*TINY_BENCH, "--max-new-tokens", "2", "--batch", "64", "--compressors", "none", "--json", str(out)])
    assert rc == 0
    (row,) = json.loads(out.read_text())["results"]
    assert row["batch"] == 64 and row["tokens_per_s_runs"] and len(row["tokens_per_s_runs"]) == 1


# --- the OpenVINO peer --------------------------------------------------------------------------
def test_eviction_sizes_are_blocks():
    assert eviction_sizes(256) == {"start_size": 32, "recent_size": 32, "max_cache_size": 256}
    assert eviction_sizes(200)["max_cache_size"] == 224  # rounded up to a block
    assert eviction_sizes(40)["max_cache_size"] == 96  # start + recent + one evictable block at least
    for budget in (1, 8, 64, 100, 1000):
        sizes = eviction_sizes(budget)
        assert all(v % KV_BLOCK == 0 for v in sizes.values())
        assert sizes["max_cache_size"] > sizes["start_size"] + sizes["recent_size"]


def test_openvino_peer_not_set_up_stops_before_loading_naming_the_setup_command(tiny, monkeypatch, tmp_path, capsys):
    """Missing runtime, missing exporter, an interrupted set-up, a bad SPARSERL_OPENVINO_EXPORT_PYTHON:
    each stops the command before the model loads, with one error naming what to run."""
    monkeypatch.setenv("SPARSERL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPARSERL_OPENVINO_EXPORT_PYTHON", raising=False)
    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    out = tmp_path / "b.json"
    argv = [*TINY_BENCH, "--compressors", "none", "--peers", "openvino", "--dtype", "float32", "--json", str(out)]

    monkeypatch.setitem(sys.modules, "openvino_genai", None)  # `import openvino_genai` raises ImportError
    with pytest.raises(PeerUnavailable, match="sparserl bench setup-openvino"):
        import_openvino_genai()
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "needs its runtime" in err and "sparserl bench setup-openvino" in err
    monkeypatch.delitem(sys.modules, "openvino_genai")

    monkeypatch.setattr("sparserl.bench.openvino_setup.runtime_missing", lambda: None)  # runtime there
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "exporter" in err and "does not exist" in err and "sparserl bench setup-openvino" in err
    (tmp_path / "cache" / "openvino" / "exporter" / "bin").mkdir(parents=True)  # interrupted: no marker
    assert cli.main(argv) == 1
    assert "incomplete" in capsys.readouterr().err
    monkeypatch.setenv("SPARSERL_OPENVINO_EXPORT_PYTHON", str(tmp_path / "no-python"))
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "SPARSERL_OPENVINO_EXPORT_PYTHON" in err and "not an executable file" in err
    assert not out.exists()


def test_openvino_setup_runs_its_steps_and_names_the_one_that_fails(monkeypatch, tmp_path):
    """The set-up's steps, in order, with the exporter's pins and torch's own version; a failing step
    is named with its output's tail; the marker is written last, so a failed set-up is not trusted."""
    from sparserl.bench import openvino_setup as ov

    monkeypatch.setattr(ov, "runtime_missing", lambda: None)
    calls = []

    def fake_run(cmd, capture_output, text):
        calls.append(cmd)
        if cmd[1:3] == ["-m", "venv"]:
            python = ov._venv_python(tmp_path / "venv")
            python.parent.mkdir(parents=True)
            python.write_text("")
        fail = "optimum.exporters" in " ".join(cmd) and fail_import[0]
        return subprocess.CompletedProcess(cmd, 1 if fail else 0, "", "ModuleNotFoundError: optimum" if fail else "")

    fail_import = [True]
    monkeypatch.setattr(ov.subprocess, "run", fake_run)
    with pytest.raises(OpenVINOSetupError, match="(?s)checking that the exporter imports failed.*ModuleNotFoundError"):
        ov.setup(venv=tmp_path / "venv", log=lambda *a: None)
    assert not (tmp_path / "venv" / ov.MARKER).exists()
    pip = next(c for c in calls if "install" in c)
    assert f"torch=={torch.__version__.split('+')[0]}" in pip and "optimum-intel==2.2.0" in pip
    assert any("uninstall" in c and "torchvision" in c for c in calls)
    fail_import[0] = False
    calls.clear()
    exe = ov.setup(venv=tmp_path / "venv", log=lambda *a: None)  # the incomplete one is redone
    assert calls[0][1:3] == ["-m", "venv"] and (tmp_path / "venv" / ov.MARKER).exists()
    calls.clear()
    assert ov.setup(venv=tmp_path / "venv", log=lambda *a: None) == exe and calls == []  # done: nothing to do


def test_openvino_runtime_pins_come_from_the_bench_extra():
    from sparserl.bench.openvino_setup import runtime_requirements

    reqs = runtime_requirements()
    assert any(r.startswith("openvino-genai==") for r in reqs) and any(r.startswith("openvino==") for r in reqs)


def _openvino_ready() -> bool:
    """The runtime and an exporter (``sparserl bench setup-openvino``; CI runs it)."""
    try:
        check_ready()
    except OpenVINOSetupError:
        return False
    return True


@pytest.mark.skipif(not _openvino_ready(), reason="the OpenVINO peer is not set up (sparserl bench setup-openvino)")
def test_openvino_rows_on_tiny(tiny, fast_machine, monkeypatch):
    """The export runs (in the set-up's environment) and the peer's rows come back."""
    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: tiny)
    report = rollout.run_bench(
        model="tiny",
        batch=2,
        max_new_tokens=4,
        kv_budget=128,
        step_length=32,
        compressors=[],
        dtype="float32",
        hf_baseline=False,
        peers=["openvino"],
        quants=["none", "int8"],
    )
    assert "peers_skipped" not in report, report.get("peers_skipped")
    rows = {(r["engine"], r["compressor"], r["quant"]): r for r in report["results"]}
    assert set(rows) == {
        ("sparserl", "none", "none"),
        ("sparserl", "none", "int8"),
        ("openvino", "none", "none"),
        ("openvino", "eviction", "none"),
        ("openvino", "none", "int8"),
    }
    assert rows["openvino", "none", "int8"]["openvino"]["ir"].endswith("-int8")
    rows = {(e, c): r for (e, c, q), r in rows.items() if q == "none"}
    for key in (("openvino", "none"), ("openvino", "eviction")):
        r = rows[key]
        assert r["tokens_per_s"] > 0 and r["kv_bytes_peak"] > 0 and r["openvino"]["precision"] == "f32"
        assert r["batch"] == 2 and r["max_new_tokens"] == 4
    assert rows["openvino", "eviction"]["openvino"]["cache_eviction"]["max_cache_size"] == 128


# --- quantized sampler rows ---------------------------------------------------------------------
def test_bench_quant_rows_fields_and_mismatch(tiny, fast_machine, monkeypatch):
    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: tiny)
    report = rollout.run_bench(
        model="tiny",
        batch=2,
        max_new_tokens=4,
        kv_budget=8,
        step_length=2,
        compressors=[],
        dtype="float32",
        hf_baseline=False,
        quants=["none", "int8"],
        kv_quants=["none"],
        log=lambda *a: None,
    )
    rows = {(r["quant"], r["kv_quant"]): r for r in report["results"]}
    assert set(rows) == {("none", "none"), ("int8", "none")}
    dense, q = rows["none", "none"], rows["int8", "none"]
    assert dense["ratio_vs_sparserl_dense"] == 1.0
    assert q["ratio_vs_sparserl_dense"] == pytest.approx(q["tokens_per_s"] / dense["tokens_per_s"])
    assert q["weight_bytes"] < dense["weight_bytes"] and q["quantize_s"] > 0 and q["quant_emulated"] is False
    assert 0.9 < q["alpha_mean"] <= 1.0 + 1e-6 and q["alpha_p5"] <= q["alpha_mean"] + 1e-9 and q["k3_kl"] >= 0
    assert q["mismatch_tokens"] == 2 * 3  # 2 sequences, tokens 2..4
    assert "alpha_mean" not in dense


def test_bench_quant_rows_roofline_uses_their_own_ceilings(tiny, fast_machine, monkeypatch):
    """A quantized row's roofline reads its own weight and KV bytes and its own products' rate (an
    int8 sampler measured against float32's ceilings could pass 1.0)."""
    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: tiny)
    monkeypatch.setattr(rollout, "gemm_flops_per_s", lambda model, rows: 50e9 if model.quant == "none" else 120e9)
    seen = []
    real = rollout.roofline
    monkeypatch.setattr(rollout, "roofline", lambda *a: seen.append(a) or real(*a))
    report = rollout.run_bench(
        model="tiny",
        batch=2,
        max_new_tokens=3,
        kv_budget=8,
        step_length=2,
        compressors=[],
        dtype="float32",
        hf_baseline=False,
        quants=["none", "int8"],
        kv_quants=["none", "int8"],
        log=lambda *a: None,
    )
    assert report["machine"]["gemm_flops_per_s_by_quant"] == {
        "none/none": 50e9,
        "int8/none": 120e9,
        "none/int8": 50e9,
        "int8/int8": 120e9,
    }
    rows = {(r["quant"], r["kv_quant"]): r for r in report["results"]}
    by_rate = {}
    for _batch, bytes_read, _flops, _bw, rate in seen:
        by_rate.setdefault(rate, set()).add(bytes_read)
    assert set(by_rate) == {50e9, 120e9}
    assert max(by_rate[120e9]) < min(by_rate[50e9])  # int8 weights: fewer bytes than float32's
    # the int8 KV rows read fewer bytes than the float32 KV rows of the same weights
    dense, kv8 = rows["none", "none"], rows["none", "int8"]
    assert kv8["roofline_tokens_per_s"] > dense["roofline_tokens_per_s"] or kv8["roofline_bound"] == "compute"


def test_bench_int8_group_rows_carry_their_group(tiny, fast_machine, monkeypatch):
    """--quant-group reaches the int8_group rows' sampler (the row reports what its quantizer used)."""
    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: tiny)
    report = rollout.run_bench(
        model="tiny",
        batch=2,
        max_new_tokens=3,
        kv_budget=8,
        step_length=2,
        compressors=[],
        dtype="float32",
        hf_baseline=False,
        quants=["int8", "int8_group"],
        quant_group=32,
        log=lambda *a: None,
    )
    groups = {r["quant"]: r["quant_group"] for r in report["results"]}
    assert groups == {"none": None, "int8": None, "int8_group": 32}


def test_bench_bad_quant_group_fails_before_loading(monkeypatch):
    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(ValueError, match="multiple of 4"):
        rollout.run_bench(model="tiny", quants=["int8_group"], quant_group=6)


def test_mismatch_of_the_dense_sampler_with_itself(tiny):
    from sparserl.bench.mismatch import sampler_mismatch
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import build_compressor

    engine = RolloutEngine(tiny, build_compressor("none"))
    mm = sampler_mismatch(engine, engine.model, "Once upon a time", rows=2, max_new_tokens=5)
    assert mm["alpha_mean"] == pytest.approx(1.0, abs=1e-4) and mm["k3_kl"] == pytest.approx(0.0, abs=1e-6)
    assert engine.step_hook is None  # restored


@pytest.mark.parametrize("option", ["quants", "kv_quants"])
def test_bench_bad_quant_name_fails_before_loading(monkeypatch, option):
    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(SparserlError, match="did you mean 'int8'"):
        rollout.run_bench(model="tiny", **{option: ["int9"]})


# --- decode-step kernels (the native kernels against torch, in one process) ---------------------
def test_bench_kernels_rows(tiny, fast_machine, monkeypatch):
    from sparserl.rollout import native

    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: tiny)
    report = rollout.run_bench(
        model="tiny",
        batch=2,
        max_new_tokens=4,
        kv_budget=8,
        step_length=2,
        compressors=["rkv"],
        dtype="float32",
        hf_baseline=False,
        kernels=["native", "torch"],
        kv_quants=["none", "fp8"],
        log=lambda *a: None,
    )
    rows = {(r["compressor"], r["kv_quant"], r["kernels"]): r for r in report["results"]}
    first = native.kernels("cpu", torch.float32)  # "native" wherever the kernel builds
    assert set(rows) == {
        ("none", "none", first),
        ("rkv", "none", first),
        ("none", "none", "torch"),
        ("rkv", "none", "torch"),
        ("none", "fp8", first),
        ("rkv", "fp8", first),
    }
    assert rows["none", "none", first]["ratio_vs_sparserl_dense"] == 1.0  # the first kernel's dense row
    # the fused step runs with the native kernels only (and with a quantized KV cache too)
    assert {k: r["fused"] for k, r in rows.items()} == {k: k[2] == "native" for k in rows}


def test_bench_unknown_kernels(monkeypatch):
    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(ValueError, match="known: native, torch"):
        rollout.run_bench(model="tiny", kernels=["flash"])


def test_bench_quantized_rows_run_the_first_kernels(tiny, fast_machine, monkeypatch):
    """``--kernels torch`` alone: the quantized rows are timed with torch's kernels too, as labelled,
    and their warm-up ran with those kernels (fbgemm's weight copy is made before timing, not in it)."""
    ran, ready = [], []
    timed = rollout._sparserl_run

    def record(engine, params, kernels="native"):
        ran.append((engine.model.quant, kernels))
        ready.append(getattr(engine.model.layers[0].qkv, "packed", True) is not None)  # float rows: True
        return timed(engine, params, kernels)

    monkeypatch.setattr(rollout, "_sparserl_run", record)
    monkeypatch.setattr(rollout, "load_model", lambda *a, **k: tiny)
    report = rollout.run_bench(
        model="tiny",
        batch=2,
        max_new_tokens=3,
        kv_budget=8,
        step_length=2,
        compressors=[],
        dtype="float32",
        hf_baseline=False,
        quants=["none", "int8"],
        kernels=["torch"],
        log=lambda *a: None,
    )
    assert sorted(ran) == [("int8", "torch"), ("none", "torch")]
    assert {r["kernels"] for r in report["results"]} == {"torch"}
    from sparserl.rollout.quant.int8 import fbgemm_available

    assert all(ready) or not fbgemm_available("cpu")


def test_export_python_that_is_not_a_python_is_named(monkeypatch, tmp_path):
    from sparserl.bench.openvino_setup import exporter_python

    fake = tmp_path / "not-python"
    fake.write_text("this is not a program\n")
    fake.chmod(0o755)
    monkeypatch.setenv("SPARSERL_OPENVINO_EXPORT_PYTHON", str(fake))
    with pytest.raises(OpenVINOSetupError, match="not a Python that imports optimum.intel"):
        exporter_python()
