// grpo/step: the policy-gradient pass of one optimizer step over this rank's rollouts:
// per micro-batch the policy's forward, the clipped surrogate (+ beta x k3 KL) per
// completion token, weighted as loss_type says, and its gradient back through the model.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

// Rows [r0, r1) hold spans of completions in order (a completion's tokens are consecutive
// rows); each span goes to the objective whole (chunks of a whole-completion objective
// are whole completions: ct_grpo_train_pass runs those unfused).
static void token_loss_rows(void *ctx, ct_head *h, int r0, int r1) {
  token_loss *t = ctx;
  ct_grpo *g = t->g;
  ct_grpo_step_stats *st = t->st;
  for (int q = r0; q < r1;) {
    int j, j2;
    ct_grpo_rollout *r = ct_grpo_gathered(g, t->first, q, &j);
    int q1 = q + 1;
    while (q1 < r1 && ct_grpo_gathered(g, t->first, q1, &j2) == r) q1++;
    int n = q1 - q;
    // old log-probs: the policy's before this rollout's first update. The first pass
    // computes them (ratio exactly 1) and keeps them when later passes reuse the rollouts.
    const float *lp = h->logp + q, *old = t->first_pass || !r->old ? lp : r->old + j;
    if (t->first_pass && r->old) memcpy(r->old + j, lp, sizeof(float) * n);
    if (r->masked) {
      memset(h->coef + q, 0, sizeof(float) * n);
    } else {
      st->loss += ct_grpo_span_loss(&t->m, r->n_own, n, lp, old, h->entropy + q, g->use_ref ? r->ref + j : NULL,
                                    r->q ? r->q + j : NULL, r->adv, h->coef + q, &st->info, &g->mx);
      for (int k = q; k < q1; k++) st->entropy += h->entropy[k];
      st->tokens += n;
    }
    memset(h->zcoef + q, 0, sizeof(float) * n);
    q = q1;
  }
}

// The entropy mask's threshold for the micro-batch at `first` (n head rows), from the
// entropies of its completions that are not masked, with every rank's.
static int entropy_threshold(ct_grpo *g, int first, int n, double *threshold) {
  float *ent = malloc(sizeof(float) * (n > 0 ? n : 1));
  if (!ent) return ct_set_error(CT_ENOMEM, "out of memory");
  long k = 0;
  for (int q = 0; q < n; q++) {
    int j;
    if (!ct_grpo_gathered(g, first, q, &j)->masked) ent[k++] = g->head.entropy[q];
  }
  int rc = ct_grpo_entropy_threshold(&g->obj, ent, k, threshold);
  free(ent);
  return rc;
}

int ct_grpo_train_pass(ct_grpo *g, bool first_pass, ct_grpo_step_stats *st) {
  const ct_config *c = g->cfg;
  ct_train *tr = g->tr;
  int B = (int)c->per_device_train_batch_size;
  // denominators over the whole step (all ranks), counted before any backward
  ct_grpo_counts counts = {0};
  for (int i = 0; i < g->n_ro; i++)
    counts.tokens += g->ro[i].masked ? 0 : g->ro[i].n_own, counts.sequences += 1;  // (as TRL: see advantage.h)
  counts.micro_batches = (g->n_ro + B - 1) / B;
  ct_dist_sum_stats(&counts);
  g->mx = (ct_grpo_span_max){-INFINITY, -INFINITY, -INFINITY};
  ct_loop_phase(tr, 0, (g->n_ro + B - 1) / B, 0);
  for (int first = 0; first < g->n_ro; first += B) {
    int n = g->n_ro - first < B ? g->n_ro - first : B;
    double micro_tokens = 0;
    for (int i = 0; i < n; i++)
      if (!g->ro[first + i].masked) micro_tokens += g->ro[first + i].n_own;
    ct_grpo_batch(g, first, n, true);
    ct_train_dropout_key(tr, first / B);
    const ct_batch *b = &g->batch;
    ct_acts *a = &g->acts;
    token_loss t = {g, first, first_pass, {g->obj, g->agg, &counts, micro_tokens, (int)c->max_completion_length, 0}, st};
    int rc;
    if (!ct_grpo_needs_whole(&g->obj)) {
      if ((rc = ct_lm_fused(&tr->model, &tr->g, a, &g->head, b, token_loss_rows, &t)) >= 0)
        ct_backward(&tr->model, &tr->g, a, a->dln, b->B, b->T);
    } else if ((rc = ct_lm_forward(&tr->model, a, &g->head, b)) >= 0) {
      // every completion's log-probs before any coefficient (the head's logits run twice)
      if (g->obj.top_entropy < 1 && (rc = entropy_threshold(g, first, rc, &t.m.entropy_threshold))) return rc;
      token_loss_rows(&t, &g->head, 0, g->head.n);
      ct_lm_backward(&tr->model, &tr->g, a, &g->head, b);
    }
    if (rc < 0) return rc;
    for (int i = 0; i < n; i++)  // (TRL's num_tokens: prompt and completion, shared or not)
      st->input_tokens += ct_grpo_prompt_ids(g, &g->ro[first + i])->n + g->ro[first + i].n;
    char reward[48];
    snprintf(reward, sizeof reward, "reward %.3f", g->rs.reward / (g->rs.scored > 0 ? g->rs.scored : 1));
    ct_log_phase(&tr->log, tr->step + 1, "training", first / B + 1, (g->n_ro + B - 1) / B, "micro-batches",
                 st->input_tokens, reward);
  }
  // a rank with fewer micro-batches (a short last batch of the data) still joins the others'
  // per-micro-batch collective: the entropy quantile
  int mine = (g->n_ro + B - 1) / B, most = ct_dist_max_int(mine);
  for (int k = mine; k < most && g->obj.top_entropy < 1; k++) {
    double unused;
    int rc = ct_grpo_entropy_threshold(&g->obj, NULL, 0, &unused);
    if (rc) return rc;
  }
  return 0;
}

// Evaluation: one greedy completion of each eval prompt (split across ranks), scored by
// the reward functions: eval_reward (the weighted sum), eval_rewards/<name>/mean,
