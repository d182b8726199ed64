// grpo/step: the policy-gradient pass of one optimizer step over this rank's rollouts:
// per micro-batch the policy's forward, the clipped surrogate (+ beta x k3 KL) per
// completion token, weighted as loss_type says, and its gradient back through the model.
#include <stdio.h>

#include "advantage.h"
#include "dist.h"
#include "error.h"
#include "grpo/grpo.h"
#include "lm.h"
#include "loop.h"

// One micro-batch's per-token loss, for the head's rows a chunk at a time (ct_head_coef_fn).
typedef struct {
  ct_grpo *g;
  int first;  // the micro-batch's first rollout
  bool first_pass;
  ct_grpo_micro m;
  ct_grpo_step_stats *st;
} token_loss;

static void token_loss_rows(void *ctx, ct_head *h, int r0, int r1) {
  token_loss *t = ctx;
  ct_grpo *g = t->g;
  ct_grpo_step_stats *st = t->st;
  for (int q = r0; q < r1; q++) {
    int j;
    ct_grpo_rollout *r = ct_grpo_gathered(g, t->first, q, &j);
    h->coef[q] = h->zcoef[q] = 0;
    // old log-probs: the policy's before this rollout's first update. The first pass
    // computes them (ratio exactly 1) and keeps them when later passes reuse the rollouts.
    double lp = h->logp[q], old = t->first_pass ? lp : r->old[j];
    if (t->first_pass && r->old) r->old[j] = h->logp[q];
    if (r->masked) continue;
    ct_grpo_token_info info;
    st->loss += ct_grpo_micro_loss(&t->m, r->n, lp, old, g->use_ref ? r->ref[j] : 0, r->adv, &h->coef[q], &info);
    st->kl += info.kl;
    st->clip_lo += info.clipped_low;
    st->clip_hi += info.clipped_high;
    st->entropy += h->entropy[q];
    st->tokens += 1;
  }
}

int ct_grpo_train_pass(ct_grpo *g, bool first_pass, ct_grpo_step_stats *st) {
  const ct_config *c = g->cfg;
  ct_train *tr = g->tr;
  int B = (int)c->per_device_train_batch_size;
  ct_grpo_clip clip = {c->epsilon, c->epsilon_high > 0 ? c->epsilon_high : c->epsilon,
                       g->use_ref ? c->beta : 0};
  // denominators over the whole step (all ranks), counted before any backward
  ct_grpo_counts counts = {0};
  for (int i = 0; i < g->n_ro; i++)
    if (!g->ro[i].masked && g->ro[i].n > 0) counts.tokens += g->ro[i].n, counts.sequences += 1;
  counts.micro_batches = (g->n_ro + B - 1) / B;
  ct_dist_sum_stats(&counts);
  ct_loop_phase(tr, 0, (g->n_ro + B - 1) / B, 0);
  for (int first = 0; first < g->n_ro; first += B) {
    int n = g->n_ro - first < B ? g->n_ro - first : B;
    double micro_tokens = 0;
    for (int i = 0; i < n; i++)
      if (!g->ro[first + i].masked) micro_tokens += g->ro[first + i].n;
    ct_grpo_batch(g, first, n);
    ct_train_dropout_key(tr, first / B);
    const ct_batch *b = &g->batch;
    ct_acts *a = &g->acts;
    token_loss t = {g, first, first_pass, {clip, g->agg, &counts, micro_tokens, (int)c->max_completion_length}, st};
    int rc = ct_lm_fused(&tr->model, &tr->g, a, &g->head, b, token_loss_rows, &t);
    if (rc < 0) return rc;
    st->input_tokens += b->n_tokens;
    ct_backward(&tr->model, &tr->g, a, a->dln, b->B, b->T);
    char reward[48];
    snprintf(reward, sizeof reward, "reward %.3f", g->rs.reward / (g->rs.completions > 0 ? g->rs.completions : 1));
    ct_log_phase(&tr->log, tr->step + 1, "training", first / B + 1, (g->n_ro + B - 1) / B, "micro-batches",
                 st->input_tokens, reward);
  }
  return 0;
}

// Evaluation: one greedy completion of each eval prompt (split across ranks), scored by
// the reward functions: eval_reward (the weighted sum), eval_rewards/<name>/mean,
