// head: the LM head over the gathered target rows — logits in vocabulary chunks, folded
// online into log-sum-exp, target log-prob, entropy and argmax, and the backward from
// per-row coefficients. Losses built on it (CE, DPO, GRPO, KD) live with their callers.
#include "head.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "dnnl.h"
#include "error.h"
#include "fastmath.h"
#include "matmul.h"
#include "mem.h"
#include "kernels.h"
#include "pool.h"
#include "prof.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

static int tiles_of(int V, int ntiles) { return ntiles < 1 ? 1 : ntiles > V ? V : ntiles; }

double ct_head_bytes(int cap_rows, int logit_rows, int V, int C, int ntiles) {
  long tile = (V + tiles_of(V, ntiles) - 1) / tiles_of(V, ntiles);
  return sizeof(float) * ((double)logit_rows * tile + 2.0 * cap_rows * C + 12.0 * cap_rows) +
         sizeof(uint16_t) * (double)cap_rows * C;  // hc16
}

int ct_head_init(ct_head *h, int cap_rows, int logit_rows, int V, int C, int ntiles) {
  memset(h, 0, sizeof *h);
  ntiles = tiles_of(V, ntiles);
  if (logit_rows > cap_rows) logit_rows = cap_rows;
  if (logit_rows < 1) logit_rows = 1;
  h->cap = cap_rows;
  h->V = V;
  h->C = C;
  h->ntiles = ntiles;
  h->tile = h->ftile = (V + ntiles - 1) / ntiles;
  h->logit_cap = (long)logit_rows * h->tile;
  h->inv_temp = 1.0f;
  long cap = cap_rows;
  h->rows = malloc(sizeof(int) * cap);
  h->target = malloc(sizeof(int) * cap);
  h->argmax = malloc(sizeof(int) * cap);
  h->logit_sum = malloc(sizeof(double) * cap);
  h->hc = ct_big_alloc(sizeof(float) * cap * C);
  h->dhc = ct_big_alloc(sizeof(float) * cap * C);
  h->hc16 = ct_big_alloc(sizeof(uint16_t) * cap * C);
  h->logits = ct_big_alloc(sizeof(float) * h->logit_cap);
  float **per_row[] = {&h->lse, &h->logp, &h->entropy, &h->run_sum, &h->run_xsum, &h->coef, &h->zcoef};
  int bad = !h->rows || !h->target || !h->argmax || !h->logit_sum || !h->hc || !h->dhc || !h->hc16 || !h->logits;
  for (size_t i = 0; i < sizeof per_row / sizeof per_row[0]; i++) {
    *per_row[i] = calloc(cap, sizeof(float));
    bad |= !*per_row[i];
  }
  h->bytes = (long)ct_head_bytes(cap_rows, logit_rows, V, C, ntiles);
  if (bad) {
    ct_head_free(h);  // (clears the struct: the size comes from the arguments)
    return ct_set_error(CT_ENOMEM, "LM head: cannot allocate %.1f MB for %d rows x %d vocabulary "
                        "columns (raise num_vocab_tiling)", ct_head_bytes(cap_rows, logit_rows, V, C, ntiles) / 1e6,
                        cap_rows, V);
  }
  return 0;
}

void ct_head_free(ct_head *h) {
  ct_big_free(h->hc);
  ct_big_free(h->dhc);
  ct_big_free(h->hc16);
  ct_big_free(h->logits);
  ct_free_all(h->rows, h->target, h->argmax, h->logit_sum, h->lse, h->logp, h->entropy, h->run_sum, h->run_xsum,
              h->coef, h->zcoef);
  memset(h, 0, sizeof *h);
}

// dst (C) = src · s
static void copy_scaled(float *dst, const float *src, int C, float s) {
  if (s == 1.0f) memcpy(dst, src, sizeof(float) * C);
  else for (int c = 0; c < C; c++) dst[c] = src[c] * s;
}

// rows and target of the tokens with a target; the count, or CT_EINVAL past the capacity.
static int select_rows(ct_head *h, const int *target, int N) {
  if (N > h->cap)
    return ct_set_error(CT_EINVAL, "LM head: %d tokens exceed the %d rows it was sized for", N, h->cap);
  int n = 0;
  for (int t = 0; t < N; t++)
    if (target[t] >= 0) {
      h->rows[n] = t;
      h->target[n++] = target[t];
    }
  return h->n = n;
}

typedef struct {
  const ct_head *h;
  const float *hidden;
  float *d_hidden;
} rows_job;

static void gather_range(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const rows_job *j = ctx;
  const ct_head *h = j->h;
  for (long r = lo; r < hi; r++)  // logits / T = (hidden / T) · Wᵀ: scaling the row scales the logits
    copy_scaled(h->hc + r * h->C, j->hidden + (long)h->rows[r] * h->C, h->C, h->inv_temp);
}

int ct_head_gather(ct_head *h, const float *hidden, const int *target, int N) {
  int n = select_rows(h, target, N);
  if (n < 0) return n;
  rows_job j = {h, hidden, NULL};
  ct_parallel_ranges(n, 1, ct_pool_parts(n), gather_range, &j);
  return n;
}

typedef struct {
  ct_head *h;
  int v0, nv;  // this chunk's vocabulary columns [v0, v0 + nv)
  int parts;
  bool bf16;   // dlogits_range: leave the dlogits in bf16 (see dlogits_row16)
} chunk_job;

// The largest of l[0, n) and (*at) the first index holding it; NaNs are passed over, and
// with no value above −∞ it is −∞ at 0. 16 lanes each keep their own largest value and the
// first index of it; of the lanes holding the overall largest, the least index is the
// first in the row (as the one-by-one scan: the profile had that scan at 3% of a GRPO step).
static float max_at(const float *l, int n, int *at) {
  float m = -INFINITY;
  int v = 0, best = 0;
#if defined(__AVX512F__)
  if (n >= 16) {
    __m512 vm = _mm512_set1_ps(-INFINITY);
    __m512i vi = _mm512_setzero_si512(), idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    for (; v + 16 <= n; v += 16, idx = _mm512_add_epi32(idx, step)) {
      __m512 x = _mm512_loadu_ps(l + v);
      __mmask16 gt = _mm512_cmp_ps_mask(x, vm, _CMP_GT_OQ);  // false for NaN: passed over
      vm = _mm512_mask_mov_ps(vm, gt, x);
      vi = _mm512_mask_mov_epi32(vi, gt, idx);
    }
    m = _mm512_reduce_max_ps(vm);
    if (m > -INFINITY) {
      __mmask16 top = _mm512_cmp_ps_mask(vm, _mm512_set1_ps(m), _CMP_EQ_OQ);
      best = _mm512_mask_reduce_min_epi32(top, vi);
    }
  }
#endif
  for (; v < n; v++)  // the tail, or the whole row without AVX-512
    if (l[v] > m) {
      m = l[v];
      best = v;
    }
  *at = best;
  return m;
}

// Folds one chunk of logits into each row's running max (kept in lse until the end),
// Σ e^(l−max), Σ e^(l−max)·l, Σ l, argmax and target logit (kept in logp until the end).
static void fold_chunk_range(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const chunk_job *j = ctx;
  ct_head *h = j->h;
  for (long r = lo; r < hi; r++) {
    const float *l = h->logits + r * j->nv;
    int at;
    float mt = max_at(l, j->nv, &at);
    float st = 0, sxt = 0, slt = 0;
#pragma omp simd reduction(+ : st, sxt, slt)
    for (int v = 0; v < j->nv; v++) {
      float e = ct_expf(l[v] - mt);
      st += e;
      sxt += e * l[v];
      slt += l[v];
    }
    h->logit_sum[r] += slt;  // in double across chunks: V terms of either sign
    float m = h->lse[r];
    if (mt > m) {
      float k = ct_expf(m - mt);
      h->run_sum[r] = h->run_sum[r] * k + st;
      h->run_xsum[r] = h->run_xsum[r] * k + sxt;
      h->lse[r] = mt;
      h->argmax[r] = j->v0 + at;
    } else {
      float k = ct_expf(mt - m);
      h->run_sum[r] += st * k;
      h->run_xsum[r] += sxt * k;
    }
    int y = h->target[r] - j->v0;
    if (y >= 0 && y < j->nv) h->logp[r] = l[y];
  }
}

int ct_head_adopt(ct_head *h, const int *target, int N) {
  int n = select_rows(h, target, N);
  if (h->inv_temp != 1.0f)
    for (long k = 0; k < (long)n * h->C; k++) h->hc[k] *= h->inv_temp;
  return n;
}

static void head_forward(ct_head *h, const float *W, const uint16_t *W16, ct_logits_fn fn, void *ctx) {
  int n = h->n;
  h->w16_of = W16 ? W : NULL;
  h->w16 = W16;
  if (W16) ct_bf16_narrow_rows(h->hc16, h->hc, n, h->C, h->C);
  for (int r = 0; r < n; r++) {
    h->lse[r] = -INFINITY;  // running max until the end
    h->run_sum[r] = h->run_xsum[r] = 0;
    h->logit_sum[r] = 0;
    h->argmax[r] = 0;
  }
  long fit = n > 0 ? h->logit_cap / n : h->tile;  // columns that fit for n rows
  h->ftile = (int)(fit < h->tile ? (fit > 0 ? fit : 1) : h->tile);
  for (int v0 = 0; v0 < h->V; v0 += h->ftile) {
    int nv = v0 + h->ftile <= h->V ? h->ftile : h->V - v0;
    // logits (n, nv) = hc · W[v0 : v0+nv]ᵀ
    CT_PROF(CT_PROF_HEAD_PRODUCT,
            if (fn) fn(ctx, h->hc, n, v0, nv, h->logits);
            else if (W16) ct_gemm_bf16('N', 'T', n, nv, h->C, h->hc16, h->C, W16 + (long)v0 * h->C, h->C, 0, h->logits, nv);
            else ct_sgemm('N', 'T', n, nv, h->C, 1, h->hc, h->C, W + (long)v0 * h->C, h->C, 0, h->logits, nv));
    chunk_job j = {h, v0, nv, ct_pool_parts(n), false};
    ct_parallel_ranges(h->n, 1, j.parts, fold_chunk_range, &j);
  }
  for (int r = 0; r < n; r++) {
    float lse = h->lse[r] + logf(h->run_sum[r]);
    h->entropy[r] = lse - h->run_xsum[r] / h->run_sum[r];
    h->logp[r] -= lse;
    h->lse[r] = lse;
  }
}

void ct_head_forward(ct_head *h, const float *W) { head_forward(h, W, NULL, NULL, NULL); }

void ct_head_forward_bf16(ct_head *h, const float *W, const uint16_t *W16) { head_forward(h, W, W16, NULL, NULL); }

void ct_head_forward_fn(ct_head *h, ct_logits_fn fn, void *ctx) { head_forward(h, NULL, NULL, fn, ctx); }

enum { DL_BLOCK = 256 };  // dlogits_row16's block of columns

// One row of logits l (nv) into its dlogits rounded to bf16, written over the first half of
// the row's own bytes (as uint16 (nv) at l): block by block, each block read whole before
// its bf16 values are written over bytes of this or earlier blocks (memcpy: no aliasing
// assumption between the float and uint16 views). y: the target's column, or out of range.
static void dlogits_row16(float *l, int nv, float lse, float a, int y, float coef) {
  float t[DL_BLOCK];
  uint16_t t16[DL_BLOCK];
  for (int v0 = 0; v0 < nv; v0 += DL_BLOCK) {
    int k = nv - v0 < DL_BLOCK ? nv - v0 : DL_BLOCK;
    memcpy(t, l + v0, sizeof(float) * k);
#pragma omp simd
    for (int v = 0; v < k; v++) t[v] = a * ct_expf(t[v] - lse);
    if (y >= v0 && y < v0 + k) t[y - v0] -= coef;
    ct_bf16_narrow(t16, t, k);
    memcpy((char *)l + sizeof(uint16_t) * v0, t16, sizeof(uint16_t) * k);
  }
}

// Turns a chunk of logits into dlogits in place: fp32 (n, nv), or (j->bf16) bf16 rows with
// a stride of 2·nv uint16 (each in the first half of its fp32 row).
static void dlogits_range(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const chunk_job *j = ctx;
  ct_head *h = j->h;
  for (long r = lo; r < hi; r++) {
    float *l = h->logits + r * j->nv;
    float lse = h->lse[r], a = h->coef[r] + h->zcoef[r];
    int y = h->target[r] - j->v0;
    if (j->bf16) {
      dlogits_row16(l, j->nv, lse, a, y, h->coef[r]);
      continue;
    }
#pragma omp simd
    for (int v = 0; v < j->nv; v++) l[v] = a * ct_expf(l[v] - lse);
    if (y >= 0 && y < j->nv) l[y] -= h->coef[r];
  }
}

// The backward's products for one chunk [v0, v0 + nv) in bf16: logits recomputed (several
// chunks), dlogits in bf16 in place, dhc (+)= dlogits · W16[v0:], dW[v0:] += dlogitsᵀ · hc16.
static void backward_chunk16(ct_head *h, const uint16_t *W16, float *dW, int v0, int nv) {
  int n = h->n, C = h->C;
  const uint16_t *Wv = W16 + (long)v0 * C;
  if (h->ftile < h->V) CT_PROF(CT_PROF_HEAD_PRODUCT, ct_gemm_bf16('N', 'T', n, nv, C, h->hc16, C, Wv, C, 0, h->logits, nv));
  chunk_job j = {h, v0, nv, ct_pool_parts(n), true};
  ct_parallel_ranges(h->n, 1, j.parts, dlogits_range, &j);
  const uint16_t *d16 = (const uint16_t *)h->logits;  // (n, nv), row stride 2·nv
  CT_PROF(CT_PROF_HEAD_PRODUCT, ct_gemm_bf16('N', 'N', n, C, nv, d16, 2 * nv, Wv, C, v0 ? 1 : 0, h->dhc, C);
          if (dW) ct_gemm_bf16('T', 'N', nv, C, n, d16, 2 * nv, h->hc16, C, 1, dW + (long)v0 * C, C));
}

// dhc (n, C) = dlogits · W and dW += dlogitsᵀ · hc over the forward's vocabulary chunks.
static void backward_products(ct_head *h, const float *W, float *dW) {
  int n = h->n;
  const uint16_t *W16 = W && W == h->w16_of ? h->w16 : NULL;
  for (int v0 = 0; v0 < h->V; v0 += h->ftile) {  // the forward's chunks
    int nv = v0 + h->ftile <= h->V ? h->ftile : h->V - v0;
    if (W16) {
      backward_chunk16(h, W16, dW, v0, nv);
      continue;
    }
    if (h->ftile < h->V)  // recompute this chunk's logits; with one chunk they are still there
      CT_PROF(CT_PROF_HEAD_PRODUCT, ct_sgemm('N', 'T', n, nv, h->C, 1, h->hc, h->C, W + (long)v0 * h->C, h->C, 0, h->logits, nv));
    chunk_job j = {h, v0, nv, ct_pool_parts(n), false};
    ct_parallel_ranges(h->n, 1, j.parts, dlogits_range, &j);
    // dhc (n, C) (+)= dlogits · W[v0 : v0+nv];  dW[v0 : v0+nv] += dlogitsᵀ · hc
    CT_PROF(CT_PROF_HEAD_PRODUCT,
            ct_sgemm('N', 'N', n, h->C, nv, 1, h->logits, nv, W + (long)v0 * h->C, h->C, v0 ? 1 : 0, h->dhc, h->C);
            if (dW)  // NULL: a frozen head
              ct_sgemm('T', 'N', nv, h->C, n, 1, h->logits, nv, h->hc, h->C, 1, dW + (long)v0 * h->C, h->C));
  }
}

// Token rows [lo, hi) of d_hidden: the gathered rows' gradients (rows[] ascends), 0 elsewhere.
static void scatter_range(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const rows_job *j = ctx;
  const ct_head *h = j->h;
  long C = h->C;
  int a = 0, b = h->n;  // the first gathered row at or after token lo
  while (a < b) {
    int mid = a + (b - a) / 2;
    if (h->rows[mid] < lo) a = mid + 1;
    else b = mid;
  }
  memset(j->d_hidden + lo * C, 0, sizeof(float) * (size_t)((hi - lo) * C));
  for (int r = a; r < h->n && h->rows[r] < hi; r++)
    copy_scaled(j->d_hidden + (long)h->rows[r] * C, h->dhc + (long)r * C, h->C, h->inv_temp);
}

// d_hidden (N, C) = the gathered rows' gradients in their token rows, 0 elsewhere.
static void scatter_dhc(const ct_head *h, float *d_hidden, int N) {
  rows_job j = {h, NULL, d_hidden};
  ct_parallel_ranges(N, 1, ct_pool_parts(N), scatter_range, &j);
}

void ct_head_backward(ct_head *h, const float *W, float *dW, float *d_hidden, int N) {
  backward_products(h, W, dW);
  scatter_dhc(h, d_hidden, N);
}

int ct_head_chunk_rows(int rows, int V, int min_rows) {
  long fit = CT_HEAD_CHUNK_FLOATS / (V > 0 ? V : 1) / 16 * 16;
  if (fit < min_rows) fit = min_rows;
  return (int)(rows < fit ? rows : fit);
}

void ct_head_ce_rows(void *ctx, ct_head *h, int r0, int r1) {
  const ct_head_ce *k = ctx;
  for (int r = r0; r < r1; r++) {
    h->coef[r] = k->scale;
    h->zcoef[r] = 2 * k->z_loss * h->lse[r] * k->scale;
  }
}

// Rows [r0, r1) of h's gathered rows as a head of their own: every per-row array starts at
// row r0; the logits buffer and everything else is h's.
static ct_head rows_view(const ct_head *h, int r0, int r1) {
  ct_head v = *h;
  long C = h->C;
  v.n = r1 - r0;
  v.rows += r0, v.target += r0, v.argmax += r0, v.logit_sum += r0;
  v.hc += r0 * C, v.dhc += r0 * C, v.hc16 += r0 * C;
  v.lse += r0, v.logp += r0, v.entropy += r0, v.run_sum += r0, v.run_xsum += r0;
  v.coef += r0, v.zcoef += r0;
  return v;
}

void ct_head_fused(ct_head *h, const float *W, const uint16_t *W16, float *dW, float *d_hidden, int N,
                   ct_head_coef_fn coef, void *ctx) {
  long tile = h->tile;
  int rows = (int)(h->logit_cap / tile);  // the logit_rows of ct_head_init
  for (int r0 = 0; r0 < h->n; r0 += rows) {
    int r1 = r0 + rows < h->n ? r0 + rows : h->n;
    ct_head v = rows_view(h, r0, r1);
    head_forward(&v, W, W16, NULL, NULL);
    coef(ctx, h, r0, r1);
    backward_products(&v, W, dW);
    h->w16_of = v.w16_of, h->w16 = v.w16, h->ftile = v.ftile;
  }
  scatter_dhc(h, d_hidden, N);
}
