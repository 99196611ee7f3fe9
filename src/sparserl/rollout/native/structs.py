"""The C structs the kernels take, as :mod:`ctypes` structures.

- :class:`Weight`: ``decode_layer.c``'s ``sparserl_weight``, one weight product's descriptor
  (:mod:`sparserl.rollout.fused` builds one per linear layer).
"""

from __future__ import annotations

import ctypes

import torch


class Weight(ctypes.Structure):
    """``decode_layer.c``'s weight descriptor: which kernel multiplies by it and where its parts
    are. Holds raw addresses: whoever builds one keeps the tensors alive (:attr:`keep`)."""

    FLOAT32, INT8, INT8_GROUP, BF16 = 0, 1, 2, 3
    _fields_ = [
        ("kind", ctypes.c_int32),
        ("N", ctypes.c_int32),
        ("K", ctypes.c_int32),
        ("group", ctypes.c_int32),
        ("panels", ctypes.c_void_p),
        ("colsum", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("smooth", ctypes.c_void_p),
        ("n_outliers", ctypes.c_int32),
        ("outlier_idx", ctypes.c_void_p),
        ("outlier_panels", ctypes.c_void_p),
        ("group_scales", ctypes.c_void_p),
        ("panel_width", ctypes.c_int32),
        ("k_pad", ctypes.c_int32),
    ]

    @classmethod
    def of(
        cls,
        kind: int,
        panels: torch.Tensor,
        N: int,
        K: int,
        group: int = 0,
        colsum=None,
        scales=None,
        bias=None,
        smooth=None,
        outlier_idx=None,
        outlier_panels=None,
        group_scales=None,
    ) -> Weight | None:
        """A descriptor over these tensors (CPU; float32 but for int8 panels and int32 column sums
        and outlier indices, all contiguous), or None when one of them is not a tensor the kernels
        take. ``outlier_idx`` [n] with ``outlier_panels``
        (:func:`~sparserl.rollout.native.linear.pack_linear` of ``W[:, idx]``):
        input channels kept in float32 (:class:`~sparserl.rollout.quant.outliers.OutlierLinear`).
        ``group_scales``: ``int8_group``'s weight scales per output and group
        (:func:`~sparserl.rollout.native.linear_int8.pack_group_scales`).
        ``BF16``: ``panels`` from :func:`~sparserl.rollout.native.linear_bf16.pack_linear_bf16` (its
        ``panel_width`` and ``k_pad`` go into the descriptor)."""
        parts = {
            "colsum": colsum,
            "scales": scales,
            "bias": bias,
            "smooth": smooth,
            "outlier_idx": outlier_idx,
            "outlier_panels": outlier_panels,
            "group_scales": group_scales,
        }
        want = {"colsum": torch.int32, "outlier_idx": torch.int32}
        if (outlier_idx is None) != (outlier_panels is None):
            return None
        if outlier_idx is not None and (
            outlier_panels.out_features != N or outlier_panels.in_features != outlier_idx.numel()
        ):
            return None
        for name, t in parts.items():
            if t is not None and (
                t.device.type != "cpu" or t.dtype != want.get(name, torch.float32) or not t.is_contiguous()
            ):
                return None
        if panels.device.type != "cpu" or not panels.is_contiguous():
            return None
        if (kind == cls.BF16) != (panels.dtype == torch.bfloat16) or (kind == cls.BF16 and smooth is not None):
            return None
        width, k_pad = (panels.panel_width, panels.k_pad) if kind == cls.BF16 else (0, 0)
        if (bias is not None and bias.numel() != N) or (smooth is not None and smooth.numel() != K):
            return None
        ptr = {name: None if t is None else t.data_ptr() for name, t in parts.items()}
        d = cls(
            kind,
            N,
            K,
            group,
            panels.data_ptr(),
            ptr["colsum"],
            ptr["scales"],
            ptr["bias"],
            ptr["smooth"],
            0 if outlier_idx is None else outlier_idx.numel(),
            ptr["outlier_idx"],
            ptr["outlier_panels"],
            ptr["group_scales"],
            width,
            k_pad,
        )
        d.keep = (panels, *parts.values())
        return d
