// amx: the engine's bf16 products on AMX tiles, over the panels as packed. Every output
// is within float32 summation error of the sum of the bf16-rounded inputs' products
// (checked in float64), each token's row is the same bits alone or in any batch and
// any split of the panels, and through ct_linear_forward the full panels are AMX's bits,
// the narrow last panel the panel kernel's, at 1 and 2 threads. The panels' AVX-512
// kernel and AMX agree within the same bound. On a CPU without AMX (or built without
// it) there is nothing to run: the test says so.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "bf16.h"
#include "linear.h"
#include "panel.h"
#include "pool.h"
#include "rng.h"
#include "test.h"

static float *randn(long n, uint64_t seed) {
  float *v = malloc(sizeof(float) * (size_t)n);
  ct_rng r;
  ct_rng_seed(&r, seed);
  for (long i = 0; i < n; i++) v[i] = ct_rng_normal(&r);
  return v;
}

// x (S, K) rounded to bf16, with the 16 rows past S that AMX may read (garbage on purpose:
// their outputs must be dropped).
static uint16_t *narrow_rows(const float *x, int S, int K) {
  uint16_t *x16 = malloc(sizeof(uint16_t) * (size_t)(S + 16) * K);
  for (int s = 0; s < S; s++) ct_bf16_narrow(x16 + (long)s * K, x + (long)s * K, K);
  for (long i = (long)S * K; i < (long)(S + 16) * K; i++) x16[i] = ct_f32_to_bf16(1e30f);
  return x16;
}

static const int Ns[] = {32, 64, 96}, Ks[] = {32, 64, 96, 896}, Ss[] = {1, 5, 15, 16, 17, 31, 32, 33, 70};
#define LEN(a) (int)(sizeof(a) / sizeof(a[0]))

// |y − Σ x16·w16| ≤ K·2⁻²³·Σ|x16·w16| (+ the accumulated y0 when acc), rows of y past S
// and columns past N untouched.
static void test_amx_sums_the_rounded_products_in_fp32(void) {
  int bad = 0, untouched = 1;
  for (int a = 0; a < LEN(Ns); a++)
    for (int b = 0; b < LEN(Ks); b++)
      for (int c = 0; c < LEN(Ss); c++) {
        int N = Ns[a], K = Ks[b], S = Ss[c], ldy = N + 5, np = N / CT_PANEL;
        float *W = randn((long)N * K, 5 + N), *x = randn((long)S * K, 6 + K), *y0 = randn((long)(S + 1) * ldy, 7);
        float *y = malloc(sizeof(float) * (size_t)(S + 1) * ldy);
        uint16_t *P = malloc(sizeof(uint16_t) * ct_panel16_size(N, K)), *x16 = narrow_rows(x, S, K);
        ct_panel_pack16(W, N, K, P);
        for (int acc = 0; acc < 2; acc++) {
          memcpy(y, y0, sizeof(float) * (size_t)(S + 1) * ldy);
          ct_amx_gemm16(P, N, K, x16, K, S, y, ldy, acc, 0, np);
          for (int s = 0; s < S; s++) {
            for (int n = 0; n < N; n++) {
              double want = acc ? y0[s * ldy + n] : 0, mag = fabs(want);
              for (int k = 0; k < K; k++) {
                double p = (double)ct_bf16_to_f32(x16[(long)s * K + k]) *
                           ct_bf16_to_f32(ct_f32_to_bf16(W[(long)n * K + k]));
                want += p;
                mag += fabs(p);
              }
              bad += !(fabs(y[s * ldy + n] - want) <= (K + 1) * 0x1p-23 * mag + 1e-30);
            }
            for (int n = N; n < ldy; n++) untouched &= y[s * ldy + n] == y0[s * ldy + n];
          }
          for (int n = 0; n < ldy; n++) untouched &= y[S * ldy + n] == y0[S * ldy + n];
        }
        free(W), free(x), free(y0), free(y), free(P), free(x16);
      }
  CHECK(bad == 0);
  CHECK(untouched);
}

// A token's row: the same bits alone (S = 1), in a batch of 128, and with the panels
// split one per call and the tokens 7 at a time.
static void test_amx_rows_do_not_depend_on_the_batch(void) {
  int N = 96, K = 896, S = 128, np = N / CT_PANEL;
  float *W = randn((long)N * K, 9), *x = randn((long)S * K, 10);
  float *all = malloc(sizeof(float) * S * N), *one = malloc(sizeof(float) * N), *split = malloc(sizeof(float) * S * N);
  uint16_t *P = malloc(sizeof(uint16_t) * ct_panel16_size(N, K)), *x16 = narrow_rows(x, S, K);
  ct_panel_pack16(W, N, K, P);
  ct_amx_gemm16(P, N, K, x16, K, S, all, N, 0, 0, np);
  int same = 1;
  for (int s = 0; s < S; s++) {
    uint16_t *alone = narrow_rows(x + (long)s * K, 1, K);
    ct_amx_gemm16(P, N, K, alone, K, 1, one, N, 0, 0, np);
    same &= memcmp(one, all + (long)s * N, sizeof(float) * N) == 0;
    free(alone);
  }
  CHECK(same);
  for (int p = 0; p < np; p++)
    for (int s = 0; s < S; s += 7) {
      int m = S - s < 7 ? S - s : 7;
      ct_amx_gemm16(P, N, K, x16 + (long)s * K, K, m, split + (long)s * N, N, 0, p, p + 1);
    }
  CHECK(memcmp(split, all, sizeof(float) * S * N) == 0);
  free(W), free(x), free(all), free(one), free(split), free(P), free(x16);
}

// ct_linear_forward on bf16 panels with N = 70 (two full panels and one of 6 rows): the
// full panels are ct_amx_gemm16's bits, the narrow one ct_panel16_gemm's, at 1 and 2
// threads; the panel kernel's full panels agree with AMX's within the rounding bound.
static void test_linear_forward_takes_amx_for_full_panels(void) {
  int N = 70, K = 64, S = 40, np = (N + CT_PANEL - 1) / CT_PANEL;
  float *W = randn((long)N * K, 11), *x = randn((long)S * K, 12);
  float *y1 = malloc(sizeof(float) * S * N), *y2 = malloc(sizeof(float) * S * N);
  float *ya = malloc(sizeof(float) * S * N), *yp = malloc(sizeof(float) * S * N);
  uint16_t *P = malloc(sizeof(uint16_t) * ct_panel16_size(N, K)), *x16 = narrow_rows(x, S, K);
  ct_panel_pack16(W, N, K, P);
  ct_linear L = {.rows = N, .cols = K, .p16 = P};
  CHECK_OK(ct_pool_init(1));
  ct_linear_forward(&L, x, K, S, y1, N, 0);
  CHECK_OK(ct_pool_init(2));
  ct_linear_forward(&L, x, K, S, y2, N, 0);
  CHECK(memcmp(y1, y2, sizeof(float) * S * N) == 0);
  ct_amx_gemm16(P, N, K, x16, K, S, ya, N, 0, 0, np);
  ct_panel16_gemm(P, N, K, x16, K, S, yp, N, 0, 0, np);
  int amx_bits = 1, panel_bits = 1, close = 1;
  for (int s = 0; s < S; s++)
    for (int n = 0; n < N; n++) {
      long i = (long)s * N + n;
      if (n >= 64) {  // the narrow panel: ct_amx_gemm16 leaves it
        panel_bits &= memcmp(&y2[i], &yp[i], 4) == 0;
        continue;
      }
      amx_bits &= memcmp(&y2[i], &ya[i], 4) == 0;
      double mag = 0;
      for (int k = 0; k < K; k++)
        mag += fabs((double)ct_bf16_to_f32(x16[(long)s * K + k]) * ct_bf16_to_f32(ct_f32_to_bf16(W[(long)n * K + k])));
      close &= fabs(ya[i] - yp[i]) <= 2 * K * 0x1p-23 * mag;
    }
  CHECK(amx_bits);
  CHECK(panel_bits);
  CHECK(close);
  free(W), free(x), free(y1), free(y2), free(ya), free(yp), free(P), free(x16);
}

int main(void) {
  ct_pool_init(2);
  if (!ct_amx_ready()) {
    fprintf(stderr, "  AMX: not on this CPU (or not built in, or CT_AMX=0): the panels' kernel serves bf16\n");
    return test_summary();
  }
  RUN(test_amx_sums_the_rounded_products_in_fp32);
  RUN(test_amx_rows_do_not_depend_on_the_batch);
  RUN(test_linear_forward_takes_amx_for_full_panels);
  return test_summary();
}
