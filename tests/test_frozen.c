// frozen: the forward-only model behind references and teachers. A float32 frozen copy
// gives the policy's own log-probs bit for bit (the DPO/GRPO "policy == reference"
// starting point relies on it); its hidden states are the training forward's; the int8
// storage stays close to float32; and nothing a forward does changes the weights.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "bf16.h"
#include "frozen.h"
#include "lm.h"
#include "mem.h"
#include "pool.h"
#include "dnnl.h"
#include "test.h"
#include "tiny_model.h"

enum { B = 3, T = 9 };

// Three rows of different lengths (right-padded), targets on every real next token.
static void make_batch(ct_batch *b, int V) {
  if (ct_batch_init(b, B, T)) exit(1);
  b->B = B;
  b->T = T;
  b->n_target = b->n_tokens = 0;
  int lens[B] = {9, 6, 4};
  for (int r = 0; r < B; r++) {
    int ids[T];
    for (int t = 0; t < lens[r]; t++) ids[t] = (r * 11 + t * 7 + 3) % V;
    ct_batch_row(b, r, ids, 1, ids + 1, lens[r] - 1, 0);
  }
}

// A float32 copy of a model's weights for the frozen module (which takes ownership).
static void copy_model(ct_model *dst, const ct_model *src) {
  if (ct_model_init(dst, &src->cfg, T)) exit(1);
  memcpy(dst->params, src->params, sizeof(float) * src->n_floats);
}

// A policy m with its own activations and head, a frozen copy of it as `dtype` with a head
// of `ntiles` vocabulary chunks, and a batch: both heads at temperature 0.7 (as GRPO's
// reference uses).
typedef struct {
  ct_model m;
  ct_frozen f;
  ct_batch b;
  ct_acts a;
  ct_head h1, h2;
} pair_t;

static void pair_init(pair_t *p, const char *type, int dtype, int ntiles) {
  ct_model c;
  tiny_model(&p->m, type);
  copy_model(&c, &p->m);
  CHECK_OK(ct_frozen_init(&p->f, &c, dtype, B, T));
  make_batch(&p->b, p->m.cfg.vocab_size);
  CHECK_OK(ct_acts_init(&p->a, &p->m, B, T, CT_ACTS_KEEP));
  CHECK_OK(ct_head_init(&p->h1, B * T, B * T, p->m.cfg.vocab_size, p->m.cfg.hidden_size, 1));
  CHECK_OK(ct_head_init(&p->h2, B * T, B * T, p->m.cfg.vocab_size, p->m.cfg.hidden_size, ntiles));
  p->h1.inv_temp = p->h2.inv_temp = 1 / 0.7f;
}

static void pair_free(pair_t *p) {
  ct_head_free(&p->h1);
  ct_head_free(&p->h2);
  ct_acts_free(&p->a);
  ct_batch_free(&p->b);
  ct_frozen_free(&p->f);
  ct_model_free(&p->m);
}

static void check_f32_logps_equal_the_policy_bit_for_bit(const char *type) {
  pair_t p;
  pair_init(&p, type, CT_STORE_F32, 1);
  int C = p.m.cfg.hidden_size;
  int n1 = ct_lm_forward(&p.m, &p.a, &p.h1, &p.b), n2 = ct_frozen_logps(&p.f, &p.b, &p.h2);
  CHECK(n1 == (int)p.b.n_target && n2 == n1);
  CHECK(n1 > 0 && !memcmp(p.h1.logp, p.h2.logp, sizeof(float) * n1));
  CHECK(!memcmp(p.h1.rows, p.h2.rows, sizeof(int) * n1));
  // the hidden states of the target rows are the training forward's
  float *hid = malloc(sizeof(float) * n1 * C);
  CHECK(ct_frozen_hidden(&p.f, &p.b, hid) == n1);
  for (int q = 0; q < n1; q++)
    for (int k = 0; k < C; k++) CHECK(hid[(long)q * C + k] == p.a.lnf[(long)p.h1.rows[q] * C + k]);
  free(hid);
  pair_free(&p);
}

static void test_f32_logps_equal_the_policy_bit_for_bit(void) {
  check_f32_logps_equal_the_policy_bit_for_bit("llama");
  check_f32_logps_equal_the_policy_bit_for_bit("qwen2");
  check_f32_logps_equal_the_policy_bit_for_bit("qwen3");
  check_f32_logps_equal_the_policy_bit_for_bit("gemma3_text");
}

// A LoRA policy's reference is a view of its model run through the policy's own
// activations (ct_frozen_through): whatever mode those were made for, it gives the policy's
// log-probs bit for bit, and the policy's next forward through them is unchanged.
static void check_view_through_policy_acts(const char *type) {
  pair_t p;
  pair_init(&p, type, CT_STORE_F32, 1);
  int n1 = ct_lm_forward(&p.m, &p.a, &p.h1, &p.b);
  float *want = malloc(sizeof(float) * n1);
  memcpy(want, p.h1.logp, sizeof(float) * n1);
  ct_frozen v;
  CHECK_OK(ct_frozen_view(&v, &p.m, 0, T));
  CHECK(v.acts.mem == NULL);  // none of its own
  for (int mode = CT_ACTS_FORWARD; mode <= CT_ACTS_RECOMPUTE; mode++) {
    ct_acts a;
    CHECK_OK(ct_acts_init(&a, &p.m, B, T, mode));
    ct_frozen_through(&v, &a);
    CHECK(ct_frozen_logps(&v, &p.b, &p.h2) == n1);
    CHECK(!memcmp(p.h2.logp, want, sizeof(float) * n1));
    CHECK(ct_lm_forward(&p.m, &a, &p.h2, &p.b) == n1);  // the owner's pass after it
    CHECK(!memcmp(p.h2.logp, want, sizeof(float) * n1));
    ct_acts_free(&a);
  }
  ct_frozen_through(&v, &p.a);  // the policy's KEEP activations, as DPO and GRPO do
  CHECK(ct_frozen_logps(&v, &p.b, &p.h2) == n1 && !memcmp(p.h2.logp, want, sizeof(float) * n1));
  ct_frozen_free(&v);  // (must not free the borrowed activations: pair_free does)
  free(want);
  pair_free(&p);
}

static void test_a_view_through_the_policys_activations_gives_its_log_probs(void) {
  check_view_through_policy_acts("llama");
  check_view_through_policy_acts("qwen3");
  check_view_through_policy_acts("gemma3_text");
}

// int8: the log-probs are exactly those of the engine's own int8 logits (same rows, same
// targets: 1e-5 allows the head's chunked float log-sum-exp against a double one), and
// close to float32's. int8 rounds every weight (per-row absmax / 127) and every matmul
// input row, which moves this model's logits by up to ~0.06 (test_engine); at
// temperature 0.7 a log-prob moves by up to about twice that / 0.7, so 0.3 nat bounds
// it, while a misplaced or unscaled row is off by whole nats.
static void check_int8_logps(const char *type) {
  pair_t p;
  pair_init(&p, type, CT_STORE_INT8, 3);  // the int8 head in 3 vocabulary chunks
  CHECK(ct_frozen_params(&p.f) == NULL && p.f.model.params == NULL);  // the fp32 copy is gone
  uint64_t sum = ct_frozen_checksum(&p.f);
  int n1 = ct_lm_forward(&p.m, &p.a, &p.h1, &p.b), n2 = ct_frozen_logps(&p.f, &p.b, &p.h2);
  CHECK(n2 == n1 && !memcmp(p.h1.rows, p.h2.rows, sizeof(int) * n1) &&
        !memcmp(p.h1.target, p.h2.target, sizeof(int) * n1));
  int V = p.m.cfg.vocab_size, N = B * T, outs[B * T], nout = 0;
  for (int i = 0; i < N; i++)
    if (p.b.target[i] >= 0) outs[nout++] = i;
  float *lg = malloc(sizeof(float) * nout * V);
  // the same pass the module ran (its slot/pos arrays still hold the placement)
  CHECK_OK(ct_engine_forward(p.f.engine, N, p.b.ids, p.f.slot, p.f.pos, outs, nout, lg));
  double worst = 0, exact = 0;
  for (int q = 0; q < n1; q++) {
    const float *l = lg + (long)q * V;
    double mx = -INFINITY, z = 0;
    for (int v = 0; v < V; v++) mx = fmax(mx, l[v] / 0.7);
    for (int v = 0; v < V; v++) z += exp(l[v] / 0.7 - mx);
    exact = fmax(exact, fabs(l[p.h2.target[q]] / 0.7 - mx - log(z) - p.h2.logp[q]));
    worst = fmax(worst, fabs((double)p.h1.logp[q] - p.h2.logp[q]));
  }
  fprintf(stderr, "    %s int8 vs fp32: max |Δ log-prob| %.4f over %d tokens; vs the engine's logits %.2g\n",
          type, worst, n1, exact);
  CHECK(exact < 1e-5);
  CHECK(worst < 0.3 && worst > 0);
  CHECK(ct_frozen_checksum(&p.f) == sum);
  free(lg);
  pair_free(&p);
}

static void test_int8_logps_are_close_to_f32_and_use_the_same_rows(void) {
  check_int8_logps("qwen2");
  check_int8_logps("gemma3_text");  // the engine's sliding-window ring, four norms per layer
}

// bfloat16 storage widens each layer exactly: its log-probs equal, bit for bit, those of a
// float32 model whose weights were rounded to bf16 beforehand (same kernels, same order),
// and stay close to the unrounded model's (weights move by at most 2^-9 relative).
static void check_bf16_rounded(const char *type) {
  pair_t p;
  pair_init(&p, type, CT_STORE_BF16, 2);
  CHECK(p.f.model.params == NULL && p.f.model.params16 != NULL);
  ct_model r;  // the policy's weights rounded to bf16, kept in fp32
  copy_model(&r, &p.m);
  for (long i = 0; i < r.n_floats; i++) r.params[i] = ct_bf16_to_f32(ct_f32_to_bf16(r.params[i]));
  ct_head h3;
  CHECK_OK(ct_head_init(&h3, B * T, B * T, r.cfg.vocab_size, r.cfg.hidden_size, 2));
  h3.inv_temp = p.h2.inv_temp;
  int n1 = ct_lm_forward(&p.m, &p.a, &p.h1, &p.b), n2 = ct_frozen_logps(&p.f, &p.b, &p.h2);
  int n3 = ct_lm_forward(&r, &p.a, &h3, &p.b);
  CHECK(n2 == n1 && n3 == n1 && n1 > 0);
  CHECK(!memcmp(h3.logp, p.h2.logp, sizeof(float) * n1));
  double worst = 0;
  for (int q = 0; q < n1; q++) worst = fmax(worst, fabs((double)p.h1.logp[q] - p.h2.logp[q]));
  fprintf(stderr, "    %s bf16 vs fp32: max |Δ log-prob| %.4f over %d tokens\n", type, worst, n1);
  CHECK(worst > 0 && worst < 0.05);
  // hidden states and logits chunks agree with the rounded model's too
  int C = r.cfg.hidden_size, V = r.cfg.vocab_size;
  float *hid = malloc(sizeof(float) * n1 * C), *l1 = malloc(sizeof(float) * n1 * V), *l2 = malloc(sizeof(float) * n1 * V);
  CHECK(ct_frozen_hidden(&p.f, &p.b, hid) == n1);
  ct_frozen_logits(&p.f, hid, n1, 3, V - 5, l1);
  ct_model_logits(&r, hid, n1, 3, V - 5, l2);
  CHECK(!memcmp(l1, l2, sizeof(float) * n1 * (V - 5)));
  ct_free_all(hid, l1, l2);
  ct_head_free(&h3);
  ct_model_free(&r);
  pair_free(&p);
}

static void test_bf16_equals_a_float32_model_of_rounded_weights(void) {
  check_bf16_rounded("qwen3");
  check_bf16_rounded("gemma3_text");  // Gemma's extra norms widen with the layer
}

// A batch past the capacity, or a position past T, is an error, not a write out of bounds.
static void test_oversized_batches_are_errors(void) {
  ct_model m, c;
  tiny_model(&m, "llama");
  copy_model(&c, &m);
  ct_frozen f;
  CHECK_OK(ct_frozen_init(&f, &c, CT_STORE_F32, 1, T));
  ct_batch b;
  make_batch(&b, m.cfg.vocab_size);
  float *hid = malloc(sizeof(float) * B * T * m.cfg.hidden_size);
  CHECK(ct_frozen_hidden(&f, &b, hid) == CT_EINVAL);
  free(hid);
  ct_batch_free(&b);
  ct_frozen_free(&f);
  ct_model_free(&m);
}

// bf16 compute (bf16: true): a float32 reference multiplies in bf16 exactly as the policy
// does, so equal weights still give equal log-probs bit for bit — and not float32's; after
// TR-DPO writes its parameters, ct_frozen_params_changed brings its bf16 copy along.
static void test_bf16_compute_equals_the_bf16_policy_and_follows_syncs(void) {
  if (!ct_dnnl_bf16_cpu()) {
    fprintf(stderr, "  skipped: no bf16 hardware\n");
    return;
  }
  CHECK_OK(ct_dnnl_init());
  pair_t p;
  pair_init(&p, "qwen2", CT_STORE_F32, 1);
  int n0 = ct_lm_forward(&p.m, &p.a, &p.h1, &p.b);
  float *f32 = malloc(sizeof(float) * n0);
  memcpy(f32, p.h1.logp, sizeof(float) * n0);
  ct_acts_free(&p.a);
  CHECK_OK(ct_model_bf16_compute(&p.m));
  CHECK_OK(ct_acts_init(&p.a, &p.m, B, T, CT_ACTS_KEEP));
  CHECK_OK(ct_frozen_compute_bf16(&p.f));
  int n1 = ct_lm_forward(&p.m, &p.a, &p.h1, &p.b), n2 = ct_frozen_logps(&p.f, &p.b, &p.h2);
  CHECK(n1 == n0 && n2 == n1);
  CHECK(!memcmp(p.h1.logp, p.h2.logp, sizeof(float) * n1));
  double moved = 0;
  for (int q = 0; q < n1; q++) moved = fmax(moved, fabs(p.h1.logp[q] - f32[q]));
  fprintf(stderr, "  bf16 compute moves the log-probs by up to %.3g\n", moved);
  CHECK(moved > 0 && moved < 0.1);
  for (long i = 0; i < p.m.n_floats; i++) p.m.params[i] *= 1.5f;  // a new policy, synced in
  ct_model_bf16_refresh(&p.m);
  memcpy(ct_frozen_params(&p.f), p.m.params, sizeof(float) * p.m.n_floats);
  ct_frozen_params_changed(&p.f);
  n1 = ct_lm_forward(&p.m, &p.a, &p.h1, &p.b);
  n2 = ct_frozen_logps(&p.f, &p.b, &p.h2);
  CHECK(n2 == n1 && !memcmp(p.h1.logp, p.h2.logp, sizeof(float) * n1));
  free(f32);
  pair_free(&p);
}

int main(void) {
  ct_pool_init(2);
  RUN(test_f32_logps_equal_the_policy_bit_for_bit);
  RUN(test_a_view_through_the_policys_activations_gives_its_log_probs);
  RUN(test_int8_logps_are_close_to_f32_and_use_the_same_rows);
  RUN(test_bf16_equals_a_float32_model_of_rounded_weights);
  RUN(test_oversized_batches_are_errors);
  RUN(test_bf16_compute_equals_the_bf16_policy_and_follows_syncs);
  ct_pool_free();
  return test_summary();
}
