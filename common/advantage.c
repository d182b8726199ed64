// advantage: reward sums, group advantages (group_norm, rloo, reinforce_baseline and
// the whitening the last two use) and each loss_type's token weight (the per-token
// objective is objective.c's). Rollouts and batching are the trainer's.
#include "advantage.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "config.h"
#include "dist.h"
#include "error.h"


void ct_grpo_total_rewards(const double *R, int n, int K, const double *w, double *r) {
  for (int i = 0; i < n; i++) {
    double s = 0;
    for (int k = 0; k < K; k++) {
      double v = R[(long)i * K + k];
      if (v == v) s += (w ? w[k] : 1.0) * v;  // NaN: left out
    }
    r[i] = s;
  }
}

double ct_grpo_group_std(const double *x, int G, double *mean) {
  double m = 0, var = 0;
  for (int i = 0; i < G; i++) m += x[i];
  m /= G;
  for (int i = 0; i < G; i++) var += (x[i] - m) * (x[i] - m);
  *mean = m;
  return G > 1 ? sqrt(var / (G - 1)) : 0;
}

static bool all_equal(const double *x, int G) {
  bool same = true;
  for (int i = 1; i < G; i++) same &= x[i] == x[0];
  return same;
}

// nanmean (*mean) and Bessel-corrected nanstd of one group's rewards, NaNs (unscorable)
// left out; *count gets how many are not NaN. The std is NaN below two values, as TRL's.
static double group_nanstd(const double *x, int G, double *mean, int *count) {
  double m = 0, var = 0;
  int c = 0;
  for (int i = 0; i < G; i++)
    if (x[i] == x[i]) m += x[i], c++;
  m = c ? m / c : NAN;
  for (int i = 0; i < G; i++)
    if (x[i] == x[i]) var += (x[i] - m) * (x[i] - m);
  *mean = m, *count = c;
  return c > 1 ? sqrt(var / (c - 1)) : NAN;
}

int ct_grpo_advantages(const double *r, int groups, int G, int scale, double batch_std, double *adv) {
  int zero = 0;
  for (int g = 0; g < groups; g++) {
    const double *x = r + (long)g * G;
    int c, k = 0;
    double mean, std = group_nanstd(x, G, &mean, &c), first = NAN;
    bool same = c > 1;  // (TRL's isclose(std, 0): not for a std of NaN)
    for (int i = 0; i < G; i++)
      if (x[i] == x[i]) same &= k++ == 0 ? (first = x[i], true) : x[i] == first;
    zero += same;
    double div = scale == CT_SCALE_GROUP ? std + 1e-4 : scale == CT_SCALE_BATCH ? batch_std + 1e-4 : 1.0;
    for (int i = 0; i < G; i++) {
      double a = same ? 0.0 : (x[i] - mean) / div;
      adv[(long)g * G + i] = a == a ? a : 0.0;  // an unscorable completion (and a lone score's NaN): 0
    }
  }
  return zero;
}

int ct_grpo_rloo(const double *r, int groups, int G, double *adv) {
  int zero = 0;
  for (int g = 0; g < groups; g++) {
    const double *x = r + (long)g * G;
    double sum = 0;
    for (int i = 0; i < G; i++) sum += x[i];
    bool same = all_equal(x, G);
    zero += same;
    for (int i = 0; i < G; i++) adv[(long)g * G + i] = same ? 0.0 : x[i] - (sum - x[i]) / (G - 1);
  }
  return zero;
}

int ct_grpo_group_baseline(const double *r, int groups, int G, double *adv) {
  int zero = 0;
  for (int g = 0; g < groups; g++) {
    const double *x = r + (long)g * G;
    double mean;
    ct_grpo_group_std(x, G, &mean);
    bool same = all_equal(x, G);
    zero += same;
    for (int i = 0; i < G; i++) adv[(long)g * G + i] = same ? 0.0 : x[i] - mean;
  }
  return zero;
}

// Σ w_i·(a_i − c)^p for p = 0, 1, 2 into s[0..2] (w NULL: 1 each).
static void weighted_moments(const double *a, const double *w, int n, double c, double s[3]) {
  s[0] = s[1] = s[2] = 0;
  for (int i = 0; i < n; i++) {
    double wi = w ? w[i] : 1.0, d = a[i] - c;
    s[0] += wi, s[1] += wi * d, s[2] += wi * d * d;
  }
}

int ct_grpo_whiten(double *adv, const double *w, int n, int kind) {
  bool tokens = kind == CT_WHITEN_TOKENS;
  double s[3];
  int rc;
  // two passes (the mean, then squares about it): no cancellation in Σa² − (Σa)²/N
  weighted_moments(adv, tokens ? w : NULL, n, 0, s);
  if ((rc = ct_dist_sum_f64(s, 3))) return rc;
  if (s[0] <= 0) return 0;
  double mean = s[1] / s[0], count = s[0];
  weighted_moments(adv, tokens ? w : NULL, n, mean, s);
  if ((rc = ct_dist_sum_f64(s, 3))) return rc;
  double div = tokens ? sqrt(fmax(s[2] / count, 1e-8)) : (count > 1 ? sqrt(s[2] / (count - 1)) : 0) + 1e-4;
  for (int i = 0; i < n; i++) adv[i] = (adv[i] - mean) / div;
  return 0;
}

int ct_grpo_normalize_then_sum(const double *R, int groups, int G, int K, const double *w, double *r, double *adv) {
  int n = groups * G;
  for (int i = 0; i < n; i++) r[i] = 0;
  for (int p = 0; p < groups; p++)
    for (int k = 0; k < K; k++) {
      double m = 0, c = 0, v = 0;
      for (int i = p * G; i < (p + 1) * G; i++)
        if (R[(long)i * K + k] == R[(long)i * K + k]) m += R[(long)i * K + k], c += 1;
      m /= c;
      for (int i = p * G; i < (p + 1) * G; i++)
        if (R[(long)i * K + k] == R[(long)i * K + k]) v += (R[(long)i * K + k] - m) * (R[(long)i * K + k] - m);
      double sd = sqrt(v / c * (c / (c - 1)));  // TRL's nanstd: NaN for one value
      for (int i = p * G; i < (p + 1) * G; i++) {
        double z = (R[(long)i * K + k] - m) / (sd + 1e-4);
        if (z == z) r[i] += (w ? w[k] : 1.0) * z;  // nansum
      }
    }
  int kept = 0;
  double *x = malloc(sizeof(double) * (n > 0 ? n : 1));
  if (!x) return ct_set_error(CT_ENOMEM, "out of memory");
  for (int i = 0; i < n; i++) {
    bool any = false;
    for (int k = 0; k < K; k++) any |= R[(long)i * K + k] == R[(long)i * K + k];
    if (!any) r[i] = NAN;  // unscorable
    else x[kept++] = r[i];
  }
  int rc = ct_grpo_whiten(x, NULL, kept, CT_WHITEN_COMPLETIONS);  // over every rank's
  for (int i = 0, j = 0; i < n; i++) adv[i] = r[i] == r[i] ? x[j++] : 0;
  free(x);
  return rc;
}

double ct_grpo_token_weight(int agg, const ct_grpo_counts *c, int seq_len, double micro_tokens,
                            int max_completion_length) {
  switch (agg) {
    case CT_GRPO_AGG_GRPO: return 1.0 / (c->sequences * seq_len);
    case CT_GRPO_AGG_BNPO: return 1.0 / (c->micro_batches * micro_tokens);
    case CT_GRPO_AGG_DR_GRPO: return 1.0 / (c->sequences * (double)max_completion_length);
    default: return 1.0 / c->tokens;
  }
}
