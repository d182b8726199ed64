// forward: one decoder layer recipe run over a batch with sgemm, keeping what backward
// needs (or one layer's storage with keep = false), and its backward. The sampler's
// engine.c runs the same recipe token by token over a KV cache, batch-invariant (fixed
// order dot products); a change to the layer goes into both.
#include "forward.h"

#include <stdlib.h>
#include <string.h>

#include "adapter.h"
#include "attention.h"
#include "dnnl.h"
#include "error.h"
#include "mem.h"
#include "kernels.h"
#include "lora.h"
#include "matmul.h"
#include "pool.h"
#include "prof.h"
#include "stop.h"
#include "thin.h"

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

enum { N_SLOTS = 28 };  // buffers carved from ct_acts.mem, in this order (ids/pos/seg/pre last)

// Layers whose activations a CT_ACTS_RECOMPUTE forward keeps (the top ones), within [0, L).
static long kept_layers(const ct_model_config *c, int mode, int kept) {
  return mode != CT_ACTS_RECOMPUTE || kept < 0 ? 0 : kept < c->num_layers ? kept : c->num_layers - 1;
}

// Kept layers whose gu is kept in bf16 (ct_acts.gu16): with bf16 compute, RECOMPUTE's, not Gemma's.
static long gu16_layers(const ct_model_config *c, int mode, int kept, bool b16) {
  return b16 && !c->gemma ? kept_layers(c, mode, kept) : 0;
}

// Sizes in floats of every buffer of ct_acts for B x T tokens in `mode` (RECOMPUTE: the top
// `kept` layers' activations kept besides the recomputation's one layer; b16: bf16 compute).
static void acts_sizes(const ct_model_config *c, int B, int T, int mode, int kept, bool b16, long sizes[N_SLOTS]) {
  dims d = dims_of(c);
  long N = (long)B * T;
  bool keep = mode == CT_ACTS_KEEP, back = mode != CT_ACTS_FORWARD, qkn = c->qk_norm, gem = c->gemma;
  long Ls = keep ? d.L : 1 + kept_layers(c, mode, kept), Lx = back ? d.L + 1 : 1;  // per-layer slots; residual slots
  long Lgu = Ls - gu16_layers(c, mode, kept, b16);  // gu's fp32 slots
  // reductions: rmsnorm (C), head norm (hd <= QKV), qkv bias (QKV); attention blocks
  long scratch = max3(CT_RED_CHUNKS * (d.C > d.QKV ? d.C : d.QKV),
                      (long)ct_pool_threads() * ct_attention_scratch_floats(T, c->head_dim, c->attn_softcap > 0), 1);
  long v[N_SLOTS] = {
      Lx * N * d.C, N * d.C, Ls * N, Ls * N * d.QKV,
      qkn ? Ls * N * d.QKV : 0, qkn ? Ls * N * (d.H + d.KV) : 0, Ls * N * d.H * d.hd,
      Ls * N * d.H, back ? Ls * N * d.C : 0, 0, Ls * N, Lgu * N * 2 * d.F, N * d.F,
      N * d.C, N,
      back ? N * d.C : 0, back ? N * d.C : 0, back ? N * d.QKV : 0, back ? N * d.H * d.hd : 0,
      back ? N * d.F : 0, scratch,  // (no dgu: backward writes it over the layer's gu)
      gem ? Ls * N * d.C : 0, gem ? Ls * N : 0, gem ? Ls * N * d.C : 0, gem ? Ls * N : 0,
      gem ? N * d.C : 0, d.C > d.hd ? d.C : d.hd,
      4 * ((N + 15) / 16 * 16)};  // ids, pos, seg, pre (ints are float-sized)
  for (int i = 0; i < N_SLOTS; i++) sizes[i] = (v[i] + 15) / 16 * 16;
}

double ct_acts_bytes(const ct_model_config *c, int B, int T, int mode) { return ct_acts_kept_bytes(c, B, T, mode, 0); }

static double kept_bytes(const ct_model_config *c, int B, int T, int mode, int kept, bool b16) {
  long sizes[N_SLOTS], total = 0;
  acts_sizes(c, B, T, mode, kept, b16, sizes);
  for (int i = 0; i < N_SLOTS; i++) total += sizes[i];
  return sizeof(float) * (double)total;
}

double ct_acts_kept_bytes(const ct_model_config *c, int B, int T, int mode, int kept) {
  return kept_bytes(c, B, T, mode, kept, false);
}

// Floats... in uint16: the widest projection input and output gradient, N rows each.
static void bf16_sizes(const ct_model_config *c, int B, int T, long *x16, long *dy16) {
  dims d = dims_of(c);
  long N = (long)B * T;
  *x16 = (N * max3(d.C, d.H * d.hd, d.F) + 31) / 32 * 32;
  *dy16 = (N * max3(d.QKV, d.C, 2 * d.F) + 31) / 32 * 32;
}

double ct_acts_bf16_bytes(const ct_model_config *c, int B, int T) {
  long x16, dy16;
  bf16_sizes(c, B, T, &x16, &dy16);
  return sizeof(uint16_t) * (double)(x16 + dy16);
}

// uint16 values of the kept layers' bf16 gu.
static long gu16_size(const ct_model_config *c, int B, int T, int mode, int kept) {
  return gu16_layers(c, mode, kept, true) * (long)B * T * 2 * c->intermediate_size;
}

double ct_acts_kept_bytes_bf16(const ct_model_config *c, int B, int T, int mode, int kept) {
  return kept_bytes(c, B, T, mode, kept, true) + ct_acts_bf16_bytes(c, B, T) +
         sizeof(uint16_t) * (double)gu16_size(c, B, T, mode, kept);
}

static int acts_bf16_init(ct_acts *a, const ct_model *m, int kept) {
  long x16, dy16, g16 = gu16_size(&m->cfg, a->B, a->T, a->mode, kept);
  bf16_sizes(&m->cfg, a->B, a->T, &x16, &dy16);
  a->mem16 = ct_big_alloc(sizeof(uint16_t) * (x16 + dy16 + g16));
  if (!a->mem16) return ct_set_error(CT_ENOMEM, "cannot allocate the bf16 matmul inputs");
  a->x16 = a->mem16;
  a->dy16 = a->mem16 + x16;
  a->gu16 = g16 ? a->dy16 + dy16 : NULL;
  return 0;
}

int ct_acts_init(ct_acts *a, const ct_model *m, int B, int T, int mode) { return ct_acts_init_kept(a, m, B, T, mode, 0); }

int ct_acts_init_kept(ct_acts *a, const ct_model *m, int B, int T, int mode, int kept) {
  memset(a, 0, sizeof *a);
  a->B = B;
  a->T = T;
  a->mode = mode;
  a->keep = mode == CT_ACTS_KEEP;
  a->kept_from = m->cfg.num_layers - (int)kept_layers(&m->cfg, mode, kept);
  long sizes[N_SLOTS], total = 0;
  acts_sizes(&m->cfg, B, T, mode, kept, m->compute16, sizes);
  for (int i = 0; i < N_SLOTS; i++) total += sizes[i];
  a->bytes = sizeof(float) * total;
  a->mem = ct_big_alloc(sizeof(float) * total);  // zeroed
  if (!a->mem)
    return ct_set_error(CT_ENOMEM, "cannot allocate %.1f MB of activations for %d x %d tokens",
                        total * 4.0 / 1e6, B, T);
  float **slots[N_SLOTS - 1] = {&a->x, &a->ln1, &a->rstd1, &a->qkv, &a->qkv_pre, &a->qk_rstd, &a->att,
                                &a->lse, &a->x2, &a->ln2, &a->rstd2, &a->gu, &a->h, &a->lnf, &a->rstdf,
                                &a->dres, &a->dln, &a->dqkv, &a->datt, &a->dh, &a->scratch,
                                &a->ao, &a->rstd_ao, &a->mo, &a->rstd_mo, &a->tmp, &a->wn};
  float *p = a->mem;
  for (int i = 0; i < N_SLOTS - 1; i++) {
    *slots[i] = sizes[i] > 0 ? p : NULL;
    p += sizes[i];
  }
  a->ln2 = a->ln1;  // one slot for both norms' outputs (forward.h)
  long Np = (long)B * T, Npad = (Np + 15) / 16 * 16;
  a->ids = (int *)p;
  a->pos = (int *)p + Npad;
  a->seg = (int *)p + 2 * Npad;
  a->pre = (int *)p + 3 * Npad;
  return m->compute16 ? acts_bf16_init(a, m, kept) : 0;
}

double ct_lora_acts_bytes(const ct_lora_config *lc, const ct_model_config *c, int B, int T, int mode) {
  return sizeof(float) * (double)ct_adapter_work_floats(lc, c, (long)B * T, mode);
}

int ct_acts_attach_lora(ct_acts *a, const ct_lora *lo) {
  ct_big_free(a->lora_mem);
  a->lora_mem = NULL;
  a->lora = lo;
  if (!lo) return 0;
  a->lora_mem = ct_big_alloc((size_t)ct_lora_acts_bytes(&lo->cfg, &lo->mc, a->B, a->T, a->mode));
  if (!a->lora_mem) return ct_set_error(CT_ENOMEM, "cannot allocate the LoRA work space");
  return 0;
}

double ct_acts_rows_bytes(const ct_model_config *c, int T_row) {
  return sizeof(float) * (double)ct_pool_threads() * ct_attention_scratch_floats(T_row, c->head_dim, c->attn_softcap > 0);
}

int ct_acts_long_rows(ct_acts *a, const ct_model *m, int T_row) {
  ct_big_free(a->row_scratch);
  a->row_scratch = NULL;
  a->row_T = 0;
  if (T_row <= a->T) return 0;
  a->row_scratch = ct_big_alloc((size_t)ct_acts_rows_bytes(&m->cfg, T_row));
  if (!a->row_scratch)
    return ct_set_error(CT_ENOMEM, "cannot allocate %.1f MB of attention blocks for rows of %d tokens",
                        ct_acts_rows_bytes(&m->cfg, T_row) / 1e6, T_row);
  a->row_T = T_row;
  return 0;
}

void ct_acts_free(ct_acts *a) {
  ct_big_free(a->row_scratch);
  ct_big_free(a->lora_mem);
  ct_big_free(a->mem);
  ct_big_free(a->mem16);
  memset(a, 0, sizeof *a);
}

// One layer's activations: where layer l reads its input and writes each intermediate.
// Per-layer buffers have a slot per layer (CT_ACTS_KEEP) or one slot reused; the
// residual stream has L+1 slots except in CT_ACTS_FORWARD, where it is updated in place.
// Strides are the last forward's token count a->n: a batch smaller than the capacity uses
// (and so touches) the start of every buffer only.
typedef struct {
  float *x;       // (N, C) layer input
  float *xn;      // (N, C) layer output (x itself in CT_ACTS_FORWARD)
  float *ln1, *rstd1, *qkv, *qkv_pre, *qk_rstd, *att, *lse;
  float *x2;      // (N, C) residual after attention (x itself in CT_ACTS_FORWARD)
  float *ln2, *rstd2, *gu, *h;
  uint16_t *gu16;  // a kept layer's gu in bf16 (ct_acts.gu16; gu is then the fp32 scratch), or NULL
  float *ao, *rstd_ao, *mo, *rstd_mo;  // Gemma's post-norm inputs, else NULL
} layer_acts;

// Layer l's storage: its own slot when kept (every layer for CT_ACTS_KEEP, the top ones from
// kept_from for CT_ACTS_RECOMPUTE), else slot 0, the one the recomputation reuses.
static layer_acts layer_slots(const ct_acts *a, const dims *d, int l) {
  long Nc = a->n, s = a->keep ? l : a->mode == CT_ACTS_RECOMPUTE && l >= a->kept_from ? 1 + l - a->kept_from : 0;
  bool fwd = a->mode == CT_ACTS_FORWARD;
  layer_acts la;
  la.x = a->x + (fwd ? 0 : l) * Nc * d->C;
  la.xn = fwd ? la.x : la.x + Nc * d->C;
  la.ln1 = a->ln1;  // one slot: backward recomputes ln1 and ln2 (the same bits)
  la.rstd1 = a->rstd1 + s * Nc;
  la.qkv = a->qkv + s * Nc * d->QKV;
  la.qkv_pre = a->qkv_pre ? a->qkv_pre + s * Nc * d->QKV : NULL;
  la.qk_rstd = a->qk_rstd ? a->qk_rstd + s * Nc * (d->H + d->KV) : NULL;
  la.att = a->att + s * Nc * d->H * d->hd;
  la.lse = a->lse + s * Nc * d->H;
  la.x2 = fwd ? la.x : a->x2 + s * Nc * d->C;
  la.ln2 = a->ln2;
  la.rstd2 = a->rstd2 + s * Nc;
  bool g16 = a->gu16 && s > 0;  // (gu16 is only ever RECOMPUTE's kept layers: slots 1..)
  la.gu = a->gu + (g16 ? 0 : s) * Nc * 2 * d->F;
  la.gu16 = g16 ? a->gu16 + (s - 1) * Nc * 2 * d->F : NULL;
  la.ao = a->ao ? a->ao + s * Nc * d->C : NULL;
  la.rstd_ao = a->rstd_ao ? a->rstd_ao + s * Nc : NULL;
  la.mo = a->mo ? a->mo + s * Nc * d->C : NULL;
  la.rstd_mo = a->rstd_mo ? a->rstd_mo + s * Nc : NULL;
  la.h = a->h;  // one slot: backward recomputes h = swiglu(gu), cheaper than keeping L of them
  return la;
}

// ---------------------------------------------------------------------------
// A projection y = x · Wᵀ with W (out, in) as Hugging Face stores it, and its backward:
// fp32 sgemm, or (bf16 compute) x and W rounded to bf16, products summed in fp32.

// y (N, out) = x (N, in; row stride ldx) · Wᵀ + beta · y (row stride ldy). x16_ready: a->x16
// already holds x rounded to bf16 in packed rows (its producer wrote it in the same pass).
static void proj_forward_r(const ct_model *m, const ct_acts *a, long N, int out, int in, const float *x,
                           int ldx, const float *W, float beta, float *y, int ldy, bool x16_ready) {
  const uint16_t *W16 = ct_model_w16(m, W);
  if (!W16) {
    CT_PROF(CT_PROF_PRODUCT, ct_sgemm('N', 'T', (int)N, out, in, 1, x, ldx, W, in, beta, y, ldy));
    return;
  }
  if (!x16_ready) CT_PROF(CT_PROF_NARROW, ct_bf16_narrow_rows(a->x16, x, (int)N, in, ldx));
  CT_PROF(CT_PROF_PRODUCT, ct_gemm_bf16('N', 'T', (int)N, out, in, a->x16, in, W16, in, beta, y, ldy));
}

static void proj_forward(const ct_model *m, const ct_acts *a, long N, int out, int in, const float *x,
                         int ldx, const float *W, float beta, float *y, int ldy) {
  proj_forward_r(m, a, N, out, in, x, ldx, W, beta, y, ldy, false);
}

// dx (N, in) = dy (N, out) · W and, when gW, gW (out, in) += dyᵀ · x (x (N, in)); packed rows.
// dy16_ready: a->dy16 already holds dy rounded to bf16.
static void proj_backward_r(const ct_model *m, const ct_acts *a, long N, int out, int in, const float *dy,
                            const float *x, const float *W, float *gW, float *dx, bool dy16_ready) {
  const uint16_t *W16 = ct_model_w16(m, W);
  if (!W16) {
    CT_PROF(CT_PROF_PRODUCT, ct_sgemm('N', 'N', (int)N, in, out, 1, dy, out, W, in, 0, dx, in));
    CT_PROF(CT_PROF_PRODUCT, if (gW) ct_sgemm('T', 'N', out, in, (int)N, 1, dy, out, x, in, 1, gW, in));
    return;
  }
  if (!dy16_ready) CT_PROF(CT_PROF_NARROW, ct_bf16_narrow_rows(a->dy16, dy, (int)N, out, out));
  CT_PROF(CT_PROF_PRODUCT, ct_gemm_bf16('N', 'N', (int)N, in, out, a->dy16, out, W16, in, 0, dx, in));
  if (!gW) return;
  CT_PROF(CT_PROF_NARROW, ct_bf16_narrow_rows(a->x16, x, (int)N, in, in));
  CT_PROF(CT_PROF_PRODUCT, ct_gemm_bf16('T', 'N', out, in, (int)N, a->dy16, out, a->x16, in, 1, gW, in));
}

static void proj_backward(const ct_model *m, const ct_acts *a, long N, int out, int in, const float *dy,
                          const float *x, const float *W, float *gW, float *dx) {
  proj_backward_r(m, a, N, out, in, dy, x, W, gW, dx, false);
}

// Layer l's attention options and RoPE tables (sliding layers: their window and base).
static ct_attn_dims attn_dims(const ct_model *m, const ct_acts *a, int l, int B, int T, const float **cos_t,
                              const float **sin_t) {
  const ct_model_config *c = &m->cfg;
  int win = ct_layer_window(c, l);
  *cos_t = win ? m->rope_cos_local : m->rope_cos;
  *sin_t = win ? m->rope_sin_local : m->rope_sin;
  return (ct_attn_dims){B, T, c->num_heads, c->num_kv_heads, c->head_dim, ct_attn_scale(c), win, c->attn_softcap,
                        a->has_pre ? a->pre : NULL};
}

// The attention's blocks: rows longer than the capacity's T have their own (ct_acts_long_rows).
static float *attn_scratch(const ct_acts *a, int T) { return T > a->T ? a->row_scratch : a->scratch; }

// The weight a norm multiplies by (Gemma: 1 + w, in a->wn until the next call).
#define NW(w, n) ct_norm_weight(c, (w), (int)(n), a->wn)

// Gemma's sandwich norm: y (N, C) += rmsnorm(v) (rstd saved); a->tmp holds the norm's output.
static void post_norm_add(const ct_model_config *c, const ct_acts *a, float *y, const float *v, const float *w,
                          float *rstd, long N, bool add) {
  CT_PROF(CT_PROF_NORM, ct_rmsnorm_forward(a->tmp, rstd, v, NW(w, c->hidden_size), (int)N, c->hidden_size, c->rms_norm_eps));
  if (add) ct_add_rows(y, a->tmp, N, c->hidden_size);
}

static ct_adapter_run adapters_of(const ct_acts *a) {
  return (ct_adapter_run){a->lora, a->lora_mem, (long)a->B * a->T, a->mode, false};
}

// Layer forward from la->x. With `full` false it stops once what backward reads is
// computed (recomputation: the layer's output la->xn is already there), without h when
// `need_h` is false. l indexes the adapters and QK-Clip's maxima; the attention (window,
// RoPE base) is layer `kind`'s.
static void layer_forward(const ct_model *m, int l, int kind, const ct_layer_weights *w, const layer_acts *la,
                          const ct_acts *a, int B, int T, bool full, bool need_h) {
  const ct_model_config *c = &m->cfg;
  dims d = dims_of(c);
  long N = (long)B * T;
  const float *rc, *rs;
  ct_attn_dims ad = attn_dims(m, a, kind, B, T, &rc, &rs);
  ct_adapter_run ad_run = adapters_of(a);
  ad_run.again = !full;  // (a recomputation: the adapters' u are kept)
  CT_PROF(CT_PROF_NORM, ct_rmsnorm_forward(la->ln1, la->rstd1, la->x, NW(w->ln1, d.C), (int)N, (int)d.C, c->rms_norm_eps));
  proj_forward(m, a, N, (int)d.QKV, (int)d.C, la->ln1, (int)d.C, w->wqkv, 0, la->qkv, (int)d.QKV);
  CT_PROF(CT_PROF_LORA, for (int t = CT_LORA_Q; t <= CT_LORA_V; t++) ct_adapter_forward(&ad_run, l, t, la->ln1, (int)d.C, la->qkv, (int)d.QKV, N));
  CT_PROF(CT_PROF_POINTWISE, if (w->bqkv) ct_bias_forward(la->qkv, w->bqkv, (int)N, (int)d.QKV, (int)d.QKV));
  if (c->qk_norm) {
    // q heads and k heads have separate weights: two calls over the same rows
    CT_PROF(CT_PROF_NORM, ct_headnorm_forward(la->qkv, la->qkv_pre, la->qk_rstd, NW(w->qnorm, d.hd), (int)N, (int)d.H, (int)d.hd,
                        (int)d.QKV, c->rms_norm_eps));
    CT_PROF(CT_PROF_NORM, ct_headnorm_forward(la->qkv + d.H * d.hd, la->qkv_pre + d.H * d.hd, la->qk_rstd + N * d.H,
                        NW(w->knorm, d.hd), (int)N, (int)d.KV, (int)d.hd, (int)d.QKV, c->rms_norm_eps));
  }
  // q and k heads are adjacent: rotate all H + KV of them in one pass
  CT_PROF(CT_PROF_POINTWISE, ct_rope(la->qkv, a->pos, rc, rs, (int)N, (int)(d.H + d.KV), (int)d.hd, (int)d.QKV, 0));
  CT_PROF(CT_PROF_ATTENTION, ct_attention_forward(la->att, la->lse, la->qkv, a->seg, ad, attn_scratch(a, T), a->qk_max ? a->qk_max + l * d.H : NULL));
  CT_PROF(CT_PROF_POINTWISE, if (la->x2 != la->x) ct_copy_rows(la->x2, la->x, N, (int)d.C));
  if (c->gemma) {  // x2 = x + norm(att · Woᵀ)
    proj_forward(m, a, N, (int)d.C, (int)(d.H * d.hd), la->att, (int)(d.H * d.hd), w->wo, 0, la->ao, (int)d.C);
    CT_PROF(CT_PROF_LORA, ct_adapter_forward(&ad_run, l, CT_LORA_O, la->att, (int)(d.H * d.hd), la->ao, (int)d.C, N));
    post_norm_add(c, a, la->x2, la->ao, w->post_attn, la->rstd_ao, N, true);
  } else {
    proj_forward(m, a, N, (int)d.C, (int)(d.H * d.hd), la->att, (int)(d.H * d.hd), w->wo, 1, la->x2, (int)d.C);
    CT_PROF(CT_PROF_LORA, ct_adapter_forward(&ad_run, l, CT_LORA_O, la->att, (int)(d.H * d.hd), la->x2, (int)d.C, N));
  }
  CT_PROF(CT_PROF_NORM, ct_rmsnorm_forward(la->ln2, la->rstd2, la->x2, NW(w->ln2, d.C), (int)N, (int)d.C, c->rms_norm_eps));
  proj_forward(m, a, N, (int)(2 * d.F), (int)d.C, la->ln2, (int)d.C, w->wgu, 0, la->gu, (int)(2 * d.F));
  // gate and up adapters: their u here, their s·u·Bᵀ added to gu in SwiGLU's pass below
  // (rank 16, training), else whole here
  float *bt = c->gemma || !a->lora ? NULL : malloc(sizeof(float) * CT_THIN_R * 2 * d.F);
  const float *ug = NULL, *uu = NULL;
  CT_PROF(CT_PROF_LORA, if (bt) ug = ct_adapter_forward_u(&ad_run, l, CT_LORA_GATE, la->ln2, (int)d.C, N, bt);
          if (bt) uu = ct_adapter_forward_u(&ad_run, l, CT_LORA_UP, la->ln2, (int)d.C, N, bt + CT_THIN_R * d.F);
          if (!ug) ct_adapter_forward(&ad_run, l, CT_LORA_GATE, la->ln2, (int)d.C, la->gu, (int)(2 * d.F), N);
          if (!uu) ct_adapter_forward(&ad_run, l, CT_LORA_UP, la->ln2, (int)d.C, la->gu, (int)(2 * d.F), N));
  float s = a->lora ? a->lora->scale : 0;
  if (c->gemma) {  // xn = x2 + norm(h · Wdownᵀ); backward reads mo and its rstd
    CT_PROF(CT_PROF_POINTWISE, ct_geglu_forward(la->h, la->gu, (int)N, (int)d.F));
    proj_forward(m, a, N, (int)d.C, (int)d.F, la->h, (int)d.F, w->wdown, 0, la->mo, (int)d.C);
    CT_PROF(CT_PROF_LORA, ct_adapter_forward(&ad_run, l, CT_LORA_DOWN, la->h, (int)d.F, la->mo, (int)d.C, N));
    CT_PROF(CT_PROF_POINTWISE, if (full && la->xn != la->x2) ct_copy_rows(la->xn, la->x2, N, (int)d.C));
    post_norm_add(c, a, la->xn, la->mo, w->post_ff, la->rstd_mo, N, full);
    return;
  }
  uint16_t *h16 = full && ct_model_w16(m, w->wdown) ? a->x16 : NULL;  // (the down product's input)
  bool h_too = full || need_h, r16 = ct_model_w16(m, w->wgu) != NULL;  // (bf16 compute: gu rounded to bf16)
  CT_PROF(CT_PROF_POINTWISE,
          if (ug || uu || r16) ct_swiglu_forward_lora(h_too ? la->h : NULL, h16, la->gu, (int)N, (int)d.F, s, ug, bt, uu,
                                                      bt ? bt + CT_THIN_R * d.F : NULL, r16, la->gu16);
          else if (h_too) ct_swiglu_forward(la->h, h16, la->gu, (int)N, (int)d.F));
  free(bt);
  if (!full) return;
  CT_PROF(CT_PROF_POINTWISE, if (la->xn != la->x2) ct_copy_rows(la->xn, la->x2, N, (int)d.C));
  proj_forward_r(m, a, N, (int)d.C, (int)d.F, la->h, (int)d.F, w->wdown, 1, la->xn, (int)d.C, h16 != NULL);
  CT_PROF(CT_PROF_LORA, ct_adapter_forward(&ad_run, l, CT_LORA_DOWN, la->h, (int)d.F, la->xn, (int)d.C, N));
}

void ct_forward(const ct_model *m, ct_acts *a, int B, int T) {
  const ct_model_config *c = &m->cfg;
  dims d = dims_of(c);
  long N = (long)B * T;
  a->n = N;
  if (a->lora && a->lora->embed) ct_embed_forward(a->x, a->lora->embed, a->ids, (int)N, (int)d.C);
  else ct_model_embed(m, a->ids, (int)N, a->x);
  if (c->gemma) {  // x (N, C) *= sqrt(C), a float32 scalar as in transformers
    float es = ct_embed_scale(c);
    for (long i = 0; i < N * d.C; i++) a->x[i] *= es;
  }
  for (int l = 0; l < d.L; l++) {
    ct_stop_poll("forward, layer", l + 1, d.L);  // (a stop, or the heartbeat, within a long pass)
    layer_acts la = layer_slots(a, &d, l);
    layer_forward(m, l, l, ct_model_layer(m, l), &la, a, B, T, true, true);
  }
  CT_PROF(CT_PROF_NORM, ct_rmsnorm_forward(a->lnf, a->rstdf, ct_acts_top(a, c), NW(ct_model_norm(m), d.C), (int)N, (int)d.C, c->rms_norm_eps));
}

// Layer backward: a->dres holds the gradient of the layer's output on entry and of its
// input on exit; parameter gradients accumulate into gw. l and kind as layer_forward's.
static void layer_backward(const ct_model *m, int l, int kind, const ct_layer_weights *w,
                         const ct_layer_weights *gw, ct_acts *a, int B, int T) {
  const ct_model_config *c = &m->cfg;
  dims d = dims_of(c);
  long N = (long)B * T;
  int Hd = (int)(d.H * d.hd);
  float *dres = a->dres;  // (N, C)
  layer_acts la = layer_slots(a, &d, l);
  ct_adapter_run ad_run = adapters_of(a);
  bool again = a->mode == CT_ACTS_RECOMPUTE && l < a->kept_from;  // (a kept layer is as CT_ACTS_KEEP's)
  // h = swiglu(gu) is read by the down adapter's dA and the down weight's gradient only; the
  // adapter can take it from gu as it reads (ct_adapter_backward_down_gu), so without a
  // weight gradient no h is computed (a pass writing N x F floats, and one reading them)
  bool down = ad_run.lora && ad_run.lora->w[l][CT_LORA_DOWN].A;
  bool no_h = !c->gemma && !gw->wdown && (!down || ct_adapter_down_from_gu(&ad_run, l, N));
  if (again) layer_forward(m, l, kind, w, &la, a, B, T, false, !no_h);
  float *x = la.x, *ln1 = la.ln1, *rstd1 = la.rstd1, *qkv = la.qkv, *att = la.att, *lse = la.lse;
  float *x2 = la.x2, *ln2 = la.ln2, *rstd2 = la.rstd2, *gu = la.gu, *h = la.h;
  const float *rc, *rs;
  ct_attn_dims ad = attn_dims(m, a, kind, B, T, &rc, &rs);
  if (!again) {  // (the recomputation just did; its last norm output is ln2)
    CT_PROF(CT_PROF_POINTWISE, if (la.gu16) ct_bf16_widen_all(gu, la.gu16, N * 2 * d.F));
    CT_PROF(CT_PROF_POINTWISE, if (c->gemma) ct_geglu_forward(h, gu, (int)N, (int)d.F);
                               else if (!no_h) ct_swiglu_forward(h, NULL, gu, (int)N, (int)d.F));
    CT_PROF(CT_PROF_NORM, ct_rmsnorm_apply(ln2, rstd2, x2, NW(w->ln2, d.C), (int)N, (int)d.C));
  }

  // MLP: xn = x2 + h · Wdownᵀ (Gemma: x2 + norm(h · Wdownᵀ), dmo (N, C) into dln)
  const float *dmo = dres;
  if (c->gemma) {
    CT_PROF(CT_PROF_NORM, ct_rmsnorm_backward(a->dln, gw->post_ff, dres, la.mo, NW(w->post_ff, d.C), la.rstd_mo, (int)N, (int)d.C,
                        0, a->scratch));
    dmo = a->dln;
  }
  proj_backward(m, a, N, (int)d.C, (int)d.F, dmo, h, w->wdown, gw->wdown, a->dh);  // dh (N, F)
  CT_PROF(CT_PROF_LORA, if (down && no_h) ct_adapter_backward_down_gu(&ad_run, l, gu, dmo, (int)d.C, a->dh, (int)d.F, N);
                        else ct_adapter_backward(&ad_run, l, CT_LORA_DOWN, h, (int)d.F, dmo, (int)d.C, a->dh, (int)d.F, N));
  float *dgu = gu;  // (N, 2F) in place: the layer's gu is not read again
  uint16_t *dgu16 = !c->gemma && ct_model_w16(m, w->wgu) ? a->dy16 : NULL;  // (the gate/up product's dy)
  CT_PROF(CT_PROF_POINTWISE, if (c->gemma) ct_geglu_backward(dgu, a->dh, gu, (int)N, (int)d.F);
                             else ct_swiglu_backward(dgu, dgu16, a->dh, gu, (int)N, (int)d.F));
  proj_backward_r(m, a, N, (int)(2 * d.F), (int)d.C, dgu, ln2, w->wgu, gw->wgu, a->dln, dgu16 != NULL);  // dln2 (N, C)
  CT_PROF(CT_PROF_LORA, ct_adapter_backward(&ad_run, l, CT_LORA_GATE, ln2, (int)d.C, dgu, (int)(2 * d.F), a->dln, (int)d.C, N));
  CT_PROF(CT_PROF_LORA, ct_adapter_backward(&ad_run, l, CT_LORA_UP, ln2, (int)d.C, dgu, (int)(2 * d.F), a->dln, (int)d.C, N));
  CT_PROF(CT_PROF_NORM, ct_rmsnorm_backward(dres, gw->ln2, a->dln, x2, NW(w->ln2, d.C), rstd2, (int)N, (int)d.C, 1,
                      a->scratch));                                  // dres is now dx2

  // attention: x2 = x + att · Woᵀ (Gemma: x + norm(att · Woᵀ), dao (N, C) into dln)
  const float *dao = dres;
  if (c->gemma) {
    CT_PROF(CT_PROF_NORM, ct_rmsnorm_backward(a->dln, gw->post_attn, dres, la.ao, NW(w->post_attn, d.C), la.rstd_ao, (int)N,
                        (int)d.C, 0, a->scratch));
    dao = a->dln;
  }
  proj_backward(m, a, N, (int)d.C, Hd, dao, att, w->wo, gw->wo, a->datt);  // datt (N, H*hd)
  CT_PROF(CT_PROF_LORA, ct_adapter_backward(&ad_run, l, CT_LORA_O, att, Hd, dao, (int)d.C, a->datt, Hd, N));
  CT_PROF(CT_PROF_ATTENTION, ct_attention_backward(a->dqkv, a->datt, att, lse, qkv, a->seg, ad, attn_scratch(a, T)));
  CT_PROF(CT_PROF_POINTWISE, ct_rope(a->dqkv, a->pos, rc, rs, (int)N, (int)(d.H + d.KV), (int)d.hd, (int)d.QKV, 1));
  if (c->qk_norm) {
    float *pre = la.qkv_pre, *r = la.qk_rstd;
    CT_PROF(CT_PROF_NORM, ct_headnorm_backward(a->dqkv, gw->qnorm, pre, NW(w->qnorm, d.hd), r, (int)N, (int)d.H, (int)d.hd,
                         (int)d.QKV, a->scratch));
    CT_PROF(CT_PROF_NORM, ct_headnorm_backward(a->dqkv + d.H * d.hd, gw->knorm, pre + d.H * d.hd, NW(w->knorm, d.hd),
                         r + N * d.H, (int)N, (int)d.KV, (int)d.hd, (int)d.QKV, a->scratch));
  }
  CT_PROF(CT_PROF_POINTWISE, if (gw->bqkv) ct_bias_backward(gw->bqkv, a->dqkv, (int)N, (int)d.QKV, (int)d.QKV, a->scratch));
  CT_PROF(CT_PROF_NORM, ct_rmsnorm_apply(ln1, rstd1, x, NW(w->ln1, d.C), (int)N, (int)d.C));  // (over ln2: one slot)
  proj_backward(m, a, N, (int)d.QKV, (int)d.C, a->dqkv, ln1, w->wqkv, gw->wqkv, a->dln);  // dln1 (N, C)
  for (int t = CT_LORA_Q; t <= CT_LORA_V; t++)
    CT_PROF(CT_PROF_LORA, ct_adapter_backward(&ad_run, l, t, ln1, (int)d.C, a->dqkv, (int)d.QKV, a->dln, (int)d.C, N));
  CT_PROF(CT_PROF_NORM, ct_rmsnorm_backward(dres, gw->ln1, a->dln, x, NW(w->ln1, d.C), rstd1, (int)N, (int)d.C, 1,
                      a->scratch));                                  // dres is now dx
}

void ct_backward(const ct_model *m, const ct_weights *g, ct_acts *a, const float *dlnf, int B,
                 int T) {
  const ct_model_config *c = &m->cfg;
  dims d = dims_of(c);
  long N = (long)B * T;
  float *dres = a->dres;  // (N, C) gradient of the residual stream, carried down the layers
  a->n = N;                // (the forward's: backward follows it on the same batch)
  CT_PROF(CT_PROF_NORM, ct_rmsnorm_backward(dres, g->norm, dlnf, ct_acts_top(a, c), NW(ct_model_norm(m), d.C), a->rstdf, (int)N,
                      (int)d.C, 0, a->scratch));
  if (a->dx_top) ct_add_rows(dres, a->dx_top, N, (int)d.C);  // (multi-token prediction's)
  for (int l = (int)d.L - 1; l >= 0; l--) {
    ct_stop_poll("backward, layer", d.L - l, d.L);
    layer_backward(m, l, l, ct_model_layer(m, l), &g->layers[l], a, B, T);
    if (a->grad_ready) a->grad_ready(a->grad_ready_ctx, l);
  }
  if (c->gemma) {  // through the embedding scale
    float es = ct_embed_scale(c);
    for (long i = 0; i < N * d.C; i++) dres[i] *= es;
  }
  float *gE = a->lora && a->lora->embed ? a->lora->g_embed : g->embed;
  if (gE) ct_embed_backward(gE, dres, a->ids, (int)N, (int)d.C);
  if (a->grad_ready) a->grad_ready(a->grad_ready_ctx, -1);
}

// ---------------------------------------------------------------------------
// One layer outside the model's stack (multi-token prediction's blocks)

int ct_acts_init_layer(ct_acts *a, const ct_model *m, int B, int T, int mode) {
  ct_model one = *m;  // (ct_acts_init reads the config and whether bf16 compute is on)
  one.cfg.num_layers = 1;
  return ct_acts_init(a, &one, B, T, mode);
}

void ct_layer_forward(const ct_model *m, int kind, const ct_layer_weights *w, ct_acts *a, int B, int T) {
  dims d = dims_of(&m->cfg);
  a->n = (long)B * T;
  layer_acts la = layer_slots(a, &d, 0);
  layer_forward(m, 0, kind, w, &la, a, B, T, true, true);
}

void ct_layer_backward(const ct_model *m, int kind, const ct_layer_weights *w, const ct_layer_weights *g,
                       ct_acts *a, int B, int T) {
  layer_backward(m, 0, kind, w, g, a, B, T);
}
