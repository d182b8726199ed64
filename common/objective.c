// objective: GRPO's per-token objective and its coefficients (objective.h).
#include "objective.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "dist.h"
#include "error.h"

const char *const ct_grpo_loss_type_names[] = {"grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "vespo", NULL};
static const int kind_policy[] = {CT_GRPO_POLICY_CLIP,  CT_GRPO_POLICY_CLIP, CT_GRPO_POLICY_CLIP,
                                  CT_GRPO_POLICY_CLIP,  CT_GRPO_POLICY_CISPO, CT_GRPO_POLICY_SAPO,
                                  CT_GRPO_POLICY_VESPO};
static const int kind_agg[] = {CT_GRPO_AGG_GRPO, CT_GRPO_AGG_BNPO, CT_GRPO_AGG_DR_GRPO, CT_GRPO_AGG_DAPO,
                               CT_GRPO_AGG_DAPO, CT_GRPO_AGG_GRPO, CT_GRPO_AGG_DAPO};
_Static_assert(sizeof ct_grpo_loss_type_names / sizeof *ct_grpo_loss_type_names == sizeof kind_policy / sizeof *kind_policy + 1 &&
               sizeof kind_policy == sizeof kind_agg, "a policy and a weighting for every loss_type");

int ct_grpo_loss_kind(const char *loss_type, int *policy, int *agg) {
  for (int i = 0; ct_grpo_loss_type_names[i]; i++)
    if (!strcmp(loss_type, ct_grpo_loss_type_names[i])) return *policy = kind_policy[i], *agg = kind_agg[i], 0;
  return -1;
}

int ct_grpo_objective_of(const ct_config *c, bool use_ref, ct_grpo_objective *o, int *agg) {
  const char *where = ct_config_origin(c, "loss_type");
  if (c->loss_type.n != 1)
    return ct_set_error(CT_ECONFIG, "%s: key 'loss_type': GRPO takes one loss_type (grpo, bnpo, dr_grpo, dapo, "
                        "cispo or sapo)", where);
  memset(o, 0, sizeof *o);
  if (ct_grpo_loss_kind(c->loss_type.v[0], &o->policy, agg))
    return ct_set_error(CT_ECONFIG, "%s: key 'loss_type': '%s' is no GRPO loss", where, c->loss_type.v[0]);
  const char *lt = c->loss_type.v[0];
  static const char *const vespo_keys[] = {"vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"};
  for (int i = 0; i < 4; i++)
    if (o->policy != CT_GRPO_POLICY_VESPO && ct_config_is_set(c, vespo_keys[i]))
      return ct_set_error(CT_ECONFIG, "%s: key '%s': vespo's weighting takes it, and loss_type is %s",
                          ct_config_origin(c, vespo_keys[i]), vespo_keys[i], lt);
  static const char *const sapo_keys[] = {"sapo_temperature_pos", "sapo_temperature_neg"};
  for (int i = 0; i < 2; i++)  // keys that would do nothing are refused, naming why
    if (o->policy != CT_GRPO_POLICY_SAPO && ct_config_is_set(c, sapo_keys[i]))
      return ct_set_error(CT_ECONFIG, "%s: key '%s': sapo's gate takes it, and loss_type is %s",
                          ct_config_origin(c, sapo_keys[i]), sapo_keys[i], lt);
  if (o->policy != CT_GRPO_POLICY_CLIP && c->delta > 0)
    return ct_set_error(CT_ECONFIG, "%s: key 'delta': caps the clipped surrogate's ratio (loss_type grpo, bnpo, "
                        "dr_grpo, dapo), and loss_type is %s", ct_config_origin(c, "delta"), lt);
  static const char *const isc_keys[] = {"vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
                                         "vllm_importance_sampling_clip_min"};
  for (int i = 0; i < 3; i++)
    if (!c->vllm_importance_sampling_correction && ct_config_is_set(c, isc_keys[i]))
      return ct_set_error(CT_ECONFIG, "%s: key '%s': shapes the sampler correction, and "
                          "vllm_importance_sampling_correction is false", ct_config_origin(c, isc_keys[i]), isc_keys[i]);
  if (c->use_bias_correction_kl && !(c->beta > 0))
    return ct_set_error(CT_ECONFIG, "%s: key 'use_bias_correction_kl': scales the KL term, and beta is 0",
                        ct_config_origin(c, "use_bias_correction_kl"));
  o->clip = (ct_grpo_clip){c->epsilon, c->epsilon_high > 0 ? c->epsilon_high : c->epsilon, use_ref ? c->beta : 0};
  o->sequence = c->importance_sampling_level == CT_IS_SEQUENCE;
  o->delta = c->delta;
  o->tau_pos = c->sapo_temperature_pos;
  o->tau_neg = c->sapo_temperature_neg;
  o->bias_kl = c->use_bias_correction_kl;
  o->opm = c->off_policy_mask_threshold > 0;
  o->opm_threshold = c->off_policy_mask_threshold;
  o->isc = c->vllm_importance_sampling_correction ? c->vllm_importance_sampling_mode : -1;
  o->isc_min = c->vllm_importance_sampling_clip_min;
  o->isc_max = c->vllm_importance_sampling_clip_max;
  o->top_entropy = c->top_entropy_quantile;
  o->k_pos = c->vespo_k_pos, o->lambda_pos = c->vespo_lambda_pos;
  o->k_neg = c->vespo_k_neg, o->lambda_neg = c->vespo_lambda_neg;
  if (o->policy == CT_GRPO_POLICY_VESPO && (o->isc == CT_ISC_SEQUENCE_TRUNCATE || o->isc == CT_ISC_SEQUENCE_MASK))
    return ct_set_error(CT_ECONFIG, "%s: key 'vllm_importance_sampling_mode': vespo folds a token_ correction "
                        "into its weight (token_truncate or token_mask), as TRL requires",
                        ct_config_origin(c, "vllm_importance_sampling_mode"));
  if (o->isc >= 0 && !(o->isc_min <= o->isc_max))
    return ct_set_error(CT_ECONFIG, "%s: key 'vllm_importance_sampling_clip_min': %g is above "
                        "vllm_importance_sampling_clip_max %g", ct_config_origin(c, "vllm_importance_sampling_clip_min"),
                        o->isc_min, o->isc_max);
  return 0;
}

bool ct_grpo_needs_whole(const ct_grpo_objective *o) {
  return o->sequence || o->opm || o->policy == CT_GRPO_POLICY_VESPO || o->isc == CT_ISC_SEQUENCE_TRUNCATE || o->isc == CT_ISC_SEQUENCE_MASK ||
         o->top_entropy < 1;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

double ct_grpo_quantile(float *x, long n, double q) {
  if (n <= 0) return -INFINITY;
  qsort(x, (size_t)n, sizeof *x, cmp_float);
  double pos = q * (double)(n - 1);
  long lo = (long)floor(pos);
  if (lo >= n - 1) return x[n - 1];
  return x[lo] + (pos - (double)lo) * ((double)x[lo + 1] - x[lo]);
}

int ct_grpo_entropy_threshold(const ct_grpo_objective *o, const float *ent, long n, double *threshold) {
  int world = ct_dist_world(), rank = ct_dist_rank();
  long most = ct_dist_max_int((int)n);  // every rank's count, then every rank's values in its slot
  float *all = calloc((size_t)(world * most + world), sizeof *all);
  if (!all) return ct_set_error(CT_ENOMEM, "out of memory for the entropy quantile");
  float *counts = all + world * most;  // (world)
  counts[rank] = (float)n;
  if (n) memcpy(all + rank * most, ent, sizeof(float) * n);
  int rc = ct_dist_sum_f32(all, (world * most + world));
  long total = 0;
  for (int r = 0; !rc && r < world; r++) {  // packed to the front, in rank order
    long k = (long)counts[r];
    memmove(all + total, all + r * most, sizeof(float) * k);
    total += k;
  }
  if (!rc) *threshold = ct_grpo_quantile(all, total, 1 - o->top_entropy);
  free(all);
  return rc;
}

// The sampler correction's ratio for a log-ratio x = old − q (summed over the completion in
// sequence_ modes).
static double correction(const ct_grpo_objective *o, double x) {
  double r = exp(x);
  if (o->isc == CT_ISC_TOKEN_TRUNCATE || o->isc == CT_ISC_SEQUENCE_TRUNCATE)
    return r < o->isc_min ? o->isc_min : r > o->isc_max ? o->isc_max : r;
  return r < o->isc_min || r > o->isc_max ? 0 : r;
}

static void note_max(double *m, double v) {
  if (v > *m) *m = v;
}

// The clip or sapo policy term p(s) at importance weight s, and *dp = dp/ds.
static double policy_term(const ct_grpo_objective *o, double s, double A, double *dp) {
  if (o->policy == CT_GRPO_POLICY_SAPO) {
    double tau = A > 0 ? o->tau_pos : o->tau_neg, g = 1 / (1 + exp(-tau * (s - 1)));
    *dp = -4 * g * (1 - g) * A;
    return -g * 4 / tau * A;
  }
  double lo = 1 - o->clip.eps_low, hi = 1 + o->clip.eps_high;
  double c = s < lo ? lo : s > hi ? hi : s, dc = s >= lo && s <= hi;  // clamp passes the gradient on its bounds
  double s1 = s, d1 = 1;
  if (o->delta > 0 && s > o->delta) s1 = o->delta, d1 = 0;
  double u = s1 * A, v = c * A;
  *dp = u < v ? -A * d1 : v < u ? -A * dc : -A * 0.5 * (d1 + dc);
  return u <= v ? -u : -v;
}

typedef struct {
  double l;   // ℓ_t
  double d;   // ∂ℓ_t/∂lp_t through the token's own terms (cispo's lp_t, the KL's)
  double ds;  // ∂ℓ_t/∂s
} token_terms;

// Token t's terms at importance weight s and sampler correction cr (1: none); info (when
// not NULL) counts it.
static token_terms terms(const ct_grpo_objective *o, double s, double cr, double A, double lp, const double *ref,
                         bool keep, bool high, double phi, ct_grpo_span_info *info) {
  token_terms r = {0, 0, 0};
  double eh = o->clip.eps_high, el = o->clip.eps_low;
  if (o->policy == CT_GRPO_POLICY_VESPO) {  // φ carries no gradient; the correction is in it
    r.l = -phi * A * lp;
    r.d = -phi * A;
    cr = 1;
  } else if (o->policy == CT_GRPO_POLICY_CISPO) {
    double cap = s < eh ? s : eh;  // no gradient through it
    r.l = -cap * A * lp;
    r.d = -cap * A;
  } else {
    r.l = policy_term(o, s, A, &r.ds);
  }
  if (!keep || !high) r.l = r.d = r.ds = 0;
  r.l *= cr, r.d *= cr, r.ds *= cr;
  if (info) {
    if (o->policy == CT_GRPO_POLICY_CISPO) info->cispo_clipped += s > eh && A > 0;
    else info->clipped_low += s < 1 - el && A < 0, info->clipped_high += s > 1 + eh && A > 0;
    if (o->policy == CT_GRPO_POLICY_VESPO) info->phi_sum += phi;
    info->masked += !keep;
    info->low_entropy += !high;
  }
  if (ref) {  // β·k_t, times s with use_bias_correction_kl
    double x = *ref - lp, e = exp(x), k = e - x - 1, f = o->bias_kl ? s : 1;
    if (info) info->kl += k;
    r.l += o->clip.beta * k * f;
    r.d += o->clip.beta * (1 - e) * f;
    if (o->bias_kl) r.ds += o->clip.beta * k;
  }
  return r;
}

// VESPO's sequence weight φ (TRL's get_gamma_weights): from the clamped log-ratios' sum and,
// with a token_ correction (q given), the clamped logs of its ratios.
static double vespo_phi(const ct_grpo_objective *o, int n, const float *lp, const float *old, const float *q,
                        double A) {
  const double lo = log(1e-8);
  double sl = 0;
  for (int t = 0; t < n; t++) {
    sl += fmin(fmax((double)lp[t] - old[t], -20.0), 20.0);
    if (q) {
      double c = correction(o, (double)old[t] - q[t]), lc = c > 0 ? log(c) : lo;
      sl += fmin(fmax(lc, lo), 20.0);
    }
  }
  double lw = fmin(fmax(sl, lo), 20.0), w = exp(lw);
  double k = A >= 0 ? o->k_pos : o->k_neg, lam = fmax(A >= 0 ? o->lambda_pos : o->lambda_neg, 1e-4);
  double phi = exp(lam + k * lw - lam * w);
  return isfinite(phi) ? phi : 0;
}

// Whether token t is among the micro-batch's high-entropy ones (every token with
// top_entropy_quantile 1): TRL's entropies ≥ the threshold, compared in float32.
static bool high(const ct_grpo_micro *m, const float *ent, int t) {
  return m->obj.top_entropy >= 1 || ent[t] >= (float)m->entropy_threshold;
}

double ct_grpo_span_loss(const ct_grpo_micro *m, int seq_len, int n, const float *lp, const float *old,
                         const float *ent, const float *ref, const float *q, double A, float *coef,
                         ct_grpo_span_info *info, ct_grpo_span_max *mx) {
  const ct_grpo_objective *o = &m->obj;
  double w = ct_grpo_token_weight(m->agg, m->counts, seq_len, m->micro_tokens, m->max_completion_length);
  if (!(o->clip.beta > 0)) ref = NULL;
  bool isc = o->isc >= 0 && q, isc_seq = isc && (o->isc == CT_ISC_SEQUENCE_TRUNCATE || o->isc == CT_ISC_SEQUENCE_MASK);
  double dn = n > 0 ? n : 1;  // TRL's mask.sum(-1).clamp(min=1)
  // the completion-wide quantities: GSPO's weight s, the off-policy mask, the sequence_
  // correction, and Σ_t w·∂ℓ_t/∂s (which reaches every lp_t through ∂s/∂lp_t = s/n)
  double s_seq = 1, cr_seq = 1, shared = 0;
  bool keep = true;
  if (ct_grpo_needs_whole(o)) {
    double sr = 0, sq = 0, sd = 0;
    for (int t = 0; t < n; t++) {
      sr += (double)lp[t] - old[t], sq += (double)(q ? q[t] : old[t]) - lp[t];
      if (q) sd += (double)old[t] - q[t];
    }
    s_seq = exp(sr / dn);
    keep = !o->opm || A >= 0 || sq / dn <= o->opm_threshold;
    if (isc_seq) {
      cr_seq = correction(o, sd);
      info->is_sum += cr_seq, info->is_n += 1;
      if (mx) note_max(&mx->is_max, cr_seq), note_max(&mx->is_neg_min, -cr_seq);
    }
  }
  double phi = o->policy == CT_GRPO_POLICY_VESPO ? vespo_phi(o, n, lp, old, isc && !isc_seq ? q : NULL, A) : 0;
  double rt;  // ref[t] in double
  if (o->sequence)
    for (int t = 0; t < n; t++) {
      double cr = isc && !isc_seq ? correction(o, (double)old[t] - q[t]) : cr_seq;
      shared += w * terms(o, s_seq, cr, A, lp[t], ref ? (rt = ref[t], &rt) : NULL, keep, high(m, ent, t), phi, NULL).ds;
    }
  double loss = 0;
  for (int t = 0; t < n; t++) {
    double s = o->sequence ? s_seq : exp((double)lp[t] - old[t]), cr = cr_seq;
    if (q) {
      double diff = fabs((double)old[t] - q[t]);
      info->lp_diff += diff, info->lp_diff_n += 1;
      if (mx) note_max(&mx->lp_diff_max, diff);
    }
    if (isc && !isc_seq) {
      cr = correction(o, (double)old[t] - q[t]);
      info->is_sum += cr, info->is_n += 1;
      if (mx) note_max(&mx->is_max, cr), note_max(&mx->is_neg_min, -cr);
    }
    token_terms r = terms(o, s, cr, A, lp[t], ref ? (rt = ref[t], &rt) : NULL, keep, high(m, ent, t), phi, info);
    loss += w * r.l;
    double g = o->sequence ? shared * s_seq / dn : w * r.ds * s;  // through s
    coef[t] = (float)(-(w * r.d + g));
  }
  return loss;
}

double ct_grpo_token_loss(const ct_grpo_clip *c, double lp, double old, double ref, double A, double *d,
                          ct_grpo_token_info *info) {
  ct_grpo_objective o = {.clip = *c, .isc = -1, .top_entropy = 1};
  ct_grpo_span_info si = {0};
  double s = exp(lp - old);
  token_terms r = terms(&o, s, 1, A, lp, c->beta > 0 ? &ref : NULL, true, true, 0, &si);
  *d = r.d + r.ds * s;
  info->kl = si.kl;
  info->clipped_low = si.clipped_low > 0;
  info->clipped_high = si.clipped_high > 0;
  return r.l;
}
