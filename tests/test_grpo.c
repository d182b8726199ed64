// GRPO's arithmetic: rewards to advantages (zero-std groups, NaN rewards, the three
// scalings), the clipped surrogate and k3 KL per token (values and derivatives), and the
// four loss_type weightings, all against numbers worked out by hand.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "advantage.h"
#include "objective.h"
#include "test.h"

static void test_weighted_rewards_leave_nan_out(void) {
  // 3 completions x 2 functions; weights 1 and 0.5
  double R[6] = {1, 2, NAN, 4, NAN, NAN}, w[2] = {1, 0.5}, r[3];
  ct_grpo_total_rewards(R, 3, 2, w, r);
  CHECK_NEAR(r[0], 2.0, 0);
  CHECK_NEAR(r[1], 2.0, 0);  // NaN accuracy counts 0, the other function still counts
  CHECK_NEAR(r[2], 0.0, 0);
}

// Group of 4: rewards 1, 0, 0, 1 -> mean 0.5, Bessel std sqrt(1/3) = 0.57735.
static void test_group_advantages_are_standardized_with_bessel_std(void) {
  double r[8] = {1, 0, 0, 1, 3, 3, 3, 3}, a[8];
  int zero = ct_grpo_advantages(r, 2, 4, CT_SCALE_GROUP, 0, a);
  double s = sqrt(1.0 / 3.0);
  CHECK_NEAR(a[0], 0.5 / (s + 1e-4), 1e-12);
  CHECK_NEAR(a[1], -0.5 / (s + 1e-4), 1e-12);
  CHECK(zero == 1);  // the second group: all equal
  for (int i = 4; i < 8; i++) CHECK(a[i] == 0.0);
}

// A near-zero std does not blow advantages up: 1e-4 in the divisor bounds them.
static void test_near_zero_std_is_bounded(void) {
  double r[2] = {1.0, 1.0 + 1e-9}, a[2];
  ct_grpo_advantages(r, 1, 2, CT_SCALE_GROUP, 0, a);
  CHECK(fabs(a[0]) < 1e-4 && fabs(a[1]) < 1e-4);
}

static void test_batch_and_none_scaling(void) {
  double r[4] = {2, 0, 5, 1}, a[4];
  ct_grpo_advantages(r, 2, 2, CT_SCALE_BATCH, 2.0, a);
  CHECK_NEAR(a[0], 1.0 / 2.0001, 1e-12);
  CHECK_NEAR(a[3], -2.0 / 2.0001, 1e-12);
  ct_grpo_advantages(r, 2, 2, CT_SCALE_NONE, 0, a);
  CHECK_NEAR(a[0], 1.0, 0);
  CHECK_NEAR(a[2], 2.0, 0);
}

// rloo, group 3 1 2 6 (sum 12): A_i = r_i − (12 − r_i)/3 = 0, −8/3, −4/3, 4; the second
// group is all equal: 0 exactly (0.1·3/3 would not give it).
static void test_rloo_leaves_each_completion_out_of_its_baseline(void) {
  double r[8] = {3, 1, 2, 6, 0.1, 0.1, 0.1, 0.1}, a[8];
  CHECK(ct_grpo_rloo(r, 2, 4, a) == 1);
  CHECK_NEAR(a[0], 0.0, 1e-15);
  CHECK_NEAR(a[1], -8.0 / 3, 1e-15);
  CHECK_NEAR(a[2], -4.0 / 3, 1e-15);
  CHECK_NEAR(a[3], 4.0, 1e-15);
  for (int i = 4; i < 8; i++) CHECK(a[i] == 0.0);
  // normalize_advantages: mean 0, Σ A² = 64/9 + 16/9 + 16 = 224/9, Bessel var 32/9
  CHECK_OK(ct_grpo_whiten(a, NULL, 8, CT_WHITEN_COMPLETIONS));
  double div = 4 * sqrt(2.0) / 3 + 1e-4;
  CHECK_NEAR(a[1], -8.0 / 3 / div, 1e-12);
  CHECK_NEAR(a[3], 4.0 / div, 1e-12);
  CHECK_NEAR(a[5], 0.0, 1e-15);
}

// reinforce_baseline, groups {1, 3} and {5, 5}: A = −1, 1, 0, 0; completions of 3, 1, 2, 2
// tokens: μ = (−3 + 1)/8 = −1/4, σ² = (3·0.75² + 1.25² + 4·0.25²)/8 = 3.5/8.
static void test_reinforce_baseline_whitens_over_tokens(void) {
  double r[4] = {1, 3, 5, 5}, w[4] = {3, 1, 2, 2}, a[4];
  CHECK(ct_grpo_group_baseline(r, 2, 2, a) == 1);
  CHECK_NEAR(a[0], -1.0, 0);
  CHECK_NEAR(a[1], 1.0, 0);
  CHECK(a[2] == 0.0 && a[3] == 0.0);
  CHECK_OK(ct_grpo_whiten(a, w, 4, CT_WHITEN_TOKENS));
  double sd = sqrt(3.5 / 8);
  CHECK_NEAR(a[0], -0.75 / sd, 1e-12);
  CHECK_NEAR(a[1], 1.25 / sd, 1e-12);
  CHECK_NEAR(a[2], 0.25 / sd, 1e-12);
  CHECK_NEAR(a[3], 0.25 / sd, 1e-12);
  double m = 0, v = 0;  // per token: mean 0, variance 1
  for (int i = 0; i < 4; i++) m += w[i] * a[i], v += w[i] * a[i] * a[i];
  CHECK_NEAR(m / 8, 0.0, 1e-12);
  CHECK_NEAR(v / 8, 1.0, 1e-12);
}

// Whitening all-equal advantages gives 0, not NaN (σ² is held at 1e-8 or more; std + 1e-4);
// no tokens at all leaves them as they are.
static void test_whitening_degenerate_batches(void) {
  double a[3] = {0.5, 0.5, 0.5}, w[3] = {1, 2, 3};
  CHECK_OK(ct_grpo_whiten(a, w, 3, CT_WHITEN_TOKENS));
  for (int i = 0; i < 3; i++) CHECK(a[i] == 0.0);
  double b[2] = {2, -1}, z[2] = {0, 0};
  CHECK_OK(ct_grpo_whiten(b, z, 2, CT_WHITEN_TOKENS));
  CHECK(b[0] == 2 && b[1] == -1);
  double c[1] = {3};
  CHECK_OK(ct_grpo_whiten(c, NULL, 1, CT_WHITEN_COMPLETIONS));
  CHECK_NEAR(c[0], 0.0, 0);
}

// On the first pass over fresh rollouts old == current: ratio 1, no clipping, and the
// loss and its derivative are −A.
static void test_ratio_one_gives_minus_advantage_and_no_clipping(void) {
  ct_grpo_clip c = {0.2, 0.28, 0};
  for (double A = -2; A <= 2; A += 0.5) {
    double d;
    ct_grpo_token_info info;
    double l = ct_grpo_token_loss(&c, -1.3, -1.3, 0, A, &d, &info);
    CHECK_NEAR(l, -A, 1e-15);
    CHECK_NEAR(d, -A, 1e-15);
    CHECK(!info.clipped_low && !info.clipped_high && info.kl == 0);
  }
}

// Outside the trust region the clipped term wins and carries no gradient.
static void test_clipping_stops_the_gradient_outside_the_range(void) {
  ct_grpo_clip c = {0.2, 0.2, 0};
  double d;
  ct_grpo_token_info info;
  // ratio e^0.5 = 1.6487 > 1.2 with A > 0: loss −1.2·A, no gradient, clipped high
  double l = ct_grpo_token_loss(&c, 0.5, 0.0, 0, 2.0, &d, &info);
  CHECK_NEAR(l, -2.4, 1e-12);
  CHECK(d == 0 && info.clipped_high && !info.clipped_low);
  // ratio e^−0.5 = 0.6065 < 0.8 with A < 0: loss −0.8·A = 0.8, clipped low
  l = ct_grpo_token_loss(&c, -0.5, 0.0, 0, -1.0, &d, &info);
  CHECK_NEAR(l, 0.8, 1e-12);
  CHECK(d == 0 && info.clipped_low);
  // ratio 1.6487 with A < 0: the unclipped term is smaller, gradient flows
  l = ct_grpo_token_loss(&c, 0.5, 0.0, 0, -1.0, &d, &info);
  CHECK_NEAR(l, exp(0.5), 1e-12);
  CHECK_NEAR(d, exp(0.5), 1e-12);
}

// k3 KL = e^(ref−lp) − (ref−lp) − 1: zero when the policy equals the reference.
static void test_kl_is_zero_at_the_reference_and_k3_elsewhere(void) {
  ct_grpo_clip c = {0.2, 0.2, 0.04};
  double d;
  ct_grpo_token_info info;
  double l = ct_grpo_token_loss(&c, -2.0, -2.0, -2.0, 0.7, &d, &info);
  CHECK(info.kl == 0);
  CHECK_NEAR(l, -0.7, 1e-15);
  CHECK_NEAR(d, -0.7, 1e-15);  // the KL's derivative 1 − e^0 is 0 there
  l = ct_grpo_token_loss(&c, -2.0, -2.0, -1.5, 0.0, &d, &info);
  double t = 0.5;
  CHECK_NEAR(info.kl, exp(t) - t - 1, 1e-15);
  // A = 0 leaves only the KL: loss β·kl, dℓ/dlp = β·(1 − e^(ref−lp))
  CHECK_NEAR(l, 0.04 * (exp(t) - t - 1), 1e-15);
  CHECK_NEAR(d, 0.04 * (1 - exp(t)), 1e-15);
  // with an advantage and ratio 1: −A + β·kl and −A + β·(1 − e^t), here with t < 0
  l = ct_grpo_token_loss(&c, -1.0, -1.0, -1.8, 1.5, &d, &info);
  t = -0.8;
  CHECK_NEAR(info.kl, exp(t) - t - 1, 1e-15);
  CHECK_NEAR(l, -1.5 + 0.04 * (exp(t) - t - 1), 1e-14);
  CHECK_NEAR(d, -1.5 + 0.04 * (1 - exp(t)), 1e-14);
  // clipped high (no surrogate gradient): the KL's derivative is all that is left
  l = ct_grpo_token_loss(&c, 0.5, 0.0, -0.5, 2.0, &d, &info);
  t = -1.0;
  CHECK(info.clipped_high);
  CHECK_NEAR(l, -1.2 * 2.0 + 0.04 * (exp(t) - t - 1), 1e-14);
  CHECK_NEAR(d, 0.04 * (1 - exp(t)), 1e-15);
  // beta = 0: ref is ignored, no KL at all
  ct_grpo_clip c0 = {0.2, 0.2, 0};
  l = ct_grpo_token_loss(&c0, -1.0, -1.0, -1.8, 1.5, &d, &info);
  CHECK(info.kl == 0);
  CHECK_NEAR(l, -1.5, 1e-15);
  CHECK_NEAR(d, -1.5, 1e-15);
}

// dℓ/dlp against central differences, inside and outside the clip range, with KL.
static void test_token_loss_gradient_matches_finite_differences(void) {
  ct_grpo_clip c = {0.2, 0.3, 0.1};
  double pts[][4] = {{-1.0, -1.1, -0.9, 1.5}, {-1.0, -0.95, -1.2, -0.7}, {-0.3, -0.35, -0.8, 2.0},
                     {-2.0, -1.7, -2.5, -1.0}, {-0.5, -0.5, -0.5, 0.3}};
  for (size_t i = 0; i < sizeof pts / sizeof pts[0]; i++) {
    double lp = pts[i][0], old = pts[i][1], ref = pts[i][2], A = pts[i][3], d, dm, dp, h = 1e-6;
    ct_grpo_token_info info;
    ct_grpo_token_loss(&c, lp, old, ref, A, &d, &info);
    double lplus = ct_grpo_token_loss(&c, lp + h, old, ref, A, &dp, &info);
    double lminus = ct_grpo_token_loss(&c, lp - h, old, ref, A, &dm, &info);
    CHECK_NEAR(d, (lplus - lminus) / (2 * h), 1e-6);
  }
}

// Step of 2 sequences of 3 and 5 tokens in 2 micro-batches, max_completion_length 8.
static void test_loss_type_weights_match_hand_values(void) {
  ct_grpo_counts c = {.tokens = 8, .sequences = 2, .micro_batches = 2};
  CHECK_NEAR(ct_grpo_token_weight(CT_GRPO_AGG_GRPO, &c, 3, 3, 8), 1.0 / 6, 1e-15);   // 1/(2·3)
  CHECK_NEAR(ct_grpo_token_weight(CT_GRPO_AGG_GRPO, &c, 5, 5, 8), 1.0 / 10, 1e-15);
  CHECK_NEAR(ct_grpo_token_weight(CT_GRPO_AGG_BNPO, &c, 3, 3, 8), 1.0 / 6, 1e-15);   // 1/(2·3)
  CHECK_NEAR(ct_grpo_token_weight(CT_GRPO_AGG_DR_GRPO, &c, 3, 3, 8), 1.0 / 16, 1e-15);
  CHECK_NEAR(ct_grpo_token_weight(CT_GRPO_AGG_DAPO, &c, 3, 3, 8), 1.0 / 8, 1e-15);
  // grpo: every sequence weighs the same in total; dapo: every token does
  CHECK_NEAR(3 * ct_grpo_token_weight(CT_GRPO_AGG_GRPO, &c, 3, 3, 8) +
             5 * ct_grpo_token_weight(CT_GRPO_AGG_GRPO, &c, 5, 5, 8), 1.0, 1e-15);
  CHECK_NEAR(8 * ct_grpo_token_weight(CT_GRPO_AGG_DAPO, &c, 3, 3, 8), 1.0, 1e-15);
}

// TRL's nanstd: Bessel-corrected, NaN left out (NaN for a single value).
static double trl_nanstd(const double *x, int n, int stride) {
  double m = 0, c = 0, v = 0;
  for (int i = 0; i < n; i++)
    if (!isnan(x[i * stride])) m += x[i * stride], c++;
  m /= c;
  for (int i = 0; i < n; i++)
    if (!isnan(x[i * stride])) v += (x[i * stride] - m) * (x[i * stride] - m);
  return sqrt(v / c * c / (c - 1));
}

// multi_objective_aggregation normalize_then_sum against TRL's branch written out: 2 groups
// of 4, 3 reward functions with NaN scores, a group holding one function's score once, and
// a row no function scored.
static void test_normalize_then_sum_matches_trls_branch(void) {
  enum { N = 8, K = 3, G = 4 };
  const double R[N][K] = {{1, 0.5, NAN},   {0, 0.25, NAN}, {1, NAN, 2}, {0.5, 1, NAN},
                          {NAN, NAN, NAN}, {2, 0, 1},      {1, 0, NAN}, {3, 0.75, NAN}};
  const double w[K] = {1.0, 0.5, 2.0};
  double r[N], adv[N], want_r[N], want[N];
  CHECK_OK(ct_grpo_normalize_then_sum(&R[0][0], N / G, G, K, w, r, adv));
  // grouped (groups, G, K): mean_k and std_k over each group's G, reward_k = (x − mean)/(std + 1e-4)
  for (int i = 0; i < N; i++) want_r[i] = 0;
  for (int p = 0; p < N / G; p++)
    for (int k = 0; k < K; k++) {
      double m = 0, c = 0;
      for (int i = p * G; i < p * G + G; i++)
        if (!isnan(R[i][k])) m += R[i][k], c++;
      m /= c;
      double sd = trl_nanstd(&R[p * G][k], G, K);
      for (int i = p * G; i < p * G + G; i++) {
        double z = (R[i][k] - m) / (sd + 1e-4);
        if (!isnan(z)) want_r[i] += w[k] * z;
      }
    }
  want_r[4] = NAN;  // unscorable: every function NaN
  double mean = 0, c = 0;
  for (int i = 0; i < N; i++)
    if (!isnan(want_r[i])) mean += want_r[i], c++;
  mean /= c;
  double sd = trl_nanstd(want_r, N, 1);
  for (int i = 0; i < N; i++) want[i] = isnan(want_r[i]) ? 0 : (want_r[i] - mean) / (sd + 1e-4);
  for (int i = 0; i < N; i++) {
    CHECK(isnan(want_r[i]) ? isnan(r[i]) : fabs(r[i] - want_r[i]) < 1e-12);
    CHECK_NEAR(adv[i], want[i], 1e-12);
  }
  CHECK(adv[4] == 0);
  // the third function's group 1 held one score: its z is NaN and adds nothing to row 2
  CHECK(fabs(r[2] - want_r[2]) < 1e-12);
}


// sum_then_normalize with unscorable completions, as TRL's branch reads: rewards[unscorable] =
// NaN, group nanmean and nanstd (or the batch's nanstd), (r − mean) / (std + 1e-4) (scale
// none: r − mean), then nan_to_num: an unscorable completion, and a group's lone score,
// get 0.
static void test_sum_then_normalize_leaves_unscorable_completions_out_as_trl(void) {
  enum { N = 12, G = 4 };
  const double r[N] = {1, NAN, 0, 0.5, NAN, NAN, 2, NAN, 3, 3, NAN, 3};  // groups: 3 scored, 1, 3 equal
  for (int scale = CT_SCALE_GROUP; scale <= CT_SCALE_NONE; scale++) {
    double batch = trl_nanstd(r, N, 1), adv[N], want[N];
    int zero = ct_grpo_advantages(r, N / G, G, scale, batch, adv);
    for (int p = 0; p < N / G; p++) {
      double m = 0, c = 0;
      for (int i = p * G; i < p * G + G; i++)
        if (!isnan(r[i])) m += r[i], c++;
      m /= c;
      double sd = scale == CT_SCALE_GROUP ? trl_nanstd(r + p * G, G, 1) : batch;
      for (int i = p * G; i < p * G + G; i++) {
        double a = scale == CT_SCALE_NONE ? r[i] - m : (r[i] - m) / (sd + 1e-4);
        want[i] = isnan(a) ? 0 : a;
      }
    }
    for (int i = 0; i < N; i++) CHECK_NEAR(adv[i], want[i], 1e-9);
    CHECK(adv[1] == 0 && adv[4] == 0 && adv[6] == 0 && adv[10] == 0);
    CHECK(zero == 1);  // the third group (three equal scores); not the lone score's NaN std
  }
}

// ---------------------------------------------------------------------------
// TRL's GRPOTrainer._compute_loss, written out in float64 over a (B, T) micro-batch the way
// the PyTorch code reads (masks, broadcasts, each loss_type's reduction), as a function of
// the log-probs lp. sg is the same log-probs where TRL detaches them (cispo's clamped
// ratio, the off-policy mask): finite differences move lp and hold sg, so they give the
// gradient autograd would. Rows b with trunc[b] are truncated completions under
// mask_truncated_completions: their whole mask is 0.
enum { RB = 5, RT = 7, MAXLEN = 9 };
typedef struct {
  int len[RB];
  bool trunc[RB];
  double old[RB][RT], ref[RB][RT], q[RB][RT], A[RB];
  float ent[RB][RT];  // the tokens' entropies
} trl_case;

typedef struct {
  const char *loss_type;
  bool sequence, bias_kl;
  double eps, eps_high, beta, delta, tau_pos, tau_neg, opm;  // delta, opm: 0 = None
  int isc;                   // vllm_importance_sampling_mode + 1 (0: no correction)
  double isc_min, isc_max;   // its clip_min (0 = None) and clip_max
  double top_entropy;        // top_entropy_quantile (0 in a row below: 1)
  double vk_pos, vl_pos, vk_neg, vl_neg;  // vespo's (0 in a row below: TRL's defaults 2, 3, 3, 2)
} trl_cfg;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// get_high_entropy_mask's threshold: torch.quantile(entropies[mask], 1 − top_entropy_quantile),
// linear interpolation between the order statistics.
static double trl_entropy_threshold(const trl_cfg *k, const trl_case *c, double mask[RB][RT]) {
  double v[RB * RT];
  int n = 0;
  for (int b = 0; b < RB; b++)
    for (int t = 0; t < RT; t++)
      if (mask[b][t]) v[n++] = c->ent[b][t];
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  double pos = (1 - k->top_entropy) * (n - 1), f = floor(pos);
  return f + 1 < n ? v[(int)f] + (pos - f) * (v[(int)f + 1] - v[(int)f]) : v[n - 1];
}

static double trl_loss(const trl_cfg *k, const trl_case *c, double lp[RB][RT], double sg[RB][RT]) {
  double mask[RB][RT], liw[RB][RT], ptl[RB][RT];
  for (int b = 0; b < RB; b++)
    for (int t = 0; t < RT; t++) mask[b][t] = t < c->len[b] && !c->trunc[b];
  double thr = k->top_entropy > 0 && k->top_entropy < 1 ? trl_entropy_threshold(k, c, mask) : -INFINITY;
  for (int b = 0; b < RB; b++) {
    double sum = 0, n = 0, kl_sum = 0;
    for (int t = 0; t < RT; t++) sum += (lp[b][t] - c->old[b][t]) * mask[b][t], n += mask[b][t];
    for (int t = 0; t < RT; t++) liw[b][t] = k->sequence ? sum / fmax(n, 1) : lp[b][t] - c->old[b][t];
    // off-policy mask, from the detached log-probs: keep when A >= 0 or the mean KL <= delta
    for (int t = 0; t < RT; t++) kl_sum += (c->q[b][t] - sg[b][t]) * mask[b][t];
    double keep = k->opm > 0 ? (c->A[b] >= 0 || kl_sum / fmax(n, 1) <= k->opm) : 1;
    // the sampler correction, from old and the sampler's q (no gradient): per token, or one
    // per row from the row's sum; clamped (truncate) or zeroed outside [min, max] (mask)
    double isr[RT], row_diff = 0;
    int mode = k->isc - 1;
    for (int t = 0; t < RT; t++) row_diff += (c->old[b][t] - c->q[b][t]) * mask[b][t];
    for (int t = 0; t < RT; t++) {
      bool seq = mode == CT_ISC_SEQUENCE_TRUNCATE || mode == CT_ISC_SEQUENCE_MASK;
      double x = exp(seq ? row_diff : (c->old[b][t] - c->q[b][t]) * mask[b][t]);
      if (mode == CT_ISC_TOKEN_TRUNCATE || mode == CT_ISC_SEQUENCE_TRUNCATE) x = fmin(fmax(x, k->isc_min), k->isc_max);
      else if (x < k->isc_min || x > k->isc_max) x = 0;
      isr[t] = k->isc ? x : 1;
    }
    for (int t = 0; t < RT; t++) {
      double c1 = exp(liw[b][t]), A = c->A[b], p;
      if (!strcmp(k->loss_type, "cispo")) {
        double sgw = k->sequence ? 0 : sg[b][t] - c->old[b][t];
        if (k->sequence) {  // the detached sequence weight
          double s2 = 0;
          for (int u = 0; u < RT; u++) s2 += (sg[b][u] - c->old[b][u]) * mask[b][u];
          sgw = s2 / fmax(n, 1);
        }
        p = -fmin(exp(sgw), k->eps_high) * A * lp[b][t];
      } else if (!strcmp(k->loss_type, "vespo")) {  // get_gamma_weights, under no_grad (sg)
        double lo = log(1e-8), sl = 0;
        for (int u = 0; u < RT; u++) {
          sl += fmin(fmax(sg[b][u] - c->old[b][u], -20.0), 20.0) * mask[b][u];
          if (k->isc) sl += fmin(fmax(log(isr[u]), lo), 20.0);  // (TRL sums these over every position)
        }
        double lw = fmin(fmax(sl, lo), 20.0), kk = A >= 0 ? k->vk_pos : k->vk_neg;
        double lam = fmax(A >= 0 ? k->vl_pos : k->vl_neg, 1e-4), phi = exp(lam + kk * lw - lam * exp(lw));
        if (!isfinite(phi)) phi = 0;
        p = -phi * A * lp[b][t];
      } else if (!strcmp(k->loss_type, "sapo")) {
        double tau = A > 0 ? k->tau_pos : k->tau_neg;
        p = -(1 / (1 + exp(-tau * (c1 - 1)))) * 4 / tau * A;
      } else {
        double c2 = fmin(fmax(c1, 1 - k->eps), 1 + k->eps_high), c1d = k->delta > 0 ? fmin(c1, k->delta) : c1;
        p = -fmin(c1d * A, c2 * A);
      }
      p *= keep * (strcmp(k->loss_type, "vespo") ? isr[t] : 1) * (c->ent[b][t] * mask[b][t] >= (float)thr && mask[b][t]);
      if (k->beta > 0) {
        double x = c->ref[b][t] - lp[b][t], kl = exp(x) - x - 1;
        p += k->beta * kl * (k->bias_kl ? c1 : 1);
      }
      ptl[b][t] = p;
    }
  }
  double L = 0, all = 0;
  for (int b = 0; b < RB; b++)
    for (int t = 0; t < RT; t++) all += mask[b][t];
  const char *lt = k->loss_type;
  for (int b = 0; b < RB; b++) {
    double row = 0, n = 0;
    for (int t = 0; t < RT; t++) row += ptl[b][t] * mask[b][t], n += mask[b][t];
    if (!strcmp(lt, "grpo") || !strcmp(lt, "sapo")) L += row / fmax(n, 1) / RB;  // .mean() over B
    else if (!strcmp(lt, "bnpo")) L += row / fmax(all, 1);
    else if (!strcmp(lt, "dr_grpo")) L += row / (RB * (double)MAXLEN);
    else L += row / fmax(all, 1);  // dapo, cispo, vespo: num_items_in_batch
  }
  return L;
}

// ct_grpo_span_loss over the micro-batch as bin/grpo runs it: counts of the step (every
// completion a sequence, masked ones' tokens left out), masked completions skipped.
static double ours(const trl_cfg *k, const trl_case *c, float lp[RB][RT], float coef[RB][RT]) {
  ct_config cfg = {0};
  char *lt[] = {(char *)k->loss_type};
  cfg.loss_type = (ct_str_list){lt, 1};
  cfg.epsilon = k->eps, cfg.epsilon_high = k->eps_high, cfg.beta = k->beta, cfg.delta = k->delta;
  cfg.importance_sampling_level = k->sequence ? CT_IS_SEQUENCE : CT_IS_TOKEN;
  cfg.sapo_temperature_pos = k->tau_pos, cfg.sapo_temperature_neg = k->tau_neg;
  cfg.use_bias_correction_kl = k->bias_kl, cfg.off_policy_mask_threshold = k->opm;
  cfg.vllm_importance_sampling_correction = k->isc > 0;
  cfg.vllm_importance_sampling_mode = k->isc > 0 ? k->isc - 1 : 0;
  cfg.vllm_importance_sampling_clip_min = k->isc_min, cfg.vllm_importance_sampling_clip_max = k->isc_max;
  cfg.top_entropy_quantile = k->top_entropy > 0 ? k->top_entropy : 1;
  cfg.vespo_k_pos = k->vk_pos, cfg.vespo_lambda_pos = k->vl_pos, cfg.vespo_k_neg = k->vk_neg, cfg.vespo_lambda_neg = k->vl_neg;
  ct_grpo_micro m = {0};
  CHECK_OK(ct_grpo_objective_of(&cfg, k->beta > 0, &m.obj, &m.agg));
  ct_grpo_counts counts = {0, RB, 1};
  for (int b = 0; b < RB; b++) counts.tokens += c->trunc[b] ? 0 : c->len[b];
  m.counts = &counts, m.micro_tokens = counts.tokens, m.max_completion_length = MAXLEN;
  float ents[RB * RT];
  long ne = 0;
  for (int b = 0; b < RB; b++)
    for (int t = 0; t < c->len[b] && !c->trunc[b]; t++) ents[ne++] = c->ent[b][t];
  if (m.obj.top_entropy < 1) CHECK_OK(ct_grpo_entropy_threshold(&m.obj, ents, ne, &m.entropy_threshold));
  const float(*ent)[RT] = c->ent;
  double L = 0;
  ct_grpo_span_info info = {0};
  for (int b = 0; b < RB; b++) {
    float old[RT], ref[RT], q[RT];
    for (int t = 0; t < RT; t++) old[t] = (float)c->old[b][t], ref[t] = (float)c->ref[b][t], q[t] = (float)c->q[b][t];
    memset(coef[b], 0, sizeof coef[b]);
    if (c->trunc[b]) continue;
    if (ct_grpo_needs_whole(&m.obj)) {
      L += ct_grpo_span_loss(&m, c->len[b], c->len[b], lp[b], old, ent[b], ref, q, c->A[b], coef[b], &info, NULL);
    } else {  // token-local: any split of the completion into spans gives the same
      int cut = c->len[b] / 2;
      L += ct_grpo_span_loss(&m, c->len[b], cut, lp[b], old, ent[b], ref, q, c->A[b], coef[b], &info, NULL);
      L += ct_grpo_span_loss(&m, c->len[b], c->len[b] - cut, lp[b] + cut, old + cut, ent[b] + cut, ref + cut, q + cut, c->A[b],
                             coef[b] + cut, &info, NULL);
    }
  }
  return L;
}

// Every loss_type, both importance-sampling levels, delta, SAPO's temperatures, the KL with
// and without the bias correction, the off-policy mask, the sampler correction's modes and
// the entropy mask: the loss equals TRL's formula
// in float64, and each coefficient equals −∂L/∂lp_t by central differences of it. The
// ratios are away from 1 (old ≠ lp, as on a later pass), so clips, caps and gates act.
static void test_objectives_match_trls_formula_and_its_gradient(void) {
  trl_case c = {{7, 3, 5, 1, 6}, {false, false, true, false, false}, {{0}}, {{0}}, {{0}}, {0.9, -1.3, 0.4, -0.2, 1.7}, {{0}}};
  float lp[RB][RT];
  double dlp[RB][RT];
  uint64_t r = 12345;
  for (int b = 0; b < RB; b++)
    for (int t = 0; t < RT; t++) {
      double u[4];
      for (int i = 0; i < 4; i++) r = r * 6364136223846793005ULL + 1442695040888963407ULL, u[i] = (double)(r >> 11) / 9007199254740992.0;
      lp[b][t] = (float)(-0.2 - 2.5 * u[0]);
      dlp[b][t] = lp[b][t];
      c.old[b][t] = (float)(lp[b][t] + 0.7 * (u[1] - 0.5));  // ratios e^±0.35
      c.ref[b][t] = (float)(lp[b][t] + 0.8 * (u[2] - 0.5));
      c.q[b][t] = (float)(lp[b][t] + 0.6 * (u[3] - 0.3));
      c.ent[b][t] = (float)(0.1 + 4 * u[0] * u[1]);
    }
  c.ent[0][2] = c.ent[1][1] = c.ent[4][3];  // ties at the threshold go either side alike
  const trl_cfg cfgs[] = {
      {"grpo", false, false, 0.2, 0.2, 0, 0, 1, 1.05, 0, 0, 0, 0, 0, 0, 0, 0, 0},     {"bnpo", false, false, 0.2, 0.28, 0.04, 0, 1, 1.05, 0, 0, 0, 0, 0, 0, 0, 0, 0},
      {"dr_grpo", false, false, 0.1, 0.15, 0, 0, 1, 1.05, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {"dapo", false, false, 0.2, 0.28, 0.04, 1.25, 1, 1.05, 0, 0, 0, 0, 0, 0, 0, 0, 0},
      {"dapo", true, false, 0.05, 0.05, 0, 0, 1, 1.05, 0, 0, 0, 0, 0, 0, 0, 0, 0},    {"grpo", true, true, 0.2, 0.2, 0.1, 1.3, 1, 1.05, 0, 0, 0, 0, 0, 0, 0, 0, 0},
      {"cispo", false, false, 0.2, 1.1, 0, 0, 1, 1.05, 0, 0, 0, 0, 0, 0, 0, 0, 0},    {"cispo", true, false, 0.2, 1.05, 0.04, 0, 1, 1.05, 0, 0, 0, 0, 0, 0, 0, 0, 0},
      {"sapo", false, false, 0.2, 0.2, 0, 0, 1, 1.05, 0, 0, 0, 0, 0, 0, 0, 0, 0},     {"sapo", true, true, 0.2, 0.2, 0.05, 0, 2.0, 0.7, 0, 0, 0, 0, 0, 0, 0, 0, 0},
      {"dapo", false, true, 0.2, 0.28, 0.08, 0, 1, 1.05, 0.05, 0, 0, 0, 0, 0, 0, 0, 0}, {"grpo", true, false, 0.2, 0.2, 0, 0, 1, 1.05, 0.1, 0, 0, 0, 0, 0, 0, 0, 0},
      // the sampler correction's four modes (TRL's default clip_max 3; a clip_min too)
      {"dapo", false, false, 0.2, 0.28, 0, 0, 1, 1.05, 0, 1 + CT_ISC_TOKEN_TRUNCATE, 0.8, 1.2, 0, 0, 0, 0, 0},
      {"grpo", false, false, 0.2, 0.2, 0.04, 0, 1, 1.05, 0, 1 + CT_ISC_TOKEN_MASK, 0.8, 1.25, 0, 0, 0, 0, 0},
      {"dapo", false, false, 0.2, 0.28, 0, 0, 1, 1.05, 0, 1 + CT_ISC_SEQUENCE_TRUNCATE, 0, 3.0, 0, 0, 0, 0, 0},
      {"sapo", true, false, 0.2, 0.2, 0, 0, 1, 1.05, 0, 1 + CT_ISC_SEQUENCE_MASK, 0.5, 3.0, 0, 0, 0, 0, 0},
      {"cispo", false, false, 0.2, 5.0, 0, 0, 1, 1.05, 0, 1 + CT_ISC_SEQUENCE_MASK, 0, 3.0, 0, 0, 0, 0, 0},
      // the entropy mask over the 17 tokens: the top 20% (an interpolated quantile) and the top
      // 25% (the 0.75 quantile is the 13th smallest entropy itself: that token stays)
      {"dapo", false, false, 0.2, 0.28, 0.04, 0, 1, 1.05, 0, 0, 0, 0, 0.2, 0, 0, 0, 0},
      {"grpo", true, false, 0.2, 0.2, 0, 0, 1, 1.05, 0, 1 + CT_ISC_TOKEN_TRUNCATE, 0, 3.0, 0.25, 0, 0, 0, 0},
      // vespo: TRL's default gamma weights, alone, with KL, and with a token correction folded in
      {"vespo", false, false, 0.2, 0.2, 0, 0, 1, 1.05, 0, 0, 0, 0, 0, 2, 3, 3, 2},
      {"vespo", false, false, 0.2, 0.2, 0.04, 0, 1, 1.05, 0, 0, 0, 0, 0, 1.5, 0.5, 2.5, 1.0},
      {"vespo", false, false, 0.2, 0.2, 0, 0, 1, 1.05, 0, 1 + CT_ISC_TOKEN_MASK, 0.6, 1.6, 0, 2, 3, 3, 2},
      {"vespo", false, false, 0.2, 0.2, 0, 0, 1, 1.05, 0, 1 + CT_ISC_TOKEN_TRUNCATE, 0.7, 1.4, 0, 2, 3, 3, 2}};
  for (size_t i = 0; i < sizeof cfgs / sizeof *cfgs; i++) {
    const trl_cfg *k = &cfgs[i];
    float coef[RB][RT];
    double sg[RB][RT];
    memcpy(sg, dlp, sizeof sg);
    double L = ours(k, &c, lp, coef), want = trl_loss(k, &c, dlp, sg), worst = 0;
    for (int b = 0; b < RB; b++)
      for (int t = 0; t < RT; t++) {
        double h = 1e-6, x = dlp[b][t];
        dlp[b][t] = x + h;
        double up = trl_loss(k, &c, dlp, sg);
        dlp[b][t] = x - h;
        double dn = trl_loss(k, &c, dlp, sg);
        dlp[b][t] = x;
        double g = -(up - dn) / (2 * h);  // −∂L/∂lp_t
        worst = fmax(worst, fabs(coef[b][t] - g) / (1e-3 + fabs(g)));
      }
    if (worst > 1e-4 || fabs(L - want) > 1e-6 * (1 + fabs(want)))
      printf("  %s%s: loss %.9g, TRL's %.9g; worst coefficient error %.2g\n", k->loss_type,
             k->sequence ? " (sequence)" : "", L, want, worst);
    CHECK(worst <= 1e-4);
    CHECK_NEAR(L, want, 1e-6 * (1 + fabs(want)));
  }
}

int main(void) {
  RUN(test_weighted_rewards_leave_nan_out);
  RUN(test_group_advantages_are_standardized_with_bessel_std);
  RUN(test_near_zero_std_is_bounded);
  RUN(test_batch_and_none_scaling);
  RUN(test_sum_then_normalize_leaves_unscorable_completions_out_as_trl);
  RUN(test_rloo_leaves_each_completion_out_of_its_baseline);
  RUN(test_reinforce_baseline_whitens_over_tokens);
  RUN(test_whitening_degenerate_batches);
  RUN(test_ratio_one_gives_minus_advantage_and_no_clipping);
  RUN(test_clipping_stops_the_gradient_outside_the_range);
  RUN(test_kl_is_zero_at_the_reference_and_k3_elsewhere);
  RUN(test_token_loss_gradient_matches_finite_differences);
  RUN(test_loss_type_weights_match_hand_values);
  RUN(test_objectives_match_trls_formula_and_its_gradient);
  RUN(test_normalize_then_sum_matches_trls_branch);
  return test_summary();
}
