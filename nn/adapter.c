// adapter: the LoRA term of a projection in training forwards and backwards (adapter.h).
#include "adapter.h"

#include <stddef.h>
#include <stdint.h>

#include <string.h>

#include "lora.h"
#include "matmul.h"
#include "pool.h"
#include "thin.h"

// ---------------------------------------------------------------------------
// Work space: one allocation (a->mem), carved here for capacity Nc = a->cap.

typedef struct {
  float *x;        // (Nc, max in) the dropped-out input; in backward, then s·v·A before masking
  float *u, *v;    // (Nc, r)
  float *t;        // (max in, r) A transposed for the thin kernels, then dA's sums (thin.h)
  float *kept;     // rank 16 (thin.h), training: every layer's and target's u (Nc, r), kept
                   // by the forward for its recomputation and the backward
  uint32_t *bits;  // the training forward's dropout masks, a bit per input element: per layer
                   // and target, Nc rows of ceil(in / 32) words; backward reads them back
} work;

static long max_in(const ct_lora_config *lc, const ct_model_config *c) {
  long m = 1;
  for (int t = 0; t < CT_LORA_TARGETS; t++) {
    int in, out, row0;
    ct_lora_dims(c, t, &in, &out, &row0);
    if (lc->targets >> t & 1 && in > m) m = in;
  }
  return m;
}

// Words of mask bits before target t of layer l (t = CT_LORA_TARGETS, l = L: all of them).
static long bits_before(const ct_lora_config *lc, const ct_model_config *c, long Nc, int l, int t) {
  long per_layer = 0, before_t = 0;
  for (int u = 0; u < CT_LORA_TARGETS; u++) {
    int in, out, row0;
    ct_lora_dims(c, u, &in, &out, &row0);
    long words = lc->targets >> u & 1 ? Nc * ((in + 31) / 32) : 0;
    per_layer += words;
    if (u < t) before_t += words;
  }
  return l * per_layer + before_t;
}

// Targets before t (t = CT_LORA_TARGETS: all of them) that have adapters.
static int targets_before(const ct_lora_config *lc, int t) {
  int k = 0;
  for (int u = 0; u < t; u++) k += lc->targets >> u & 1;
  return k;
}

// Whether the forward keeps u for its recomputation and the backward (thin.h's rank, training).
static bool keeps_u(const ct_lora_config *lc, int mode) { return ct_thin_takes(lc->r) && mode != CT_ACTS_FORWARD; }

// Floats of the work space's x for Nc rows of inputs up to mx wide: the masked input; at
// rank 16, where the backward reads no masked copy, the partial sums of its kernels
// (ct_thin_out_grad_floats: more than the rows for a batch of under 16).
static long x_floats(const ct_lora_config *lc, long Nc, long mx, int mode) {
  long xs = Nc * mx, ps = keeps_u(lc, mode) ? ct_thin_out_grad_floats((int)Nc, (int)mx) : 0;
  return ps > xs ? ps : xs;
}

// Lays the work space out from p; returns its size in floats. Mask bits and kept u only for
// training activations (mode): evaluation forwards draw no masks.
static long carve(const ct_lora_config *lc, const ct_model_config *c, long Nc, int mode, float *p, work *w) {
  long mx = max_in(lc, c), r = lc->r, t = ct_thin_takes(lc->r) ? mx * r : 0;
  long kept = keeps_u(lc, mode) ? (long)c->num_layers * targets_before(lc, CT_LORA_TARGETS) * Nc * r : 0;
  long xs = x_floats(lc, Nc, mx, mode);
  if (p) {
    w->x = p;
    w->u = w->x + xs;
    w->v = w->u + Nc * r;
    w->t = w->v + Nc * r;
    w->kept = kept ? w->t + t : NULL;
    w->bits = (uint32_t *)(w->t + t + kept);
  }
  long bits = lc->dropout > 0 && mode != CT_ACTS_FORWARD ? bits_before(lc, c, Nc, c->num_layers, 0) : 0;
  return xs + 2 * Nc * r + t + kept + bits;
}

long ct_adapter_work_floats(const ct_lora_config *lc, const ct_model_config *c, long N, int mode) {
  return carve(lc, c, N, mode, NULL, NULL);
}

static work work_of(const ct_adapter_run *a) {
  work w;
  carve(&a->lora->cfg, &a->lora->mc, a->cap, a->mode, a->mem, &w);
  return w;
}

// ---------------------------------------------------------------------------
// Dropout: element i = n·in + k of target t's input is kept (times 1/(1 − p)) or zeroed.
// The hash is murmur3's 32-bit finalizer over (i ^ a per-(key, layer, target) seed), cheap
// in 32-bit vector lanes; the forward draws each mask once and keeps it as bits.

typedef struct {
  uint32_t key, cut;  // drop when the hash's top 24 bits are below cut
  float keep;         // 1 / (1 − p)
  bool on;
} dropout;

static dropout dropout_of(const ct_adapter_run *a, int l, int t) {
  const ct_lora *lo = a->lora;
  dropout d = {0, 0, 1, lo->cfg.dropout > 0 && a->mode != CT_ACTS_FORWARD};
  if (!d.on) return d;
  uint64_t k64 = lo->dropout_key ^ ((uint64_t)(l * CT_LORA_TARGETS + t + 1) * 0xd6e8feb86659fd93ULL);
  k64 = (k64 ^ (k64 >> 31)) * 0xbf58476d1ce4e5b9ULL;
  float p = (float)lo->cfg.dropout;
  d.key = (uint32_t)(k64 ^ (k64 >> 32));
  d.cut = (uint32_t)(p * 16777216.0f);  // of 2^24
  d.keep = 1.0f / (1.0f - p);
  return d;
}

static inline float mask_at(const dropout *d, uint32_t i) {
  uint32_t h = i * 0x9e3779b1u ^ d->key;
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return (h >> 8) >= d->cut ? d->keep : 0.0f;
}

// Rows of the masked input, or of the masked sum into dx, on the pool. The forward draws
// each mask (a hash) and keeps it as bits; backward expands the bits, which costs a fraction
// of drawing them again.
typedef struct {
  dropout d;
  const float *x;  // (N, ldx)
  int ldx, in, parts;
  long N;
  float *xd;       // (N, in) the masked input
  float *dx;       // masked_add: dx (N, lddx) += xd ⊙ mask
  int lddx;
  uint32_t *bits;  // (N, ceil(in / 32)) this layer's and target's masks
  bool draw;       // forward: hash and write bits; backward: read them
} rows_job;

// o[k] = v[k] · mask for row n, k < in (o += when add), from the row's mask bits wb.
static inline void apply_bits(const uint32_t *wb, const float *v, float *o, int in, float keep, bool add) {
  for (int k0 = 0; k0 < in; k0 += 32) {
    uint32_t w = wb[k0 / 32];
    int kn = in - k0 < 32 ? in - k0 : 32;
    if (add) {
#pragma omp simd
      for (int k = 0; k < kn; k++) o[k0 + k] += v[k0 + k] * ((w >> k & 1u) ? keep : 0.0f);
    } else {
#pragma omp simd
      for (int k = 0; k < kn; k++) o[k0 + k] = v[k0 + k] * ((w >> k & 1u) ? keep : 0.0f);
    }
  }
}

// Row n's mask drawn: its bits into wb, the masked row o (in) = x ⊙ mask.
static void draw_row(const dropout *d, long n, const float *x, float *o, uint32_t *wb, int in) {
  uint32_t i0 = (uint32_t)(n * in);
  for (int k0 = 0; k0 < in; k0 += 32) {
    int kn = in - k0 < 32 ? in - k0 : 32;
    uint32_t w = 0;
#pragma omp simd reduction(| : w)
    for (int k = 0; k < kn; k++) {
      float m = mask_at(d, i0 + (uint32_t)(k0 + k));
      o[k0 + k] = x[k0 + k] * m;
      w |= (m != 0.0f ? 1u : 0u) << k;
    }
    wb[k0 / 32] = w;
  }
}

static void input_task(void *ctx, int part, int thread) {
  (void)thread;
  const rows_job *j = ctx;
  long lo, hi, wpr = (j->in + 31) / 32;
  ct_chunk_range(j->N, 1, j->parts, part, &lo, &hi);
  for (long n = lo; n < hi; n++) {
    const float *x = j->x + n * j->ldx;
    float *o = j->xd + n * j->in;
    uint32_t *wb = j->bits + n * wpr;
    if (!j->draw) {
      apply_bits(wb, x, o, j->in, j->d.keep, false);
      continue;
    }
    draw_row(&j->d, n, x, o, wb, j->in);
  }
}

static void masked_add_task(void *ctx, int part, int thread) {
  (void)thread;
  const rows_job *j = ctx;
  long lo, hi, wpr = (j->in + 31) / 32;
  ct_chunk_range(j->N, 1, j->parts, part, &lo, &hi);
  for (long n = lo; n < hi; n++) apply_bits(j->bits + n * wpr, j->xd + n * j->in, j->dx + n * j->lddx, j->in, j->d.keep, true);
}

// The training forward at rank 16 with dropout: for 8 rows at a time, their masks drawn
// and the masked rows written into the thread's 8 rows of the work space (they stay in
// cache), then their u = xd·Aᵀ (thin.h: the same bits as over a whole masked copy).
typedef struct {
  const rows_job *r;
  const float *At;  // (in, 16) A transposed
  float *u;         // (N, 16)
  float *xd;        // 8 rows of max_in floats per pool thread
  long max_in;
} drawn_job;

static void drawn_range(void *ctx, long lo, long hi, int thread) {
  const drawn_job *j = ctx;
  const rows_job *r = j->r;
  long wpr = (r->in + 31) / 32;
  float *xd = j->xd + thread * 8 * j->max_in;
  for (long n0 = lo; n0 < hi; n0 += 8) {
    long n1 = n0 + 8 < hi ? n0 + 8 : hi;
    for (long n = n0; n < n1; n++)
      draw_row(&r->d, n, r->x + n * r->ldx, xd + (n - n0) * r->in, r->bits + n * wpr, r->in);
    ct_thin_out_rows(0, n1 - n0, r->in, 1, xd, r->in, j->At, j->u + n0 * CT_THIN_R);
  }
}

static void run_rows(rows_job *j, ct_task_fn task) {
  j->parts = ct_pool_parts(j->N);
  ct_parallel_for(j->parts, task, j);
}

// ---------------------------------------------------------------------------

// Layer l's, target t's mask bits in the work space.
static uint32_t *mask_bits(const ct_adapter_run *a, const work *w, int l, int t) {
  return w->bits + bits_before(&a->lora->cfg, &a->lora->mc, a->cap, l, t);
}

// Layer l's, target t's kept u (cap, r).
static float *kept_u(const ct_adapter_run *a, const work *w, int l, int t) {
  const ct_lora_config *lc = &a->lora->cfg;
  return w->kept + ((long)l * targets_before(lc, CT_LORA_TARGETS) + targets_before(lc, t)) * a->cap * lc->r;
}

// The adapter's input: x, or dropout(x) in the work space. *ld gets its row stride.
static const float *masked_input(rows_job *j, const work *w, int *ld) {
  if (!j->d.on) {
    *ld = j->ldx;
    return j->x;
  }
  j->xd = w->x;
  run_rows(j, input_task);
  *ld = j->in;
  return w->x;
}

// ---------------------------------------------------------------------------
// The products. At rank 16 those whose other side is a whole activation matrix run on
// thin.h's kernels (no packing copy of that matrix); other ranks on ct_sgemm.

// u (N, r) = xd · Aᵀ
static void times_at(const ct_lora_ab *ab, int r, int in, const float *xd, int ld, const work *w, long N) {
  if (!ct_thin_takes(r)) {
    ct_sgemm('N', 'T', (int)N, r, in, 1, xd, ld, ab->A, in, 0, w->u, r);
    return;
  }
  ct_thin_transpose(ab->A, in, w->t);
  ct_thin_out((int)N, in, 1, xd, ld, w->t, w->u);
}

// v (N, r) = dy · B
static void times_b(const ct_lora_ab *ab, int r, int out, const float *dy, int ldy, const work *w, long N) {
  if (ct_thin_takes(r)) ct_thin_out((int)N, out, 1, dy, ldy, ab->B, w->v);
  else ct_sgemm('N', 'N', (int)N, r, out, 1, dy, ldy, ab->B, r, 0, w->v, r);
}

// dB += s·dyᵀ·u, dA += s·vᵀ·xd
static void weight_grads(const ct_lora_ab *gab, int r, int in, int out, float s, const float *dy, int ldy,
                         const float *xd, int ld, const work *w, long N) {
  int n = (int)N;
  if (!ct_thin_takes(r)) {
    ct_sgemm('T', 'N', out, r, n, s, dy, ldy, w->u, r, 1, gab->B, r);
    ct_sgemm('T', 'N', r, in, n, s, w->v, r, xd, ld, 1, gab->A, in);
    return;
  }
  ct_thin_grad(n, out, s, dy, ldy, w->u, gab->B);
  memset(w->t, 0, sizeof(float) * in * r);  // (in, r): dA transposed
  ct_thin_grad(n, in, s, xd, ld, w->v, w->t);
  for (int j = 0; j < r; j++)
    for (int k = 0; k < in; k++) gab->A[(long)j * in + k] += w->t[(long)k * r + j];
}

// u (N, r) = dropout(x)·Aᵀ of layer l's target t into the work space (kept at rank 16: the
// forward's, which a recomputation reuses); returns the work space with w.u at it.
static work forward_u(const ct_adapter_run *a, int l, int t, const float *x, int ldx, long N) {
  const ct_lora *lo = a->lora;
  const ct_lora_ab *ab = &lo->w[l][t];
  int in, out, row0, ld, r = lo->cfg.r;
  ct_lora_dims(&lo->mc, t, &in, &out, &row0);
  work w = work_of(a);
  if (w.kept) w.u = kept_u(a, &w, l, t);  // (the recomputation's u is the forward's)
  if (w.kept && a->again) return w;
  rows_job j = {dropout_of(a, l, t), x, ldx, in, 0, N, NULL, NULL, 0, mask_bits(a, &w, l, t), true};
  long mx = max_in(&lo->cfg, &lo->mc);
  if (w.kept && j.d.on && (long)ct_pool_threads() * 8 <= a->cap) {  // masks and u in one pass
    ct_thin_transpose(ab->A, in, w.t);
    drawn_job dj = {&j, w.t, w.u, w.x, mx};
    ct_parallel_ranges(N, 8, ct_pool_parts((N + 7) / 8), drawn_range, &dj);
  } else {
    const float *xd = masked_input(&j, &w, &ld);
    times_at(ab, r, in, xd, ld, &w, N);  // u (N, r)
  }
  return w;
}

void ct_adapter_forward(const ct_adapter_run *a, int l, int t, const float *x, int ldx, float *y, int ldy, long N) {
  const ct_lora *lo = a->lora;
  if (!lo || !lo->w[l][t].A) return;
  int in, out, row0, r = lo->cfg.r;
  ct_lora_dims(&lo->mc, t, &in, &out, &row0);
  work w = forward_u(a, l, t, x, ldx, N);
  ct_sgemm('N', 'T', (int)N, out, r, lo->scale, w.u, r, lo->w[l][t].B, r, 1, y + row0, ldy);  // y += s·u·Bᵀ
}

const float *ct_adapter_forward_u(const ct_adapter_run *a, int l, int t, const float *x, int ldx, long N, float *Bt) {
  const ct_lora *lo = a->lora;
  if (!lo || !lo->w[l][t].A || !keeps_u(&lo->cfg, a->mode)) return NULL;
  int in, out, row0, r = lo->cfg.r;
  ct_lora_dims(&lo->mc, t, &in, &out, &row0);
  const float *B = lo->w[l][t].B;  // (out, r)
  for (int k = 0; k < out; k++)
    for (int j = 0; j < r; j++) Bt[(long)j * out + k] = B[(long)k * r + j];
  return forward_u(a, l, t, x, ldx, N).u;
}

// Whether the partial sums of a kernel over N rows of K (ct_thin_out_grad_floats) fit in the
// work space's x (carve sizes it for them when the forward keeps u).
static bool partials_fit(const ct_adapter_run *a, long N, int K) {
  long mx = max_in(&a->lora->cfg, &a->lora->mc);
  return N <= a->cap && ct_thin_out_grad_floats((int)N, K) <= x_floats(&a->lora->cfg, a->cap, mx, a->mode);
}

// The backward at rank 16 from the forward's kept u and mask bits: no copy of the masked
// input, dA from x under the mask (x NULL: from swiglu(gu), gu (N, 2·in)), dx in one pass
// (thin.h).
static void backward_kept(const ct_adapter_run *a, const work *w, int l, int t, const float *x, int ldx,
                          const float *gu, const float *dy, int ldy, float *dx, int lddx, int N) {
  const ct_lora *lo = a->lora;
  const ct_lora_ab *ab = &lo->w[l][t], *gab = lo->grads ? &lo->g[l][t] : NULL;
  int in, out, row0;
  ct_lora_dims(&lo->mc, t, &in, &out, &row0);
  dropout d = dropout_of(a, l, t);
  const uint32_t *bits = d.on ? mask_bits(a, w, l, t) : NULL;
  float sk = lo->scale * d.keep;  // xd = keep · mask ⊙ x
  const float *u = kept_u(a, w, l, t);
  // v = dy·B (N, r) and dB += s·dyᵀ·u in one pass over dy, the partial dB sums in w->x
  // (unused by this backward) where they fit
  bool one_pass = gab && partials_fit(a, N, out);
  if (one_pass) ct_thin_out_grad(N, out, lo->scale, dy, ldy, ab->B, u, w->v, gab->B, w->x);
  else ct_thin_out(N, out, 1, dy, ldy, ab->B, w->v);
  if (gab) {
    if (!one_pass) ct_thin_grad(N, out, lo->scale, dy, ldy, u, gab->B);  // dB += s·dyᵀ·u
    // dA += s·vᵀ·xd, its partial sums in w->x too where they fit (from gu: they always do)
    if (!x) ct_thin_grad_masked_swiglu(N, in, sk, gu, bits, w->v, gab->A, w->x);
    else ct_thin_grad_masked(N, in, sk, x, ldx, bits, w->v, gab->A, partials_fit(a, N, in) ? w->x : NULL);
  }
  ct_thin_dx_masked(N, in, sk, w->v, ab->A, bits, dx, lddx);          // dx += s·keep·mask ⊙ (v·A)
}

// u = xd·Aᵀ, v = dy·B, dB += s·dyᵀ·u, dA += s·vᵀ·xd, dx += s·(v·A) ⊙ mask.
void ct_adapter_backward(const ct_adapter_run *a, int l, int t, const float *x, int ldx, const float *dy, int ldy,
                         float *dx, int lddx, long N) {
  const ct_lora *lo = a->lora;
  if (!lo || !lo->w[l][t].A) return;
  const ct_lora_ab *ab = &lo->w[l][t], *gab = lo->grads ? &lo->g[l][t] : NULL;
  int in, out, row0, ld, r = lo->cfg.r, n = (int)N;
  ct_lora_dims(&lo->mc, t, &in, &out, &row0);
  work w = work_of(a);
  if (w.kept) {
    backward_kept(a, &w, l, t, x, ldx, NULL, dy + row0, ldy, dx, lddx, n);
    return;
  }
  rows_job j = {dropout_of(a, l, t), x, ldx, in, 0, N, NULL, NULL, 0, mask_bits(a, &w, l, t), false};
  const float *xd = masked_input(&j, &w, &ld);
  dy += row0;
  times_at(ab, r, in, xd, ld, &w, N);   // u (N, r)
  times_b(ab, r, out, dy, ldy, &w, N);  // v = dy·B (N, r)
  if (gab) weight_grads(gab, r, in, out, lo->scale, dy, ldy, xd, ld, &w, N);
  if (!j.d.on) {
    ct_sgemm('N', 'N', n, in, r, lo->scale, w.v, r, ab->A, in, 1, dx, lddx);  // dx += s·v·A
    return;
  }
  ct_sgemm('N', 'N', n, in, r, lo->scale, w.v, r, ab->A, in, 0, w.x, in);  // s·v·A, then
  j.xd = w.x, j.dx = dx, j.lddx = lddx;                                  // ⊙ the mask
  run_rows(&j, masked_add_task);
}

bool ct_adapter_down_from_gu(const ct_adapter_run *a, int l, long N) {
  const ct_lora *lo = a->lora;
  int in, out, row0;
  if (!lo || !lo->w[l][CT_LORA_DOWN].A || !keeps_u(&lo->cfg, a->mode)) return false;
  ct_lora_dims(&lo->mc, CT_LORA_DOWN, &in, &out, &row0);
  return partials_fit(a, N, in);
}

void ct_adapter_backward_down_gu(const ct_adapter_run *a, int l, const float *gu, const float *dy, int ldy, float *dx,
                                 int lddx, long N) {
  work w = work_of(a);
  int in, out, row0;
  ct_lora_dims(&a->lora->mc, CT_LORA_DOWN, &in, &out, &row0);
  backward_kept(a, &w, l, CT_LORA_DOWN, NULL, in, gu, dy + row0, ldy, dx, lddx, (int)N);
}
