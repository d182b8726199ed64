// test_optim: the optimizer pieces ZeRO-1 and DiLoCo are built from. AdamW over shards of
// the flat buffer (cut through tensors of both weight-decay kinds) is bit for bit the
// whole-buffer step, its bf16 copy included; the outer Nesterov step gives hand-computed
// values; and the outer step with lr 1 and momentum 0 returns the local weights. Muon: two
// steps against a float64 reference computed here (Nesterov momentum, Newton–Schulz, the
// transposed wide/tall cases, Moonlight's scale, weight decay), the tensors it leaves to
// AdamW bit for bit ct_adamw_step's.
#include <math.h>
#include <string.h>

#include "bf16.h"
#include "fill.h"
#include "muon.h"
#include "optim.h"
#include "pool.h"
#include "test.h"
#include "tiny_model.h"

// Three AdamW steps on shards [0, a), [a, b), [b, n) (a, b inside tensors, one with decay
// and one without) against ct_adamw_step on the whole buffer.
static void test_adamw_on_shards_equals_the_whole_step_bit_for_bit(void) {
  ct_model whole, shard;
  tiny_model(&whole, "qwen2");
  tiny_model(&shard, "qwen2");
  CHECK_OK(ct_model_bf16_compute(&whole));
  CHECK_OK(ct_model_bf16_compute(&shard));
  ct_layout L = ct_model_tensors(&whole);
  long n = L.n_floats, cut[4] = {0, 0, 0, n};
  for (int t = 0, k = 1; t < L.n_tensors && k < 3; t++)  // a decayed matrix, then a norm
    if ((k == 1 && L.tensors[t].decay && L.tensors[t].numel > 3) ||
        (k == 2 && !L.tensors[t].decay && L.tensors[t].offset > cut[1]))
      cut[k++] = L.tensors[t].offset + L.tensors[t].numel / 2 + 1;
  CHECK(0 < cut[1] && cut[1] < cut[2] && cut[2] < n);
  float *g = falloc(n), *gs = falloc(n), *m1 = falloc(n), *v1 = falloc(n), *m1s = falloc(n), *v1s = falloc(n);
  ct_adamw h = {0.9, 0.999, 1e-8, 0.1};
  ct_rng r;
  ct_rng_seed(&r, 11);
  for (long step = 1; step <= 3; step++) {
    for (int t = 0; t < L.n_tensors; t++)  // (the alignment gaps between tensors stay zero)
      for (long i = L.tensors[t].offset; i < L.tensors[t].offset + L.tensors[t].numel; i++)
        g[i] = gs[i] = (float)ct_rng_normal(&r);
    ct_adamw_step(&L, whole.params, whole.compute16, g, m1, v1, step, 1e-2, 0.5f, &h);
    for (int s = 0; s < 3; s++) {  // each shard's buffers start at its own element 0
      long lo = cut[s], hi = cut[s + 1];
      float *sg = falloc(hi - lo), *sm = falloc(hi - lo), *sv = falloc(hi - lo);
      memcpy(sg, gs + lo, 4 * (hi - lo));
      memcpy(sm, m1s + lo, 4 * (hi - lo));
      memcpy(sv, v1s + lo, 4 * (hi - lo));
      ct_adamw_step_range(&L, lo, hi, shard.params, shard.compute16, sg, sm, sv, step, 1e-2, 0.5f, &h);
      memcpy(m1s + lo, sm, 4 * (hi - lo));
      memcpy(v1s + lo, sv, 4 * (hi - lo));
      for (long i = 0; i < hi - lo; i++) CHECK(sg[i] == 0);  // the shard's gradient zeroed
      free(sg), free(sm), free(sv);
    }
  }
  CHECK(!memcmp(whole.params, shard.params, 4 * n));
  CHECK(!memcmp(m1, m1s, 4 * n) && !memcmp(v1, v1s, 4 * n));
  CHECK(!memcmp(whole.compute16, shard.compute16, 2 * n));
  free(g), free(gs), free(m1), free(v1), free(m1s), free(v1s);
  ct_model_free(&whole);
  ct_model_free(&shard);
}

// lr 0.5, μ 0.9: mom = 0.9 mom + d; start -= 0.5 (d + 0.9 mom), by hand for two steps.
static void test_nesterov_outer_step_matches_hand_computed_values(void) {
  float start[2] = {1.0f, -2.0f}, mom[2] = {0, 0}, params[2] = {9, 9};
  const float d1[2] = {0.5f, -1.0f}, d2[2] = {0.25f, 0.5f};
  ct_nesterov_outer_step(start, mom, params, d1, 2, 0.5, 0.9);
  // mom = (0.5, -1); start = 1 - 0.5 (0.5 + 0.45) = 0.525, -2 - 0.5 (-1 - 0.9) = -1.05
  CHECK_NEAR(mom[0], 0.5, 1e-7);
  CHECK_NEAR(mom[1], -1.0, 1e-7);
  CHECK_NEAR(start[0], 0.525, 1e-6);
  CHECK_NEAR(start[1], -1.05, 1e-6);
  CHECK(params[0] == start[0] && params[1] == start[1]);
  ct_nesterov_outer_step(start, mom, params, d2, 2, 0.5, 0.9);
  // mom = (0.45 + 0.25, -0.9 + 0.5) = (0.7, -0.4); start -= 0.5 (0.25 + 0.63, 0.5 - 0.36)
  CHECK_NEAR(mom[0], 0.7, 1e-6);
  CHECK_NEAR(mom[1], -0.4, 1e-6);
  CHECK_NEAR(start[0], 0.525 - 0.44, 1e-6);
  CHECK_NEAR(start[1], -1.05 - 0.07, 1e-6);
}

// lr 1, μ 0: θ_start − (θ_start − θ) = θ to rounding: DiLoCo with H = 1 is the local step.
static void test_outer_step_with_lr_1_and_no_momentum_returns_the_local_weights(void) {
  enum { N = 1000 };
  float *start = falloc(N), *mom = falloc(N), *local = falloc(N), *d = falloc(N);
  ct_rng r;
  ct_rng_seed(&r, 5);
  for (int i = 0; i < N; i++) {
    start[i] = (float)ct_rng_normal(&r);
    local[i] = start[i] + 1e-3f * (float)ct_rng_normal(&r);
    d[i] = start[i] - local[i];
  }
  ct_nesterov_outer_step(start, mom, NULL, d, N, 1.0, 0.0);
  for (int i = 0; i < N; i++) CHECK_NEAR(start[i], local[i], 1e-7 * (1 + fabsf(local[i])));
  free(start), free(mom), free(local), free(d);
}

// ---- Muon ----

// The float64 reference of one Muon matrix step (m, n): buf = μ buf + g; u = g + μ buf;
// X = u / (‖u‖ + 1e-7) (transposed when m > n); 5 × X = aX + (bA + cA²)X with A = XXᵀ;
// p = p (1 − lr wd) − lr 0.2 sqrt(max(m, n)) X.
static void muon_reference(double *p, double *buf, const double *g, long m, long n, double lr, double wd,
                           double mu) {
  long len = m * n;
  int tr = m > n;
  long k = tr ? n : m, K = tr ? m : n;
  double *u = calloc(len, sizeof *u), *X = calloc(len, sizeof *X), *Y = calloc(len, sizeof *Y);
  double *A = calloc(k * k, sizeof *A), *B = calloc(k * k, sizeof *B), sq = 0;
  for (long i = 0; i < len; i++) {
    buf[i] = mu * buf[i] + g[i];
    u[i] = g[i] + mu * buf[i];
    sq += u[i] * u[i];
  }
  for (long r = 0; r < m; r++)
    for (long c = 0; c < n; c++) X[tr ? c * m + r : r * n + c] = u[r * n + c] / (sqrt(sq) + 1e-7);
  for (int it = 0; it < 5; it++) {
    for (long i = 0; i < k; i++)
      for (long j = 0; j < k; j++) {
        double s = 0;
        for (long l = 0; l < K; l++) s += X[i * K + l] * X[j * K + l];
        A[i * k + j] = s;
      }
    for (long i = 0; i < k; i++)
      for (long j = 0; j < k; j++) {
        double s = 0;
        for (long l = 0; l < k; l++) s += A[i * k + l] * A[l * k + j];
        B[i * k + j] = -4.7750 * A[i * k + j] + 2.0315 * s;
      }
    for (long i = 0; i < k; i++)
      for (long j = 0; j < K; j++) {
        double s = 0;
        for (long l = 0; l < k; l++) s += B[i * k + l] * X[l * K + j];
        Y[i * K + j] = 3.4445 * X[i * K + j] + s;
      }
    memcpy(X, Y, sizeof *X * len);
  }
  double scale = lr * 0.2 * sqrt((double)K);
  for (long r = 0; r < m; r++)
    for (long c = 0; c < n; c++)
      p[r * n + c] = p[r * n + c] * (1 - lr * wd) - scale * X[tr ? c * m + r : r * n + c];
  free(u), free(X), free(Y), free(A), free(B);
}

// Muon takes exactly the decoder layers' 2-D matrices: 7 per layer (q, k, v, o, gate, up,
// down), never the embeddings, the LM head, norms or biases.
static void test_muon_takes_the_decoder_matrices_only(void) {
  ct_model m;
  tiny_model(&m, "qwen3");  // q/k norms: 1-D tensors inside the layers
  ct_layout L = ct_model_tensors(&m);
  CHECK(ct_muon_count(&L) == 7 * m.cfg.num_layers);
  for (int t = 0; t < L.n_tensors; t++) {
    const ct_tensor_info *ti = &L.tensors[t];
    bool want = strstr(ti->name, "_proj.weight") && strncmp(ti->name, "model.layers.", 13) == 0;
    CHECK(ct_muon_takes(ti) == want);
  }
  CHECK(!ct_muon_takes(ct_model_find_tensor(&m, "model.embed_tokens.weight")));
  ct_model_free(&m);
  tiny_model(&m, "qwen2");  // biases inside the layers, an untied head
  L = ct_model_tensors(&m);
  CHECK(ct_muon_count(&L) == 7 * m.cfg.num_layers);
  CHECK(!ct_muon_takes(ct_model_find_tensor(&m, "lm_head.weight")));
  CHECK(!ct_muon_takes(ct_model_find_tensor(&m, "model.layers.0.self_attn.q_proj.bias")));
  ct_model_free(&m);
  // multi-token prediction: each depth's block matrices and its eh_proj are hidden matrices
  ct_model_config c = tiny_config("qwen3");
  c.mtp_layers = 2;
  if (ct_model_init(&m, &c, 64)) exit(1);
  L = ct_model_tensors(&m);
  CHECK(ct_muon_count(&L) == 7 * c.num_layers + 8 * c.mtp_layers);
  CHECK(ct_muon_takes(ct_model_find_tensor(&m, "mtp.layers.1.eh_proj.weight")));
  CHECK(ct_muon_takes(ct_model_find_tensor(&m, "mtp.layers.0.mlp.down_proj.weight")));
  CHECK(!ct_muon_takes(ct_model_find_tensor(&m, "mtp.layers.0.enorm.weight")));
  ct_model_free(&m);
}

// Two Muon steps (grad_scale 0.5, weight decay 0.1, μ 0.9) on every matrix of a qwen2 tiny
// model (wide ones, k_proj (16, 24), and tall ones, up_proj (40, 24): the transposed case)
// against muon_reference in double, checked after each step: the second step's update
// depends on the first's momentum (Nesterov). The other tensors (embeddings, head, norms,
// biases) get ct_adamw_step's arithmetic bit for bit, and the matrices' second moment stays 0.
static void test_muon_two_steps_match_a_float64_reference(void) {
  ct_model mu, ad;
  tiny_model(&mu, "qwen2");
  tiny_model(&ad, "qwen2");
  CHECK_OK(ct_model_bf16_compute(&mu));
  ct_layout L = ct_model_tensors(&mu);
  long n = L.n_floats;
  float *g = falloc(n), *ga = falloc(n), *m1 = falloc(n), *v1 = falloc(n), *m1a = falloc(n), *v1a = falloc(n);
  float *work = falloc(ct_muon_work_floats(&L));
  double *p = calloc(n, sizeof *p), *buf = calloc(n, sizeof *buf), *gd = calloc(n, sizeof *gd);
  for (long i = 0; i < n; i++) p[i] = mu.params[i];
  ct_adamw h = {0.9, 0.999, 1e-8, 0.1};
  const double lr = 2e-2, momentum = 0.9;
  const float scale = 0.5f;
  ct_rng r;
  ct_rng_seed(&r, 21);
  for (long step = 1; step <= 2; step++) {
    for (int t = 0; t < L.n_tensors; t++)
      for (long i = L.tensors[t].offset; i < L.tensors[t].offset + L.tensors[t].numel; i++) {
        g[i] = ga[i] = (float)ct_rng_normal(&r);
        gd[i] = (double)(g[i] * scale);
      }
    ct_muon_step(&L, mu.params, mu.compute16, g, m1, v1, work, step, lr, scale, &h, momentum);
    ct_adamw_step(&L, ad.params, NULL, ga, m1a, v1a, step, lr, scale, &h);
    for (int t = 0; t < L.n_tensors; t++) {
      const ct_tensor_info *ti = &L.tensors[t];
      long o = ti->offset, len = ti->numel;
      if (!ct_muon_takes(ti)) {  // AdamW's, bit for bit
        CHECK(!memcmp(mu.params + o, ad.params + o, 4 * len));
        CHECK(!memcmp(m1 + o, m1a + o, 4 * len) && !memcmp(v1 + o, v1a + o, 4 * len));
        continue;
      }
      double *before = malloc(sizeof *before * len);
      memcpy(before, p + o, sizeof *before * len);
      muon_reference(p + o, buf + o, gd + o, ti->shape[0], ti->shape[1], lr, h.weight_decay, momentum);
      double most = 0, err = 0;
      for (long i = 0; i < len; i++) {
        double d = p[o + i] - before[i];  // the reference's change
        most = fmax(most, fabs(d));
        err = fmax(err, fabs((double)mu.params[o + i] - p[o + i]));
        CHECK_NEAR(m1[o + i], buf[o + i], 1e-6 * (1 + fabs(buf[o + i])));
        CHECK(v1[o + i] == 0);
      }
      CHECK(most > 1e-3);  // a real update: lr 0.2 sqrt(K) / sqrt(k) per entry
      CHECK(err <= 1e-4 * most);
      for (long i = 0; i < len; i++) p[o + i] = mu.params[o + i];  // step 2 starts from the float weights
      free(before);
    }
    for (long i = 0; i < n; i++) CHECK(g[i] == 0);  // gradients zeroed
  }
  uint16_t *want16 = calloc(n, sizeof *want16);  // the bf16 copy follows the new weights
  ct_bf16_narrow(want16, mu.params, n);
  CHECK(!memcmp(want16, mu.compute16, 2 * n));
  free(want16), free(p), free(buf), free(gd), free(work);
  free(g), free(ga), free(m1), free(v1), free(m1a), free(v1a);
  ct_model_free(&mu);
  ct_model_free(&ad);
}

int main(void) {
  if (ct_pool_init(2)) return 1;
  RUN(test_adamw_on_shards_equals_the_whole_step_bit_for_bit);
  RUN(test_nesterov_outer_step_matches_hand_computed_values);
  RUN(test_outer_step_with_lr_1_and_no_momentum_returns_the_local_weights);
  RUN(test_muon_takes_the_decoder_matrices_only);
  RUN(test_muon_two_steps_match_a_float64_reference);
  ct_pool_free();
  return test_summary();
}
