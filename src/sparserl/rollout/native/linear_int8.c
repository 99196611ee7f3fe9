/* The int8 sampler's weight products on CPU (QuRL's W8A8, sparserl.rollout.quant.int8):
 *
 *     a_t = max_k |X_tk| / 127,   P_tk = round(X_tk / a_t)            (dynamic, per token)
 *     Y_tn = a_t s_n sum_k P_tk Q_nk  (+ bias_n)                      (Q: int8 codes, s: per channel)
 *
 * on AVX2 integer instructions: vpmaddubsw multiplies unsigned 8-bit by signed 8-bit pairs into
 * 16-bit sums, vpmaddwd adds those pairs into 32-bit lanes (on a CPU with VNNI one vpdpbusd does
 * both and the add, the same integers: simd.h's dot4_u8s8). Its unsigned side is the activation
 * shifted by 128 (U = P + 128 in [1, 255]); the shift is taken back with the weights' column sums:
 * sum_k U_k Q_k = sum_k P_k Q_k + 128 sum_k Q_k. Without VNNI the 16-bit pair sums cannot
 * saturate when |Q| <= 64 (255 * 64 * 2 = 32640 <= 32767): the same 7-bit weight grid as fbgemm's
 * AVX2 path (the int8 module docstring says why); with VNNI the full grid |Q| <= 127 is exact
 * (sparserl_int8_full_range). Either way the result equals the float reference of exactly these
 * integers.
 *
 * Packed weights: panels of 16 output columns, k in groups of 4: Wq[p][k/4][16][4] (zero past N
 * and K), so one 32-byte load holds 8 columns x 4 k; a 4-row x 16-column tile keeps 8 int32
 * accumulators. Where the CPU has AVX512 (BW) the panels are 32 columns wide and the tile 4 x 32,
 * 8 accumulators of 16 lanes (int8_group's signed tile keeps 256 bits, on each 16-column half:
 * AVX512 has no vpsignb; with VNNI, 512- or 256-bit, int8_group runs on this tile instead, below).
 * Panels are split over OpenMP threads (torch's libgomp pool).
 *
 * Why: fbgemm's dynamic linear quantizes its input per tensor; per-token scales on it cost three
 * extra torch operators per product, and its products ran only ~1.14x this project's float32
 * kernel (linear.c) at the decode step's 16 rows; this one 1.58x (docs/results/native_linear.md).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

#if defined(__AVX512BW__)
#define NR8 32 /* output columns per panel: two 64-byte registers of 16 columns x 4 k */
#else
#define NR8 16 /* output columns per panel */
#endif
#define PREFETCH_BYTES 8192 /* how far ahead in the panel the first row block prefetches */

int sparserl_int8_panel_width(void) { return NR8; }

/* 1 where the int8 tile's dot4 (simd.h's dot4_u8s8 / dot4_u8s8_512 at the tile's width) is one
 * vpdpbusd: AVX512 VNNI for the 512-bit tile, AVX-VNNI (or AVX512 VNNI + VL) for the 256-bit one */
#if (defined(__AVX512BW__) && defined(__AVX512VNNI__)) ||                  \
    (!defined(__AVX512BW__) && defined(__AVX2__) &&                            \
     (defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))))
#define I8_VNNI 1
#else
#define I8_VNNI 0
#endif

/* 1 when the per-token kernel's products are exact for the full weight grid |Q| <= 127: VNNI adds
 * each u8 x s8 product into 32 bits (no 16-bit pair sums), and the portable C sums in int32; 0 on
 * plain AVX2 / AVX512BW, whose vpmaddubsw pair sums saturate past 32767 (|Q| <= 64 there). */
int sparserl_int8_full_range(void) {
#if defined(__AVX2__)
    return I8_VNNI;
#else
    return 1;
#endif
}

/* Q [N, K] int8 -> Wq (size P * K4 * NR8, K4 = K rounded up to 4) and colsum[n] = sum_k Q[n, k]
 * (N rounded up to NR8 entries, 0 past N). */
void sparserl_pack_int8(int N, int K, const int8_t *Q, int8_t *Wq, int32_t *colsum) {
    const int P = (N + NR8 - 1) / NR8, K4 = (K + 3) & ~3;
#pragma omp parallel for schedule(static)
    for (int p = 0; p < P; p++) {
        for (int j = 0; j < NR8; j++) {
            const int n = p * NR8 + j;
            int32_t s = 0;
            for (int k = 0; k < K4; k++) {
                const int8_t v = (n < N && k < K) ? Q[(int64_t)n * K + k] : 0;
                Wq[(((int64_t)p * (K4 / 4) + k / 4) * NR8 + j) * 4 + (k & 3)] = v;
                s += v;
            }
            colsum[n] = s;
        }
    }
}

/* max_k |x_k| over n floats */
static inline float absmax(const float *x, int n) {
    int k = 0;
    float m = 0.f;
#ifdef __AVX2__
    __m256 v = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.f);
    for (; k + 8 <= n; k += 8) v = _mm256_max_ps(v, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)));
    float t[8];
    _mm256_storeu_ps(t, v);
    for (int j = 0; j < 8; j++) m = fmaxf(m, t[j]);
#endif
    for (; k < n; k++) m = fmaxf(m, fabsf(x[k]));
    return m;
}

/* c_k = clamp(round(x_k * inv), -127, 127) + offset as bytes (offset 128: unsigned codes), rounding
 * half to even as torch.round (nearbyintf; vcvtps2dq in the default rounding mode) */
static inline void round_codes(const float *x, int n, float inv, int offset, uint8_t *c) {
    int k = 0;
#ifdef __AVX2__
    const __m256 vinv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(127.f), lo = _mm256_set1_ps(-127.f);
    const __m256i off = _mm256_set1_epi32(offset);
    for (; k + 8 <= n; k += 8) {
        const __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x + k), vinv), lo), hi);
        const __m256i q = _mm256_add_epi32(_mm256_cvtps_epi32(v), off);
        const __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
        _mm_storel_epi64((__m128i *)(c + k), offset ? _mm_packus_epi16(q16, q16) : _mm_packs_epi16(q16, q16));
    }
#endif
    for (; k < n; k++) {
        float v = nearbyintf(x[k] * inv);
        v = v > 127.f ? 127.f : (v < -127.f ? -127.f : v);
        c[k] = (uint8_t)((int)v + offset);
    }
}

/* X [M, K] float32 -> U [M, K4] uint8 (P + 128; 128 past K) and a [M] (1 for an all-zero row). */
static void quantize_rows(int M, int K, const float *X, int64_t ldx, uint8_t *U, float *a) {
    const int K4 = (K + 3) & ~3;
    for (int r = 0; r < M; r++) {
        const float *x = X + (int64_t)r * ldx;
        const float m = absmax(x, K), scale = m > 0.f ? m / 127.f : 1.f;
        uint8_t *u = U + (int64_t)r * K4;
        round_codes(x, K, 1.f / scale, 128, u);
        for (int k = K; k < K4; k++) u[k] = 128;
        a[r] = scale;
    }
}

static inline void finish_row(float *y, const int32_t *acc, const int32_t *colsum, float a, const float *s,
                              const float *bias, int ncols, int accumulate) {
    for (int j = 0; j < ncols; j++)
        y[j] = (accumulate ? y[j] : 0.f) + ((float)(acc[j] - 128 * colsum[j]) * a * s[j] + (bias ? bias[j] : 0.f));
}

#if defined(__AVX512BW__)
/* AVX512: a 4-row x 32-column tile, 8 int32 accumulators of 16 lanes (the AVX2 tile's integers) */
typedef __m512i i8vec;
#define I8_LANES 16
#define I8_ZERO() _mm512_setzero_si512()
#define I8_SET1(x) _mm512_set1_epi32(x)
#define I8_LOAD(p) _mm512_loadu_si512((const void *)(p))
#define I8_STORE_TO(p, v) _mm512_storeu_si512((void *)(p), v)
#define I8_DOT4(c, u, w) dot4_u8s8_512(c, u, w)
#define I8_PIN(a, b) __asm__("" : "+v"(a), "+v"(b))
#define I8_SUB _mm512_sub_epi32
#define I8_SHL7(v) _mm512_slli_epi32(v, 7)
#elif defined(__AVX2__)
/* AVX2: a 4-row x 16-column tile, 8 int32 accumulators of 8 lanes */
typedef __m256i i8vec;
#define I8_LANES 8
#define I8_ZERO() _mm256_setzero_si256()
#define I8_SET1(x) _mm256_set1_epi32(x)
#define I8_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define I8_STORE_TO(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#define I8_DOT4(c, u, w) dot4_u8s8(c, u, w)
#define I8_PIN(a, b) __asm__("" : "+x"(a), "+x"(b))
#define I8_SUB _mm256_sub_epi32
#define I8_SHL7(v) _mm256_slli_epi32(v, 7)
#endif

/* float vectors of the tile's width (I8_LANES floats): the group tile's float sums, the outliers */
#if defined(__AVX512BW__)
typedef __m512 fvec; /* a panel row is two registers of 16 floats */
#define FV_LANES 16
#define FV_ZERO _mm512_setzero_ps
#define FV_LOAD _mm512_loadu_ps
#define FV_STORE _mm512_storeu_ps
#define FV_FMA _mm512_fmadd_ps
#define FV_ADD _mm512_add_ps
#define FV_MUL _mm512_mul_ps
#define FV_SET1 _mm512_set1_ps
#define FV_CVT _mm512_cvtepi32_ps
#elif defined(__AVX2__)
typedef __m256 fvec; /* two registers of 8 floats */
#define FV_LANES 8
#define FV_ZERO _mm256_setzero_ps
#define FV_LOAD _mm256_loadu_ps
#define FV_STORE _mm256_storeu_ps
#define FV_FMA _mm256_fmadd_ps
#define FV_ADD _mm256_add_ps
#define FV_MUL _mm256_mul_ps
#define FV_SET1 _mm256_set1_ps
#define FV_CVT _mm256_cvtepi32_ps
#endif

#if defined(__AVX2__)
#define I8_DECL(r) i8vec c##r##0 = I8_ZERO(), c##r##1 = c##r##0;
#define I8_DOT(r)                                                \
    if (MR > r) {                                                \
        int32_t xv;                                              \
        memcpy(&xv, U + (int64_t)r * K4 + 4 * g, 4);             \
        const i8vec xb = I8_SET1(xv);                            \
        c##r##0 = I8_DOT4(c##r##0, xb, w0);                      \
        c##r##1 = I8_DOT4(c##r##1, xb, w1);                      \
    }
#define I8_STORE(r)                                                                              \
    if (MR > r) {                                                                                \
        int32_t acc[NR8];                                                                        \
        I8_STORE_TO(acc, c##r##0);                                                               \
        I8_STORE_TO(acc + I8_LANES, c##r##1);                                                    \
        finish_row(Y + (int64_t)r * ldy, acc, colsum, a[r], s, bias, ncols, accumulate);         \
    }

/* MR (<= 4) rows x one panel (NR8 columns: two registers of I8_LANES columns x 4 k per panel row) */
static inline __attribute__((always_inline)) void tile8(const int MR, int K4, const uint8_t *U, const float *a,
                                                         const int8_t *w, const int32_t *colsum, const float *s,
                                                         const float *bias, float *Y, int64_t ldy, int ncols,
                                                         int accumulate, const int prefetch) {
    I8_DECL(0) I8_DECL(1) I8_DECL(2) I8_DECL(3)
    for (int g = 0; g < K4 / 4; g++) {
        /* the first row block streams the panel from memory: fetch ahead, into the next panel */
        if (prefetch)
            for (int line = 0; line < NR8 * 4; line += 64)
                _mm_prefetch((const char *)(w + (int64_t)g * NR8 * 4 + PREFETCH_BYTES + line), _MM_HINT_T0);
        i8vec w0 = I8_LOAD(w + (int64_t)g * NR8 * 4), w1 = I8_LOAD(w + (int64_t)g * NR8 * 4 + 4 * I8_LANES);
        I8_PIN(w0, w1); /* kept in registers (see linear.c) */
        I8_DOT(0) I8_DOT(1) I8_DOT(2) I8_DOT(3)
    }
    I8_STORE(0) I8_STORE(1) I8_STORE(2) I8_STORE(3)
}

static void panel8(int M, int K4, const uint8_t *U, const float *a, const int8_t *w, const int32_t *colsum,
                   const float *s, const float *bias, float *Y, int64_t ldy, int ncols, int accumulate) {
    int m = 0;
    for (; m + 4 <= M; m += 4) {
        if (m == 0)
            tile8(4, K4, U, a, w, colsum, s, bias, Y, ldy, ncols, accumulate, 1);
        else
            tile8(4, K4, U + (int64_t)m * K4, a + m, w, colsum, s, bias, Y + m * ldy, ldy, ncols, accumulate, 0);
    }
    const int pf = m == 0;
    switch (M - m) {
        case 3: tile8(3, K4, U + (int64_t)m * K4, a + m, w, colsum, s, bias, Y + m * ldy, ldy, ncols, accumulate, pf); break;
        case 2: tile8(2, K4, U + (int64_t)m * K4, a + m, w, colsum, s, bias, Y + m * ldy, ldy, ncols, accumulate, pf); break;
        case 1: tile8(1, K4, U + (int64_t)m * K4, a + m, w, colsum, s, bias, Y + m * ldy, ldy, ncols, accumulate, pf); break;
        default: break;
    }
}
#else
static void panel8(int M, int K4, const uint8_t *U, const float *a, const int8_t *w, const int32_t *colsum,
                   const float *s, const float *bias, float *Y, int64_t ldy, int ncols, int accumulate) {
    for (int r = 0; r < M; r++) {
        int32_t acc[NR8];
        for (int j = 0; j < NR8; j++) {
            int32_t t = 0;
            for (int k = 0; k < K4; k++) t += (int32_t)U[(int64_t)r * K4 + k] * w[((k / 4) * NR8 + j) * 4 + (k & 3)];
            acc[j] = t;
        }
        finish_row(Y + (int64_t)r * ldy, acc, colsum, a[r], s, bias, ncols, accumulate);
    }
}
#endif

/* Y [M, N] (ldy) = (or, with `accumulate`, +=) the product above; `work` holds M * (K4 + 4) bytes
 * (quantized rows) and M floats (their scales). */
int sparserl_linear_int8_acc(int M, int N, int K, const float *X, int64_t ldx, const int8_t *Wq,
                             const int32_t *colsum, const float *scales, const float *bias, float *Y, int64_t ldy,
                             uint8_t *work, int accumulate) {
    if (M <= 0 || N <= 0 || K <= 0) return -1;
    const int K4 = (K + 3) & ~3, P = (N + NR8 - 1) / NR8;
    float *a = (float *)work;
    uint8_t *U = work + (int64_t)M * sizeof(float);
    quantize_rows(M, K, X, ldx, U, a);
#pragma omp parallel for schedule(static)
    for (int p = 0; p < P; p++) {
        const int n0 = p * NR8, ncols = N - n0 < NR8 ? N - n0 : NR8;
        panel8(M, K4, U, a, Wq + (int64_t)p * (K4 / 4) * NR8 * 4, colsum + n0, scales + n0, bias ? bias + n0 : 0,
               Y + n0, ldy, ncols, accumulate);
    }
    return 0;
}

int sparserl_linear_int8(int M, int N, int K, const float *X, int64_t ldx, const int8_t *Wq, const int32_t *colsum,
                         const float *scales, const float *bias, float *Y, int64_t ldy, uint8_t *work) {
    return sparserl_linear_int8_acc(M, N, K, X, ldx, Wq, colsum, scales, bias, Y, ldy, work, 0);
}

/* ---- int8 with per-group scales (rollout.quant = int8_group) -----------------------------------
 *
 *     a_tj = max_{k in group j} |X_tk| / 127,   P_tk = round(X_tk / a_tj)     (groups of G along k)
 *     Y_tn = s_n sum_j a_tj g_nj sum_{k in group j} P_tk Q_nk  (+ bias_n),   |Q| <= 127
 *
 * g_nj: the weights' scale per output and group (int8_group; packed per panel as gs[p][j][NR8], 0
 * past N), or 1 (gs NULL: per-channel weights, s_n alone; x * 1 is exact, so the same bits).
 *
 * The full 8-bit weight grid: vpmaddubsw takes |P| (unsigned) and Q with P's sign applied
 * (vpsignb), so each 16-bit pair sum is at most 2 * 127 * 127 = 32258 and cannot saturate; no shift
 * and no column sums. The int32 sums of each group are scaled by a_tj into float accumulators.
 * G must be a multiple of 4. */

/* X [M, K] -> P [M, K4] int8 + offset (0 = signed codes, 128 = the unsigned U = P + 128 of the
 * per-token kernel; offset past K) and a [M, ceil(K / G)] (1 for an all-zero group) */
static void quantize_groups(int M, int K, int G, const float *X, int64_t ldx, int8_t *P, float *a, int offset) {
    const int K4 = (K + 3) & ~3, NG = (K + G - 1) / G;
    for (int r = 0; r < M; r++) {
        const float *x = X + (int64_t)r * ldx;
        uint8_t *p = (uint8_t *)P + (int64_t)r * K4;
        for (int j = 0; j < NG; j++) {
            const int k0 = j * G, k1 = k0 + G < K ? k0 + G : K;
            const float m = absmax(x + k0, k1 - k0), scale = m > 0.f ? m / 127.f : 1.f;
            round_codes(x + k0, k1 - k0, 1.f / scale, offset, p + k0);
            a[(int64_t)r * NG + j] = scale;
        }
        for (int k = K; k < K4; k++) p[k] = (uint8_t)offset;
    }
}

/* a row of the group product: y (+)= acc s (+ bias), both tiles */
static inline void store_group_row(float *y, const float *acc, const float *s, const float *bias, int ncols,
                                   int accumulate) {
    for (int c = 0; c < ncols; c++) y[c] = (accumulate ? y[c] : 0.f) + (acc[c] * s[c] + (bias ? bias[c] : 0.f));
}

/* Where the int8 tile's dot4 is one vpdpbusd (I8_VNNI: AVX512 VNNI on the 512-bit tile, AVX-VNNI on
 * the 256-bit one) the groups run on that tile too (tile8's unsigned codes U = P + 128, no vpsignb):
 * per group, sum_k U Q - 128 cs_nj = sum_k P Q exactly (cs_nj = sum_{k in group j} Q_nk, packed per
 * panel like g), so the same integers, then the same float operations as tile_group: the same bits.
 * Used when the caller passes cs. (Without VNNI, vpmaddubsw's pair sums of U Q would saturate on
 * the full grid.) On 256 bits the 8 float sums do not fit in the registers beside the 8 int32 sums;
 * the compiler keeps them in memory, touched once per group. */
#if defined(__AVX2__) && I8_VNNI
#define GROUP_U8 1
#define GU_FLUSH(r)                                                                                           \
    if (MR > r) {                                                                                             \
        const fvec ar = FV_SET1(a[(int64_t)r * NG + j]);                                                      \
        f##r##0 = FV_FMA(FV_CVT(I8_SUB(c##r##0, cs0)), FV_MUL(ar, gj0), f##r##0);                            \
        f##r##1 = FV_FMA(FV_CVT(I8_SUB(c##r##1, cs1)), FV_MUL(ar, gj1), f##r##1);                            \
    }
#define GU_STORE(r)                                                                                           \
    if (MR > r) {                                                                                             \
        float acc[NR8];                                                                                       \
        FV_STORE(acc, f##r##0);                                                                               \
        FV_STORE(acc + FV_LANES, f##r##1);                                                                    \
        store_group_row(Y + (int64_t)r * ldy, acc, s, bias, ncols, accumulate);                              \
    }

/* MR (<= 4) rows x one panel */
static inline __attribute__((always_inline)) void tile_group_u8(const int MR, int K4, int G, int NG, const uint8_t *U,
                                                                 const float *a, const int8_t *w, const int32_t *cs,
                                                                 const float *s, const float *gs, const float *bias,
                                                                 float *Y, int64_t ldy, int ncols, int accumulate,
                                                                 const int prefetch) {
    fvec f00 = FV_ZERO(), f01 = f00, f10 = f00, f11 = f00, f20 = f00, f21 = f00, f30 = f00, f31 = f00;
    const fvec one = FV_SET1(1.f);
    for (int j = 0; j < NG; j++) {
        const int g0 = j * G / 4, g1 = (j + 1) * G / 4 < K4 / 4 ? (j + 1) * G / 4 : K4 / 4;
        I8_DECL(0) I8_DECL(1) I8_DECL(2) I8_DECL(3)
        for (int g = g0; g < g1; g++) {
            if (prefetch)
                for (int line = 0; line < NR8 * 4; line += 64)
                    _mm_prefetch((const char *)(w + (int64_t)g * NR8 * 4 + PREFETCH_BYTES + line), _MM_HINT_T0);
            i8vec w0 = I8_LOAD(w + (int64_t)g * NR8 * 4), w1 = I8_LOAD(w + (int64_t)g * NR8 * 4 + 4 * I8_LANES);
            I8_PIN(w0, w1);
            I8_DOT(0) I8_DOT(1) I8_DOT(2) I8_DOT(3)
        }
        const i8vec cs0 = I8_SHL7(I8_LOAD(cs + (int64_t)j * NR8)), cs1 = I8_SHL7(I8_LOAD(cs + (int64_t)j * NR8 + I8_LANES));
        const fvec gj0 = gs ? FV_LOAD(gs + (int64_t)j * NR8) : one, gj1 = gs ? FV_LOAD(gs + (int64_t)j * NR8 + FV_LANES) : one;
        GU_FLUSH(0) GU_FLUSH(1) GU_FLUSH(2) GU_FLUSH(3)
    }
    GU_STORE(0) GU_STORE(1) GU_STORE(2) GU_STORE(3)
}

static void panel_group_u8(int M, int K4, int G, int NG, const uint8_t *U, const float *a, const int8_t *w,
                           const int32_t *cs, const float *s, const float *gs, const float *bias, float *Y,
                           int64_t ldy, int ncols, int accumulate) {
    int m = 0;
    for (; m + 4 <= M; m += 4)
        tile_group_u8(4, K4, G, NG, U + (int64_t)m * K4, a + (int64_t)m * NG, w, cs, s, gs, bias, Y + m * ldy, ldy,
                      ncols, accumulate, m == 0);
    const int pf = m == 0;
    const uint8_t *um = U + (int64_t)m * K4;
    const float *am = a + (int64_t)m * NG;
    float *ym = Y + m * ldy;
    switch (M - m) {
        case 3: tile_group_u8(3, K4, G, NG, um, am, w, cs, s, gs, bias, ym, ldy, ncols, accumulate, pf); break;
        case 2: tile_group_u8(2, K4, G, NG, um, am, w, cs, s, gs, bias, ym, ldy, ncols, accumulate, pf); break;
        case 1: tile_group_u8(1, K4, G, NG, um, am, w, cs, s, gs, bias, ym, ldy, ncols, accumulate, pf); break;
        default: break;
    }
}
#else
#define GROUP_U8 0
#endif

int sparserl_int8_group_u8(void) { return GROUP_U8; }

#ifdef __AVX2__
#define G8_DOT(r)                                                                                                  \
    if (MR > r) {                                                                                                  \
        int32_t xv;                                                                                                \
        memcpy(&xv, P + (int64_t)r * K4 + 4 * g, 4);                                                              \
        const __m256i xb = _mm256_set1_epi32(xv), ax = _mm256_sign_epi8(xb, xb);                                   \
        c##r##0 = dot4_u8s8(c##r##0, ax, _mm256_sign_epi8(w0, xb));                                               \
        c##r##1 = dot4_u8s8(c##r##1, ax, _mm256_sign_epi8(w1, xb));                                               \
    }
#define G8_FLUSH(r)                                                                                            \
    if (MR > r) {                                                                                              \
        const __m256 ar = _mm256_set1_ps(a[(int64_t)r * NG + j]);                                             \
        f##r##0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c##r##0), _mm256_mul_ps(ar, gj0), f##r##0);               \
        f##r##1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c##r##1), _mm256_mul_ps(ar, gj1), f##r##1);               \
    }
#define G8_STORE(r)                                                                                            \
    if (MR > r) {                                                                                              \
        float acc[NR8];                                                                                        \
        _mm256_storeu_ps(acc, f##r##0);                                                                        \
        _mm256_storeu_ps(acc + 8, f##r##1);                                                                    \
        store_group_row(Y + (int64_t)r * ldy, acc, s, bias, ncols, accumulate);                               \
    }

/* MR (<= 4) rows x 16 columns: per group, int32 sums in registers, then scaled into float sums */
static inline __attribute__((always_inline)) void tile_group(const int MR, int K4, int G, int NG, const int8_t *P,
                                                              const float *a, const int8_t *w, const float *s,
                                                              const float *gs, const float *bias, float *Y,
                                                              int64_t ldy, int ncols, int accumulate,
                                                              const int prefetch) {
    __m256 f00 = _mm256_setzero_ps(), f01 = f00, f10 = f00, f11 = f00, f20 = f00, f21 = f00, f30 = f00, f31 = f00;
    const __m256 one = _mm256_set1_ps(1.f);
    for (int j = 0; j < NG; j++) {
        const int g0 = j * G / 4, g1 = (j + 1) * G / 4 < K4 / 4 ? (j + 1) * G / 4 : K4 / 4;
        const __m256 gj0 = gs ? _mm256_loadu_ps(gs + (int64_t)j * NR8) : one,
                     gj1 = gs ? _mm256_loadu_ps(gs + (int64_t)j * NR8 + 8) : one;
        __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
                c31 = c00;
        for (int g = g0; g < g1; g++) {
            if (prefetch) _mm_prefetch((const char *)(w + (int64_t)g * NR8 * 4 + PREFETCH_BYTES), _MM_HINT_T0);
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + (int64_t)g * NR8 * 4)),
                          w1 = _mm256_loadu_si256((const __m256i *)(w + (int64_t)g * NR8 * 4 + 32));
            G8_DOT(0) G8_DOT(1) G8_DOT(2) G8_DOT(3)
        }
        G8_FLUSH(0) G8_FLUSH(1) G8_FLUSH(2) G8_FLUSH(3)
    }
    G8_STORE(0) G8_STORE(1) G8_STORE(2) G8_STORE(3)
}

/* 16 columns of a panel (its 64-byte half when panels are 32 wide) */
static void panel_group16(int M, int K4, int G, int NG, const int8_t *P, const float *a, const int8_t *w,
                          const float *s, const float *gs, const float *bias, float *Y, int64_t ldy, int ncols,
                          int accumulate) {
    int m = 0;
    for (; m + 4 <= M; m += 4) {
        if (m == 0)
            tile_group(4, K4, G, NG, P, a, w, s, gs, bias, Y, ldy, ncols, accumulate, 1);
        else
            tile_group(4, K4, G, NG, P + (int64_t)m * K4, a + (int64_t)m * NG, w, s, gs, bias, Y + m * ldy, ldy, ncols,
                       accumulate, 0);
    }
    const int pf = m == 0;
    const int8_t *pm = P + (int64_t)m * K4;
    const float *am = a + (int64_t)m * NG;
    float *ym = Y + m * ldy;
    switch (M - m) {
        case 3: tile_group(3, K4, G, NG, pm, am, w, s, gs, bias, ym, ldy, ncols, accumulate, pf); break;
        case 2: tile_group(2, K4, G, NG, pm, am, w, s, gs, bias, ym, ldy, ncols, accumulate, pf); break;
        case 1: tile_group(1, K4, G, NG, pm, am, w, s, gs, bias, ym, ldy, ncols, accumulate, pf); break;
        default: break;
    }
}

/* one panel: its 16-column halves in turn where panels are 32 wide (the AVX512 int8 layout; this
 * kernel's sign trick has no 512-bit vpsignb, so it stays on 256-bit registers) */
static void panel_group(int M, int K4, int G, int NG, const int8_t *P, const float *a, const int8_t *w,
                        const float *s, const float *gs, const float *bias, float *Y, int64_t ldy, int ncols,
                        int accumulate) {
    for (int h = 0; h * 16 < ncols; h++)
        panel_group16(M, K4, G, NG, P, a, w + 64 * h, s + 16 * h, gs ? gs + 16 * h : 0, bias ? bias + 16 * h : 0,
                      Y + 16 * h, ldy, ncols - 16 * h < 16 ? ncols - 16 * h : 16, accumulate);
}
#else
static void panel_group(int M, int K4, int G, int NG, const int8_t *P, const float *a, const int8_t *w,
                        const float *s, const float *gs, const float *bias, float *Y, int64_t ldy, int ncols,
                        int accumulate) {
    for (int r = 0; r < M; r++) {
        const int8_t *pr = P + (int64_t)r * K4;
        float facc[NR8] = {0};
        for (int j = 0; j < NG; j++) {
            const int g0 = j * G / 4, g1 = (j + 1) * G / 4 < K4 / 4 ? (j + 1) * G / 4 : K4 / 4;
            for (int c = 0; c < NR8; c++) {
                int32_t t = 0;
                for (int g = g0; g < g1; g++)
                    for (int q = 0; q < 4; q++) t += (int32_t)pr[4 * g + q] * w[((int64_t)g * NR8 + c) * 4 + q];
                facc[c] += (float)t * (a[(int64_t)r * NG + j] * (gs ? gs[(int64_t)j * NR8 + c] : 1.f));
            }
        }
        store_group_row(Y + (int64_t)r * ldy, facc, s, bias, ncols, accumulate);
    }
}
#endif

/* one panel of the group product: on the unsigned-code tile where built and gcolsum is given
 * (U then holds P + 128), else the signed one */
static inline void group_panel(int p, int M, int K4, int G, int NG, const int8_t *codes, const float *a,
                               const int8_t *Wq, const int32_t *gcolsum, const float *scales, const float *gscales,
                               const float *bias, float *Y, int64_t ldy, int ncols, int accumulate) {
    const int8_t *w = Wq + (int64_t)p * (K4 / 4) * NR8 * 4;
    const float *gs = gscales ? gscales + (int64_t)p * NG * NR8 : 0;
#if GROUP_U8
    if (gcolsum) {
        panel_group_u8(M, K4, G, NG, (const uint8_t *)codes, a, w, gcolsum + (int64_t)p * NG * NR8, scales, gs, bias,
                       Y, ldy, ncols, accumulate);
        return;
    }
#endif
    (void)gcolsum;
    panel_group(M, K4, G, NG, codes, a, w, scales, gs, bias, Y, ldy, ncols, accumulate);
}

/* the codes' offset: 128 for the unsigned-code tile */
static inline int group_offset(const int32_t *gcolsum) { return GROUP_U8 && gcolsum ? 128 : 0; }

/* Y [M, N] (ldy) = the product above; `work` holds M * K4 bytes (quantized rows) and
 * M * ceil(K / G) floats (their scales); gscales: g packed per panel, or NULL (g = 1); gcolsum: the
 * codes' column sums per group, packed like g, or NULL (the signed tile). Returns -1 on bad sizes. */
int sparserl_linear_int8_group_acc(int M, int N, int K, int G, const float *X, int64_t ldx, const int8_t *Wq,
                                   const int32_t *gcolsum, const float *scales, const float *gscales,
                                   const float *bias, float *Y, int64_t ldy, uint8_t *work, int accumulate) {
    if (M <= 0 || N <= 0 || K <= 0 || G <= 0 || G % 4) return -1;
    const int K4 = (K + 3) & ~3, P = (N + NR8 - 1) / NR8, NG = (K + G - 1) / G;
    float *a = (float *)work;
    int8_t *Pq = (int8_t *)(work + (int64_t)M * NG * sizeof(float));
    quantize_groups(M, K, G, X, ldx, Pq, a, group_offset(gcolsum));
#pragma omp parallel for schedule(static)
    for (int p = 0; p < P; p++) {
        const int n0 = p * NR8, ncols = N - n0 < NR8 ? N - n0 : NR8;
        group_panel(p, M, K4, G, NG, Pq, a, Wq, gcolsum, scales + n0, gscales, bias ? bias + n0 : 0, Y + n0, ldy,
                    ncols, accumulate);
    }
    return 0;
}

int sparserl_linear_int8_group(int M, int N, int K, int G, const float *X, int64_t ldx, const int8_t *Wq,
                               const int32_t *gcolsum, const float *scales, const float *gscales, const float *bias,
                               float *Y, int64_t ldy, uint8_t *work) {
    return sparserl_linear_int8_group_acc(M, N, K, G, X, ldx, Wq, gcolsum, scales, gscales, bias, Y, ldy, work, 0);
}

/* ---- outlier input channels in float32 (rollout.quant_outliers; quant/outliers.py) -------------
 *
 *     T_tn = the int8 product above (per token, or per group with G > 0) of X with the inputs
 *            idx[0..n_out) zeroed: their codes are 0 and they set no activation scale
 *     T_tn = fma(X_t,idx[j], Wo[n, j], T_tn)   for j = 0, 1, ..., n_out - 1 in turn
 *     Y_tn = T_tn + bias_n   (accumulate: Y_tn += T_tn + bias_n)
 *
 * The float32 part runs in the int8 product's parallel loop, on the same panel's columns, so it
 * costs no extra pass over the threads; 4 rows at a time keep 8 independent FMA chains in
 * registers. Wo is packed per int8 panel, Wo[p][j][NR8] = W_O[NR8 p + c][j] (0 past N):
 * linear.c's sparserl_pack_panels with width NR8. Each output's chain of fmaf is
 * the same whatever the vector width, so every build gives the same bits. */

#define OUTLIER_STACK_ROWS 64

/* MR (<= 4) rows of one panel: t = T's columns (0 past ncols), the fmaf chain over j in
 * registers (4 rows x 2 registers: 8 independent chains), then + bias, then into Y */
static inline __attribute__((always_inline)) void outlier_tile(const int MR, int64_t ldt, int n_out,
                                                                const float *Xo, const float *Wo, const float *T,
                                                                int n0, int ncols, const float *bias, float *Y,
                                                                int64_t ldy, int accumulate) {
#if defined(FV_LANES)
    fvec acc[4][2];
    float t[4][NR8];
    const int full = ncols == NR8;
    for (int r = 0; r < 4; r++) {
        if (r >= MR) continue;
        const float *src = T + r * ldt;
        if (!full) {
            for (int c = 0; c < NR8; c++) t[r][c] = c < ncols ? src[c] : 0.f;
            src = t[r];
        }
        acc[r][0] = FV_LOAD(src), acc[r][1] = FV_LOAD(src + FV_LANES);
    }
    for (int j = 0; j < n_out; j++) {
        const fvec w0 = FV_LOAD(Wo + (int64_t)j * NR8), w1 = FV_LOAD(Wo + (int64_t)j * NR8 + FV_LANES);
        for (int r = 0; r < 4; r++)
            if (r < MR) {
                const fvec x = FV_SET1(Xo[(int64_t)r * n_out + j]);
                acc[r][0] = FV_FMA(x, w0, acc[r][0]);
                acc[r][1] = FV_FMA(x, w1, acc[r][1]);
            }
    }
    for (int r = 0; r < 4; r++) {
        if (r >= MR) continue;
        float *y = Y + (int64_t)r * ldy;
        if (full) {
            for (int h = 0; h < 2; h++) {
                fvec v = acc[r][h];
                if (bias) v = FV_ADD(v, FV_LOAD(bias + n0 + h * FV_LANES));
                if (accumulate) v = FV_ADD(v, FV_LOAD(y + h * FV_LANES));
                FV_STORE(y + h * FV_LANES, v);
            }
            continue;
        }
        FV_STORE(t[r], acc[r][0]), FV_STORE(t[r] + FV_LANES, acc[r][1]);
        for (int c = 0; c < ncols; c++) {
            const float v = bias ? t[r][c] + bias[n0 + c] : t[r][c];
            y[c] = accumulate ? y[c] + v : v;
        }
    }
#else
    for (int r = 0; r < MR; r++) {
        float t[NR8];
        for (int c = 0; c < NR8; c++) t[c] = c < ncols ? T[r * ldt + c] : 0.f;
        for (int j = 0; j < n_out; j++)
            for (int c = 0; c < NR8; c++) t[c] = fmaf(Xo[(int64_t)r * n_out + j], Wo[(int64_t)j * NR8 + c], t[c]);
        float *y = Y + (int64_t)r * ldy;
        for (int c = 0; c < ncols; c++) {
            const float v = bias ? t[c] + bias[n0 + c] : t[c];
            y[c] = accumulate ? y[c] + v : v;
        }
    }
#endif
}

/* T: the panel's int8 part, [M, ncols] ldt apart; Y: the panel's first column of row 0 */
static void outlier_rows(int M, int64_t ldt, int n_out, const float *Xo, const float *Wo, const float *T, int n0,
                         int ncols, const float *bias, float *Y, int64_t ldy, int accumulate) {
    int m = 0;
    for (; m + 4 <= M; m += 4)
        outlier_tile(4, ldt, n_out, Xo + (int64_t)m * n_out, Wo, T + m * ldt, n0, ncols, bias, Y + m * ldy, ldy,
                     accumulate);
    const float *xo = Xo + (int64_t)m * n_out, *tm = T + m * ldt;
    float *ym = Y + m * ldy;
    switch (M - m) {
        case 3: outlier_tile(3, ldt, n_out, xo, Wo, tm, n0, ncols, bias, ym, ldy, accumulate); break;
        case 2: outlier_tile(2, ldt, n_out, xo, Wo, tm, n0, ncols, bias, ym, ldy, accumulate); break;
        case 1: outlier_tile(1, ldt, n_out, xo, Wo, tm, n0, ncols, bias, ym, ldy, accumulate); break;
        default: break;
    }
}

/* Y [M, N] (ldy) = (accumulate: +=) the product above; G = 0: per-token scales (int8, colsum
 * needed), G > 0: per-group scales (int8_group; colsum: the group column sums of
 * sparserl_linear_int8_group_acc, or NULL; gscales: g, or NULL). 0, or -1 on bad sizes or no memory. */
int sparserl_linear_int8_outliers(int M, int N, int K, int G, const float *X, int64_t ldx, const int8_t *Wq,
                                  const int32_t *colsum, const float *scales, const float *gscales,
                                  const float *bias, float *Y, int64_t ldy, int accumulate, int n_out,
                                  const int32_t *idx, const float *Wo) {
    if (M <= 0 || N <= 0 || K <= 0 || G < 0 || G % 4 || n_out <= 0 || n_out >= K || (!G && !colsum)) return -1;
    for (int j = 0; j < n_out; j++)
        if (idx[j] < 0 || idx[j] >= K) return -1;
    const int K4 = (K + 3) & ~3, P = (N + NR8 - 1) / NR8, NG = G ? (K + G - 1) / G : 1;
    /* the int8 part of a panel goes to a stack tile up to OUTLIER_STACK_ROWS rows (a decode step),
     * else to T [M, N] */
    float *rest = malloc(sizeof(float) * (size_t)M * K), *Xo = malloc(sizeof(float) * (size_t)M * n_out),
          *T = M > OUTLIER_STACK_ROWS ? malloc(sizeof(float) * (size_t)M * N) : 0;
    uint8_t *work = malloc((size_t)M * (4 * NG + K4));
    int rc = -1;
    if (!rest || !Xo || (M > OUTLIER_STACK_ROWS && !T) || !work) goto done;
    for (int r = 0; r < M; r++) {
        float *x = rest + (int64_t)r * K;
        memcpy(x, X + (int64_t)r * ldx, sizeof(float) * K);
        for (int j = 0; j < n_out; j++) {
            Xo[(int64_t)r * n_out + j] = x[idx[j]];
            x[idx[j]] = 0.f;
        }
    }
    float *a = (float *)work;
    uint8_t *codes = work + (int64_t)M * NG * sizeof(float);
    if (G)
        quantize_groups(M, K, G, rest, K, (int8_t *)codes, a, group_offset(colsum));
    else
        quantize_rows(M, K, rest, K, codes, a);
#pragma omp parallel for schedule(static)
    for (int p = 0; p < P; p++) {
        const int n0 = p * NR8, ncols = N - n0 < NR8 ? N - n0 : NR8;
        const int8_t *w = Wq + (int64_t)p * (K4 / 4) * NR8 * 4;
        float tile[OUTLIER_STACK_ROWS * NR8];
        float *Tp = T ? T + n0 : tile;
        const int64_t ldt = T ? N : NR8;
        if (G)
            group_panel(p, M, K4, G, NG, (const int8_t *)codes, a, Wq, colsum, scales + n0, gscales, 0, Tp, ldt,
                        ncols, 0);
        else
            panel8(M, K4, codes, a, w, colsum + n0, scales + n0, 0, Tp, ldt, ncols, 0);
        outlier_rows(M, ldt, n_out, Xo, Wo + (int64_t)p * n_out * NR8, Tp, n0, ncols, bias, Y + n0, ldy, accumulate);
    }
    rc = 0;
done:
    free(work);
    free(T);
    free(Xo);
    free(rest);
    return rc;
}
