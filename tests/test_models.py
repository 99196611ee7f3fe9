import json

import pytest
import torch

from sparserl.models.loading import ModelLoadError, load_model, parse_dtype


def test_tiny_is_seeded(tiny):
    again = load_model("tiny", dtype="float32", seed=0)
    other = load_model("tiny", dtype="float32", seed=1)
    w = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(tiny.model.state_dict()[w].cpu(), again.model.state_dict()[w])
    assert not torch.equal(tiny.model.state_dict()[w].cpu(), other.model.state_dict()[w])


def test_the_fallback_byte_tokenizer_encodes_every_byte_and_decodes_back():
    """Without the embedded model's cache the tiny model's tokenizer is one token per byte (a machine without the
    GGUF, such as a GPU machine, runs the tests on it): every text encodes byte for byte and decodes back."""
    from sparserl.models.loading import _byte_tokenizer

    tok = _byte_tokenizer()
    text = "What is 3 + 5?\n héllo ∑ <x>"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == [3 + b for b in text.encode()]
    assert tok.decode(ids) == text
    chat = tok.encode("<|im_start|>hi<|im_end|>", add_special_tokens=False)
    assert chat == [1, 3 + ord("h"), 3 + ord("i"), 2] and len(tok) == 259


def test_missing_and_unsupported_models(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(str(tmp_path / "nothing"))
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        load_model(str(tmp_path / "x.gguf"))
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ModelLoadError, match="not supported"):
        load_model(str(tmp_path))
    with pytest.raises(ModelLoadError, match="dtype"):
        parse_dtype("float8")


def test_local_hf_folder_roundtrip(tmp_path, tiny):
    tiny.model.save_pretrained(tmp_path / "m")
    tiny.tokenizer.save_pretrained(tmp_path / "m")
    lm = load_model(str(tmp_path / "m"), dtype="float32", device=tiny.model.device)
    ids = torch.tensor([[1, 2, 3, 4]], device=tiny.model.device)
    with torch.no_grad():
        assert torch.allclose(lm.model(ids).logits, tiny.model(ids).logits, atol=1e-6)


def test_embedded_default_model_loads():
    lm = load_model("smollm2-135m", dtype="float32")
    cfg = lm.model.config
    assert cfg.model_type == "llama" and cfg.num_hidden_layers == 30 and cfg.hidden_size == 576
    assert lm.tokenizer.eos_token == "<|im_end|>"
    assert all(p.dtype == torch.float32 for p in lm.model.parameters())


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral"])
def test_other_families_match_transformers(family, tiny_family):
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import get_compressor
    from sparserl.rollout.sampling import SamplingParams

    lm = tiny_family(family)
    model = lm.model
    out = RolloutEngine(lm, get_compressor("none")).generate(
        ["hello world"], SamplingParams(n=2, max_new_tokens=12, seed=0, ignore_eos=True)
    )
    for i in range(2):
        ids = torch.tensor(out.prompt_ids[i] + out.response_ids[i])[None]
        with torch.no_grad():
            lp = model(ids).logits[0].float().log_softmax(-1)
        P = len(out.prompt_ids[i])
        ref = lp[P - 1 : -1].gather(-1, ids[0, P:, None])[:, 0]
        assert (ref - torch.tensor(out.sampler_logprobs[i])).abs().max() < 1e-4


def test_gguf_file_loads_dequantized():
    from sparserl.models.loading import embedded_gguf_path

    lm = load_model(str(embedded_gguf_path()), dtype="float32")
    assert lm.model.config.num_hidden_layers == 30
    w = lm.model.model.layers[0].self_attn.q_proj.weight
    assert w.dtype == torch.float32 and w.requires_grad  # plain trainable weights, not packed blocks


def test_model_load_error_is_a_sparserl_error():
    from sparserl.errors import SparserlError

    assert issubclass(ModelLoadError, SparserlError) and issubclass(ModelLoadError, ValueError)


def test_model_device_cpu_from_config():
    """``model.device=cpu`` (the config key) puts the model, the sampler and the cache on the CPU."""
    from sparserl.config import load_config
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import compressor_from_fields
    from sparserl.rollout.sampling import SamplingParams

    cfg = load_config("sparse_rl_fixed40", ["model.name=tiny", "model.device=cpu"])
    lm = load_model(cfg.model.name, dtype="float32", seed=0, device=cfg.model.device)
    assert {p.device.type for p in lm.model.parameters()} == {"cpu"}
    eng = RolloutEngine(lm, compressor_from_fields(cfg.rollout), dtype="float32")
    assert eng.device == torch.device("cpu")
    out = eng.generate(["hi"], SamplingParams(n=2, max_new_tokens=8, seed=0))
    assert len(out.response_ids) == 2


def test_model_device_auto_and_missing_devices():
    from sparserl.models.loading import resolve_device

    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ModelLoadError, match="model.device='tpu9'"):
        resolve_device("tpu9")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match=r"model.device='cuda'.*CUDA is not available"):
            load_model("tiny", device="cuda")
    else:
        with pytest.raises(ModelLoadError, match="model.device='cuda:99'"):
            resolve_device("cuda:99")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["none", "rkv", "h2o"])
def test_model_device_cuda(name):
    """On ``model.device=cuda`` every tensor of the cache and each step lives on the GPU; the
    sampler's log-probs match transformers' forward on the same device."""
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.kv import build_compressor
    from sparserl.rollout.sampling import SamplingParams

    lm = load_model("tiny", dtype="float32", seed=0, device="cuda")
    assert {p.device.type for p in lm.model.parameters()} == {"cuda"}
    eng = RolloutEngine(lm, build_compressor(name, kv_budget=12, step_length=4, window=2))
    devices = set()

    def hook(event, cache=None, **kw):
        if event == "before_decode":
            devices.update(
                t.device.type
                for t in [
                    *cache.k,
                    *cache.v,
                    cache.pos,
                    cache.lens,
                    cache.start,
                    *(cache.acc or []),
                    kw["tokens"],
                    kw["positions"],
                ]
            )

    eng.step_hook = hook
    p = SamplingParams(n=2, max_new_tokens=24, seed=0, ignore_eos=True, top_p=0.9, temperature=0.8)
    out = eng.generate(["hello world", "a b c d e f"], p)
    assert devices == {"cuda"}
    assert out.response_ids == eng.generate(["hello world", "a b c d e f"], p).response_ids  # seeded
    if name == "none":
        from sparserl.rollout.sampling import sampling_logprobs

        for i in range(len(out.response_ids)):
            ids = torch.tensor(out.prompt_ids[i] + out.response_ids[i], device="cuda")[None]
            with torch.no_grad():
                logits = lm.model(ids).logits[0].float()
            P = len(out.prompt_ids[i])
            ref = sampling_logprobs(logits[P - 1 : -1], p).gather(-1, ids[0, P:, None])[:, 0].cpu()
            assert (ref - torch.tensor(out.sampler_logprobs[i])).abs().max() < 1e-3
