"""The compiled decode step (``RolloutEngine(..., compile=True)``) against the eager one.

Every compressor runs through ``torch.compile``'s capture (dynamo + AOT autograd, backend
``aot_eager``: the same graph, dynamic shapes and in-place cache writes, without code generation);
inductor's generated code, which costs ~20 s of gcc per graph on 2 cores, is checked on R-KV (the
default sampler, which exercises the attention accumulator too) and, with ``SPARSERL_TEST_INDUCTOR=1``,
on every compressor."""

import os

import pytest
import torch
from torch._dynamo.utils import counters

from sparserl.rollout.engine import RolloutEngine
from sparserl.rollout.kv import available_compressors, get_compressor
from sparserl.rollout.sampling import SamplingParams

PROMPTS = ["a b c", [{"role": "user", "content": "Count from one to twenty, slowly please."}]]


def make(name):
    return get_compressor(name, budget=12, step_length=6, **({"window": 4} if name == "snapkv" else {}))


ALL_INDUCTOR = os.environ.get("SPARSERL_TEST_INDUCTOR") == "1"
# block top-k chooses pages per step, which the compiled step (attention over every slot) cannot: it
# refuses compile (tests/test_blocktopk.py)
COMPILED = [name for name in available_compressors() if not get_compressor(name).selects_per_step]
CASES = [(name, "aot_eager") for name in COMPILED] + [
    (name, "inductor") for name in COMPILED if ALL_INDUCTOR or name == "rkv"
]


@pytest.mark.parametrize("name,backend", CASES)
def test_compiled_decode_matches_eager(tiny, name, backend):
    """Same tokens, log-probs within 1e-4 (float32), same KV figures, for every compressor; rows
    leave the batch on EOS along the way (the batch dimension shrinks under the compiled step)."""
    p = SamplingParams(n=3, max_new_tokens=30, seed=7, temperature=1.0)
    eager = RolloutEngine(tiny, make(name))
    compiled = RolloutEngine(tiny, make(name), compile=backend)
    inductor_graphs = sum(counters["inductor"].values())
    eos = set(range(0, len(tiny.tokenizer), 40))  # rows stop at different steps
    eager.eos_ids = compiled.eos_ids = eos
    a = eager.generate(PROMPTS, p)
    b = compiled.generate(PROMPTS, p)
    assert a.response_ids == b.response_ids
    assert "stop" in a.finish_reason and len({len(r) for r in a.response_ids}) > 1
    for x, y in zip(a.sampler_logprobs, b.sampler_logprobs):
        assert (torch.tensor(x) - torch.tensor(y)).abs().max().item() <= 1e-4
    assert (a.kv.compressions, a.kv.bytes_peak, a.kv_tokens_kept) == (
        b.kv.compressions,
        b.kv.bytes_peak,
        b.kv_tokens_kept,
    )
    assert (sum(counters["inductor"].values()) > inductor_graphs) == (backend == "inductor")  # really that backend


def test_compiled_step_does_not_recompile(tiny):
    """Batch size, attended length and capacity change between steps and calls: no recompilation
    once a batch of one (a specialised graph of its own) and of several have been seen."""
    eng = RolloutEngine(tiny, make("rkv"), compile="aot_eager")
    eng.generate(PROMPTS[:1], SamplingParams(n=1, max_new_tokens=8, seed=0, ignore_eos=True))
    eng.generate(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=8, seed=0, ignore_eos=True))
    before = counters["stats"]["unique_graphs"]
    eng.eos_ids = set(range(0, len(tiny.tokenizer), 5))
    eng.generate(PROMPTS, SamplingParams(n=3, max_new_tokens=25, seed=1))  # other batch, lengths, capacity
    assert counters["stats"]["unique_graphs"] == before
