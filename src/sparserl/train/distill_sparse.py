"""DistillSparse (Sparrow: Zhou et al., 2026, arXiv 2606.08446, docs/algorithms.md §3): LoRA weights φ on the
sparse sampler only, trained so that the sampler stays close to the dense policy at a sparser budget.

Each step, after the learner's update (θ frozen from here on), φ takes one AdamW step on

    L(φ) = L_PPO^sparse(φ) + λ · KL(q_φ ‖ p)

- ``q_φ``: the sparse sampler with weights θ + (α/r) B A, its log-probs of the step's sampled tokens from
  a replay of its attention: what each layer and KV head read at each decode step, recorded during the
  exact α's replay (:class:`sparserl.rollout.attended.AttendedPositions`), becomes a per-layer mask of one
  teacher-forced forward with gradients (:func:`replay_attention`) of a copy of the model carrying φ
  (``self.model``). The same tokens are read, so the forward is the sampler's computation (the test:
  equal log-probs), up to float rounding;
- ``L_PPO^sparse``: PPO-clip (:func:`~sparserl.train.losses.policy_loss`) on ``q_φ`` with the sampler's
  recorded log-probs as the behaviour policy and the step's advantages;
- ``KL(q_φ ‖ p)``: k3 on the sampled tokens (``low_var_kl``, :func:`~sparserl.train.losses.kl_penalty`),
  ``p`` the dense policy after the update (the learner's no-grad forward), λ = 0.001 by default.

The learner and the dense scorer never see φ: it lives on the copy, and only the sampler receives the
merged ``θ + (α/r) B A`` (:meth:`DistillSparse.sampler_weights`). The exact α is measured with φ
(``mismatch/alpha_p5``, the sampler that ran) and without (``mismatch/alpha_p5_nophi``, the same sampler
on θ alone, replayed again). φ and its optimizer are saved with each checkpoint and resumed.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.nn.functional as F

from .. import runlog as names
from ..batch import RolloutBatch
from ..rollout.attended import AttendedPositions, replay_masks
from ..score import score_logprobs, token_logprobs
from .lora import apply_lora, sampler_state
from .losses import agg_loss, kl_penalty, loss_normalizers, policy_loss

REPLAY_ATTENTION = "sparserl_replay"  # the attention interface name the copy's config holds
PHI_SEED = 20260606  # φ's A is drawn from its own generator: a run's other random numbers do not move


def replay_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    replay_masks: torch.Tensor | None = None,
    **kwargs,
):
    """A transformers attention function: softmax(q kᵀ · scaling, over the keys layer ``module.layer_idx``'s
    mask allows) v, with ``replay_masks`` bool [B, n_layers, Hkv, S, S] (each query head reads its KV head's
    mask); without masks, causal attention."""
    g = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(g, dim=1), value.repeat_interleave(g, dim=1)
    if replay_masks is None:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)
    else:
        mask = replay_masks[:, module.layer_idx].repeat_interleave(g, dim=1)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(REPLAY_ATTENTION, replay_attention)


class DistillSparse:
    """φ, its copy of the model and its optimizer (``algorithm.distill_sparse``: ``rank``, ``lambda``, ``lr``,
    ``alpha``, ``target``)."""

    def __init__(self, cfg, learner: torch.nn.Module):
        from transformers import AutoModelForCausalLM

        _register()
        ds, t = cfg.algorithm.distill_sparse, cfg.train
        self.cfg, self.options = cfg, ds
        dtype = next(learner.parameters()).dtype
        config = copy.deepcopy(learner.config)  # its own: the learner keeps its attention
        model = AutoModelForCausalLM.from_config(config, attn_implementation=REPLAY_ATTENTION, dtype=dtype).to(
            next(learner.parameters()).device
        )
        model.load_state_dict(sampler_state(learner), strict=False)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(PHI_SEED)
            self.model = apply_lora(
                model, ds.rank, ds.alpha, 0.0, ds.target, key="algorithm.distill_sparse.target"
            ).train()
        self.model.config._attn_implementation = REPLAY_ATTENTION
        self.phi = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.phi, lr=ds.lr, betas=tuple(t.betas), eps=t.eps, weight_decay=0.0)
        self.recorded: AttendedPositions | None = None

    # --- the weights ----------------------------------------------------------------------------------
    @torch.no_grad()
    def load_base(self, learner: torch.nn.Module) -> None:
        """θ: the learner's (merged) weights into the copy's frozen base layers."""
        state = sampler_state(learner)
        for name, param in self.model.named_parameters():
            if ".lora_" not in name:
                param.copy_(state[name.replace(".base_layer", "")])

    def base_weights(self, learner: torch.nn.Module) -> dict[str, torch.Tensor]:
        """θ alone (the learner's merged weights): the same sparse sampler without φ."""
        return sampler_state(learner)

    def sampler_weights(self, learner: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The sampler's weights: θ + (α / r) B A under the base model's names."""
        self.load_base(learner)
        return sampler_state(self.model)

    # --- the step -------------------------------------------------------------------------------------
    def recorder(
        self, prompt_ids: list[list[int]], response_ids: list[list[int]], n_layers: int, n_kv: int
    ) -> AttendedPositions:
        """A fresh recorder for this step's replay (kept for :meth:`step`)."""
        self.recorded = AttendedPositions(prompt_ids, response_ids, n_layers, n_kv)
        return self.recorded

    def logprobs(self, rows: list[int], T: int) -> torch.Tensor:
        """log q_φ [n, T] of the recorded responses ``rows`` (0 past each one's end), with gradients: one
        forward over ``prompt + response[:-1]`` with the recorded masks."""
        rec, dev = self.recorded, next(self.model.parameters()).device
        seqs = [rec.prompt_ids[i] + rec.response_ids[i][:-1] for i in rows]
        S = max(map(len, seqs))
        ids = torch.zeros(len(rows), S, dtype=torch.long)
        targets = torch.zeros(len(rows), T, dtype=torch.long)
        for n, (i, seq) in enumerate(zip(rows, seqs)):
            ids[n, : len(seq)] = torch.tensor(seq)
            targets[n, : len(rec.response_ids[i])] = torch.tensor(rec.response_ids[i])
        positions = torch.arange(S)[None].expand(len(rows), S)
        hidden = self.model.get_decoder()(
            input_ids=ids.to(dev),
            position_ids=positions.to(dev),
            use_cache=False,
            replay_masks=replay_masks(rec, rows).to(dev),
        ).last_hidden_state
        index = torch.stack([len(rec.prompt_ids[i]) - 1 + torch.arange(T) for i in rows]).clamp(max=S - 1)
        at = hidden.gather(1, index.to(dev)[..., None].expand(-1, -1, hidden.shape[-1]))  # [n, T, H]
        logits = self.model.lm_head(at)
        tau = self.cfg.rollout.temperature
        lp = token_logprobs(logits / tau if tau != 1.0 else logits, targets.to(dev))
        lengths = torch.tensor([len(rec.response_ids[i]) for i in rows], device=dev)
        return lp * (torch.arange(T, device=dev)[None] < lengths[:, None])

    def step(self, learner: torch.nn.Module, batch: RolloutBatch) -> dict:
        """One update of φ on the step's batch (rows in the recorded order), after the learner's update."""
        start = time.perf_counter()
        cfg, a, ds = self.cfg, self.cfg.algorithm, self.options
        self.load_base(learner)
        mask = batch.response_mask
        dense = score_logprobs(
            learner,
            batch,
            cfg.train.micro_batch_size,
            cfg.rollout.temperature,
            cfg.train.shared_prompt,
            cfg.train.max_tokens_per_micro_batch,
        )  # p: the updated dense policy, no grad
        norms = loss_normalizers(mask, a.loss_agg, max_len=cfg.rollout.max_new_tokens)
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "k3": 0.0, "pg": 0.0}
        N, T = batch.response_ids.shape
        for s in range(0, N, cfg.train.micro_batch_size):
            rows = list(range(s, min(N, s + cfg.train.micro_batch_size)))
            r = slice(rows[0], rows[-1] + 1)
            log_q = self.logprobs(rows, T)
            pg, _ = policy_loss(
                log_q,
                batch.sampler_logprobs[r],
                batch.advantages[r],
                mask[r],
                None,
                clip_eps=a.clip_eps,
                clip_eps_high=a.clip_eps_high,
                importance_sampling_level=a.importance_sampling_level,
                **norms,
            )
            k3 = kl_penalty(log_q, dense[r], "low_var_kl")
            kl = agg_loss(k3, mask[r], **norms)
            loss = pg + ds.lambda_ * kl
            loss.backward()
            sums["loss"] += float(loss.detach())
            sums["pg"] += float(pg.detach())
            sums["k3"] += float((k3.detach() * mask[r]).sum())
        norm = torch.nn.utils.clip_grad_norm_(self.phi, cfg.train.grad_clip or float("inf"))
        self.optimizer.step()
        self.recorded = None
        return {
            names.DISTILL_LOSS: sums["loss"],
            names.DISTILL_PG_LOSS: sums["pg"],
            names.DISTILL_K3: sums["k3"] / max(float(mask.sum()), 1.0),
            names.DISTILL_GRAD_NORM: float(norm),
            names.TIME_DISTILL: time.perf_counter() - start,
        }
