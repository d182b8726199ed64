// test_kernels: the numerical core of ctune against references written here.
//   - every backward in kernels.h, attention.h and loss.h against central finite
//     differences of a scalar objective L = Σ r_i·y_i (fixed random r), computed in
//     double from the kernels' float outputs, for EVERY input and parameter element on
//     small odd sizes (remainders everywhere);
//   - attention forward and the LM head forward against plain double-precision loops;
//   - vocabulary tiling and the thread count (1 vs 2) against each other;
//   - ct_sgemm against a triple loop; ct_expf against exp(), ct_logf against log(); ct_chunk_range;
//     ct_blas_wanted_core; a parallel loop inside a pool task.
// A watchdog turns a hung test into a failure. Set TEST_VERBOSE=1 to print, for every gradient check, the worst |analytic − fd| / tol.
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attention.h"
#include "bf16.h"
#include "error.h"
#include "fastmath.h"
#include "kernels.h"
#include "head.h"
#include "matmul.h"
#include "pool.h"
#include "fill.h"
#include "rng.h"
#include "test.h"

// ---------------------------------------------------------------------------
// Helpers: allocation, random fill, finite differences

#define MAX_THREADS 2     // the pool sizes this binary uses
#define RMS_EPS 1e-5f     // the norms' own epsilon (not the finite-difference step)
#define FD_EPS 1e-3       // finite-difference step on O(1) inputs
#define FD_ABS 2e-3       // |analytic − fd| <= FD_ABS + FD_REL·|fd|
#define FD_REL 2e-2
// The head's objective sums the float log-probs (magnitude ~4, rounding ~3e-7 each) of
// every row, and a W entry moves them all: at a step of 1e-3 that noise alone reaches half
// the tolerance. The truncation error at 1e-2 is still below 1e-4.
#define HEAD_FD_EPS 1e-2

static void fill_nan(float *x, long n) {
  for (long i = 0; i < n; i++) x[i] = NAN;
}
// Objective weights r (n) in [-1, 1), drawn as floats so that the float copy handed to a
// backward as dy is exactly the r of the double objective.
static void fill_r(double *r, float *rf, long n) {
  for (long i = 0; i < n; i++) {
    float v = (float)unif(-1, 1);
    r[i] = v;
    if (rf) rf[i] = v;
  }
}

// Σ r_i·y_i in double.
static double weighted_sum(const double *r, const float *y, long n) {
  double s = 0;
  for (long i = 0; i < n; i++) s += r[i] * y[i];
  return s;
}

// out = a − base (base may be NULL), in double: the analytic gradient of an accumulating
// backward is what it added.
static void added(double *out, const float *a, const float *base, long n) {
  for (long i = 0; i < n; i++) out[i] = (double)a[i] - (base ? (double)base[i] : 0.0);
}

typedef double (*objective_fn)(void *ctx);

static void set_threads(int n) {
  CHECK_OK(ct_pool_init(n));
  CHECK(ct_pool_threads() == n);
}

// Objectives are evaluated thousands of times on tiny sizes: on one thread, so that the
// pool's per-loop hand-shake (a scheduler slice when the machine is busy) does not
// dominate. The analytic gradients are computed on two threads, and the forward kernels
// are separately shown to give the same bits on one and two threads.
static void fd_begin(void) { set_threads(1); }
static void fd_end(void) { set_threads(2); }

// Central difference of f with respect to the float *xi (restored afterwards). The step
// actually taken is that of the rounded floats, so it is the divisor.
static double central_diff_at(float *xi, double eps, objective_fn f, void *ctx) {
  float x0 = *xi, xp = (float)(x0 + eps), xm = (float)(x0 - eps);
  *xi = xp;
  double lp = f(ctx);
  *xi = xm;
  double lm = f(ctx);
  *xi = x0;
  return (lp - lm) / ((double)xp - (double)xm);
}

static void central_diff(double *fd, float *x, long n, double eps, objective_fn f, void *ctx) {
  fd_begin();
  for (long i = 0; i < n; i++) fd[i] = central_diff_at(x + i, eps, f, ctx);
  fd_end();
}

// Every element must satisfy |analytic − fd| <= FD_ABS + FD_REL·|fd|; the first five
// offenders are printed with their index.
static void check_grad(const char *what, const double *analytic, const double *fd, long n) {
  long bad = 0;
  double worst = 0;
  for (long i = 0; i < n; i++) {
    double tol = FD_ABS + FD_REL * fabs(fd[i]), err = fabs(analytic[i] - fd[i]);
    if (!(err <= tol)) {
      if (bad < 5)
        fprintf(stderr, "    %s: %s[%ld]: analytic %.7g, finite difference %.7g\n", test_current,
                what, i, analytic[i], fd[i]);
      bad++;
      err = INFINITY;
    }
    if (err / tol > worst) worst = err / tol;
  }
  if (bad) fprintf(stderr, "    %s: %s: %ld of %ld elements off\n", test_current, what, bad, n);
  if (getenv("TEST_VERBOSE"))
    fprintf(stderr, "    %s: worst |analytic - fd| / tol = %.3f over %ld\n", what, worst, n);
  CHECK(bad == 0);
}

// A hung test fails the binary instead of stalling `make test`.
static void on_alarm(int sig) {
  (void)sig;
  static const char a[] = "  FAIL ", b[] = ": did not finish in time (deadlock?)\n";
  if (write(2, a, sizeof a - 1) < 0 || write(2, test_current, strlen(test_current)) < 0 ||
      write(2, b, sizeof b - 1) < 0) {
  }
  _exit(1);
}

// A watchdog's seconds: under a wrapping tool (CT_WRAP, make valgrind) 50 times as many. The
// alarm catches deadlocks, and valgrind ran the 0.18 s chunked-attention check (300 central
// differences at T 700) past its 120 s on a 2-core AMD VM.
static unsigned watch_s(int seconds) {
  const char *w = getenv("CT_WRAP");
  return (unsigned)seconds * (w && *w ? 50u : 1u);
}

// Runs body in a child process forked while the parent's pool is stopped; fails when the
// child does not exit with status 0 within `seconds`. For what cannot be recovered
// in-process: a deadlocked pool, a sanitizer report under -fno-sanitize-recover.
static bool run_in_child(void (*body)(void), int seconds) {
  set_threads(1);  // no workers in the parent at fork time: the child starts clean
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGALRM, SIG_DFL);
    alarm(watch_s(seconds));
    test_failures = 0;
    body();
    ct_pool_free();
    _exit(test_failures ? 1 : 0);
  }
  int status = 0;
  bool ok = pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
            WEXITSTATUS(status) == 0;
  if (pid > 0 && WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
    fprintf(stderr, "    %s: did not finish in %d s (deadlock)\n", test_current, seconds);
  else if (pid > 0 && WIFSIGNALED(status))
    fprintf(stderr, "    %s: %s\n", test_current, strsignal(WTERMSIG(status)));
  set_threads(2);
  return ok;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
#define RUN_WATCHED(fn, seconds)                                                 \
  do {                                                                           \
    double t0_ = now_s();                                                        \
    alarm(watch_s(seconds));                                                     \
    RUN(fn);                                                                     \
    alarm(0);                                                                    \
    if (getenv("TEST_VERBOSE")) fprintf(stderr, "    (%.3f s)\n", now_s() - t0_); \
  } while (0)

// ---------------------------------------------------------------------------
// RMSNorm

typedef struct {
  float *x, *w, *y, *rstd;
  const double *r;
  int N, C;
} rms_ctx;

static double rms_objective(void *p) {
  rms_ctx *c = p;
  ct_rmsnorm_forward(c->y, c->rstd, c->x, c->w, c->N, c->C, RMS_EPS);
  return weighted_sum(c->r, c->y, (long)c->N * c->C);
}

// dx is written (NaN beforehand must vanish); dw accumulates onto what it held.
static void test_rmsnorm_backward_matches_central_differences(void) {
  enum { N = 7, C = 12 };
  seed(1);
  float x[N * C], w[C], y[N * C], rstd[N], dy[N * C], dx[N * C], dw[C], dw0[C];
  float scratch[CT_RED_CHUNKS * C];
  double r[N * C], fdx[N * C], fdw[C], ax[N * C], aw[C];
  fill(x, N * C, -1.5, 1.5);
  fill(w, C, -1.5, 1.5);
  fill(dw0, C, -1, 1);
  fill_r(r, dy, N * C);
  memcpy(dw, dw0, sizeof dw);
  fill_nan(dx, N * C);
  ct_rmsnorm_forward(y, rstd, x, w, N, C, RMS_EPS);
  ct_rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C, 0, scratch);
  rms_ctx c = {x, w, y, rstd, r, N, C};
  central_diff(fdx, x, N * C, FD_EPS, rms_objective, &c);
  central_diff(fdw, w, C, FD_EPS, rms_objective, &c);
  added(ax, dx, NULL, N * C);
  added(aw, dw, dw0, C);
  check_grad("dx", ax, fdx, N * C);
  check_grad("dw", aw, fdw, C);
}

// accumulate=1: dx += the same gradient that accumulate=0 writes.
static void test_rmsnorm_backward_accumulate_adds_gradient_to_dx(void) {
  enum { N = 9, C = 13 };
  seed(2);
  float x[N * C], w[C], y[N * C], rstd[N], dy[N * C], dx[N * C], dx0[N * C], dxw[N * C];
  float dw[C], scratch[CT_RED_CHUNKS * C];
  double r[N * C], fdx[N * C], ax[N * C];
  fill(x, N * C, -1.5, 1.5);
  fill(w, C, -1.5, 1.5);
  fill(dx0, N * C, -1, 1);
  fill_r(r, dy, N * C);
  memcpy(dx, dx0, sizeof dx);
  ct_rmsnorm_forward(y, rstd, x, w, N, C, RMS_EPS);
  memset(dw, 0, sizeof dw);
  ct_rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C, 1, scratch);
  memset(dw, 0, sizeof dw);
  ct_rmsnorm_backward(dxw, dw, dy, x, w, rstd, N, C, 0, scratch);
  double worst = 0;
  for (int i = 0; i < N * C; i++) worst = fmax(worst, fabs((double)dx[i] - dx0[i] - dxw[i]));
  CHECK_NEAR(worst, 0, 1e-6);
  rms_ctx c = {x, w, y, rstd, r, N, C};
  central_diff(fdx, x, N * C, FD_EPS, rms_objective, &c);
  added(ax, dx, dx0, N * C);
  check_grad("dx - dx0", ax, fdx, N * C);
}

// The reduction of dw uses CT_RED_CHUNKS fixed chunks summed in order.
static void rms_run(float *dx, float *dw, const float *x, const float *w, const float *dy, int N,
                    int C) {
  float *y = falloc((long)N * C), *rstd = falloc(N), *scratch = falloc((long)CT_RED_CHUNKS * C);
  ct_rmsnorm_forward(y, rstd, x, w, N, C, RMS_EPS);
  for (int i = 0; i < C; i++) dw[i] = 0.25f;
  ct_rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C, 0, scratch);
  free(y);
  free(rstd);
  free(scratch);
}

static void test_rmsnorm_backward_is_bit_identical_for_1_and_2_threads(void) {
  static const int shapes[][2] = {{203, 37}, {5, 12}, {64, 64}};
  seed(3);
  for (int s = 0; s < 3; s++) {
    int N = shapes[s][0], C = shapes[s][1];
    float *x = falloc((long)N * C), *w = falloc(C), *dy = falloc((long)N * C);
    float *dx1 = falloc((long)N * C), *dx2 = falloc((long)N * C), *dw1 = falloc(C), *dw2 = falloc(C);
    fill(x, (long)N * C, -2, 2);
    fill(w, C, -1, 1);
    fill(dy, (long)N * C, -1, 1);
    set_threads(1);
    rms_run(dx1, dw1, x, w, dy, N, C);
    set_threads(2);
    rms_run(dx2, dw2, x, w, dy, N, C);
    CHECK(memcmp(dx1, dx2, sizeof(float) * N * C) == 0);
    CHECK(memcmp(dw1, dw2, sizeof(float) * C) == 0);
    free(x), free(w), free(dy), free(dx1), free(dx2), free(dw1), free(dw2);
  }
}

// ---------------------------------------------------------------------------
// Per-head RMSNorm on a strided matrix whose heads do not cover the whole row

typedef struct {
  float *x, *work, *xsave, *rstd, *w;
  const double *r;
  int N, heads, hd, ld;
} headnorm_ctx;

// L = Σ r·y over the whole (N, ld) matrix: columns past the heads pass through unchanged,
// so their gradient is r, which is what the backward must leave in them.
static double headnorm_objective(void *p) {
  headnorm_ctx *c = p;
  long n = (long)c->N * c->ld;
  memcpy(c->work, c->x, sizeof(float) * n);
  ct_headnorm_forward(c->work, c->xsave, c->rstd, c->w, c->N, c->heads, c->hd, c->ld, RMS_EPS);
  return weighted_sum(c->r, c->work, n);
}

static void test_headnorm_backward_matches_central_differences_on_strided_rows(void) {
  enum { N = 5, HEADS = 3, HD = 6, LD = HEADS * HD + 5, NL = N * LD };
  seed(4);
  float x[NL], work[NL], xsave[NL], rstd[N * HEADS], w[HD], dxio[NL], dw[HD], dw0[HD];
  float scratch[CT_RED_CHUNKS * HD];
  double r[NL], fdx[NL], fdw[HD], ax[NL], aw[HD];
  fill(x, NL, -1.5, 1.5);
  fill(w, HD, -1.5, 1.5);
  fill(dw0, HD, -1, 1);
  fill_r(r, dxio, NL);
  memcpy(dw, dw0, sizeof dw);
  headnorm_ctx c = {x, work, xsave, rstd, w, r, N, HEADS, HD, LD};
  headnorm_objective(&c);
  bool passthrough = true;
  for (int n = 0; n < N; n++)
    for (int i = HEADS * HD; i < LD; i++) passthrough &= work[n * LD + i] == x[n * LD + i];
  CHECK(passthrough);
  ct_headnorm_backward(dxio, dw, xsave, w, rstd, N, HEADS, HD, LD, scratch);
  added(ax, dxio, NULL, NL);
  added(aw, dw, dw0, HD);
  central_diff(fdx, x, NL, FD_EPS, headnorm_objective, &c);
  central_diff(fdw, w, HD, FD_EPS, headnorm_objective, &c);
  check_grad("dx", ax, fdx, NL);
  check_grad("dw", aw, fdw, HD);
}

// ---------------------------------------------------------------------------
// RoPE (rotate-half); tables built as model.c does, theta = 10000

enum { ROPE_MAX_POS = 1100 };

static void rope_tables(float *cos_t, float *sin_t, int max_pos, int hd) {
  int half = hd / 2;
  for (int p = 0; p < max_pos; p++)
    for (int i = 0; i < half; i++) {
      float inv_freq = (float)(1.0 / pow(10000.0, (double)(2 * i) / hd));
      float angle = (float)p * inv_freq;
      cos_t[p * half + i] = (float)cos(angle);
      sin_t[p * half + i] = (float)sin(angle);
    }
}

typedef struct {
  float *x, *work;
  const int *pos;
  const float *cos_t, *sin_t;
  const double *r;
  int N, heads, hd, ld;
} rope_ctx;

static double rope_objective(void *p) {
  rope_ctx *c = p;
  long n = (long)c->N * c->ld;
  memcpy(c->work, c->x, sizeof(float) * n);
  ct_rope(c->work, c->pos, c->cos_t, c->sin_t, c->N, c->heads, c->hd, c->ld, 0);
  return weighted_sum(c->r, c->work, n);
}

// RoPE is linear, y = R·x, and its backward is dx = Rᵀ·dy: <R a, b> = <a, Rᵀ b> for any
// a, b; Rᵀ R = I; and the gradient of Σ r·(R x) (finite differences) is Rᵀ r.
static void test_rope_inverse_is_the_transpose_of_forward(void) {
  enum { N = 6, HEADS = 3, HD = 8, LD = HEADS * HD + 5, NL = N * LD };
  static const int pos[N] = {0, 1, 5, 17, 3, 1000};
  static float cos_t[ROPE_MAX_POS * HD / 2], sin_t[ROPE_MAX_POS * HD / 2];
  rope_tables(cos_t, sin_t, ROPE_MAX_POS, HD);
  seed(5);
  float a[NL], b[NL], ra[NL], rtb[NL], x[NL], work[NL], g[NL];
  double r[NL], fd[NL], an[NL];
  for (int trial = 0; trial < 4; trial++) {
    fill(a, NL, -1, 1);
    fill(b, NL, -1, 1);
    memcpy(ra, a, sizeof a);
    memcpy(rtb, b, sizeof b);
    ct_rope(ra, pos, cos_t, sin_t, N, HEADS, HD, LD, 0);
    ct_rope(rtb, pos, cos_t, sin_t, N, HEADS, HD, LD, 1);
    double lhs = 0, rhs = 0;
    for (int i = 0; i < NL; i++) lhs += (double)ra[i] * b[i], rhs += (double)a[i] * rtb[i];
    CHECK_NEAR(lhs, rhs, 1e-5 * (1 + fabs(rhs)));
    ct_rope(ra, pos, cos_t, sin_t, N, HEADS, HD, LD, 1);  // Rᵀ R a
    double worst = 0;
    for (int i = 0; i < NL; i++) worst = fmax(worst, fabs((double)ra[i] - a[i]));
    CHECK_NEAR(worst, 0, 1e-6);
  }
  fill(x, NL, -1.5, 1.5);
  fill_r(r, g, NL);
  ct_rope(g, pos, cos_t, sin_t, N, HEADS, HD, LD, 1);
  added(an, g, NULL, NL);
  rope_ctx c = {x, work, pos, cos_t, sin_t, r, N, HEADS, HD, LD};
  central_diff(fd, x, NL, FD_EPS, rope_objective, &c);
  check_grad("dx", an, fd, NL);
}

// A rotation: every head vector keeps its length; columns past the heads are untouched.
static void test_rope_preserves_the_norm_of_every_head(void) {
  enum { N = 11, HEADS = 5, HD = 16, LD = HEADS * HD + 3, NL = N * LD };
  static float cos_t[ROPE_MAX_POS * HD / 2], sin_t[ROPE_MAX_POS * HD / 2];
  rope_tables(cos_t, sin_t, ROPE_MAX_POS, HD);
  seed(6);
  int pos[N];
  for (int n = 0; n < N; n++) pos[n] = (int)ct_rng_below(&rng, ROPE_MAX_POS);
  float x[NL], y[NL];
  fill(x, NL, -2, 2);
  memcpy(y, x, sizeof x);
  ct_rope(y, pos, cos_t, sin_t, N, HEADS, HD, LD, 0);
  double worst = 0;
  bool untouched = true;
  for (int n = 0; n < N; n++) {
    for (int h = 0; h < HEADS; h++) {
      double nx = 0, ny = 0;
      for (int i = 0; i < HD; i++) {
        double xv = x[n * LD + h * HD + i], yv = y[n * LD + h * HD + i];
        nx += xv * xv, ny += yv * yv;
      }
      worst = fmax(worst, fabs(sqrt(ny) - sqrt(nx)) / sqrt(nx));
    }
    for (int i = HEADS * HD; i < LD; i++) untouched &= y[n * LD + i] == x[n * LD + i];
  }
  CHECK_NEAR(worst, 0, 1e-6);
  CHECK(untouched);
}

static void test_rope_at_position_0_is_identity(void) {
  enum { N = 4, HEADS = 3, HD = 8, LD = HEADS * HD, NL = N * LD };
  static float cos_t[ROPE_MAX_POS * HD / 2], sin_t[ROPE_MAX_POS * HD / 2];
  rope_tables(cos_t, sin_t, ROPE_MAX_POS, HD);
  seed(7);
  int pos[N] = {0, 0, 0, 0};
  float x[NL], y[NL];
  fill(x, NL, -3, 3);
  for (int inverse = 0; inverse < 2; inverse++) {
    memcpy(y, x, sizeof x);
    ct_rope(y, pos, cos_t, sin_t, N, HEADS, HD, LD, inverse);
    CHECK(memcmp(x, y, sizeof x) == 0);
  }
}

// ---------------------------------------------------------------------------
// SwiGLU

typedef struct {
  float *gu, *h;
  const double *r;
  int N, F;
} swiglu_ctx;

static double swiglu_objective(void *p) {
  swiglu_ctx *c = p;
  ct_swiglu_forward(c->h, NULL, c->gu, c->N, c->F);
  return weighted_sum(c->r, c->h, (long)c->N * c->F);
}

static void test_swiglu_backward_matches_central_differences(void) {
  enum { N = 7, F = 11 };
  seed(8);
  float gu[N * 2 * F], h[N * F], dh[N * F], dgu[N * 2 * F];
  double r[N * F], fd[N * 2 * F], an[N * 2 * F];
  fill(gu, N * 2 * F, -3, 3);
  fill_r(r, dh, N * F);
  fill_nan(dgu, N * 2 * F);
  ct_swiglu_backward(dgu, NULL, dh, gu, N, F);
  added(an, dgu, NULL, N * 2 * F);
  swiglu_ctx c = {gu, h, r, N, F};
  central_diff(fd, gu, N * 2 * F, FD_EPS, swiglu_objective, &c);
  check_grad("dgu", an, fd, N * 2 * F);
}

// The bf16 copies SwiGLU writes for the next product (h16, dgu16) are exactly its fp32
// outputs narrowed, and asking for them changes no fp32 bit.
static void test_swiglu_bf16_copies_are_its_outputs_narrowed(void) {
  enum { N = 29, F = 37 };
  seed(21);
  float gu[N * 2 * F], dh[N * F], h[N * F], h_plain[N * F], dgu[N * 2 * F], dgu_plain[N * 2 * F];
  uint16_t h16[N * F], dgu16[N * 2 * F], want[N * 2 * F];
  fill(gu, N * 2 * F, -4, 4);
  fill(dh, N * F, -1, 1);
  ct_swiglu_forward(h_plain, NULL, gu, N, F);
  ct_swiglu_forward(h, h16, gu, N, F);
  CHECK(memcmp(h, h_plain, sizeof h) == 0);
  ct_bf16_narrow(want, h, N * F);
  CHECK(memcmp(h16, want, sizeof h16) == 0);
  ct_swiglu_backward(dgu_plain, NULL, dh, gu, N, F);
  ct_swiglu_backward(dgu, dgu16, dh, gu, N, F);
  CHECK(memcmp(dgu, dgu_plain, sizeof dgu) == 0);
  ct_bf16_narrow(want, dgu, N * 2 * F);
  CHECK(memcmp(dgu16, want, sizeof dgu16) == 0);
}

// ct_swiglu_forward_lora: gu gains s·(u·Bᵀ) of each given adapter (against double sums,
// within the rounding of a 16-term fp32 chain), the half without an adapter keeps its bits,
// and h, h16 are ct_swiglu_forward's of the sums; without h only the sums, the same bits.
// Odd sizes: rows not a multiple of 8, F not of 16 (the vector blocks and the scalar tail).
static void test_swiglu_lora_adds_the_adapters_then_swiglu(void) {
  enum { N = 29, F = 37, R = 16 };
  seed(23);
  float gu0[N * 2 * F], gu[N * 2 * F], gu2[N * 2 * F], ug[N * R], uu[N * R], bgt[R * F], but[R * F];
  float h[N * F], want_h[N * F];
  uint16_t h16[N * F], want16[N * F];
  const float s = 0.7f;
  fill(gu0, N * 2 * F, -4, 4);
  fill(ug, N * R, -1, 1);
  fill(uu, N * R, -1, 1);
  fill(bgt, R * F, -0.5f, 0.5f);
  fill(but, R * F, -0.5f, 0.5f);
  memcpy(gu, gu0, sizeof gu);
  ct_swiglu_forward_lora(h, h16, gu, N, F, s, ug, bgt, uu, but, 0, NULL);
  int bad = 0;
  for (int n = 0; n < N; n++)
    for (int half = 0; half < 2; half++)
      for (int k = 0; k < F; k++) {
        const float *u = half ? uu : ug, *bt = half ? but : bgt;
        double t = 0, mag = 0;
        for (int r = 0; r < R; r++) t += (double)u[n * R + r] * bt[r * F + k], mag += fabs((double)u[n * R + r] * bt[r * F + k]);
        long i = (long)n * 2 * F + half * F + k;
        double want = gu0[i] + s * t;
        bad += fabs(gu[i] - want) > 4e-6 * (fabs(gu0[i]) + s * mag) + 1e-30;
      }
  CHECK(bad == 0);
  ct_swiglu_forward(want_h, NULL, gu, N, F);
  CHECK(memcmp(h, want_h, sizeof h) == 0);
  ct_bf16_narrow(want16, h, N * F);
  CHECK(memcmp(h16, want16, sizeof h16) == 0);
  memcpy(gu2, gu0, sizeof gu2);  // the sums alone: the same bits
  ct_swiglu_forward_lora(NULL, NULL, gu2, N, F, s, ug, bgt, uu, but, 0, NULL);
  CHECK(memcmp(gu2, gu, sizeof gu) == 0);
  memcpy(gu2, gu0, sizeof gu2);  // the up adapter alone: the gate half untouched
  ct_swiglu_forward_lora(NULL, NULL, gu2, N, F, s, NULL, NULL, uu, but, 0, NULL);
  int same_gate = 1, same_up = 1;
  for (int n = 0; n < N; n++)
    for (int k = 0; k < F; k++) {
      same_gate &= gu2[(long)n * 2 * F + k] == gu0[(long)n * 2 * F + k];
      same_up &= gu2[(long)n * 2 * F + F + k] == gu[(long)n * 2 * F + F + k];
    }
  CHECK(same_gate && same_up);
  // round (bf16 compute): gu holds the sums rounded to bf16, gu16 their bits, h and h16
  // are swiglu's of the rounded values; without adapters, gu itself rounded
  float gr[N * 2 * F], hr[N * F];
  uint16_t g16[N * 2 * F], hr16[N * F];
  memcpy(gr, gu0, sizeof gr);
  ct_swiglu_forward_lora(hr, hr16, gr, N, F, s, ug, bgt, uu, but, 1, g16);
  int rounded = 1;
  for (long i = 0; i < N * 2 * F; i++)
    rounded &= g16[i] == ct_f32_to_bf16(gu[i]) && gr[i] == ct_bf16_to_f32(g16[i]);
  CHECK(rounded);
  ct_swiglu_forward(want_h, NULL, gr, N, F);
  CHECK(memcmp(hr, want_h, sizeof hr) == 0);
  ct_bf16_narrow(want16, hr, N * F);
  CHECK(memcmp(hr16, want16, sizeof hr16) == 0);
  memcpy(gr, gu0, sizeof gr);
  ct_swiglu_forward_lora(NULL, NULL, gr, N, F, s, NULL, NULL, NULL, NULL, 1, NULL);
  rounded = 1;
  for (long i = 0; i < N * 2 * F; i++) rounded &= gr[i] == ct_bf16_to_f32(ct_f32_to_bf16(gu0[i]));
  CHECK(rounded);
}

// Backward writes dgu over gu (forward.c): in place must give the out-of-place bits, for
// SwiGLU and GeGLU, on odd sizes (the pool has 2 threads).
static void test_glu_backward_in_place_equals_out_of_place(void) {
  enum { N = 37, F = 13 };
  seed(18);
  float gu[N * 2 * F], dh[N * F], out[N * 2 * F], io[N * 2 * F];
  fill(gu, N * 2 * F, -4, 4);
  fill(dh, N * F, -1, 1);
  for (int geglu = 0; geglu < 2; geglu++) {
    memcpy(io, gu, sizeof io);
    fill_nan(out, N * 2 * F);
    if (geglu) ct_geglu_backward(out, dh, gu, N, F), ct_geglu_backward(io, dh, io, N, F);
    else ct_swiglu_backward(out, NULL, dh, gu, N, F), ct_swiglu_backward(io, NULL, dh, io, N, F);
    CHECK(memcmp(out, io, sizeof io) == 0);
    CHECK(!isnan(io[0]) && io[0] != gu[0]);  // (it did write)
  }
}

// Backward recomputes the norms' outputs from the saved rstd (forward.c): the same bits.
static void test_rmsnorm_apply_reproduces_the_forward_bit_for_bit(void) {
  enum { N = 29, C = 67 };
  seed(19);
  float x[N * C], w[C], y[N * C], y2[N * C], rstd[N];
  fill(x, N * C, -3, 3);
  fill(w, C, -2, 2);
  ct_rmsnorm_forward(y, rstd, x, w, N, C, RMS_EPS);
  fill_nan(y2, N * C);
  ct_rmsnorm_apply(y2, rstd, x, w, N, C);
  CHECK(memcmp(y, y2, sizeof y) == 0);
}

// ---------------------------------------------------------------------------
// Bias on strided rows

typedef struct {
  const float *y0;
  float *y, *b;
  const double *r;
  int N, C, ld;
} bias_ctx;

static double bias_objective(void *p) {
  bias_ctx *c = p;
  long n = (long)c->N * c->ld;
  memcpy(c->y, c->y0, sizeof(float) * n);
  ct_bias_forward(c->y, c->b, c->N, c->C, c->ld);
  return weighted_sum(c->r, c->y, n);
}

static void test_bias_backward_matches_central_differences(void) {
  enum { N = 7, C = 13, LD = 17, NL = N * LD };
  seed(9);
  float y0[NL], y[NL], b[C], dy[NL], db[C], db0[C], scratch[CT_RED_CHUNKS * C];
  double r[NL], fd[C], an[C];
  fill(y0, NL, -1, 1);
  fill(b, C, -1, 1);
  fill(db0, C, -1, 1);
  fill_r(r, dy, NL);
  memcpy(db, db0, sizeof db);
  bias_ctx c = {y0, y, b, r, N, C, LD};
  bias_objective(&c);
  bool untouched = true;
  for (int n = 0; n < N; n++)
    for (int i = C; i < LD; i++) untouched &= y[n * LD + i] == y0[n * LD + i];
  CHECK(untouched);
  ct_bias_backward(db, dy, N, C, LD, scratch);
  added(an, db, db0, C);
  central_diff(fd, b, C, FD_EPS, bias_objective, &c);
  check_grad("db", an, fd, C);
}

static void test_bias_backward_is_bit_identical_for_1_and_2_threads(void) {
  static const int shapes[][3] = {{301, 45, 50}, {6, 7, 7}, {1000, 16, 20}};
  seed(10);
  for (int s = 0; s < 3; s++) {
    int N = shapes[s][0], C = shapes[s][1], ld = shapes[s][2];
    float *dy = falloc((long)N * ld), *db1 = falloc(C), *db2 = falloc(C);
    float *scratch = falloc((long)CT_RED_CHUNKS * C);
    fill(dy, (long)N * ld, -1, 1);
    for (int i = 0; i < C; i++) db1[i] = db2[i] = 0.5f;
    set_threads(1);
    ct_bias_backward(db1, dy, N, C, ld, scratch);
    set_threads(2);
    ct_bias_backward(db2, dy, N, C, ld, scratch);
    CHECK(memcmp(db1, db2, sizeof(float) * C) == 0);
    free(dy), free(db1), free(db2), free(scratch);
  }
}

// ---------------------------------------------------------------------------
// Embedding

typedef struct {
  float *table, *out;
  const int *ids;
  const double *r;
  int N, C;
} embed_ctx;

static double embed_objective(void *p) {
  embed_ctx *c = p;
  ct_embed_forward(c->out, c->table, c->ids, c->N, c->C);
  return weighted_sum(c->r, c->out, (long)c->N * c->C);
}

// Ids repeat (their rows must sum) and some never occur (their rows stay as they were);
// C = 37 is cut into column chunks of 16 with a remainder.
static void test_embed_backward_matches_central_differences_with_repeated_ids(void) {
  enum { VOCAB = 9, N = 13, C = 37 };
  static const int ids[N] = {3, 1, 3, 3, 0, 8, 1, 5, 3, 8, 0, 5, 3};  // 2, 4, 6, 7 unused
  seed(11);
  float table[VOCAB * C], out[N * C], dout[N * C], dt[VOCAB * C], dt0[VOCAB * C];
  double r[N * C], fd[VOCAB * C], an[VOCAB * C];
  fill(table, VOCAB * C, -1, 1);
  fill(dt0, VOCAB * C, -1, 1);
  fill_r(r, dout, N * C);
  memcpy(dt, dt0, sizeof dt);
  ct_embed_backward(dt, dout, ids, N, C);
  added(an, dt, dt0, VOCAB * C);
  embed_ctx c = {table, out, ids, r, N, C};
  central_diff(fd, table, VOCAB * C, FD_EPS, embed_objective, &c);
  check_grad("dtable", an, fd, VOCAB * C);
  bool used[VOCAB] = {false}, unused_untouched = true;
  for (int n = 0; n < N; n++) used[ids[n]] = true;
  for (int v = 0; v < VOCAB; v++)
    for (int i = 0; i < C && !used[v]; i++) unused_untouched &= dt[v * C + i] == dt0[v * C + i];
  CHECK(unused_untouched);
}

// ---------------------------------------------------------------------------
// Attention

static float *attn_scratch(int T) {
  return falloc((long)MAX_THREADS * ct_attention_scratch_floats(T, 64, true));  // (hd up to 64)
}

// Random qkv with q and k in [-2, 2] (scores of order one, so that softmax is far from
// uniform) and v in [-1, 1].
static void attn_fill(float *qkv, ct_attn_dims d) {
  int ld = (d.H + 2 * d.KV) * d.hd;
  for (long n = 0; n < (long)d.B * d.T; n++)
    for (int i = 0; i < ld; i++) {
      bool qk = i < (d.H + d.KV) * d.hd;
      qkv[n * ld + i] = (float)(qk ? unif(-2, 2) : unif(-1, 1));
    }
}

// seg for row 0: documents packed back to back, starting at the listed positions;
// row 1 (and any further): plain causal.
static void attn_seg(int *seg, ct_attn_dims d, const int *starts, int nstarts) {
  for (int b = 0; b < d.B; b++)
    for (int t = 0; t < d.T; t++) {
      int s = 0;
      if (b == 0)
        for (int i = 0; i < nstarts; i++)
          if (starts[i] <= t) s = starts[i];
      seg[b * d.T + t] = s;
    }
}

// Causal GQA softmax attention in double: query t of head h attends to keys
// [seg[t], t] of kv group h / (H / KV).
static void attn_reference(double *out, double *lse, const float *qkv, const int *seg,
                           ct_attn_dims d) {
  int ld = (d.H + 2 * d.KV) * d.hd, rep = d.H / d.KV;
  double scale = 1.0 / sqrt((double)d.hd);
  double *s = dalloc(d.T);
  for (int b = 0; b < d.B; b++)
    for (int h = 0; h < d.H; h++)
      for (int t = 0; t < d.T; t++) {
        long n = (long)b * d.T + t;
        int g = h / rep, k0 = seg[n];
        const float *q = qkv + n * ld + h * d.hd;
        double mx = -INFINITY, sum = 0;
        for (int k = k0; k <= t; k++) {
          const float *kk = qkv + ((long)b * d.T + k) * ld + (d.H + g) * d.hd;
          double dot = 0;
          for (int i = 0; i < d.hd; i++) dot += (double)q[i] * kk[i];
          s[k] = dot * scale;
          mx = fmax(mx, s[k]);
        }
        for (int k = k0; k <= t; k++) sum += exp(s[k] - mx);
        double l = mx + log(sum);
        lse[n * d.H + h] = l;
        for (int i = 0; i < d.hd; i++) {
          double o = 0;
          for (int k = k0; k <= t; k++)
            o += exp(s[k] - l) * qkv[((long)b * d.T + k) * ld + (d.H + d.KV + g) * d.hd + i];
          out[n * d.H * d.hd + h * d.hd + i] = o;
        }
      }
  free(s);
}

static void test_attention_forward_matches_double_reference(void) {
  ct_attn_dims d = {.B = 2, .T = 70, .H = 4, .KV = 2, .hd = 8};  // blocks of 64 rows + 6
  static const int starts[] = {0, 13, 40, 66};  // the second block starts inside a document
  long N = (long)d.B * d.T, ld = (d.H + 2 * d.KV) * d.hd, no = N * d.H * d.hd;
  seed(12);
  float *qkv = falloc(N * ld), *out = falloc(no), *lse = falloc(N * d.H), *scratch = attn_scratch(d.T);
  int *seg = xcalloc(N, sizeof(int));
  double *rout = dalloc(no), *rlse = dalloc(N * d.H);
  attn_fill(qkv, d);
  attn_seg(seg, d, starts, 4);
  fill_nan(out, no);
  fill_nan(lse, N * d.H);
  ct_attention_forward(out, lse, qkv, seg, d, scratch, NULL);
  attn_reference(rout, rlse, qkv, seg, d);
  double wo = 0, wl = 0;
  for (long i = 0; i < no; i++) wo = fmax(wo, isnan(out[i]) ? INFINITY : fabs(out[i] - rout[i]));
  for (long i = 0; i < N * d.H; i++) wl = fmax(wl, isnan(lse[i]) ? INFINITY : fabs(lse[i] - rlse[i]));
  CHECK_NEAR(wo, 0, 1e-5);
  CHECK_NEAR(wl, 0, 1e-5);
  free(qkv), free(out), free(lse), free(scratch), free(seg), free(rout), free(rlse);
}

typedef struct {
  float *qkv, *out, *lse, *scratch;
  const int *seg;
  ct_attn_dims d;
  const double *r;
} attn_ctx;

static double attn_objective(void *p) {
  attn_ctx *c = p;
  ct_attention_forward(c->out, c->lse, c->qkv, c->seg, c->d, c->scratch, NULL);
  return weighted_sum(c->r, c->out, (long)c->d.B * c->d.T * c->d.H * c->d.hd);
}

// Checks ct_attention_backward against central differences of Σ r·out for `nsample`
// random entries of qkv (all of them when nsample <= 0). dqkv starts as NaN: it must be
// written in full.
static void attn_check_backward(ct_attn_dims d, const int *starts, int nstarts, int nsample,
                                double eps) {
  long N = (long)d.B * d.T, ld = (d.H + 2 * d.KV) * d.hd, no = N * d.H * d.hd, nq = N * ld;
  float *qkv = falloc(nq), *out = falloc(no), *lse = falloc(N * d.H), *dout = falloc(no);
  float *dqkv = falloc(nq), *scratch = attn_scratch(d.T);
  int *seg = xcalloc(N, sizeof(int));
  double *r = dalloc(no);
  attn_fill(qkv, d);
  attn_seg(seg, d, starts, nstarts);
  fill_r(r, dout, no);
  fill_nan(dqkv, nq);
  ct_attention_forward(out, lse, qkv, seg, d, scratch, NULL);
  ct_attention_backward(dqkv, dout, out, lse, qkv, seg, d, scratch);
  attn_ctx c = {qkv, out, lse, scratch, seg, d, r};
  long n = nsample > 0 ? nsample : nq;
  double *an = dalloc(n), *fd = dalloc(n);
  fd_begin();
  for (long i = 0; i < n; i++) {
    long e = nsample > 0 ? (long)ct_rng_below(&rng, (uint64_t)nq) : i;
    an[i] = dqkv[e];
    fd[i] = central_diff_at(qkv + e, eps, attn_objective, &c);
  }
  fd_end();
  check_grad("dqkv", an, fd, n);
  free(qkv), free(out), free(lse), free(dout), free(dqkv), free(scratch), free(seg), free(r);
  free(an), free(fd);
}

static void test_attention_backward_matches_central_differences_for_every_entry_at_T9(void) {
  ct_attn_dims d = {.B = 2, .T = 9, .H = 4, .KV = 2, .hd = 8};
  static const int starts[] = {0, 4, 7};
  seed(13);
  attn_check_backward(d, starts, 3, 0, FD_EPS);
}

static void test_attention_backward_matches_central_differences_at_T70(void) {
  ct_attn_dims d = {.B = 2, .T = 70, .H = 4, .KV = 2, .hd = 8};
  static const int starts[] = {0, 13, 40, 66};
  seed(14);
  attn_check_backward(d, starts, 4, 300, FD_EPS);
}

// A row longer than the backward's query chunks (512): at 2 threads one sequence and one kv
// group run its chunks side by side, each into its own partial dK | dV.
static void test_attention_backward_over_chunks_matches_central_differences(void) {
  ct_attn_dims d = {.B = 1, .T = 700, .H = 2, .KV = 1, .hd = 8};
  static const int starts[] = {0, 200, 201, 515};
  seed(16);
  attn_check_backward(d, starts, 4, 300, FD_EPS);
}

// The chunks of long rows one after another in one task (1 and 2 threads) and side by side
// (8 threads: 1 sequence x 2 kv groups x 3 chunks): the same bits, with a window and a softcap.
static void test_attention_backward_over_chunks_is_bit_identical_at_any_thread_count(void) {
  ct_attn_dims d = {.B = 1, .T = 1100, .H = 4, .KV = 2, .hd = 8, .window = 600, .softcap = 20};
  static const int starts[] = {0, 300, 301, 700};
  long N = (long)d.B * d.T, ld = (d.H + 2 * d.KV) * d.hd, no = N * d.H * d.hd, nq = N * ld;
  seed(17);
  float *qkv = falloc(nq), *dout = falloc(no), *out = falloc(no), *lse = falloc(N * d.H);
  float *scratch = falloc(8L * ct_attention_scratch_floats(d.T, d.hd, true)), *dqkv[3];
  int *seg = xcalloc(N, sizeof(int)), threads[3] = {1, 2, 8};
  attn_fill(qkv, d);
  fill(dout, no, -1, 1);
  attn_seg(seg, d, starts, 4);
  set_threads(1);
  ct_attention_forward(out, lse, qkv, seg, d, scratch, NULL);
  for (int k = 0; k < 3; k++) {
    dqkv[k] = falloc(nq);
    fill_nan(dqkv[k], nq);
    set_threads(threads[k]);
    ct_attention_backward(dqkv[k], dout, out, lse, qkv, seg, d, scratch);
  }
  bool finite = true;
  for (long i = 0; i < nq; i++) finite &= isfinite(dqkv[2][i]);
  CHECK(finite);
  CHECK(memcmp(dqkv[0], dqkv[1], sizeof(float) * nq) == 0);
  CHECK(memcmp(dqkv[0], dqkv[2], sizeof(float) * nq) == 0);
  set_threads(2);
  for (int k = 0; k < 3; k++) free(dqkv[k]);
  free(qkv), free(dout), free(out), free(lse), free(scratch), free(seg);
}

static void test_attention_is_bit_identical_for_1_and_2_threads(void) {
  ct_attn_dims d = {.B = 2, .T = 70, .H = 4, .KV = 2, .hd = 8};
  static const int starts[] = {0, 13, 40, 66};
  long N = (long)d.B * d.T, ld = (d.H + 2 * d.KV) * d.hd, no = N * d.H * d.hd, nq = N * ld;
  seed(15);
  float *qkv = falloc(nq), *dout = falloc(no), *scratch = attn_scratch(d.T);
  float *out[2], *lse[2], *dqkv[2];
  int *seg = xcalloc(N, sizeof(int));
  attn_fill(qkv, d);
  fill(dout, no, -1, 1);
  attn_seg(seg, d, starts, 4);
  for (int k = 0; k < 2; k++) {
    out[k] = falloc(no), lse[k] = falloc(N * d.H), dqkv[k] = falloc(nq);
    set_threads(k + 1);
    ct_attention_forward(out[k], lse[k], qkv, seg, d, scratch, NULL);
    ct_attention_backward(dqkv[k], dout, out[k], lse[k], qkv, seg, d, scratch);
  }
  CHECK(memcmp(out[0], out[1], sizeof(float) * no) == 0);
  CHECK(memcmp(lse[0], lse[1], sizeof(float) * N * d.H) == 0);
  CHECK(memcmp(dqkv[0], dqkv[1], sizeof(float) * nq) == 0);
  for (int k = 0; k < 2; k++) free(out[k]), free(lse[k]), free(dqkv[k]);
  free(qkv), free(dout), free(scratch), free(seg);
}

// A shared prefix (attention.h's pre): row 0 packs a prefix of 70 tokens and documents of
// 30, 90 and 1 tokens; row 1 a prefix of 5 and documents of 3 and 60 (then padding). Each
// document, run as its own row behind its own copy of the prefix, must give the same
// outputs and gradients: a prefix's dqkv is the sum over its copies (the copies' prefix
// rows carry the packed prefix's output gradient once, in the first copy). Across block
// edges, with a window and a softcap too.
typedef struct {
  int pre_len, ndoc, doc[3];
} prefix_row;

static void attention_shared_prefix_case(const prefix_row rows[2], int window, float softcap, float scale) {
  ct_attn_dims dp = {.B = 2, .H = 4, .KV = 2, .hd = 8, .scale = scale, .window = window, .softcap = softcap};
  ct_attn_dims ds = dp;
  ds.B = 0;
  for (int b = 0; b < 2; b++) {
    int len = rows[b].pre_len;
    for (int i = 0; i < rows[b].ndoc; i++) {
      len += rows[b].doc[i];
      int sl = rows[b].pre_len + rows[b].doc[i];
      ds.T = sl > ds.T ? sl : ds.T;
      ds.B++;
    }
    dp.T = len + 3 > dp.T ? len + 3 : dp.T;  // (3 padding tokens at least)
  }
  int ld = (dp.H + 2 * dp.KV) * dp.hd, wo = dp.H * dp.hd;
  long Np = (long)dp.B * dp.T, Ns = (long)ds.B * ds.T;
  float *qp = falloc(Np * ld), *op = falloc(Np * wo), *lp = falloc(Np * dp.H), *gp = falloc(Np * wo);
  float *dqp = falloc(Np * ld), *qs = falloc(Ns * ld), *os = falloc(Ns * wo), *ls = falloc(Ns * ds.H);
  float *gs = falloc(Ns * wo), *dqs = falloc(Ns * ld), *scratch = attn_scratch(dp.T > ds.T ? dp.T : ds.T);
  int *segp = xcalloc(Np, sizeof(int)), *pre = xcalloc(Np, sizeof(int)), *segs = xcalloc(Ns, sizeof(int));
  attn_fill(qp, dp);
  fill(gp, Np * wo, -1, 1);
  // packed: padding sees itself only; separate rows: src[n] = the packed token copied there
  long *src = xcalloc(Ns, sizeof(long));
  for (long n = 0; n < Np; n++) segp[n] = (int)(n % dp.T);
  for (long n = 0; n < Ns; n++) segs[n] = (int)(n % ds.T), src[n] = -1;
  int srow = 0;
  for (int b = 0; b < 2; b++) {
    int P = rows[b].pre_len, at = P;
    for (int t = 0; t < P; t++) segp[b * dp.T + t] = 0;
    for (int i = 0; i < rows[b].ndoc; i++, srow++) {
      for (int m = 0; m < rows[b].doc[i]; m++) {
        segp[b * dp.T + at + m] = at;
        pre[b * dp.T + at + m] = P;
      }
      for (int t = 0; t < P + rows[b].doc[i]; t++) {
        segs[srow * ds.T + t] = 0;
        src[srow * ds.T + t] = (long)b * dp.T + (t < P ? t : at + t - P);
      }
      for (int t = 0; t < P && i == 0; t++)  // the prefix's output gradient: in the first copy
        memcpy(gs + ((long)srow * ds.T + t) * wo, gp + ((long)b * dp.T + t) * wo, sizeof(float) * wo);
      for (int m = 0; m < rows[b].doc[i]; m++)
        memcpy(gs + ((long)srow * ds.T + P + m) * wo, gp + ((long)b * dp.T + at + m) * wo, sizeof(float) * wo);
      at += rows[b].doc[i];
    }
  }
  for (long n = 0; n < Ns; n++)
    if (src[n] >= 0) memcpy(qs + n * ld, qp + src[n] * ld, sizeof(float) * ld);
  dp.pre = pre;
  ct_attention_forward(op, lp, qp, segp, dp, scratch, NULL);
  ct_attention_backward(dqp, gp, op, lp, qp, segp, dp, scratch);
  ct_attention_forward(os, ls, qs, segs, ds, scratch, NULL);
  ct_attention_backward(dqs, gs, os, ls, qs, segs, ds, scratch);
  // outputs: every copy equals the packed token; dqkv: the packed token's is the sum of its copies'
  double werr = 0, gerr = 0;
  double *sum = dalloc(Np * ld);
  for (long n = 0; n < Ns; n++) {
    if (src[n] < 0) continue;
    for (int i = 0; i < wo; i++) werr = fmax(werr, fabs(os[n * wo + i] - op[src[n] * wo + i]));
    for (int h = 0; h < dp.H; h++) werr = fmax(werr, fabs(ls[n * ds.H + h] - lp[src[n] * dp.H + h]));
    for (int i = 0; i < ld; i++) sum[src[n] * ld + i] += dqs[n * ld + i];
  }
  for (int b = 0; b < 2; b++) {
    int len = rows[b].pre_len;
    for (int i = 0; i < rows[b].ndoc; i++) len += rows[b].doc[i];
    for (long n = (long)b * dp.T; n < (long)b * dp.T + len; n++)
      for (int i = 0; i < ld; i++) gerr = fmax(gerr, fabs(dqp[n * ld + i] - sum[n * ld + i]) / (1 + fabs(sum[n * ld + i])));
  }
  CHECK_NEAR(werr, 0, 2e-6);
  CHECK_NEAR(gerr, 0, 2e-5);
  free(qp), free(op), free(lp), free(gp), free(dqp), free(qs), free(os), free(ls), free(gs), free(dqs), free(scratch);
  free(segp), free(pre), free(segs), free(src), free(sum);
}

static void test_attention_over_a_shared_prefix_equals_one_row_per_document(void) {
  static const prefix_row rows[2] = {{70, 3, {30, 90, 1}}, {5, 2, {3, 60}}};
  // rows longer than the backward's query chunks (512): its partials over a prefix's keys
  static const prefix_row long_rows[2] = {{70, 3, {300, 250, 1}}, {5, 2, {400, 300}}};
  seed(16);
  attention_shared_prefix_case(rows, 0, 0, 0);
  attention_shared_prefix_case(rows, 20, 5.0f, 0.3f);
  attention_shared_prefix_case(rows, 75, 0, 0);
  attention_shared_prefix_case(long_rows, 0, 0, 0);
  attention_shared_prefix_case(long_rows, 120, 5.0f, 0);
}

// ---------------------------------------------------------------------------
// LM head (loss.h)

typedef struct {
  int N, C, V;
  float *hidden, *W;  // (N, C), (V, C)
  int *target;        // (N), −1 = no target
  int n;              // rows with a target
  float *coef, *zcoef;  // (n) per gathered row
} head_case;

// About a quarter of the tokens (always the first and the last) have no target; tokens
// 1 and 2 aim at the first and the last vocabulary entry (0 is a target, not a mask).
static void head_case_init(head_case *hc, int N, int C, int V) {
  hc->N = N, hc->C = C, hc->V = V;
  hc->hidden = falloc((long)N * C);
  hc->W = falloc((long)V * C);
  hc->target = xcalloc(N, sizeof(int));
  fill(hc->hidden, (long)N * C, -1, 1);
  fill(hc->W, (long)V * C, -1, 1);
  hc->n = 0;
  for (int t = 0; t < N; t++) {
    bool masked = t == 0 || t == N - 1 || (t > 2 && ct_rng_below(&rng, 4) == 0);
    hc->target[t] = masked ? -1 : t == 1 ? 0 : t == 2 ? V - 1 : (int)ct_rng_below(&rng, (uint64_t)V);
    hc->n += !masked;
  }
  hc->coef = falloc(hc->n);
  hc->zcoef = falloc(hc->n);
  fill(hc->coef, hc->n, 0.2, 1.5);
  fill(hc->zcoef, hc->n, -0.5, 0.5);
}

static void head_case_free(head_case *hc) {
  free(hc->hidden), free(hc->W), free(hc->target), free(hc->coef), free(hc->zcoef);
}

// lse, logp, entropy, argmax and Σ logits of the gathered rows (in gather order) in double.
static void head_reference(double *lse, double *logp, double *ent, int *amax, double *second,
                           double *lsum, const head_case *hc) {
  double *l = dalloc(hc->V);
  int r = 0;
  for (int t = 0; t < hc->N; t++) {
    if (hc->target[t] < 0) continue;
    double mx = -INFINITY, sum = 0, xsum = 0;
    int am = 0;
    for (int v = 0; v < hc->V; v++) {
      double s = 0;
      for (int i = 0; i < hc->C; i++)
        s += (double)hc->hidden[(long)t * hc->C + i] * hc->W[(long)v * hc->C + i];
      l[v] = s;
      if (s > mx) mx = s, am = v;
    }
    double sec = -INFINITY;  // runner-up logit, to tell near ties apart
    lsum[r] = 0;
    for (int v = 0; v < hc->V; v++) {
      lsum[r] += l[v];
      sum += exp(l[v] - mx);
      if (v != am) sec = fmax(sec, l[v]);
    }
    double z = mx + log(sum);
    for (int v = 0; v < hc->V; v++) xsum += exp(l[v] - z) * l[v];
    lse[r] = z, logp[r] = l[hc->target[t]] - z, ent[r] = z - xsum, amax[r] = am;
    second[r] = mx - sec;
    r++;
  }
  free(l);
}

static void test_head_gather_keeps_only_rows_with_a_target(void) {
  seed(16);
  head_case hc;
  head_case_init(&hc, 23, 12, 50);
  ct_head h;
  CHECK_OK(ct_head_init(&h, hc.N, hc.N, hc.V, hc.C, 1));
  int n = ct_head_gather(&h, hc.hidden, hc.target, hc.N);
  CHECK(n == hc.n);
  CHECK(h.n == hc.n);
  int r = 0;
  bool same = true;
  for (int t = 0; t < hc.N && r < n; t++) {
    if (hc.target[t] < 0) continue;
    same &= h.rows[r] == t && h.target[r] == hc.target[t];
    same &= memcmp(h.hc + (long)r * hc.C, hc.hidden + (long)t * hc.C, sizeof(float) * hc.C) == 0;
    r++;
  }
  CHECK(same);
  CHECK(r == n);
  ct_head_free(&h);
  head_case_free(&hc);
}

static void test_head_forward_matches_double_reference(void) {
  seed(17);
  head_case hc;
  head_case_init(&hc, 23, 12, 50);
  for (int k = 0; k < 3; k++) {  // one tile, three tiles, one tile over a 3-row logits buffer
    int ntiles = k == 1 ? 3 : 1;
    ct_head h;
    CHECK_OK(ct_head_init(&h, hc.N, k == 2 ? 3 : hc.N, hc.V, hc.C, ntiles));
    ct_head_gather(&h, hc.hidden, hc.target, hc.N);
    CHECK(k < 2 || h.logit_cap < (long)hc.n * hc.V);  // really narrower
    ct_head_forward(&h, hc.W);
    double *lse = dalloc(hc.n), *logp = dalloc(hc.n), *ent = dalloc(hc.n), *gap = dalloc(hc.n);
    double *lsum = dalloc(hc.n);
    int *am = xcalloc(hc.n, sizeof(int));
    head_reference(lse, logp, ent, am, gap, lsum, &hc);
    double wl = 0, wp = 0, we = 0, ws = 0;
    bool argmax_ok = true;
    for (int r = 0; r < hc.n; r++) {
      wl = fmax(wl, isnan(h.lse[r]) ? INFINITY : fabs(h.lse[r] - lse[r]));
      wp = fmax(wp, isnan(h.logp[r]) ? INFINITY : fabs(h.logp[r] - logp[r]));
      we = fmax(we, isnan(h.entropy[r]) ? INFINITY : fabs(h.entropy[r] - ent[r]));
      ws = fmax(ws, isnan(h.logit_sum[r]) ? INFINITY : fabs(h.logit_sum[r] - lsum[r]));
      argmax_ok &= h.argmax[r] == am[r] || gap[r] < 1e-5;  // a near tie may go either way
    }
    CHECK_NEAR(wl, 0, 1e-5);
    CHECK_NEAR(wp, 0, 1e-5);
    CHECK_NEAR(we, 0, 1e-5);
    CHECK_NEAR(ws, 0, 1e-4);  // a sum of 50 logits of order 1, each within float rounding
    CHECK(argmax_ok);
    free(lse), free(logp), free(ent), free(gap), free(lsum), free(am);
    ct_head_free(&h);
  }
  head_case_free(&hc);
}

typedef struct {
  ct_head *h;
  head_case *hc;
  const float *coef, *zcoef;
} head_ctx;

// L = Σ_r coef_r·(−logp_r) + zcoef_r·lse_r over the gathered rows, coef and zcoef held
// fixed. With l the logits of row r, y its target and p = softmax(l):
//   ∂(−logp_r)/∂l = ∂(lse_r − l_y)/∂l = p − onehot(y),   ∂lse_r/∂l = p,
// so ∂L/∂l = coef·(p − onehot(y)) + zcoef·p: exactly the dlogits that loss.h documents.
// (A z-loss weight·lse² sets zcoef = 2·weight·lse; lse is part of zcoef's value, not of
// the objective, which is why the objective here is linear in lse.)
static double head_objective(void *p) {
  head_ctx *c = p;
  ct_head_gather(c->h, c->hc->hidden, c->hc->target, c->hc->N);
  ct_head_forward(c->h, c->hc->W);
  double L = 0;
  for (int r = 0; r < c->h->n; r++)
    L += -(double)c->coef[r] * c->h->logp[r] + (double)c->zcoef[r] * c->h->lse[r];
  return L;
}

// Runs gather, forward and backward with the given coefficients; dW starts at dW0 (it
// accumulates) and d_hidden at NaN (it is written in full).
// logit_rows < the gathered rows makes the head take narrower chunks than V / ntiles.
static void head_backward_run(float *dW, float *dh, const float *dW0, head_case *hc, int ntiles,
                              int logit_rows, const float *coef, const float *zcoef) {
  ct_head h;
  CHECK_OK(ct_head_init(&h, hc->N, logit_rows, hc->V, hc->C, ntiles));
  ct_head_gather(&h, hc->hidden, hc->target, hc->N);
  ct_head_forward(&h, hc->W);
  memcpy(h.coef, coef, sizeof(float) * h.n);
  memcpy(h.zcoef, zcoef, sizeof(float) * h.n);
  if (dW0)
    memcpy(dW, dW0, sizeof(float) * hc->V * hc->C);
  else
    memset(dW, 0, sizeof(float) * hc->V * hc->C);
  fill_nan(dh, (long)hc->N * hc->C);
  ct_head_backward(&h, hc->W, dW, dh, hc->N);
  ct_head_free(&h);
}

// Three objectives: coef only (cross-entropy), zcoef only (z-loss style), both; each with
// one vocabulary tile, with three (whose backward recomputes the logits), and with one
// tile but a logits buffer for 4 rows only (the forward narrows its chunks to fit).
// Integer hidden values and weights: every logit an exact small integer whatever the order
// of its sum, so most rows hold their largest value more than once. argmax is the first
// of them, as a one-by-one scan has it: across the 16-lane blocks, the tail and vocabulary
// chunks (V = 103: six blocks and a tail of 7; 1, 3 and 7 chunks).
static void test_head_argmax_is_the_first_of_tied_maxima(void) {
  seed(29);
  head_case hc;
  head_case_init(&hc, 40, 3, 103);
  for (long i = 0; i < (long)hc.N * hc.C; i++) hc.hidden[i] = (float)ct_rng_below(&rng, 3) - 1.0f;
  for (long i = 0; i < (long)hc.V * hc.C; i++) hc.W[i] = (float)ct_rng_below(&rng, 5) - 2.0f;
  int ties = 0;
  for (int ntiles = 1; ntiles <= 7; ntiles += 3) {
    ct_head h;
    CHECK_OK(ct_head_init(&h, hc.N, hc.N, hc.V, hc.C, ntiles));
    ct_head_gather(&h, hc.hidden, hc.target, hc.N);
    ct_head_forward(&h, hc.W);
    bool ok = true;
    for (int r = 0; r < h.n; r++) {
      const float *x = hc.hidden + (long)h.rows[r] * hc.C;
      double best = -INFINITY;
      int first = -1, count = 0;
      for (int v = 0; v < hc.V; v++) {
        double l = 0;
        for (int c = 0; c < hc.C; c++) l += (double)x[c] * hc.W[(long)v * hc.C + c];
        if (l > best) best = l, first = v, count = 1;
        else if (l == best) count++;
      }
      ties += count > 1;
      ok &= h.argmax[r] == first;
    }
    CHECK(ok);
    ct_head_free(&h);
  }
  CHECK(ties > 10);  // the case really has ties
  head_case_free(&hc);
}

static void test_head_backward_matches_central_differences(void) {
  seed(18);
  head_case hc;
  head_case_init(&hc, 17, 12, 50);
  long nW = (long)hc.V * hc.C, nh = (long)hc.N * hc.C;
  float *dW = falloc(nW), *dW0 = falloc(nW), *dh = falloc(nh);
  float *zero = falloc(hc.n);
  double *an = dalloc(nW), *fd = dalloc(nW);
  fill(dW0, nW, -1, 1);
  const int setups[3][2] = {{1, 17}, {3, 17}, {1, 4}};  // ntiles, logit rows
  for (int s = 0; s < 3; s++)
    for (int mode = 0; mode < 3; mode++) {
      int ntiles = setups[s][0], lr = setups[s][1];
      const float *coef = mode == 1 ? zero : hc.coef, *zcoef = mode == 0 ? zero : hc.zcoef;
      head_backward_run(dW, dh, dW0, &hc, ntiles, lr, coef, zcoef);
      ct_head h;
      CHECK_OK(ct_head_init(&h, hc.N, lr, hc.V, hc.C, ntiles));
      head_ctx c = {&h, &hc, coef, zcoef};
      const char *name = mode == 0 ? "coef" : mode == 1 ? "zcoef" : "coef+zcoef";
      char what[64];
      snprintf(what, sizeof what, "dW (ntiles %d, logit rows %d, %s)", ntiles, lr, name);
      added(an, dW, dW0, nW);
      central_diff(fd, hc.W, nW, HEAD_FD_EPS, head_objective, &c);
      check_grad(what, an, fd, nW);
      snprintf(what, sizeof what, "d_hidden (ntiles %d, logit rows %d, %s)", ntiles, lr, name);
      added(an, dh, NULL, nh);
      central_diff(fd, hc.hidden, nh, HEAD_FD_EPS, head_objective, &c);
      check_grad(what, an, fd, nh);
      ct_head_free(&h);
    }
  free(dW), free(dW0), free(dh), free(zero), free(an), free(fd);
  head_case_free(&hc);
}

static void test_head_backward_writes_zero_d_hidden_for_rows_without_target(void) {
  seed(19);
  head_case hc;
  head_case_init(&hc, 31, 12, 50);
  float *dW = falloc((long)hc.V * hc.C), *dh = falloc((long)hc.N * hc.C);
  for (int ntiles = 1; ntiles <= 4; ntiles *= 4) {
    head_backward_run(dW, dh, NULL, &hc, ntiles, hc.N, hc.coef, hc.zcoef);
    bool zero = true, finite = true;
    for (int t = 0; t < hc.N; t++)
      for (int i = 0; i < hc.C; i++) {
        float v = dh[(long)t * hc.C + i];
        if (hc.target[t] < 0) zero &= v == 0;
        finite &= isfinite(v);
      }
    CHECK(zero);
    CHECK(finite);
  }
  free(dW), free(dh);
  head_case_free(&hc);
}

// Everything the head produces, for comparisons between runs.
typedef struct {
  int n;
  float *lse, *logp, *ent, *dW, *dh;
  int *amax;
  long bytes;
} head_out;

// Copies the per-row forward results of h's o->n gathered rows into o.
static void head_out_take(head_out *o, const ct_head *h) {
  o->lse = falloc(o->n), o->logp = falloc(o->n), o->ent = falloc(o->n);
  o->amax = xcalloc(o->n, sizeof(int));
  memcpy(o->lse, h->lse, sizeof(float) * o->n);
  memcpy(o->logp, h->logp, sizeof(float) * o->n);
  memcpy(o->ent, h->entropy, sizeof(float) * o->n);
  memcpy(o->amax, h->argmax, sizeof(int) * o->n);
}

static void head_out_run(head_out *o, head_case *hc, int ntiles) {
  ct_head h;
  CHECK_OK(ct_head_init(&h, hc->N, hc->N, hc->V, hc->C, ntiles));
  o->n = ct_head_gather(&h, hc->hidden, hc->target, hc->N);
  ct_head_forward(&h, hc->W);
  head_out_take(o, &h);
  memcpy(h.coef, hc->coef, sizeof(float) * o->n);
  memcpy(h.zcoef, hc->zcoef, sizeof(float) * o->n);
  o->dW = falloc((long)hc->V * hc->C);
  o->dh = falloc((long)hc->N * hc->C);
  ct_head_backward(&h, hc->W, o->dW, o->dh, hc->N);
  o->bytes = h.bytes;
  ct_head_free(&h);
}

static void head_out_free(head_out *o) {
  free(o->lse), free(o->logp), free(o->ent), free(o->amax), free(o->dW), free(o->dh);
}

// o's results within rounding (1e-5 relative) of base's, the same argmax.
static void check_head_out_close(const head_out *o, const head_out *base, const head_case *hc) {
  CHECK(o->n == base->n);
  CHECK(test_max_rel_diff(o->lse, base->lse, o->n) <= 1e-5);
  CHECK(test_max_rel_diff(o->logp, base->logp, o->n) <= 1e-5);
  CHECK(test_max_rel_diff(o->ent, base->ent, o->n) <= 1e-5);
  CHECK(memcmp(o->amax, base->amax, sizeof(int) * o->n) == 0);
  CHECK(test_max_rel_diff(o->dW, base->dW, (long)hc->V * hc->C) <= 1e-5);
  CHECK(test_max_rel_diff(o->dh, base->dh, (long)hc->N * hc->C) <= 1e-5);
}

// ct_head_fused's coefficient callback: the case's coefficients, and a record that the
// chunks come in order, each with its rows' forward results already there.
typedef struct {
  const head_case *hc;
  int next;       // the first row the next chunk must start at
  bool in_order;  // every chunk started at `next`
  bool ready;     // every row's lse was finite when its chunk's coefficients were asked for
} fused_ctx;

static void fused_coef(void *ctx, ct_head *h, int r0, int r1) {
  fused_ctx *f = ctx;
  f->in_order &= r0 == f->next && r1 > r0;
  f->next = r1;
  for (int r = r0; r < r1; r++) {
    f->ready &= isfinite(h->lse[r]);
    h->coef[r] = f->hc->coef[r];
    h->zcoef[r] = f->hc->zcoef[r];
  }
}

static void head_out_run_fused(head_out *o, head_case *hc, int ntiles, int rows) {
  ct_head h;
  CHECK_OK(ct_head_init(&h, hc->N, rows, hc->V, hc->C, ntiles));
  o->n = ct_head_gather(&h, hc->hidden, hc->target, hc->N);
  for (int r = 0; r < o->n; r++) h.lse[r] = NAN;  // (the forward must set them)
  o->dW = falloc((long)hc->V * hc->C);
  o->dh = falloc((long)hc->N * hc->C);
  fused_ctx f = {hc, 0, true, true};
  ct_head_fused(&h, hc->W, NULL, o->dW, o->dh, hc->N, fused_coef, &f);
  CHECK(f.in_order && f.ready && f.next == o->n);
  head_out_take(o, &h);
  o->bytes = h.bytes;
  ct_head_free(&h);
}

// Forward and backward a chunk of rows at a time give what the whole forward then the
// whole backward give, with and without vocabulary tiling, for chunks that divide the rows
// and chunks that leave a remainder; fewer rows at a time hold fewer bytes.
static void test_head_fused_matches_forward_then_backward(void) {
  seed(22);
  head_case hc;
  head_case_init(&hc, 29, 12, 50);
  head_out base, o;
  head_out_run(&base, &hc, 1);
  static const int rows[] = {1, 4, 7, 29};
  for (int ntiles = 1; ntiles <= 3; ntiles += 2) {
    long prev_bytes = 0;
    for (int k = 0; k < 4; k++) {
      head_out_run_fused(&o, &hc, ntiles, rows[k]);
      check_head_out_close(&o, &base, &hc);
      CHECK(o.bytes > prev_bytes);
      prev_bytes = o.bytes;
      head_out_free(&o);
    }
  }
  head_out_free(&base);
  head_case_free(&hc);
}

static void test_head_vocab_tiling_matches_untiled_for_n_1_2_3_4_8(void) {
  static const int tiles[] = {1, 2, 3, 4, 8};
  seed(20);
  head_case hc;
  head_case_init(&hc, 29, 12, 50);  // V = 50: no tiling divides it evenly but 1 and 2
  head_out base, o;
  head_out_run(&base, &hc, 1);
  long prev_bytes = base.bytes;
  for (int k = 1; k < 5; k++) {
    head_out_run(&o, &hc, tiles[k]);
    check_head_out_close(&o, &base, &hc);
    if (!(o.bytes < prev_bytes))
      fprintf(stderr, "    ntiles %d: %ld bytes, not fewer than %ld\n", tiles[k], o.bytes, prev_bytes);
    CHECK(o.bytes < prev_bytes);
    prev_bytes = o.bytes;
    head_out_free(&o);
  }
  head_out_free(&base);
  head_case_free(&hc);
}

// Large enough that ct_sgemm splits the logits products across the threads. The head's
// own reductions are per row, but how sgemm is split follows the thread count, and
// whether OpenBLAS's result is bit-identical for a split product depends on its kernel
// (SkylakeX: yes; Haswell, as under valgrind: not always) -- so within rounding here.
static void test_head_matches_for_1_and_2_threads(void) {
  seed(21);
  head_case hc;
  head_case_init(&hc, 190, 64, 50);
  for (int ntiles = 1; ntiles <= 3; ntiles += 2) {
    head_out o[2];
    for (int k = 0; k < 2; k++) {
      set_threads(k + 1);
      head_out_run(&o[k], &hc, ntiles);
    }
    CHECK(o[0].n == o[1].n);
    CHECK(test_max_rel_diff(o[0].lse, o[1].lse, o[0].n) < 1e-5);
    CHECK(test_max_rel_diff(o[0].logp, o[1].logp, o[0].n) < 1e-5);
    CHECK(test_max_rel_diff(o[0].ent, o[1].ent, o[0].n) < 1e-5);
    CHECK(memcmp(o[0].amax, o[1].amax, sizeof(int) * o[0].n) == 0);
    CHECK(test_max_rel_diff(o[0].dW, o[1].dW, (long)hc.V * hc.C) < 1e-5);
    CHECK(test_max_rel_diff(o[0].dh, o[1].dh, (long)hc.N * hc.C) < 1e-5);
    head_out_free(&o[0]);
    head_out_free(&o[1]);
  }
  head_case_free(&hc);
}

// ---------------------------------------------------------------------------
// ct_sgemm

// One product with padded leading dimensions; C's padding holds a sentinel that must
// survive, and with beta = 0 C starts as NaN (it must be ignored, as cblas does).
static void sgemm_case(char ta, char tb, int M, int N, int K, float alpha, float beta) {
  int lda = (ta == 'N' ? K : M) + 3, ldb = (tb == 'N' ? N : K) + 2, ldc = N + 5;
  long na = (long)(ta == 'N' ? M : K) * lda, nb = (long)(tb == 'N' ? K : N) * ldb, nc = (long)M * ldc;
  float *A = falloc(na), *B = falloc(nb), *C = falloc(nc), *C0 = falloc(nc);
  fill(A, na, -1, 1);
  fill(B, nb, -1, 1);
  if (beta == 0)
    fill_nan(C0, nc);
  else
    fill(C0, nc, -1, 1);
  for (int i = 0; i < M; i++)
    for (int j = N; j < ldc; j++) C0[(long)i * ldc + j] = 12345.0f;
  memcpy(C, C0, sizeof(float) * nc);
  ct_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  long bad = 0;
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      double s = 0, sa = 0;
      for (int k = 0; k < K; k++) {
        double a = ta == 'N' ? A[(long)i * lda + k] : A[(long)k * lda + i];
        double b = tb == 'N' ? B[(long)k * ldb + j] : B[(long)j * ldb + k];
        s += a * b, sa += fabs(a * b);
      }
      double c0 = beta == 0 ? 0 : C0[(long)i * ldc + j];
      double ref = alpha * s + beta * c0, tol = 2e-5 * (fabs(alpha) * sa + fabs(beta * c0)) + 1e-6;
      double got = C[(long)i * ldc + j];
      if (!(fabs(got - ref) <= tol) && bad++ < 3)
        fprintf(stderr, "    %c%c %dx%dx%d alpha %g beta %g: C[%d][%d] = %.7g, want %.7g\n", ta, tb,
                M, N, K, alpha, beta, i, j, got, ref);
    }
    for (int j = N; j < ldc; j++) bad += C[(long)i * ldc + j] != 12345.0f;
  }
  CHECK(bad == 0);
  free(A), free(B), free(C), free(C0);
}

// Shapes: odd and small (one thread), rows split (M >= N), columns split (N > M).
static void test_sgemm_matches_naive_loop_for_all_transposes(void) {
  static const int shapes[][3] = {
      {37, 53, 29}, {300, 200, 64}, {70, 333, 64}, {1, 1, 1}, {17, 5, 300}};
  static const float ab[][2] = {{1, 0}, {0.7f, -0.3f}, {-1.25f, 1}};
  static const char tr[] = {'N', 'T'};
  seed(22);
  for (int s = 0; s < 5; s++)
    for (int t = 0; t < 4; t++)
      for (int k = 0; k < 3; k++)
        sgemm_case(tr[t / 2], tr[t % 2], shapes[s][0], shapes[s][1], shapes[s][2], ab[k][0],
                   ab[k][1]);
}

static void test_sgemm_with_k_0_scales_c_by_beta(void) {
  float A[1] = {1}, B[1] = {1}, C[6] = {1, 2, 3, 4, 5, 6};
  ct_sgemm('N', 'N', 2, 3, 0, 1.0f, A, 1, B, 3, 0.5f, C, 3);
  bool scaled = true;
  for (int i = 0; i < 6; i++) scaled &= C[i] == 0.5f * (i + 1);
  CHECK(scaled);
  float D[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
  ct_sgemm('N', 'N', 2, 3, 0, 1.0f, A, 1, B, 3, 0.0f, D, 3);
  bool zero = true;
  for (int i = 0; i < 6; i++) zero &= D[i] == 0;
  CHECK(zero);
}

// ---------------------------------------------------------------------------
// ct_expf

// 4M evenly spaced points plus the ends and the neighbourhood of 0. (An exhaustive run
// over every float in [-87, 88] found a worst relative error of 8.5e-8, at 26.69.)
static void test_expf_relative_error_below_4e_7_on_minus_87_to_88(void) {
  static const float extra[] = {-87.0f, 88.0f, 0.0f, -0.0f, 1e-30f, -1e-30f, 1e-7f, -1e-7f};
  const long n = 1L << 22, nx = sizeof extra / sizeof extra[0];
  double worst = 0;
  float worst_x = 0;
  for (long i = 0; i <= n + nx; i++) {
    float x = i <= n ? (float)(-87.0 + 175.0 * (double)i / n) : extra[i - n - 1];
    double e = exp((double)x), rel = fabs((double)ct_expf(x) - e) / e;
    if (!(rel <= worst)) worst = rel, worst_x = x;
  }
  if (!(worst < 4e-7)) fprintf(stderr, "    worst %.3g at x = %.9g\n", worst, worst_x);
  CHECK(worst < 4e-7);
}

static void test_expf_of_minus_infinity_is_zero(void) {
  volatile float x = -INFINITY;
  CHECK(ct_expf(x) == 0.0f);
  volatile float y = -1000.0f;
  CHECK(ct_expf(y) == 0.0f);
}

static void expf_nan_body(void) {
  volatile float x = NAN;
  CHECK(isnan(ct_expf(x)));
}

// In a child process: under -fsanitize=undefined -fno-sanitize-recover a report ends it.
static void test_expf_of_nan_is_nan(void) { CHECK(run_in_child(expf_nan_body, 30)); }

// ct_logf: 4M points spread evenly in log scale over every normal float, plus ends,
// powers of two and the neighbourhood of 1 (where the absolute error is what matters).
static void test_logf_error_within_2_ulp_over_the_normal_floats(void) {
  static const float extra[] = {FLT_MIN, FLT_MAX, 1.0f, 2.0f, 0.5f, 0.70710677f, 0.70710683f,
                                1.0000001f, 0.99999994f, 1.4142135f, 3.0f, 1e-30f, 1e30f};
  const long n = 1L << 22, nx = sizeof extra / sizeof extra[0];
  double worst = 0;
  float worst_x = 0;
  for (long i = 0; i <= n + nx; i++) {
    float x = i <= n ? (float)exp(log(FLT_MIN) + (log(FLT_MAX) - log(FLT_MIN)) * (double)i / n)
                     : extra[i - n - 1];
    if (!(x >= FLT_MIN && x <= FLT_MAX)) continue;  // rounding at the ends
    double l = log((double)x), ulp = fmax(fabs(l), 1e-30) * FLT_EPSILON;
    double err = fabs((double)ct_logf(x) - l) / (fabs(l) < 1 ? fmax(fabs(x - 1.0), FLT_EPSILON) * FLT_EPSILON : ulp);
    if (!(err <= worst)) worst = err, worst_x = x;
  }
  if (!(worst < 2)) fprintf(stderr, "    worst %.3g ulp at x = %.9g\n", worst, worst_x);
  CHECK(worst < 2);
}

// ---------------------------------------------------------------------------
// Pool (the rest of its contract is in test_pool.c)

typedef struct {
  atomic_int hits[6][5];  // (outer item, inner item)
} nest_ctx;

typedef struct {
  atomic_int *row;  // (5) hits of one outer item
} nest_arg;

static void nest_row_task(void *ctx, int i, int thread) {
  (void)thread;
  atomic_fetch_add(((nest_arg *)ctx)->row + i, 1);
}

static void nest_outer_task(void *ctx, int i, int thread) {
  (void)thread;
  nest_ctx *c = ctx;
  nest_arg a = {c->hits[i]};
  ct_parallel_for(5, nest_row_task, &a);
}

static void nested_loop_body(void) {
  CHECK_OK(ct_pool_init(2));
  nest_ctx c;
  for (int i = 0; i < 6; i++)
    for (int k = 0; k < 5; k++) atomic_init(&c.hits[i][k], 0);
  for (int rep = 0; rep < 50; rep++) ct_parallel_for(6, nest_outer_task, &c);
  long bad = 0;
  for (int i = 0; i < 6; i++)
    for (int k = 0; k < 5; k++) bad += atomic_load(&c.hits[i][k]) != 50;
  CHECK(bad == 0);
}

// pool.h: "a loop inside a task runs serially".
static void test_pool_runs_a_loop_inside_a_task_serially(void) {
  CHECK(run_in_child(nested_loop_body, 3));
}

// ---------------------------------------------------------------------------
// ct_chunk_range, ct_blas_wanted_core

static void test_chunk_range_covers_0_to_n_exactly_without_overlap(void) {
  static const long big[] = {1000, 4099, 65537, (1L << 33) + 5};
  static const long aligns[] = {1, 2, 3, 16, 64};
  long bad = 0;
  for (int ni = 0; ni < 101 + 4; ni++) {
    long n = ni <= 100 ? ni : big[ni - 101];
    for (int a = 0; a < 5; a++)
      for (int parts = 1; parts <= 17; parts++) {
        long align = aligns[a], prev = 0;
        for (int i = 0; i < parts; i++) {
          long lo, hi;
          ct_chunk_range(n, align, parts, i, &lo, &hi);
          bool ok = lo == prev && lo <= hi && hi <= n && (lo % align == 0 || lo == n);
          if (!ok && bad++ < 3)
            fprintf(stderr, "    n %ld align %ld parts %d: chunk %d = [%ld, %ld) after %ld\n", n,
                    align, parts, i, lo, hi, prev);
          prev = hi;
        }
        if (prev != n && bad++ < 3)
          fprintf(stderr, "    n %ld align %ld parts %d: chunks end at %ld\n", n, align, parts, prev);
      }
  }
  CHECK(bad == 0);
}

static bool same_core(const char *got, const char *want) {
  return got == want || (got && want && strcmp(got, want) == 0);
}

static void test_blas_wanted_core_picks_kernel_for_cpu_features(void) {
  CHECK(same_core(ct_blas_wanted_core("Prescott", true, true), "SKYLAKEX"));
  CHECK(same_core(ct_blas_wanted_core("Haswell", true, true), "SKYLAKEX"));
  CHECK(same_core(ct_blas_wanted_core("SkylakeX", true, true), NULL));
  CHECK(same_core(ct_blas_wanted_core("Sandybridge", false, true), "HASWELL"));
  CHECK(same_core(ct_blas_wanted_core("Prescott", false, true), "HASWELL"));
  CHECK(same_core(ct_blas_wanted_core("Haswell", false, true), NULL));
  CHECK(same_core(ct_blas_wanted_core("SkylakeX", false, true), NULL));
  static const char *const any[] = {"Prescott", "Sandybridge", "Haswell", "SkylakeX", "Nehalem"};
  for (int i = 0; i < 5; i++) CHECK(same_core(ct_blas_wanted_core(any[i], false, false), NULL));
}

// ---------------------------------------------------------------------------

int main(int argc, char **argv) {
  ct_blas_init(argc, argv);
  signal(SIGALRM, on_alarm);
  if (ct_pool_init(2) != 0) {
    fprintf(stderr, "test_kernels: %s\n", ct_last_error());
    return 1;
  }
  RUN_WATCHED(test_rmsnorm_backward_matches_central_differences, 30);
  RUN_WATCHED(test_rmsnorm_backward_accumulate_adds_gradient_to_dx, 30);
  RUN_WATCHED(test_rmsnorm_backward_is_bit_identical_for_1_and_2_threads, 30);
  RUN_WATCHED(test_headnorm_backward_matches_central_differences_on_strided_rows, 30);
  RUN_WATCHED(test_rope_inverse_is_the_transpose_of_forward, 30);
  RUN_WATCHED(test_rope_preserves_the_norm_of_every_head, 30);
  RUN_WATCHED(test_rope_at_position_0_is_identity, 30);
  RUN_WATCHED(test_swiglu_backward_matches_central_differences, 30);
  RUN_WATCHED(test_glu_backward_in_place_equals_out_of_place, 30);
  RUN_WATCHED(test_swiglu_bf16_copies_are_its_outputs_narrowed, 30);
  RUN_WATCHED(test_swiglu_lora_adds_the_adapters_then_swiglu, 30);
  RUN_WATCHED(test_rmsnorm_apply_reproduces_the_forward_bit_for_bit, 30);
  RUN_WATCHED(test_bias_backward_matches_central_differences, 30);
  RUN_WATCHED(test_bias_backward_is_bit_identical_for_1_and_2_threads, 30);
  RUN_WATCHED(test_embed_backward_matches_central_differences_with_repeated_ids, 30);
  RUN_WATCHED(test_attention_forward_matches_double_reference, 30);
  RUN_WATCHED(test_attention_backward_matches_central_differences_for_every_entry_at_T9, 30);
  RUN_WATCHED(test_attention_backward_matches_central_differences_at_T70, 30);
  RUN_WATCHED(test_attention_is_bit_identical_for_1_and_2_threads, 30);
  RUN_WATCHED(test_attention_backward_over_chunks_matches_central_differences, 120);
  RUN_WATCHED(test_attention_backward_over_chunks_is_bit_identical_at_any_thread_count, 120);
  RUN(test_attention_over_a_shared_prefix_equals_one_row_per_document);
  RUN_WATCHED(test_head_gather_keeps_only_rows_with_a_target, 30);
  RUN_WATCHED(test_head_forward_matches_double_reference, 30);
  RUN_WATCHED(test_head_argmax_is_the_first_of_tied_maxima, 30);
  RUN_WATCHED(test_head_backward_matches_central_differences, 30);
  RUN_WATCHED(test_head_backward_writes_zero_d_hidden_for_rows_without_target, 30);
  RUN_WATCHED(test_head_vocab_tiling_matches_untiled_for_n_1_2_3_4_8, 30);
  RUN_WATCHED(test_head_fused_matches_forward_then_backward, 30);
  RUN_WATCHED(test_head_matches_for_1_and_2_threads, 30);
  RUN_WATCHED(test_sgemm_matches_naive_loop_for_all_transposes, 30);
  RUN_WATCHED(test_sgemm_with_k_0_scales_c_by_beta, 30);
  RUN_WATCHED(test_expf_relative_error_below_4e_7_on_minus_87_to_88, 30);
  RUN_WATCHED(test_expf_of_minus_infinity_is_zero, 30);
  RUN_WATCHED(test_chunk_range_covers_0_to_n_exactly_without_overlap, 30);
  RUN_WATCHED(test_blas_wanted_core_picks_kernel_for_cpu_features, 30);
  RUN_WATCHED(test_expf_of_nan_is_nan, 40);
  RUN_WATCHED(test_logf_error_within_2_ulp_over_the_normal_floats, 30);
  RUN_WATCHED(test_pool_runs_a_loop_inside_a_task_serially, 30);
  ct_pool_free();
  return test_summary();
}
