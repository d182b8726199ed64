// attention: causal GQA forward and backward in 64-query blocks that skip the masked
// triangle; the forward keeps only each row's log-sum-exp and the backward recomputes
// the probabilities (O(T) memory per head). The engine (infer/engine.c) has its own
// KV-cache attention for decoding.
#include "attention.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "fastmath.h"
#include "kernels.h"
#include "matmul.h"
#include "pool.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

// Queries are processed in blocks of QB rows; a block only needs the keys up to its last
// row, so the causal mask wastes at most half of one QB x QB tile per block.
#define QB 64

// The backward groups query blocks by their start into chunks of QCHUNK queries. A row of
// one chunk accumulates dK and dV in place; a longer row sums each chunk's share into a
// partial (T, 2·hd) of its own and adds the partials in chunk order. So the same bits come
// out whether a row's chunks run one after another in one task or side by side in several,
// which lets a batch of few rows (GRPO's completions behind one shared prompt: one row of
// 2,000+ tokens) use every thread.
#define QCHUNK 512

// Per thread: P, dP (and the softcap's tanh) for a block of QB rows, D (QB), a partial (T, 2·hd).
long ct_attention_scratch_floats(int T, int hd, bool softcap) {
  return (softcap ? 3L : 2L) * QB * T + QB + 2L * hd * T;
}

typedef struct {
  float *out, *lse, *dqkv, *scratch, *head_max;
  const float *qkv, *dout, *cout, *clse;
  const int *seg;
  ct_attn_dims d;
  long scratch_per_thread;
} attn_job;

// *p = max(*p, v) atomically: the tasks of one head (the batch's other rows) share *p.
static void max_into(float *p, float v) {
  uint32_t *u = (uint32_t *)(void *)p, old = __atomic_load_n(u, __ATOMIC_RELAXED), nv;
  memcpy(&nv, &v, 4);
  for (float cur;; ) {
    memcpy(&cur, &old, 4);
    if (!(v > cur) || __atomic_compare_exchange_n(u, &old, nv, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return;
  }
}

// The first key query t may see: its document start, or the window's start when later.
static inline int key_lo(const int *seg_b, int t, int window) {
  int w0 = window > 0 ? t - window + 1 : 0;
  return seg_b[t] > w0 ? seg_b[t] : w0;
}

// The end of the query block from q0: QB rows, cut where a document of 2+ tokens starts, so
// that no block spans two documents (it would compute the earlier one's keys for the later
// one's rows, all masked: packed rows, and GRPO's completions behind a shared prompt).
static int block_end(const int *seg_b, int q0, int T) {
  int q1 = q0 + QB < T ? q0 + QB : T;
  for (int t = q0 + 1; t < q1; t++)
    if (seg_b[t] == t && t + 1 < T && seg_b[t + 1] == t) return t;
  return q1;
}

// Rows [q0, q1) of sequence b: first key index any of them may see (key_lo grows with t).
static int block_kstart(const int *seg_b, int q0, int window) { return key_lo(seg_b, q0, window); }

static float attn_scale(const ct_attn_dims *d) { return d->scale > 0 ? d->scale : 1.0f / sqrtf((float)d->hd); }

// A query block's keys: the prefix piece [0, np) (shared prompts: attn_dims.pre) and the
// own piece [k0, q1), side by side in the block's score rows (np + nk columns).
typedef struct {
  int k0, nk, np;
} key_pieces;

static key_pieces block_keys(const ct_attn_dims *d, const int *seg_b, const int *pre_b, int q0, int q1) {
  key_pieces k = {block_kstart(seg_b, q0, d->window), 0, 0};
  k.nk = q1 - k.k0;
  int pb = 0;
  for (int t = q0; pre_b && t < q1; t++) pb = pre_b[t] > pb ? pre_b[t] : pb;
  k.np = pb < k.k0 ? pb : k.k0;  // prefix keys at or past k0 are in the own piece already
  return k;
}

// The score columns query t sees, as up to three [c0, c1) spans in column order: its
// prefix keys [plo, pre) in the prefix piece, those of them inside the own piece, and its
// own keys [key_lo, t]. A prefix key j is (t − seg) + pre − j positions before t.
static int row_spans(const ct_attn_dims *d, const int *seg_b, const int *pre_b, int t, key_pieces k, int sp[3][2]) {
  int n = 0, pe = pre_b ? pre_b[t] : 0;
  if (pe > 0) {
    int plo = d->window > 0 ? t - seg_b[t] + pe - d->window + 1 : 0;
    plo = plo > 0 ? plo : 0;
    int a1 = pe < k.np ? pe : k.np;
    if (plo < a1) sp[n][0] = plo, sp[n][1] = a1, n++;
    int b0 = plo > k.np ? plo : k.np;  // prefix keys in the own piece (then np == k0)
    if (b0 < pe) sp[n][0] = k.np + b0 - k.k0, sp[n][1] = k.np + pe - k.k0, n++;
  }
  sp[n][0] = k.np + key_lo(seg_b, t, d->window) - k.k0;
  sp[n][1] = k.np + t - k.k0 + 1;
  return n + 1;
}

// S (nq, np + nk) = scale · Q[q0:q1] · [K[0:np]; K[k0:q1]]ᵀ: Q's rows ldq apart, K's ld
static void block_scores(const float *Q, int ldq, const float *K, int ld, int q0, int nq, key_pieces k, int hd,
                         float scale, float *S) {
  int W = k.np + k.nk;
  if (k.np) ct_sgemm_serial('N', 'T', nq, k.np, hd, scale, Q + (long)q0 * ldq, ldq, K, ld, 0.0f, S, W);
  ct_sgemm_serial('N', 'T', nq, k.nk, hd, scale, Q + (long)q0 * ldq, ldq, K + (long)k.k0 * ld, ld, 0.0f, S + k.np, W);
}

// O (nq, hd; row stride ldo) = P_prefix · V[0:np] + P_own · V[k0:q1]   (beta 0), or += (beta 1)
static void block_times(const float *P, int nq, key_pieces k, const float *V, int ld, int hd, float beta, float *O,
                        int ldo) {
  int W = k.np + k.nk;
  if (k.np) {
    ct_sgemm_serial('N', 'N', nq, hd, k.np, 1.0f, P, W, V, ld, beta, O, ldo);
    beta = 1.0f;
  }
  ct_sgemm_serial('N', 'N', nq, hd, k.nk, 1.0f, P + k.np, W, V + (long)k.k0 * ld, ld, beta, O, ldo);
}

// dX[0:np] += P_prefixᵀ · G, dX[k0:q1] += P_ownᵀ · G: G (nq, hd; row stride ldg)
static void block_times_t(const float *P, int nq, key_pieces k, const float *G, int ldg, int hd, float *dX, int ld) {
  int W = k.np + k.nk;
  if (k.np) ct_sgemm_serial('T', 'N', k.np, hd, nq, 1.0f, P, W, G, ldg, 1.0f, dX, ld);
  ct_sgemm_serial('T', 'N', k.nk, hd, nq, 1.0f, P + k.np, W, G, ldg, 1.0f, dX + (long)k.k0 * ld, ld);
}

// The largest of s[lo, hi) and m (NaNs passed over). The max of any order is the same
// value, so 16 lanes at a time give the one-by-one scan's result (which, a chain of
// dependent compares, was half of the forward's own time).
static float max_into_span(const float *s, int lo, int hi, float m) {
  int k = lo;
#if defined(__AVX512F__)
  if (hi - lo >= 16) {
    __m512 v = _mm512_set1_ps(m);
    for (; k + 16 <= hi; k += 16) v = _mm512_max_ps(_mm512_loadu_ps(s + k), v);  // (NaN: keeps v's lane)
    m = _mm512_reduce_max_ps(v);
  }
#endif
  for (; k < hi; k++) m = s[k] > m ? s[k] : m;
  return m;
}

// Scores s (n) become c·tanh(s/c); th (n, or NULL) keeps tanh for the backward.
static void softcap_row(float *s, float *th, int n, float c) {
  float ic = 1.0f / c;
#pragma omp simd
  for (int k = 0; k < n; k++) {
    float t = ct_tanhf(s[k] * ic);
    if (th) th[k] = t;
    s[k] = c * t;
  }
}

static void attn_fwd_task(void *ctx, int task, int thread) {
  const attn_job *j = ctx;
  const ct_attn_dims d = j->d;
  int b = task / d.H, h = task % d.H, g = h / (d.H / d.KV);
  int ld = (d.H + 2 * d.KV) * d.hd, ldo = d.H * d.hd;
  float scale = attn_scale(&d);
  const float *base = j->qkv + (long)b * d.T * ld;
  const float *Q = base + h * d.hd, *K = base + (d.H + g) * d.hd, *V = base + (d.H + d.KV + g) * d.hd;
  float *O = j->out + (long)b * d.T * ldo + h * d.hd;
  float *L = j->lse + (long)b * d.T * d.H + h;
  const int *seg = j->seg + (long)b * d.T, *pre = d.pre ? d.pre + (long)b * d.T : NULL;
  float *S = j->scratch + thread * j->scratch_per_thread;  // (QB, T)
  float hmax = -INFINITY;  // this row's largest logit for head h
  for (int q0 = 0, q1; q0 < d.T; q0 = q1) {
    q1 = block_end(seg, q0, d.T);
    int nq = q1 - q0;
    key_pieces kp = block_keys(&d, seg, pre, q0, q1);
    int W = kp.np + kp.nk;
    block_scores(Q, ld, K, ld, q0, nq, kp, d.hd, scale, S);  // S (nq, W)
    for (int r = 0; r < nq; r++) {
      int t = q0 + r, sp[3][2], ns = row_spans(&d, seg, pre, t, kp, sp);  // valid columns
      float *s = S + (long)r * W;
      float mx = -INFINITY;
      for (int i = 0; i < ns; i++) {
        if (d.softcap > 0) softcap_row(s + sp[i][0], NULL, sp[i][1] - sp[i][0], d.softcap);
        mx = max_into_span(s, sp[i][0], sp[i][1], mx);
      }
      hmax = mx > hmax ? mx : hmax;
      float sum = 0;
      int prev = 0;
      for (int i = 0; i < ns; i++) {
        if (sp[i][0] > prev) memset(s + prev, 0, sizeof(float) * (size_t)(sp[i][0] - prev));
#pragma omp simd reduction(+ : sum)
        for (int k = sp[i][0]; k < sp[i][1]; k++) {
          s[k] = ct_expf(s[k] - mx);
          sum += s[k];
        }
        prev = sp[i][1];
      }
      if (W > prev) memset(s + prev, 0, sizeof(float) * (size_t)(W - prev));
      float inv = 1.0f / sum;
      for (int i = 0; i < ns; i++) {
#pragma omp simd
        for (int k = sp[i][0]; k < sp[i][1]; k++) s[k] *= inv;
      }
      L[(long)t * d.H] = mx + logf(sum);
    }
    block_times(S, nq, kp, V, ld, d.hd, 0.0f, O + (long)q0 * ldo, ldo);  // O[q0:q1] (nq, hd) = P · V
  }
  if (j->head_max) max_into(j->head_max + h, hmax);
}

void ct_attention_forward(float *out, float *lse, const float *qkv, const int *seg,
                          ct_attn_dims d, float *scratch, float *head_max) {
  attn_job j = {.out = out, .lse = lse, .qkv = qkv, .seg = seg, .d = d, .scratch = scratch,
                .head_max = head_max, .scratch_per_thread = ct_attention_scratch_floats(d.T, d.hd, d.softcap > 0)};
  ct_parallel_for(d.B * d.H, attn_fwd_task, &j);
}

// Query blocks starting in [c0, c1) of sequence b, every head of kv group g: dQ of those
// blocks written (=), their share of dK and dV (T rows, row stride ldk) added. P's scratch:
// the thread's.
static void bwd_blocks(const attn_job *j, int b, int g, int c0, int c1, float *dK, float *dV, int ldk, int thread) {
  const ct_attn_dims d = j->d;
  int rep = d.H / d.KV;
  int ld = (d.H + 2 * d.KV) * d.hd, ldo = d.H * d.hd;
  float scale = attn_scale(&d);
  const float *base = j->qkv + (long)b * d.T * ld;
  float *dbase = j->dqkv + (long)b * d.T * ld;
  const float *K = base + (d.H + g) * d.hd, *V = base + (d.H + d.KV + g) * d.hd;
  const int *seg = j->seg + (long)b * d.T, *pre = d.pre ? d.pre + (long)b * d.T : NULL;
  float *P = j->scratch + thread * j->scratch_per_thread;  // (QB, T)
  float *dP = P + (long)QB * d.T;                          // (QB, T)
  float *TH = d.softcap > 0 ? dP + (long)QB * d.T : NULL;  // (QB, T) tanh of capped scores
  float *D = (TH ? TH : dP) + (long)QB * d.T;               // (QB)
  int first = 0;  // the first block starting at or after c0 (blocks are cut from 0 on)
  while (first < c0) first = block_end(seg, first, d.T);
  for (int h = g * rep; h < (g + 1) * rep; h++) {
    const float *Q = base + h * d.hd;
    float *dQ = dbase + h * d.hd;
    const float *O = j->cout + (long)b * d.T * ldo + h * d.hd;
    const float *dO = j->dout + (long)b * d.T * ldo + h * d.hd;
    const float *L = j->clse + (long)b * d.T * d.H + h;
    for (int q0 = first, q1; q0 < c1 && q0 < d.T; q0 = q1) {
      q1 = block_end(seg, q0, d.T);
      int nq = q1 - q0;
      key_pieces kp = block_keys(&d, seg, pre, q0, q1);
      int W = kp.np + kp.nk, spans[QB][3][2], nspans[QB];
      block_scores(Q, ld, K, ld, q0, nq, kp, d.hd, scale, P);  // P (nq, W): scores, then probabilities
      for (int r = 0; r < nq; r++) {
        int t = q0 + r, (*sp)[2] = spans[r], ns = nspans[r] = row_spans(&d, seg, pre, t, kp, sp);
        float *p = P + (long)r * W, l = L[(long)t * d.H];
        int prev = 0;
        for (int i = 0; i < ns; i++) {
          if (d.softcap > 0) softcap_row(p + sp[i][0], TH + (long)r * W + sp[i][0], sp[i][1] - sp[i][0], d.softcap);
          if (sp[i][0] > prev) memset(p + prev, 0, sizeof(float) * (size_t)(sp[i][0] - prev));
#pragma omp simd
          for (int k = sp[i][0]; k < sp[i][1]; k++) p[k] = ct_expf(p[k] - l);
          prev = sp[i][1];
        }
        if (W > prev) memset(p + prev, 0, sizeof(float) * (size_t)(W - prev));
        const float *o = O + (long)t * ldo, *dout = dO + (long)t * ldo;
        float dot = 0;
        for (int i = 0; i < d.hd; i++) dot += o[i] * dout[i];
        D[r] = dot;
      }
      block_times_t(P, nq, kp, dO + (long)q0 * ldo, ldo, d.hd, dV, ldk);  // dV += Pᵀ · dO[q0:q1]
      // dP (nq, W) = dO[q0:q1] · Vᵀ (scores' pieces)
      block_scores(dO, ldo, V, ld, q0, nq, kp, d.hd, 1.0f, dP);
      // dS = P ∘ (dP − D) · scale, written over dP; through a softcap also ∘ (1 − tanh²)
      for (int r = 0; r < nq; r++) {
        float *ds = dP + (long)r * W;
        const float *p = P + (long)r * W;
        float Dr = D[r];
#pragma omp simd
        for (int k = 0; k < W; k++) ds[k] = p[k] * (ds[k] - Dr) * scale;
        if (d.softcap > 0) {
          const float *th = TH + (long)r * W;
          for (int i = 0; i < nspans[r]; i++)
            for (int k = spans[r][i][0]; k < spans[r][i][1]; k++) ds[k] *= 1.0f - th[k] * th[k];
        }
      }
      // dQ[q0:q1] = dS · K;  dK += dSᵀ · Q[q0:q1]
      block_times(dP, nq, kp, K, ld, d.hd, 0.0f, dQ + (long)q0 * ld, ld);
      block_times_t(dP, nq, kp, Q + (long)q0 * ld, ld, d.hd, dK, ldk);
    }
  }
}

static int chunks_of(int T) { return (T + QCHUNK - 1) / QCHUNK; }

// The key rows chunk c of sequence b reads (and its partial holds): the prefix [0, r[0]) and
// [r[1], r[2]), its blocks' own keys (the ranges may overlap).
static void chunk_rows(const attn_job *j, int b, int c, int r[3]) {
  const ct_attn_dims *d = &j->d;
  const int *seg = j->seg + (long)b * d->T, *pre = d->pre ? d->pre + (long)b * d->T : NULL;
  int q0 = 0, c0 = c * QCHUNK, c1 = c0 + QCHUNK;
  r[0] = 0, r[1] = d->T, r[2] = 0;
  while (q0 < c0) q0 = block_end(seg, q0, d->T);
  for (int q1; q0 < c1 && q0 < d->T; q0 = q1) {
    q1 = block_end(seg, q0, d->T);
    key_pieces kp = block_keys(d, seg, pre, q0, q1);
    r[0] = kp.np > r[0] ? kp.np : r[0];
    r[1] = kp.k0 < r[1] ? kp.k0 : r[1];
    r[2] = q1 > r[2] ? q1 : r[2];
  }
  if (r[1] < r[0]) r[1] = r[0];  // (the overlap once)
  if (r[2] < r[1]) r[2] = r[1];
}

// Partial p (its index in the scratch's partials: one per thread) of (T, 2·hd): dK | dV.
static float *partial(const attn_job *j, int p) {
  const ct_attn_dims *d = &j->d;
  return j->scratch + p * j->scratch_per_thread + j->scratch_per_thread - 2L * d->hd * d->T;
}

// Rows [t0, t1) of a partial zeroed, or (dK, dV given) added into dK | dV (row stride ld).
static void partial_rows(const attn_job *j, float *pk, int t0, int t1, float *dK, float *dV, int ld) {
  int hd = j->d.hd;
  if (!dK) {
    if (t1 > t0) memset(pk + (long)t0 * 2 * hd, 0, sizeof(float) * 2 * hd * (t1 - t0));
    return;
  }
  for (int t = t0; t < t1; t++)
    for (int i = 0; i < hd; i++) {
      dK[(long)t * ld + i] += pk[(long)t * 2 * hd + i];
      dV[(long)t * ld + i] += pk[(long)t * 2 * hd + hd + i];
    }
}

static void partial_chunk(const attn_job *j, float *pk, const int r[3], float *dK, float *dV, int ld) {
  partial_rows(j, pk, 0, r[0], dK, dV, ld);
  partial_rows(j, pk, r[1], r[2], dK, dV, ld);
}

// Sequence b's, group g's dK and dV columns (row stride ld).
static float *dk_of(const attn_job *j, int b, int g, float **dV) {
  const ct_attn_dims *d = &j->d;
  int ld = (d->H + 2 * d->KV) * d->hd;
  float *dK = j->dqkv + (long)b * d->T * ld + (d->H + g) * d->hd;
  *dV = dK + d->KV * d->hd;
  for (int t = 0; t < d->T; t++) {
    memset(dK + (long)t * ld, 0, sizeof(float) * d->hd);
    memset(*dV + (long)t * ld, 0, sizeof(float) * d->hd);
  }
  return dK;
}

// One task per (sequence, kv group): the group's heads share dK and dV, so they run in the
// same task and accumulate without races; a row of several chunks through the thread's
// partial, chunk by chunk.
static void attn_bwd_task(void *ctx, int task, int thread) {
  const attn_job *j = ctx;
  const ct_attn_dims d = j->d;
  int b = task / d.KV, g = task % d.KV, ld = (d.H + 2 * d.KV) * d.hd, C = chunks_of(d.T);
  float *dV, *dK = dk_of(j, b, g, &dV);
  if (C == 1) {
    bwd_blocks(j, b, g, 0, d.T, dK, dV, ld, thread);
    return;
  }
  float *pk = partial(j, thread);
  for (int c = 0; c < C; c++) {
    int r[3];
    chunk_rows(j, b, c, r);
    partial_chunk(j, pk, r, NULL, NULL, 0);
    bwd_blocks(j, b, g, c * QCHUNK, (c + 1) * QCHUNK, pk, pk + d.hd, 2 * d.hd, thread);
    partial_chunk(j, pk, r, dK, dV, ld);
  }
}

// One task per (sequence, kv group, chunk), each into its own partial (then attn_sum_task).
static void attn_bwd_chunk_task(void *ctx, int task, int thread) {
  const attn_job *j = ctx;
  const ct_attn_dims d = j->d;
  int C = chunks_of(d.T), c = task % C, b = task / C / d.KV, g = task / C % d.KV, r[3];
  float *pk = partial(j, task);
  chunk_rows(j, b, c, r);
  partial_chunk(j, pk, r, NULL, NULL, 0);
  bwd_blocks(j, b, g, c * QCHUNK, (c + 1) * QCHUNK, pk, pk + d.hd, 2 * d.hd, thread);
}

// dK, dV of (sequence, kv group) = Σ_c partial c, from zero, in chunk order.
static void attn_sum_task(void *ctx, int task, int thread) {
  (void)thread;
  const attn_job *j = ctx;
  const ct_attn_dims d = j->d;
  int C = chunks_of(d.T), b = task / d.KV, g = task % d.KV, ld = (d.H + 2 * d.KV) * d.hd, r[3];
  float *dV, *dK = dk_of(j, b, g, &dV);
  for (int c = 0; c < C; c++) {
    chunk_rows(j, b, c, r);
    partial_chunk(j, partial(j, task * C + c), r, dK, dV, ld);
  }
}

void ct_attention_backward(float *dqkv, const float *dout, const float *out, const float *lse,
                           const float *qkv, const int *seg, ct_attn_dims d, float *scratch) {
  attn_job j = {.dqkv = dqkv, .dout = dout, .cout = out, .clse = lse, .qkv = qkv, .seg = seg,
                .d = d, .scratch = scratch,
                .scratch_per_thread = ct_attention_scratch_floats(d.T, d.hd, d.softcap > 0)};
  int C = chunks_of(d.T), threads = ct_pool_threads();
  // few (sequence, kv group) pairs for the threads, and a partial for each of their chunks:
  // the chunks side by side (the same bits as one after another)
  if (C > 1 && d.B * d.KV < threads && d.B * d.KV * C <= threads) {
    ct_parallel_for(d.B * d.KV * C, attn_bwd_chunk_task, &j);
    ct_parallel_for(d.B * d.KV, attn_sum_task, &j);
    return;
  }
  ct_parallel_for(d.B * d.KV, attn_bwd_task, &j);
}
