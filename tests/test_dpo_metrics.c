// dpo/metrics: logits/chosen, logits/rejected, nll_loss, entropy and mean_token_accuracy
// of a tiny model's DPO micro-batch against values worked out here in double from the
// decoder's output (every logit = lnf · Wᵀ, all V of them, at every completion position),
// for 1, 3 and V vocabulary chunks; and TRL's averaging: per micro-batch, then over them.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dpo/metrics.h"
#include "forward.h"
#include "lm.h"
#include "test.h"
#include "tiny_model.h"

enum { PAIRS = 2, T_ = 9 };

// Two pairs with different prompt and completion lengths: rows 0-1 chosen, 2-3 rejected.
static void fill_batch(ct_batch *b, int V) {
  static const int prompt[PAIRS][3] = {{1, 2, 3}, {4, 5, 0}};
  static const int chosen[PAIRS][6] = {{6, 7, 8, 9, 0, 0}, {10, 11, 12, 13, 14, 15}};
  static const int rejected[PAIRS][6] = {{16, 17, 0, 0, 0, 0}, {18, 19, 20, 0, 0, 0}};
  static const int np[PAIRS] = {3, 2}, nc[PAIRS] = {4, 6}, nr[PAIRS] = {2, 3};
  b->B = 2 * PAIRS;
  b->T = T_;
  b->n_target = b->n_tokens = 0;
  for (int i = 0; i < PAIRS; i++) {
    ct_batch_row(b, i, prompt[i], np[i], chosen[i], nc[i], V - 1);
    ct_batch_row(b, PAIRS + i, prompt[i], np[i], rejected[i], nr[i], V - 1);
  }
}

// The metrics' sums worked out from the decoder output lnf (B*T, C) and the head W (V, C).
static ct_dpo_token_sums by_hand(const float *lnf, const float *W, const ct_batch *b, int V, int C) {
  ct_dpo_token_sums s = {0};
  double *l = calloc(V, sizeof(double));
  for (int n = 0; n < b->B * b->T; n++) {
    int y = b->target[n];
    if (y < 0) continue;
    double mx = -INFINITY, sum = 0, mean = 0, xs = 0;
    int am = 0;
    for (int v = 0; v < V; v++) {
      l[v] = 0;
      for (int i = 0; i < C; i++) l[v] += (double)lnf[(long)n * C + i] * W[(long)v * C + i];
      mean += l[v] / V;
      if (l[v] > mx) mx = l[v], am = v;
    }
    for (int v = 0; v < V; v++) sum += exp(l[v] - mx);
    double lse = mx + log(sum);
    for (int v = 0; v < V; v++) xs += exp(l[v] - lse) * l[v];
    s.entropy += lse - xs;
    if (n / b->T < PAIRS) {
      s.logit_c += mean, s.tok_c++;
      s.nll_c += lse - l[y];
      s.correct_c += am == y;
    } else {
      s.logit_r += mean, s.tok_r++;
    }
  }
  free(l);
  return s;
}

static void test_token_sums_match_logits_written_out_for_1_3_and_V_chunks(void) {
  ct_model m;
  tiny_model(&m, "llama");  // tied: the head is the embedding
  int V = m.cfg.vocab_size, C = m.cfg.hidden_size;
  const float *W = m.params + ct_model_find_tensor(&m, "model.embed_tokens.weight")->offset;
  ct_acts a;
  ct_batch b;
  CHECK_OK(ct_acts_init(&a, &m, 2 * PAIRS, T_, CT_ACTS_FORWARD));
  CHECK_OK(ct_batch_init(&b, 2 * PAIRS, T_));
  fill_batch(&b, V);
  const int tiles[] = {1, 3, V};
  for (int k = 0; k < 3; k++) {
    ct_head h;
    CHECK_OK(ct_head_init(&h, 2 * PAIRS * T_, 2 * PAIRS * T_, V, C, tiles[k]));
    int n = ct_lm_forward(&m, &a, &h, &b);
    CHECK(n == 4 + 6 + 2 + 3);  // every completion token, predicted from the position before it
    ct_dpo_token_sums got = {0}, want = by_hand(a.lnf, W, &b, V, C);
    ct_dpo_token_sums_add(&got, &h, T_, PAIRS);
    CHECK(got.tok_c == 4 + 6 && got.tok_r == 2 + 3);
    CHECK(want.tok_c == got.tok_c && want.tok_r == got.tok_r);
    CHECK(fabs(want.logit_c) > 1e-3 && fabs(want.logit_c - want.logit_r) > 1e-3);  // not a trivial 0
    CHECK_NEAR(got.logit_c, want.logit_c, 1e-5);
    CHECK_NEAR(got.logit_r, want.logit_r, 1e-5);
    CHECK_NEAR(got.nll_c, want.nll_c, 1e-4);
    CHECK_NEAR(got.entropy, want.entropy, 1e-4);
    CHECK(got.correct_c == want.correct_c);
    ct_dpo_token_means mean = {0};
    ct_dpo_token_means_add(&mean, &got, 1);
    CHECK(mean.micro == 1);
    CHECK_NEAR(mean.logits_c, want.logit_c / want.tok_c, 1e-6);
    CHECK_NEAR(mean.logits_r, want.logit_r / want.tok_r, 1e-6);
    CHECK_NEAR(mean.nll, want.nll_c / want.tok_c, 1e-5);
    CHECK_NEAR(mean.accuracy, want.correct_c / want.tok_c, 1e-12);
    CHECK_NEAR(mean.entropy, want.entropy / (want.tok_c + want.tok_r), 1e-5);
    if (k == 0)
      fprintf(stderr, "  logits/chosen %.6f, logits/rejected %.6f, nll_loss %.6f, entropy %.6f\n",
              mean.logits_c, mean.logits_r, mean.nll, mean.entropy);
    ct_head_free(&h);
  }
  ct_acts_free(&a);
  ct_batch_free(&b);
  ct_model_free(&m);
}

// TRL appends one value per micro-batch and logs their mean: micro-batches weigh the
// same whatever their token counts.
static void test_means_average_micro_batches_not_tokens(void) {
  ct_dpo_token_sums s[3] = {
      {.logit_c = 2, .logit_r = -1, .nll_c = 4, .correct_c = 1, .entropy = 9, .tok_c = 2, .tok_r = 1},
      {.logit_c = 18, .logit_r = 6, .nll_c = 6, .correct_c = 6, .entropy = 24, .tok_c = 6, .tok_r = 2},
      {.tok_c = 0},  // a micro-batch no rank ran (the short last step)
  };
  ct_dpo_token_means m = {0};
  ct_dpo_token_means_add(&m, s, 3);
  CHECK(m.micro == 2);
  CHECK_NEAR(m.logits_c / m.micro, (1.0 + 3.0) / 2, 1e-15);  // token-weighted would be 2.5
  CHECK_NEAR(m.logits_r / m.micro, (-1.0 + 3.0) / 2, 1e-15);
  CHECK_NEAR(m.nll / m.micro, (2.0 + 1.0) / 2, 1e-15);
  CHECK_NEAR(m.accuracy / m.micro, (0.5 + 1.0) / 2, 1e-15);
  CHECK_NEAR(m.entropy / m.micro, (3.0 + 3.0) / 2, 1e-15);
}

int main(void) {
  RUN(test_token_sums_match_logits_written_out_for_1_3_and_V_chunks);
  RUN(test_means_average_micro_batches_not_tokens);
  return test_summary();
}
