// dpo/loss: each preference loss of one pair and its derivatives with respect to the
// policy's summed log-probs, in double. Batching and the sft term are the trainer's.
#include "dpo/loss.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>

const char *const ct_dpo_loss_type_names[] = {"sigmoid",  "hinge",    "ipo",       "robust",   "sft",
                                              "simpo",    "exo_pair", "nca_pair",  "bco_pair", "sppo_hard",
                                              "apo_zero", "apo_down", "discopop", "sigmoid_norm", "orpo",
                                              "cpo",      "aot",      "aot_unpaired", "kto",
                                              "apo_zero_unpaired", "cpo_hinge", "cpo_ipo", "cpo_simpo",
                                              "alphapo", NULL};
_Static_assert(sizeof ct_dpo_loss_type_names / sizeof *ct_dpo_loss_type_names == CT_DPO_COUNT + 1,
               "ct_dpo_loss_type_names must name every CT_DPO_* value");

// log σ(x), stable for large |x|
static double log_sigmoid(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }
static double sigmoid(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }

// log(1 − e^x) for x < 0, accurate at both ends (Mächler's log1mexp)
static double log1mexp(double x) { return x > -M_LN2 ? log(-expm1(x)) : log1p(-exp(x)); }

// σ'(x) = σ(x)·σ(−x)
static double dsigmoid(double x) { return sigmoid(x) * sigmoid(-x); }

// The losses of TRL's that read x_c = β·ρ_c and x_r = β·ρ_r apart (not only their
// difference): L, and dL/dx_c, dL/dx_r into *gc, *gr.
static double apart(const ct_dpo_loss *o, int type, double xc, double xr, double *gc, double *gr) {
  double z = xc - xr;
  switch (type) {
    case CT_DPO_NCA_PAIR:
      *gc = -sigmoid(-xc) + 0.5 * sigmoid(xc);
      *gr = 0.5 * sigmoid(xr);
      return -log_sigmoid(xc) - 0.5 * log_sigmoid(-xc) - 0.5 * log_sigmoid(-xr);
    case CT_DPO_BCO_PAIR:
      *gc = -sigmoid(-xc);
      *gr = sigmoid(xr);
      return -log_sigmoid(xc) - log_sigmoid(-xr);
    case CT_DPO_SPPO_HARD: {  // in ρ: (ρ_c − 1/(2β))², i.e. (x_c − ½)²/β²
      double b2 = o->beta * o->beta;
      *gc = 2 * (xc - 0.5) / b2;
      *gr = 2 * (xr + 0.5) / b2;
      return ((xc - 0.5) * (xc - 0.5) + (xr + 0.5) * (xr + 0.5)) / b2;
    }
    case CT_DPO_APO_ZERO:
      *gc = -dsigmoid(xc);
      *gr = dsigmoid(xr);
      return 1 - sigmoid(xc) + sigmoid(xr);
    default:  // CT_DPO_APO_DOWN
      *gc = dsigmoid(xc) - dsigmoid(z);
      *gr = dsigmoid(z);
      return sigmoid(xc) + 1 - sigmoid(z);
  }
}

// The cpo losses' u: the summed log-prob, or (ipo, simpo, alphapo) the mean.
static bool cpo_mean(int type) { return type == CT_DPO_CPO_IPO || type == CT_DPO_CPO_SIMPO || type == CT_DPO_ALPHAPO; }

double ct_dpo_cpo_reward(const ct_dpo_loss *o, int type, double lp, int len) {
  double u = cpo_mean(type) ? lp / len : lp;
  return o->beta * (o->alpha != 0 ? -expm1(-o->alpha * u) / o->alpha : u);
}

// CPOTrainer's losses (no reference): L and dL/dlogπ(c), dL/dlogπ(r) into *gc, *gr.
static double cpo_family(const ct_dpo_loss *o, int type, double lp_c, double lp_r, int len_c, int len_r,
                         double *gc, double *gr) {
  double b = o->beta, e = o->label_smoothing, a = o->alpha, L, dx;
  bool mean = cpo_mean(type);
  double uc = mean ? lp_c / len_c : lp_c, ur = mean ? lp_r / len_r : lp_r;
  double tc = a != 0 ? -expm1(-a * uc) / a : uc, tr = a != 0 ? -expm1(-a * ur) / a : ur;  // AlphaPO's r(u)
  double x = tc - tr;
  switch (type) {
    case CT_DPO_CPO_HINGE:
      L = b * x < 1 ? 1 - b * x : 0;
      dx = b * x < 1 ? -b : 0;
      break;
    case CT_DPO_CPO_IPO: {
      double v = x - 1 / (2 * b);
      L = v * v;
      dx = 2 * v;
      break;
    }
    case CT_DPO_CPO_SIMPO:
    case CT_DPO_ALPHAPO: {  // TRL: logits − γ/β, then β·(...)
      double z = b * (x - o->simpo_gamma / b);
      L = -(1 - e) * log_sigmoid(z) - e * log_sigmoid(-z);
      dx = b * (-(1 - e) * sigmoid(-z) + e * sigmoid(z));
      break;
    }
    default: {  // CT_DPO_CPO: the sigmoid loss
      double z = b * x;
      L = -(1 - e) * log_sigmoid(z) - e * log_sigmoid(-z);
      dx = b * (-(1 - e) * sigmoid(-z) + e * sigmoid(z));
    }
  }
  // dx/dlogπ(c) = r'(u_c)·du_c/dlogπ(c), r'(u) = e^(−α·u)
  *gc = dx * (a != 0 ? exp(-a * uc) : 1) / (mean ? len_c : 1);
  *gr = -dx * (a != 0 ? exp(-a * ur) : 1) / (mean ? len_r : 1);
  return L;
}

double ct_dpo_pair_loss(const ct_dpo_loss *o, double lp_c, double lp_r, double ref_c, double ref_r,
                        int len_c, int len_r, double *d_c, double *d_r) {
  double b = o->beta, e = o->label_smoothing, total = 0;
  double delta = (lp_c - ref_c) - (lp_r - ref_r), x = b * delta;
  *d_c = *d_r = 0;
  for (int k = 0; k < o->n; k++) {
    double w = o->weight[k], L = 0, dx = 0;  // dx: dL/dx for the x-based losses
    switch (o->type[k]) {
      case CT_DPO_SIGMOID:
        L = -(1 - e) * log_sigmoid(x) - e * log_sigmoid(-x);
        dx = -(1 - e) * sigmoid(-x) + e * sigmoid(x);
        break;
      case CT_DPO_HINGE:
        L = x < 1 ? 1 - x : 0;
        dx = x < 1 ? -1 : 0;
        break;
      case CT_DPO_ROBUST:
        L = (-(1 - e) * log_sigmoid(x) + e * log_sigmoid(-x)) / (1 - 2 * e);
        dx = (-(1 - e) * sigmoid(-x) - e * sigmoid(x)) / (1 - 2 * e);
        break;
      case CT_DPO_IPO: {
        double u = (lp_c - ref_c) / len_c - (lp_r - ref_r) / len_r - 1 / (2 * b);
        L = u * u;
        *d_c += w * 2 * u / len_c;
        *d_r -= w * 2 * u / len_r;
        break;
      }
      case CT_DPO_SIMPO: {
        double z = b * (lp_c / len_c - lp_r / len_r) - o->simpo_gamma;
        L = -(1 - e) * log_sigmoid(z) - e * log_sigmoid(-z);
        double dz = -(1 - e) * sigmoid(-z) + e * sigmoid(z);
        *d_c += w * dz * b / len_c;
        *d_r -= w * dz * b / len_r;
        break;
      }
      case CT_DPO_SFT:
        break;  // token-averaged by the trainer
      case CT_DPO_EXO_PAIR: {
        double q = sigmoid(x), ql = sigmoid(-x);
        L = q * (log_sigmoid(x) - log1p(-e)) + ql * (log_sigmoid(-x) - log(e));
        dx = q * ql * (x + log(e) - log1p(-e));  // log σ(x) − log σ(−x) = x
        break;
      }
      case CT_DPO_DISCOPOP: {
        double t = o->discopop_tau, m = sigmoid(x / t), dm = m * (1 - m) / t;
        // e^(−x)·m without inf·0 at large |x|: 1 / (e^x + e^(x − x/τ)) for x < 0
        double em = x >= 0 ? exp(-x) * m : 1 / (exp(x) + exp(x - x / t));
        L = -log_sigmoid(x) * (1 - m) + em;
        dx = -sigmoid(-x) * (1 - m) + log_sigmoid(x) * dm - em + em * (1 - m) / t;
        break;
      }
      case CT_DPO_SIGMOID_NORM: {
        double z = b * ((lp_c - ref_c) / len_c - (lp_r - ref_r) / len_r);
        L = -log_sigmoid(z);
        *d_c += w * -sigmoid(-z) * b / len_c;
        *d_r -= w * -sigmoid(-z) * b / len_r;
        break;
      }
      case CT_DPO_ORPO: {  // in the mean log-probs a = logπ/|y| (< 0)
        double ac = lp_c / len_c, ar = lp_r / len_r, lo = ct_dpo_log_odds(lp_c, lp_r, len_c, len_r);
        L = -b * log_sigmoid(lo);
        double dlo = -b * sigmoid(-lo);  // dL/dlog_odds
        *d_c += w * dlo / -expm1(ac) / len_c;  // dlog_odds/da_c = 1 / (1 − e^a_c)
        *d_r -= w * dlo / -expm1(ar) / len_r;
        break;
      }
      case CT_DPO_CPO:
      case CT_DPO_CPO_HINGE:
      case CT_DPO_CPO_IPO:
      case CT_DPO_CPO_SIMPO:
      case CT_DPO_ALPHAPO: {
        double gc, gr;
        L = cpo_family(o, o->type[k], lp_c, lp_r, len_c, len_r, &gc, &gr);
        *d_c += w * gc;
        *d_r += w * gr;
        break;
      }
      case CT_DPO_NCA_PAIR:
      case CT_DPO_BCO_PAIR:
      case CT_DPO_SPPO_HARD:
      case CT_DPO_APO_ZERO:
      case CT_DPO_APO_DOWN: {
        double gc, gr;
        L = apart(o, o->type[k], b * (lp_c - ref_c), b * (lp_r - ref_r), &gc, &gr);
        *d_c += w * gc * b;
        *d_r += w * gr * b;
        break;
      }
    }
    total += w * L;
    *d_c += w * dx * b;  // x = β(lp_c − ...) − β(lp_r − ...)
    *d_r -= w * dx * b;
  }
  return total;
}

typedef struct {
  double v;
  int at;
} ranked;

static int cmp_ranked(const void *a, const void *b) {
  double x = ((const ranked *)a)->v, y = ((const ranked *)b)->v;
  return (x > y) - (x < y);
}

// x (m) sorted ascending with the index each value came from.
static ranked *sorted(const double *x, int m) {
  ranked *r = malloc(sizeof *r * (size_t)(m > 0 ? m : 1));
  if (!r) return NULL;
  for (int i = 0; i < m; i++) r[i] = (ranked){x[i], i};
  qsort(r, (size_t)m, sizeof *r, cmp_ranked);
  return r;
}

void ct_dpo_batch_terms(const ct_dpo_loss *o, int m, const double *lp_c, const double *lp_r, const double *ref_c,
                        const double *ref_r, double *L, double *d_c, double *d_r) {
  double b = o->beta, e = o->label_smoothing;
  double *u = malloc(sizeof(double) * (size_t)(m > 0 ? m : 1)), *v = malloc(sizeof(double) * (size_t)(m > 0 ? m : 1));
  for (int k = 0; k < o->n && u && v; k++) {
    int t = o->type[k];
    if (t != CT_DPO_AOT && t != CT_DPO_AOT_UNPAIRED) continue;
    for (int j = 0; j < m; j++) {  // aot: policy vs reference margins; unpaired: chosen vs rejected ratios
      u[j] = t == CT_DPO_AOT ? lp_c[j] - lp_r[j] : lp_c[j] - ref_c[j];
      v[j] = t == CT_DPO_AOT ? ref_c[j] - ref_r[j] : lp_r[j] - ref_r[j];
    }
    ranked *su = sorted(u, m), *sv = sorted(v, m);
    for (int i = 0; su && sv && i < m; i++) {
      double x = b * (su[i].v - sv[i].v), w = o->weight[k];
      double l = -(1 - e) * log_sigmoid(x) - e * log_sigmoid(-x), g = b * (-(1 - e) * sigmoid(-x) + e * sigmoid(x));
      int jc = su[i].at;  // the pair whose u sits at position i (its c and r in aot)
      L[jc] += w * l;
      d_c[jc] += w * g;
      if (t == CT_DPO_AOT) d_r[jc] -= w * g;
      else d_r[sv[i].at] -= w * g;  // unpaired: the rejected ratio at position i (a constant in aot)
    }
    free(su), free(sv);
  }
  free(u), free(v);
}

double ct_dpo_log_odds(double lp_c, double lp_r, int len_c, int len_r) {
  double ac = lp_c / len_c, ar = lp_r / len_r;
  return (ac - ar) - (log1mexp(ac) - log1mexp(ar));
}

double ct_dpo_log_sigmoid(double x) { return log_sigmoid(x); }

int ct_dpo_needs_reference(const ct_dpo_loss *o) {
  for (int k = 0; k < o->n; k++)
    if (o->type[k] != CT_DPO_SIMPO && o->type[k] != CT_DPO_SFT && o->type[k] != CT_DPO_ORPO &&
        !ct_dpo_is_cpo(o->type[k]))
      return 1;
  return 0;
}

double ct_dpo_sft_weight(const ct_dpo_loss *o) {
  double w = 0;
  for (int k = 0; k < o->n; k++)
    if (o->type[k] == CT_DPO_SFT || o->type[k] == CT_DPO_ORPO) w += o->weight[k];
    else if (ct_dpo_is_cpo(o->type[k]) && o->type[k] != CT_DPO_ALPHAPO) w += o->weight[k] * o->cpo_alpha;
  return w;
}

int ct_dpo_unpaired(const ct_dpo_loss *o) {
  for (int k = 0; k < o->n; k++)
    if (o->type[k] == CT_DPO_KTO || o->type[k] == CT_DPO_APO_ZERO_UNPAIRED) return 1;
  return 0;
}

int ct_dpo_kto_kl(const ct_dpo_loss *o) {
  for (int k = 0; k < o->n; k++)
    if (o->type[k] == CT_DPO_KTO) return 1;
  return 0;
}

double ct_dpo_kto_loss(const ct_dpo_loss *o, bool desirable, double lp, double ref, double kl, double *d) {
  double b = o->beta, rho = lp - ref, total = 0;
  *d = 0;
  for (int k = 0; k < o->n; k++) {
    double w = o->weight[k] * (desirable ? o->desirable_weight : o->undesirable_weight);
    if (o->type[k] == CT_DPO_KTO) {  // 1 − σ(±β(ρ − KL)): d/dρ = ∓β·σ'
      double z = desirable ? b * (rho - kl) : b * (kl - rho);
      total += w * (1 - sigmoid(z));
      *d += w * (desirable ? -b : b) * dsigmoid(z);
    } else if (o->type[k] == CT_DPO_APO_ZERO_UNPAIRED) {
      double z = b * rho;
      total += w * (desirable ? 1 - sigmoid(z) : sigmoid(z));
      *d += w * (desirable ? -b : b) * dsigmoid(z);
    }
  }
  return total;
}

int ct_dpo_is_cpo(int type) {
  return type == CT_DPO_CPO || type == CT_DPO_CPO_HINGE || type == CT_DPO_CPO_IPO || type == CT_DPO_CPO_SIMPO ||
         type == CT_DPO_ALPHAPO;
}
