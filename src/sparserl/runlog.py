"""A run's record: the metric names every module shares, and reading ``metrics.jsonl`` back.

One home for the names (TRL habit: ``station/what``, each saying exactly what it measures). The
trainer writes them, ``train/metrics.py`` logs and prints them, ``eval/report.py`` and the comparison
read them; none spells a name itself. The correction station's own names (``mismatch/*``, ``is/*``,
``rs/*``) are listed in ``sparserl.correct.base``; the ones other modules read are named here too.

KV memory is stated like with like (never an allocation against a token count):

- ``kv/sampler_alloc_bytes``: the most the sampler's K/V buffers held during the step's rollout;
- ``kv/dense_alloc_bytes``: what the dense engine allocates for the same batch (every sequence's
  prompt + ``max_new_tokens`` slots);
- ``kv/alloc_reduction`` = dense / sampler allocation (×);
- ``kv/kept_frac_final``: per response, the tokens its cache held at its end over the tokens a dense
  cache would hold then (prompt + response), averaged over the step's responses;
  ``kv/kept_tokens_final`` and ``kv/dense_tokens_final`` are the two means.

``metrics.jsonl`` holds one ``{"step": ..., <metrics>, "time": <unix s>}`` per line.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
#: the config a run started with (never overwritten); a resume with a changed config adds
#: ``config-resume-<step>.yaml`` beside it (``sparserl.train.run_folder.recorded_configs``)
CONFIG_FILE = "config.yaml"
#: config keys that may change when a run is resumed, since they cannot change what it already did
#: (``section.*``: every key of the section); any other change needs ``--allow-config-change``
RESUME_FREE_KEYS = ("name", "train.steps", "log.*", "checkpoint.*", "eval.every", "cluster.*")

# memory of the training process: the resident high-water mark so far (the kernel's VmHWM), and preflight's
# prediction of the step's peak for this config (sparserl.memory.predict_peak), logged side by side each step
MEMORY_RSS_PEAK = "memory/rss_peak_bytes"
MEMORY_PREDICTED_PEAK = "memory/predicted_peak_bytes"
MEMORY_RETURNED = "memory/returned_bytes"  # freed heap pages handed back to the kernel at the step's end

# reward station
REWARD_MEAN = "reward/mean"
REWARD_STD = "reward/std"
# the verifier's mean (a weighted or length-shaped reward's first part; else reward/mean): what compare ranks arms by
REWARD_VERIFIER_MEAN = "reward/verifier_mean"
ACCURACY = "reward/accuracy"  # the fraction of responses the verifier (a weighted reward's first part) scores >= 1
REWARD_ERRORS = "reward/errors"
FRAC_ZERO_STD_GROUPS = "reward/frac_zero_std_groups"

# DAPO's dynamic sampling (algorithm.filter_groups): batches sampled this step, groups found whose rewards
# differ, the fraction of the groups trained on that do, and the mean reward of the groups trained on. Under it,
# reward/mean is the mean over every response the step sampled, kept or not, so that it compares with other runs':
# the kept groups' mean is raised by the selection (a weak model's dropped groups are mostly all 0); so is
# reward/accuracy
GEN_BATCHES = "sampling/gen_batches"
INFORMATIVE_GROUPS = "sampling/informative_groups"
KEPT_INFORMATIVE_FRAC = "sampling/kept_informative_frac"
REWARD_MEAN_KEPT = "sampling/reward_mean_kept"

# responses
LENGTH_MEAN = "response/length_mean"
LENGTH_MAX = "response/length_max"
CLIPPED_FRAC = "response/clipped_frac"

# KV cache of the sampler (see the module docstring)
KV_SAMPLER_ALLOC = "kv/sampler_alloc_bytes"
KV_DENSE_ALLOC = "kv/dense_alloc_bytes"
KV_ALLOC_REDUCTION = "kv/alloc_reduction"
KV_KEPT_FRAC = "kv/kept_frac_final"
KV_KEPT_TOKENS = "kv/kept_tokens_final"
KV_DENSE_TOKENS = "kv/dense_tokens_final"
KV_COMPRESSIONS = "kv/compressions"
KV_BUDGET_BIN = "kv/budget_bin/"  # + bin start: the budget the step's rollout kept in that sequence-length bin

# mismatch and correction (computed by sparserl.correct)
MISMATCH_K3 = "mismatch/k3_kl"
MISMATCH_LOG_RATIO = "mismatch/log_ratio_abs_mean"
# rollout.mismatch_split (sparserl.mismatch.split): k3 of the quantized weights' part and of the cache's part
MISMATCH_K3_WEIGHTS = "mismatch/k3_kl_weights"
MISMATCH_K3_CACHE = "mismatch/k3_kl_cache"
MISMATCH_ALPHA_MEAN = "mismatch/alpha_mean"  # Sparrow's acceptance α = Σ_x min(p, q), mean over tokens
MISMATCH_ALPHA_P5 = "mismatch/alpha_p5"  # its 5th percentile over the step's tokens
MISMATCH_ALPHA_P5_BIN = "mismatch/alpha_p5_bin/"  # + bin start: the 5th percentile per sequence-length bin
# algorithm.distill_sparse: α of the same sparse sampler on θ alone, without φ (replayed on the same tokens)
MISMATCH_ALPHA_MEAN_NOPHI = "mismatch/alpha_mean_nophi"
MISMATCH_ALPHA_P5_NOPHI = "mismatch/alpha_p5_nophi"
MISMATCH_REPLAY_ERR = "mismatch/replay_err"  # exact α: largest |replayed - recorded| sampler log-prob
# rollout.async: the sampler holds the weights of a step before; the mismatch's lag and cache parts, read
# against the sampler's own weights on a dense cache (sparserl.mismatch.teacher_forced.DenseCacheReading)
#: the same per token, averaged: a partial rollout's later segments were drawn by fresher weights (rollout.partial)
MISMATCH_POLICY_LAG_TOKENS = "mismatch/policy_lag_tokens_mean"
ROLLOUT_PARTIAL_FRAC = "rollout/partial_frac"  # responses whose tokens were drawn by more than one push
#: response tokens masked out of the loss as older than rollout.partial_max_lag pushes
ROLLOUT_STALE_MASKED = "rollout/stale_masked_frac"
MISMATCH_POLICY_LAG = "mismatch/policy_lag_steps"  # weight pushes between the sampler's weights and the learner's
MISMATCH_K3_LAG = "mismatch/k3_kl_lag"  # k3 of the learner against the sampler's weights on a dense cache
MISMATCH_ALPHA_LAG_MEAN = "mismatch/alpha_lag_mean"  # α of the same two, over the sampler's weights' top-k
MISMATCH_ALPHA_LAG_P5 = "mismatch/alpha_lag_p5"
MISMATCH_ALPHA_CACHE_MEAN = (
    "mismatch/alpha_cache_mean"  # α of the sampler that ran against its weights on a dense cache
)
MISMATCH_ALPHA_CACHE_P5 = "mismatch/alpha_cache_p5"
MASKED_FRAC = "rs/masked_frac"  # valid tokens giving no gradient: out of the final mask, or weight 0 in it
TOKEN_MASKED_FRAC = "rs/token_masked_frac"
OVERSAMPLE_ACCEPT_KEPT = "sampling/oversample_acceptance_kept"  # mean acceptance of the responses kept per prompt
OVERSAMPLE_ACCEPT_DROPPED = "sampling/oversample_acceptance_dropped"  # and of those left out
DENSE_FALLBACK_FRAC = "sampling/dense_fallback_frac"  # groups of a step re-sampled densely (all rewards 0)
DENSE_FALLBACK_REWARD = "sampling/dense_fallback_reward_mean"  # the mean reward of those dense re-samples
OFF_POLICY_MASKED_FRAC = "rs/off_policy_masked_frac"  # responses of the micro-batches left out by the sequence mask
SEQ_VETOED_FRAC = "rs/seq_vetoed_frac"
IS_WEIGHT_MEAN = "is/weight_mean"  # the correction's weights over the tokens kept in the loss
IS_WEIGHT_STD = "is/weight_std"
IS_WEIGHT_MIN = "is/weight_min"
IS_WEIGHT_MAX = "is/weight_max"
IS_ESS = "is/ess"  # effective-sample-size fraction of those weights, (Σw)² / (N Σw²)
IS_CLIPPED_FRAC = "is/clipped_frac"  # kept tokens whose weight the correction clipped

# learner
POLICY_LOSS = "policy/loss"
ENTROPY = "policy/entropy"
KL_REF = "policy/kl_ref"
GRAD_NORM = "grad_norm"
LR = "lr"
OPTIMIZER_STEPS = "optimizer_steps"
#: optimizer steps of the step not applied because their loss or gradient norm was not finite (the weights
#: stayed as they were; sparserl.train.nonfinite): train.max_nonfinite_steps such steps in a row stop the run
SKIPPED_NONFINITE = "train/skipped_nonfinite"

# time per station, and throughput
CLUSTER_WORKER_RESTARTS = "cluster/worker_restarts"  # rollout workers replaced so far (cluster.rollout_workers)
#: the share of the wall clock since the rollout collected before that the rollout workers did not sample: 1 - the
#: collected rollout's sampling seconds summed over its workers / (its workers x that wall clock)
CLUSTER_WORKER_IDLE = "cluster/worker_idle_frac"

TIME_ROLLOUT = "time/rollout_s"
TIME_REWARD = "time/reward_s"
TIME_SCORE = "time/score_s"
TIME_ALPHA = "time/alpha_s"  # measuring α (mismatch.alpha): replay and/or the dense forward
TIME_UPDATE = "time/update_s"
TIME_STEP = "time/step_s"  # the step's wall clock, from its rollout to its push: the stations and what lies between
#: the stations: the disjoint parts of a step, in order; their sum is the step's time up to what lies between
STATIONS = (TIME_ROLLOUT, TIME_REWARD, TIME_SCORE, TIME_ALPHA, TIME_UPDATE)
ROLLOUT_TOKENS_PER_S = "throughput/rollout_tokens_per_s"
RESPONSES_PER_S = "throughput/responses_per_s"  # the step's responses over its wall clock (time/step_s)
TIME_QUANTIZE = "time/quantize_s"  # part of time/update_s: re-quantizing the sampler's weights after the push
# rollout workers: their sampling itself (the slowest worker's); time/rollout_s is the training process's wait
# for it, less than this under rollout.async (the sampling overlaps the step before's update)
TIME_GENERATE = "time/generate_s"
TIME_DISTILL = "time/distill_s"  # part of time/update_s: DistillSparse's update of φ
TIME_PUSH = "time/push_s"  # part of time/update_s: the new weights into the sampler here and the workers' object
#: times that are part of a station (sub-time -> its station): never added to the stations
SUBTIMES = {TIME_GENERATE: TIME_ROLLOUT, TIME_QUANTIZE: TIME_UPDATE, TIME_DISTILL: TIME_UPDATE, TIME_PUSH: TIME_UPDATE}

# DistillSparse (sparserl.train.distill_sparse): φ's loss L = L_PPO^sparse + λ·k3, its parts and gradient norm
DISTILL_LOSS = "distill/loss"
DISTILL_PG_LOSS = "distill/pg_loss"
DISTILL_K3 = "distill/k3_kl"  # mean k3 KL(q_φ ‖ p) over the step's tokens, before φ's update
DISTILL_GRAD_NORM = "distill/grad_norm"

# quantized sampler (QuRL): of the weight elements the last optimizer step changed, the fraction whose
# quantized code changed too (sparserl.train.update_visible)
QUANT_UPDATE_VISIBLE = "quant/update_visible_frac"

# held-out evaluation: logged at the step it ran, also written to eval-step<N>.json
EVAL_FILE = "eval-step{step:05d}.json"
EVAL_MODES = ("dense", "sparse")


def step_seconds(row: dict) -> float | None:
    """A metrics row's step time: ``time/step_s`` when logged, else (a run that did not log it)
    the sum of the :data:`STATIONS` present (never a sub-time: :data:`SUBTIMES`); None without either."""

    def number(v):
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    if number(row.get(TIME_STEP)) is not None:
        return number(row[TIME_STEP])
    parts = [number(row.get(k)) for k in STATIONS]
    parts = [x for x in parts if x is not None]
    return sum(parts) if parts else None


def reward_part_metric(spec: str) -> str:
    """The mean of one part of a weighted reward (``reward.fn`` a list), by its spec: ``reward/part/<spec>``."""
    return f"reward/part/{spec}"


def eval_metric(mode: str, stat: str = "pass@1") -> str:
    """``eval/dense/pass@1``: an evaluation figure under dense or sparse inference."""
    return f"eval/{mode}/{stat}"


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of ``run_dir/metrics.jsonl`` (or of that file given directly), in file order.

    A truncated or corrupt last line (a run killed mid-write) is skipped; a missing file gives [].
    """
    path = Path(run_dir)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.exists():
        return []
    rows: list[dict] = []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                warnings.warn(f"{path}:{i + 1}: skipping a line that is not JSON", stacklevel=2)
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
