"""The training process's peak resident memory, predicted from the config and the model's shape alone
(no weight loaded): :func:`predict_peak`.

    peak = resident + max over the step's stations

Resident for the whole run (bytes; P parameters, P_t of them trained, w bytes per weight):

- the process's baseline: Python, torch, transformers and sparserl imported (:data:`BASELINE_BYTES`,
  measured on an idle process);
- the learner: its weights P w, gradients P_t w and AdamW's two moments 2 P_t w (LoRA trains only its
  adapters: P_t = r (in + out) per adapted linear);
- the sampler's weights in ``rollout.dtype``: a float32 sampler over a float32 learner shares the
  embedding, o and down and keeps its fused q/k/v and gate/up; another dtype copies every weight;
  ``rollout.quant`` stores the layers' linears in one byte (:func:`sampler_bytes`);
- the reference model P w when ``algorithm.kl_coef`` > 0.

The stations of a step (N = ``prompts_per_step`` × ``rollout.n`` responses, L_in the prompt's tokens,
T = ``rollout.max_new_tokens``), each holding its own buffers on top of the resident parts:

- rollout: the KV cache N × capacity × kv bytes a token (:meth:`KVCompressor.capacity`,
  :func:`~sparserl.rollout.kv_quant.kv_bytes_per_token`), the prefill's widest layer, the sampling's
  [N, V] float32 buffers, and what the sampler keeps for α: its distributions q [N, T, V] float32
  (``mismatch.alpha_q=kept`` within ``alpha_record_mib``) or its hidden states [N, T, H] float32 (``hidden``);
  under ``rollout.oversample`` m responses a prompt, not n;
- the dense fallback (``rollout.dense_fallback``): at the most every row again, on a dense cache;
- old-policy scoring (no grad; when the old policy's log-probs come from a scoring forward): the kept q or
  sampler hidden states, p's hidden states [N, T, H] float32 kept for α, one layer's forward over a
  micro-batch and the chunked head's [chunk, V] float32 blocks;
- α: the kept q (or, replayed, the sampler's KV cache again), p's and the sampler's hidden states and the
  head's blocks;
- update: autograd's saved tensors for one micro-batch (:mod:`.activations`: per token and layer, or one
  hidden state per layer boundary plus one layer's under gradient checkpointing), autocast's bfloat16
  weight copies, the backward's gradients of one layer's activations, the head's blocks, p's hidden
  states (the step holds the old policy's until it ends), and the allocator's slack: the freed blocks glibc
  keeps resident inside the micro-batch (:data:`ALLOCATOR_SLACK` of the activations it allocates). With the
  old policy from the update's own forward, α runs between that forward and its backward: the α station then
  holds the update's graph (saved tensors and weight copies) beside α's buffers, and the backward starts after
  α freed them.

A micro-batch holds at most ``train.micro_batch_size`` rows and, with ``train.max_tokens_per_micro_batch``,
at most that many tokens (:func:`~sparserl.packing.worst_case_tokens`, as the packing counts them).
``auto`` values not known before the run starts (``model.mixed_precision``, ``rollout.dtype``,
``train.gradient_checkpointing``) are taken as the larger of their outcomes, checkpointing as on only
when the prediction without it does not fit :func:`~.limit.memory_limit`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import Config
from ..cost import ModelShape
from ..packing import micro_batch_rows, worst_case_tokens
from ..rollout.build import sampler_section
from ..rollout.kv import compressor_from_fields
from ..rollout.kv_quant import kv_bytes_per_token
from .activations import autocast_weight_bytes, checkpointed_layer_bytes, layer_forward_bytes, saved_layer_bytes

__all__ = ["BASELINE_BYTES", "HEAD_CHUNK", "MemoryPrediction", "predict_peak", "rollout_row_bytes", "sampler_bytes"]

#: an idle process's resident memory after importing torch 2.13, transformers 5.24 and sparserl's trainer
#: (2-core AVX512/AMX Xeon; ``experiments/training/memory_prediction.py --baseline``)
BASELINE_BYTES = 415_000_000
#: positions per block of the chunked LM head (:data:`sparserl.score.chunked_head.DEFAULT_CHUNK`)
HEAD_CHUNK = 256
#: float32 [chunk, V] blocks alive at once in the chunked head: logits, their softmax, the gradient
HEAD_BLOCKS = 3
#: float32 [N, V] buffers a decode step's sampling holds: the logits, tempered, their softmax, a copy
SAMPLING_BUFFERS = 4
#: the backward's transient over the saved tensors: gradients of about this many layers' activations
BACKWARD_LAYERS = 1.0
#: freed heap blocks glibc keeps resident inside one micro-batch's forward and backward (where no trim runs:
#: :mod:`.allocator`), as a fraction of the activations that micro-batch allocates (tokens x layers x the saved
#: bytes of a layer, checkpointed or not). Measured on SmolLM2-135M at micro-batches of ~4,096 tokens, the step's
#: peak less the same step's under glibc's mmap threshold at 1 MiB (which leaves no holes): 1.2 GB for the dense
#: long job, 1.3 GB for the main job under gradient checkpointing, 21-23% of 5.7 GB (docs/results/main_job_memory/)
ALLOCATOR_SLACK = 0.25
GB = 1e9


@dataclass
class MemoryPrediction:
    """Resident parts and each station's parts, in bytes; :attr:`peak` = resident + the largest station."""

    resident: dict[str, int]
    stations: dict[str, dict[str, int]]
    checkpointing: bool = False
    notes: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None  # the longest prompt the prediction assumed

    @property
    def largest_station(self) -> str:
        return max(self.stations, key=lambda s: sum(self.stations[s].values()))

    @property
    def peak(self) -> int:
        return sum(self.resident.values()) + sum(self.stations[self.largest_station].values())

    def parts(self) -> dict[str, int]:
        """The peak's parts: the resident ones, then the largest station's (named ``station: part``)."""
        s = self.largest_station
        return {**self.resident, **{f"{s}: {k}": v for k, v in self.stations[s].items()}}

    def largest_parts(self, k: int = 3) -> list[tuple[str, int]]:
        return sorted(self.parts().items(), key=lambda kv: -kv[1])[:k]

    def summary(self, k: int = 3) -> str:
        """``11.2 GB (update: activations 5.0 GB, learner + AdamW ...)``: the peak and its ``k`` largest parts."""
        parts = ", ".join(f"{name} {v / GB:.2f}" for name, v in self.largest_parts(k))
        return f"{self.peak / GB:.2f} GB at the {self.largest_station} (largest parts, GB: {parts})"


def _bytes(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]


def _lora_params(shape: ModelShape, rank: int, target) -> int:
    """Trained parameters of LoRA adapters of rank ``rank`` on every layer's ``target`` linears."""
    H, I, q, kv = shape.hidden, shape.intermediate, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    dims = {
        "q_proj": (H, q),
        "k_proj": (H, kv),
        "v_proj": (H, kv),
        "o_proj": (q, H),
        "gate_proj": (H, I),
        "up_proj": (H, I),
        "down_proj": (I, H),
    }
    names = dims if target == "all-linear" else [t for t in target if t in dims]
    return shape.layers * sum(rank * sum(dims[n]) for n in names)


def sampler_bytes(shape: ModelShape, learner_dtype: str, sampler_dtype: str, r) -> int:
    """The sampler's own weight bytes beside the learner's (``r``: the ``rollout`` section). Same dtype as
    the learner: its fused q/k/v and gate/up are copies, the rest are the learner's tensors. Another
    dtype: every weight again. ``rollout.quant``: the layers' linears in one byte with a float32 scale
    per output row (per group of ``quant_group`` inputs for int8_group), its outlier channels in float32;
    the LM head too with ``quant_head``; ``fp32_head`` under a half-precision sampler: the head again in float32,
    twice (its packed copy)."""
    sb = _bytes(sampler_dtype)
    q, kv, H, I = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.hidden, shape.intermediate
    fused = shape.layers * ((q + 2 * kv) * H + 2 * I * H)
    head = shape.vocab * H
    others = shape.params - shape.layers * shape.layer_weights  # embedding, untied head, norms, biases
    # fp32_head: a float32 copy beside the embedding, and its packed copy for the decode kernel
    fp32_head = 8 * head if r.fp32_head and sampler_dtype != "float32" else 0
    if r.quant == "none":
        return (fused * sb if sampler_dtype == learner_dtype else shape.params * sb) + fp32_head
    rows = shape.layers * ((q + 2 * kv) + H + 2 * I + H)  # output rows of qkv, o, gate_up, down
    scales = 4 * rows
    if r.quant == "int8_group":
        scales = 4 * shape.layer_weights * shape.layers // max(1, r.quant_group)
    outliers = 4 * rows * r.quant_outliers
    linears = shape.layers * shape.layer_weights + scales + outliers
    rest = 0 if sampler_dtype == learner_dtype else others * sb
    if r.quant_head:
        linears += head + 4 * shape.vocab
        if sampler_dtype != learner_dtype and not shape.tied_embeddings:
            rest -= head * sb
    return linears + rest + fp32_head


def predict_peak(cfg: Config, shape: ModelShape, prompt_tokens: int) -> MemoryPrediction:
    """The peak resident bytes of a ``sparserl train`` process running ``cfg`` on a model of ``shape``
    whose prompts are at most ``prompt_tokens`` tokens (the module docstring). ``auto`` choices not
    known before the run are taken as the larger outcome (the checkpointing one as the run decides it)."""
    precisions = ["off", "bfloat16"] if cfg.model.mixed_precision == "auto" else [cfg.model.mixed_precision]
    if cfg.model.dtype != "float32":
        precisions = ["off"]
    r = sampler_section(cfg)
    dtypes = ["float32", "bfloat16"] if r.dtype == "auto" else [r.dtype]
    best = None
    for precision in precisions:
        for dtype in dtypes:
            p = _predict_resolved(cfg, shape, prompt_tokens, precision, dtype)
            if best is None or p.peak > best.peak:
                best = p
    return best


def _predict_resolved(cfg: Config, shape: ModelShape, prompt_tokens: int, precision: str, dtype: str):
    ckpt = cfg.train.gradient_checkpointing
    if ckpt == "auto":
        from .limit import memory_limit

        off = _predict(cfg, shape, prompt_tokens, precision, dtype, False)
        if off.peak <= memory_limit(cfg)[0]:
            return off
        return _predict(cfg, shape, prompt_tokens, precision, dtype, True)
    return _predict(cfg, shape, prompt_tokens, precision, dtype, bool(ckpt))


def _old_policy_source(
    cfg: Config, compresses: bool, dtype: str, learner_dtype: str, fits_one: bool, prompt_tokens: int
) -> str:
    """``sampler`` | ``update`` | ``score``: where the run's old-policy log-probs come from
    (:func:`sparserl.score.old_logprobs_source` on what the config says)."""
    from ..score.old_policy import OldLogprobsError, old_logprobs_source

    r = cfg.rollout
    try:
        kind = old_logprobs_source(
            cfg.algorithm.old_logprobs,
            why_not_update=cfg.why_update_forward_is_not_old_policy(prompt_tokens=prompt_tokens),
            compresses=compresses,
            sampler_dtype=dtype,
            learner_dtype=learner_dtype,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            quantized=r.quantized,
            lagged=r.async_,
        )
    except OldLogprobsError:  # refused when the trainer is built; the prediction assumes a scoring forward
        return "score"
    return "score" if kind == "update" and not fits_one else kind


def _micro_batch(cfg: Config, rows_max: int, prompt_tokens: int, T: int, shared: bool) -> tuple[int, int, int]:
    """(rows, tokens, keys) of the largest micro-batch: at most ``train.micro_batch_size`` rows of a
    mini-batch of ``rows_max`` and at most ``train.max_tokens_per_micro_batch`` tokens."""
    t, n = cfg.train, cfg.rollout.n
    rows = max(1, min(t.micro_batch_size, rows_max))

    def tokens(k: int) -> int:
        return worst_case_tokens(k, -(-k // n), prompt_tokens, T, shared)

    while rows > 1 and t.max_tokens_per_micro_batch is not None and tokens(rows) > t.max_tokens_per_micro_batch:
        rows -= 1
    return rows, tokens(rows), prompt_tokens + T


def rollout_row_bytes(shape: ModelShape, compressor, prompt_tokens: int, max_new: int, dtype: str, kv_quant: str):
    """What one response holds on the sampler's device while it is generated (the rollout station per row, less
    what α keeps): its KV cache at the compressor's capacity (``compressor.capacity``: a bounded cache holds
    budget + step length, a dense one prompt + ``max_new``), its share of the prefill's widest layer and the
    sampling's [V] float32 buffers. ``dtype``: the sampler's (``float32 | bfloat16 | float16``)."""
    P, T = prompt_tokens, max_new
    per_token = kv_bytes_per_token(shape.layers, shape.kv_heads, shape.head_dim, _torch_dtype(dtype), kv_quant)
    sb = _bytes(dtype)
    return {
        "KV cache": compressor.capacity(P, T) * per_token,
        "prefill layer": P * layer_forward_bytes(shape, sb, sb, P),
        "sampling buffers": SAMPLING_BUFFERS * shape.vocab * 4,
    }


def _predict(cfg: Config, shape: ModelShape, prompt_tokens: int, precision: str, dtype: str, ckpt: bool):
    t, a, m = cfg.train, cfg.algorithm, cfg.mismatch
    r = sampler_section(cfg).model_copy(update={"dtype": dtype})
    wb = _bytes(cfg.model.dtype)
    autocast = precision == "bfloat16"
    compute = 2 if autocast or wb == 2 else 4
    H, V, T, P = shape.hidden, shape.vocab, r.max_new_tokens, prompt_tokens
    N = t.prompts_per_step * r.n
    N_sampled = t.prompts_per_step * (r.oversample or r.n)  # rollout.oversample: more sampled than trained
    trained = _lora_params(shape, t.lora_rank, t.lora_target) if t.lora_rank else shape.params

    resident = {
        "baseline": BASELINE_BYTES,
        "learner weights": shape.params * wb + (trained * wb if t.lora_rank else 0),
        "gradients": trained * wb,
        "AdamW moments": 2 * trained * wb,
        "sampler weights": sampler_bytes(shape, cfg.model.dtype, dtype, r),
    }
    if a.kl_coef > 0:
        resident["reference"] = shape.params * wb

    # the sampler's KV cache: every response's buffers at the compressor's capacity
    if r.kv_controller is not None:  # the buffers hold the controller's ceiling
        r = r.model_copy(update={"kv_budget": max(r.kv_budget, r.kv_controller.max_budget)})
    comp = compressor_from_fields(r)

    # what the sampler keeps for the exact α
    exact = m.alpha == "exact"
    q_bytes = N_sampled * T * V * 4
    keeps_q = (
        exact and cfg.algorithm.distill_sparse is None and m.alpha_q == "kept" and q_bytes <= m.alpha_record_mib * 2**20
    )
    keeps_h = exact and cfg.algorithm.distill_sparse is None and m.alpha_q == "hidden"
    kept = {"kept q": q_bytes} if keeps_q else {"sampler hidden states": N_sampled * T * H * 4} if keeps_h else {}
    row = rollout_row_bytes(shape, comp, P, T, dtype, r.kv_quant)
    rollout = {**{part: N_sampled * b for part, b in row.items()}, **kept}
    kv = rollout["KV cache"]

    # micro-batches of the scoring and the update; a checkpointed grad forward runs every row whole
    # (sparserl.score.shared_prompt.shares_prompt_with_grad)
    shared = t.shared_prompt and not ckpt
    mini = min(N, (t.mini_batch_prompts or t.prompts_per_step) * r.n)
    rows, tokens, keys = _micro_batch(cfg, mini, P, T, shared)
    whole = worst_case_tokens(N, t.prompts_per_step, P, T, shared)
    fits_one = t.max_tokens_per_micro_batch is None or whole <= t.max_tokens_per_micro_batch
    source = _old_policy_source(
        cfg, comp.compresses, dtype, "bfloat16" if autocast else cfg.model.dtype, fits_one and mini == N, P
    )
    head_blocks = HEAD_BLOCKS * HEAD_CHUNK * V * 4
    p_hidden = {"p hidden states": N * T * H * 4} if m.alpha != "off" else {}
    stations: dict[str, dict[str, int]] = {"rollout": rollout}
    if r.dense_fallback:  # Sparrow's dense fallback: every group re-sampled on a dense cache, at the most
        dense = rollout_row_bytes(shape, compressor_from_fields(r, name="none"), P, T, dtype, r.kv_quant)
        stations["dense fallback"] = {f"dense {part}": N * b for part, b in dense.items()}
    if source == "score":
        stations["old-policy scoring"] = {
            **kept,
            **({"p hidden states": N_sampled * T * H * 4} if p_hidden else {}),  # every sampled response's
            "layer forward": tokens * layer_forward_bytes(shape, wb, compute, keys),
            "head blocks": head_blocks,
        }
    alpha: dict[str, int] = {}
    if exact:
        alpha = {
            **(kept if kept else {"replayed KV cache": kv, "sampling buffers": SAMPLING_BUFFERS * N * V * 4}),
            **p_hidden,
            "head blocks": 2 * head_blocks,
        }
        stations["alpha"] = alpha

    # the update: one micro-batch under autograd
    if source == "update":
        rows, tokens = N, whole
    layer = saved_layer_bytes(shape, wb, compute, keys, autocast)
    per_token_outside = 4 * H * 4 + 2 * shape.head_dim * 4  # embedding, final norm, head input, rotary
    if ckpt:
        activations = tokens * (shape.layers * checkpointed_layer_bytes(shape, wb) + layer)
    else:
        activations = tokens * shape.layers * layer
    graph = {"activations": activations + tokens * per_token_outside}
    if autocast:
        graph["bf16 weight copies"] = autocast_weight_bytes(shape) + 2 * V * H
    # the step holds p's hidden states (the old policy's) until it ends; α's other buffers are freed before
    # the update (sparserl.train.step.train_step)
    stations["update"] = {
        **graph,
        "backward": int(BACKWARD_LAYERS * tokens * layer),
        "allocator slack": int(ALLOCATOR_SLACK * tokens * shape.layers * layer),
        "head blocks": head_blocks,
        **p_hidden,
    }
    if source == "update" and alpha:  # α runs between the update's forward and its backward, beside its graph
        stations["alpha"] = {**{f"update {k}": v for k, v in graph.items()}, **alpha}
    notes = [f"prompts of at most {P} tokens", f"old policy: {source}", f"micro-batch: {rows} rows, {tokens} tokens"]
    if cfg.cluster.rollout_workers and cfg.cluster.address is None:  # a local Ray: all of it on this machine
        resident.update(local_cluster_bytes(cfg, shape, r, row, kept, N_sampled, P))
        notes.append(f"a local Ray: {cfg.cluster.rollout_workers} rollout worker(s) and the pushes in its object store")
    return MemoryPrediction(resident, stations, ckpt, notes, P)


def local_cluster_bytes(
    cfg: Config, shape: ModelShape, r, row: dict[str, int], kept: dict[str, int], N: int, prompt_tokens: int
):
    """What a local Ray holds beside the training process, for the run (``cluster.rollout_workers`` = W,
    ``cluster.address`` None), in bytes:

    - each rollout worker's process: the baseline, the model it loads (``model.dtype``), its sampler's weights, a
      push being loaded, and its shard of ⌈N / W⌉ responses: their KV caches and sampling buffers for each
      rollout sampling at once (1, or under ``rollout.partial`` the k = ``rollout.max_staleness`` rollouts in
      flight, each keeping its cache between segments) and what α keeps (head inputs or q) for the k + 1
      rollouts it may hold until they are taken; under ``rollout.async`` the reading of a finished rollout on a
      dense cache with its weights: a micro-batch's logits and their log-softmax, two float32 [rows, T, V]
      blocks (rows bounded by ``train.max_tokens_per_micro_batch``), and its hidden states;
    - Ray's object store: the latest max(2, k + 1) weight pushes (:attr:`sparserl.cluster.pool.RolloutPool.keep`),
      each the learner's state dict (a tied head counted again: it is serialized as an entry of its own)."""
    W, k = cfg.cluster.rollout_workers, r.max_staleness if r.async_ else 0
    # a push serializes every state-dict entry: a tied LM head travels as a tensor of its own (measured: 651 MB an
    # object for SmolLM2-135M in float32, its 538 MB of parameters and the 113 MB head again)
    push = (shape.params + (shape.vocab * shape.hidden if shape.tied_embeddings else 0)) * _bytes(cfg.model.dtype)
    shard = -(-N // W)
    sampling = k if (r.partial and k > 1) else 1
    T, t = r.max_new_tokens, cfg.train
    rows = min(shard, micro_batch_rows(t.micro_batch_size, t.max_tokens_per_micro_batch, prompt_tokens + T))
    reading = rows * (2 * T * shape.vocab + (prompt_tokens + T) * shape.hidden) * 4 if r.async_ else 0
    worker = (
        BASELINE_BYTES
        + 2 * push  # the model it loads and a push being loaded
        + sampler_bytes(shape, cfg.model.dtype, r.dtype, r)
        + sampling * shard * sum(row.values())
        + (k + 1) * shard * sum(kept.values()) // N
        + reading
    )
    return {
        f"rollout workers ({W})": W * worker,
        f"object store: {max(2, k + 1)} weight pushes": max(2, k + 1) * push,
    }


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)
