/* A decode layer of the sampler in two calls (sparserl.rollout.fused):
 *
 *   sparserl_layer_qkv:  x = rms_norm(h; ln1);  [q | k | v] = x Wqkv^T (+ b);  RoPE on q and k in place;
 *                        k and v stored at each row's slot of the layer's K, V buffers: float32, bfloat16,
 *                        or int8 codes with their per-vector scales (the int8 KV cache)
 *   sparserl_layer_mlp:  h += a Wo^T;  x = rms_norm(h; ln2);  [g | u] = x Wgu^T;  h += (silu(g) u) Wdown^T
 *
 * (attention over the cache runs between them: decode_attention.c). Every product goes through
 * sparserl_apply, which takes one descriptor per weight: float32 panels (linear.c), int8 with
 * per-token scales or int8 with per-group scales (linear_int8.c), bfloat16 panels (linear_bf16.c: the
 * bf16 sampler's step, its inputs rounded to bf16 in the call, float32 sums), each int8 kind optionally with
 * SmoothQuant's per-input 1/s (the inputs multiplied by it first, as SmoothedLinear does) and with
 * outlier input channels in float32 (OutlierLinear; linear_int8.c's sparserl_linear_int8_outliers).
 *
 * Why: the same operators called one at a time from Python cost ~30-40 us each in their
 * wrappers and in torch's small operators on the project's 2-core machine (a ctypes call alone
 * ~10 us), about 20 of them a layer: over 10 ms of a ~100-ms step of SmolLM2-135M at batch 16.
 * The maths and its order are those of the unfused step, so the results are the same bits.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { WEIGHT_FLOAT32 = 0, WEIGHT_INT8 = 1, WEIGHT_INT8_GROUP = 2, WEIGHT_BF16 = 3 };
enum { KV_FLOAT32 = 0, KV_INT8 = 1, KV_BF16 = 3 };  /* decode_attention.c's kv_type codes the write takes */

typedef struct {
    int32_t kind;            /* WEIGHT_* */
    int32_t N, K, group;     /* out features, in features, inputs per scale (int8 group) */
    const void *panels;      /* linear.c's float panels or linear_int8.c's int8 panels */
    const int32_t *colsum;   /* int8: the panels' column sums; int8 group: per group, packed like
                                group_scales, or NULL (linear_int8.c's sparserl_linear_int8_group_acc) */
    const float *scales;     /* int8: per output channel */
    const float *bias;       /* [N] or NULL */
    const float *smooth;     /* [K]: multiplies the inputs first (SmoothQuant's 1/s), or NULL */
    int32_t n_outliers;      /* int8 kinds: input channels kept in float32 (0: none) */
    const int32_t *outlier_idx;  /* [n_outliers]: which inputs (their codes and weight columns are 0) */
    const float *outlier_panels; /* W[:, outlier_idx] [N, n_outliers] in linear_int8.c's panels */
    const float *group_scales;   /* int8 group: the weights' scale per output and group, packed per
                                    panel ([P][ceil(K / group)][panel width]), or NULL */
    int32_t panel_width, k_pad;  /* bf16: sparserl_pack_bf16's layout of `panels` */
} sparserl_weight;

int sparserl_linear(int M, int N, int K, const float *X, int64_t ldx, const float *Wp, const float *bias, float *Y,
                    int64_t ldy, int accumulate);
int sparserl_linear_int8_acc(int M, int N, int K, const float *X, int64_t ldx, const int8_t *Wq,
                             const int32_t *colsum, const float *scales, const float *bias, float *Y, int64_t ldy,
                             uint8_t *work, int accumulate);
int sparserl_linear_int8_group_acc(int M, int N, int K, int G, const float *X, int64_t ldx, const int8_t *Wq,
                                   const int32_t *gcolsum, const float *scales, const float *gscales,
                                   const float *bias, float *Y, int64_t ldy, uint8_t *work, int accumulate);
int sparserl_linear_int8_outliers(int M, int N, int K, int G, const float *X, int64_t ldx, const int8_t *Wq,
                                  const int32_t *colsum, const float *scales, const float *gscales,
                                  const float *bias, float *Y, int64_t ldy, int accumulate, int n_out,
                                  const int32_t *idx, const float *Wo);
int sparserl_linear_bf16(int M, int N, int K, const float *X, int64_t ldx, const uint16_t *Wb, int width, int kpad,
                         const float *bias, float *Y, int64_t ldy, int accumulate);
void sparserl_to_bf16(int64_t n, const float *x, uint16_t *out);
void sparserl_rms_norm(int M, int D, const float *x, int64_t ldx, const float *w, float eps, float *y, int64_t ldy);
void sparserl_silu_mul(int M, int I, const float *gu, int64_t ldg, float *y, int64_t ldy);
void sparserl_rope(int M, int H, int D, float *x, int64_t ldx, const float *cos_, const float *sin_, int64_t ldc);

int sparserl_weight_size(void) { return (int)sizeof(sparserl_weight); }

/* Y (+)= X W^T (+ bias) for the M rows of X (ldx apart); 0, or -1 on a bad descriptor or no memory. */
int sparserl_apply(const sparserl_weight *w, int M, const float *X, int64_t ldx, float *Y, int64_t ldy,
                   int accumulate) {
    const int N = w->N, K = w->K, K4 = (K + 3) & ~3, n_out = w->n_outliers;
    float *smoothed = 0;
    uint8_t *work = 0;
    int rc = -1;
    if (n_out < 0 || (n_out > 0 && ((w->kind != WEIGHT_INT8 && w->kind != WEIGHT_INT8_GROUP) || !w->outlier_idx ||
                                    !w->outlier_panels || (w->kind == WEIGHT_INT8_GROUP && w->group <= 0))))
        return -1;
    if (w->smooth) {
        smoothed = malloc(sizeof(float) * (size_t)M * K);
        if (!smoothed) return -1;
        for (int r = 0; r < M; r++)
            for (int k = 0; k < K; k++) smoothed[(int64_t)r * K + k] = X[(int64_t)r * ldx + k] * w->smooth[k];
        X = smoothed;
        ldx = K;
    }
    if (n_out) {
        rc = sparserl_linear_int8_outliers(M, N, K, w->kind == WEIGHT_INT8_GROUP ? w->group : 0, X, ldx,
                                           (const int8_t *)w->panels, w->colsum, w->scales,
                                           w->kind == WEIGHT_INT8_GROUP ? w->group_scales : 0, w->bias, Y, ldy,
                                           accumulate, n_out, w->outlier_idx, w->outlier_panels);
        free(smoothed);
        return rc;
    }
    switch (w->kind) {
        case WEIGHT_FLOAT32:
            rc = sparserl_linear(M, N, K, X, ldx, (const float *)w->panels, w->bias, Y, ldy, accumulate);
            break;
        case WEIGHT_INT8:
            work = malloc((size_t)M * (K4 + 4));
            if (work)
                rc = sparserl_linear_int8_acc(M, N, K, X, ldx, (const int8_t *)w->panels, w->colsum, w->scales,
                                              w->bias, Y, ldy, work, accumulate);
            break;
        case WEIGHT_INT8_GROUP:
            if (w->group > 0) {
                work = malloc((size_t)M * (4 * ((K + w->group - 1) / w->group) + K4));
                if (work)
                    rc = sparserl_linear_int8_group_acc(M, N, K, w->group, X, ldx, (const int8_t *)w->panels,
                                                        w->colsum, w->scales, w->group_scales, w->bias, Y, ldy,
                                                        work, accumulate);
            }
            break;
        case WEIGHT_BF16:
            if (!w->smooth)
                rc = sparserl_linear_bf16(M, N, K, X, ldx, (const uint16_t *)w->panels, w->panel_width, w->k_pad,
                                          w->bias, Y, ldy, accumulate);
            break;
        default:
            break;
    }
    free(work);
    free(smoothed);
    return rc;
}

/* The int8 KV cache's write (kv_quant.py's Int8, the same float32 operations in the same order, so the
 * same codes and scale): s = max|x| / 127 (at least FLT_MIN), c = round-half-even(x / s). Returns s. */
static float quantize_int8(int D, const float *x, int8_t *codes) {
    float amax = 0.0f;
    for (int i = 0; i < D; i++) amax = fmaxf(amax, fabsf(x[i]));
    float s = amax / 127.0f;
    if (s < FLT_MIN) s = FLT_MIN;
    for (int i = 0; i < D; i++) {
        float c = nearbyintf(x[i] / s);
        codes[i] = (int8_t)(c > 127.0f ? 127.0f : (c < -127.0f ? -127.0f : c));
    }
    return s;
}

/* h [M, hidden] -> qkv [M, (Hq + 2 Hkv) D] (q and k rotated by cos/sin [M, D]); x [M, hidden] is
 * scratch. With K != NULL, row r's k and v heads are stored at slot slots[r] of K, V (element
 * (b, h, s, d) at b sb + h sh + s ss + d): float32, or with kv_bf16 bfloat16 (rounded to nearest even,
 * the bits of torch's .to(torch.bfloat16)). */
int sparserl_layer_qkv(int M, int hidden, const float *h, const float *ln1, float eps, const sparserl_weight *wqkv,
                       int Hq, int Hkv, int D, const float *cos_, const float *sin_, float *x, float *qkv, void *K,
                       void *V, int64_t sb, int64_t sh, int64_t ss, const int64_t *slots, int kv_type, float *Ks,
                       float *Vs, int64_t s_sb, int64_t s_sh) {
    const int width = (Hq + 2 * Hkv) * D;
    if (wqkv->N != width || wqkv->K != hidden) return -1;
    if (K && kv_type != KV_FLOAT32 && kv_type != KV_BF16 && !(kv_type == KV_INT8 && Ks && Vs)) return -1;
    sparserl_rms_norm(M, hidden, h, hidden, ln1, eps, x, hidden);
    if (sparserl_apply(wqkv, M, x, hidden, qkv, width, 0) != 0) return -1;
    sparserl_rope(M, Hq + Hkv, D, qkv, width, cos_, sin_, D);
    if (K) {
        for (int r = 0; r < M; r++) {
            const float *k = qkv + (int64_t)r * width + (int64_t)Hq * D, *v = k + (int64_t)Hkv * D;
            for (int j = 0; j < Hkv; j++) {
                const int64_t at = r * sb + j * sh + slots[r] * ss;
                if (kv_type == KV_BF16) {
                    sparserl_to_bf16(D, k + (int64_t)j * D, (uint16_t *)K + at);
                    sparserl_to_bf16(D, v + (int64_t)j * D, (uint16_t *)V + at);
                } else if (kv_type == KV_INT8) {
                    const int64_t s_at = r * s_sb + j * s_sh + slots[r];
                    Ks[s_at] = quantize_int8(D, k + (int64_t)j * D, (int8_t *)K + at);
                    Vs[s_at] = quantize_int8(D, v + (int64_t)j * D, (int8_t *)V + at);
                } else {
                    memcpy((float *)K + at, k + (int64_t)j * D, sizeof(float) * D);
                    memcpy((float *)V + at, v + (int64_t)j * D, sizeof(float) * D);
                }
            }
        }
    }
    return 0;
}

/* h [M, hidden] += the attention's output a [M, lda apart] through Wo, then the MLP; x [M, hidden],
 * gu [M, 2 I] and act [M, I] are scratch (I = wgu->N / 2). */
int sparserl_layer_mlp(int M, int hidden, float *h, const float *a, int64_t lda, const sparserl_weight *wo,
                       const float *ln2, float eps, const sparserl_weight *wgu, const sparserl_weight *wdown, float *x,
                       float *gu, float *act) {
    const int inter = wgu->N / 2;
    if (wo->N != hidden || wgu->K != hidden || wgu->N % 2 || wdown->K != inter || wdown->N != hidden) return -1;
    if (sparserl_apply(wo, M, a, lda, h, hidden, 1) != 0) return -1;
    sparserl_rms_norm(M, hidden, h, hidden, ln2, eps, x, hidden);
    if (sparserl_apply(wgu, M, x, hidden, gu, 2 * inter, 0) != 0) return -1;
    sparserl_silu_mul(M, inter, gu, 2 * inter, act, inter);
    return sparserl_apply(wdown, M, act, inter, h, hidden, 1);
}
