"""The kernels compiled for a GPU without one: ``triton.compile`` builds each for sm_90 (H100 / H200) and the
cuobjdump and ptxas bundled with Triton report its resources (registers, stack, local memory, spill stores and
loads), so a kernel that would spill on the GPU fails a CPU test (``tests/test_gpu_compile.py``).

    python3 -m sparserl.rollout.gpu.resources          # one line per kernel variant

Must run in a process without ``TRITON_INTERPRET`` (the interpreter replaces the kernels when they are
decorated).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["KernelResources", "compile_for", "kernel_variants", "resource_report"]


@dataclass(frozen=True)
class KernelResources:
    """One compiled kernel's resources, as cuobjdump reports them."""

    name: str
    registers: int
    stack_bytes: int
    shared_bytes: int
    local_bytes: int
    spill_stores: int
    spill_loads: int


def _tool(name: str) -> str:
    """The path of one of the CUDA tools Triton's wheel bundles (cuobjdump, ptxas)."""
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"Triton's bundled {name} is not at {path}")
    return str(path)


def compile_for(fn, signature: dict, constexprs: dict, arch: int = 90):
    """``fn`` (a ``@triton.jit`` kernel) compiled for ``sm_<arch>`` with the argument types ``signature`` (name →
    ``*bf16``, ``i32``, ``fp32``, ...) and the ``constexprs`` (name → value) → Triton's compiled kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if os.environ.get("TRITON_INTERPRET"):
        raise RuntimeError("compiling for a GPU needs a process without TRITON_INTERPRET")
    sig = dict(signature)
    sig.update({k: "constexpr" for k in constexprs})
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32))


def resource_report(compiled) -> KernelResources:
    """Registers, stack and static shared memory of a compiled kernel (its cubin through cuobjdump) and its spills
    (its PTX through the bundled ptxas -v: "N bytes spill stores, M bytes spill loads")."""
    arch = compiled.metadata.target.arch
    with tempfile.TemporaryDirectory() as tmp:
        cubin, ptx = Path(tmp) / "kernel.cubin", Path(tmp) / "kernel.ptx"
        cubin.write_bytes(compiled.asm["cubin"])
        ptx.write_text(compiled.asm["ptx"])
        usage = subprocess.run(
            [_tool("cuobjdump"), "--dump-resource-usage", str(cubin)], capture_output=True, text=True, check=True
        ).stdout
        sm = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
        verbose = subprocess.run(
            [_tool("ptxas"), "-v", f"--gpu-name={sm}", str(ptx), "-o", str(Path(tmp) / "again.cubin")],
            capture_output=True,
            text=True,
            check=True,
        ).stderr

    def field(name: str) -> int:
        m = re.search(rf"\b{name}:(\d+)", usage)
        return int(m.group(1)) if m else 0

    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", verbose)
    if spills is None:
        raise RuntimeError(f"ptxas -v printed no spill line for {compiled.metadata.name}:\n{verbose}")
    return KernelResources(
        name=compiled.metadata.name,
        registers=field("REG"),
        stack_bytes=field("STACK"),
        shared_bytes=field("SHARED"),
        local_bytes=field("LOCAL"),
        spill_stores=int(spills.group(1)),
        spill_loads=int(spills.group(2)),
    )


def kernel_variants() -> dict[str, tuple]:
    """Every kernel the GPU sampler launches, in the variants the engine uses: (kernel, signature, constexprs)."""
    from .decode_attention import _decode_attention_kernel
    from .rkv_redundancy import _rkv_rows_kernel, rkv_block
    from .window_scores import _window_kernel

    attn_sig = {
        **{n: "*bf16" for n in ("Q", "K", "V", "OUT")},
        **{n: "*fp32" for n in ("KS", "VS", "LSE")},
        **{n: "*i32" for n in ("START", "LENS", "PAGES")},
        **{
            n: "i32"
            for n in (
                "stride_qb",
                "stride_qh",
                "stride_kb",
                "stride_kh",
                "stride_kn",
                "stride_vb",
                "stride_vh",
                "stride_vn",
                "stride_sb",
                "stride_sh",
                "stride_pb",
                "stride_ph",
                "stride_ob",
                "stride_oh",
                "stride_lb",
            )
        },  # fmt: skip
        "qk_scale": "fp32",
        "v_unit": "fp32",
    }
    variants = {}
    for group, D in ((3, 64), (6, 128)):
        base = {"GROUP": group, "GROUP_PAD": 16, "D": D, "D_PAD": D, "BLOCK_N": 64, "N_PAGES": 1, "PAGE": 1}
        variants[f"decode_attention g{group} d{D} bf16"] = (
            _decode_attention_kernel,
            attn_sig,
            {**base, "USE_PAGES": False, "SCALED": False, "F32": False},
        )
        variants[f"decode_attention g{group} d{D} int8"] = (
            _decode_attention_kernel,
            {**attn_sig, "K": "*i8", "V": "*i8"},
            {**base, "USE_PAGES": False, "SCALED": True, "F32": False},
        )
        variants[f"page_attention g{group} d{D} bf16 k8x16"] = (
            _decode_attention_kernel,
            attn_sig,
            {**base, "N_PAGES": 8, "PAGE": 16, "USE_PAGES": True, "SCALED": False, "F32": False},
        )
    rkv_sig = {"K": "*bf16", "VALID": "*u8", "ROWSUM": "*fp32", "LAST": "*i32", "LAST_VAL": "*fp32", "L": "i32"}
    rkv_sig.update({"threshold": "fp32", **{n: "i32" for n in ("stride_kn_", "stride_kh", "stride_kl", "stride_vn")}})
    window_sig = {"Q": "*bf16", "K": "*bf16", "VALID": "*u8", "OUT": "*fp32", "L": "i32", "W": "i32"}
    window_sig.update({n: "i32" for n in ("stride_qn", "stride_qh", "stride_ql", "stride_kn", "stride_kh",
                                          "stride_kl", "stride_vn", "stride_on", "stride_oh")})  # fmt: skip
    for group, w, D in ((3, 8, 64), (3, 32, 64), (6, 32, 128)):
        variants[f"window_scores g{group} w{w} d{D} bf16"] = (
            _window_kernel,
            window_sig,
            {"GROUP": group, "D": D, "D_PAD": D, "W_PAD": max(16, w), "BLOCK": 32, "F32": False},
        )
    for D in (64, 128):
        variants[f"rkv_redundancy d{D} bf16"] = (
            _rkv_rows_kernel,
            rkv_sig,
            {"H": 3, "D": D, "D_PAD": D, "BLOCK": rkv_block(D)},
        )
    return variants


def main() -> None:
    for name, (fn, sig, constexprs) in kernel_variants().items():
        print(name, asdict(resource_report(compile_for(fn, sig, constexprs))), flush=True)


if __name__ == "__main__":
    main()
