// test_sample: the token sampler against references written here in double precision.
//   - greedy, the reported log-prob, and the exact filter sets of top_k / top_p / min_p /
//     repetition penalty against a transformers-literal reference (sort, cumsum, mask);
//   - the kept distribution, exactly: sweeping the uniform over a grid of N points maps
//     each token to a share of the grid equal to its probability within 1/N;
//   - frequencies from the random stream, with chi-square statistics that can fail;
//   - determinism of the streams, bad input, and a 151936-token vocabulary.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "sample.h"
#include "test.h"

#define BIG_V 151936  // Qwen2's vocabulary
#define CHI2_5DOF_999 20.515  // 99.9% quantile of chi-square, 5 degrees of freedom
#define CHI2_1DOF_999 10.828

static ct_sample_params params(float temperature) {
  return (ct_sample_params){temperature, 0, 1.0f, 0.0f, 1.0f};
}

static void fill_normal(float *x, int n, double scale, uint64_t seed) {
  ct_rng r;
  ct_rng_seed(&r, seed);
  for (int i = 0; i < n; i++) x[i] = (float)(scale * ct_rng_normal(&r));
}

// ---------------------------------------------------------------------------
// Reference: transformers' processors, literally, in double

static double pen_ref(float l, float rp) { return l > 0 ? (double)l / rp : (double)l * rp; }

// log_softmax(logits / T)[tok] in double.
static double log_softmax_ref(const float *l, int V, double T, int tok) {
  double m = -INFINITY, z = 0;
  for (int i = 0; i < V; i++) m = fmax(m, l[i] / T);
  for (int i = 0; i < V; i++) z += exp(l[i] / T - m);
  return l[tok] / T - m - log(z);
}

static const double *sort_key;  // for the qsort comparators below
// ascending score; equal scores: higher id first (so lower ids are kept first by top_p)
static int cmp_ascending(const void *a, const void *b) {
  int i = *(const int *)a, j = *(const int *)b;
  if (sort_key[i] != sort_key[j]) return sort_key[i] < sort_key[j] ? -1 : 1;
  return j - i;
}

// The distribution transformers samples from: repetition penalty, temperature, top_k
// (remove s < k-th largest), top_p (sort ascending, softmax, cumsum, remove cum <= 1 - p,
// keep the last), min_p (remove prob < min_p · max prob). prob (V) out, renormalized.
static void hf_probs(const ct_sample_params *p, const float *l, int V, const int *seen,
                     int n_seen, double *prob) {
  double *s = malloc(sizeof(double) * V);
  int *order = malloc(sizeof(int) * V);
  for (int i = 0; i < V; i++) s[i] = l[i];
  for (int j = 0; j < n_seen; j++) s[seen[j]] = pen_ref(l[seen[j]], p->repetition_penalty);
  for (int i = 0; i < V; i++) s[i] /= p->temperature;
  for (int i = 0; i < V; i++) order[i] = i;
  sort_key = s;
  qsort(order, V, sizeof(int), cmp_ascending);
  if (p->top_k > 0 && p->top_k < V) {
    double kth = s[order[V - p->top_k]];
    for (int i = 0; i < V; i++)
      if (s[i] < kth) s[i] = -INFINITY;
    qsort(order, V, sizeof(int), cmp_ascending);
  }
  double m = -INFINITY, z = 0;
  for (int i = 0; i < V; i++) m = fmax(m, s[i]);
  for (int i = 0; i < V; i++) z += prob[i] = exp(s[i] - m);
  for (int i = 0; i < V; i++) prob[i] /= z;
  if (p->top_p < 1) {
    double cum = 0;
    for (int r = 0; r < V - 1; r++) {  // the last (largest) always stays
      cum += prob[order[r]];
      if (cum <= 1 - (double)p->top_p) prob[order[r]] = 0;
    }
  }
  if (p->min_p > 0) {
    double top = 0;
    for (int i = 0; i < V; i++) top = fmax(top, prob[i]);
    for (int i = 0; i < V; i++)
      if (prob[i] < p->min_p * top) prob[i] = 0;
  }
  z = 0;
  for (int i = 0; i < V; i++) z += prob[i];
  for (int i = 0; i < V; i++) prob[i] /= z;
  free(s);
  free(order);
}

// The inverse CDF in ascending id, as documented in sample.h: token i answers the
// uniforms in [cdf[i], cdf[i + 1]). cdf (V + 1) out.
static void ref_cdf(const double *prob, int V, double *cdf) {
  cdf[0] = 0;
  for (int i = 0; i < V; i++) cdf[i + 1] = cdf[i] + prob[i];
}

// Share of a grid of N uniforms (j + 0.5) / N that lands on each token: the sampled
// distribution, exactly, up to 1/N.
static void grid_shares(const ct_sample_params *p, const float *l, int V, const int *seen,
                        int n_seen, int N, double *share) {
  ct_sampler_ws ws;
  CHECK_OK(ct_sampler_ws_init(&ws, V));
  for (int i = 0; i < V; i++) share[i] = 0;
  for (int j = 0; j < N; j++) {
    int t = ct_sample_token_u(p, l, V, seen, n_seen, (j + 0.5) / N, &ws, NULL);
    CHECK(t >= 0 && t < V);
    if (t >= 0 && t < V) share[t] += 1.0 / N;
  }
  ct_sampler_ws_free(&ws);
}

// max_i |share_i - prob_i| <= 1/N (+ float rounding); no share outside the support, and
// every token of probability > 1/N gets a share.
static void check_shares(const double *share, const double *prob, int V, int N) {
  double worst = 0;
  int support = 1;
  for (int i = 0; i < V; i++) {
    worst = fmax(worst, fabs(share[i] - prob[i]));
    if ((share[i] > 0 && prob[i] == 0) || (share[i] == 0 && prob[i] > 1.0 / N)) support = 0;
  }
  CHECK(support);
  CHECK_NEAR(worst, 0, 1.0 / N + 1e-5);
}

// Draws n tokens with the seeded stream; counts (V) out.
static void draw_counts(const ct_sample_params *p, const float *l, int V, const int *seen,
                        int n_seen, uint64_t seed, int n, long *counts) {
  ct_sampler_ws ws;
  CHECK_OK(ct_sampler_ws_init(&ws, V));
  ct_rng r;
  ct_sample_rng(&r, seed, 0);
  for (int i = 0; i < V; i++) counts[i] = 0;
  for (int j = 0; j < n; j++) {
    int t = ct_sample_token(p, l, V, seen, n_seen, &r, &ws, NULL);
    CHECK(t >= 0 && t < V);
    if (t >= 0 && t < V) counts[t]++;
  }
  ct_sampler_ws_free(&ws);
}

// Pearson's statistic over the tokens with prob > 0; *outside = draws where prob == 0.
static double chi_square(const long *counts, const double *prob, int V, long n, long *outside) {
  double x2 = 0;
  *outside = 0;
  for (int i = 0; i < V; i++) {
    if (prob[i] > 0) {
      double e = n * prob[i];
      x2 += (counts[i] - e) * (counts[i] - e) / e;
    } else {
      *outside += counts[i];
    }
  }
  return x2;
}

// ---------------------------------------------------------------------------
// Greedy and the reported log-prob

static void test_greedy_picks_lowest_argmax_draws_nothing_logprob_is_log_softmax(void) {
  ct_sampler_ws ws;
  CHECK_OK(ct_sampler_ws_init(&ws, 8));
  const float l[8] = {0.5f, 3.0f, -INFINITY, 3.0f, 2.9f, -1.0f, 3.0f, 0.0f};
  ct_sample_params p = params(0);
  p.top_k = 2, p.top_p = 0.5f, p.min_p = 0.5f;  // no effect on greedy
  ct_rng r, before;
  ct_sample_rng(&r, 7, 0);
  before = r;
  float lp = 0;
  CHECK(ct_sample_token(&p, l, 8, NULL, 0, &r, &ws, &lp) == 1);
  CHECK(memcmp(&r, &before, sizeof r) == 0);
  CHECK_NEAR(lp, log_softmax_ref(l, 8, 1.0, 1), 1e-6);
  // greedy needs no stream at all
  CHECK(ct_sample_token(&p, l, 8, NULL, 0, NULL, &ws, &lp) == 1);
  // a masked vocabulary prefix and a lone finite token
  const float m[5] = {-INFINITY, -INFINITY, -INFINITY, -40.0f, -INFINITY};
  CHECK(ct_sample_token(&p, m, 5, NULL, 0, NULL, &ws, &lp) == 3);
  CHECK_NEAR(lp, 0.0, 1e-7);
  ct_sampler_ws_free(&ws);
}

static void test_greedy_argmax_flips_under_repetition_penalty(void) {
  ct_sampler_ws ws;
  CHECK_OK(ct_sampler_ws_init(&ws, 4));
  // 2.0 / 1.5 = 1.33 < 1.8: the seen favourite loses; its raw log-prob is not reported
  const float l[4] = {2.0f, 1.8f, -1.0f, 0.5f};
  ct_sample_params p = params(0);
  p.repetition_penalty = 1.5f;
  int seen[3] = {0, 0, 0};  // duplicates penalize once: 2/1.5 = 1.33 still beats 0.5
  float lp;
  CHECK(ct_sample_token(&p, l, 4, seen, 3, NULL, &ws, &lp) == 1);
  CHECK_NEAR(lp, log_softmax_ref(l, 4, 1.0, 1), 1e-6);
  int seen01[2] = {1, 0};
  CHECK(ct_sample_token(&p, l, 4, seen01, 2, NULL, &ws, &lp) == 0);  // 1.33 vs 1.2
  // a negative logit is multiplied: -0.6 · 1.5 = -0.9 < -0.8
  const float n[2] = {-0.6f, -0.8f};
  int s0 = 0;
  CHECK(ct_sample_token(&p, n, 2, &s0, 1, NULL, &ws, &lp) == 1);
  p.repetition_penalty = 1.0f;
  CHECK(ct_sample_token(&p, n, 2, &s0, 1, NULL, &ws, &lp) == 0);
  // a penalty below 1 rewards the seen tokens
  p.repetition_penalty = 0.5f;
  int s3 = 3;
  CHECK(ct_sample_token(&p, l, 4, &s3, 1, NULL, &ws, &lp) == 0);  // 0.5 / 0.5 = 1 < 2
  int s1 = 1;
  CHECK(ct_sample_token(&p, l, 4, &s1, 1, NULL, &ws, &lp) == 1);  // 3.6 > 2
  ct_sampler_ws_free(&ws);
}

static void test_logprob_is_log_softmax_of_logits_over_T_whatever_the_filters(void) {
  enum { V = 1000 };
  static float l[V];
  fill_normal(l, V, 2.5, 11);
  for (int i = 0; i < V; i += 37) l[i] = -INFINITY;
  int seen[50];
  for (int j = 0; j < 50; j++) seen[j] = (j * 97 + 5) % V;
  const ct_sample_params cases[] = {
      {1.0f, 0, 1.0f, 0.0f, 1.0f},   {0.5f, 0, 1.0f, 0.0f, 1.0f},
      {1.7f, 5, 1.0f, 0.0f, 1.0f},   {1.0f, 0, 0.3f, 0.0f, 1.0f},
      {0.8f, 0, 1.0f, 0.2f, 1.0f},   {1.2f, 0, 1.0f, 0.0f, 1.8f},
      {0.7f, 40, 0.9f, 0.05f, 1.3f}, {1.0f, 1, 1.0f, 0.0f, 1.0f},
  };
  ct_sampler_ws ws;
  CHECK_OK(ct_sampler_ws_init(&ws, V));
  ct_rng r;
  ct_sample_rng(&r, 3, 0);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    double worst = 0;
    for (int d = 0; d < 50; d++) {
      float lp;
      int t = ct_sample_token(&cases[c], l, V, seen, 50, &r, &ws, &lp);
      CHECK(t >= 0 && l[t] > -INFINITY);
      if (t < 0) break;
      worst = fmax(worst, fabs(lp - log_softmax_ref(l, V, cases[c].temperature, t)));
    }
    CHECK_NEAR(worst, 0, 2e-5);
  }
  ct_sampler_ws_free(&ws);
}

// ---------------------------------------------------------------------------
// The sampled distribution

static const float six[6] = {1.2f, -0.3f, 0.4f, 2.0f, -1.5f, 0.9f};

static void check_six_frequencies(float T) {
  enum { N = 200000 };
  ct_sample_params p = params(T);
  long counts[6], outside;
  double prob[6], wrong[6];
  draw_counts(&p, six, 6, NULL, 0, 2024, N, counts);
  hf_probs(&p, six, 6, NULL, 0, prob);
  double x2 = chi_square(counts, prob, 6, N, &outside);
  fprintf(stderr, "    T=%g: chi-square %.2f (5 dof, 99.9%% quantile %.1f)\n", T, x2, CHI2_5DOF_999);
  CHECK(outside == 0);
  CHECK(x2 < CHI2_5DOF_999);
  // the statistic has power: the same counts against the softmax at another temperature
  ct_sample_params q = params(T == 1.0f ? 0.8f : 1.0f);
  hf_probs(&q, six, 6, NULL, 0, wrong);
  CHECK(chi_square(counts, wrong, 6, N, &outside) > 10 * CHI2_5DOF_999);
}

static void test_frequencies_match_softmax_at_temperature_1_chi_square(void) {
  check_six_frequencies(1.0f);
}

static void test_frequencies_match_softmax_of_logits_over_half_at_temperature_05(void) {
  check_six_frequencies(0.5f);
}

static void test_top_k_2_only_top_two_at_renormalized_frequencies(void) {
  enum { N = 200000 };
  ct_sample_params p = params(1.0f);
  p.top_k = 2;
  long counts[6], outside;
  double prob[6];
  draw_counts(&p, six, 6, NULL, 0, 99, N, counts);
  hf_probs(&p, six, 6, NULL, 0, prob);
  CHECK(prob[3] > 0 && prob[0] > 0 && prob[1] + prob[2] + prob[4] + prob[5] == 0);
  CHECK_NEAR(prob[3], 1 / (1 + exp(1.2 - 2.0)), 1e-6);
  double x2 = chi_square(counts, prob, 6, N, &outside);
  CHECK(outside == 0);
  CHECK(x2 < CHI2_1DOF_999);
  double share[6];
  grid_shares(&p, six, 6, NULL, 0, 100000, share);
  check_shares(share, prob, 6, 100000);
  // ties at the k-th value all stay (transformers removes only s < k-th)
  const float tie[5] = {3.0f, 1.0f, 2.0f, 2.0f, 2.0f};
  hf_probs(&p, tie, 5, NULL, 0, prob);
  double want[5] = {0};
  double z = exp(3.0) + 3 * exp(2.0);
  want[0] = exp(3.0) / z, want[2] = want[3] = want[4] = exp(2.0) / z;
  for (int i = 0; i < 5; i++) CHECK_NEAR(prob[i], want[i], 1e-9);
  grid_shares(&p, tie, 5, NULL, 0, 100000, share);
  check_shares(share, want, 5, 100000);
}

// Rows with many equal scores (logits on a 0.25 grid): ties at the top-k boundary all
// stay, and top-p orders equal probabilities by id, in both top-k paths (a heap up to
// k = 256, a radix select above) and the top-p radix select.
static void test_ties_follow_the_reference_in_every_selection_path(void) {
  enum { V = 1000, N = 5000 };
  static float l[V];
  static double prob[V], share[V];
  fill_normal(l, V, 1.5, 404);
  for (int i = 0; i < V; i++) l[i] = roundf(l[i] * 4) / 4;
  const int ks[] = {1, 7, 256, 257, 600, 999};
  const float ps[] = {1.0f, 0.05f, 0.5f, 0.9f};
  for (int a = 0; a < 6; a++)
    for (int b = 0; b < 4; b++) {
      ct_sample_params p = params(0.7f);
      p.top_k = ks[a], p.top_p = ps[b];
      hf_probs(&p, l, V, NULL, 0, prob);
      grid_shares(&p, l, V, NULL, 0, N, share);
      check_shares(share, prob, V, N);
    }
}

// probabilities 0.40 0.25 0.15 0.10 0.06 0.04, scattered over the ids
static const int rank_id[6] = {4, 1, 5, 0, 3, 2};
static const double rank_p[6] = {0.40, 0.25, 0.15, 0.10, 0.06, 0.04};
static void known_logits(float *l) {
  for (int r = 0; r < 6; r++) l[rank_id[r]] = (float)log(rank_p[r]);
}

// Shares of the grid for params p must be softmax(log rank_p / T) over the top `keep`
// ranks, renormalized.
static void check_keeps_top_ranks(const ct_sample_params *p, int keep) {
  float l[6];
  known_logits(l);
  double want[6] = {0}, z = 0, prob[6], share[6];
  for (int r = 0; r < keep; r++) z += pow(rank_p[r], 1.0 / p->temperature);
  for (int r = 0; r < keep; r++) want[rank_id[r]] = pow(rank_p[r], 1.0 / p->temperature) / z;
  hf_probs(p, l, 6, NULL, 0, prob);
  for (int i = 0; i < 6; i++) CHECK_NEAR(prob[i], want[i], 1e-6);  // the reference agrees
  grid_shares(p, l, 6, NULL, 0, 50000, share);
  check_shares(share, want, 6, 50000);
}

static void test_top_p_keeps_exactly_the_transformers_set(void) {
  ct_sample_params p = params(1.0f);
  // ascending cumsum 0.04 0.10 0.20 0.35 0.60 1: with top_p 0.7 the three <= 0.3 go
  // (values chosen away from the boundaries 0.4 0.65 0.8 0.9 0.96)
  const float top_p[] = {0.7f, 0.3f, 0.45f, 0.62f, 0.85f, 0.93f, 0.999f, 0.01f};
  const int keep[] = {3, 1, 2, 2, 4, 5, 6, 1};
  for (int c = 0; c < 8; c++) {
    p.top_p = top_p[c];
    check_keeps_top_ranks(&p, keep[c]);
  }
  // random small rows against the literal reference, with temperature and -inf entries
  ct_rng r;
  ct_rng_seed(&r, 5);
  float l[40];
  double prob[40], share[40];
  for (int c = 0; c < 30; c++) {
    int V = 2 + (int)ct_rng_below(&r, 39);
    fill_normal(l, V, 2.0, 100 + c);
    if (c % 3 == 0) l[ct_rng_below(&r, V)] = -INFINITY;
    p.temperature = (float)(0.3 + ct_rng_uniform(&r));
    p.top_p = (float)(0.05 + 0.9 * ct_rng_uniform(&r));
    hf_probs(&p, l, V, NULL, 0, prob);
    grid_shares(&p, l, V, NULL, 0, 10000, share);
    check_shares(share, prob, V, 10000);
  }
}

static void test_min_p_keeps_exactly_tokens_at_least_min_p_times_the_top(void) {
  ct_sample_params p = params(1.0f);
  const float min_p[] = {0.3f, 0.2f, 0.5f, 0.05f, 0.61f, 0.99f};
  const int keep[] = {3, 4, 2, 6, 2, 1};  // thresholds 0.12 0.08 0.2 0.02 0.244 0.396
  for (int c = 0; c < 6; c++) {
    p.min_p = min_p[c];
    check_keeps_top_ranks(&p, keep[c]);
  }
}

static void test_filters_compose_in_transformers_order(void) {
  ct_sample_params p = params(1.0f);
  // top_k first, then top_p on the renormalized survivors: top 4 renormalized is
  // 0.444 0.278 0.167 0.111, so top_p 0.7 keeps 2 (3 without top_k)
  p.top_k = 4, p.top_p = 0.7f;
  check_keeps_top_ranks(&p, 2);
  // top_p before min_p: min_p 0.3 first would leave 0.5 0.31 0.19 and top_p 0.7 then
  // keeps 2; in transformers' order top_p keeps 3 and min_p (>= 0.12) keeps them
  p.top_k = 0, p.top_p = 0.7f, p.min_p = 0.3f;
  check_keeps_top_ranks(&p, 3);
  p.top_p = 0.85f, p.min_p = 0.2f;  // top_p keeps 4, min_p (>= 0.08) keeps 4
  check_keeps_top_ranks(&p, 4);
  p.top_p = 0.85f, p.min_p = 0.3f;  // top_p keeps 4, min_p (>= 0.12) keeps 3
  check_keeps_top_ranks(&p, 3);
  // temperature before the filters: at T = 0.5 the probabilities are rank_p² / Σ, so
  // 0.16 0.0625 0.0225 0.01 0.0036 0.0016 / 0.2602: prefix sums 0.61 0.85, so top_p 0.7
  // keeps 2
  p = params(0.5f);
  p.top_p = 0.7f;
  check_keeps_top_ranks(&p, 2);
}

static void test_repetition_penalty_changes_frequencies_as_transformers_formula(void) {
  enum { N = 200000 };
  ct_sample_params p = params(0.9f);
  p.repetition_penalty = 1.6f;
  int seen[5] = {3, 4, 3, 0, 3};  // positive (3, 0) divided, negative (4) multiplied, once each
  long counts[6], outside;
  double prob[6], want[6];
  draw_counts(&p, six, 6, seen, 5, 77, N, counts);
  hf_probs(&p, six, 6, seen, 5, prob);
  double m = -INFINITY, z = 0;
  for (int i = 0; i < 6; i++) {
    double s = six[i];
    if (i == 0 || i == 3) s /= 1.6;
    if (i == 4) s *= 1.6;
    want[i] = s / 0.9;
    m = fmax(m, want[i]);
  }
  for (int i = 0; i < 6; i++) z += want[i] = exp(want[i] - m);
  for (int i = 0; i < 6; i++) CHECK_NEAR(prob[i], want[i] / z, 1e-6);
  double x2 = chi_square(counts, prob, 6, N, &outside);
  fprintf(stderr, "    penalty: chi-square %.2f\n", x2);
  CHECK(outside == 0);
  CHECK(x2 < CHI2_5DOF_999);
  double unpenalized[6];
  ct_sample_params q = params(0.9f);
  hf_probs(&q, six, 6, NULL, 0, unpenalized);
  CHECK(chi_square(counts, unpenalized, 6, N, &outside) > 10 * CHI2_5DOF_999);
}

static void test_masked_tokens_are_never_sampled(void) {
  enum { V = 300 };
  float l[V];
  fill_normal(l, V, 1.0, 8);
  for (int i = 0; i < V; i++)
    if (i % 3) l[i] = -INFINITY;
  l[297] = 50;  // one token next to masked ones holds almost all the mass at T = 1
  double prob[V], share[V];
  const ct_sample_params cases[] = {{1.0f, 0, 1.0f, 0.0f, 1.0f},
                                    {30.0f, 0, 1.0f, 0.0f, 1.0f},
                                    {30.0f, 150, 0.999f, 0.0f, 1.0f},
                                    {30.0f, 0, 1.0f, 0.01f, 2.0f}};
  int seen[3] = {1, 2, 297};
  for (int c = 0; c < 4; c++) {
    hf_probs(&cases[c], l, V, seen, 3, prob);
    grid_shares(&cases[c], l, V, seen, 3, 20000, share);
    check_shares(share, prob, V, 20000);
    double masked = 0;
    for (int i = 0; i < V; i++)
      if (i % 3) masked += share[i];
    CHECK(masked == 0);
  }
}

// ---------------------------------------------------------------------------
// Streams and determinism

static void test_same_seed_and_index_give_the_same_tokens(void) {
  enum { V = 1000, N = 300 };
  static float l[V];
  fill_normal(l, V, 1.0, 21);
  ct_sample_params p = params(1.0f);
  p.top_p = 0.95f;
  ct_sampler_ws ws;
  CHECK_OK(ct_sampler_ws_init(&ws, V));
  int a[N], b[N], c[N], d[N];
  ct_rng r;
  ct_sample_rng(&r, 1234, 3);
  for (int i = 0; i < N; i++) a[i] = ct_sample_token(&p, l, V, NULL, 0, &r, &ws, NULL);
  ct_sample_rng(&r, 1234, 3);
  for (int i = 0; i < N; i++) b[i] = ct_sample_token(&p, l, V, NULL, 0, &r, &ws, NULL);
  ct_sample_rng(&r, 1234, 4);
  for (int i = 0; i < N; i++) c[i] = ct_sample_token(&p, l, V, NULL, 0, &r, &ws, NULL);
  ct_sample_rng(&r, 1235, 3);
  for (int i = 0; i < N; i++) d[i] = ct_sample_token(&p, l, V, NULL, 0, &r, &ws, NULL);
  int same_ab = 0, same_ac = 0, same_ad = 0;
  for (int i = 0; i < N; i++) same_ab += a[i] == b[i], same_ac += a[i] == c[i], same_ad += a[i] == d[i];
  CHECK(same_ab == N);
  // ~1/600 of positions agree by chance for this spread of probabilities
  CHECK(same_ac < 10);
  CHECK(same_ad < 10);
  ct_sampler_ws_free(&ws);
}

static void test_different_indices_give_independent_streams(void) {
  enum { N = 20000 };
  // the 4-word states differ, and the uniforms of neighbouring indices are uncorrelated
  ct_rng s[4];
  for (int k = 0; k < 4; k++) ct_sample_rng(&s[k], 42, k);
  for (int a = 0; a < 4; a++)
    for (int b = a + 1; b < 4; b++) CHECK(memcmp(&s[a], &s[b], sizeof s[a]) != 0);
  for (int k = 0; k < 3; k++) {
    ct_rng x, y;
    ct_sample_rng(&x, 42, k);
    ct_sample_rng(&y, 42, k + 1);
    double sxy = 0, sx = 0, sy = 0, sxx = 0, syy = 0;
    for (int i = 0; i < N; i++) {
      double u = ct_rng_uniform(&x), v = ct_rng_uniform(&y);
      sxy += u * v, sx += u, sy += v, sxx += u * u, syy += v * v;
    }
    double cov = sxy / N - sx / N * sy / N;
    double corr = cov / sqrt((sxx / N - sx / N * sx / N) * (syy / N - sy / N * sy / N));
    CHECK(fabs(corr) < 0.04);  // 5.6 standard errors at N = 20000
  }
  ct_rng x, y;  // the index is not just added to the seed
  ct_sample_rng(&x, 42, 1);
  ct_sample_rng(&y, 43, 0);
  CHECK(memcmp(&x, &y, sizeof x) != 0);
}

static void test_token_depends_only_on_logits_params_and_uniform(void) {
  enum { V = 500 };
  static float l[V], other[3 * V];
  fill_normal(l, V, 1.5, 31);
  fill_normal(other, 3 * V, 4.0, 32);
  const ct_sample_params p = {0.9f, 100, 0.9f, 0.01f, 1.2f};
  int seen[4] = {1, 2, 3, 4};
  ct_sampler_ws ws, big;
  CHECK_OK(ct_sampler_ws_init(&ws, V));
  CHECK_OK(ct_sampler_ws_init(&big, 3 * V));
  ct_rng r;
  ct_sample_rng(&r, 9, 0);
  int mismatches = 0, extra_draws = 0;
  for (int j = 0; j < 200; j++) {
    // (1) one uniform per call: the token from the stream equals the token for the
    // uniform that the stream yields next
    ct_rng copy = r;
    double u = ct_rng_uniform(&copy);
    float lp1, lp2, lp3;
    int t1 = ct_sample_token(&p, l, V, seen, 4, &r, &ws, &lp1);
    extra_draws += memcmp(&r, &copy, sizeof r) != 0;
    // (2) the same uniform after unrelated calls and in a larger workspace
    ct_sample_token_u(&p, other, V, NULL, 0, 0.5, &ws, NULL);
    int t2 = ct_sample_token_u(&p, l, V, seen, 4, u, &ws, &lp2);
    ct_sample_token_u(&p, other, 3 * V, NULL, 0, 0.25, &big, NULL);
    int t3 = ct_sample_token_u(&p, l, V, seen, 4, u, &big, &lp3);
    mismatches += t1 != t2 || t2 != t3 || lp1 != lp2 || lp2 != lp3;
  }
  CHECK(extra_draws == 0);
  CHECK(mismatches == 0);
  // the logits are read only
  float again[V];
  fill_normal(again, V, 1.5, 31);
  CHECK(memcmp(again, l, sizeof l) == 0);
  ct_sampler_ws_free(&ws);
  ct_sampler_ws_free(&big);
}

// ---------------------------------------------------------------------------
// Bad input

static void check_error_(int rc, const char *needle) {
  CHECK(rc == CT_EINVAL);
  CHECK(strstr(ct_last_error(), needle) != NULL);
  if (!strstr(ct_last_error(), needle))
    fprintf(stderr, "    message \"%s\" lacks \"%s\"\n", ct_last_error(), needle);
}

// `expr` fails with CT_EINVAL and a message holding `needle`. ct_last_error() is never
// cleared by the library, so it is cleared here first: a stale message from the call
// before cannot satisfy the check.
#define check_error(expr, needle) check_error_((ct_set_error(CT_OK, "%s", ""), (expr)), (needle))

static void test_nan_inf_and_all_masked_rows_are_rejected_with_a_message(void) {
  ct_sampler_ws ws;
  CHECK_OK(ct_sampler_ws_init(&ws, 6));
  float l[6] = {0.1f, 0.2f, 0.3f, NAN, 0.5f, 0.6f};
  const ct_sample_params greedy = params(0), hot = params(1.0f);
  ct_sample_params filt = params(1.0f);
  filt.top_k = 2, filt.top_p = 0.5f;
  ct_rng r, before;
  ct_sample_rng(&r, 1, 0);
  before = r;
  float lp = 123;
  check_error(ct_sample_token(&greedy, l, 6, NULL, 0, &r, &ws, &lp), "NaN");
  check_error(ct_sample_token(&hot, l, 6, NULL, 0, &r, &ws, &lp), "token 3 is NaN");
  check_error(ct_sample_token(&filt, l, 6, NULL, 0, &r, &ws, &lp), "NaN");
  l[3] = 0.4f, l[5] = INFINITY;
  check_error(ct_sample_token(&hot, l, 6, NULL, 0, &r, &ws, &lp), "+inf");
  for (int i = 0; i < 6; i++) l[i] = -INFINITY;
  check_error(ct_sample_token(&greedy, l, 6, NULL, 0, &r, &ws, &lp), "-inf");
  check_error(ct_sample_token(&hot, l, 6, NULL, 0, &r, &ws, &lp), "all 6 logits are -inf");
  // an overflow of logits / temperature is not reported as a masked row
  for (int i = 0; i < 6; i++) l[i] = 1e30f;
  ct_sample_params cold = params(1e-10f);
  check_error(ct_sample_token(&cold, l, 6, NULL, 0, &r, &ws, &lp), "overflow");
  CHECK(memcmp(&r, &before, sizeof r) == 0);  // no uniform drawn on error
  CHECK(lp == 123);
  // other misuse
  for (int i = 0; i < 6; i++) l[i] = (float)i;
  int bad_seen[2] = {1, 6};
  check_error(ct_sample_token(&hot, l, 6, bad_seen, 2, &r, &ws, &lp), "seen token id 6");
  check_error(ct_sample_token(&hot, l, 7, NULL, 0, &r, &ws, &lp), "workspace");
  check_error(ct_sample_token(&hot, l, 6, NULL, 0, NULL, &ws, &lp), "random stream");
  check_error(ct_sample_token_u(&hot, l, 6, NULL, 0, 1.0, &ws, &lp), "uniform");
  check_error(ct_sample_token_u(&hot, l, 6, NULL, 0, NAN, &ws, &lp), "uniform");
  ct_sample_params bad = params(1.0f);
  bad.top_p = 0;
  check_error(ct_sample_token(&bad, l, 6, NULL, 0, &r, &ws, &lp), "top_p");
  CHECK(memcmp(&r, &before, sizeof r) == 0);
  CHECK(ct_sample_token(&hot, l, 6, NULL, 0, &r, &ws, &lp) >= 0);  // and it still works
  ct_sampler_ws_free(&ws);
  ct_sampler_ws w0;
  check_error(ct_sampler_ws_init(&w0, 0), "vocabulary size");
}

static void test_params_check_names_the_bad_key(void) {
  const ct_sample_params good = {0.7f, 50, 0.9f, 0.05f, 1.1f};
  CHECK_OK(ct_sample_params_check(&good));
  const ct_sample_params edge = {0.0f, 0, 1.0f, 0.0f, 1.0f};
  CHECK_OK(ct_sample_params_check(&edge));
  struct {
    ct_sample_params p;
    const char *key;
  } bad[] = {
      {{-0.1f, 0, 1, 0, 1}, "temperature"},
      {{NAN, 0, 1, 0, 1}, "temperature"},
      {{INFINITY, 0, 1, 0, 1}, "temperature"},
      {{1, -1, 1, 0, 1}, "top_k"},
      {{1, 0, 0, 0, 1}, "top_p"},
      {{1, 0, 1.5f, 0, 1}, "top_p"},
      {{1, 0, NAN, 0, 1}, "top_p"},
      {{1, 0, 1, -0.1f, 1}, "min_p"},
      {{1, 0, 1, 1.0f, 1}, "min_p"},
      {{1, 0, 1, NAN, 1}, "min_p"},
      {{1, 0, 1, 0, 0}, "repetition_penalty"},
      {{1, 0, 1, 0, -2}, "repetition_penalty"},
      {{1, 0, 1, 0, NAN}, "repetition_penalty"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    check_error(ct_sample_params_check(&bad[i].p), bad[i].key);
}

// ---------------------------------------------------------------------------
// A real vocabulary

static void test_vocab_151936_matches_the_double_reference(void) {
  float *l = malloc(sizeof(float) * BIG_V);
  double *prob = malloc(sizeof(double) * BIG_V), *cdf = malloc(sizeof(double) * (BIG_V + 1));
  fill_normal(l, BIG_V, 2.5, 151936);
  for (int i = 0; i < BIG_V; i += 1001) l[i] = -INFINITY;  // masked ids
  l[777] = 14.0f;  // a clear favourite, as in a trained model
  static int seen[600];
  for (int j = 0; j < 600; j++) seen[j] = (j * 7919 + 13) % BIG_V;
  seen[0] = 777;
  const struct {
    ct_sample_params p;
    int n_seen;
  } cases[] = {
      {{1.0f, 0, 1.0f, 0.0f, 1.0f}, 0},      {{0.7f, 50, 1.0f, 0.0f, 1.0f}, 0},
      {{1.0f, 0, 0.9f, 0.0f, 1.0f}, 0},      {{1.3f, 2000, 0.95f, 0.001f, 1.0f}, 0},
      {{1.0f, 0, 1.0f, 0.05f, 1.0f}, 0},     {{0.8f, 0, 1.0f, 0.0f, 1.3f}, 600},
      {{1.0f, 1, 1.0f, 0.0f, 1.0f}, 0},      {{2.0f, 0, 0.5f, 0.0f, 1.2f}, 600},
      {{0.0f, 0, 1.0f, 0.0f, 1.3f}, 600},
  };
  ct_sampler_ws ws;
  CHECK_OK(ct_sampler_ws_init(&ws, BIG_V));
  ct_rng r;
  ct_rng_seed(&r, 17);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const ct_sample_params *p = &cases[c].p;
    int n_seen = cases[c].n_seen;
    double T = p->temperature > 0 ? p->temperature : 1.0;
    double lse = l[1] / T - log_softmax_ref(l, BIG_V, T, 1);  // l[1] is finite
    int best = 0;
    if (p->temperature > 0) {
      hf_probs(p, l, BIG_V, seen, n_seen, prob);
    } else {  // argmax of the penalized logits
      for (int i = 0; i < BIG_V; i++) prob[i] = l[i];
      for (int k = 0; k < n_seen; k++) prob[seen[k]] = pen_ref(l[seen[k]], p->repetition_penalty);
      for (int i = 0; i < BIG_V; i++)
        if (prob[i] > prob[best]) best = i;
    }
    ref_cdf(prob, BIG_V, cdf);
    // float probabilities move the interval edges by ~1e-7; each token's mass is ~1e-5
    // in the flat cases, so a few draws may land on a neighbour, never further
    int wrong = 0, outside = 0, neighbour = 0;
    double worst_lp = 0, worst_edge = 0;
    for (int j = 0; j < 20; j++) {
      double u = ct_rng_uniform(&r);
      float lp;
      int t = ct_sample_token_u(p, l, BIG_V, seen, n_seen, u, &ws, &lp);
      CHECK(t >= 0 && t < BIG_V);
      if (t < 0) break;
      worst_lp = fmax(worst_lp, fabs(lp - (l[t] / T - lse)));
      if (p->temperature == 0) {
        wrong += t != best;
        continue;
      }
      outside += prob[t] == 0;
      double edge = fmax(cdf[t] - u, u - cdf[t + 1]);  // > 0: u is outside t's interval
      neighbour += edge >= 0;
      worst_edge = fmax(worst_edge, edge);
      wrong += edge > 1e-6;
    }
    CHECK(wrong == 0 && outside == 0 && neighbour <= 3);
    CHECK_NEAR(worst_lp, 0, 5e-5);
    if (wrong || outside || neighbour)
      fprintf(stderr, "    case %zu: %d wrong, %d outside, %d neighbours (u off by %.2g)\n", c,
              wrong, outside, neighbour, worst_edge);
  }
  ct_sampler_ws_free(&ws);
  free(l);
  free(prob);
  free(cdf);
}

// Equal probabilities everywhere: top_p keeps the lowest ids (the worst case of the
// top-p selection: every token lands in the same bucket).
static void test_top_p_on_a_flat_vocab_keeps_the_lowest_ids(void) {
  float *l = malloc(sizeof(float) * BIG_V);
  for (int i = 0; i < BIG_V; i++) l[i] = 0.25f;
  ct_sampler_ws ws;
  CHECK_OK(ct_sampler_ws_init(&ws, BIG_V));
  ct_sample_params p = params(1.0f);
  p.top_p = 0.5f;
  float lp;
  // the kept prefix has mass >= 0.5 at BIG_V / 2 tokens: ids 0 .. BIG_V/2 - 1
  CHECK(ct_sample_token_u(&p, l, BIG_V, NULL, 0, 0.0, &ws, &lp) == 0);
  CHECK(ct_sample_token_u(&p, l, BIG_V, NULL, 0, 0.5, &ws, &lp) == BIG_V / 4);
  CHECK(ct_sample_token_u(&p, l, BIG_V, NULL, 0, 1 - 0x1p-53, &ws, &lp) == BIG_V / 2 - 1);
  CHECK_NEAR(lp, -log((double)BIG_V), 1e-5);
  p.top_p = 1.0f;
  CHECK(ct_sample_token_u(&p, l, BIG_V, NULL, 0, 1 - 0x1p-53, &ws, &lp) == BIG_V - 1);
  p.top_k = 10;  // all tie with the 10th: all stay (heap, then radix select)
  CHECK(ct_sample_token_u(&p, l, BIG_V, NULL, 0, 1 - 0x1p-53, &ws, &lp) == BIG_V - 1);
  p.top_k = 1000;
  CHECK(ct_sample_token_u(&p, l, BIG_V, NULL, 0, 1 - 0x1p-53, &ws, &lp) == BIG_V - 1);
  p.top_p = 0.25f;  // and top_p still cuts by id: a quarter of the vocabulary
  CHECK(ct_sample_token_u(&p, l, BIG_V, NULL, 0, 1 - 0x1p-53, &ws, &lp) == BIG_V / 4 - 1);
  ct_sampler_ws_free(&ws);
  free(l);
}

// ct_top_k_ids against a full sort by (score descending, id ascending): random scores
// with many ties (values on a coarse grid), every k from 1 to V.
static void test_top_k_ids_equal_a_full_sort_with_ties_broken_by_id(void) {
  enum { V = 300 };
  float s[V];
  int want[V], got[V];
  ct_rng r;
  ct_rng_seed(&r, 77);
  for (int i = 0; i < V; i++) s[i] = (float)(int)(ct_rng_uniform(&r) * 40) - 20;  // 40 values
  for (int i = 0; i < V; i++) want[i] = i;
  for (int i = 1; i < V; i++)  // insertion sort: descending score, then ascending id
    for (int j = i; j > 0 && (s[want[j]] > s[want[j - 1]] ||
                              (s[want[j]] == s[want[j - 1]] && want[j] < want[j - 1])); j--) {
      int t = want[j];
      want[j] = want[j - 1];
      want[j - 1] = t;
    }
  int bad = 0;
  for (int k = 1; k <= V; k++) {
    ct_top_k_ids(s, V, k, got);
    bad += memcmp(got, want, sizeof(int) * k) != 0;
  }
  CHECK(bad == 0);
}

int main(void) {
  RUN(test_greedy_picks_lowest_argmax_draws_nothing_logprob_is_log_softmax);
  RUN(test_greedy_argmax_flips_under_repetition_penalty);
  RUN(test_logprob_is_log_softmax_of_logits_over_T_whatever_the_filters);
  RUN(test_frequencies_match_softmax_at_temperature_1_chi_square);
  RUN(test_frequencies_match_softmax_of_logits_over_half_at_temperature_05);
  RUN(test_top_k_2_only_top_two_at_renormalized_frequencies);
  RUN(test_top_p_keeps_exactly_the_transformers_set);
  RUN(test_min_p_keeps_exactly_tokens_at_least_min_p_times_the_top);
  RUN(test_filters_compose_in_transformers_order);
  RUN(test_ties_follow_the_reference_in_every_selection_path);
  RUN(test_repetition_penalty_changes_frequencies_as_transformers_formula);
  RUN(test_masked_tokens_are_never_sampled);
  RUN(test_same_seed_and_index_give_the_same_tokens);
  RUN(test_different_indices_give_independent_streams);
  RUN(test_token_depends_only_on_logits_params_and_uniform);
  RUN(test_nan_inf_and_all_masked_rows_are_rejected_with_a_message);
  RUN(test_params_check_names_the_bad_key);
  RUN(test_vocab_151936_matches_the_double_reference);
  RUN(test_top_p_on_a_flat_vocab_keeps_the_lowest_ids);
  RUN(test_top_k_ids_equal_a_full_sort_with_ties_broken_by_id);
  return test_summary();
}
