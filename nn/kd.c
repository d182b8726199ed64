// kd: the generalized JSD between teacher and student in vocabulary chunks (three
// passes: normalizers, loss and Σg, gradient), from full teacher logits or stored top-k.
#include "kd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "fastmath.h"
#include "matmul.h"
#include "pool.h"

double ct_kd_bytes(int cap_rows, int V, int C, int ntiles) {
  ntiles = ntiles < 1 ? 1 : ntiles > V ? V : ntiles;
  double cap = cap_rows, tile = (V + ntiles - 1) / ntiles;
  return sizeof(float) * (2 * cap * tile + cap * C) + 9 * sizeof(double) * cap;
}

int ct_kd_init(ct_kd *k, int cap_rows, int V, int C, int ntiles) {
  memset(k, 0, sizeof *k);
  if (ntiles < 1) ntiles = 1;
  if (ntiles > V) ntiles = V;
  k->cap = cap_rows;
  k->V = V;
  k->C = C;
  k->ntiles = ntiles;
  k->tile = (V + ntiles - 1) / ntiles;
  long cap = cap_rows;
  k->ls = aligned_alloc(64, sizeof(float) * ((cap * k->tile + 15) / 16 * 16));
  k->lt = aligned_alloc(64, sizeof(float) * ((cap * k->tile + 15) / 16 * 16));
  k->dhs = aligned_alloc(64, sizeof(float) * ((cap * C + 15) / 16 * 16));
  double **d[] = {&k->lse_s, &k->lse_t, &k->sum_s, &k->sum_t, &k->gsum, &k->loss, &k->lse_t1,
                  &k->tgt_t1, &k->sum_t1};
  int bad = !k->ls || !k->lt || !k->dhs;
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) bad |= !(*d[i] = calloc(cap, sizeof(double)));
  k->bytes = (long)ct_kd_bytes(cap_rows, V, C, ntiles);
  if (bad) {
    ct_kd_free(k);  // (clears the struct: the size comes from the arguments)
    return ct_set_error(CT_ENOMEM, "distillation: cannot allocate %.1f MB (raise num_vocab_tiling)",
                        ct_kd_bytes(cap_rows, V, C, ntiles) / 1e6);
  }
  return 0;
}

void ct_kd_free(ct_kd *k) {
  void *p[] = {k->ls, k->lt, k->dhs, k->lse_s, k->lse_t, k->sum_s, k->sum_t, k->gsum, k->loss,
               k->lse_t1, k->tgt_t1, k->sum_t1};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
  memset(k, 0, sizeof *k);
}

// log(e^a + e^b)
static inline double logaddexp(double a, double b) {
  double m = a > b ? a : b;
  if (m == -INFINITY) return -INFINITY;
  return m + log(exp(a - m) + exp(b - m));
}

// g_i = ∂L/∂s_i and the loss term of one vocabulary entry.
static inline double term(double s, double t, double beta, double *g) {
  double ps = exp(s), pt = exp(t);
  if (beta == 0) {
    *g = -pt;
    return pt > 0 ? pt * (t - s) : 0;
  }
  if (beta == 1) {
    *g = ps * (s - t + 1);
    return ps > 0 ? ps * (s - t) : 0;
  }
  double m = logaddexp(log(beta) + t, log(1 - beta) + s);
  *g = (1 - beta) * ps * (s - m);
  return (pt > 0 ? beta * pt * (t - m) : 0) + (ps > 0 ? (1 - beta) * ps * (s - m) : 0);
}

double ct_kd_reference(const double *zs, const double *zt, int V, double tau, double beta, double *dz) {
  double ms = -INFINITY, mt = -INFINITY, ss = 0, st = 0;
  for (int v = 0; v < V; v++) {
    ms = fmax(ms, zs[v] / tau);
    mt = fmax(mt, zt[v] / tau);
  }
  for (int v = 0; v < V; v++) {
    ss += exp(zs[v] / tau - ms);
    st += exp(zt[v] / tau - mt);
  }
  double ls = ms + log(ss), lt = mt + log(st), L = 0, G = 0;
  for (int v = 0; v < V; v++) {
    double g;
    L += term(zs[v] / tau - ls, zt[v] / tau - lt, beta, &g);
    dz[v] = g;
    G += g;
  }
  for (int v = 0; v < V; v++) dz[v] = (dz[v] - exp(zs[v] / tau - ls) * G) / tau;
  return L;
}

typedef struct {
  ct_kd *k;
  int n, v0, nv, pass, parts;
  const int *target;
  const ct_kd_opts *o;
} chunk_job;

// The chunked passes run in float with the vectorizable ct_expf/ct_logf, summing in
// float over blocks of BLOCK entries and in double across blocks (the reference above
// is the double-precision definition they are tested against).
enum { FORWARD_KL, REVERSE_KL, MIXTURE, BLOCK = 1024 };

typedef struct {
  float beta;
} mix;

// One vocabulary entry's loss term and g = ∂L/∂s. `kind` is a constant at every call
// (the callers are always_inline), so each kind gets its own vectorized loop.
static inline __attribute__((always_inline)) float term_f(int kind, const mix *q, float s, float t,
                                                          float *g) {
  if (kind == FORWARD_KL) {
    float pt = ct_expf(t);
    *g = -pt;
    return pt * (t - s);
  }
  float ps = ct_expf(s);
  if (kind == REVERSE_KL) {
    *g = ps * (s - t + 1);
    return ps * (s - t);
  }
  // m = log(β p_T + (1−β) p_S), taken relative to the larger of s and t so that the log's
  // argument lies in [min(β, 1−β), 1]; s == t gives s − m = t − m = 0 exactly.
  float pt = ct_expf(t), d = s - t, u = ct_expf(-(d > 0 ? d : -d));
  // d > 0: m = s + log(β e^(t−s) + 1 − β);  else m = t + log(β + (1−β) e^(s−t))
  float lg = d > 0 ? ct_logf(q->beta * u + (1 - q->beta)) : ct_logf(q->beta + (1 - q->beta) * u);
  float sm = d > 0 ? -lg : d - lg;   // s − m
  float tm = d > 0 ? -lg - d : -lg;  // t − m
  *g = (1 - q->beta) * ps * sm;
  return q->beta * pt * tm + *g;
}

// Pass 2 for one row of a chunk: adds Σ loss and Σ g.
static inline __attribute__((always_inline)) void row_loss(int kind, const mix *q, const float *zs,
                                                           const float *zt, int nv, float it, float ls,
                                                           float lt, double *L, double *G) {
  for (int b0 = 0; b0 < nv; b0 += BLOCK) {
    int b1 = b0 + BLOCK < nv ? b0 + BLOCK : nv;
    float l = 0, gs = 0;
#pragma omp simd reduction(+ : l, gs)
    for (int v = b0; v < b1; v++) {
      float g;
      l += term_f(kind, q, zs[v] * it - ls, zt[v] * it - lt, &g);
      gs += g;
    }
    *L += l;
    *G += gs;
  }
}

// Pass 3 for one row of a chunk: ∂(scale·L)/∂z = scale·(g − p_S·Σg)/τ over the student logits.
static inline __attribute__((always_inline)) void row_grad(int kind, const mix *q, float *zs,
                                                           const float *zt, int nv, float it, float ls,
                                                           float lt, float G, float c) {
#pragma omp simd
  for (int v = 0; v < nv; v++) {
    float s = zs[v] * it - ls, g;
    term_f(kind, q, s, zt[v] * it - lt, &g);
    zs[v] = c * (g - ct_expf(s) * G);
  }
}

// Folds a chunk's max and Σ e^(x·scale − max) into a row's running (max, sum).
static void fold(double *m, double *sum, float cmax, float csum) {
  if (cmax > *m) {
    *sum = *sum * exp(*m - cmax) + csum;
    *m = cmax;
  } else {
    *sum += csum * exp(cmax - *m);
  }
}

// max over x, and Σ e^(x·scale − max·scale) (scale > 0)
static void chunk_lse(const float *x, int nv, float scale, float *cmax, float *csum) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int v = 0; v < nv; v++) m = x[v] > m ? x[v] : m;
  m *= scale;
  double sum = 0;
  for (int b0 = 0; b0 < nv; b0 += BLOCK) {
    int b1 = b0 + BLOCK < nv ? b0 + BLOCK : nv;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int v = b0; v < b1; v++) s += ct_expf(x[v] * scale - m);
    sum += s;
  }
  *cmax = m;
  *csum = (float)sum;
}

static void chunk_range(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const chunk_job *j = ctx;
  ct_kd *k = j->k;
  float it = 1.0f / j->o->tau, beta = j->o->beta;
  int kind = beta == 0 ? FORWARD_KL : beta == 1 ? REVERSE_KL : MIXTURE;
  mix q = {beta};
  for (long r = lo; r < hi; r++) {
    float *zs = k->ls + r * j->nv, *zt = k->lt + r * j->nv;
    float ls = (float)k->lse_s[r], lt = (float)k->lse_t[r];
    if (j->pass == 1) {
      float m, s;
      chunk_lse(zs, j->nv, it, &m, &s);
      fold(&k->lse_s[r], &k->sum_s[r], m, s);
      chunk_lse(zt, j->nv, it, &m, &s);
      fold(&k->lse_t[r], &k->sum_t[r], m, s);
      chunk_lse(zt, j->nv, 1.0f, &m, &s);
      fold(&k->lse_t1[r], &k->sum_t1[r], m, s);
      int y = j->target ? j->target[r] - j->v0 : -1;
      if (y >= 0 && y < j->nv) k->tgt_t1[r] = zt[y];
    } else if (j->pass == 2) {
      double *L = &k->loss[r], *G = &k->gsum[r];
      if (kind == FORWARD_KL) row_loss(FORWARD_KL, &q, zs, zt, j->nv, it, ls, lt, L, G);
      else if (kind == REVERSE_KL) row_loss(REVERSE_KL, &q, zs, zt, j->nv, it, ls, lt, L, G);
      else row_loss(MIXTURE, &q, zs, zt, j->nv, it, ls, lt, L, G);
    } else {  // pass 3: the chunk's gradient, written over the student logits
      float G = (float)k->gsum[r], c = j->o->scale * it;
      if (kind == FORWARD_KL) row_grad(FORWARD_KL, &q, zs, zt, j->nv, it, ls, lt, G, c);
      else if (kind == REVERSE_KL) row_grad(REVERSE_KL, &q, zs, zt, j->nv, it, ls, lt, G, c);
      else row_grad(MIXTURE, &q, zs, zt, j->nv, it, ls, lt, G, c);
    }
  }
}

double ct_kd_soft(ct_kd *k, const float *hs, int n, const float *W, float *dW, const int *target,
                  ct_kd_teacher_fn teacher, void *ctx, const ct_kd_opts *o) {
  for (int r = 0; r < n; r++) {
    k->lse_s[r] = k->lse_t[r] = k->lse_t1[r] = -INFINITY;
    k->sum_s[r] = k->sum_t[r] = k->sum_t1[r] = 0;
    k->gsum[r] = k->loss[r] = 0;
    k->tgt_t1[r] = 0;
  }
  int last = dW || o->frozen_head ? 3 : 2;
  for (int pass = 1; pass <= last; pass++) {
    for (int v0 = 0; v0 < k->V; v0 += k->tile) {
      int nv = v0 + k->tile <= k->V ? k->tile : k->V - v0;
      if (k->ntiles > 1 || pass == 1) {  // one chunk: the logits are still there
        ct_sgemm('N', 'T', n, nv, k->C, 1, hs, k->C, W + (long)v0 * k->C, k->C, 0, k->ls, nv);
        teacher(ctx, n, v0, nv, k->lt);
      }
      chunk_job j = {k, n, v0, nv, pass, ct_pool_parts(n), target, o};
      ct_parallel_ranges(j.n, 1, j.parts, chunk_range, &j);
      if (pass == 3) {  // dhs (=, first chunk) + dz · W;  dW += dzᵀ · hs
        ct_sgemm('N', 'N', n, k->C, nv, 1, k->ls, nv, W + (long)v0 * k->C, k->C, v0 ? 1 : 0, k->dhs, k->C);
        if (dW) ct_sgemm('T', 'N', nv, k->C, n, 1, k->ls, nv, hs, k->C, 1, dW + (long)v0 * k->C, k->C);
      }
    }
    if (pass == 1)
      for (int r = 0; r < n; r++) {
        k->lse_s[r] += log(k->sum_s[r]);
        k->lse_t[r] += log(k->sum_t[r]);
        k->lse_t1[r] += log(k->sum_t1[r]);
      }
  }
  double total = 0;
  for (int r = 0; r < n; r++) total += k->loss[r];
  return total;
}

double ct_kd_soft_topk(ct_kd *k, const float *hs, int n, const float *W, float *dW, const int *idx,
                       const float *tl, int kk, const ct_kd_opts *o) {
  double it = 1.0 / o->tau, total = 0;
  double *zs = malloc(sizeof(double) * kk), *zt = malloc(sizeof(double) * kk), *dz = malloc(sizeof(double) * kk);
  if (!zs || !zt || !dz) {
    free(zs), free(zt), free(dz);
    ct_set_error(CT_ENOMEM, "distillation: out of memory");
    return NAN;
  }
  // rows one after another: the scatter into dW must not race
  for (int r = 0; r < n; r++) {
    const float *h = hs + (long)r * k->C;
    for (int q = 0; q < kk; q++) {
      const float *w = W + (long)idx[(long)r * kk + q] * k->C;
      double d = 0;
      for (int c = 0; c < k->C; c++) d += (double)h[c] * w[c];
      zs[q] = d;
      zt[q] = tl[(long)r * kk + q];
    }
    double L = ct_kd_reference(zs, zt, kk, 1.0 / it, o->beta, dz);
    k->loss[r] = L;
    total += L;
    if (!dW && !o->frozen_head) continue;
    float *dh = k->dhs + (long)r * k->C;
    memset(dh, 0, sizeof(float) * k->C);
    for (int q = 0; q < kk; q++) {
      float g = (float)(o->scale * dz[q]);
      const float *w = W + (long)idx[(long)r * kk + q] * k->C;
      for (int c = 0; c < k->C; c++) dh[c] += g * w[c];
      if (!dW) continue;
      float *dw = dW + (long)idx[(long)r * kk + q] * k->C;
      for (int c = 0; c < k->C; c++) dw[c] += g * h[c];
    }
  }
  free(zs);
  free(zt);
  free(dz);
  return total;
}
