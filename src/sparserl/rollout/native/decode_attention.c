/* Fused decode attention over the sampler's KV cache (one query token per sequence, GQA).
 *
 * For every sequence b and KV head h, with the g = Hq / Hkv query heads that share it:
 *
 *     s[i, j] = (q[i] . K[j]) * scale + bias[b, j]          j < L
 *     p[i, j] = exp(s[i, j] - max_j s[i, j]) / sum_j exp(...)
 *     out[i]  = sum_j p[i, j] V[j]
 *
 * in one pass over K and one over V, parallel over (b, h) with OpenMP (the same libgomp torch
 * uses, so torch.set_num_threads applies). K and V are read straight from the cache's buffers:
 * float32 values, or int8 / fp8 (E4M3) codes with one float32 scale per [token, KV head] (kv_quant):
 * q . (c s) = (q . c) s and sum_j p_j s_j c_j, so no dequantized copy is made.
 *
 * Why not torch: the same computation as two batched matmuls runs B * Hkv tiny [g x D] x [D x L]
 * products (g = 3 for SmolLM2), each a separate GEMM call with its own packing, plus a softmax and
 * a bias add over [B, Hkv, g, L]: ~9 GB/s of K/V traffic where the machine streams ~30.
 *
 * Masked slots (bias -inf) get probability exactly 0. Scores of a row are written to `probs`
 * ([B, Hkv, g, L], float32) and turned into the probabilities in place, which the caller keeps for
 * H2O's accumulated attention.
 *
 * Returns 0, or -1 when the shape is not supported (the caller falls back to torch).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define KV_FLOAT32 0
#define KV_INT8 1
#define KV_FP8 2 /* float8_e4m3fn codes, read as code * 2^-8 (the caller folds 256 into the scales) */

#include "simd.h"

#ifdef __AVX2__

static inline __m256 load8(const void *base, int64_t off, int kv_type) {
    if (kv_type == KV_INT8) {
        __m128i c = _mm_loadl_epi64((const __m128i *)((const int8_t *)base + off));
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c));
    }
    if (kv_type == KV_FP8) { /* E4M3 s eeee mmm, sign-extended and shifted left by 7 = the float16
                                s 0eeee mmm0000000 once bit 14 is cleared: the code times 2^-8 */
        __m128i h = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)((const int8_t *)base + off)));
        h = _mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16((short)~(1 << 14)));
        return _mm256_cvtph_ps(h);
    }
    return _mm256_loadu_ps((const float *)base + off);
}
#endif

static inline float fp8_value(uint8_t c) { /* E4M3 code times 2^-8, as load8 gives it */
    const int e = (c >> 3) & 15, m = c & 7;
    const float v = e ? ldexpf(1.0f + m / 8.0f, e - 15) : ldexpf((float)m, -17);
    return (c & 128) ? -v : v;
}

static inline float load1(const void *base, int64_t off, int kv_type) {
    if (kv_type == KV_INT8) return (float)((const int8_t *)base)[off];
    if (kv_type == KV_FP8) return fp8_value(((const uint8_t *)base)[off]);
    return ((const float *)base)[off];
}

/* One (sequence, KV head): D is a compile-time constant in the specialised callers below. */
static inline __attribute__((always_inline)) void head_attention(
    const int g, const int L, const int D, const float *q, const int64_t q_sh, const void *K, const void *V,
    const int64_t kv_sl, const float *ks, const float *vs, const int kv_type, const float *bias,
    const float scale, const float v_unit, float *out, float *p) {
    /* scores */
    int j0 = 0;
#ifdef __AVX2__
    if (D % 8 == 0) { /* 4 keys at a time: 4 dot products reduced together by three hadds */
        for (; j0 + 4 <= L; j0 += 4) {
            const int64_t r0 = (int64_t)j0 * kv_sl;
            __m128 sj = _mm_set1_ps(scale);
            if (ks) sj = _mm_mul_ps(sj, _mm_loadu_ps(ks + j0));
            const __m128 bj = _mm_loadu_ps(bias + j0);
            for (int i = 0; i < g; i++) {
                const float *qi = q + (int64_t)i * q_sh;
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int d = 0; d < D; d += 8) {
                    const __m256 qv = _mm256_loadu_ps(qi + d);
                    a0 = _mm256_fmadd_ps(qv, load8(K, r0 + d, kv_type), a0);
                    a1 = _mm256_fmadd_ps(qv, load8(K, r0 + kv_sl + d, kv_type), a1);
                    a2 = _mm256_fmadd_ps(qv, load8(K, r0 + 2 * kv_sl + d, kv_type), a2);
                    a3 = _mm256_fmadd_ps(qv, load8(K, r0 + 3 * kv_sl + d, kv_type), a3);
                }
                const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
                const __m128 dots = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
                _mm_storeu_ps(p + (int64_t)i * L + j0, _mm_add_ps(_mm_mul_ps(dots, sj), bj)); /* -inf bias stays -inf */
            }
        }
    }
#endif
    for (int j = j0; j < L; j++) {
        const float bj = bias[j];
        if (bj == -INFINITY) {
            for (int i = 0; i < g; i++) p[(int64_t)i * L + j] = -INFINITY;
            continue;
        }
        const float sj = (ks ? ks[j] : 1.0f) * scale;
        const int64_t row = (int64_t)j * kv_sl;
        for (int i = 0; i < g; i++) {
            const float *qi = q + (int64_t)i * q_sh;
            float dot;
#ifdef __AVX2__
            if (D % 16 == 0) {
                __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
                for (int d = 0; d < D; d += 16) {
                    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qi + d), load8(K, row + d, kv_type), a0);
                    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qi + d + 8), load8(K, row + d + 8, kv_type), a1);
                }
                dot = hsum256(_mm256_add_ps(a0, a1));
            } else
#endif
            {
                dot = 0.0f;
                for (int d = 0; d < D; d++) dot += qi[d] * load1(K, row + d, kv_type);
            }
            p[(int64_t)i * L + j] = dot * sj + bj;
        }
    }
    /* softmax per query head, in place */
    for (int i = 0; i < g; i++) {
        float *pi = p + (int64_t)i * L;
        float mx = -INFINITY;
        for (int j = 0; j < L; j++) mx = pi[j] > mx ? pi[j] : mx;
        float sum = 0.0f;
        int j = 0;
#ifdef __AVX2__
        const __m256 vmx = _mm256_set1_ps(mx), ninf = _mm256_set1_ps(-INFINITY);
        __m256 vsum = _mm256_setzero_ps();
        for (; j + 8 <= L; j += 8) {
            __m256 s = _mm256_loadu_ps(pi + j);
            __m256 keep = _mm256_cmp_ps(s, ninf, _CMP_GT_OQ);
            __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(s, vmx)), keep);
            _mm256_storeu_ps(pi + j, e);
            vsum = _mm256_add_ps(vsum, e);
        }
        sum = hsum256(vsum);
#endif
        for (; j < L; j++) {
            const float e = pi[j] == -INFINITY ? 0.0f : expf(pi[j] - mx);
            pi[j] = e;
            sum += e;
        }
        const float inv = 1.0f / sum;
        for (j = 0; j < L; j++) pi[j] *= inv;
    }
    /* out[i] = sum_j p[i, j] (vs_j v_unit) V[j] */
    for (int i = 0; i < g; i++) {
        const float *pi = p + (int64_t)i * L;
        float *oi = out + (int64_t)i * D;
#ifdef __AVX2__
        if (D == 64 || D == 128) {
            for (int half = 0; half < D; half += 64) {
                __m256 o[8];
                for (int v = 0; v < 8; v++) o[v] = _mm256_setzero_ps();
                for (int j = 0; j < L; j++) {
                    const float pj = pi[j];
                    if (pj == 0.0f) continue;
                    const __m256 w = _mm256_set1_ps(vs ? pj * vs[j] * v_unit : pj);
                    const int64_t row = (int64_t)j * kv_sl + half;
                    for (int v = 0; v < 8; v++) o[v] = _mm256_fmadd_ps(w, load8(V, row + 8 * v, kv_type), o[v]);
                }
                for (int v = 0; v < 8; v++) _mm256_storeu_ps(oi + half + 8 * v, o[v]);
            }
            continue;
        }
#endif
        for (int d = 0; d < D; d++) oi[d] = 0.0f;
        for (int j = 0; j < L; j++) {
            const float pj = pi[j];
            if (pj == 0.0f) continue;
            const float w = vs ? pj * vs[j] * v_unit : pj;
            const int64_t row = (int64_t)j * kv_sl;
            for (int d = 0; d < D; d++) oi[d] += w * load1(V, row + d, kv_type);
        }
    }
}

#define DISPATCH(DCONST)                                                                                  \
    _Pragma("omp parallel for collapse(2) schedule(static)") for (int b = 0; b < B; b++) {               \
        for (int h = 0; h < Hkv; h++) {                                                                   \
            const int64_t kv_off = (int64_t)b * kv_sb + (int64_t)h * kv_sh;                               \
            const int64_t s_off = (int64_t)b * s_sb + (int64_t)h * s_sh;                                  \
            const void *Kh = kv_type ? (const void *)((const int8_t *)K + kv_off)                         \
                                     : (const void *)((const float *)K + kv_off);                         \
            const void *Vh = kv_type ? (const void *)((const int8_t *)V + kv_off)                         \
                                     : (const void *)((const float *)V + kv_off);                         \
            head_attention(g, L, DCONST, q + (int64_t)b * q_sb + (int64_t)h * g * q_sh, q_sh, Kh, Vh,     \
                           kv_sl, ks ? ks + s_off : 0, vs ? vs + s_off : 0, kv_type,                      \
                           bias + (int64_t)b * bias_sb, scale, v_unit,                                    \
                           out + ((int64_t)b * Hkv + h) * g * D, probs + ((int64_t)b * Hkv + h) * g * L); \
        }                                                                                                 \
    }

int sparserl_decode_attention(int B, int Hq, int Hkv, int L, int D, const float *q, int64_t q_sb, int64_t q_sh,
                              const void *K, const void *V, int64_t kv_sb, int64_t kv_sh, int64_t kv_sl,
                              const float *ks, const float *vs, int64_t s_sb, int64_t s_sh, int kv_type,
                              const float *bias, int64_t bias_sb, float scale, float v_unit, float *out,
                              float *probs) {
    if (kv_type < KV_FLOAT32 || kv_type > KV_FP8 || Hkv <= 0 || Hq % Hkv != 0 || L <= 0 || D <= 0) return -1;
    const int g = Hq / Hkv;
    if (D == 64) {
        DISPATCH(64)
    } else if (D == 128) {
        DISPATCH(128)
    } else {
        DISPATCH(D)
    }
    return 0;
}

int sparserl_native_abi(void) { return 1; }
