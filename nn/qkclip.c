// qkclip: QK-Clip's per-head factors and the rescaling of q/k weights, biases or norm
// weights (see qkclip.h for the scheme). The recording happens in attention.c; when to
// apply is common/train.c's business.
#include "qkclip.h"

#include <math.h>
#include <stdlib.h>

#include "bf16.h"
#include "error.h"

int ct_qkclip_init(ct_qkclip *q, const ct_model_config *c, float tau) {
  *q = (ct_qkclip){.tau = tau, .L = c->num_layers + c->mtp_layers, .H = c->num_heads, .KV = c->num_kv_heads};
  if (!(tau > 0) || !isfinite(tau)) return ct_set_error(CT_EINVAL, "qk_clip: threshold %g is not a number > 0", tau);
  if (!(q->max = malloc(sizeof(float) * (size_t)q->L * q->H))) return ct_set_error(CT_ENOMEM, "qk_clip: out of memory");
  ct_qkclip_reset(q);
  return 0;
}

void ct_qkclip_free(ct_qkclip *q) {
  free(q->max);
  q->max = NULL;
}

void ct_qkclip_reset(ct_qkclip *q) {
  for (long i = 0; i < (long)q->L * q->H; i++) q->max[i] = -INFINITY;
}

float ct_qkclip_max(const ct_qkclip *q) {
  float m = -INFINITY;
  for (long i = 0; i < (long)q->L * q->H; i++) m = q->max[i] > m ? q->max[i] : m;
  return m;
}

// x (n) *= s, and the bf16 copy of those floats when m computes in bf16
static void scale(ct_model *m, float *x, long n, float s) {
  for (long i = 0; i < n; i++) x[i] *= s;
  if (m->compute16 && m->params) ct_bf16_narrow(m->compute16 + (x - m->params), x, n);
}

// x (n) = (1 + x)·s − 1: a Gemma norm weight whose multiplier (1 + x) scales by s.
static void shift_scale(ct_model *m, float *x, long n, float s) {
  for (long i = 0; i < n; i++) x[i] = (1 + x[i]) * s - 1;
  if (m->compute16 && m->params) ct_bf16_narrow(m->compute16 + (x - m->params), x, n);
}

// Head h's target factor η_h = min(1, τ / S_h) (1 when S_h <= τ or nothing was seen).
static float eta(const ct_qkclip *q, int l, int h) {
  float s = q->max[(long)l * q->H + h];
  return s > q->tau ? q->tau / s : 1.0f;
}

// Block l's weights: a decoder layer, or past them a multi-token prediction depth's block.
static ct_layer_weights *block(ct_model *m, int l) {
  int L = m->cfg.num_layers;
  return l < L ? &m->w.layers[l] : &m->w.mtp[l - L].block;
}

// Layer l without q/k norms: k_g by sqrt(min η of its group), q_h by η_h / that.
static void clip_projections(const ct_qkclip *q, ct_model *m, int l) {
  const ct_model_config *c = &m->cfg;
  ct_layer_weights *w = block(m, l);
  long hd = c->head_dim, C = c->hidden_size;
  int rep = q->H / q->KV;
  for (int g = 0; g < q->KV; g++) {
    float lo = 1;
    for (int h = g * rep; h < (g + 1) * rep; h++) lo = fminf(lo, eta(q, l, h));
    if (lo == 1) continue;  // no head of the group above τ: nothing moves
    float cg = sqrtf(lo);
    long krow = (q->H + g) * hd;  // the key head's rows in the fused (QKV, C) matrix
    scale(m, w->wqkv + krow * C, hd * C, cg);
    if (w->bqkv) scale(m, w->bqkv + krow, hd, cg);
    for (int h = g * rep; h < (g + 1) * rep; h++) {
      float ah = eta(q, l, h) / cg;
      scale(m, w->wqkv + h * hd * C, hd * C, ah);
      if (w->bqkv) scale(m, w->bqkv + h * hd, hd, ah);
    }
  }
}

// Layer l with q/k norms: the shared norm weights by sqrt(min η of the layer) each.
static void clip_norms(const ct_qkclip *q, ct_model *m, int l) {
  ct_layer_weights *w = block(m, l);
  float lo = 1;
  for (int h = 0; h < q->H; h++) lo = fminf(lo, eta(q, l, h));
  if (lo == 1) return;
  float s = sqrtf(lo);
  if (m->cfg.gemma) {  // Gemma's norms multiply by (1 + w): (1 + w)·s = 1 + (w·s + s − 1)
    shift_scale(m, w->qnorm, m->cfg.head_dim, s);
    shift_scale(m, w->knorm, m->cfg.head_dim, s);
    return;
  }
  scale(m, w->qnorm, m->cfg.head_dim, s);
  scale(m, w->knorm, m->cfg.head_dim, s);
}

int ct_qkclip_apply(const ct_qkclip *q, ct_model *m) {
  int clipped = 0;
  if (!m->params) return 0;  // (a model stored in bf16 or int8 is never trained)
  for (int l = 0; l < q->L; l++) {
    for (int h = 0; h < q->H; h++) clipped += q->max[(long)l * q->H + h] > q->tau;
    if (m->cfg.qk_norm) clip_norms(q, m, l);
    else clip_projections(q, m, l);
  }
  return clipped;
}
