// dpo/metrics: TRL's per-token DPO metrics, from the policy head's gathered rows:
//   logits/chosen, logits/rejected   mean over completion tokens of the token's mean logit
//                                    (the mean over all V vocabulary entries)
//   nll_loss                         mean −log p over chosen completion tokens (RPO's term)
//   entropy                          mean entropy over chosen and rejected completion tokens
//   mean_token_accuracy              chosen completion tokens whose argmax is the target
// As TRL's DPOTrainer: each micro-batch, summed over ranks, gives one token mean per
// metric; the logged value is the mean of those over the micro-batches of the logging
// window (every gradient-accumulation micro-batch of every step) or of the eval set.
#pragma once
#include "head.h"

// Sums over one micro-batch's completion tokens. A plain array of doubles: ranks add
// them with ct_dist_sum_f64.
typedef struct {
  double logit_c, logit_r;  // Σ of each token's mean logit
  double nll_c;             // Σ −log p(target), chosen tokens
  double correct_c;         // chosen tokens whose argmax is the target
  double entropy;           // Σ entropy, chosen and rejected tokens
  double tok_c, tok_r;      // tokens
} ct_dpo_token_sums;

// Σ over micro-batches of each one's token means, and how many micro-batches.
typedef struct {
  double logits_c, logits_r, nll, entropy, accuracy;
  double micro;
  double micro_c, micro_r;  // unpaired: micro-batches with chosen tokens, with rejected ones
} ct_dpo_token_means;

// Adds the tokens of head h, after a forward of a batch of rows of T positions whose
// first m rows are the chosen completions and the next m the rejected ones.
void ct_dpo_token_sums_add(ct_dpo_token_sums *s, const ct_head *h, int T, int m);

// The same for rows of any order: cls[row] 1 chosen, 0 rejected, −1 left out (KTO's KL rows;
// its desirable examples count as chosen, its undesirable ones as rejected).
void ct_dpo_token_sums_add_rows(ct_dpo_token_sums *s, const ct_head *h, int T, const signed char *cls);

// Adds the token means of n micro-batches (each already summed over ranks). Entries
// without chosen tokens are micro-batches no rank ran (the short last step): skipped.
void ct_dpo_token_means_add(ct_dpo_token_means *mean, const ct_dpo_token_sums *s, int n);

// KTO's: logits/chosen over the micro-batches that have chosen tokens (micro_c), logits/rejected
// over those with rejected ones (micro_r), entropy over all that ran (micro), as TRL's
// KTOTrainer appends each only when it has tokens.
void ct_dpo_token_means_add_unpaired(ct_dpo_token_means *mean, const ct_dpo_token_sums *s, int n);
