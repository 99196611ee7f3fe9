/* The scores KV compressors select by, computed without their large temporaries.
 *
 * 1. R-KV's redundancy term (Cai et al. 2025, arXiv 2505.24133) without the [L x L] matrix.
 *
 * For one (sequence, KV head) pair with keys k_0..k_{L-1} and validity v_i:
 *
 *     S_ij = cos(k_i, k_j)  if i != j, v_i, v_j and cos > thr;  else 0
 *     last(i) = max{ j : S_ij > 0 };  S_i,last(i) := 0 when last(i) > i   (the newest copy is kept)
 *     out_j = (1 / #valid) * sum_i S_ij
 *
 * which is rkv.redundancy() before its softmax. S is symmetric, so only j > i is computed: each kept
 * S_ij is added to column j (row i's entry) and to column i (row j's entry); last(i) > i is always
 * found among the j > i. The cosines are a register-tiled product of 4 rows x 16 columns (x 32 with
 * AVX512) over the keys normalised once and stored transposed ([D][L]), then thresholded and summed
 * in registers, without branches on the data: nothing of size L x L is written.
 *
 * Why: torch builds S as a [n, H, L, L] float tensor (480 MB at batch 16, 30 layers, L = 288) and
 * makes six passes over it (product, threshold, compare, max, scatter, sum): ~1.3 s per compression
 * on this 2-core CPU, more than eight decode steps. Pairs are split over OpenMP threads.
 *
 * 2. The observation-window attention of SnapKV / R-KV (Li et al. 2024): for one (sequence, KV
 *    head), the mean over the w window queries of softmax(q K^T / sqrt(D)) with query t (at slot
 *    L - w + t) seeing keys 0 .. L - w + t that are valid, reduced over the g query heads of the
 *    GQA group by max or mean (kv/base.py's window_attention). torch runs it as a product, a mask
 *    tensor, a softmax and three reductions over [n, Hkv, g, w, L] (~170 ms per compression at batch
 *    16); here one pass per query, the probabilities in a row buffer.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

#define TILE_COLS 16

/* Keys come as float32, or as bfloat16 (keys_bf16: the bf16 sampler's cache), widened exactly to the
 * float32 they hold as they are read: the scores are the float32 kernel's on the same values. */
static inline float bf16_value(uint16_t bits) {
    const uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* key i's D values as float32: the row itself (float32), or widened into tmp (bf16) */
static inline const float *key_row(const void *k, int64_t i, int64_t s_row, int D, int keys_bf16, float *tmp) {
    if (!keys_bf16) return (const float *)k + i * s_row;
    const uint16_t *src = (const uint16_t *)k + i * s_row;
    for (int d = 0; d < D; d++) tmp[d] = bf16_value(src[d]);
    return tmp;
}

#ifdef __AVX2__
/* Rows i0 .. i0 + ni - 1 against the 16 columns j0 .. j0 + 15, their cosines in s (row r at
 * s + r * ld): kept = s where j > i, j valid (vmask: -1 on valid slots < L) and s > thr; adds
 * them to the columns and to the rows' vector sums racc[r] (summed once a row block is done), and
 * moves each row's most recent similar key. */
static inline void keep16(int i0, int ni, int j0, const float *s, int ld, const uint8_t *valid, const int32_t *vmask,
                          float thr, float *col, int *last, float *last_val, __m256 *racc) {
    const __m256i jv0 = _mm256_add_epi32(_mm256_set1_epi32(j0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i jv1 = _mm256_add_epi32(jv0, _mm256_set1_epi32(8));
    const __m256 vm0 = _mm256_loadu_ps((const float *)(vmask + j0)), vm1 = _mm256_loadu_ps((const float *)(vmask + j0 + 8));
    const __m256 vthr = _mm256_set1_ps(thr), zero = _mm256_setzero_ps();
    __m256 c0 = _mm256_loadu_ps(col + j0), c1 = _mm256_loadu_ps(col + j0 + 8);
    for (int r = 0; r < ni; r++) {
        const int i = i0 + r;
        if (!valid[i]) continue;
        const float *sr = s + r * ld;
        const __m256i iv = _mm256_set1_epi32(i);
        const __m256 m0 = _mm256_and_ps(_mm256_and_ps(vm0, _mm256_castsi256_ps(_mm256_cmpgt_epi32(jv0, iv))),
                                        _mm256_cmp_ps(_mm256_loadu_ps(sr), vthr, _CMP_GT_OQ));
        const __m256 m1 = _mm256_and_ps(_mm256_and_ps(vm1, _mm256_castsi256_ps(_mm256_cmpgt_epi32(jv1, iv))),
                                        _mm256_cmp_ps(_mm256_loadu_ps(sr + 8), vthr, _CMP_GT_OQ));
        const __m256 k0 = _mm256_and_ps(m0, _mm256_loadu_ps(sr)), k1 = _mm256_and_ps(m1, _mm256_loadu_ps(sr + 8));
        c0 = _mm256_add_ps(c0, k0);
        c1 = _mm256_add_ps(c1, k1);
        racc[r] = _mm256_add_ps(racc[r], _mm256_add_ps(k0, k1)); /* dropped entries add exact zeros */
        const int pos = _mm256_movemask_ps(_mm256_cmp_ps(k0, zero, _CMP_GT_OQ)) |
                        (_mm256_movemask_ps(_mm256_cmp_ps(k1, zero, _CMP_GT_OQ)) << 8);
        /* no branch: whether a row has a similar key in a block is data, not a pattern */
        const int c = 31 - __builtin_clz((unsigned)pos | 1u);
        last[i] = pos ? j0 + c : last[i];
        last_val[i] = pos ? sr[c] : last_val[i];
    }
    _mm256_storeu_ps(col + j0, c0);
    _mm256_storeu_ps(col + j0 + 8, c1);
}
#endif

/* one pair: the normalised keys (zero for invalid ones) as rows [Lp][D] and as panels kn
 * [Lp / 16][D][16] (a panel = 16 keys transposed; Lp >= L rounded up to 16, plus one zero panel),
 * valid [L] */
static void one_pair(int L, int Lp, int D, const float *rows, const float *kn, const uint8_t *valid, const int32_t *vmask, float thr,
                     float *col, int *last, float *last_val, float *row_sum, float *out) {
    memset(col, 0, sizeof(float) * Lp);
    for (int i = 0; i < L; i++) { last[i] = -1; last_val[i] = 0.f; row_sum[i] = 0.f; }
    for (int i0 = 0; i0 < L; i0 += 4) {
        const int ni = L - i0 < 4 ? L - i0 : 4;
        const float *r0 = rows + (int64_t)i0 * D, *r1 = r0 + D, *r2 = r1 + D, *r3 = r2 + D;
#ifdef __AVX2__
        __m256 racc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
#endif
#if defined(__AVX512F__)
        /* two panels at once: a 4 x 32 tile, 8 accumulator chains of 16 lanes (4 chains leave the
         * FMA units waiting on their latency); the same FMAs per cosine as below, so the same bits.
         * The second panel may be the zero pad panel past L: computed, not kept. */
        for (int j0 = (i0 / TILE_COLS) * TILE_COLS; j0 < L; j0 += 2 * TILE_COLS) {
            float s[4][2 * TILE_COLS];
            const float *p0 = kn + (int64_t)j0 * D, *p1 = p0 + (int64_t)TILE_COLS * D;
            __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
            for (int d = 0; d < D; d++) {
                const __m512 b0 = _mm512_loadu_ps(p0 + d * TILE_COLS), b1 = _mm512_loadu_ps(p1 + d * TILE_COLS);
                __m512 a = _mm512_set1_ps(r0[d]);
                a00 = _mm512_fmadd_ps(a, b0, a00); a01 = _mm512_fmadd_ps(a, b1, a01);
                a = _mm512_set1_ps(r1[d]);
                a10 = _mm512_fmadd_ps(a, b0, a10); a11 = _mm512_fmadd_ps(a, b1, a11);
                a = _mm512_set1_ps(r2[d]);
                a20 = _mm512_fmadd_ps(a, b0, a20); a21 = _mm512_fmadd_ps(a, b1, a21);
                a = _mm512_set1_ps(r3[d]);
                a30 = _mm512_fmadd_ps(a, b0, a30); a31 = _mm512_fmadd_ps(a, b1, a31);
            }
            _mm512_storeu_ps(s[0], a00); _mm512_storeu_ps(s[0] + 16, a01);
            _mm512_storeu_ps(s[1], a10); _mm512_storeu_ps(s[1] + 16, a11);
            _mm512_storeu_ps(s[2], a20); _mm512_storeu_ps(s[2] + 16, a21);
            _mm512_storeu_ps(s[3], a30); _mm512_storeu_ps(s[3] + 16, a31);
            keep16(i0, ni, j0, s[0], 2 * TILE_COLS, valid, vmask, thr, col, last, last_val, racc);
            if (j0 + TILE_COLS < L)
                keep16(i0, ni, j0 + TILE_COLS, s[0] + TILE_COLS, 2 * TILE_COLS, valid, vmask, thr, col, last, last_val, racc);
        }
#else
        for (int j0 = (i0 / TILE_COLS) * TILE_COLS; j0 < L; j0 += TILE_COLS) {
            float s[4][TILE_COLS];
#ifdef __AVX2__
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
            const float *panel = kn + (int64_t)j0 * D; /* [D][16]: columns j0 .. j0 + 15 */
            for (int d = 0; d < D; d++) {
                const __m256 b0 = _mm256_loadu_ps(panel + d * TILE_COLS), b1 = _mm256_loadu_ps(panel + d * TILE_COLS + 8);
                __m256 a = _mm256_broadcast_ss(r0 + d);
                a00 = _mm256_fmadd_ps(a, b0, a00); a01 = _mm256_fmadd_ps(a, b1, a01);
                a = _mm256_broadcast_ss(r1 + d);
                a10 = _mm256_fmadd_ps(a, b0, a10); a11 = _mm256_fmadd_ps(a, b1, a11);
                a = _mm256_broadcast_ss(r2 + d);
                a20 = _mm256_fmadd_ps(a, b0, a20); a21 = _mm256_fmadd_ps(a, b1, a21);
                a = _mm256_broadcast_ss(r3 + d);
                a30 = _mm256_fmadd_ps(a, b0, a30); a31 = _mm256_fmadd_ps(a, b1, a31);
            }
            _mm256_storeu_ps(s[0], a00); _mm256_storeu_ps(s[0] + 8, a01);
            _mm256_storeu_ps(s[1], a10); _mm256_storeu_ps(s[1] + 8, a11);
            _mm256_storeu_ps(s[2], a20); _mm256_storeu_ps(s[2] + 8, a21);
            _mm256_storeu_ps(s[3], a30); _mm256_storeu_ps(s[3] + 8, a31);
            keep16(i0, ni, j0, s[0], TILE_COLS, valid, vmask, thr, col, last, last_val, racc);
#else
            (void)r1; (void)r2; (void)r3;
            for (int r = 0; r < 4; r++)
                for (int c = 0; c < TILE_COLS; c++) {
                    float acc = 0.f;
                    for (int d = 0; d < D; d++) acc += rows[(int64_t)(i0 + r) * D + d] * kn[(int64_t)j0 * D + d * TILE_COLS + c];
                    s[r][c] = acc;
                }
            const int nj = L - j0 < TILE_COLS ? L - j0 : TILE_COLS;
            for (int r = 0; r < ni; r++) {
                const int i = i0 + r;
                if (!valid[i]) continue;
                float rs = 0.f;
                for (int c = 0; c < nj; c++) {
                    const int j = j0 + c;
                    if (j <= i || !valid[j]) continue;
                    const float v = s[r][c];
                    if (!(v > thr)) continue;
                    col[j] += v;
                    rs += v;
                    if (v > 0.f) { last[i] = j; last_val[i] = v; }
                }
                row_sum[i] += rs;
            }
#endif
        }
#endif
#ifdef __AVX2__
        for (int r = 0; r < ni; r++) row_sum[i0 + r] += hsum256(racc[r]);
#endif
    }
    int n_valid = 0;
    for (int i = 0; i < L; i++) {
        n_valid += valid[i] != 0;
        col[i] += row_sum[i];
    }
    for (int i = 0; i < L; i++)
        if (last[i] > i) col[last[i]] -= last_val[i];
    const float inv = 1.f / (float)(n_valid > 0 ? n_valid : 1);
    for (int j = 0; j < L; j++) out[j] = col[j] * inv;
}

/* sum of x_d^2 over n floats (8 lanes, then a scalar tail) */
static inline float sumsq(const float *x, int n) {
    int d = 0;
    float ss = 0.f;
#ifdef __AVX2__
    __m256 acc = _mm256_setzero_ps();
    for (; d + 8 <= n; d += 8) {
        const __m256 v = _mm256_loadu_ps(x + d);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    ss = hsum256(acc);
#endif
    for (; d < n; d++) ss += x[d] * x[d];
    return ss;
}

/* keys: pair p = n * H + h at keys + n * s_n + h * s_h, row i at + i * s_row (unit stride in D);
 * valid: row n at valid + n * s_valid (one byte per slot); out: [P = N * H, L] contiguous.
 * Returns 0, or -1 when memory ran out. */
int sparserl_rkv_redundancy(int N, int H, int L, int D, const void *keys, int64_t s_n, int64_t s_h, int64_t s_row,
                            const uint8_t *valid, int64_t s_valid, float thr, float *out, int keys_bf16) {
    const int64_t item = keys_bf16 ? 2 : 4;
    const int Lp = (L + TILE_COLS - 1) / TILE_COLS * TILE_COLS + TILE_COLS;
    int failed = 0;
#pragma omp parallel
    {
        float *kn = malloc(sizeof(float) * (2 * (size_t)D * Lp + 4 * (size_t)Lp + (size_t)D));
        int *last = malloc(sizeof(int) * (size_t)Lp);
        int32_t *vmask = malloc(sizeof(int32_t) * (size_t)Lp);
        /* every thread meets the worksharing loop (its barrier), also one whose buffers failed */
#pragma omp for schedule(dynamic, 4)
        for (int p = 0; p < N * H; p++) {
            if (!kn || !last || !vmask) {
#pragma omp atomic write
                failed = 1;
            } else {
                float *rows = kn + (size_t)D * Lp, *col = rows + (size_t)D * Lp, *last_val = col + Lp, *row_sum = last_val + Lp;
                float *wide = row_sum + Lp; /* one bf16 key widened */
                const int n = p / H, h = p % H;
                const char *k = (const char *)keys + (n * s_n + h * s_h) * item;
                const uint8_t *v = valid + n * s_valid;
                for (int j = 0; j < Lp; j++) vmask[j] = j < L && v[j] ? -1 : 0;
                /* every slot of both layouts is written: the keys normalised, zeros for invalid and pad
                 * slots; first the rows (contiguous in D: vector loops), then each panel transposed from
                 * its 16 rows (contiguous writes, reads from L1). A quarter of the time went here when
                 * both were written key by key with scalar strided stores. */
                for (int i = 0; i < Lp; i++) {
                    float *row = rows + (int64_t)i * D;
                    if (!vmask[i]) {
                        memset(row, 0, sizeof(float) * (size_t)D);
                        continue;
                    }
                    const float *ki = key_row(k, i, s_row, D, keys_bf16, wide);
                    const float inv = 1.f / (sqrtf(sumsq(ki, D)) + 1e-8f);
                    for (int d = 0; d < D; d++) row[d] = ki[d] * inv;
                }
                for (int p0 = 0; p0 < Lp; p0 += TILE_COLS) {
                    float *panel = kn + (int64_t)p0 * D;
                    const float *src = rows + (int64_t)p0 * D;
                    for (int d = 0; d < D; d++)
                        for (int c = 0; c < TILE_COLS; c++) panel[d * TILE_COLS + c] = src[(int64_t)c * D + d];
                }
                one_pair(L, Lp, D, rows, kn, v, vmask, thr, col, last, last_val, row_sum, out + (int64_t)p * L);
            }
        }
        free(kn);
        free(last);
        free(vmask);
    }
    return failed ? -1 : 0;
}

static inline float dot(const float *a, const float *b, int D) {
    float s = 0.f;
    for (int d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

/* row[j] = q . k_j * scale for j in [0, n) (keys at k + j * s_row) */
static void scores_row(const float *q, const float *k, int64_t s_row, int n, int D, float scale, float *row) {
    int j = 0;
#ifdef __AVX2__
    if (D % 8 == 0) {
        const __m256 vs = _mm256_set1_ps(scale);
        for (; j + 8 <= n; j += 8) {
            const float *kj = k + j * s_row;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            for (int d = 0; d < D; d += 8) {
                const __m256 qd = _mm256_loadu_ps(q + d);
                a0 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kj + d), a0);
                a1 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kj + s_row + d), a1);
                a2 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kj + 2 * s_row + d), a2);
                a3 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kj + 3 * s_row + d), a3);
                a4 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kj + 4 * s_row + d), a4);
                a5 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kj + 5 * s_row + d), a5);
                a6 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kj + 6 * s_row + d), a6);
                a7 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kj + 7 * s_row + d), a7);
            }
            /* eight horizontal sums at once: [sum a0, ..., sum a7] */
            const __m256 t0 = _mm256_hadd_ps(a0, a1), t1 = _mm256_hadd_ps(a2, a3);
            const __m256 t2 = _mm256_hadd_ps(a4, a5), t3 = _mm256_hadd_ps(a6, a7);
            const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
            const __m256 sums = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
            _mm256_storeu_ps(row + j, _mm256_mul_ps(sums, vs));
        }
    }
#endif
    for (; j < n; j++) row[j] = dot(q, k + j * s_row, D) * scale;
}

/* row[0..n) := exp(row - max) over the valid slots (vmask -1), 0 elsewhere; returns their sum (0 if
 * none is valid) */
static float softmax_numerators(float *row, const int32_t *vmask, int n) {
    float m = -INFINITY;
    for (int j = 0; j < n; j++)
        if (vmask[j] && row[j] > m) m = row[j];
    if (m == -INFINITY) return 0.f;
    int j = 0;
    float sum = 0.f;
#ifdef __AVX2__
    const __m256 vm = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) {
        const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_loadu_ps(row + j), vm)),
                                       _mm256_loadu_ps((const float *)(vmask + j)));
        _mm256_storeu_ps(row + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    sum = hsum256(acc);
#endif
    for (; j < n; j++) {
        row[j] = vmask[j] ? expf(row[j] - m) : 0.f;
        sum += row[j];
    }
    return sum;
}

/* q: query head hq = h * G + g, window query t at q + n * sq_n + hq * sq_h + t * sq_t (unit stride
 * in D); keys and valid as above; reduce_max: 1 = max over the group, 0 = mean. out [N, H, L]. */
int sparserl_window_attention(int N, int H, int G, int W, int L, int D, const float *q, int64_t sq_n, int64_t sq_h,
                              int64_t sq_t, const void *keys, int64_t s_n, int64_t s_h, int64_t s_row,
                              const uint8_t *valid, int64_t s_valid, int reduce_max, float *out, int keys_bf16) {
    const int64_t item = keys_bf16 ? 2 : 4;
    int failed = 0;
    const float scale = 1.f / sqrtf((float)D);
#pragma omp parallel
    {
        const size_t len = (size_t)(L > 0 ? L : 1);
        float *buf = malloc(sizeof(float) * 2 * len);
        int32_t *vmask = malloc(sizeof(int32_t) * len);
        float *wide = keys_bf16 ? malloc(sizeof(float) * len * (size_t)D) : NULL; /* the pair's keys, widened */
#pragma omp for schedule(dynamic, 4)
        for (int p = 0; p < N * H; p++) {
            if (!buf || !vmask || (keys_bf16 && !wide)) {
#pragma omp atomic write
                failed = 1;
            } else {
                float *row = buf, *acc = buf + L;
                const int n = p / H, h = p % H;
                const char *base = (const char *)keys + (n * s_n + h * s_h) * item;
                const float *k = (const float *)base;
                int64_t k_row = s_row;
                if (keys_bf16) { /* widened once, read by every query of the window and group */
                    for (int j = 0; j < L; j++) key_row(base, j, s_row, D, 1, wide + (int64_t)j * D);
                    k = wide;
                    k_row = D;
                }
                const uint8_t *v = valid + n * s_valid;
                for (int j = 0; j < L; j++) vmask[j] = v[j] ? -1 : 0;
                float *o = out + (int64_t)p * L;
                for (int j = 0; j < L; j++) o[j] = 0.f;
                for (int g = 0; g < G; g++) {
                    for (int j = 0; j < L; j++) acc[j] = 0.f;
                    for (int t = 0; t < W; t++) {
                        const float *qt = q + n * sq_n + (int64_t)(h * G + g) * sq_h + t * sq_t;
                        const int seen = L - W + t + 1; /* keys up to the query's own slot */
                        scores_row(qt, k, k_row, seen, D, scale, row);
                        const float sum = softmax_numerators(row, vmask, seen);
                        if (sum == 0.f) continue; /* no key visible: nan_to_num gives 0 */
                        const float inv = 1.f / (sum * (float)W);
                        for (int j = 0; j < seen; j++) acc[j] += row[j] * inv;
                    }
                    if (reduce_max) {
                        for (int j = 0; j < L; j++) o[j] = g == 0 || acc[j] > o[j] ? acc[j] : o[j];
                    } else {
                        for (int j = 0; j < L; j++) o[j] += acc[j] / (float)G;
                    }
                }
            }
        }
        free(buf);
        free(vmask);
        free(wide);
    }
    return failed ? -1 : 0;
}
