"""Micro-batches by token budget (:mod:`sparserl.packing`): every row in exactly one micro-batch within
both budgets, the packed and trimmed forwards giving the unpacked log-probs and gradients, gradient
checkpointing giving the same gradient, and the config rule refusing a budget no row fits."""

import pytest
import torch
from test_logprobs import grouped_batch, tiny_family

from sparserl.batch import RolloutBatch
from sparserl.config import ConfigError, load_config, validate
from sparserl.packing import (
    MicroBatchBudgetError,
    RowLengths,
    micro_batch_tokens,
    pack_micro_batches,
)
from sparserl.score import forward_response, forward_response_shared, score_logprobs, score_logprobs_keep_hidden
from sparserl.score.dense import micro_batches
from sparserl.score.hidden import dense_hidden, dense_hidden_shared


def varied_batch(seed=0, groups=3, n=5) -> RolloutBatch:
    """Groups of ``n`` responses of 0-23 tokens to prompts of 3-12 tokens (vocabulary 97)."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses, group_ids = [], [], []
    for gi in range(groups):
        p = torch.randint(1, 97, (int(torch.randint(3, 13, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n):
            length = int(torch.randint(0, 24, (1,), generator=g))
            prompts.append(p)
            responses.append(torch.randint(1, 97, (length,), generator=g).tolist())
            group_ids.append(gi)
    return RolloutBatch.from_rollout(prompts, responses, [[0.0] * len(r) for r in responses], group_ids)


# --------------------------------------------------------------------------- packing
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("max_tokens,max_rows", [(60, 16), (120, 3), (400, 4), (10_000, 100)])
def test_every_row_in_exactly_one_micro_batch_within_both_budgets(shared, max_tokens, max_rows):
    batch = varied_batch()
    lengths = RowLengths.of_batch(batch)
    parts = pack_micro_batches(lengths, max_tokens=max_tokens, max_rows=max_rows, shared_prompt=shared)
    rows = torch.cat(parts)
    assert sorted(rows.tolist()) == list(range(batch.size))
    for part in parts:
        assert len(part) <= max_rows
        assert micro_batch_tokens(lengths, part, shared) <= max_tokens
        assert part.tolist() == sorted(part.tolist())
    # deterministic, and the longest rows come first: lengths sorted across micro-batches
    again = pack_micro_batches(lengths, max_tokens=max_tokens, max_rows=max_rows, shared_prompt=shared)
    assert [p.tolist() for p in again] == [p.tolist() for p in parts]
    total = lengths.prompt + lengths.response.clamp(min=1)
    longest = [int(total[p].max()) for p in parts]
    assert longest == sorted(longest, reverse=True)
    if max_tokens == 10_000:
        assert len(parts) == -(-batch.size // max_rows)  # nothing split that the row count does not split


def test_trimmed_tokens_count_what_the_forward_computes():
    batch = RolloutBatch.from_rollout(
        [[1, 2, 3], [4], [5, 6]], [[7] * 5, [8] * 2, [9]], [[0.0] * 5, [0.0] * 2, [0.0]], [0, 1, 1]
    )
    lengths = RowLengths.of_batch(batch)
    assert lengths.prompt.tolist() == [3, 1, 2] and lengths.response.tolist() == [5, 2, 1]
    assert micro_batch_tokens(lengths, torch.tensor([1, 2]), False) == 2 * (2 + 2)
    assert micro_batch_tokens(lengths, torch.tensor([1, 2]), True) == 1 * 2 + 2 * 2  # one group
    assert micro_batch_tokens(lengths, torch.tensor([0, 1, 2]), True) == 2 * 3 + 3 * 5


def test_a_row_longer_than_the_budget_is_refused_naming_the_key():
    batch = varied_batch()
    lengths = RowLengths.of_batch(batch)
    longest = int((lengths.prompt + lengths.response).max())
    with pytest.raises(MicroBatchBudgetError, match=r"train\.max_tokens_per_micro_batch=.*prompt of \d+ tokens"):
        pack_micro_batches(lengths, max_tokens=longest - 1, max_rows=8)
    assert pack_micro_batches(lengths, max_tokens=longest, max_rows=8)


def test_without_a_token_budget_micro_batches_are_consecutive_rows():
    parts = pack_micro_batches(RowLengths.of_batch(varied_batch()), slice(2, 13), max_tokens=None, max_rows=4)
    assert [p.tolist() for p in parts] == [[2, 3, 4, 5], [6, 7, 8, 9], [10, 11, 12]]


# --------------------------------------------------------------------------- packed forwards = unpacked
def _grads(model, batch, forward, parts, entropy_grad=True):
    """Log-probs, entropies [N, T] and parameter gradients of a fixed weighted loss over ``parts``."""
    model.zero_grad(set_to_none=True)
    g = torch.Generator().manual_seed(3)
    w_lp = torch.randn(batch.response_ids.shape, generator=g) * batch.response_mask
    w_ent = torch.randn(batch.response_ids.shape, generator=g) * batch.response_mask
    lps = torch.zeros(batch.response_ids.shape)
    ents = torch.zeros(batch.response_ids.shape)
    for r in parts:
        lp, ent = forward(model, batch, r, return_entropy=True, entropy_grad=entropy_grad, temperature=0.7)
        ((lp * w_lp[r]).sum() + (ent * w_ent[r]).sum()).backward()
        lps[r], ents[r] = lp.detach(), ent.detach()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return lps * batch.response_mask, ents * batch.response_mask, grads


@pytest.mark.parametrize("shared", [False, True])
def test_packed_gradient_equals_the_whole_batch_gradient(shared):
    model = tiny_family("llama")
    batch = varied_batch()
    forward = forward_response_shared if shared else forward_response
    parts = micro_batches(batch, 4, 90, shared)
    assert len(parts) > -(-batch.size // 4) and any(len(p) > 1 for p in parts)  # the token budget splits too
    lp_a, ent_a, g_a = _grads(model, batch, forward, [slice(0, batch.size)])
    lp_b, ent_b, g_b = _grads(model, batch, forward, parts)
    torch.testing.assert_close(lp_b, lp_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_b, ent_a, atol=1e-5, rtol=0)
    assert g_a.keys() == g_b.keys() and g_a
    for k in g_a:
        torch.testing.assert_close(g_b[k], g_a[k], atol=1e-6, rtol=1e-4, msg=k)


@pytest.mark.parametrize("shared", [False, True])
def test_packed_scoring_equals_unpacked(shared):
    model = tiny_family("llama").eval()
    batch = varied_batch(seed=1)
    whole = score_logprobs(model, batch, 100, 0.7, shared)
    packed = score_logprobs(model, batch, 4, 0.7, shared, max_tokens=120)
    torch.testing.assert_close(packed, whole, atol=1e-5, rtol=0)
    lp, hidden = score_logprobs_keep_hidden(model, batch, 3, 0.7, shared, max_tokens=120)
    torch.testing.assert_close(lp, whole, atol=1e-5, rtol=0)
    T = batch.response_ids.shape[1]
    if shared:
        full = dense_hidden_shared(model, batch, 100)
        part = dense_hidden_shared(model, batch, 3, max_tokens=120)
    else:
        args = (batch.input_ids, batch.attention_mask, batch.position_ids, T)
        full, part = dense_hidden(model, *args, 100), dense_hidden(model, *args, 3, max_tokens=120)
    mask = batch.response_mask[..., None]
    torch.testing.assert_close(part * mask, full * mask, atol=1e-5, rtol=0)
    torch.testing.assert_close(hidden * mask, full * mask, atol=1e-5, rtol=0)


def test_trimmed_forward_equals_the_untrimmed_one():
    """One short row with a long one: the short row alone runs on its own columns only."""
    model = tiny_family("llama").eval()
    batch = grouped_batch()
    with torch.no_grad():
        whole, _ = forward_response(model, batch, slice(0, batch.size))
        for i in range(batch.size):
            alone, _ = forward_response(model, batch, torch.tensor([i]))
            m = batch.response_mask[i]
            torch.testing.assert_close(alone[0] * m, whole[i] * m, atol=1e-5, rtol=0)


# --------------------------------------------------------------------------- gradient checkpointing
def test_gradient_checkpointing_gives_the_same_gradient():
    from sparserl.score.shared_prompt import checkpoints_activations
    from sparserl.train.gradient_checkpointing import use_gradient_checkpointing

    model = tiny_family("llama")
    batch = varied_batch(groups=2, n=3)
    parts = micro_batches(batch, 3, None, False)
    _, _, plain = _grads(model, batch, forward_response, parts)
    use_gradient_checkpointing(model, True)
    assert checkpoints_activations(model) and model.model.layers[0].gradient_checkpointing
    calls = []
    layer = model.model.layers[0]
    real = layer._gradient_checkpointing_func
    layer._gradient_checkpointing_func = lambda *a, **k: calls.append(1) or real(*a, **k)
    _, _, ckpt = _grads(model, batch, forward_response, parts)
    assert calls  # the layers really went through the checkpoint
    for k in plain:
        torch.testing.assert_close(ckpt[k], plain[k], atol=1e-6, rtol=1e-4, msg=k)
    use_gradient_checkpointing(model, False)
    assert not checkpoints_activations(model)


# --------------------------------------------------------------------------- config
def test_a_budget_below_one_response_is_refused_by_the_config_rule():
    from sparserl.config.rules.micro_batch import micro_batch_budget

    with pytest.raises(ConfigError, match=r"train\.max_tokens_per_micro_batch=64.*rollout\.max_new_tokens=96.*97"):
        validate(load_config("default", ["train.max_tokens_per_micro_batch=64", "rollout.max_new_tokens=96"]))
    assert (
        micro_batch_budget(load_config("default", ["train.max_tokens_per_micro_batch=97", "rollout.max_new_tokens=96"]))
        == []
    )
    assert micro_batch_budget(load_config("default", ["train.max_tokens_per_micro_batch=null"])) == []


@pytest.mark.parametrize(
    "preset, overrides, budget",
    [
        ("default", [], 4096),  # 4 x 512 + 32 x 48 = 3,584 tokens: the whole batch in one micro-batch
        ("dense", ["data.train=svamp", "rollout.max_new_tokens=1024", "train.prompts_per_step=4"], 2048),
        ("long", [], 2048),
        ("long", ["rollout.max_new_tokens=2048"], 2560),  # one whole row: 2,048 + a 512-token prompt
        ("default", ["rollout.max_new_tokens=4096"], 4608),
        ("default", ["train.max_tokens_per_micro_batch=3000", "rollout.max_new_tokens=1024"], 3000),
        ("default", ["train.max_tokens_per_micro_batch=null"], None),
    ],
)
def test_auto_token_budget_keeps_a_whole_short_batch_and_packs_long_ones(preset, overrides, budget):
    """``train.max_tokens_per_micro_batch: auto`` (the default) resolves when the config is built: 4,096 where a
    whole rollout batch at its longest fits it, else 2,048 or one whole row; a number or null stays as set."""
    cfg = load_config(preset, overrides)
    assert cfg.train.max_tokens_per_micro_batch == budget
    assert validate(cfg) is cfg or True  # the resolved budget passes the config's rules (one row fits)
    if budget is not None:
        assert budget >= cfg.rollout.max_new_tokens + 1


def test_auto_token_budget_is_what_a_saved_config_holds_and_resumes_with(tmp_path):
    from sparserl.config import save_config

    path = save_config(load_config("long"), tmp_path / "config.yaml")
    assert "max_tokens_per_micro_batch: 2048" in path.read_text()
    assert load_config(str(path)).train.max_tokens_per_micro_batch == 2048


def test_the_main_job_keeps_the_update_forward_and_long_reasoning_does_not():
    assert load_config("default", []).why_update_forward_is_not_old_policy() is None
    long = load_config(
        "dense", ["rollout.max_new_tokens=1024", "train.prompts_per_step=4", "train.micro_batch_size=32"]
    )
    why = long.why_update_forward_is_not_old_policy()
    assert why is not None and "train.max_tokens_per_micro_batch" in why


def test_the_data_s_own_prompt_bound_decides_whether_the_update_forward_fits():
    """4 prompts x 8 responses of 48 tokens, each prompt once: 4 x 512 + 1,536 = 3,584 tokens under the rules'
    prompt bound, 4 x 367 + 1,536 = 3,004 under a data set's own; a budget of 3,072 fits only the second."""
    cfg = load_config("default", ["train.max_tokens_per_micro_batch=3072"])
    assert cfg.update_forward_tokens() == 3584 and cfg.update_forward_tokens(367) == 3004
    why = cfg.why_update_forward_is_not_old_policy()
    assert why is not None and "train.max_tokens_per_micro_batch" in why
    assert cfg.why_update_forward_is_not_old_policy(prompt_tokens=367) is None
    assert cfg.why_update_forward_is_not_old_policy(prompt_tokens=400) is not None  # 4 x 400 + 1,536 > 3,072


def test_the_trainer_chooses_its_old_policy_on_the_prompt_bound_preflight_measured(tiny):
    """build_trainer passes preflight's bound of the data's prompts (well under 512 for the built-in task) to the
    old policy's choice and to the memory prediction, so both say ``update`` where the whole batch fits."""
    from sparserl.train.build import build_trainer

    cfg = validate(
        load_config("default", ["model.name=tiny", "data.eval=null", "train.max_tokens_per_micro_batch=3072"])
    )
    trainer = build_trainer(cfg)
    bound = trainer.memory.prompt_tokens
    assert bound < 512 and cfg.update_forward_tokens(bound) <= 3072
    assert trainer.old_policy.kind == "update"
    assert "old policy: update" in trainer.memory.notes
