// thin: rank-16 products streaming the big operand once, register-blocked (see thin.h).
// The AVX-512 paths and the scalar ones (tails, other CPUs) compute the same fmaf chains,
// so a row's result does not depend on which path or thread took it.
#include "thin.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "pool.h"
#include "swiglu.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define R CT_THIN_R

// ---------------------------------------------------------------------------
// Y = alpha · X · W, rows [n0, n1) (n0 a multiple of 8)

static void out_rows_scalar(long n, int K, float alpha, const float *X, int ldx, const float *W, float *Y) {
  const float *x = X + n * ldx;
  float acc[R] = {0};
  for (int k = 0; k < K; k++)
    for (int j = 0; j < R; j++) acc[j] = fmaf(x[k], W[(long)k * R + j], acc[j]);
  for (int j = 0; j < R; j++) Y[n * R + j] = alpha * acc[j];
}

static void out_rows(long n0, long n1, int K, float alpha, const float *X, int ldx, const float *W, float *Y) {
  long n = n0;
#if defined(__AVX512F__)
  for (; n + 8 <= n1; n += 8) {  // 8 rows share each load of W's row k
    const float *x = X + n * ldx;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int k = 0; k < K; k++) {
      __m512 w = _mm512_loadu_ps(W + (long)k * R);
      a0 = _mm512_fmadd_ps(_mm512_set1_ps(x[k]), w, a0);
      a1 = _mm512_fmadd_ps(_mm512_set1_ps(x[ldx + k]), w, a1);
      a2 = _mm512_fmadd_ps(_mm512_set1_ps(x[2L * ldx + k]), w, a2);
      a3 = _mm512_fmadd_ps(_mm512_set1_ps(x[3L * ldx + k]), w, a3);
      a4 = _mm512_fmadd_ps(_mm512_set1_ps(x[4L * ldx + k]), w, a4);
      a5 = _mm512_fmadd_ps(_mm512_set1_ps(x[5L * ldx + k]), w, a5);
      a6 = _mm512_fmadd_ps(_mm512_set1_ps(x[6L * ldx + k]), w, a6);
      a7 = _mm512_fmadd_ps(_mm512_set1_ps(x[7L * ldx + k]), w, a7);
    }
    __m512 s = _mm512_set1_ps(alpha);
    float *y = Y + n * R;
    _mm512_storeu_ps(y, _mm512_mul_ps(s, a0));
    _mm512_storeu_ps(y + R, _mm512_mul_ps(s, a1));
    _mm512_storeu_ps(y + 2 * R, _mm512_mul_ps(s, a2));
    _mm512_storeu_ps(y + 3 * R, _mm512_mul_ps(s, a3));
    _mm512_storeu_ps(y + 4 * R, _mm512_mul_ps(s, a4));
    _mm512_storeu_ps(y + 5 * R, _mm512_mul_ps(s, a5));
    _mm512_storeu_ps(y + 6 * R, _mm512_mul_ps(s, a6));
    _mm512_storeu_ps(y + 7 * R, _mm512_mul_ps(s, a7));
  }
#endif
  for (; n < n1; n++) out_rows_scalar(n, K, alpha, X, ldx, W, Y);
}

typedef struct {
  int N, K, ldx;
  float alpha;
  const float *X, *W, *U;
  float *Y, *G;
} thin_job;

static void out_range(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const thin_job *j = ctx;
  out_rows(lo, hi, j->K, j->alpha, j->X, j->ldx, j->W, j->Y);
}

void ct_thin_out_rows(long n0, long n1, int K, float alpha, const float *X, int ldx, const float *W, float *Y) {
  out_rows(n0, n1, K, alpha, X, ldx, W, Y);
}

void ct_thin_transpose(const float *A, int K, float *W) {
  for (int j = 0; j < R; j++)
    for (int k = 0; k < K; k++) W[(long)k * R + j] = A[(long)j * K + k];
}

void ct_thin_out(int N, int K, float alpha, const float *X, int ldx, const float *W, float *Y) {
  thin_job j = {N, K, ldx, alpha, X, W, NULL, Y, NULL};
  ct_parallel_ranges(N, 8, ct_pool_parts((N + 7) / 8), out_range, &j);
}

// ---------------------------------------------------------------------------
// G += alpha · Xᵀ · U, inputs [k0, k1) (k0 a multiple of 16)

static void grad_cols_scalar(int k, int N, float alpha, const float *X, int ldx, const float *U, float *G) {
  float acc[R] = {0};
  for (long n = 0; n < N; n++)
    for (int j = 0; j < R; j++) acc[j] = fmaf(X[n * ldx + k], U[n * R + j], acc[j]);
  for (int j = 0; j < R; j++) G[(long)k * R + j] = fmaf(alpha, acc[j], G[(long)k * R + j]);
}

static void grad_cols(int k0, int k1, int N, float alpha, const float *X, int ldx, const float *U, float *G) {
  int k = k0;
#if defined(__AVX512F__)
  for (; k + 16 <= k1; k += 16) {  // 16 inputs share each load of U's row n
    __m512 a[16];
    for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
    for (long n = 0; n < N; n++) {
      // rows are far apart (a row of X is K floats): no hardware prefetcher follows that stride
      if (n + 16 < N) _mm_prefetch((const char *)(X + (n + 16) * ldx + k), _MM_HINT_T0);
      __m512 u = _mm512_loadu_ps(U + n * R);
      const float *x = X + n * ldx + k;
#pragma GCC unroll 16
      for (int i = 0; i < 16; i++) a[i] = _mm512_fmadd_ps(_mm512_set1_ps(x[i]), u, a[i]);
    }
    __m512 s = _mm512_set1_ps(alpha);
    for (int i = 0; i < 16; i++) {
      float *g = G + (long)(k + i) * R;
      _mm512_storeu_ps(g, _mm512_fmadd_ps(s, a[i], _mm512_loadu_ps(g)));
    }
  }
#endif
  for (; k < k1; k++) grad_cols_scalar(k, N, alpha, X, ldx, U, G);
}

static void grad_range(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const thin_job *j = ctx;
  grad_cols((int)lo, (int)hi, j->N, j->alpha, j->X, j->ldx, j->U, j->G);
}

void ct_thin_grad(int N, int K, float alpha, const float *X, int ldx, const float *U, float *G) {
  thin_job j = {N, K, ldx, alpha, X, NULL, U, NULL, G};
  ct_parallel_ranges(K, 16, ct_pool_parts((K + 15) / 16), grad_range, &j);
}

// ---------------------------------------------------------------------------
// Y = X · W and G += alpha · Xᵀ · U in one pass over X: chunk c's rows into partial c

typedef struct {
  int N, K, ldx;
  float alpha;
  const float *X, *W, *U;
  float *Y, *G, *P;
} out_grad_job;

long ct_thin_out_grad_floats(int N, int K) { return (long)(N + CT_THIN_CHUNK - 1) / CT_THIN_CHUNK * K * R; }

static void out_grad_row_scalar(long n, int K, const float *X, int ldx, const float *W, const float *U, float *Y,
                                float *P) {
  const float *x = X + n * ldx, *u = U + n * R;
  float acc[R] = {0};
  for (int k = 0; k < K; k++)
    for (int j = 0; j < R; j++) {
      acc[j] = fmaf(x[k], W[(long)k * R + j], acc[j]);
      P[(long)k * R + j] = fmaf(x[k], u[j], P[(long)k * R + j]);
    }
  for (int j = 0; j < R; j++) Y[n * R + j] = acc[j];
}

static void out_grad_chunk(void *ctx, int c, int thread) {
  (void)thread;
  const out_grad_job *j = ctx;
  int K = j->K, ldx = j->ldx;
  long n = (long)c * CT_THIN_CHUNK, n1 = n + CT_THIN_CHUNK < j->N ? n + CT_THIN_CHUNK : j->N;
  float *P = j->P + (long)c * K * R;
  for (long i = 0; i < (long)K * R; i++) P[i] = 0;
#if defined(__AVX512F__)
  for (; n + 8 <= n1; n += 8) {  // 8 rows: each W row and partial row loaded once for all 8
    const float *x = j->X + n * ldx;
    __m512 u[8], y[8];
    for (int r = 0; r < 8; r++) u[r] = _mm512_loadu_ps(j->U + (n + r) * R), y[r] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
      __m512 w = _mm512_loadu_ps(j->W + (long)k * R), p = _mm512_loadu_ps(P + (long)k * R);
#pragma GCC unroll 8
      for (int r = 0; r < 8; r++) {
        __m512 xv = _mm512_set1_ps(x[r * (long)ldx + k]);
        y[r] = _mm512_fmadd_ps(xv, w, y[r]);
        p = _mm512_fmadd_ps(xv, u[r], p);
      }
      _mm512_storeu_ps(P + (long)k * R, p);
    }
    for (int r = 0; r < 8; r++) _mm512_storeu_ps(j->Y + (n + r) * R, y[r]);
  }
#endif
  for (; n < n1; n++) out_grad_row_scalar(n, K, j->X, ldx, j->W, j->U, j->Y, P);
}

// G[k] += alpha · Σ_c partial_c[k], chunks in order, for inputs [lo, hi)
static void out_grad_sum(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const out_grad_job *j = ctx;
  long chunks = (j->N + CT_THIN_CHUNK - 1) / CT_THIN_CHUNK;
  for (long i = lo * R; i < hi * R; i++) {
    float t = 0;
    for (long c = 0; c < chunks; c++) t += j->P[c * j->K * R + i];
    j->G[i] = fmaf(j->alpha, t, j->G[i]);
  }
}

void ct_thin_out_grad(int N, int K, float alpha, const float *X, int ldx, const float *W, const float *U, float *Y,
                      float *G, float *partials) {
  out_grad_job j = {N, K, ldx, alpha, X, W, U, Y, G, partials};
  ct_parallel_for((N + CT_THIN_CHUNK - 1) / CT_THIN_CHUNK, out_grad_chunk, &j);
  ct_parallel_ranges(K, 16, ct_pool_parts((K + 15) / 16), out_grad_sum, &j);
}

// ---------------------------------------------------------------------------
// With a dropout mask (bits: row n's words at bits + n·wpr, bit k of the row set = kept;
// NULL = every element kept): G (16, K) += alpha · Σ_n U[n][:]ᵀ · (mask ⊙ X[n]), inputs
// [k0, k1) (k0 a multiple of 16), and dX[n] += alpha · mask ⊙ (V[n] · A) for rows [n0, n1).

static inline int kept(const uint32_t *bits, long n, int wpr, int k) {
  return !bits || (bits[n * wpr + k / 32] >> (k % 32) & 1u);
}

static void grad_rows_scalar(int k, int N, float alpha, const float *X, int ldx, const uint32_t *bits, int wpr,
                             const float *U, float *G, int K) {
  float acc[R] = {0};
  for (long n = 0; n < N; n++) {
    float x = kept(bits, n, wpr, k) ? X[n * ldx + k] : 0.0f;
    for (int j = 0; j < R; j++) acc[j] = fmaf(x, U[n * R + j], acc[j]);
  }
  for (int j = 0; j < R; j++) G[(long)j * K + k] = fmaf(alpha, acc[j], G[(long)j * K + k]);
}

typedef struct {
  int N, K, ldx, wpr, lddx;
  float alpha;
  const float *X, *U, *A;
  const float *gu;  // grad_chunk: X is swiglu(gu) (gu (N, 2K)), computed as it is read
  const uint32_t *bits;
  float *G, *dX;
} masked_job;

// X[n][k], or swiglu's h from gu's row n
static inline float x_at(const masked_job *j, long n, long k) {
  if (!j->gu) return j->X[n * j->ldx + k];
  const float *g = j->gu + n * 2 * j->K;
  return ct_swiglu_h(g[k], g[j->K + k]);
}

#if defined(__AVX512F__)
// Bits k..k+15 of row n's mask (k a multiple of 16), or all set without one.
static inline __mmask16 mask16(const uint32_t *bits, long n, int wpr, int k) {
  return bits ? (__mmask16)(bits[n * wpr + k / 32] >> (k % 32)) : (__mmask16)0xffff;
}
#endif

static void grad_rows_range(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const masked_job *j = ctx;
  int k = (int)lo;
#if defined(__AVX512F__)
  for (; k + 16 <= hi; k += 16) {  // 16 inputs in lanes; row n's 16 U values broadcast
    __m512 a[16];
    for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
    for (long n = 0; n < j->N; n++) {
      if (n + 16 < j->N) _mm_prefetch((const char *)(j->X + (n + 16) * j->ldx + k), _MM_HINT_T0);
      __m512 x = _mm512_maskz_loadu_ps(mask16(j->bits, n, j->wpr, k), j->X + n * j->ldx + k);
      const float *u = j->U + n * R;
#pragma GCC unroll 16
      for (int i = 0; i < 16; i++) a[i] = _mm512_fmadd_ps(x, _mm512_set1_ps(u[i]), a[i]);
    }
    __m512 s = _mm512_set1_ps(j->alpha);
    for (int i = 0; i < 16; i++) {
      float *g = j->G + (long)i * j->K + k;
      _mm512_storeu_ps(g, _mm512_fmadd_ps(s, a[i], _mm512_loadu_ps(g)));
    }
  }
#endif
  for (; k < hi; k++) grad_rows_scalar(k, j->N, j->alpha, j->X, j->ldx, j->bits, j->wpr, j->U, j->G, j->K);
}

// Chunk c's partial P (16, K) = Σ over its rows n, in order, of U[n][:]ᵀ · (mask ⊙ X[n]):
// each P[r][k] one fmaf chain in row order. Rows go 8 at a time along X; for each 48
// inputs (3 blocks of 16 lanes) the 8 rows' P[r][..] of half the rank sit in 24 registers,
// so each broadcast U value feeds 3 FMAs (the chain held in memory between rows read 2.6
// loads a FMA and ran at a quarter of the FMA rate). X from gu: h of the 8 rows' 48 inputs
// computed once into h (as ct_swiglu_forward computes it), read by both halves.
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void grad_block(const masked_job *j, long n, int nr, long k, float *P,
                                                             const int nb) {
  long K = j->K;
  float h[8][48];
  const float *xr[8];
  for (int i = 0; i < nr; i++) {
    if (!j->gu) {
      xr[i] = j->X + (n + i) * j->ldx + k;
      continue;
    }
    const float *g = j->gu + (n + i) * 2 * K + k, *u = g + K;
    for (int q = 96; q < 144; q += 16) {
      _mm_prefetch((const char *)(g + q), _MM_HINT_T0);
      _mm_prefetch((const char *)(u + q), _MM_HINT_T0);
    }
    for (int b = 0; b < nb; b++) {
#pragma omp simd
      for (int q = 0; q < 16; q++) h[i][16 * b + q] = ct_swiglu_h(g[16 * b + q], u[16 * b + q]);
    }
    xr[i] = h[i];
  }
  // (24 named accumulators: as an array GCC stored every one back to the stack each row)
#define GB_EACH(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7)
#define GB_DECL(r) __m512 a##r##0 = z, a##r##1 = z, a##r##2 = z;
#define GB_LOAD(r)                                                   \
  a##r##0 = _mm512_loadu_ps(P + (r0 + r) * K + k);                   \
  if (nb > 1) a##r##1 = _mm512_loadu_ps(P + (r0 + r) * K + k + 16); \
  if (nb > 2) a##r##2 = _mm512_loadu_ps(P + (r0 + r) * K + k + 32);
#define GB_FMA(r)                                              \
  {                                                            \
    __m512 ur = _mm512_set1_ps(u[r]);                          \
    a##r##0 = _mm512_fmadd_ps(x0, ur, a##r##0);                \
    if (nb > 1) a##r##1 = _mm512_fmadd_ps(x1, ur, a##r##1);    \
    if (nb > 2) a##r##2 = _mm512_fmadd_ps(x2, ur, a##r##2);    \
  }
#define GB_STORE(r)                                                   \
  _mm512_storeu_ps(P + (r0 + r) * K + k, a##r##0);                    \
  if (nb > 1) _mm512_storeu_ps(P + (r0 + r) * K + k + 16, a##r##1);  \
  if (nb > 2) _mm512_storeu_ps(P + (r0 + r) * K + k + 32, a##r##2);
  const __m512 z = _mm512_setzero_ps();
  for (int r0 = 0; r0 < R; r0 += 8) {
    GB_EACH(GB_DECL)
    GB_EACH(GB_LOAD)
    for (int i = 0; i < nr; i++) {
      const float *xi = xr[i];
      int kk = (int)k;
      if (r0 == 0 && !j->gu)  // the rows' lines two blocks on: 8 strided streams outran the prefetchers
        for (int q = 96; q < 144; q += 16) _mm_prefetch((const char *)(xi + q), _MM_HINT_T0);
      __m512 x0 = _mm512_maskz_loadu_ps(mask16(j->bits, n + i, j->wpr, kk), xi);
      __m512 x1 = nb > 1 ? _mm512_maskz_loadu_ps(mask16(j->bits, n + i, j->wpr, kk + 16), xi + 16) : z;
      __m512 x2 = nb > 2 ? _mm512_maskz_loadu_ps(mask16(j->bits, n + i, j->wpr, kk + 32), xi + 32) : z;
      const float *u = j->U + (n + i) * R + r0;
      GB_EACH(GB_FMA)
    }
    GB_EACH(GB_STORE)
  }
#undef GB_EACH
#undef GB_DECL
#undef GB_LOAD
#undef GB_FMA
#undef GB_STORE
}
#endif

static void grad_chunk(void *ctx, int c, int thread) {
  (void)thread;
  const masked_job *j = ctx;
  long K = j->K, n0 = (long)c * CT_THIN_CHUNK, n1 = n0 + CT_THIN_CHUNK < j->N ? n0 + CT_THIN_CHUNK : j->N;
  float *P = j->dX + c * R * K;
  memset(P, 0, sizeof(float) * R * K);
  long kv = 0;
#if defined(__AVX512F__)
  kv = K / 16 * 16;
  long k3 = K / 48 * 48;
  for (long n = n0; n < n1; n += 8) {
    int nr = n1 - n < 8 ? (int)(n1 - n) : 8;
    for (long k = 0; k < k3; k += 48) grad_block(j, n, nr, k, P, 3);
    if (kv - k3 == 32) grad_block(j, n, nr, k3, P, 2);
    else if (kv - k3 == 16) grad_block(j, n, nr, k3, P, 1);
  }
#endif
  for (long n = n0; n < n1 && kv < K; n++)
    for (long k = kv; k < K; k++) {
      float x = kept(j->bits, n, j->wpr, (int)k) ? x_at(j, n, k) : 0.0f;
      for (int r = 0; r < R; r++) P[r * K + k] = fmaf(x, j->U[n * R + r], P[r * K + k]);
    }
}

// G[r][k] += alpha · Σ_c P_c[r][k], chunks in order, for inputs [lo, hi)
static void grad_sum(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const masked_job *j = ctx;
  long K = j->K, chunks = (j->N + CT_THIN_CHUNK - 1) / CT_THIN_CHUNK;
  for (int r = 0; r < R; r++)
    for (long k = lo; k < hi; k++) {
      float t = 0;
      for (long c = 0; c < chunks; c++) t += j->dX[(c * R + r) * K + k];
      j->G[r * K + k] = fmaf(j->alpha, t, j->G[r * K + k]);
    }
}

void ct_thin_grad_masked(int N, int K, float alpha, const float *X, int ldx, const uint32_t *bits, const float *U,
                         float *G, float *partials) {
  masked_job j = {.N = N, .K = K, .ldx = ldx, .wpr = (K + 31) / 32, .alpha = alpha, .X = X, .U = U, .bits = bits,
                  .G = G, .dX = partials};
  if (!partials) {
    ct_parallel_ranges(K, 16, ct_pool_parts((K + 15) / 16), grad_rows_range, &j);
    return;
  }
  ct_parallel_for((N + CT_THIN_CHUNK - 1) / CT_THIN_CHUNK, grad_chunk, &j);
  ct_parallel_ranges(K, 16, ct_pool_parts((K + 15) / 16), grad_sum, &j);
}

void ct_thin_grad_masked_swiglu(int N, int F, float alpha, const float *gu, const uint32_t *bits, const float *U,
                                float *G, float *partials) {
  masked_job j = {.N = N, .K = F, .wpr = (F + 31) / 32, .alpha = alpha, .U = U, .gu = gu, .bits = bits, .G = G,
                  .dX = partials};
  ct_parallel_for((N + CT_THIN_CHUNK - 1) / CT_THIN_CHUNK, grad_chunk, &j);
  ct_parallel_ranges(F, 16, ct_pool_parts((F + 15) / 16), grad_sum, &j);
}

static void dx_rows_scalar(long n, int K, float alpha, const float *V, const float *A, const uint32_t *bits, int wpr,
                           float *dX, int lddx, int k0) {
  for (int k = k0; k < K; k++) {
    float t = 0;
    for (int j = 0; j < R; j++) t = fmaf(V[n * R + j], A[(long)j * K + k], t);
    if (kept(bits, n, wpr, k)) dX[n * lddx + k] = fmaf(alpha, t, dX[n * lddx + k]);
  }
}

static void dx_range(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const masked_job *j = ctx;
  int K = j->K, k = 0;
#if defined(__AVX512F__)
  __m512 s = _mm512_set1_ps(j->alpha);
  int kv = K / 16 * 16;
  for (long c0 = lo; c0 < hi; c0 += 32) {  // 32 rows at a time: their dX rows stay in L2 across blocks
    long c1 = c0 + 32 < hi ? c0 + 32 : hi;
    for (int kb = 0; kb < kv; kb += 16) {  // A's 16 rows of this block in registers; each row streams by
      __m512 a[16];
      for (int i = 0; i < 16; i++) a[i] = _mm512_loadu_ps(j->A + (long)i * K + kb);
      for (long n = c0; n < c1; n++) {
        const float *v = j->U + n * R;
        __m512 t = _mm512_mul_ps(_mm512_set1_ps(v[0]), a[0]);
#pragma GCC unroll 15
        for (int i = 1; i < 16; i++) t = _mm512_fmadd_ps(_mm512_set1_ps(v[i]), a[i], t);
        float *d = j->dX + n * j->lddx + kb;
        _mm512_storeu_ps(d, _mm512_mask3_fmadd_ps(s, t, _mm512_loadu_ps(d), mask16(j->bits, n, j->wpr, kb)));
      }
    }
  }
  k = kv;
#endif
  for (long n = lo; k < K && n < hi; n++) dx_rows_scalar(n, K, j->alpha, j->U, j->A, j->bits, j->wpr, j->dX, j->lddx, k);
}

void ct_thin_add_rows(long n0, long n1, int K, float alpha, const float *V, const float *A, float *Y, int ldy) {
  masked_job j = {.K = K, .wpr = (K + 31) / 32, .lddx = ldy, .alpha = alpha, .U = V, .A = A, .dX = Y};
  dx_range(&j, n0, n1, 0);
}

void ct_thin_dx_masked(int N, int K, float alpha, const float *V, const float *A, const uint32_t *bits, float *dX,
                       int lddx) {
  masked_job j = {.N = N, .K = K, .wpr = (K + 31) / 32, .lddx = lddx, .alpha = alpha, .U = V, .A = A, .bits = bits,
                  .dX = dX};
  ct_parallel_ranges(N, 8, ct_pool_parts((N + 63) / 64), dx_range, &j);
}
