// engine: the inference forward over (slot, position) tokens with a KV cache per slot.
// The same layer recipe as nn/forward.c, but with fixed-order dot products (linear.c)
// instead of sgemm, so that a token's result never depends on what shares the pass;
// a change to the layer goes into both.
#include "engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "fastmath.h"
#include "kernels.h"
#include "mem.h"
#include "panel.h"
#include "pool.h"

struct ct_engine {
  const ct_infer_weights *w;
  ct_engine_opts o;
  int C, F, H, KV, hd, QKV, L, V;
  float *kcache, *vcache;      // (L, S, T, KVd)
  float *rope_cos, *rope_sin;  // (T, hd/2)
  // work buffers for up to max_tokens tokens
  float *x, *ln, *qkv, *qkv_save, *qk_rstd, *rstd, *att, *gu, *h, *xo;
  float *scores;               // (threads, H/KV, T)
  float *lora_u;               // (max_tokens, r) the adapters' inner products
  float *lora_p;               // (r · max(in, out)) one adapter matrix packed into panels
  int *ids, *pos, *slot;
  long bytes;
};

enum { N_BUFS = 15 };  // float buffers, in engine_sizes' order

// Floats of each buffer for a model config and options: the KV caches, the RoPE tables,
// then the work buffers for max_tokens tokens.
static void engine_sizes(const ct_model_config *c, const ct_engine_opts *o, long n[N_BUFS]) {
  long N = o->max_tokens, T = o->max_len, C = c->hidden_size, F = c->intermediate_size;
  long H = c->num_heads, KV = c->num_kv_heads, hd = c->head_dim, QKV = (H + 2 * KV) * hd;
  long cache = (long)c->num_layers * o->slots * T * KV * hd;
  long v[N_BUFS] = {cache, cache, T * (hd / 2), T * (hd / 2), N * C, N * C, N * C, N * QKV, N * QKV,
                    N * (H + KV), N, N * H * hd, N * 2 * F, N * F, (long)ct_pool_threads() * (H / KV) * T};
  for (int i = 0; i < N_BUFS; i++) n[i] = (v[i] + 15) / 16 * 16 + 16;
}

double ct_engine_bytes(const ct_model_config *c, const ct_engine_opts *o) {
  long n[N_BUFS];
  double b = 3.0 * sizeof(int) * o->max_tokens;
  engine_sizes(c, o, n);
  for (int i = 0; i < N_BUFS; i++) b += sizeof(float) * (double)n[i];
  return b;
}

int ct_engine_init(ct_engine **out, const ct_infer_weights *w, const ct_engine_opts *o) {
  *out = NULL;
  if (o->slots < 1 || o->max_len < 1 || o->max_tokens < o->slots)
    return ct_set_error(CT_EINVAL, "engine: need slots >= 1, max_len >= 1, max_tokens >= slots");
  ct_engine *e = calloc(1, sizeof *e);
  if (!e) return ct_set_error(CT_ENOMEM, "engine: out of memory");
  const ct_model_config *c = &w->cfg;
  *e = (ct_engine){.w = w, .o = *o, .C = c->hidden_size, .F = c->intermediate_size,
                   .H = c->num_heads, .KV = c->num_kv_heads, .hd = c->head_dim,
                   .L = c->num_layers, .V = c->vocab_size};
  e->QKV = (e->H + 2 * e->KV) * e->hd;
  long n[N_BUFS], N = o->max_tokens;
  engine_sizes(c, o, n);
  float **bufs[N_BUFS] = {&e->kcache, &e->vcache, &e->rope_cos, &e->rope_sin, &e->x, &e->ln, &e->xo,
                          &e->qkv, &e->qkv_save, &e->qk_rstd, &e->rstd, &e->att, &e->gu, &e->h, &e->scores};
  bool ok = true;
  for (int i = 0; i < N_BUFS; i++) {
    *bufs[i] = ct_big_alloc(sizeof(float) * n[i]);  // zeroed, huge pages for the caches
    ok &= *bufs[i] != NULL;
  }
  e->bytes = (long)ct_engine_bytes(c, o);
  e->ids = malloc(sizeof(int) * N);
  e->pos = malloc(sizeof(int) * N);
  e->slot = malloc(sizeof(int) * N);
  if (w->lora) {
    long widest = 0;
    for (int t = 0; t < CT_LORA_TARGETS; t++) {
      int in, out, row0;
      ct_lora_dims(&w->lora->mc, t, &in, &out, &row0);
      widest = in > widest ? in : out > widest ? out : widest;
    }
    ok &= (e->lora_u = malloc(sizeof(float) * N * w->lora->cfg.r)) != NULL;
    ok &= (e->lora_p = malloc(sizeof(float) * widest * w->lora->cfg.r)) != NULL;
  }
  ok &= e->ids && e->pos && e->slot;
  if (!ok) {
    long mb = e->bytes / 1000000;
    ct_engine_free(e);
    return ct_set_error(CT_ENOMEM, "engine: cannot allocate %ld MB (KV cache for %d slots x %d "
                        "positions); lower slots or max_len", mb, o->slots, o->max_len);
  }
  ct_rope_fill(c, o->max_len, e->rope_cos, e->rope_sin);
  *out = e;
  return 0;
}

void ct_engine_free(ct_engine *e) {
  if (!e) return;
  float *bufs[N_BUFS] = {e->kcache, e->vcache, e->rope_cos, e->rope_sin, e->x, e->ln, e->xo,
                         e->qkv, e->qkv_save, e->qk_rstd, e->rstd, e->att, e->gu, e->h, e->scores};
  for (int i = 0; i < N_BUFS; i++) ct_big_free(bufs[i]);
  ct_free_all(e->ids, e->pos, e->slot, e->lora_u, e->lora_p, e);
}

const ct_infer_weights *ct_engine_weights(const ct_engine *e) { return e->w; }
ct_engine_opts ct_engine_options(const ct_engine *e) { return e->o; }

// The cache row of (layer, slot, position).
static inline long cache_row(const ct_engine *e, int l, int s, int p) {
  return (((long)l * e->o.slots + s) * e->o.max_len + p) * (long)(e->KV * e->hd);
}

typedef struct {
  ct_engine *e;
  int l, n;
} pass_job;

// Token i's k and v into its slot's cache.
static void store_kv_task(void *ctx, int i, int thread) {
  (void)thread;
  const pass_job *j = ctx;
  ct_engine *e = j->e;
  long KVd = (long)e->KV * e->hd, row = cache_row(e, j->l, e->slot[i], e->pos[i]);
  const float *k = e->qkv + (long)i * e->QKV + (long)e->H * e->hd;
  memcpy(e->kcache + row, k, sizeof(float) * KVd);
  memcpy(e->vcache + row, k + KVd, sizeof(float) * KVd);
}

#if defined(__AVX512F__)
#include <immintrin.h>

// v[j] (16 vectors) -> one vector whose lane j is the sum of v[j]'s lanes.
static inline __m512 hsum16(const __m512 v[16]) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; i++)  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; i++)  // per 128-bit lane: the lane's sum of v[4i .. 4i+3]
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44), _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xEE));
  __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xDD));
}

// s[p] = q·k_p for 16 positions from K (row stride ld), head size 16·nc.
static inline __attribute__((always_inline)) void scores16(const float *q, const float *K, long ld, float *s,
                                                           const int nc) {
  __m512 v[16];
  for (int j = 0; j < 16; j++) {
    const float *k = K + j * ld;
    __m512 a = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(k));
    for (int c = 1; c < nc; c++) a = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * c), _mm512_loadu_ps(k + 16 * c), a);
    v[j] = a;
  }
  _mm512_storeu_ps(s, hsum16(v));
}

// o (16·nc) = Σ_p a[p]·v_p over P rows of V (row stride ld), accumulated in registers.
static inline __attribute__((always_inline)) void weighted_sum(const float *a, const float *V, long ld, int P,
                                                               float *o, const int nc) {
  __m512 acc[8];
  for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
  for (int p = 0; p < P; p++) {
    __m512 w = _mm512_set1_ps(a[p]);
    for (int c = 0; c < nc; c++) acc[c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(V + p * ld + 16 * c), acc[c]);
  }
  for (int c = 0; c < nc; c++) _mm512_storeu_ps(o + 16 * c, acc[c]);
}
#endif

// One query head over P cached positions: scores into s (scaled, then exp'd), its output
// into o (hd).
static void attend_head(const float *q, const float *K, const float *V, long ld, int P, int hd, float scale,
                        float *s, float *o) {
  int p = 0;
#if defined(__AVX512F__)
  if (hd == 64)
    for (; p + 16 <= P; p += 16) scores16(q, K + p * ld, ld, s + p, 4);
  else if (hd == 128)
    for (; p + 16 <= P; p += 16) scores16(q, K + p * ld, ld, s + p, 8);
#endif
  for (; p < P; p++) {
    const float *k = K + p * ld;
    float d = 0;
#pragma omp simd reduction(+ : d)
    for (int t = 0; t < hd; t++) d += q[t] * k[t];
    s[p] = d;
  }
  float mx = -INFINITY;
  for (p = 0; p < P; p++) {
    s[p] *= scale;
    mx = s[p] > mx ? s[p] : mx;
  }
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (p = 0; p < P; p++) {
    s[p] = ct_expf(s[p] - mx);
    sum += s[p];
  }
  float inv = 1.0f / sum;
  for (p = 0; p < P; p++) s[p] *= inv;
#if defined(__AVX512F__)
  if (hd == 64) {
    weighted_sum(s, V, ld, P, o, 4);
    return;
  }
  if (hd == 128) {
    weighted_sum(s, V, ld, P, o, 8);
    return;
  }
#endif
  memset(o, 0, sizeof(float) * hd);
  for (p = 0; p < P; p++) {
    const float *v = V + p * ld;
#pragma omp simd
    for (int t = 0; t < hd; t++) o[t] += s[p] * v[t];
  }
}

// Attention of token i's query heads of kv group g over its slot's positions 0..pos. A
// token's result depends on its own query and its slot's cache only, never on the pass.
static void attend_task(void *ctx, int task, int thread) {
  const pass_job *j = ctx;
  ct_engine *e = j->e;
  int i = task / e->KV, g = task % e->KV, rep = e->H / e->KV, hd = e->hd, P = e->pos[i] + 1;
  long KVd = (long)e->KV * hd, base = cache_row(e, j->l, e->slot[i], 0) + (long)g * hd;
  float *sc = e->scores + (long)thread * rep * e->o.max_len;
  for (int r = 0; r < rep; r++) {
    int h = g * rep + r;
    attend_head(e->qkv + (long)i * e->QKV + (long)h * hd, e->kcache + base, e->vcache + base, KVd, P, hd,
                1.0f / sqrtf((float)hd), sc + (long)r * e->o.max_len, e->att + (long)i * e->H * hd + (long)h * hd);
  }
}

static void embed_rows(ct_engine *e, int n) {
  const ct_linear *E = &e->w->embed;
  if (E->f32) {
    ct_embed_forward(e->x, E->f32, e->ids, n, e->C);
    return;
  }
  for (int i = 0; i < n; i++) ct_linear_row(E, e->ids[i], e->x + (long)i * e->C);
}

// Adapter t of layer l on the n rows of x (n, ldx): y (n, ldy) += s · (x·Aᵀ)·Bᵀ in the
// target's columns. A and B are packed into panels on every call (they train between
// generations; packing is r·(in + out) values next to a pass's n·r·(in + out) products), so
// each output is a fixed-order chain (panel.h) and batching changes no bit here either.
static void lora_add(ct_engine *e, int l, int t, const float *x, int ldx, int n, float *y, int ldy) {
  const ct_lora *lo = e->w->lora;
  if (!lo || !lo->w[l][t].A) return;
  int in, out, row0, r = lo->cfg.r;
  ct_lora_dims(&lo->mc, t, &in, &out, &row0);
  ct_panel_pack(lo->w[l][t].A, r, in, e->lora_p);
  ct_linear m = {.rows = r, .cols = in, .p32 = e->lora_p};
  ct_linear_forward(&m, x, ldx, n, e->lora_u, r, 0);
  for (long i = 0; i < (long)n * r; i++) e->lora_u[i] *= lo->scale;
  ct_panel_pack(lo->w[l][t].B, out, r, e->lora_p);
  m = (ct_linear){.rows = out, .cols = r, .p32 = e->lora_p};
  ct_linear_forward(&m, e->lora_u, r, n, y + row0, ldy, 1);
}

static int pass(ct_engine *e, int n, const int *ids, const int *slot, const int *pos,
                const int *out, int nout, float *logits, float *hidden) {
  if (n < 1 || n > e->o.max_tokens)
    return ct_set_error(CT_EINVAL, "engine: %d tokens in one pass (capacity %d)", n, e->o.max_tokens);
  for (int i = 0; i < n; i++) {
    if (slot[i] < 0 || slot[i] >= e->o.slots || pos[i] < 0 || pos[i] >= e->o.max_len)
      return ct_set_error(CT_EINVAL, "engine: token %d at slot %d position %d is outside %d slots "
                          "x %d positions", i, slot[i], pos[i], e->o.slots, e->o.max_len);
    if (ids[i] < 0 || ids[i] >= e->V)
      return ct_set_error(CT_EINVAL, "engine: token id %d is outside the vocabulary of %d", ids[i], e->V);
  }
  for (int k = 0; k < nout; k++)
    if (out[k] < 0 || out[k] >= n) return ct_set_error(CT_EINVAL, "engine: output row %d is not a token of the pass", out[k]);
  memcpy(e->ids, ids, sizeof(int) * n);
  memcpy(e->pos, pos, sizeof(int) * n);
  memcpy(e->slot, slot, sizeof(int) * n);
  const ct_model_config *c = &e->w->cfg;
  int C = e->C, QKV = e->QKV, Hd = e->H * e->hd, F = e->F;
  embed_rows(e, n);
  for (int l = 0; l < e->L; l++) {
    const ct_infer_layer *w = &e->w->layers[l];
    pass_job j = {e, l, n};
    ct_rmsnorm_forward(e->ln, e->rstd, e->x, w->ln1, n, C, c->rms_norm_eps);
    ct_linear_forward(&w->qkv, e->ln, C, n, e->qkv, QKV, 0);  // (n, QKV)
    for (int t = CT_LORA_Q; t <= CT_LORA_V; t++) lora_add(e, l, t, e->ln, C, n, e->qkv, QKV);
    if (w->bqkv) ct_bias_forward(e->qkv, w->bqkv, n, QKV, QKV);
    if (w->qnorm) {
      ct_headnorm_forward(e->qkv, e->qkv_save, e->qk_rstd, w->qnorm, n, e->H, e->hd, QKV, c->rms_norm_eps);
      ct_headnorm_forward(e->qkv + Hd, e->qkv_save + Hd, e->qk_rstd + (long)n * e->H, w->knorm,
                          n, e->KV, e->hd, QKV, c->rms_norm_eps);
    }
    ct_rope(e->qkv, e->pos, e->rope_cos, e->rope_sin, n, e->H + e->KV, e->hd, QKV, 0);
    ct_parallel_for(n, store_kv_task, &j);         // every k/v of the pass is cached first,
    ct_parallel_for(n * e->KV, attend_task, &j);   // then each token reads its slot
    ct_linear_forward(&w->o, e->att, Hd, n, e->x, C, 1);        // x += att · Woᵀ
    lora_add(e, l, CT_LORA_O, e->att, Hd, n, e->x, C);
    ct_rmsnorm_forward(e->ln, e->rstd, e->x, w->ln2, n, C, c->rms_norm_eps);
    ct_linear_forward(&w->gu, e->ln, C, n, e->gu, 2 * F, 0);    // (n, 2F)
    lora_add(e, l, CT_LORA_GATE, e->ln, C, n, e->gu, 2 * F);
    lora_add(e, l, CT_LORA_UP, e->ln, C, n, e->gu, 2 * F);
    ct_swiglu_forward(e->h, e->gu, n, F);
    ct_linear_forward(&w->down, e->h, F, n, e->x, C, 1);        // x += h · Wdownᵀ
    lora_add(e, l, CT_LORA_DOWN, e->h, F, n, e->x, C);
  }
  if (nout == 0) return 0;
  if (hidden) {  // straight into the caller's buffer
    for (int k = 0; k < nout; k++) memcpy(e->xo + (long)k * C, e->x + (long)out[k] * C, sizeof(float) * C);
    ct_rmsnorm_forward(hidden, e->rstd, e->xo, e->w->norm, nout, C, c->rms_norm_eps);
    return 0;
  }
  for (int k = 0; k < nout; k++) memcpy(e->xo + (long)k * C, e->x + (long)out[k] * C, sizeof(float) * C);
  ct_rmsnorm_forward(e->ln, e->rstd, e->xo, e->w->norm, nout, C, c->rms_norm_eps);
  ct_linear_forward(&e->w->lm_head, e->ln, C, nout, logits, e->V, 0);
  return 0;
}

int ct_engine_forward(ct_engine *e, int n, const int *ids, const int *slot, const int *pos,
                      const int *out, int nout, float *logits) {
  return pass(e, n, ids, slot, pos, out, nout, logits, NULL);
}

int ct_engine_forward_hidden(ct_engine *e, int n, const int *ids, const int *slot, const int *pos,
                             const int *out, int nout, float *hidden) {
  return pass(e, n, ids, slot, pos, out, nout, NULL, hidden);
}

int ct_engine_copy_slot(ct_engine *e, int src, int dst, int len) {
  if (src < 0 || src >= e->o.slots || dst < 0 || dst >= e->o.slots || len < 0 || len > e->o.max_len)
    return ct_set_error(CT_EINVAL, "engine: cannot copy %d positions from slot %d to slot %d", len, src, dst);
  if (src == dst || len == 0) return 0;
  size_t bytes = sizeof(float) * (size_t)len * e->KV * e->hd;
  for (int l = 0; l < e->L; l++) {
    memcpy(e->kcache + cache_row(e, l, dst, 0), e->kcache + cache_row(e, l, src, 0), bytes);
    memcpy(e->vcache + cache_row(e, l, dst, 0), e->vcache + cache_row(e, l, src, 0), bytes);
  }
  return 0;
}
