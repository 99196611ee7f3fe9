"""End-to-end training on the tiny model: weights change, checkpoints load, resume is exact."""

import json
import os
import sys

import pytest
import torch

from sparserl.config import ConfigError, load_config, validate
from sparserl.train.checkpoint import latest_checkpoint
from sparserl.train.trainer import build_trainer, train, train_step

# rollout.dtype=float32 and model.mixed_precision=off: `auto` is bfloat16 on a CPU with fast bf16 units, and
# these tests compare the sampler with the float32 learner exactly
TINY = [
    "model.name=tiny",
    "rollout.dtype=float32",
    "model.mixed_precision=off",
    "train.prompts_per_step=2",
    "rollout.n=4",
    "rollout.max_new_tokens=16",
    "rollout.kv_budget=8",
    "rollout.step_length=4",
    "rollout.window=2",
    "train.micro_batch_size=4",
    "log.tensorboard=false",
    "log.progress=plain",
    "checkpoint.every=1",
    "checkpoint.keep_last=0",
    "train.lr=1e-3",
    "reward.fn=test_train:toy_reward",
    "data.eval=null",
    "data.system_prompt=null",
    "rollout.compress_prompt=false",
]


def toy_reward(response: str, label: str) -> float:
    """A reward with spread on a random model (arith answers never come out right)."""
    return float(len(response) % 2)


def cfg_for(tmp_path, *extra):
    return validate(load_config("sparse_rl_fixed40", [*TINY, f"log.out_dir={tmp_path}", *extra]))


def test_two_steps_change_weights_and_write_loadable_checkpoint(tmp_path):
    cfg = cfg_for(tmp_path, "train.steps=2")
    tr = build_trainer(cfg)
    assert tr.optimizer.defaults["fused"]  # torch's fused AdamW kernel on CPU and CUDA
    before = {k: v.clone() for k, v in tr.learner.state_dict().items()}
    run = train(cfg, run_dir=tmp_path / "run", log=lambda *_: None)
    ck = latest_checkpoint(run)
    assert ck is not None and ck.name == "step-000002"
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(ck / "model")
    changed = [k for k, v in loaded.state_dict().items() if k in before and not torch.equal(v, before[k])]
    assert changed, "training did not change any weight"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "reward/mean",
        "mismatch/k3_kl",
        "is/ess",
        "rs/token_masked_frac",
        "kv/sampler_alloc_bytes",
        "kv/dense_alloc_bytes",
        "kv/alloc_reduction",
        "kv/kept_frac_final",
        "kv/kept_tokens_final",
        "kv/dense_tokens_final",
        "time/update_s",
        "time/step_s",
        "policy/clip_frac_high",
        "grad_norm",
    ):
        assert key in rows[-1]
    # like with like: the sampler's buffers (prompt + budget + period) against the dense engine's
    # (prompt + max_new_tokens) for the same batch, and kept tokens against dense tokens
    last = rows[-1]
    assert last["kv/sampler_alloc_bytes"] < last["kv/dense_alloc_bytes"]
    assert last["kv/alloc_reduction"] == pytest.approx(last["kv/dense_alloc_bytes"] / last["kv/sampler_alloc_bytes"])
    assert last["kv/kept_tokens_final"] <= last["kv/dense_tokens_final"]
    report = (run / "report.md").read_text()
    assert "saved -" not in report and "bytes allocated, sampler vs dense engine" in report
    assert (run / "report.md").exists() and (run / "reward.png").exists()


def test_sampler_receives_new_weights(tmp_path):
    cfg = cfg_for(tmp_path, "train.steps=1")
    tr = build_trainer(cfg)
    emb0 = tr.engine.model.layers[0].qkv.clone()
    train_step(tr, 1)
    assert not torch.equal(emb0, tr.engine.model.layers[0].qkv)
    w = tr.learner.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(tr.engine.model.layers[0].qkv[: w.shape[0]], w.detach())


@pytest.mark.parametrize("precision", ["off", "bfloat16"])
def test_resume_gives_the_same_next_step(tmp_path, precision):
    mixed = f"model.mixed_precision={precision}"
    full = train(cfg_for(tmp_path, "train.steps=3", mixed), run_dir=tmp_path / "a", log=lambda *_: None)
    part = cfg_for(tmp_path, "train.steps=2", mixed)
    train(part, run_dir=tmp_path / "b", log=lambda *_: None)
    # a run killed while writing step 3 leaves debris that resume ignores
    (tmp_path / "b" / "checkpoints" / ".tmp-step-000003-999").mkdir()
    resumed = train(cfg_for(tmp_path, "train.steps=3", mixed), run_dir=tmp_path / "b", resume=True, log=lambda *_: None)
    ra = [json.loads(x) for x in (full / "metrics.jsonl").read_text().splitlines()]
    rb = [json.loads(x) for x in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rb] == [1, 2, 3]
    for key in ("reward/mean", "policy/loss", "mismatch/k3_kl", "response/length_mean"):
        assert ra[2][key] == pytest.approx(rb[2][key], rel=1e-5, abs=1e-7)
    wa = (latest_checkpoint(full) / "model" / "model.safetensors").read_bytes()
    wb = (latest_checkpoint(resumed) / "model" / "model.safetensors").read_bytes()
    assert wa == wb
    assert not list((tmp_path / "b" / "checkpoints").glob(".tmp-*"))


def test_bad_configs_fail_before_the_model_loads(tmp_path):
    with pytest.raises(ConfigError, match="rollout.kv_bugdet"):
        load_config("sparse_rl_fixed40", ["rollout.kv_bugdet=3"])
    with pytest.raises(ConfigError):
        validate(load_config("sparse_rl_fixed40", ["rollout.kv_budget=4", "rollout.window=8"]))
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  stpes: 3\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_config(str(bad))


def test_bad_data_row_names_file_and_line(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2"\n')
    cfg = cfg_for(tmp_path, "train.steps=1", f"data.train={data}")
    with pytest.raises(ValueError, match=r"d\.jsonl.*line 2"):
        train(cfg, run_dir=tmp_path / "r", log=lambda *_: None)


def test_eval_and_report_commands(tmp_path):
    from sparserl import cli

    out = tmp_path / "eval.json"
    assert (
        cli.main(
            [
                "eval",
                "--model",
                "tiny",
                "--data",
                "arith",
                "--limit",
                "3",
                "--n",
                "2",
                "--temperature",
                "1.0",
                "--max-new-tokens",
                "12",
                "--compressor",
                "rkv",
                "--kv-budget",
                "6",
                "--step-length",
                "2",
                "--window",
                "2",
                "--dtype",
                "float32",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    assert [r["compressor"] for r in res["runs"]] == ["none", "rkv"]
    for r in res["runs"]:
        assert r["problems"] == 3 and 0.0 <= r["pass@1"] <= r["pass@2"] <= 1.0
    run = train(cfg_for(tmp_path, "train.steps=1"), run_dir=tmp_path / "rr", log=lambda *_: None)
    (run / "report.md").unlink()
    assert cli.main(["report", str(run)]) == 0
    assert (run / "report.md").exists()


def test_dense_sampler_and_dense_scoring_agree_at_any_temperature(tmp_path):
    """With no compression the sampler is the dense policy: log q == log p (the correction's ρ is 1)."""
    from sparserl.batch import RolloutBatch
    from sparserl.rollout.sampling import SamplingParams
    from sparserl.score import score_logprobs

    cfg = cfg_for(tmp_path, "rollout.compressor=none", "rollout.temperature=0.7")
    tr = build_trainer(cfg)
    ro = tr.engine.generate(["1 + 2 =", "hello"], SamplingParams(n=3, max_new_tokens=12, temperature=0.7, seed=0))
    batch = RolloutBatch.from_rollout(ro.prompt_ids, ro.response_ids, ro.sampler_logprobs, ro.prompt_index)
    old = score_logprobs(tr.learner, batch, 4, temperature=0.7)
    assert torch.allclose(old, batch.sampler_logprobs, atol=1e-4)
    at_one = score_logprobs(tr.learner, batch, 4, temperature=1.0)
    assert not torch.allclose(at_one, batch.sampler_logprobs, atol=1e-3)


def test_kill_9_mid_run_resumes_from_last_checkpoint(tmp_path):
    """A real SIGKILL of `sparserl train` while it runs; the resumed run finishes from the last
    complete checkpoint with one metrics line per step."""
    import os
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "sparserl.cli",
        "train",
        "sparse_rl_fixed40",
        *TINY,
        "train.steps=40",
        f"log.out_dir={tmp_path}",
        "--run-dir",
        str(run),
    ]
    env = {**os.environ, "PYTHONPATH": os.path.dirname(__file__)}  # for the toy reward
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and latest_checkpoint(run) is None:
            time.sleep(0.2)
        time.sleep(0.7)  # somewhere in a later step (or in the middle of writing a checkpoint)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    last = latest_checkpoint(run)
    assert last is not None
    killed_at = int(last.name.split("-")[1])
    assert killed_at < 40
    resumed = subprocess.run(
        [*args[:-2], "train.steps=" + str(killed_at + 2), "--run-dir", str(run), "--resume"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {last}" in resumed.stdout
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, killed_at + 3))


def test_several_updates_per_rollout_batch(tmp_path):
    """mini_batch_prompts < prompts_per_step: one optimizer step per mini-batch, times ppo_epochs."""
    cfg = cfg_for(tmp_path, "train.steps=1", "train.mini_batch_prompts=1", "train.ppo_epochs=2")
    tr = build_trainer(cfg)
    train_step(tr, 1)
    steps = {int(s["step"]) for s in tr.optimizer.state_dict()["state"].values()}
    assert steps == {4}  # 2 prompts / 1 per mini-batch x 2 epochs


def test_off_policy_masking_and_the_unbiased_kl_run_in_every_micro_batch(tmp_path):
    """algorithm.off_policy_mask_threshold (DeepSeek-V3.2) against the current policy of each of 4 optimizer
    steps, with the unbiased KL and IcePop: a bound of 0 leaves responses out (logged), a bound no drift reaches
    leaves none, and the two runs learn differently."""
    from sparserl import runlog as names

    extra = ("train.steps=1", "train.mini_batch_prompts=1", "train.ppo_epochs=2", "algorithm.kl_coef=0.01")
    extra += ("algorithm.kl_unbiased=true", "algorithm.correction=icepop")
    runs = {}
    for delta in (0.0, 100.0):
        tr = build_trainer(cfg_for(tmp_path / str(delta), *extra, f"algorithm.off_policy_mask_threshold={delta}"))
        metrics = train_step(tr, 1)
        runs[delta] = metrics, {k: v.clone() for k, v in tr.learner.state_dict().items()}
    (strict, w0), (loose, w1) = runs[0.0], runs[100.0]
    assert 0 < strict[names.OFF_POLICY_MASKED_FRAC] < 1 and loose[names.OFF_POLICY_MASKED_FRAC] == 0
    assert any(not torch.equal(w0[k], w1[k]) for k in w0)


def test_double_min_reads_the_steps_exact_alpha_and_its_own_seed(tmp_path, monkeypatch):
    """algorithm.correction=double_min: the step hands it each position's exact α (the α station's) as the
    normaliser and a seed of the step's own."""
    from sparserl.train import step as step_module

    seen = {}
    apply = step_module.apply_corrections

    def spy(spec, q, p, mask, options=None):
        seen.update(options or {}, mask=mask)
        return apply(spec, q, p, mask, options)

    monkeypatch.setattr(step_module, "apply_corrections", spy)
    cfg = cfg_for(tmp_path, "train.steps=1", "algorithm.correction=double_min", "mismatch.alpha=exact")
    metrics = train_step(build_trainer(cfg), 1)
    alpha = seen["overlap"]
    assert alpha is not None and alpha.shape == seen["mask"].shape
    valid = seen["mask"] != 0
    assert float(alpha[valid].mean()) == pytest.approx(metrics["mismatch/alpha_mean"], abs=1e-5)
    assert seen["seed"] == cfg.train.seed * 1_000_003 + 1


def test_checkpoint_every_0_saves_only_at_the_end(tmp_path):
    run = train(cfg_for(tmp_path, "train.steps=2", "checkpoint.every=0"), run_dir=tmp_path / "c0", log=lambda *_: None)
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-000002"]


def test_warmup_counts_optimizer_updates(tmp_path):
    # 2 prompts per step, 1 per mini-batch: 2 optimizer updates per RL step
    cfg = cfg_for(tmp_path, "train.steps=1", "train.mini_batch_prompts=1", "train.warmup_steps=4", "train.lr=1e-3")
    run = train(cfg, run_dir=tmp_path / "w", log=lambda *_: None)
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["optimizer_steps"] == 2
    assert row["lr"] == pytest.approx(1e-3 * 3 / 4)  # after 2 updates: min(1, (2 + 1) / 4)


def test_reward_timeout_is_wired(tmp_path):
    tr = build_trainer(cfg_for(tmp_path, "reward.timeout_s=0.75"))
    assert tr.reward_fn.timeout_s == 0.75


def test_periodic_eval_reaches_metrics_and_report(tmp_path):
    """eval.every=1: held-out pass@1 under dense and sparse inference at each step, in metrics.jsonl,
    in eval-step<N>.json and in the report's evaluation table (which read no real key before)."""
    from sparserl.eval.report import load_run, summarize

    cfg = cfg_for(
        tmp_path,
        "train.steps=2",
        "data.eval=arith:seed=7",
        "data.eval_limit=2",
        "eval.every=1",
        "eval.max_new_tokens=8",
        "reward.fn=math",
    )
    run = train(cfg, run_dir=tmp_path / "ev", log=lambda *_: None)
    assert sorted(p.name for p in run.glob("eval*.json")) == ["eval-step00001.json", "eval-step00002.json"]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        assert 0.0 <= row["eval/dense/pass@1"] <= 1.0 and 0.0 <= row["eval/sparse/pass@1"] <= 1.0
    s = summarize(load_run(run))
    assert s["eval_pass1"]["dense"] == rows[-1]["eval/dense/pass@1"]
    assert s["eval_pass1"]["sparse"] == rows[-1]["eval/sparse/pass@1"]
    md = (run / "report.md").read_text()
    table = md.split("## Evaluation", 1)[1].split("##", 1)[0]
    assert "| 2 | 2 |" in table and "–" not in table


def test_eval_dense_only_skips_the_sparse_evaluation(tmp_path):
    """eval.dense_only (Sparrow's val_dense_only): only the dense pass@1 is measured and written."""
    extra = ("train.steps=1", "data.eval=arith:seed=7", "data.eval_limit=2", "eval.max_new_tokens=8")
    run = train(cfg_for(tmp_path, *extra, "eval.dense_only=true"), run_dir=tmp_path / "ev", log=lambda *_: None)
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert "eval/dense/pass@1" in row and not any(k.startswith("eval/sparse/") for k in row)
    record = json.loads((run / "eval-step00001.json").read_text())
    assert "dense" in record and "sparse" not in record


def test_eval_every_0_evaluates_once_at_the_end(tmp_path):
    cfg = cfg_for(
        tmp_path,
        "train.steps=2",
        "data.eval=arith:seed=7",
        "data.eval_limit=1",
        "eval.every=0",
        "eval.max_new_tokens=4",
        "reward.fn=math",
    )
    run = train(cfg, run_dir=tmp_path / "e0", log=lambda *_: None)
    assert [p.name for p in run.glob("eval*.json")] == ["eval-step00002.json"]


def test_old_logprobs_come_from_the_sampler_only_where_it_runs_the_old_policy(tmp_path, monkeypatch):
    """algorithm.old_logprobs: auto skips the scoring forward for a dense float32 sampler (and then
    old == sampler log-probs); score always scores; sampler on a compressing sampler is a config error."""
    from sparserl.train import old_logprobs

    calls = []
    for name in ("score_logprobs", "score_logprobs_keep_hidden"):  # the latter when α reads the same forward
        real = getattr(old_logprobs, name)
        monkeypatch.setattr(old_logprobs, name, lambda *a, real=real, **k: calls.append(1) or real(*a, **k))
    for mode, scored in (("auto", 0), ("score", 1)):
        cfg = cfg_for(
            tmp_path,
            "rollout.compressor=none",
            "rollout.dtype=float32",
            "algorithm.correction=none",
            f"algorithm.old_logprobs={mode}",
        )
        calls.clear()
        train_step(build_trainer(cfg), 1)
        assert len(calls) == scored, mode
    cfg = cfg_for(tmp_path, "rollout.dtype=float32")  # rkv compresses: auto scores
    calls.clear()
    train_step(build_trainer(cfg), 1)
    assert len(calls) == 1
    with pytest.raises(ConfigError, match="old_logprobs=sampler.*compresses"):
        cfg_for(tmp_path, "algorithm.old_logprobs=sampler")


@pytest.mark.parametrize(
    "extra",
    [
        ("train.shared_prompt=true",),
        ("train.shared_prompt=false", "mismatch.alpha=off", "algorithm.entropy_coef=0.01"),
        ("train.shared_prompt=false", "algorithm.kl_coef=0.01", "mismatch.alpha=topk"),
    ],
)
def test_old_logprobs_from_the_update_forward_equal_a_scoring_forward(tmp_path, monkeypatch, extra):
    """algorithm.old_logprobs=update (one optimizer step over one micro-batch): no scoring forward, and
    the step is the scored step's up to float rounding: the same mismatch, α, loss, gradient norm and
    new weights; the PPO ratio is exactly 1."""
    from sparserl.train import old_logprobs, step, update

    calls, update_forwards = [], []
    for module, name in (
        (old_logprobs, "score_logprobs"),
        (old_logprobs, "score_logprobs_keep_hidden"),
        (step, "score_logprobs"),
    ):  # the last: the reference's
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, name=name, **k: calls.append(name) or real(*a, **k))
    for name in ("forward_response", "forward_response_shared"):  # the update's own forward, in update_policy
        real = getattr(update, name)
        monkeypatch.setattr(update, name, lambda *a, real=real, **k: update_forwards.append(1) or real(*a, **k))
    out, weights = {}, {}
    for mode in ("score", "update"):
        # one micro-batch holds the whole batch: rows only, no token budget (whole rows at the prompt bound exceed it)
        cfg = cfg_for(
            tmp_path,
            "train.micro_batch_size=8",
            "train.max_tokens_per_micro_batch=null",
            f"algorithm.old_logprobs={mode}",
            *extra,
        )
        trainer = build_trainer(cfg)
        assert trainer.old_policy.kind == mode
        calls.clear()
        update_forwards.clear()
        out[mode] = train_step(trainer, 1)
        ref_scorings = 1 if trainer.ref is not None else 0  # the reference model is still scored
        assert len(calls) == (ref_scorings + 1 if mode == "score" else ref_scorings), (mode, calls)
        assert len(update_forwards) == (1 if mode == "score" else 0), mode  # one learner forward a step, not two
        weights[mode] = {k: v.detach().clone() for k, v in trainer.learner.state_dict().items()}
    keys = ["mismatch/k3_kl", "rs/token_masked_frac", "policy/loss", "grad_norm", "policy/entropy"]
    keys += ["mismatch/alpha_mean"] if "mismatch.alpha=off" not in extra else []
    keys += ["policy/kl_ref"] if "algorithm.kl_coef=0.01" in extra else []
    for key in keys:
        assert out["update"][key] == pytest.approx(out["score"][key], rel=1e-4, abs=1e-6), key
    assert out["score"]["mismatch/k3_kl"] > 0 and out["score"]["grad_norm"] > 0
    assert out["update"]["policy/ratio_mean"] == 1.0 and out["update"]["policy/clip_frac_high"] == 0.0
    # AdamW's first step moves a weight by lr·m̂/(√v̂ + ε), about lr·sign(g): where a gradient element is at the
    # level of rounding (on CUDA the two forwards' kernels round differently), the two steps can differ by up to
    # 2·lr there. Every weight stays within that bound, and all but a few in 1,000 agree to 1e-6 (on the
    # CPU, all of them; on an H200, 2 of one tensor's 4,096 did not).
    lr = cfg.train.lr
    differing = total = 0
    for k in weights["score"]:
        diff = (weights["update"][k] - weights["score"][k]).abs()
        assert diff.max().item() <= 2 * lr * 1.001, k
        differing, total = differing + (diff > 1e-6).sum().item(), total + diff.numel()
        if weights["score"][k].device.type == "cpu":
            assert diff.max().item() <= 1e-6, k
    assert differing <= 2e-3 * total, (differing, total)
    assert any(
        not torch.equal(weights["update"][k], build_trainer(cfg).learner.state_dict()[k]) for k in weights["update"]
    )


def test_auto_takes_the_update_forward_only_where_its_rule_holds(tmp_path):
    """auto: the update's forward with one micro-batch per step; a scoring forward with two micro-batches,
    two optimizer steps or LoRA dropout; old_logprobs=update there is a config error naming the key."""
    assert build_trainer(cfg_for(tmp_path, "train.micro_batch_size=8")).old_policy.kind == "update"
    assert build_trainer(cfg_for(tmp_path)).old_policy.kind == "score"  # TINY: micro-batches of 4 of 8 samples
    for extra, phrase in (
        (("train.micro_batch_size=4",), "2 micro-batches.*train.micro_batch_size"),
        (("train.mini_batch_prompts=1",), "2 optimizer steps"),
        (("train.ppo_epochs=2",), "2 optimizer steps"),
        (("train.lora_rank=4", "train.lora_dropout=0.1"), "dropout 0.1.*train.lora_dropout"),
    ):
        with pytest.raises(ConfigError, match="old_logprobs=update.*" + phrase):
            cfg_for(tmp_path, "train.micro_batch_size=8", "algorithm.old_logprobs=update", *extra)


def test_update_asked_for_on_a_learner_with_dropout_fails_before_any_rollout(tmp_path, monkeypatch):
    """Dropout is the loaded model's fact (its config, peft's modules): build_trainer asks the rule once."""
    from sparserl.score.old_policy import OldLogprobsError
    from sparserl.train import old_logprobs, step

    cfg = cfg_for(tmp_path, "train.micro_batch_size=8", "algorithm.old_logprobs=update")
    monkeypatch.setattr(old_logprobs, "model_dropout", lambda model: 0.1)
    monkeypatch.setattr(step, "rollout", lambda *a: pytest.fail("a rollout ran"))
    with pytest.raises(OldLogprobsError, match="old_logprobs=update.*dropout 0.1"):
        build_trainer(cfg)


@pytest.mark.parametrize("precision", ["off", "bfloat16"])
def test_resume_with_the_update_forward_gives_the_same_next_step(tmp_path, precision):
    over = ("train.micro_batch_size=8", "algorithm.old_logprobs=update", f"model.mixed_precision={precision}")
    full = train(cfg_for(tmp_path, "train.steps=3", *over), run_dir=tmp_path / "a", log=lambda *_: None)
    train(cfg_for(tmp_path, "train.steps=2", *over), run_dir=tmp_path / "b", log=lambda *_: None)
    resumed = train(cfg_for(tmp_path, "train.steps=3", *over), run_dir=tmp_path / "b", resume=True, log=lambda *_: None)
    wa = (latest_checkpoint(full) / "model" / "model.safetensors").read_bytes()
    wb = (latest_checkpoint(resumed) / "model" / "model.safetensors").read_bytes()
    assert wa == wb


def test_shared_prompt_update_equals_the_full_forward_update(tmp_path):
    """train.shared_prompt changes how the learner forwards, not what it computes: same rollouts, same
    loss and gradient norm (micro-batches of 3 split the groups of 4)."""
    out = {}
    for shared in ("true", "false"):
        cfg = cfg_for(tmp_path, f"train.shared_prompt={shared}", "train.micro_batch_size=3")
        out[shared] = train_step(build_trainer(cfg), 1)
    for key in ("policy/loss", "policy/pg_loss", "grad_norm", "policy/entropy", "policy/ratio_mean"):
        assert out["true"][key] == pytest.approx(out["false"][key], rel=1e-4, abs=1e-6), key


def test_deterministic_kernels_are_asked_for_on_cuda_only(tmp_path):
    """``train.deterministic``: the CPU is deterministic as it is (nothing changes there); on CUDA the
    trainer turns on torch's deterministic kernels and a fixed cuBLAS workspace before the model loads
    (test_resume_gives_the_same_next_step checks the bits where ``auto`` is a GPU)."""
    import os

    from sparserl.train.determinism import use_deterministic_kernels

    assert use_deterministic_kernels("cpu") is False
    if not torch.cuda.is_available():
        assert not torch.are_deterministic_algorithms_enabled()
        return
    before = torch.are_deterministic_algorithms_enabled()
    build_trainer(cfg_for(tmp_path, "train.steps=1", "model.device=cuda"))
    assert torch.are_deterministic_algorithms_enabled() and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert not torch.is_deterministic_algorithms_warn_only_enabled()  # strict: torch's deterministic attention
    torch.use_deterministic_algorithms(before)
    train(cfg_for(tmp_path, "train.steps=1", "model.device=cuda"), run_dir=tmp_path / "run", log=lambda *_: None)
    assert torch.are_deterministic_algorithms_enabled() == before  # a run leaves the process as it found it


def test_an_op_without_a_deterministic_kernel_is_named_with_the_key_that_lifts_it():
    from sparserl.errors import SparserlError
    from sparserl.train.determinism import naming_nondeterministic_ops

    torch_says = (
        "kthvalue CUDA does not have a deterministic implementation, but you set "
        "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just for this operation"
    )
    with pytest.raises(SparserlError, match=r"train.deterministic=true.*kthvalue CUDA.*train.deterministic=false"):
        with naming_nondeterministic_ops():
            raise RuntimeError(torch_says)
    with pytest.raises(RuntimeError, match="^CUDA out of memory$"):  # other errors pass as they are
        with naming_nondeterministic_ops():
            raise RuntimeError("CUDA out of memory")


def test_hugging_face_progress_bars_are_off_where_stderr_is_not_a_terminal(monkeypatch):
    """A log file gets no "Loading weights" / "Writing model shards" bars; a terminal keeps them; a value the
    user set for HF_HUB_DISABLE_PROGRESS_BARS is left alone."""
    import io

    from sparserl import cli

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.setattr(sys, "stderr", Terminal())
    cli.quiet_progress_bars_off_terminal()
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    cli.quiet_progress_bars_off_terminal()
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    cli.quiet_progress_bars_off_terminal()
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"


def test_mask_truncated_leaves_cut_responses_out_of_the_loss(tmp_path):
    """algorithm.mask_truncated (TRL's mask_truncated_completions, DAPO's overlong filtering): a response cut
    at rollout.max_new_tokens gets an empty loss mask; its reward still counts in its group's advantage."""
    from sparserl.reward import score_responses
    from sparserl.train.trainer import corrections_and_advantages, rollout, rollout_batch

    cfg = cfg_for(tmp_path, "algorithm.mask_truncated=true")
    trainer = build_trainer(cfg)
    examples, ro = rollout(trainer, 1)
    rewards, _ = score_responses(toy_reward, ro.texts, [examples[i].label for i in ro.prompt_index])
    batch = rollout_batch(trainer, ro, rewards)
    assert batch.truncated.tolist() == [reason == "length" for reason in ro.finish_reason]
    batch.old_logprobs = batch.sampler_logprobs.clone()
    batch.truncated = torch.arange(batch.size) % 3 == 0  # a known pattern
    corr = corrections_and_advantages(cfg, batch)
    whole = corrections_and_advantages(cfg_for(tmp_path), batch)
    cut = batch.truncated
    assert corr.mask[cut].sum() == 0 and torch.equal(corr.mask[~cut], whole.mask[~cut])
    assert whole.mask[cut].sum() > 0
    # every response cut: nothing is left in the loss and the weights do not move
    cfg = cfg_for(
        tmp_path,
        "algorithm.mask_truncated=true",
        "rollout.max_new_tokens=2",
        "rollout.kv_budget=4",
        "rollout.step_length=1",
    )
    trainer = build_trainer(cfg)
    before = {k: v.clone() for k, v in trainer.learner.state_dict().items()}
    metrics = train_step(trainer, 1)
    assert metrics["response/clipped_frac"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in trainer.learner.state_dict().items())
    trainer = build_trainer(
        cfg_for(tmp_path, "rollout.max_new_tokens=2", "rollout.kv_budget=4", "rollout.step_length=1")
    )
    train_step(trainer, 1)
    assert not all(torch.equal(before[k], v) for k, v in trainer.learner.state_dict().items())


def test_a_gspo_step_trains_on_policy(tmp_path, monkeypatch):
    """importance_sampling_level=sequence (GSPO) through the trainer: the policy loss gets it, one update on the
    step's own batch has every response's ratio exactly 1, and it changes the weights."""
    from sparserl.train import update

    levels = []
    real = update.policy_loss
    monkeypatch.setattr(
        update, "policy_loss", lambda *a, **k: levels.append(k.get("importance_sampling_level")) or real(*a, **k)
    )
    trainer = build_trainer(
        cfg_for(
            tmp_path,
            "algorithm.importance_sampling_level=sequence",
            "algorithm.clip_eps=3e-4",
            "algorithm.clip_eps_high=4e-4",
        )
    )
    before = {k: v.clone() for k, v in trainer.learner.state_dict().items()}
    metrics = train_step(trainer, 1)
    assert levels and set(levels) == {"sequence"}
    assert metrics["policy/ratio_min"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["policy/ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert any(not torch.equal(v, before[k]) for k, v in trainer.learner.state_dict().items())
