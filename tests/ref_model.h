// ref_model: the model written again from first principles in float64, for tests.
// Parameters are looked up by Hugging Face name in the model's table, so the reference
// shares nothing with the code under test but the names.
#pragma once
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

typedef struct {
  const ct_model *m;
  const double *P;  // parameters in the model's flat layout
} ref_t;

static const double *W(const ref_t *r, const char *fmt, int l) {
  char name[96];
  snprintf(name, sizeof name, fmt, l);
  const ct_tensor_info *t = ct_model_find_tensor(r->m, name);
  return t ? r->P + t->offset : NULL;
}

static void rmsnorm(double *y, const double *x, const double *w, int n, double eps) {
  double ss = 0;
  for (int i = 0; i < n; i++) ss += x[i] * x[i];
  double r = 1 / sqrt(ss / n + eps);
  for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

// y (out) = x (in) · Wᵀ + b
static void linear(double *y, const double *x, const double *Wm, const double *b, int in, int out) {
  for (int o = 0; o < out; o++) {
    double s = b ? b[o] : 0;
    for (int i = 0; i < in; i++) s += x[i] * Wm[(long)o * in + i];
    y[o] = s;
  }
}

static void rope(double *v, int pos, int hd, double theta) {
  int half = hd / 2;
  for (int i = 0; i < half; i++) {
    double a = pos * pow(theta, -2.0 * i / hd), c = cos(a), s = sin(a);
    double x1 = v[i], x2 = v[i + half];
    v[i] = x1 * c - x2 * s;
    v[i + half] = x2 * c + x1 * s;
  }
}

// The residual stream after every decoder layer, x (B·T, C), before the final norm.
static void ref_layers(const ref_t *r, int B, int T, const int *ids, const int *pos, const int *seg, double *x) {
  const ct_model_config *c = &r->m->cfg;
  int C = c->hidden_size, F = c->intermediate_size, H = c->num_heads, KV = c->num_kv_heads;
  int hd = c->head_dim, N = B * T, Hd = H * hd;
  double eps = c->rms_norm_eps;
  double *xn = calloc(C, 8), *q = calloc((size_t)N * Hd, 8);
  double *k = calloc((size_t)N * KV * hd, 8), *v = calloc((size_t)N * KV * hd, 8);
  double *o = calloc((size_t)N * Hd, 8), *tmp = calloc(C > F ? (Hd > F ? Hd : F) : (Hd > C ? Hd : C), 8);
  double *g = calloc(F, 8), *u = calloc(F, 8), *p = calloc(T, 8);
  const double *E = W(r, "model.embed_tokens.weight", 0);
  for (int n = 0; n < N; n++) memcpy(x + (long)n * C, E + (long)ids[n] * C, 8 * C);
  for (int l = 0; l < c->num_layers; l++) {
    for (int n = 0; n < N; n++) {
      rmsnorm(xn, x + (long)n * C, W(r, "model.layers.%d.input_layernorm.weight", l), C, eps);
      linear(q + (long)n * Hd, xn, W(r, "model.layers.%d.self_attn.q_proj.weight", l),
             W(r, "model.layers.%d.self_attn.q_proj.bias", l), C, Hd);
      linear(k + (long)n * KV * hd, xn, W(r, "model.layers.%d.self_attn.k_proj.weight", l),
             W(r, "model.layers.%d.self_attn.k_proj.bias", l), C, KV * hd);
      linear(v + (long)n * KV * hd, xn, W(r, "model.layers.%d.self_attn.v_proj.weight", l),
             W(r, "model.layers.%d.self_attn.v_proj.bias", l), C, KV * hd);
      for (int h = 0; h < H; h++) {
        double *qh = q + (long)n * Hd + h * hd;
        if (c->qk_norm) {
          memcpy(tmp, qh, 8 * hd);
          rmsnorm(qh, tmp, W(r, "model.layers.%d.self_attn.q_norm.weight", l), hd, eps);
        }
        rope(qh, pos[n], hd, c->rope_theta);
      }
      for (int h = 0; h < KV; h++) {
        double *kh = k + ((long)n * KV + h) * hd;
        if (c->qk_norm) {
          memcpy(tmp, kh, 8 * hd);
          rmsnorm(kh, tmp, W(r, "model.layers.%d.self_attn.k_norm.weight", l), hd, eps);
        }
        rope(kh, pos[n], hd, c->rope_theta);
      }
    }
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
          int n = b * T + t, grp = h / (H / KV);
          double mx = -INFINITY, sum = 0;
          for (int j = seg[n]; j <= t; j++) {
            double s = 0;
            for (int i = 0; i < hd; i++)
              s += q[(long)n * Hd + h * hd + i] * k[((long)(b * T + j) * KV + grp) * hd + i];
            p[j] = s / sqrt(hd);
            mx = fmax(mx, p[j]);
          }
          for (int j = seg[n]; j <= t; j++) sum += (p[j] = exp(p[j] - mx));
          for (int i = 0; i < hd; i++) {
            double acc = 0;
            for (int j = seg[n]; j <= t; j++) acc += p[j] / sum * v[((long)(b * T + j) * KV + grp) * hd + i];
            o[(long)n * Hd + h * hd + i] = acc;
          }
        }
    for (int n = 0; n < N; n++) {
      double *xr = x + (long)n * C;
      linear(tmp, o + (long)n * Hd, W(r, "model.layers.%d.self_attn.o_proj.weight", l), NULL, Hd, C);
      for (int i = 0; i < C; i++) xr[i] += tmp[i];
      rmsnorm(xn, xr, W(r, "model.layers.%d.post_attention_layernorm.weight", l), C, eps);
      linear(g, xn, W(r, "model.layers.%d.mlp.gate_proj.weight", l), NULL, C, F);
      linear(u, xn, W(r, "model.layers.%d.mlp.up_proj.weight", l), NULL, C, F);
      for (int i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
      linear(tmp, g, W(r, "model.layers.%d.mlp.down_proj.weight", l), NULL, F, C);
      for (int i = 0; i < C; i++) xr[i] += tmp[i];
    }
  }
  free(xn); free(q); free(k); free(v); free(o); free(tmp); free(g); free(u); free(p);
}

// Sum over target tokens of cross-entropy + z·lse² of the final hidden states x (N, C),
// through the final norm (Gemma's applies 1 + w) and the head; *count gets the targets.
static void rmsnorm1p(double *y, const double *x, const double *w, int n, double eps);
static double ref_head_sum(const ref_t *r, const double *x, int N, const int *target, double z, int *count) {
  const ct_model_config *c = &r->m->cfg;
  int C = c->hidden_size, V = c->vocab_size;
  double *xn = calloc(C, 8), *logits = calloc(V, 8);
  const double *head = c->tie_word_embeddings ? W(r, "model.embed_tokens.weight", 0) : W(r, "lm_head.weight", 0);
  const double *norm = W(r, "model.norm.weight", 0);
  double total = 0;
  *count = 0;
  for (int n = 0; n < N; n++) {
    if (target[n] < 0) continue;
    (c->gemma ? rmsnorm1p : rmsnorm)(xn, x + (long)n * C, norm, C, c->rms_norm_eps);
    linear(logits, xn, head, NULL, C, V);
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, logits[i]);
    for (int i = 0; i < V; i++) s += exp(logits[i] - mx);
    double lse = mx + log(s);
    total += lse - logits[target[n]] + z * lse * lse;
    (*count)++;
  }
  free(xn); free(logits);
  return total;
}

// Sum over target tokens of cross-entropy + z·lse²; *count gets the number of targets.
static double ref_loss(const ref_t *r, int B, int T, const int *ids, const int *pos,
                       const int *seg, const int *target, double z, int *count_out) {
  int N = B * T, count;
  double *x = calloc((size_t)N * r->m->cfg.hidden_size, 8);
  ref_layers(r, B, T, ids, pos, seg, x);
  double total = ref_head_sum(r, x, N, target, z, &count);
  free(x);
  if (count_out) *count_out = count;
  return total;
}

// ---------------------------------------------------------------------------
// Gemma 3 (gemma3_text), from transformers' modeling_gemma3.py

// y = x / rms(x) · (1 + w)
static void rmsnorm1p(double *y, const double *x, const double *w, int n, double eps) {
  double ss = 0;
  for (int i = 0; i < n; i++) ss += x[i] * x[i];
  double r = 1 / sqrt(ss / n + eps);
  for (int i = 0; i < n; i++) y[i] = x[i] * r * (1 + w[i]);
}

static double gelu_tanh(double x) {
  return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

// Rotate-half RoPE with base theta, positions divided by `factor` (linear scaling; 1 = none).
static void rope_g(double *v, int pos, int hd, double theta, double factor) {
  int half = hd / 2;
  for (int i = 0; i < half; i++) {
    double a = pos * pow(theta, -2.0 * i / hd) / factor, c = cos(a), s = sin(a);
    double x1 = v[i], x2 = v[i + half];
    v[i] = x1 * c - x2 * s;
    v[i + half] = x2 * c + x1 * s;
  }
}

// Mean over target tokens of cross-entropy + z·lse².
__attribute__((unused)) static double gemma_ref_loss(const ref_t *r, int B, int T, const int *ids, const int *pos,
                                                     const int *seg, const int *target, double z) {
  const ct_model_config *c = &r->m->cfg;
  int C = c->hidden_size, F = c->intermediate_size, H = c->num_heads, KV = c->num_kv_heads;
  int hd = c->head_dim, N = B * T, Hd = H * hd, big = C + Hd + F;
  double eps = c->rms_norm_eps, scale = 1 / sqrt(c->query_pre_attn_scalar);
  double *x = calloc((size_t)N * C, 8), *xn = calloc(big, 8), *q = calloc((size_t)N * Hd, 8);
  double *k = calloc((size_t)N * KV * hd, 8), *v = calloc((size_t)N * KV * hd, 8);
  double *o = calloc((size_t)N * Hd, 8), *tmp = calloc(big, 8), *tmp2 = calloc(big, 8);
  double *g = calloc(F, 8), *u = calloc(F, 8), *p = calloc(T, 8);
  const double *E = W(r, "model.embed_tokens.weight", 0);
  for (int n = 0; n < N; n++)
    for (int i = 0; i < C; i++) x[(long)n * C + i] = E[(long)ids[n] * C + i] * sqrt(C);
  for (int l = 0; l < c->num_layers; l++) {
    bool sliding = c->sliding_window > 0 && c->sliding[l];
    double theta = sliding ? c->rope_local_theta : c->rope_theta;
    double factor = !sliding && c->rope_type == 2 ? c->rope_factor : 1;
    for (int n = 0; n < N; n++) {
      rmsnorm1p(xn, x + (long)n * C, W(r, "model.layers.%d.input_layernorm.weight", l), C, eps);
      linear(q + (long)n * Hd, xn, W(r, "model.layers.%d.self_attn.q_proj.weight", l), NULL, C, Hd);
      linear(k + (long)n * KV * hd, xn, W(r, "model.layers.%d.self_attn.k_proj.weight", l), NULL, C, KV * hd);
      linear(v + (long)n * KV * hd, xn, W(r, "model.layers.%d.self_attn.v_proj.weight", l), NULL, C, KV * hd);
      for (int h = 0; h < H + KV; h++) {
        double *vh = h < H ? q + (long)n * Hd + h * hd : k + ((long)n * KV + h - H) * hd;
        memcpy(tmp, vh, 8 * hd);
        rmsnorm1p(vh, tmp, W(r, h < H ? "model.layers.%d.self_attn.q_norm.weight" : "model.layers.%d.self_attn.k_norm.weight", l),
                  hd, eps);
        rope_g(vh, pos[n], hd, theta, factor);
      }
    }
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
          int n = b * T + t, grp = h / (H / KV), j0 = seg[n];
          if (sliding && t - c->sliding_window + 1 > j0) j0 = t - c->sliding_window + 1;  // 0 <= t - j < window
          double mx = -INFINITY, sum = 0;
          for (int j = j0; j <= t; j++) {
            double s = 0;
            for (int i = 0; i < hd; i++) s += q[(long)n * Hd + h * hd + i] * k[((long)(b * T + j) * KV + grp) * hd + i];
            s *= scale;
            if (c->attn_softcap > 0) s = c->attn_softcap * tanh(s / c->attn_softcap);
            p[j] = s;
            mx = fmax(mx, s);
          }
          for (int j = j0; j <= t; j++) sum += (p[j] = exp(p[j] - mx));
          for (int i = 0; i < hd; i++) {
            double acc = 0;
            for (int j = j0; j <= t; j++) acc += p[j] / sum * v[((long)(b * T + j) * KV + grp) * hd + i];
            o[(long)n * Hd + h * hd + i] = acc;
          }
        }
    for (int n = 0; n < N; n++) {
      double *xr = x + (long)n * C;
      linear(tmp, o + (long)n * Hd, W(r, "model.layers.%d.self_attn.o_proj.weight", l), NULL, Hd, C);
      rmsnorm1p(tmp2, tmp, W(r, "model.layers.%d.post_attention_layernorm.weight", l), C, eps);
      for (int i = 0; i < C; i++) xr[i] += tmp2[i];
      rmsnorm1p(xn, xr, W(r, "model.layers.%d.pre_feedforward_layernorm.weight", l), C, eps);
      linear(g, xn, W(r, "model.layers.%d.mlp.gate_proj.weight", l), NULL, C, F);
      linear(u, xn, W(r, "model.layers.%d.mlp.up_proj.weight", l), NULL, C, F);
      for (int i = 0; i < F; i++) g[i] = gelu_tanh(g[i]) * u[i];
      linear(tmp, g, W(r, "model.layers.%d.mlp.down_proj.weight", l), NULL, F, C);
      rmsnorm1p(tmp2, tmp, W(r, "model.layers.%d.post_feedforward_layernorm.weight", l), C, eps);
      for (int i = 0; i < C; i++) xr[i] += tmp2[i];
    }
  }
  int count;
  double total = ref_head_sum(r, x, N, target, z, &count);
  free(x); free(xn); free(q); free(k); free(v); free(o); free(tmp); free(tmp2); free(g); free(u); free(p);
  return total / count;
}

__attribute__((unused)) static double ref_mean_loss(const ref_t *r, int B, int T, const int *ids, const int *pos,
                            const int *seg, const int *target, double z) {
  if (r->m->cfg.gemma) return gemma_ref_loss(r, B, T, ids, pos, seg, target, z);
  int count;
  double total = ref_loss(r, B, T, ids, pos, seg, target, z, &count);
  return total / count;
}

// Every parameter's gradient grads (m's layout) against central finite differences of
// ref_mean_loss on ref's float64 copy P of the parameters (restored after each one).
// Returns how many are off by more than 1e-5 + 1e-3·|fd| (the first five printed);
// *checked gets how many were checked.
__attribute__((unused)) static int ref_check_gradients(const ref_t *ref, double *P, const float *grads, int B, int T,
                                                       const int *ids, const int *pos, const int *seg,
                                                       const int *target, double z, int *checked) {
  const ct_model *m = ref->m;
  int bad = 0;
  double worst = 0;
  *checked = 0;
  for (int ti = 0; ti < m->n_tensors; ti++) {
    const ct_tensor_info *t = &m->tensors[ti];
    for (long k = 0; k < t->numel; k++) {
      long i = t->offset + k;
      double keep = P[i], e = 1e-5;
      P[i] = keep + e;
      double lp = ref_mean_loss(ref, B, T, ids, pos, seg, target, z);
      P[i] = keep - e;
      double lm = ref_mean_loss(ref, B, T, ids, pos, seg, target, z);
      P[i] = keep;
      double fd = (lp - lm) / (2 * e), err = fabs(grads[i] - fd);
      (*checked)++;
      worst = err > worst ? err : worst;
      if (err > 1e-5 + 1e-3 * fabs(fd) && bad++ < 5)
        fprintf(stderr, "  %s[%ld]: analytic %.8g, finite difference %.8g\n", t->name, k, grads[i], fd);
    }
  }
  fprintf(stderr, "  %d gradients checked, worst |diff| %.3g\n", *checked, worst);
  return bad;
}
