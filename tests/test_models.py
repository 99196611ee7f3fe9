import json

import pytest
import torch

from sparserl.models.loading import ModelLoadError, load_model, parse_dtype


def test_tiny_is_seeded(tiny):
    again = load_model("tiny", dtype="float32", seed=0)
    other = load_model("tiny", dtype="float32", seed=1)
    w = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(tiny.model.state_dict()[w], again.model.state_dict()[w])
    assert not torch.equal(tiny.model.state_dict()[w], other.model.state_dict()[w])


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
    lm = load_model(str(tmp_path / "m"), dtype="float32")
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.allclose(lm.model(ids).logits, tiny.model(ids).logits, atol=1e-6)


def test_embedded_default_model_loads():
    lm = load_model("smollm2-135m", dtype="float32")
    cfg = lm.model.config
    assert cfg.model_type == "llama" and cfg.num_hidden_layers == 30 and cfg.hidden_size == 576
    assert lm.tokenizer.eos_token == "<|im_end|>"
    assert all(p.dtype == torch.float32 for p in lm.model.parameters())


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral"])
def test_other_families_match_transformers(family, tiny):
    from transformers import AutoConfig, AutoModelForCausalLM

    from sparserl.models.loading import LoadedModel
    from sparserl.rollout.engine import RolloutEngine
    from sparserl.rollout.sampling import SamplingParams

    cfg = AutoConfig.for_model(family, vocab_size=len(tiny.tokenizer), hidden_size=64, intermediate_size=128,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                               max_position_embeddings=512, eos_token_id=tiny.tokenizer.eos_token_id,
                               tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    lm = LoadedModel(model, tiny.tokenizer, family, None)
    out = RolloutEngine(lm, None).generate(["hello world"], SamplingParams(n=2, max_new_tokens=12, seed=0, ignore_eos=True))
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
