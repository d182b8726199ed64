// thin: the rank-16 products against sums in double, at shapes with tails (N not a
// multiple of 8, K not a multiple of 16, a row stride wider than K); the same bits at 1, 2
// and 3 threads; and a row or input computed by the blocked path equal, bit for bit, to
// the same one computed alone by the scalar path.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fill.h"
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

int main(void) {
  seed(1), fill_normal(X, N * LDX, &rng);
  seed(2), fill_normal(W, K * 16, &rng);
  seed(3), fill_normal(U, N * 16, &rng);
  RUN(test_thin_out_matches_double_sums);
  RUN(test_thin_grad_adds_to_g_and_matches_double_sums);
  RUN(test_same_bits_at_any_thread_count);
  RUN(test_blocked_and_scalar_paths_agree_bit_for_bit);
  return test_summary();
}
