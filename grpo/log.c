// grpo/log: what GRPO writes of a step: its rollouts in completions.jsonl (with every
// reward function's score, the weighted reward and the advantage) and its line of
// metrics.jsonl (TRL's GRPOTrainer names).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "error.h"
#include "generate.h"
#include "grpo/grpo.h"

// A completion with tool calls: "tool_mask" (1: the model's token, 0: a tool result's,
// TRL's name), "turns" (the messages after the prompt), "tool_calls" and "tool_failures";
// and the row's "tools" and "chat_template_kwargs", which its prompt was rendered with (the
// replay renders it again).
static void add_tool_fields(json_t *row, const ct_grpo_rollout *o, const json_t *data_row) {
  static const char *const keys[] = {"tools", "chat_template_kwargs"};
  for (int k = 0; k < 2; k++) {
    json_t *v = json_object_get(data_row, keys[k]);
    if (v) json_object_set(row, keys[k], v);
  }
  if (o->turns) {
    json_object_set(row, "turns", o->turns);
    json_object_set_new(row, "tool_calls", json_integer(o->tool_calls));
    json_object_set_new(row, "tool_failures", json_integer(o->tool_failures));
  }
  if (o->prompt_msgs) {  // an environment's episode
    json_object_set_new(row, "env_steps", json_integer(o->env_steps));
    json_object_set_new(row, "env_reward", o->env_reward == o->env_reward ? json_real(o->env_reward) : json_null());
  }
  if (!o->tool_mask) return;
  json_t *m = json_array();
  for (int j = 0; m && j < o->n; j++) json_array_append_new(m, json_integer(o->tool_mask[j]));
  json_object_set_new(row, "tool_mask", m);
}

int ct_grpo_log_rollouts(ct_grpo *g, const double *R, const double *r, const double *adv) {
  int n = g->n_ro, K = g->K;
  if (!g->log.on) return 0;
  json_t **rows = malloc(sizeof *rows * (n > 0 ? n : 1));
  if (!rows) return ct_set_error(CT_ENOMEM, "out of memory");
  for (int i = 0; i < n; i++) {
    const ct_grpo_rollout *o = &g->ro[i];
    json_t *prompt = o->prompt_msgs ? o->prompt_msgs : ct_completion_prompt(g->prompts.rows[o->prompt]);
    rows[i] = ct_completion_row(g->tr->step + 1, prompt, o->text, o->ids,
                                o->lp, o->n, ct_finish_names[o->finish]);
    for (int k = 0; k < K; k++) {
      double v = R[(long)i * K + k];
      json_object_set_new(rows[i], ct_reward_name(g->rewards[k]), v == v ? json_real(v) : json_null());
    }
    json_object_set_new(rows[i], "reward", json_real(r[i]));
    json_object_set_new(rows[i], "advantage", json_real(adv[i]));
    add_tool_fields(rows[i], o, g->prompts.rows[o->prompt]);
  }
  int rc = ct_completions_append(&g->log, rows, n);
  free(rows);
  return rc ? ct_wrap_error(rc, "logging completions") : 0;
}

// TRL's completions/* lengths (in tokens, a stop token counted): of every completion, and
// of those ended by a stop token ("terminated"; 0 when none was).
static void set_length_metrics(json_t *j, const ct_grpo_rollout_stats *s, const ct_grpo_lengths *e) {
  double term = s->completions - s->truncated;
  json_object_set_new(j, "completions/min_length", json_real(s->completions > 0 ? -e->neg_min : 0));
  json_object_set_new(j, "completions/max_length", json_real(s->completions > 0 ? e->max : 0));
  json_object_set_new(j, "completions/mean_terminated_length", json_real(term > 0 ? s->terminated_length / term : 0));
  json_object_set_new(j, "completions/min_terminated_length", json_real(term > 0 ? -e->term_neg_min : 0));
  json_object_set_new(j, "completions/max_terminated_length", json_real(term > 0 ? e->term_max : 0));
}

int ct_grpo_log_step(ct_grpo *g, const ct_grpo_step_stats *st, double lr, double norm, bool new_rollouts,
                     double train_s) {
  const ct_grpo_rollout_stats *s = &g->rs;
  ct_train *tr = g->tr;
  double tok = st->tokens > 0 ? st->tokens : 1, n = s->completions > 0 ? s->completions : 1;
  double groups = s->groups > 0 ? s->groups : 1, scored = s->scored > 0 ? s->scored : 1;
  double var = s->scored > 1 ? (s->reward_sq - s->reward * s->reward / s->scored) / (s->scored - 1) : 0;
  const ct_grpo_span_info *in = &st->info;
  json_t *j = json_pack("{s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}",
                        "step", (json_int_t)tr->step, "loss", st->loss, "reward", s->reward / scored,
                        "reward_std", sqrt(var > 0 ? var : 0), "frac_reward_zero_std", s->zero_std_groups / groups,
                        "kl", in->kl / tok, "completions/mean_length", s->length / n,
                        "completions/clipped_ratio", s->truncated / n, "entropy", st->entropy / tok,
                        "learning_rate", lr, "grad_norm", norm, "num_tokens", tr->num_tokens,
                        "time/generation_s", new_rollouts ? g->gen_s : 0.0, "time/training_s", train_s);
  if (g->obj.policy == CT_GRPO_POLICY_CISPO) {  // TRL's: cispo's cap, vespo's weight, else the clip's two sides
    json_object_set_new(j, "cispo_clip_ratio", json_real(in->cispo_clipped / tok));
  } else if (g->obj.policy == CT_GRPO_POLICY_VESPO) {
    json_object_set_new(j, "vespo/phi_seq_mean", json_real(in->phi_sum / tok));
  } else {
    json_object_set_new(j, "clip_ratio/low_mean", json_real(in->clipped_low / tok));
    json_object_set_new(j, "clip_ratio/high_mean", json_real(in->clipped_high / tok));
    json_object_set_new(j, "clip_ratio/region_mean", json_real((in->clipped_low + in->clipped_high) / tok));
  }
  if (g->obj.opm) json_object_set_new(j, "off_policy_mask/masked_ratio", json_real(in->masked / tok));
  if (g->cfg->filter_groups && new_rollouts) {  // verl's num_gen_batches, and what was dropped
    json_object_set_new(j, "filter_groups/num_gen_batches", json_real(g->fg.batches));
    json_object_set_new(j, "filter_groups/zero_std_groups", json_real(g->fg.zero_std_groups));
    json_object_set_new(j, "filter_groups/kept_zero_std_groups", json_real(g->fg.kept_zero_std));
  }
  // the sampler against the training forward (TRL's sampling/ metrics; those of the
  // difference always, those of the correction when it is on)
  if (in->lp_diff_n > 0) {
    json_object_set_new(j, "sampling/sampling_logp_difference/mean", json_real(in->lp_diff / in->lp_diff_n));
    json_object_set_new(j, "sampling/sampling_logp_difference/max", json_real(g->mx.lp_diff_max));
  }
  if (in->is_n > 0) {
    json_object_set_new(j, "sampling/importance_sampling_ratio/min", json_real(-g->mx.is_neg_min));
    json_object_set_new(j, "sampling/importance_sampling_ratio/mean", json_real(in->is_sum / in->is_n));
    json_object_set_new(j, "sampling/importance_sampling_ratio/max", json_real(g->mx.is_max));
  }
  set_length_metrics(j, s, &g->lens);
  if (g->agent) {  // TRL's: calls per completion, failed calls per call; and turns per completion
    json_object_set_new(j, "tools/call_frequency", json_real(s->tool_calls / n));
    json_object_set_new(j, "tools/failure_frequency", json_real(s->tool_calls > 0 ? s->tool_failures / s->tool_calls : 0));
    json_object_set_new(j, "turns/mean", json_real(s->turns / n));
  }
  if (ct_grpo_agent_env(g->agent)) {  // steps per episode, and episodes a failed step ended
    json_object_set_new(j, "env/steps_mean", json_real(s->env_steps / n));
    json_object_set_new(j, "env/failed_episodes", json_real(s->env_failed / n));
  }
  json_object_set_new(j, "time/scoring_s", json_real(new_rollouts ? g->score_s : 0.0));
  char key[96];
  for (int k = 0; k < g->K; k++) {  // std as TRL's nanstd: Bessel-corrected, NaN (left out) below 2
    const ct_grpo_reward_mean *f = &g->func[k];
    snprintf(key, sizeof key, "rewards/%s/mean", ct_reward_name(g->rewards[k]));
    json_object_set_new(j, key, json_real(f->n > 0 ? f->sum / f->n : NAN));
    snprintf(key, sizeof key, "rewards/%s/std", ct_reward_name(g->rewards[k]));
    double var = f->n > 1 ? (f->sq - f->sum * f->sum / f->n) / (f->n - 1) : 0;
    json_object_set_new(j, key, json_real(f->n > 1 ? sqrt(fmax(var, 0)) : NAN));
  }
  return ct_log_metrics(&tr->log, j);
}
