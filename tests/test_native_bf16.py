"""The bfloat16 weight products (sparserl.rollout.native, linear_bf16.c): the kernel against a
reference of the same bf16 values, the packed layouts (the AVX512-BF16 panels and the AMX tiles) on
a hand-built matrix, determinism, and the builds without AVX512-BF16 (AVX2, the portable C).

The AMX path runs only on a CPU with amx_bf16: there the default layout is the AMX one, and every
test below that packs with ``layout=None`` runs it; elsewhere ``layout="amx"`` runs the same packed
bytes on the portable loops."""

import pytest
import torch

from sparserl.rollout import native

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler: the torch path runs everywhere")

U32 = 2.0**-24  # float32's unit roundoff
U64 = 2.0**-53


def gamma(n: int, u: float) -> float:
    """Higham's γ_n = n u / (1 - n u): the relative bound of n roundings in a sum."""
    return n * u / (1 - n * u)


def error_bound(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, *, both_float32: bool) -> torch.Tensor:
    """Elementwise bound on |kernel - reference| for Y = bf16(x) bf16(w)ᵀ (+ b).

    Every product a_k c_k of two bfloat16 values is exact in float32 (8 x 8 significand bits fit in
    24) and in float64, so the kernel and any reference sum the same K exact terms (and the bias):
    they differ only in the roundings of the sums. A float32 sum of n terms in any order, each
    addition rounded to nearest (vdpbf16ps and tdpbf16ps add the two products of a pair one after
    the other, or with fewer roundings: no worse), is within γ_n Σ|terms| of the exact sum, γ_n =
    n u / (1 - n u), u = 2⁻²⁴ (Higham, Accuracy and Stability, §4.2), with n = K + 1 (K products
    and the bias; the first addition into 0 is exact, so this overcounts by one). Hence

        |kernel - exact| ≤ γ_{K+1}(u32) · (Σ_k |a_k c_k| + |b|)
        |kernel - float32 reference| ≤ 2 γ_{K+1}(u32) · (Σ_k |a_k c_k| + |b|)       (both_float32)

    and a float64 reference adds its own γ_{K+1}(u64) · (...) instead of the second γ(u32).
    vdpbf16ps / tdpbf16ps treat denormal inputs and results as zero: randn's bf16 values and their
    products are ~1e-38 away from that range, so it does not enter here."""
    K = x.shape[-1]
    mag = x.bfloat16().double().abs() @ w.bfloat16().double().abs().T
    if b is not None:
        mag = mag + b.double().abs()
    second = gamma(K + 1, U32) if both_float32 else gamma(K + 1, U64)
    return (gamma(K + 1, U32) + second) * mag


def check_product(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    """y against the float32 reference of the same bf16 values (``x.bfloat16().float() @
    w.bfloat16().float().T``) and against float64, each within :func:`error_bound`."""
    assert y.dtype == torch.float32 and y.shape == (*x.shape[:-1], w.shape[0])
    ref32 = x.bfloat16().float() @ w.bfloat16().float().T + (0 if b is None else b)
    ref64 = x.bfloat16().double() @ w.bfloat16().double().T + (0 if b is None else b.double())
    assert ((y.double() - ref32.double()).abs() <= error_bound(x, w, b, both_float32=True)).all()
    assert ((y.double() - ref64).abs() <= error_bound(x, w, b, both_float32=False)).all()


def case(M: int, N: int, K: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed * 1000003 + M * N + K)
    return torch.randn(N, K, generator=gen), torch.randn(M, K, generator=gen), torch.randn(N, generator=gen)


SHAPES = [  # rows M, out N, in K
    (16, 960, 576),  # SmolLM2's fused q/k/v at batch 16
    (16, 576, 1536),  # its down product
    (1, 576, 576),  # one row
    (17, 100, 65),  # rows past two 8-row tiles and one 16-row AMX block; N not a multiple of 16 or 32; K odd
    (5, 7, 5),  # N smaller than a panel, K smaller than a k-pair block
    (3, 33, 1),  # K = 1
    (9, 48, 100),  # K not a multiple of 32, N a multiple of 16 but not of 32
]
LAYOUTS = [None, "panels", "amx"]  # the machine's, the build's panels, the AMX tiles (C loops without AMX)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_bf16_product_within_the_bound_of_the_same_bf16_values(shape, bias, layout):
    M, N, K = shape
    w, x, b = case(M, N, K)
    b = b if bias else None
    y = native.linear_bf16(x, native.pack_linear_bf16(w, layout=layout), b)
    check_product(y, x, w, b)


@pytest.mark.parametrize("M", range(1, 18))
def test_every_row_count_up_to_17(M):
    """Every remainder of the AVX512 tiles (8, 4, 3, 2, 1 rows), of the AVX2 one (4 rows) and of the
    AMX row blocks (16)."""
    w, x, b = case(M, 70, 97, seed=1)
    for layout in LAYOUTS:
        check_product(native.linear_bf16(x, native.pack_linear_bf16(w, layout=layout), b), x, w, b)


def test_bf16_product_takes_batched_strided_inputs_and_adds_in_place():
    gen = torch.Generator().manual_seed(3)
    w, b = torch.randn(50, 40, generator=gen), torch.randn(50, generator=gen)
    wide = torch.randn(6, 1, 64, generator=gen)
    x = wide[..., 3:43]  # x [6, 1, 40], rows 64 apart
    packed = native.pack_linear_bf16(w)
    y = native.linear_bf16(x, packed, b)
    assert y.shape == (6, 1, 50)
    check_product(y, x, w, b)
    h = torch.randn(6, 1, 50, generator=gen)
    out = h.clone()
    assert native.linear_bf16(x, packed, b, add_to=out) is out
    torch.testing.assert_close(out, h + y, rtol=0, atol=1e-5)  # one more rounding: h + y


def test_bf16_product_declines_what_it_does_not_take():
    w = torch.randn(8, 4)
    packed = native.pack_linear_bf16(w)
    assert native.linear_bf16(torch.randn(2, 5), packed) is None  # wrong K
    assert native.linear_bf16(torch.randn(2, 4, dtype=torch.float64), packed) is None
    assert native.linear_bf16(torch.randn(2, 4), packed, torch.randn(7)) is None  # bias of the wrong size
    assert native.linear_bf16(torch.randn(2, 4), native.pack_linear(w)) is None  # float32 panels
    assert native.pack_linear_bf16(w.double()) is None and native.pack_linear_bf16(w.bfloat16()) is None
    with pytest.raises(ValueError):
        native.pack_linear_bf16(w, layout="tiles")
    with native.torch_only():
        assert native.linear_bf16(torch.randn(2, 4), packed) is None


def hand_built(N: int, K: int) -> torch.Tensor:
    """W[i][k] = (2i + 1) · 2^(k - 20): exact in bfloat16 (an odd significand below 256 and a power of
    two), and each value names its position (the odd part i, the exponent k)."""
    return torch.tensor([[(2 * i + 1) * 2.0 ** (k - 20) for k in range(K)] for i in range(N)], dtype=torch.float32)


def test_panels_layout_on_a_hand_built_matrix():
    """The build's panels: Wb[p][k // 2][j][k % 2] = W[NR p + j][k], 0 past N and K (K rounded up to 2)."""
    N, K = 40, 37  # neither a multiple of the panel width (16 or 32) nor of 2
    w = hand_built(N, K)
    assert torch.equal(w.bfloat16().float(), w)
    packed = native.pack_linear_bf16(w, layout="panels")
    nr = native.library().sparserl_bf16_panel_width()
    assert (packed.panel_width, packed.k_pad) == (nr, 2) and nr in (16, 32)
    flat = packed.float().tolist()
    P, K2 = -(-N // nr), -(-K // 2)
    assert len(flat) == P * K2 * nr * 2
    # a few positions written out: a k-pair of one column is adjacent, then the next column's pair
    assert flat[0:4] == [w[0, 0].item(), w[0, 1].item(), w[1, 0].item(), w[1, 1].item()]
    assert flat[2 * nr] == w[0, 2].item()  # the next k-pair row of the panel
    assert flat[2 * nr * K2] == w[nr, 0].item()  # the second panel
    assert flat[2 * nr * (K2 - 1) + 1] == 0.0  # column 0, k = 37: past K
    # every position, pure Python
    for p in range(P):
        for k2 in range(K2):
            for j in range(nr):
                for e in range(2):
                    n, k = nr * p + j, 2 * k2 + e
                    want = w[n, k].item() if n < N and k < K else 0.0
                    assert flat[((p * K2 + k2) * nr + j) * 2 + e] == want, (p, k2, j, e)
    assert torch.equal(native.unpack_bf16(packed), w.bfloat16())


def amx_tiles_reference(w: list[list[float]], N: int, K: int) -> list[float]:
    """The AMX B tiles in pure Python: for each 16-column panel p and each block b of 32 k, one tile of
    16 rows x 64 bytes, row r holding the k-pairs (32 b + 2 r, 32 b + 2 r + 1) of the 16 columns,
    column by column; tiles one after the other, b fastest; 0 past N and K."""
    out = []
    for p in range(-(-N // 16)):
        for b in range(-(-K // 32)):
            for r in range(16):
                for j in range(16):
                    for e in range(2):
                        n, k = 16 * p + j, 32 * b + 2 * r + e
                        out.append(w[n][k] if n < N and k < K else 0.0)
    return out


def test_amx_tile_layout_on_a_hand_built_matrix():
    """The AMX layout from the C packer (callable on any CPU) equals the pure-Python tiles."""
    N, K = 40, 70  # three 16-column panels, the last partial; three 32-k blocks, the last partial
    w = hand_built(N, K)
    packed = native.pack_linear_bf16(w, layout="amx")
    assert (packed.panel_width, packed.k_pad) == (16, 32)
    flat = packed.float().tolist()
    ref = amx_tiles_reference(w.tolist(), N, K)
    assert len(flat) == len(ref) == 3 * 3 * 512
    assert flat == ref
    tile = 16 * 32  # bf16 per tile: 16 rows x 64 bytes
    assert flat[tile] == w[0, 32].item()  # panel 0, block 1 starts at k = 32
    assert flat[3 * tile + 2] == w[17, 0].item()  # panel 1, block 0, row 0, column 1
    assert torch.equal(native.unpack_bf16(packed), w.bfloat16())


def test_rounding_to_bf16_is_torchs():
    """The activations' rounding (round to nearest even; overflow → inf; denormals kept) gives the
    bits of ``x.bfloat16()``, in the vector loops and their scalar tail; a NaN gives a NaN (0x7FC0,
    c10::BFloat16's; torch's vectorized conversion writes 0xFFFF)."""
    special = [
        0.0,
        -0.0,
        1.0,
        1.00390625,
        1.01171875,
        1.0 + 2**-8 + 2**-20,
        float("inf"),
        -float("inf"),
        float("nan"),
        -float("nan"),
        3.4028235e38,
        -3.4028235e38,
        1e-39,
        -1e-40,
        1.17549435e-38,
        2**-8 + 2**-16,
    ]  # ties to even both ways, just past a tie, largest float → inf, denormals
    gen = torch.Generator().manual_seed(4)
    x = torch.cat(
        [
            torch.tensor(special),
            torch.randn(1000, generator=gen) * 10.0 ** torch.randint(-40, 38, (1000,), generator=gen),
        ]
    )
    x = x.float()
    for n in (len(x), 13):  # the vector loops and the tail
        assert same_bf16(native.to_bf16(x[:n]), x[:n].bfloat16())


def same_bf16(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same bits, any NaN equal to any NaN."""
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a[~nan].view(torch.int16), b[~nan].view(torch.int16))


def test_bf16_product_is_deterministic():
    """The same bits run to run and on 1 or 2 threads (each output is summed by one thread, in k order)."""
    w, x, b = case(16, 960, 576, seed=5)
    packed = native.pack_linear_bf16(w)
    first = native.linear_bf16(x, packed, b)
    for _ in range(3):
        assert torch.equal(native.linear_bf16(x, packed, b), first)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(native.linear_bf16(x, packed, b), first)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(native.pack_linear_bf16(w), packed)


def test_kernel_names_this_cpu():
    flags = native.cpu_flags()
    kernel = native.bf16_kernel()
    if "amx_bf16" in flags and "avx512_bf16" in flags:
        assert kernel in ("amx", "avx512_bf16")  # amx unless the compiler or the OS refuses the tiles
    elif "avx512_bf16" in flags and "avx512bw" in flags:
        assert kernel == "avx512_bf16"
    elif "avx2" in flags:
        assert kernel == "avx2"
    layout = native.pack_linear_bf16(torch.randn(3, 3))
    assert (layout.panel_width, layout.k_pad) == (
        (16, 32) if kernel == "amx" else (native.library().sparserl_bf16_panel_width(), 2)
    )


@pytest.fixture(scope="module")
def amx_emulated_build():
    """The library with every AMX tile instruction replaced by C of its documented semantics
    (``-DSPARSERL_AMX_EMULATE``, linear_bf16.c): the AMX path's own loops (16-row blocks, two panels a
    step, the tails, a tile configuration per thread) on any CPU. Not its speed."""
    return native.load(native.build(flags=native.flags_for("-march=native -DSPARSERL_AMX_EMULATE")))


def test_the_amx_path_with_emulated_tiles_is_within_the_bound(amx_emulated_build):
    """What an AMX CPU runs, up to the instructions themselves: bf16_kernel() names it, the default
    layout is the AMX tiles, and every shape (rows past a 16-row block, N and K not multiples of 16 or
    32, one row, K = 1) is within the bound, adding in place too, the same bits on 1 or 2 threads."""
    lib = amx_emulated_build
    assert native.bf16_kernel(lib) == "amx"
    for M, N, K in [*SHAPES, (33, 50, 96)]:
        w, x, b = case(M, N, K, seed=7)
        packed = native.pack_linear_bf16(w, lib=lib)
        assert (packed.panel_width, packed.k_pad) == (16, 32)
        assert torch.equal(packed, native.pack_linear_bf16(w, layout="amx"))
        y = native.linear_bf16(x, packed, b, lib=lib)
        check_product(y, x, w, b)
        base = torch.randn(M, N)
        added = base.clone()
        assert native.linear_bf16(x, packed, b, lib=lib, add_to=added) is not None
        assert ((added - base - y).abs() <= 1e-5 * (1 + y.abs())).all()
    w, x, b = case(17, 100, 65, seed=8)
    packed = native.pack_linear_bf16(w, lib=lib)
    threads = torch.get_num_threads()
    first = native.linear_bf16(x, packed, b, lib=lib)
    try:
        torch.set_num_threads(1)
        assert torch.equal(native.linear_bf16(x, packed, b, lib=lib), first)
    finally:
        torch.set_num_threads(threads)


def test_the_amx_prefetch_build_gives_the_same_bits(amx_emulated_build):
    """``-DAMX_PREFETCH=2`` (B tiles prefetched two k-blocks ahead, a variant an AMX machine times,
    experiments/kernels/bf16_kernel_variants.py) compiles and changes no bit: a prefetch is only a hint."""
    prefetching = native.load(
        native.build(flags=native.flags_for("-march=native -DSPARSERL_AMX_EMULATE -DAMX_PREFETCH=2"))
    )
    for M, N, K in [(16, 960, 576), (33, 50, 96), (3, 33, 1)]:
        w, x, b = case(M, N, K, seed=9)
        packed = native.pack_linear_bf16(w, lib=prefetching)
        assert torch.equal(
            native.linear_bf16(x, packed, b, lib=prefetching), native.linear_bf16(x, packed, b, lib=amx_emulated_build)
        )


@pytest.fixture(scope="module")
def portable_build():
    """The library without -march (the plain C loops a CPU without AVX2 runs)."""
    return native.load(native.build(flags=native.flags_for("")))


@pytest.mark.parametrize("build", ["portable", "avx2"])
def test_builds_without_avx512_bf16(build, portable_build, avx2_build):
    """The portable C and the plain AVX2 build (16-column panels, the bf16 values widened to float32):
    bf16_kernel() names them, they pack the same values and their products are within the bound."""
    lib = portable_build if build == "portable" else avx2_build
    assert native.bf16_kernel(lib) == ("c" if build == "portable" else "avx2")
    assert lib.sparserl_bf16_panel_width() == 16
    for M, N, K in [(16, 960, 576), (17, 100, 65), (3, 33, 1), (4, 16, 64)]:
        w, x, b = case(M, N, K, seed=6)
        for layout in (None, "amx"):
            packed = native.pack_linear_bf16(w, layout=layout, lib=lib)
            assert torch.equal(native.unpack_bf16(packed), w.bfloat16())
            y = native.linear_bf16(x, packed, b, lib=lib)
            check_product(y, x, w, b)
            ours = native.linear_bf16(x, native.pack_linear_bf16(w, layout=layout), b)
            assert ((y.double() - ours.double()).abs() <= error_bound(x, w, b, both_float32=True)).all()
    assert torch.equal(native.pack_linear_bf16(w, layout="amx", lib=lib), native.pack_linear_bf16(w, layout="amx"))
    x = torch.tensor([1.00390625, float("nan"), 1e-39, 3.4028235e38, 1.01171875] * 5)
    assert same_bf16(native.to_bf16(x, lib=lib), x.bfloat16())
