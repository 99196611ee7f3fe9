/* The small operators of a decode layer, each one pass over its rows (float32, row-major):
 *
 *     rms_norm:  y = x / sqrt(mean(x^2) + eps) * w          (Zhang & Sennrich 2019; LlamaRMSNorm)
 *     silu_mul:  y = silu(g) * u,  silu(g) = g / (1 + exp(-g)),  [g | u] one row of the fused gate/up
 *     rope:      (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) over the two halves of each head,
 *                in place (Su et al. 2021, RoFormer; the rotate-half form of transformers' Llama)
 *
 * Why: torch runs each as several operators (RMSNorm decomposes into pow, mean, rsqrt and two
 * products on CPU, ~100 us for a 16 x 576 input here; RoPE is a cat, a negation, two products and
 * a sum), each a dispatch and a pass over memory; a decode step calls them ~300 times.
 * Large inputs (a prefill) are split over OpenMP threads.
 */
#include <math.h>
#include <stdint.h>

#include "simd.h"

#define PARALLEL_ELEMENTS (1 << 16) /* below this many elements one thread does it all */

static inline float sum_squares(const float *x, int D) {
    int j = 0;
    float s = 0.f;
#ifdef __AVX2__
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (; j + 16 <= D; j += 16) {
        const __m256 x0 = _mm256_loadu_ps(x + j), x1 = _mm256_loadu_ps(x + j + 8);
        a0 = _mm256_fmadd_ps(x0, x0, a0);
        a1 = _mm256_fmadd_ps(x1, x1, a1);
    }
    s = hsum256(_mm256_add_ps(a0, a1));
#endif
    for (; j < D; j++) s += x[j] * x[j];
    return s;
}

void sparserl_rms_norm(int M, int D, const float *x, int64_t ldx, const float *w, float eps, float *y, int64_t ldy) {
#pragma omp parallel for schedule(static) if ((int64_t)M * D >= PARALLEL_ELEMENTS)
    for (int r = 0; r < M; r++) {
        const float *xr = x + (int64_t)r * ldx;
        float *yr = y + (int64_t)r * ldy;
        const float inv = 1.f / sqrtf(sum_squares(xr, D) / (float)D + eps);
        int j = 0;
#ifdef __AVX2__
        const __m256 vinv = _mm256_set1_ps(inv);
        for (; j + 8 <= D; j += 8)
            _mm256_storeu_ps(yr + j, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + j), vinv), _mm256_loadu_ps(w + j)));
#endif
        for (; j < D; j++) yr[j] = xr[j] * inv * w[j];
    }
}

void sparserl_silu_mul(int M, int I, const float *gu, int64_t ldg, float *y, int64_t ldy) {
#pragma omp parallel for schedule(static) if ((int64_t)M * I >= PARALLEL_ELEMENTS)
    for (int r = 0; r < M; r++) {
        const float *g = gu + (int64_t)r * ldg, *u = g + I;
        float *yr = y + (int64_t)r * ldy;
        int j = 0;
#ifdef __AVX2__
        const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
        for (; j + 8 <= I; j += 8) {
            const __m256 gv = _mm256_loadu_ps(g + j);
            const __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, gv))));
            _mm256_storeu_ps(yr + j, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + j)));
        }
#endif
        for (; j < I; j++) yr[j] = g[j] / (1.f + expf(-g[j])) * u[j];
    }
}

/* x: M rows (ldx apart) of H heads (D apart) of D values; cos, sin: M rows (ldc apart) of D. */
void sparserl_rope(int M, int H, int D, float *x, int64_t ldx, const float *cos_, const float *sin_, int64_t ldc) {
    const int half = D / 2;
#pragma omp parallel for schedule(static) if ((int64_t)M * H * D >= PARALLEL_ELEMENTS)
    for (int r = 0; r < M; r++) {
        const float *c = cos_ + (int64_t)r * ldc, *s = sin_ + (int64_t)r * ldc;
        for (int h = 0; h < H; h++) {
            float *x1 = x + (int64_t)r * ldx + (int64_t)h * D, *x2 = x1 + half;
            int j = 0;
#ifdef __AVX2__
            for (; j + 8 <= half; j += 8) {
                const __m256 a = _mm256_loadu_ps(x1 + j), b = _mm256_loadu_ps(x2 + j);
                const __m256 o1 = _mm256_sub_ps(_mm256_mul_ps(a, _mm256_loadu_ps(c + j)),
                                                _mm256_mul_ps(b, _mm256_loadu_ps(s + j)));
                const __m256 o2 = _mm256_add_ps(_mm256_mul_ps(b, _mm256_loadu_ps(c + half + j)),
                                                _mm256_mul_ps(a, _mm256_loadu_ps(s + half + j)));
                _mm256_storeu_ps(x1 + j, o1);
                _mm256_storeu_ps(x2 + j, o2);
            }
#endif
            for (; j < half; j++) {
                const float a = x1[j], b = x2[j];
                x1[j] = a * c[j] - b * s[j];
                x2[j] = b * c[half + j] + a * s[half + j];
            }
        }
    }
}
