"""Native CPU kernels of the sampler, compiled on first use with the machine's C compiler.

Eight sources, one library:

- ``decode_attention.c``: the fused decode attention, which the cache's
  :func:`sparserl.rollout.cache.attention` uses on CPU for float32 K/V and int8 / fp8 KV codes;
- ``linear.c``: the decode step's float32 weight products ``x Wᵀ (+ b)`` for a few rows, on
  weights packed once in panels (:func:`pack_linear`; :func:`sparserl.rollout.model.linear` uses it);
- ``layer_ops.c``: the small operators of a layer, each in one pass: RMSNorm (:func:`rms_norm`),
  SiLU(gate)·up (:func:`silu_mul`) and RoPE in place (:func:`rope_`);
- ``linear_int8.c``: the ``int8`` sampler's W8A8 products with per-token activation scales on AVX2
  integer instructions (:func:`pack_int8`, :func:`linear_int8`; :mod:`sparserl.rollout.quant.int8`),
  and ``int8_group``'s with per-group scales and the full 8-bit weight grid (``linear_int8(group=G)``;
  :mod:`sparserl.rollout.quant.int8_group`);
- ``decode_layer.c``: a whole decode layer in two calls around the attention, every product through
  one weight descriptor (:class:`Weight`: float32 panels, ``int8``, ``int8_group``, SmoothQuant's
  ``1/s``); :mod:`sparserl.rollout.fused` runs the decode step on it;
- ``kv_scores.c``: the compressors' scores without their large temporaries: R-KV's redundancy term
  (:func:`rkv_redundancy`; :func:`sparserl.rollout.kv.rkv.redundancy` uses it) and the
  observation-window attention (:func:`window_attention`; :func:`sparserl.rollout.kv.base.window_attention`);
- ``linear_bf16.c``: the weight products in bfloat16, ``x Wᵀ (+ b)`` with x rounded to bf16 in the
  call and float32 sums (:func:`pack_linear_bf16`, :func:`linear_bf16`): AVX512-BF16's ``vdpbf16ps``,
  AMX tiles where the CPU has them (:func:`bf16_kernel` says which runs), AVX2 or plain C elsewhere;
  the bf16 sampler's fused step (:mod:`sparserl.rollout.fused`) multiplies by its weights here;
- ``blocktopk.c``: block top-k sparse attention (:func:`blocktopk_attention`; :mod:`sparserl.rollout.kv.blocktopk`):
  the page key sums kept up to date, the pages chosen by query · mean key, attention over their rows only.

All are plain C (AVX2 intrinsics where the compiler targets them, OpenMP), loaded
with :mod:`ctypes`: no torch headers, so they compile in about a second. The library is built once
per source, compiler, flags and CPU into
``$SPARSERL_NATIVE_CACHE`` (default ``~/.cache/sparserl/native``; ``$SPARSERL_NATIVE_ARCH`` replaces
``-march=native``: :func:`default_flags`); concurrent builders (pytest
workers) each write a temporary file and rename it into place.

It links OpenMP as ``libgomp.so.1``, the soname of the runtime torch has already loaded, so the
kernel runs on torch's thread pool (``torch.set_num_threads`` applies) instead of a second,
competing one.

When there is no compiler, the build fails, or ``SPARSERL_NATIVE=0`` is set, :func:`library`
returns None (with one warning naming the reason, except when disabled on purpose) and every caller
keeps its torch path. Which one ran is what :func:`kernels` reports (bench rows carry it).
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

from ...errors import SparserlError

SOURCES = [Path(__file__).with_name(name)
           for name in ("decode_attention.c", "linear.c", "layer_ops.c", "linear_int8.c", "kv_scores.c",
                        "decode_layer.c", "blocktopk.c", "linear_bf16.c")]
HEADERS = [Path(__file__).with_name("simd.h")]
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared"]
_LIB: list = []  # [ctypes library or None] once loaded
_OFF: list[bool] = []  # non-empty inside ``torch_only()``


def cache_dir() -> Path:
    """``$SPARSERL_NATIVE_CACHE`` (default ``~/.cache/sparserl/native``), created if missing; an
    EnvPathError when it cannot be a folder."""
    from ...envpath import env_dir

    return env_dir("SPARSERL_NATIVE_CACHE", Path.home() / ".cache" / "sparserl" / "native")


def enabled() -> bool:
    """False when ``SPARSERL_NATIVE=0`` (the torch paths then run everywhere)."""
    return os.environ.get("SPARSERL_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def _cpu_signature() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    """The CPU's feature flags (``/proc/cpuinfo``; empty where it cannot be read)."""
    line = _cpu_signature()
    return set(line.split(":", 1)[1].split()) if ":" in line else set()


#: the instruction sets that decide which kernels and dtypes are fast, as /proc/cpuinfo names them
ISA = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile",
       "amx_bf16", "amx_int8")


def isa() -> list[str]:
    """Which of :data:`ISA` this CPU has (what a measurement's machine is named by)."""
    flags = cpu_flags()
    return [f for f in ISA if f in flags]


def flags_for(arch: str | None) -> list[str]:
    """:data:`FLAGS` with ``-march=native`` replaced by ``arch``, compiler flags in one string (e.g.
    ``"-mavx2 -mfma -mf16c -mavxvnni"``; ``""``: the portable C), or unchanged for None."""
    if arch is None:
        return list(FLAGS)
    return [f for f in FLAGS if not f.startswith("-march")] + shlex.split(arch)


def default_flags() -> list[str]:
    """The library's flags: :data:`FLAGS`, or with ``-march=native`` replaced by
    ``$SPARSERL_NATIVE_ARCH`` where it is set (to measure what a CPU with fewer instruction sets
    gets, e.g. a laptop's AVX2 + AVX-VNNI; the code must still run on this CPU)."""
    return flags_for(os.environ.get("SPARSERL_NATIVE_ARCH") or None)


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def build(compiler: str | None = None, flags: list[str] | None = None) -> Path:
    """Compile :data:`SOURCES` into one library (if not already built for this source, compiler, flags and CPU)
    and return the shared library's path. Raises RuntimeError with the compiler's message on
    failure. ``flags``: other than :func:`default_flags` (tests build the portable C without
    ``-march``: :func:`flags_for`)."""
    flags = default_flags() if flags is None else flags
    cc = compiler or _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (cc, gcc or clang; or set CC)")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    key = hashlib.sha256("\0".join([*(src.read_text() for src in SOURCES + HEADERS), cc, version, " ".join(flags), _cpu_signature()]).encode())
    out = cache_dir() / f"sparserl_native-{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        res = subprocess.run([cc, *flags, *map(str, SOURCES), "-o", tmp, "-lm"], capture_output=True, text=True)
        if res.returncode != 0 and ("amx" in res.stderr.lower() or "tile" in res.stderr.lower()):
            # a compiler that claims the AMX target but an assembler that does not know it:
            # linear_bf16.c without its AMX path (the AVX512-BF16 one runs)
            res = subprocess.run([cc, *flags, "-DSPARSERL_NO_AMX", *map(str, SOURCES), "-o", tmp, "-lm"],
                                 capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"{cc} failed on {', '.join(src.name for src in SOURCES)}: {res.stderr.strip()[-2000:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def load(path: str | Path):
    """The kernel library at ``path`` (a :func:`build`), with its functions' signatures declared."""
    lib = ctypes.CDLL(str(path))
    i, i64, p, fl = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    f = lib.sparserl_decode_attention
    f.argtypes = [i, i, i, i, i, p, i64, i64, p, p, i64, i64, i64, p, p, i64, i64, i, p, i64, fl, fl, p, p]
    f.restype = i
    lib.sparserl_linear.argtypes = [i, i, i, p, i64, p, p, p, i64, i]
    lib.sparserl_linear.restype = i
    lib.sparserl_linear_panel_width.restype = i
    lib.sparserl_rms_norm.argtypes = [i, i, p, i64, p, fl, p, i64]
    lib.sparserl_rms_norm.restype = None
    lib.sparserl_silu_mul.argtypes = [i, i, p, i64, p, i64]
    lib.sparserl_silu_mul.restype = None
    lib.sparserl_rope.argtypes = [i, i, i, p, i64, p, p, i64]
    lib.sparserl_rope.restype = None
    lib.sparserl_int8_panel_width.restype = i
    lib.sparserl_int8_full_range.restype = i
    lib.sparserl_pack_panels.argtypes = [i, i, i, p, p]
    lib.sparserl_pack_panels.restype = None
    lib.sparserl_linear_int8_outliers.argtypes = [i, i, i, i, p, i64, p, p, p, p, p, p, i64, i, i, p, p]
    lib.sparserl_linear_int8_outliers.restype = i
    lib.sparserl_pack_int8.argtypes = [i, i, p, p, p]
    lib.sparserl_pack_int8.restype = None
    lib.sparserl_linear_int8.argtypes = [i, i, i, p, i64, p, p, p, p, p, i64, p]
    lib.sparserl_linear_int8.restype = i
    lib.sparserl_linear_int8_group.argtypes = [i, i, i, i, p, i64, p, p, p, p, p, p, i64, p]
    lib.sparserl_linear_int8_group.restype = i
    lib.sparserl_int8_group_u8.restype = i
    lib.sparserl_rkv_redundancy.argtypes = [i, i, i, i, p, i64, i64, i64, p, i64, fl, p, i]
    lib.sparserl_rkv_redundancy.restype = i
    lib.sparserl_window_attention.argtypes = [i, i, i, i, i, i, p, i64, i64, i64, p, i64, i64, i64, p, i64, i, p, i]
    lib.sparserl_window_attention.restype = i
    lib.sparserl_blocktopk_attention.argtypes = [i, i, i, i, i, p, i64, i64, p, p, i64, i64, i64, p, i64, i64, p, p,
                                                 p, i, i, i, fl, p, p, i, i]
    lib.sparserl_blocktopk_attention.restype = i
    lib.sparserl_bf16_panel_width.restype = i
    lib.sparserl_bf16_kernel.restype = i
    lib.sparserl_bf16_kernel_for.argtypes = [i, i]
    lib.sparserl_bf16_kernel_for.restype = i
    lib.sparserl_bf16_default_layout.restype = i
    lib.sparserl_to_bf16.argtypes = [i64, p, p]
    lib.sparserl_to_bf16.restype = None
    lib.sparserl_pack_bf16.argtypes = [i, i, i, i, p, p]
    lib.sparserl_pack_bf16.restype = None
    lib.sparserl_linear_bf16.argtypes = [i, i, i, p, i64, p, i, i, p, p, i64, i]
    lib.sparserl_linear_bf16.restype = i
    lib.sparserl_weight_size.restype = i
    if lib.sparserl_weight_size() != ctypes.sizeof(Weight):
        raise RuntimeError("decode_layer.c's sparserl_weight does not match native.Weight")
    w = ctypes.POINTER(Weight)
    lib.sparserl_apply.argtypes = [w, i, p, i64, p, i64, i]
    lib.sparserl_apply.restype = i
    lib.sparserl_layer_qkv.argtypes = [i, i, p, p, fl, w, i, i, i, p, p, p, p, p, p, i64, i64, i64, p, i, p, p, i64, i64]
    lib.sparserl_layer_qkv.restype = i
    lib.sparserl_layer_mlp.argtypes = [i, i, p, p, i64, w, p, fl, w, w, p, p, p]
    lib.sparserl_layer_mlp.restype = i
    return lib


class Weight(ctypes.Structure):
    """``decode_layer.c``'s weight descriptor: which kernel multiplies by it and where its parts
    are. Holds raw addresses: whoever builds one keeps the tensors alive (:attr:`keep`)."""

    FLOAT32, INT8, INT8_GROUP, BF16 = 0, 1, 2, 3
    _fields_ = [("kind", ctypes.c_int32), ("N", ctypes.c_int32), ("K", ctypes.c_int32), ("group", ctypes.c_int32),
                ("panels", ctypes.c_void_p), ("colsum", ctypes.c_void_p), ("scales", ctypes.c_void_p),
                ("bias", ctypes.c_void_p), ("smooth", ctypes.c_void_p), ("n_outliers", ctypes.c_int32),
                ("outlier_idx", ctypes.c_void_p), ("outlier_panels", ctypes.c_void_p),
                ("group_scales", ctypes.c_void_p), ("panel_width", ctypes.c_int32), ("k_pad", ctypes.c_int32)]

    @classmethod
    def of(cls, kind: int, panels: torch.Tensor, N: int, K: int, group: int = 0, colsum=None, scales=None,
           bias=None, smooth=None, outlier_idx=None, outlier_panels=None, group_scales=None) -> "Weight | None":
        """A descriptor over these tensors (CPU; float32 but for int8 panels and int32 column sums
        and outlier indices, all contiguous), or None when one of them is not a tensor the kernels
        take. ``outlier_idx`` [n] with ``outlier_panels`` (:func:`pack_linear` of ``W[:, idx]``):
        input channels kept in float32 (:class:`~sparserl.rollout.quant.outliers.OutlierLinear`).
        ``group_scales``: ``int8_group``'s weight scales per output and group
        (:func:`pack_group_scales`). ``BF16``: ``panels`` from :func:`pack_linear_bf16` (its
        ``panel_width`` and ``k_pad`` go into the descriptor)."""
        parts = {"colsum": colsum, "scales": scales, "bias": bias, "smooth": smooth, "outlier_idx": outlier_idx,
                 "outlier_panels": outlier_panels, "group_scales": group_scales}
        want = {"colsum": torch.int32, "outlier_idx": torch.int32}
        if (outlier_idx is None) != (outlier_panels is None):
            return None
        if outlier_idx is not None and (outlier_panels.out_features != N
                                        or outlier_panels.in_features != outlier_idx.numel()):
            return None
        for name, t in parts.items():
            if t is not None and (t.device.type != "cpu" or t.dtype != want.get(name, torch.float32)
                                  or not t.is_contiguous()):
                return None
        if panels.device.type != "cpu" or not panels.is_contiguous():
            return None
        if (kind == cls.BF16) != (panels.dtype == torch.bfloat16) or (kind == cls.BF16 and smooth is not None):
            return None
        width, k_pad = (panels.panel_width, panels.k_pad) if kind == cls.BF16 else (0, 0)
        if (bias is not None and bias.numel() != N) or (smooth is not None and smooth.numel() != K):
            return None
        ptr = {name: None if t is None else t.data_ptr() for name, t in parts.items()}
        d = cls(kind, N, K, group, panels.data_ptr(), ptr["colsum"], ptr["scales"], ptr["bias"], ptr["smooth"],
                0 if outlier_idx is None else outlier_idx.numel(), ptr["outlier_idx"], ptr["outlier_panels"],
                ptr["group_scales"], width, k_pad)
        d.keep = (panels, *parts.values())
        return d


class NativeArchError(SparserlError):
    """``$SPARSERL_NATIVE_ARCH`` names flags the kernels do not build or load with: the user asked
    for that build, so falling back to torch would measure something else."""


def library():
    """The loaded kernel library (ctypes), or None when native kernels are off or unavailable.
    Raises :class:`NativeArchError` when a build that ``$SPARSERL_NATIVE_ARCH`` asks for fails."""
    if _LIB:
        return _LIB[0]
    lib = None
    if enabled():
        try:
            lib = load(build())
        except (OSError, RuntimeError, AttributeError) as e:
            arch = os.environ.get("SPARSERL_NATIVE_ARCH")
            if arch:
                raise NativeArchError(f"SPARSERL_NATIVE_ARCH={arch!r}: the native kernels do not build or load "
                                      f"with these flags ({str(e)[-600:]}); unset it to build for this CPU "
                                      "(-march=native)") from None
            warnings.warn(f"sparserl: native kernels unavailable, using torch ({e})", RuntimeWarning,
                          stacklevel=2)
            lib = None
    _LIB[:] = [lib]
    return lib


@contextlib.contextmanager
def torch_only():
    """Inside this block every caller runs its torch path (a benchmark's baseline in the same
    process)."""
    _OFF.append(True)
    try:
        yield
    finally:
        _OFF.pop()


def reset() -> None:
    """Forget the loaded library (tests switch ``SPARSERL_NATIVE``)."""
    _LIB.clear()


def kernels(device: torch.device | str, dtype: torch.dtype) -> str:
    """``native`` when the decode step on this device and dtype runs the C kernels (attention, and
    the weight products of packed weights), else ``torch``."""
    return ("native" if torch.device(device).type == "cpu" and dtype in (torch.float32, torch.bfloat16) and not _OFF
            and library() else "torch")


KV_TYPES = {torch.float32: 0, torch.int8: 1, torch.float8_e4m3fn: 2, torch.bfloat16: 3}  # the kernel's kv_type codes
UNIT = {torch.float32: 1.0, torch.int8: 1.0, torch.float8_e4m3fn: 256.0, torch.bfloat16: 1.0}  # fp8: code * 2^-8
SCALED_KV = (torch.int8, torch.float8_e4m3fn)  # KV codes that come with per-token scales


def decode_attention(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, bias: torch.Tensor,
                     k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None, lib=None):
    """The C kernel's softmax(q Kᵀ/√D + bias) V (shapes as :func:`sparserl.rollout.cache.attention`:
    q [B, Hq, 1, D] float32; K/V [B, Hkv, capacity, D] float32 or bfloat16 (the bf16 sampler's cache,
    read as the same values in float32), or int8 / float8_e4m3fn codes with
    ``k_scale`` / ``v_scale`` [B, Hkv, capacity] float32; bias [B, 1, 1, L] float32) → (out [B, Hq * D],
    p [B, Hkv, g, L] float32), or None when this input is not one the kernel takes (the caller then
    runs torch). ``lib``: another build of the kernel (tests), else :func:`library`."""
    lib = lib or (None if _OFF else library())
    if lib is None or q.device.type != "cpu" or q.dtype != torch.float32 or torch.compiler.is_compiling():
        return None
    kv_type = KV_TYPES.get(K.dtype)
    if kv_type is None or K.dtype != V.dtype or (K.dtype in SCALED_KV) != (k_scale is not None):
        return None
    B, hq, _, D = q.shape
    hkv, L = K.shape[1], bias.shape[-1]
    if (q.stride(-1) != 1 or K.stride() != V.stride() or K.stride(-1) != 1 or hq % hkv
            or bias.dtype != torch.float32 or not bias.is_contiguous() or L > K.shape[2]):
        return None
    if k_scale is not None and (k_scale.stride() != v_scale.stride() or k_scale.stride(-1) != 1
                    or k_scale.dtype != torch.float32 or v_scale.dtype != torch.float32):
        return None
    g = hq // hkv
    out = torch.empty(B, hq * D, dtype=torch.float32)
    p = torch.empty(B, hkv, g, L, dtype=torch.float32)
    ks_ptr = vs_ptr = None
    s_sb = s_sh = 0
    if k_scale is not None:
        ks_ptr, vs_ptr = k_scale.data_ptr(), v_scale.data_ptr()
        s_sb, s_sh = k_scale.stride(0), k_scale.stride(1)
    unit = UNIT[K.dtype]
    rc = lib.sparserl_decode_attention(
        B, hq, hkv, L, D, q.data_ptr(), q.stride(0), q.stride(1), K.data_ptr(), V.data_ptr(), K.stride(0),
        K.stride(1), K.stride(2), ks_ptr, vs_ptr, s_sb, s_sh, kv_type, bias.data_ptr(), L, D**-0.5 * unit, unit,
        out.data_ptr(), p.data_ptr())
    return None if rc != 0 else (out, p)


def blocktopk_attention(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, sums: torch.Tensor, start: torch.Tensor,
                        lens: torch.Tensor, k_pages: torch.Tensor | None, page: int, sink: int, recent: int,
                        update: bool = True, attend: bool = True, chosen: torch.Tensor | None = None, lib=None):
    """``blocktopk.c``: block top-k attention for one decode step of one layer, after the step's k, v
    are written at slot ``lens - 1`` (the formula in :mod:`sparserl.rollout.kv.blocktopk`). q [B, Hq, 1, D]
    float32 (unit stride in D); K, V [B, Hkv, capacity, D] float32 with the same strides (a layer's
    view of the cache); ``sums`` [B, Hkv, pages, D] float32 (the page key sums, unit strides in the last
    two dims; updated with the new key when ``update``); ``start``, ``lens`` [B] int64 (the first slot and
    the length after the write) and ``k_pages`` [B] int32 (pages each row reads), contiguous; ``chosen``
    [B, Hkv, max_k] int32 (contiguous) receives the pages read, ascending, -1 after them. Returns out
    [B, Hq * D] (with ``attend=False``, True: the update alone ran), or None, with nothing done, when
    the kernel does not take this input (the caller runs torch: :mod:`sparserl.rollout.page_attention`)."""
    lib = lib or (None if _OFF else library())
    if lib is None or torch.compiler.is_compiling():
        return None
    if (any(t.device.type != "cpu" or t.dtype != torch.float32 for t in (q, sums)) or K.device.type != "cpu"
            or K.dtype not in (torch.float32, torch.bfloat16) or V.dtype != K.dtype):
        return None
    B, hq, _, D = q.shape
    hkv = K.shape[1]
    if (q.stride(-1) != 1 or K.stride() != V.stride() or K.stride(-1) != 1 or hq % hkv or sums.stride(-1) != 1
            or sums.stride(-2) != D or sums.shape[:2] != (B, hkv) or sums.shape[-1] != D
            or K.shape[0] != B or K.shape[-1] != D):
        return None
    ints = [(start, torch.int64), (lens, torch.int64)] + ([(k_pages, torch.int32)] if attend else [])
    if any(t.device.type != "cpu" or t.dtype != dt or not t.is_contiguous() or t.numel() != B for t, dt in ints):
        return None
    if chosen is not None and (chosen.dtype != torch.int32 or not chosen.is_contiguous()
                               or chosen.shape[:2] != (B, hkv)):
        return None
    max_k = chosen.shape[2] if chosen is not None else int(k_pages.max()) if attend else 1
    out = torch.empty(B, hq * D, dtype=torch.float32) if attend else None
    rc = lib.sparserl_blocktopk_attention(
        B, hq, hkv, D, page, q.data_ptr(), q.stride(0), q.stride(1), K.data_ptr(), V.data_ptr(), K.stride(0),
        K.stride(1), K.stride(2), sums.data_ptr(), sums.stride(0), sums.stride(1), start.data_ptr(), lens.data_ptr(),
        k_pages.data_ptr() if attend else None, int(update), sink, recent, D**-0.5,
        out.data_ptr() if attend else None, chosen.data_ptr() if chosen is not None else None, max_k,
        int(K.dtype == torch.bfloat16))
    if rc == -2:
        raise MemoryError("sparserl_blocktopk_attention: out of memory")
    if rc != 0:
        return None
    return out if attend else True


def active() -> bool:
    """Whether callers should run the C kernels now (built, enabled, not inside :func:`torch_only`)."""
    return not _OFF and library() is not None


def pack_linear(w: torch.Tensor, lib=None) -> torch.Tensor | None:
    """W [N, K] float32 (CPU) → its panels for :func:`linear` (``linear.c``: ``Wp[p][k][j] =
    W[NR p + j][k]``, NR = 24, or 32 where the build has AVX512; zero past N), or None when the library is not available."""
    lib = lib or library()
    return None if lib is None else _pack_panels(w, lib, lib.sparserl_linear_panel_width())


def _pack_panels(w: torch.Tensor, lib, width: int) -> torch.Tensor | None:
    """W [N, K] float32 (CPU) → panels of ``width`` columns, ``Wp[p][k][j] = W[width p + j][k]``
    (``linear.c``'s ``sparserl_pack_panels``), with ``out_features``, ``in_features`` attached."""
    if w.device.type != "cpu" or w.dtype != torch.float32 or w.dim() != 2:
        return None
    w = w.detach().contiguous()
    N, K = w.shape
    packed = torch.empty(-(-N // width) * width * K, dtype=torch.float32)
    lib.sparserl_pack_panels(N, K, width, w.data_ptr(), packed.data_ptr())
    packed.out_features, packed.in_features = N, K  # what the panels hold
    return packed


def _lib_for(lib, *tensors: torch.Tensor):
    """The library to run on these float32 CPU tensors, or None (then the caller runs torch)."""
    lib = lib or (None if _OFF else library())
    if lib is None or torch.compiler.is_compiling():
        return None
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in tensors):
        return None
    return lib


def _lib_for_keys(lib, keys: torch.Tensor, *others: torch.Tensor):
    """:func:`_lib_for` where ``keys`` may also be bfloat16 CPU tensors (the kernels widen them as they
    read them); ``others`` must be float32."""
    if keys.dtype == torch.bfloat16 and keys.device.type == "cpu":
        return _lib_for(lib, *others)
    return _lib_for(lib, keys, *others)


def _rows(x: torch.Tensor) -> torch.Tensor | None:
    """x [..., n] as a [rows, n] view with unit stride along n, or None when it cannot be one."""
    try:
        x2 = x.view(-1, x.shape[-1])
    except RuntimeError:
        return None
    return x2 if x2.stride(-1) == 1 else None


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None, lib=None,
           add_to: torch.Tensor | None = None) -> torch.Tensor | None:
    """``x Wᵀ (+ bias)`` on the C kernel, W given as :func:`pack_linear`'s panels; x [..., K] float32.
    ``add_to`` [..., N] (contiguous): the product is added to it in place and it is returned. None
    when the kernel does not take this input (the caller runs torch)."""
    lib = _lib_for(lib, x, packed, *(t for t in (bias, add_to) if t is not None))
    if lib is None:
        return None
    io = _product_io(x, packed.out_features, packed.in_features, bias, add_to)
    if io is None:
        return None
    x2, rows, out, N, K = io
    if rows and lib.sparserl_linear(rows, N, K, x2.data_ptr(), x2.stride(0), packed.data_ptr(),
                                    None if bias is None else bias.data_ptr(), out.data_ptr(), N,
                                    int(add_to is not None)) != 0:
        return None
    return out


def _product_io(x: torch.Tensor, N: int, K: int, bias: torch.Tensor | None, add_to: torch.Tensor | None):
    """A product's operands as the kernels take them: (x as [rows, K] rows, rows, the output [..., N] float32
    (``add_to`` itself when given), N, K), or None when x, bias or add_to do not fit."""
    if x.shape[-1] != K or (bias is not None and (not bias.is_contiguous() or bias.numel() != N)):
        return None
    x2 = _rows(x)
    if x2 is None:
        x2 = x.reshape(-1, K).contiguous()
    rows = x2.shape[0]
    if add_to is not None and (not add_to.is_contiguous() or add_to.numel() != rows * N):
        return None
    out = add_to if add_to is not None else torch.empty(*x.shape[:-1], N, dtype=torch.float32)
    return x2, rows, out, N, K


#: ``linear_bf16.c``'s kernels by their code (``sparserl_bf16_kernel``)
BF16_KERNELS = ("c", "avx2", "avx512_bf16", "amx")
#: the packed layouts of :func:`pack_linear_bf16`: name → (panel width, k padded to a multiple of);
#: "panels": the build's panel width (32 with AVX512-BF16, else 16), k in pairs
BF16_LAYOUTS = {"amx": (16, 32)}


def bf16_kernel(lib=None) -> str:
    """Which path of ``linear_bf16.c`` this machine runs on the weights :func:`pack_linear_bf16` packs:
    ``"amx"`` (AMX tiles: the build targets AVX512-BF16, the compiler knows AMX, the CPU has amx_bf16
    and Linux grants the tile state), ``"avx512_bf16"``, ``"avx2"``, ``"c"`` (the portable loops), or
    ``"torch"`` without the library."""
    lib = lib or library()
    return "torch" if lib is None else BF16_KERNELS[lib.sparserl_bf16_kernel()]


#: the layout :func:`pack_linear_bf16` packs for each kernel (the kernel runs on weights of that layout)
BF16_KERNEL_LAYOUT = {"amx": "amx", "avx512_bf16": "panels", "avx2": "panels", "c": "panels"}


def bf16_kernels(lib=None) -> tuple[str, ...]:
    """The kernels of ``linear_bf16.c`` this machine runs, each on its layout
    (:data:`BF16_KERNEL_LAYOUT`): ``("amx", "avx512_bf16")`` on an AMX Xeon, ``("avx512_bf16",)`` on a
    CPU with AVX512-BF16 only, ``("avx2",)``, ``("c",)``; the portable loops are left out where a
    vector kernel runs. Empty without the library. Which of two is faster is measured, not assumed
    (:mod:`sparserl.rollout.bf16_kernel_choice`)."""
    lib = lib or library()
    if lib is None:
        return ()
    found = []
    for kernel, layout in BF16_KERNEL_LAYOUT.items():
        width, kpad = _bf16_layout(layout, lib)
        ran = BF16_KERNELS[lib.sparserl_bf16_kernel_for(width, kpad)]
        if ran == kernel and kernel not in found:
            found.append(kernel)
    return tuple(k for k in found if k != "c") or ("c",)


def _bf16_layout(layout: str | None, lib) -> tuple[int, int]:
    if layout is None:
        code = lib.sparserl_bf16_default_layout()
        return code >> 8, code & 0xFF
    if layout == "panels":
        return lib.sparserl_bf16_panel_width(), 2
    if layout not in BF16_LAYOUTS:
        raise ValueError(f"layout={layout!r}: expected None, 'panels' or one of {sorted(BF16_LAYOUTS)}")
    return BF16_LAYOUTS[layout]


def pack_linear_bf16(w: torch.Tensor, layout: str | None = None, lib=None) -> torch.Tensor | None:
    """W [N, K] float32 (CPU) → its bfloat16 values (round to nearest even, as ``w.bfloat16()``)
    packed for :func:`linear_bf16` (``linear_bf16.c``): panels of ``width`` output columns, k in
    pairs, ``Wb[p][k // 2][j][k % 2] = bf16(W[width p + j][k])``, zero past N and past K up to K
    rounded to ``kpad``. ``layout``: None, the one :func:`bf16_kernel` runs on; ``"panels"``, the
    build's panels (width 32 where it targets AVX512-BF16, else 16; kpad 2); ``"amx"``, width 16 and
    kpad 32 (16 rows of a panel are one AMX B tile; packs on any CPU). The result (bfloat16, 1-D)
    carries ``out_features``, ``in_features``, ``panel_width`` and ``k_pad``; None without the library."""
    lib = lib or library()
    if lib is None or w.device.type != "cpu" or w.dtype != torch.float32 or w.dim() != 2:
        return None
    width, kpad = _bf16_layout(layout, lib)
    w = w.detach().contiguous()
    N, K = w.shape
    packed = torch.empty(-(-N // width) * width * (-(-K // kpad) * kpad), dtype=torch.bfloat16)
    lib.sparserl_pack_bf16(N, K, width, kpad, w.data_ptr(), packed.data_ptr())
    packed.out_features, packed.in_features, packed.panel_width, packed.k_pad = N, K, width, kpad
    return packed


def bf16_kernel_of(packed: torch.Tensor, lib=None) -> str:
    """The kernel :func:`linear_bf16` runs here on these panels (by their layout)."""
    lib = lib or library()
    return "torch" if lib is None else BF16_KERNELS[lib.sparserl_bf16_kernel_for(packed.panel_width, packed.k_pad)]


def unpack_bf16(packed: torch.Tensor) -> torch.Tensor:
    """:func:`pack_linear_bf16`'s panels back to W's bfloat16 values [N, K]."""
    N, K, width, kpad = packed.out_features, packed.in_features, packed.panel_width, packed.k_pad
    k_pad = -(-K // kpad) * kpad
    P = packed.numel() // (width * k_pad)
    return packed.view(P, k_pad // 2, width, 2).permute(0, 2, 1, 3).reshape(P * width, k_pad)[:N, :K].contiguous()


def to_bf16(x: torch.Tensor, lib=None) -> torch.Tensor | None:
    """x float32 (CPU) → bfloat16 by ``linear_bf16.c``'s rounding (what the kernel does to its
    activations; the bits of ``x.bfloat16()``), or None without the library."""
    lib = _lib_for(lib, x)
    if lib is None:
        return None
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=torch.bfloat16)
    lib.sparserl_to_bf16(x.numel(), x.data_ptr(), out.data_ptr())
    return out


def linear_bf16(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None, lib=None,
                add_to: torch.Tensor | None = None) -> torch.Tensor | None:
    """``bf16(x) bf16(W)ᵀ (+ bias)`` with float32 sums on ``linear_bf16.c``, W given as
    :func:`pack_linear_bf16`'s panels; x [..., K] float32 (rounded to bfloat16 in the kernel), bias
    [N] float32, the result float32. ``add_to`` [..., N] (contiguous): the product is added to it in
    place and it is returned. None when the kernel does not take this input (the caller runs torch)."""
    lib = _lib_for(lib, x, *(t for t in (bias, add_to) if t is not None))
    if lib is None or packed.device.type != "cpu" or packed.dtype != torch.bfloat16 or not packed.is_contiguous():
        return None
    io = _product_io(x, packed.out_features, packed.in_features, bias, add_to)
    if io is None:
        return None
    x2, rows, out, N, K = io
    if rows and lib.sparserl_linear_bf16(rows, N, K, x2.data_ptr(), x2.stride(0), packed.data_ptr(),
                                         packed.panel_width, packed.k_pad,
                                         None if bias is None else bias.data_ptr(), out.data_ptr(), N,
                                         int(add_to is not None)) != 0:
        return None
    return out


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, lib=None) -> torch.Tensor | None:
    """``x / sqrt(mean(x²) + eps) · w`` over the last dimension (``layer_ops.c``), or None."""
    lib = _lib_for(lib, x, w)
    x2 = None if lib is None or not w.is_contiguous() or w.numel() != x.shape[-1] else _rows(x)
    if x2 is None:
        return None
    out = torch.empty(x.shape, dtype=torch.float32)
    lib.sparserl_rms_norm(x2.shape[0], x2.shape[1], x2.data_ptr(), x2.stride(0), w.data_ptr(), eps,
                          out.data_ptr(), x2.shape[1])
    return out


def silu_mul(gate_up: torch.Tensor, lib=None) -> torch.Tensor | None:
    """``silu(g) · u`` for ``gate_up = [g | u]`` [..., 2 I] → [..., I] (``layer_ops.c``), or None."""
    lib = _lib_for(lib, gate_up)
    x2 = None if lib is None or gate_up.shape[-1] % 2 else _rows(gate_up)
    if x2 is None:
        return None
    inter = x2.shape[1] // 2
    out = torch.empty(*gate_up.shape[:-1], inter, dtype=torch.float32)
    lib.sparserl_silu_mul(x2.shape[0], inter, x2.data_ptr(), x2.stride(0), out.data_ptr(), inter)
    return out


def rope_(x: torch.Tensor, n_heads: int, cos: torch.Tensor, sin: torch.Tensor, lib=None) -> bool:
    """RoPE in place on the first ``n_heads`` heads of x [..., H, D] (contiguous), with cos / sin
    [..., D] (one row per row of x, contiguous): ``x·cos + rotate_half(x)·sin`` (``layer_ops.c``).
    False when the kernel does not take this input (x untouched)."""
    lib = _lib_for(lib, x, cos, sin)
    if lib is None or not (x.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()) or x.dim() < 2:
        return False
    H, D = x.shape[-2:]
    rows = x.numel() // (H * D) if H * D else 0
    if D % 2 or n_heads > H or cos.shape != sin.shape or cos.shape[-1] != D or cos.numel() != rows * D:
        return False
    if rows:
        lib.sparserl_rope(rows, n_heads, D, x.data_ptr(), H * D, cos.data_ptr(), sin.data_ptr(), D)
    return True


def pack_int8(q: torch.Tensor, lib=None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Int8 codes Q [N, K] → (panels, column sums) for :func:`linear_int8` (|Q| ≤ 64 per token,
    ≤ 127 where :func:`int8_full_range`; |Q| ≤ 127 with groups; see ``linear_int8.c``), or None when the library is not available."""
    lib = lib or library()
    if lib is None or q.device.type != "cpu" or q.dtype != torch.int8 or q.dim() != 2:
        return None
    q = q.contiguous()
    N, K = q.shape
    nr = lib.sparserl_int8_panel_width()
    n_pad, k_pad = -(-N // nr) * nr, -(-K // 4) * 4
    panels = torch.empty(n_pad * k_pad, dtype=torch.int8)
    colsum = torch.empty(n_pad, dtype=torch.int32)
    lib.sparserl_pack_int8(N, K, q.data_ptr(), panels.data_ptr(), colsum.data_ptr())
    panels.out_features, panels.in_features, panels.panel_width = N, K, nr
    return panels, colsum


def _pack_per_group(values: torch.Tensor, fill, lib) -> torch.Tensor:
    """[N, NG] → per int8 panel of NR outputs, per group, the panel's NR values (``[P][NG][NR]``,
    ``fill`` past N)."""
    nr = lib.sparserl_int8_panel_width()
    n, ng = values.shape
    n_pad = -(-n // nr) * nr
    padded = torch.full((n_pad, ng), fill, dtype=values.dtype)
    padded[:n] = values
    return padded.view(n_pad // nr, nr, ng).transpose(1, 2).contiguous().view(-1)


def pack_group_scales(scales: torch.Tensor, lib=None) -> torch.Tensor | None:
    """Weight scales per output and group, g [N, NG] float32 → :func:`linear_int8`'s
    ``group_scales`` (per panel and group, 1 past N), or None without the library."""
    lib = lib or library()
    if lib is None or scales.device.type != "cpu" or scales.dim() != 2:
        return None
    return _pack_per_group(scales.float(), 1.0, lib)


def pack_group_colsums(q: torch.Tensor, group: int, lib=None) -> torch.Tensor | None:
    """Int8 codes Q [N, K] → their column sums per group of ``group`` inputs, packed as
    :func:`pack_group_scales` (int32, 0 past N): :func:`linear_int8`'s ``group_colsum``. None
    without the library, or where the build has no use for them (:func:`int8_group_u8`)."""
    lib = lib or library()
    if lib is None or q.device.type != "cpu" or q.dim() != 2 or not int8_group_u8(lib):
        return None
    n, k = q.shape
    ng = -(-k // group)
    padded = q if ng * group == k else torch.nn.functional.pad(q, (0, ng * group - k))
    sums = padded.reshape(n, ng, group).sum(-1, dtype=torch.int32)
    return _pack_per_group(sums, 0, lib)


def int8_group_u8(lib=None) -> bool:
    """Whether this build runs ``int8_group`` on the per-token kernel's unsigned codes and tile when
    given the group column sums: where that tile's dot is one vpdpbusd (AVX512 VNNI on 512 bits,
    AVX-VNNI on 256; ``linear_int8.c``)."""
    lib = lib or library()
    return bool(lib is not None and lib.sparserl_int8_group_u8())


def int8_full_range(lib=None) -> bool:
    """Whether :func:`linear_int8`'s per-token products are exact on the full weight grid |Q| ≤ 127
    (a VNNI build, or the portable C); False on plain AVX2 / AVX512BW (|Q| ≤ 64 there) or with no
    library."""
    lib = lib or library()
    return bool(lib is not None and lib.sparserl_int8_full_range())


def unpack_int8(packed: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """:func:`pack_int8`'s panels back to the codes Q [N, K] int8 (``Wq[p][k/4][j][k%4] = Q[NR p + j][k]``,
    NR = the build's panel width: 16, or 32 with AVX512)."""
    panels = packed[0]
    N, K, nr = panels.out_features, panels.in_features, panels.panel_width
    k_pad = -(-K // 4) * 4
    n_pad = panels.numel() // k_pad
    return panels.view(n_pad // nr, k_pad // 4, nr, 4).permute(0, 2, 1, 3).reshape(n_pad, k_pad)[:N, :K].contiguous()


def _group_operands_ok(group: int | None, group_scales: torch.Tensor | None,
                       group_colsum: torch.Tensor | None) -> bool:
    """Whether the int8 kernels take this group size and ``int8_group``'s packed operands (both
    only with a group; contiguous; the column sums int32 on the CPU: :func:`_lib_for` checks the
    float ones)."""
    if group is None:
        return group_scales is None and group_colsum is None
    return (group > 0 and group % 4 == 0
            and (group_scales is None or group_scales.is_contiguous())
            and (group_colsum is None or (group_colsum.dtype == torch.int32 and group_colsum.device.type == "cpu"
                                          and group_colsum.is_contiguous())))


def linear_int8(x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor], scales: torch.Tensor,
                bias: torch.Tensor | None = None, group: int | None = None, group_scales: torch.Tensor | None = None,
                group_colsum: torch.Tensor | None = None, lib=None) -> torch.Tensor | None:
    """The int8 W8A8 products of ``linear_int8.c`` on x [..., K] float32, Q given as
    :func:`pack_int8`'s panels and ``scales`` [N] float32:

    - ``group=None``: ``a_t s_n Σ_k P_tk Q_nk (+ bias)``, P quantized per token (``int8``; |Q| ≤ 64,
      ≤ 127 where :func:`int8_full_range`);
    - ``group=G``: ``s_n Σ_j a_tj g_nj Σ_{k ∈ j} P_tk Q_nk (+ bias)``, one scale per token and group
      of G inputs, ``g`` the weights' scales per output and group (``group_scales``,
      :func:`pack_group_scales`; None: 1) (``int8_group``; |Q| ≤ 127, G a multiple of 4).
      ``group_colsum`` (:func:`pack_group_colsums`): the builds with VNNI (AVX512 or AVX-VNNI) then
      run the groups on the per-token kernel's tile (:func:`int8_group_u8`), with the same bits.

    None when the kernel does not take this input (the caller runs another kernel)."""
    panels, colsum = packed
    lib = _lib_for(lib, x, scales, *(t for t in (bias, group_scales) if t is not None))
    if (lib is None or not scales.is_contiguous() or (bias is not None and not bias.is_contiguous())
            or not _group_operands_ok(group, group_scales, group_colsum)):
        return None
    N, K = panels.out_features, panels.in_features
    x2 = _rows(x) if x.shape[-1] == K else None
    if x2 is None:
        return None
    rows = x2.shape[0]
    out = torch.empty(*x.shape[:-1], N, dtype=torch.float32)
    if rows == 0:
        return out
    k_pad, b_ptr = -(-K // 4) * 4, None if bias is None else bias.data_ptr()
    if group is None:  # work: the rows' scales (4 bytes each) and their quantized values
        work = torch.empty(rows * (4 + k_pad), dtype=torch.uint8)
        rc = lib.sparserl_linear_int8(rows, N, K, x2.data_ptr(), x2.stride(0), panels.data_ptr(), colsum.data_ptr(),
                                      scales.data_ptr(), b_ptr, out.data_ptr(), N, work.data_ptr())
    else:
        work = torch.empty(rows * (4 * -(-K // group) + k_pad), dtype=torch.uint8)
        rc = lib.sparserl_linear_int8_group(rows, N, K, group, x2.data_ptr(), x2.stride(0), panels.data_ptr(),
                                            None if group_colsum is None else group_colsum.data_ptr(),
                                            scales.data_ptr(), None if group_scales is None else group_scales.data_ptr(),
                                            b_ptr, out.data_ptr(), N, work.data_ptr())
    return None if rc != 0 else out


def pack_outliers(w_outliers: torch.Tensor, lib=None) -> torch.Tensor | None:
    """``W[:, idx]`` [N, n] float32 (CPU) → its panels for :func:`linear_int8` with outliers
    (``Wo[p][j][c] = W[NR p + c, idx[j]]``, NR the int8 panel width), or None without the library."""
    lib = lib or library()
    return None if lib is None else _pack_panels(w_outliers, lib, lib.sparserl_int8_panel_width())


def linear_int8_outliers(x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor], scales: torch.Tensor,
                         idx: torch.Tensor, outlier_panels: torch.Tensor, group: int | None = None,
                         group_scales: torch.Tensor | None = None, group_colsum: torch.Tensor | None = None,
                         lib=None) -> torch.Tensor | None:
    """:func:`linear_int8` of x [..., K] with the inputs ``idx`` (int32 [n]) zeroed, plus their
    float32 product with :func:`pack_outliers`'s panels (``linear_int8.c``,
    ``sparserl_linear_int8_outliers``; no bias: the caller adds it). None when the kernel does not
    take this input."""
    panels, colsum = packed
    lib = _lib_for(lib, x, scales, outlier_panels, *(t for t in (group_scales,) if t is not None))
    if (lib is None or not scales.is_contiguous() or idx.dtype != torch.int32 or not idx.is_contiguous()
            or not _group_operands_ok(group, group_scales, group_colsum)):
        return None
    N, K = panels.out_features, panels.in_features
    x2 = _rows(x) if x.shape[-1] == K else None
    if x2 is None or outlier_panels.out_features != N or outlier_panels.in_features != idx.numel():
        return None
    out = torch.empty(*x.shape[:-1], N, dtype=torch.float32)
    sums = colsum if group is None else group_colsum
    if x2.shape[0] and lib.sparserl_linear_int8_outliers(
            x2.shape[0], N, K, group or 0, x2.data_ptr(), x2.stride(0), panels.data_ptr(),
            None if sums is None else sums.data_ptr(), scales.data_ptr(),
            None if group_scales is None else group_scales.data_ptr(), None, out.data_ptr(), N, 0,
            idx.numel(), idx.data_ptr(), outlier_panels.data_ptr()) != 0:
        return None
    return out


def rkv_redundancy(keys: torch.Tensor, valid: torch.Tensor, threshold: float, lib=None) -> torch.Tensor | None:
    """R-KV's mean thresholded similarity of every key (``kv_scores.c``; before the softmax of
    :func:`sparserl.rollout.kv.rkv.redundancy`): keys [n, H, L, D] float32 or bfloat16 (the bf16
    sampler's cache, read as the float32 values it holds; unit stride in D), valid [n, L] bool →
    [n, H, L] float32, or None when the kernel does not take this input."""
    lib = _lib_for_keys(lib, keys)
    if (lib is None or keys.dim() != 4 or keys.stride(-1) != 1 or valid.dtype != torch.bool
            or valid.device.type != "cpu"):
        return None
    n, heads, length, dim = keys.shape
    if valid.shape != (n, length) or (length > 1 and valid.stride(1) != 1):
        return None
    out = torch.empty(n, heads, length, dtype=torch.float32)
    if out.numel() == 0:
        return out
    rc = lib.sparserl_rkv_redundancy(n, heads, length, dim, keys.data_ptr(), keys.stride(0), keys.stride(1),
                                     keys.stride(2), valid.data_ptr(), valid.stride(0), float(threshold),
                                     out.data_ptr(), int(keys.dtype == torch.bfloat16))
    if rc != 0:
        raise MemoryError("sparserl_rkv_redundancy: out of memory")
    return out


def window_attention(queries: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, reduce_group: str,
                     lib=None) -> torch.Tensor | None:
    """The observation window's attention (``kv_scores.c``; what
    :func:`sparserl.rollout.kv.base.window_attention` computes): queries [n, Hq, w, D] (the last
    ``w`` slots' queries, oldest first), keys [n, Hkv, L, D] (float32, or bfloat16 read as the float32
    values it holds; bf16 queries are widened here, they are few), valid [n, L] bool → [n, Hkv, L]
    float32, or None when the kernel does not take this input."""
    if queries.dtype == torch.bfloat16 and keys.dtype == torch.bfloat16:
        queries = queries.float()
    lib = _lib_for_keys(lib, keys, queries)
    if (lib is None or keys.dim() != 4 or queries.dim() != 4 or keys.stride(-1) != 1 or queries.stride(-1) != 1
            or valid.dtype != torch.bool or valid.device.type != "cpu" or reduce_group not in ("max", "mean")):
        return None
    n, hq, w, dim = queries.shape
    heads, length = keys.shape[1], keys.shape[2]
    if (keys.shape[0] != n or keys.shape[3] != dim or hq % heads or valid.shape != (n, length)
            or (length > 1 and valid.stride(1) != 1) or w > length):
        return None
    out = torch.empty(n, heads, length, dtype=torch.float32)
    if out.numel() == 0:
        return out
    rc = lib.sparserl_window_attention(n, heads, hq // heads, w, length, dim, queries.data_ptr(), queries.stride(0),
                                       queries.stride(1), queries.stride(2), keys.data_ptr(), keys.stride(0),
                                       keys.stride(1), keys.stride(2), valid.data_ptr(), valid.stride(0),
                                       int(reduce_group == "max"), out.data_ptr(), int(keys.dtype == torch.bfloat16))
    if rc != 0:
        raise MemoryError("sparserl_window_attention: out of memory")
    return out
