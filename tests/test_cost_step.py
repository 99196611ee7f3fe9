"""The whole step's cost model (sparserl.cost.step): stations summing to the step, what depends on the
compressor and what does not, the options that add or remove work, and the seeds' shapes."""

import pytest

from sparserl import runlog as names
from sparserl.cost import MachineRates, ModelShape, forward_cost, rollout_cost_lengths, spread_lengths, step_cost
from sparserl.cost.machines import H200
from sparserl.cost.shapes import model_shape
from sparserl.cost.sparrow import pages_schedule
from sparserl.cost.step import ADAMW_BYTES_PER_PARAM, SOFTMAX_PASSES, STATIONS, with_weight_bytes

SMOL = model_shape("smollm2-135m")  # float32
CPU = MachineRates(bandwidth=20e9, gemm_flops=200e9, prefill_flops=800e9)
LONG = spread_lengths(32, 256, 1024)
TINY = ModelShape(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=32)
UNIT = MachineRates(bandwidth=1.0, gemm_flops=1.0, prefill_flops=1.0)


def test_stations_sum_to_the_step_and_carry_the_run_logs_names():
    s = step_cost(SMOL, CPU, 100, LONG, group_size=8, budget=256)
    assert tuple(s.stations) == STATIONS
    assert s.seconds == pytest.approx(sum(s.stations.values()))
    d = s.to_dict()
    assert d[names.TIME_STEP] == pytest.approx(s.seconds)
    assert all(d[k] == s.stations[k] for k in STATIONS)
    assert 0 < d["rollout_fraction"] < 1 and d["rollout"]["method"] == "budget"
    assert s.parts[names.TIME_PUSH] < s.stations[names.TIME_UPDATE]  # push is part of the update


def test_compression_shrinks_the_rollout_only():
    dense = step_cost(SMOL, CPU, 100, [4096] * 32, group_size=8)
    sparse = step_cost(SMOL, CPU, 100, [4096] * 32, group_size=8, budget=256)
    topk = step_cost(SMOL, CPU, 100, [4096] * 32, group_size=8, blocktopk_pages=16)
    assert sparse.stations[names.TIME_ROLLOUT] < 0.7 * dense.stations[names.TIME_ROLLOUT]
    assert topk.stations[names.TIME_ROLLOUT] < dense.stations[names.TIME_ROLLOUT]
    for other in (sparse, topk):
        for station in (names.TIME_SCORE, names.TIME_ALPHA, names.TIME_UPDATE):
            assert other.stations[station] == dense.stations[station]


def test_a_tighter_budget_gives_a_cheaper_rollout_at_long_lengths():
    times = [step_cost(SMOL, CPU, 100, [4096] * 8, budget=b).stations[names.TIME_ROLLOUT] for b in (1024, 512, 128)]
    assert times[0] > times[1] > times[2]


def test_old_logprobs_from_the_update_or_the_sampler_remove_the_scoring():
    score = step_cost(SMOL, CPU, 100, LONG)
    for source in ("update", "sampler"):
        s = step_cost(SMOL, CPU, 100, LONG, old_logprobs=source)
        assert s.stations[names.TIME_SCORE] == 0.0
        assert s.seconds == pytest.approx(score.seconds - score.stations[names.TIME_SCORE])
    assert score.stations[names.TIME_SCORE] == pytest.approx(score.parts["learner/forward_s"])
    ref = step_cost(SMOL, CPU, 100, LONG, ref_model=True)
    assert ref.stations[names.TIME_SCORE] == pytest.approx(2 * score.stations[names.TIME_SCORE])


def test_gradient_checkpointing_adds_one_forward_of_the_layers():
    prompts = 4
    fwd = forward_cost(SMOL, CPU, 100, LONG, prompts)
    plain = step_cost(SMOL, CPU, 100, LONG, group_size=8)
    ckpt = step_cost(SMOL, CPU, 100, LONG, group_size=8, gradient_checkpointing=True)
    extra = ckpt.stations[names.TIME_UPDATE] - plain.stations[names.TIME_UPDATE]
    assert extra == pytest.approx(fwd.layers_s)
    # forward + backward = 3 forwards of the GEMMs, 2 log-softmax passes
    fb = plain.parts["update/forward_backward_s"]
    assert fb == pytest.approx(3 * (fwd.layers_s + fwd.head_s) + 2 * fwd.logits_s)
    two = step_cost(SMOL, CPU, 100, LONG, group_size=8, ppo_epochs=2)
    assert two.parts["update/forward_backward_s"] == pytest.approx(2 * fb)


def test_forward_by_hand_on_unit_rates():
    """TINY on 1 B/s and 1 FLOP/s: 1 prompt of 2 tokens, responses of 1 and 3 tokens, one micro-batch."""
    f = forward_cost(TINY, UNIT, 2, [1, 3], prompts=1, micro_batch_tokens=None)
    layer_w = TINY.decode_weights - 32 * 8
    tokens = 2 + 4
    pairs = 2**2 / 2 + (1 * 2 + 1 / 2) + (3 * 2 + 9 / 2)
    assert f.layer_flops == pytest.approx(2 * layer_w * tokens + 4 * 2 * 2 * 4 * pairs)
    assert f.layers_s == pytest.approx(max(layer_w * 4.0, f.layer_flops))
    assert f.head_flops == pytest.approx(2 * 32 * 8 * 4)
    assert f.logits_s == pytest.approx(SOFTMAX_PASSES * 4 * 4 * 32)
    assert forward_cost(TINY, UNIT, 2, [1, 3], prompts=1, micro_batch_tokens=2).micro_batches == 3


def test_the_prompt_shared_by_a_group_is_forwarded_once():
    shared = step_cost(SMOL, CPU, 500, LONG, group_size=8)
    whole = step_cost(SMOL, CPU, 500, LONG, group_size=8, shared_prompt=False)
    assert shared.learner_tokens == 4 * 500 + sum(LONG) and whole.learner_tokens == 32 * 500 + sum(LONG)
    assert shared.stations[names.TIME_UPDATE] < whole.stations[names.TIME_UPDATE]


def test_alpha_by_where_q_comes_from():
    s = {q: step_cost(SMOL, CPU, 100, LONG, alpha_q=q) for q in ("hidden", "kept", "replay", "topk", "off")}
    a = {q: v.stations[names.TIME_ALPHA] for q, v in s.items()}
    assert a["topk"] == a["off"] == 0.0
    assert 0 < a["kept"] < a["hidden"]  # one head product instead of two
    assert a["replay"] == pytest.approx(a["kept"] + s["replay"].stations[names.TIME_ROLLOUT])
    t_out, head = sum(LONG), SMOL.vocab * SMOL.hidden
    expect = 4 * head * t_out / CPU.prefill_rate + (2 * SOFTMAX_PASSES + 2) * 4 * t_out * SMOL.vocab / CPU.bandwidth
    assert a["hidden"] == pytest.approx(expect)


def test_update_counts_adamw_and_the_push():
    s = step_cost(SMOL, CPU, 100, LONG)
    assert s.parts["update/optimizer_s"] == pytest.approx(ADAMW_BYTES_PER_PARAM * SMOL.params / CPU.bandwidth)
    int8 = with_weight_bytes(SMOL, 1.0)
    q = step_cost(int8, CPU, 100, LONG, learner=SMOL)
    assert q.parts[names.TIME_PUSH] == pytest.approx(SMOL.params * (4 + 1) / CPU.bandwidth)
    assert q.stations[names.TIME_ROLLOUT] < s.stations[names.TIME_ROLLOUT]  # fewer weight bytes a decode step
    assert q.stations[names.TIME_UPDATE] < s.stations[names.TIME_UPDATE]  # the push writes 1 byte, not 4


def test_int8_keeps_the_head_at_its_own_bytes():
    int8 = with_weight_bytes(SMOL, 1.0)
    head = SMOL.vocab * SMOL.hidden
    assert int8.decode_weight_bytes == pytest.approx((SMOL.decode_weights - head) * 1.0 + head * 4.0)
    assert with_weight_bytes(SMOL, 1.0, 1.0).decode_weight_bytes == pytest.approx(SMOL.decode_weights)


def test_rows_leave_the_batch_as_they_end():
    """Two rows of 4 and 8 tokens = a row of 4 plus a row of 8, less one prefill and the weight reads
    they shared (memory-bound: unit compute rate far above the bandwidth)."""
    fast = MachineRates(bandwidth=1.0, gemm_flops=1e30)
    both = rollout_cost_lengths(TINY, fast, 2, [4, 8])
    short = rollout_cost_lengths(TINY, fast, 2, [4])
    long = rollout_cost_lengths(TINY, fast, 2, [8])
    shared_weights = (4 - 1) * TINY.decode_weight_bytes  # the 3 decode steps both rows ran
    prefill_w = TINY.decode_weight_bytes
    assert both.seconds == pytest.approx(short.seconds + long.seconds - shared_weights - prefill_w)
    assert both.decode_steps == 7


def test_blocktopk_pages_may_follow_the_length():
    steps = [[0, 2], [64, 8]]
    grow = rollout_cost_lengths(SMOL, CPU, 16, [256] * 4, blocktopk_pages=steps)
    low = rollout_cost_lengths(SMOL, CPU, 16, [256] * 4, blocktopk_pages=2)
    high = rollout_cost_lengths(SMOL, CPU, 16, [256] * 4, blocktopk_pages=8)
    assert low.attention_s < grow.attention_s < high.attention_s
    with pytest.raises(ValueError, match="start at length 0"):
        rollout_cost_lengths(SMOL, CPU, 16, [256], blocktopk_pages=[[10, 4]])


def test_the_rollout_fraction_grows_with_length_on_the_gpu():
    shape = model_shape("qwen3-1.7b", "bfloat16")
    fracs = [
        step_cost(shape, H200.rates, 256, [n] * 32, group_size=8, gradient_checkpointing=True).rollout_fraction
        for n in (1024, 4096, 16384)
    ]
    assert fracs[0] < fracs[1] < fracs[2]


def test_sparrows_schedule_speeds_up_the_rollout_more_than_the_step():
    shape = model_shape("qwen3-4b", "bfloat16")
    lens = spread_lengths(32, 8000, 32000)
    kw = dict(group_size=8, ref_model=True, alpha_q="topk", gradient_checkpointing=True)
    dense = step_cost(shape, H200.rates, 256, lens, **kw)
    sparse = step_cost(shape, H200.rates, 256, lens, blocktopk_pages=pages_schedule("qwen3-4b"), **kw)
    rollout_x = dense.stations[names.TIME_ROLLOUT] / sparse.stations[names.TIME_ROLLOUT]
    step_x = dense.seconds / sparse.seconds
    assert 1.5 < step_x < rollout_x < 4


@pytest.mark.parametrize("model, params", [("qwen3-1.7b", 1.7e9), ("qwen3-4b", 4.0e9), ("smollm2-135m", 135e6)])
def test_the_seeds_shapes_have_their_published_parameter_counts(model, params):
    assert model_shape(model).params == pytest.approx(params, rel=0.03)


def test_spread_lengths():
    assert spread_lengths(4, 100, 100) == [100] * 4
    lens = spread_lengths(4, 0 + 1, 801)
    assert lens == [101, 301, 501, 701] and min(lens) >= 1
    with pytest.raises(ValueError, match="low <= high"):
        spread_lengths(4, 10, 5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(old_logprobs="reference"), "old_logprobs must be"),
        (dict(alpha_q="exact"), "alpha_q must be"),
        (dict(group_size=0), "group_size must be"),
        (dict(ppo_epochs=0), "ppo_epochs must be"),
        (dict(micro_batch_tokens=0), "micro_batch_tokens must be"),
        (dict(learner=TINY), "same model"),
        (dict(nonsense=1), "unknown argument"),
    ],
)
def test_bad_input_names_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        step_cost(SMOL, CPU, 100, LONG, **kwargs)


def test_model_shape_reads_a_config_folder(tmp_path):
    import json

    from sparserl.cost.shapes import CONFIGS

    (tmp_path / "config.json").write_text(json.dumps(CONFIGS["qwen3-4b"]))
    assert model_shape(str(tmp_path), "bfloat16") == model_shape("qwen3-4b", "bfloat16")
    with pytest.raises(ValueError, match="neither one of"):
        model_shape(str(tmp_path / "missing"))


def test_the_command_prints_and_writes_the_split(tmp_path, capsys):
    import json

    from sparserl import cli

    out = tmp_path / "split.json"
    argv = ["bench", "step-cost", "--machine", "2e10:2e11:8e11", "--dtype", "float32", "--json", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "| dense |" in printed and "| int8 |" in printed
    doc = json.loads(out.read_text())
    assert list(doc["arms"]) == ["dense", "rkv256", "controller", "blocktopk", "int8"]
    dense = doc["arms"]["dense"]
    assert dense[names.TIME_STEP] == pytest.approx(sum(dense[k] for k in STATIONS))
    assert doc["options"]["lengths"] == [1024] * 32
    again = tmp_path / "again.json"  # an earlier output's rates, read back: the same prediction
    assert cli.main(["bench", "step-cost", "--machine", str(out), "--dtype", "float32", "--json", str(again)]) == 0
    assert json.loads(again.read_text())["arms"] == doc["arms"]

    assert cli.main(["bench", "step-cost", "--setting", "sparrow", "--model", "qwen3-4b"]) == 0
    assert "Sparrow published (4 x H200): rollout 2.41x, one RL step 2.11x" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--machine", "fast"], "--machine 'fast'"),
        (["--arms", "dense,sparrow"], "Sparrow published schedules for"),
        (["--arms", "dense,rkv"], "unknown arm 'rkv'"),
        (["--lengths", "10-x"], "--lengths"),
        (["--setting", "short"], "--setting"),
    ],
)
def test_the_command_refuses_bad_options(argv, match, capsys):
    from sparserl import cli

    assert cli.main(["bench", "step-cost", "--machine", "2e10:2e11", *argv]) == 1
    assert match in capsys.readouterr().err


def test_the_prediction_beside_a_measured_split(tmp_path, capsys):
    import json

    from sparserl import cli
    from sparserl.cost.arms import beside

    steps = {"dense": step_cost(SMOL, CPU, 100, LONG), "rkv256": step_cost(SMOL, CPU, 100, LONG, budget=256)}
    row = {names.TIME_STEP: 10.0, names.TIME_ROLLOUT: 4.0, names.TIME_SCORE: 1.0, names.TIME_UPDATE: 5.0}
    side = beside(steps, {"dense": row, "rkv_fixed": row, "config": row}, {"rkv_fixed": "rkv256"})
    lines = side.splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| dense", "| rkv_fixed"]  # "config": no prediction
    dense = steps["dense"]
    assert f"{dense.rollout_fraction:.0%} / 40%" in lines[2] and f"{dense.seconds:.3g} / 10" in lines[2]
    assert beside(steps, {"config": row}) == ""

    measured = tmp_path / "bench_step.json"
    measured.write_text(json.dumps({"summary": {"dense": row, "rkv_fixed": row}}))
    argv = ["bench", "step-cost", "--machine", "2e10:2e11:8e11", "--dtype", "float32", "--measured", str(measured)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "beside" in out and "| rkv_fixed | " in out
    measured.write_text("{}")
    assert cli.main(argv) == 1
    assert "not a `sparserl bench step --json` output" in capsys.readouterr().err
