/* The decode products timed in C alone, no Python: float32 (linear.c) and int8 (linear_int8.c), GMAC/s
 * at M rows, best of `reps` passes over `layers` distinct weights (1: hot; 30: streamed). Results:
 * docs/results/engine_profile.md.
 *
 *   gcc -O3 -march=native -fno-math-errno -fopenmp -Isrc/sparserl/rollout/native -o /tmp/products \
 *       experiments/kernels/native_products.c -lm
 *   OMP_NUM_THREADS=2 /tmp/products 3072 576 30 16 10      # N K layers M reps
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <omp.h>
#include "linear.c"
#include "linear_int8.c"

static double now(void) { return omp_get_wtime(); }

int main(int argc, char **argv) {
    int N = atoi(argv[1]), K = atoi(argv[2]), layers = atoi(argv[3]), M = argc > 4 ? atoi(argv[4]) : 16;
    int reps = argc > 5 ? atoi(argv[5]) : 20;
    const int P = (N + 23) / 24, P8 = (N + 15) / 16, K4 = (K + 3) & ~3;
    float *X = malloc(sizeof(float) * M * K), *Y = malloc(sizeof(float) * M * N);
    for (int i = 0; i < M * K; i++) X[i] = (float)rand() / RAND_MAX - 0.5f;
    float **Wp = malloc(sizeof(float *) * layers); int8_t **Wq = malloc(sizeof(int8_t *) * layers);
    int32_t *cs = malloc(sizeof(int32_t) * P8 * 16); float *sc = malloc(sizeof(float) * N);
    float *W = malloc(sizeof(float) * N * K); int8_t *Q = malloc(N * K);
    for (int i = 0; i < N * K; i++) { W[i] = (float)rand() / RAND_MAX - 0.5f; Q[i] = (rand() % 129) - 64; }
    for (int n = 0; n < N; n++) sc[n] = 0.01f;
    for (int l = 0; l < layers; l++) {
        Wp[l] = aligned_alloc(64, sizeof(float) * P * 24 * K); sparserl_pack_linear(N, K, W, Wp[l]);
        Wq[l] = aligned_alloc(64, (size_t)P8 * 16 * K4); sparserl_pack_int8(N, K, Q, Wq[l], cs);
    }
    uint8_t *work = malloc(M * (K4 + 4) + 64);
    double best_f = 1e9, best_i = 1e9;
    for (int r = 0; r < reps; r++) {
        double t = now();
        for (int l = 0; l < layers; l++) sparserl_linear(M, N, K, X, K, Wp[l], 0, Y, N, 0);
        t = now() - t; if (t < best_f) best_f = t;
        t = now();
        for (int l = 0; l < layers; l++) sparserl_linear_int8(M, N, K, X, K, Wq[l], cs, sc, 0, Y, N, work);
        t = now() - t; if (t < best_i) best_i = t;
    }
    double macs = (double)M * N * K * layers;
    printf("N=%d K=%d layers=%d M=%d threads=%d: float32 %.1f GMAC/s  int8 %.1f GMAC/s\n", N, K, layers, M,
           omp_get_max_threads(), macs / best_f / 1e9, macs / best_i / 1e9);
    return 0;
}
