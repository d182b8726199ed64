// lora: adapters against an independent float64 reference — the loss of base + adapters
// equals the reference's loss of the merged weights W + s·B·A, and the gradients of every
// A and B equal central differences of that reference; step 0 (B = 0) is the base bit for
// bit; a merged model's logits equal base + adapters; PEFT files round-trip; dropout's
// gradient matches finite differences of the same masked forward; bad adapters are
// refused with a clear message.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adapter.h"
#include "bf16.h"
#include "engine.h"
#include "forward.h"
#include "fs.h"
#include "head.h"
#include "hf.h"
#include "lora.h"
#include "amx.h"
#include "matmul.h"
#include "pool.h"
#include "quant.h"
#include "ref_lora.h"
#include "ref_model.h"
#include "rng.h"
#include "test.h"
#include "thin.h"
#include "tiny_model.h"
#include "weights.h"

enum { B = 2, T = 6, N = B * T };

typedef struct {
  int ids[N], pos[N], seg[N], target[N];
} batch_t;

static batch_t make_batch(int V) {
  batch_t b;
  for (int n = 0; n < N; n++) {
    b.ids[n] = (n * 7 + 3) % V;
    b.pos[n] = n % T;
    b.seg[n] = 0;
    b.target[n] = n % T < T - 1 ? (n * 5 + 1) % V : -1;
  }
  return b;
}

static ct_lora_config all_linear(int r, double dropout) {
  return (ct_lora_config){.r = r, .alpha = 3, .dropout = dropout, .targets = (1u << CT_LORA_TARGETS) - 1};
}

// Mean cross-entropy of the batch through m with adapters lo (grads accumulated into
// lo->grads when set, and into g when not NULL); logits of every token into `logits`.
static int ours_mode = CT_ACTS_KEEP, ours_kept = 0;  // (recomputation: check_dropout_gradients)

// Whether training activations for this batch take the down adapter's dA from SwiGLU's
// input (no h computed: ct_adapter_backward_down_gu) at layer 0.
static bool down_from_gu(const ct_model *m, const ct_lora *lo) {
  ct_acts a;
  if (ct_acts_init_kept(&a, m, B, T, CT_ACTS_KEEP, 0) || ct_acts_attach_lora(&a, lo)) exit(1);
  ct_adapter_run run = {lo, a.lora_mem, N, CT_ACTS_KEEP, false};
  bool yes = ct_adapter_down_from_gu(&run, 0, N);
  ct_acts_free(&a);
  return yes;
}

static double ours(const ct_model *m, ct_lora *lo, const ct_weights *g, const batch_t *b, float *logits) {
  const ct_model_config *c = &m->cfg;
  ct_acts a;
  ct_head h;
  if (ct_acts_init_kept(&a, m, B, T, ours_mode, ours_kept) || ct_acts_attach_lora(&a, lo) ||
      ct_head_init(&h, N, N, c->vocab_size, c->hidden_size, 1))
    exit(1);
  memcpy(a.ids, b->ids, sizeof b->ids);
  memcpy(a.pos, b->pos, sizeof b->pos);
  memcpy(a.seg, b->seg, sizeof b->seg);
  ct_forward(m, &a, B, T);
  if (logits) ct_sgemm('N', 'T', N, c->vocab_size, c->hidden_size, 1, a.lnf, c->hidden_size, m->w.lm_head,
                       c->hidden_size, 0, logits, c->vocab_size);
  int n = ct_head_gather(&h, a.lnf, b->target, N);
  ct_head_forward(&h, m->w.lm_head);
  double loss = 0;
  for (int r = 0; r < n; r++) {
    loss -= h.logp[r];
    h.coef[r] = 1.0f / n;
    h.zcoef[r] = 0;
  }
  if (g) {
    ct_head_backward(&h, m->w.lm_head, g->lm_head, a.dln, N);
    ct_backward(m, g, &a, a.dln, B, T);
  }
  ct_head_free(&h);
  ct_acts_free(&a);
  return loss / n;
}

// A model whose weights are all frozen: gradient views with every member NULL.
static void frozen_grads(ct_weights *g, const ct_model *m) {
  memset(g, 0, sizeof *g);
  g->layers = calloc(m->cfg.num_layers, sizeof *g->layers);
}

static void random_adapters(ct_lora *lo, const ct_model *m, uint64_t seed) {
  ct_lora_init_weights(lo, m, seed);
  ct_rng r;
  ct_rng_seed(&r, seed + 1);
  for (int i = 0; i < lo->n_tensors; i++)  // B non-zero, so that dA is not 0
    if (strstr(lo->tensors[i].name, "lora_B"))
      for (long k = 0; k < lo->tensors[i].numel; k++)
        lo->params[lo->tensors[i].offset + k] = (float)(0.3 * ct_rng_normal(&r));
}

static void check_gradients_against_reference(const char *type, int r) {
  ct_model m;
  tiny_model(&m, type);
  ct_lora lo;
  ct_lora_config lc = all_linear(r, 0);
  CHECK_OK(ct_lora_init(&lo, &lc, &m.cfg));
  random_adapters(&lo, &m, 11);
  float *grads = calloc(lo.n_floats, sizeof(float));
  ct_lora_bind_grads(&lo, grads);
  ct_weights g;
  frozen_grads(&g, &m);
  batch_t b = make_batch(m.cfg.vocab_size);
  double loss = ours(&m, &lo, &g, &b, NULL);
  double *P = malloc(sizeof(double) * m.n_floats);
  ref_lora_merged(P, &m, &lo);
  ref_t ref = {&m, P};
  double want = ref_mean_loss(&ref, B, T, b.ids, b.pos, b.seg, b.target, 0);
  CHECK_NEAR(loss, want, 2e-5 * fabs(want));
  // every adapter element: central differences of the reference over the merged weights
  double worst = 0;
  int bad = 0, checked = 0;
  for (long i = 0; i < lo.n_floats; i += r > 4 ? 7 : 1) {  // rank 16: every 7th element
    bool used = false;
    for (int k = 0; k < lo.n_tensors && !used; k++)
      used = i >= lo.tensors[k].offset && i < lo.tensors[k].offset + lo.tensors[k].numel;
    if (!used) continue;
    float keep = lo.params[i], e = 1e-3f;
    lo.params[i] = keep + e;
    ref_lora_merged(P, &m, &lo);
    double lp = ref_mean_loss(&ref, B, T, b.ids, b.pos, b.seg, b.target, 0);
    lo.params[i] = keep - e;
    ref_lora_merged(P, &m, &lo);
    double lm = ref_mean_loss(&ref, B, T, b.ids, b.pos, b.seg, b.target, 0);
    lo.params[i] = keep;
    double fd = (lp - lm) / (2.0 * e), err = fabs(grads[i] - fd);
    worst = fmax(worst, err);
    bad += err > 1e-4 + 2e-3 * fabs(fd);
    checked++;
  }
  fprintf(stderr, "    %s, r %d: %d adapter gradients checked, worst |diff| %.2e\n", type, r, checked, worst);
  CHECK(bad == 0 && checked > 100);
  free(P);
  free(grads);
  ct_weights_free(&g);
  ct_lora_free(&lo);
  ct_model_free(&m);
}

static void test_adapter_gradients_match_float64_reference_of_merged_weights(void) {
  check_gradients_against_reference("llama", 2);
  check_gradients_against_reference("qwen2", 2);
  check_gradients_against_reference("qwen3", 2);
  check_gradients_against_reference("gemma3_text", 2);  // o_proj and down_proj feed the post norms
  check_gradients_against_reference("qwen2", 16);  // rank 16: thin.h's kernels instead of sgemm
}

// The sampler's engine applies the adapters too: its logits (KV cache, fixed-order
// products) equal the training forward's with the same adapters, as the base's do.
static void check_engine_against_training_forward(int r) {
  ct_model m;
  tiny_model(&m, "qwen3");
  ct_lora lo;
  ct_lora_config lc = all_linear(r, 0.5);  // dropout: training forwards only, not the engine's
  CHECK_OK(ct_lora_init(&lo, &lc, &m.cfg));
  random_adapters(&lo, &m, 9);
  batch_t b = make_batch(m.cfg.vocab_size);
  int V = m.cfg.vocab_size;
  float *want = malloc(sizeof(float) * N * V), *got = malloc(sizeof(float) * N * V);
  // the training forward without dropout: an evaluation (CT_ACTS_FORWARD) pass
  ct_acts a;
  CHECK_OK(ct_acts_init(&a, &m, B, T, CT_ACTS_FORWARD));
  CHECK_OK(ct_acts_attach_lora(&a, &lo));
  memcpy(a.ids, b.ids, sizeof b.ids);
  memcpy(a.pos, b.pos, sizeof b.pos);
  memcpy(a.seg, b.seg, sizeof b.seg);
  ct_forward(&m, &a, B, T);
  ct_sgemm('N', 'T', N, V, m.cfg.hidden_size, 1, a.lnf, m.cfg.hidden_size, m.w.lm_head, m.cfg.hidden_size, 0, want, V);
  ct_infer_weights w;
  ct_engine *e;
  ct_engine_opts o = {B, T, N, false};
  CHECK_OK(ct_infer_from_model(&w, &m));
  CHECK_OK(ct_infer_attach_lora(&w, &lo));
  CHECK_OK(ct_engine_init(&e, &w, &o));
  int slot[N], out[N];
  for (int i = 0; i < N; i++) slot[i] = i / T, out[i] = i;
  CHECK_OK(ct_engine_forward(e, N, b.ids, slot, b.pos, out, N, got));
  double worst = 0;
  for (long i = 0; i < (long)N * V; i++) worst = fmax(worst, fabs(want[i] - got[i]));
  fprintf(stderr, "    engine with adapters (r %d) vs training forward: max |logit diff| %.2e\n", r, worst);
  CHECK(worst < 2e-5);
  // batch invariance: each sequence alone gives its rows of the batch's logits, bit for bit
  float *alone = malloc(sizeof(float) * T * V);
  int local[T];
  for (int i = 0; i < T; i++) local[i] = i;
  for (int s = 0; s < B; s++) {
    CHECK_OK(ct_engine_forward(e, T, b.ids + s * T, slot + s * T, b.pos + s * T, local, T, alone));
    CHECK(memcmp(alone, got + (long)s * T * V, sizeof(float) * T * V) == 0);
  }
  free(alone);
  // adapters packed once for a generation (ct_engine_lora_pin): the same bits as packed per
  // call; unpinned again, a change to the adapters shows in the next pass
  float *pinned = malloc(sizeof(float) * N * V);
  ct_engine_lora_pin(e);
  CHECK_OK(ct_engine_forward(e, N, b.ids, slot, b.pos, out, N, pinned));
  CHECK(memcmp(pinned, got, sizeof(float) * N * V) == 0);
  lo.w[0][CT_LORA_V].B[0] += 1.0f;
  CHECK_OK(ct_engine_forward(e, N, b.ids, slot, b.pos, out, N, pinned));
  CHECK(memcmp(pinned, got, sizeof(float) * N * V) == 0);  // (pinned: the packed copy is what runs)
  ct_engine_lora_unpin(e);
  CHECK_OK(ct_engine_forward(e, N, b.ids, slot, b.pos, out, N, pinned));
  CHECK(memcmp(pinned, got, sizeof(float) * N * V) != 0);
  lo.w[0][CT_LORA_V].B[0] -= 1.0f;
  free(pinned);
  ct_engine_free(e);
  ct_infer_free(&w);
  ct_acts_free(&a);
  free(want);
  free(got);
  ct_lora_free(&lo);
  ct_model_free(&m);
}

static void test_engine_with_adapters_matches_the_training_forward(void) {
  check_engine_against_training_forward(3);
  check_engine_against_training_forward(16);  // x·Aᵀ on thin.h's kernel in both
}

// bf16 panels carry rank-16 adapters' B in extension columns (linear.h), and a pinned engine
// folds the adapters into its products (bf16 terms, fp32 sums). Its logits: against the
// unfolded adapters (fp32 thin.h terms over the same bf16 base) within a small part of what
// the adapters change, so every B sits in its place; each sequence alone the batch's bits;
// B changed after pinning unseen until unpinned, when the unfolded path's bits return.
static void check_engine_folds_adapters(const char *type) {
  ct_model m;
  tiny_model(&m, type);
  ct_lora lo;
  ct_lora_config lc = all_linear(CT_THIN_R, 0);
  CHECK_OK(ct_lora_init(&lo, &lc, &m.cfg));
  random_adapters(&lo, &m, 19);
  batch_t b = make_batch(m.cfg.vocab_size);
  int V = m.cfg.vocab_size, slot[N], out[N], local[T];
  for (int i = 0; i < N; i++) slot[i] = i / T, out[i] = i;
  for (int i = 0; i < T; i++) local[i] = i;
  float *base = malloc(sizeof(float) * N * V), *plain = malloc(sizeof(float) * N * V);
  float *folded = malloc(sizeof(float) * N * V), *alone = malloc(sizeof(float) * T * V);
  ct_infer_weights w0, w;
  ct_engine *e0, *e;
  ct_engine_opts o = {B, T, N, false};
  CHECK_OK(ct_infer_from_model(&w0, &m));  // the base alone, bf16 panels
  CHECK_OK(ct_infer_pack(&w0, CT_PACK_BF16));
  CHECK_OK(ct_engine_init(&e0, &w0, &o));
  CHECK_OK(ct_engine_forward(e0, N, b.ids, slot, b.pos, out, N, base));
  CHECK_OK(ct_infer_from_model(&w, &m));
  CHECK_OK(ct_infer_attach_lora(&w, &lo));
  CHECK_OK(ct_infer_pack(&w, CT_PACK_BF16));
  int step = ct_amx_ready() ? 32 : 16;  // (AMX: whole k steps of 32)
  CHECK(w.layers[0].qkv.ext == (48 + step - 1) / step * step && w.layers[0].gu.ext == 32 && w.layers[0].o.ext == step &&
        w.layers[0].down.ext == step);
  CHECK_OK(ct_engine_init(&e, &w, &o));
  CHECK_OK(ct_engine_forward(e, N, b.ids, slot, b.pos, out, N, plain));  // unpinned: unfolded
  ct_engine_lora_pin(e);
  CHECK_OK(ct_engine_forward(e, N, b.ids, slot, b.pos, out, N, folded));
  double effect = 0, diff = 0;
  for (long i = 0; i < (long)N * V; i++) {
    effect = fmax(effect, fabs(plain[i] - base[i]));
    diff = fmax(diff, fabs(folded[i] - plain[i]));
  }
  fprintf(stderr, "    %s: the adapters move logits by up to %.3f; folded vs unfolded: %.2e\n", type, effect, diff);
  CHECK(effect > 0.05);
  // u and B rounded to bf16 put 2^-8 of each adapter term in error; 7 adapters a layer over
  // the layers before the head, through the norms (which rescale), measured 0.9-1.9% of
  // the adapters' effect. A B in another target's place, or a wrong scale, moves it ~100%.
  CHECK(diff > 0 && diff < 0.05 * effect);
  for (int s = 0; s < B; s++) {
    CHECK_OK(ct_engine_forward(e, T, b.ids + s * T, slot + s * T, b.pos + s * T, local, T, alone));
    CHECK(memcmp(alone, folded + (long)s * T * V, sizeof(float) * T * V) == 0);
  }
  lo.w[0][CT_LORA_UP].B[0] += 1.0f;
  CHECK_OK(ct_engine_forward(e, N, b.ids, slot, b.pos, out, N, base));
  CHECK(memcmp(base, folded, sizeof(float) * N * V) == 0);  // (pinned: the panels' copy runs)
  lo.w[0][CT_LORA_UP].B[0] -= 1.0f;
  ct_engine_lora_unpin(e);
  CHECK_OK(ct_engine_forward(e, N, b.ids, slot, b.pos, out, N, base));
  CHECK(memcmp(base, plain, sizeof(float) * N * V) == 0);
  ct_engine_free(e0);
  ct_engine_free(e);
  ct_infer_free(&w0);
  ct_infer_free(&w);
  free(base), free(plain), free(folded), free(alone);
  ct_lora_free(&lo);
  ct_model_free(&m);
}

static void test_engine_folds_adapters_into_bf16_panels(void) {
  if (!ct_thin_takes(CT_THIN_R)) return;  // (folding needs thin.h's kernels: AVX-512 builds)
  check_engine_folds_adapters("qwen3");
  check_engine_folds_adapters("gemma3_text");  // o and down feed post-norms: other call sites
}

// A narrowed base (int8 rows, bf16) runs, bit for bit, as a float32 base holding the
// narrowed values: the adapters' gradients on it equal those on that float32 model.
static void check_narrowed_base(bool int8) {
  ct_model m, r;
  tiny_model(&m, "qwen2");
  tiny_model(&r, "qwen2");
  for (int i = 0; i < r.n_tensors; i++) {  // r: the values the narrowed storage holds
    const ct_tensor_info *t = &r.tensors[i];
    float *p = r.params + t->offset;
    if (!int8) {
      for (long k = 0; k < t->numel; k++) p[k] = ct_bf16_to_f32(ct_f32_to_bf16(p[k]));
    } else if (t->ndim == 2 && !strstr(t->name, "embed") && !strstr(t->name, "lm_head")) {
      int8_t *q = malloc((size_t)t->numel);
      float *sc = malloc(sizeof(float) * t->shape[0]);
      ct_quantize_rows_int8(p, (int)t->shape[0], (int)t->shape[1], q, sc);
      for (long k = 0; k < t->numel; k++) p[k] = (float)q[k] * sc[k / t->shape[1]];
      free(q);
      free(sc);
    }
  }
  if (!int8)  // bf16 keeps the embedding and head float32 for a LoRA base
    for (int i = 0; i < r.n_tensors; i++)
      if (strstr(r.tensors[i].name, "embed") || strstr(r.tensors[i].name, "lm_head"))
        memcpy(r.params + r.tensors[i].offset, m.params + r.tensors[i].offset, sizeof(float) * r.tensors[i].numel);
  CHECK_OK(int8 ? ct_model_to_int8(&m) : ct_model_to_bf16(&m, true));
  CHECK(m.params == NULL);
  ct_lora lo;
  ct_lora_config lc = all_linear(2, 0);
  CHECK_OK(ct_lora_init(&lo, &lc, &r.cfg));
  random_adapters(&lo, &r, 13);
  float *g1 = calloc(lo.n_floats, sizeof(float)), *g2 = calloc(lo.n_floats, sizeof(float));
  ct_weights g;
  frozen_grads(&g, &r);
  batch_t b = make_batch(r.cfg.vocab_size);
  ct_lora_bind_grads(&lo, g1);
  double l1 = ours(&r, &lo, &g, &b, NULL);
  ct_lora_bind_grads(&lo, g2);
  double l2 = ours(&m, &lo, &g, &b, NULL);
  CHECK(l1 == l2 && !memcmp(g1, g2, sizeof(float) * lo.n_floats));
  fprintf(stderr, "    %s base: loss %.6f, the same bits as float32 of its values\n", int8 ? "int8" : "bf16", l2);
  free(g1);
  free(g2);
  ct_weights_free(&g);
  ct_lora_free(&lo);
  ct_model_free(&m);
  ct_model_free(&r);
}

static void test_narrowed_bases_equal_float32_bases_of_their_values(void) {
  check_narrowed_base(false);
  check_narrowed_base(true);
}

// PEFT's initialization (B = 0) leaves the base's logits unchanged, bit for bit; with B
// non-zero, the merged model's logits equal base + adapters.
static void test_step0_is_the_base_and_merging_matches(void) {
  ct_model m, mm;
  tiny_model(&m, "qwen2");
  tiny_model(&mm, "qwen2");
  ct_lora lo;
  ct_lora_config lc = all_linear(4, 0);
  CHECK_OK(ct_lora_init(&lo, &lc, &m.cfg));
  ct_lora_init_weights(&lo, &m, 3);
  batch_t b = make_batch(m.cfg.vocab_size);
  int V = m.cfg.vocab_size;
  float *l0 = malloc(sizeof(float) * N * V), *l1 = malloc(sizeof(float) * N * V);
  ours(&m, NULL, NULL, &b, l0);
  ours(&m, &lo, NULL, &b, l1);
  CHECK(!memcmp(l0, l1, sizeof(float) * N * V));
  random_adapters(&lo, &m, 5);
  ours(&m, &lo, NULL, &b, l0);
  CHECK_OK(ct_lora_merge(&lo, &mm));
  ours(&mm, NULL, NULL, &b, l1);
  double worst = 0, scale = 0;
  for (long i = 0; i < (long)N * V; i++) worst = fmax(worst, fabs(l0[i] - l1[i])), scale = fmax(scale, fabs(l0[i]));
  fprintf(stderr, "    merged vs base + adapters: max |logit diff| %.2e (max |logit| %.2f)\n", worst, scale);
  CHECK(worst <= 1e-5);
  free(l0);
  free(l1);
  ct_lora_free(&lo);
  ct_model_free(&m);
  ct_model_free(&mm);
}

// With dropout, backward draws the masks the forward drew: the gradient of the (masked,
// fixed-key) loss matches its float32 central differences.
static void check_dropout_gradients(int r) {
  ct_model m;
  tiny_model(&m, "llama");
  ct_lora lo;
  ct_lora_config lc = all_linear(r, 0.3);
  CHECK_OK(ct_lora_init(&lo, &lc, &m.cfg));
  CHECK(down_from_gu(&m, &lo) == (ct_thin_takes(r) != 0));  // rank 16: the path without h
  random_adapters(&lo, &m, 7);
  lo.dropout_key = 99;
  float *grads = calloc(lo.n_floats, sizeof(float));
  ct_lora_bind_grads(&lo, grads);
  ct_weights g;
  frozen_grads(&g, &m);
  batch_t b = make_batch(m.cfg.vocab_size);
  double loss = ours(&m, &lo, &g, &b, NULL), loss_nd;
  // recomputing each layer's forward (its adapters' u and masks kept from the first): the
  // same loss and gradients, bit for bit
  float *grads_rc = calloc(lo.n_floats, sizeof(float));
  ct_lora_bind_grads(&lo, grads_rc);
  ours_mode = CT_ACTS_RECOMPUTE;
  CHECK(ours(&m, &lo, &g, &b, NULL) == loss);
  CHECK(!memcmp(grads_rc, grads, sizeof(float) * lo.n_floats));
  memset(grads_rc, 0, sizeof(float) * lo.n_floats);
  ours_kept = 1;  // ... and with the top layer's activations kept
  CHECK(ours(&m, &lo, &g, &b, NULL) == loss);
  ours_kept = 0;
  ours_mode = CT_ACTS_KEEP;
  CHECK(!memcmp(grads_rc, grads, sizeof(float) * lo.n_floats));
  free(grads_rc);
  ct_lora_bind_grads(&lo, grads);
  lo.grads = NULL;
  lo.dropout_key = 100;
  loss_nd = ours(&m, &lo, NULL, &b, NULL);
  CHECK(loss != loss_nd);  // another key, other masks: the masks are really applied
  lo.dropout_key = 99;
  int bad = 0, checked = 0;
  for (int k = 0; k < lo.n_tensors; k += 3) {  // a sample of tensors, every element
    const ct_tensor_info *t = &lo.tensors[k];
    for (long j = 0; j < t->numel; j += r > 4 ? 7 : 1) {
      long i = t->offset + j;
      float keep = lo.params[i], e = 1e-2f;
      lo.params[i] = keep + e;
      double lp = ours(&m, &lo, NULL, &b, NULL);
      lo.params[i] = keep - e;
      double lm = ours(&m, &lo, NULL, &b, NULL);
      lo.params[i] = keep;
      double fd = (lp - lm) / (2.0 * e);
      bad += fabs(grads[i] - fd) > 2e-3 + 2e-2 * fabs(fd);
      checked++;
    }
  }
  fprintf(stderr, "    dropout 0.3, r %d: %d gradients checked\n", r, checked);
  CHECK(bad == 0 && checked > 20);
  free(grads);
  ct_weights_free(&g);
  ct_lora_free(&lo);
  ct_model_free(&m);
}

static void test_dropout_gradients_match_finite_differences_of_the_masked_loss(void) {
  check_dropout_gradients(2);
  check_dropout_gradients(16);  // thin.h's kernels on the masked input
}

// Saved in PEFT's layout and read back: the same tensors, the same config.
static void test_peft_files_round_trip_and_bad_adapters_are_refused(void) {
  ct_model m;
  tiny_model(&m, "qwen2");  // untied: modules_to_save lm_head is allowed
  ct_lora lo, back;
  ct_lora_config lc = {.r = 3, .alpha = 6, .dropout = 0.05, .rslora = true,
                       .targets = 1u << CT_LORA_Q | 1u << CT_LORA_V | 1u << CT_LORA_DOWN, .save_head = true};
  CHECK_OK(ct_lora_init(&lo, &lc, &m.cfg));
  random_adapters(&lo, &m, 21);
  CHECK(lo.scale == (float)(6 / sqrt(3.0)));
  char dir[] = "/tmp/ct_test_lora_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  CHECK_OK(ct_lora_save(&lo, dir, "base-model"));
  CHECK_OK(ct_lora_load(&back, dir, &m.cfg));
  CHECK(back.cfg.r == 3 && back.cfg.alpha == 6 && back.cfg.rslora && back.cfg.targets == lc.targets &&
        back.cfg.save_head && !back.cfg.save_embed && back.n_floats == lo.n_floats);
  CHECK(!memcmp(back.params, lo.params, sizeof(float) * lo.n_floats));
  char *text;
  size_t len;
  char p[CT_PATH_MAX];
  CHECK_OK(ct_path_join(p, sizeof p, dir, "adapter_config.json"));
  CHECK_OK(ct_read_file(p, &text, &len, NULL));
  CHECK(strstr(text, "\"peft_type\": \"LORA\"") && strstr(text, "\"task_type\": \"CAUSAL_LM\"") &&
        strstr(text, "\"down_proj\"") && strstr(text, "\"lm_head\""));
  free(text);
  // another base shape: the adapter does not fit
  ct_model_config other = m.cfg;
  other.hidden_size = 28;
  ct_lora x;
  int rc = ct_lora_load(&x, dir, &other);
  CHECK(rc == CT_EFORMAT && strstr(ct_last_error(), "this base model needs"));
  // another peft_type
  FILE *f = fopen(p, "w");
  fputs("{\"peft_type\": \"IA3\", \"r\": 3, \"lora_alpha\": 6, \"target_modules\": [\"q_proj\"]}", f);
  fclose(f);
  rc = ct_lora_load(&x, dir, &m.cfg);
  CHECK(rc == CT_EFORMAT && strstr(ct_last_error(), "'peft_type' is IA3, not LORA"));
  f = fopen(p, "w");
  fputs("{\"peft_type\": \"LORA\", \"r\": 3, \"lora_alpha\": 6, \"target_modules\": [\"qq_proj\"]}", f);
  fclose(f);
  rc = ct_lora_load(&x, dir, &m.cfg);
  CHECK(rc == CT_EFORMAT && strstr(ct_last_error(), "target module 'qq_proj'"));
  ct_lora_config zero = all_linear(0, 0);
  CHECK(ct_lora_init(&x, &zero, &m.cfg) == CT_ECONFIG && strstr(ct_last_error(), "r must be at least 1"));
  ct_model tied;
  tiny_model(&tied, "llama");
  ct_lora_config head = all_linear(2, 0);
  head.save_head = true;
  CHECK(ct_lora_init(&x, &head, &tied.cfg) == CT_ECONFIG && strstr(ct_last_error(), "tied embeddings"));
  ct_remove_tree(dir);
  ct_lora_free(&lo);
  ct_lora_free(&back);
  ct_model_free(&m);
  ct_model_free(&tied);
}

int main(int argc, char **argv) {
  ct_blas_init(argc, argv);
  ct_pool_init(2);
  RUN(test_adapter_gradients_match_float64_reference_of_merged_weights);
  RUN(test_step0_is_the_base_and_merging_matches);
  RUN(test_engine_with_adapters_matches_the_training_forward);
  RUN(test_engine_folds_adapters_into_bf16_panels);
  RUN(test_narrowed_bases_equal_float32_bases_of_their_values);
  RUN(test_dropout_gradients_match_finite_differences_of_the_masked_loss);
  RUN(test_peft_files_round_trip_and_bad_adapters_are_refused);
  ct_pool_free();
  return test_summary();
}
