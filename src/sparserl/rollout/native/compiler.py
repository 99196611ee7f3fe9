"""The kernel library: compiled from the C sources on first use with the machine's C compiler, cached,
loaded with :mod:`ctypes` and its functions' signatures declared, and the switches that turn it off.

The library is built once per source, compiler, flags and CPU into ``$SPARSERL_NATIVE_CACHE`` (default
``~/.cache/sparserl/native``; ``$SPARSERL_NATIVE_ARCH`` replaces ``-march=native``: :func:`default_flags`);
concurrent builders (pytest workers) each write a temporary file and rename it into place. It links
OpenMP as ``libgomp.so.1``, the soname of the runtime torch has already loaded, so the kernels run on
torch's thread pool (``torch.set_num_threads`` applies) instead of a second, competing one.

When there is no compiler, the build fails, or ``SPARSERL_NATIVE=0`` is set, :func:`library` returns
None (with one warning naming the reason, except when disabled on purpose) and every caller keeps its
torch path; :func:`kernels` reports which one ran (bench rows carry it).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

from ...errors import SparserlError
from ...models.machine import ISA, cache_dir, cpu_flags, cpu_signature, isa
from .structs import Weight

__all__ = [
    "FLAGS",
    "HEADERS",
    "ISA",
    "NativeArchError",
    "SOURCES",
    "active",
    "build",
    "cache_dir",
    "cpu_flags",
    "default_flags",
    "enabled",
    "flags_for",
    "isa",
    "kernels",
    "lib_for",
    "lib_for_keys",
    "library",
    "load",
    "reset",
    "running",
    "torch_only",
]

SOURCES = [
    Path(__file__).with_name(name)
    for name in (
        "decode_attention.c",
        "linear.c",
        "layer_ops.c",
        "linear_int8.c",
        "kv_scores.c",
        "decode_layer.c",
        "blocktopk.c",
        "linear_bf16.c",
    )
]
HEADERS = [Path(__file__).with_name("simd.h")]
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared"]
_LIB: list = []  # [ctypes library or None] once loaded
_OFF: list[bool] = []  # non-empty inside ``torch_only()``


def enabled() -> bool:
    """False when ``SPARSERL_NATIVE=0`` (the torch paths then run everywhere)."""
    return os.environ.get("SPARSERL_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


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
    key = hashlib.sha256(
        "\0".join(
            [*(src.read_text() for src in SOURCES + HEADERS), cc, version, " ".join(flags), cpu_signature()]
        ).encode()
    )
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
            res = subprocess.run(
                [cc, *flags, "-DSPARSERL_NO_AMX", *map(str, SOURCES), "-o", tmp, "-lm"], capture_output=True, text=True
            )
        if res.returncode != 0:
            raise RuntimeError(f"{cc} failed on {', '.join(src.name for src in SOURCES)}: {res.stderr.strip()[-2000:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def load(path: str | Path):
    """The kernel library at ``path`` (a :func:`build`), with its functions' signatures declared, source by
    source."""
    lib = ctypes.CDLL(str(path))
    i, i64, p, fl = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    w = ctypes.POINTER(Weight)
    signatures = {  # name: (argument types, result type)
        # decode_attention.c
        "sparserl_decode_attention": (
            [i, i, i, i, i, p, i64, i64, p, p, i64, i64, i64, p, p, i64, i64, i, p, i64, fl, fl, p, p],
            i,
        ),
        # linear.c
        "sparserl_linear": ([i, i, i, p, i64, p, p, p, i64, i], i),
        "sparserl_linear_panel_width": ([], i),
        "sparserl_pack_panels": ([i, i, i, p, p], None),
        # layer_ops.c
        "sparserl_rms_norm": ([i, i, p, i64, p, fl, p, i64], None),
        "sparserl_silu_mul": ([i, i, p, i64, p, i64], None),
        "sparserl_rope": ([i, i, i, p, i64, p, p, i64], None),
        # linear_int8.c
        "sparserl_int8_panel_width": ([], i),
        "sparserl_int8_full_range": ([], i),
        "sparserl_int8_group_u8": ([], i),
        "sparserl_pack_int8": ([i, i, p, p, p], None),
        "sparserl_linear_int8": ([i, i, i, p, i64, p, p, p, p, p, i64, p], i),
        "sparserl_linear_int8_group": ([i, i, i, i, p, i64, p, p, p, p, p, p, i64, p], i),
        "sparserl_linear_int8_outliers": ([i, i, i, i, p, i64, p, p, p, p, p, p, i64, i, i, p, p], i),
        # kv_scores.c
        "sparserl_rkv_redundancy": ([i, i, i, i, p, i64, i64, i64, p, i64, fl, p, i], i),
        "sparserl_window_attention": ([i, i, i, i, i, i, p, i64, i64, i64, p, i64, i64, i64, p, i64, i, p, i], i),
        # blocktopk.c
        "sparserl_blocktopk_attention": (
            [i, i, i, i, i, p, i64, i64, p, p, i64, i64, i64, p, i64, i64, p, p, p, i, i, i, fl, p, p, i, i],
            i,
        ),
        # linear_bf16.c
        "sparserl_bf16_panel_width": ([], i),
        "sparserl_bf16_kernel": ([], i),
        "sparserl_bf16_kernel_for": ([i, i], i),
        "sparserl_bf16_default_layout": ([], i),
        "sparserl_to_bf16": ([i64, p, p], None),
        "sparserl_pack_bf16": ([i, i, i, i, p, p], None),
        "sparserl_linear_bf16": ([i, i, i, p, i64, p, i, i, p, p, i64, i], i),
        # decode_layer.c (its weight descriptor: structs.Weight)
        "sparserl_weight_size": ([], i),
        "sparserl_apply": ([w, i, p, i64, p, i64, i], i),
        "sparserl_layer_qkv": ([i, i, p, p, fl, w, i, i, i, p, p, p, p, p, p, i64, i64, i64, p, i, p, p, i64, i64], i),
        "sparserl_layer_mlp": ([i, i, p, p, i64, w, p, fl, w, w, p, p, p], i),
    }
    for name, (argtypes, restype) in signatures.items():
        f = getattr(lib, name)
        if argtypes:
            f.argtypes = argtypes
        f.restype = restype
    if lib.sparserl_weight_size() != ctypes.sizeof(Weight):
        raise RuntimeError("decode_layer.c's sparserl_weight does not match native.Weight")
    return lib


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
                raise NativeArchError(
                    f"SPARSERL_NATIVE_ARCH={arch!r}: the native kernels do not build or load "
                    f"with these flags ({str(e)[-600:]}); unset it to build for this CPU "
                    "(-march=native)"
                ) from None
            warnings.warn(f"sparserl: native kernels unavailable, using torch ({e})", RuntimeWarning, stacklevel=2)
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
    return (
        "native"
        if torch.device(device).type == "cpu" and dtype in (torch.float32, torch.bfloat16) and not _OFF and library()
        else "torch"
    )


def active() -> bool:
    """Whether callers should run the C kernels now (built, enabled, not inside :func:`torch_only`)."""
    return not _OFF and library() is not None


def running(lib=None):
    """``lib`` (another build of the kernels: tests), else the loaded library unless inside
    :func:`torch_only`; None when neither."""
    return lib or (None if _OFF else library())


def lib_for(lib, *tensors: torch.Tensor):
    """The library to run on these float32 CPU tensors, or None (then the caller runs torch)."""
    lib = running(lib)
    if lib is None or torch.compiler.is_compiling():
        return None
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in tensors):
        return None
    return lib


def lib_for_keys(lib, keys: torch.Tensor, *others: torch.Tensor):
    """:func:`lib_for` where ``keys`` may also be bfloat16 CPU tensors (the kernels widen them as they
    read them); ``others`` must be float32."""
    if keys.dtype == torch.bfloat16 and keys.device.type == "cpu":
        return lib_for(lib, *others)
    return lib_for(lib, keys, *others)
