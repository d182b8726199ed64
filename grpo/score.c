// grpo/score: a step's rollouts scored by every reward function, the weighted sum turned
// into advantages as advantage_estimator says, and the rollouts' statistics for the metrics.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "advantage.h"
#include "dist.h"
#include "error.h"
#include "grpo/grpo.h"
#include "mem.h"

int ct_grpo_reward_matrix(ct_grpo *g, const ct_prompt_set *set, const ct_grpo_rollout *ro, int n, double *R,
                          ct_grpo_reward_mean *func) {
  int K = g->K;
  size_t m = n > 0 ? (size_t)n : 1;
  double *col = malloc(sizeof(double) * m);
  ct_reward_item *items = malloc(sizeof *items * m);
  if (!col || !items) return ct_free_all(col, items), ct_set_error(CT_ENOMEM, "out of memory");
  int **own = calloc(m, sizeof *own);  // the model's tokens of completions with tool results
  if (!own) return ct_free_all(col, items), ct_set_error(CT_ENOMEM, "out of memory");
  for (int i = 0; i < n; i++) {
    const int *ids = ro[i].ids;
    if (ro[i].tool_mask && (ids = own[i] = malloc(sizeof(int) * (ro[i].n_own + 1))))
      for (int j = 0, k = 0; j < ro[i].n; j++)
        if (ro[i].tool_mask[j]) own[i][k++] = ro[i].ids[j];
    items[i] = (ct_reward_item){ct_grpo_prompt_text(set, &ro[i]), ro[i].text, set->rows[ro[i].prompt], ro[i].n_own,
                                ids, ro[i].env_reward};
  }
  memset(func, 0, sizeof *func * K);
  int rc = 0;
  for (int k = 0; k < K && !rc; k++) {
    if ((rc = ct_reward_score(g->rewards[k], items, n, col))) break;
    for (int i = 0; i < n; i++) {
      R[(long)i * K + k] = col[i];
      if (col[i] == col[i]) func[k].sum += col[i], func[k].sq += col[i] * col[i], func[k].n += 1;
    }
  }
  for (int i = 0; i < n; i++) free(own[i]);
  ct_free_all(col, items, own);
  return rc ? ct_wrap_error(rc, "scoring completions") : 0;
}

// The rollouts' lengths: sums into s, extremes into g->lens (over all ranks).
static int length_stats(ct_grpo *g, ct_grpo_rollout_stats *s) {
  ct_grpo_lengths *e = &g->lens;
  e->max = e->neg_min = e->term_max = e->term_neg_min = -INFINITY;
  for (int i = 0; i < g->n_ro; i++) {
    double n = g->ro[i].n_own;  // (TRL's lengths count the model's tokens, not tool results)
    s->completions += 1;
    s->tool_calls += g->ro[i].tool_calls, s->tool_failures += g->ro[i].tool_failures, s->turns += g->ro[i].n_turns;
    s->env_steps += g->ro[i].env_steps, s->env_failed += g->ro[i].env_steps && isnan(g->ro[i].env_reward);
    s->length += n;
    e->max = fmax(e->max, n), e->neg_min = fmax(e->neg_min, -n);
    if (g->ro[i].truncated) {
      s->truncated += 1;
    } else {
      s->terminated_length += n;
      e->term_max = fmax(e->term_max, n), e->term_neg_min = fmax(e->term_neg_min, -n);
    }
  }
  return ct_dist_max_f64((double *)e, (int)(sizeof *e / sizeof(double)));
}

// The advantages adv (n_ro) of this rank's rewards r as advantage_estimator says (whitening
// is collective: its statistics span every rank). batch_std: of every rank's rewards.
// Returns the number of this rank's groups whose rewards are all equal, or a negative error.
static int advantages(ct_grpo *g, const double *r, double batch_std, double *adv) {
  const ct_config *c = g->cfg;
  int n = g->n_ro, groups = n / g->G, zero, rc;
  switch (c->advantage_estimator) {
    case CT_ADV_RLOO:
      zero = ct_grpo_rloo(r, groups, g->G, adv);
      if (c->normalize_advantages && (rc = ct_grpo_whiten(adv, NULL, n, CT_WHITEN_COMPLETIONS))) return rc;
      return zero;
    case CT_ADV_REINFORCE_BASELINE: {
      zero = ct_grpo_group_baseline(r, groups, g->G, adv);
      double *tokens = malloc(sizeof(double) * (n > 0 ? n : 1));  // (n) each completion's weight
      if (!tokens) return ct_set_error(CT_ENOMEM, "out of memory");
      for (int i = 0; i < n; i++) tokens[i] = g->ro[i].n_own;
      rc = ct_grpo_whiten(adv, tokens, n, CT_WHITEN_TOKENS);
      free(tokens);
      return rc ? rc : zero;
    }
    default: return ct_grpo_advantages(r, groups, g->G, c->scale_rewards, batch_std, adv);
  }
}

int ct_grpo_score(ct_grpo *g, const double *scored) {
  const ct_config *c = g->cfg;
  int n = g->n_ro, K = g->K, groups = n / g->G;
  size_t m = n > 0 ? (size_t)n : 1;
  double *R = malloc(sizeof(double) * m * K), *r = malloc(sizeof(double) * m), *adv = malloc(sizeof(double) * m);
  int rc = !R || !r || !adv ? ct_set_error(CT_ENOMEM, "out of memory") : 0;
  if (!rc && !scored) rc = ct_grpo_reward_matrix(g, &g->prompts, g->ro, n, R, g->func);
  if (!rc && scored) {  // the scores as computed (dynamic sampling); their per-function sums
    memcpy(R, scored, sizeof(double) * n * K);
    memset(g->func, 0, sizeof *g->func * K);
    for (int i = 0; i < n; i++)
      for (int k = 0; k < K; k++) {
        double v = R[(long)i * K + k];
        if (v == v) g->func[k].sum += v, g->func[k].sq += v * v, g->func[k].n += 1;
      }
  }
  if (rc) return ct_free_all(R, r, adv), rc;
  ct_grpo_total_rewards(R, n, K, g->weights, r);
  // unscorable completions (every reward function NaN: TRL's unscorable_mask) are left out of
  // the logged reward and its std, and group_norm leaves them out of its statistics (A = 0);
  // their r stays the nansum (0) for the rollout log and the other estimators
  double *rn = malloc(sizeof(double) * m);
  if (!rn) return ct_free_all(R, r, adv), ct_set_error(CT_ENOMEM, "out of memory");
  ct_grpo_rollout_stats *s = &g->rs;
  memset(s, 0, sizeof *s);
  for (int i = 0; i < n; i++) {
    bool any = K == 0;
    for (int k = 0; k < K; k++) any |= R[(long)i * K + k] == R[(long)i * K + k];
    rn[i] = any ? r[i] : NAN;
    if (any) s->reward += r[i], s->reward_sq += r[i] * r[i], s->scored += 1;
  }
  if ((rc = length_stats(g, s))) return ct_free_all(R, r, adv, rn), rc;
  s->groups = groups;
  // the batch std needs every rank's rewards (TRL's nanstd: Bessel, over the scorable ones);
  // the zero-std count needs the advantages
  ct_grpo_rollout_stats part = *s;
  ct_dist_sum_stats(&part);
  double mean = part.scored > 0 ? part.reward / part.scored : 0;
  double var = part.scored > 1 ? (part.reward_sq - part.scored * mean * mean) / (part.scored - 1) : 0;
  int z;
  if (c->multi_objective_aggregation == CT_MOA_NORMALIZE_THEN_SUM) {  // (r stays the weighted sum, as logged)
    double *rn = malloc(sizeof(double) * m);
    z = rn ? ct_grpo_normalize_then_sum(R, groups, g->G, K, g->weights, rn, adv) : ct_set_error(CT_ENOMEM, "out of memory");
    free(rn);
    if (z == 0 && !(var > 0)) z = groups;  // frac_reward_zero_std: all or none here, as TRL's batch std
  } else {
    z = advantages(g, c->advantage_estimator == CT_ADV_GROUP_NORM ? rn : r, sqrt(var > 0 ? var : 0), adv);
  }
  free(rn);
  if (z < 0) return ct_free_all(R, r, adv), z;
  double zero = z;
  ct_dist_sum_f64(&zero, 1);
  *s = part;
  s->zero_std_groups = zero;
  if ((rc = ct_dist_sum_f64((double *)g->func, CT_GRPO_REWARD_MEAN_DOUBLES * K))) return ct_free_all(R, r, adv), rc;
  for (int i = 0; i < n; i++) {
    g->ro[i].reward = r[i];
    g->ro[i].adv = adv[i];
    g->ro[i].masked = c->mask_truncated_completions && g->ro[i].truncated;
  }
  rc = ct_grpo_log_rollouts(g, R, r, adv);
  ct_free_all(R, r, adv);
  return rc;
}
