"""The rollout cost model (sparserl.cost): every term on a hand-computed case, the orderings it must
respect, the engine's own cache trajectory, and bad input."""

import pytest
import torch

from sparserl.cost import MachineRates, ModelShape, predicted_cost_vs_dense, rollout_cost
from sparserl.rollout.kv import build_compressor
from sparserl.rollout.kv.schedule import KVSchedule

# A hand-sized decoder: 1 layer, hidden 4, 2 query heads, 1 KV head, head dim 2, MLP 8, vocab 10,
# float32 weights and KV (4 bytes).
#   layer weights = (Hq + 2 Hkv) d h + h Hq d + 3 I h = 4·2·4 + 4·4 + 3·8·4 = 32 + 16 + 96 = 144
#   P_w = 144 + V h (LM head) = 144 + 40 = 184;  P = 144 + 2·4 (norms) + 40 (tied embedding) + 4 = 196
#   D = 2 ℓ Hkv d = 4,  r = 2
TINY = ModelShape(layers=1, hidden=4, heads=2, kv_heads=1, head_dim=2, intermediate=8, vocab=10)
# 1000 bytes/s and 1000 FLOP/s: a step's weights alone are 184·4 = 736 bytes (0.736 s) and
# 2·184 = 368 FLOPs per sequence (0.368 s), so a one-sequence step is memory-bound
SLOW = MachineRates(bandwidth=1000.0, gemm_flops=1000.0)
# Prefill, 1 sequence, 2 prompt tokens: bytes 736 + N L_in D b_kv = 736 + 2·4·4 = 768;
# FLOPs 2 N L_in (P_w − V h) + 2 N V h + 4 N ℓ Hq d L_in² = 2·2·144 + 2·40 + 4·2·2·4 = 576 + 80 + 64 = 720
# → max(0.768, 0.720) = 0.768 s
PREFILL = 0.768

SMOL = ModelShape.from_config(
    {
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "intermediate_size": 1536,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
        "model_type": "llama",
    },
    "float32",
)
CPU = MachineRates(bandwidth=10e9, gemm_flops=100e9)


def test_shape_hand_computed():
    assert TINY.layer_weights == 144
    assert TINY.decode_weights == 184
    assert TINY.params == 196
    assert TINY.kv_width == 4 and TINY.gqa_ratio == 2
    bf16 = ModelShape.from_config(
        {
            "num_hidden_layers": 1,
            "hidden_size": 4,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "intermediate_size": 8,
            "vocab_size": 10,
        },
        "bfloat16",
        kv_dtype=torch.float32,
    )
    assert bf16.head_dim == 2 and bf16.weight_bytes == 2 and bf16.kv_bytes == 4


def test_shape_matches_the_sampler(tiny_lm):
    from sparserl.bench.machine import decode_linear_weights
    from sparserl.rollout.model import SamplerModel

    shape = ModelShape.from_config(tiny_lm.model.config)
    sampler = SamplerModel(tiny_lm.model, torch.float32)
    assert shape.decode_weights == sum(w.numel() for w in decode_linear_weights(sampler))
    assert shape.params == sum(p.numel() for p in tiny_lm.model.parameters())


def test_dense_memory_bound_hand_computed():
    # 1 sequence, prompt 2, response 3: decode steps s = 1, 2 with K = 3, 4 tokens.
    # KV bytes N D b_kv K = 16 K = 48, 64; attention FLOPs 2 r N D K = 16 K = 48, 64.
    # Steps: max((736 + 48)/1000, (368 + 48)/1000) = 0.784, max(0.800, 0.432) = 0.800 (memory-bound)
    c = rollout_cost(TINY, SLOW, 1, 2, 3)
    assert c.method == "dense" and c.decode_steps == 2 and c.memory_bound_steps == 2 and c.compressions == 0
    assert c.prefill_s == pytest.approx(PREFILL)
    assert c.weight_s == pytest.approx(2 * 0.736)
    assert c.attention_s == pytest.approx(0.048 + 0.064)
    assert c.scoring_s == 0 and c.compression_s == 0
    assert c.seconds == pytest.approx(PREFILL + 1.472 + 0.112)
    assert c.kv_tokens_mean == pytest.approx(3.5)
    assert c.bytes_read == pytest.approx(768 + 784 + 800)
    assert c.flops == pytest.approx(720 + 416 + 432)


def test_dense_compute_bound_hand_computed():
    # the same at 100 FLOP/s: steps are compute-bound, (368 + 48)/100 = 4.16 s and (368 + 64)/100 = 4.32 s;
    # the prefill max(768/1000, 720/100) = 7.2 s
    c = rollout_cost(TINY, MachineRates(1000.0, 100.0), 1, 2, 3)
    assert c.memory_bound_steps == 0
    assert c.prefill_s == pytest.approx(7.2)
    assert c.weight_s == pytest.approx(2 * 3.68)
    assert c.attention_s == pytest.approx(0.48 + 0.64)
    # the prefill's own GEMM rate (1000 FLOP/s at its rows): max(768/1000, 720/1000) = 0.768 s
    assert rollout_cost(TINY, MachineRates(1000.0, 100.0, prefill_flops=1000.0), 1, 2, 3).prefill_s == pytest.approx(
        PREFILL
    )


def test_dense_attention_flops_are_kinetics():
    # compute-bound (bandwidth unbounded for practical purposes): attention FLOPs summed over the
    # decode steps = 2 r N D Σ_{s=1}^{L_out-1} (L_in + s), Kinetics' r(2 L_in + L_out) L_out N D term
    rates = MachineRates(1e30, 1e9)
    n, lin, lout = 4, 100, 500
    c = rollout_cost(SMOL, rates, n, lin, lout)
    total = sum(lin + s for s in range(1, lout))
    assert c.attention_s * rates.gemm_flops == pytest.approx(2 * SMOL.gqa_ratio * n * SMOL.kv_width * total)


def test_rkv_compression_hand_computed():
    # budget 2, step_length 1, window 1, prompt 2 (kept whole), response 5: 4 decode steps.
    # region after each step: 1, 2, 3 (≥ 2 + 1: compressed to 2, cache 5 → 4), then 3 at the last
    # step (skipped: nothing is written after it). K = 3, 4, 5, 5.
    # Steps (memory-bound): weights 4 · 0.736 = 2.944 s; KV 16 K bytes = 48 + 64 + 80 + 80 = 272 → 0.272 s.
    # Compression (L = 5 slots, R = 3, keep 2): FLOPs N ℓ (2 Hq w L d + Hkv R(R−1) d) = 2·2·1·5·2 + 3·2·2
    # = 40 + 12 = 52; bytes N ℓ Hkv d b_kv (L + 8 keep) = 8 · (5 + 16) = 168 → max(0.168, 0.052) = 0.168 s
    c = rollout_cost(TINY, SLOW, 1, 2, 5, budget=2, step_length=1, window=1)
    assert c.method == "budget" and c.compressions == 1 and c.decode_steps == 4
    assert c.weight_s == pytest.approx(2.944)
    assert c.attention_s == pytest.approx(0.272)
    assert c.compression_s == pytest.approx(0.168)
    assert c.seconds == pytest.approx(PREFILL + 2.944 + 0.272 + 0.168)
    # SnapKV scores by the window alone (40 FLOPs), StreamingLLM not at all: its compression is the
    # copy, 8 · 16 = 128 bytes → 0.128 s
    assert rollout_cost(
        TINY, SLOW, 1, 2, 5, budget=2, step_length=1, window=1, compressor="snapkv"
    ).compression_s == pytest.approx(0.168)
    assert rollout_cost(
        TINY, MachineRates(1e6, 1.0), 1, 2, 5, budget=2, step_length=1, window=1, compressor="snapkv"
    ).compression_s == pytest.approx(40.0)
    streaming = build_compressor("streaming", kv_budget=2, step_length=1, window=1, options={"sinks": 0})
    assert rollout_cost(TINY, SLOW, 1, 2, 5, compressor=streaming).compression_s == pytest.approx(0.128)


def test_blocktopk_hand_computed():
    # 1 page of 2 tokens read, no dense layer, prompt 2, response 4: K = 3, 4, 5, each step attends 2.
    # Attention bytes 16 · 2 = 32 → 3 · 0.032 = 0.096 s. Pages ⌈K/2⌉ = 2, 2, 3, scored by reading
    # N ℓ Hkv d b_kv = 8 bytes each (16 + 16 + 24 = 56 → 0.056 s) and 2 N ℓ Hq d = 8 FLOPs each.
    c = rollout_cost(TINY, SLOW, 1, 2, 4, blocktopk_pages=1, page_size=2, dense_layers=0)
    assert c.method == "blocktopk" and c.memory_bound_steps == 3
    assert c.weight_s == pytest.approx(3 * 0.736)
    assert c.attention_s == pytest.approx(0.096)
    assert c.scoring_s == pytest.approx(0.056)
    assert c.seconds == pytest.approx(PREFILL + 2.208 + 0.096 + 0.056)
    assert c.kv_tokens_mean == 2
    # the one layer kept dense: the dense attention (16·(3 + 4 + 5) = 192 bytes), nothing scored
    d = rollout_cost(TINY, SLOW, 1, 2, 4, blocktopk_pages=1, page_size=2, dense_layers=1)
    assert d.attention_s == pytest.approx(0.192) and d.scoring_s == 0


def test_blocktopk_reads_fewer_bytes_than_dense():
    dense = rollout_cost(SMOL, CPU, 16, 32, 2048)
    sparse = rollout_cost(SMOL, CPU, 16, 32, 2048, blocktopk_pages=8)
    assert sparse.bytes_read < dense.bytes_read
    assert sparse.attention_s + sparse.scoring_s < dense.attention_s
    assert sparse.seconds < dense.seconds


def test_dense_costs_more_than_a_budget_on_long_responses():
    dense = rollout_cost(SMOL, CPU, 16, 32, 2048)
    costs = [rollout_cost(SMOL, CPU, 16, 32, 2048, budget=b, step_length=128) for b in (64, 128, 256)]
    for c in costs:
        assert dense.seconds > c.seconds and c.compressions > 0
    assert costs[0].seconds < costs[1].seconds < costs[2].seconds
    # a budget the response never reaches costs what dense does
    assert rollout_cost(SMOL, CPU, 16, 32, 100, budget=256).seconds == pytest.approx(
        rollout_cost(SMOL, CPU, 16, 32, 100).seconds
    )


def test_schedule_between_its_smallest_and_largest_budget():
    sched = KVSchedule.from_pairs([[0, 64], [1000, 256]])
    kw = dict(step_length=64)
    lo = rollout_cost(SMOL, CPU, 16, 32, 2048, budget=64, **kw)
    hi = rollout_cost(SMOL, CPU, 16, 32, 2048, budget=256, **kw)
    mid = rollout_cost(SMOL, CPU, 16, 32, 2048, schedule=sched, **kw)
    assert mid.method == "schedule"
    assert lo.seconds < mid.seconds < hi.seconds
    # the pairs, as rollout.kv_schedule gives them, are the same schedule
    assert rollout_cost(SMOL, CPU, 16, 32, 2048, schedule=[[0, 64], [1000, 256]], **kw) == mid


def test_ratio_to_dense():
    assert predicted_cost_vs_dense(SMOL, CPU, 16, 32, 512) == 1.0
    r = predicted_cost_vs_dense(SMOL, CPU, 16, 32, 2048, budget=128)
    assert 0 < r < 1
    assert r == pytest.approx(
        rollout_cost(SMOL, CPU, 16, 32, 2048, budget=128).seconds / rollout_cost(SMOL, CPU, 16, 32, 2048).seconds
    )


@pytest.mark.parametrize(
    "options",
    [
        dict(budget=8, step_length=4, window=2),
        dict(budget=8, step_length=3, window=2, tail_slack=5),
        dict(schedule=[[0, 6], [14, 10]], step_length=4, window=2),
        dict(budget=6, step_length=4, window=2, compress_prompt=True),
    ],
)
def test_trajectory_is_the_engines(tiny_lm, options):
    """The compressions and the final cache the model predicts are the engine's."""
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.sampling import SamplingParams

    comp = build_compressor(
        "rkv",
        kv_budget=options.get("budget"),
        step_length=options["step_length"],
        window=options["window"],
        compress_prompt=options.get("compress_prompt", False),
        tail_slack=options.get("tail_slack", 0),
        options={"schedule": options["schedule"]} if "schedule" in options else None,
    )
    engine = RolloutEngine(tiny_lm, comp, dtype=torch.float32)
    prompt = list(range(3, 15))  # 12 tokens: longer than the compressible prompt's buffer
    out = engine.generate(["-"], SamplingParams(n=2, max_new_tokens=30, ignore_eos=True, seed=0), prompt_ids=[prompt])
    shape = ModelShape.from_config(tiny_lm.model.config)
    c = rollout_cost(shape, CPU, 2, len(prompt), 30, **options)
    assert c.decode_steps == 29
    assert c.compressions == out.kv.compressions > 0
    assert out.kv_tokens_kept == [c.kv_tokens_last] * 2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n=0), "n must be"),
        (dict(prompt_len=-1), "prompt_len must be"),
        (dict(response_len=-5), "response_len must be"),
        (dict(response_len=0), "response_len must be"),
        (dict(budget=0), "budget must be"),
        (dict(budget=-3), "budget must be"),
        (dict(step_length=0), "step_length must be"),
        (dict(budget=64, schedule=[[0, 64]]), "not both"),
        (dict(budget=64, compressor="h2o"), "no cost terms for compressor 'h2o'"),
        (dict(budget=4, window=8), "larger than the observation window"),
        (dict(schedule=[[0, 0]]), "budget 0 must be >= 1"),
        (dict(blocktopk_pages=0), "blocktopk_pages must be"),
        (dict(blocktopk_pages=4, budget=64), "block top-k keeps the whole cache"),
        (dict(blocktopk_pages=4, dense_layers=31), "dense_layers"),
        (dict(budget=64, compressor="none"), "compressor 'none' is dense"),
    ],
)
def test_bad_input_raises(kwargs, match):
    args = dict(n=16, prompt_len=32, response_len=256)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        rollout_cost(SMOL, CPU, args.pop("n"), args.pop("prompt_len"), args.pop("response_len"), **args)


def test_bad_shapes_and_rates_raise():
    with pytest.raises(ValueError, match="bandwidth must be"):
        MachineRates(0.0, 1e9)
    with pytest.raises(ValueError, match="gemm_flops must be"):
        MachineRates(1e9, float("nan"))
    with pytest.raises(ValueError, match="prefill_flops must be"):
        MachineRates(1e9, 1e9, prefill_flops=-1.0)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        ModelShape(layers=1, hidden=4, heads=3, kv_heads=2, head_dim=2, intermediate=8, vocab=10)
    with pytest.raises(ValueError, match="layers must be"):
        ModelShape(layers=0, hidden=4, heads=2, kv_heads=1, head_dim=2, intermediate=8, vocab=10)
    with pytest.raises(ValueError, match="unknown dtype"):
        ModelShape.from_config(SMOL_CONFIG, "float33")
    with pytest.raises(ValueError, match="memory_bandwidth_bytes_per_s"):
        MachineRates.from_machine_info({"gemm_flops_per_s": 1e9})
    assert MachineRates.from_machine_info(
        {"memory_bandwidth_bytes_per_s": 2e9, "gemm_flops_per_s": 5e9}
    ) == MachineRates(2e9, 5e9)


SMOL_CONFIG = {
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
}


@pytest.fixture(scope="module")
def tiny_lm():
    """A 2-layer random Llama with a 64-token vocabulary (built in milliseconds, no tokenizer load)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from sparserl.models.loading import IdsOnlyTokenizer, LoadedModel

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LoadedModel(LlamaForCausalLM(cfg).eval(), IdsOnlyTokenizer(), "cost-test", None)


def test_cost_imports_nothing_of_bench():
    """One way: ``sparserl.bench`` measures the machine and predicts with the cost model
    (:func:`sparserl.bench.machine.measure_rates` builds :class:`MachineRates`); the model itself is
    formulas on shapes and rates, and imports no bench module, not even inside a function."""
    import ast
    from pathlib import Path

    import sparserl.cost

    tree = ast.parse(Path(sparserl.cost.__file__).read_text())
    names = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not [n for n in names if "bench" in n.split(".")]


def test_measure_rates_gives_the_cost_model_its_machine(tiny_lm):
    from sparserl.bench.machine import measure_rates
    from sparserl.rollout.model import SamplerModel

    rates = measure_rates(SamplerModel(tiny_lm.model, torch.float32), rows=2, prefill_rows=4)
    assert isinstance(rates, MachineRates) and rates.prefill_flops is not None
    assert rollout_cost(ModelShape.from_config(tiny_lm.model.config), rates, 2, 4, 8).seconds > 0
