/* The vector helpers the kernels share (AVX2, VNNI where the CPU has it; absent in the portable build). */
#ifndef SPARSERL_SIMD_H
#define SPARSERL_SIMD_H

/* A partial panel's row of a product's tile: t (the tile's sums) + bias, + y (accumulate), in the
 * full panel's order (linear.c, linear_bf16.c). */
static inline void store_tail(float *y, const float *t, int ncols, const float *bias, int accumulate) {
    for (int j = 0; j < ncols; j++) {
        const float v = bias ? t[j] + bias[j] : t[j];
        y[j] = accumulate ? v + y[j] : v;
    }
}
#ifdef __AVX2__
#include <immintrin.h>

/* exp on 8 floats: Cephes' expf (range reduction by ln 2, degree-5 polynomial; ~1e-7 relative),
 * the form of avx_mathfun (J. Pommier, zlib licence). Inputs below -88.4 give ~0 (masked later). */
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
    __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
    fx = _mm256_floor_ps(fx);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 z = _mm256_mul_ps(x, x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, z, x);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i n = _mm256_cvttps_epi32(fx);
    n = _mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

/* c + the sums of 4 adjacent products u8 x s8 into each int32 lane (u: unsigned bytes, s: signed).
 * With VNNI (AVX-VNNI, or AVX512-VNNI with VL) one vpdpbusd; on plain AVX2 vpmaddubsw + vpmaddwd +
 * vpaddd, which equals it whenever the 16-bit pair sums cannot saturate (every caller keeps
 * |u_k s_k + u_k+1 s_k+1| <= 32767), so both give the same integers. */
static inline __m256i dot4_u8s8(__m256i c, __m256i u, __m256i s) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(c, u, s);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(c, u, s);
#else
    return _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

#if defined(__AVX512BW__)
/* dot4_u8s8 on 16 int32 lanes (64 bytes) */
static inline __m512i dot4_u8s8_512(__m512i c, __m512i u, __m512i s) {
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(c, u, s);
#else
    return _mm512_add_epi32(c, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}
#endif

static inline float hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}
#ifdef __AVX512F__
/* One row of a 32-column panel's tile, held in two registers a | b: (+ bias) (+ y), stored whole,
 * or through store_tail for a partial panel (linear.c's float32 and linear_bf16.c's bf16 products). */
static inline void store_row32(float *y, __m512 a, __m512 b, int ncols, const float *bias, int accumulate) {
    if (ncols == 32) {
        if (bias) {
            a = _mm512_add_ps(a, _mm512_loadu_ps(bias));
            b = _mm512_add_ps(b, _mm512_loadu_ps(bias + 16));
        }
        if (accumulate) {
            a = _mm512_add_ps(a, _mm512_loadu_ps(y));
            b = _mm512_add_ps(b, _mm512_loadu_ps(y + 16));
        }
        _mm512_storeu_ps(y, a);
        _mm512_storeu_ps(y + 16, b);
        return;
    }
    float t[32];
    _mm512_storeu_ps(t, a);
    _mm512_storeu_ps(t + 16, b);
    store_tail(y, t, ncols, bias, accumulate);
}
#endif
#endif
#endif
