// The reward model's arithmetic (reward/loss, nn/score): the pair loss, its
// derivatives and metric sums against hand values, and the gradient of the pair loss
// through the score head (at each row's last real token) and the whole backbone against
// central differences of the float64 reference model; the reward pooled by sequence
// length under right and left padding with pad == EOS; a reward model saved in Hugging
// Face's sequence-classification layout reloads (common/reward_model) with the same rewards; and
// the directories a reward model must not be (causal LM, num_labels 2, no score.weight,
// no tokenizer) fail with their reason. With LoRA (use_peft): the gradient through the
// score head (a modules_to_save copy) and every adapter factor against central
// differences of the reference over the merged weights; an adapter saved as PEFT's
// SEQ_CLS reloads (alone, or as base + adapter) with the training forward's rewards, and
// adapters that are not a reward model's are refused.
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "forward.h"
#include "fs.h"
#include "hf.h"
#include "lora.h"
#include "reward_model.h"
#include "safetensors.h"
#include "tokenizer.h"
#include "matmul.h"
#include "model.h"
#include "prefs.h"
#include "pool.h"
#include "rng.h"
#include "reward/loss.h"
#include "score.h"
#include "scratch.h"
#include "test.h"
#include "tiny_model.h"
#include "ref_lora.h"
#include "ref_model.h"

// r_c 2, r_r 0.5, margin 0.5: z = 1, ℓ = log(1 + e^−1), dℓ/dr_c = −σ(−1) = −0.268941...
static void test_pair_loss_matches_hand_values(void) {
  double dc, dr, s = 1 / (1 + exp(1.0));
  CHECK_NEAR(ct_rm_pair_loss(2, 0.5, 0.5, 0, &dc, &dr), log1p(exp(-1.0)), 1e-15);
  CHECK_NEAR(dc, -s, 1e-15);
  CHECK_NEAR(dr, s, 1e-15);
  // center_rewards_coefficient 0.1: + 0.1·(2.5)² = 0.625; both derivatives + 2·0.1·2.5
  CHECK_NEAR(ct_rm_pair_loss(2, 0.5, 0.5, 0.1, &dc, &dr), log1p(exp(-1.0)) + 0.625, 1e-15);
  CHECK_NEAR(dc, -s + 0.5, 1e-15);
  CHECK_NEAR(dr, s + 0.5, 1e-15);
  // far on either side: finite, ≈ −z below and ≈ 0 above
  CHECK_NEAR(ct_rm_pair_loss(-400, 400, 0, 0, &dc, &dr), 800, 1e-9);
  CHECK_NEAR(dc, -1, 1e-15);
  CHECK_NEAR(ct_rm_pair_loss(400, -400, 0, 0, &dc, &dr), 0, 1e-15);
}

// pairs (2, 0.5) and (−1, 3): accuracy 1/2, margin (1.5 − 4)/2, rewards −1 … 3, mean 4.5/4
static void test_metric_sums(void) {
  ct_rm_sums s = {0};
  ct_rm_range e = {-INFINITY, -INFINITY};
  ct_rm_add_pair(&s, &e, 2, 0.5, 0.25);
  ct_rm_add_pair(&s, &e, -1, 3, 4.0);
  CHECK(s.pairs == 2 && s.correct == 1);
  CHECK_NEAR(s.loss, 4.25, 0);
  CHECK_NEAR(s.margin, -2.5, 0);
  CHECK_NEAR(s.reward, 4.5, 0);
  CHECK(e.max == 3 && e.neg_min == 1);
}

// ---------------------------------------------------------------------------
// The gradient through the score head and the backbone.

enum { B = 2, T = 7 };
static const int last[B] = {4, 6};  // row 0: 5 real tokens then 2 padding; row 1: 7
static const double margin = 0.3, center = 0.05;

// The float64 reference: ℓ(score·norm(x) at row 0's last token, the same at row 1's).
static double ref_pair_loss(const ref_t *r, const double *w, const int *ids, const int *pos, const int *seg) {
  const ct_model_config *c = &r->m->cfg;
  int C = c->hidden_size;
  double *x = calloc((size_t)B * T * C, 8), *xn = calloc(C, 8), rew[B], dc, dr;
  ref_layers(r, B, T, ids, pos, seg, x);
  for (int b = 0; b < B; b++) {
    rmsnorm(xn, x + ((long)b * T + last[b]) * C, W(r, "model.norm.weight", 0), C, c->rms_norm_eps);
    rew[b] = 0;
    for (int i = 0; i < C; i++) rew[b] += w[i] * xn[i];
  }
  free(x);
  free(xn);
  return ct_rm_pair_loss(rew[0], rew[1], margin, center, &dc, &dr);
}

// Central difference of the reference loss in the parameter *p against the analytic
// gradient `got`: the worst error so far in *worst, a count of misses in *bad.
static void fd_check(const ref_t *ref, const double *w, const int *ids, const int *pos, const int *seg, double *p,
                     float got, double *worst, int *bad) {
  double keep = *p, e = 1e-5;
  *p = keep + e;
  double lp = ref_pair_loss(ref, w, ids, pos, seg);
  *p = keep - e;
  double lm = ref_pair_loss(ref, w, ids, pos, seg);
  *p = keep;
  double fd = (lp - lm) / (2 * e), err = fabs(got - fd);
  *worst = fmax(*worst, err);
  *bad += err > 1e-5 + 1e-3 * fabs(fd);
}

static void test_score_head_and_backbone_gradients_match_reference(void) {
  ct_model_config cfg = mini_config();
  snprintf(cfg.model_type, sizeof cfg.model_type, "qwen2");
  cfg.qkv_bias = true;
  int C = cfg.hidden_size, N = B * T;
  ct_model m;
  CHECK_OK(ct_model_init(&m, &cfg, 16));
  ct_model_init_random(&m, 3, 0.3f);
  ct_rng r;
  ct_rng_seed(&r, 5);
  float w[12], dw[12] = {0};
  for (int i = 0; i < C; i++) w[i] = (float)(0.5 * ct_rng_normal(&r));
  ct_acts a;
  CHECK_OK(ct_acts_init(&a, &m, B, T, CT_ACTS_KEEP));
  for (int n = 0; n < N; n++) {
    a.ids[n] = (int)ct_rng_below(&r, cfg.vocab_size);
    a.pos[n] = n % T;
    a.seg[n] = 0;
  }
  float *grads = aligned_alloc(64, sizeof(float) * m.n_floats);
  memset(grads, 0, sizeof(float) * m.n_floats);
  ct_weights g;
  CHECK_OK(ct_weights_bind(&g, &m, grads));
  // ours: float32 forward, score, pair loss, score backward, backbone backward
  ct_forward(&m, &a, B, T);
  double rew[B], d[B];
  ct_score_forward(a.lnf, last, B, T, C, w, rew);
  double loss = ct_rm_pair_loss(rew[0], rew[1], margin, center, &d[0], &d[1]);
  memset(a.dln, 0, sizeof(float) * N * C);
  ct_score_backward(a.lnf, last, B, T, C, w, d, a.dln, dw);
  ct_backward(&m, &g, &a, a.dln, B, T);

  double *P = calloc(m.n_floats, sizeof(double)), wd[12];
  for (long i = 0; i < m.n_floats; i++) P[i] = m.params[i];
  for (int i = 0; i < C; i++) wd[i] = w[i];
  ref_t ref = {&m, P};
  double want = ref_pair_loss(&ref, wd, a.ids, a.pos, a.seg);
  CHECK_NEAR(loss, want, 2e-5 * fabs(want) + 1e-6);
  int bad = 0, checked = 0;
  double worst = 0;
  for (int i = 0; i < C; i++) fd_check(&ref, wd, a.ids, a.pos, a.seg, &wd[i], dw[i], &worst, &bad), checked++;
  for (long i = 0; i < m.n_floats; i++)  // every backbone parameter, through the head
    fd_check(&ref, wd, a.ids, a.pos, a.seg, &P[i], grads[i], &worst, &bad), checked++;
  fprintf(stderr, "  %d gradients checked, worst |diff| %.3g\n", checked, worst);
  CHECK(bad == 0);
  CHECK(rew[0] != rew[1]);  // a pair that is not degenerate
  free(P);
  free(grads);
  ct_weights_free(&g);
  ct_acts_free(&a);
  ct_model_free(&m);
}

// use_peft: the base frozen, adapters on every projection, the score head a trained copy
// (modules_to_save). The reference runs the merged weights W + s·B·A in float64, and
// the score head's copy w.
static void merged(double *P, double *w, const ct_model *m, const ct_lora *lo) {
  ref_lora_merged(P, m, lo);
  for (int i = 0; i < m->cfg.hidden_size; i++) w[i] = lo->score[i];
}

static void test_lora_score_head_and_adapter_gradients_match_reference(void) {
  ct_model_config cfg = mini_config();
  cfg.num_labels = 1;
  int C = cfg.hidden_size, N = B * T;
  ct_model m;
  CHECK_OK(ct_model_init(&m, &cfg, 16));
  ct_model_init_random(&m, 3, 0.3f);
  ct_lora_config lc = {.r = 2, .alpha = 4, .targets = (1u << CT_LORA_TARGETS) - 1, .save_score = true};
  ct_lora lo;
  CHECK_OK(ct_lora_init(&lo, &lc, &m.cfg));
  ct_lora_init_weights(&lo, &m, 7);
  CHECK(!memcmp(lo.score, m.w.score, sizeof(float) * C));  // the copy starts as the base's head
  ct_rng r;
  ct_rng_seed(&r, 5);
  for (int i = 0; i < lo.n_tensors; i++)  // B and the head non-zero: every gradient is live
    if (strstr(lo.tensors[i].name, "lora_B") || strstr(lo.tensors[i].name, "score"))
      for (long k = 0; k < lo.tensors[i].numel; k++)
        lo.params[lo.tensors[i].offset + k] = (float)(0.4 * ct_rng_normal(&r));
  float *grads = calloc(lo.n_floats, sizeof(float));
  ct_lora_bind_grads(&lo, grads);
  ct_weights g = {0};  // the base frozen: no gradient views
  g.layers = calloc(cfg.num_layers, sizeof *g.layers);
  ct_acts a;
  CHECK_OK(ct_acts_init(&a, &m, B, T, CT_ACTS_KEEP));
  CHECK_OK(ct_acts_attach_lora(&a, &lo));
  for (int n = 0; n < N; n++) {
    a.ids[n] = (int)ct_rng_below(&r, cfg.vocab_size);
    a.pos[n] = n % T;
    a.seg[n] = 0;
  }
  ct_forward(&m, &a, B, T);
  double rew[B], d[B];
  ct_score_forward(a.lnf, last, B, T, C, lo.score, rew);
  double loss = ct_rm_pair_loss(rew[0], rew[1], margin, center, &d[0], &d[1]);
  memset(a.dln, 0, sizeof(float) * N * C);
  ct_score_backward(a.lnf, last, B, T, C, lo.score, d, a.dln, lo.g_score);
  ct_backward(&m, &g, &a, a.dln, B, T);

  double *P = calloc(m.n_floats, sizeof(double)), wd[12];
  ref_t ref = {&m, P};
  merged(P, wd, &m, &lo);
  double want = ref_pair_loss(&ref, wd, a.ids, a.pos, a.seg);
  CHECK_NEAR(loss, want, 2e-5 * fabs(want) + 1e-6);
  int bad = 0, checked = 0;
  double worst = 0;
  for (int k = 0; k < lo.n_tensors; k++)  // every adapter factor and the head
    for (long i = lo.tensors[k].offset; i < lo.tensors[k].offset + lo.tensors[k].numel; i++) {
      float keep = lo.params[i], up = keep + 1e-3f, dn = keep - 1e-3f;
      lo.params[i] = up;
      merged(P, wd, &m, &lo);
      double lp = ref_pair_loss(&ref, wd, a.ids, a.pos, a.seg);
      lo.params[i] = dn;
      merged(P, wd, &m, &lo);
      double lm = ref_pair_loss(&ref, wd, a.ids, a.pos, a.seg);
      lo.params[i] = keep;
      double fd = (lp - lm) / ((double)up - dn), err = fabs(grads[i] - fd);
      worst = fmax(worst, err);
      bad += err > 1e-4 + 2e-3 * fabs(fd);
      checked++;
    }
  fprintf(stderr, "  %d adapter and head gradients checked, worst |diff| %.3g\n", checked, worst);
  long numel = 0;
  for (int k = 0; k < lo.n_tensors; k++) numel += lo.tensors[k].numel;
  CHECK(bad == 0 && checked == numel && checked > 400);
  float gs = 0;
  for (int i = 0; i < C; i++) gs += fabsf(lo.g_score[i]);
  CHECK(gs > 0);  // the head did get a gradient
  free(P);
  free(grads);
  ct_weights_free(&g);
  ct_acts_free(&a);
  ct_lora_free(&lo);
  ct_model_free(&m);
}


// ---------------------------------------------------------------------------
// Pooling, saving, reloading.

static ct_model_config rm_config(bool tied) {
  return (ct_model_config){.model_type = "qwen2", .vocab_size = 260, .hidden_size = 16, .intermediate_size = 24,
                           .num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 4,
                           .max_position_embeddings = 64, .rope_theta = 10000, .rms_norm_eps = 1e-6f,
                           .tie_word_embeddings = tied, .qkv_bias = true, .bos_token_id = -1, .eos_token_id = 258,
                           .pad_token_id = 258, .num_labels = 1};
}

// A random reward model (score head included: a matrix of the layout).
static void rm_model(ct_model *m, bool tied) {
  ct_model_config cfg = rm_config(tied);
  CHECK_OK(ct_model_init(m, &cfg, 64));
  ct_model_init_random(m, 11, 0.4f);
}

// Rewards of rows laid out by hand: row b holds len[b] real tokens from start[b] (pads
// elsewhere, each its own segment, ids = pad), positions counted from the first real token.
static void rewards_lora(ct_model *m, const ct_lora *lo, int B, int T, const int *const *seq, const int *len,
                         const int *start, double *r) {
  ct_acts a;
  CHECK_OK(ct_acts_init(&a, m, B, T, CT_ACTS_FORWARD));
  CHECK_OK(ct_acts_attach_lora(&a, lo));
  int last[8];
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      int i = b * T + t, real = t >= start[b] && t < start[b] + len[b];
      a.ids[i] = real ? seq[b][t - start[b]] : m->cfg.pad_token_id;
      a.pos[i] = real ? t - start[b] : 0;
      a.seg[i] = real ? start[b] : t;  // (pads: a segment of their own)
    }
    last[b] = start[b] + len[b] - 1;  // by length: the pad id plays no part
  }
  ct_forward(m, &a, B, T);
  ct_score_forward(a.lnf, last, B, T, m->cfg.hidden_size, lo ? lo->score : m->w.score, r);
  ct_acts_free(&a);
}

static void rewards_of(ct_model *m, int B, int T, const int *const *seq, const int *len, const int *start,
                       double *r) {
  rewards_lora(m, NULL, B, T, seq, len, start, r);
}

// pad == EOS == 258, and the sequence ends in EOS: transformers' rule (the token before the
// first pad) would pool at index 3 of "7 9 11 13 258"; pooling by length takes index 4, and
// the reward is the unpadded one whatever the padding.
static void test_reward_pooled_by_length_under_left_and_right_padding_with_pad_eq_eos(void) {
  ct_model m;
  rm_model(&m, true);
  const int s[] = {7, 9, 11, 13, 258}, o[] = {5, 6, 7, 8, 9, 10, 11, 12};
  const int *one[] = {s}, *two[] = {s, o};
  double alone, right[2], left[2], first_pad;
  rewards_of(&m, 1, 5, one, (int[]){5}, (int[]){0}, &alone);
  rewards_of(&m, 2, 8, two, (int[]){5, 8}, (int[]){0, 0}, right);  // 3 pads after s
  rewards_of(&m, 2, 8, two, (int[]){5, 8}, (int[]){3, 0}, left);   // 3 pads before s
  rewards_of(&m, 1, 4, one, (int[]){4}, (int[]){0}, &first_pad);   // what the pad-id rule would pool
  CHECK_NEAR(right[0], alone, 1e-5 * (1 + fabs(alone)));
  CHECK_NEAR(left[0], alone, 1e-5 * (1 + fabs(alone)));
  CHECK_NEAR(left[1], right[1], 1e-5 * (1 + fabs(right[1])));
  CHECK(fabs(first_pad - alone) > 1e-3);  // the two rules differ on this row
  ct_model_free(&m);
}

// Writes m as Hugging Face writes a sequence classifier, with the byte tokenizer.
static void save_model(const ct_model *m, const char *dir) {
  char p[1100];
  CHECK_OK(ct_mkdirs(dir));
  snprintf(p, sizeof p, "%s/config.json", dir);
  CHECK_OK(ct_hf_config_write(&m->cfg, p, "float32", NULL));
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  const float *bufs[] = {m->params};
  CHECK_OK(ct_save_tensors(&ct_model_tensors(m), 1, bufs, NULL, p, CT_DT_F32));
  ct_tokenizer *tok;
  CHECK_OK(ct_tokenizer_bytes(&tok));
  CHECK_OK(ct_tokenizer_save(tok, dir));
  ct_tokenizer_free(tok);
}

// Opens dir/name into st and checks that it holds the score head `score`, of shape [1, 16].
static void open_with_score(ct_safetensors *st, const char *dir, const char *name, const char *score) {
  char p[1100];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  CHECK_OK(ct_st_open(st, p));
  const ct_st_tensor *sw = ct_st_find(st, score);
  CHECK(sw && sw->ndim == 2 && sw->shape[0] == 1 && sw->shape[1] == 16);
}

static void test_saved_reward_model_has_hf_seq_cls_layout_and_reloads_with_same_rewards(void) {
  for (int tied = 0; tied < 2; tied++) {
    ct_model m;
    rm_model(&m, tied);
    const char *dir = scratch_path(tied ? "rm_tied" : "rm_untied");
    save_model(&m, dir);
    char p[1100];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *j = json_load_file(p, 0, NULL);
    CHECK(j && !strcmp(json_string_value(json_array_get(json_object_get(j, "architectures"), 0)),
                       "Qwen2ForSequenceClassification"));
    CHECK(json_object_size(json_object_get(j, "id2label")) == 1 &&
          !strcmp(json_string_value(json_object_get(json_object_get(j, "id2label"), "0")), "LABEL_0"));
    CHECK(json_integer_value(json_object_get(j, "pad_token_id")) == 258);
    json_decref(j);
    ct_safetensors st;
    open_with_score(&st, dir, "model.safetensors", "score.weight");
    CHECK(!ct_st_find(&st, "lm_head.weight"));  // a classifier has no LM head
    CHECK(ct_st_find(&st, "model.embed_tokens.weight") && ct_st_find(&st, "model.norm.weight"));
    ct_st_close(&st);

    const int s0[] = {7, 9, 11, 13, 258}, s1[] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, s2[] = {40, 41};
    const int *seq[] = {s0, s1, s2}, len[] = {5, 9, 2};
    double want[3], got[3], got16[3], got8[3];
    for (int i = 0; i < 3; i++) rewards_of(&m, 1, len[i], &seq[i], &len[i], (int[]){0}, &want[i]);
    CHECK_OK(ct_rm_check(dir, NULL));
    ct_rm rm;
    CHECK_OK(ct_rm_open(&rm, dir, NULL, CT_STORE_F32, 2, 16));  // batches of 2: one padded batch, then one row
    CHECK(!strcmp(rm.name, tied ? "rm_tied" : "rm_untied"));
    CHECK_OK(ct_rm_score_ids(&rm, seq, len, 3, got, NULL));
    ct_rm_free(&rm);
    CHECK_OK(ct_rm_open(&rm, dir, NULL, CT_STORE_BF16, 3, 16));
    CHECK_OK(ct_rm_score_ids(&rm, seq, len, 3, got16, NULL));
    ct_rm_free(&rm);
    // int8: the sampler's engine (per-row int8 matrices, int8 activations); its buffers
    // grow past their first 6 tokens as the float paths' do
    CHECK_OK(ct_rm_open(&rm, dir, NULL, CT_STORE_INT8, 2, 6));
    CHECK_OK(ct_rm_score_ids(&rm, seq, len, 3, got8, NULL));
    CHECK(rm.T >= 9);
    ct_rm_free(&rm);
    for (int i = 0; i < 3; i++) {
      CHECK_NEAR(got[i], want[i], 1e-5 * (1 + fabs(want[i])));
      CHECK_NEAR(got16[i], want[i], 0.05 * (1 + fabs(want[i])));  // weights rounded to bf16
      CHECK_NEAR(got8[i], want[i], 0.1 * (1 + fabs(want[i])));    // and to int8
    }
    // a text longer than the capacity is NaN, counted; the others are scored
    const int *seq2[] = {s0, s1};
    int too_long = 0;
    CHECK_OK(ct_rm_open(&rm, dir, NULL, CT_STORE_F32, 2, 6));
    CHECK_OK(ct_rm_score_ids(&rm, seq2, len, 2, got, &too_long));
    CHECK(too_long == 1 && isnan(got[1]));
    CHECK_NEAR(got[0], want[0], 1e-5 * (1 + fabs(want[0])));
    // without a counter (GRPO) the buffers grow instead: every text gets its reward
    CHECK_OK(ct_rm_score_ids(&rm, seq2, len, 2, got, NULL));
    CHECK(rm.T >= 9);
    for (int i = 0; i < 2; i++) CHECK_NEAR(got[i], want[i], 1e-5 * (1 + fabs(want[i])));
    ct_rm_free(&rm);
    ct_model_free(&m);
  }
}

// A causal LM's directory read into a classifier: its backbone, its LM head skipped, the
// score left for the caller (zero here).
static void test_causal_lm_dir_loads_into_a_classifier_layout(void) {
  ct_model m;
  ct_model_config cfg = rm_config(false);
  cfg.num_labels = 0;
  CHECK_OK(ct_model_init(&m, &cfg, 64));
  ct_model_init_random(&m, 5, 0.3f);
  const char *dir = scratch_path("lm");
  save_model(&m, dir);
  cfg.num_labels = 1;
  ct_model c;
  CHECK_OK(ct_model_init(&c, &cfg, 64));
  CHECK_OK(ct_model_load_weights(&c, c.params, dir));
  CHECK(!memcmp(c.w.embed, m.w.embed, sizeof(float) * 260 * 16));
  CHECK(!memcmp(c.w.norm, m.w.norm, sizeof(float) * 16));
  float zero[16] = {0};
  CHECK(!memcmp(c.w.score, zero, sizeof zero));
  ct_model_free(&c);
  ct_model_free(&m);
}

// A LoRA reward model as bin/reward writes it (use_peft): a causal LM's directory as the
// base, and an adapter directory (PEFT's SEQ_CLS files) naming it. It opens both as the
// adapter directory alone and as base + adapter, with the rewards of the training
// forward (adapters applied unmerged); the files carry PEFT's names and task type.
static void test_lora_reward_model_saved_as_peft_seq_cls_reloads_with_same_rewards(void) {
  ct_model m;
  rm_model(&m, true);
  ct_model_config lm_cfg = m.cfg;
  lm_cfg.num_labels = 0;
  ct_model base;  // the causal LM the reward model was trained from: m without the head
  CHECK_OK(ct_model_init(&base, &lm_cfg, 64));
  for (int i = 0; i < base.n_tensors; i++) {
    const ct_tensor_info *t = &base.tensors[i], *f = ct_model_find_tensor(&m, t->name);
    memcpy(base.params + t->offset, m.params + f->offset, sizeof(float) * t->numel);
  }
  const char *bdir = scratch_path("lora_base"), *adir = scratch_path("lora_rm");
  save_model(&base, bdir);
  ct_lora_config lc = {.r = 4, .alpha = 8, .targets = 1u << CT_LORA_Q | 1u << CT_LORA_V | 1u << CT_LORA_DOWN,
                       .save_score = true};
  ct_lora lo;
  CHECK_OK(ct_lora_init(&lo, &lc, &m.cfg));
  ct_lora_init_weights(&lo, &m, 9);
  ct_rng r;
  ct_rng_seed(&r, 13);
  for (int i = 0; i < lo.n_tensors; i++)  // trained-looking adapters and head
    if (!strstr(lo.tensors[i].name, "lora_A"))
      for (long k = 0; k < lo.tensors[i].numel; k++)
        lo.params[lo.tensors[i].offset + k] = (float)(0.3 * ct_rng_normal(&r));
  CHECK_OK(ct_mkdirs(adir));
  CHECK_OK(ct_lora_save(&lo, adir, bdir));
  char p[1100];
  snprintf(p, sizeof p, "%s/adapter_config.json", adir);
  json_t *j = json_load_file(p, 0, NULL);
  CHECK(j && !strcmp(json_string_value(json_object_get(j, "task_type")), "SEQ_CLS"));
  json_t *ms = json_object_get(j, "modules_to_save");
  CHECK(json_array_size(ms) == 2 && !strcmp(json_string_value(json_array_get(ms, 1)), "score"));
  json_decref(j);
  ct_safetensors st;
  open_with_score(&st, adir, "adapter_model.safetensors", "base_model.model.score.weight");
  CHECK(ct_st_find(&st, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight") != NULL);
  ct_st_close(&st);

  const int s0[] = {7, 9, 11, 13, 258}, s1[] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, s2[] = {40, 41};
  const int *seq[] = {s0, s1, s2}, len[] = {5, 9, 2};
  double want[3], got[3], got2[3], plain[3];
  for (int i = 0; i < 3; i++) {
    rewards_lora(&m, &lo, 1, len[i], &seq[i], &len[i], (int[]){0}, &want[i]);
    rewards_lora(&m, NULL, 1, len[i], &seq[i], &len[i], (int[]){0}, &plain[i]);
  }
  ct_rm rm;
  CHECK_OK(ct_rm_check(adir, NULL));
  CHECK_OK(ct_rm_open(&rm, adir, NULL, CT_STORE_F32, 2, 16));  // the adapter directory alone
  CHECK(!strcmp(rm.name, "lora_rm"));
  CHECK_OK(ct_rm_score_ids(&rm, seq, len, 3, got, NULL));
  ct_rm_free(&rm);
  CHECK_OK(ct_rm_open(&rm, bdir, adir, CT_STORE_F32, 2, 16));  // model_path + adapter_path
  CHECK_OK(ct_rm_score_ids(&rm, seq, len, 3, got2, NULL));
  ct_rm_free(&rm);
  for (int i = 0; i < 3; i++) {
    CHECK_NEAR(got[i], want[i], 1e-5 * (1 + fabs(want[i])));  // merged W + s·B·A: rounding only
    CHECK(got2[i] == got[i]);
    CHECK(fabs(want[i] - plain[i]) > 1e-2);  // the adapters change the rewards
  }
  CHECK(ct_rm_bytes(adir, CT_STORE_F32, 2, 16) == ct_rm_bytes(bdir, CT_STORE_F32, 2, 16));  // sized by its base

  // an adapter that is not a reward model's: a causal LM's (no score), a base that is not there
  const char *cdir = scratch_path("lora_causal");
  ct_lora lc_lo;
  ct_lora_config clc = {.r = 2, .alpha = 4, .targets = 1u << CT_LORA_Q};
  CHECK_OK(ct_lora_init(&lc_lo, &clc, &lm_cfg));
  CHECK_OK(ct_mkdirs(cdir));
  CHECK_OK(ct_lora_save(&lc_lo, cdir, bdir));
  ct_lora_free(&lc_lo);
  CHECK(ct_rm_check(cdir, NULL) == CT_ECONFIG && strstr(ct_last_error(), "the adapter has no score head"));
  CHECK(ct_rm_check(bdir, cdir) == CT_ECONFIG && strstr(ct_last_error(), "not a SEQ_CLS adapter"));
  const char *odir = scratch_path("lora_orphan");
  CHECK_OK(ct_mkdirs(odir));
  CHECK_OK(ct_lora_save(&lo, odir, scratch_path("gone")));
  CHECK(ct_rm_check(odir, NULL) == CT_ECONFIG && strstr(ct_last_error(), "is not a directory here"));
  // the SEQ_CLS adapter over a causal LM where a causal LM is meant (the sampler): refused
  ct_lora back;
  CHECK(ct_lora_load(&back, adir, &lm_cfg) != 0 && strstr(ct_last_error(), "sequence classifier's head"));
  ct_lora_free(&lo);
  ct_model_free(&base);
  ct_model_free(&m);
}

// The reason names what is wrong with the directory.
static void check_refused(const char *dir, const char *want) {
  int rc = ct_rm_check(dir, NULL);
  CHECK(rc == CT_ECONFIG);
  if (!strstr(ct_last_error(), want)) fprintf(stderr, "  message: %s (wanted '%s')\n", ct_last_error(), want);
  CHECK(strstr(ct_last_error(), want) != NULL);
}

static void test_bad_reward_model_dirs_fail_with_their_reason(void) {
  ct_model m;
  rm_model(&m, true);
  char p[1100];
  check_refused(scratch_path("lm"), "not a *ForSequenceClassification");
  const char *two = scratch_path("two_labels");
  save_model(&m, two);
  snprintf(p, sizeof p, "%s/config.json", two);
  json_t *j = json_load_file(p, 0, NULL);
  json_object_set_new(j, "id2label", json_pack("{s:s,s:s}", "0", "LABEL_0", "1", "LABEL_1"));
  json_dump_file(j, p, 0);
  json_decref(j);
  check_refused(two, "num_labels 2");
  const char *nohead = scratch_path("no_score");
  save_model(&m, nohead);
  ct_model_config cfg = m.cfg;  // the same backbone without a head: a file with no score.weight
  cfg.num_labels = 0;
  ct_model b;
  CHECK_OK(ct_model_init(&b, &cfg, 64));
  snprintf(p, sizeof p, "%s/model.safetensors", nohead);
  const float *bufs[] = {b.params};
  CHECK_OK(ct_save_tensors(&ct_model_tensors(&b), 1, bufs, NULL, p, CT_DT_F32));
  ct_model_free(&b);
  check_refused(nohead, "has no score.weight");
  const char *notok = scratch_path("no_tokenizer");
  save_model(&m, notok);
  snprintf(p, sizeof p, "%s/tokenizer.json", notok);
  CHECK(unlink(p) == 0);
  check_refused(notok, "tokenizer cannot be loaded");
  check_refused(scratch_path("missing"), "config.json: unable to open");
  ct_model_free(&m);
}

// ---------------------------------------------------------------------------
// Reward pairs (prefs.h's reward mode), with the byte tokenizer: ids are bytes, EOS 256.

static const char *write_rows(const char *name, const char *text) {
  const char *p = scratch_path(name);
  FILE *f = fopen(p, "w");
  fputs(text, f);
  fclose(f);
  return p;
}

// ids[0, n) == the bytes of s, then `tail` (-1: nothing)
static bool is_text(const int *ids, int n, const char *s, int tail) {
  int k = (int)strlen(s);
  if (n != k + (tail >= 0)) return false;
  for (int i = 0; i < k; i++)
    if (ids[i] != (unsigned char)s[i]) return false;
  return tail < 0 || ids[k] == tail;
}

static void test_reward_pairs_are_whole_sequences_with_margin_and_long_pairs_dropped(void) {
  ct_tokenizer *tok;
  CHECK_OK(ct_tokenizer_bytes(&tok));
  int eos = ct_tokenizer_eos(tok);
  ct_pref_opts o = {.max_length = 12, .reward = true};
  ct_pref_dataset ds;
  CHECK_OK(ct_pref_load(&ds, write_rows("pairs.jsonl",
      "{\"prompt\": \"Q: \", \"chosen\": \"yes\", \"rejected\": \"no\", \"margin\": 1.5}\n"  // prompt + answer
      "{\"chosen\": \"abc\", \"rejected\": \"xyz\"}\n"                                       // no prompt, no shared start
      "{\"prompt\": \"Q: \", \"chosen\": \"a very long answer\", \"rejected\": \"no\"}\n"    // 3 + 18 + 1 > 12: dropped
      "{\"prompt_input_ids\": [5], \"chosen_input_ids\": [6, 7], \"rejected_input_ids\": [8]}\n"
      "{\"chosen_ids\": [1, 2, 3], \"rejected_ids\": [4]}\n"), tok, &o));
  CHECK(ds.n == 4 && ds.n_dropped == 1);
  const int *p = ds.ids + ds.start[0];
  CHECK(ds.p_len[0] == 0 && is_text(p, ds.c_len[0], "Q: yes", eos) && is_text(p + ds.c_len[0], ds.r_len[0], "Q: no", eos));
  CHECK(ds.margin[0] == 1.5f && ds.margin[1] == 0 && ds.margin[2] == 0);
  p = ds.ids + ds.start[1];
  CHECK(is_text(p, ds.c_len[1], "abc", eos) && is_text(p + ds.c_len[1], ds.r_len[1], "xyz", eos));
  p = ds.ids + ds.start[2];  // pre-tokenized: as given, after the prompt's ids
  CHECK(ds.p_len[2] == 1 && ds.c_len[2] == 2 && ds.r_len[2] == 1 && p[0] == 5 && p[1] == 6 && p[2] == 7 && p[3] == 8);
  p = ds.ids + ds.start[3];
  CHECK(ds.p_len[3] == 0 && ds.c_len[3] == 3 && ds.r_len[3] == 1 && p[2] == 3 && p[3] == 4);
  ct_pref_free(&ds);
  // conversations: the prompt's messages + each answer's, one render without a generation prompt
  o.max_length = 200;
  CHECK_OK(ct_pref_load(&ds, write_rows("chat.jsonl",
      "{\"prompt\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chosen\": [{\"role\": \"assistant\", "
      "\"content\": \"hello\"}], \"rejected\": [{\"role\": \"assistant\", \"content\": \"go\"}]}\n"), tok, &o));
  const char *want = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n";
  ct_ids w = {0};
  CHECK_OK(ct_tokenizer_encode_doc(tok, want, strlen(want), &w));
  CHECK(ds.n == 1 && ds.p_len[0] == 0 && ds.c_len[0] == w.n && !memcmp(ds.ids, w.v, sizeof(int) * w.n));
  ct_ids_free(&w);
  ct_pref_free(&ds);
  // bad rows name the key
  CHECK(ct_pref_load(&ds, write_rows("m.jsonl", "{\"chosen\": \"a\", \"rejected\": \"b\", \"margin\": \"x\"}\n"), tok, &o) ==
        CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "m.jsonl:1: key 'margin'") != NULL);
  CHECK(ct_pref_load(&ds, write_rows("i.jsonl", "{\"chosen_ids\": [1]}\n"), tok, &o) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "key 'rejected_ids' is missing") != NULL);
  o.max_length = 3;  // every pair too long: an error that says so
  CHECK(ct_pref_load(&ds, write_rows("all.jsonl", "{\"chosen\": \"abcd\", \"rejected\": \"b\"}\n"), tok, &o) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "longer than max_length") != NULL);
  ct_tokenizer_free(tok);
}

int main(int argc, char **argv) {
  ct_blas_init(argc, argv);
  ct_pool_init(2);
  RUN(test_pair_loss_matches_hand_values);
  RUN(test_metric_sums);
  RUN(test_score_head_and_backbone_gradients_match_reference);
  RUN(test_lora_score_head_and_adapter_gradients_match_reference);
  RUN(test_reward_pooled_by_length_under_left_and_right_padding_with_pad_eq_eos);
  if (scratch_make("/tmp/ct-test-rm-XXXXXX")) return 1;
  RUN(test_saved_reward_model_has_hf_seq_cls_layout_and_reloads_with_same_rewards);
  RUN(test_causal_lm_dir_loads_into_a_classifier_layout);
  RUN(test_lora_reward_model_saved_as_peft_seq_cls_reloads_with_same_rewards);
  RUN(test_bad_reward_model_dirs_fail_with_their_reason);
  RUN(test_reward_pairs_are_whole_sequences_with_margin_and_long_pairs_dropped);
  scratch_remove();
  return test_summary();
}
