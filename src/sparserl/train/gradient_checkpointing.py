"""Gradient checkpointing of the learner (``train.gradient_checkpointing``): each decoder layer keeps only
its input in a forward with gradients and recomputes its activations in the backward, trading ~1/3 more
learner compute for the activations of every layer but one."""

from __future__ import annotations

from ..config import Config
from ..score.shared_prompt import checkpoints_activations


def gradient_checkpointing_wanted(cfg: Config, learner, predicted: bool | None = None) -> bool:
    """``train.gradient_checkpointing``: true / false as set; ``auto``: ``predicted`` when given (preflight's
    prediction decided it on the data's own prompt bound: :attr:`sparserl.memory.MemoryPrediction.checkpointing`),
    else on when the step's predicted peak memory would not fit without it
    (:func:`sparserl.memory.gradient_checkpointing_on`)."""
    setting = cfg.train.gradient_checkpointing
    if setting == "auto":
        if predicted is not None:
            return predicted
        from ..memory import gradient_checkpointing_on

        return gradient_checkpointing_on(cfg, learner)
    return bool(setting)


def use_gradient_checkpointing(learner, on: bool) -> None:
    """Turn transformers' gradient checkpointing of ``learner``'s decoder layers on or off: in a forward
    with gradients in training mode each layer keeps only its input and recomputes its activations in the
    backward (non-reentrant ``torch.utils.checkpoint``, which needs no input that requires grad, so a
    LoRA learner's frozen embeddings need no ``enable_input_require_grads``). Off by default in the model;
    no-grad forwards (scoring, the sampler) are unaffected. A grad-mode forward then runs every row whole
    (:func:`sparserl.score.shared_prompt.shares_prompt_with_grad`)."""
    new = hasattr(learner, "activation_checkpointing_enable")  # transformers' name since 5.x; the old one warns
    if on and new:
        learner.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif on:
        learner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif checkpoints_activations(learner):
        (learner.activation_checkpointing_disable if new else learner.gradient_checkpointing_disable)()
