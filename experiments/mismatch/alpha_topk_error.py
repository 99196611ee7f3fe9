"""Sparrow's top-k α against the exact α on the same sampled batch: one rollout of the
main job's shape (or GSM8K prompts), both modes measured on it, per-token error and the p5 tails.

    python3 experiments/mismatch/alpha_topk_error.py                               # the default task
    python3 experiments/mismatch/alpha_topk_error.py data.train=gsm8k rollout.max_new_tokens=512 rollout.kv_budget=128
"""

from __future__ import annotations

import json
import sys
import time

import torch

from sparserl.batch import RolloutBatch
from sparserl.config import load_config, validate
from sparserl.mismatch.acceptance import acceptance, acceptance_topk, summary
from sparserl.mismatch.measure import dense_hidden
from sparserl.mismatch.replay import replay
from sparserl.score.shared_prompt import lm_head_weight
from sparserl.train.trainer import build_trainer, sampling_params


@torch.no_grad()
def main(overrides: list[str]) -> dict:
    cfg = validate(load_config("default", ["mismatch.alpha=topk", "data.eval=null", *overrides]))
    trainer = build_trainer(cfg)
    params = sampling_params(cfg, 1)
    examples = trainer.data.next_batch()
    t0 = time.perf_counter()
    ro = trainer.engine.generate([e.prompt for e in examples], params)
    rollout_s = time.perf_counter() - t0
    batch = RolloutBatch.from_rollout(ro.prompt_ids, ro.response_ids, ro.sampler_logprobs, ro.prompt_index)
    tau = params.temperature or 1.0
    t0 = time.perf_counter()
    hidden = dense_hidden(trainer.learner, batch, cfg.train.micro_batch_size)
    weight = lm_head_weight(trainer.learner)
    forward_s = time.perf_counter() - t0
    N, T = batch.response_ids.shape
    exact, topk = torch.zeros(N, T, dtype=torch.float64), torch.zeros(N, T, dtype=torch.float64)

    def on_step(t, rows, logq):
        logp = torch.log_softmax((hidden[rows, t] @ weight.t()).float() / tau, -1)
        exact[rows, t] = acceptance(logp, logq).double()

    t0 = time.perf_counter()
    replay(trainer.engine, ro.prompt_ids, ro.response_ids, params, on_step)
    replay_s = time.perf_counter() - t0
    for i, (v, idx) in enumerate(zip(ro.top_logprobs, ro.top_indices)):
        logp = torch.log_softmax((hidden[i, : len(v)] @ weight.t()).float() / tau, -1)
        topk[i, : len(v)] = acceptance_topk(logp, v, idx).double()
    mask = batch.response_mask.bool()
    err = (exact - topk)[mask]
    (em, ep5), (tm, tp5) = summary(exact, mask), summary(topk, mask)
    return {
        "overrides": overrides,
        "tokens": int(mask.sum()),
        "exact_mean": em,
        "exact_p5": ep5,
        "topk_mean": tm,
        "topk_p5": tp5,
        "err_mean": float(err.mean()),
        "err_max": float(err.max()),
        "err_p95": float(torch.quantile(err, 0.95)),
        "rollout_s": rollout_s,
        "dense_forward_s": forward_s,
        "replay_s": replay_s,
        "cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": "),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=2))
