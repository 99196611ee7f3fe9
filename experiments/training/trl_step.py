"""TRL GRPOTrainer's RL step on the job of sparserl's ``dense`` preset, timed step by step.

The peer of sparserl's dense RL step (docs/results/rl_step_vs_trl.md). Run it in a venv that
sees the main site-packages plus TRL (``python3 -m venv --system-site-packages /work/venvs/trl &&
/work/venvs/trl/bin/pip install trl==1.13.0``)::

    flock /work/exp/cpu.lock /work/venvs/trl/bin/python experiments/training/trl_step.py --steps 4 \
        --out /work/exp/trl_step.json

What is the same as ``sparserl train dense`` (read from the resolved ``dense`` config, not copied):
the model (``sparserl.models.loading.load_model``: SmolLM2-135M-Instruct from the embedded GGUF,
float32), the prompts (the built-in ``arith`` task with the config's system prompt, in the order
sparserl's ``PromptSampler`` draws them, rendered by the tokenizer's chat template with the
generation prompt), the reward (sparserl's ``math`` reward through ``score_responses``), 4 prompts x
8 completions per optimizer step in micro-batches of 16 (gradient accumulation 2), at most 48 new
tokens at temperature 1 (top-p 1, top-k off), AdamW with the config's lr/betas/eps/weight decay,
constant lr, grad-norm clip, GRPO advantages scaled by the group std, the PPO clip, no KL term (no
reference model), and ``loss_type="grpo"`` (mean over a response's tokens, then over responses:
sparserl's ``seq_mean_token_mean``). One generation per optimizer step and one update, so TRL uses
the current policy's detached log-probs as the old ones (no scoring forward), as sparserl's dense
preset uses the sampler's.

Timing: a TrainerCallback takes ``time.perf_counter`` at ``on_step_begin`` / ``on_step_end`` (one
optimizer step: generation, reward, both micro-batches' forward/backward, clip and AdamW step); the
trainer's generation (``_generate_single_turn``: ``model.generate``), reward (``_calculate_rewards``)
and the whole generate-and-score phase are wrapped with timers too, so
``update_s = step_s - generate_and_score_s``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4, help="optimizer steps to time (the first includes warm-up)")
    p.add_argument("--preset", default="dense", help="sparserl preset whose job is reproduced")
    p.add_argument("--out", default="trl_step.json", help="JSON file of per-step times")
    p.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="TRL's own default (True); off by default here because sparserl does not checkpoint",
    )
    p.add_argument("--output-dir", default="/tmp/trl_step_run", help="TRL's output_dir (nothing is saved)")
    return p.parse_args()


def build_dataset(cfg, n_prompts: int):
    """sparserl's training prompts in the order its PromptSampler draws them (TRL will not shuffle)."""
    from datasets import Dataset

    from sparserl.data.loaders import PromptSampler
    from sparserl.train.train_set import load_train_set

    data = load_train_set(cfg.data)
    sampler = PromptSampler(list(data), cfg.train.prompts_per_step, seed=cfg.train.seed)
    examples = []
    while len(examples) < n_prompts:
        examples.extend(sampler.next_batch())
    examples = examples[:n_prompts]
    return Dataset.from_list([{"prompt": e.prompt, "label": e.label} for e in examples])


def make_reward(cfg):
    """sparserl's reward as a TRL reward function: completions are chat messages; labels come from
    the dataset column ``label``."""
    from sparserl.reward.registry import load_reward, score_responses

    fn = load_reward(cfg.reward.fn, timeout_s=cfg.reward.timeout_s)

    def sparserl_reward(prompts, completions, label, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        rewards, _errors = score_responses(fn, texts, label)
        return rewards

    return sparserl_reward


class Timed:
    """Wraps a bound method of the trainer and appends each call's wall time to a list."""

    def __init__(self, obj, name: str, sink: list):
        self.inner, self.sink = getattr(obj, name), sink
        setattr(obj, name, self)

    def __call__(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return self.inner(*a, **k)
        finally:
            self.sink.append(time.perf_counter() - t0)


def main():
    args = parse_args()
    import transformers
    import trl
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from sparserl.config import load_config
    from sparserl.models.loading import load_model

    cfg = load_config(args.preset, ["data.eval=null", "checkpoint.every=0"])
    r, t, a = cfg.rollout, cfg.train, cfg.algorithm
    assert a.kl_coef == 0.0, "this script reproduces the no-KL job (beta=0)"
    assert a.loss_agg == "seq_mean_token_mean", "loss_type='grpo' matches seq_mean_token_mean only"
    assert a.adv_estimator == "grpo" and a.scale_rewards in ("group", "none", "batch")
    group_batch = t.prompts_per_step * r.n
    assert group_batch % t.micro_batch_size == 0
    accum = group_batch // t.micro_batch_size

    torch.manual_seed(t.seed)
    lm = load_model(cfg.model.name, dtype=cfg.model.dtype, seed=cfg.model.seed, device="cpu")
    model, tok = lm.model.train(), lm.tokenizer
    dataset = build_dataset(cfg, args.steps * t.prompts_per_step)

    gcfg = GRPOConfig(
        output_dir=args.output_dir,
        # batch: one optimizer step = prompts_per_step x n completions, micro-batches of micro_batch_size
        num_generations=r.n,
        per_device_train_batch_size=t.micro_batch_size,
        gradient_accumulation_steps=accum,
        num_iterations=t.ppo_epochs,
        max_steps=args.steps,
        shuffle_dataset=False,
        # sampling
        max_completion_length=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        use_vllm=False,
        # objective
        loss_type="grpo",
        scale_rewards=a.scale_rewards,
        beta=a.kl_coef,
        epsilon=a.clip_eps,
        epsilon_high=a.clip_eps_high if a.clip_eps_high is not None else a.clip_eps,
        mask_truncated_completions=False,
        # optimizer
        learning_rate=t.lr,
        adam_beta1=t.betas[0],
        adam_beta2=t.betas[1],
        adam_epsilon=t.eps,
        weight_decay=t.weight_decay,
        max_grad_norm=t.grad_clip,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        # precision, memory, bookkeeping
        bf16=False,
        fp16=False,
        gradient_checkpointing=args.gradient_checkpointing,
        use_cpu=True,
        seed=t.seed,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        log_completions=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )

    steps: list[dict] = []
    gen_s, reward_s, gen_score_s, logs = [], [], [], []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, targs, state, control, **kw):
            self.t0 = time.perf_counter()
            self.marks = (len(gen_s), len(reward_s), len(gen_score_s))

        def on_step_end(self, targs, state, control, **kw):
            dt = time.perf_counter() - self.t0
            g, rw, gs = (sum(x[m:]) for x, m in zip((gen_s, reward_s, gen_score_s), self.marks))
            steps.append(
                {
                    "step": state.global_step,
                    "step_s": dt,
                    "generate_s": g,
                    "reward_s": rw,
                    "generate_and_score_s": gs,
                    "update_s": dt - gs,
                }
            )
            print(
                f"step {state.global_step}: {dt:.2f} s (generate {g:.2f}, reward {rw:.2f}, "
                f"generate+score {gs:.2f}, update {dt - gs:.2f})",
                flush=True,
            )

        def on_log(self, targs, state, control, logs=None, **kw):
            if logs:
                logs_copy = {}
                for k, v in logs.items():  # transformers may hand formatted strings to callbacks
                    try:
                        logs_copy[k] = float(v)
                    except (TypeError, ValueError):
                        pass
                logs_copy["step"] = state.global_step
                logs_list.append(logs_copy)

    logs_list = logs
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=make_reward(cfg),
        args=gcfg,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[StepTimer()],
    )
    Timed(trainer, "_generate_single_turn", gen_s)
    Timed(trainer, "_calculate_rewards", reward_s)
    Timed(trainer, "_generate_and_score_completions", gen_score_s)

    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0

    later = [s["step_s"] for s in steps[1:]]
    result = {
        "what": f"TRL GRPOTrainer step on sparserl's {args.preset} job",
        "versions": {
            "trl": trl.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "torch_threads": torch.get_num_threads(),
        "settings": {
            k: getattr(gcfg, k)
            for k in (
                "num_generations",
                "per_device_train_batch_size",
                "gradient_accumulation_steps",
                "generation_batch_size",
                "steps_per_generation",
                "num_iterations",
                "max_completion_length",
                "temperature",
                "top_p",
                "top_k",
                "loss_type",
                "scale_rewards",
                "beta",
                "epsilon",
                "epsilon_high",
                "learning_rate",
                "adam_beta1",
                "adam_beta2",
                "adam_epsilon",
                "weight_decay",
                "max_grad_norm",
                "lr_scheduler_type",
                "bf16",
                "gradient_checkpointing",
                "seed",
                "use_vllm",
            )
        },
        "model_activation_checkpointing": bool(
            getattr(
                trainer.model, "is_activation_checkpointing", getattr(trainer.model, "is_gradient_checkpointing", False)
            )
        ),
        "model": cfg.model.name,
        "dtype": cfg.model.dtype,
        "data": cfg.data.train,
        "steps": steps,
        "median_step_s_2_to_n": statistics.median(later) if later else None,
        "median_update_s_2_to_n": statistics.median(s["update_s"] for s in steps[1:]) if later else None,
        "median_generate_s_2_to_n": statistics.median(s["generate_s"] for s in steps[1:]) if later else None,
        "train_wall_s": total,
        "trl_logs": logs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    print(
        json.dumps(
            {
                k: result[k]
                for k in ("median_step_s_2_to_n", "median_update_s_2_to_n", "median_generate_s_2_to_n", "train_wall_s")
            }
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
