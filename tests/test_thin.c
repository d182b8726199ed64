// thin: the rank-16 products against sums in double, at shapes with tails (N not a
// multiple of 8, K not a multiple of 16, a row stride wider than K); the same bits at 1, 2
// and 3 threads; and a row or input computed by the blocked path equal, bit for bit, to
// the same one computed alone by the scalar path.
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fill.h"
#include "kernels.h"
#include "pool.h"
#include "rng.h"
#include "test.h"
#include "thin.h"

enum { N = 45, K = 37, LDX = 41 };

static float X[N * LDX], W[K * 16], U[N * 16];

// Output (n, j) of ct_thin_out at scale 1, summed in double: sum_k X[n,k] W[k,j].
static double out_sum(int n, int j) {
  double s = 0;
  for (int k = 0; k < K; k++) s += (double)X[n * LDX + k] * W[k * 16 + j];
  return s;
}

// Gradient (k, j) of ct_thin_grad at scale 1, summed in double: sum_n X[n,k] U[n,j].
static double grad_sum(int k, int j) {
  double s = 0;
  for (int n = 0; n < N; n++) s += (double)X[n * LDX + k] * U[n * 16 + j];
  return s;
}

static void test_thin_out_matches_double_sums(void) {
  static float Y[N * 16];
  ct_thin_out(N, K, 0.5f, X, LDX, W, Y);
  double worst = 0;
  for (int n = 0; n < N; n++)
    for (int j = 0; j < 16; j++) worst = fmax(worst, fabs(Y[n * 16 + j] - 0.5 * out_sum(n, j)));
  CHECK(worst < 2e-5);
}

static void test_thin_grad_adds_to_g_and_matches_double_sums(void) {
  static float G[K * 16], G0[K * 16];
  seed(9), fill_normal(G0, K * 16, &rng);
  memcpy(G, G0, sizeof G);
  ct_thin_grad(N, K, 0.25f, X, LDX, U, G);
  double worst = 0;
  for (int k = 0; k < K; k++)
    for (int j = 0; j < 16; j++)
      worst = fmax(worst, fabs(G[k * 16 + j] - (G0[k * 16 + j] + 0.25 * grad_sum(k, j))));
  CHECK(worst < 2e-5);
}

// Outputs start as NaN, so a row or input no thread wrote would show (and would differ
// from the double sums checked first).
static void test_same_bits_at_any_thread_count(void) {
  static float Y[3][N * 16], G[3][K * 16];
  for (int t = 1; t <= 3; t++) {
    CHECK_OK(ct_pool_init(t));
    for (int i = 0; i < N * 16; i++) Y[t - 1][i] = NAN;
    ct_thin_out(N, K, 1.5f, X, LDX, W, Y[t - 1]);
    memset(G[t - 1], 0, sizeof G[t - 1]);
    ct_thin_grad(N, K, 1.5f, X, LDX, U, G[t - 1]);
  }
  double worst = 0;
  for (int n = 0; n < N; n++)
    for (int j = 0; j < 16; j++) {
      worst = fmax(worst, fabs(Y[0][n * 16 + j] - 1.5 * out_sum(n, j)));  // (NaN makes fmax keep worst: checked below)
      CHECK(!isnan(Y[0][n * 16 + j]));
    }
  CHECK(worst < 5e-5);
  CHECK(!memcmp(Y[0], Y[1], sizeof Y[0]) && !memcmp(Y[0], Y[2], sizeof Y[0]));
  CHECK(!memcmp(G[0], G[1], sizeof G[0]) && !memcmp(G[0], G[2], sizeof G[0]));
  ct_pool_free();
}

// Row 3 of a block of 8 against row 3 alone (the scalar path); input 5 of a block of 16
// against input 5 alone. (Without AVX-512 both sides are the scalar path.)
static void test_blocked_and_scalar_paths_agree_bit_for_bit(void) {
  static float Ya[8 * 16], Yb[16], Ga[16 * 16], Gb[16];
  ct_thin_out(8, K, 1, X, LDX, W, Ya);
  ct_thin_out(1, K, 1, X + 3 * LDX, LDX, W, Yb);
  CHECK(!memcmp(Ya + 3 * 16, Yb, sizeof Yb));
  memset(Ga, 0, sizeof Ga);
  memset(Gb, 0, sizeof Gb);
  ct_thin_grad(N, 16, 1, X, LDX, U, Ga);
  ct_thin_grad(N, 1, 1, X + 5, LDX, U, Gb);
  CHECK(!memcmp(Ga + 5 * 16, Gb, sizeof Gb));
}

// The masked kernels (dropout bits: row n's words at n·ceil(K2 / 32)): K2 = 70 spans three
// words with a tail past the last 16-input block; 45 rows with a stride of 73.
enum { K2 = 70, LD2 = 73, WPR = (K2 + 31) / 32 };
static float X2[N * LD2], A2[16 * K2], V2[N * 16];
static uint32_t BITS[N * WPR];

static int bit(int n, int k) { return BITS[n * WPR + k / 32] >> (k % 32) & 1; }

static void test_masked_grad_and_dx_match_double_sums_with_any_mask_and_thread_count(void) {
  static float G[3][16 * K2], D[3][N * LD2], G0[16 * K2], D0[N * LD2], Gall[16 * K2], Gnull[16 * K2];
  seed(4), fill_normal(X2, N * LD2, &rng);
  seed(5), fill_normal(A2, 16 * K2, &rng);
  seed(6), fill_normal(V2, N * 16, &rng);
  seed(7), fill_normal(G0, 16 * K2, &rng);
  seed(8), fill_normal(D0, N * LD2, &rng);
  for (int i = 0; i < N * WPR; i++) BITS[i] = (uint32_t)ct_rng_next(&rng) | (uint32_t)ct_rng_next(&rng);  // ~3/4 kept
  for (int t = 1; t <= 3; t++) {
    CHECK_OK(ct_pool_init(t));
    memcpy(G[t - 1], G0, sizeof G0);
    memcpy(D[t - 1], D0, sizeof D0);
    ct_thin_grad_masked(N, K2, 0.75f, X2, LD2, BITS, V2, G[t - 1], NULL);
    ct_thin_dx_masked(N, K2, 0.75f, V2, A2, BITS, D[t - 1], LD2);
    ct_pool_free();
  }
  double wg = 0, wd = 0;
  int dropped = 0;
  for (int j = 0; j < 16; j++)
    for (int k = 0; k < K2; k++) {
      double s = 0;
      for (int n = 0; n < N; n++) s += bit(n, k) ? (double)X2[n * LD2 + k] * V2[n * 16 + j] : 0;
      wg = fmax(wg, fabs(G[0][j * K2 + k] - (G0[j * K2 + k] + 0.75 * s)));
    }
  for (int n = 0; n < N; n++)
    for (int k = 0; k < LD2; k++) {
      double s = 0;
      for (int j = 0; j < 16 && k < K2; j++) s += (double)V2[n * 16 + j] * A2[j * K2 + k];
      bool on = k < K2 && bit(n, k);
      dropped += k < K2 && !on;
      wd = fmax(wd, fabs(D[0][n * LD2 + k] - (D0[n * LD2 + k] + (on ? 0.75 * s : 0))));  // past K2: untouched
    }
  CHECK(wg < 5e-5 && wd < 5e-5 && dropped > N * K2 / 8);
  CHECK(!memcmp(G[0], G[1], sizeof G[0]) && !memcmp(G[0], G[2], sizeof G[0]));
  CHECK(!memcmp(D[0], D[1], sizeof D[0]) && !memcmp(D[0], D[2], sizeof D[0]));
  // no mask (NULL) = every bit set
  for (int i = 0; i < N * WPR; i++) BITS[i] = ~0u;
  memset(Gall, 0, sizeof Gall);
  memset(Gnull, 0, sizeof Gnull);
  ct_thin_grad_masked(N, K2, 1, X2, LD2, BITS, V2, Gall, NULL);
  ct_thin_grad_masked(N, K2, 1, X2, LD2, NULL, V2, Gnull, NULL);
  CHECK(!memcmp(Gall, Gnull, sizeof Gall));
  memcpy(D[0], D0, sizeof D0);
  memcpy(D[1], D0, sizeof D0);
  ct_thin_dx_masked(N, K2, 1, V2, A2, BITS, D[0], LD2);
  ct_thin_dx_masked(N, K2, 1, V2, A2, NULL, D[1], LD2);
  CHECK(!memcmp(D[0], D[1], sizeof D[0]));
}

// ct_thin_out_grad over rows spanning three chunks (the last one short, with a tail past
// the last block of 8): Y equals ct_thin_out's bits at scale 1, G the double sums added
// in, and the same bits at 1, 2 and 3 threads.
static void test_out_grad_in_one_pass_matches_out_and_double_sums(void) {
  enum { N2 = 2 * CT_THIN_CHUNK + 29, K3 = 37, LD3 = 41 };
  float *X3 = malloc(sizeof(float) * N2 * LD3), *U3 = malloc(sizeof(float) * N2 * 16);
  float *P = malloc(sizeof(float) * ct_thin_out_grad_floats(N2, K3));
  static float Y[3][N2 * 16], Yref[N2 * 16], G[3][K3 * 16], G0[K3 * 16];
  seed(31), fill_normal(X3, N2 * LD3, &rng), fill_normal(U3, N2 * 16, &rng), fill_normal(G0, K3 * 16, &rng);
  for (int t = 1; t <= 3; t++) {
    CHECK_OK(ct_pool_init(t));
    for (int i = 0; i < N2 * 16; i++) Y[t - 1][i] = NAN;
    memcpy(G[t - 1], G0, sizeof G0);
    ct_thin_out_grad(N2, K3, 0.75f, X3, LD3, W, U3, Y[t - 1], G[t - 1], P);
    if (t == 1) ct_thin_out(N2, K3, 1, X3, LD3, W, Yref);
    ct_pool_free();
  }
  CHECK(!memcmp(Y[0], Yref, sizeof Yref));
  CHECK(!memcmp(Y[0], Y[1], sizeof Yref) && !memcmp(Y[0], Y[2], sizeof Yref));
  CHECK(!memcmp(G[0], G[1], sizeof G0) && !memcmp(G[0], G[2], sizeof G0));
  double worst = 0;
  for (int k = 0; k < K3; k++)
    for (int j = 0; j < 16; j++) {
      double s = 0;
      for (int n = 0; n < N2; n++) s += (double)X3[n * LD3 + k] * U3[n * 16 + j];
      worst = fmax(worst, fabs(G[0][k * 16 + j] - (G0[k * 16 + j] + 0.75 * s)));
      CHECK(!isnan(G[0][k * 16 + j]));
    }
  CHECK(worst < 1e-4);
  free(X3), free(U3), free(P);
}

// ct_thin_grad_masked with partials: rows spanning three chunks (the last short, with a
// tail past the last group of 8), inputs past the last block of 16, a mask: G the double
// sums added in (and the column walk's within rounding), the same bits at 1, 2 and 3
// threads, and a column's chain the same bits in a vector block as in the scalar tail.
static void test_masked_grad_in_row_chunks_matches_double_sums(void) {
  enum { N2 = 2 * CT_THIN_CHUNK + 91, K4 = 70, LD4 = 73, WP = (K4 + 31) / 32 };
  float *X4 = malloc(sizeof(float) * N2 * LD4), *V4 = malloc(sizeof(float) * N2 * 16);
  float *P = malloc(sizeof(float) * ct_thin_out_grad_floats(N2, K4));
  uint32_t *bits = malloc(sizeof(uint32_t) * N2 * WP);
  static float G[3][16 * K4], G0[16 * K4], Gwalk[16 * K4], Ga[16 * 32], Gb[16];
  seed(41), fill_normal(X4, N2 * LD4, &rng), fill_normal(V4, N2 * 16, &rng), fill_normal(G0, 16 * K4, &rng);
  for (int i = 0; i < N2 * WP; i++) bits[i] = (uint32_t)ct_rng_next(&rng) | (uint32_t)ct_rng_next(&rng);
  for (int t = 1; t <= 3; t++) {
    CHECK_OK(ct_pool_init(t));
    memcpy(G[t - 1], G0, sizeof G0);
    ct_thin_grad_masked(N2, K4, 0.75f, X4, LD4, bits, V4, G[t - 1], P);
    if (t == 1) memcpy(Gwalk, G0, sizeof G0), ct_thin_grad_masked(N2, K4, 0.75f, X4, LD4, bits, V4, Gwalk, NULL);
    ct_pool_free();
  }
  CHECK(!memcmp(G[0], G[1], sizeof G0) && !memcmp(G[0], G[2], sizeof G0));
  double worst = 0, apart = 0;
  for (int j = 0; j < 16; j++)
    for (int k = 0; k < K4; k++) {
      double s = 0;
      for (int n = 0; n < N2; n++)
        s += (bits[n * WP + k / 32] >> (k % 32) & 1) ? (double)X4[n * LD4 + k] * V4[n * 16 + j] : 0;
      worst = fmax(worst, fabs(G[0][j * K4 + k] - (G0[j * K4 + k] + 0.75 * s)));
      apart = fmax(apart, fabs(G[0][j * K4 + k] - Gwalk[j * K4 + k]));
    }
  CHECK(worst < 2e-4 && apart < 2e-4);
  // column 16 of X4: in a vector block (K 32) and alone in the scalar tail (K 1, from X4 + 16)
  memset(Ga, 0, sizeof Ga), memset(Gb, 0, sizeof Gb);
  ct_thin_grad_masked(N2, 32, 1, X4, LD4, NULL, V4, Ga, P);
  ct_thin_grad_masked(N2, 1, 1, X4 + 16, LD4, NULL, V4, Gb, P);
  for (int j = 0; j < 16; j++) CHECK(!memcmp(&Ga[j * 32 + 16], &Gb[j], sizeof(float)));
  free(X4), free(V4), free(P), free(bits);
}

// ct_thin_grad_masked_swiglu equals ct_swiglu_forward then ct_thin_grad_masked, bit for bit:
// rows spanning three chunks, inputs with and without a tail past the last block of 16, a
// mask and none, at 1, 2 and 3 threads.
static void test_masked_grad_from_swiglu_input_equals_h_then_grad(void) {
  enum { N2 = 2 * CT_THIN_CHUNK + 13, FMAX = 48, WP = (FMAX + 31) / 32 };
  float *gu = malloc(sizeof(float) * N2 * 2 * FMAX), *h = malloc(sizeof(float) * N2 * FMAX);
  float *V5 = malloc(sizeof(float) * N2 * 16), *P = malloc(sizeof(float) * ct_thin_out_grad_floats(N2, FMAX));
  uint32_t *bits = malloc(sizeof(uint32_t) * N2 * WP);
  static float G0[16 * FMAX], Gh[16 * FMAX], Gg[16 * FMAX];
  seed(61), fill_normal(gu, N2 * 2 * FMAX, &rng), fill_normal(V5, N2 * 16, &rng), fill_normal(G0, 16 * FMAX, &rng);
  for (int i = 0; i < N2 * WP; i++) bits[i] = (uint32_t)ct_rng_next(&rng) | (uint32_t)ct_rng_next(&rng);
  for (int F = 40; F <= 48; F += 8)
    for (int masked = 0; masked <= 1; masked++)
      for (int t = 1; t <= 3; t++) {
        CHECK_OK(ct_pool_init(t));
        const uint32_t *b = masked ? bits : NULL;  // (rows of ceil(F / 32) = 2 words either way)
        memcpy(Gh, G0, sizeof G0), memcpy(Gg, G0, sizeof G0);
        ct_swiglu_forward(h, NULL, gu, N2, F);
        ct_thin_grad_masked(N2, F, 0.75f, h, F, b, V5, Gh, P);
        ct_thin_grad_masked_swiglu(N2, F, 0.75f, gu, b, V5, Gg, P);
        CHECK(!memcmp(Gh, Gg, sizeof(float) * 16 * F));
        ct_pool_free();
      }
  free(gu), free(h), free(V5), free(P), free(bits);
}

int main(void) {
  seed(1), fill_normal(X, N * LDX, &rng);
  seed(2), fill_normal(W, K * 16, &rng);
  seed(3), fill_normal(U, N * 16, &rng);
  RUN(test_thin_out_matches_double_sums);
  RUN(test_thin_grad_adds_to_g_and_matches_double_sums);
  RUN(test_same_bits_at_any_thread_count);
  RUN(test_blocked_and_scalar_paths_agree_bit_for_bit);
  RUN(test_masked_grad_and_dx_match_double_sums_with_any_mask_and_thread_count);
  RUN(test_out_grad_in_one_pass_matches_out_and_double_sums);
  RUN(test_masked_grad_in_row_chunks_matches_double_sums);
  RUN(test_masked_grad_from_swiglu_input_equals_h_then_grad);
  return test_summary();
}
