"""The static decode step (sparserl.rollout.static_step): the eager engine's tokens from a step whose tensors keep
their shapes and which reads nothing back to the host, for dense and every compressor that evicts; refused where
it cannot run; the sampling stream's counter as a device tensor."""

from __future__ import annotations

import pytest
import torch

from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import get_compressor
from sparserl.rollout.sampling import SamplingParams, row_uniforms
from sparserl.rollout.static_step import StaticDecodeStep, generate_static, static_unsupported

PROMPTS = ["hello there", "What is 3 + 4? Answer with a number.", "Count: one two"]


def _pair(tiny, name: str, every: int, **kw):
    comp = get_compressor(name, **kw) if name != "none" else get_compressor("none")
    eager = RolloutEngine(tiny, comp, fused=False)
    static = RolloutEngine(tiny, comp, fused=False, static=True, static_check_every=every)
    return eager, static


@pytest.mark.parametrize(
    "name,every,kw",
    [
        ("none", 1, {}),
        ("none", 8, {}),
        ("rkv", 1, {"budget": 12, "step_length": 4}),
        ("snapkv", 1, {"budget": 12, "step_length": 4, "window": 4}),
        ("streaming", 1, {"budget": 12, "step_length": 4}),
        ("h2o", 1, {"budget": 12, "step_length": 4}),
        ("blocktopk", 1, {"pages": 3, "dense_layers": 1}),
    ],
)
def test_static_step_gives_the_eager_engines_tokens(tiny, name, every, kw):
    """Greedy, so that a token is a function of the logits' order: attention over the masked capacity sums in
    another order than over the longest row's slots (logits ~1e-7 apart), which under sampling moves a draw that
    falls within that of a CDF boundary (the tail's tokens hold ~2e-7 each) to the neighbouring token. The head's
    inputs (``keep_hidden``) agree to float rounding; the compressions are the same."""
    eager, static = _pair(tiny, name, every, **kw)
    new = 60 if name == "blocktopk" else 30  # block top-k: rows of 4-5 pages, 3 read (the choice is exercised)
    params = SamplingParams(n=2, max_new_tokens=new, seed=5, temperature=0.0, keep_hidden=True)
    a, b = eager.generate(PROMPTS, params), static.generate(PROMPTS, params)
    if name == "blocktopk":
        assert max(len(p) + len(r) for p, r in zip(a.prompt_ids, a.response_ids)) > 4 * 16
    assert a.response_ids == b.response_ids
    for x, y in zip(a.hidden, b.hidden):
        assert torch.allclose(x, y, atol=1e-4)
    assert a.finish_reason == b.finish_reason
    if name not in ("none", "blocktopk"):
        assert b.kv.compressions == a.kv.compressions > 0 and b.kv_tokens_kept == a.kv_tokens_kept


def test_sampled_tokens_and_their_logprobs_follow_the_eager_engine(tiny):
    """At temperature 1 the draws are the eager engine's (the same stream, read from the device counter): the
    tokens agree up to the first that falls within float rounding of a CDF boundary, their log-probs to 1e-5."""
    eager, static = _pair(tiny, "rkv", 1, budget=12, step_length=4)
    params = SamplingParams(n=2, max_new_tokens=30, seed=5, temperature=1.0)
    a, b = eager.generate(PROMPTS, params), static.generate(PROMPTS, params)
    agree = 0
    for ra, rb, la, lb in zip(a.response_ids, b.response_ids, a.sampler_logprobs, b.sampler_logprobs):
        n = next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), len(ra))
        assert n >= 10, (ra, rb)
        assert torch.allclose(torch.tensor(la[:n]), torch.tensor(lb[:n]), atol=1e-5)
        agree += n
    assert agree >= 0.8 * sum(len(r) for r in a.response_ids)


def test_static_step_ends_rows_at_eos_like_the_eager_engine(tiny):
    """Rows that end early (EOS) stay masked in the static batch: same tokens, lengths and finish reasons. The EOS
    is a token one row's greedy answer reaches at step 6, so rows end at different steps."""
    eager, static = _pair(tiny, "none", 4)
    params = SamplingParams(n=1, max_new_tokens=24, seed=0, temperature=0.0)
    free = RolloutEngine(tiny, get_compressor("none"), fused=False)
    free.eos_ids = set()
    token = free.generate(PROMPTS, params).response_ids[1][6]
    eager.eos_ids = static.eos_ids = {token}
    a, b = eager.generate(PROMPTS, params), static.generate(PROMPTS, params)
    assert a.response_ids == b.response_ids and a.finish_reason == b.finish_reason
    assert "stop" in b.finish_reason and len({len(r) for r in b.response_ids}) > 1


@pytest.mark.parametrize("name,kw", [("none", {}), ("rkv", {"budget": 12, "step_length": 4})])
def test_finished_rows_are_refilled_with_waiting_responses(tiny, name, kw, monkeypatch):
    """Two rows for six responses that end at different steps (an EOS a greedy answer reaches, and the length
    limit): each finished row takes the next waiting response (its prompt prefilled into the row), and every
    response comes out as the eager engine gives it with all six rows at once."""
    eager, static = _pair(tiny, name, 2, **kw)
    params = SamplingParams(n=2, max_new_tokens=24, seed=0, temperature=0.0)
    free = RolloutEngine(tiny, get_compressor("none"), fused=False)
    free.eos_ids = set()
    token = free.generate(PROMPTS, params).response_ids[2][5]
    eager.eos_ids = static.eos_ids = {token}
    static.max_batch = 2
    prefills = []
    original = static._prefill_distinct
    monkeypatch.setattr(static, "_prefill_distinct", lambda *a: prefills.append(a[0].shape[0]) or original(*a))
    if name != "none":
        eager.static_check_every = static.static_check_every = 1
    a, b = eager.generate(PROMPTS, params), static.generate(PROMPTS, params)
    assert prefills[0] == 2 and sum(prefills) == 6 and len(prefills) >= 3  # the first two, then refills
    assert a.response_ids == b.response_ids and a.finish_reason == b.finish_reason
    assert "stop" in b.finish_reason and len({len(r) for r in b.response_ids}) > 1
    assert b.prompt_index == a.prompt_index


class _NoHostReads:
    """Makes every host read of a tensor's value raise while active (on CPU the reads that sync on CUDA)."""

    NAMES = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "numpy")

    def __enter__(self):
        self.saved = {n: getattr(torch.Tensor, n) for n in self.NAMES}

        def refuse(name):
            def method(*args, **kwargs):
                raise AssertionError(f"host read of a tensor in the static step: Tensor.{name}")

            return method

        for n in self.NAMES:
            setattr(torch.Tensor, n, refuse(n))
        return self

    def __exit__(self, *exc):
        for n, f in self.saved.items():
            setattr(torch.Tensor, n, f)


@pytest.mark.parametrize(
    "name,kv_quant", [("none", "none"), ("rkv", "none"), ("snapkv", "none"), ("streaming", "none"), ("h2o", "none"),
                      ("rkv", "int8"), ("none", "fp8"), ("blocktopk", "none")]
)  # fmt: skip
def test_the_step_reads_nothing_on_the_host_and_keeps_its_shapes(tiny, name, kv_quant, monkeypatch):
    kw = {"window": 4} if name == "snapkv" else {"pages": 3, "dense_layers": 1} if name == "blocktopk" else {}
    comp = get_compressor(name, budget=12 if name != "blocktopk" else 48, step_length=4, **kw) if name != "none" \
        else get_compressor("none")  # fmt: skip
    engine = RolloutEngine(tiny, comp, fused=False, static=True, static_check_every=1, kv_quant=kv_quant)
    captured = {}

    def record(state):
        captured["state"] = state
        return state.step

    steps = []
    original = StaticDecodeStep.step

    def watched(self):
        before = _shapes(self)
        with _NoHostReads():
            original(self)
        assert _shapes(self) == before  # every tensor of the step keeps its shape and dtype
        steps.append(1)

    monkeypatch.setattr(StaticDecodeStep, "step", watched)
    out = engine.generate(PROMPTS[:2], SamplingParams(n=2, max_new_tokens=24, seed=1, ignore_eos=True))
    assert len(steps) == 24 and all(len(r) == 24 for r in out.response_ids)


def _shapes(state: StaticDecodeStep) -> dict:
    c = state.cache
    tensors = {k: v for k, v in vars(state).items() if isinstance(v, torch.Tensor)}
    names = ("keys", "values", "k_scale", "v_scale", "pos", "lens", "start", "attn_acc", "q_ring")
    tensors.update({k: getattr(c, k) for k in names})
    return {k: (tuple(v.shape), v.dtype) for k, v in tensors.items() if v is not None}


def test_the_host_reads_done_flags_every_k_steps(tiny, monkeypatch):
    """The driver reads the rows' done flags every ``static_check_every`` steps (24 steps, k = 8: 3 reads) and
    nothing else of the step's state between them."""
    engine = RolloutEngine(tiny, get_compressor("none"), fused=False, static=True, static_check_every=8)
    reads = []
    original = torch.Tensor.tolist

    def counted(self):
        if self.dtype == torch.bool:
            reads.append(1)
        return original(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    engine.generate(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=24, seed=1, ignore_eos=True))
    monkeypatch.setattr(torch.Tensor, "tolist", original)
    assert len(reads) == 3, len(reads)


def test_what_the_static_step_refuses(tiny):
    params = SamplingParams(max_new_tokens=8)
    assert static_unsupported(get_compressor("blocktopk"), params) is None
    scheduled = get_compressor("blocktopk", schedule=[[0, 48], [32, 96]])
    assert "schedule" in static_unsupported(scheduled, params)
    assert "stop strings" in static_unsupported(get_compressor("none"), SamplingParams(stop=["\n"]))
    assert static_unsupported(get_compressor("rkv"), params) is None
    engine = RolloutEngine(tiny, scheduled, fused=False, static=True)
    with pytest.raises(ValueError, match="cannot run this batch"):
        generate_static(engine, [[1, 2, 3]], params, torch.arange(1))
    with pytest.raises(ValueError, match="static_check_every"):
        RolloutEngine(tiny, get_compressor("none"), static=True, static_check_every=0)


def test_the_sampling_stream_reads_its_step_from_a_device_tensor():
    rows = torch.arange(6)
    for step in (0, 7, 2**40 + 3):
        assert torch.equal(row_uniforms(3, rows, step), row_uniforms(3, rows, torch.tensor(step)))


def test_a_training_run_samples_on_the_static_step(tmp_path, monkeypatch):
    """``rollout.static_step=true`` reaches the trainer's sampler: a one-step run on the tiny model samples
    through the static driver (R-KV, checked every 2 steps) and trains."""
    from test_train import cfg_for

    from sparserl.rollout import static_step
    from sparserl.train.trainer import train

    calls = []
    original = static_step.generate_static

    def spy(engine, prompts, *a, **k):
        calls.append(len(prompts))
        return original(engine, prompts, *a, **k)

    monkeypatch.setattr(static_step, "generate_static", spy)
    cfg = cfg_for(tmp_path, "train.steps=1", "rollout.static_step=true", "rollout.static_check_every=2")
    assert cfg.rollout.static_step and cfg.rollout.compressor == "rkv"
    run = train(cfg, run_dir=tmp_path / "run", log=lambda *_: None)
    assert calls and calls[0] == cfg.train.prompts_per_step * cfg.rollout.n
    assert (run / "metrics.jsonl").exists()


def test_the_config_refuses_a_static_step_its_replay_would_not_reproduce():
    from sparserl.config import ConfigError, load_config, validate

    base = ["rollout.static_step=true", "rollout.static_check_every=8"]
    with pytest.raises(ConfigError, match="static_check_every=1, or mismatch.alpha_q=hidden"):
        validate(load_config("default", [*base, "mismatch.alpha_q=replay"]))
    validate(load_config("default", base))  # alpha from the kept hidden states: no replay
    validate(load_config("default", [*base[:1], "rollout.static_check_every=1", "mismatch.alpha_q=replay"]))
    with pytest.raises(ConfigError, match="does nothing without rollout.static_step"):
        validate(load_config("default", ["rollout.static_check_every=4"]))


def test_what_needs_the_eager_step_falls_back_to_it(tiny):
    assert "distributions" in static_unsupported(get_compressor("none"), SamplingParams(keep_distributions=True))
    engine = RolloutEngine(tiny, get_compressor("none"), fused=False, static=True)
    out = engine.generate(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=6, keep_distributions=True))
    assert out.distributions is not None and len(out.distributions) == 2
