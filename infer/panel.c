// panel: packing W into k-major panels of 32 rows, and the products over them (see panel.h).
#include "panel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "error.h"
#include "swiglu.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define P CT_PANEL
#define MR CT_PANEL_MR  // tokens per register tile: 12 x 2 accumulators of 16 lanes

static inline int panel_w(int N, int p) { return N - p * P < P ? N - p * P : P; }

long ct_panel16_size(int N, int K) { return (long)N * 2 * ((K + 1) / 2); }

// ---------------------------------------------------------------------------
// Packing

void ct_panel_pack(const float *W, int N, int K, float *Pk) {
  for (int p = 0; p * P < N; p++) {
    int w = panel_w(N, p);
    const float *src = W + (long)p * P * K;
    float *dst = Pk + (long)p * P * K;
    for (int j = 0; j < w; j++)
      for (int k = 0; k < K; k++) dst[(long)k * w + j] = src[(long)j * K + k];
  }
}

void ct_panel_pack_inplace(float *W, int N, int K, float *tmp) {
  for (int p = 0; p * P < N; p++) {  // a panel's rows are exactly the span it is packed into
    int w = panel_w(N, p);
    float *span = W + (long)p * P * K;
    memcpy(tmp, span, sizeof(float) * w * K);
    ct_panel_pack(tmp, w, K, span);
  }
}

// dst (panels of pairs of K + ext columns) from rows of K fetched by get(src, n, k), the
// columns past K zero — one loop for both sources.
#define PACK16(GET)                                                                      \
  do {                                                                                   \
    int K2 = (K + ext + 1) / 2;                                                          \
    for (int p = 0; p * P < N; p++) {                                                    \
      int w = panel_w(N, p);                                                             \
      uint16_t *dst = Pk + (long)p * P * K2 * 2;                                         \
      for (int j = 0; j < w; j++) {                                                      \
        long n = (long)p * P + j;                                                        \
        for (int k = 0; k < 2 * K2; k++)                                                 \
          dst[((long)(k / 2) * w + j) * 2 + (k & 1)] = k < K ? GET(W, n * K + k) : 0;     \
      }                                                                                  \
    }                                                                                    \
  } while (0)
#define GET_NARROW(W, i) ct_f32_to_bf16((W)[i])
#define GET_SAME(W, i) ((W)[i])

void ct_panel_pack16_ext(const float *W, int N, int K, int ext, uint16_t *Pk) { PACK16(GET_NARROW); }
void ct_panel_pack16_from16_ext(const uint16_t *W, int N, int K, int ext, uint16_t *Pk) { PACK16(GET_SAME); }
void ct_panel_pack16(const float *W, int N, int K, uint16_t *Pk) { ct_panel_pack16_ext(W, N, K, 0, Pk); }
void ct_panel_pack16_from16(const uint16_t *W, int N, int K, uint16_t *Pk) { ct_panel_pack16_from16_ext(W, N, K, 0, Pk); }

long ct_panel16_at(int N, int K, int n, int k) {
  int p = n / P;
  return (long)p * P * 2 * ((K + 1) / 2) + ((long)(k / 2) * panel_w(N, p) + n - p * P) * 2 + (k & 1);
}

void ct_panel8_pack_inplace(int8_t *W, int N, int K, int8_t *tmp) {
  for (int p = 0; p * P < N; p++) {
    int w = panel_w(N, p);
    int8_t *span = W + (long)p * P * K;
    memcpy(tmp, span, (size_t)w * K);
    for (int j = 0; j < w; j++)
      for (int k = 0; k < K; k++) span[((long)(k / 4) * w + j) * 4 + (k & 3)] = tmp[(long)j * K + k];
  }
}

void ct_panel8_row(const int8_t *Pk, int N, int K, int n, int8_t *out) {
  int p = n / P, w = panel_w(N, p), j = n - p * P;
  const int8_t *src = Pk + (long)p * P * K + 4 * j;
  for (int k = 0; k < K; k++) out[k] = src[(long)(k / 4) * w * 4 + (k & 3)];
}

void ct_panel_row(const float *Pk, int N, int K, int n, float *out) {
  int p = n / P, w = panel_w(N, p), j = n - p * P;
  const float *src = Pk + (long)p * P * K + j;
  for (int k = 0; k < K; k++) out[k] = src[(long)k * w];
}

void ct_panel16_row(const uint16_t *Pk, int N, int K, int n, float *out) {
  int p = n / P, w = panel_w(N, p), j = n - p * P, K2 = (K + 1) / 2;
  const uint16_t *src = Pk + (long)p * P * K2 * 2 + 2 * j;
  for (int k = 0; k < K; k++) out[k] = ct_bf16_to_f32(src[(long)(k / 2) * w * 2 + (k & 1)]);
}

// ---------------------------------------------------------------------------
// Kernels: one register tile = mr (<= MR) tokens x one panel. Each lane of an
// accumulator is one output's chain of k steps.

typedef struct {
  const void *x;  // (mr, ldx) fp32 or bf16 pairs
  int ldx;
  float *y;       // (mr, ldy), the panel's first column
  int ldy, acc, w, K;
  const char *pf; // this tile's share of the next panel, fetched into L2 meanwhile
  int pf_lines;   // its 64-byte lines
} tile;

// Each tile of a panel asks for its share of the next panel's lines (one per k step), so
// the weights stream from memory while the current panel computes, instead of the next
// panel's first tile stalling on all of them.
// (always_inline: GCC deems a separate function that only prefetches free of effects and
// drops its calls — no prefetch was ever issued while this was a plain static inline.)
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void prefetch_step(const tile *t, int k) {
  if (k < t->pf_lines) _mm_prefetch(t->pf + 64L * k, _MM_HINT_T1);
}
#endif

// The share of panel p + 1 (bytes each) that tile i of n fetches.
static inline void prefetch_share(tile *t, const void *next, long bytes, int i, int n) {
  if (!next) return;
  long lines = (bytes + 63) / 64, per = (lines + n - 1) / n, first = per * i;
  t->pf = (const char *)next + 64 * first;
  t->pf_lines = (int)(first >= lines ? 0 : lines - first < per ? lines - first : per);
}

#if defined(__AVX512F__)
// The tile's output rows fetched for writing (and reading, with acc) at its start: a tile
// computes for thousands of cycles, its stores then find y in L1 instead of stalling on
// lines long gone to L3 (measured on one thread: the y += x·Wᵀ products, the attention and
// MLP outputs added to x, 4-8% faster).
static inline __attribute__((always_inline)) void prefetch_y(const tile *t, const int mr) {
#pragma GCC unroll 12
  for (int m = 0; m < MR; m++) {
    if (m >= mr) break;
    const char *y = (const char *)(t->y + (long)m * t->ldy);
    _mm_prefetch(y, _MM_HINT_ET0);
    _mm_prefetch(y + 4 * (t->w - 1), _MM_HINT_ET0);
    if (t->w > 16) _mm_prefetch(y + 64, _MM_HINT_ET0);
  }
}

// The first n of 16 lanes (all for n >= 16, none for n <= 0): a panel of width w loads its
// two vectors with lanes(w) and lanes(w − 16).
static inline __mmask16 lanes(int n) { return n >= 16 ? 0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }

// Inlined and unrolled with the kernel, so the accumulators stay in registers (an
// out-of-line store would make GCC keep them in memory through the k loop).
static inline __attribute__((always_inline)) void tile_store(const tile *t, const int mr, __m512 c[MR][2],
                                                             __mmask16 m0, __mmask16 m1) {
#pragma GCC unroll 12
  for (int m = 0; m < MR; m++) {
    if (m >= mr) break;
    float *y = t->y + (long)m * t->ldy;
    __m512 v0 = c[m][0], v1 = c[m][1];
    if (t->acc) {
      v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, y), v0);
      v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, y + 16), v1);
    }
    _mm512_mask_storeu_ps(y, m0, v0);
    _mm512_mask_storeu_ps(y + 16, m1, v1);
  }
}

// fp32 tiles read x packed (ct_panel_pack_x): the tile's mr values of step k at x + k·mr.
static inline __attribute__((always_inline)) void tile_f32(const tile *t, const float *Pk, const int mr) {
  prefetch_y(t, mr);
  __m512 c[MR][2];
#pragma GCC unroll 12
  for (int m = 0; m < MR; m++) c[m][0] = c[m][1] = _mm512_setzero_ps();
  const __mmask16 m0 = lanes(t->w), m1 = lanes(t->w - 16);
  const float *x = t->x;
  for (int k = 0; k < t->K; k++, x += mr) {
    const float *b = Pk + (long)k * t->w;
    prefetch_step(t, k);
    __m512 b0 = _mm512_maskz_loadu_ps(m0, b), b1 = _mm512_maskz_loadu_ps(m1, b + 16);
#pragma GCC unroll 12
    for (int m = 0; m < MR; m++)
      if (m < mr) {
        __m512 a = _mm512_set1_ps(x[m]);
        c[m][0] = _mm512_fmadd_ps(a, b0, c[m][0]);
        c[m][1] = _mm512_fmadd_ps(a, b1, c[m][1]);
      }
  }
  tile_store(t, mr, c, m0, m1);
}
#else
static inline void tile_f32(const tile *t, const float *Pk, const int mr) {
  const float *x = t->x;
  for (int m = 0; m < mr; m++)
    for (int j = 0; j < t->w; j++) {
      float c = 0;
      for (int k = 0; k < t->K; k++) c = fmaf(x[(long)k * mr + m], Pk[(long)k * t->w + j], c);
      float *y = t->y + (long)m * t->ldy + j;
      *y = t->acc ? *y + c : c;
    }
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
static inline __attribute__((always_inline)) void tile_bf16(const tile *t, const uint16_t *Pk, const int mr) {
  prefetch_y(t, mr);
  __m512 c[MR][2];
#pragma GCC unroll 12
  for (int m = 0; m < MR; m++) c[m][0] = c[m][1] = _mm512_setzero_ps();
  const __mmask16 m0 = lanes(t->w), m1 = lanes(t->w - 16);
  const int K2 = (t->K + 1) / 2;
  const uint16_t *x = t->x;
  for (int k = 0; k < K2; k++) {
    const uint16_t *b = Pk + (long)k * t->w * 2;  // w pairs
    prefetch_step(t, k);
    __m512bh b0 = (__m512bh)_mm512_maskz_loadu_epi32(m0, b), b1 = (__m512bh)_mm512_maskz_loadu_epi32(m1, b + 32);
#pragma GCC unroll 12
    for (int m = 0; m < MR; m++)
      if (m < mr) {
        int32_t pair;
        memcpy(&pair, x + (long)m * t->ldx + 2 * k, 4);
        __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
        c[m][0] = _mm512_dpbf16_ps(c[m][0], a, b0);
        c[m][1] = _mm512_dpbf16_ps(c[m][1], a, b1);
      }
  }
  tile_store(t, mr, c, m0, m1);
}
bool ct_panel16_native(void) { return true; }
#else
// The instruction's arithmetic: the odd element's product, then the even one's, each
// exact in fp32 (8-bit significands) and added with one rounding. Not vectorized: GCC 12's
// dynamic cost model vectorizes this two-step in-order sum wrongly (measured: errors of
// whole units from K = 64 up, at -O2 -mavx2 -fvect-cost-model=dynamic).
__attribute__((optimize("no-tree-vectorize"))) static void tile_bf16(const tile *t, const uint16_t *Pk,
                                                                     const int mr) {
  const uint16_t *x = t->x;
  const int K2 = (t->K + 1) / 2;
  for (int m = 0; m < mr; m++)
    for (int j = 0; j < t->w; j++) {
      float c = 0;
      for (int k = 0; k < K2; k++) {
        const uint16_t *a = x + (long)m * t->ldx + 2 * k, *b = Pk + ((long)k * t->w + j) * 2;
        c += ct_bf16_to_f32(a[1]) * ct_bf16_to_f32(b[1]);
        c += ct_bf16_to_f32(a[0]) * ct_bf16_to_f32(b[0]);
      }
      float *y = t->y + (long)m * t->ldy + j;
      *y = t->acc ? *y + c : c;
    }
}
bool ct_panel16_native(void) { return false; }
#endif

// int8: the quantized activations' scales and the rows' scales and sums beside the tile.
typedef struct {
  tile t;
  const float *sx, *scale;  // (mr) activation scales; (w) the panel's row scales
  const int32_t *rowsum;    // (w)
} tile8;

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
static inline __attribute__((always_inline)) void tile_q8(const tile8 *q, const int8_t *Pk, const int mr) {
  const tile *t = &q->t;
  prefetch_y(t, mr);
  __m512i c[MR][2];
#pragma GCC unroll 12
  for (int m = 0; m < MR; m++) c[m][0] = c[m][1] = _mm512_setzero_si512();
  const __mmask16 m0 = lanes(t->w), m1 = lanes(t->w - 16);
  const uint8_t *x = t->x;
  for (int k = 0; k < t->K / 4; k++) {
    const int8_t *b = Pk + (long)k * t->w * 4;  // w quads
    prefetch_step(t, k);
    __m512i b0 = _mm512_maskz_loadu_epi32(m0, b), b1 = _mm512_maskz_loadu_epi32(m1, b + 64);
#pragma GCC unroll 12
    for (int m = 0; m < MR; m++)
      if (m < mr) {
        int32_t quad;
        memcpy(&quad, x + (long)m * t->ldx + 4 * k, 4);
        __m512i a = _mm512_set1_epi32(quad);
        c[m][0] = _mm512_dpbusd_epi32(c[m][0], a, b0);
        c[m][1] = _mm512_dpbusd_epi32(c[m][1], a, b1);
      }
  }
  // y = (sx · scale) · (float)(d − 128·rowsum), in that order (as the row-major kernel)
  __m512 s0 = _mm512_maskz_loadu_ps(m0, q->scale), s1 = _mm512_maskz_loadu_ps(m1, q->scale + 16);
  __m512i r0 = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m0, q->rowsum), 7);
  __m512i r1 = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m1, q->rowsum + 16), 7);
  __m512 v[MR][2];
#pragma GCC unroll 12
  for (int m = 0; m < MR; m++) {
    if (m >= mr) break;
    __m512 sx = _mm512_set1_ps(q->sx[m]);
    v[m][0] = _mm512_mul_ps(_mm512_mul_ps(sx, s0), _mm512_cvtepi32_ps(_mm512_sub_epi32(c[m][0], r0)));
    v[m][1] = _mm512_mul_ps(_mm512_mul_ps(sx, s1), _mm512_cvtepi32_ps(_mm512_sub_epi32(c[m][1], r1)));
  }
  tile_store(t, mr, v, m0, m1);
}
#else
static inline void tile_q8(const tile8 *q, const int8_t *Pk, const int mr) {
  const tile *t = &q->t;
  const uint8_t *x = t->x;
  for (int m = 0; m < mr; m++)
    for (int j = 0; j < t->w; j++) {
      int32_t d = 0;
      for (int k = 0; k < t->K; k++) d += (int32_t)x[(long)m * t->ldx + k] * Pk[((long)(k / 4) * t->w + j) * 4 + (k & 3)];
      float v = q->sx[m] * q->scale[j] * (float)(d - 128 * q->rowsum[j]);
      float *y = t->y + (long)m * t->ldy + j;
      *y = t->acc ? *y + v : v;
    }
}
#endif

// Dispatch on the tile height so each height is its own unrolled loop.
#define TILE_SWITCH(FN, t, Pk, mr) \
  switch (mr) {                    \
    case 1: FN(t, Pk, 1); break;   \
    case 2: FN(t, Pk, 2); break;   \
    case 3: FN(t, Pk, 3); break;   \
    case 4: FN(t, Pk, 4); break;   \
    case 5: FN(t, Pk, 5); break;   \
    case 6: FN(t, Pk, 6); break;   \
    case 7: FN(t, Pk, 7); break;   \
    case 8: FN(t, Pk, 8); break;   \
    case 9: FN(t, Pk, 9); break;   \
    case 10: FN(t, Pk, 10); break; \
    case 11: FN(t, Pk, 11); break; \
    default: FN(t, Pk, 12); break; \
  }

// Tokens in blocks of TB (its activations stay in cache while the panels stream past).
#define TB (20 * MR)

// Register tiles in the token block starting at s0.
static inline int tiles(int S, int s0) { return ((S - s0 < TB ? S - s0 : TB) + MR - 1) / MR; }

#if defined(__AVX512F__)
// d[j·12 + m] = a[m][j] for 12 rows m and 16 columns j: the 16 x 16 transpose of the
// rows (the last 4 of a zero), 12 lanes of each column stored.
static inline __attribute__((always_inline)) void store12x16(__m512 a[16], float *d) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {  // pairs of rows interleaved
    t[i] = _mm512_unpacklo_ps(a[i], a[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(a[i], a[i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {  // then pairs of pairs: 4 rows' values per 128-bit lane
    __m512d t0 = _mm512_castps_pd(t[i]), t1 = _mm512_castps_pd(t[i + 1]);
    __m512d t2 = _mm512_castps_pd(t[i + 2]), t3 = _mm512_castps_pd(t[i + 3]);
    a[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    a[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    a[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    a[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {  // 128-bit lanes of rows 0-3 with 4-7, 8-11 with 12-15
    t[i] = _mm512_shuffle_f32x4(a[i], a[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(a[i], a[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(a[i + 8], a[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(a[i + 8], a[i + 12], 0xdd);
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {  // column i, then column i + 8
    a[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    a[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
#pragma GCC unroll 16
  for (int j = 0; j < 16; j++) _mm512_mask_storeu_ps(d + j * MR, 0x0fff, a[j]);
}

// d[j·12 + m] = r[m·ldx + j] for 12 rows m and 16 columns j.
static inline void pack12x16(const float *r, long ldx, float *d) {
  __m512 a[16];
#pragma GCC unroll 16
  for (int m = 0; m < 16; m++) a[m] = m < MR ? _mm512_loadu_ps(r + m * ldx) : _mm512_setzero_ps();
  store12x16(a, d);
}

// The same for h = swiglu(g, u) of 12 rows g + m·ld, u = g + K + m·ld.
static inline void pack12x16_swiglu(const float *g, long ld, int K, float *d) {
  __m512 a[16];
  float h[16];
#pragma GCC unroll 16
  for (int m = 0; m < 16; m++) {
    if (m < MR) {
      const float *gm = g + m * ld, *um = gm + K;
#pragma omp simd
      for (int i = 0; i < 16; i++) h[i] = ct_swiglu_h(gm[i], um[i]);
      a[m] = _mm512_loadu_ps(h);
    } else {
      a[m] = _mm512_setzero_ps();
    }
  }
  store12x16(a, d);
}
#endif

void ct_panel_pack_x(const float *x, int ldx, int S, int K, int s0, int s1, float *xp) {
  for (int s = s0; s < s1; s += MR) {  // writes in order, 12 rows read side by side
    int mr = S - s < MR ? S - s : MR;
    float *d = xp + (long)s * K;
    const float *r = x + (long)s * ldx;
    if (mr == MR) {
      int k = 0;
#if defined(__AVX512F__)
      for (; k + 16 <= K; k += 16, d += 16 * MR) pack12x16(r + k, ldx, d);
#endif
      for (; k < K; k++, d += MR)
#pragma GCC unroll 12
        for (int m = 0; m < MR; m++) d[m] = r[(long)m * ldx + k];
    } else {
      for (int k = 0; k < K; k++, d += mr)
        for (int m = 0; m < mr; m++) d[m] = r[(long)m * ldx + k];
    }
  }
}

void ct_panel_pack_x_swiglu(const float *gu, int ldgu, int S, int K, int s0, int s1, float *xp) {
  for (int s = s0; s < s1; s += MR) {
    int mr = S - s < MR ? S - s : MR, k = 0;
    float *d = xp + (long)s * K;
    const float *g = gu + (long)s * ldgu;
#if defined(__AVX512F__)
    if (mr == MR)
      for (; k + 16 <= K; k += 16, d += 16 * MR) pack12x16_swiglu(g + k, ldgu, K, d);
#endif
    for (; k < K; k++, d += mr)  // ct_swiglu_forward's expression, value by value
      for (int m = 0; m < mr; m++) {
        const float *gm = g + (long)m * ldgu;
        d[m] = ct_swiglu_h(gm[k], gm[K + k]);
      }
  }
}

void ct_panel_gemm_px(const float *Pk, int N, int K, const float *xp, int S, float *y, int ldy, int acc, int p0,
                      int p1) {
  for (int s0 = 0; s0 < S; s0 += TB)
    for (int p = p0; p < p1; p++)
      for (int s = s0; s < S && s < s0 + TB; s += MR) {
        int mr = S - s < MR ? S - s : MR;
        tile t = {xp + (long)s * K, 0, y + (long)s * ldy + p * P, ldy, acc, panel_w(N, p), K, NULL, 0};
        prefetch_share(&t, p + 1 < p1 ? Pk + (long)(p + 1) * P * K : NULL, 4L * panel_w(N, p + 1) * K,
                       (s - s0) / MR, tiles(S, s0));
        TILE_SWITCH(tile_f32, &t, Pk + (long)p * P * K, mr);
      }
}

int ct_panel_gemm(const float *Pk, int N, int K, const float *x, int ldx, int S, float *y, int ldy,
                  int acc, int p0, int p1) {
  float *xp = malloc(sizeof(float) * (size_t)(TB < S ? TB : S) * (K ? K : 1));
  if (!xp) return ct_set_error(CT_ENOMEM, "panel: out of memory for %d x %d packed inputs", TB < S ? TB : S, K);
  for (int s0 = 0; s0 < S; s0 += TB) {
    int n = S - s0 < TB ? S - s0 : TB;
    ct_panel_pack_x(x + (long)s0 * ldx, ldx, n, K, 0, n, xp);
    ct_panel_gemm_px(Pk, N, K, xp, n, y + (long)s0 * ldy, ldy, acc, p0, p1);
  }
  free(xp);
  return 0;
}

void ct_panel8_gemm(const int8_t *Pk, int N, int K, const uint8_t *xu, int ldx, const float *sx,
                    const float *scale, const int32_t *rowsum, int S, float *y, int ldy, int acc, int p0, int p1) {
  for (int s0 = 0; s0 < S; s0 += TB)
    for (int p = p0; p < p1; p++)
      for (int s = s0; s < S && s < s0 + TB; s += MR) {
        int mr = S - s < MR ? S - s : MR;
        tile8 q = {{xu + (long)s * ldx, ldx, y + (long)s * ldy + p * P, ldy, acc, panel_w(N, p), K, NULL, 0},
                   sx + s, scale + p * P, rowsum + p * P};
        prefetch_share(&q.t, p + 1 < p1 ? Pk + (long)(p + 1) * P * K : NULL, (long)panel_w(N, p + 1) * K,
                       (s - s0) / MR, tiles(S, s0));
        TILE_SWITCH(tile_q8, &q, Pk + (long)p * P * K, mr);
      }
}

void ct_panel16_gemm(const uint16_t *Pk, int N, int K, const uint16_t *x16, int ldx16, int S, float *y,
                     int ldy, int acc, int p0, int p1) {
  long K2 = (K + 1) / 2;
  for (int s0 = 0; s0 < S; s0 += TB)
    for (int p = p0; p < p1; p++)
      for (int s = s0; s < S && s < s0 + TB; s += MR) {
        int mr = S - s < MR ? S - s : MR;
        tile t = {x16 + (long)s * ldx16, ldx16, y + (long)s * ldy + p * P, ldy, acc, panel_w(N, p), K, NULL, 0};
        prefetch_share(&t, p + 1 < p1 ? Pk + (long)(p + 1) * P * K2 * 2 : NULL, 4L * panel_w(N, p + 1) * K2,
                       (s - s0) / MR, tiles(S, s0));
        TILE_SWITCH(tile_bf16, &t, Pk + (long)p * P * K2 * 2, mr);
      }
}
