// forward: one decoder layer recipe run over a batch with sgemm, keeping what backward
// needs (or one layer's storage with keep = false), and its backward. The sampler's
// engine.c runs the same recipe token by token over a KV cache, batch-invariant (fixed
// order dot products); a change to the layer goes into both.
#include "forward.h"

#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "error.h"
#include "kernels.h"
#include "matmul.h"
#include "pool.h"

typedef struct {
  long C, F, H, KV, hd, QKV, L;
} dims;

static dims dims_of(const ct_model_config *c) {
  dims d = {c->hidden_size, c->intermediate_size, c->num_heads, c->num_kv_heads, c->head_dim, 0,
            c->num_layers};
  d.QKV = (d.H + 2 * d.KV) * d.hd;
  return d;
}

static long max3(long a, long b, long c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

int ct_acts_init(ct_acts *a, const ct_model *m, int B, int T, bool keep) {
  memset(a, 0, sizeof *a);
  dims d = dims_of(&m->cfg);
  long N = (long)B * T, Ls = keep ? d.L : 1;
  bool qkn = m->cfg.qk_norm;
  a->B = B;
  a->T = T;
  a->keep = keep;
  // reductions: rmsnorm (C), head norm (hd <= QKV), qkv bias (QKV); attention blocks
  long scratch = max3(CT_RED_CHUNKS * (d.C > d.QKV ? d.C : d.QKV),
                      (long)ct_pool_threads() * ct_attention_scratch_floats(T), 1);
  // Sizes in floats, in the order they are carved below; each rounded to 16 floats.
  long sizes[] = {
      (Ls + 1) * N * d.C, Ls * N * d.C, Ls * N, Ls * N * d.QKV,
      qkn ? Ls * N * d.QKV : 0, qkn ? Ls * N * (d.H + d.KV) : 0, Ls * N * d.H * d.hd,
      Ls * N * d.H, keep ? Ls * N * d.C : 0, Ls * N * d.C, Ls * N, Ls * N * 2 * d.F, Ls * N * d.F,
      N * d.C, N,
      keep ? N * d.C : 0, keep ? N * d.C : 0, keep ? N * d.QKV : 0, keep ? N * d.H * d.hd : 0,
      keep ? N * 2 * d.F : 0, keep ? N * d.F : 0, scratch,
      3 * ((N + 15) / 16 * 16)};  // ids, pos, seg (ints are float-sized)
  float **slots[] = {&a->x, &a->ln1, &a->rstd1, &a->qkv, &a->qkv_pre, &a->qk_rstd, &a->att,
                     &a->lse, &a->x2, &a->ln2, &a->rstd2, &a->gu, &a->h, &a->lnf, &a->rstdf,
                     &a->dres, &a->dln, &a->dqkv, &a->datt, &a->dgu, &a->dh, &a->scratch, NULL};
  int n = sizeof sizes / sizeof sizes[0];
  long total = 0;
  for (int i = 0; i < n; i++) total += (sizes[i] + 15) / 16 * 16;
  a->mem = aligned_alloc(64, sizeof(float) * total);
  if (!a->mem)
    return ct_set_error(CT_ENOMEM, "cannot allocate %.1f MB of activations for %d x %d tokens",
                        total * 4.0 / 1e6, B, T);
  memset(a->mem, 0, sizeof(float) * total);
  float *p = a->mem;
  for (int i = 0; i < n - 1; i++) {
    *slots[i] = sizes[i] ? p : NULL;
    p += (sizes[i] + 15) / 16 * 16;
  }
  long Np = (N + 15) / 16 * 16;
  a->ids = (int *)p;
  a->pos = (int *)p + Np;
  a->seg = (int *)p + 2 * Np;
  return 0;
}

void ct_acts_free(ct_acts *a) {
  free(a->mem);
  memset(a, 0, sizeof *a);
}

// The slot of layer l in a per-layer buffer of `per` floats per layer (slot 0 when the
// activations are not kept).
#define AT(a, buf, l, per) ((buf) + ((a)->keep ? (long)(l) * (per) : 0))

void ct_forward(const ct_model *m, ct_acts *a, int B, int T) {
  const ct_model_config *c = &m->cfg;
  dims d = dims_of(c);
  long N = (long)B * T;
  ct_attn_dims ad = {B, T, (int)d.H, (int)d.KV, (int)d.hd};
  // Stride of per-layer buffers is set by capacity, not by this batch, so that the
  // layout does not depend on B and T.
  long Ncap = (long)a->B * a->T;
  ct_embed_forward(a->x, m->w.embed, a->ids, (int)N, (int)d.C);
  for (int l = 0; l < d.L; l++) {
    const ct_layer_weights *w = &m->w.layers[l];
    float *x = AT(a, a->x, l, Ncap * d.C);                  // (N, C) layer input
    float *xn = a->keep ? x + Ncap * d.C : x;               // (N, C) layer output
    float *ln1 = AT(a, a->ln1, l, Ncap * d.C);              // (N, C)
    float *rstd1 = AT(a, a->rstd1, l, Ncap);                // (N)
    float *qkv = AT(a, a->qkv, l, Ncap * d.QKV);            // (N, QKV)
    float *att = AT(a, a->att, l, Ncap * d.H * d.hd);       // (N, H*hd)
    float *lse = AT(a, a->lse, l, Ncap * d.H);              // (N, H)
    float *x2 = a->keep ? AT(a, a->x2, l, Ncap * d.C) : x;  // (N, C) (in place when not kept)
    float *ln2 = AT(a, a->ln2, l, Ncap * d.C);              // (N, C)
    float *rstd2 = AT(a, a->rstd2, l, Ncap);                // (N)
    float *gu = AT(a, a->gu, l, Ncap * 2 * d.F);            // (N, 2F)
    float *h = AT(a, a->h, l, Ncap * d.F);                  // (N, F)

    ct_rmsnorm_forward(ln1, rstd1, x, w->ln1, (int)N, (int)d.C, c->rms_norm_eps);
    ct_sgemm('N', 'T', (int)N, (int)d.QKV, (int)d.C, 1, ln1, (int)d.C, w->wqkv, (int)d.C, 0, qkv,
             (int)d.QKV);
    if (w->bqkv) ct_bias_forward(qkv, w->bqkv, (int)N, (int)d.QKV, (int)d.QKV);
    if (c->qk_norm) {
      float *pre = AT(a, a->qkv_pre, l, Ncap * d.QKV);
      float *r = AT(a, a->qk_rstd, l, Ncap * (d.H + d.KV));
      // q heads and k heads have separate weights: two calls over the same rows
      ct_headnorm_forward(qkv, pre, r, w->qnorm, (int)N, (int)d.H, (int)d.hd, (int)d.QKV,
                          c->rms_norm_eps);
      ct_headnorm_forward(qkv + d.H * d.hd, pre + d.H * d.hd, r + N * d.H, w->knorm, (int)N,
                          (int)d.KV, (int)d.hd, (int)d.QKV, c->rms_norm_eps);
    }
    // q and k heads are adjacent: rotate all H + KV of them in one pass
    ct_rope(qkv, a->pos, m->rope_cos, m->rope_sin, (int)N, (int)(d.H + d.KV), (int)d.hd,
            (int)d.QKV, 0);
    ct_attention_forward(att, lse, qkv, a->seg, ad, a->scratch);
    if (x2 != x) memcpy(x2, x, sizeof(float) * N * d.C);
    ct_sgemm('N', 'T', (int)N, (int)d.C, (int)(d.H * d.hd), 1, att, (int)(d.H * d.hd), w->wo,
             (int)(d.H * d.hd), 1, x2, (int)d.C);
    ct_rmsnorm_forward(ln2, rstd2, x2, w->ln2, (int)N, (int)d.C, c->rms_norm_eps);
    ct_sgemm('N', 'T', (int)N, (int)(2 * d.F), (int)d.C, 1, ln2, (int)d.C, w->wgu, (int)d.C, 0,
             gu, (int)(2 * d.F));
    ct_swiglu_forward(h, gu, (int)N, (int)d.F);
    if (xn != x2) memcpy(xn, x2, sizeof(float) * N * d.C);
    ct_sgemm('N', 'T', (int)N, (int)d.C, (int)d.F, 1, h, (int)d.F, w->wdown, (int)d.F, 1, xn,
             (int)d.C);
  }
  float *xl = a->keep ? a->x + d.L * Ncap * d.C : a->x;
  ct_rmsnorm_forward(a->lnf, a->rstdf, xl, m->w.norm, (int)N, (int)d.C, c->rms_norm_eps);
}

void ct_backward(const ct_model *m, const ct_weights *g, ct_acts *a, const float *dlnf, int B,
                 int T) {
  const ct_model_config *c = &m->cfg;
  dims d = dims_of(c);
  long N = (long)B * T, Ncap = (long)a->B * a->T;
  int Hd = (int)(d.H * d.hd);
  ct_attn_dims ad = {B, T, (int)d.H, (int)d.KV, (int)d.hd};
  float *dres = a->dres;  // (N, C) gradient of the residual stream, carried down the layers
  ct_rmsnorm_backward(dres, g->norm, dlnf, a->x + d.L * Ncap * d.C, m->w.norm, a->rstdf, (int)N,
                      (int)d.C, 0, a->scratch);
  for (int l = (int)d.L - 1; l >= 0; l--) {
    const ct_layer_weights *w = &m->w.layers[l];
    const ct_layer_weights *gw = &g->layers[l];
    float *x = a->x + l * Ncap * d.C;
    float *ln1 = a->ln1 + l * Ncap * d.C, *rstd1 = a->rstd1 + l * Ncap;
    float *qkv = a->qkv + l * Ncap * d.QKV;
    float *att = a->att + l * Ncap * Hd, *lse = a->lse + l * Ncap * d.H;
    float *x2 = a->x2 + l * Ncap * d.C;
    float *ln2 = a->ln2 + l * Ncap * d.C, *rstd2 = a->rstd2 + l * Ncap;
    float *gu = a->gu + l * Ncap * 2 * d.F, *h = a->h + l * Ncap * d.F;

    // MLP: xn = x2 + h · Wdownᵀ
    ct_sgemm('N', 'N', (int)N, (int)d.F, (int)d.C, 1, dres, (int)d.C, w->wdown, (int)d.F, 0,
             a->dh, (int)d.F);                                        // dh (N, F)
    ct_sgemm('T', 'N', (int)d.C, (int)d.F, (int)N, 1, dres, (int)d.C, h, (int)d.F, 1, gw->wdown,
             (int)d.F);                                               // dWdown (C, F)
    ct_swiglu_backward(a->dgu, a->dh, gu, (int)N, (int)d.F);          // dgu (N, 2F)
    ct_sgemm('N', 'N', (int)N, (int)d.C, (int)(2 * d.F), 1, a->dgu, (int)(2 * d.F), w->wgu,
             (int)d.C, 0, a->dln, (int)d.C);                          // dln2 (N, C)
    ct_sgemm('T', 'N', (int)(2 * d.F), (int)d.C, (int)N, 1, a->dgu, (int)(2 * d.F), ln2,
             (int)d.C, 1, gw->wgu, (int)d.C);                         // dWgu (2F, C)
    ct_rmsnorm_backward(dres, gw->ln2, a->dln, x2, w->ln2, rstd2, (int)N, (int)d.C, 1,
                        a->scratch);                                  // dres is now dx2

    // attention: x2 = x + att · Woᵀ
    ct_sgemm('N', 'N', (int)N, Hd, (int)d.C, 1, dres, (int)d.C, w->wo, Hd, 0, a->datt, Hd);
    ct_sgemm('T', 'N', (int)d.C, Hd, (int)N, 1, dres, (int)d.C, att, Hd, 1, gw->wo, Hd);
    ct_attention_backward(a->dqkv, a->datt, att, lse, qkv, a->seg, ad, a->scratch);
    ct_rope(a->dqkv, a->pos, m->rope_cos, m->rope_sin, (int)N, (int)(d.H + d.KV), (int)d.hd,
            (int)d.QKV, 1);
    if (c->qk_norm) {
      float *pre = a->qkv_pre + l * Ncap * d.QKV;
      float *r = a->qk_rstd + l * Ncap * (d.H + d.KV);
      ct_headnorm_backward(a->dqkv, gw->qnorm, pre, w->qnorm, r, (int)N, (int)d.H, (int)d.hd,
                           (int)d.QKV, a->scratch);
      ct_headnorm_backward(a->dqkv + d.H * d.hd, gw->knorm, pre + d.H * d.hd, w->knorm,
                           r + N * d.H, (int)N, (int)d.KV, (int)d.hd, (int)d.QKV, a->scratch);
    }
    if (gw->bqkv) ct_bias_backward(gw->bqkv, a->dqkv, (int)N, (int)d.QKV, (int)d.QKV, a->scratch);
    ct_sgemm('N', 'N', (int)N, (int)d.C, (int)d.QKV, 1, a->dqkv, (int)d.QKV, w->wqkv, (int)d.C,
             0, a->dln, (int)d.C);                                    // dln1 (N, C)
    ct_sgemm('T', 'N', (int)d.QKV, (int)d.C, (int)N, 1, a->dqkv, (int)d.QKV, ln1, (int)d.C, 1,
             gw->wqkv, (int)d.C);                                     // dWqkv (QKV, C)
    ct_rmsnorm_backward(dres, gw->ln1, a->dln, x, w->ln1, rstd1, (int)N, (int)d.C, 1,
                        a->scratch);                                  // dres is now dx
  }
  ct_embed_backward(g->embed, dres, a->ids, (int)N, (int)d.C);
}
