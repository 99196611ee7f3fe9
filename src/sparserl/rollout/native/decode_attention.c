/* Fused decode attention over the sampler's KV cache (one query token per sequence, GQA).
 *
 * For every sequence b and KV head h, with the g = Hq / Hkv query heads that share it:
 *
 *     s[i, j] = (q[i] . K[j]) * scale + bias[b, j]          j < L
 *     p[i, j] = exp(s[i, j] - max_j s[i, j]) / sum_j exp(...)
 *     out[i]  = sum_j p[i, j] V[j]
 *
 * in one pass over K and one over V per block of output columns (VALUE_WIDTH), each row read once
 * for up to 4 of the g query heads, parallel over (b, h) with OpenMP (the same libgomp torch
 * uses, so torch.set_num_threads applies). K and V are read straight from the cache's buffers:
 * float32 values, bfloat16 values (the bf16 sampler's cache: each widened to float32 exactly, by a shift
 * of its 16 bits, as it is loaded), or int8 / fp8 (E4M3) codes with one float32 scale per [token, KV head]
 * (kv_quant): q . (c s) = (q . c) s and sum_j p_j s_j c_j, so no dequantized copy is made. A bf16 cache
 * gives the bits float32 K/V holding the same values give: the same sums in the same order.
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
#define KV_BF16 3 /* bfloat16 values, no scales */
#define KV_ESIZE(t) ((t) == KV_FLOAT32 ? 4 : (t) == KV_BF16 ? 2 : 1) /* bytes per element */

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
    if (kv_type == KV_BF16) /* the 16 bits of a bf16 are the top half of its float32 */
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + off))), 16));
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
    if (kv_type == KV_BF16) {
        const uint32_t u = (uint32_t)((const uint16_t *)base)[off] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return ((const float *)base)[off];
}

/* Scores of key j for the G query heads, one key at a time (the keys the 4-key tile leaves). */
static inline __attribute__((always_inline)) void score_key(
    const int G, const int D, const float *q, const int64_t q_sh, const void *K, const int j, const int64_t kv_sl,
    const float *ks, const int kv_type, const float *bias, const float scale, float *p, const int L) {
    const float bj = bias[j];
    if (bj == -INFINITY) {
        for (int i = 0; i < G; i++) p[(int64_t)i * L + j] = -INFINITY;
        return;
    }
    const float sj = (ks ? ks[j] : 1.0f) * scale;
    const int64_t row = (int64_t)j * kv_sl;
    for (int i = 0; i < G; i++) {
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
            for (int d = 0; d < D; d++) dot = fmaf(qi[d], load1(K, row + d, kv_type), dot); /* one rounding a term, whatever the compiler contracts */
        }
        p[(int64_t)i * L + j] = dot * sj + bj;
    }
}

#ifdef __AVX2__
/* Load one byte of every 64-byte line of a row of `bytes` bytes. Software prefetches
 * (_mm_prefetch, to L1 or L2, 2 KB ahead of the keys or of the values) changed nothing measurable
 * on the Xeon; demand loads do: the value pass, which reads a (sequence, head)'s values, touches the
 * next one's keys, so that the memory is reading while the core computes. The compiler must keep
 * the loads: their sum goes to an empty asm statement. */
static inline void touch_row(const char *row, const int bytes) {
    int t = 0;
    for (int c = 0; c < bytes; c += 64) t += row[c];
    __asm__ volatile("" ::"r"(t));
}

/* Scores of keys j0 .. j0+3 for the G query heads q[0 .. G-1]: each key's row is loaded once for all
 * G heads. Per (head, key) the sum over d runs in 8 lanes in order of d, then the same hadd tree:
 * the bits do not depend on G or on the ISA the file is compiled for. */
static inline __attribute__((always_inline)) void scores4(
    const int G, const int D, const float *q, const int64_t q_sh, const void *K, const int64_t r0,
    const int64_t kv_sl, const int kv_type, const __m128 sj, const __m128 bj, float *p, const int L) {
    __m256 a[4][4];
    for (int i = 0; i < G; i++)
        for (int t = 0; t < 4; t++) a[i][t] = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 8) {
        const __m256 k0 = load8(K, r0 + d, kv_type), k1 = load8(K, r0 + kv_sl + d, kv_type);
        const __m256 k2 = load8(K, r0 + 2 * kv_sl + d, kv_type), k3 = load8(K, r0 + 3 * kv_sl + d, kv_type);
        for (int i = 0; i < G; i++) {
            const __m256 qv = _mm256_loadu_ps(q + (int64_t)i * q_sh + d);
            a[i][0] = _mm256_fmadd_ps(qv, k0, a[i][0]);
            a[i][1] = _mm256_fmadd_ps(qv, k1, a[i][1]);
            a[i][2] = _mm256_fmadd_ps(qv, k2, a[i][2]);
            a[i][3] = _mm256_fmadd_ps(qv, k3, a[i][3]);
        }
    }
    for (int i = 0; i < G; i++) {
        const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a[i][0], a[i][1]), _mm256_hadd_ps(a[i][2], a[i][3]));
        const __m128 dots = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        _mm_storeu_ps(p + (int64_t)i * L, _mm_add_ps(_mm_mul_ps(dots, sj), bj)); /* -inf bias stays -inf */
    }
}

/* Width of the value pass: the output columns of the G heads it accumulates in registers at once
 * (G * W / 8 accumulators: 24 fit AVX512's 32 vector registers, 12 AVX2's 16). */
#if defined(__AVX512F__)
#define VALUE_WIDTH(G) ((G) <= 3 ? 64 : 32)
#else
#define VALUE_WIDTH(G) ((G) <= 3 ? 32 : 16)
#endif

/* out[i, c0 .. c0+W-1] = sum_j w[i, j] V[j, c0 ..] for the G heads, each row of V loaded once for all
 * of them. Per (head, column) the sum runs over j in order, so the bits do not depend on W or G.
 * Keys whose weight is 0 for every head (masked) are skipped: their rows may hold anything.
 * next_K: rows (next_row_stride bytes apart, row_bytes long) to touch, one per key (touch_row). */
static inline __attribute__((always_inline)) void values(
    const int G, const int W, const int L, const int c0, const float *p, const void *V, const int64_t kv_sl,
    const float *vs, const int kv_type, const float v_unit, float *out, const int D, const char *next_K,
    const int64_t next_row_stride, const int row_bytes) {
    __m256 o[4][8];
    for (int i = 0; i < G; i++)
        for (int v = 0; v < W / 8; v++) o[i][v] = _mm256_setzero_ps();
    for (int j = 0; j < L; j++) {
        float pj[4];
        int any = 0;
        for (int i = 0; i < G; i++) {
            pj[i] = p[(int64_t)i * L + j];
            any |= pj[i] != 0.0f;
        }
        if (next_K) touch_row(next_K + j * next_row_stride, row_bytes);
        if (!any) continue;
        const int64_t row = (int64_t)j * kv_sl + c0;
        __m256 w[4];
        for (int i = 0; i < G; i++) w[i] = _mm256_set1_ps(vs ? pj[i] * vs[j] * v_unit : pj[i]);
        for (int v = 0; v < W / 8; v++) {
            const __m256 x = load8(V, row + 8 * v, kv_type);
            for (int i = 0; i < G; i++) o[i][v] = _mm256_fmadd_ps(w[i], x, o[i][v]);
        }
    }
    for (int i = 0; i < G; i++)
        for (int v = 0; v < W / 8; v++) _mm256_storeu_ps(out + (int64_t)i * D + c0 + 8 * v, o[i][v]);
}

#endif

/* One (sequence, KV head), its g query heads in chunks of G <= 4 that read each key and value row
 * once: D and G are compile-time constants in the specialised callers below. */
static inline __attribute__((always_inline)) void heads_attention(
    const int G, const int L, const int D, const float *q, const int64_t q_sh, const void *K, const void *V,
    const int64_t kv_sl, const float *ks, const float *vs, const int kv_type, const float *bias,
    const float scale, const float v_unit, float *out, float *p, const void *next_K) {
    /* scores */
    int j0 = 0;
#ifdef __AVX2__
    const int esize = KV_ESIZE(kv_type), row_bytes = D * esize;
    if (D % 8 == 0) { /* 4 keys at a time: 4 dot products reduced together by three hadds */
        for (; j0 + 4 <= L; j0 += 4) {
            const int64_t r0 = (int64_t)j0 * kv_sl;
            __m128 sj = _mm_set1_ps(scale);
            if (ks) sj = _mm_mul_ps(sj, _mm_loadu_ps(ks + j0));
            scores4(G, D, q, q_sh, K, r0, kv_sl, kv_type, sj, _mm_loadu_ps(bias + j0), p + j0, L);
        }
    }
#endif
    for (int j = j0; j < L; j++) score_key(G, D, q, q_sh, K, j, kv_sl, ks, kv_type, bias, scale, p, L);
    /* softmax per query head, in place */
    for (int i = 0; i < G; i++) {
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
#ifdef __AVX2__
    const int W = VALUE_WIDTH(G);
    if (D % W == 0) {
        for (int c0 = 0; c0 < D; c0 += W) /* the first of them touches the next head's keys */
            values(G, W, L, c0, p, V, kv_sl, vs, kv_type, v_unit, out, D,
                   c0 == 0 ? (const char *)next_K : 0, kv_sl * esize, row_bytes);
        return;
    }
#endif
    for (int i = 0; i < G; i++) {
        const float *pi = p + (int64_t)i * L;
        float *oi = out + (int64_t)i * D;
        for (int d = 0; d < D; d++) oi[d] = 0.0f;
        for (int j = 0; j < L; j++) {
            const float pj = pi[j];
            if (pj == 0.0f) continue;
            const float w = vs ? pj * vs[j] * v_unit : pj;
            const int64_t row = (int64_t)j * kv_sl;
            for (int d = 0; d < D; d++) oi[d] = fmaf(w, load1(V, row + d, kv_type), oi[d]);
        }
    }
}

/* The g query heads of one (sequence, KV head) in chunks of at most 4. */
static inline __attribute__((always_inline)) void head_attention(
    const int g, const int L, const int D, const float *q, const int64_t q_sh, const void *K, const void *V,
    const int64_t kv_sl, const float *ks, const float *vs, const int kv_type, const float *bias,
    const float scale, const float v_unit, float *out, float *p, const void *next_K) {
    for (int i0 = 0; i0 < g; i0 += 4) {
        const float *qc = q + (int64_t)i0 * q_sh;
        float *oc = out + (int64_t)i0 * D, *pc = p + (int64_t)i0 * L;
        switch (g - i0 < 4 ? g - i0 : 4) {
#define CHUNK(GC) heads_attention(GC, L, D, qc, q_sh, K, V, kv_sl, ks, vs, kv_type, bias, scale, v_unit, oc, pc, i0 + 4 >= g ? next_K : 0)
            case 1: CHUNK(1); break;
            case 2: CHUNK(2); break;
            case 3: CHUNK(3); break;
            default: CHUNK(4);
#undef CHUNK
        }
    }
}

#define DISPATCH(DCONST)                                                                                  \
    _Pragma("omp parallel for collapse(2) schedule(static)") for (int b = 0; b < B; b++) {               \
        for (int h = 0; h < Hkv; h++) {                                                                   \
            const int64_t kv_off = (int64_t)b * kv_sb + (int64_t)h * kv_sh;                               \
            const int64_t s_off = (int64_t)b * s_sb + (int64_t)h * s_sh;                                  \
            const void *Kh = (const void *)((const char *)K + kv_off * KV_ESIZE(kv_type));              \
            const void *Vh = (const void *)((const char *)V + kv_off * KV_ESIZE(kv_type));              \
            /* the next (sequence, head) in order, whose keys the value pass touches (this thread's next */ \
            /* one except at the end of its range)                                                       */ \
            const int64_t next_off = h + 1 < Hkv ? kv_off + kv_sh : (int64_t)(b + 1) * kv_sb;           \
            const void *next_K = h + 1 == Hkv && b + 1 == B ? 0                                           \
                                 : (const void *)((const char *)K + next_off * KV_ESIZE(kv_type));        \
            head_attention(g, L, DCONST, q + (int64_t)b * q_sb + (int64_t)h * g * q_sh, q_sh, Kh, Vh,     \
                           kv_sl, ks ? ks + s_off : 0, vs ? vs + s_off : 0, kv_type,                      \
                           bias + (int64_t)b * bias_sb, scale, v_unit,                                    \
                           out + ((int64_t)b * Hkv + h) * g * D, probs + ((int64_t)b * Hkv + h) * g * L,  \
                           next_K);                                                               \
        }                                                                                                 \
    }

int sparserl_decode_attention(int B, int Hq, int Hkv, int L, int D, const float *q, int64_t q_sb, int64_t q_sh,
                              const void *K, const void *V, int64_t kv_sb, int64_t kv_sh, int64_t kv_sl,
                              const float *ks, const float *vs, int64_t s_sb, int64_t s_sh, int kv_type,
                              const float *bias, int64_t bias_sb, float scale, float v_unit, float *out,
                              float *probs) {
    if (kv_type < KV_FLOAT32 || kv_type > KV_BF16 || (kv_type == KV_BF16 && (ks || vs)) || Hkv <= 0 || Hq % Hkv != 0 || L <= 0 || D <= 0) return -1;
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
