/* The decode step's weight products in bfloat16:
 *
 *     Y[m][n] (+)= sum_k bf16(X[m][k]) * Wb[n][k]  (+ bias[n])        float32 accumulation
 *
 * X [M, K] float32 (rows ldx apart) is rounded to bfloat16 inside the call, round-to-nearest-even
 * as torch's .to(torch.bfloat16) (the same bits, denormals kept; NaN -> 0x7FC0 as c10::BFloat16);
 * Wb = bf16(W) [N, K] was rounded the same way once, when packed. Every product of two bfloat16 values is exact in
 * float32 (8 x 8 significand bits), so the paths below differ only in the order of the float32 sums.
 *
 * Packed weights: panels of `width` output columns, k in pairs (the VNNI order of vdpbf16ps):
 *
 *     Wb[p][k/2][j][k%2] = bf16(W[width p + j][k])        (0 past N, and past K up to K rounded to kpad)
 *
 * - AVX512-BF16 (width 32, kpad 2): one panel row of 32 columns x 2 k is two 64-byte registers; a
 *   tile of up to 8 rows x 32 columns keeps 16 accumulators of 16 floats, and one
 *   _mm512_dpbf16_ps per register adds x[2i] w[2i] + x[2i+1] w[2i+1] to each column's sum.
 * - AMX (width 16, kpad 32): the same order, and then 16 consecutive rows of a 16-column panel
 *   (16 rows x 64 bytes; row r holds the k-pairs (2r, 2r+1) of the 16 columns) are exactly one
 *   B tile of _tile_dpbf16ps: tile (p, b) = Wb[p][16 b : 16 b + 16] = 1 KB contiguous. A tile of 16
 *   rows of bf16(X) x 32 k (an A tile) times two B tiles adds into two 16 x 16 float32 C tiles.
 *   Compiled only where the build targets AVX512-BF16 (every AMX CPU has it) with a compiler that
 *   knows the AMX target (gcc >= 11, clang >= 12), and run only where CPUID says amx-tile and
 *   amx-bf16 and Linux grants the tile state (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)).
 * - AVX2 (width 16, kpad 2; a CPU without AVX512-BF16): a 32-bit lane of a panel row holds one
 *   column's two bf16, so a shift left by 16 and a mask give the two k as floats; a tile of up to 4
 *   rows x 16 columns, each k-pair two FMAs into the same accumulator.
 * - Portable C: any width and kpad (so also the AMX layout on a machine without AMX), float32
 *   arithmetic on the bf16 values, one output at a time.
 * Panels are split over OpenMP threads (torch's libgomp pool), as in linear.c. `accumulate` = 1
 * adds to what Y holds (the residual stream).
 *
 * Why: a decode step at 16 rows streams every weight from memory once per step; bf16 halves those
 * bytes, and vdpbf16ps does twice the multiply-adds of a float32 FMA per instruction.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "simd.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define BF16_AVX512 1
#define NRB 32 /* the build's panel width: two 64-byte registers of 16 columns x 2 k */
#else
#define BF16_AVX512 0
#define NRB 16
#endif

#if defined(SPARSERL_AMX_EMULATE) && !defined(SPARSERL_NO_AMX)
/* Tests only (tests/test_native_bf16.py): the AMX path's own loops on any CPU, each tile instruction
 * replaced below by C with its documented semantics, so that its indexing, tails and threads are
 * checked where no AMX CPU is at hand. Not the speed, not the hardware's rounding. */
#define BF16_AMX 1
#define AMX_EMULATED 1
#elif BF16_AVX512 && defined(__x86_64__) && defined(__linux__) && !defined(SPARSERL_NO_AMX) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define BF16_AMX 1
#define AMX_EMULATED 0
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define BF16_AMX 0
#endif

/* How many panel rows (k-pairs) ahead the first row block prefetches (0: none): 64, for both tiles.
 * On the 2-core AMD EPYC with AVX512-BF16 streaming SmolLM2's products at 16 rows, the AVX512 tile ran
 * 1.18x faster with 64 rows ahead than with none (16 rows ahead gained less), the bf16 decode step
 * 1.09-1.10x, the same bits (docs/results/bf16_linear/); the AVX2 tile keeps linear.c's habit. */
#ifndef PREFETCH_K2
#define PREFETCH_K2 64
#endif

enum { KERNEL_C = 0, KERNEL_AVX2 = 1, KERNEL_AVX512_BF16 = 2, KERNEL_AMX = 3 };

int sparserl_bf16_panel_width(void) { return NRB; }

/* float32 -> bfloat16 bits, round to nearest even (torch's c10::BFloat16 round_to_nearest_even) */
static inline uint16_t bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (f != f) return 0x7FC0;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static inline float bf16_float(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* x[0:n] -> bf16 bits (`to_float` = 0) or the same values as float32 (`to_float` = 1) */
static void round_row(const float *x, int n, void *out, int to_float) {
    int k = 0;
    uint16_t *h = (uint16_t *)out;
    float *f = (float *)out;
#if defined(__AVX512F__)
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7FFF), qnan = _mm512_set1_epi32(0x7FC0);
    for (; k + 16 <= n; k += 16) {
        const __m512 v = _mm512_loadu_ps(x + k);
        const __m512i u = _mm512_castps_si512(v);
        __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
        r = _mm512_mask_mov_epi32(_mm512_srli_epi32(r, 16), _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), qnan);
        if (to_float)
            _mm512_storeu_si512((void *)(f + k), _mm512_slli_epi32(r, 16));
        else
            _mm256_storeu_si256((__m256i *)(h + k), _mm512_cvtepi32_epi16(r));
    }
#elif defined(__AVX2__)
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7FFF), qnan = _mm256_set1_epi32(0x7FC0);
    for (; k + 8 <= n; k += 8) {
        const __m256 v = _mm256_loadu_ps(x + k);
        const __m256i u = _mm256_castps_si256(v);
        __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(half, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
        r = _mm256_srli_epi32(r, 16);
        r = _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
        if (to_float) {
            _mm256_storeu_si256((__m256i *)(f + k), _mm256_slli_epi32(r, 16));
        } else {
            const __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
            _mm_storeu_si128((__m128i *)(h + k), p);
        }
    }
#endif
    for (; k < n; k++) {
        const uint16_t b = bf16_round(x[k]);
        if (to_float)
            f[k] = bf16_float(b);
        else
            h[k] = b;
    }
}

/* x[0:n] float32 -> bf16 bits (torch's rounding; tests compare the bits) */
void sparserl_to_bf16(int64_t n, const float *x, uint16_t *out) {
    for (int64_t i = 0; i < n; i += 1 << 20) round_row(x + i, (int)(n - i < (1 << 20) ? n - i : 1 << 20), out + i, 0);
}

/* W [N, K] float32 -> Wb (P * Kp * width bf16, P = N rounded up to width / width, Kp = K rounded up
 * to kpad, an even number): Wb[p][k/2][j][k%2] = bf16(W[width p + j][k]), 0 past N and K. */
void sparserl_pack_bf16(int N, int K, int width, int kpad, const float *W, uint16_t *Wb) {
    const int P = (N + width - 1) / width, Kp = (K + kpad - 1) / kpad * kpad;
#pragma omp parallel for schedule(static)
    for (int p = 0; p < P; p++)
        for (int k = 0; k < Kp; k++)
            for (int j = 0; j < width; j++) {
                const int n = p * width + j;
                Wb[(((int64_t)p * (Kp / 2) + k / 2) * width + j) * 2 + (k & 1)] =
                    n < N && k < K ? bf16_round(W[(int64_t)n * K + k]) : 0;
            }
}

/* ---- AMX: compiled where BF16_AMX, run where amx_usable() ---- */
#if BF16_AMX
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* the tile configuration (palette 1): tiles 0-1 C (16 x 16 float32), 2 A (16 rows x 32 bf16 of X),
 * 3-4 B (16 k-pairs x 16 columns); every tile 16 rows of 64 bytes. Static, so no store is elided. */
static const struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config = {1, 0, {0}, {64, 64, 64, 64, 64}, {16, 16, 16, 16, 16}};

#if AMX_EMULATED
/* Intel's definitions (Intel 64 and IA-32 Architectures Software Developer's Manual, LDTILECFG, TILELOADD,
 * TILESTORED, TILEZERO, TDPBF16PS) on per-thread tiles: each tile `rows` rows of `colsb` bytes, as the
 * configuration last loaded by this thread says. TDPBF16PS: for every row m of A and column n of C,
 * C[m][n] += sum over the k-pairs k < colsb(A) / 4 of A[m][2k] B[k][2n] + A[m][2k+1] B[k][2n+1], in float32. */
static _Thread_local struct {
    int rows, colsb;
    unsigned char data[16][64];
} emu_tile[8];

static float emu_bf16(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void emu_loadconfig(const void *config) {
    const unsigned char *c = (const unsigned char *)config;
    for (int t = 0; t < 8; t++) {
        uint16_t colsb;
        memcpy(&colsb, c + 16 + 2 * t, 2);
        emu_tile[t].colsb = colsb;
        emu_tile[t].rows = c[48 + t];
    }
}

static void emu_zero(int t) { memset(emu_tile[t].data, 0, sizeof emu_tile[t].data); }

static void emu_loadd(int t, const void *base, int64_t stride) {
    for (int r = 0; r < emu_tile[t].rows; r++)
        memcpy(emu_tile[t].data[r], (const unsigned char *)base + r * stride, (size_t)emu_tile[t].colsb);
}

static void emu_stored(int t, void *base, int64_t stride) {
    for (int r = 0; r < emu_tile[t].rows; r++)
        memcpy((unsigned char *)base + r * stride, emu_tile[t].data[r], (size_t)emu_tile[t].colsb);
}

static void emu_dpbf16ps(int c, int a, int b) {
    for (int m = 0; m < emu_tile[a].rows; m++)
        for (int n = 0; n < emu_tile[c].colsb / 4; n++) {
            float acc;
            memcpy(&acc, emu_tile[c].data[m] + 4 * n, 4);
            for (int k = 0; k < emu_tile[a].colsb / 4; k++)
                acc += emu_bf16(emu_tile[a].data[m] + 4 * k) * emu_bf16(emu_tile[b].data[k] + 4 * n) +
                       emu_bf16(emu_tile[a].data[m] + 4 * k + 2) * emu_bf16(emu_tile[b].data[k] + 4 * n + 2);
            memcpy(emu_tile[c].data[m] + 4 * n, &acc, 4);
        }
}

#define _tile_loadconfig(config) emu_loadconfig(config)
#define _tile_zero(t) emu_zero(t)
#define _tile_loadd(t, base, stride) emu_loadd(t, base, stride)
#define _tile_stored(t, base, stride) emu_stored(t, base, stride)
#define _tile_dpbf16ps(c, a, b) emu_dpbf16ps(c, a, b)
#define _tile_release() ((void)0)
#define AMX_TARGET
static int amx_usable(void) { return 1; }
#else
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
static int amx_usable(void) {
    static int state = -1; /* -1: not asked yet */
    if (state < 0) {
        unsigned a, b, c, d;
        int ok = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) /* amx-tile */ && (d >> 22 & 1) /* amx-bf16 */;
        ok = ok && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
        state = ok;
    }
    return state;
}
#endif

/* How many k-blocks (B tiles of 32 k) ahead the AMX path prefetches its two panels' B tiles, in the first
 * 16-row block (0: none). One: measured on an AMX Xeon (2 vCPUs of the GPU machines' 16-core host, 2026-11-28,
 * docs/results/amx_xeon/), a decode step's weight products at 16 rows took 12.7 ms with 1 against 15.0 ms
 * with none (1.18x, median of 3 per-round ratios; 2 and 4 blocks ahead 1% and 3% slower than 1). */
#ifndef AMX_PREFETCH
#define AMX_PREFETCH 1
#endif

/* Y (+)= Xb Wb^T over the 16-column panels [p0, p1) (Xb: Mp = M rounded up to 16 rows of Kp bf16,
 * zero past M and K), two panels (two C tiles) at a time. Each thread configures its own tiles. */
AMX_TARGET static void amx_panels(int M, int N, int Kp, const uint16_t *Xb, const uint16_t *Wb, const float *bias,
                                  float *Y, int64_t ldy, int accumulate) {
    const int P = (N + 15) / 16, KB = Kp / 32;
    const int64_t tile = 16 * 32; /* bf16 per B tile */
#pragma omp parallel
    {
        float c[2][16][16];
        _tile_loadconfig(&amx_config);
#pragma omp for schedule(static)
        for (int q = 0; q < (P + 1) / 2; q++) {
            const int p = 2 * q, two = p + 1 < P;
            const uint16_t *w0 = Wb + (int64_t)p * KB * tile, *w1 = w0 + (int64_t)KB * tile;
            for (int m0 = 0; m0 < M; m0 += 16) {
                const uint16_t *x = Xb + (int64_t)m0 * Kp;
                _tile_zero(0);
                _tile_zero(1);
                for (int b = 0; b < KB; b++) {
                    if (AMX_PREFETCH && m0 == 0 && b + AMX_PREFETCH < KB)
                        for (int line = 0; line < 16; line++) { /* the B tiles AMX_PREFETCH k-blocks ahead */
                            __builtin_prefetch(w0 + (b + AMX_PREFETCH) * tile + 32 * line, 0, 3);
                            if (two) __builtin_prefetch(w1 + (b + AMX_PREFETCH) * tile + 32 * line, 0, 3);
                        }
                    _tile_loadd(2, x + 32 * b, 2 * Kp);
                    _tile_loadd(3, w0 + b * tile, 64);
                    _tile_dpbf16ps(0, 2, 3);
                    if (two) {
                        _tile_loadd(4, w1 + b * tile, 64);
                        _tile_dpbf16ps(1, 2, 4);
                    }
                }
                _tile_stored(0, c[0], 64);
                _tile_stored(1, c[1], 64);
                for (int h = 0; h < 1 + two; h++) {
                    const int n0 = (p + h) * 16, ncols = N - n0 < 16 ? N - n0 : 16;
                    for (int r = 0; r < 16 && m0 + r < M; r++)
                        store_tail(Y + (m0 + r) * ldy + n0, c[h][r], ncols, bias ? bias + n0 : 0, accumulate);
                }
            }
        }
        _tile_release();
    }
}
#endif

/* ---- AVX512-BF16: a tile of up to 8 rows x 32 columns ---- */
#if BF16_AVX512
#ifndef RB
#define RB 8 /* rows per tile (8 or 4) */
#endif

/* the two bf16 of X[r][2 k2], X[r][2 k2 + 1] as one 32-bit lane */
static inline int32_t pair(const uint16_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#define T_DECL(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = c##r##0;
#define T_DOT(r)                                                                   \
    if (MR > r) {                                                                  \
        const __m512bh x = (__m512bh)_mm512_set1_epi32(pair(xp + 2 * ((int64_t)(r) * ldp + k2))); \
        c##r##0 = _mm512_dpbf16_ps(c##r##0, x, w0);                                \
        c##r##1 = _mm512_dpbf16_ps(c##r##1, x, w1);                                \
    }
#define T_STORE(r) \
    if (MR > r) store_row32(Y + (int64_t)(r) * ldy, c##r##0, c##r##1, ncols, bias, accumulate);

/* MR (1..8) rows of Xb (bf16, 2 ldp apart: ldp k-pairs a row) times one panel of K2 k-pairs */
static inline __attribute__((always_inline)) void tile(const int MR, int K2, const uint16_t *xp, int64_t ldp,
                                                        const uint16_t *w, float *Y, int64_t ldy, int ncols,
                                                        const float *bias, int accumulate, int prefetch) {
    T_DECL(0) T_DECL(1) T_DECL(2) T_DECL(3) T_DECL(4) T_DECL(5) T_DECL(6) T_DECL(7)
    for (int k2 = 0; k2 < K2; k2++) {
        if (PREFETCH_K2 && prefetch) {
            _mm_prefetch((const char *)(w + (int64_t)(k2 + PREFETCH_K2) * 2 * NRB), _MM_HINT_T0);
            _mm_prefetch((const char *)(w + (int64_t)(k2 + PREFETCH_K2) * 2 * NRB + 32), _MM_HINT_T0);
        }
        __m512bh w0 = (__m512bh)_mm512_loadu_si512((const void *)(w + (int64_t)k2 * 2 * NRB));
        __m512bh w1 = (__m512bh)_mm512_loadu_si512((const void *)(w + (int64_t)k2 * 2 * NRB + 32));
        __asm__("" : "+v"(w0), "+v"(w1)); /* keep the panel row in registers (linear.c) */
        T_DOT(0) T_DOT(1) T_DOT(2) T_DOT(3) T_DOT(4) T_DOT(5) T_DOT(6) T_DOT(7)
    }
    T_STORE(0) T_STORE(1) T_STORE(2) T_STORE(3) T_STORE(4) T_STORE(5) T_STORE(6) T_STORE(7)
}

static void panel(int M, int K2, const uint16_t *xp, int64_t ldp, const uint16_t *w, float *Y, int64_t ldy,
                  int ncols, const float *bias, int accumulate) {
    int m = 0;
    for (; m + RB <= M; m += RB) tile(RB, K2, xp + 2 * m * ldp, ldp, w, Y + m * ldy, ldy, ncols, bias, accumulate, m == 0);
    if (m + 4 <= M) {
        tile(4, K2, xp + 2 * m * ldp, ldp, w, Y + m * ldy, ldy, ncols, bias, accumulate, m == 0);
        m += 4;
    }
    const int pf = m == 0;
    switch (M - m) {
        case 3: tile(3, K2, xp + 2 * m * ldp, ldp, w, Y + m * ldy, ldy, ncols, bias, accumulate, pf); break;
        case 2: tile(2, K2, xp + 2 * m * ldp, ldp, w, Y + m * ldy, ldy, ncols, bias, accumulate, pf); break;
        case 1: tile(1, K2, xp + 2 * m * ldp, ldp, w, Y + m * ldy, ldy, ncols, bias, accumulate, pf); break;
        default: break;
    }
}

/* ---- AVX2: a tile of up to 4 rows x 16 columns on the bf16 values widened to float32 ---- */
#elif defined(__AVX2__)
static inline void store_row(float *y, __m256 a, __m256 b, int ncols, const float *bias, int accumulate) {
    if (ncols == NRB) {
        if (bias) {
            a = _mm256_add_ps(a, _mm256_loadu_ps(bias));
            b = _mm256_add_ps(b, _mm256_loadu_ps(bias + 8));
        }
        if (accumulate) {
            a = _mm256_add_ps(a, _mm256_loadu_ps(y));
            b = _mm256_add_ps(b, _mm256_loadu_ps(y + 8));
        }
        _mm256_storeu_ps(y, a);
        _mm256_storeu_ps(y + 8, b);
        return;
    }
    float t[NRB];
    _mm256_storeu_ps(t, a);
    _mm256_storeu_ps(t + 8, b);
    store_tail(y, t, ncols, bias, accumulate);
}

#define T_DECL(r) __m256 c##r##0 = _mm256_setzero_ps(), c##r##1 = c##r##0;
#define T_DOT(r)                                                       \
    if (MR > r) {                                                      \
        const __m256 xe = _mm256_broadcast_ss(xf + (int64_t)(r) * ldf + 2 * k2); \
        const __m256 xo = _mm256_broadcast_ss(xf + (int64_t)(r) * ldf + 2 * k2 + 1); \
        c##r##0 = _mm256_fmadd_ps(xo, w0o, _mm256_fmadd_ps(xe, w0e, c##r##0)); \
        c##r##1 = _mm256_fmadd_ps(xo, w1o, _mm256_fmadd_ps(xe, w1e, c##r##1)); \
    }
#define T_STORE(r) \
    if (MR > r) store_row(Y + (int64_t)(r) * ldy, c##r##0, c##r##1, ncols, bias, accumulate);

/* MR (1..4) rows of the bf16 values of X as float32 (ldf apart) times one panel of K2 k-pairs */
static inline __attribute__((always_inline)) void tile(const int MR, int K2, const float *xf, int64_t ldf,
                                                        const uint16_t *w, float *Y, int64_t ldy, int ncols,
                                                        const float *bias, int accumulate, int prefetch) {
    const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
    T_DECL(0) T_DECL(1) T_DECL(2) T_DECL(3)
    for (int k2 = 0; k2 < K2; k2++) {
        if (PREFETCH_K2 && prefetch) _mm_prefetch((const char *)(w + (int64_t)(k2 + PREFETCH_K2) * 2 * NRB), _MM_HINT_T0);
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(w + (int64_t)k2 * 2 * NRB));
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(w + (int64_t)k2 * 2 * NRB + 16));
        /* lane j: W[j][2 k2] in its low 16 bits, W[j][2 k2 + 1] in its high 16 */
        __m256 w0e = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)), w0o = _mm256_castsi256_ps(_mm256_and_si256(v0, hi));
        __m256 w1e = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)), w1o = _mm256_castsi256_ps(_mm256_and_si256(v1, hi));
        __asm__("" : "+x"(w0e), "+x"(w0o), "+x"(w1e), "+x"(w1o));
        T_DOT(0) T_DOT(1) T_DOT(2) T_DOT(3)
    }
    T_STORE(0) T_STORE(1) T_STORE(2) T_STORE(3)
}

static void panel(int M, int K2, const float *xf, int64_t ldf, const uint16_t *w, float *Y, int64_t ldy, int ncols,
                  const float *bias, int accumulate) {
    int m = 0;
    for (; m + 4 <= M; m += 4) tile(4, K2, xf + m * ldf, ldf, w, Y + m * ldy, ldy, ncols, bias, accumulate, m == 0);
    const int pf = m == 0;
    switch (M - m) {
        case 3: tile(3, K2, xf + m * ldf, ldf, w, Y + m * ldy, ldy, ncols, bias, accumulate, pf); break;
        case 2: tile(2, K2, xf + m * ldf, ldf, w, Y + m * ldy, ldy, ncols, bias, accumulate, pf); break;
        case 1: tile(1, K2, xf + m * ldf, ldf, w, Y + m * ldy, ldy, ncols, bias, accumulate, pf); break;
        default: break;
    }
}
#endif

/* Portable C, any layout: one panel of `width` columns, one output at a time, k in order */
static void panel_c(int M, int Kp, const float *xf, int64_t ldf, const uint16_t *w, int width, float *Y,
                    int64_t ldy, int ncols, const float *bias, int accumulate) {
    for (int r = 0; r < M; r++)
        for (int j = 0; j < ncols; j++) {
            float s = 0.f;
            for (int k = 0; k < Kp; k++) s += xf[(int64_t)r * ldf + k] * bf16_float(w[((int64_t)(k / 2) * width + j) * 2 + (k & 1)]);
            float *y = Y + (int64_t)r * ldy + j;
            *y = (accumulate ? *y : 0.f) + (bias ? s + bias[j] : s);
        }
}

/* which kernel runs packed weights of this width and kpad here */
static int kernel_for(int width, int kpad) {
#if BF16_AMX
    if (width == 16 && kpad % 32 == 0 && amx_usable()) return KERNEL_AMX;
#endif
#if BF16_AVX512
    if (width == NRB) return KERNEL_AVX512_BF16;
#elif defined(__AVX2__)
    if (width == NRB) return KERNEL_AVX2;
#endif
    (void)width;
    (void)kpad;
    return KERNEL_C;
}

/* The kernel sparserl_linear_bf16 runs here on weights packed with this width and kpad (codes as below) */
int sparserl_bf16_kernel_for(int width, int kpad) { return width > 0 && kpad > 0 ? kernel_for(width, kpad) : -1; }

/* The kernel this machine runs on the layout it packs for by default (sparserl_bf16_default_layout):
 * 3 AMX, 2 AVX512-BF16, 1 AVX2, 0 portable C. */
int sparserl_bf16_kernel(void) {
#if BF16_AMX
    if (amx_usable()) return KERNEL_AMX;
#endif
    return kernel_for(NRB, 2);
}

/* The layout that kernel takes: width and kpad as (width << 8) | kpad (AMX 16, 32; else NRB, 2). */
int sparserl_bf16_default_layout(void) {
    return sparserl_bf16_kernel() == KERNEL_AMX ? (16 << 8) | 32 : (NRB << 8) | 2;
}

/* Y (+)= X Wb^T (+ bias) on weights packed by sparserl_pack_bf16(width, kpad). 0, -1 on bad
 * arguments, -2 without memory. */
int sparserl_linear_bf16(int M, int N, int K, const float *X, int64_t ldx, const uint16_t *Wb, int width, int kpad,
                         const float *bias, float *Y, int64_t ldy, int accumulate) {
    if (M <= 0 || N <= 0 || K <= 0 || width <= 0 || kpad <= 0 || kpad % 2) return -1;
    const int kernel = kernel_for(width, kpad), P = (N + width - 1) / width;
    const int Kp = (K + kpad - 1) / kpad * kpad, K2 = Kp / 2;
    const int bf16_rows = kernel >= KERNEL_AVX512_BF16; /* X as bf16 bits, else as float32 values */
    const int Mp = kernel == KERNEL_AMX ? (M + 15) / 16 * 16 : M;
    void *xbuf = calloc((size_t)Mp * Kp, bf16_rows ? 2 : 4); /* zero past M and K */
    if (!xbuf) return -2;
    for (int r = 0; r < M; r++)
        round_row(X + (int64_t)r * ldx, K, bf16_rows ? (void *)((uint16_t *)xbuf + (int64_t)r * Kp)
                                                     : (void *)((float *)xbuf + (int64_t)r * Kp), !bf16_rows);
#if BF16_AMX
    if (kernel == KERNEL_AMX) {
        amx_panels(M, N, Kp, (const uint16_t *)xbuf, Wb, bias, Y, ldy, accumulate);
        free(xbuf);
        return 0;
    }
#endif
#pragma omp parallel for schedule(static)
    for (int p = 0; p < P; p++) {
        const int n0 = p * width, ncols = N - n0 < width ? N - n0 : width;
        const uint16_t *w = Wb + (int64_t)p * K2 * width * 2;
        float *y = Y + n0;
        const float *b = bias ? bias + n0 : 0;
#if BF16_AVX512
        if (kernel == KERNEL_AVX512_BF16) {
            panel(M, K2, (const uint16_t *)xbuf, K2, w, y, ldy, ncols, b, accumulate);
            continue;
        }
#elif defined(__AVX2__)
        if (kernel == KERNEL_AVX2) {
            panel(M, K2, (const float *)xbuf, Kp, w, y, ldy, ncols, b, accumulate);
            continue;
        }
#endif
        panel_c(M, Kp, (const float *)xbuf, Kp, w, width, y, ldy, ncols, b, accumulate);
    }
    free(xbuf);
    return 0;
}
