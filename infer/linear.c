// linear: y = x·Wᵀ for a few rows, one dot product per output in a fixed order (fp32),
// or exact int32 sums of int8 weights and per-row quantized activations (VNNI when
// present, the same integers in plain C otherwise).
#include "linear.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "bf16.h"
#include "panel.h"
#include "pool.h"
#include "quant.h"
#include "swiglu.h"
#include "thin.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

// Rows of W are handled four at a time (each x element loaded once for four dot
// products); blocks are aligned to 4 in every thread split, so a given output row is
// always computed by the same code path.
#define RB 4

typedef struct {
  const ct_linear *w;
  const float *x;
  float *y;
  int ldx, ldy, S, acc, parts;
} lin_job;

static inline void put(float *y, float v, int acc) { *y = acc ? *y + v : v; }

static void rows_f32(const lin_job *j, long n0, long n1) {
  const int K = j->w->cols;
  long n = n0;
  for (; n + RB <= n1; n += RB) {
    const float *w0 = j->w->f32 + n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    for (int s = 0; s < j->S; s++) {
      const float *xs = j->x + (long)s * j->ldx;
      float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
      for (int k = 0; k < K; k++) {
        float xv = xs[k];
        a0 += xv * w0[k];
        a1 += xv * w1[k];
        a2 += xv * w2[k];
        a3 += xv * w3[k];
      }
      float *ys = j->y + (long)s * j->ldy + n;
      put(ys, a0, j->acc);
      put(ys + 1, a1, j->acc);
      put(ys + 2, a2, j->acc);
      put(ys + 3, a3, j->acc);
    }
  }
  for (; n < n1; n++) {  // the last rows % 4 of W: always these same rows
    const float *w0 = j->w->f32 + n * K;
    for (int s = 0; s < j->S; s++) {
      const float *xs = j->x + (long)s * j->ldx;
      float a0 = 0;
#pragma omp simd reduction(+ : a0)
      for (int k = 0; k < K; k++) a0 += xs[k] * w0[k];
      put(j->y + (long)s * j->ldy + n, a0, j->acc);
    }
  }
}

// int8 x int8 -> int32 dot products of one quantized activation row xu (x + 128, as
// unsigned bytes) with weight rows: Σ xu·w − 128·Σ w = Σ x·w, exactly.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
static inline __m512i dp(__m512i acc, const uint8_t *x, const int8_t *w, __mmask64 m) {
  return _mm512_dpbusd_epi32(acc, _mm512_maskz_loadu_epi8(m, x), _mm512_maskz_loadu_epi8(m, w));
}
static void dot4_q8(const uint8_t *xu, const int8_t *w, int K, int32_t *out) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (int k = 0; k < K; k += 64) {
    __mmask64 m = K - k >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (K - k)) - 1);
    a0 = dp(a0, xu + k, w + k, m);
    a1 = dp(a1, xu + k, w + K + k, m);
    a2 = dp(a2, xu + k, w + 2 * (long)K + k, m);
    a3 = dp(a3, xu + k, w + 3 * (long)K + k, m);
  }
  out[0] = _mm512_reduce_add_epi32(a0);
  out[1] = _mm512_reduce_add_epi32(a1);
  out[2] = _mm512_reduce_add_epi32(a2);
  out[3] = _mm512_reduce_add_epi32(a3);
}
static int32_t dot1_q8(const uint8_t *xu, const int8_t *w, int K) {
  __m512i a = _mm512_setzero_si512();
  for (int k = 0; k < K; k += 64) {
    __mmask64 m = K - k >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (K - k)) - 1);
    a = dp(a, xu + k, w + k, m);
  }
  return _mm512_reduce_add_epi32(a);
}
#else
static int32_t dot1_q8(const uint8_t *xu, const int8_t *w, int K) {
  int32_t a = 0;
#pragma omp simd reduction(+ : a)
  for (int k = 0; k < K; k++) a += (int32_t)xu[k] * (int32_t)w[k];
  return a;
}
static void dot4_q8(const uint8_t *xu, const int8_t *w, int K, int32_t *out) {
  for (int r = 0; r < 4; r++) out[r] = dot1_q8(xu, w + (long)r * K, K);
}
#endif

// buf, or a buffer of at least `need` elements of `size` bytes that replaces it (twice the
// need, contents dropped); NULL when that cannot be allocated (buf freed, *cap 0). The
// scratch of one call's activations.
static void *reserve(void *buf, long *cap, long need, size_t size) {
  if (need <= *cap) return buf;
  free(buf);
  *cap = need * 2;
  if ((buf = malloc(size * (size_t)*cap))) return buf;
  *cap = 0;
  return NULL;
}

// The quantized activations of the current call: xu (S, K) bytes and their scales.
static struct {
  uint8_t *xu;
  float *sx;
  long cap_bytes, cap_rows;
} QX;

static void rows_q8(const lin_job *j, long n0, long n1) {
  const int K = j->w->cols;
  const float *sc = j->w->scale;
  const int32_t *rs = j->w->rowsum;
  int32_t d[RB];
  long n = n0;
  for (; n + RB <= n1; n += RB)
    for (int s = 0; s < j->S; s++) {
      dot4_q8(QX.xu + (long)s * K, j->w->q + n * K, K, d);
      float *ys = j->y + (long)s * j->ldy + n;
      for (int r = 0; r < RB; r++)
        put(ys + r, QX.sx[s] * sc[n + r] * (float)(d[r] - 128 * rs[n + r]), j->acc);
    }
  for (; n < n1; n++)
    for (int s = 0; s < j->S; s++) {
      int32_t d1 = dot1_q8(QX.xu + (long)s * K, j->w->q + n * K, K);
      put(j->y + (long)s * j->ldy + n, QX.sx[s] * sc[n] * (float)(d1 - 128 * rs[n]), j->acc);
    }
}

// The rows of x one conversion pass covers: each row on its own, so splitting them
// between threads changes nothing.
typedef struct {
  const float *x;
  int ldx, S, K, parts;
  bool swiglu;  // pack_x: x is gu (S, 2K), the rows packed are swiglu(gu)
} rows_job;

// max_k |x[k]| (from 0; a NaN is skipped, as fmaxf does). libm's fmaxf is a call per
// element (GCC does not inline it): 4% of an int8 decode's time went there.
static float absmax(const float *x, int K) {
  float mx = 0;
  int k = 0;
#if defined(__AVX512F__)
  __m512 m = _mm512_setzero_ps();  // max(a, m) returns m when a is NaN
  for (; k + 16 <= K; k += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + k)), m);
  mx = _mm512_reduce_max_ps(m);
#endif
  for (; k < K; k++) mx = fmaxf(mx, fabsf(x[k]));
  return mx;
}

// xu[k] = rint(x[k]·inv) + 128 as a byte (round to nearest even, as rintf in the default
// rounding mode; |x·inv| <= 127).
static void quantize_row(const float *x, int K, float inv, uint8_t *xu) {
  int k = 0;
#if defined(__AVX512F__)
  const __m512 vi = _mm512_set1_ps(inv);
  const __m512i off = _mm512_set1_epi32(128);
  for (; k + 16 <= K; k += 16) {
    __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), vi)), off);
    _mm_storeu_si128((__m128i *)(xu + k), _mm512_cvtepi32_epi8(q));
  }
#endif
  for (; k < K; k++) xu[k] = (uint8_t)((int)rintf(x[k] * inv) + 128);
}

static void quantize_task(void *ctx, int part, int thread) {
  (void)thread;
  const rows_job *j = ctx;
  long s0, s1;
  ct_chunk_range(j->S, 1, j->parts, part, &s0, &s1);
  for (long s = s0; s < s1; s++) {
    const float *xs = j->x + s * j->ldx;
    float mx = absmax(xs, j->K), sx = mx > 0 ? mx / 127.0f : 1.0f, inv = 1.0f / sx;
    QX.sx[s] = sx;
    quantize_row(xs, j->K, inv, QX.xu + s * j->K);
  }
}

// Quantizes the S rows of x (absmax per row) into QX.
static int quantize_x(const float *x, int ldx, int S, int K) {
  QX.xu = reserve(QX.xu, &QX.cap_bytes, (long)S * K, 1);
  QX.sx = reserve(QX.sx, &QX.cap_rows, S, sizeof(float));
  if (!QX.xu || !QX.sx) return -1;
  rows_job j = {x, ldx, S, K, ct_pool_parts(S), false};
  ct_parallel_for(j.parts, quantize_task, &j);
  return 0;
}

// x rounded to bf16 for bf16 panels of K + ext columns: (S, 2⌈(K + ext)/2⌉), the columns past
// K zero or the adapters' u (ct_linear_lora), and 16 rows of zeros after the S rows (AMX
// reads whole 16-row tiles: see amx.h). h: each thread's NB rows of swiglu(gu).
static struct {
  uint16_t *x16;
  float *h;
  long cap, hcap;
} BX;

typedef struct {
  const float *x;  // (S, K; row stride ldx), or gu (S, 2K) when swiglu
  int ldx, S, K, ext, parts;
  bool swiglu;
  const ct_linear_lora *lo;  // or NULL
} narrow_job;

enum { NB = 8 };  // rows a narrowing step takes (thin.h's block)

static void narrow_task(void *ctx, int part, int thread) {
  const narrow_job *j = ctx;
  const int K = j->K;
  long s0, s1, ld = 2 * ((K + j->ext + 1) / 2);
  ct_chunk_range(j->S, NB, j->parts, part, &s0, &s1);
  float *hb = j->swiglu ? BX.h + (long)thread * NB * K : NULL, u[NB * CT_THIN_R];
  for (long s = s0; s < s1; s += NB) {
    int nb = s1 - s < NB ? (int)(s1 - s) : NB;
    const float *xb = j->x + s * j->ldx;
    int ldb = j->ldx;
    if (hb) {  // h = swiglu(gu), ct_swiglu_forward's formula
      for (int m = 0; m < nb; m++) {
        const float *g = xb + (long)m * ldb, *uu = g + K;
        float *h = hb + (long)m * K;
#pragma omp simd
        for (int k = 0; k < K; k++) h[k] = ct_swiglu_h(g[k], uu[k]);
      }
      xb = hb, ldb = K;
    }
    uint16_t *d = BX.x16 + s * ld;
    for (int m = 0; m < nb; m++) {
      ct_bf16_narrow(d + m * ld, xb + (long)m * ldb, K);
      memset(d + m * ld + K, 0, sizeof(uint16_t) * (ld - K));
    }
    for (int i = 0; j->lo && i < j->lo->n; i++) {
      if (!j->lo->A[i]) continue;
      ct_thin_out_rows(0, nb, K, j->lo->scale, xb, ldb, j->lo->A[i], u);  // u (nb, 16)
      for (int m = 0; m < nb; m++) ct_bf16_narrow(d + m * ld + K + CT_THIN_R * i, u + m * CT_THIN_R, CT_THIN_R);
    }
  }
}

// BX.x16 for x (see narrow_job); -1 when out of memory.
static int narrow_x_ext(const float *x, int ldx, int S, int K, int ext, bool swiglu, const ct_linear_lora *lo) {
  long ld = 2 * ((K + ext + 1) / 2);
  if (!(BX.x16 = reserve(BX.x16, &BX.cap, (S + 16L) * ld, sizeof(uint16_t)))) return -1;
  if (swiglu && !(BX.h = reserve(BX.h, &BX.hcap, (long)ct_pool_threads() * NB * K, sizeof(float)))) return -1;
  narrow_job j = {x, ldx, S, K, ext, ct_pool_parts((S + NB - 1) / NB), swiglu, lo};
  ct_parallel_for(j.parts, narrow_task, &j);
  memset(BX.x16 + S * ld, 0, 16 * ld * sizeof(uint16_t));
  return 0;
}

// x packed for fp32 panels (ct_panel_pack_x): (S, K) in tiles of CT_PANEL_MR tokens.
static struct {
  float *xp;
  long cap;
} PX;

static void pack_x_task(void *ctx, int part, int thread) {
  (void)thread;
  const rows_job *j = ctx;
  long s0, s1;
  ct_chunk_range(j->S, CT_PANEL_MR, j->parts, part, &s0, &s1);
  if (s1 <= s0) return;
  if (j->swiglu) ct_panel_pack_x_swiglu(j->x, j->ldx, j->S, j->K, (int)s0, (int)s1, PX.xp);
  else ct_panel_pack_x(j->x, j->ldx, j->S, j->K, (int)s0, (int)s1, PX.xp);
}

// A copy this small (an adapter's (S, r) inner products at decode) runs on the calling
// thread: at 16 threads waking the pool cost more than the copy (same bits either way).
enum { SERIAL_COPY = 16384 };  // floats

static int pack_x(const float *x, int ldx, int S, int K, bool swiglu) {
  if (!(PX.xp = reserve(PX.xp, &PX.cap, (long)S * K, sizeof(float)))) return -1;
  int parts = !swiglu && (long)S * K <= SERIAL_COPY ? 1 : ct_pool_parts((S + CT_PANEL_MR - 1) / CT_PANEL_MR);
  rows_job j = {x, ldx, S, K, parts, swiglu};
  ct_parallel_for(j.parts, pack_x_task, &j);
  return 0;
}

// Panels [p0, p1) for tokens [s0, s1).
static void panel_range(const lin_job *j, long p0, long p1, long s0, long s1) {
  const ct_linear *w = j->w;
  int S = (int)(s1 - s0);
  float *y = j->y + s0 * j->ldy;
  if (w->p8)
    ct_panel8_gemm(w->p8, w->rows, w->cols, QX.xu + s0 * w->cols, w->cols, QX.sx + s0, w->scale, w->rowsum, S, y,
                   j->ldy, j->acc, (int)p0, (int)p1);
  else if (w->p16) {
    int K = w->cols + w->ext;
    long ld = 2 * ((K + 1) / 2);
    const uint16_t *x16 = BX.x16 + s0 * ld;
    if (ct_amx_ready() && ct_amx_fits(K)) {  // full panels on AMX, the narrow last one below
      ct_amx_gemm16(w->p16, w->rows, K, x16, (int)ld, S, y, j->ldy, j->acc, (int)p0, (int)p1);
      if (p1 * CT_PANEL <= w->rows) return;
      p0 = p1 - 1;
    }
    ct_panel16_gemm(w->p16, w->rows, K, x16, (int)ld, S, y, j->ldy, j->acc, (int)p0, (int)p1);
  } else
    ct_panel_gemm_px(w->p32, w->rows, w->cols, PX.xp + s0 * w->cols, S, y, j->ldy, j->acc, (int)p0, (int)p1);
}

// Parts are ranges of panels, or — when there are fewer panels than threads (an
// adapter's A: one panel of r rows) — ranges of tokens. Either way each output is the same
// chain (panel.h), computed once.
static void panel_task(void *ctx, int part, int thread) {
  (void)thread;
  const lin_job *j = ctx;
  long np = (j->w->rows + CT_PANEL - 1) / CT_PANEL, a, b;
  if (np < ct_pool_threads()) {
    ct_chunk_range(j->S, CT_PANEL_MR, j->parts, part, &a, &b);
    if (b > a) panel_range(j, 0, np, a, b);
    return;
  }
  ct_chunk_range(np, 1, j->parts, part, &a, &b);
  if (b > a) panel_range(j, a, b, 0, j->S);
}

static void lin_task(void *ctx, int part, int thread) {
  (void)thread;
  const lin_job *j = ctx;
  long n0, n1;
  ct_chunk_range(j->w->rows, RB, j->parts, part, &n0, &n1);
  if (n1 <= n0) return;
  if (j->w->q) rows_q8(j, n0, n1);
  else rows_f32(j, n0, n1);
}

// The panels' product of x narrowed into BX.x16 (p16) or packed into PX.xp (p32).
static void panels(const ct_linear *w, int S, float *y, int ldy, int accumulate) {
  lin_job j = {w, NULL, y, 0, ldy, S, accumulate, 0};
  long np = (w->rows + CT_PANEL - 1) / CT_PANEL;
  j.parts = np < ct_pool_threads() ? (S >= 24 ? ct_pool_threads() : 1) : ct_pool_parts(np);
  ct_parallel_for(j.parts, panel_task, &j);
}

void ct_linear_forward(const ct_linear *w, const float *x, int ldx, int S, float *y, int ldy,
                       int accumulate) {
  if (S <= 0) return;
  if ((w->q || w->p8) && quantize_x(x, ldx, S, w->cols)) {  // out of memory: leave y as it was
    return;
  }
  lin_job j = {w, x, y, ldx, ldy, S, accumulate, 0};
  if (!w->q && (w->p8 || w->p16 || w->p32)) {
    if (w->p16 && narrow_x_ext(x, ldx, S, w->cols, w->ext, false, NULL)) return;  // out of memory: y as it was
    if (w->p32 && pack_x(x, ldx, S, w->cols, false)) return;
    panels(w, S, y, ldy, accumulate);
    return;
  }
  // enough parts to balance, each at least a few rows of W
  j.parts = ct_pool_parts(w->rows / RB);
  ct_parallel_for(j.parts, lin_task, &j);
}

int ct_linear_forward_lora(const ct_linear *w, const float *x, int ldx, int S, float *y, int ldy, int accumulate,
                           const ct_linear_lora *lo, int swiglu) {
  if (w->q || w->p8 || !w->p16 || (lo && lo->n * CT_THIN_R > w->ext)) return 1;
  if (S <= 0) return 0;
  if (narrow_x_ext(x, ldx, S, w->cols, w->ext, swiglu, lo)) return 1;  // out of memory
  panels(w, S, y, ldy, accumulate);
  return 0;
}

int ct_linear_forward_swiglu(const ct_linear *w, const float *gu, int ldgu, int S, float *y, int ldy,
                             int accumulate) {
  if (!w->q && !w->p8 && w->p16) return ct_linear_forward_lora(w, gu, ldgu, S, y, ldy, accumulate, NULL, 1);
  if (w->q || w->p8 || !w->p32) return 1;
  if (S <= 0) return 0;
  if (pack_x(gu, ldgu, S, w->cols, true)) return 1;  // out of memory: the caller's two steps
  panels(w, S, y, ldy, accumulate);
  return 0;
}

void ct_linear_row(const ct_linear *w, int r, float *out) {
  if (!w->q && w->p8) {
    int8_t q[w->cols];
    ct_panel8_row(w->p8, w->rows, w->cols, r, q);
    for (int k = 0; k < w->cols; k++) out[k] = (float)q[k] * w->scale[r];
    return;
  }
  if (!w->q && w->p16) {
    ct_panel16_row(w->p16, w->rows, w->cols, r, out);
    return;
  }
  if (!w->q && w->p32) {
    ct_panel_row(w->p32, w->rows, w->cols, r, out);
    return;
  }
  if (w->f32) {
    memcpy(out, w->f32 + (long)r * w->cols, sizeof(float) * w->cols);
    return;
  }
  const int8_t *q = w->q + (long)r * w->cols;
  float s = w->scale[r];
  for (int k = 0; k < w->cols; k++) out[k] = (float)q[k] * s;
}

void ct_rowsums(const int8_t *q, int rows, int cols, int32_t *rowsum) {
  for (int n = 0; n < rows; n++) {
    int32_t t = 0;
    for (int k = 0; k < cols; k++) t += q[(long)n * cols + k];
    rowsum[n] = t;
  }
}

void ct_quantize_rows(const float *W, int rows, int cols, int8_t *q, float *scale, int32_t *rowsum) {
  ct_quantize_rows_int8(W, rows, cols, q, scale);
  ct_rowsums(q, rows, cols, rowsum);
}
