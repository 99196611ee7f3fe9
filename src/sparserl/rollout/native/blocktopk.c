/* Block top-k sparse attention: one decode step of one layer (Sparrow's Vortex engine; Zhou et al.,
 * 2026, arXiv 2606.08446; sparserl.rollout.kv.blocktopk holds the method, this is its CPU kernel).
 *
 * The KV cache is kept whole. A sequence's tokens are grouped in pages of `page` tokens counted from
 * its first token (slot start[b]): page j holds slots start + page j .. start + page (j + 1) - 1, the
 * last page partial. For every sequence b and KV head h, with the g = Hq / Hkv query heads i that
 * share it:
 *
 *   1. (update != 0) the key just written at slot t = lens[b] - 1 enters the running key sum of its
 *      page j = (t - start) / page:  S_j += K_t  (S_j = K_t when it is the page's first token);
 *   2. n = ceil((lens - start) / page) pages, k = k_pages[b]. If n <= k every page is read. Else the
 *      first `sink` and the last `recent` pages, and the k - sink - recent others of largest score
 *          s_j = max_i q_i . S_j / n_j          (n_j = page: every scored page is full)
 *      ties going to the later page;
 *   3. attention over the chosen pages' tokens only, in slot order:
 *          out_i = sum_t softmax_t(scale q_i . K_t) V_t.
 *
 * Only the chosen pages' K and V rows are read, and the page sums of the scored pages (1/page of the
 * keys' bytes): that is the whole point (Sparrow: it saves attention reads, not memory). Parallel over
 * (b, h) with OpenMP (torch's libgomp, as decode_attention.c). Layout: q[b, i, d] at b q_sb + i q_sh +
 * d; K, V float32 (or, kv_bf16, bfloat16: the bf16 sampler's cache, each value widened exactly as it is
 * read, so the float32 kernel's bits on the same values) element (b, h, s, d) at b kv_sb + h kv_sh +
 * s kv_sl + d; page sums float32 (b, h, j,
 * d) at b s_sb + h s_sh + j D + d. chosen [B, Hkv, max_k] int32 (when not NULL) receives the pages
 * read, ascending, -1 after them. out [B, Hq * D] float32 may be NULL: then only the update runs.
 *
 * The products run like decode_attention.c's (4 keys at a time, each key row loaded once for up to 4
 * query heads; the values in register blocks of output columns), on the gathered rows. Each thread
 * takes a contiguous range of (b, h) pairs and plans a pair (update, scores, choice, row list) and
 * prefetches its rows LOOKAHEAD pairs before attending over it: the chosen pages are scattered 4 KB
 * runs that the hardware prefetchers do not enter (on the 2-core EPYC: 852 -> ~690 us a layer at
 * 2,091 cached tokens, batch 16, cold; docs/results/blocktopk.md).
 *
 * Returns 0; -1 on a bad shape or a k out of [sink + recent, max_k] (nothing done); -2 when out of
 * memory (some rows may have been updated).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef LOOKAHEAD
#define LOOKAHEAD 2 /* pairs planned ahead of their attention */
#endif

#if defined(__AVX512F__)
#define TOPK_VALUE_WIDTH(G) ((G) <= 3 ? 64 : 32)
#else
#define TOPK_VALUE_WIDTH(G) ((G) <= 3 ? 32 : 16)
#endif

/* 8 K or V elements from element offset `off` as float32: float32, or bf16 widened (exact) */
#ifdef __AVX2__
static inline __m256 kv8(const void *base, const int64_t off, const int bf16) {
    if (bf16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + off))), 16));
    return _mm256_loadu_ps((const float *)base + off);
}
#endif

static inline float kv1(const void *base, const int64_t off, const int bf16) {
    if (!bf16) return ((const float *)base)[off];
    const uint32_t u = (uint32_t)((const uint16_t *)base)[off] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* q . K[off .. off + D) */
static inline float dot_kv(const float *q, const void *K, const int64_t off, const int D, const int bf16) {
    int d = 0;
#ifdef __AVX2__
    if (D % 8 == 0) {
        __m256 acc = _mm256_setzero_ps();
        for (; d < D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), kv8(K, off + d, bf16), acc);
        return hsum256(acc);
    }
#endif
    float s = 0.0f;
    for (; d < D; d++) s += q[d] * kv1(K, off + d, bf16);
    return s;
}

static inline float dot(const float *a, const float *b, int D) {
    int d = 0;
    float s = 0.0f;
#ifdef __AVX2__
    if (D % 8 == 0) {
        __m256 acc = _mm256_setzero_ps();
        for (; d < D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
        return hsum256(acc);
    }
#endif
    for (; d < D; d++) s += a[d] * b[d];
    return s;
}

/* 1 when (sa, ia) ranks before (sb, ib): larger score, then the later page */
static inline int ranks_before(float sa, int ia, float sb, int ib) { return sa > sb || (sa == sb && ia > ib); }

/* Reorder (s, idx)[0 .. m-1] so that its first t entries are the t best (quickselect). */
static void top_t(float *s, int *idx, int m, int t) {
    int lo = 0, hi = m - 1;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        float fs = s[mid]; s[mid] = s[hi]; s[hi] = fs;
        int fi = idx[mid]; idx[mid] = idx[hi]; idx[hi] = fi;
        int p = lo;
        for (int i = lo; i < hi; i++)
            if (ranks_before(s[i], idx[i], s[hi], idx[hi])) {
                fs = s[i]; s[i] = s[p]; s[p] = fs;
                fi = idx[i]; idx[i] = idx[p]; idx[p] = fi;
                p++;
            }
        fs = s[p]; s[p] = s[hi]; s[hi] = fs;
        fi = idx[p]; idx[p] = idx[hi]; idx[hi] = fi;
        if (p == t - 1 || p == t) return; /* entries before p all rank before it */
        if (p > t) hi = p - 1;
        else lo = p + 1;
    }
}

/* Scores of the gathered keys for G query heads: p[i * M + m] = scale q_i . K[rows[m]], m < M. */
static inline __attribute__((always_inline)) void gathered_scores(
    const int G, const int D, const float *q, const int64_t q_sh, const void *K, const int64_t *rows, const int M,
    const float scale, float *p, const int bf16) {
    int m = 0;
#ifdef __AVX2__
    if (D % 8 == 0) {
        for (; m + 4 <= M; m += 4) {
            const int64_t k0 = rows[m], k1 = rows[m + 1], k2 = rows[m + 2], k3 = rows[m + 3];
            __m256 a[4][4];
            for (int i = 0; i < G; i++)
                for (int t = 0; t < 4; t++) a[i][t] = _mm256_setzero_ps();
            for (int d = 0; d < D; d += 8) {
                const __m256 x0 = kv8(K, k0 + d, bf16), x1 = kv8(K, k1 + d, bf16);
                const __m256 x2 = kv8(K, k2 + d, bf16), x3 = kv8(K, k3 + d, bf16);
                for (int i = 0; i < G; i++) {
                    const __m256 qv = _mm256_loadu_ps(q + (int64_t)i * q_sh + d);
                    a[i][0] = _mm256_fmadd_ps(qv, x0, a[i][0]);
                    a[i][1] = _mm256_fmadd_ps(qv, x1, a[i][1]);
                    a[i][2] = _mm256_fmadd_ps(qv, x2, a[i][2]);
                    a[i][3] = _mm256_fmadd_ps(qv, x3, a[i][3]);
                }
            }
            const __m128 vs = _mm_set1_ps(scale);
            for (int i = 0; i < G; i++) {
                const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a[i][0], a[i][1]), _mm256_hadd_ps(a[i][2], a[i][3]));
                const __m128 dots = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
                _mm_storeu_ps(p + (int64_t)i * M + m, _mm_mul_ps(dots, vs));
            }
        }
    }
#endif
    for (; m < M; m++)
        for (int i = 0; i < G; i++) p[(int64_t)i * M + m] = dot_kv(q + (int64_t)i * q_sh, K, rows[m], D, bf16) * scale;
}

/* Softmax of each of the G rows of p (M entries each), in place. */
static inline void softmax_rows(const int G, const int M, float *p) {
    for (int i = 0; i < G; i++) {
        float *pi = p + (int64_t)i * M;
        float mx = -INFINITY;
        for (int m = 0; m < M; m++) mx = pi[m] > mx ? pi[m] : mx;
        float sum = 0.0f;
        int m = 0;
#ifdef __AVX2__
        const __m256 vmx = _mm256_set1_ps(mx);
        __m256 vsum = _mm256_setzero_ps();
        for (; m + 8 <= M; m += 8) {
            const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(pi + m), vmx));
            _mm256_storeu_ps(pi + m, e);
            vsum = _mm256_add_ps(vsum, e);
        }
        sum = hsum256(vsum);
#endif
        for (; m < M; m++) {
            pi[m] = expf(pi[m] - mx);
            sum += pi[m];
        }
        const float inv = 1.0f / sum;
        for (m = 0; m < M; m++) pi[m] *= inv;
    }
}

/* out[i * D + d] = sum_m p[i * M + m] V[rows[m] + d] for the G heads. */
static inline __attribute__((always_inline)) void gathered_values(
    const int G, const int D, const float *p, const int M, const void *V, const int64_t *rows, float *out,
    const int bf16) {
#ifdef __AVX2__
    const int W = TOPK_VALUE_WIDTH(G);
    if (D % W == 0) {
        for (int c0 = 0; c0 < D; c0 += W) {
            __m256 o[4][8];
            for (int i = 0; i < G; i++)
                for (int v = 0; v < W / 8; v++) o[i][v] = _mm256_setzero_ps();
            for (int m = 0; m < M; m++) {
                const int64_t row = rows[m] + c0;
                __m256 w[4];
                for (int i = 0; i < G; i++) w[i] = _mm256_set1_ps(p[(int64_t)i * M + m]);
                for (int v = 0; v < W / 8; v++) {
                    const __m256 x = kv8(V, row + 8 * v, bf16);
                    for (int i = 0; i < G; i++) o[i][v] = _mm256_fmadd_ps(w[i], x, o[i][v]);
                }
            }
            for (int i = 0; i < G; i++)
                for (int v = 0; v < W / 8; v++) _mm256_storeu_ps(out + (int64_t)i * D + c0 + 8 * v, o[i][v]);
        }
        return;
    }
#endif
    for (int i = 0; i < G; i++) {
        float *oi = out + (int64_t)i * D;
        for (int d = 0; d < D; d++) oi[d] = 0.0f;
        for (int m = 0; m < M; m++) {
            const float w = p[(int64_t)i * M + m];
            for (int d = 0; d < D; d++) oi[d] += w * kv1(V, rows[m] + d, bf16);
        }
    }
}

/* The g query heads of one (sequence, KV head) over the gathered rows, in chunks of at most 4; inlined
 * into the two calls below, one per value of bf16, so that the float32 loads carry no test (a runtime
 * flag in the loads cost the float32 kernel ~2.5%, measured with blocktopk_profile.py --against). */
static inline __attribute__((always_inline)) void heads_over_rows(const int g, const int D, const float *q, const int64_t q_sh, const void *K,
                            const void *V, const int64_t *rows, const int M, const float scale, float *p,
                            float *out, const int bf16) {
    for (int i0 = 0; i0 < g; i0 += 4) {
        const float *qc = q + (int64_t)i0 * q_sh;
        float *oc = out + (int64_t)i0 * D;
        const int G = g - i0 < 4 ? g - i0 : 4;
        switch (G) {
#define CHUNK(GC)                                              \
    gathered_scores(GC, D, qc, q_sh, K, rows, M, scale, p, bf16); \
    softmax_rows(GC, M, p);                                       \
    gathered_values(GC, D, p, M, V, rows, oc, bf16);
            case 1: CHUNK(1) break;
            case 2: CHUNK(2) break;
            case 3: CHUNK(3) break;
            default: CHUNK(4)
#undef CHUNK
        }
    }
}

/* Everything of one (sequence, KV head) before its attention: the sum update, the choice of pages
 * (written to pages[0 .. count-1], ascending) and the element offsets of their rows in K and V
 * (rows[0 .. M-1]); returns M (0: nothing to attend). score and idx: scratch for the scored pages. */
static int plan_pair(const int b, const int h, const int g, const int D, const int page, const float *q,
                     const int64_t q_sb, const int64_t q_sh, const void *K, const int bf16, const int64_t kv_sb,
                     const int64_t kv_sh, const int64_t kv_sl, float *sums, const int64_t s_sb, const int64_t s_sh,
                     const int64_t *start, const int64_t *lens, const int32_t *k_pages, const int update,
                     const int sink, const int recent, const int attend, float *score, int *idx, int *pages,
                     int *count_out, int64_t *rows) {
    const int64_t n_tok = lens[b] - start[b];
    const int n = (int)((n_tok + page - 1) / page);
    const int64_t kv_off = (int64_t)b * kv_sb + (int64_t)h * kv_sh;
    float *S = sums + (int64_t)b * s_sb + (int64_t)h * s_sh;
    if (update) {
        const int64_t t = n_tok - 1; /* the new token, relative to start */
        float *Sj = S + (t / page) * D;
        const int64_t k = kv_off + (start[b] + t) * kv_sl;
        if (!bf16) { /* float32: a copy or a vector add, as before the bf16 cache */
            const float *kf = (const float *)K + k;
            if (t % page == 0) memcpy(Sj, kf, sizeof(float) * D);
            else
                for (int d = 0; d < D; d++) Sj[d] += kf[d];
        } else if (t % page == 0) {
            for (int d = 0; d < D; d++) Sj[d] = kv1(K, k + d, 1);
        } else {
            for (int d = 0; d < D; d++) Sj[d] += kv1(K, k + d, 1);
        }
    }
    *count_out = 0;
    if (!attend) return 0;
    const float *qh = q + (int64_t)b * q_sb + (int64_t)h * g * q_sh;
    const int k = k_pages[b];
    int count = 0;
    if (n <= k) {
        for (int j = 0; j < n; j++) pages[count++] = j;
    } else {
        /* score the pages between the always-read ones, keep the best k - sink - recent */
        const int m = n - sink - recent, t = k - sink - recent;
        const float inv = 1.0f / (float)page;
        for (int c = 0; c < m; c++) {
            const float *Sj = S + (int64_t)(sink + c) * D;
            float best = -INFINITY;
            for (int i = 0; i < g; i++) {
                const float s = dot(qh + (int64_t)i * q_sh, Sj, D) * inv;
                best = s > best ? s : best;
            }
            score[c] = best;
            idx[c] = sink + c;
        }
        if (t > 0 && t < m) top_t(score, idx, m, t);
        /* ascending: the sinks, the chosen ones sorted (insertion: t is small), the recent */
        for (int j = 0; j < sink; j++) pages[count++] = j;
        for (int c = 0; c < t; c++) {
            int at = count++;
            while (at > sink && pages[at - 1] > idx[c]) {
                pages[at] = pages[at - 1];
                at--;
            }
            pages[at] = idx[c];
        }
        for (int j = n - recent; j < n; j++) pages[count++] = j;
    }
    int M = 0;
    for (int c = 0; c < count; c++) {
        const int64_t first = start[b] + (int64_t)pages[c] * page;
        const int64_t last = first + page < lens[b] ? first + page : lens[b];
        for (int64_t s = first; s < last; s++) rows[M++] = kv_off + s * kv_sl;
    }
    *count_out = count;
    return M;
}

/* Ask for every line of the planned rows of K and V. The chosen rows are scattered runs of a page
 * each (4 KB for 16 float32 rows of 64), each on a memory page of its own that the hardware
 * prefetchers do not enter; issued one (sequence, head) ahead of its attention, they arrive while the
 * core computes the previous one. */
static inline void prefetch_rows(const void *K, const void *V, const int64_t *rows, const int M, const int D,
                                 const int esize) {
    for (int m = 0; m < M; m++)
        for (int c = 0; c < D * esize; c += 64) {
            __builtin_prefetch((const char *)K + rows[m] * esize + c, 0, 3);
            __builtin_prefetch((const char *)V + rows[m] * esize + c, 0, 3);
        }
}

int sparserl_blocktopk_attention(int B, int Hq, int Hkv, int D, int page, const float *q, int64_t q_sb,
                                 int64_t q_sh, const void *K, const void *V, int64_t kv_sb, int64_t kv_sh,
                                 int64_t kv_sl, float *sums, int64_t s_sb, int64_t s_sh, const int64_t *start,
                                 const int64_t *lens, const int32_t *k_pages, int update, int sink, int recent,
                                 float scale, float *out, int32_t *chosen, int max_k, int kv_bf16) {
    const int bf16 = kv_bf16 != 0, esize = bf16 ? 2 : 4;
    if (B <= 0 || Hkv <= 0 || Hq % Hkv != 0 || D <= 0 || page <= 0 || sink < 0 || recent < 1 || max_k < 1)
        return -1;
    const int g = Hq / Hkv, pairs = B * Hkv, attend = out != 0;
    int max_pages = 0, bad = 0;
    for (int b = 0; b < B; b++) {
        const int64_t n_tok = lens[b] - start[b];
        if (n_tok < 1 || (attend && (k_pages[b] < sink + recent || k_pages[b] > max_k))) return -1;
        const int n = (int)((n_tok + page - 1) / page);
        max_pages = n > max_pages ? n : max_pages;
    }
#pragma omp parallel
    {
        /* per thread, a contiguous range of (sequence, head) pairs, each planned (and its rows asked for)
         * LOOKAHEAD pairs ahead of its attention: LOOKAHEAD + 1 plans of pages and rows in a ring */
        int threads = 1, me = 0;
#ifdef _OPENMP
        threads = omp_get_num_threads();
        me = omp_get_thread_num();
#endif
        const int lo = (int)((int64_t)pairs * me / threads), hi = (int)((int64_t)pairs * (me + 1) / threads);
        const size_t m_max = (size_t)max_k * page;
        enum { RING = LOOKAHEAD + 1 };
        char *work = malloc(sizeof(float) * max_pages + sizeof(int) * (1 + RING) * max_pages +
                            RING * sizeof(int64_t) * m_max + sizeof(float) * 4 * m_max);
        if (!work) {
#pragma omp atomic write
            bad = 1;
        } else {
            float *score = (float *)work;
            int *idx = (int *)(score + max_pages), *pages[RING];
            int64_t *rows[RING];
            int M[RING], count[RING];
            for (int r = 0; r < RING; r++) {
                pages[r] = idx + (1 + r) * max_pages;
                rows[r] = (int64_t *)(idx + (1 + RING) * max_pages) + r * m_max;
            }
            float *p = (float *)(rows[RING - 1] + m_max);
            for (int i = lo; i < hi && i < lo + LOOKAHEAD; i++) {
                const int r = (i - lo) % RING;
                M[r] = plan_pair(i / Hkv, i % Hkv, g, D, page, q, q_sb, q_sh, K, bf16, kv_sb, kv_sh, kv_sl, sums, s_sb, s_sh,
                                 start, lens, k_pages, update, sink, recent, attend, score, idx, pages[r], &count[r],
                                 rows[r]);
                prefetch_rows(K, V, rows[r], M[r], D, esize);
            }
            for (int i = lo; i < hi; i++) {
                const int now = (i - lo) % RING, ahead = i + LOOKAHEAD;
                if (ahead < hi) {
                    const int r = (ahead - lo) % RING;
                    M[r] = plan_pair(ahead / Hkv, ahead % Hkv, g, D, page, q, q_sb, q_sh, K, bf16, kv_sb, kv_sh, kv_sl, sums,
                                     s_sb, s_sh, start, lens, k_pages, update, sink, recent, attend, score, idx,
                                     pages[r], &count[r], rows[r]);
                    prefetch_rows(K, V, rows[r], M[r], D, esize);
                }
                if (!attend) continue;
                const int b = i / Hkv, h = i % Hkv;
                const float *qh = q + (int64_t)b * q_sb + (int64_t)h * g * q_sh;
                if (bf16) heads_over_rows(g, D, qh, q_sh, K, V, rows[now], M[now], scale, p, out + (int64_t)i * g * D, 1);
                else heads_over_rows(g, D, qh, q_sh, K, V, rows[now], M[now], scale, p, out + (int64_t)i * g * D, 0);
                if (chosen) {
                    int32_t *ch = chosen + (int64_t)i * max_k;
                    for (int c = 0; c < max_k; c++) ch[c] = c < count[now] ? pages[now][c] : -1;
                }
            }
            free(work);
        }
    }
    return bad ? -2 : 0;
}
