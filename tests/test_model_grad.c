// The whole model against an independent float64 reference written here from first
// principles: the float32 loss must match the reference loss, and every parameter's
// analytic gradient must match central differences of the reference.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "forward.h"
#include "loss.h"
#include "matmul.h"
#include "model.h"
#include "pool.h"
#include "rng.h"
#include "test.h"

// ---------------------------------------------------------------------------
// Reference: plain loops in double, parameters looked up by Hugging Face name.

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

// Mean over target tokens of cross-entropy + z·lse².
static double ref_loss(const ref_t *r, int B, int T, const int *ids, const int *pos,
                       const int *seg, const int *target, double z) {
  const ct_model_config *c = &r->m->cfg;
  int C = c->hidden_size, F = c->intermediate_size, H = c->num_heads, KV = c->num_kv_heads;
  int hd = c->head_dim, V = c->vocab_size, N = B * T, Hd = H * hd;
  double eps = c->rms_norm_eps;
  double *x = calloc((size_t)N * C, 8), *xn = calloc(C, 8), *q = calloc((size_t)N * Hd, 8);
  double *k = calloc((size_t)N * KV * hd, 8), *v = calloc((size_t)N * KV * hd, 8);
  double *o = calloc((size_t)N * Hd, 8), *tmp = calloc(C > F ? (Hd > F ? Hd : F) : (Hd > C ? Hd : C), 8);
  double *g = calloc(F, 8), *u = calloc(F, 8), *p = calloc(T, 8), *logits = calloc(V, 8);
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
  const double *head = c->tie_word_embeddings ? E : W(r, "lm_head.weight", 0);
  double total = 0;
  int count = 0;
  for (int n = 0; n < N; n++) {
    if (target[n] < 0) continue;
    rmsnorm(xn, x + (long)n * C, W(r, "model.norm.weight", 0), C, eps);
    linear(logits, xn, head, NULL, C, V);
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, logits[i]);
    for (int i = 0; i < V; i++) s += exp(logits[i] - mx);
    double lse = mx + log(s);
    total += lse - logits[target[n]] + z * lse * lse;
    count++;
  }
  free(x); free(xn); free(q); free(k); free(v); free(o); free(tmp); free(g); free(u); free(p);
  free(logits);
  return total / count;
}

// ---------------------------------------------------------------------------
// The system under test: float32 forward, head, backward.

typedef struct {
  int B, T;
  int ids[64], pos[64], seg[64], target[64];
} batch_t;

// Two rows of T=7: row 0 causal with two padding tokens at the end (no target),
// row 1 two packed documents (positions restart, attention block-diagonal).
static batch_t make_batch(int V) {
  batch_t b = {.B = 2, .T = 7};
  ct_rng r;
  ct_rng_seed(&r, 7);
  for (int n = 0; n < 14; n++) b.ids[n] = (int)ct_rng_below(&r, V);
  for (int t = 0; t < 7; t++) {
    b.pos[t] = t;
    b.seg[t] = 0;
    b.target[t] = t < 4 ? b.ids[t + 1] : -1;  // tokens 5, 6 are padding
    b.pos[7 + t] = t < 3 ? t : t - 3;
    b.seg[7 + t] = t < 3 ? 0 : 3;
    b.target[7 + t] = (t == 2 || t == 6) ? -1 : b.ids[7 + t + 1 < 14 ? 7 + t + 1 : 13];
  }
  return b;
}

static double ours(const ct_model *m, const ct_weights *g, const batch_t *b, double z, int ntiles,
                   float *grads) {
  const ct_model_config *c = &m->cfg;
  int N = b->B * b->T;
  ct_acts a;
  ct_head h;
  if (ct_acts_init(&a, m, b->B, b->T, true) || ct_head_init(&h, N, c->vocab_size, c->hidden_size, ntiles)) {
    fprintf(stderr, "%s\n", ct_last_error());
    exit(1);
  }
  memcpy(a.ids, b->ids, sizeof(int) * N);
  memcpy(a.pos, b->pos, sizeof(int) * N);
  memcpy(a.seg, b->seg, sizeof(int) * N);
  ct_forward(m, &a, b->B, b->T);
  int n = ct_head_gather(&h, a.lnf, b->target, N);
  ct_head_forward(&h, m->w.lm_head);
  double loss = 0;
  for (int r = 0; r < n; r++) {
    loss += -h.logp[r] + z * h.lse[r] * h.lse[r];
    h.coef[r] = 1.0f / n;
    h.zcoef[r] = (float)(2 * z * h.lse[r] / n);
  }
  memset(grads, 0, sizeof(float) * m->n_floats);
  ct_head_backward(&h, m->w.lm_head, g->lm_head, a.dln, N);
  ct_backward(m, g, &a, a.dln, b->B, b->T);
  ct_head_free(&h);
  ct_acts_free(&a);
  return loss / n;
}

static void check_model(ct_model_config cfg, double z) {
  ct_model m;
  CHECK_OK(ct_model_init(&m, &cfg, 16));
  ct_model_init_random(&m, 3, 0.3f);
  ct_rng r;
  ct_rng_seed(&r, 11);
  for (int i = 0; i < m.n_tensors; i++)  // make norms and biases non-trivial too
    if (m.tensors[i].ndim == 1)
      for (long k = 0; k < m.tensors[i].numel; k++)
        m.params[m.tensors[i].offset + k] = (float)(1 + 0.2 * ct_rng_normal(&r));
  float *grads = aligned_alloc(64, sizeof(float) * m.n_floats);
  ct_weights g;
  CHECK_OK(ct_weights_bind(&g, &m, grads));
  batch_t b = make_batch(cfg.vocab_size);
  double loss = ours(&m, &g, &b, z, 1, grads);

  double *P = calloc(m.n_floats, sizeof(double));
  for (long i = 0; i < m.n_floats; i++) P[i] = m.params[i];
  ref_t ref = {&m, P};
  double want = ref_loss(&ref, b.B, b.T, b.ids, b.pos, b.seg, b.target, z);
  CHECK_NEAR(loss, want, 2e-5 * fabs(want));

  int bad = 0, checked = 0;
  double worst = 0;
  for (int ti = 0; ti < m.n_tensors; ti++) {
    const ct_tensor_info *t = &m.tensors[ti];
    for (long k = 0; k < t->numel; k++) {
      long i = t->offset + k;
      double keep = P[i], e = 1e-5;
      P[i] = keep + e;
      double lp = ref_loss(&ref, b.B, b.T, b.ids, b.pos, b.seg, b.target, z);
      P[i] = keep - e;
      double lm = ref_loss(&ref, b.B, b.T, b.ids, b.pos, b.seg, b.target, z);
      P[i] = keep;
      double fd = (lp - lm) / (2 * e), err = fabs(grads[i] - fd);
      checked++;
      if (err > worst) worst = err;
      if (err > 1e-5 + 1e-3 * fabs(fd)) {
        if (bad++ < 5)
          fprintf(stderr, "  %s[%ld]: analytic %.8g, finite difference %.8g\n", t->name, k, grads[i], fd);
      }
    }
  }
  fprintf(stderr, "  %d gradients checked, worst |diff| %.3g\n", checked, worst);
  CHECK(bad == 0);
  long numel = 0;
  for (int ti = 0; ti < m.n_tensors; ti++) numel += m.tensors[ti].numel;
  CHECK(checked == numel && numel > 2000);

  // Tiling the vocabulary changes nothing but rounding.
  float *g3 = aligned_alloc(64, sizeof(float) * m.n_floats);
  ct_weights gw3;
  CHECK_OK(ct_weights_bind(&gw3, &m, g3));
  double loss3 = ours(&m, &gw3, &b, z, 3, g3);
  CHECK_NEAR(loss3, loss, 1e-6 * fabs(loss));
  CHECK(test_max_rel_diff(g3, grads, m.n_floats) < 1e-5);
  ct_weights_free(&gw3);
  free(g3);
  free(P);
  ct_weights_free(&g);
  free(grads);
  ct_model_free(&m);
}

static ct_model_config tiny(void) {
  ct_model_config c = {.model_type = "llama", .vocab_size = 17, .hidden_size = 12,
                       .intermediate_size = 20, .num_layers = 2, .num_heads = 4,
                       .num_kv_heads = 2, .head_dim = 4, .max_position_embeddings = 16,
                       .rope_theta = 10000, .rms_norm_eps = 1e-6f, .tie_word_embeddings = true,
                       .bos_token_id = -1, .eos_token_id = -1, .pad_token_id = -1};
  return c;
}

static void test_llama_tied_gradients_match_float64_reference(void) { check_model(tiny(), 0); }

static void test_qwen2_untied_qkv_bias_with_z_loss_gradients_match_reference(void) {
  ct_model_config c = tiny();
  c.tie_word_embeddings = false;
  c.qkv_bias = true;
  check_model(c, 1e-2);
}

static void test_qwen3_qk_norm_mqa_gradients_match_reference(void) {
  ct_model_config c = tiny();
  c.qk_norm = true;
  c.num_kv_heads = 1;
  c.head_dim = 6;  // H*hd != C
  c.tie_word_embeddings = false;
  check_model(c, 0);
}

int main(int argc, char **argv) {
  ct_blas_init(argc, argv);
  ct_pool_init(2);
  RUN(test_llama_tied_gradients_match_float64_reference);
  RUN(test_qwen2_untied_qkv_bias_with_z_loss_gradients_match_reference);
  RUN(test_qwen3_qk_norm_mqa_gradients_match_reference);
  return test_summary();
}
