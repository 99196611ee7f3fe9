"""The compiled decode step (``RolloutEngine(..., compile=True)``) against the eager one."""
import pytest
import torch

from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import available_compressors, get_compressor
from sparserl.rollout.sampling import SamplingParams

PROMPTS = ["a b c", [{"role": "user", "content": "Count from one to twenty, slowly please."}]]


def make(name):
    return get_compressor(name, budget=12, step_length=6, **({"window": 4} if name == "snapkv" else {}))


@pytest.mark.parametrize("name", available_compressors())
def test_compiled_decode_matches_eager(tiny, name):
    """Same tokens, log-probs within 1e-4 (float32), same KV figures, for every compressor; rows
    leave the batch on EOS along the way (the batch dimension shrinks under the compiled step)."""
    p = SamplingParams(n=3, max_new_tokens=30, seed=7, temperature=1.0)
    eager = RolloutEngine(tiny, make(name))
    compiled = RolloutEngine(tiny, make(name), compile=True)
    eos = set(range(0, len(tiny.tokenizer), 40))  # rows stop at different steps
    eager.eos_ids = compiled.eos_ids = eos
    a = eager.generate(PROMPTS, p)
    b = compiled.generate(PROMPTS, p)
    assert a.response_ids == b.response_ids
    assert "stop" in a.finish_reason and len({len(r) for r in a.response_ids}) > 1
    for x, y in zip(a.sampler_logprobs, b.sampler_logprobs):
        assert (torch.tensor(x) - torch.tensor(y)).abs().max().item() <= 1e-4
    assert (a.kv.compressions, a.kv.bytes_peak, a.kv_tokens_kept) == (b.kv.compressions, b.kv.bytes_peak, b.kv_tokens_kept)


def test_compiled_step_does_not_recompile(tiny):
    """Batch size, attended length and capacity change between steps and calls: one compilation."""
    from torch._dynamo.utils import counters

    eng = RolloutEngine(tiny, make("rkv"), compile=True)
    eng.generate(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=8, seed=0, ignore_eos=True))
    before = counters["stats"]["unique_graphs"]
    eng.eos_ids = set(range(0, len(tiny.tokenizer), 5))
    eng.generate(PROMPTS, SamplingParams(n=3, max_new_tokens=25, seed=1))  # other batch, lengths, capacity
    assert counters["stats"]["unique_graphs"] == before
