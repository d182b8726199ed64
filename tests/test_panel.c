// panel: the engine's packed products. fp32: every output is exactly the chain of fused
// multiply-adds in k order (bit for bit against fmaf); bf16: within float32 summation
// error of the products of the bf16-rounded inputs. Any batch size, tile tail, panel
// tail, thread split and in-place packing gives the same bits.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"
#include "linear.h"
#include "panel.h"
#include "pool.h"
#include "rng.h"
#include "test.h"
#include "thin.h"

static float *randn(int n, uint64_t seed) {
  float *v = malloc(sizeof(float) * (n ? n : 1));
  ct_rng r;
  ct_rng_seed(&r, seed);
  for (int i = 0; i < n; i++) v[i] = ct_rng_normal(&r);
  return v;
}

static const int Ns[] = {1, 5, 16, 17, 31, 32, 33, 70}, Ks[] = {1, 7, 64, 65}, Ss[] = {1, 5, 12, 13, 30};
#define LEN(a) (int)(sizeof(a) / sizeof(a[0]))

// y[s, n] as the kernel promises: fmaf chain over k from 0.
static float chain(const float *x, const float *w, int K) {
  float c = 0;
  for (int k = 0; k < K; k++) c = fmaf(x[k], w[k], c);
  return c;
}

static void test_fp32_is_the_fma_chain_for_every_shape_and_tail(void) {
  int bad = 0, untouched = 1;
  for (int a = 0; a < LEN(Ns); a++)
    for (int b = 0; b < LEN(Ks); b++)
      for (int c = 0; c < LEN(Ss); c++) {
        int N = Ns[a], K = Ks[b], S = Ss[c], ldy = N + 3, np = (N + CT_PANEL - 1) / CT_PANEL;
        float *W = randn(N * K, 1 + N), *x = randn(S * K, 2 + K), *P = malloc(sizeof(float) * N * K);
        float *y = malloc(sizeof(float) * S * ldy), *y0 = randn(S * ldy, 3);
        ct_panel_pack(W, N, K, P);
        for (int acc = 0; acc < 2; acc++) {
          memcpy(y, y0, sizeof(float) * S * ldy);
          ct_panel_gemm(P, N, K, x, K, S, y, ldy, acc, 0, np);
          for (int s = 0; s < S; s++) {
            for (int n = 0; n < N; n++) {
              float want = chain(x + (long)s * K, W + (long)n * K, K);
              if (acc) want = y0[s * ldy + n] + want;
              bad += memcmp(&want, &y[s * ldy + n], 4) != 0;
            }
            for (int n = N; n < ldy; n++) untouched &= y[s * ldy + n] == y0[s * ldy + n];
          }
        }
        free(W); free(x); free(P); free(y); free(y0);
      }
  CHECK(bad == 0);
  CHECK(untouched);
}

// bf16: |y − Σ x16·w16| ≤ K·2⁻²³·Σ|x16·w16| (fp32 sums of exact products), and far from
// the unrounded product when the inputs round (the kernel does use bf16 inputs).
// ct_panel_pack_x puts x[s, k] at tile(s)·K + k·mr + s % 12 (mr the tile's height) for
// every K (whole 16-column steps and tails), row stride, tail tile and range of tiles.
static void test_pack_x_places_every_value(void) {
  const int Kx[] = {1, 15, 16, 17, 33, 576}, Sx[] = {1, 11, 12, 13, 25, 40};
  for (int a = 0; a < LEN(Kx); a++)
    for (int b = 0; b < LEN(Sx); b++) {
      int K = Kx[a], S = Sx[b], ldx = K + 3;
      float *x = randn(S * ldx, 7 + a * 10 + b), *xp = malloc(sizeof(float) * S * K);
      for (int i = 0; i < S * K; i++) xp[i] = NAN;
      ct_panel_pack_x(x, ldx, S, K, 0, S > CT_PANEL_MR ? CT_PANEL_MR : S, xp);  // the first tile, then the rest
      if (S > CT_PANEL_MR) ct_panel_pack_x(x, ldx, S, K, CT_PANEL_MR, S, xp);
      int bad = 0;
      for (int s = 0; s < S; s++) {
        int t0 = s / CT_PANEL_MR * CT_PANEL_MR, mr = S - t0 < CT_PANEL_MR ? S - t0 : CT_PANEL_MR;
        for (int k = 0; k < K; k++) bad += xp[(long)t0 * K + (long)k * mr + s - t0] != x[(long)s * ldx + k];
      }
      CHECK(bad == 0);
      free(x), free(xp);
    }
}

// swiglu computed while packed (ct_linear_forward_swiglu) gives the bits of
// ct_swiglu_forward then ct_linear_forward, for whole and partial tiles and 16-column steps;
// other storages are left to the caller.
static void test_swiglu_packed_equals_the_two_steps(void) {
  const int Kx[] = {7, 16, 70}, Sx[] = {1, 13, 30};
  for (int a = 0; a < LEN(Kx); a++)
    for (int b = 0; b < LEN(Sx); b++) {
      int K = Kx[a], S = Sx[b], N = 40, ldgu = 2 * K + 1;
      float *W = randn(N * K, 3 + a), *gu = randn(S * ldgu, 11 + b), *h = malloc(sizeof(float) * S * K);
      float *P = malloc(sizeof(float) * N * K), *y1 = randn(S * N, 5), *y2 = malloc(sizeof(float) * S * N);
      memcpy(y2, y1, sizeof(float) * S * N);
      for (int i = 0; i < S * ldgu; i++) gu[i] *= 4;  // gates far into both tails of the sigmoid
      ct_panel_pack(W, N, K, P);
      ct_linear w = {.rows = N, .cols = K, .p32 = P};
      float *gu_dense = malloc(sizeof(float) * S * 2 * K);  // ct_swiglu_forward's (S, 2K) rows
      for (int s = 0; s < S; s++) memcpy(gu_dense + (long)s * 2 * K, gu + (long)s * ldgu, sizeof(float) * 2 * K);
      ct_swiglu_forward(h, NULL, gu_dense, S, K);
      ct_linear_forward(&w, h, K, S, y1, N, 1);
      CHECK(ct_linear_forward_swiglu(&w, gu, ldgu, S, y2, N, 1) == 0);
      CHECK(memcmp(y1, y2, sizeof(float) * S * N) == 0);
      ct_linear rows = {.rows = N, .cols = K, .f32 = W};
      CHECK(ct_linear_forward_swiglu(&rows, gu, ldgu, S, y2, N, 1) == 1);
      // bf16 panels: swiglu(gu) narrowed as it is computed, the same bits as the two steps
      uint16_t *P16 = malloc(sizeof(uint16_t) * ct_panel16_size(N, K));
      ct_panel_pack16(W, N, K, P16);
      ct_linear w16 = {.rows = N, .cols = K, .p16 = P16};
      memcpy(y2, y1, sizeof(float) * S * N);
      ct_linear_forward(&w16, h, K, S, y1, N, 1);
      CHECK(ct_linear_forward_swiglu(&w16, gu, ldgu, S, y2, N, 1) == 0);
      CHECK(memcmp(y1, y2, sizeof(float) * S * N) == 0);
      free(W), free(gu), free(h), free(P), free(y1), free(y2), free(gu_dense), free(P16);
    }
}

static void test_bf16_sums_the_rounded_products_in_fp32(void) {
  int bad = 0;
  for (int a = 0; a < LEN(Ns); a++)
    for (int b = 0; b < LEN(Ks); b++)
      for (int c = 0; c < LEN(Ss); c++) {
        int N = Ns[a], K = Ks[b], S = Ss[c], K2 = (K + 1) / 2, np = (N + CT_PANEL - 1) / CT_PANEL;
        float *W = randn(N * K, 5 + N), *x = randn(S * K, 6 + K), *y = malloc(sizeof(float) * S * N);
        uint16_t *P = malloc(sizeof(uint16_t) * ct_panel16_size(N, K)), *x16 = calloc((size_t)S * 2 * K2, 2);
        ct_panel_pack16(W, N, K, P);
        for (int s = 0; s < S; s++) ct_bf16_narrow(x16 + s * 2 * K2, x + s * K, K);
        ct_panel16_gemm(P, N, K, x16, 2 * K2, S, y, N, 0, 0, np);
        for (int s = 0; s < S; s++)
          for (int n = 0; n < N; n++) {
            double want = 0, mag = 0;
            for (int k = 0; k < K; k++) {
              double p = (double)ct_bf16_to_f32(x16[s * 2 * K2 + k]) * ct_bf16_to_f32(ct_f32_to_bf16(W[n * K + k]));
              want += p;
              mag += fabs(p);
            }
            bad += !(fabs(y[s * N + n] - want) <= K * 0x1p-23 * mag + 1e-30);
          }
        free(W); free(x); free(y); free(P); free(x16);
      }
  CHECK(bad == 0);
}

// Adapters folded into bf16 panels (linear.h): W (N, K) packed with 32 extension columns, the
// first adapter's B in rows [0, 40) at columns [K, K + 16), the second's in rows [40, N) at
// [K + 16, K + 32). y = bf16(x)·bf16(W)ᵀ + Σ_i bf16(u_i)·bf16(B_i)ᵀ, u_i = s·x·A_iᵀ (thin.h's
// fp32 chain), each sum in fp32 — checked against float64 (u's rounding to bf16 may land on
// either side of a tie, so the bound is a bf16 ulp of each adapter term); from swiglu(gu)
// the same bits as from its rows; one token alone the same bits as in the batch.
static void test_folded_adapters_add_their_rounded_terms(void) {
  if (!ct_thin_takes(CT_THIN_R)) return;  // (folding needs thin.h's kernels: AVX-512 builds)
  const int N = 70, Ks[] = {40, 64}, S = 13, R = CT_THIN_R, E = 32;
  const float scale = 0.5f;
  for (int c = 0; c < 2; c++) {
    int K = Ks[c], KE = K + E;
    float *W = randn(N * K, 21 + c), *x = randn(S * K, 22), *A0 = randn(R * K, 23), *A1 = randn(R * K, 24);
    float *B = randn(N * R, 25), *y = malloc(sizeof(float) * S * N), *y1 = malloc(sizeof(float) * N);
    float *At0 = malloc(sizeof(float) * K * R), *At1 = malloc(sizeof(float) * K * R);
    uint16_t *P = malloc(sizeof(uint16_t) * ct_panel16_size(N, KE));
    ct_panel_pack16_ext(W, N, K, E, P);
    for (int n = 0; n < N; n++)
      for (int j = 0; j < R; j++) P[ct_panel16_at(N, KE, n, K + (n < 40 ? 0 : R) + j)] = ct_f32_to_bf16(B[n * R + j]);
    ct_thin_transpose(A0, K, At0);
    ct_thin_transpose(A1, K, At1);
    ct_linear w = {.rows = N, .cols = K, .p16 = P, .ext = E};
    ct_linear_lora lo = {2, scale, {At0, At1}};
    CHECK(ct_linear_forward_lora(&w, x, K, S, y, N, 0, &lo, 0) == 0);
    int bad = 0;
    for (int s = 0; s < S; s++)
      for (int n = 0; n < N; n++) {
        const float *A = n < 40 ? A0 : A1;
        double want = 0, mag = 0, lmag = 0;
        for (int k = 0; k < K; k++) {
          double p = (double)ct_bf16_to_f32(ct_f32_to_bf16(x[s * K + k])) * ct_bf16_to_f32(ct_f32_to_bf16(W[n * K + k]));
          want += p, mag += fabs(p);
        }
        for (int j = 0; j < R; j++) {
          double u = 0;
          for (int k = 0; k < K; k++) u += (double)x[s * K + k] * A[j * K + k];
          double p = (double)ct_bf16_to_f32(ct_f32_to_bf16((float)(scale * u))) * ct_bf16_to_f32(ct_f32_to_bf16(B[n * R + j]));
          want += p, mag += fabs(p), lmag += fabs(p);
        }
        bad += !(fabs(y[s * N + n] - want) <= KE * 0x1p-23 * mag + 0x1p-8 * lmag + 1e-30);
      }
    CHECK(bad == 0);
    for (int s = 0; s < S; s += 6) {  // one token alone
      CHECK(ct_linear_forward_lora(&w, x + s * K, K, 1, y1, N, 0, &lo, 0) == 0);
      CHECK(memcmp(y1, y + s * N, sizeof(float) * N) == 0);
    }
    // no adapters: the extension's columns are zeros, the plain product's bits
    float *y0 = malloc(sizeof(float) * S * N), *yp = malloc(sizeof(float) * S * N);
    uint16_t *P0 = malloc(sizeof(uint16_t) * ct_panel16_size(N, K));
    ct_panel_pack16(W, N, K, P0);
    ct_linear w0 = {.rows = N, .cols = K, .p16 = P0};
    ct_linear_forward(&w0, x, K, S, y0, N, 0);
    ct_linear_forward(&w, x, K, S, yp, N, 0);
    CHECK(memcmp(y0, yp, sizeof(float) * S * N) == 0);
    // from swiglu(gu): the bits of its rows
    float *gu = randn(S * 2 * K, 26), *h = malloc(sizeof(float) * S * K);
    ct_swiglu_forward(h, NULL, gu, S, K);
    CHECK(ct_linear_forward_lora(&w, h, K, S, y0, N, 0, &lo, 0) == 0);
    CHECK(ct_linear_forward_lora(&w, gu, 2 * K, S, yp, N, 0, &lo, 1) == 0);
    CHECK(memcmp(y0, yp, sizeof(float) * S * N) == 0);
    free(W), free(x), free(A0), free(A1), free(B), free(y), free(y1), free(At0), free(At1), free(P);
    free(y0), free(yp), free(P0), free(gu), free(h);
  }
}

// A row's result is the same bits whatever the batch it is in and however the panels are
// split between calls (threads); packing in place gives the copy's layout; rows read back.
static void test_batch_split_and_inplace_change_no_bit(void) {
  int N = 75, K = 96, S = 29, np = (N + CT_PANEL - 1) / CT_PANEL, K2 = K / 2;
  float *W = randn(N * K, 9), *x = randn(S * K, 10), *P = malloc(sizeof(float) * N * K);
  float *all = malloc(sizeof(float) * S * N), *one = malloc(sizeof(float) * N), *split = malloc(sizeof(float) * S * N);
  uint16_t *P16 = malloc(sizeof(uint16_t) * ct_panel16_size(N, K)), *x16 = malloc(sizeof(uint16_t) * S * K);
  ct_panel_pack(W, N, K, P);
  ct_panel_pack16(W, N, K, P16);
  for (int s = 0; s < S; s++) ct_bf16_narrow(x16 + s * K, x + s * K, K);
  for (int bf = 0; bf < 2; bf++) {
    int same = 1;
    if (bf) ct_panel16_gemm(P16, N, K, x16, K, S, all, N, 0, 0, np);
    else ct_panel_gemm(P, N, K, x, K, S, all, N, 0, 0, np);
    for (int s = 0; s < S; s++) {  // each row alone
      if (bf) ct_panel16_gemm(P16, N, K, x16 + s * K, K, 1, one, N, 0, 0, np);
      else ct_panel_gemm(P, N, K, x + s * K, K, 1, one, N, 0, 0, np);
      same &= memcmp(one, all + s * N, sizeof(float) * N) == 0;
    }
    for (int p = 0; p < np; p++)  // one panel per call, rows 3 at a time
      for (int s = 0; s < S; s += 3) {
        int m = S - s < 3 ? S - s : 3;
        if (bf) ct_panel16_gemm(P16, N, K, x16 + s * K, K, m, split + s * N, N, 0, p, p + 1);
        else ct_panel_gemm(P, N, K, x + s * K, K, m, split + s * N, N, 0, p, p + 1);
      }
    same &= memcmp(split, all, sizeof(float) * S * N) == 0;
    CHECK(same);
  }
  (void)K2;
  float *inplace = malloc(sizeof(float) * N * K), *scratch = malloc(sizeof(float) * CT_PANEL * K), row[96];
  memcpy(inplace, W, sizeof(float) * N * K);
  ct_panel_pack_inplace(inplace, N, K, scratch);
  CHECK(memcmp(inplace, P, sizeof(float) * N * K) == 0);
  int rows_ok = 1;
  for (int n = 0; n < N; n++) {
    ct_panel_row(P, N, K, n, row);
    rows_ok &= memcmp(row, W + n * K, sizeof(float) * K) == 0;
    ct_panel16_row(P16, N, K, n, row);
    for (int k = 0; k < K; k++) rows_ok &= row[k] == ct_bf16_to_f32(ct_f32_to_bf16(W[n * K + k]));
  }
  CHECK(rows_ok);
  free(W); free(x); free(P); free(all); free(one); free(split); free(P16); free(x16); free(inplace); free(scratch);
}

// Through ct_linear_forward with the pool: panels give the chain's bits at any thread
// count — split by panels (200 rows), or by tokens when there is one panel (an adapter's A).
static void check_thread_count_invariant(int N, int K, int S) {
  float *W = randn(N * K, 11), *x = randn(S * K, 12), *P = malloc(sizeof(float) * N * K);
  float *y1 = malloc(sizeof(float) * S * N), *y2 = malloc(sizeof(float) * S * N);
  ct_panel_pack(W, N, K, P);
  ct_linear L = {.rows = N, .cols = K, .p32 = P};
  ct_pool_init(1);
  ct_linear_forward(&L, x, K, S, y1, N, 0);
  ct_pool_init(2);
  ct_linear_forward(&L, x, K, S, y2, N, 0);
  CHECK(memcmp(y1, y2, sizeof(float) * S * N) == 0);
  int same = 1;
  for (int s = 0; s < S; s++)
    for (int n = 0; n < N; n++) same &= y2[s * N + n] == chain(x + s * K, W + n * K, K);
  CHECK(same);
  free(W); free(x); free(P); free(y1); free(y2);
}

static void test_linear_forward_on_panels_is_thread_count_invariant(void) {
  check_thread_count_invariant(200, 33, 17);
  check_thread_count_invariant(16, 40, 61);
}

// int8 panels: the row-major int8 kernel's results bit for bit (both are exact integer
// sums and the same float epilogue), for every shape, tail and accumulate mode; rows read back.
static void test_int8_panels_equal_the_row_kernel(void) {
  static const int N8[] = {1, 5, 31, 33, 70}, K8[] = {4, 64, 68};
  int bad = 0, rows_ok = 1;
  for (int a = 0; a < LEN(N8); a++)
    for (int b = 0; b < LEN(K8); b++)
      for (int c = 0; c < LEN(Ss); c++) {
        int N = N8[a], K = K8[b], S = Ss[c];
        float *W = randn(N * K, 20 + N), *x = randn(S * K, 21 + K), *scale = malloc(sizeof(float) * N);
        float *y1 = randn(S * N, 22), *y2 = malloc(sizeof(float) * S * N);
        int8_t *q = malloc((size_t)N * K), *pk = malloc((size_t)N * K), *scratch = malloc((size_t)CT_PANEL * K), row[68];
        int32_t *rs = malloc(sizeof(int32_t) * N);
        ct_quantize_rows(W, N, K, q, scale, rs);
        memcpy(pk, q, (size_t)N * K);
        ct_panel8_pack_inplace(pk, N, K, scratch);
        ct_linear rm = {.rows = N, .cols = K, .q = q, .scale = scale, .rowsum = rs};
        ct_linear pm = {.rows = N, .cols = K, .p8 = pk, .scale = scale, .rowsum = rs};
        for (int acc = 0; acc < 2; acc++) {
          memcpy(y2, y1, sizeof(float) * S * N);
          ct_linear_forward(&rm, x, K, S, y1, N, acc);
          ct_linear_forward(&pm, x, K, S, y2, N, acc);
          bad += memcmp(y1, y2, sizeof(float) * S * N) != 0;
        }
        for (int n = 0; n < N; n++) {
          ct_panel8_row(pk, N, K, n, row);
          rows_ok &= memcmp(row, q + (long)n * K, (size_t)K) == 0;
        }
        free(W); free(x); free(scale); free(y1); free(y2); free(q); free(pk); free(scratch); free(rs);
      }
  CHECK(bad == 0);
  CHECK(rows_ok);
}

// int8 activations: each row quantized as documented (scale max|x|/127, 1 for a zero row;
// rint(x/scale) + 128, ties to even), the product the exact integer sum: every output equals
// the scalar formula bit for bit — for widths with and without a vector tail, a zero row,
// a row whose largest magnitude is negative, and values exactly between two steps.
static void test_int8_activations_quantize_as_documented(void) {
  static const int K8[] = {4, 16, 20, 68, 576};
  int bad = 0;
  for (int b = 0; b < LEN(K8); b++) {
    int N = 33, K = K8[b], S = 5;
    float *W = randn(N * K, 40 + K), *x = randn(S * K, 41 + K), *scale = malloc(sizeof(float) * N);
    float *y = malloc(sizeof(float) * S * N);
    int8_t *q = malloc((size_t)N * K);
    int32_t *rs = malloc(sizeof(int32_t) * N);
    ct_quantize_rows(W, N, K, q, scale, rs);
    for (int k = 0; k < K; k++) x[1 * K + k] = 0;                  // row 1: zero (scale 1)
    x[2 * K + K - 1] = -9;                                          // row 2: max |x| negative, last
    for (int k = 0; k < K; k++) x[3 * K + k] = (float)(k % 5) - 1.5f;  // row 3: scale 1 (max 127),
    x[3 * K] = 127;                                                      // halves: ties to even
    ct_linear L = {.rows = N, .cols = K, .q = q, .scale = scale, .rowsum = rs};
    ct_linear_forward(&L, x, K, S, y, N, 0);
    for (int s = 0; s < S; s++) {
      const float *xs = x + (long)s * K;
      float mx = 0;
      for (int k = 0; k < K; k++) mx = fmaxf(mx, fabsf(xs[k]));
      float sx = mx > 0 ? mx / 127.0f : 1.0f, inv = 1.0f / sx;
      for (int n = 0; n < N; n++) {
        int32_t d = 0;
        for (int k = 0; k < K; k++) d += ((int)rintf(xs[k] * inv) + 128) * q[(long)n * K + k];
        float want = sx * scale[n] * (float)(d - 128 * rs[n]);
        bad += memcmp(&want, &y[s * N + n], 4) != 0;
      }
    }
    free(W); free(x); free(scale); free(y); free(q); free(rs);
  }
  CHECK(bad == 0);
}

int main(void) {
  ct_pool_init(2);
  RUN(test_fp32_is_the_fma_chain_for_every_shape_and_tail);
  RUN(test_pack_x_places_every_value);
  RUN(test_swiglu_packed_equals_the_two_steps);
  RUN(test_bf16_sums_the_rounded_products_in_fp32);
  RUN(test_folded_adapters_add_their_rounded_terms);
  RUN(test_batch_split_and_inplace_change_no_bit);
  RUN(test_linear_forward_on_panels_is_thread_count_invariant);
  RUN(test_int8_panels_equal_the_row_kernel);
  RUN(test_int8_activations_quantize_as_documented);
  fprintf(stderr, "  bf16 kernel: %s\n", ct_panel16_native() ? "AVX512_BF16" : "plain C emulation");
  return test_summary();
}
