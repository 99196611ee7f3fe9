"""The online budget controller (sparserl.train.kv_controller), steered by the measured α tail."""

from __future__ import annotations

from ..schema import Config


def kv_controller(cfg: Config) -> list[str]:
    """The controller needs a compressor and a measured α on its own bins; its budgets are ordered and
    above the window."""
    r = cfg.rollout
    if (kc := r.kv_controller) is None:
        return []
    errors: list[str] = []
    if r.compressor == "none":
        errors.append("rollout.kv_controller needs a compressor (rollout.compressor='none' keeps every token)")
    if cfg.mismatch.alpha == "off":
        errors.append("rollout.kv_controller steers by the measured α tail: set mismatch.alpha to exact or topk")
    if kc.bin is not None and kc.bin != cfg.mismatch.alpha_bin:
        errors.append(
            f"rollout.kv_controller.bin={kc.bin} must equal mismatch.alpha_bin="
            f"{cfg.mismatch.alpha_bin} (the bins α is measured on), or be left out"
        )
    if kc.min_budget > kc.max_budget:
        errors.append(f"rollout.kv_controller.min_budget={kc.min_budget} is above max_budget={kc.max_budget}")
    if r.compressor not in ("none", "blocktopk") and kc.min_budget <= r.window:
        errors.append(
            f"rollout.kv_controller.min_budget={kc.min_budget} must be larger than rollout.window="
            f"{r.window} (the window's tokens are always kept)"
        )
    return errors
