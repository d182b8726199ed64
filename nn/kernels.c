// kernels: element-wise and row-wise layers (RMSNorm, per-head norm, RoPE, SwiGLU, bias,
// embedding) forward and backward, vectorized, parallel over rows. Reductions use fixed
// chunks so results do not depend on the thread count. Matrix products are matmul.c's.
#include "kernels.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "bf16.h"
#include "fastmath.h"
#include "pool.h"
#include "thin.h"
#include "swiglu.h"

// ---------------------------------------------------------------------------
// Row-parallel helpers: ROWS_BEGIN/ROWS_END wrap the body of a task that handles
// chunk `part` of [0, N). Reductions use CT_RED_CHUNKS parts so that the partial sums,
// and hence the results, are the same whatever the number of threads.

#define ROWS(N, parts, part, lo, hi) \
  long lo, hi;                       \
  ct_chunk_range((N), 1, (parts), (part), &lo, &hi)

// dst[c] += Σ_k partial[k*C + c] for k in chunk order.
typedef struct { float *dst; const float *partial; int C, parts; } sum_job;
static void sum_partials_task(void *ctx, int part, int thread) {
  (void)thread;
  const sum_job *j = ctx;
  ROWS(j->C, ct_pool_threads(), part, lo, hi);
  for (int k = 0; k < j->parts; k++) {
    const float *p = j->partial + (long)k * j->C;
    for (long c = lo; c < hi; c++) j->dst[c] += p[c];
  }
}
static void sum_partials(float *dst, const float *partial, int C, int parts) {
  sum_job j = {dst, partial, C, parts};
  ct_parallel_for(ct_pool_threads(), sum_partials_task, &j);
}

// ---------------------------------------------------------------------------
// RMSNorm

static float rms_inv(const float *x, int C, float eps) {
  float ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int i = 0; i < C; i++) ss += x[i] * x[i];
  return 1.0f / sqrtf(ss / C + eps);
}

typedef struct {
  float *y, *rstd, *dx, *dw, *scratch;
  const float *x, *w, *dy;
  int N, C, parts, accumulate;
  bool apply;  // forward with the rstd already there (ct_rmsnorm_apply)
  float eps;
} rms_job;

static void rms_fwd_task(void *ctx, int part, int thread) {
  (void)thread;
  const rms_job *j = ctx;
  ROWS(j->N, j->parts, part, lo, hi);
  for (long n = lo; n < hi; n++) {
    const float *x = j->x + n * j->C;
    float *y = j->y + n * j->C;
    float r = j->apply ? j->rstd[n] : rms_inv(x, j->C, j->eps);
    if (!j->apply) j->rstd[n] = r;
    for (int i = 0; i < j->C; i++) y[i] = x[i] * r * j->w[i];
  }
}

void ct_rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int N, int C,
                        float eps) {
  rms_job j = {.y = y, .rstd = rstd, .x = x, .w = w, .N = N, .C = C, .eps = eps,
               .parts = ct_pool_parts(N)};
  ct_parallel_for(j.parts, rms_fwd_task, &j);
}

void ct_rmsnorm_apply(float *y, const float *rstd, const float *x, const float *w, int N, int C) {
  rms_job j = {.y = y, .rstd = (float *)rstd, .x = x, .w = w, .N = N, .C = C, .parts = ct_pool_parts(N),
               .apply = true};
  ct_parallel_for(j.parts, rms_fwd_task, &j);
}

static void rms_bwd_task(void *ctx, int part, int thread) {
  (void)thread;
  const rms_job *j = ctx;
  ROWS(j->N, CT_RED_CHUNKS, part, lo, hi);
  int C = j->C;
  float *dw = j->scratch + (long)part * C;
  memset(dw, 0, sizeof(float) * C);
  for (long n = lo; n < hi; n++) {
    const float *x = j->x + n * C, *dy = j->dy + n * C;
    float *dx = j->dx + n * C;
    float r = j->rstd[n];
    // dxhat = dy * w;  dx = r * (dxhat - xhat * mean(dxhat * xhat))
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int i = 0; i < C; i++) dot += dy[i] * j->w[i] * x[i];
    float k = dot * r * r / C;
    if (j->accumulate)
      for (int i = 0; i < C; i++) dx[i] += r * (dy[i] * j->w[i] - x[i] * k);
    else
      for (int i = 0; i < C; i++) dx[i] = r * (dy[i] * j->w[i] - x[i] * k);
    for (int i = 0; i < C; i++) dw[i] += dy[i] * x[i] * r;
  }
}

void ct_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w,
                         const float *rstd, int N, int C, int accumulate, float *scratch) {
  rms_job j = {.dx = dx, .dw = dw, .dy = dy, .x = x, .w = w, .rstd = (float *)rstd, .N = N, .C = C,
               .accumulate = accumulate, .scratch = scratch};
  ct_parallel_for(CT_RED_CHUNKS, rms_bwd_task, &j);
  if (dw) sum_partials(dw, scratch, C, CT_RED_CHUNKS);  // NULL: a frozen norm
}

// ---------------------------------------------------------------------------
// Per-head RMSNorm (Qwen3 q_norm / k_norm): rows of `heads` vectors of width hd.

typedef struct {
  float *xio, *xsave, *rstd, *dw, *scratch;
  const float *w;
  const float *cxsave;
  int N, heads, hd, ld, parts;
  float eps;
} headnorm_job;

static void headnorm_fwd_task(void *ctx, int part, int thread) {
  (void)thread;
  const headnorm_job *j = ctx;
  ROWS(j->N, j->parts, part, lo, hi);
  for (long n = lo; n < hi; n++)
    for (int h = 0; h < j->heads; h++) {
      float *x = j->xio + n * j->ld + (long)h * j->hd;
      float *xs = j->xsave + n * j->ld + (long)h * j->hd;
      memcpy(xs, x, sizeof(float) * j->hd);
      float r = rms_inv(x, j->hd, j->eps);
      j->rstd[n * j->heads + h] = r;
      for (int i = 0; i < j->hd; i++) x[i] = x[i] * r * j->w[i];
    }
}

void ct_headnorm_forward(float *xio, float *xsave, float *rstd, const float *w, int N, int heads,
                         int hd, int ld, float eps) {
  headnorm_job j = {.xio = xio, .xsave = xsave, .rstd = rstd, .w = w, .N = N, .heads = heads,
                    .hd = hd, .ld = ld, .eps = eps, .parts = ct_pool_parts(N)};
  ct_parallel_for(j.parts, headnorm_fwd_task, &j);
}

static void headnorm_bwd_task(void *ctx, int part, int thread) {
  (void)thread;
  const headnorm_job *j = ctx;
  ROWS(j->N, CT_RED_CHUNKS, part, lo, hi);
  int hd = j->hd;
  float *dw = j->scratch + (long)part * hd;
  memset(dw, 0, sizeof(float) * hd);
  for (long n = lo; n < hi; n++)
    for (int h = 0; h < j->heads; h++) {
      float *d = j->xio + n * j->ld + (long)h * hd;
      const float *x = j->cxsave + n * j->ld + (long)h * hd;
      float r = j->rstd[n * j->heads + h];
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int i = 0; i < hd; i++) dot += d[i] * j->w[i] * x[i];
      float k = dot * r * r / hd;
      for (int i = 0; i < hd; i++) {
        dw[i] += d[i] * x[i] * r;
        d[i] = r * (d[i] * j->w[i] - x[i] * k);
      }
    }
}

void ct_headnorm_backward(float *dxio, float *dw, const float *xsave, const float *w,
                          const float *rstd, int N, int heads, int hd, int ld, float *scratch) {
  headnorm_job j = {.xio = dxio, .cxsave = xsave, .rstd = (float *)rstd, .w = w, .dw = dw,
                    .scratch = scratch, .N = N, .heads = heads, .hd = hd, .ld = ld};
  ct_parallel_for(CT_RED_CHUNKS, headnorm_bwd_task, &j);
  if (dw) sum_partials(dw, scratch, hd, CT_RED_CHUNKS);  // NULL: a frozen norm
}

// ---------------------------------------------------------------------------
// RoPE, rotate-half convention: pairs (i, i + hd/2) rotate by pos * inv_freq[i].

typedef struct {
  float *x;
  const int *pos;
  const float *cos_t, *sin_t;
  int N, heads, hd, ld, inverse, parts;
} rope_job;

static void rope_task(void *ctx, int part, int thread) {
  (void)thread;
  const rope_job *j = ctx;
  ROWS(j->N, j->parts, part, lo, hi);
  int half = j->hd / 2;
  float sgn = j->inverse ? -1.0f : 1.0f;
  for (long n = lo; n < hi; n++) {
    const float *c = j->cos_t + (long)j->pos[n] * half;
    const float *s = j->sin_t + (long)j->pos[n] * half;
    for (int h = 0; h < j->heads; h++) {
      float *x1 = j->x + n * j->ld + (long)h * j->hd, *x2 = x1 + half;
      for (int i = 0; i < half; i++) {
        float a = x1[i], b = x2[i], si = sgn * s[i];
        x1[i] = a * c[i] - b * si;
        x2[i] = b * c[i] + a * si;
      }
    }
  }
}

void ct_rope(float *x, const int *pos, const float *cos_t, const float *sin_t, int N, int heads,
             int hd, int ld, int inverse) {
  rope_job j = {x, pos, cos_t, sin_t, N, heads, hd, ld, inverse, ct_pool_parts(N)};
  ct_parallel_for(j.parts, rope_task, &j);
}

// ---------------------------------------------------------------------------
// SwiGLU

typedef struct {
  float *h, *dgu;
  uint16_t *h16, *dgu16;  // (or NULL) the outputs rounded to bf16
  const float *gu, *dh;
  int N, F, parts;
} swiglu_job;

// Rows [lo, hi) of h = swiglu(gu).
static void swiglu_rows(const swiglu_job *j, long lo, long hi) {
  int F = j->F;
  for (long n = lo; n < hi; n++) {
    const float *g = j->gu + n * 2 * F, *u = g + F;
    float *h = j->h + n * F;
#pragma omp simd
    for (int i = 0; i < F; i++) h[i] = ct_swiglu_h(g[i], u[i]);
    if (j->h16) ct_bf16_narrow(j->h16 + n * F, h, F);  // (the row is still in L1)
  }
}

static void swiglu_fwd_task(void *ctx, int part, int thread) {
  (void)thread;
  const swiglu_job *j = ctx;
  ROWS(j->N, j->parts, part, lo, hi);
  swiglu_rows(j, lo, hi);
}

void ct_swiglu_forward(float *h, uint16_t *h16, const float *gu, int N, int F) {
  swiglu_job j = {.h = h, .h16 = h16, .gu = gu, .N = N, .F = F, .parts = ct_pool_parts(N)};
  ct_parallel_for(j.parts, swiglu_fwd_task, &j);
}

typedef struct {
  swiglu_job sw;
  float *gu, s;
  const float *ug, *Bgt, *uu, *But;
  int round;
  uint16_t *gu16;
} swiglu_lora_job;

// Rows [n0, n1) of gu (2F each) rounded to bf16 values in place, their bits into gu16 too.
static void round_rows(float *gu, uint16_t *gu16, long n0, long n1, int F) {
  for (long n = n0; n < n1; n++) {
    float *r = gu + n * 2 * F;
#pragma omp simd
    for (int i = 0; i < 2 * F; i++) {
      uint16_t b = ct_f32_to_bf16(r[i]);
      r[i] = ct_bf16_to_f32(b);
      if (gu16) gu16[n * 2 * F + i] = b;
    }
  }
}

static void swiglu_lora_range(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const swiglu_lora_job *j = ctx;
  int F = j->sw.F;
  for (long n0 = lo; n0 < hi; n0 += 8) {  // 8 rows of gu (2 x 8 x F floats) stay in L2
    long n1 = n0 + 8 < hi ? n0 + 8 : hi;
    if (j->ug) ct_thin_add_rows(n0, n1, F, j->s, j->ug, j->Bgt, j->gu, 2 * F);
    if (j->uu) ct_thin_add_rows(n0, n1, F, j->s, j->uu, j->But, j->gu + F, 2 * F);
    if (j->round) round_rows(j->gu, j->gu16, n0, n1, F);
    if (j->sw.h) swiglu_rows(&j->sw, n0, n1);
  }
}

void ct_swiglu_forward_lora(float *h, uint16_t *h16, float *gu, int N, int F, float s, const float *ug,
                            const float *Bgt, const float *uu, const float *But, int round, uint16_t *gu16) {
  swiglu_lora_job j = {{.h = h, .h16 = h16, .gu = gu, .N = N, .F = F}, gu, s, ug, Bgt, uu, But, round, gu16};
  ct_parallel_ranges(N, 8, ct_pool_parts((N + 7) / 8), swiglu_lora_range, &j);
}

static void swiglu_bwd_task(void *ctx, int part, int thread) {
  (void)thread;
  const swiglu_job *j = ctx;
  ROWS(j->N, j->parts, part, lo, hi);
  int F = j->F;
  for (long n = lo; n < hi; n++) {
    const float *g = j->gu + n * 2 * F, *u = g + F, *dh = j->dh + n * F;
    float *dg = j->dgu + n * 2 * F, *du = dg + F;
#pragma omp simd
    for (int i = 0; i < F; i++) {
      float dgi, dui;
      ct_swiglu_grads(g[i], u[i], dh[i], &dgi, &dui);
      du[i] = dui;  // (both read before either is written: dgu may be gu)
      dg[i] = dgi;
    }
    if (j->dgu16) ct_bf16_narrow(j->dgu16 + n * 2 * F, dg, 2 * F);
  }
}

void ct_swiglu_backward(float *dgu, uint16_t *dgu16, const float *dh, const float *gu, int N, int F) {
  swiglu_job j = {.dgu = dgu, .dgu16 = dgu16, .dh = dh, .gu = gu, .N = N, .F = F, .parts = ct_pool_parts(N)};
  ct_parallel_for(j.parts, swiglu_bwd_task, &j);
}

// ---------------------------------------------------------------------------
// GeGLU (tanh approximation)

#define GELU_K 0.7978845608028654f  // sqrt(2/π)
#define GELU_A 0.044715f

static void geglu_fwd_task(void *ctx, int part, int thread) {
  (void)thread;
  const swiglu_job *j = ctx;
  ROWS(j->N, j->parts, part, lo, hi);
  int F = j->F;
  for (long n = lo; n < hi; n++) {
    const float *g = j->gu + n * 2 * F, *u = g + F;
    float *h = j->h + n * F;
#pragma omp simd
    for (int i = 0; i < F; i++) {
      float x = g[i], t = ct_tanhf(GELU_K * (x + GELU_A * x * x * x));
      h[i] = 0.5f * x * (1.0f + t) * u[i];
    }
  }
}

void ct_geglu_forward(float *h, const float *gu, int N, int F) {
  swiglu_job j = {.h = h, .gu = gu, .N = N, .F = F, .parts = ct_pool_parts(N)};
  ct_parallel_for(j.parts, geglu_fwd_task, &j);
}

static void geglu_bwd_task(void *ctx, int part, int thread) {
  (void)thread;
  const swiglu_job *j = ctx;
  ROWS(j->N, j->parts, part, lo, hi);
  int F = j->F;
  for (long n = lo; n < hi; n++) {
    const float *g = j->gu + n * 2 * F, *u = g + F, *dh = j->dh + n * F;
    float *dg = j->dgu + n * 2 * F, *du = dg + F;
#pragma omp simd
    for (int i = 0; i < F; i++) {
      float x = g[i], t = ct_tanhf(GELU_K * (x + GELU_A * x * x * x));
      float gelu = 0.5f * x * (1.0f + t);
      float dgelu = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
      float dui = dh[i] * gelu, dgi = dh[i] * u[i] * dgelu;
      du[i] = dui;  // (both read before either is written: dgu may be gu)
      dg[i] = dgi;
    }
  }
}

void ct_geglu_backward(float *dgu, const float *dh, const float *gu, int N, int F) {
  swiglu_job j = {.dgu = dgu, .dh = dh, .gu = gu, .N = N, .F = F, .parts = ct_pool_parts(N)};
  ct_parallel_for(j.parts, geglu_bwd_task, &j);
}

typedef struct {
  float *y;
  const float *x;
  long N;
  int C, parts;
} add_job;

static void add_task(void *ctx, int part, int thread) {
  (void)thread;
  const add_job *j = ctx;
  ROWS(j->N, j->parts, part, lo, hi);
  float *y = j->y + lo * j->C;
  const float *x = j->x + lo * j->C;
  long n = (hi - lo) * j->C;
#pragma omp simd
  for (long i = 0; i < n; i++) y[i] += x[i];
}

void ct_add_rows(float *y, const float *x, long N, int C) {
  add_job j = {.y = y, .x = x, .N = N, .C = C, .parts = ct_pool_parts((int)N)};
  ct_parallel_for(j.parts, add_task, &j);
}

static void copy_task(void *ctx, int part, int thread) {
  (void)thread;
  const add_job *j = ctx;
  ROWS(j->N, j->parts, part, lo, hi);
  memcpy(j->y + lo * j->C, j->x + lo * j->C, sizeof(float) * (size_t)((hi - lo) * j->C));
}

void ct_copy_rows(float *y, const float *x, long N, int C) {
  add_job j = {.y = y, .x = x, .N = N, .C = C, .parts = ct_pool_parts((int)N)};
  ct_parallel_for(j.parts, copy_task, &j);
}

// ---------------------------------------------------------------------------
// Bias

typedef struct {
  float *y, *db, *scratch;
  const float *b, *dy;
  int N, C, ld, parts;
} bias_job;

static void bias_fwd_task(void *ctx, int part, int thread) {
  (void)thread;
  const bias_job *j = ctx;
  ROWS(j->N, j->parts, part, lo, hi);
  for (long n = lo; n < hi; n++)
    for (int i = 0; i < j->C; i++) j->y[n * j->ld + i] += j->b[i];
}

void ct_bias_forward(float *y, const float *b, int N, int C, int ld) {
  bias_job j = {.y = y, .b = b, .N = N, .C = C, .ld = ld, .parts = ct_pool_parts(N)};
  ct_parallel_for(j.parts, bias_fwd_task, &j);
}

static void bias_bwd_task(void *ctx, int part, int thread) {
  (void)thread;
  const bias_job *j = ctx;
  ROWS(j->N, CT_RED_CHUNKS, part, lo, hi);
  float *db = j->scratch + (long)part * j->C;
  memset(db, 0, sizeof(float) * j->C);
  for (long n = lo; n < hi; n++)
    for (int i = 0; i < j->C; i++) db[i] += j->dy[n * j->ld + i];
}

void ct_bias_backward(float *db, const float *dy, int N, int C, int ld, float *scratch) {
  bias_job j = {.db = db, .dy = dy, .scratch = scratch, .N = N, .C = C, .ld = ld};
  ct_parallel_for(CT_RED_CHUNKS, bias_bwd_task, &j);
  sum_partials(db, scratch, C, CT_RED_CHUNKS);
}

// ---------------------------------------------------------------------------
// The embedding

typedef struct {
  float *out;
  const float *in;
  const int *ids;
  int N, C, parts;
} embed_job;

static void embed_fwd_task(void *ctx, int part, int thread) {
  (void)thread;
  const embed_job *j = ctx;
  ROWS(j->N, j->parts, part, lo, hi);
  for (long n = lo; n < hi; n++)
    memcpy(j->out + n * j->C, j->in + (long)j->ids[n] * j->C, sizeof(float) * j->C);
}

void ct_embed_forward(float *out, const float *table, const int *ids, int N, int C) {
  embed_job j = {out, table, ids, N, C, ct_pool_parts(N)};
  ct_parallel_for(j.parts, embed_fwd_task, &j);
}

static void embed_bwd_task(void *ctx, int part, int thread) {
  (void)thread;
  const embed_job *j = ctx;
  long lo, hi;  // columns
  ct_chunk_range(j->C, 16, j->parts, part, &lo, &hi);
  for (long n = 0; n < j->N; n++) {
    float *d = j->out + (long)j->ids[n] * j->C;
    const float *g = j->in + n * j->C;
    for (long c = lo; c < hi; c++) d[c] += g[c];
  }
}

void ct_embed_backward(float *dtable, const float *dout, const int *ids, int N, int C) {
  embed_job j = {dtable, dout, ids, N, C, ct_pool_threads()};
  ct_parallel_for(j.parts, embed_bwd_task, &j);
}

// ---------------------------------------------------------------------------
// bf16 narrowing of a matmul's input (bf16 compute): rows of x (N, ld) -> dst (N, C) packed

typedef struct {
  uint16_t *dst;
  const float *x;
  int C, ld;
} narrow_rows_job;

static void narrow_rows_range(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const narrow_rows_job *j = ctx;
  for (long n = lo; n < hi; n++) ct_bf16_narrow(j->dst + n * j->C, j->x + n * j->ld, j->C);
}

void ct_bf16_narrow_rows(uint16_t *dst, const float *x, int N, int C, int ld) {
  narrow_rows_job j = {dst, x, C, ld};
  ct_parallel_ranges(N, 1, ct_pool_parts(N), narrow_rows_range, &j);
}

typedef struct {
  float *dst;
  const uint16_t *src;
} widen_job;

static void widen_range(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const widen_job *j = ctx;
  ct_bf16_widen(j->dst + lo, j->src + lo, hi - lo);
}

void ct_bf16_widen_all(float *dst, const uint16_t *src, long n) {
  widen_job j = {dst, src};
  ct_parallel_ranges(n, 4096, ct_pool_parts((n + 65535) / 65536), widen_range, &j);
}
