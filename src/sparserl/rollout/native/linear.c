/* The decode step's weight products on CPU: Y (+)= X W^T (+ bias) for a few rows of X.
 *
 * X [M, K] float32 (rows ldx apart), W [N, K] float32 stored once in a packed layout, Y [M, N]
 * (rows ldy apart). The packed weight is W cut into panels of NR = 24 output columns, each panel
 * stored k-major: Wp[p][k][j] = W[p * NR + j][k] (columns past N are 0). A 4 x 24 register tile
 * (12 accumulators of 8 floats) runs over one panel:
 *
 *     for k:  w0..w2 = Wp[p][k][0:24];  for r < 4:  acc[r] += X[r][k] * (w0, w1, w2)
 *
 * so one panel row (96 bytes) feeds 12 FMAs, and a panel (24 K floats; 55 KB at K = 576) is read
 * from memory once and from L2 for the next row blocks (the first pass prefetches ahead).
 * Panels are split over OpenMP threads (torch's libgomp pool).
 *
 * Why not oneDNN's packed sgemm (what torch's mkldnn linear runs): for the skinny products of a
 * decode step (16 rows, weights streamed from memory) it reached ~55 GFLOP/s on the project's
 * 2-core AVX2 machine, this tile ~70 (docs/results/native_linear.md).
 *
 * On a CPU with AVX512 the panels are 32 columns wide and the tile is 4 x 32 (8 accumulators of 16
 * floats): the same FMAs per output in the same order, half the instructions (measured in
 * docs/results/bench_quant.md).
 *
 * `accumulate` = 1 adds to what Y holds (the residual stream: h += a W^T in place).
 */
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "simd.h"

#if defined(__AVX512F__)
#define NR 32 /* two 16-float registers per row */
#else
#define NR 24
#endif
#define PREFETCH_K 128 /* how many panel rows ahead the first row block prefetches */

int sparserl_linear_panel_width(void) { return NR; }

/* W [N, K] -> panels of `width` columns: Wp[p][k][j] = W[width p + j][k] (0 past N). linear.c's
 * panels (width NR), and the float32 outlier columns of linear_int8.c (the int8 panel width). */
void sparserl_pack_panels(int N, int K, int width, const float *W, float *Wp) {
    const int P = (N + width - 1) / width;
#pragma omp parallel for schedule(static)
    for (int p = 0; p < P; p++)
        for (int k = 0; k < K; k++)
            for (int j = 0; j < width; j++) {
                const int n = p * width + j;
                Wp[((int64_t)p * K + k) * width + j] = n < N ? W[(int64_t)n * K + k] : 0.f;
            }
}

void sparserl_pack_linear(int N, int K, const float *W, float *Wp) { sparserl_pack_panels(N, K, NR, W, Wp); }

#if defined(__AVX512F__)
/* AVX512: panels of 32 columns, a 4 x 32 tile (8 accumulators of 16 floats: with two FMA units of
 * 4 cycles' latency, 8 independent chains keep both busy); per lane the same FMAs in the same k
 * order as the AVX2 tile, so the same bits. Rows stored by simd.h's store_row32. */
#define TILE_DECL(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = c##r##0;
/* the panel row k in registers, kept there (as below) */
#define TILE_LOAD(k)                                                                                   \
    __m512 w0 = _mm512_loadu_ps(w + (int64_t)(k) * NR), w1 = _mm512_loadu_ps(w + (int64_t)(k) * NR + 16); \
    __asm__("" : "+v"(w0), "+v"(w1));
#define TILE_FMA(r)                                                   \
    if (MR > r) {                                                     \
        const __m512 x = _mm512_set1_ps(X[(int64_t)r * ldx + k]);     \
        c##r##0 = _mm512_fmadd_ps(x, w0, c##r##0);                    \
        c##r##1 = _mm512_fmadd_ps(x, w1, c##r##1);                    \
    }
#define TILE_STORE(r) \
    if (MR > r) store_row32(Y + (int64_t)r * ldy, c##r##0, c##r##1, ncols, bias, accumulate);
#elif defined(__AVX2__)
static inline void store_row(float *y, __m256 a, __m256 b, __m256 c, int ncols, const float *bias, int accumulate) {
    if (ncols == NR) {
        if (bias) {
            a = _mm256_add_ps(a, _mm256_loadu_ps(bias));
            b = _mm256_add_ps(b, _mm256_loadu_ps(bias + 8));
            c = _mm256_add_ps(c, _mm256_loadu_ps(bias + 16));
        }
        if (accumulate) {
            a = _mm256_add_ps(a, _mm256_loadu_ps(y));
            b = _mm256_add_ps(b, _mm256_loadu_ps(y + 8));
            c = _mm256_add_ps(c, _mm256_loadu_ps(y + 16));
        }
        _mm256_storeu_ps(y, a);
        _mm256_storeu_ps(y + 8, b);
        _mm256_storeu_ps(y + 16, c);
        return;
    }
    float t[NR];
    _mm256_storeu_ps(t, a);
    _mm256_storeu_ps(t + 8, b);
    _mm256_storeu_ps(t + 16, c);
    store_tail(y, t, ncols, bias, accumulate);
}

#define TILE_DECL(r) __m256 c##r##0 = _mm256_setzero_ps(), c##r##1 = c##r##0, c##r##2 = c##r##0;
/* keep the panel row in registers: gcc otherwise folds it into the 12 FMAs as 12 loads, and the
 * loop becomes load-bound (measured 1.4x slower, single thread) */
#define TILE_LOAD(k)                                                                                   \
    __m256 w0 = _mm256_loadu_ps(w + (int64_t)(k) * NR), w1 = _mm256_loadu_ps(w + (int64_t)(k) * NR + 8), \
           w2 = _mm256_loadu_ps(w + (int64_t)(k) * NR + 16);                                            \
    __asm__("" : "+x"(w0), "+x"(w1), "+x"(w2));
#define TILE_FMA(r)                                                          \
    if (MR > r) {                                                            \
        const __m256 x = _mm256_broadcast_ss(X + (int64_t)r * ldx + k);    \
        c##r##0 = _mm256_fmadd_ps(x, w0, c##r##0);                           \
        c##r##1 = _mm256_fmadd_ps(x, w1, c##r##1);                           \
        c##r##2 = _mm256_fmadd_ps(x, w2, c##r##2);                           \
    }
#define TILE_STORE(r) \
    if (MR > r) store_row(Y + (int64_t)r * ldy, c##r##0, c##r##1, c##r##2, ncols, bias, accumulate);
#endif

#if defined(__AVX2__)
/* MR (1..4) rows of X times one panel; MR is a constant in each inlined copy, so the tile stays
 * in registers. */
static inline __attribute__((always_inline)) void tile(const int MR, int K, const float *X, int64_t ldx,
                                                        const float *w, float *Y, int64_t ldy, int ncols,
                                                        const float *bias, int accumulate, int prefetch) {
    TILE_DECL(0) TILE_DECL(1) TILE_DECL(2) TILE_DECL(3)
    for (int k = 0; k < K; k++) {
        if (prefetch) {
            _mm_prefetch((const char *)(w + (int64_t)(k + PREFETCH_K) * NR), _MM_HINT_T0);
            _mm_prefetch((const char *)(w + (int64_t)(k + PREFETCH_K) * NR + 16), _MM_HINT_T0);
        }
        TILE_LOAD(k)
        TILE_FMA(0) TILE_FMA(1) TILE_FMA(2) TILE_FMA(3)
    }
    TILE_STORE(0) TILE_STORE(1) TILE_STORE(2) TILE_STORE(3)
}

static void panel(int M, int K, const float *X, int64_t ldx, const float *w, float *Y, int64_t ldy, int ncols,
                  const float *bias, int accumulate) {
    int m = 0;
    for (; m + 4 <= M; m += 4) {
        if (m == 0)
            tile(4, K, X, ldx, w, Y, ldy, ncols, bias, accumulate, 1);
        else
            tile(4, K, X + m * ldx, ldx, w, Y + m * ldy, ldy, ncols, bias, accumulate, 0);
    }
    const int pf = m == 0;
    switch (M - m) {
        case 3: tile(3, K, X + m * ldx, ldx, w, Y + m * ldy, ldy, ncols, bias, accumulate, pf); break;
        case 2: tile(2, K, X + m * ldx, ldx, w, Y + m * ldy, ldy, ncols, bias, accumulate, pf); break;
        case 1: tile(1, K, X + m * ldx, ldx, w, Y + m * ldy, ldy, ncols, bias, accumulate, pf); break;
        default: break;
    }
}
#else
/* Portable C (no AVX2): the same panels, one output at a time. */
static void panel(int M, int K, const float *X, int64_t ldx, const float *w, float *Y, int64_t ldy, int ncols,
                  const float *bias, int accumulate) {
    for (int r = 0; r < M; r++)
        for (int j = 0; j < ncols; j++) {
            float s = 0.f;
            for (int k = 0; k < K; k++) s += X[(int64_t)r * ldx + k] * w[(int64_t)k * NR + j];
            float *y = Y + (int64_t)r * ldy + j;
            *y = (accumulate ? *y : 0.f) + s + (bias ? bias[j] : 0.f);
        }
}
#endif

int sparserl_linear(int M, int N, int K, const float *X, int64_t ldx, const float *Wp, const float *bias, float *Y,
                    int64_t ldy, int accumulate) {
    if (M <= 0 || N <= 0 || K <= 0) return -1;
    const int P = (N + NR - 1) / NR;
#pragma omp parallel for schedule(static)
    for (int p = 0; p < P; p++) {
        const int n0 = p * NR, ncols = N - n0 < NR ? N - n0 : NR;
        panel(M, K, X, ldx, Wp + (int64_t)p * K * NR, Y + n0, ldy, ncols, bias ? bias + n0 : 0, accumulate);
    }
    return 0;
}
