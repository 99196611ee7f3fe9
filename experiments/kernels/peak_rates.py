"""This CPU's peak arithmetic rates, against which the decode step's weight products are judged
(what bounds them). Results: docs/results/bench_quant.md.

A small C file is compiled here (gcc -O3 -march=native -fopenmp) and run through ctypes; each loop
keeps enough independent accumulators in registers to hide latency, with no memory traffic:
- ``fma``: float32 ``vfmadd231ps`` on 8 lanes (the float32 kernels' inner op): 8 MAC each;
- ``int8``: ``vpmaddubsw`` + ``vpmaddwd`` + ``vpaddd`` (the ``int8`` kernel's inner op): 32 MAC each;
- ``int8_sign``: the same with ``vpsignb`` twice in front (the ``int8_group`` kernel's inner op);
- ``fma512``: float32 ``vfmadd231ps`` on 16 lanes (where the CPU has AVX512F): 16 MAC each;
- ``bf16``: ``vdpbf16ps`` on 16 lanes (where it has AVX512-BF16; ``linear_bf16.c``'s inner op): 32 MAC each.
Each on 1 thread and on every thread (OpenMP), in giga multiply-accumulates per second, the best of 5.

    python3 experiments/kernels/peak_rates.py
"""

import ctypes
import os
import subprocess
import tempfile

import torch

from sparserl.bench.measure import best_seconds

SRC = r"""
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#define REP8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

double fma_loop(long iters, int threads) {
    double sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
        __m256 x = _mm256_set1_ps(1.0001f + omp_get_thread_num()), w = _mm256_set1_ps(0.9999f);
#define D(i) __m256 a##i = _mm256_set1_ps((float)i);
        REP8(D) __m256 a8 = _mm256_setzero_ps(), a9 = a8, a10 = a8, a11 = a8;
        for (long n = 0; n < iters; n++) {
#define F(i) a##i = _mm256_fmadd_ps(x, w, a##i);
            REP8(F) F(8) F(9) F(10) F(11)
            __asm__("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
            __asm__("" : "+x"(x), "+x"(w));
        }
        float out[8];
        __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                 _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
        s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
        _mm256_storeu_ps(out, s);
        sink += out[0];
    }
    return sink;
}

double int8_loop(long iters, int threads, int sign) {
    double sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
        __m256i x = _mm256_set1_epi8(3 + omp_get_thread_num()), w = _mm256_set1_epi8(-5),
                      ones = _mm256_set1_epi16(1);
#define DI(i) __m256i c##i = _mm256_set1_epi32(i);
        REP8(DI)
        if (sign) {
            for (long n = 0; n < iters; n++) {
#define S(i) c##i = _mm256_add_epi32(c##i, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(x, x), \
    _mm256_sign_epi8(w, x)), ones));
                REP8(S)
                __asm__("" : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(x), "+x"(w));
            }
        } else {
            for (long n = 0; n < iters; n++) {
#define I(i) c##i = _mm256_add_epi32(c##i, _mm256_madd_epi16(_mm256_maddubs_epi16(x, w), ones));
                REP8(I)
                __asm__("" : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(x), "+x"(w));
            }
        }
        int32_t out[8];
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                                     _mm256_add_epi32(_mm256_add_epi32(c4, c5), _mm256_add_epi32(c6, c7)));
        _mm256_storeu_si256((__m256i *)out, s);
        sink += out[0];
    }
    return sink;
}

/* 12 independent zmm accumulators a_i = OP(a_i, x, w), x and w of type T kept in registers */
#define ZMM_LOOP(NAME, T, X0, W0, OP)                                                         \
    double NAME(long iters, int threads) {                                                    \
        double sink = 0;                                                                      \
        _Pragma("omp parallel num_threads(threads) reduction(+ : sink)") {                    \
            T x = X0, w = W0;                                                                 \
            __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2),    \
                   a3 = _mm512_set1_ps(3), a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5),    \
                   a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7), a8 = _mm512_setzero_ps(),  \
                   a9 = a8, a10 = a8, a11 = a8;                                               \
            for (long n = 0; n < iters; n++) {                                                \
                a0 = OP(a0, x, w); a1 = OP(a1, x, w); a2 = OP(a2, x, w); a3 = OP(a3, x, w);   \
                a4 = OP(a4, x, w); a5 = OP(a5, x, w); a6 = OP(a6, x, w); a7 = OP(a7, x, w);   \
                a8 = OP(a8, x, w); a9 = OP(a9, x, w); a10 = OP(a10, x, w); a11 = OP(a11, x, w); \
                __asm__("" : "+v"(x), "+v"(w));                                               \
            }                                                                                 \
            __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)), \
                                     _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))); \
            s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11))); \
            sink += _mm512_reduce_add_ps(s);                                                  \
        }                                                                                     \
        return sink;                                                                          \
    }

#if defined(__AVX512F__)
#define FMA512(a, x, w) _mm512_fmadd_ps(x, w, a)
ZMM_LOOP(fma512_loop, __m512, _mm512_set1_ps(1.0001f + omp_get_thread_num()), _mm512_set1_ps(0.9999f), FMA512)
#endif
#if defined(__AVX512BF16__)
ZMM_LOOP(bf16_loop, __m512bh, (__m512bh)_mm512_set1_epi32(0x3F803F80 + omp_get_thread_num()),
         (__m512bh)_mm512_set1_epi32(0x3F7F3F7F), _mm512_dpbf16_ps)
#endif
"""


def build() -> ctypes.CDLL:
    d = tempfile.mkdtemp(prefix="peak_rates_")
    src, lib = os.path.join(d, "peak.c"), os.path.join(d, "peak.so")
    open(src, "w").write(SRC)
    subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", src, "-o", lib], check=True)
    dll = ctypes.CDLL(lib)
    dll.fma_loop.argtypes = [ctypes.c_long, ctypes.c_int]
    dll.int8_loop.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_int]
    dll.fma_loop.restype = dll.int8_loop.restype = ctypes.c_double
    for name in ("fma512_loop", "bf16_loop"):  # present where the CPU has the instructions
        if hasattr(dll, name):
            getattr(dll, name).argtypes = [ctypes.c_long, ctypes.c_int]
            getattr(dll, name).restype = ctypes.c_double
    return dll


def rate(fn, macs_per_iter: int, threads: int, iters: int = 20_000_000) -> float:
    best = best_seconds(lambda: fn(iters, threads), passes=5)
    return macs_per_iter * iters * threads / best / 1e9


def main() -> None:
    dll = build()
    threads = torch.get_num_threads()
    cases = {
        "fma (float32)": (lambda n, t: dll.fma_loop(n, t), 12 * 8),
        "int8 (maddubs+madd+add)": (lambda n, t: dll.int8_loop(n, t, 0), 8 * 32),
        "int8_sign (+2 vpsignb)": (lambda n, t: dll.int8_loop(n, t, 1), 8 * 32),
    }
    if hasattr(dll, "fma512_loop"):
        cases["fma512 (float32, zmm)"] = (lambda n, t: dll.fma512_loop(n, t), 12 * 16)
    if hasattr(dll, "bf16_loop"):
        cases["bf16 (vdpbf16ps, zmm)"] = (lambda n, t: dll.bf16_loop(n, t), 12 * 32)
    print(f"{'loop':26s} {'1 thread':>12s} {f'{threads} threads':>12s}   (GMAC/s, best of 5)")
    for name, (fn, macs) in cases.items():
        print(f"{name:26s} {rate(fn, macs, 1):12.1f} {rate(fn, macs, threads):12.1f}", flush=True)


if __name__ == "__main__":
    main()
