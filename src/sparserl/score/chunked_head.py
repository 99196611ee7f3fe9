"""Per-token log-prob and entropy straight from hidden states and the LM head, chunk by chunk.

With ``z = (h Wᵀ) / τ`` (``h`` a final hidden state, ``W`` the LM head ``[V, H]``, ``τ`` the sampling
temperature) and ``y`` the target token:

    log p(y) = z_y − logsumexp(z),      H = logsumexp(z) − Σ_v p_v z_v,      p = softmax(z).

The positions go through the head ``chunk_size`` at a time, in float32, so that at most one
``[chunk, V]`` block of logits (and its softmax) exists at once -- in the forward *and* in the
backward, which recomputes each chunk's logits from the saved ``h`` and ``W`` instead of keeping
every position's logits alive for autograd (the plain path keeps ``[positions, V]`` float32 logits
and their softmax: ~150 MiB each for 16 responses x 48 tokens of a 49k vocabulary). The gradients
with ``g`` the incoming gradients of log p(y) and of H:

    ∂/∂z_k = g_lp (1[k = y] − p_k) − g_H p_k (z_k − Σ_v p_v z_v),     ∂/∂logits = (∂/∂z) / τ,
    ∂/∂h = (∂/∂logits) W,     ∂/∂W = Σ_positions (∂/∂logits)ᵀ h.

(The same trick as Liger-Kernel's fused linear cross-entropy and verl's ``use_fused_kernels``.)

Under ``torch.autocast`` (the learner's mixed precision, :mod:`sparserl.models.mixed_precision`) the
products ``h Wᵀ``, ``(∂/∂logits) W`` and ``(∂/∂logits)ᵀ h`` run in autocast's dtype with float32
accumulation, in the backward too (which runs outside autocast), as autograd does for a plain
``Linear``; the softmax and the gradients' sums stay float32.
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK = 256  # positions per block: a [256, 49152] float32 block is 48 MiB


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] without materialising the full log-softmax: logit − logsumexp."""
    logits = logits.float()
    return logits.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(logits, dim=-1)


def _autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype autocast casts products to on ``device`` now, or None where it is off."""
    return torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 logits / τ of one block, as the plain path computes them (matmul in the model's dtype)."""
    z = (h @ weight.t()).float()
    if temperature > 0 and temperature != 1.0:
        z = z / temperature
    return z


class _HeadLogprobEntropy(torch.autograd.Function):
    """(log p(target) [N], entropy [N]) of hidden [N, H] through weight [V, H]; see the module docstring."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, chunk_size: int, with_entropy: bool):
        N = hidden.shape[0]
        ctx.compute_dtype = _autocast_dtype(hidden.device)
        # autocast casts an operand at every product, and autograd is off in here, so its cache of cast
        # weights is too: cast W once (the same values each chunk's product would have cast)
        weight_c = weight.to(ctx.compute_dtype) if ctx.compute_dtype is not None else weight
        logp = torch.empty(N, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(logp)
        mean_z = torch.zeros_like(logp)  # Σ p z (for the entropy and its gradient)
        for s in range(0, N, chunk_size):
            e = min(s + chunk_size, N)
            z = _chunk_logits(hidden[s:e], weight_c, temperature)
            if with_entropy:  # one exp pass gives both logsumexp and Σ p z
                top = z.amax(-1, keepdim=True)
                ez = (z - top).exp_()
                total = ez.sum(-1)
                lse[s:e] = top[:, 0] + total.log()
                with torch.autocast(hidden.device.type, enabled=False):  # a sum over the vocabulary: float32
                    mean_z[s:e] = torch.bmm(ez[:, None, :], z[:, :, None])[:, 0, 0] / total
                del ez
            else:
                lse[s:e] = torch.logsumexp(z, dim=-1)
            logp[s:e] = z.gather(-1, targets[s:e, None])[:, 0] - lse[s:e]
        del weight_c
        entropy = lse - mean_z if with_entropy else torch.zeros_like(logp)
        ctx.save_for_backward(hidden, weight, targets, lse, mean_z)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp, g_entropy):
        hidden, weight, targets, lse, mean_z = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk_size
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not ctx.with_entropy:
            g_entropy = None
        if (g_logp is None and g_entropy is None) or not (want_h or want_w):
            return None, None, None, None, None, None
        N = hidden.shape[0]
        dtype = ctx.compute_dtype or hidden.dtype  # the forward's products' dtype (autocast's, if it was on)
        hidden_c, weight_c = hidden.to(dtype), weight.to(dtype)
        scale = 1.0 / temperature if (temperature > 0 and temperature != 1.0) else 1.0
        g_lp = (g_logp if g_logp is not None else torch.zeros_like(lse)) * scale  # folded: ∂/∂logits = ∂/∂z / τ
        if g_entropy is not None:  # ∂/∂z = p (a + b z) with a = g_H Σpz − g_lp, b = −g_H; + g_lp at the target
            a = g_entropy * scale * mean_z - g_lp
            b = -g_entropy * scale
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        rows = torch.arange(min(chunk, N), device=hidden.device)
        for s in range(0, N, chunk):
            e = min(s + chunk, N)
            h = hidden_c[s:e]
            z = _chunk_logits(h, weight_c, temperature)
            if g_entropy is not None:
                p = (z - lse[s:e, None]).exp_()
                gz = z.mul_(b[s:e, None]).add_(a[s:e, None]).mul_(p)
                del p
            else:  # ∂/∂z = −g_lp p, in z's buffer
                gz = z.sub_(lse[s:e, None]).exp_().mul_(-g_lp[s:e, None])
            gz[rows[: e - s], targets[s:e]] += g_lp[s:e]
            if want_h:
                grad_h[s:e] = gz.to(dtype) @ weight_c
            if want_w:
                if dtype == torch.float32:
                    grad_w.addmm_(gz.t(), h)
                else:  # a 16-bit product, accumulated into the float32 sum
                    grad_w += gz.to(dtype).t() @ h
        return grad_h, (grad_w.to(weight.dtype) if want_w else None), None, None, None, None


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
    with_entropy: bool = False,
    entropy_grad: bool = False,
):
    """log softmax((h Wᵀ)/τ)[target] and (with ``with_entropy``) the entropy of softmax((h Wᵀ)/τ), for
    ``hidden [..., H]`` and ``targets [...]``, without materialising the logits of all positions at once
    (forward and backward). Returns ``(logp [...], entropy [...] or None)``, float32. The entropy carries
    a gradient only with ``entropy_grad`` (as in :func:`sparserl.score.forward_response`). ``temperature``
    0 or 1 means no scaling (the sampler's rule)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    shape = hidden.shape[:-1]
    h = hidden.reshape(-1, hidden.shape[-1])
    t = targets.reshape(-1).to(torch.long)
    logp, ent = _HeadLogprobEntropy.apply(h, weight, t, float(temperature), int(chunk_size), bool(with_entropy))
    logp = logp.reshape(shape)
    if not with_entropy:
        return logp, None
    ent = ent.reshape(shape)
    return logp, (ent if entropy_grad else ent.detach())
