"""The shared base of every KV compressor (kvpress-style: a method only writes ``score``).

A compressor decides, for one layer and a group of sequences, which cached tokens of the
*compressible region* survive. The cache (``sparserl.rollout.cache``) does the surgery once for all
methods: it calls :meth:`KVCompressor.select`, gathers the kept keys / values / positions into the
front of the region and frees the rest of the buffer for new tokens.

``select`` = ``score`` (the method's definition) + the rules common to all methods:
protected tokens (the observation window, attention sinks) get +inf, invalid slots (left padding)
get -inf, the top ``budget`` are kept and restored to position order.

Besides choosing tokens, a compressor decides the two things the cache asks it: when a sequence is
:meth:`~KVCompressor.due` for compression and how many slots the buffers need
(:meth:`~KVCompressor.capacity`). The dense cache is a compressor too (``none``,
:class:`sparserl.rollout.kv.none.Dense`): never due, capacity ``prompt + max_new``.

A method may instead keep every token and choose, at each decode step, which slots attention reads
(block top-k, :mod:`sparserl.rollout.kv.blocktopk`): it sets :attr:`KVCompressor.selects_per_step`,
is never due, sizes the buffers like dense and gives the cache an :meth:`~KVCompressor.attention_selector`.

Adding a method: a dataclass subclass in its own file with a docstring giving the formula and the
paper, a ``score()`` and ``@register("name")``; the parametrized test matrix in
``tests/test_kv_compressors.py`` picks it up.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from ...errors import SparserlError
from ...registry import Registry, did_you_mean
from .. import native
from ..gpu import triton_available
from .schedule import KVSchedule, ScheduleError, load_schedule

TRIGGERS = ("step_length", "newline")


class CompressorOptionError(SparserlError, ValueError):
    """A compressor option that is unknown or out of range; the message names the compressor, the
    option and what would be valid."""


@dataclass
class ScoreInputs:
    """What a compressor may look at for ``n`` (sequence, layer) pairs of equal cache length (the
    cache folds the layers it scores together into this batch dim, layer-major; every method scores
    each pair on its own).

    keys:      [n, Hkv, L, D]  all cached keys (post-RoPE), slots 0..L-1
    region:    slice of slots that may be compressed (``region.start`` .. L)
    valid:     [n, L] bool, False on left-padding slots
    queries:   [n, Hq, w, D] the last ``w`` queries (post-RoPE), oldest first, or None
    positions: [n, Hkv, L] the true token position of each slot
    attn_acc:  [n, Hkv, L] accumulated attention each slot received (H2O), or None
    """

    keys: torch.Tensor
    region: slice
    valid: torch.Tensor
    queries: torch.Tensor | None
    positions: torch.Tensor
    attn_acc: torch.Tensor | None = None

    @property
    def region_keys(self) -> torch.Tensor:
        return self.keys[:, :, self.region]


@dataclass
class KVCompressor:
    """Common options of every compressor.

    budget:          tokens kept per sequence, layer and KV head in the compressible region.
    trigger:         ``step_length``: compress when the region reaches ``budget + step_length``
                     tokens, i.e. every ``step_length`` decode steps once the cache exceeds the budget
                     (R-KV / Sparse-RL); ``newline``: also compress after a newline token once the
                     region exceeds the budget (R-KV's alternative).
    step_length:     the trigger period; the buffer holds at most ``budget + step_length`` tokens.
    compress_prompt: whether the prompt belongs to the compressible region (default: kept whole).
    window:          number of most recent tokens always kept (and, for attention-based methods,
                     the observation window of queries).
    tail_slack:      spare slots past ``budget + step_length`` so that a compression due when the
                     rest of the generation fits in them is skipped (:meth:`due`): at the end of a
                     generation a compression frees slots for a few tokens only, and cannot pay for
                     its scoring. 0 (default): the buffer is exactly ``budget + step_length``.
    """

    budget: int = 128
    trigger: str = "step_length"
    step_length: int = 128
    compress_prompt: bool = False
    window: int = 8
    tail_slack: int = 0
    schedule: KVSchedule | None = None

    name = "base"
    needs_queries = False  # keep a ring of the last `window` queries per layer
    needs_attention = False  # accumulate the attention every slot receives (H2O)
    per_head = True  # one index set per KV head (False: one per layer)
    #: keeps every token and chooses, at each decode step, which slots attention reads (block top-k:
    #: :meth:`attention_selector`) instead of evicting
    selects_per_step = False

    def __post_init__(self):
        self._resolve_schedule()
        self.validate()

    def _resolve_schedule(self) -> None:
        """Turn ``schedule`` into a :class:`KVSchedule` and ``budget`` into its largest (idempotent)."""
        if self.schedule is not None:
            try:
                self.schedule = load_schedule(self.schedule, self.name, source=f"{self.name}: schedule")
            except ScheduleError as e:
                raise CompressorOptionError(str(e)) from None
            self.budget = self.schedule.max_budget

    def set_schedule(self, schedule) -> None:
        """Replace the schedule (between rollouts: the online controller); checked like a new one."""
        self.schedule = schedule
        self._resolve_schedule()
        self.validate()

    @property
    def smallest_budget(self) -> int:
        """The smallest budget the compressor may keep (the schedule's smallest, else ``budget``)."""
        return self.schedule.min_budget if self.schedule is not None else self.budget

    def validate(self) -> None:
        if self.budget < 1:
            raise CompressorOptionError(f"{self.name}: kv budget must be >= 1, got {self.budget}")
        if self.trigger not in TRIGGERS:
            raise CompressorOptionError(f"{self.name}: unknown trigger {self.trigger!r}; expected one of {TRIGGERS}")
        if self.step_length < 1:
            raise CompressorOptionError(f"{self.name}: step_length must be >= 1, got {self.step_length}")
        if self.window < 0:
            raise CompressorOptionError(f"{self.name}: window must be >= 0, got {self.window}")
        if self.tail_slack < 0:
            raise CompressorOptionError(f"{self.name}: tail_slack must be >= 0, got {self.tail_slack}")
        if self.window >= self.smallest_budget:
            raise CompressorOptionError(
                f"{self.name}: kv budget ({self.smallest_budget}) must be larger than the observation window "
                f"({self.window})"
            )

    @property
    def compresses(self) -> bool:
        return True

    @property
    def evicts(self) -> bool:
        """Whether the method removes tokens from the cache (its buffers are then bounded by ``budget +
        step_length``); False for the dense cache and for methods that select per step."""
        return self.compresses and not self.selects_per_step

    def attention_selector(self, cache):
        """The per-generation state of a method that selects per step (:attr:`selects_per_step`), which
        the cache (:class:`~sparserl.rollout.cache.CompressedKVCache`, once its buffers hold the prompt)
        consults at every decode step: ``begin_step(cache)``, ``sparse(layer)``, ``attend(cache, layer,
        q)``, ``native_step(...)`` (the fused step, :mod:`sparserl.rollout.fused`), ``select(rows)``,
        ``attended(cache, layer)``. None (default): attention reads every cached slot."""
        return None

    @property
    def needs_newlines(self) -> bool:
        """Whether the engine must flag newline tokens (the ``newline`` trigger)."""
        return self.compresses and self.trigger == "newline"

    # --- what the cache asks -------------------------------------------------------------------
    def capacity(self, prompt_len: int, max_new: int) -> int:
        """Slots per sequence, layer and KV head that the cache's buffers hold (the one rule).

        The compressible region never exceeds ``budget + step_length + tail_slack`` tokens (``R``).
        With the prompt kept whole the buffer is ``prompt + min(max_new, R)``; with a compressible
        prompt it is ``min(R, prompt + max_new)``. Never more than dense."""
        period = self.budget + self.step_length + self.tail_slack
        if self.compress_prompt:
            return min(period, prompt_len + max_new)
        return prompt_len + min(max_new, period)

    def due(
        self,
        region_len: torch.Tensor,
        newline: torch.Tensor | None = None,
        remaining: int | None = None,
        seq_len: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Bool [B]: sequences to compress now, given the length of their compressible region and
        (``newline`` trigger) whether the token just written holds a newline. ``seq_len`` [B] (each
        sequence's length so far) gives a schedule's budget (:meth:`budget_for`); without it, or
        without a schedule, the budget is ``budget``.

        Skip rule (``remaining`` = tokens the engine will still write into the cache after this
        step, at most): a compression is skipped when the rest of the generation fits in the
        buffer without it, ``remaining <= tail_slack``. With ``tail_slack = 0`` that is a
        compression that frees slots no later token uses (after the last decode step); with the
        ``step_length`` trigger a sequence is due exactly when its region fills ``budget +
        step_length`` slots, so the region never exceeds ``budget + step_length + tail_slack``, the
        buffer (:meth:`capacity`). A larger ``tail_slack`` trades those slots for the last
        compressions of a generation, which cost a whole scoring for a few tokens. The ``newline``
        trigger's compressions before the buffer is full are the method's definition (cut at a
        thought boundary), not a need for room: they are kept while more than ``tail_slack``
        tokens follow."""
        budget = self.budget_for(seq_len) if seq_len is not None and self.schedule is not None else self.budget
        due = region_len >= budget + self.step_length
        if self.trigger == "newline" and newline is not None:
            due |= newline & (region_len > budget)
        if remaining is not None and remaining <= self.tail_slack:
            due = torch.zeros_like(due)
        return due

    def score_bytes(self, n: int, n_kv: int, n_heads: int, length: int, head_dim: int) -> int:
        """About how many bytes the scoring of ``n`` (sequence, layer) pairs of ``length`` slots
        holds at once (the cache scores as many layers together as fit its chunk bound). Default:
        float copies of the keys and values, and the window attention when the method uses it."""
        per = n_kv * length * (3 * head_dim + 16)
        if self.needs_queries:
            per += 12 * n_heads * self.window * length
        return n * per

    def budget_for(self, seq_len: int | torch.Tensor) -> int | torch.Tensor:
        """Budget at sequence length ``seq_len`` (prompt + tokens generated; an int or a [B] tensor):
        the schedule's (Sparrow), else the fixed ``budget``. The buffers hold the largest."""
        if self.schedule is not None:
            return self.schedule.budget_for(seq_len)
        if isinstance(seq_len, torch.Tensor):
            return torch.full_like(seq_len, self.budget)
        return self.budget

    # --- the method's definition -------------------------------------------------------------
    def score(self, inp: ScoreInputs) -> torch.Tensor:
        """Return a score per region slot, [n, Hkv, Lr] (higher = keep). Override."""
        raise NotImplementedError

    def protected(self, inp: ScoreInputs) -> torch.Tensor:
        """Bool [n, Lr]: region slots kept whatever their score. Default: the last ``window``."""
        n, lr = inp.valid.shape[0], inp.region.stop - inp.region.start
        prot = torch.zeros(n, lr, dtype=torch.bool, device=inp.valid.device)
        if self.window:
            prot[:, -self.window :] = True
        return prot

    # --- shared rules --------------------------------------------------------------------------
    def select(self, inp: ScoreInputs, keep: int) -> torch.Tensor:
        """Indices (into the region) of the ``keep`` slots that survive, [n, Hkv, keep], ascending."""
        scores = self.score(inp).float()
        n, hkv, lr = scores.shape
        if not self.per_head:
            scores = scores.sum(dim=1, keepdim=True)
        valid = inp.valid[:, inp.region]
        prot = self.protected(inp) & valid
        scores = scores.masked_fill(prot[:, None, :], float("inf"))
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
        # ties broken towards recent tokens, so that the choice is deterministic
        tiebreak = torch.arange(lr, device=scores.device, dtype=torch.float32) * 1e-12
        idx = torch.topk(scores + tiebreak, keep, dim=-1).indices
        idx, _ = torch.sort(idx, dim=-1)
        if idx.shape[1] != hkv:
            idx = idx.expand(n, hkv, keep)
        return idx

    def options(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# --- helpers shared by attention-based methods ---------------------------------------------------
def window_attention(inp: ScoreInputs, reduce_group: str = "max") -> torch.Tensor:
    """softmax(Q Kᵀ/√d) of the observation-window queries over all valid cached keys (causal inside
    the window, which occupies the last ``w`` slots), averaged over the window queries and reduced
    over the query heads of each GQA group. Returns [n, Hkv, L] in float32. On CPU (float32 or bf16 keys) the C
    kernel (``native/kv_scores.c``) computes it in one pass per query, on CUDA the Triton kernel
    (:mod:`sparserl.rollout.gpu.window_scores`); this torch code is their reference and the path elsewhere."""
    q, k = inp.queries, inp.keys
    if q is None:
        raise ValueError("this compressor needs the observation-window queries")
    fast = native.window_attention(q, k, inp.valid, reduce_group)
    if fast is not None:
        return fast
    if k.is_cuda and triton_available():  # the Triton kernel: no [w, L] scores written (sparserl.rollout.gpu)
        from ..gpu.window_scores import window_scores

        return window_scores(q.contiguous(), k.contiguous(), inp.valid, reduce_group, dot_f32=k.dtype == torch.float32)
    n, hq, w, d = q.shape
    hkv, L = k.shape[1], k.shape[2]
    g = hq // hkv
    qf = q.float().reshape(n, hkv, g * w, d)
    scores = torch.matmul(qf, k.float().transpose(-1, -2)).mul_(d**-0.5).view(n, hkv, g, w, L)
    # query i of the window sits at slot L - w + i and sees keys up to its own slot
    causal = torch.arange(L, device=k.device)[None, :] > torch.arange(L - w, L, device=k.device)[:, None]
    bias = torch.zeros(n, 1, 1, w, L, device=k.device).masked_fill_(causal, float("-inf"))
    bias.masked_fill_(~inp.valid[:, None, None, None, :], float("-inf"))
    attn = (scores + bias).softmax(dim=-1).nan_to_num_(0.0).mean(dim=3)  # [n, hkv, g, L]
    return attn.amax(dim=2) if reduce_group == "max" else attn.mean(dim=2)


def pool1d(x: torch.Tensor, kernel: int, kind: str = "max") -> torch.Tensor:
    """Same-length 1-D pooling over the last dim of [n, h, L] (odd kernel; 1 = identity)."""
    if kernel <= 1:
        return x
    n, h, L = x.shape
    flat = x.reshape(n * h, 1, L)
    pad = kernel // 2
    if kind == "max":
        out = F.max_pool1d(flat, kernel, stride=1, padding=pad)
    else:
        out = F.avg_pool1d(flat, kernel, stride=1, padding=pad, count_include_pad=False)
    return out[..., :L].reshape(n, h, L)


COMPRESSORS: Registry[type[KVCompressor]] = Registry("compressor")


def register(name: str):
    """Class decorator: register a compressor under ``name`` (also its ``name`` attribute)."""

    def deco(cls):
        cls.name = name
        return COMPRESSORS.register(name)(cls)

    return deco


def available_compressors() -> list[str]:
    """Every compressor name, ``none`` (dense) included: the one list the config and CLI use."""
    return COMPRESSORS.names()


def option_names(name: str) -> list[str]:
    """The options compressor ``name`` accepts (its dataclass fields)."""
    return sorted(f.name for f in fields(COMPRESSORS.get(name)))


def get_compressor(name: str, **options) -> KVCompressor:
    """Build a compressor by name with its own option names (``budget``, ``window``, ``lam``...).
    ``none`` gives the dense null compressor. Unknown names raise
    :class:`~sparserl.registry.UnknownNameError`, unknown or bad options
    :class:`CompressorOptionError` (both ``ValueError`` s)."""
    cls = COMPRESSORS.get(name)
    known = option_names(name)
    bad = sorted(set(options) - set(known))
    if bad:
        named = ", ".join(f"{o!r}{did_you_mean(o, known)}" for o in bad)
        raise CompressorOptionError(
            f"compressor {name!r}: unknown option{'s' if len(bad) > 1 else ''} "
            f"{named}; valid options: {', '.join(known)}"
        )
    try:
        return cls(**options)
    except TypeError as e:  # a value of the wrong type (e.g. a string budget)
        raise CompressorOptionError(f"compressor {name!r}: bad option value ({e}); options given: {options}") from None
