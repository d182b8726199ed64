// QK-Clip: the attention kernel's per-head maximum against a float64 reference, and the
// rescaling measured on the model itself — after ct_qkclip_apply the same batch's maxima
// are exactly τ for every clipped head and unchanged for the others (GQA groups that mix
// both included), with biases and with q/k norms; nothing moves when no head is above τ.
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "bf16.h"
#include "forward.h"
#include "lm.h"
#include "mtp.h"
#include "pool.h"
#include "qkclip.h"
#include "rng.h"
#include "test.h"
#include "tiny_model.h"

enum { B = 2, T = 70 };  // 70: the attention's 64-query blocks and a partial one
enum { MT = 48 };         // a model's rows (its RoPE tables hold 64 positions)

// ---------------------------------------------------------------------------
// The kernel's statistic

static void test_attention_head_max_is_the_largest_visible_logit_of_each_head(void) {
  ct_attn_dims d = {.B = 3, .T = T, .H = 4, .KV = 2, .hd = 8};
  long N = (long)d.B * d.T, ld = (d.H + 2 * d.KV) * d.hd;
  float *qkv = malloc(sizeof(float) * N * ld), *out = malloc(sizeof(float) * N * d.H * d.hd);
  float *lse = malloc(sizeof(float) * N * d.H), *scratch = malloc(sizeof(float) * ct_attention_scratch_floats(T, d.hd, d.softcap > 0) * ct_pool_threads());
  int *seg = calloc(N, sizeof(int));
  ct_rng r;
  ct_rng_seed(&r, 3);
  for (long i = 0; i < N * ld; i++) qkv[i] = (float)(2 * ct_rng_normal(&r));
  for (int t = 0; t < T; t++) seg[T + t] = t < 30 ? 0 : 30;  // row 1: two packed documents
  double ref[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  for (int b = 0; b < d.B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < d.H; h++)
        for (int k = seg[b * T + t]; k <= t; k++) {  // only the keys the query sees
          const float *q = qkv + ((long)b * T + t) * ld + h * d.hd, *kk = qkv + ((long)b * T + k) * ld + (d.H + h / 2) * d.hd;
          double s = 0;
          for (int i = 0; i < d.hd; i++) s += (double)q[i] * kk[i];
          ref[h] = fmax(ref[h], s / sqrt(d.hd));
        }
  float hm[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  ct_attention_forward(out, lse, qkv, seg, d, scratch, hm);
  for (int h = 0; h < 4; h++) CHECK_NEAR(hm[h], ref[h], 1e-5 * fabs(ref[h]));
  float big[4] = {1e4f, 1e4f, -INFINITY, 1e4f};  // max-accumulated, never overwritten
  ct_attention_forward(out, lse, qkv, seg, d, scratch, big);
  CHECK(big[0] == 1e4f && big[1] == 1e4f && big[3] == 1e4f);
  CHECK_NEAR(big[2], ref[2], 1e-5 * fabs(ref[2]));
  free(qkv), free(out), free(lse), free(scratch), free(seg);
}

// ---------------------------------------------------------------------------
// The model: maxima measured by a training forward

typedef struct {
  ct_acts a;
  float max[64];  // (L, H)
} probe;

static void probe_init(probe *p, const ct_model *m) {
  if (ct_acts_init(&p->a, m, B, MT, CT_ACTS_KEEP)) exit(1);
  ct_rng r;
  ct_rng_seed(&r, 11);
  for (int n = 0; n < B * MT; n++) {
    p->a.ids[n] = (int)ct_rng_below(&r, (uint64_t)m->cfg.vocab_size);
    p->a.pos[n] = n % MT;
    p->a.seg[n] = 0;
  }
  p->a.qk_max = p->max;
}

// The batch's per-head maxima at m's current weights, into out (L*H).
static void measure(probe *p, const ct_model *m, float *out) {
  int n = m->cfg.num_layers * m->cfg.num_heads;
  for (int i = 0; i < n; i++) p->max[i] = -INFINITY;
  ct_forward(m, &p->a, B, MT);
  memcpy(out, p->max, sizeof(float) * n);
}

// A tiny_config model of `type` with L layers and KV key heads whose logits are large
// enough to matter: matrices normal(0, 0.3 * boost), vectors 1 + normal(0, 0.2), q/k norm
// weights times boost.
static void model_of(ct_model *m, const char *type, int L, int KV, float boost) {
  ct_model_config c = tiny_config(type);
  c.num_layers = L, c.num_kv_heads = KV;
  if (ct_model_init(m, &c, 64)) exit(1);
  ct_model_init_random(m, 5, 0.3f * boost);
  tiny_vectors(m, 6, 1, 0.2);
  for (int l = 0; l < L && c.qk_norm; l++)
    for (int i = 0; i < c.head_dim; i++) m->w.layers[l].qnorm[i] *= boost, m->w.layers[l].knorm[i] *= boost;
}

static void test_no_head_above_tau_leaves_every_weight_bit_identical(void) {
  const char *types[] = {"llama", "qwen2", "qwen3"};
  for (int k = 0; k < 3; k++) {
    ct_model m;
    model_of(&m, types[k], 2, 2, 2);
    probe p;
    probe_init(&p, &m);
    float s[64];
    measure(&p, &m, s);
    ct_qkclip q;
    CHECK_OK(ct_qkclip_init(&q, &m.cfg, 1.0f));
    float top = -INFINITY;
    for (int i = 0; i < q.L * q.H; i++) top = fmaxf(top, s[i]), q.max[i] = s[i];
    q.tau = top;  // at τ exactly: not above it
    float *before = malloc(sizeof(float) * m.n_floats);
    memcpy(before, m.params, sizeof(float) * m.n_floats);
    CHECK(ct_qkclip_apply(&q, &m) == 0);
    CHECK(memcmp(before, m.params, sizeof(float) * m.n_floats) == 0);
    free(before);
    ct_qkclip_free(&q);
    ct_acts_free(&p.a);
    ct_model_free(&m);
  }
}

// Clips at τ = the midpoint of the first two heads (a GQA group, so the group mixes a
// clipped and an unclipped head), then measures again on the same batch. One layer: a
// layer's maxima are τ on the inputs they were measured on, and clipping layer l changes
// the inputs of the layers above it.
static void clip_and_remeasure(const char *type, int H, int KV) {
  ct_model m;
  model_of(&m, type, 1, KV, 2.5f);
  ct_model_config c = m.cfg;
  int n = c.num_layers * H;
  probe p;
  probe_init(&p, &m);
  float s[64], s2[64];
  measure(&p, &m, s);
  float tau = 0.5f * (s[0] + s[1]);
  ct_qkclip q;
  CHECK_OK(ct_qkclip_init(&q, &m.cfg, tau));
  memcpy(q.max, s, sizeof(float) * n);
  float *before = malloc(sizeof(float) * m.n_floats);
  memcpy(before, m.params, sizeof(float) * m.n_floats);
  int expect = 0;
  for (int i = 0; i < n; i++) expect += s[i] > tau;
  CHECK(expect > 0 && expect < n);
  CHECK(ct_qkclip_apply(&q, &m) == expect);
  measure(&p, &m, s2);
  for (int i = 0; i < n; i++) {
    float want = s[i] > tau ? tau : s[i];
    CHECK_NEAR(s2[i], want, 2e-5 * fabs(want));
  }
  // nothing but the q/k rows and biases moved (v, o, MLP, norms, embedding bit for bit)
  const ct_layer_weights *w = &m.w.layers[0];
  long qk = (long)(H + KV) * c.head_dim, wq = w->wqkv - m.params, bq = w->bqkv ? w->bqkv - m.params : -1;
  long moved = 0;
  for (long i = 0; i < m.n_floats; i++) {
    bool qk_part = (i >= wq && i < wq + qk * c.hidden_size) || (bq >= 0 && i >= bq && i < bq + qk);
    if (!qk_part) moved += before[i] != m.params[i];
  }
  CHECK(moved == 0);
  free(before);
  ct_qkclip_free(&q);
  ct_acts_free(&p.a);
  ct_model_free(&m);
}

static void test_gqa_clipped_heads_measure_tau_and_their_group_mates_do_not_change(void) {
  clip_and_remeasure("llama", 4, 2);
}

static void test_biases_scale_with_their_weights(void) { clip_and_remeasure("qwen2", 4, 2); }

static void test_mha_heads_clip_independently(void) { clip_and_remeasure("llama", 4, 4); }

// q/k norms: the layer's shared norm weights carry the factor, so a layer with a head above
// τ scales all its heads by τ / (its largest maximum): that head lands on τ.
static void check_qk_norm_layers(const char *type) {
  ct_model m;
  model_of(&m, type, 1, 2, 3);
  probe p;
  probe_init(&p, &m);
  int L = m.cfg.num_layers, H = m.cfg.num_heads;
  float s[64], s2[64], top[8];
  measure(&p, &m, s);
  for (int l = 0; l < L; l++) {
    top[l] = -INFINITY;
    for (int h = 0; h < H; h++) top[l] = fmaxf(top[l], s[l * H + h]);
  }
  float tau = 0.5f * (s[0] + s[1]);
  ct_qkclip q;
  CHECK_OK(ct_qkclip_init(&q, &m.cfg, tau));
  memcpy(q.max, s, sizeof(float) * L * H);
  CHECK(ct_qkclip_apply(&q, &m) > 0);
  measure(&p, &m, s2);
  for (int l = 0; l < L; l++)
    for (int h = 0; h < H; h++) {
      double want = s[l * H + h] * (double)tau / top[l];
      CHECK_NEAR(s2[l * H + h], want, 2e-5 * fabs(want));
    }
  ct_qkclip_free(&q);
  ct_acts_free(&p.a);
  ct_model_free(&m);
}

// Qwen3's norms multiply by w; Gemma 3's by (1 + w), which is what must scale.
static void test_qk_norm_layers_scale_as_a_whole_to_put_their_hottest_head_on_tau(void) {
  check_qk_norm_layers("qwen3");
  check_qk_norm_layers("gemma3_text");
}

// The bf16 compute copy the matmuls read follows the rescaled weights.
static void test_bf16_compute_copy_follows_the_rescaled_weights(void) {
  ct_model m;
  model_of(&m, "llama", 2, 2, 2);
  probe p;
  probe_init(&p, &m);
  float s[64];
  measure(&p, &m, s);
  CHECK_OK(ct_model_bf16_compute(&m));
  ct_qkclip q;
  CHECK_OK(ct_qkclip_init(&q, &m.cfg, 0.5f * (s[0] + s[1])));
  memcpy(q.max, s, sizeof(float) * q.L * q.H);
  CHECK(ct_qkclip_apply(&q, &m) > 0);
  long bad = 0;
  for (long i = 0; i < m.n_floats; i++) bad += m.compute16[i] != ct_f32_to_bf16(m.params[i]);
  CHECK(bad == 0);
  ct_qkclip_free(&q);
  ct_acts_free(&p.a);
  ct_model_free(&m);
}

// Multi-token prediction: one decoder layer and one depth whose block's q/k weights are
// larger, so its heads are the hottest. A step through ct_lm_step (the production path:
// trunk, then ct_mtp_step) records the block's maxima in row L; clipping at a τ between
// them (above every decoder head) brings the block's clipped heads to τ on the same
// batch and leaves the decoder layer bit for bit.
static void mtp_maxima(const ct_model *m, float *max) {  // max ((L + D) * H)
  const ct_model_config *c = &m->cfg;
  int Bm = 2, Tm = 8, N = Bm * Tm;
  ct_acts a;
  ct_head h;
  ct_mtp t;
  ct_batch b;
  if (ct_acts_init(&a, m, Bm, Tm, CT_ACTS_FORWARD) || ct_head_init(&h, N, N, c->vocab_size, c->hidden_size, 1) ||
      ct_batch_init(&b, Bm, Tm) || ct_mtp_init(&t, m, Bm, Tm, false))
    exit(1);
  b.B = Bm, b.T = Tm, b.n_target = 0;
  ct_rng r;
  ct_rng_seed(&r, 12);
  for (int n = 0; n < N; n++) {
    b.ids[n] = (int)ct_rng_below(&r, (uint64_t)c->vocab_size);
    b.pos[n] = n % Tm, b.seg[n] = 0;
  }
  for (int n = 0; n < N; n++) b.target[n] = n % Tm < Tm - 1 ? b.ids[n + 1] : -1, b.n_target += b.target[n] >= 0;
  double nk[CT_MTP_MAX] = {0};
  ct_mtp_count(b.target, b.seg, Bm, Tm, c->mtp_layers, nk);
  ct_mtp_set_scale(&t, 0.1f, nk);
  a.mtp = &t;
  for (int i = 0; i < (c->num_layers + c->mtp_layers) * c->num_heads; i++) max[i] = -INFINITY;
  a.qk_max = max;
  ct_lm_stats st = {0};
  CHECK_OK(ct_lm_step(m, &a, &h, &b, NULL, 1.0f / (float)b.n_target, 0, &st));
  ct_mtp_free(&t);
  ct_batch_free(&b);
  ct_head_free(&h);
  ct_acts_free(&a);
}

static void test_mtp_blocks_are_clipped_like_decoder_layers(void) {
  ct_model_config c = tiny_config("llama");
  c.num_layers = 1, c.mtp_layers = 1;
  ct_model m;
  if (ct_model_init(&m, &c, 64)) exit(1);
  ct_model_init_random(&m, 5, 0.3f);
  ct_layer_weights *w = &m.w.mtp[0].block;
  for (long i = 0; i < (long)(c.num_heads + c.num_kv_heads) * c.head_dim * c.hidden_size; i++) w->wqkv[i] *= 3;
  int H = c.num_heads, n = 2 * H;
  float s[16], s2[16];
  mtp_maxima(&m, s);
  float main_top = -INFINITY;
  for (int h = 0; h < H; h++) {
    main_top = fmaxf(main_top, s[h]);
    CHECK(isfinite(s[h]) && isfinite(s[H + h]));
  }
  float tau = fmaxf(main_top, 0.5f * (s[H] + s[H + 1]));
  int expect = 0;
  for (int h = 0; h < H; h++) expect += s[H + h] > tau;
  CHECK(expect > 0 && expect < H);  // the block has heads on both sides of τ; the decoder none above
  ct_qkclip q;
  CHECK_OK(ct_qkclip_init(&q, &m.cfg, tau));
  CHECK(q.L == 2);
  memcpy(q.max, s, sizeof(float) * n);
  float *before = malloc(sizeof(float) * m.n_floats);
  memcpy(before, m.params, sizeof(float) * m.n_floats);
  CHECK(ct_qkclip_apply(&q, &m) == expect);
  mtp_maxima(&m, s2);
  for (int i = 0; i < n; i++) {
    float want = s[i] > tau ? tau : s[i];
    CHECK_NEAR(s2[i], want, 2e-5 * fabs(want));
  }
  long moved = 0, mtp0 = m.w.mtp[0].enorm - m.params;
  for (long i = 0; i < mtp0; i++) moved += before[i] != m.params[i];
  CHECK(moved == 0);
  free(before);
  ct_qkclip_free(&q);
  ct_model_free(&m);
}

static void test_init_rejects_thresholds_that_are_not_positive(void) {
  ct_model_config c = tiny_config("llama");
  ct_qkclip q;
  CHECK(ct_qkclip_init(&q, &c, 0) == CT_EINVAL);
  CHECK(ct_qkclip_init(&q, &c, -1) == CT_EINVAL);
  CHECK(ct_qkclip_init(&q, &c, NAN) == CT_EINVAL);
  CHECK_OK(ct_qkclip_init(&q, &c, 5));
  CHECK(ct_qkclip_max(&q) == -INFINITY);
  q.max[3] = 2, q.max[5] = 7;
  CHECK(ct_qkclip_max(&q) == 7);
  ct_qkclip_reset(&q);
  CHECK(ct_qkclip_max(&q) == -INFINITY);
  ct_qkclip_free(&q);
}

int main(void) {
  if (ct_pool_init(2)) return 1;
  RUN(test_attention_head_max_is_the_largest_visible_logit_of_each_head);
  RUN(test_no_head_above_tau_leaves_every_weight_bit_identical);
  RUN(test_gqa_clipped_heads_measure_tau_and_their_group_mates_do_not_change);
  RUN(test_biases_scale_with_their_weights);
  RUN(test_mha_heads_clip_independently);
  RUN(test_qk_norm_layers_scale_as_a_whole_to_put_their_hottest_head_on_tau);
  RUN(test_bf16_compute_copy_follows_the_rescaled_weights);
  RUN(test_mtp_blocks_are_clipped_like_decoder_layers);
  RUN(test_init_rejects_thresholds_that_are_not_positive);
  ct_pool_free();
  return test_summary();
}
