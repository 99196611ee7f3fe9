"""The learner's bfloat16 mixed precision (model.mixed_precision): float32 weights, gradients and AdamW
state; bfloat16 products in every learner forward and in the backward; the scoring and the update on
the same kernels; ``sparserl bench learner``."""

import json

import pytest
import torch
from test_train import cfg_for
from torch.utils._python_dispatch import TorchDispatchMode

from sparserl.cli import main
from sparserl.config import ConfigError
from sparserl.models import mixed_precision
from sparserl.models.mixed_precision import autocast_for, learner_compute_dtype, learner_precision
from sparserl.score.chunked_head import head_logprobs
from sparserl.train.trainer import build_trainer, train, train_step

DENSE = ["rollout.compressor=none", "rollout.dtype=float32"]


def _head_grads(hidden, weight, targets, autocast: bool, chunked: bool):
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if chunked:
            lp, ent = head_logprobs(h, w, targets, 0.7, chunk_size=5, with_entropy=True, entropy_grad=True)
        else:  # the plain head: autograd through autocast's own bf16 product
            z = (h @ w.t()).float() / 0.7
            lp = z.gather(-1, targets[:, None])[:, 0] - torch.logsumexp(z, -1)
            ent = torch.logsumexp(z, -1) - (z.softmax(-1) * z).sum(-1)
    (lp.sum() + 0.3 * ent.sum()).backward()
    return lp.detach(), h.grad, w.grad


class _ProductDtypes(TorchDispatchMode):
    """Records the input dtypes of every matrix product aten runs while active."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.addmm_, torch.ops.aten.bmm):
            self.seen.append((func.overloadpacket.__name__, *(a.dtype for a in args if isinstance(a, torch.Tensor))))
        return func(*args, **(kwargs or {}))


def test_chunked_head_runs_its_backward_in_autocasts_dtype():
    """Under autocast the chunked head's backward multiplies in bfloat16 (autocast's dtype, read from the
    forward), as autograd does for the plain head; without autocast, in float32. Its values stay within
    bf16 rounding of the plain head's under autocast."""
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(13, 32, generator=g), torch.randn(300, 32, generator=g) * 0.5
    targets = torch.randint(0, 300, (13,), generator=g)
    lp_ref, gh_ref, gw_ref = _head_grads(hidden, weight, targets, autocast=True, chunked=False)
    products = {}
    for autocast in (True, False):
        with _ProductDtypes() as products[autocast]:
            lp, gh, gw = _head_grads(hidden, weight, targets, autocast=autocast, chunked=True)
        assert gh.dtype == gw.dtype == torch.float32  # the gradients of float32 weights stay float32
        if autocast:
            torch.testing.assert_close(lp, lp_ref, rtol=0, atol=1e-5)
            for ours, ref in ((gh, gh_ref), (gw, gw_ref)):
                assert (ours - ref).norm() / ref.norm() < 1e-2  # bf16's rounding (2^-8 per product output)
    # 3 chunks: forward logits (mm) and Σ p z (bmm, a float32 sum); backward logits, grad_h, grad_w (mm)
    bf16, f32 = torch.bfloat16, torch.float32
    assert sorted(products[True].seen) == [("bmm", f32, f32)] * 3 + [("mm", bf16, bf16)] * 12
    assert sorted(products[False].seen) == (
        [("addmm_", f32, f32, f32)] * 3 + [("bmm", f32, f32)] * 3 + [("mm", f32, f32)] * 9
    )


def test_what_a_model_section_computes_in(tmp_path):
    cfg = cfg_for(tmp_path, "model.mixed_precision=bfloat16")
    assert learner_precision(cfg.model) == "bfloat16" and learner_compute_dtype(cfg.model) is torch.bfloat16
    cfg.model.mixed_precision = "off"
    assert learner_precision(cfg.model) == "off" and learner_compute_dtype(cfg.model) is torch.float32
    cfg = cfg_for(tmp_path, "model.dtype=bfloat16", "model.mixed_precision=auto")  # 16-bit weights: their own
    assert learner_precision(cfg.model) == "off" and learner_compute_dtype(cfg.model) is torch.bfloat16
    with pytest.raises(ValueError, match="model.mixed_precision='fp16'"):  # a name never reaches here unchecked
        mixed_precision.resolve("fp16")
    with autocast_for("bfloat16", torch.device("cpu")):
        assert torch.is_autocast_enabled("cpu")
    with autocast_for("off", torch.device("cpu")):
        assert not torch.is_autocast_enabled("cpu")


def _step_dtypes(tmp_path, *extra):
    """(metrics of one step, dtypes the learner's q_proj put out while scoring and updating, trainer)."""
    trainer = build_trainer(cfg_for(tmp_path, *DENSE, "algorithm.correction=none", *extra))
    seen = []
    proj = trainer.learner.model.layers[0].self_attn.q_proj
    hook = proj.register_forward_hook(lambda _m, _i, out: seen.append((torch.is_grad_enabled(), out.dtype)))
    metrics = train_step(trainer, 1)
    hook.remove()
    return metrics, seen, trainer


def test_a_mixed_precision_step_computes_in_bf16_and_keeps_float32_state(tmp_path):
    metrics, seen, trainer = _step_dtypes(tmp_path, "model.mixed_precision=bfloat16")
    assert {grad for grad, _ in seen} == {False, True}  # the scoring forward (no grad) and the update's both ran
    assert {dtype for _, dtype in seen} == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in trainer.learner.parameters())
    state = [s for s in trainer.optimizer.state.values() if s]
    assert state and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32 for s in state)
    # the old policy was scored on the update's kernels: the first update's ratio is 1 to float32 rounding
    assert metrics["policy/ratio_max"] - 1 < 1e-5 and 1 - metrics["policy/ratio_min"] < 1e-5
    off, seen_off, _ = _step_dtypes(tmp_path)  # the default: float32 throughout
    assert {dtype for _, dtype in seen_off} == {torch.float32}
    assert off["policy/ratio_max"] == pytest.approx(1.0, abs=1e-5)


def test_the_update_on_float32_scores_would_not_start_at_ratio_1(tmp_path, monkeypatch):
    """What the ratio test above guards: scoring outside autocast while the update runs inside it moves
    the first ratio off 1 by bf16's rounding."""
    from sparserl.train import old_logprobs

    real = old_logprobs.score_logprobs_keep_hidden

    def float32_scores(*args, **kwargs):
        with torch.autocast("cpu", enabled=False):
            return real(*args, **kwargs)

    monkeypatch.setattr(old_logprobs, "score_logprobs_keep_hidden", float32_scores)
    metrics, _, _ = _step_dtypes(tmp_path, "model.mixed_precision=bfloat16")
    assert max(metrics["policy/ratio_max"] - 1, 1 - metrics["policy/ratio_min"]) > 1e-4


def test_mixed_precision_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"model.mixed_precision=bfloat16.*model.dtype=bfloat16"):
        cfg_for(tmp_path, "model.dtype=bfloat16", "model.mixed_precision=bfloat16")
    with pytest.raises(ConfigError, match="model.mixed_precision"):
        cfg_for(tmp_path, "model.mixed_precision=fp16")
    # a dense float32 sampler is not the old policy of a learner computing in bf16
    with pytest.raises(ConfigError, match="old_logprobs=sampler.*mixed_precision"):
        cfg_for(tmp_path, *DENSE, "model.mixed_precision=bfloat16", "algorithm.old_logprobs=sampler")


@pytest.mark.parametrize("micro", [4, 8])  # 8: the whole batch, so old_logprobs=update is timed too
def test_bench_learner_reports_both_precisions(tmp_path, capsys, micro):
    out = tmp_path / "learner.json"
    overrides = [
        "model.name=tiny",
        "rollout.dtype=float32",
        "train.prompts_per_step=2",
        "rollout.n=4",
        "rollout.max_new_tokens=12",
        f"train.micro_batch_size={micro}",
        "reward.fn=test_train:toy_reward",
        "data.eval=null",
        f"log.out_dir={tmp_path}",
    ]
    assert main(["bench", "learner", *overrides, "--repeat", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["seconds"]) == {"float32", "bfloat16_mixed"}
    for mode in report["seconds"].values():
        assert len(mode["score"]) == len(mode["update"]) == 2 and min(mode["update"]) > 0
    assert len(report["ratio_rounds"]["update"]) == 2
    assert report["speedup_bf16_mixed"]["update"] > 0
    num = report["numerics"]
    assert 0 < num["k3_bf16_vs_float32"] < 1e-2 and num["max_abs_logprob_diff"] > 0
    assert 0.9 < num["grad_cosine"] < 1.0 and 0 < num["grad_rel_l2"] < 0.5  # near, and not the same computation
    assert -1 <= num["grad_cosine_halves_float32"] < num["grad_cosine"]  # two halves of the groups: further apart
    assert report["batch"]["sequences"] == 8 and report["machine"]["cpu"]
    assert report["machine"]["mixed_precision_auto"]["mode"] in ("off", "bfloat16")
    assert report["command"].startswith("sparserl bench learner model.name=tiny") and "--repeat 2" in report["command"]
    printed = capsys.readouterr().out
    assert "median of per-round ratios" in printed
    update_forward = report["speedup_update_forward"]
    if micro == 4:
        assert "2 micro-batches" in update_forward["why_not"] and "old_logprobs=update not timed" in printed
        assert report["seconds"]["float32"]["update_forward"] == []
    else:
        assert update_forward["why_not"] is None
        for name in ("float32", "bfloat16_mixed"):
            assert len(report["seconds"][name]["update_forward"]) == 2
            assert len(update_forward[name]["ratio_rounds"]) == 2 and update_forward[name]["speedup"] > 0


def test_bench_learner_refuses_a_bf16_learner(tmp_path):
    assert main(["bench", "learner", "model.name=tiny", "model.dtype=bfloat16", f"log.out_dir={tmp_path}"]) == 1


def _fake_timer(off: list, bf16: list):
    seconds = {"off": iter(off), "bfloat16": iter(bf16)}
    return lambda mode: next(seconds[mode])


def test_auto_takes_bf16_only_where_measured_faster_by_the_margin():
    cpu = torch.device("cpu")
    faster = mixed_precision.measure(cpu, _fake_timer([2.0, 2.0, 2.0], [1.0, 1.0, 1.0]))
    assert faster.mode == "bfloat16" and faster.ratio_rounds == [2.0, 2.0, 2.0] and "2.00x" in faster.reason
    close = mixed_precision.measure(cpu, _fake_timer([1.05, 1.05, 1.05], [1.0, 1.0, 1.0]))
    assert close.mode == "off" and "under 1.1x" in close.reason  # within the margin: exact float32
    # one round at half speed does not decide (the median of per-round ratios)
    slow_round = mixed_precision.measure(cpu, _fake_timer([1.0, 1.0, 1.0], [0.5, 2.0, 0.5]))
    assert slow_round.mode == "bfloat16"
    emulated = mixed_precision.measure(cpu, _fake_timer([1.0], [30.0]))  # one round is enough: the timer has no more
    assert emulated.mode == "off" and emulated.ratio_rounds == [0.0333] and "median of 1 per-round" in emulated.reason


def test_auto_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSERL_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(mixed_precision, "_CHOSEN", {})
    logged = []
    choice = mixed_precision.choose("cpu", _fake_timer([3.0] * 3, [1.0] * 3), log=logged.append)
    assert choice.mode == "bfloat16" and not choice.cached and "timing" in logged[0]
    on_disk = json.loads((tmp_path / mixed_precision.CACHE_FILE).read_text())
    assert on_disk[choice.key]["mode"] == "bfloat16"
    monkeypatch.setattr(mixed_precision, "_CHOSEN", {})  # a new process: the file answers, nothing is timed

    def no_timing(mode):
        raise AssertionError("measured again")

    again = mixed_precision.choose("cpu", no_timing, log=logged.append)
    assert again.cached and again.mode == "bfloat16" and len(logged) == 2
    assert mixed_precision.resolve("auto", "cpu") == "bfloat16"


def test_the_real_probe_times_both_precisions():
    timer = mixed_precision.probe_timer(torch.device("cpu"))
    assert timer("off") > 0 and timer("bfloat16") > 0


def test_a_run_on_auto_records_the_choice_and_computes_in_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSERL_NATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(mixed_precision, "_CHOSEN", {})
    mixed_precision.choose("cpu", _fake_timer([3.0] * 3, [1.0] * 3), log=lambda *_: None)
    cfg = cfg_for(tmp_path, *DENSE, "model.mixed_precision=auto", "train.steps=1", "checkpoint.every=0")
    seen = []
    from sparserl.train import update

    real = update.update_policy

    def spy(trainer, batch, corr, *rest):
        proj = trainer.learner.model.layers[0].mlp.down_proj
        hook = proj.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
        try:
            return real(trainer, batch, corr, *rest)
        finally:
            hook.remove()

    monkeypatch.setattr(update, "update_policy", spy)
    run = train(cfg, run_dir=tmp_path / "run", log=lambda *_: None)
    assert seen and set(seen) == {torch.bfloat16}
    assert "model.mixed_precision: auto -> bfloat16 on this machine: measured" in (run / "config.yaml").read_text()


def test_a_run_recorded_before_the_key_resumes_in_float32(tmp_path):
    """A run whose config.yaml predates model.mixed_precision ran its learner in float32: --resume keeps
    that (not today's default `auto`), and a config that now asks for auto is a change it names."""
    import yaml

    from sparserl.train.run_folder import ResumeError, check_resume_config, load_recorded_config

    cfg = cfg_for(tmp_path, "train.steps=1")
    run = train(cfg, run_dir=tmp_path / "old", log=lambda *_: None)
    recorded = yaml.safe_load((run / "config.yaml").read_text())
    del recorded["model"]["mixed_precision"]
    (run / "config.yaml").write_text(yaml.safe_dump(recorded))
    assert load_recorded_config(run / "config.yaml").model.mixed_precision == "off"
    assert (
        load_recorded_config(run / "config.yaml", ["model.mixed_precision=bfloat16"]).model.mixed_precision
        == "bfloat16"
    )  # an explicit override still wins
    newer = cfg_for(tmp_path, "train.steps=1")
    newer.model.mixed_precision = "auto"
    with pytest.raises(ResumeError, match=r"model.mixed_precision: 'off' -> 'auto'"):
        check_resume_config(run, newer)
    newer.model.mixed_precision = "off"
    assert check_resume_config(run, newer) == []


def test_data_parallel_peers_get_the_drivers_resolved_precision(tmp_path, monkeypatch):
    from sparserl.train.data_parallel import peer_config

    monkeypatch.setattr(mixed_precision, "_CHOSEN", {})
    monkeypatch.setenv("SPARSERL_NATIVE_CACHE", str(tmp_path / "cache"))
    mixed_precision.choose("cpu", _fake_timer([3.0] * 3, [1.0] * 3), log=lambda *_: None)
    cfg = cfg_for(tmp_path, "model.mixed_precision=auto")
    peer = peer_config(cfg, torch.device("cpu"))
    assert peer.model.mixed_precision == "bfloat16" and cfg.model.mixed_precision == "auto"
    cfg.model.mixed_precision = "off"
    assert peer_config(cfg, torch.device("cpu")).model.mixed_precision == "off"
