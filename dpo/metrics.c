// dpo/metrics: the per-token metrics TRL's DPOTrainer logs besides the rewards, summed
// per micro-batch from the head (no logits are kept: the head sums each row's V logits
// while their chunk exists) and averaged per micro-batch. Rewards and log-probs are the
// trainer's (per pair).
#include "dpo/metrics.h"

#include <stdbool.h>

// Adds gathered row r of h as a chosen (c) or rejected token.
static void add_token(ct_dpo_token_sums *s, const ct_head *h, int r, bool c) {
  double mean_logit = h->logit_sum[r] * (1.0 / h->V);
  s->entropy += h->entropy[r];
  if (c) {
    s->logit_c += mean_logit;
    s->nll_c -= h->logp[r];
    s->correct_c += h->argmax[r] == h->target[r];
    s->tok_c += 1;
  } else {
    s->logit_r += mean_logit;
    s->tok_r += 1;
  }
}

void ct_dpo_token_sums_add_rows(ct_dpo_token_sums *s, const ct_head *h, int T, const signed char *cls) {
  for (int r = 0; r < h->n; r++)
    if (cls[h->rows[r] / T] >= 0) add_token(s, h, r, cls[h->rows[r] / T] == 1);
}

void ct_dpo_token_sums_add(ct_dpo_token_sums *s, const ct_head *h, int T, int m) {
  for (int r = 0; r < h->n; r++) add_token(s, h, r, h->rows[r] / T < m);
}

void ct_dpo_token_means_add(ct_dpo_token_means *mean, const ct_dpo_token_sums *s, int n) {
  for (int k = 0; k < n; k++) {
    const ct_dpo_token_sums *t = &s[k];
    if (t->tok_c <= 0) continue;
    mean->logits_c += t->logit_c / t->tok_c;
    mean->logits_r += t->tok_r > 0 ? t->logit_r / t->tok_r : 0;
    mean->nll += t->nll_c / t->tok_c;
    mean->accuracy += t->correct_c / t->tok_c;
    mean->entropy += t->entropy / (t->tok_c + t->tok_r);
    mean->micro += 1;
  }
}

void ct_dpo_token_means_add_unpaired(ct_dpo_token_means *mean, const ct_dpo_token_sums *s, int n) {
  for (int k = 0; k < n; k++) {
    const ct_dpo_token_sums *t = &s[k];
    if (t->tok_c + t->tok_r <= 0) continue;  // (a micro-batch no rank ran)
    if (t->tok_c > 0) mean->logits_c += t->logit_c / t->tok_c, mean->micro_c += 1;
    if (t->tok_r > 0) mean->logits_r += t->logit_r / t->tok_r, mean->micro_r += 1;
    mean->entropy += t->entropy / (t->tok_c + t->tok_r);
    mean->micro += 1;
  }
}
