// test_optim: the optimizer pieces ZeRO-1 and DiLoCo are built from. AdamW over shards of
// the flat buffer (cut through tensors of both weight-decay kinds) is bit for bit the
// whole-buffer step, its bf16 copy included; the outer Nesterov step gives hand-computed
// values; and the outer step with lr 1 and momentum 0 returns the local weights.
#include <string.h>

#include "bf16.h"
#include "fill.h"
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

int main(void) {
  if (ct_pool_init(2)) return 1;
  RUN(test_adamw_on_shards_equals_the_whole_step_bit_for_bit);
  RUN(test_nesterov_outer_step_matches_hand_computed_values);
  RUN(test_outer_step_with_lr_1_and_no_momentum_returns_the_local_weights);
  ct_pool_free();
  return test_summary();
}
