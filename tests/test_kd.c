// test_kd: the soft distillation loss of nn/kd against definitions written here.
//   - ct_kd_reference (per token, double) against KL / generalized-JSD values computed in
//     this file from probabilities (softmax of logits/τ, then Σ p log(p/q), the mixture
//     M = β·p_T + (1−β)·p_S formed explicitly), and against literals computed outside;
//     identical distributions give 0 for every β;
//   - ct_kd_reference's ∂L/∂z against central differences of its own loss;
//   - ct_kd_soft (vocabulary chunks, float, teacher logits from a callback) against
//     ct_kd_reference row by row: per-row loss, dhs = scale·dz·W, dW += scale·dzᵀ·hs;
//     every vocabulary tiling against the untiled one; the teacher's τ = 1 target log-prob;
//   - ct_kd_soft_topk against ct_kd_soft when k = V, and against ct_kd_reference on the
//     renormalized subset when k < V;
//   - dW == NULL: the loss alone, equal to the training-mode loss.
// Sizes are small and odd (n = 7 rows, C = 12, V = 37, teacher width 9) so that every
// tiling leaves a short last chunk and the pool's row split is uneven.
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "kd.h"
#include "error.h"
#include "matmul.h"
#include "pool.h"
#include "fill.h"
#include "rng.h"
#include "test.h"

// ---------------------------------------------------------------------------
// Helpers: allocation, random fill, comparisons

#define N_ROWS 7
#define C_DIM 12
#define V_DIM 37
#define CT_DIM 9      // the teacher's hidden width: it need not be the student's
#define SCALE 0.37f   // o.scale: multiplies the gradient, never the loss
#define LOSS_TOL 1e-5 // float logits (sgemm) vs double: |Δz| ~ 1e-6, and |∂L/∂z| <= 1
#define GRAD_TOL 2e-5 // |got − want| <= GRAD_TOL · max(|want|) over the tensor

static const double BETAS[] = {0, 0.3, 0.5, 1};
static const double TAUS[] = {1, 2};
#define NBETA (int)(sizeof BETAS / sizeof BETAS[0])
#define NTAU (int)(sizeof TAUS / sizeof TAUS[0])

static void filld(double *x, long n, double lo, double hi) {
  for (long i = 0; i < n; i++) x[i] = unif(lo, hi);
}

// Every |got_i − want_i| <= tol · max(1e-30, max_i |want_i|); the first three offenders are
// printed. Gradients here are O(1e-2): a scale of their own, not of 1.
static void check_tensor(const char *what, const float *got, const double *want, long n, double tol) {
  double big = 1e-30;
  for (long i = 0; i < n; i++) big = fmax(big, fabs(want[i]));
  long bad = 0;
  for (long i = 0; i < n; i++) {
    double err = fabs((double)got[i] - want[i]);
    if (!(err <= tol * big)) {
      if (bad < 3)
        fprintf(stderr, "    %s: %s[%ld]: got %.8g, want %.8g (max |want| %.3g)\n", test_current,
                what, i, got[i], want[i], big);
      bad++;
    }
  }
  if (bad) fprintf(stderr, "    %s: %s: %ld of %ld elements off\n", test_current, what, bad, n);
  CHECK(bad == 0);
}

static void check_tensor_f(const char *what, const float *got, const float *want, long n, double tol) {
  double *w = dalloc(n);
  for (long i = 0; i < n; i++) w[i] = want[i];
  check_tensor(what, got, w, n, tol);
  free(w);
}

// ---------------------------------------------------------------------------
// The definitions, from first principles: probabilities first, logs last

static void hand_softmax(const double *z, int V, double tau, double *p) {
  double s = 0;
  for (int v = 0; v < V; v++) s += p[v] = exp(z[v] / tau);  // small logits: no max needed
  for (int v = 0; v < V; v++) p[v] /= s;
}

// KL(p‖q) = Σ p log(p/q)
static double hand_kl(const double *p, const double *q, int V) {
  double s = 0;
  for (int v = 0; v < V; v++) s += p[v] * log(p[v] / q[v]);
  return s;
}

// β = 0: KL(T‖S); β = 1: KL(S‖T); else β·KL(T‖M) + (1−β)·KL(S‖M), M = w_T·p_T + (1−w_T)·p_S
// with w_T = β (w_T = 1 − β is the swapped mixture, used to show the test tells them apart).
static double hand_loss_w(const double *zs, const double *zt, int V, double tau, double beta, double w_t) {
  double ps[64], pt[64], m[64];
  hand_softmax(zs, V, tau, ps);
  hand_softmax(zt, V, tau, pt);
  if (beta == 0) return hand_kl(pt, ps, V);
  if (beta == 1) return hand_kl(ps, pt, V);
  for (int v = 0; v < V; v++) m[v] = w_t * pt[v] + (1 - w_t) * ps[v];
  return beta * hand_kl(pt, m, V) + (1 - beta) * hand_kl(ps, m, V);
}
static double hand_loss(const double *zs, const double *zt, int V, double tau, double beta) {
  return hand_loss_w(zs, zt, V, tau, beta, beta);
}

// ---------------------------------------------------------------------------
// ct_kd_reference: values and gradient

// zs = (1, −0.5, 2, 0.25), zt = (0.5, 1.5, −1, 0); the literals were computed outside this
// file (Python, math module, the probability-space formulas above).
static void test_reference_matches_hand_computed_values_for_beta_0_03_05_1_at_tau_1_and_2(void) {
  const double zs[4] = {1.0, -0.5, 2.0, 0.25}, zt[4] = {0.5, 1.5, -1.0, 0.0};
  const double want[2][4] = {
      {1.374979742295041, 0.23985692962863445, 0.2795631953537036, 1.416462768090677},
      {0.3782649651934626, 0.07589345068721311, 0.08992023219979443, 0.3872939938608463}};
  double dz[64];
  for (int a = 0; a < NTAU; a++)
    for (int b = 0; b < NBETA; b++) {
      double L = ct_kd_reference(zs, zt, 4, TAUS[a], BETAS[b], dz);
      CHECK_NEAR(L, want[a][b], 1e-12);
      CHECK_NEAR(hand_loss(zs, zt, 4, TAUS[a], BETAS[b]), want[a][b], 1e-12);  // the helper too
    }
  // random logits, V = 4 and V = 11, over a wider range
  seed(11);
  for (int V = 4; V <= 11; V += 7)
    for (int rep = 0; rep < 5; rep++) {
      double s[64], t[64];
      filld(s, V, -3, 3);
      filld(t, V, -3, 3);
      for (int a = 0; a < NTAU; a++)
        for (int b = 0; b < NBETA; b++)
          CHECK_NEAR(ct_kd_reference(s, t, V, TAUS[a], BETAS[b], dz), hand_loss(s, t, V, TAUS[a], BETAS[b]),
                     1e-12);
    }
}

// β = 0.3 is not symmetric under β ↔ 1 − β in the mixture: the swapped M gives another
// value, far enough apart that the check above would see it.
static void test_reference_jsd_uses_mixture_beta_pT_plus_1_minus_beta_pS(void) {
  const double zs[4] = {1.0, -0.5, 2.0, 0.25}, zt[4] = {0.5, 1.5, -1.0, 0.0};
  double dz[4];
  for (int a = 0; a < NTAU; a++) {
    double right = hand_loss_w(zs, zt, 4, TAUS[a], 0.3, 0.3);
    double swapped = hand_loss_w(zs, zt, 4, TAUS[a], 0.3, 0.7);
    CHECK(fabs(right - swapped) > 1e-3);
    double L = ct_kd_reference(zs, zt, 4, TAUS[a], 0.3, dz);
    CHECK_NEAR(L, right, 1e-12);
  }
}

static void test_reference_is_zero_for_identical_distributions_for_every_beta(void) {
  seed(12);
  double zs[11], zt[11], dz[11];
  for (int rep = 0; rep < 3; rep++) {
    filld(zs, 11, -4, 4);
    // the same logits, and the same logits shifted by a constant: the same distribution
    for (int shift = 0; shift < 2; shift++) {
      for (int v = 0; v < 11; v++) zt[v] = zs[v] + (shift ? 2.5 : 0);
      for (int a = 0; a < NTAU; a++)
        for (int b = 0; b < NBETA; b++) {
          double L = ct_kd_reference(zs, zt, 11, TAUS[a], BETAS[b], dz);
          CHECK_NEAR(L, 0, 1e-12);
          double g = 0;
          for (int v = 0; v < 11; v++) g = fmax(g, fabs(dz[v]));
          CHECK_NEAR(g, 0, 1e-12);
        }
    }
  }
}

// Central differences in double, step 1e-5: truncation ~1e-10, rounding ~1e-11, so the
// tolerance 1e-7 + 1e-6·|fd| is tight.
static void test_reference_dz_matches_central_differences_for_beta_0_03_05_1_at_tau_1_and_2(void) {
  seed(13);
  const double eps = 1e-5;
  for (int V = 4; V <= 11; V += 7)
    for (int rep = 0; rep < 3; rep++) {
      double zs[11], zt[11], dz[11], tmp[11];
      double range = rep == 2 ? 6 : 2;  // one draw with peaked distributions
      filld(zs, V, -range, range);
      filld(zt, V, -range, range);
      for (int a = 0; a < NTAU; a++)
        for (int b = 0; b < NBETA; b++) {
          ct_kd_reference(zs, zt, V, TAUS[a], BETAS[b], dz);
          double gsum = 0;
          for (int v = 0; v < V; v++) {
            double z0 = zs[v];
            zs[v] = z0 + eps;
            double lp = ct_kd_reference(zs, zt, V, TAUS[a], BETAS[b], tmp);
            zs[v] = z0 - eps;
            double lm = ct_kd_reference(zs, zt, V, TAUS[a], BETAS[b], tmp);
            zs[v] = z0;
            double fd = (lp - lm) / (2 * eps);
            CHECK_NEAR(dz[v], fd, 1e-7 + 1e-6 * fabs(fd));
            gsum += dz[v];
          }
          CHECK_NEAR(gsum, 0, 1e-12);  // a softmax's logits move it only relative to each other
        }
    }
}

// ---------------------------------------------------------------------------
// ct_kd_soft against the reference

typedef struct {
  const float *ht;  // (n, CT_DIM) teacher hidden states
  const float *Wt;  // (V, CT_DIM) teacher head
  int n, V, tile;
  int calls, bad_args;
  // student-as-teacher: the student's own logits, by the same sgemm call
  const float *hs, *W;
  int C;
} teacher_ctx;

static void teacher_fn(void *p, int n, int v0, int nv, float *out) {
  teacher_ctx *t = p;
  t->calls++;
  if (n != t->n || v0 < 0 || nv < 1 || nv > t->tile || v0 + nv > t->V) t->bad_args++;
  if (t->hs) {
    ct_sgemm('N', 'T', n, nv, t->C, 1, t->hs, t->C, t->W + (long)v0 * t->C, t->C, 0, out, nv);
    return;
  }
  for (int r = 0; r < n; r++)
    for (int j = 0; j < nv; j++) {
      double d = 0;
      for (int c = 0; c < CT_DIM; c++) d += (double)t->ht[r * CT_DIM + c] * t->Wt[(long)(v0 + j) * CT_DIM + c];
      out[(long)r * nv + j] = (float)d;
    }
}

// One problem: student rows, student head, teacher, targets, and the teacher's full logits.
typedef struct {
  int n, C, V;
  float *hs;   // (n, C)
  float *W;    // (V, C)
  float *ht;   // (n, CT_DIM)
  float *Wt;   // (V, CT_DIM)
  float *tl;   // (n, V) teacher logits, as the callback gives them
  int target[N_ROWS];
} problem;

static void problem_init(problem *p, uint64_t s) {
  seed(s);
  p->n = N_ROWS, p->C = C_DIM, p->V = V_DIM;
  p->hs = falloc(N_ROWS * C_DIM);
  p->W = falloc(V_DIM * C_DIM);
  p->ht = falloc(N_ROWS * CT_DIM);
  p->Wt = falloc(V_DIM * CT_DIM);
  p->tl = falloc(N_ROWS * V_DIM);
  fill(p->hs, N_ROWS * C_DIM, -1, 1);
  fill(p->W, V_DIM * C_DIM, -1, 1);
  fill(p->ht, N_ROWS * CT_DIM, -1, 1);
  fill(p->Wt, V_DIM * CT_DIM, -1.2, 1.2);
  for (int r = 0; r < N_ROWS; r++) p->target[r] = (int)ct_rng_below(&rng, V_DIM);
  p->target[0] = 0, p->target[1] = V_DIM - 1;  // both ends of the vocabulary
  teacher_ctx t = {p->ht, p->Wt, N_ROWS, V_DIM, V_DIM, 0, 0, NULL, NULL, 0};
  teacher_fn(&t, N_ROWS, 0, V_DIM, p->tl);
}

static void problem_free(problem *p) {
  free(p->hs), free(p->W), free(p->ht), free(p->Wt), free(p->tl);
}

static teacher_ctx teacher_for(const problem *p, int tile) {
  teacher_ctx t = {p->ht, p->Wt, p->n, p->V, tile, 0, 0, NULL, NULL, 0};
  return t;
}

// Student logits of row r in double (V).
static void student_logits(const problem *p, int r, double *zs) {
  for (int v = 0; v < p->V; v++) {
    double d = 0;
    for (int c = 0; c < p->C; c++) d += (double)p->hs[r * p->C + c] * p->W[(long)v * p->C + c];
    zs[v] = d;
  }
}

// The expected results: per-row losses, dhs = scale·dz·W (n, C), dW = scale·dzᵀ·hs (V, C).
static void expected(const problem *p, double tau, double beta, double scale, double *loss, double *dhs,
                     double *dW) {
  int n = p->n, C = p->C, V = p->V;
  double *zs = dalloc(V), *zt = dalloc(V), *dz = dalloc(V);
  memset(dhs, 0, sizeof(double) * n * C);
  memset(dW, 0, sizeof(double) * V * C);
  for (int r = 0; r < n; r++) {
    student_logits(p, r, zs);
    for (int v = 0; v < V; v++) zt[v] = p->tl[(long)r * V + v];
    loss[r] = ct_kd_reference(zs, zt, V, tau, beta, dz);
    for (int v = 0; v < V; v++)
      for (int c = 0; c < C; c++) {
        dhs[r * C + c] += scale * dz[v] * p->W[(long)v * C + c];
        dW[(long)v * C + c] += scale * dz[v] * p->hs[r * C + c];
      }
  }
  free(zs), free(zt), free(dz);
}

// Per-row losses, dhs and dW of a ct_kd_soft call against expected()'s values.
static void check_against_expected(const ct_kd *k, const float *dW, const double *loss, const double *dhs,
                                   const double *dW_want, int V) {
  for (int r = 0; r < N_ROWS; r++) CHECK_NEAR(k->loss[r], loss[r], LOSS_TOL);
  check_tensor("dhs", k->dhs, dhs, (long)N_ROWS * k->C, GRAD_TOL);
  check_tensor("dW", dW, dW_want, (long)V * k->C, GRAD_TOL);
}

static void test_soft_matches_reference_per_row_loss_dhs_and_dW(void) {
  problem p;
  problem_init(&p, 21);
  int n = p.n, C = p.C, V = p.V;
  double *loss = dalloc(n), *dhs = dalloc(n * C), *dW_want = dalloc(V * C);
  float *dW = falloc(V * C);
  const int tiles[] = {1, 3};
  for (int ti = 0; ti < 2; ti++) {
    ct_kd k;
    CHECK_OK(ct_kd_init(&k, n, V, C, tiles[ti]));
    for (int a = 0; a < NTAU; a++)
      for (int b = 0; b < NBETA; b++) {
        ct_kd_opts o = {(float)TAUS[a], (float)BETAS[b], SCALE, false};
        expected(&p, o.tau, o.beta, o.scale, loss, dhs, dW_want);
        memset(dW, 0, sizeof(float) * V * C);
        teacher_ctx t = teacher_for(&p, k.tile);
        double total = ct_kd_soft(&k, p.hs, n, p.W, dW, p.target, teacher_fn, &t, &o);
        CHECK(t.calls > 0 && t.bad_args == 0);
        double sum = 0;
        for (int r = 0; r < n; r++) {
          CHECK_NEAR(k.loss[r], loss[r], LOSS_TOL);
          sum += loss[r];
        }
        CHECK_NEAR(total, sum, n * LOSS_TOL);
        check_tensor("dhs", k.dhs, dhs, n * C, GRAD_TOL);
        check_tensor("dW", dW, dW_want, V * C, GRAD_TOL);
      }
    ct_kd_free(&k);
  }
  free(loss), free(dhs), free(dW_want), free(dW);
  problem_free(&p);
}

// dW is a gradient buffer (+=); dhs is the function's own output (=), whatever it held.
static void test_soft_accumulates_into_dW_and_overwrites_dhs(void) {
  problem p;
  problem_init(&p, 22);
  int n = p.n, C = p.C, V = p.V;
  double *loss = dalloc(n), *dhs = dalloc(n * C), *dW_want = dalloc(V * C);
  float *dW = falloc(V * C), *dW0 = falloc(V * C);
  fill(dW0, V * C, -0.05, 0.05);
  const int tiles[] = {1, 2, 5};
  for (int ti = 0; ti < 3; ti++) {
    ct_kd k;
    CHECK_OK(ct_kd_init(&k, n, V, C, tiles[ti]));
    ct_kd_opts o = {2.0f, 0.5f, SCALE, false};
    expected(&p, o.tau, o.beta, o.scale, loss, dhs, dW_want);
    for (long i = 0; i < V * C; i++) dW_want[i] += dW0[i];
    memcpy(dW, dW0, sizeof(float) * V * C);
    for (long i = 0; i < n * C; i++) k.dhs[i] = 1e3f;  // stale values from an earlier call
    teacher_ctx t = teacher_for(&p, k.tile);
    ct_kd_soft(&k, p.hs, n, p.W, dW, p.target, teacher_fn, &t, &o);
    check_tensor("dhs", k.dhs, dhs, n * C, GRAD_TOL);
    check_tensor("dW", dW, dW_want, V * C, GRAD_TOL);
    ct_kd_free(&k);
  }
  free(loss), free(dhs), free(dW_want), free(dW), free(dW0);
  problem_free(&p);
}

// A frozen student head (LoRA): dW is NULL, the hidden gradient is still computed and
// equal to the trained head's — chunked, unchunked and top-k.
static void test_frozen_head_gives_the_same_dhs_without_dW(void) {
  problem p;
  problem_init(&p, 24);
  int n = p.n, C = p.C, V = p.V;
  float *dW = falloc(V * C), *want = falloc(n * C);
  int *idx = xcalloc((long)n * V, sizeof(int));
  for (int r = 0; r < n; r++)
    for (int v = 0; v < V; v++) idx[(long)r * V + v] = v;
  for (int tiles = 1; tiles <= 3; tiles += 2) {
    ct_kd k;
    CHECK_OK(ct_kd_init(&k, n, V, C, tiles));
    ct_kd_opts o = {2.0f, 0.5f, SCALE, false};
    teacher_ctx t = teacher_for(&p, k.tile);
    double l1 = ct_kd_soft(&k, p.hs, n, p.W, dW, p.target, teacher_fn, &t, &o);
    memcpy(want, k.dhs, sizeof(float) * n * C);
    for (long i = 0; i < n * C; i++) k.dhs[i] = 1e3f;
    o.frozen_head = true;
    t = teacher_for(&p, k.tile);
    double l2 = ct_kd_soft(&k, p.hs, n, p.W, NULL, p.target, teacher_fn, &t, &o);
    CHECK(l1 == l2 && !memcmp(want, k.dhs, sizeof(float) * n * C));
    o.frozen_head = false;
    ct_kd_soft_topk(&k, p.hs, n, p.W, dW, idx, p.tl, V, &o);
    memcpy(want, k.dhs, sizeof(float) * n * C);
    o.frozen_head = true;
    ct_kd_soft_topk(&k, p.hs, n, p.W, NULL, idx, p.tl, V, &o);
    CHECK(!memcmp(want, k.dhs, sizeof(float) * n * C));
    ct_kd_free(&k);
  }
  free(dW), free(want), free(idx);
  problem_free(&p);
}

static void test_soft_is_zero_when_teacher_equals_student_for_every_beta(void) {
  problem p;
  problem_init(&p, 23);
  int n = p.n, C = p.C, V = p.V;
  float *dW = falloc(V * C);
  const int tiles[] = {1, 3};
  for (int ti = 0; ti < 2; ti++) {
    ct_kd k;
    CHECK_OK(ct_kd_init(&k, n, V, C, tiles[ti]));
    for (int a = 0; a < NTAU; a++)
      for (int b = 0; b < NBETA; b++) {
        ct_kd_opts o = {(float)TAUS[a], (float)BETAS[b], 1.0f, false};
        teacher_ctx t = teacher_for(&p, k.tile);
        t.hs = p.hs, t.W = p.W, t.C = C;
        memset(dW, 0, sizeof(float) * V * C);
        double total = ct_kd_soft(&k, p.hs, n, p.W, dW, p.target, teacher_fn, &t, &o);
        CHECK_NEAR(total, 0, 1e-10);
        double g = 0;
        for (long i = 0; i < n * C; i++) g = fmax(g, fabs(k.dhs[i]));
        for (long i = 0; i < V * C; i++) g = fmax(g, fabs(dW[i]));
        CHECK_NEAR(g, 0, 1e-7);
      }
    ct_kd_free(&k);
  }
  free(dW);
  problem_free(&p);
}

// Each tiling's losses, dhs and dW against the untiled ones (and all against the
// reference, so that agreeing on a wrong answer does not pass); memory falls with ntiles.
static void test_soft_chunked_matches_unchunked_for_ntiles_1_2_3_5_8(void) {
  problem p;
  problem_init(&p, 24);
  int n = p.n, C = p.C, V = p.V;
  const int tiles[] = {1, 2, 3, 5, 8};
  const int NT = 5;
  double *loss = dalloc(n), *dhs = dalloc(n * C), *dW_want = dalloc(V * C);
  double *loss1 = dalloc(n);
  float *dhs1 = falloc(n * C), *dW1 = falloc(V * C), *dW = falloc(V * C);
  long bytes[5];
  for (int a = 0; a < NTAU; a++)
    for (int b = 0; b < NBETA; b++) {
      ct_kd_opts o = {(float)TAUS[a], (float)BETAS[b], SCALE, false};
      expected(&p, o.tau, o.beta, o.scale, loss, dhs, dW_want);
      for (int ti = 0; ti < NT; ti++) {
        ct_kd k;
        CHECK_OK(ct_kd_init(&k, n, V, C, tiles[ti]));
        bytes[ti] = k.bytes;
        memset(dW, 0, sizeof(float) * V * C);
        teacher_ctx t = teacher_for(&p, k.tile);
        ct_kd_soft(&k, p.hs, n, p.W, dW, p.target, teacher_fn, &t, &o);
        CHECK(t.bad_args == 0);
        if (ti == 0) {
          memcpy(loss1, k.loss, sizeof(double) * n);
          memcpy(dhs1, k.dhs, sizeof(float) * n * C);
          memcpy(dW1, dW, sizeof(float) * V * C);
        } else {
          for (int r = 0; r < n; r++) CHECK_NEAR(k.loss[r], loss1[r], 1e-5 * fmax(fabs(loss1[r]), 1e-2));
          check_tensor_f("dhs vs untiled", k.dhs, dhs1, n * C, 1e-5);
          check_tensor_f("dW vs untiled", dW, dW1, V * C, 1e-5);
        }
        check_against_expected(&k, dW, loss, dhs, dW_want, V);
        ct_kd_free(&k);
      }
    }
  for (int ti = 1; ti < NT; ti++) CHECK(bytes[ti] < bytes[ti - 1]);
  // more tiles than vocabulary entries: one entry per chunk, the same answer
  {
    ct_kd k;
    CHECK_OK(ct_kd_init(&k, n, V, C, V + 5));
    ct_kd_opts o = {1.0f, 0.5f, SCALE, false};
    expected(&p, o.tau, o.beta, o.scale, loss, dhs, dW_want);
    memset(dW, 0, sizeof(float) * V * C);
    teacher_ctx t = teacher_for(&p, k.tile);
    ct_kd_soft(&k, p.hs, n, p.W, dW, p.target, teacher_fn, &t, &o);
    CHECK(t.bad_args == 0);
    check_against_expected(&k, dW, loss, dhs, dW_want, V);
    ct_kd_free(&k);
  }
  free(loss), free(dhs), free(dW_want), free(loss1), free(dhs1), free(dW1), free(dW);
  problem_free(&p);
}

// tgt_t1 − lse_t1 = log softmax(z_teacher)[target] at τ = 1, whatever τ the loss uses.
static void test_soft_teacher_target_logprob_is_log_softmax_at_tau_1(void) {
  problem p;
  problem_init(&p, 25);
  int n = p.n, C = p.C, V = p.V;
  double want[N_ROWS];
  for (int r = 0; r < n; r++) {
    const float *z = p.tl + (long)r * V;
    double m = -INFINITY, s = 0;
    for (int v = 0; v < V; v++) m = fmax(m, z[v]);
    for (int v = 0; v < V; v++) s += exp(z[v] - m);
    want[r] = z[p.target[r]] - m - log(s);
  }
  float *dW = falloc(V * C);
  const int tiles[] = {1, 2, 3, 5, 8};
  for (int ti = 0; ti < 5; ti++)
    for (int a = 0; a < NTAU; a++)
      for (int with_grad = 0; with_grad < 2; with_grad++) {
        ct_kd k;
        CHECK_OK(ct_kd_init(&k, n, V, C, tiles[ti]));
        ct_kd_opts o = {(float)TAUS[a], 0.5f, SCALE, false};
        teacher_ctx t = teacher_for(&p, k.tile);
        ct_kd_soft(&k, p.hs, n, p.W, with_grad ? dW : NULL, p.target, teacher_fn, &t, &o);
        for (int r = 0; r < n; r++) CHECK_NEAR(k.tgt_t1[r] - k.lse_t1[r], want[r], 1e-6);
        ct_kd_free(&k);
      }
  free(dW);
  problem_free(&p);
}

// ---------------------------------------------------------------------------
// ct_kd_soft_topk

static void test_topk_with_all_ids_equals_soft(void) {
  problem p;
  problem_init(&p, 31);
  int n = p.n, C = p.C, V = p.V;
  int *idx = xcalloc((long)n * V, sizeof(int)), *perm = xcalloc((long)n * V, sizeof(int));
  float *tlp = falloc(n * V);
  for (int r = 0; r < n; r++)
    for (int v = 0; v < V; v++) idx[r * V + v] = v;
  // the same ids in another order per row: the order of the k entries does not matter
  memcpy(perm, idx, sizeof(int) * n * V);
  seed(32);
  for (int r = 0; r < n; r++) {
    for (int v = V - 1; v > 0; v--) {
      int j = (int)ct_rng_below(&rng, (uint64_t)v + 1), x = perm[r * V + v];
      perm[r * V + v] = perm[r * V + j], perm[r * V + j] = x;
    }
    for (int v = 0; v < V; v++) tlp[r * V + v] = p.tl[r * V + perm[r * V + v]];
  }
  float *dW_soft = falloc(V * C), *dW_topk = falloc(V * C), *dhs_soft = falloc(n * C);
  double *loss_soft = dalloc(n);
  for (int a = 0; a < NTAU; a++)
    for (int b = 0; b < NBETA; b++) {
      ct_kd_opts o = {(float)TAUS[a], (float)BETAS[b], SCALE, false};
      ct_kd k;
      CHECK_OK(ct_kd_init(&k, n, V, C, 3));
      memset(dW_soft, 0, sizeof(float) * V * C);
      teacher_ctx t = teacher_for(&p, k.tile);
      double total_soft = ct_kd_soft(&k, p.hs, n, p.W, dW_soft, p.target, teacher_fn, &t, &o);
      memcpy(loss_soft, k.loss, sizeof(double) * n);
      memcpy(dhs_soft, k.dhs, sizeof(float) * n * C);
      for (int order = 0; order < 2; order++) {
        memset(dW_topk, 0, sizeof(float) * V * C);
        double total = ct_kd_soft_topk(&k, p.hs, n, p.W, dW_topk, order ? perm : idx, order ? tlp : p.tl, V, &o);
        CHECK_NEAR(total, total_soft, n * LOSS_TOL);
        for (int r = 0; r < n; r++) CHECK_NEAR(k.loss[r], loss_soft[r], LOSS_TOL);
        check_tensor_f("dhs topk vs soft", k.dhs, dhs_soft, n * C, GRAD_TOL);
        check_tensor_f("dW topk vs soft", dW_topk, dW_soft, V * C, GRAD_TOL);
      }
      ct_kd_free(&k);
    }
  free(idx), free(perm), free(tlp), free(dW_soft), free(dW_topk), free(dhs_soft), free(loss_soft);
  problem_free(&p);
}

// kk < V: both distributions renormalized over each row's kk ids (distinct, unsorted).
static void test_topk_subset_equals_reference_on_renormalized_subset(void) {
  problem p;
  problem_init(&p, 33);
  int n = p.n, C = p.C, V = p.V;
  const int kks[] = {1, 5, 16};
  for (int ki = 0; ki < 3; ki++) {
    int kk = kks[ki];
    int *idx = xcalloc((long)n * kk, sizeof(int));
    float *tl = falloc(n * kk);
    seed(34 + ki);
    for (int r = 0; r < n; r++) {  // partial Fisher–Yates: kk distinct ids
      int ids[V_DIM];
      for (int v = 0; v < V; v++) ids[v] = v;
      for (int q = 0; q < kk; q++) {
        int j = q + (int)ct_rng_below(&rng, (uint64_t)(V - q)), x = ids[q];
        ids[q] = ids[j], ids[j] = x;
        idx[r * kk + q] = ids[q];
        tl[r * kk + q] = p.tl[r * V + ids[q]];
      }
    }
    double *dhs = dalloc(n * C), *dW_want = dalloc(V * C);
    float *dW = falloc(V * C);
    for (int a = 0; a < NTAU; a++)
      for (int b = 0; b < NBETA; b++) {
        ct_kd_opts o = {(float)TAUS[a], (float)BETAS[b], SCALE, false};
        double tau = o.tau, beta = o.beta;
        memset(dhs, 0, sizeof(double) * n * C);
        memset(dW_want, 0, sizeof(double) * V * C);
        ct_kd k;
        CHECK_OK(ct_kd_init(&k, n, V, C, 2));
        memset(dW, 0, sizeof(float) * V * C);
        double total = ct_kd_soft_topk(&k, p.hs, n, p.W, dW, idx, tl, kk, &o), sum = 0;
        for (int r = 0; r < n; r++) {
          double zs[V_DIM], zt[V_DIM], zfull[V_DIM], dz[V_DIM];
          student_logits(&p, r, zfull);
          for (int q = 0; q < kk; q++) zs[q] = zfull[idx[r * kk + q]], zt[q] = tl[r * kk + q];
          double L = ct_kd_reference(zs, zt, kk, tau, beta, dz);
          CHECK_NEAR(L, hand_loss(zs, zt, kk, tau, beta), 1e-12);  // the subset, renormalized
          CHECK_NEAR(k.loss[r], L, 1e-6);
          if (kk == 1) CHECK_NEAR(k.loss[r], 0, 1e-12);  // one id: both distributions are (1)
          sum += L;
          for (int q = 0; q < kk; q++)
            for (int c = 0; c < C; c++) {
              long w = (long)idx[r * kk + q] * C + c;
              dhs[r * C + c] += o.scale * dz[q] * p.W[w];
              dW_want[w] += o.scale * dz[q] * p.hs[r * C + c];
            }
        }
        CHECK_NEAR(total, sum, 1e-5);
        if (kk > 1) {
          check_tensor("dhs", k.dhs, dhs, n * C, GRAD_TOL);
          check_tensor("dW", dW, dW_want, V * C, GRAD_TOL);
        } else {  // kk = 1: no gradient at all
          double g = 0;
          for (long i = 0; i < n * C; i++) g = fmax(g, fabs(k.dhs[i]));
          for (long i = 0; i < V * C; i++) g = fmax(g, fabs(dW[i]));
          CHECK_NEAR(g, 0, 1e-12);
        }
        ct_kd_free(&k);
      }
    free(idx), free(tl), free(dhs), free(dW_want), free(dW);
  }
  problem_free(&p);
}

// ---------------------------------------------------------------------------
// dW == NULL: evaluation only

static void test_loss_only_mode_equals_training_mode_loss(void) {
  problem p;
  problem_init(&p, 41);
  int n = p.n, C = p.C, V = p.V;
  float *dW = falloc(V * C);
  int *idx = xcalloc((long)n * 6, sizeof(int));
  float *tl = falloc(n * 6);
  for (int r = 0; r < n; r++)
    for (int q = 0; q < 6; q++) {
      idx[r * 6 + q] = (r * 5 + q * 6) % V;  // distinct: 6 steps of 6 stay below 37
      tl[r * 6 + q] = p.tl[r * V + idx[r * 6 + q]];
    }
  const int tiles[] = {1, 2, 3, 5, 8};
  double train[N_ROWS], evalr[N_ROWS];
  for (int a = 0; a < NTAU; a++)
    for (int b = 0; b < NBETA; b++) {
      ct_kd_opts o = {(float)TAUS[a], (float)BETAS[b], SCALE, false};
      for (int ti = 0; ti < 5; ti++) {
        ct_kd k;
        CHECK_OK(ct_kd_init(&k, n, V, C, tiles[ti]));
        teacher_ctx t = teacher_for(&p, k.tile);
        memset(dW, 0, sizeof(float) * V * C);
        double lt = ct_kd_soft(&k, p.hs, n, p.W, dW, p.target, teacher_fn, &t, &o);
        memcpy(train, k.loss, sizeof train);
        for (long i = 0; i < n * C; i++) k.dhs[i] = NAN;  // an evaluation pass must not need it
        double le = ct_kd_soft(&k, p.hs, n, p.W, NULL, p.target, teacher_fn, &t, &o);
        memcpy(evalr, k.loss, sizeof evalr);
        CHECK(t.bad_args == 0);
        CHECK_NEAR(le, lt, 1e-12 * fmax(1, fabs(lt)));
        for (int r = 0; r < n; r++) CHECK_NEAR(evalr[r], train[r], 1e-12);
        // a training pass after the evaluation pass still gives the same result
        double lt2 = ct_kd_soft(&k, p.hs, n, p.W, dW, p.target, teacher_fn, &t, &o);
        CHECK_NEAR(lt2, lt, 1e-12 * fmax(1, fabs(lt)));

        memset(dW, 0, sizeof(float) * V * C);
        double kt = ct_kd_soft_topk(&k, p.hs, n, p.W, dW, idx, tl, 6, &o);
        memcpy(train, k.loss, sizeof train);
        double ke = ct_kd_soft_topk(&k, p.hs, n, p.W, NULL, idx, tl, 6, &o);
        memcpy(evalr, k.loss, sizeof evalr);
        CHECK_NEAR(ke, kt, 1e-12 * fmax(1, fabs(kt)));
        for (int r = 0; r < n; r++) CHECK_NEAR(evalr[r], train[r], 1e-12);
        ct_kd_free(&k);
      }
    }
  free(dW), free(idx), free(tl);
  problem_free(&p);
}

int main(int argc, char **argv) {
  ct_blas_init(argc, argv);
  ct_pool_init(2);
  alarm(60);  // a hung pool fails the binary instead of stalling `make test`
  RUN(test_reference_matches_hand_computed_values_for_beta_0_03_05_1_at_tau_1_and_2);
  RUN(test_reference_jsd_uses_mixture_beta_pT_plus_1_minus_beta_pS);
  RUN(test_reference_is_zero_for_identical_distributions_for_every_beta);
  RUN(test_reference_dz_matches_central_differences_for_beta_0_03_05_1_at_tau_1_and_2);
  RUN(test_soft_matches_reference_per_row_loss_dhs_and_dW);
  RUN(test_soft_accumulates_into_dW_and_overwrites_dhs);
  RUN(test_soft_is_zero_when_teacher_equals_student_for_every_beta);
  RUN(test_frozen_head_gives_the_same_dhs_without_dW);
  RUN(test_soft_chunked_matches_unchunked_for_ntiles_1_2_3_5_8);
  RUN(test_soft_teacher_target_logprob_is_log_softmax_at_tau_1);
  RUN(test_topk_with_all_ids_equals_soft);
  RUN(test_topk_subset_equals_reference_on_renormalized_subset);
  RUN(test_loss_only_mode_equals_training_mode_loss);
  ct_pool_free();
  return test_summary();
}
