// engine: the inference forward over (slot, position) tokens with a KV cache per slot.
// The same layer recipe as nn/forward.c, but with fixed-order dot products (linear.c)
// instead of sgemm, so that a token's result never depends on what shares the pass;
// a change to the layer goes into both. A sliding-window layer (Gemma 3) keeps a ring of
// its last positions only: position p in row p % R, R = min(max_len, window + max_tokens
// - 1) so that no token of a pass overwrites a row another token of the pass still reads.
//
// Attention reads keys lane-transposed: a slot's R key rows sit in blocks of 16 rows (the
// last w = R − 16b wide), block b (KVd, w) at row 16b's offset: element (c, r) at
// block + c·w + r % 16. A score is then one lane's chain of fused multiply-adds over the head
// dimension (no horizontal sum), and the queries of a slot's run of tokens in a pass (a
// prompt) share each block's loads: a token's scores are the same bits alone or in a run.
// Values stay in rows (the weighted sum reads a row per position). With kv_bf16 both caches
// hold bfloat16 (rounded to nearest even when stored, widened exactly when read): the same
// layout, half the bytes.
#include "engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "error.h"
#include "fastmath.h"
#include "kernels.h"
#include "mem.h"
#include "panel.h"
#include "pool.h"
#include "prof.h"
#include "stop.h"
#include "thin.h"

struct ct_engine {
  const ct_infer_weights *w;
  ct_engine_opts o;
  int C, F, H, KV, hd, QKV, L, V;
  float *kcache, *vcache;      // per layer l: (S, kv_rows[l], KVd) at kv_off[l], elements of
                               // float32 or (kv16) bf16: offsets count elements (kv_ptr)
  int kv16;                    // o.kv_bf16
  long kv_off[CT_MAX_LAYERS + 1];
  int kv_rows[CT_MAX_LAYERS + 1];  // T, or a sliding layer's ring
  float *rope_cos, *rope_sin;  // (T, hd/2)
  float *rope_cos_local, *rope_sin_local;  // (T, hd/2) sliding layers' (rope_local_theta)
  float *wn;                   // (max(C, hd)) a Gemma norm's 1 + w
  float attn_scale;
  // work buffers for up to max_tokens tokens
  float *x, *ln, *qkv, *qkv_save, *qk_rstd, *rstd, *att, *gu, *h, *xo;
  float *scores;               // (threads, qb · H/KV, lds) per thread: a unit's query rows
  long lds;                    // a score row's stride: max_len rounded up to 16, plus 16
  int qb;                      // tokens of one slot's run whose queries share key blocks
  int *units;                  // (max_tokens + 1) first token of each unit (runs cut to qb)
  float *lora_u;               // (max_tokens, r) the adapters' inner products
  float *lora_p;               // (r · max(in, out)) one adapter matrix packed into panels
  float *pinned;               // ct_engine_lora_pin: adapter (l, t) at pin_at[l][t], A's then B's
  long pin_at[CT_MAX_LAYERS][CT_LORA_TARGETS];
  bool lora_ext;               // pinned, and the adapters' B are in the bf16 panels (linear.h)
  int *ids, *pos, *slot;
  long bytes;
};

enum { N_BUFS = 18 };  // float buffers, in engine_sizes' order
enum { QB = 16 };      // at most this many tokens per attention unit

// A score row's stride: room for max_len scores and the 15 lanes past a run's last block.
static long score_ld(const ct_engine_opts *o) { return ((long)o->max_len + 15) / 16 * 16 + 16; }

// Tokens per unit: up to QB while the unit's score rows stay within 1 MB per thread.
static int unit_tokens(const ct_model_config *c, const ct_engine_opts *o) {
  long q = (1L << 18) / ((long)(c->num_heads / c->num_kv_heads) * score_ld(o));
  q = q > QB ? QB : q < 1 ? 1 : q;
  return (int)(q < o->max_tokens ? q : o->max_tokens);
}

// Cache rows per slot of layer l: max_len, or for a sliding layer the ring that holds its
// window plus the positions one pass may add after a token.
static int layer_rows(const ct_model_config *c, const ct_engine_opts *o, int l) {
  long w = ct_layer_window(c, l), r = w + o->max_tokens - 1;
  return w && r < o->max_len ? (int)r : o->max_len;
}

// Floats of each buffer for a model config and options: the KV caches, the RoPE tables,
// then the work buffers for max_tokens tokens.
static void engine_sizes(const ct_model_config *c, const ct_engine_opts *o, long n[N_BUFS]) {
  long N = o->max_tokens, T = o->max_len, C = c->hidden_size, F = c->intermediate_size;
  long H = c->num_heads, KV = c->num_kv_heads, hd = c->head_dim, QKV = (H + 2 * KV) * hd, cache = 0;
  for (int l = 0; l < c->num_layers; l++) cache += (long)o->slots * layer_rows(c, o, l) * KV * hd;
  if (o->kv_bf16) cache = (cache + 1) / 2;  // (in floats: two bf16 elements each)
  long local = ct_has_local_rope(c) ? T * (hd / 2) : 0;
  long v[N_BUFS] = {cache, cache, T * (hd / 2), T * (hd / 2), N * C, N * C, N * C, N * QKV, N * QKV,
                    N * (H + KV), N, N * H * hd, N * 2 * F, N * F,
                    (long)ct_pool_threads() * unit_tokens(c, o) * (H / KV) * score_ld(o),
                    local, local, C > hd ? C : hd};
  for (int i = 0; i < N_BUFS; i++) n[i] = (v[i] + 15) / 16 * 16 + 16;
}

double ct_engine_bytes(const ct_model_config *c, const ct_engine_opts *o) {
  long n[N_BUFS];
  double b = 4.0 * sizeof(int) * o->max_tokens + sizeof(int);
  engine_sizes(c, o, n);
  for (int i = 0; i < N_BUFS; i++) b += sizeof(float) * (double)n[i];
  return b;
}

int ct_engine_init(ct_engine **out, const ct_infer_weights *w, const ct_engine_opts *o) {
  *out = NULL;
  if (o->slots < 1 || o->max_len < 1 || o->max_tokens < o->slots)
    return ct_set_error(CT_EINVAL, "engine: need slots >= 1, max_len >= 1, max_tokens >= slots");
  if (w->cfg.num_layers > CT_MAX_LAYERS)
    return ct_set_error(CT_EINVAL, "engine: %d layers (at most %d)", w->cfg.num_layers, CT_MAX_LAYERS);
  ct_engine *e = calloc(1, sizeof *e);
  if (!e) return ct_set_error(CT_ENOMEM, "engine: out of memory");
  const ct_model_config *c = &w->cfg;
  *e = (ct_engine){.w = w, .o = *o, .C = c->hidden_size, .F = c->intermediate_size,
                   .H = c->num_heads, .KV = c->num_kv_heads, .hd = c->head_dim,
                   .L = c->num_layers, .V = c->vocab_size};
  e->QKV = (e->H + 2 * e->KV) * e->hd;
  e->kv16 = o->kv_bf16;
  e->attn_scale = ct_attn_scale(c);
  e->lds = score_ld(o);
  e->qb = unit_tokens(c, o);
  for (int l = 0; l < e->L; l++) {
    e->kv_rows[l] = layer_rows(c, o, l);
    e->kv_off[l + 1] = e->kv_off[l] + (long)o->slots * e->kv_rows[l] * e->KV * e->hd;
  }
  long n[N_BUFS], N = o->max_tokens;
  engine_sizes(c, o, n);
  float **bufs[N_BUFS] = {&e->kcache, &e->vcache, &e->rope_cos, &e->rope_sin, &e->x, &e->ln, &e->xo,
                          &e->qkv, &e->qkv_save, &e->qk_rstd, &e->rstd, &e->att, &e->gu, &e->h, &e->scores,
                          &e->rope_cos_local, &e->rope_sin_local, &e->wn};
  bool ok = true;
  for (int i = 0; i < N_BUFS; i++) {
    *bufs[i] = ct_big_alloc(sizeof(float) * n[i]);  // zeroed, huge pages for the caches
    ok &= *bufs[i] != NULL;
  }
  e->bytes = (long)ct_engine_bytes(c, o);
  e->ids = malloc(sizeof(int) * N);
  e->pos = malloc(sizeof(int) * N);
  e->slot = malloc(sizeof(int) * N);
  e->units = malloc(sizeof(int) * (N + 1));
  if (w->lora) {
    long layer = 0;  // one layer's adapters packed: every group of lora_add fits
    for (int t = 0; t < CT_LORA_TARGETS; t++) {
      int in, out, row0;
      ct_lora_dims(&w->lora->mc, t, &in, &out, &row0);
      layer += in + out;
    }
    ok &= (e->lora_u = malloc(sizeof(float) * N * 3 * w->lora->cfg.r)) != NULL;  // (q, k, v at once)
    ok &= (e->lora_p = malloc(sizeof(float) * layer * w->lora->cfg.r)) != NULL;
  }
  ok &= e->ids && e->pos && e->slot && e->units;
  if (!ok) {
    long mb = e->bytes / 1000000;
    ct_engine_free(e);
    return ct_set_error(CT_ENOMEM, "engine: cannot allocate %ld MB (KV cache for %d slots x %d "
                        "positions); lower slots or max_len", mb, o->slots, o->max_len);
  }
  ct_rope_fill(c, o->max_len, e->rope_cos, e->rope_sin);
  if (ct_has_local_rope(c)) ct_rope_fill_local(c, o->max_len, e->rope_cos_local, e->rope_sin_local);
  *out = e;
  return 0;
}

void ct_engine_free(ct_engine *e) {
  if (!e) return;
  float *bufs[N_BUFS] = {e->kcache, e->vcache, e->rope_cos, e->rope_sin, e->x, e->ln, e->xo,
                         e->qkv, e->qkv_save, e->qk_rstd, e->rstd, e->att, e->gu, e->h, e->scores,
                         e->rope_cos_local, e->rope_sin_local, e->wn};
  for (int i = 0; i < N_BUFS; i++) ct_big_free(bufs[i]);
  ct_free_all(e->ids, e->pos, e->slot, e->units, e->lora_u, e->lora_p, e->pinned, e);
}

const ct_infer_weights *ct_engine_weights(const ct_engine *e) { return e->w; }
ct_engine_opts ct_engine_options(const ct_engine *e) { return e->o; }

// Slot s's first value row of layer l (rows p % R follow, KVd each); its key blocks start
// at the same offset of the key cache. In elements (kv_ptr makes the address).
static inline long slot_base(const ct_engine *e, int l, int s) {
  return e->kv_off[l] + (long)s * e->kv_rows[l] * e->KV * e->hd;
}

// Width of key block b of R rows: 16, the last R − 16b.
static inline int block_w(int R, int b) { return R - 16 * b < 16 ? R - 16 * b : 16; }

// Element i of a cache at p (bf: bfloat16 elements), its address and its value.
static inline const void *kv_ptr(const void *p, long i, int bf) { return (const char *)p + i * (bf ? 2 : 4); }
static inline float kv_at(const void *p, long i, int bf) {
  return bf ? ct_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

typedef struct {
  ct_engine *e;
  int l, n, parts, tasks;
  bool single;  // one token per unit (sliding layers), else e->units
} pass_job;

// Tokens [lo, hi) of a part: k into its slot's key block (transposed), v into its row.
static void store_kv_task(void *ctx, int part, int thread) {
  (void)thread;
  const pass_job *j = ctx;
  ct_engine *e = j->e;
  long lo, hi, KVd = (long)e->KV * e->hd;
  int R = e->kv_rows[j->l];
  ct_chunk_range(j->n, 1, j->parts, part, &lo, &hi);
  for (long i = lo; i < hi; i++) {
    int r = e->pos[i] % R, w = block_w(R, r / 16);
    long base = slot_base(e, j->l, e->slot[i]);
    const float *k = e->qkv + i * e->QKV + (long)e->H * e->hd;
    long kb = base + (long)(r - r % 16) * KVd + r % 16, vb = base + r * KVd;
    if (e->kv16) {
      uint16_t *K = (uint16_t *)e->kcache, *V = (uint16_t *)e->vcache;
      for (long c = 0; c < KVd; c++) K[kb + c * w] = ct_f32_to_bf16(k[c]);
      ct_bf16_narrow(V + vb, k + KVd, KVd);
    } else {
      for (long c = 0; c < KVd; c++) e->kcache[kb + c * w] = k[c];
      memcpy(e->vcache + vb, k + KVd, sizeof(float) * KVd);
    }
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define ENGINE_AVX512 1
#include <immintrin.h>

// The first n of 16 lanes.
static inline __mmask16 lanes(int n) { return n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1); }

// 16 cache elements from element i of p (the lanes of mask m only: the others 0), widened
// to float32 from bf16.
static inline __m512 kv_load(const void *p, long i, int bf) {
  if (!bf) return _mm512_loadu_ps((const float *)p + i);
  __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline __m512 kv_load_mask(__mmask16 m, const void *p, long i, int bf) {
  if (!bf) return _mm512_maskz_loadu_ps(m, (const float *)p + i);
  __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// s + m·lds + j = Σ_d q_m[d]·k_j[d] for mr query rows and keys j of nb blocks: with nb = 1
// the w keys of the block at kt (k_j[d] at element d·w + j), otherwise 16 keys of each of
// nb full blocks (block t at element t·kstride); bf: the keys are bf16. Every score is one
// lane's chain of fused multiply-adds in d order from 0: the same value whatever rows and
// blocks share the call.
static inline __attribute__((always_inline)) void kt_tile(const float *const *q, const void *kt, long kstride,
                                                          int w, int hd, float *s, long lds, const int mr,
                                                          const int nb, const int bf) {
  __m512 c[8][4];
#pragma GCC unroll 8
  for (int m = 0; m < mr; m++)
#pragma GCC unroll 4
    for (int t = 0; t < nb; t++) c[m][t] = _mm512_setzero_ps();
  const __mmask16 mk = lanes(w);
  for (int d = 0; d < hd; d++) {
    __m512 k[4];
#pragma GCC unroll 4
    for (int t = 0; t < nb; t++)
      k[t] = nb == 1 ? kv_load_mask(mk, kt, (long)d * w, bf) : kv_load(kt, t * kstride + d * 16, bf);
#pragma GCC unroll 8
    for (int m = 0; m < mr; m++) {
      __m512 a = _mm512_set1_ps(q[m][d]);
#pragma GCC unroll 4
      for (int t = 0; t < nb; t++) c[m][t] = _mm512_fmadd_ps(a, k[t], c[m][t]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < mr; m++)
#pragma GCC unroll 4
    for (int t = 0; t < nb; t++) {
      if (nb == 1) _mm512_mask_storeu_ps(s + m * lds, mk, c[m][0]);
      else _mm512_storeu_ps(s + m * lds + 16 * t, c[m][t]);
    }
}

#define KT_CASE(MR, NB) \
  case MR: kt_tile(q, kt, kstride, w, hd, s, lds, MR, NB, bf); break;

// kt_tile for mr <= 8 rows (mr <= 4 with nb = 4), each (mr, nb, bf) its own unrolled loop.
static inline __attribute__((always_inline)) void kt_cases(const float *const *q, int mr, const void *kt,
                                                           long kstride, int w, int hd, float *s, long lds,
                                                           int nb, const int bf) {
  if (nb == 4) {
    switch (mr) { KT_CASE(1, 4) KT_CASE(2, 4) KT_CASE(3, 4) default: kt_tile(q, kt, kstride, w, hd, s, lds, 4, 4, bf); }
  } else if (nb == 2) {
    switch (mr) {
      KT_CASE(1, 2) KT_CASE(2, 2) KT_CASE(3, 2) KT_CASE(4, 2) KT_CASE(5, 2) KT_CASE(6, 2) KT_CASE(7, 2)
      default: kt_tile(q, kt, kstride, w, hd, s, lds, 8, 2, bf);
    }
  } else {
    switch (mr) {
      KT_CASE(1, 1) KT_CASE(2, 1) KT_CASE(3, 1) KT_CASE(4, 1) KT_CASE(5, 1) KT_CASE(6, 1) KT_CASE(7, 1)
      default: kt_tile(q, kt, kstride, w, hd, s, lds, 8, 1, bf);
    }
  }
}
#undef KT_CASE

static void kt_call(const float *const *q, int mr, const void *kt, long kstride, int w, int hd, float *s,
                    long lds, int nb, int bf) {
  if (bf) kt_cases(q, mr, kt, kstride, w, hd, s, lds, nb, 1);
  else kt_cases(q, mr, kt, kstride, w, hd, s, lds, nb, 0);
}

// o_r (16·nc, at o + r·16·nc) = Σ_p a_r[p]·v_p for nh heads r (weights a_r at a + r·lda)
// over P1 rows of V1 then P2 rows of V2 (row stride ld elements; bf: bf16), each
// accumulated in registers in that order; every V row is loaded once for all nh heads.
static inline __attribute__((always_inline)) void weighted_sum(const float *a, long lda, const int nh,
                                                               const void *V1, int P1, const void *V2, int P2,
                                                               long ld, float *o, const int nc, const int bf) {
  __m512 acc[4][8];
#pragma GCC unroll 4
  for (int r = 0; r < nh; r++)
#pragma GCC unroll 8
    for (int c = 0; c < nc; c++) acc[r][c] = _mm512_setzero_ps();
  for (int p = 0; p < P1 + P2; p++) {
    const void *v = p < P1 ? kv_ptr(V1, p * ld, bf) : kv_ptr(V2, (p - P1) * ld, bf);
#pragma GCC unroll 8  // acc in registers: a loop kept in memory chains every FMA through a store
    for (int c = 0; c < nc; c++) {
      __m512 vc = kv_load(v, 16 * c, bf);
#pragma GCC unroll 4
      for (int r = 0; r < nh; r++) acc[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + p]), vc, acc[r][c]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < nh; r++)
#pragma GCC unroll 8
    for (int c = 0; c < nc; c++) _mm512_storeu_ps(o + (r * nc + c) * 16, acc[r][c]);
}

// weighted_sum for nh (any) heads of 64 or 128: as many at a time as keep 16 accumulators.
static inline __attribute__((always_inline)) void weighted_sums_of(const float *a, long lda, int nh,
                                                                   const void *V1, int P1, const void *V2,
                                                                   int P2, long ld, float *o, int hd,
                                                                   const int bf) {
  int at = hd == 64 ? 4 : 2;
  for (int r = 0; r < nh; r += at) {
    int k = nh - r < at ? nh - r : at;
    const float *ar = a + r * lda;
    float *orr = o + (long)r * hd;
    if (hd == 128) {
      if (k == 2) weighted_sum(ar, lda, 2, V1, P1, V2, P2, ld, orr, 8, bf);
      else weighted_sum(ar, lda, 1, V1, P1, V2, P2, ld, orr, 8, bf);
    } else {
      switch (k) {
        case 4: weighted_sum(ar, lda, 4, V1, P1, V2, P2, ld, orr, 4, bf); break;
        case 3: weighted_sum(ar, lda, 3, V1, P1, V2, P2, ld, orr, 4, bf); break;
        case 2: weighted_sum(ar, lda, 2, V1, P1, V2, P2, ld, orr, 4, bf); break;
        default: weighted_sum(ar, lda, 1, V1, P1, V2, P2, ld, orr, 4, bf); break;
      }
    }
  }
}

static void weighted_sums(const float *a, long lda, int nh, const void *V1, int P1, const void *V2, int P2,
                          long ld, float *o, int hd, int bf) {
  if (bf) weighted_sums_of(a, lda, nh, V1, P1, V2, P2, ld, o, hd, 1);
  else weighted_sums_of(a, lda, nh, V1, P1, V2, P2, ld, o, hd, 0);
}
#endif

#if !defined(ENGINE_AVX512)
// kt_tile's arithmetic in plain C: each score one fmaf chain in d order from 0.
static void kt_call(const float *const *q, int mr, const void *kt, long kstride, int w, int hd, float *s,
                    long lds, int nb, int bf) {
  for (int m = 0; m < mr; m++)
    for (int t = 0; t < nb; t++)
      for (int jj = 0; jj < (nb == 1 ? w : 16); jj++) {
        long k = nb == 1 ? jj : t * kstride + jj, ldk = nb == 1 ? w : 16;
        float c = 0;
        for (int d = 0; d < hd; d++) c = fmaf(q[m][d], kv_at(kt, k + d * ldk, bf), c);
        s[m * lds + 16 * t + jj] = c;
      }
}
#endif

// Scores of nq query rows q[m] over key rows [a, b) of group g of a slot's R rows (key
// blocks from K): row m's score of key row r into s + m·lds + r − a. Blocks go whole (the
// lanes of a last block past b land behind the row's scores, within lds); an unaligned a's
// first block goes through tmp. Rows are taken 8 at a time with 2 blocks, 4 with 4 blocks
// (few rows: a decode step's heads), so each block's loads serve several queries.
static void range_scores(const float *const *q, int nq, const void *K, int R, long KVd, int g, int hd, int a,
                         int b, float *s, long lds, int bf) {
  int bk = a / 16;
  if (a % 16) {
    int w = block_w(R, bk), lo = a % 16, hi = b - 16 * bk < w ? b - 16 * bk : w;
    const void *kt = kv_ptr(K, 16L * bk * KVd + (long)g * hd * w, bf);
    float tmp[8 * 16];
    for (int m0 = 0; m0 < nq; m0 += 8) {
      int mr = nq - m0 < 8 ? nq - m0 : 8;
      kt_call(q + m0, mr, kt, 0, w, hd, tmp, 16, 1, bf);
      for (int m = 0; m < mr; m++) memcpy(s + (m0 + m) * lds, tmp + m * 16 + lo, sizeof(float) * (hi - lo));
    }
    bk++;
  }
  int wide = nq <= 4 ? 4 : 2;
  while (16 * bk < b) {
    int full = 0;  // whole 16-row blocks from bk within [., b), up to `wide`
    while (full < wide && 16 * (bk + full) < b && block_w(R, bk + full) == 16) full++;
    int nb = full == wide ? wide : full >= 2 ? 2 : 1, w = block_w(R, bk), rows = nb == 4 ? 4 : 8;
    const void *kt = kv_ptr(K, 16L * bk * KVd + (long)g * hd * (nb == 1 ? w : 16), bf);
    for (int m0 = 0; m0 < nq; m0 += rows) {
      int mr = nq - m0 < rows ? nq - m0 : rows;
      kt_call(q + m0, mr, kt, 16L * KVd, nb == 1 ? w : 16, hd, s + m0 * lds + 16 * bk - a, lds, nb, bf);
    }
    bk += nb;
  }
}

// The largest of s[0, P) (the max of any order is the same value: a ±0 tie changes no exp).
static float max_of(const float *s, int P) {
  float mx = -INFINITY;
  int p = 0;
#if defined(ENGINE_AVX512)
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (; p + 16 <= P; p += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(s + p));
  mx = _mm512_reduce_max_ps(m);
#endif
  for (; p < P; p++) mx = s[p] > mx ? s[p] : mx;
  return mx;
}

// s[0, P) *= scale, returning the largest (one pass: max_of of the scaled values).
static float scale_max(float *s, int P, float scale) {
  float mx = -INFINITY;
  int p = 0;
#if defined(ENGINE_AVX512)
  const __m512 sc = _mm512_set1_ps(scale);
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (; p + 16 <= P; p += 16) {
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(s + p), sc);
    _mm512_storeu_ps(s + p, v);
    m = _mm512_max_ps(m, v);
  }
  mx = _mm512_reduce_max_ps(m);
#endif
  for (; p < P; p++) s[p] *= scale, mx = s[p] > mx ? s[p] : mx;
  return mx;
}

// s[0, P) scaled (and softcapped), then exp(s − max); returns their sum.
static float softmax_weights(float *s, int P, float scale, float softcap) {
  float mx;
  if (softcap > 0) {
    float ic = 1.0f / softcap;
    for (int p = 0; p < P; p++) s[p] = softcap * ct_tanhf(s[p] * scale * ic);
    mx = max_of(s, P);
  } else {
    mx = scale_max(s, P, scale);
  }
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int p = 0; p < P; p++) {
    s[p] = ct_expf(s[p] - mx);
    sum += s[p];
  }
  return sum;
}

// nh query heads sharing one kv group, their scores at s + r·lds over P1 cached positions
// in rows of V1 then P2 in rows of V2 (a ring's two runs; P2 = 0 for a full layer; bf:
// bf16 rows): the scores scaled (softcapped) and exp'd, head r's output into o + r·hd.
static void attend_finish(float *s, long lds, int nh, const void *V1, int P1, const void *V2, int P2, long ld,
                          int hd, float scale, float softcap, float *o, int bf) {
  int P = P1 + P2;
  float sum[nh];
  for (int r = 0; r < nh; r++) sum[r] = softmax_weights(s + r * lds, P, scale, softcap);
  // o = Σ_p s_p·v_p / sum: the normalization applied to the hd outputs, not the P weights
  int done = 0;
#if defined(ENGINE_AVX512)
  if (hd == 64 || hd == 128) weighted_sums(s, lds, nh, V1, P1, V2, P2, ld, o, hd, bf), done = 1;
#endif
  for (int r = 0; r < nh && !done; r++) {
    float *or = o + (long)r * hd;
    const float *sr = s + r * lds;
    memset(or, 0, sizeof(float) * hd);
    for (int p = 0; p < P; p++) {
      const void *v = p < P1 ? kv_ptr(V1, p * ld, bf) : kv_ptr(V2, (p - P1) * ld, bf);
#pragma omp simd
      for (int t = 0; t < hd; t++) or[t] += sr[p] * kv_at(v, t, bf);
    }
  }
  for (int r = 0; r < nh; r++) {
    float inv = 1.0f / sum[r], *or = o + (long)r * hd;
    for (int t = 0; t < hd; t++) or[t] *= inv;
  }
}

// Attention of unit u's tokens (tokens [units[u], units[u + 1]) of one slot, or token u
// alone on a sliding layer) for kv group g, each over its slot's positions 0..pos (a window's
// last ones). The unit's queries share the key blocks; a token's result depends on its own
// query and its slot's cache only, never on the pass.
static void attend_unit(const pass_job *j, int u, int g, int thread) {
  ct_engine *e = j->e;
  int i0 = j->single ? u : e->units[u], i1 = j->single ? u + 1 : e->units[u + 1];
  int rep = e->H / e->KV, hd = e->hd, R = e->kv_rows[j->l], nq = (i1 - i0) * rep;
  long KVd = (long)e->KV * hd, base = slot_base(e, j->l, e->slot[i0]);
  int bf = e->kv16;
  const void *K = kv_ptr(e->kcache, base, bf), *V = kv_ptr(e->vcache, base + (long)g * hd, bf);
  const float *q[nq];
  float *s = e->scores + (long)thread * e->qb * rep * e->lds, scale = e->attn_scale;
  float softcap = e->w->cfg.attn_softcap;
  for (int m = 0; m < nq; m++) q[m] = e->qkv + (long)(i0 + m / rep) * e->QKV + (long)(g * rep + m % rep) * hd;
  if (j->single) {  // positions [p0, pos] sit in rows [p0 % R, ...) then, past the ring's end, from row 0
    int pos = e->pos[i0], win = ct_layer_window(&e->w->cfg, j->l), p0 = win && pos - win + 1 > 0 ? pos - win + 1 : 0;
    int r0 = p0 % R, P = pos - p0 + 1, P1 = P < R - r0 ? P : R - r0;
    range_scores(q, nq, K, R, KVd, g, hd, r0, r0 + P1, s, e->lds, bf);
    if (P > P1) range_scores(q, nq, K, R, KVd, g, hd, 0, P - P1, s + P1, e->lds, bf);
    attend_finish(s, e->lds, rep, kv_ptr(V, r0 * KVd, bf), P1, V, P - P1, KVd, hd, scale, softcap,
                  e->att + (long)i0 * e->H * hd + (long)g * rep * hd, bf);
    return;
  }
  int P = 0;  // a full layer: rows are positions; the unit's scores over its furthest token's
  for (int i = i0; i < i1; i++) P = e->pos[i] + 1 > P ? e->pos[i] + 1 : P;
  range_scores(q, nq, K, R, KVd, g, hd, 0, P, s, e->lds, bf);
  for (int i = i0; i < i1; i++)
    attend_finish(s + (long)(i - i0) * rep * e->lds, e->lds, rep, V, e->pos[i] + 1, V, 0, KVd, hd, scale, softcap,
                  e->att + (long)i * e->H * hd + (long)g * rep * hd, bf);
}

// Part k of the pass's units x groups: tasks k, k + parts, ... (an even mix of short and
// long prompts' positions in every part; 32 parts a thread, so the last part a thread
// finishes alone is short).
static void attend_part(void *ctx, int part, int thread) {
  const pass_job *j = ctx;
  for (int t = part; t < j->tasks; t += j->parts) attend_unit(j, t / j->e->KV, t % j->e->KV, thread);
}

// The pass's units: runs of consecutive tokens of one slot, cut every qb tokens.
static int make_units(ct_engine *e, int n) {
  int nu = 0;
  for (int i = 0; i < n; i++)
    if (i == 0 || e->slot[i] != e->slot[i - 1] || i - e->units[nu - 1] == e->qb) e->units[nu++] = i;
  e->units[nu] = n;
  return nu;
}

// Caches every k/v of the pass, then each token attends to its slot.
static void attention(ct_engine *e, int l, int n, int nu) {
  pass_job j = {e, l, n, ct_pool_parts(n), 0, ct_layer_window(&e->w->cfg, l) > 0};
  ct_parallel_for(j.parts, store_kv_task, &j);  // (on every thread even at decode: its scattered
                                                // stores miss the cache; serial they cost 1.7 s
                                                // more of a 16-core GRPO step's rollouts)
  j.tasks = (j.single ? n : nu) * e->KV;
  j.parts = j.tasks < 32 * ct_pool_threads() ? j.tasks : 32 * ct_pool_threads();
  ct_parallel_for(j.parts, attend_part, &j);
}

static void embed_rows(ct_engine *e, int n) {
  const ct_linear *E = &e->w->embed;
  if (E->f32) {
    ct_embed_forward(e->x, E->f32, e->ids, n, e->C);
    return;
  }
  for (int i = 0; i < n; i++) ct_linear_row(E, e->ids[i], e->x + (long)i * e->C);
}

// Adapter (l, t) packed at P: A transposed (in, r) for thin.h at rank 16, else A's panels
// (r, in); then B's panels (out, r). r·(in + out) floats.
static void pack_adapter(const ct_lora *lo, int l, int t, float *P) {
  int in, out, row0, r = lo->cfg.r;
  ct_lora_dims(&lo->mc, t, &in, &out, &row0);
  const float *B = lo->w[l][t].B;
  float *Q = P + (long)in * r;
  if (ct_thin_takes(r)) {  // A (in, r) k-major for ct_thin_out_rows, B (r, out) for ct_thin_add_rows
    ct_thin_transpose(lo->w[l][t].A, in, P);
    for (int j = 0; j < r; j++)
      for (int o = 0; o < out; o++) Q[(long)j * out + o] = B[(long)o * r + j];
    return;
  }
  ct_panel_pack(lo->w[l][t].A, r, in, P);
  ct_panel_pack(B, out, r, Q);
}

double ct_engine_lora_bytes(const ct_lora *lo) {
  double n = 0;
  for (int l = 0; lo && l < lo->mc.num_layers; l++)
    for (int t = 0; t < CT_LORA_TARGETS; t++) {
      int in, out, row0;
      ct_lora_dims(&lo->mc, t, &in, &out, &row0);
      if (lo->w[l][t].A) n += (double)lo->cfg.r * (in + out);
    }
  return sizeof(float) * n;
}

// The matrix of layer l that holds target t, and the first target it holds.
static const ct_linear *target_matrix(const ct_infer_layer *L, int t, int *t0) {
  *t0 = t <= CT_LORA_V ? CT_LORA_Q : t == CT_LORA_O ? CT_LORA_O : t <= CT_LORA_UP ? CT_LORA_GATE : CT_LORA_DOWN;
  return t <= CT_LORA_V ? &L->qkv : t == CT_LORA_O ? &L->o : t <= CT_LORA_UP ? &L->gu : &L->down;
}

// Adapter (l, t)'s B (out, r) rounded to bf16 into its matrix's extension columns
// [cols + 16i, cols + 16i + 16) of its rows, i its place among the matrix's targets.
static void write_b(const ct_engine *e, int l, int t) {
  const ct_lora *lo = e->w->lora;
  int t0, in, out, row0, r = lo->cfg.r;
  const ct_linear *M = target_matrix(&e->w->layers[l], t, &t0);
  ct_lora_dims(&lo->mc, t, &in, &out, &row0);
  uint16_t *P = (uint16_t *)M->p16;  // (the weights' own panels: ct_infer_pack allocated them)
  int K = M->cols + M->ext, k0 = M->cols + CT_THIN_R * (t - t0);
  for (int n = 0; n < out; n++)
    for (int j = 0; j < r; j++) P[ct_panel16_at(M->rows, K, row0 + n, k0 + j)] = ct_f32_to_bf16(lo->w[l][t].B[(long)n * r + j]);
}

static void pin_task(void *ctx, int k, int thread) {
  (void)thread;
  ct_engine *e = ctx;
  int l = k / CT_LORA_TARGETS, t = k % CT_LORA_TARGETS, t0;
  if (!e->w->lora->w[l][t].A) return;
  pack_adapter(e->w->lora, l, t, e->pinned + e->pin_at[l][t]);
  if (target_matrix(&e->w->layers[l], t, &t0)->ext) write_b(e, l, t);
}

void ct_engine_lora_pin(ct_engine *e) {
  const ct_lora *lo = e->w->lora;
  ct_engine_lora_unpin(e);
  if (!lo || !(e->pinned = malloc((size_t)ct_engine_lora_bytes(lo) + sizeof(float)))) return;
  long at = 0;
  for (int l = 0; l < e->L; l++)
    for (int t = 0; t < CT_LORA_TARGETS; t++) {
      int in, out, row0;
      ct_lora_dims(&lo->mc, t, &in, &out, &row0);
      e->pin_at[l][t] = at;
      if (lo->w[l][t].A) at += (long)lo->cfg.r * (in + out);
    }
  ct_parallel_for(e->L * CT_LORA_TARGETS, pin_task, e);
  for (int l = 0; l < e->L; l++) {
    const ct_infer_layer *L = &e->w->layers[l];
    e->lora_ext |= L->qkv.ext || L->o.ext || L->gu.ext || L->down.ext;
  }
}

void ct_engine_lora_unpin(ct_engine *e) {
  free(e->pinned);
  e->pinned = NULL;
  e->lora_ext = false;
}

// Adapters t0..t1 of layer l as a product folds them in (linear.h), pinned: each A
// transposed at the start of its pinned block (pack_adapter).
static ct_linear_lora folded(const ct_engine *e, int l, int t0, int t1) {
  const ct_lora *lo = e->w->lora;
  ct_linear_lora a = {t1 - t0 + 1, lo->scale, {NULL}};
  for (int t = t0; t <= t1; t++)
    if (lo->w[l][t].A) a.A[t - t0] = e->pinned + e->pin_at[l][t];
  return a;
}

// Adapter t of layer l on the n rows of x (n, ldx): y (n, ldy) += s · (x·Aᵀ)·Bᵀ in the
// target's columns, A and B through panels: packed once by ct_engine_lora_pin, else on
// every call (they train between generations; packing is r·(in + out) values next to a
// pass's n·r·(in + out) products). Each output is a fixed-order chain (panel.h), so
// batching changes no bit here either, pinned or not.
static void lora_add_panels(ct_engine *e, int l, int t, const float *x, int ldx, int n, float *y, int ldy) {
  const ct_lora *lo = e->w->lora;
  int in, out, row0, r = lo->cfg.r;
  ct_lora_dims(&lo->mc, t, &in, &out, &row0);
  const float *Ap = e->pinned ? e->pinned + e->pin_at[l][t] : e->lora_p, *Bp = Ap + (long)in * r;
  if (!e->pinned) ct_panel_pack(lo->w[l][t].A, r, in, e->lora_p);
  ct_linear m = {.rows = r, .cols = in, .p32 = Ap};
  ct_linear_forward(&m, x, ldx, n, e->lora_u, r, 0);
  for (long i = 0; i < (long)n * r; i++) e->lora_u[i] *= lo->scale;
  if (!e->pinned) ct_panel_pack(lo->w[l][t].B, out, r, e->lora_p), Bp = e->lora_p;
  m = (ct_linear){.rows = out, .cols = r, .p32 = Bp};
  ct_linear_forward(&m, e->lora_u, r, n, y + row0, ldy, 1);
}

typedef struct {
  const ct_engine *e;
  int l, t0, t1, ldx, ldy;
  const float *x;
  float *y;
  const float *P[CT_LORA_TARGETS];  // each target's packed A then B (pack_adapter)
} lora_rows_job;

// Rows [lo, hi) of every target of the job: u = s·x·Aᵀ (thin.h's chain), then y += u·Bᵀ.
static void lora_rows(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const lora_rows_job *j = ctx;
  const ct_lora *L = j->e->w->lora;
  for (int t = j->t0; t <= j->t1; t++) {
    if (!j->P[t]) continue;
    int in, out, row0;
    ct_lora_dims(&L->mc, t, &in, &out, &row0);
    float *u = j->e->lora_u + (long)(t - j->t0) * j->e->o.max_tokens * CT_THIN_R;
    ct_thin_out_rows(lo, hi, in, L->scale, j->x, j->ldx, j->P[t], u);
    ct_thin_add_rows(lo, hi, out, 1, u, j->P[t] + (long)in * CT_THIN_R, j->y + row0, j->ldy);
  }
}

// Adapters t0..t1 of layer l, which read the same rows x (n, ldx), added into y (n, ldy):
// y += s · (x·Aᵀ)·Bᵀ in each target's columns. At rank 16 one pool loop over the rows does
// all of them (the q, k and v adapters: one loop instead of six per decode step); each
// output is a fixed-order chain of its row alone (thin.h), so batching changes no bit.
static void lora_add(ct_engine *e, int l, int t0, int t1, const float *x, int ldx, int n, float *y, int ldy) {
  const ct_lora *lo = e->w->lora;
  if (!lo) return;
  if (!ct_thin_takes(lo->cfg.r)) {
    for (int t = t0; t <= t1; t++)
      if (lo->w[l][t].A) lora_add_panels(e, l, t, x, ldx, n, y, ldy);
    return;
  }
  lora_rows_job j = {e, l, t0, t1, ldx, ldy, x, y, {0}};
  float *P = e->lora_p;
  bool any = false;
  for (int t = t0; t <= t1; t++) {
    if (!lo->w[l][t].A) continue;
    int in, out, row0;
    ct_lora_dims(&lo->mc, t, &in, &out, &row0);
    if (e->pinned) j.P[t] = e->pinned + e->pin_at[l][t];
    else pack_adapter(lo, l, t, P), j.P[t] = P, P += (long)lo->cfg.r * (in + out);
    any = true;
  }
  if (any) ct_parallel_ranges(n, 8, ct_pool_parts((n + 7) / 8), lora_rows, &j);
}

// x_in (n, C): the first layer's input rows instead of ids' embeddings (ids unused then);
// top (n, C): where the last layer's output (before the final norm) of every token goes.
static int pass(ct_engine *e, int n, const int *ids, const float *x_in, const int *slot, const int *pos,
                const int *out, int nout, float *logits, float *hidden, float *top) {
  if (n < 1 || n > e->o.max_tokens)
    return ct_set_error(CT_EINVAL, "engine: %d tokens in one pass (capacity %d)", n, e->o.max_tokens);
  for (int i = 0; i < n; i++) {
    if (slot[i] < 0 || slot[i] >= e->o.slots || pos[i] < 0 || pos[i] >= e->o.max_len)
      return ct_set_error(CT_EINVAL, "engine: token %d at slot %d position %d is outside %d slots "
                          "x %d positions", i, slot[i], pos[i], e->o.slots, e->o.max_len);
    if (!x_in && (ids[i] < 0 || ids[i] >= e->V))
      return ct_set_error(CT_EINVAL, "engine: token id %d is outside the vocabulary of %d", ids[i], e->V);
  }
  for (int k = 0; k < nout; k++)
    if (out[k] < 0 || out[k] >= n) return ct_set_error(CT_EINVAL, "engine: output row %d is not a token of the pass", out[k]);
  if (!x_in) memcpy(e->ids, ids, sizeof(int) * n);
  memcpy(e->pos, pos, sizeof(int) * n);
  memcpy(e->slot, slot, sizeof(int) * n);
  const ct_model_config *c = &e->w->cfg;
  int C = e->C, QKV = e->QKV, Hd = e->H * e->hd, F = e->F;
  if (x_in) memcpy(e->x, x_in, sizeof(float) * n * C);
  else CT_PROF(CT_PROF_E_OTHER, embed_rows(e, n));
  if (c->gemma && !x_in) {  // x *= sqrt(C) (a float32 scalar, as the training forward)
    float es = ct_embed_scale(c);
    for (long i = 0; i < (long)n * C; i++) e->x[i] *= es;
  }
#define NW(w, k) ct_norm_weight(c, (w), (k), e->wn)
  int nu = make_units(e, n);
  bool ext = e->lora_ext;
  for (int l = 0; l < e->L; l++) {
    ct_stop_poll(NULL, 0, 0);  // (a stop within a long prefill)
    const ct_infer_layer *w = &e->w->layers[l];
    bool win = ct_layer_window(c, l) > 0;
    CT_PROF(CT_PROF_E_OTHER, ct_rmsnorm_forward(e->ln, e->rstd, e->x, NW(w->ln1, C), n, C, c->rms_norm_eps));
    // (the adapters folded into the products where the panels hold their B: bf16, pinned)
    ct_linear_lora fq = ext ? folded(e, l, CT_LORA_Q, CT_LORA_V) : (ct_linear_lora){0};
    ct_linear_lora fo = ext ? folded(e, l, CT_LORA_O, CT_LORA_O) : fq;
    ct_linear_lora fg = ext ? folded(e, l, CT_LORA_GATE, CT_LORA_UP) : fq;
    ct_linear_lora fd = ext ? folded(e, l, CT_LORA_DOWN, CT_LORA_DOWN) : fq;
    if (ext) CT_PROF(CT_PROF_E_LINEAR, ct_linear_forward_lora(&w->qkv, e->ln, C, n, e->qkv, QKV, 0, &fq, 0));
    else {
      CT_PROF(CT_PROF_E_LINEAR, ct_linear_forward(&w->qkv, e->ln, C, n, e->qkv, QKV, 0));  // (n, QKV)
      CT_PROF(CT_PROF_E_LORA, lora_add(e, l, CT_LORA_Q, CT_LORA_V, e->ln, C, n, e->qkv, QKV));
    }
    CT_PROF(CT_PROF_E_OTHER, if (w->bqkv) ct_bias_forward(e->qkv, w->bqkv, n, QKV, QKV));
    if (w->qnorm) {
      CT_PROF(CT_PROF_E_OTHER, ct_headnorm_forward(e->qkv, e->qkv_save, e->qk_rstd, NW(w->qnorm, e->hd), n, e->H, e->hd, QKV,
                          c->rms_norm_eps));
      CT_PROF(CT_PROF_E_OTHER, ct_headnorm_forward(e->qkv + Hd, e->qkv_save + Hd, e->qk_rstd + (long)n * e->H, NW(w->knorm, e->hd),
                          n, e->KV, e->hd, QKV, c->rms_norm_eps));
    }
    CT_PROF(CT_PROF_E_OTHER, ct_rope(e->qkv, e->pos, win ? e->rope_cos_local : e->rope_cos, win ? e->rope_sin_local : e->rope_sin, n,
            e->H + e->KV, e->hd, QKV, 0));
    CT_PROF(CT_PROF_E_ATTENTION, attention(e, l, n, nu));
    if (c->gemma) {  // x += norm(att · Woᵀ), the projection in ln (free now), the norm in xo
      if (ext) CT_PROF(CT_PROF_E_LINEAR, ct_linear_forward_lora(&w->o, e->att, Hd, n, e->ln, C, 0, &fo, 0));
      else {
        CT_PROF(CT_PROF_E_LINEAR, ct_linear_forward(&w->o, e->att, Hd, n, e->ln, C, 0));
        CT_PROF(CT_PROF_E_LORA, lora_add(e, l, CT_LORA_O, CT_LORA_O, e->att, Hd, n, e->ln, C));
      }
      CT_PROF(CT_PROF_E_OTHER, ct_rmsnorm_forward(e->xo, e->rstd, e->ln, NW(w->post_attn, C), n, C, c->rms_norm_eps));
      CT_PROF(CT_PROF_E_OTHER, ct_add_rows(e->x, e->xo, n, C));
    } else if (ext) {
      CT_PROF(CT_PROF_E_LINEAR, ct_linear_forward_lora(&w->o, e->att, Hd, n, e->x, C, 1, &fo, 0));
    } else {
      CT_PROF(CT_PROF_E_LINEAR, ct_linear_forward(&w->o, e->att, Hd, n, e->x, C, 1));        // x += att · Woᵀ
      CT_PROF(CT_PROF_E_LORA, lora_add(e, l, CT_LORA_O, CT_LORA_O, e->att, Hd, n, e->x, C));
    }
    CT_PROF(CT_PROF_E_OTHER, ct_rmsnorm_forward(e->ln, e->rstd, e->x, NW(w->ln2, C), n, C, c->rms_norm_eps));
    if (ext) CT_PROF(CT_PROF_E_LINEAR, ct_linear_forward_lora(&w->gu, e->ln, C, n, e->gu, 2 * F, 0, &fg, 0));
    else {
      CT_PROF(CT_PROF_E_LINEAR, ct_linear_forward(&w->gu, e->ln, C, n, e->gu, 2 * F, 0));    // (n, 2F)
      CT_PROF(CT_PROF_E_LORA, lora_add(e, l, CT_LORA_GATE, CT_LORA_UP, e->ln, C, n, e->gu, 2 * F));
    }
    if (c->gemma) {  // x += norm(gelu_tanh(g)·u · Wdownᵀ)
      CT_PROF(CT_PROF_E_OTHER, ct_geglu_forward(e->h, e->gu, n, F));
      if (ext) CT_PROF(CT_PROF_E_LINEAR, ct_linear_forward_lora(&w->down, e->h, F, n, e->ln, C, 0, &fd, 0));
      else {
        CT_PROF(CT_PROF_E_LINEAR, ct_linear_forward(&w->down, e->h, F, n, e->ln, C, 0));
        CT_PROF(CT_PROF_E_LORA, lora_add(e, l, CT_LORA_DOWN, CT_LORA_DOWN, e->h, F, n, e->ln, C));
      }
      CT_PROF(CT_PROF_E_OTHER, ct_rmsnorm_forward(e->xo, e->rstd, e->ln, NW(w->post_ff, C), n, C, c->rms_norm_eps));
      CT_PROF(CT_PROF_E_OTHER, ct_add_rows(e->x, e->xo, n, C));
      continue;
    }
    // x += h · Wdownᵀ, h = swiglu(gu): computed while packed unless the adapter reads h
    if (ext) {  // (the folded adapter reads each row of h as it is narrowed)
      CT_PROF(CT_PROF_E_LINEAR, ct_linear_forward_lora(&w->down, e->gu, 2 * F, n, e->x, C, 1, &fd, 1));
      continue;
    }
    bool h_read = e->w->lora && e->w->lora->w[l][CT_LORA_DOWN].A;
    double t0 = ct_prof_open(CT_PROF_E_LINEAR);
    bool fused = !h_read && !ct_linear_forward_swiglu(&w->down, e->gu, 2 * F, n, e->x, C, 1);
    ct_prof_add(CT_PROF_E_LINEAR, t0);
    if (!fused) {
      CT_PROF(CT_PROF_E_OTHER, ct_swiglu_forward(e->h, NULL, e->gu, n, F));
      CT_PROF(CT_PROF_E_LINEAR, ct_linear_forward(&w->down, e->h, F, n, e->x, C, 1));
    }
    CT_PROF(CT_PROF_E_LORA, lora_add(e, l, CT_LORA_DOWN, CT_LORA_DOWN, e->h, F, n, e->x, C));
  }
  if (top) memcpy(top, e->x, sizeof(float) * n * C);
  if (nout == 0) return 0;
  if (hidden) {  // straight into the caller's buffer
    for (int k = 0; k < nout; k++) memcpy(e->xo + (long)k * C, e->x + (long)out[k] * C, sizeof(float) * C);
    ct_rmsnorm_forward(hidden, e->rstd, e->xo, NW(e->w->norm, C), nout, C, c->rms_norm_eps);
    return 0;
  }
  for (int k = 0; k < nout; k++) memcpy(e->xo + (long)k * C, e->x + (long)out[k] * C, sizeof(float) * C);
  CT_PROF(CT_PROF_E_HEAD, ct_rmsnorm_forward(e->ln, e->rstd, e->xo, NW(e->w->norm, C), nout, C, c->rms_norm_eps);
          ct_linear_forward(&e->w->lm_head, e->ln, C, nout, logits, e->V, 0));
#undef NW
  return 0;
}

int ct_engine_forward(ct_engine *e, int n, const int *ids, const int *slot, const int *pos,
                      const int *out, int nout, float *logits) {
  return pass(e, n, ids, NULL, slot, pos, out, nout, logits, NULL, NULL);
}

int ct_engine_forward_top(ct_engine *e, int n, const int *ids, const float *x_in, const int *slot, const int *pos,
                          const int *out, int nout, float *logits, float *top) {
  return pass(e, n, ids, x_in, slot, pos, out, nout, logits, NULL, top);
}

int ct_engine_forward_hidden(ct_engine *e, int n, const int *ids, const int *slot, const int *pos,
                             const int *out, int nout, float *hidden) {
  return pass(e, n, ids, NULL, slot, pos, out, nout, NULL, hidden, NULL);
}

int ct_engine_copy_slot(ct_engine *e, int src, int dst, int len) {
  if (src < 0 || src >= e->o.slots || dst < 0 || dst >= e->o.slots || len < 0 || len > e->o.max_len)
    return ct_set_error(CT_EINVAL, "engine: cannot copy %d positions from slot %d to slot %d", len, src, dst);
  if (src == dst || len == 0) return 0;
  for (int l = 0; l < e->L; l++) {  // a ring shorter than len holds positions [len - R, len): all of it
    int R = e->kv_rows[l], rows = len < R ? len : R, krows = (rows + 15) / 16 * 16;  // whole key blocks
    size_t KVd = (size_t)e->KV * e->hd, es = e->kv16 ? 2 : 4;
    memcpy((void *)kv_ptr(e->kcache, slot_base(e, l, dst), e->kv16), kv_ptr(e->kcache, slot_base(e, l, src), e->kv16),
           es * KVd * (krows < R ? krows : R));
    memcpy((void *)kv_ptr(e->vcache, slot_base(e, l, dst), e->kv16), kv_ptr(e->vcache, slot_base(e, l, src), e->kv16),
           es * KVd * rows);
  }
  return 0;
}
