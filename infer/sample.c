// sample: see sample.h. One call is a few passes over the V scores of a row:
//   1. scale and check: s = pen(logits) / T, M = max s; NaN, +inf, all -inf are errors
//   2. top_k: the k-th largest s; a min-heap for k <= 256 (most blocks of 16 cost one
//      vector compare), else a radix select on the float bits (O(V))
//   3. mass: e = exp(s - M) in place (the top token has e = 1), 0 where top_k drops it
//   4. top_p: the same radix select, weighted by e, finds the cut token (O(V))
//   5. mask (top_p cut, min_p), per-block sums, then the inverse-CDF walk for one uniform
// The reported log-prob is computed from logits / T alone: from the unmasked sum of
// step 3 when no penalty changed the scores, else from its own pass over the logits.
// At V = 151936 on a 2-core Xeon (AVX-512) a call takes about 0.15 ms at temperature 1,
// 0.2 ms greedy or with top_k 50, 0.4-0.7 ms with top_p, 1.3 ms at worst (top_p on an
// almost flat row, where the radix select cannot discard anything early).
#include "sample.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "fastmath.h"

#define BLOCK CT_SAMPLE_BLOCK

int ct_sampler_ws_init(ct_sampler_ws *ws, int V) {
  memset(ws, 0, sizeof *ws);
  if (V <= 0) return ct_set_error(CT_EINVAL, "sampler: vocabulary size must be > 0 (got %d)", V);
  ws->V = V;
  ws->prob = malloc(sizeof(float) * (size_t)V);
  ws->idx = malloc(sizeof(int) * (size_t)V);
  ws->blk = malloc(sizeof(double) * (size_t)(V / BLOCK + 1));
  if (!ws->prob || !ws->idx || !ws->blk) {
    ct_sampler_ws_free(ws);
    return ct_set_error(CT_ENOMEM, "sampler: out of memory for a workspace of %d tokens", V);
  }
  return 0;
}

void ct_sampler_ws_free(ct_sampler_ws *ws) {
  free(ws->prob);
  free(ws->idx);
  free(ws->blk);
  memset(ws, 0, sizeof *ws);
}

int ct_sample_params_check(const ct_sample_params *p) {
  // written as !(ok) so that NaN fails every test
  if (!(p->temperature >= 0 && p->temperature < INFINITY))
    return ct_set_error(CT_EINVAL, "sampling: temperature must be a finite number >= 0 (got %g)",
                        (double)p->temperature);
  if (p->top_k < 0)
    return ct_set_error(CT_EINVAL, "sampling: top_k must be >= 0, 0 = off (got %d)", p->top_k);
  if (!(p->top_p > 0 && p->top_p <= 1))
    return ct_set_error(CT_EINVAL, "sampling: top_p must be in (0, 1], 1 = off (got %g)",
                        (double)p->top_p);
  if (!(p->min_p >= 0 && p->min_p < 1))
    return ct_set_error(CT_EINVAL, "sampling: min_p must be in [0, 1), 0 = off (got %g)",
                        (double)p->min_p);
  if (!(p->repetition_penalty > 0 && p->repetition_penalty < INFINITY))
    return ct_set_error(CT_EINVAL,
                        "sampling: repetition_penalty must be a finite number > 0, 1 = off (got %g)",
                        (double)p->repetition_penalty);
  return 0;
}

void ct_sample_rng(ct_rng *rng, uint64_t seed, int sample_index) {
  // mix(mix(seed) ^ index): a bijection of the index for a given seed, and no simple
  // relation between the states of neighbouring seeds or indices
  uint64_t x = seed;
  uint64_t y = ct_splitmix64(&x) ^ (uint64_t)(int64_t)sample_index;
  ct_rng_seed(rng, ct_splitmix64(&y));
}

// ---------------------------------------------------------------------------
// Passes over a row

// The error for a row whose scaled maximum is not finite or that holds a NaN.
static int bad_row(const float *l, int V, float T, float rp) {
  for (int i = 0; i < V; i++)
    if (isnan(l[i]))
      return ct_set_error(CT_EINVAL, "sampler: logit of token %d is NaN (of %d); the forward "
                          "pass produced garbage", i, V);
  for (int i = 0; i < V; i++)
    if (l[i] == INFINITY)
      return ct_set_error(CT_EINVAL, "sampler: logit of token %d is +inf (of %d)", i, V);
  int any = 0;
  for (int i = 0; i < V; i++) any |= l[i] > -INFINITY;
  if (!any)
    return ct_set_error(CT_EINVAL, "sampler: all %d logits are -inf: every token is masked", V);
  return ct_set_error(CT_EINVAL, "sampler: logits / temperature overflow float (temperature %g, "
                      "repetition_penalty %g); use temperature=0 for greedy decoding",
                      (double)T, (double)rp);
}

// A max reduction under `omp simd` starts each lane at the lowest finite float (the
// OpenMP identity; clang takes it literally), so a row of -inf reports -FLT_MAX: rescan.
static float exact_max(float m, const float *x, int n) {
  if (m > -FLT_MAX) return m;
  m = -INFINITY;
  for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
  return m;
}

// s (V) = l / T; returns max s, and the number of NaN logits in *nan.
static float scale_row(const float *l, int V, float T, float *s, int *nan) {
  float m = -INFINITY;
  int n = 0;
  if (T == 1.0f) {  // x / 1 is x: no division (a fifth of a sampling step's time at V 151,936)
#pragma omp simd reduction(max : m) reduction(+ : n)
    for (int i = 0; i < V; i++) {
      float a = l[i];
      s[i] = a;
      n += a != a;
      m = a > m ? a : m;
    }
    *nan = n;
    return exact_max(m, s, V);
  }
#pragma omp simd reduction(max : m) reduction(+ : n)
  for (int i = 0; i < V; i++) {
    float a = l[i] / T;
    s[i] = a;
    n += l[i] != l[i];
    m = a > m ? a : m;
  }
  *nan = n;
  return exact_max(m, s, V);
}

static float max_row(const float *s, int V) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int i = 0; i < V; i++) m = s[i] > m ? s[i] : m;
  return exact_max(m, s, V);
}

// max_i l_i / T
static float max_scaled(const float *l, int V, float T) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int i = 0; i < V; i++) {
    float a = l[i] / T;
    m = a > m ? a : m;
  }
  if (m > -FLT_MAX) return m;
  m = -INFINITY;  // see exact_max
  for (int i = 0; i < V; i++) m = l[i] / T > m ? l[i] / T : m;
  return m;
}

// log Σ_i exp(l_i / T), given m = max_i l_i / T: the log-partition of softmax(logits / T).
// Blocks are summed in float (vector lanes), the blocks in double, as in mass_row.
static double log_partition(const float *l, int V, float T, float m) {
  double z = 0;
  for (int b0 = 0; b0 < V; b0 += BLOCK) {
    int n = V - b0 < BLOCK ? V - b0 : BLOCK;
    const float *x = l + b0;
    float zb = 0;
#pragma omp simd reduction(+ : zb)
    for (int j = 0; j < n; j++) zb += ct_expf(x[j] / T - m);
    z += zb;
  }
  return m + log(z);
}

// In place: s (V) -> e = exp(s - M) where s >= s_min and e >= e_min, else 0.
// blk[b] = Σ e over block b; returns Σ e, and Σ exp(s - M) before masking in *all.
static double mass_row(float *s, int V, float M, float s_min, float e_min, double *blk,
                       double *all) {
  double total = 0, total_all = 0;
  for (int b0 = 0; b0 < V; b0 += BLOCK) {
    int n = V - b0 < BLOCK ? V - b0 : BLOCK;
    float *x = s + b0;
    float z = 0, za = 0;
#pragma omp simd reduction(+ : z, za)
    for (int j = 0; j < n; j++) {
      float e = ct_expf(x[j] - M);
      za += e;
      e = x[j] >= s_min && e >= e_min ? e : 0.0f;
      x[j] = e;
      z += e;
    }
    blk[b0 / BLOCK] = z;
    total += z;
    total_all += za;
  }
  *all = total_all;
  return total;
}

// In place on e (V): keeps tokens before the top-p cut (e > e_cut, or e == e_cut and
// id <= id_cut) whose e >= e_min; blk and the return value as in mass_row.
static double mask_row(float *e, int V, float e_cut, int id_cut, float e_min, double *blk) {
  double total = 0;
  for (int b0 = 0; b0 < V; b0 += BLOCK) {
    int n = V - b0 < BLOCK ? V - b0 : BLOCK;
    float *x = e + b0;
    float z = 0;
#pragma omp simd reduction(+ : z)
    for (int j = 0; j < n; j++) {
      float v = x[j];
      int before = v > e_cut || (v == e_cut && b0 + j <= id_cut);
      v = before && v >= e_min ? v : 0.0f;
      x[j] = v;
      z += v;
    }
    blk[b0 / BLOCK] = z;
    total += z;
  }
  return total;
}

// a ranks below b: a lower score, or an equal score and a higher id
static inline bool below(const float *s, int a, int b) { return s[a] < s[b] || (s[a] == s[b] && a > b); }

// Restores the heap property below h[i] of a min-heap of token ids ordered by `below`
// (so among equal scores the highest id is evicted first).
static void sift_down(int *h, int k, const float *s, int i) {
  for (;;) {
    int c = 2 * i + 1;
    if (c >= k) return;
    if (c + 1 < k && below(s, h[c + 1], h[c])) c++;
    if (!below(s, h[c], h[i])) return;
    int t = h[c];
    h[c] = h[i];
    h[i] = t;
    i = c;
  }
}

// The k-th largest of s (V), 0 < k < V, equal values counted separately: a min-heap of
// the k largest so far (h (k) scratch). Blocks of 16 whose maximum does not beat the
// heap's minimum, nearly all of them once the heap holds large values, cost one vector
// compare. O(V log k); for small k.
static float kth_largest_heap(const float *s, int V, int k, int *h) {
  for (int i = 0; i < k; i++) h[i] = i;
  for (int i = k / 2 - 1; i >= 0; i--) sift_down(h, k, s, i);
  float lo = s[h[0]];
  for (int b0 = k; b0 < V; b0 += 16) {
    int n = V - b0 < 16 ? V - b0 : 16;
    float bm = -INFINITY;
    for (int j = 0; j < n; j++) bm = s[b0 + j] > bm ? s[b0 + j] : bm;
    if (!(bm > lo)) continue;
    for (int i = b0; i < b0 + n; i++)
      if (s[i] > lo) {
        h[0] = i;
        sift_down(h, k, s, 0);
        lo = s[h[0]];
      }
  }
  return lo;
}

static int by_score_desc(const void *a, const void *b, void *ctx) {
  const float *s = ctx;
  int i = *(const int *)a, j = *(const int *)b;
  return s[i] > s[j] ? -1 : s[i] < s[j] ? 1 : (i > j) - (i < j);
}

void ct_top_k_ids(const float *s, int V, int k, int *h) {
  if (k < V) {
    kth_largest_heap(s, V, k, h);
  } else {
    for (int i = 0; i < V; i++) h[i] = i;
    k = V;
  }
  qsort_r(h, (size_t)k, sizeof(int), by_score_desc, (void *)s);
}

// An unsigned key that orders like the float (no NaN here): flip all bits of negatives,
// the sign bit of the rest.
static inline uint32_t order_key(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return b & 0x80000000u ? ~b : b | 0x80000000u;
}

// The bucket of hist[lo..hi] (walked from hi down) where the running weight, starting at
// *before, reaches need; *before += the buckets above it. When rounding keeps the total
// short of need, the last bucket with weight.
static uint32_t crossing_bucket(const double *hist, uint32_t lo, uint32_t hi, double need,
                                double *before) {
  uint32_t last = hi;
  for (uint32_t d = hi + 1; d-- > lo;) {
    if (hist[d] == 0) continue;
    if (*before + hist[d] >= need) return d;
    *before += hist[d];
    last = d;
  }
  *before -= hist[last];
  return last;
}

// hist[digit] += weight over the n tokens cand[0..n) (cand == NULL: tokens 0..n), with
// digit = (order_key(x) >> sh) & mk and weight = x when `mass`, else 1. The weights are
// converted to double in a vector loop first: converting inside the scatter loop makes
// GCC chain every iteration through one register (vcvtss2sd merges into its target).
// Chunks without mass are skipped (after top_k nearly all of them are).
static void histogram(const float *x, const int *cand, int n, int sh, uint32_t mk, bool mass,
                      double *hist) {
  enum { CH = 64 };
  float v[CH];
  double w[CH];
  uint32_t dg[CH];
  for (int j0 = 0; j0 < n; j0 += CH) {
    int m = n - j0 < CH ? n - j0 : CH;
    if (cand)
      for (int j = 0; j < m; j++) v[j] = x[cand[j0 + j]];
    else
      for (int j = 0; j < m; j++) v[j] = x[j0 + j];
    if (mass) {
      float top = 0;
#pragma omp simd reduction(max : top)
      for (int j = 0; j < m; j++) top = v[j] > top ? v[j] : top;
      if (top == 0) continue;
      for (int j = 0; j < m; j++) w[j] = v[j];
    } else {
      for (int j = 0; j < m; j++) w[j] = 1.0;
    }
    for (int j = 0; j < m; j++) dg[j] = (order_key(v[j]) >> sh) & mk;
    for (int j = 0; j < m; j++) hist[dg[j]] += w[j];
  }
}

// Walks the tokens of x (V) in order of descending x, then ascending id, adding up a
// weight per token (x itself when `mass`, else 1) and returns the first token at which
// the running sum reaches `need` (the last token with weight if rounding keeps the sum
// below need). Radix select on order_key(x), three digits (11, 11, 10 bits): each level
// histograms the weight of the remaining candidates, keeps only the bucket where the
// running sum crosses need, and adds the buckets above it to the sum; after the last
// level the candidates share one value and are walked in id order. O(V): the first
// level reads the row directly, the others only its candidates. cand (V) and hist
// (2048) scratch.
static int select_prefix(const float *x, int V, bool mass, double need, int *cand,
                         double *hist) {
  double before = 0;  // weight of the tokens known to come before every candidate
  int n = 0;
  uint32_t lo = 2047, hi = 0;
#pragma omp simd reduction(min : lo) reduction(max : hi)
  for (int i = 0; i < V; i++) {
    uint32_t d = order_key(x[i]) >> 21;
    lo = d < lo ? d : lo;
    hi = d > hi ? d : hi;
  }
  if (lo == hi) {  // one bucket (a flat row): nothing to split at this level
    for (int i = 0; i < V; i++) cand[i] = i;
    n = V;
  } else {
    memset(hist + lo, 0, sizeof(double) * (hi - lo + 1));
    histogram(x, NULL, V, 21, 2047, mass, hist);
    uint32_t d = crossing_bucket(hist, lo, hi, need, &before);
    for (int b0 = 0; b0 < V; b0 += 64) {  // compaction; a block without d costs a vector test
      int m = V - b0 < 64 ? V - b0 : 64, hit = 0;
      for (int j = 0; j < m; j++) hit |= order_key(x[b0 + j]) >> 21 == d;
      if (!hit) continue;
      for (int i = b0; i < b0 + m; i++) {
        cand[n] = i;
        n += order_key(x[i]) >> 21 == d;
      }
    }
  }
  static const int shift[2] = {10, 0};
  static const uint32_t digits[2] = {2047, 1023};
  for (int lv = 0; lv < 2 && n > 1; lv++) {
    int sh = shift[lv];
    uint32_t mk = digits[lv];
    lo = mk, hi = 0;
    for (int j = 0; j < n; j++) {
      uint32_t d = (order_key(x[cand[j]]) >> sh) & mk;
      lo = d < lo ? d : lo;
      hi = d > hi ? d : hi;
    }
    if (lo == hi) continue;
    memset(hist + lo, 0, sizeof(double) * (hi - lo + 1));
    histogram(x, cand, n, sh, mk, mass, hist);
    uint32_t d = crossing_bucket(hist, lo, hi, need, &before);
    int m = 0;
    for (int j = 0; j < n; j++) {
      int i = cand[j];
      cand[m] = i;
      m += ((order_key(x[i]) >> sh) & mk) == d;
    }
    n = m;
  }
  for (int j = 0; j < n; j++) {  // equal values, ascending id
    before += mass ? (double)x[cand[j]] : 1.0;
    if (before >= need) return cand[j];
  }
  return cand[n - 1];
}

// Inverse CDF in ascending id: the first token whose cumulative mass exceeds u·total.
static int draw(const float *e, int V, const double *blk, double total, double u) {
  double target = u * total, cum = 0;
  for (int b0 = 0; b0 < V; b0 += BLOCK) {
    double z = blk[b0 / BLOCK];
    if (cum + z <= target) {
      cum += z;
      continue;
    }
    int end = V - b0 < BLOCK ? V : b0 + BLOCK, last = -1;
    for (int i = b0; i < end; i++)
      if (e[i] > 0) {
        last = i;
        cum += e[i];
        if (cum > target) return i;
      }
    if (last >= 0) return last;  // the block sum and this walk differ in the last bit
  }
  for (int i = V - 1; i >= 0; i--)  // u·total rounded up to total
    if (e[i] > 0) return i;
  return -1;  // unreachable: the top token always keeps its mass
}

// ---------------------------------------------------------------------------
// The entry points

// use_rng: draw u from rng once every check has passed; else u is given.
static int sample(const ct_sample_params *p, const float *logits, int V, const int *seen,
                  int n_seen, bool use_rng, ct_rng *rng, double u, ct_sampler_ws *ws,
                  float *logprob) {
  if (!p || !logits) return ct_set_error(CT_EINVAL, "sampler: no parameters or no logits");
  int rc = ct_sample_params_check(p);
  if (rc) return rc;
  if (!ws || V <= 0 || V > ws->V)
    return ct_set_error(CT_EINVAL, "sampler: %d logits do not fit the workspace of %d tokens", V,
                        ws ? ws->V : 0);
  if (n_seen < 0 || (n_seen > 0 && !seen))
    return ct_set_error(CT_EINVAL, "sampler: bad seen-token list (%d ids)", n_seen);
  for (int j = 0; j < n_seen; j++)
    if (seen[j] < 0 || seen[j] >= V)
      return ct_set_error(CT_EINVAL, "sampler: seen token id %d (position %d) is outside the "
                          "vocabulary [0, %d)", seen[j], j, V);
  bool greedy = p->temperature == 0;
  float T = greedy ? 1.0f : p->temperature, rp = p->repetition_penalty;
  if (!greedy && use_rng && !rng)
    return ct_set_error(CT_EINVAL, "sampler: temperature %g needs a random stream", (double)T);
  if (!greedy && !use_rng && !(u >= 0 && u < 1))
    return ct_set_error(CT_EINVAL, "sampler: the uniform must be in [0, 1) (got %g)", u);

  // s (V) = pen(logits) / T: HF's CTRL penalty, once per distinct seen id (it reads the
  // raw logit, so duplicates cannot compound)
  float *s = ws->prob;
  int nan;
  float M = scale_row(logits, V, T, s, &nan);
  bool pen = rp != 1 && n_seen > 0;
  if (pen) {
    for (int j = 0; j < n_seen; j++) {
      float l = logits[seen[j]];
      s[seen[j]] = (l > 0 ? l / rp : l * rp) / T;
    }
    M = max_row(s, V);
  }
  if (nan || !(M > -INFINITY && M < INFINITY)) return bad_row(logits, V, T, rp);

  double lse = NAN;  // log Σ exp(logits / T), for the reported log-prob
  int tok;
  if (greedy) {
    for (tok = 0; s[tok] != M; tok++) continue;  // the first maximum
  } else {
    int k = p->top_k > 0 && p->top_k < V ? p->top_k : 0;
    bool top_p = p->top_p < 1;
    double hist[2048], all;
    // top_k: the k-th largest score; every token scoring at least that stays
    float s_min = -INFINITY;
    if (k > 0 && k <= 256) s_min = kth_largest_heap(s, V, k, ws->idx);
    if (k > 256) s_min = s[select_prefix(s, V, false, k, ws->idx, hist)];
    // min_p must wait for top_p (HF order); without top_p it folds into this pass
    double total = mass_row(s, V, M, s_min, top_p ? 0.0f : p->min_p, ws->blk, &all);
    if (!pen) lse = M + log(all);  // s was logits / T: the same sum
    if (top_p) {
      // top_p: the shortest prefix (descending e, then ascending id) whose mass reaches
      // top_p x total stays; transformers drops, in ascending order, the tokens whose
      // cumulative probability is <= 1 - top_p, which is the same set
      int cut = select_prefix(s, V, true, (double)p->top_p * total, ws->idx, hist);
      total = mask_row(s, V, s[cut], cut, p->min_p, ws->blk);
    }
    if (use_rng) u = ct_rng_uniform(rng);
    tok = draw(s, V, ws->blk, total, u);
  }
  if (logprob) {
    if (lse != lse) {
      float m = pen ? max_scaled(logits, V, T) : M;
      lse = log_partition(logits, V, T, m);
    }
    *logprob = (float)((double)(logits[tok] / T) - lse);
  }
  return tok;
}

int ct_sample_token(const ct_sample_params *p, const float *logits, int V, const int *seen,
                    int n_seen, ct_rng *rng, ct_sampler_ws *ws, float *logprob) {
  return sample(p, logits, V, seen, n_seen, true, rng, 0, ws, logprob);
}

int ct_sample_token_u(const ct_sample_params *p, const float *logits, int V, const int *seen,
                      int n_seen, double u, ct_sampler_ws *ws, float *logprob) {
  return sample(p, logits, V, seen, n_seen, false, NULL, u, ws, logprob);
}
