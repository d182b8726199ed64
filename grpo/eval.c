// grpo/eval: the greedy evaluation on eval_dataset_path's prompts, scored by the reward
// functions (one completion per prompt, the prompts split across ranks).
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "advantage.h"
#include "dist.h"
#include "error.h"
#include "grpo/grpo.h"
#include "mem.h"

// The eval line of metrics.jsonl from this rank's m greedy completions ro and their
// rewards R (m, K) and func (collective: the sums span every rank); r (m) is scratch.
static int log_eval(ct_grpo *g, const ct_grpo_rollout *ro, int m, const double *R, double *r,
                    ct_grpo_reward_mean *func) {
  ct_train *tr = g->tr;
  int n = g->eval.n, K = g->K, rc;
  ct_grpo_total_rewards(R, m, K, g->weights, r);
  struct {
    double reward, length, clipped, count;
  } s = {0};
  double scored = 0;  // (unscorable completions, every function NaN, are left out of eval_reward, as TRL)
  for (int i = 0; i < m; i++) {
    bool any = K == 0;
    for (int k = 0; k < K; k++) any |= R[(long)i * K + k] == R[(long)i * K + k];
    if (any) s.reward += r[i], scored += 1;
    s.length += ro[i].n_own, s.clipped += ro[i].truncated, s.count += 1;
  }
  if ((rc = ct_dist_sum_f64(&scored, 1))) return rc;
  if ((rc = ct_dist_sum_stats(&s)) || (rc = ct_dist_sum_f64((double *)func, CT_GRPO_REWARD_MEAN_DOUBLES * K)))
    return rc;
  double c = s.count > 0 ? s.count : 1;
  json_t *j = json_pack("{s:I,s:f,s:f,s:f}", "step", (json_int_t)tr->step, "eval_reward", s.reward / (scored > 0 ? scored : 1),
                        "eval_completions/mean_length", s.length / c, "eval_completions/clipped_ratio", s.clipped / c);
  char key[96];
  for (int k = 0; k < K; k++) {
    snprintf(key, sizeof key, "eval_rewards/%s/mean", ct_reward_name(g->rewards[k]));
    json_object_set_new(j, key, json_real(func[k].n > 0 ? func[k].sum / func[k].n : NAN));
  }
  ct_log_info(&tr->log, "eval at step %ld: mean reward %.4f of greedy completions of %d prompts", tr->step,
              s.reward / (scored > 0 ? scored : 1), n);
  return ct_log_metrics(&tr->log, j);
}

int ct_grpo_evaluate(ct_grpo *g) {
  ct_train *tr = g->tr;
  int n = g->eval.n, lo = (int)((long)n * tr->rank / tr->world), hi = (int)((long)n * (tr->rank + 1) / tr->world);
  int m = hi - lo, K = g->K;
  size_t mm = m > 0 ? (size_t)m : 1;
  int *idx = malloc(sizeof(int) * mm);
  ct_grpo_rollout *ro = calloc(mm, sizeof *ro);
  double *R = malloc(sizeof(double) * mm * K), *r = malloc(sizeof(double) * mm);
  ct_grpo_reward_mean *func = calloc(K, sizeof *func);
  int rc = !idx || !ro || !R || !r || !func ? ct_set_error(CT_ENOMEM, "out of memory") : 0;
  for (int i = 0; i < m && !rc; i++) idx[i] = lo + i;
  ct_sample_params greedy = {0, 0, 1, 0, 1};
  if (!rc && m > 0) rc = ct_grpo_generate(g, &g->eval, idx, m, 1, greedy, ro, false);
  if (!rc) rc = ct_grpo_reward_matrix(g, &g->eval, ro, m, R, func);
  if (!rc) rc = log_eval(g, ro, m, R, r, func);
  if (ro) ct_grpo_rollouts_free(ro, m);
  ct_free_all(idx, ro, R, r, func);
  return rc;
}
