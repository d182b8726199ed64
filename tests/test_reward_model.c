// The reward model's arithmetic (reward/loss, reward/score): the pair loss, its
// derivatives and metric sums against hand values, and the gradient of the pair loss
// through the score head (at each row's last real token) and the whole backbone against
// central differences of the float64 reference model.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "matmul.h"
#include "model.h"
#include "pool.h"
#include "rng.h"
#include "reward/loss.h"
#include "reward/score.h"
#include "test.h"
#include "ref_model.h"

// r_c 2, r_r 0.5, margin 0.5: z = 1, ℓ = log(1 + e^−1), dℓ/dr_c = −σ(−1) = −0.268941...
static void test_pair_loss_matches_hand_values(void) {
  double dc, dr, s = 1 / (1 + exp(1.0));
  CHECK_NEAR(ct_rm_pair_loss(2, 0.5, 0.5, 0, &dc, &dr), log1p(exp(-1.0)), 1e-15);
  CHECK_NEAR(dc, -s, 1e-15);
  CHECK_NEAR(dr, s, 1e-15);
  // center_rewards_coefficient 0.1: + 0.1·(2.5)² = 0.625; both derivatives + 2·0.1·2.5
  CHECK_NEAR(ct_rm_pair_loss(2, 0.5, 0.5, 0.1, &dc, &dr), log1p(exp(-1.0)) + 0.625, 1e-15);
  CHECK_NEAR(dc, -s + 0.5, 1e-15);
  CHECK_NEAR(dr, s + 0.5, 1e-15);
  // far on either side: finite, ≈ −z below and ≈ 0 above
  CHECK_NEAR(ct_rm_pair_loss(-400, 400, 0, 0, &dc, &dr), 800, 1e-9);
  CHECK_NEAR(dc, -1, 1e-15);
  CHECK_NEAR(ct_rm_pair_loss(400, -400, 0, 0, &dc, &dr), 0, 1e-15);
}

// pairs (2, 0.5) and (−1, 3): accuracy 1/2, margin (1.5 − 4)/2, rewards −1 … 3, mean 4.5/4
static void test_metric_sums(void) {
  ct_rm_sums s = {0};
  ct_rm_range e = {-INFINITY, -INFINITY};
  ct_rm_add_pair(&s, &e, 2, 0.5, 0.25);
  ct_rm_add_pair(&s, &e, -1, 3, 4.0);
  CHECK(s.pairs == 2 && s.correct == 1);
  CHECK_NEAR(s.loss, 4.25, 0);
  CHECK_NEAR(s.margin, -2.5, 0);
  CHECK_NEAR(s.reward, 4.5, 0);
  CHECK(e.max == 3 && e.neg_min == 1);
}

// ---------------------------------------------------------------------------
// The gradient through the score head and the backbone.

enum { B = 2, T = 7 };
static const int last[B] = {4, 6};  // row 0: 5 real tokens then 2 padding; row 1: 7
static const double margin = 0.3, center = 0.05;

// The float64 reference: ℓ(score·norm(x) at row 0's last token, the same at row 1's).
static double ref_pair_loss(const ref_t *r, const double *w, const int *ids, const int *pos, const int *seg) {
  const ct_model_config *c = &r->m->cfg;
  int C = c->hidden_size;
  double *x = calloc((size_t)B * T * C, 8), *xn = calloc(C, 8), rew[B], dc, dr;
  ref_layers(r, B, T, ids, pos, seg, x);
  for (int b = 0; b < B; b++) {
    rmsnorm(xn, x + ((long)b * T + last[b]) * C, W(r, "model.norm.weight", 0), C, c->rms_norm_eps);
    rew[b] = 0;
    for (int i = 0; i < C; i++) rew[b] += w[i] * xn[i];
  }
  free(x);
  free(xn);
  return ct_rm_pair_loss(rew[0], rew[1], margin, center, &dc, &dr);
}

// Central difference of the reference loss in the parameter *p against the analytic
// gradient `got`: the worst error so far in *worst, a count of misses in *bad.
static void fd_check(const ref_t *ref, const double *w, const int *ids, const int *pos, const int *seg, double *p,
                     float got, double *worst, int *bad) {
  double keep = *p, e = 1e-5;
  *p = keep + e;
  double lp = ref_pair_loss(ref, w, ids, pos, seg);
  *p = keep - e;
  double lm = ref_pair_loss(ref, w, ids, pos, seg);
  *p = keep;
  double fd = (lp - lm) / (2 * e), err = fabs(got - fd);
  *worst = fmax(*worst, err);
  *bad += err > 1e-5 + 1e-3 * fabs(fd);
}

static void test_score_head_and_backbone_gradients_match_reference(void) {
  ct_model_config cfg = {.model_type = "qwen2", .vocab_size = 17, .hidden_size = 12, .intermediate_size = 20,
                         .num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 4,
                         .max_position_embeddings = 16, .rope_theta = 10000, .rms_norm_eps = 1e-6f,
                         .tie_word_embeddings = true, .qkv_bias = true, .bos_token_id = -1, .eos_token_id = -1,
                         .pad_token_id = -1};
  int C = cfg.hidden_size, N = B * T;
  ct_model m;
  CHECK_OK(ct_model_init(&m, &cfg, 16));
  ct_model_init_random(&m, 3, 0.3f);
  ct_rng r;
  ct_rng_seed(&r, 5);
  float w[12], dw[12] = {0};
  for (int i = 0; i < C; i++) w[i] = (float)(0.5 * ct_rng_normal(&r));
  ct_acts a;
  CHECK_OK(ct_acts_init(&a, &m, B, T, CT_ACTS_KEEP));
  for (int n = 0; n < N; n++) {
    a.ids[n] = (int)ct_rng_below(&r, cfg.vocab_size);
    a.pos[n] = n % T;
    a.seg[n] = 0;
  }
  float *grads = aligned_alloc(64, sizeof(float) * m.n_floats);
  memset(grads, 0, sizeof(float) * m.n_floats);
  ct_weights g;
  CHECK_OK(ct_weights_bind(&g, &m, grads));
  // ours: float32 forward, score, pair loss, score backward, backbone backward
  ct_forward(&m, &a, B, T);
  double rew[B], d[B];
  ct_score_forward(a.lnf, last, B, T, C, w, rew);
  double loss = ct_rm_pair_loss(rew[0], rew[1], margin, center, &d[0], &d[1]);
  memset(a.dln, 0, sizeof(float) * N * C);
  ct_score_backward(a.lnf, last, B, T, C, w, d, a.dln, dw);
  ct_backward(&m, &g, &a, a.dln, B, T);

  double *P = calloc(m.n_floats, sizeof(double)), wd[12];
  for (long i = 0; i < m.n_floats; i++) P[i] = m.params[i];
  for (int i = 0; i < C; i++) wd[i] = w[i];
  ref_t ref = {&m, P};
  double want = ref_pair_loss(&ref, wd, a.ids, a.pos, a.seg);
  CHECK_NEAR(loss, want, 2e-5 * fabs(want) + 1e-6);
  int bad = 0, checked = 0;
  double worst = 0;
  for (int i = 0; i < C; i++) fd_check(&ref, wd, a.ids, a.pos, a.seg, &wd[i], dw[i], &worst, &bad), checked++;
  for (long i = 0; i < m.n_floats; i++)  // every backbone parameter, through the head
    fd_check(&ref, wd, a.ids, a.pos, a.seg, &P[i], grads[i], &worst, &bad), checked++;
  fprintf(stderr, "  %d gradients checked, worst |diff| %.3g\n", checked, worst);
  CHECK(bad == 0);
  CHECK(rew[0] != rew[1]);  // a pair that is not degenerate
  free(P);
  free(grads);
  ct_weights_free(&g);
  ct_acts_free(&a);
  ct_model_free(&m);
}

int main(int argc, char **argv) {
  ct_blas_init(argc, argv);
  ct_pool_init(2);
  RUN(test_pair_loss_matches_hand_values);
  RUN(test_metric_sums);
  RUN(test_score_head_and_backbone_gradients_match_reference);
  return test_summary();
}
