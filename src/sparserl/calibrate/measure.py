"""Exact α per (compressor, budget, sequence-length bin): the rows ``sparserl calibrate`` searches.

Two ways to get the tokens α is measured on (``tokens``):

- ``sampler`` (Sparrow's): each sparse sampler samples its own responses and keeps ``q``, the
  distribution each token was drawn from, while it samples (:func:`sparserl.mismatch.exact_alpha.recorded_alpha`)
  when the batch's fits in ``record_mib`` (:func:`sparserl.mismatch.exact_alpha.distributions_fit`, as training's
  ``mismatch.alpha_record_mib``). Otherwise its replay on them (:func:`sparserl.mismatch.exact_alpha.exact_alpha`)
  hands ``q`` over and is checked against the log-probs it recorded while sampling (``replay_err``, 0
  when the replay reproduced it): the same ``q`` at the cost of about one more generation. The dense
  policy's ``p`` comes from one forward over each sampler's responses.
- ``dense``: the dense policy samples once; every sparse sampler is replayed forced on those tokens
  (one dense forward in all). Every sampler is judged on the same text, at the price of judging it off
  its own path; there is no recorded log-prob to check the replay against (``replay_err`` null).

A token drawn after ``L`` tokens of prompt and response (:func:`~sparserl.mismatch.acceptance.token_seq_len`) falls
in bin ``[k·W, (k+1)·W)`` with ``k = L // W``: the axis of a schedule's lengths.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..batch import RolloutBatch
from ..mismatch.acceptance import tail_by_bin, token_seq_len
from ..mismatch.exact_alpha import distributions_fit, exact_alpha, recorded_alpha
from ..rollout.engine import RolloutEngine, RolloutOutput
from ..rollout.kv.base import KVCompressor
from ..rollout.sampling import SamplingParams
from ..score.hidden import dense_hidden, dense_hidden_shared
from ..score.shared_prompt import lm_head_weight

TOKENS = ("sampler", "dense")


@dataclass
class Measurement:
    """What :func:`measure` found: the α rows, and per sampler its replay check and sampling speed."""

    rows: list[dict] = field(default_factory=list)
    samplers: list[dict] = field(default_factory=list)

    @property
    def replay_err_max(self) -> float | None:
        errs = [s["replay_err"] for s in self.samplers if s["replay_err"] is not None]
        return max(errs) if errs else None


def bin_rows(alpha: torch.Tensor, seq_len: torch.Tensor, mask: torch.Tensor, bin_width: int) -> list[dict]:
    """One row per length bin that holds tokens: ``bin_start``, ``bin_end`` (exclusive), ``alpha_mean``,
    ``alpha_p5`` (5th percentile) and ``n_tokens``, over the tokens where ``mask`` holds."""
    valid = mask.bool()
    a, lengths = alpha[valid].double(), seq_len[valid]
    rows = []
    for start, (p5, n) in tail_by_bin(alpha, seq_len, mask, bin_width).items():
        sel = a[(lengths >= start) & (lengths < start + bin_width)]
        rows.append(
            {
                "bin_start": start,
                "bin_end": start + bin_width,
                "alpha_mean": float(sel.mean()),
                "alpha_p5": p5,
                "n_tokens": n,
            }
        )
    return rows


def _alpha_of(
    engine: RolloutEngine,
    model,
    out: RolloutOutput,
    params: SamplingParams,
    recorded: bool,
    micro_batch_size: int,
    shared_prompt: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float | None]:
    """(α [N, T], seq_len [N, T], mask [N, T], replay error) of ``engine`` on ``out``'s tokens: from the
    distributions ``out`` kept (replay error None), else ``engine`` replayed on them. ``p``'s hidden states come
    from one forward with each distinct prompt forwarded once (``shared_prompt``), else over every row whole."""
    dev = next(model.parameters()).device
    pad = engine.tokenizer.pad_token_id or 0
    batch = RolloutBatch.from_rollout(
        out.prompt_ids, out.response_ids, out.sampler_logprobs, out.prompt_index, pad_id=pad
    ).to(dev)
    T = batch.response_ids.shape[1]
    hidden = (
        dense_hidden_shared(model, batch, micro_batch_size)
        if shared_prompt
        else dense_hidden(model, batch.input_ids, batch.attention_mask, batch.position_ids, T, micro_batch_size)
    )
    tau = params.temperature if params.temperature > 0 else 1.0
    if out.distributions is not None:
        alpha, err = recorded_alpha(out.distributions, hidden, lm_head_weight(model), tau), None
        out.distributions = None  # read: freed before the next sampler
    else:
        alpha, err = exact_alpha(
            engine,
            out.prompt_ids,
            out.response_ids,
            params,
            hidden,
            lm_head_weight(model),
            tau,
            recorded=batch.sampler_logprobs if recorded else None,
        )
    return alpha, token_seq_len(out.prompt_ids, T), batch.response_mask.cpu(), err


@torch.no_grad()
def measure(
    dense_engine: RolloutEngine,
    model,
    samplers: list[tuple[str, int, KVCompressor]],
    prompt_ids: list[list[int]],
    params: SamplingParams,
    bin_width: int,
    tokens: str = "sampler",
    micro_batch_size: int = 16,
    log: Callable[[str], None] = print,
    dense_out: RolloutOutput | None = None,
    record_mib: int = 2048,
    shared_prompt: bool = True,
) -> Measurement:
    """α rows of every ``(compressor name, budget, compressor)`` in ``samplers`` against the dense
    ``model`` (a transformers causal LM, the policy ``p``), on ``params.n`` responses to each of
    ``prompt_ids``. ``dense_engine``: the dense sampler over the same weights (the others share them,
    :meth:`RolloutEngine.from_engine`). ``tokens``: ``sampler`` or ``dense`` (module docstring); with
    ``dense``, ``dense_out`` gives tokens sampled already (e.g. by other weights: a paired comparison).
    ``record_mib``: the largest ``q`` a sampler keeps while it samples (``sampler`` tokens; 0: always replay).
    ``shared_prompt``: ``p``'s forward takes each distinct prompt once (:func:`_alpha_of`)."""
    if tokens not in TOKENS:
        raise ValueError(f"tokens={tokens!r}; expected one of {', '.join(TOKENS)}")
    result = Measurement()
    if tokens == "dense" and dense_out is None:
        dense_out = dense_engine.generate([], params, prompt_ids=prompt_ids)
        log(f"dense: {dense_out.tokens_generated} tokens sampled ({dense_out.tokens_per_s:.1f} tok/s)")
    vocab = lm_head_weight(model).shape[0]
    keep = tokens == "sampler" and distributions_fit(
        len(prompt_ids) * params.n, params.max_new_tokens, vocab, record_mib
    )
    sampling = dataclasses.replace(params, keep_distributions=keep)
    for name, budget, comp in samplers:
        t0 = time.perf_counter()
        engine = RolloutEngine.from_engine(dense_engine, comp)
        dense_out = dense_out if tokens == "dense" else None
        out = dense_out if dense_out is not None else engine.generate([], sampling, prompt_ids=prompt_ids)
        alpha, seq_len, mask, err = _alpha_of(
            engine,
            model,
            out,
            params,
            recorded=dense_out is None,
            micro_batch_size=micro_batch_size,
            shared_prompt=shared_prompt,
        )
        rows = [{"compressor": name, "budget": budget, **r} for r in bin_rows(alpha, seq_len, mask, bin_width)]
        result.rows += rows
        a = alpha[mask.bool()]
        p5 = float(torch.quantile(a, 0.05)) if a.numel() else float("nan")
        result.samplers.append(
            {
                "compressor": name,
                "budget": budget,
                "tokens": int(mask.sum()),
                "replay_err": err,
                "q": "kept" if keep else "replayed" if tokens == "sampler" else "replayed on dense tokens",
                "alpha_mean": float(a.mean()) if a.numel() else float("nan"),
                "alpha_p5": p5,
                "tokens_per_s": out.tokens_per_s if dense_out is None else None,
                "kv_compressions": out.kv.compressions if dense_out is None else None,
                "seconds": time.perf_counter() - t0,
            }
        )
        log(
            f"{name} budget {budget}: {int(mask.sum())} tokens, α mean {float(a.mean()):.4f} p5 {p5:.4f}"
            + (f", replay err {err:.2e}" if err is not None else ", q kept while sampling" if keep else "")
            + f" ({time.perf_counter() - t0:.1f}s)"
        )
    return result
