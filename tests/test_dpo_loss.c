// dpo/loss: every preference loss against values worked out here at float64 from the
// formulas of TRAINERS.md (not from the code under test), stability at large |βΔ|, the
// policy == reference point, and d_c / d_r against central finite differences.
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "dpo/loss.h"
#include "advantage.h"
#include "objective.h"
#include "test.h"

// −log σ(t) = log(1 + e^(−t)), written out for the moderate t the hand values use.
static double nls(double t) { return log1p(exp(-t)); }
// σ(t) = 1 / (1 + e^(−t))
static double sig(double t) { return 1 / (1 + exp(-t)); }

static ct_dpo_loss one(int type, double beta, double eps) {
  return (ct_dpo_loss){.n = 1, .type = {type}, .weight = {1}, .beta = beta, .label_smoothing = eps,
                       .simpo_gamma = 0.5};
}

// The base pair of the hand-value tests: ρ_c = 1, ρ_r = −0.5, Δ = 1.5, |c| = 4, |r| = 5.
static const double LP_C = -10, LP_R = -12, REF_C = -11, REF_R = -11.5;
static const int LEN_C = 4, LEN_R = 5;

static double pair(const ct_dpo_loss *o, double *dc, double *dr) {
  return ct_dpo_pair_loss(o, LP_C, LP_R, REF_C, REF_R, LEN_C, LEN_R, dc, dr);
}

static void test_sigmoid_matches_minus_log_sigmoid_of_beta_delta(void) {
  ct_dpo_loss o = one(CT_DPO_SIGMOID, 0.1, 0);
  double dc, dr, x = 0.1 * 1.5;
  double L = pair(&o, &dc, &dr);
  CHECK_NEAR(L, nls(x), 1e-14);
  CHECK_NEAR(L, 0.6209570477895321, 1e-14);  // log(1 + e^−0.15)
  // dL/dlogπ(c) = −β σ(−x), dL/dlogπ(r) = +β σ(−x)
  CHECK_NEAR(dc, -0.1 * sig(-x), 1e-15);
  CHECK_NEAR(dr, 0.1 * sig(-x), 1e-15);
}

static void test_sigmoid_with_label_smoothing_is_cdpo(void) {
  ct_dpo_loss o = one(CT_DPO_SIGMOID, 0.1, 0.1);
  double dc, dr, x = 0.15;
  double L = pair(&o, &dc, &dr);
  // −0.9 logσ(x) − 0.1 logσ(−x)
  CHECK_NEAR(L, 0.9 * nls(x) + 0.1 * nls(-x), 1e-14);
  CHECK_NEAR(L, 0.6359570477895321, 1e-14);
  double dx = -0.9 * sig(-x) + 0.1 * sig(x);
  CHECK_NEAR(dc, 0.1 * dx, 1e-15);
  CHECK_NEAR(dr, -0.1 * dx, 1e-15);
}

static void test_hinge_is_linear_below_its_kink_and_zero_above(void) {
  double dc, dr;
  ct_dpo_loss o = one(CT_DPO_HINGE, 0.1, 0);  // x = 0.15 < 1
  CHECK_NEAR(pair(&o, &dc, &dr), 1 - 0.15, 1e-14);
  CHECK_NEAR(dc, -0.1, 1e-15);
  CHECK_NEAR(dr, 0.1, 1e-15);
  o.beta = 2;  // x = 3 > 1: flat
  CHECK_NEAR(pair(&o, &dc, &dr), 0, 0);
  CHECK(dc == 0 && dr == 0);
  o.beta = 0.5;  // x = 0.75, just below
  CHECK_NEAR(pair(&o, &dc, &dr), 0.25, 1e-14);
  CHECK_NEAR(dc, -0.5, 1e-15);
  CHECK_NEAR(dr, 0.5, 1e-15);
  o.beta = 0.8;  // x = 1.2, just above
  CHECK_NEAR(pair(&o, &dc, &dr), 0, 0);
  CHECK(dc == 0 && dr == 0);
}

static void test_ipo_is_squared_length_averaged_margin(void) {
  ct_dpo_loss o = one(CT_DPO_IPO, 0.1, 0);
  double dc, dr;
  // u = ρ_c/|c| − ρ_r/|r| − 1/(2β) = 1/4 + 0.5/5 − 5 = −4.65
  double u = 1.0 / 4 + 0.5 / 5 - 1 / (2 * 0.1);
  double L = pair(&o, &dc, &dr);
  CHECK_NEAR(u, -4.65, 1e-14);
  CHECK_NEAR(L, u * u, 1e-12);
  CHECK_NEAR(L, 21.6225, 1e-12);
  CHECK_NEAR(dc, 2 * u / 4, 1e-13);   // −2.325
  CHECK_NEAR(dr, -2 * u / 5, 1e-13);  // +1.86
}

static void test_robust_matches_its_formula_with_eps_0_1(void) {
  ct_dpo_loss o = one(CT_DPO_ROBUST, 0.1, 0.1);
  double dc, dr, x = 0.15;
  double L = pair(&o, &dc, &dr);
  // [−0.9 logσ(x) + 0.1 logσ(−x)] / 0.8
  CHECK_NEAR(L, (0.9 * nls(x) - 0.1 * nls(-x)) / 0.8, 1e-14);
  CHECK_NEAR(L, 0.602207047789532, 1e-14);
  double dx = (-0.9 * sig(-x) - 0.1 * sig(x)) / 0.8;
  CHECK_NEAR(dc, 0.1 * dx, 1e-15);
  CHECK_NEAR(dr, -0.1 * dx, 1e-15);
  // eps 0 is plain DPO
  o.label_smoothing = 0;
  CHECK_NEAR(pair(&o, &dc, &dr), nls(x), 1e-14);
}

static void test_simpo_uses_mean_log_probs_gamma_and_no_reference(void) {
  ct_dpo_loss o = one(CT_DPO_SIMPO, 2, 0);
  o.simpo_gamma = 0.5;
  double dc, dr;
  // z = β (lp_c/|c| − lp_r/|r|) − γ = 2 (−2.5 + 2.4) − 0.5 = −0.7
  double z = 2 * (-10.0 / 4 - -12.0 / 5) - 0.5;
  double L = pair(&o, &dc, &dr);
  CHECK_NEAR(z, -0.7, 1e-14);
  CHECK_NEAR(L, nls(z), 1e-14);
  CHECK_NEAR(L, 1.103186048885458, 1e-14);  // log(1 + e^0.7)
  CHECK_NEAR(dc, -sig(-z) * 2 / 4, 1e-15);
  CHECK_NEAR(dr, sig(-z) * 2 / 5, 1e-15);
  // the reference log-probs do not matter
  double dc2, dr2;
  double L2 = ct_dpo_pair_loss(&o, LP_C, LP_R, 123, -456, LEN_C, LEN_R, &dc2, &dr2);
  CHECK(L2 == L && dc2 == dc && dr2 == dr);
}

static void test_sft_contributes_zero_per_pair(void) {
  ct_dpo_loss o = one(CT_DPO_SFT, 0.1, 0);
  double dc = 1, dr = 1;
  CHECK(pair(&o, &dc, &dr) == 0);
  CHECK(dc == 0 && dr == 0);
  // RPO = sigmoid + sft: per pair only the sigmoid part
  ct_dpo_loss rpo = {.n = 2, .type = {CT_DPO_SIGMOID, CT_DPO_SFT}, .weight = {1, 1}, .beta = 0.1};
  CHECK_NEAR(pair(&rpo, &dc, &dr), nls(0.15), 1e-14);
  CHECK_NEAR(dc, -0.1 * sig(-0.15), 1e-15);
}

static void test_weighted_list_sums_weighted_losses(void) {
  ct_dpo_loss o = {.n = 3, .type = {CT_DPO_SIGMOID, CT_DPO_IPO, CT_DPO_HINGE}, .weight = {0.3, 1.7, 0.5},
                   .beta = 0.1};
  double dc, dr, x = 0.15, u = -4.65;
  double L = pair(&o, &dc, &dr);
  CHECK_NEAR(L, 0.3 * nls(x) + 1.7 * u * u + 0.5 * (1 - x), 1e-12);
  CHECK_NEAR(dc, 0.3 * -0.1 * sig(-x) + 1.7 * 2 * u / 4 + 0.5 * -0.1, 1e-13);
  CHECK_NEAR(dr, 0.3 * 0.1 * sig(-x) + 1.7 * -2 * u / 5 + 0.5 * 0.1, 1e-13);
}

// βΔ = ±980: log(1 + e^980) overflows a naive formula; every loss must stay finite.
static void test_large_margins_stay_finite(void) {
  int types[] = {CT_DPO_SIGMOID,  CT_DPO_HINGE,    CT_DPO_IPO,       CT_DPO_ROBUST,   CT_DPO_SIMPO,
                 CT_DPO_SFT,      CT_DPO_EXO_PAIR, CT_DPO_NCA_PAIR,  CT_DPO_BCO_PAIR, CT_DPO_SPPO_HARD,
                 CT_DPO_APO_ZERO, CT_DPO_APO_DOWN, CT_DPO_DISCOPOP, CT_DPO_SIGMOID_NORM};
  for (int sign = -1; sign <= 1; sign += 2)
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++)
      for (int s = 0; s < 2; s++) {
        ct_dpo_loss o = one(types[k], types[k] == CT_DPO_SIMPO ? 2 : 0.1, s || types[k] == CT_DPO_EXO_PAIR ? 0.1 : 0);
        o.discopop_tau = 0.05;
        // ρ_c = big, ρ_r = −big (|c| = |r| = 1): βΔ = ±980, SimPO's z = ±19600 − γ
        double dc, dr, big = 4900.0 * sign;
        double L = ct_dpo_pair_loss(&o, -5000 + big, -5000 - big, -5000, -5000, 1, 1, &dc, &dr);
        CHECK(isfinite(L) && isfinite(dc) && isfinite(dr));
      }
  double dc, dr;
  // sigmoid, x = −980: L = 980, d_c = −β, d_r = +β
  ct_dpo_loss o = one(CT_DPO_SIGMOID, 0.1, 0);
  CHECK_NEAR(ct_dpo_pair_loss(&o, -5000, -100, -100, -5000, 7, 9, &dc, &dr), 980, 1e-9);
  CHECK_NEAR(dc, -0.1, 1e-15);
  CHECK_NEAR(dr, 0.1, 1e-15);
  // x = +980: L = 0 and no gradient
  CHECK_NEAR(ct_dpo_pair_loss(&o, -100, -5000, -5000, -100, 7, 9, &dc, &dr), 0, 1e-300);
  CHECK_NEAR(dc, 0, 1e-300);
  CHECK_NEAR(dr, 0, 1e-300);
  // cDPO: x = −980 → 0.9·980; x = +980 → 0.1·980
  o.label_smoothing = 0.1;
  CHECK_NEAR(ct_dpo_pair_loss(&o, -5000, -100, -100, -5000, 7, 9, &dc, &dr), 882, 1e-9);
  CHECK_NEAR(dc, 0.1 * -0.9, 1e-15);
  CHECK_NEAR(ct_dpo_pair_loss(&o, -100, -5000, -5000, -100, 7, 9, &dc, &dr), 98, 1e-9);
  CHECK_NEAR(dc, 0.1 * 0.1, 1e-15);
  // robust ε = 0.1: x = −980 → 0.9·980/0.8; x = +980 → −0.1·980/0.8
  o.type[0] = CT_DPO_ROBUST;
  CHECK_NEAR(ct_dpo_pair_loss(&o, -5000, -100, -100, -5000, 7, 9, &dc, &dr), 1102.5, 1e-9);
  CHECK_NEAR(dc, 0.1 * -0.9 / 0.8, 1e-15);
  CHECK_NEAR(ct_dpo_pair_loss(&o, -100, -5000, -5000, -100, 7, 9, &dc, &dr), -122.5, 1e-9);
  CHECK_NEAR(dc, 0.1 * -0.1 / 0.8, 1e-15);
  // simpo β = 2, |c| = |r| = 1: z = 2·(−5000 + 100) − 0.5 = −9800.5
  o = one(CT_DPO_SIMPO, 2, 0);
  CHECK_NEAR(ct_dpo_pair_loss(&o, -5000, -100, 0, 0, 1, 1, &dc, &dr), 9800.5, 1e-9);
  CHECK_NEAR(dc, -2, 1e-15);
  CHECK_NEAR(dr, 2, 1e-15);
}

static void test_policy_equal_to_reference_gives_log2_and_half_beta_gradients(void) {
  double betas[] = {0.1, 0.5, 2};
  for (int i = 0; i < 3; i++) {
    ct_dpo_loss o = one(CT_DPO_SIGMOID, betas[i], 0);
    double dc, dr;
    double L = ct_dpo_pair_loss(&o, -17.25, -3.5, -17.25, -3.5, 6, 2, &dc, &dr);
    CHECK(L == log(2.0));
    CHECK(dc == -betas[i] / 2);
    CHECK(dr == betas[i] / 2);
  }
}

// A small deterministic generator: uniform in [0, 1).
static unsigned long long rng = 88172645463325252ULL;
static double uniform(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0;
}

// Central differences in lp_c and lp_r (h = 1e-5) against d_c, d_r at random points.
static int check_fd(const ct_dpo_loss *o, const char *what) {
  const double h = 1e-5;
  int bad = 0, checked = 0;
  for (int it = 0; it < 200; it++) {
    double lp_c = -60 * uniform() - 0.5, lp_r = -60 * uniform() - 0.5;
    double ref_c = lp_c + 6 * (uniform() - 0.5), ref_r = lp_r + 6 * (uniform() - 0.5);
    int len_c = 1 + (int)(uniform() * 20), len_r = 1 + (int)(uniform() * 20);
    double x = o->beta * ((lp_c - ref_c) - (lp_r - ref_r));
    if (fabs(x - 1) < 1e-3) continue;  // hinge's kink: not differentiable there
    double dc, dr, t1, t2;
    ct_dpo_pair_loss(o, lp_c, lp_r, ref_c, ref_r, len_c, len_r, &dc, &dr);
    double fd_c = (ct_dpo_pair_loss(o, lp_c + h, lp_r, ref_c, ref_r, len_c, len_r, &t1, &t2) -
                   ct_dpo_pair_loss(o, lp_c - h, lp_r, ref_c, ref_r, len_c, len_r, &t1, &t2)) / (2 * h);
    double fd_r = (ct_dpo_pair_loss(o, lp_c, lp_r + h, ref_c, ref_r, len_c, len_r, &t1, &t2) -
                   ct_dpo_pair_loss(o, lp_c, lp_r - h, ref_c, ref_r, len_c, len_r, &t1, &t2)) / (2 * h);
    double tol_c = 1e-6 * fmax(fabs(dc), 1e-2), tol_r = 1e-6 * fmax(fabs(dr), 1e-2);
    checked++;
    if (!(fabs(fd_c - dc) <= tol_c) || !(fabs(fd_r - dr) <= tol_r)) {
      if (bad++ < 3)
        fprintf(stderr, "  %s: lp_c %g lp_r %g ref_c %g ref_r %g |c| %d |r| %d: d_c %.10g fd %.10g, "
                "d_r %.10g fd %.10g\n", what, lp_c, lp_r, ref_c, ref_r, len_c, len_r, dc, fd_c, dr, fd_r);
    }
  }
  return bad == 0 && checked > 150;
}

static void test_gradients_match_finite_differences_for_every_loss_type(void) {
  const char *names[] = {"sigmoid", "hinge", "ipo", "robust", "sft", "simpo"};
  double betas[] = {0.1, 0.5, 2};
  for (int type = CT_DPO_SIGMOID; type <= CT_DPO_SIMPO; type++)
    for (int b = 0; b < 3; b++)
      for (int s = 0; s < 2; s++) {
        ct_dpo_loss o = one(type, betas[b], s ? 0.1 : 0);
        char what[64];
        snprintf(what, sizeof what, "%s beta %g eps %g", names[type], betas[b], s ? 0.1 : 0.0);
        int ok = check_fd(&o, what);
        if (!ok) fprintf(stderr, "  FD mismatch: %s\n", what);
        CHECK(ok);
      }
}

// TRL's dpo_trainer.py per-pair losses, written out as its code reads in float64 (F.logsigmoid
// as log(1/(1+e^−x)), torch.sigmoid as 1/(1+e^−x)), from the policy and reference sums.
static double trl_sig(double x) { return 1 / (1 + exp(-x)); }
static double trl_logsig(double x) { return -log1p(exp(-x)); }
static double trl_pair(int type, double beta, double eps, double tau, double lp_c, double lp_r, double ref_c,
                       double ref_r, int len_c, int len_r) {
  double cs = lp_c - ref_c, rs = lp_r - ref_r, d = cs - rs, cr = beta * cs, rr = beta * rs;
  switch (type) {
    case CT_DPO_EXO_PAIR:
      return trl_sig(beta * d) * (trl_logsig(beta * d) - log1p(-eps)) +
             trl_sig(-beta * d) * (trl_logsig(-beta * d) - log(eps));
    case CT_DPO_NCA_PAIR: return -trl_logsig(cr) - 0.5 * trl_logsig(-cr) - 0.5 * trl_logsig(-rr);
    case CT_DPO_BCO_PAIR: return -trl_logsig(cr) - trl_logsig(-rr);
    case CT_DPO_SPPO_HARD: return pow(cs - 0.5 / beta, 2) + pow(rs + 0.5 / beta, 2);
    case CT_DPO_APO_ZERO: return (1 - trl_sig(beta * cs)) + trl_sig(beta * rs);
    case CT_DPO_APO_DOWN: return trl_sig(beta * cs) + (1 - trl_sig(beta * d));
    case CT_DPO_DISCOPOP: {
      double logits = d * beta, mod = trl_sig(logits / tau);
      return -trl_logsig(logits) * (1 - mod) + exp(-logits) * mod;
    }
    case CT_DPO_ORPO: {  // odds_ratio_loss on average_log_prob=True log-probs; the trainer's −losses.mean()
      double pc = lp_c / len_c, pr = lp_r / len_r;
      double log_odds = (pc - pr) - (log(1 - exp(pc)) - log(1 - exp(pr)));
      return -(beta * trl_logsig(log_odds));
    }
    case CT_DPO_CPO: {  // cpo_loss, loss_type sigmoid, alpha 0: logits = chosen − rejected (sums)
      double logits = lp_c - lp_r;
      return -trl_logsig(beta * logits) * (1 - eps) - trl_logsig(-beta * logits) * eps;
    }
    default:  // CT_DPO_SIGMOID_NORM
      return -trl_logsig(beta * (cs / len_c - rs / len_r));
  }
}

// Each of TRL's other per-pair losses (and ORPO's and CPO's pair terms, their NLL being the
// trainer's sft term): the value equals the transcription above, and d_c,
// d_r its central differences, at random pairs (margins within a few units of βΔ, where
// every term matters), for β 0.1, 0.5, 2 (exo_pair: ε 1e-3 and 0.1; discopop: τ 0.05, 1).
static void test_trls_other_pair_losses_match_its_formulas(void) {
  const int types[] = {CT_DPO_EXO_PAIR, CT_DPO_NCA_PAIR, CT_DPO_BCO_PAIR,     CT_DPO_SPPO_HARD, CT_DPO_APO_ZERO,
                       CT_DPO_APO_DOWN, CT_DPO_DISCOPOP, CT_DPO_SIGMOID_NORM, CT_DPO_ORPO,      CT_DPO_CPO};
  const double betas[] = {0.1, 0.5, 2};
  for (size_t k = 0; k < sizeof types / sizeof *types; k++)
    for (int b = 0; b < 3; b++)
      for (int v = 0; v < 2; v++) {
        double beta = betas[b], eps = v ? 0.1 : 1e-3, tau = v ? 1 : 0.05, worst = 0;
        ct_dpo_loss o = {.n = 1, .type = {types[k]}, .weight = {1}, .beta = beta, .label_smoothing = eps,
                         .discopop_tau = tau};
        for (int it = 0; it < 100; it++) {
          double lp_c = -40 * uniform() - 0.5, lp_r = -40 * uniform() - 0.5;
          double ref_c = lp_c + 4 / beta * (uniform() - 0.5), ref_r = lp_r + 4 / beta * (uniform() - 0.5);
          int len_c = 1 + (int)(uniform() * 20), len_r = 1 + (int)(uniform() * 20);
          double dc, dr, h = 1e-6;
          double L = ct_dpo_pair_loss(&o, lp_c, lp_r, ref_c, ref_r, len_c, len_r, &dc, &dr);
          double want = trl_pair(types[k], beta, eps, tau, lp_c, lp_r, ref_c, ref_r, len_c, len_r);
          double fc = (trl_pair(types[k], beta, eps, tau, lp_c + h, lp_r, ref_c, ref_r, len_c, len_r) -
                       trl_pair(types[k], beta, eps, tau, lp_c - h, lp_r, ref_c, ref_r, len_c, len_r)) / (2 * h);
          double fr = (trl_pair(types[k], beta, eps, tau, lp_c, lp_r + h, ref_c, ref_r, len_c, len_r) -
                       trl_pair(types[k], beta, eps, tau, lp_c, lp_r - h, ref_c, ref_r, len_c, len_r)) / (2 * h);
          worst = fmax(worst, fabs(L - want) / (1e-9 + fabs(want)));
          worst = fmax(worst, fmax(fabs(dc - fc), fabs(dr - fr)) / (1e-3 + fmax(fabs(fc), fabs(fr))));
        }
        if (worst > 1e-6) fprintf(stderr, "  %s beta %g: worst relative error %.3g\n", ct_dpo_loss_type_names[types[k]], beta, worst);
        CHECK(worst <= 1e-6);
      }
}


// CPOTrainer.cpo_loss as its code reads, in float64, on the log-probs concatenated_forward
// gives it (average_log_prob for ipo and simpo; alphapo is simpo): with alpha ≠ 0,
// r = (1 − p^(−alpha))/alpha, p = exp(logps); logits = r_c − r_r; simpo: logits − γ/β.
static double trl_cpo(int type, double beta, double eps, double gamma, double alpha, double lp_c, double lp_r,
                      int len_c, int len_r) {
  bool avg = type == CT_DPO_CPO_IPO || type == CT_DPO_CPO_SIMPO || type == CT_DPO_ALPHAPO;
  double c = avg ? lp_c / len_c : lp_c, r = avg ? lp_r / len_r : lp_r, logits;
  if (alpha != 0) logits = (1 - pow(exp(c), -alpha)) / alpha - (1 - pow(exp(r), -alpha)) / alpha;
  else logits = c - r;
  switch (type) {
    case CT_DPO_CPO_HINGE: return fmax(0, 1 - beta * logits);
    case CT_DPO_CPO_IPO: return pow(logits - 1 / (2 * beta), 2);
    case CT_DPO_CPO_SIMPO:
    case CT_DPO_ALPHAPO:
      logits -= gamma / beta;  // (then as sigmoid)
      /* fall through */
    default: return -trl_logsig(beta * logits) * (1 - eps) - trl_logsig(-beta * logits) * eps;
  }
}

static void test_cpo_losses_and_alphapo_match_trls_formulas(void) {
  const int types[] = {CT_DPO_CPO, CT_DPO_CPO_HINGE, CT_DPO_CPO_IPO, CT_DPO_CPO_SIMPO, CT_DPO_ALPHAPO};
  const double betas[] = {0.1, 0.5, 2}, alphas[] = {0, 0.25, -0.3};
  for (size_t k = 0; k < sizeof types / sizeof *types; k++)
    for (int b = 0; b < 3; b++)
      for (int a = 0; a < 3; a++) {
        double beta = betas[b], alpha = alphas[a], eps = a == 1 ? 0.1 : 0, gamma = 0.5, worst = 0;
        ct_dpo_loss o = {.n = 1, .type = {types[k]}, .weight = {1}, .beta = beta, .label_smoothing = eps,
                         .simpo_gamma = gamma, .alpha = alpha};
        for (int it = 0; it < 100; it++) {
          int len_c = 1 + (int)(uniform() * 20), len_r = 1 + (int)(uniform() * 20);
          double lp_c = -(0.2 + 3 * uniform()) * len_c, lp_r = -(0.2 + 3 * uniform()) * len_r;
          double dc, dr, h = 1e-6;
          if (types[k] == CT_DPO_CPO_HINGE) {  // away from the kink
            double x = alpha != 0 ? -expm1(-alpha * lp_c) / alpha + expm1(-alpha * lp_r) / alpha : lp_c - lp_r;
            if (fabs(beta * x - 1) < 1e-3) continue;
          }
          double L = ct_dpo_pair_loss(&o, lp_c, lp_r, 0, 0, len_c, len_r, &dc, &dr);
          double want = trl_cpo(types[k], beta, eps, gamma, alpha, lp_c, lp_r, len_c, len_r);
          double fc = (trl_cpo(types[k], beta, eps, gamma, alpha, lp_c + h, lp_r, len_c, len_r) -
                       trl_cpo(types[k], beta, eps, gamma, alpha, lp_c - h, lp_r, len_c, len_r)) / (2 * h);
          double fr = (trl_cpo(types[k], beta, eps, gamma, alpha, lp_c, lp_r + h, len_c, len_r) -
                       trl_cpo(types[k], beta, eps, gamma, alpha, lp_c, lp_r - h, len_c, len_r)) / (2 * h);
          worst = fmax(worst, fabs(L - want) / (1e-9 + fabs(want)));
          worst = fmax(worst, fmax(fabs(dc - fc), fabs(dr - fr)) / (1e-3 + fmax(fabs(fc), fabs(fr))));
        }
        if (worst > 1e-6)
          fprintf(stderr, "  %s beta %g alpha %g: worst relative error %.3g\n", ct_dpo_loss_type_names[types[k]], beta,
                  alpha, worst);
        CHECK(worst <= 1e-6);
      }
  // the NLL term: cpo_alpha for the cpo family, none for alphapo (TRL sets cpo_alpha 0 for it)
  ct_dpo_loss o = {.n = 2, .type = {CT_DPO_CPO_IPO, CT_DPO_ALPHAPO}, .weight = {1, 1}, .cpo_alpha = 0.5};
  CHECK(ct_dpo_sft_weight(&o) == 0.5 && !ct_dpo_needs_reference(&o));
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// TRL's aot / aot_unpaired over a batch of m pairs, as dpo_trainer.py reads: torch.sort of
// the two vectors, then −logσ(βδ)(1−ε) − logσ(−βδ)ε per position; the sum (TRL's .mean()
// times m: the trainer divides by the pairs).
static double trl_aot(int unpaired, double beta, double eps, int m, const double *lc, const double *lr,
                      const double *rc, const double *rr) {
  double u[16], v[16], L = 0;
  for (int j = 0; j < m; j++) {
    u[j] = unpaired ? lc[j] - rc[j] : lc[j] - lr[j];
    v[j] = unpaired ? lr[j] - rr[j] : rc[j] - rr[j];
  }
  qsort(u, (size_t)m, sizeof *u, cmp_dbl);
  qsort(v, (size_t)m, sizeof *v, cmp_dbl);
  for (int i = 0; i < m; i++) {
    double d = u[i] - v[i];
    L += -trl_logsig(beta * d) * (1 - eps) - trl_logsig(-beta * d) * eps;
  }
  return L;
}

// aot and aot_unpaired (with label smoothing, and beside a per-pair sigmoid term): the
// pairs' summed loss equals TRL's, and each pair's d_c, d_r its central differences, for
// batches of 1 to 12 pairs.
static void test_aot_sorts_the_batch_as_trl(void) {
  for (int unpaired = 0; unpaired < 2; unpaired++)
    for (int m = 1; m <= 12; m += 1) {
      double lc[16], lr[16], rc[16], rr[16], L[16] = {0}, dc[16] = {0}, dr[16] = {0}, beta = 0.5, eps = 0.1;
      for (int j = 0; j < m; j++) {
        lc[j] = -20 * uniform() - 1, lr[j] = -20 * uniform() - 1;
        rc[j] = lc[j] + 3 * (uniform() - 0.5), rr[j] = lr[j] + 3 * (uniform() - 0.5);
      }
      ct_dpo_loss o = {.n = 2, .type = {unpaired ? CT_DPO_AOT_UNPAIRED : CT_DPO_AOT, CT_DPO_SIGMOID},
                       .weight = {1.5, 0}, .beta = beta, .label_smoothing = eps};
      ct_dpo_batch_terms(&o, m, lc, lr, rc, rr, L, dc, dr);
      double sum = 0, worst = 0, h = 1e-6;
      for (int j = 0; j < m; j++) sum += L[j];
      double want = 1.5 * trl_aot(unpaired, beta, eps, m, lc, lr, rc, rr);
      for (int j = 0; j < m; j++)
        for (int side = 0; side < 2; side++) {
          double *x = side ? &lr[j] : &lc[j], x0 = *x;
          *x = x0 + h;
          double up = 1.5 * trl_aot(unpaired, beta, eps, m, lc, lr, rc, rr);
          *x = x0 - h;
          double dn = 1.5 * trl_aot(unpaired, beta, eps, m, lc, lr, rc, rr);
          *x = x0;
          double fd = (up - dn) / (2 * h), got = side ? dr[j] : dc[j];
          worst = fmax(worst, fabs(got - fd) / (1e-3 + fabs(fd)));
        }
      CHECK_NEAR(sum, want, 1e-9 * (1 + fabs(want)));
      if (worst > 1e-5) fprintf(stderr, "  aot%s m %d: worst gradient error %.3g\n", unpaired ? "_unpaired" : "", m, worst);
      CHECK(worst <= 1e-5);
      // the per-pair function leaves aot out entirely
      double c, r;
      ct_dpo_loss only = {.n = 1, .type = {o.type[0]}, .weight = {1}, .beta = beta};
      CHECK(ct_dpo_pair_loss(&only, lc[0], lr[0], rc[0], rr[0], 3, 4, &c, &r) == 0 && c == 0 && r == 0);
    }
}

static void test_gradients_match_finite_differences_for_weighted_lists(void) {
  ct_dpo_loss lists[] = {
      {.n = 2, .type = {CT_DPO_SIGMOID, CT_DPO_IPO}, .weight = {0.3, 1.7}, .beta = 0.1},
      {.n = 2, .type = {CT_DPO_HINGE, CT_DPO_ROBUST}, .weight = {0.3, 1.7}, .beta = 0.5, .label_smoothing = 0.1},
      {.n = 2, .type = {CT_DPO_SIMPO, CT_DPO_SFT}, .weight = {0.3, 1.7}, .beta = 2, .simpo_gamma = 0.5},
      {.n = 6,
       .type = {CT_DPO_SIGMOID, CT_DPO_HINGE, CT_DPO_IPO, CT_DPO_ROBUST, CT_DPO_SFT, CT_DPO_SIMPO},
       .weight = {0.3, 1.7, 0.3, 1.7, 0.3, 1.7},
       .beta = 0.1,
       .label_smoothing = 0.1,
       .simpo_gamma = 0.5},
  };
  for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) {
    char what[32];
    snprintf(what, sizeof what, "list %zu", i);
    CHECK(check_fd(&lists[i], what));
  }
}


// TRL's KTOTrainer._compute_loss for one micro-batch, as its code reads, in float64: kl =
// clamp(mean(KL_logps − ref_KL_logps), 0) (detached), the desirable examples' losses
// 1 − σ(β(ρ − kl)) (kto) or 1 − σ(βρ) (apo_zero_unpaired), the undesirable ones' 1 − σ(β(kl − ρ))
// or σ(βρ), cat(w_d·chosen, w_u·rejected).nanmean().
static double trl_kto(bool apo, double beta, double wd, double wu, int m, const double *lp, const double *ref,
                      const bool *label, double kl) {
  double chosen[16], rejected[16];
  int nc = 0, nr = 0;
  for (int i = 0; i < m; i++) {
    double lr = lp[i] - ref[i];
    if (label[i]) chosen[nc++] = apo ? 1 - trl_sig(beta * lr) : 1 - trl_sig(beta * (lr - kl));
    else rejected[nr++] = apo ? trl_sig(beta * lr) : 1 - trl_sig(beta * (kl - lr));
  }
  double sum = 0;
  for (int i = 0; i < nc; i++) sum += wd * chosen[i];
  for (int i = 0; i < nr; i++) sum += wu * rejected[i];
  return sum / (nc + nr);
}

static void test_kto_losses_match_trls_formula_and_its_gradient(void) {
  const double h = 1e-6;
  int bad = 0, checked = 0;
  for (int it = 0; it < 60; it++) {
    bool apo = it % 2;
    int m = 2 + it % 7;
    double beta = it % 3 == 0 ? 0.1 : it % 3 == 1 ? 0.5 : 2, wd = 0.5 + uniform(), wu = 0.5 + 1.5 * uniform();
    double lp[16], ref[16], kl_rows[16], kl = 0;
    bool label[16];
    for (int i = 0; i < m; i++) {
      lp[i] = -40 * uniform() - 0.5, ref[i] = lp[i] + 8 * (uniform() - 0.5), label[i] = uniform() < 0.5;
      kl_rows[i] = 6 * (uniform() - 0.3);  // KL_logps − ref_KL_logps of the mismatched rows
      kl += kl_rows[i] / m;
    }
    kl = kl > 0 ? kl : 0;  // .clamp(min=0)
    ct_dpo_loss o = {.n = 1, .type = {apo ? CT_DPO_APO_ZERO_UNPAIRED : CT_DPO_KTO}, .weight = {1}, .beta = beta,
                     .desirable_weight = wd, .undesirable_weight = wu};
    double ours = 0, d[16];
    for (int i = 0; i < m; i++) ours += ct_dpo_kto_loss(&o, label[i], lp[i], ref[i], kl, &d[i]) / m;
    double want = trl_kto(apo, beta, wd, wu, m, lp, ref, label, kl);
    if (!(fabs(ours - want) <= 1e-12 * fmax(1, fabs(want)))) {
      if (bad++ < 3) fprintf(stderr, "  %s m %d: loss %.15g, TRL's %.15g\n", apo ? "apo_zero_unpaired" : "kto", m, ours, want);
    }
    for (int i = 0; i < m; i++) {  // TRL's gradient: the kl term is detached, so only lp[i] moves
      double keep = lp[i];
      lp[i] = keep + h;
      double up = trl_kto(apo, beta, wd, wu, m, lp, ref, label, kl);
      lp[i] = keep - h;
      double down = trl_kto(apo, beta, wd, wu, m, lp, ref, label, kl);
      lp[i] = keep;
      double fd = (up - down) / (2 * h), g = d[i] / m;
      checked++;
      if (!(fabs(fd - g) <= 1e-6 * fmax(fabs(g), 1e-3)) && bad++ < 3)  // (h = 1e-6: roundoff ~1e-10)
        fprintf(stderr, "  %s example %d: d %.10g, TRL's by differences %.10g\n", apo ? "apo" : "kto", i, g, fd);
    }
  }
  CHECK(bad == 0 && checked > 200);
  // policy = reference and no KL: every example's loss is 1/2 of its weight, as TRL's first step
  ct_dpo_loss o = {.n = 1, .type = {CT_DPO_KTO}, .weight = {1}, .beta = 0.1, .desirable_weight = 2,
                   .undesirable_weight = 1};
  double dd;
  CHECK_NEAR(ct_dpo_kto_loss(&o, true, -5, -5, 0, &dd), 1.0, 1e-15);
  CHECK_NEAR(dd, -2 * 0.1 * 0.25, 1e-15);
  CHECK_NEAR(ct_dpo_kto_loss(&o, false, -5, -5, 0, &dd), 0.5, 1e-15);
  CHECK_NEAR(dd, 0.1 * 0.25, 1e-15);
  CHECK(ct_dpo_unpaired(&o) && ct_dpo_kto_kl(&o));
  o.type[0] = CT_DPO_APO_ZERO_UNPAIRED;
  CHECK(ct_dpo_unpaired(&o) && !ct_dpo_kto_kl(&o));
  o.type[0] = CT_DPO_APO_ZERO;
  CHECK(!ct_dpo_unpaired(&o) && !ct_dpo_kto_kl(&o));
}

static void test_needs_reference_is_false_only_for_simpo_orpo_cpo_and_sft_lists(void) {
  for (int type = 0; type < CT_DPO_COUNT; type++) {
    ct_dpo_loss o = one(type, 0.1, 0);
    bool free = type == CT_DPO_SIMPO || type == CT_DPO_SFT || type == CT_DPO_ORPO || ct_dpo_is_cpo(type);
    CHECK(ct_dpo_needs_reference(&o) == !free);
  }
  ct_dpo_loss o = {.n = 2, .type = {CT_DPO_SIMPO, CT_DPO_SFT}, .weight = {1, 1}};
  CHECK(!ct_dpo_needs_reference(&o));
  o.type[1] = CT_DPO_HINGE;
  CHECK(ct_dpo_needs_reference(&o));
  o = (ct_dpo_loss){.n = 2, .type = {CT_DPO_SFT, CT_DPO_SIGMOID}, .weight = {1, 1}};  // RPO
  CHECK(ct_dpo_needs_reference(&o));
}

static void test_sft_weight_sums_sft_terms_and_is_zero_without_them(void) {
  ct_dpo_loss o = {.n = 2, .type = {CT_DPO_SIGMOID, CT_DPO_SFT}, .weight = {1, 0.25}};
  CHECK(ct_dpo_sft_weight(&o) == 0.25);
  o.type[1] = CT_DPO_IPO;
  CHECK(ct_dpo_sft_weight(&o) == 0);
  o = (ct_dpo_loss){.n = 3, .type = {CT_DPO_SFT, CT_DPO_SIMPO, CT_DPO_SFT}, .weight = {0.5, 1, 0.75}};
  CHECK(ct_dpo_sft_weight(&o) == 1.25);
  // ORPO's NLL weighs 1, CPO's cpo_alpha (each times the entry's weight)
  o = (ct_dpo_loss){.n = 2, .type = {CT_DPO_ORPO, CT_DPO_CPO}, .weight = {0.5, 2}, .cpo_alpha = 0.25};
  CHECK(ct_dpo_sft_weight(&o) == 1.0);
}

// config validates loss_type against one union list; it must be DPO's names then GRPO's.
static void test_config_loss_type_union_is_dpo_then_grpo_names(void) {
  int k = 0;
  for (int i = 0; ct_dpo_loss_type_names[i]; i++, k++)
    CHECK(ct_loss_type_names[k] && !strcmp(ct_loss_type_names[k], ct_dpo_loss_type_names[i]));
  for (int i = 0; ct_grpo_loss_type_names[i]; i++, k++)
    CHECK(ct_loss_type_names[k] && !strcmp(ct_loss_type_names[k], ct_grpo_loss_type_names[i]));
  CHECK(ct_loss_type_names[k] == NULL);
  // and each trainer's own list (what its loss_type accepts) is its names, in order
  for (k = 0; ct_dpo_loss_type_names[k]; k++)
    CHECK(ct_dpo_loss_choices[k] && !strcmp(ct_dpo_loss_choices[k], ct_dpo_loss_type_names[k]));
  CHECK(ct_dpo_loss_choices[k] == NULL);
  for (k = 0; ct_grpo_loss_type_names[k]; k++)
    CHECK(ct_grpo_loss_choices[k] && !strcmp(ct_grpo_loss_choices[k], ct_grpo_loss_type_names[k]));
  CHECK(ct_grpo_loss_choices[k] == NULL);
}

int main(void) {
  RUN(test_sigmoid_matches_minus_log_sigmoid_of_beta_delta);
  RUN(test_sigmoid_with_label_smoothing_is_cdpo);
  RUN(test_hinge_is_linear_below_its_kink_and_zero_above);
  RUN(test_ipo_is_squared_length_averaged_margin);
  RUN(test_robust_matches_its_formula_with_eps_0_1);
  RUN(test_simpo_uses_mean_log_probs_gamma_and_no_reference);
  RUN(test_sft_contributes_zero_per_pair);
  RUN(test_weighted_list_sums_weighted_losses);
  RUN(test_large_margins_stay_finite);
  RUN(test_policy_equal_to_reference_gives_log2_and_half_beta_gradients);
  RUN(test_gradients_match_finite_differences_for_every_loss_type);
  RUN(test_gradients_match_finite_differences_for_weighted_lists);
  RUN(test_trls_other_pair_losses_match_its_formulas);
  RUN(test_cpo_losses_and_alphapo_match_trls_formulas);
  RUN(test_aot_sorts_the_batch_as_trl);
  RUN(test_kto_losses_match_trls_formula_and_its_gradient);
  RUN(test_needs_reference_is_false_only_for_simpo_orpo_cpo_and_sft_lists);
  RUN(test_sft_weight_sums_sft_terms_and_is_zero_without_them);
  RUN(test_config_loss_type_union_is_dpo_then_grpo_names);
  return test_summary();
}
