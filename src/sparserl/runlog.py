"""A run's record: the metric names every module shares, and reading ``metrics.jsonl`` back.

One home for the names (TRL habit: ``station/what``, each saying exactly what it measures), each registered
with what it holds in :data:`METRICS` (``docs/metrics.md`` is generated from it). The trainer writes them,
``train/metrics.py`` logs and prints them, ``eval/report.py`` and the comparison read them; none spells a
name itself.

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

#: every name a run logs, and what it holds: name -> description. A name ending in "/" is a family
#: (``kv/budget_bin/`` + a bin start). ``docs/metrics.md`` is generated from it (tools/metrics_doc.py);
#: ``MetricsLogger`` warns (:class:`UnregisteredMetricWarning`, an error in the tests) on a name not in it.
METRICS: dict[str, str] = {}


class UnregisteredMetricWarning(UserWarning):
    """A logged metric whose name is not in :data:`METRICS` (give it a ``metric(...)`` line here)."""


def metric(name: str, doc: str) -> str:
    """Register ``name`` with what it holds, and return it (``REWARD_MEAN = metric("reward/mean", ...)``)."""
    if name in METRICS:
        raise ValueError(f"metric {name!r} registered twice")
    METRICS[name] = doc
    return name


def is_registered(key: str) -> bool:
    """Whether a logged key is a registered name, a member of a registered family, or a composed correction's
    part's own ``is/*`` / ``rs/*`` figure (:func:`correction_part_metric`)."""
    if key in METRICS or key.startswith(tuple(name for name in METRICS if name.endswith("/"))):
        return True
    part, _, rest = key.partition("/")
    return bool(part) and rest.startswith(("is/", "rs/")) and rest in METRICS


def correction_part_metric(part: str, key: str) -> str:
    """``tis/is/ess``: a composed correction's (``algorithm.correction`` a list) part's own ``is/*`` or ``rs/*``
    figure, under the part's name (``tis1`` for its second ``tis``)."""
    return f"{part}/{key}"


# the row itself
metric("step", "the training step the row records (1-based)")
metric("time", "when the row was written (unix seconds)")

# memory of the training process
MEMORY_RSS_PEAK = metric(
    "memory/rss_peak_bytes", "the training process's resident high-water mark so far (the kernel's VmHWM), bytes"
)
MEMORY_PREDICTED_PEAK = metric(
    "memory/predicted_peak_bytes",
    "preflight's prediction of a step's peak for this config (sparserl.memory.predict_peak), bytes",
)
MEMORY_RETURNED = metric("memory/returned_bytes", "freed heap pages handed back to the kernel at the step's end")

# reward station
REWARD_MEAN = metric(
    "reward/mean",
    "the mean reward of the step's responses (under algorithm.filter_groups: of every response sampled, kept or not)",
)
REWARD_STD = metric("reward/std", "the standard deviation of those rewards")
REWARD_VERIFIER_MEAN = metric(
    "reward/verifier_mean",
    "the verifier's mean (a weighted or length-shaped reward's first part; else reward/mean): what compare ranks "
    "arms by",
)
ACCURACY = metric(
    "reward/accuracy", "the fraction of responses the verifier (a weighted reward's first part) scores >= 1"
)
REWARD_ERRORS = metric(
    "reward/errors", "responses whose reward raised or was not finite in float32 (each scored 0), a count"
)
FRAC_ZERO_STD_GROUPS = metric(
    "reward/frac_zero_std_groups", "groups whose rewards are all equal (no advantage, no gradient)"
)
REWARD_PART = metric("reward/part/", "+ a part's spec: the mean of one part of a weighted reward (reward.fn a list)")

# DAPO's dynamic sampling (algorithm.filter_groups). Under it, reward/mean is the mean over every response the step
# sampled, kept or not, so that it compares with other runs': the kept groups' mean is raised by the selection (a
# weak model's dropped groups are mostly all 0); so is reward/accuracy
GEN_BATCHES = metric("sampling/gen_batches", "batches sampled this step (algorithm.filter_groups)")
INFORMATIVE_GROUPS = metric("sampling/informative_groups", "groups found whose rewards differ")
KEPT_INFORMATIVE_FRAC = metric("sampling/kept_informative_frac", "the fraction of the groups trained on that do")
REWARD_MEAN_KEPT = metric("sampling/reward_mean_kept", "the mean reward of the groups trained on")
OVERSAMPLE_ACCEPT_KEPT = metric(
    "sampling/oversample_acceptance_kept",
    "rollout.oversample: the mean acceptance of the responses kept per prompt",
)
OVERSAMPLE_ACCEPT_DROPPED = metric("sampling/oversample_acceptance_dropped", "and of those left out")
DENSE_FALLBACK_FRAC = metric(
    "sampling/dense_fallback_frac", "rollout.dense_fallback: groups of the step re-sampled densely (all rewards 0)"
)
DENSE_FALLBACK_REWARD = metric("sampling/dense_fallback_reward_mean", "the mean reward of those dense re-samples")

# responses
LENGTH_MEAN = metric("response/length_mean", "the responses' mean length, tokens")
LENGTH_MAX = metric("response/length_max", "the longest response, tokens")
CLIPPED_FRAC = metric("response/clipped_frac", "responses cut at rollout.max_new_tokens (no end of sequence)")

# KV cache of the sampler (see the module docstring)
KV_SAMPLER_ALLOC = metric(
    "kv/sampler_alloc_bytes", "the most the sampler's K/V buffers held during the step's rollout, bytes"
)
KV_DENSE_ALLOC = metric(
    "kv/dense_alloc_bytes",
    "what the dense engine allocates for the same batch (prompt + max_new_tokens slots a sequence), bytes",
)
KV_ALLOC_REDUCTION = metric("kv/alloc_reduction", "dense / sampler allocation (x)")
KV_KEPT_FRAC = metric(
    "kv/kept_frac_final",
    "per response, the tokens its cache held at its end over those a dense cache holds then; mean over responses",
)
KV_KEPT_TOKENS = metric("kv/kept_tokens_final", "the mean of the first: tokens the sampler's cache held at the end")
KV_DENSE_TOKENS = metric("kv/dense_tokens_final", "the mean of the second: tokens a dense cache holds then")
KV_COMPRESSIONS = metric("kv/compressions", "compression passes the sampler's cache ran during the rollout")
KV_BUDGET_BIN = metric(
    "kv/budget_bin/", "+ bin start: the KV budget the step's rollout kept in that sequence-length bin (a schedule)"
)

# mismatch (sparserl.correct.base.mismatch_metrics): log ρ_t = log p_t − log q_t, p the dense old policy,
# q the sampler, over the step's valid tokens
MISMATCH_LOG_RATIO = metric("mismatch/log_ratio_abs_mean", "mean of |log ρ_t|")
MISMATCH_LOG_RATIO_MAX = metric("mismatch/log_ratio_abs_max", "max of |log ρ_t|")
MISMATCH_KL = metric("mismatch/kl", "mean of −log ρ_t: the k1 estimate of KL(q ‖ p)")
MISMATCH_K3 = metric("mismatch/k3_kl", "mean of ρ_t − 1 − log ρ_t: the k3 estimate of KL(q ‖ p), >= 0")
MISMATCH_PPL_SAMPLER = metric("mismatch/ppl_sampler", "the responses' mean perplexity under the sampler")
MISMATCH_PPL_OLD = metric("mismatch/ppl_old", "and under the dense old policy")
MISMATCH_LOG_PPL_DIFF = metric("mismatch/log_ppl_diff", "the responses' mean of mean_t (log q_t − log p_t)")
MISMATCH_CHI2 = metric("mismatch/chi2", "mean ρ_t² − 1: the token-level χ²(p ‖ q) estimate")
MISMATCH_CHI2_SEQ = metric("mismatch/chi2_seq", "the responses' mean of exp(2 Σ_t log ρ_t) − 1 (clamped at ±20)")
MISMATCH_RATIO_MEAN = metric("mismatch/ratio_mean", "mean of ρ_t")
MISMATCH_RATIO_MIN = metric("mismatch/ratio_min", "min of ρ_t")
MISMATCH_RATIO_MAX = metric("mismatch/ratio_max", "max of ρ_t")
MISMATCH_VALID_TOKENS = metric("mismatch/valid_tokens", "the count of valid tokens these are over")
# rollout.mismatch_split (sparserl.mismatch.split): k3 of the quantized weights' part and of the cache's part
MISMATCH_K3_WEIGHTS = metric("mismatch/k3_kl_weights", "rollout.mismatch_split: k3 of the quantized weights' part")
MISMATCH_K3_CACHE = metric("mismatch/k3_kl_cache", "and of the compressed cache's part")
MISMATCH_ALPHA_MEAN = metric(
    "mismatch/alpha_mean", "Sparrow's acceptance α = Σ_x min(p(x), q(x)), mean over the step's tokens"
)
MISMATCH_ALPHA_P5 = metric("mismatch/alpha_p5", "its 5th percentile over the step's tokens")
MISMATCH_ALPHA_P5_BIN = metric(
    "mismatch/alpha_p5_bin/", "+ bin start: α's 5th percentile over the tokens whose position is in that bin"
)
# algorithm.distill_sparse: α of the same sparse sampler on θ alone, without φ (replayed on the same tokens)
MISMATCH_ALPHA_MEAN_NOPHI = metric(
    "mismatch/alpha_mean_nophi", "algorithm.distill_sparse: α of the same sparse sampler on θ alone, without φ"
)
MISMATCH_ALPHA_P5_NOPHI = metric("mismatch/alpha_p5_nophi", "its 5th percentile")
MISMATCH_REPLAY_ERR = metric(
    "mismatch/replay_err", "exact α: the largest |replayed − recorded| sampler log-prob over the step's tokens"
)
# rollout.async: the sampler holds the weights of a step before; the mismatch's lag and cache parts, read
# against the sampler's own weights on a dense cache (sparserl.mismatch.teacher_forced.DenseCacheReading)
MISMATCH_POLICY_LAG = metric(
    "mismatch/policy_lag_steps", "rollout.async: weight pushes between the sampler's weights and the learner's"
)
MISMATCH_POLICY_LAG_TOKENS = metric(
    "mismatch/policy_lag_tokens_mean",
    "the same per token, averaged: a partial rollout's later segments were drawn by fresher weights",
)
MISMATCH_K3_LAG = metric("mismatch/k3_kl_lag", "k3 of the learner against the sampler's weights on a dense cache")
MISMATCH_ALPHA_LAG_MEAN = metric("mismatch/alpha_lag_mean", "α of the same two, over the sampler's weights' top-k")
MISMATCH_ALPHA_LAG_P5 = metric("mismatch/alpha_lag_p5", "its 5th percentile")
MISMATCH_ALPHA_CACHE_MEAN = metric(
    "mismatch/alpha_cache_mean", "α of the sampler that ran against its own weights on a dense cache"
)
MISMATCH_ALPHA_CACHE_P5 = metric("mismatch/alpha_cache_p5", "its 5th percentile")
ROLLOUT_PARTIAL_FRAC = metric(
    "rollout/partial_frac", "rollout.partial: responses whose tokens were drawn by more than one weight push"
)
ROLLOUT_STALE_MASKED = metric(
    "rollout/stale_masked_frac", "response tokens masked out of the loss as older than rollout.partial_max_lag pushes"
)

# correction (sparserl.correct.base.weight_metrics): its weights over the tokens kept in the loss
IS_WEIGHT_MEAN = metric("is/weight_mean", "the correction's weights over the tokens kept in the loss: mean")
IS_WEIGHT_STD = metric("is/weight_std", "their standard deviation")
IS_WEIGHT_MIN = metric("is/weight_min", "their minimum")
IS_WEIGHT_MAX = metric("is/weight_max", "their maximum")
IS_ESS = metric("is/ess", "their effective-sample-size fraction (Σw)² / (N Σw²): 1 for uniform weights")
IS_CLIPPED_FRAC = metric("is/clipped_frac", "kept tokens whose weight the correction clipped")
TOKEN_MASKED_FRAC = metric("rs/token_masked_frac", "valid tokens the correction rejected (out of the loss)")
SEQ_VETOED_FRAC = metric(
    "rs/seq_vetoed_frac", "responses the correction rejected as a whole (sequence-level rejection or mask)"
)
MASKED_FRAC = metric("rs/masked_frac", "valid tokens giving no gradient: out of the final mask, or in it with weight 0")
OFF_POLICY_MASKED_FRAC = metric(
    "rs/off_policy_masked_frac",
    "algorithm.off_policy_mask_threshold: responses of the micro-batches left out by the sequence mask",
)

metric(
    "<part>/is/…, <part>/rs/…",
    "a composed correction (algorithm.correction a list): each part's own figures above, under its name "
    "(tis/is/ess; tis1/… for a second tis)",
)

# learner (sparserl.train.losses): r_t = π_θ / μ the policy ratio, A the advantage
POLICY_LOSS = metric(
    "policy/loss",
    "the loss (policy gradient, KL and entropy terms), summed over micro-batches, mean over optimizer steps",
)
POLICY_PG_LOSS = metric("policy/pg_loss", "the policy-gradient part of it")
ENTROPY = metric("policy/entropy", "the policy's mean token entropy over the batch")
KL_REF = metric("policy/kl_ref", "the KL estimate against the reference policy (algorithm.kl_coef > 0)")
POLICY_CLIP_FRAC = metric("policy/clip_frac", "tokens the PPO clip held: clip_frac_low + clip_frac_high")
POLICY_CLIP_FRAC_LOW = metric("policy/clip_frac_low", "A < 0 and r < 1 − ε_low: clipped from below")
POLICY_CLIP_FRAC_HIGH = metric("policy/clip_frac_high", "A > 0 and r > 1 + ε_high: clipped from above")
POLICY_DUAL_CLIP_FRAC = metric(
    "policy/dual_clip_frac", "tokens the dual clip held (train.losses.policy_loss's dual_clip_c, a library option)"
)
POLICY_RATIO_MEAN = metric("policy/ratio_mean", "mean of r_t")
POLICY_RATIO_MIN = metric("policy/ratio_min", "min of r_t")
POLICY_RATIO_MAX = metric("policy/ratio_max", "max of r_t")
POLICY_APPROX_KL = metric("policy/approx_kl", "mean of r − 1 − log r: the k3 estimate of KL(μ ‖ π)")
GRAD_NORM = metric("grad_norm", "the gradient's norm before clipping, mean over the step's optimizer steps")
LR = metric("lr", "the learning rate")
OPTIMIZER_STEPS = metric(
    "optimizer_steps", "optimizer steps applied (train.ppo_epochs x mini-batches, less those skipped as non-finite)"
)
SKIPPED_NONFINITE = metric(
    "train/skipped_nonfinite",
    "optimizer steps of the step not applied because their loss or gradient norm was not finite (the weights stayed "
    "as they were; sparserl.train.nonfinite): train.max_nonfinite_steps such steps in a row stop the run",
)

# cluster
CLUSTER_WORKER_RESTARTS = metric("cluster/worker_restarts", "rollout workers replaced so far (cluster.rollout_workers)")
CLUSTER_WORKER_IDLE = metric(
    "cluster/worker_idle_frac",
    "the share of the wall clock since the rollout collected before that the rollout workers did not sample: 1 − "
    "the collected rollout's sampling seconds summed over its workers / (its workers x that wall clock)",
)

# time per station, and throughput
TIME_ROLLOUT = metric("time/rollout_s", "station 1: the rollout (the training process's wait for it)")
TIME_REWARD = metric("time/reward_s", "station 2: the reward")
TIME_SCORE = metric(
    "time/score_s",
    "station 3: the batch, the old and reference policies' log-probs, oversampling's selection, the mismatch split",
)
TIME_ALPHA = metric("time/alpha_s", "station 4: measuring α (mismatch.alpha): replay and/or the dense forward")
TIME_UPDATE = metric(
    "time/update_s", "station 5: corrections and advantages, the learner's update, DistillSparse, the weights' push"
)
TIME_STEP = metric(
    "time/step_s", "the step's wall clock, from its rollout to its push: the stations and what lies between"
)
#: the stations: the disjoint parts of a step, in order; their sum is the step's time up to what lies between
STATIONS = (TIME_ROLLOUT, TIME_REWARD, TIME_SCORE, TIME_ALPHA, TIME_UPDATE)
ROLLOUT_TOKENS_PER_S = metric("throughput/rollout_tokens_per_s", "response tokens sampled per second of sampling")
RESPONSES_PER_S = metric("throughput/responses_per_s", "the step's responses over its wall clock (time/step_s)")
TIME_QUANTIZE = metric("time/quantize_s", "part of time/update_s: re-quantizing the sampler's weights after the push")
TIME_GENERATE = metric(
    "time/generate_s",
    "the sampling itself (the slowest rollout worker's): within time/rollout_s, or longer than it under "
    "rollout.async (the sampling overlaps the step before's update)",
)
TIME_DISTILL = metric("time/distill_s", "part of time/update_s: DistillSparse's update of φ")
TIME_PUSH = metric(
    "time/push_s", "part of time/update_s: the new weights into the sampler here and the workers' object"
)
#: times that are part of a station (sub-time -> its station): never added to the stations
SUBTIMES = {TIME_GENERATE: TIME_ROLLOUT, TIME_QUANTIZE: TIME_UPDATE, TIME_DISTILL: TIME_UPDATE, TIME_PUSH: TIME_UPDATE}

# DistillSparse (sparserl.train.distill_sparse): φ's loss L = L_PPO^sparse + λ·k3, its parts and gradient norm
DISTILL_LOSS = metric("distill/loss", "DistillSparse: φ's loss L = L_PPO^sparse + λ·k3")
DISTILL_PG_LOSS = metric("distill/pg_loss", "its L_PPO^sparse part")
DISTILL_K3 = metric("distill/k3_kl", "mean k3 KL(q_φ ‖ p) over the step's tokens, before φ's update")
DISTILL_GRAD_NORM = metric("distill/grad_norm", "φ's gradient norm")

# quantized sampler (QuRL)
QUANT_UPDATE_VISIBLE = metric(
    "quant/update_visible_frac",
    "of the weight elements the last optimizer step changed, the fraction whose quantized code changed too "
    "(sparserl.train.update_visible)",
)

# held-out evaluation: logged at the step it ran, also written to eval-step<N>.json
EVAL_FILE = "eval-step{step:05d}.json"
EVAL_MODES = ("dense", "sparse")
EVAL_DENSE = metric("eval/dense/", "+ a statistic (pass@1, ...): held-out evaluation under dense inference")
EVAL_SPARSE = metric("eval/sparse/", "and under the sampler's compressed inference")


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
    return f"{REWARD_PART}{spec}"


def eval_metric(mode: str, stat: str = "pass@1") -> str:
    """``eval/dense/pass@1``: an evaluation figure under dense or sparse inference."""
    return f"eval/{mode}/{stat}"  # a member of EVAL_DENSE / EVAL_SPARSE


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
