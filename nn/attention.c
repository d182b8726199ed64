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

// Queries are processed in blocks of QB rows; a block only needs the keys up to its last
// row, so the causal mask wastes at most half of one QB x QB tile per block.
#define QB 64

long ct_attention_scratch_floats(int T, bool softcap) { return (softcap ? 3L : 2L) * QB * T + QB; }

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

// Rows [q0, q1) of sequence b: first key index any of them may see (key_lo grows with t).
static int block_kstart(const int *seg_b, int q0, int window) { return key_lo(seg_b, q0, window); }

static float attn_scale(const ct_attn_dims *d) { return d->scale > 0 ? d->scale : 1.0f / sqrtf((float)d->hd); }

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
  const int *seg = j->seg + (long)b * d.T;
  float *S = j->scratch + thread * j->scratch_per_thread;  // (QB, T)
  float hmax = -INFINITY;  // this row's largest logit for head h
  for (int q0 = 0; q0 < d.T; q0 += QB) {
    int q1 = q0 + QB < d.T ? q0 + QB : d.T, nq = q1 - q0;
    int k0 = block_kstart(seg, q0, d.window), nk = q1 - k0;
    // S (nq, nk) = Q[q0:q1] · K[k0:q1]ᵀ
    ct_sgemm_serial('N', 'T', nq, nk, d.hd, scale, Q + (long)q0 * ld, ld, K + (long)k0 * ld, ld,
                    0.0f, S, nk);
    for (int r = 0; r < nq; r++) {
      int t = q0 + r, lo = key_lo(seg, t, d.window) - k0, hi = t - k0;  // valid keys [lo, hi]
      float *s = S + (long)r * nk;
      if (d.softcap > 0) softcap_row(s + lo, NULL, hi - lo + 1, d.softcap);
      float mx = -INFINITY;
      for (int k = lo; k <= hi; k++) mx = s[k] > mx ? s[k] : mx;
      hmax = mx > hmax ? mx : hmax;
      float sum = 0;
      for (int k = 0; k < lo; k++) s[k] = 0;
#pragma omp simd reduction(+ : sum)
      for (int k = lo; k <= hi; k++) {
        s[k] = ct_expf(s[k] - mx);
        sum += s[k];
      }
      for (int k = hi + 1; k < nk; k++) s[k] = 0;
      float inv = 1.0f / sum;
      for (int k = lo; k <= hi; k++) s[k] *= inv;
      L[(long)t * d.H] = mx + logf(sum);
    }
    // O[q0:q1] (nq, hd) = P · V[k0:q1]
    ct_sgemm_serial('N', 'N', nq, d.hd, nk, 1.0f, S, nk, V + (long)k0 * ld, ld, 0.0f,
                    O + (long)q0 * ldo, ldo);
  }
  if (j->head_max) max_into(j->head_max + h, hmax);
}

void ct_attention_forward(float *out, float *lse, const float *qkv, const int *seg,
                          ct_attn_dims d, float *scratch, float *head_max) {
  attn_job j = {.out = out, .lse = lse, .qkv = qkv, .seg = seg, .d = d, .scratch = scratch,
                .head_max = head_max, .scratch_per_thread = ct_attention_scratch_floats(d.T, d.softcap > 0)};
  ct_parallel_for(d.B * d.H, attn_fwd_task, &j);
}

// One task per (sequence, kv group): the group's heads share dK and dV, so they run
// in the same task and accumulate without races.
static void attn_bwd_task(void *ctx, int task, int thread) {
  const attn_job *j = ctx;
  const ct_attn_dims d = j->d;
  int b = task / d.KV, g = task % d.KV, rep = d.H / d.KV;
  int ld = (d.H + 2 * d.KV) * d.hd, ldo = d.H * d.hd;
  float scale = attn_scale(&d);
  const float *base = j->qkv + (long)b * d.T * ld;
  float *dbase = j->dqkv + (long)b * d.T * ld;
  const float *K = base + (d.H + g) * d.hd, *V = base + (d.H + d.KV + g) * d.hd;
  float *dK = dbase + (d.H + g) * d.hd, *dV = dbase + (d.H + d.KV + g) * d.hd;
  const int *seg = j->seg + (long)b * d.T;
  float *P = j->scratch + thread * j->scratch_per_thread;  // (QB, T)
  float *dP = P + (long)QB * d.T;                          // (QB, T)
  float *TH = d.softcap > 0 ? dP + (long)QB * d.T : NULL;  // (QB, T) tanh of capped scores
  float *D = (TH ? TH : dP) + (long)QB * d.T;               // (QB)
  for (int t = 0; t < d.T; t++) {
    memset(dK + (long)t * ld, 0, sizeof(float) * d.hd);
    memset(dV + (long)t * ld, 0, sizeof(float) * d.hd);
  }
  for (int h = g * rep; h < (g + 1) * rep; h++) {
    const float *Q = base + h * d.hd;
    float *dQ = dbase + h * d.hd;
    const float *O = j->cout + (long)b * d.T * ldo + h * d.hd;
    const float *dO = j->dout + (long)b * d.T * ldo + h * d.hd;
    const float *L = j->clse + (long)b * d.T * d.H + h;
    for (int q0 = 0; q0 < d.T; q0 += QB) {
      int q1 = q0 + QB < d.T ? q0 + QB : d.T, nq = q1 - q0;
      int k0 = block_kstart(seg, q0, d.window), nk = q1 - k0;
      ct_sgemm_serial('N', 'T', nq, nk, d.hd, scale, Q + (long)q0 * ld, ld, K + (long)k0 * ld,
                      ld, 0.0f, P, nk);
      for (int r = 0; r < nq; r++) {
        int t = q0 + r, lo = key_lo(seg, t, d.window) - k0, hi = t - k0;
        float *p = P + (long)r * nk, l = L[(long)t * d.H];
        if (d.softcap > 0) softcap_row(p + lo, TH + (long)r * nk + lo, hi - lo + 1, d.softcap);
        for (int k = 0; k < lo; k++) p[k] = 0;
#pragma omp simd
        for (int k = lo; k <= hi; k++) p[k] = ct_expf(p[k] - l);
        for (int k = hi + 1; k < nk; k++) p[k] = 0;
        const float *o = O + (long)t * ldo, *dout = dO + (long)t * ldo;
        float dot = 0;
        for (int i = 0; i < d.hd; i++) dot += o[i] * dout[i];
        D[r] = dot;
      }
      // dV[k0:q1] += Pᵀ · dO[q0:q1]
      ct_sgemm_serial('T', 'N', nk, d.hd, nq, 1.0f, P, nk, dO + (long)q0 * ldo, ldo, 1.0f,
                      dV + (long)k0 * ld, ld);
      // dP (nq, nk) = dO[q0:q1] · V[k0:q1]ᵀ
      ct_sgemm_serial('N', 'T', nq, nk, d.hd, 1.0f, dO + (long)q0 * ldo, ldo, V + (long)k0 * ld,
                      ld, 0.0f, dP, nk);
      // dS = P ∘ (dP − D) · scale, written over dP; through a softcap also ∘ (1 − tanh²)
      for (int r = 0; r < nq; r++) {
        float *ds = dP + (long)r * nk;
        const float *p = P + (long)r * nk;
        for (int k = 0; k < nk; k++) ds[k] = p[k] * (ds[k] - D[r]) * scale;
        if (d.softcap > 0) {
          int t = q0 + r, lo = key_lo(seg, t, d.window) - k0, hi = t - k0;
          const float *th = TH + (long)r * nk;
          for (int k = lo; k <= hi; k++) ds[k] *= 1.0f - th[k] * th[k];
        }
      }
      // dQ[q0:q1] = dS · K[k0:q1];  dK[k0:q1] += dSᵀ · Q[q0:q1]
      ct_sgemm_serial('N', 'N', nq, d.hd, nk, 1.0f, dP, nk, K + (long)k0 * ld, ld, 0.0f,
                      dQ + (long)q0 * ld, ld);
      ct_sgemm_serial('T', 'N', nk, d.hd, nq, 1.0f, dP, nk, Q + (long)q0 * ld, ld, 1.0f,
                      dK + (long)k0 * ld, ld);
    }
  }
}

void ct_attention_backward(float *dqkv, const float *dout, const float *out, const float *lse,
                           const float *qkv, const int *seg, ct_attn_dims d, float *scratch) {
  attn_job j = {.dqkv = dqkv, .dout = dout, .cout = out, .clse = lse, .qkv = qkv, .seg = seg,
                .d = d, .scratch = scratch,
                .scratch_per_thread = ct_attention_scratch_floats(d.T, d.softcap > 0)};
  ct_parallel_for(d.B * d.KV, attn_bwd_task, &j);
}
