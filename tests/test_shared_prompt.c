// GRPO's shared prompts (data.h ct_batch_completions): a group's completions in one row
// behind one copy of their prompt give the loss and gradients of one row per completion,
// within float rounding, for every model family, with and without LoRA, with and without
// recomputation; and the batch itself holds what one row per completion holds.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "forward.h"
#include "head.h"
#include "lora.h"
#include "model.h"
#include "rng.h"
#include "test.h"
#include "tiny_model.h"

// Three groups and a loner: prompt A (6 tokens) x 3 completions (5, 9 and 1 tokens; the
// second's tokens 2 and 3 a tool's result: no target), prompt B (1 token: nothing to share)
// x 2, prompt C (4 tokens) x 4: a row holds 3 (max_run), the fourth goes alone.
enum { NSEQ = 9, MAX_RUN = 3, CAP_B = NSEQ, CAP_T = 16 };
static int pa[6], pb[1], pc[4], comp[NSEQ][9];
static unsigned char keep1[9] = {1, 1, 0, 0, 1, 1, 1, 1, 1};

static void sequences(ct_prompt_completion *s, int V) {
  ct_rng r;
  ct_rng_seed(&r, 41);
  int *ps[] = {pa, pb, pc};
  int pn[] = {6, 1, 4};
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < pn[k]; i++) ps[k][i] = (int)ct_rng_below(&r, V);
  for (int i = 0; i < NSEQ; i++)
    for (int u = 0; u < 9; u++) comp[i][u] = (int)ct_rng_below(&r, V);
  static const int which[NSEQ] = {0, 0, 0, 1, 1, 2, 2, 2, 2}, len[NSEQ] = {5, 9, 1, 3, 4, 6, 2, 7, 3};
  for (int i = 0; i < NSEQ; i++)
    s[i] = (ct_prompt_completion){ps[which[i]], comp[i], pn[which[i]], len[i], i == 1 ? keep1 : NULL};
}

// A per-token weight of completion token j of sequence i (advantages, as GRPO's loss has).
static float weight(int i, int j) { return 0.5f + 0.37f * (float)((i * 7 + j * 3) % 5) - 0.4f * (i % 2); }

typedef struct {
  double loss;
  int n;
  double logp[NSEQ][9];  // by sequence and token (NAN: no target)
} result;

// Σ weight · (−log p) over the batch's targets through m (adapters lo, or NULL), its gradient
// into grads (and lo's).
static result run(const ct_model *m, ct_lora *lo, const ct_weights *g, float *grads, const ct_batch *b, int mode,
                  int row_T) {
  const ct_model_config *c = &m->cfg;
  ct_acts a;
  ct_head h;
  int N = b->B * b->T;
  if (ct_acts_init(&a, m, CAP_B, CAP_T, mode) || ct_acts_long_rows(&a, m, row_T) || ct_acts_attach_lora(&a, lo) ||
      ct_head_init(&h, N, N, c->vocab_size, c->hidden_size, 1))
    exit(1);
  memcpy(a.ids, b->ids, sizeof(int) * N);
  memcpy(a.pos, b->pos, sizeof(int) * N);
  memcpy(a.seg, b->seg, sizeof(int) * N);
  a.has_pre = b->has_pre;
  if (b->has_pre) memcpy(a.pre, b->pre, sizeof(int) * N);
  ct_forward(m, &a, b->B, b->T);
  result out = {0};
  for (int i = 0; i < NSEQ; i++)
    for (int j = 0; j < 9; j++) out.logp[i][j] = NAN;
  out.n = ct_head_gather(&h, a.lnf, b->target, N);
  ct_head_forward(&h, m->w.lm_head);
  for (int q = 0; q < out.n; q++) {
    int i = b->tok_seq[h.rows[q]], j = b->tok_j[h.rows[q]];
    out.logp[i][j] = h.logp[q];
    out.loss -= weight(i, j) * h.logp[q];
    h.coef[q] = weight(i, j);
    h.zcoef[q] = 0;
  }
  memset(grads, 0, sizeof(float) * m->n_floats);
  if (lo) memset(lo->grads, 0, sizeof(float) * lo->n_floats);
  ct_head_backward(&h, m->w.lm_head, g->lm_head, a.dln, N);
  ct_backward(m, g, &a, a.dln, b->B, b->T);
  ct_head_free(&h);
  ct_acts_free(&a);
  return out;
}

// max |x − y| / (1 + |y|) over n floats
static double max_rel(const float *x, const float *y, long n) {
  double w = 0;
  for (long i = 0; i < n; i++) w = fmax(w, fabs((double)x[i] - y[i]) / (1 + fabs((double)y[i])));
  return w;
}

static void check_family(const char *type, bool lora) {
  ct_model m;
  tiny_model(&m, type);
  ct_prompt_completion s[NSEQ];
  sequences(s, m.cfg.vocab_size);
  ct_batch one, shared;
  CHECK_OK(ct_batch_init(&one, CAP_B, CAP_T));
  CHECK_OK(ct_batch_init(&shared, CAP_B, CAP_T));
  int row_T = ct_shared_row_tokens(6, 9, MAX_RUN);
  CHECK(!ct_batch_completions(&one, s, NSEQ, 0, 1, row_T));
  CHECK(ct_batch_completions(&shared, s, NSEQ, 0, MAX_RUN, row_T));
  // rows: A's three, B's two alone, three of C's; then C's last alone
  CHECK(one.B == NSEQ && shared.B == 1 + 2 + 1 + 1);
  CHECK(shared.n_target == one.n_target && one.n_target == 5 + 7 + 1 + 3 + 4 + 6 + 2 + 7 + 3);
  // A: 5 + 3 last prompt tokens + 15; B: 1 + 3, 1 + 4; C: 3 + 3 + 15; C alone: 4 + 3
  CHECK(shared.n_tokens == 23 + 9 + 21 + 7 && one.n_tokens == 3 * 6 + 5 + 9 + 1 + 2 + 3 + 4 + 4 * 4 + 6 + 2 + 7 + 3);
  ct_lora lo = {0};
  float *lgrads = NULL;
  if (lora) {
    ct_lora_config lc = {.r = 4, .alpha = 8, .targets = (1u << CT_LORA_TARGETS) - 1};
    CHECK_OK(ct_lora_init(&lo, &lc, &m.cfg));
    ct_lora_init_weights(&lo, &m, 9);
    ct_rng r;
    ct_rng_seed(&r, 10);
    for (int i = 0; i < lo.n_tensors; i++)  // B non-zero: the adapters change the forward
      if (strstr(lo.tensors[i].name, "lora_B"))
        for (long k = 0; k < lo.tensors[i].numel; k++) lo.params[lo.tensors[i].offset + k] = (float)(0.3 * ct_rng_normal(&r));
    lgrads = aligned_alloc(64, sizeof(float) * lo.n_floats);
    CHECK_OK(ct_lora_bind_grads(&lo, lgrads));
  }
  float *g1 = aligned_alloc(64, sizeof(float) * m.n_floats), *g2 = aligned_alloc(64, sizeof(float) * m.n_floats);
  float *l1 = lora ? aligned_alloc(64, sizeof(float) * lo.n_floats) : NULL;
  ct_weights w1, w2;
  CHECK_OK(ct_weights_bind(&w1, &m, g1));
  CHECK_OK(ct_weights_bind(&w2, &m, g2));
  for (int mode = CT_ACTS_KEEP; mode <= CT_ACTS_RECOMPUTE; mode++) {
    result a = run(&m, lora ? &lo : NULL, &w1, g1, &one, mode, row_T);
    if (lora) memcpy(l1, lgrads, sizeof(float) * lo.n_floats);
    result b = run(&m, lora ? &lo : NULL, &w2, g2, &shared, mode, row_T);
    CHECK(a.n == b.n && a.n == one.n_target);
    double dl = 0;
    for (int i = 0; i < NSEQ; i++)
      for (int j = 0; j < 9; j++) {
        CHECK(isnan(a.logp[i][j]) == isnan(b.logp[i][j]));
        if (!isnan(a.logp[i][j])) dl = fmax(dl, fabs(a.logp[i][j] - b.logp[i][j]));
      }
    CHECK(!isnan(a.logp[1][1]) && isnan(a.logp[1][2]) && isnan(a.logp[1][3]) && !isnan(a.logp[1][4]));  // a tool's result
    if (getenv("CT_TEST_VERBOSE"))
      fprintf(stderr, "%s%s mode %d: |dlogp| %.3g, loss %.9g vs %.9g, grads %.3g\n", m.cfg.model_type, lora ? "+lora" : "",
              mode, dl, a.loss, b.loss, max_rel(g2, g1, m.n_floats));
    CHECK_NEAR(dl, 0, 2e-5);
    CHECK_NEAR(b.loss, a.loss, 2e-5 * fabs(a.loss));
    CHECK(max_rel(g2, g1, m.n_floats) < 1e-4);
    if (lora) CHECK(max_rel(lgrads, l1, lo.n_floats) < 1e-4);
  }
  ct_weights_free(&w1);
  ct_weights_free(&w2);
  free(g1), free(g2), free(l1), free(lgrads);
  if (lora) ct_lora_free(&lo);
  ct_batch_free(&one);
  ct_batch_free(&shared);
  ct_model_free(&m);
}

static void test_llama_shared_prompts_equal_one_row_per_completion(void) { check_family("llama", false); }
static void test_qwen2_shared_prompts_equal_one_row_per_completion(void) { check_family("qwen2", false); }
static void test_qwen3_shared_prompts_equal_one_row_per_completion(void) { check_family("qwen3", false); }
static void test_gemma3_shared_prompts_equal_one_row_per_completion(void) { check_family("gemma3_text", false); }
static void test_lora_shared_prompts_equal_one_row_per_completion(void) {
  check_family("qwen2", true);
  check_family("gemma3_text", true);
}

// Shared rows that would hold more padded tokens than one row per completion are not made:
// a long group cut short beside short ones.
static void test_shared_rows_are_not_made_when_they_would_be_larger(void) {
  static int p[4] = {1, 2, 3, 4}, c1[9] = {5}, c2[1] = {6};
  ct_prompt_completion s[3] = {{p, c1, 4, 9, NULL}, {p, c1, 4, 9, NULL}, {c2, c2, 1, 1, NULL}};
  ct_batch b;
  CHECK_OK(ct_batch_init(&b, 3, 13));
  // shared: rows of 3 + 2·10 = 23 and 2, padded 2 x 23 = 46 > 3 x 13 = 39
  CHECK(!ct_batch_completions(&b, s, 3, 0, 2, 100));
  CHECK(b.B == 3 && b.T == 13 && !b.has_pre);
  // nor past max_T
  s[2] = s[1];
  CHECK(!ct_batch_completions(&b, s, 3, 0, 3, 32));
  CHECK(ct_batch_completions(&b, s, 3, 0, 3, 33));
  CHECK(b.B == 1 && b.T == 33 && b.has_pre);
  ct_batch_free(&b);
}

int main(void) {
  RUN(test_llama_shared_prompts_equal_one_row_per_completion);
  RUN(test_qwen2_shared_prompts_equal_one_row_per_completion);
  RUN(test_qwen3_shared_prompts_equal_one_row_per_completion);
  RUN(test_gemma3_shared_prompts_equal_one_row_per_completion);
  RUN(test_lora_shared_prompts_equal_one_row_per_completion);
  RUN(test_shared_rows_are_not_made_when_they_would_be_larger);
  return test_summary();
}
