// ctune-bench: training throughput against this machine's own sgemm rate, measured in
// the same run.
//
//   ctune-bench [train] [layers=30] [batch=4] [seq=256] [steps=4] [threads=0] [tiling=1]
//
// The model is SmolLM-135M-shaped (hidden 576, 30 layers, 9 heads, 3 kv heads,
// intermediate 1536, vocab 49152, tied embeddings), randomly initialized, fp32. One step
// is forward + LM head + backward + AdamW over batch x seq tokens. Achieved GFLOP/s
// counts 6 x (matmul parameters) + causal attention per token
// (ct_model_train_flops_per_token); the reference is a square sgemm on the same threads.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "error.h"
#include "lm.h"
#include "log.h"
#include "matmul.h"
#include "optim.h"
#include "pool.h"
#include "rng.h"

static long arg(int argc, char **argv, const char *key, long def) {
  size_t n = strlen(key);
  for (int i = 1; i < argc; i++)
    if (strncmp(argv[i], key, n) == 0 && argv[i][n] == '=') return atol(argv[i] + n + 1);
  return def;
}

// Best of `reps` runs of an n x n x n sgemm, GFLOP/s.
static double sgemm_gflops(int n, int reps) {
  float *a = aligned_alloc(64, sizeof(float) * n * n), *b = aligned_alloc(64, sizeof(float) * n * n);
  float *c = aligned_alloc(64, sizeof(float) * n * n);
  for (long i = 0; i < (long)n * n; i++) {
    a[i] = (float)(i % 13) * 0.01f;
    b[i] = (float)(i % 7) * 0.01f;
  }
  double best = 0;
  for (int r = 0; r < reps; r++) {
    double t = ct_now();
    ct_sgemm('N', 'T', n, n, n, 1, a, n, b, n, 0, c, n);
    t = ct_now() - t;
    double g = 2.0 * n * n * n / t / 1e9;
    if (g > best) best = g;
  }
  free(a);
  free(b);
  free(c);
  return best;
}

int main(int argc, char **argv) {
  ct_blas_init(argc, argv);
  int threads = (int)arg(argc, argv, "threads", 0);
  if (ct_pool_init(threads)) return 1;
  int L = (int)arg(argc, argv, "layers", 30), B = (int)arg(argc, argv, "batch", 4);
  int T = (int)arg(argc, argv, "seq", 256), steps = (int)arg(argc, argv, "steps", 4);
  int tiling = (int)arg(argc, argv, "tiling", 1);
  printf("machine: %d threads, OpenBLAS core %s\n", ct_pool_threads(), ct_blas_corename());
  double peak = sgemm_gflops(2048, 10);
  printf("sgemm 2048x2048x2048: %.1f GFLOP/s\n", peak);

  ct_model_config c = ct_model_config_smollm135m(L);
  ct_model m;
  ct_acts a;
  ct_head h;
  ct_batch b;
  if (ct_model_init(&m, &c, T) || ct_acts_init(&a, &m, B, T, true) ||
      ct_head_init(&h, B * T, c.vocab_size, c.hidden_size, tiling) || ct_batch_init(&b, B, T)) {
    fprintf(stderr, "ctune-bench: %s\n", ct_last_error());
    return 1;
  }
  ct_model_init_random(&m, 1, 0.02f);
  size_t bytes = sizeof(float) * m.n_floats;
  float *g = aligned_alloc(64, bytes), *m1 = aligned_alloc(64, bytes), *m2 = aligned_alloc(64, bytes);
  memset(g, 0, bytes);
  memset(m1, 0, bytes);
  memset(m2, 0, bytes);
  ct_weights gw;
  ct_weights_bind(&gw, &m, g);
  ct_rng r;
  ct_rng_seed(&r, 5);
  b.B = B;
  b.T = T;
  b.n_tokens = (long)B * T;
  for (int n = 0; n < B * T; n++) {
    b.ids[n] = (int)ct_rng_below(&r, (uint64_t)c.vocab_size);
    b.pos[n] = n % T;
    b.seg[n] = 0;
  }
  for (int n = 0; n < B * T; n++) b.target[n] = (n + 1) % T ? b.ids[n + 1] : -1;
  ct_adamw adam = {0.9, 0.999, 1e-8, 0.0};
  double flops = ct_model_train_flops_per_token(&c, T) * B * T, best = 1e30;
  printf("model: %.1fM parameters, %d layers; step = %d x %d tokens, %.1f GFLOP\n",
         m.n_floats / 1e6, L, B, T, flops / 1e9);
  for (int s = 0; s <= steps; s++) {  // step 0 warms up (page faults)
    ct_lm_stats st = {0};
    double t = ct_now();
    if (ct_lm_step(&m, &a, &h, &b, &gw, 1.0f / (B * T), 0, &st)) return 1;
    ct_adamw_step(&m, m.params, g, m1, m2, s + 1, 1e-4, 1.0f, &adam);
    t = ct_now() - t;
    if (s > 0 && t < best) best = t;
    if (s > 0)
      printf("  step %d: %.3f s, loss %.3f, %.0f tokens/s, %.1f GFLOP/s\n", s, t,
             st.loss / st.targets, B * T / t, flops / t / 1e9);
  }
  printf("train: %.0f tokens/s, %.1f GFLOP/s = %.1f%% of sgemm (best of %d steps)\n",
         B * T / best, flops / best / 1e9, 100 * flops / best / 1e9 / peak, steps);
  return 0;
}
