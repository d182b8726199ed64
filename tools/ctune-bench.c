// ctune-bench: training throughput against this machine's own sgemm rate, measured in
// the same run.
//
//   ctune-bench [train] [layers=30] [batch=4] [seq=256] [steps=4] [threads=0] [tiling=1] [gemma=0|1|1b]
//               [qwen=0|0.5b] [lora=0] [clock=wall|cpu]
//   ctune-bench kd [rows=512] [hidden=1024] [vocab=151936] [tiling=8] [steps=3]
//   ctune-bench decode [qwen=0|0.5b] [layers=30] [slots=128] [steps=16]
//
// The model is SmolLM-135M-shaped (hidden 576, 30 layers, 9 heads, 3 kv heads,
// intermediate 1536, vocab 49152, tied embeddings), or with gemma=1 gemma-3-270m-shaped
// (layers=18 for the full model), or with gemma=1b gemma-3-1b-shaped (hidden 1152,
// intermediate 6912, 4/1 heads of 256; layers=26 for the full model), or with qwen=0.5b
// Qwen2.5-0.5B-shaped (hidden 896, intermediate 4864, 14/2 heads of 64, q/k/v biases,
// vocab 151936, tied; layers=24 for the full model), randomly initialized,
// fp32. One step is forward + LM head + backward + AdamW over batch x seq tokens. Achieved
// GFLOP/s counts 6 x (matmul parameters) + causal attention per token
// (ct_model_train_flops_per_token); the reference is a square sgemm on the same threads.
// lora=R trains LoRA adapters of rank R (alpha 2R) on every linear layer of a frozen base
// instead (gemma-3-1b's full fine-tune does not fit 24 GB): its backward computes no base
// weight gradient, so a step counts 4 x (matmul parameters) + the adapters' 6 x r x (in +
// out) per token + attention; AdamW updates the adapters only.
//
// `decode` times the inference engine's batched decode in bf16 (every slot one token a step,
// the LM head's logits for each), as GRPO's rollouts run it, against oneDNN's bf16 2048³
// rate read between its runs: GFLOP/s count 2 x (matmul parameters) per token.
//
// `kd` times the distillation soft loss (nn/kd.c: teacher and student logits in
// vocabulary chunks, JSD, gradient) against the plain cross-entropy head (common/loss.c)
// on the same rows, at Qwen3-0.6B's hidden size and vocabulary. Tiled, the soft loss does
// 8 row x V x C products (both models' logits in each of its 3 passes, 2 for the
// gradient) to the head's 4 (3 untiled: 4 to 3); the rest of its time is its
// element-wise passes.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "amx.h"
#include "args.h"
#include "bf16.h"
#include "data.h"
#include "dnnl.h"
#include "engine.h"
#include "kd.h"
#include "config.h"
#include "error.h"
#include "lm.h"
#include "log.h"
#include "lora.h"
#include "matmul.h"
#include "mem.h"
#include "optim.h"
#include "panel.h"
#include "pool.h"
#include "prof.h"
#include "rng.h"
#include "weights.h"

// clock=cpu times by this process's CPU time instead of the wall clock: with threads=1 on a
// shared machine, other processes' time slices then stay out of the figures (with more
// threads it would count the pool's spin-waits as work).
static bool cpu_clock;

static double bench_now(void) {
  if (!cpu_clock) return ct_now();
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// gemma=0: SmolLM-135M; 1 (or 270m): gemma-3-270m; 1b: gemma-3-1b (the 270m's layer kinds
// and heads, wider); qwen=0.5b: Qwen2.5-0.5B; anything else is an error
static int bench_config(int argc, char **argv, int L, ct_model_config *c) {
  const char *g = ct_args_str(argc, argv, "gemma", "0"), *q = ct_args_str(argc, argv, "qwen", "0");
  if (strcmp(q, "0") && strcmp(g, "0")) return fprintf(stderr, "ctune-bench: qwen= and gemma= exclude each other\n"), 1;
  if (!strcmp(q, "0.5b")) {  // Qwen2.5-0.5B: SmolLM's layer kinds with q/k/v biases, wider (layers=24 in full)
    *c = ct_model_config_smollm135m(L);
    snprintf(c->model_type, sizeof c->model_type, "qwen2");
    c->vocab_size = 151936, c->hidden_size = 896, c->intermediate_size = 4864;
    c->num_heads = 14, c->num_kv_heads = 2, c->qkv_bias = true;
    c->rope_theta = 1e6f, c->rms_norm_eps = 1e-6f;
  } else if (strcmp(q, "0")) {
    return fprintf(stderr, "ctune-bench: qwen=%s is not 0 or 0.5b\n", q), 1;
  } else if (!strcmp(g, "0")) *c = ct_model_config_smollm135m(L);
  else if (!strcmp(g, "1") || !strcmp(g, "270m")) *c = ct_model_config_gemma3_270m(L);
  else if (!strcmp(g, "1b")) {
    *c = ct_model_config_gemma3_270m(L);
    c->hidden_size = 1152, c->intermediate_size = 6912;
  } else {
    return fprintf(stderr, "ctune-bench: gemma=%s is not 0, 1 (270m) or 1b\n", g), 1;
  }
  return 0;
}

// Training FLOPs per token of LoRA rank r on every linear layer: the base's forward and
// input gradient (4 x its matmul parameters, ct_model_train_flops_per_token at T = 0 being
// 6 x), the attention's as in full training, and the adapters' forward + both gradients.
static double lora_flops_per_token(const ct_model_config *c, int T, int r) {
  double matmul6 = ct_model_train_flops_per_token(c, 0), attn = ct_model_train_flops_per_token(c, T) - matmul6;
  double ad = 0;
  for (int t = 0; t < CT_LORA_TARGETS; t++) {
    int in, out, row0;
    ct_lora_dims(c, t, &in, &out, &row0);
    ad += (double)r * (in + out);
  }
  return matmul6 / 6 * 4 + attn + 6 * ad * c->num_layers;
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
    double t = bench_now();
    ct_sgemm('N', 'T', n, n, n, 1, a, n, b, n, 0, c, n);
    t = bench_now() - t;
    double g = 2.0 * n * n * n / t / 1e9;
    if (g > best) best = g;
  }
  free(a);
  free(b);
  free(c);
  return best;
}

// Best of `reps` runs of op(A)·op(B), (M, N, K), in bf16 through oneDNN (bf16 set) or fp32
// sgemm, GFLOP/s. The shapes of the training step are timed one by one with this.
static double gemm_gflops(bool bf16, char ta, char tb, int M, int N, int K, int reps) {
  long na = (long)M * K, nb = (long)K * N;
  float *a = aligned_alloc(64, sizeof(float) * (na + 16)), *b = aligned_alloc(64, sizeof(float) * (nb + 16));
  float *c = aligned_alloc(64, sizeof(float) * ((long)M * N + 16));
  uint16_t *a16 = aligned_alloc(64, 2 * (na + 32)), *b16 = aligned_alloc(64, 2 * (nb + 32));
  for (long i = 0; i < na; i++) a[i] = (float)(i % 13) * 0.01f;
  for (long i = 0; i < nb; i++) b[i] = (float)(i % 7) * 0.01f;
  ct_bf16_narrow(a16, a, na);
  ct_bf16_narrow(b16, b, nb);
  int lda = ta == 'N' ? K : M, ldb = tb == 'N' ? N : K;
  double best = 0;
  for (int r = 0; r < reps; r++) {
    double t = bench_now();
    if (bf16) ct_gemm_bf16(ta, tb, M, N, K, a16, lda, b16, ldb, 0, c, N);
    else ct_sgemm(ta, tb, M, N, K, 1, a, lda, b, ldb, 0, c, N);
    t = bench_now() - t;
    double g = 2.0 * M * N * K / t / 1e9;
    if (g > best) best = g;
  }
  free(a), free(b), free(c), free(a16), free(b16);
  return best;
}

static float *random_floats(long n, uint64_t seed, float scale) {
  float *x = aligned_alloc(64, sizeof(float) * ((n + 15) / 16 * 16));
  ct_rng r;
  ct_rng_seed(&r, seed);
  for (long i = 0; x && i < n; i++) x[i] = scale * (2 * (float)ct_rng_uniform(&r) - 1);
  return x;
}

typedef struct {
  const float *h, *W;
  int C;
} kd_teacher;

static void kd_teacher_chunk(void *ctx, int n, int v0, int nv, float *out) {
  const kd_teacher *t = ctx;
  ct_sgemm('N', 'T', n, nv, t->C, 1, t->h, t->C, t->W + (long)v0 * t->C, t->C, 0, out, nv);
}

static int bench_kd(int argc, char **argv, double peak) {
  int n = (int)ct_args_long(argc, argv, "rows", 512), C = (int)ct_args_long(argc, argv, "hidden", 1024);
  int V = (int)ct_args_long(argc, argv, "vocab", 151936), tiling = (int)ct_args_long(argc, argv, "tiling", 8);
  int steps = (int)ct_args_long(argc, argv, "steps", 3);
  float *hs = random_floats((long)n * C, 1, 1.0f), *ht = random_floats((long)n * C, 2, 1.0f);
  float *W = random_floats((long)V * C, 3, 0.1f), *Wt = random_floats((long)V * C, 4, 0.1f);
  float *dW = random_floats((long)V * C, 5, 0.0f), *dh = random_floats((long)n * C, 6, 0.0f);
  int *target = malloc(sizeof(int) * n);
  ct_head h;
  ct_kd k;
  if (!hs || !ht || !W || !Wt || !dW || !dh || !target || ct_head_init(&h, n, n, V, C, tiling) ||
      ct_kd_init(&k, n, V, C, tiling)) {
    fprintf(stderr, "ctune-bench: %s\n", ct_last_error());
    return 1;
  }
  for (int i = 0; i < n; i++) target[i] = (int)((i * 2654435761u) % (unsigned)V);
  kd_teacher t = {ht, Wt, C};
  ct_kd_opts o = {2.0f, 0.5f, 1.0f / n, false};
  double best_ce = 1e30, best_kd = 1e30, mm = 2.0 * n * V * C;
  for (int s = 0; s <= steps; s++) {  // step 0 warms up
    double t0 = bench_now();
    ct_head_gather(&h, hs, target, n);
    ct_head_forward(&h, W);
    for (int i = 0; i < n; i++) h.coef[i] = 1.0f / n, h.zcoef[i] = 0;
    ct_head_backward(&h, W, dW, dh, n);
    double t1 = bench_now();
    ct_kd_soft(&k, hs, n, W, dW, target, kd_teacher_chunk, &t, &o);
    double t2 = bench_now();
    if (s > 0 && t1 - t0 < best_ce) best_ce = t1 - t0;
    if (s > 0 && t2 - t1 < best_kd) best_kd = t2 - t1;
  }
  int kd_mm = tiling > 1 ? 8 : 4;  // tiled: both models' logits in each of 3 passes + 2 for the gradient
  printf("kd: %d rows, hidden %d, vocab %d, %d chunks; best of %d\n", n, C, V, tiling, steps);
  printf("  cross-entropy head (fwd+bwd): %.3f s, %.1f GFLOP/s = %.1f%% of sgemm\n", best_ce,
         (tiling > 1 ? 4 : 3) * mm / best_ce / 1e9, 100 * (tiling > 1 ? 4 : 3) * mm / best_ce / 1e9 / peak);
  printf("  distillation soft loss (teacher chunks + JSD + grad): %.3f s, %.1f GFLOP/s = %.1f%% of sgemm\n",
         best_kd, kd_mm * mm / best_kd / 1e9, 100 * kd_mm * mm / best_kd / 1e9 / peak);
  printf("kd: soft loss / cross-entropy head time = %.2f (matmul work ratio %.2f)\n", best_kd / best_ce,
         kd_mm / (double)(tiling > 1 ? 4 : 3));
  free(hs), free(ht), free(W), free(Wt), free(dW), free(dh), free(target);
  ct_head_free(&h);
  ct_kd_free(&k);
  return 0;
}

// The products of one training step of a SmolLM-135M-shaped layer over n tokens, and the
// LM head's, each timed in fp32 (OpenBLAS) and bf16 (oneDNN).
static int bench_gemm(int argc, char **argv) {
  int n = (int)ct_args_long(argc, argv, "tokens", 1024);
  bool fp32 = ct_args_long(argc, argv, "fp32", 1), qwen = !strcmp(ct_args_str(argc, argv, "qwen", "0"), "0.5b");
  if (ct_dnnl_init()) return fprintf(stderr, "ctune-bench: %s\n", ct_last_error()), 1;
  typedef struct { const char *what; char ta, tb; int M, N, K; } shape;
  static const shape smol[] = {
      {"qkv   y = x Wt", 'N', 'T', 0, 960, 576},   {"o     y = x Wt", 'N', 'T', 0, 576, 576},
      {"gu    y = x Wt", 'N', 'T', 0, 3072, 576},  {"down  y = x Wt", 'N', 'T', 0, 576, 1536},
      {"head  y = x Wt", 'N', 'T', 0, 49152, 576}, {"qkv   dx = dy W", 'N', 'N', 0, 576, 960},
      {"gu    dx = dy W", 'N', 'N', 0, 576, 3072}, {"down  dx = dy W", 'N', 'N', 0, 1536, 576},
      {"qkv   dW = dyt x", 'T', 'N', 960, 576, 0}, {"gu    dW = dyt x", 'T', 'N', 3072, 576, 0},
      {"down  dW = dyt x", 'T', 'N', 576, 1536, 0}, {"head  dW = dyt x", 'T', 'N', 49152, 576, 0}};
  static const shape q05[] = {  // Qwen2.5-0.5B; LoRA trains no dW of the base
      {"qkv   y = x Wt", 'N', 'T', 0, 1152, 896},  {"o     y = x Wt", 'N', 'T', 0, 896, 896},
      {"gu    y = x Wt", 'N', 'T', 0, 9728, 896},  {"down  y = x Wt", 'N', 'T', 0, 896, 4864},
      {"qkv   dx = dy W", 'N', 'N', 0, 896, 1152}, {"o     dx = dy W", 'N', 'N', 0, 896, 896},
      {"gu    dx = dy W", 'N', 'N', 0, 896, 9728}, {"down  dx = dy W", 'N', 'N', 0, 4864, 896},
      {"head  y = x Wt", 'N', 'T', 0, 151936, 896}, {"head  dx = dy W", 'N', 'N', 0, 896, 151936},
      {"2048^3 (peak)", 'N', 'T', 2048, 2048, 2048}};
  const shape *s = qwen ? q05 : smol;
  size_t ns = qwen ? sizeof q05 / sizeof *q05 : sizeof smol / sizeof *smol;
  // a second of warm-up first: the table's first row (the qkv product) read 343-429 against
  // 800 GFLOP/s measured after the others (2 cores; a few runs of 2048^3 first did not help)
  for (double t0 = bench_now(); bench_now() - t0 < 1.0;) gemm_gflops(true, 'N', 'T', 1024, 1152, 896, 5);
  printf("%-18s %6s %6s %6s  %8s %8s  ratio\n", "product", "M", "N", "K", "fp32", "bf16");
  double fl = 0, secs = 0;
  for (size_t i = 0; i < ns; i++) {
    int M = s[i].M ? s[i].M : n, N = s[i].N, K = s[i].K ? s[i].K : n;
    double f = fp32 ? gemm_gflops(false, s[i].ta, s[i].tb, M, N, K, 5) : 0;
    double h = gemm_gflops(true, s[i].ta, s[i].tb, M, N, K, 5);
    fl += 2.0 * M * N * K, secs += 2.0 * M * N * K / (h * 1e9);
    printf("%-18s %6d %6d %6d  %8.1f %8.1f  %.2f\n", s[i].what, M, N, K, f, h, f > 0 ? h / f : 0);
  }
  printf("bf16, all products once: %.1f GFLOP/s\n", fl / secs / 1e9);
  return 0;
}

// `train`: steps of forward + LM head + backward + AdamW against peak (sgemm's, or with bf16=1
// oneDNN bf16's).
static int bench_train(int argc, char **argv, double peak) {
  int L = (int)ct_args_long(argc, argv, "layers", 30), B = (int)ct_args_long(argc, argv, "batch", 4);
  int T = (int)ct_args_long(argc, argv, "seq", 256), steps = (int)ct_args_long(argc, argv, "steps", 4);
  int tiling = (int)ct_args_long(argc, argv, "tiling", 1);
  ct_model_config c;
  if (bench_config(argc, argv, L, &c)) return 2;
  int rank = (int)ct_args_long(argc, argv, "lora", 0);
  ct_model m;
  ct_acts a;
  ct_head h;
  ct_batch b;
  if (ct_model_init(&m, &c, T) || ct_acts_init(&a, &m, B, T, CT_ACTS_KEEP) ||
      ct_head_init(&h, B * T, B * T, c.vocab_size, c.hidden_size, tiling) || ct_batch_init(&b, B, T)) {
    fprintf(stderr, "ctune-bench: %s\n", ct_last_error());
    return 1;
  }
  ct_model_init_random(&m, 1, 0.02f);
  if (ct_args_long(argc, argv, "bf16", 0)) {  // the projections in bf16; the peak is oneDNN's
    ct_acts_free(&a);  // again, with the bf16 inputs of the matmuls
    if (ct_dnnl_init() || ct_model_bf16_compute(&m) || ct_acts_init(&a, &m, B, T, CT_ACTS_KEEP))
      return fprintf(stderr, "ctune-bench: %s\n", ct_last_error()), 1;
    peak = gemm_gflops(true, 'N', 'T', 2048, 2048, 2048, 10);
    printf("oneDNN bf16 2048x2048x2048: %.1f GFLOP/s (the peak below)\n", peak);
  }
  // what AdamW trains: the model, or (lora=R) the adapters over the frozen model
  ct_lora lo = {0};
  ct_lora_config lc = {.r = rank, .alpha = 2.0 * rank, .targets = (1u << CT_LORA_TARGETS) - 1};
  if (rank > 0 && (ct_lora_init(&lo, &lc, &c) || ct_acts_attach_lora(&a, &lo)))
    return fprintf(stderr, "ctune-bench: %s\n", ct_last_error()), 1;
  if (rank > 0) ct_lora_init_weights(&lo, &m, 1);
  ct_layout trained = rank > 0 ? ct_lora_tensors(&lo) : ct_model_tensors(&m);
  float *tparams = rank > 0 ? lo.params : m.params;
  uint16_t *tparams16 = rank > 0 ? NULL : m.compute16;
  size_t bytes = sizeof(float) * trained.n_floats;
  // as the trainers hold them (common/train.c): ct_big_alloc, zeroed, on huge pages. On 4 KB
  // pages from malloc, AdamW's pass over the four arrays ran several times slower.
  float *g = ct_big_alloc(bytes), *m1 = ct_big_alloc(bytes), *m2 = ct_big_alloc(bytes);
  if (!g || !m1 || !m2) return fprintf(stderr, "ctune-bench: cannot allocate 3 x %.1f MB\n", bytes / 1e6), 1;
  ct_weights gw = {0};
  if (rank > 0) {  // every base weight frozen: no gradient views
    gw.layers = calloc(c.num_layers, sizeof *gw.layers);
    if (!gw.layers) return fprintf(stderr, "ctune-bench: out of memory\n"), 1;
    ct_lora_bind_grads(&lo, g);
  } else {
    ct_weights_bind(&gw, &m, g);
  }
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
  double flops = (rank > 0 ? lora_flops_per_token(&c, T, rank) : ct_model_train_flops_per_token(&c, T)) * B * T;
  double best = 1e30;
  printf("model: %.1fM parameters, %d layers; step = %d x %d tokens, %.1f GFLOP\n",
         m.n_floats / 1e6, L, B, T, flops / 1e9);
  if (rank > 0) printf("LoRA r %d, alpha %d, all linear layers: %.2fM trained parameters, the base frozen\n", rank, 2 * rank,
                    lo.n_floats / 1e6);
  for (int s = 0; s <= steps; s++) {  // step 0 warms up (page faults)
    ct_lm_stats st = {0};
    double t = bench_now();
    if (ct_lm_step(&m, &a, &h, &b, &gw, 1.0f / (B * T), 0, &st)) return 1;
    ct_adamw_step(&trained, tparams, tparams16, g, m1, m2, s + 1, 1e-4, 1.0f, &adam);
    t = bench_now() - t;
    if (s > 0 && t < best) best = t;
    if (s > 0)
      printf("  step %d: %.3f s, loss %.3f, %.0f tokens/s, %.1f GFLOP/s\n", s, t,
             st.loss / st.targets, B * T / t, flops / t / 1e9);
  }
  ct_prof_report(stdout);  // (CT_PROFILE=1: every step's, warm-up included)
  printf("train: %.0f tokens/s, %.1f GFLOP/s = %.1f%% of the peak (best of %d steps)\n",
         B * T / best, flops / best / 1e9, 100 * flops / best / 1e9 / peak, steps);
  return 0;
}

// Decode steps 0..steps-1 of S slots from position `prompt` (after each slot's prompt);
// returns tokens/s, or -1 on an error.
static double decode_run(ct_engine *e, const ct_model_config *c, int S, int steps, int prompt, int *ids, int *slot,
                         int *pos, int *outs, float *logits) {
  int pids[16], ps[16], pp[16], last = prompt - 1;
  for (int s = 0; s < S; s++) {  // every run from position `prompt` again
    for (int i = 0; i < prompt; i++) pids[i] = (i * 31 + s * 7) % c->vocab_size, ps[i] = s, pp[i] = i;
    if (ct_engine_forward(e, prompt, pids, ps, pp, &last, 1, logits)) return -1;
  }
  double t = bench_now();
  for (int k = 0; k < steps; k++) {
    for (int s = 0; s < S; s++) ids[s] = (k * 13 + s) % c->vocab_size, slot[s] = s, pos[s] = prompt + k, outs[s] = s;
    if (ct_engine_forward(e, S, ids, slot, pos, outs, S, logits)) return -1;
  }
  return (double)S * steps / (bench_now() - t);
}

// `decode`: tokens/s of `slots` slots decoding together for `steps` steps after a 16-token
// prompt each, bf16 panels (AMX tiles where present), best of 3 runs; each run is followed
// by one oneDNN bf16 2048³ reading, the best of which is the yardstick. lora=R: adapters of
// rank R on every linear layer (B random), each run timed twice, alternated: the adapters
// folded into the panels' products (pinned, as a generation runs them) and not (their own
// passes: unpinned).
static int bench_decode(int argc, char **argv) {
  int L = (int)ct_args_long(argc, argv, "layers", 30), S = (int)ct_args_long(argc, argv, "slots", 128);
  int steps = (int)ct_args_long(argc, argv, "steps", 16), prompt = 16, rank = (int)ct_args_long(argc, argv, "lora", 0);
  ct_model_config c;
  if (S < 1 || steps < 1) return fprintf(stderr, "ctune-bench: decode needs slots >= 1 and steps >= 1\n"), 2;
  if (bench_config(argc, argv, L, &c)) return 2;
  if (ct_dnnl_init()) return fprintf(stderr, "ctune-bench: %s\n", ct_last_error()), 1;
  ct_model m;
  ct_infer_weights w;
  ct_engine *e;
  ct_engine_opts o = {S, prompt + steps, S > prompt ? S : prompt, true};  // (bf16 weights, as GRPO's rollouts)
  if (ct_model_init(&m, &c, 1) || ct_model_rope_reserve(&m, prompt + steps)) return 1;
  ct_model_init_random(&m, 1, 0.02f);
  ct_lora lo = {0};
  ct_lora_config lc = {.r = rank, .alpha = 2.0 * rank, .targets = (1u << CT_LORA_TARGETS) - 1};
  if (rank > 0 && ct_lora_init(&lo, &lc, &c)) return fprintf(stderr, "ctune-bench: %s\n", ct_last_error()), 1;
  if (rank > 0) {  // B random (PEFT's zeros would make the adapters no-ops)
    ct_lora_init_weights(&lo, &m, 1);
    ct_rng g;
    ct_rng_seed(&g, 2);
    for (int i = 0; i < lo.n_tensors; i++)
      if (strstr(lo.tensors[i].name, "lora_B"))
        for (long k = 0; k < lo.tensors[i].numel; k++) lo.params[lo.tensors[i].offset + k] = 0.01f * ct_rng_normal(&g);
  }
  if (ct_infer_from_model(&w, &m) || (rank > 0 && ct_infer_attach_lora(&w, &lo)) || ct_infer_pack(&w, CT_PACK_BF16) ||
      ct_engine_init(&e, &w, &o))
    return fprintf(stderr, "ctune-bench: %s\n", ct_last_error()), 1;
  int *ids = malloc(sizeof(int) * S), *slot = malloc(sizeof(int) * S), *pos = malloc(sizeof(int) * S);
  int *outs = malloc(sizeof(int) * S);
  float *logits = malloc(sizeof(float) * S * c.vocab_size);
  if (!ids || !slot || !pos || !outs || !logits) return fprintf(stderr, "ctune-bench: out of memory\n"), 1;
  double best = 0, unfolded = 0, peak = 0, flops = ct_model_train_flops_per_token(&c, 0) / 3;  // 2 x matmul parameters
  for (int r = 0; r < 3; r++) {
    if (rank > 0) {  // the adapters' own passes first, then folded
      double u = decode_run(e, &c, S, steps, prompt, ids, slot, pos, outs, logits);
      if (u < 0) return fprintf(stderr, "ctune-bench: %s\n", ct_last_error()), 1;
      unfolded = u > unfolded ? u : unfolded;
      ct_engine_lora_pin(e);
    }
    double t = decode_run(e, &c, S, steps, prompt, ids, slot, pos, outs, logits);
    if (t < 0) return fprintf(stderr, "ctune-bench: %s\n", ct_last_error()), 1;
    if (rank > 0) ct_engine_lora_unpin(e);
    best = t > best ? t : best;
    double g = gemm_gflops(true, 'N', 'T', 2048, 2048, 2048, 3);
    peak = g > peak ? g : peak;
  }
  ct_prof_report(stdout);  // (CT_PROFILE=1: both kinds' runs)
  if (rank > 0)
    printf("decode with LoRA r %d on every linear layer: folded into the panels' products (pinned) %.0f tokens/s, "
           "in passes of their own (unpinned) %.0f tokens/s: %.3fx (each the best of 3, alternated)\n", rank, best,
           unfolded, best / unfolded);
  printf("decode: %d slots x %d steps, bf16 on %s: %.0f tokens/s = %.0f GFLOP/s = %.0f%% of oneDNN bf16 2048^3 "
         "(%.0f GFLOP/s; each the best of 3, alternated)\n", S, steps,
         ct_amx_ready() ? "AMX tiles" : ct_panel16_native() ? "AVX512_BF16 panels" : "the panels' C emulation", best,
         best * flops / 1e9, 100 * best * flops / 1e9 / peak, peak);
  free(ids), free(slot), free(pos), free(outs), free(logits);
  ct_engine_free(e);
  ct_infer_free(&w);
  if (rank > 0) ct_lora_free(&lo);
  ct_model_free(&m);
  return 0;
}

static int usage(FILE *f) {
  fputs("usage: ctune-bench [train] [bf16=0|1] [layers=30] [batch=4] [seq=256] [steps=4] [threads=0] [tiling=1]\n"
        "                   [gemma=0|1|1b] [qwen=0|0.5b] [lora=0] [clock=wall|cpu]\n"
        "       ctune-bench kd [rows=512] [hidden=1024] [vocab=151936] [tiling=8] [steps=3]\n"
        "       ctune-bench peak [threads=0]\n"
        "       ctune-bench decode [qwen=0|0.5b] [layers=30] [slots=128] [steps=16] [lora=0]\n"
        "       ctune-bench gemm [tokens=1024] [qwen=0|0.5b] [fp32=1]\n"
        "  train: training throughput of a SmolLM-135M-shaped model against this machine's sgemm\n"
        "  kd:    the distillation soft loss against the plain cross-entropy head\n"
        "  peak:  this machine's sgemm and oneDNN bf16 rates at 2048^3 (what compute limits are taken against)\n"
        "  decode: the engine's batched bf16 decode against the oneDNN bf16 rate\n", f);
  return 0;
}

int main(int argc, char **argv) {
  if (ct_config_help_asked(argc, argv)) return usage(stdout);
  ct_blas_init(argc, argv);
  int threads = (int)ct_args_long(argc, argv, "threads", 0);
  const char *clk = ct_args_str(argc, argv, "clock", "wall");
  if (strcmp(clk, "wall") && strcmp(clk, "cpu"))
    return fprintf(stderr, "ctune-bench: clock=%s is not wall or cpu\n", clk), 2;
  cpu_clock = !strcmp(clk, "cpu");
  if (ct_pool_init(threads)) return 1;
  printf("machine: %d threads, OpenBLAS core %s\n", ct_pool_threads(), ct_blas_corename());
  double peak = sgemm_gflops(2048, 10);
  printf("sgemm 2048x2048x2048: %.1f GFLOP/s\n", peak);
  if (argc > 1 && !strcmp(argv[1], "kd")) return bench_kd(argc, argv, peak);
  if (argc > 1 && !strcmp(argv[1], "peak")) {  // the bf16 rate needs AVX512_BF16 or AMX
    if (ct_dnnl_init()) return fprintf(stderr, "ctune-bench: %s\n", ct_last_error()), 1;
    printf("oneDNN bf16 2048x2048x2048: %.1f GFLOP/s\n", gemm_gflops(true, 'N', 'T', 2048, 2048, 2048, 10));
    return 0;
  }
  if (argc > 1 && !strcmp(argv[1], "decode")) return bench_decode(argc, argv);
  if (argc > 1 && !strcmp(argv[1], "gemm")) return bench_gemm(argc, argv);
  return bench_train(argc, argv, peak);
}
