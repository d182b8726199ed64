// bf16 compute (bf16: true): oneDNN's bf16 products against exact sums of the rounded
// inputs, a tiny model's loss and gradients against fp32 and against finite differences
// of the fp32 model, and the bf16 weight copy the AdamW pass writes.
//
// The bounds. Rounding an fp32 input to bf16 changes it by at most u = 2^-8 relative (8
// significant bits, round to nearest); a product of two rounded inputs is exact in fp32
// and the K products are summed in fp32 (error <= K·2^-24 relative to Σ|a·b|). So a bf16
// product differs from the fp32 one by at most (2·2^-8 + K·2^-24)·Σ|a·b|, and from the
// exact sum of the rounded inputs by at most K·2^-24·Σ|a·b|. Through a model the rounding
// of each layer's inputs compounds: the loss and gradients of a 2-layer model pass ~10
// rounded products each (2u each), independent errors: about sqrt(10)·2u ≈ 2.5% relative
// per gradient tensor (measured 2-4%); the tests bound each tensor's norm error at 6% and
// the loss at 1%.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "dnnl.h"
#include "error.h"
#include "forward.h"
#include "head.h"
#include "model.h"
#include "optim.h"
#include "pool.h"
#include "rng.h"
#include "test.h"
#include "tiny_model.h"

static void fill(float *x, long n, ct_rng *r) {
  for (long i = 0; i < n; i++) x[i] = (float)ct_rng_normal(r);
}

// One product checked element by element against double sums of the rounded (exact
// bound K·2^-24) and unrounded (bound + 2·2^-8) inputs.
static void check_gemm(char ta, char tb, int M, int N, int K, float beta) {
  ct_rng r;
  ct_rng_seed(&r, (uint64_t)(M * 131 + N * 7 + K));
  long na = (long)M * K, nb = (long)K * N, nc = (long)M * N;
  float *a = malloc(4 * na), *b = malloc(4 * nb), *c = malloc(4 * nc), *c0 = malloc(4 * nc);
  uint16_t *a16 = malloc(2 * na), *b16 = malloc(2 * nb);
  fill(a, na, &r), fill(b, nb, &r), fill(c0, nc, &r);
  ct_bf16_narrow(a16, a, na);
  ct_bf16_narrow(b16, b, nb);
  memcpy(c, c0, 4 * nc);
  int lda = ta == 'N' ? K : M, ldb = tb == 'N' ? N : K;
  ct_gemm_bf16(ta, tb, M, N, K, a16, lda, b16, ldb, beta, c, N);
  int bad = 0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double exact16 = beta * c0[(long)i * N + j], exact32 = exact16, mag = fabs(exact16);
      for (int k = 0; k < K; k++) {
        long ia = ta == 'N' ? (long)i * K + k : (long)k * M + i, ib = tb == 'N' ? (long)k * N + j : (long)j * K + k;
        exact16 += (double)ct_bf16_to_f32(a16[ia]) * ct_bf16_to_f32(b16[ib]);
        exact32 += (double)a[ia] * b[ib];
        mag += fabs((double)a[ia] * b[ib]);
      }
      double got = c[(long)i * N + j], u = ldexp(1, -24);
      if (fabs(got - exact16) > (K + 2) * u * mag + 1e-30 || fabs(got - exact32) > (2 * ldexp(1, -8) + (K + 2) * u) * mag)
        if (bad++ < 3) fprintf(stderr, "  %c%c %dx%dx%d [%d,%d]: %g vs %g (fp32 %g)\n", ta, tb, M, N, K, i, j, got, exact16, exact32);
    }
  CHECK(bad == 0);
  free(a), free(b), free(c), free(c0), free(a16), free(b16);
}

static void test_bf16_products_are_exact_sums_of_rounded_inputs_within_fp32_accumulation(void) {
  // odd sizes, every transpose, accumulate or not, and one big enough to split over threads
  check_gemm('N', 'T', 37, 53, 29, 0);
  check_gemm('N', 'N', 37, 53, 29, 1);
  check_gemm('T', 'N', 19, 64, 33, 1);
  check_gemm('T', 'T', 5, 7, 3, 0);
  check_gemm('N', 'T', 130, 96, 72, 1);
  check_gemm('N', 'T', 1, 1, 1, 0);
}

static void test_a_shape_seen_before_creates_no_primitive(void) {
  check_gemm('N', 'T', 40, 24, 16, 0);
  int n = ct_dnnl_cached();
  check_gemm('N', 'T', 40, 24, 16, 0);
  CHECK(ct_dnnl_cached() == n);
  check_gemm('N', 'T', 40, 24, 17, 0);
  CHECK(ct_dnnl_cached() > n);
}

// Mean loss and gradients (into grads) of a fixed batch of 2 x 12 tokens.
static double loss_and_grads(const ct_model *m, float *grads) {
  const ct_model_config *c = &m->cfg;
  enum { B = 2, T = 12, N = B * T };
  ct_acts a;
  ct_head h;
  ct_weights g;
  if (ct_acts_init(&a, m, B, T, CT_ACTS_KEEP) || ct_head_init(&h, N, N, c->vocab_size, c->hidden_size, 1) ||
      ct_weights_bind(&g, m, grads))
    exit(1);
  ct_rng r;
  ct_rng_seed(&r, 9);
  int target[N];
  for (int n = 0; n < N; n++) a.ids[n] = (int)ct_rng_below(&r, (uint64_t)c->vocab_size), a.pos[n] = n % T, a.seg[n] = 0;
  for (int n = 0; n < N; n++) target[n] = (n + 1) % T ? a.ids[n + 1] : -1;
  ct_forward(m, &a, B, T);
  int rows = ct_head_gather(&h, a.lnf, target, N);
  ct_head_forward(&h, m->w.lm_head);
  double loss = 0;
  for (int i = 0; i < rows; i++) loss += -h.logp[i], h.coef[i] = 1.0f / rows, h.zcoef[i] = 0;
  memset(grads, 0, sizeof(float) * m->n_floats);
  ct_head_backward(&h, m->w.lm_head, g.lm_head, a.dln, N);
  ct_backward(m, &g, &a, a.dln, B, T);
  ct_weights_free(&g);
  ct_head_free(&h);
  ct_acts_free(&a);
  return loss / rows;
}

static double norm_diff(const float *x, const float *y, long lo, long hi, double *ny) {
  double d = 0, s = 0;
  for (long i = lo; i < hi; i++) d += ((double)x[i] - y[i]) * ((double)x[i] - y[i]), s += (double)y[i] * y[i];
  *ny = sqrt(s);
  return sqrt(d);
}

static void test_bf16_loss_and_every_gradient_tensor_within_bf16_rounding_of_fp32(void) {
  for (int f = 0; f < 3; f++) {
    const char *type = (const char *[]){"llama", "qwen2", "qwen3"}[f];
    ct_model m;
    tiny_model(&m, type);
    float *g32 = malloc(4 * m.n_floats), *g16 = malloc(4 * m.n_floats);
    double l32 = loss_and_grads(&m, g32);
    CHECK_OK(ct_model_bf16_compute(&m));
    double l16 = loss_and_grads(&m, g16);
    CHECK_NEAR(l16, l32, 1e-2 * fabs(l32));
    double worst = 0;
    for (int t = 0; t < m.n_tensors; t++) {
      const ct_tensor_info *ti = &m.tensors[t];
      double ny, d = norm_diff(g16, g32, ti->offset, ti->offset + ti->numel, &ny);
      if (d / ny > worst) worst = d / ny;
      if (!(d <= 0.06 * ny)) fprintf(stderr, "  %s %s: |g16 - g32| / |g32| = %.4f\n", type, ti->name, d / ny);
      CHECK(d <= 0.06 * ny);
    }
    fprintf(stderr, "  %s: loss %.6f (fp32 %.6f), worst tensor gradient error %.4f\n", type, l16, l32, worst);
    free(g32), free(g16);
    ct_model_free(&m);
  }
}

// Central differences of the fp32 model's loss (step 2e-3: fp32 loss noise ~1e-6 / 4e-3
// stays far below the bf16 tolerance) against the bf16 gradient, on every 29th parameter:
// |g16 - fd| <= 5% |fd| + 1% of the largest |fd| (bf16's rounding, as above).
static void test_bf16_gradients_match_finite_differences_of_the_fp32_model(void) {
  ct_model m;
  tiny_model(&m, "qwen2");
  float *g = malloc(4 * m.n_floats), *scratch = malloc(4 * m.n_floats);
  CHECK_OK(ct_model_bf16_compute(&m));
  loss_and_grads(&m, g);
  uint16_t *keep16 = m.compute16;
  m.compute16 = NULL;  // fp32 from here
  long n = 0, bad = 0;
  double *fd = malloc(sizeof(double) * (m.n_floats / 29 + 1)), big = 0;
  for (long i = 0; i < m.n_floats; i += 29) {
    float p = m.params[i], e = 2e-3f;
    m.params[i] = p + e;
    double lp = loss_and_grads(&m, scratch);
    m.params[i] = p - e;
    double lm = loss_and_grads(&m, scratch);
    m.params[i] = p;
    fd[n] = (lp - lm) / (2.0 * e);
    if (fabs(fd[n]) > big) big = fabs(fd[n]);
    n++;
  }
  for (long i = 0, k = 0; i < m.n_floats; i += 29, k++)
    if (fabs(g[i] - fd[k]) > 0.05 * fabs(fd[k]) + 0.01 * big && bad++ < 5)
      fprintf(stderr, "  param %ld: bf16 gradient %.6g, fp32 finite difference %.6g\n", i, g[i], fd[k]);
  fprintf(stderr, "  %ld gradients checked, %ld outside the bound\n", n, bad);
  CHECK(bad == 0 && n > 300);
  m.compute16 = keep16;
  free(g), free(scratch), free(fd);
  ct_model_free(&m);
}

static void test_adamw_writes_the_bf16_copy_of_exactly_the_updated_weights(void) {
  ct_model m, m2;
  tiny_model(&m, "llama");
  tiny_model(&m2, "llama");
  CHECK_OK(ct_model_bf16_compute(&m));
  long n = m.n_floats;
  float *g = malloc(4 * n), *g2 = malloc(4 * n), *m1 = calloc(n, 4), *v1 = calloc(n, 4), *m1b = calloc(n, 4), *v1b = calloc(n, 4);
  ct_rng r;
  ct_rng_seed(&r, 3);
  fill(g, n, &r);
  memcpy(g2, g, 4 * n);
  ct_adamw h = {0.9, 0.999, 1e-8, 0.1};
  ct_adamw_step(&ct_model_tensors(&m), m.params, m.compute16, g, m1, v1, 1, 1e-2, 1.0f, &h);
  ct_adamw_step(&ct_model_tensors(&m2), m2.params, NULL, g2, m1b, v1b, 1, 1e-2, 1.0f, &h);
  CHECK(!memcmp(m.params, m2.params, 4 * n));  // the copy changes nothing in fp32
  uint16_t *want = malloc(2 * n);
  ct_bf16_narrow(want, m.params, n);
  CHECK(!memcmp(want, m.compute16, 2 * n));
  free(g), free(g2), free(m1), free(v1), free(m1b), free(v1b), free(want);
  ct_model_free(&m);
  ct_model_free(&m2);
}

int main(void) {
  if (!ct_dnnl_bf16_cpu()) {
    fprintf(stderr, "  skip: this CPU has no bf16 hardware (bf16: true is an error here)\n");
    return test_summary();
  }
  CHECK_OK(ct_pool_init(2));
  CHECK_OK(ct_dnnl_init());
  RUN(test_bf16_products_are_exact_sums_of_rounded_inputs_within_fp32_accumulation);
  RUN(test_a_shape_seen_before_creates_no_primitive);
  RUN(test_bf16_loss_and_every_gradient_tensor_within_bf16_rounding_of_fp32);
  RUN(test_bf16_gradients_match_finite_differences_of_the_fp32_model);
  RUN(test_adamw_writes_the_bf16_copy_of_exactly_the_updated_weights);
  ct_dnnl_free();
  return test_summary();
}
