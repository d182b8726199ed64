// grpo: the state of a GRPO run that its files share: the rollouts of a step (rollout.c
// samples them, score.c scores them), the pass over them (step.c), what is logged of them
// (log.c) and the greedy evaluation (eval.c). grpo/main.c sets it up and runs the loop.
// Every function returns 0 or a negative error with its message set (main exits).
#ifndef CT_GRPO_GRPO_H
#define CT_GRPO_GRPO_H

#include <stdbool.h>

#include "completions.h"
#include "config.h"
#include "policy_engine.h"
#include "forward.h"
#include "frozen.h"
#include "grpo/rewards.h"
#include "grpo/agent.h"
#include "head.h"
#include "objective.h"
#include "prompts.h"
#include "sample.h"
#include "train.h"
#include "weights.h"

// One sampled completion and everything training needs of it. With tool calls, the
// completion holds the model's turns and the tool results between them; only the model's
// own tokens (n_own of them, tool_mask 1) carry a loss, and the per-token arrays of the
// loss (old, ref, q) hold those alone, in order.
typedef struct {
  int prompt;           // index into the prompt set
  int *ids, n;          // completion tokens (a stop token, when one ended it, is last)
  unsigned char *tool_mask;  // (n) 1: the model's token, 0: a tool result's; NULL: all the model's
  int n_own;            // the model's tokens
  int *ord;             // (n) with tool_mask: token j's index among the model's tokens
  float *old, *ref;     // (n_own) log-probs before the first update (num_iterations > 1) /
                        // of the reference (when used)
  float *lp;            // (n) the sampler's log-probs of the chosen tokens (0 for tool results)
  float *q;             // (n_own) those of the model's tokens (= lp without tool results)
  json_t *turns;        // with tools or an environment: the messages after the prompt
  int tool_calls, tool_failures, n_turns;
  ct_ids own_prompt;    // with an environment: this episode's prompt tokens (n 0: the prompt
                        // set's), its messages and text
  json_t *prompt_msgs;
  char *prompt_text;
  int env_steps;
  double env_reward;    // the environment's reward of the episode (NaN: none)
  int finish;           // CT_FINISH_*
  double reward, adv;
  bool truncated;       // ended by length, not by a stop token
  bool masked;          // no loss (mask_truncated_completions)
  char *text;
} ct_grpo_rollout;

// The metrics of one set of rollouts, summed over ranks (all doubles: ct_dist_sum_stats).
typedef struct {
  double reward, reward_sq, scored;  // Σ r, Σ r² over the scorable completions, and how many
  double tool_calls, tool_failures, turns;  // with tools or an environment
  double env_steps, env_failed;             // with an environment
  double completions, truncated, length;
  double terminated_length;  // Σ length of the completions ended by a stop token
  double zero_std_groups, groups;
} ct_grpo_rollout_stats;

// Completion lengths' extremes, as maxima over ranks (ct_dist_max_f64): a minimum is kept
// negated. -inf when there is no such completion.
typedef struct {
  double max, neg_min;            // all completions
  double term_max, term_neg_min;  // those ended by a stop token
} ct_grpo_lengths;

// Per reward function: Σ of its non-NaN rewards, Σ of their squares, and their count.
typedef struct {
  double sum, sq, n;
} ct_grpo_reward_mean;
#define CT_GRPO_REWARD_MEAN_DOUBLES ((int)(sizeof(ct_grpo_reward_mean) / sizeof(double)))

// filter_groups: what a step's dynamic sampling generated and kept (summed over ranks).
typedef struct {
  double batches;          // prompt batches generated
  double zero_std_groups;  // groups whose rewards were all equal, among all generated
  double kept_zero_std;    // of those, kept to fill the last batch allowed
} ct_grpo_filter_stats;

typedef struct {
  const ct_config *cfg;
  ct_train *tr;
  ct_prompt_set prompts;
  ct_prompt_set eval;   // eval_dataset_path's prompts (n = 0 without)
  int G, agg, K;
  ct_grpo_objective obj;  // loss_type and its options (agg: its token weighting)
  ct_grpo_span_max mx;    // extremes of the last training pass (all ranks after ct_grpo_train_pass)
  ct_grpo_filter_stats fg;  // the last rollouts' dynamic sampling
  ct_reward **rewards;  // (K)
  double *weights;      // (K)
  ct_policy_engine pe;  // the engine over the policy's own weights: the rollouts
  ct_frozen ref;
  bool use_ref;
  ct_acts acts;      // the policy, kept for backward
  ct_head head;
  ct_batch batch;
  ct_prompt_completion *seqs;  // (per_device_train_batch_size) a micro-batch's, for ct_grpo_batch
  int row_T;                   // the longest row of a shared prompt (share_prompts; 0: off)
  ct_grpo_rollout *ro;        // (local completions)
  int n_ro;             // this rank's completions
  int *step_prompts;
  double gen_s;         // seconds spent generating and scoring the current rollouts
  double score_s;       // ... of which scoring them (reward functions, reward models)
  ct_grpo_rollout_stats rs;     // metrics of the current rollouts
  ct_grpo_lengths lens;    // their lengths' extremes
  ct_grpo_reward_mean *func;    // (K) the same per reward function
  ct_completions log;   // completions.jsonl
  ct_grpo_agent *agent; // tool calls and environments in rollouts (NULL: neither)
  long tag_step;        // the episodes' names: the step, train or eval, and the generation
  bool tag_train;       // of that step (grpo/rollout.c)
  int tag_k;
} ct_grpo;

typedef struct {
  double loss, entropy, tokens, input_tokens;
  ct_grpo_span_info info;  // kl, clipping, the off-policy mask
} ct_grpo_step_stats;

// rollout.c ------------------------------------------------------------------

// Samples `per` completions of each of the prompts (indices into set) into ro (one shared
// prefill per prompt) with sampling parameters sp; seeds come from (seed, step, prompt), so
// a resumed run samples the same. train: rollouts to train on (progress lines, room for
// old and reference log-probs).
int ct_grpo_generate(ct_grpo *g, const ct_prompt_set *set, const int *prompts, int n_prompts, int per,
                     ct_sample_params sp, ct_grpo_rollout *ro, bool train);
void ct_grpo_rollouts_free(ct_grpo_rollout *ro, int n);
// The rollout's prompt tokens (its episode's, with an environment) and text.
const ct_ids *ct_grpo_prompt_ids(const ct_grpo *g, const ct_grpo_rollout *r);
const char *ct_grpo_prompt_text(const ct_prompt_set *set, const ct_grpo_rollout *r);
// Fills g->batch with rollouts [first, first + n): prompt + completion, targets on the
// completion tokens.
// share: a group's completions in one row behind their prompt (ct_batch_completions), when
// share_prompts is on and the rows fit.
void ct_grpo_batch(ct_grpo *g, int first, int n, bool share);
// The rollout of gathered head row q of the batch starting at rollout `first`, and the
// index among its own (model) tokens of the token that row predicts (completion token j
// is predicted at position t = prompt + j − 1; tool results are not gathered).
ct_grpo_rollout *ct_grpo_gathered(ct_grpo *g, int first, int q, int *j);
// The reference's per-token log-probs (at the sampling temperature) of every rollout.
int ct_grpo_ref_logps(ct_grpo *g);

// score.c --------------------------------------------------------------------

// R (n, K): each reward function's score of each completion (NaN where one could not
// score), and func: per function the sum and count of its non-NaN scores.
int ct_grpo_reward_matrix(ct_grpo *g, const ct_prompt_set *set, const ct_grpo_rollout *ro, int n, double *R,
                          ct_grpo_reward_mean *func);
// Scores every rollout with each reward function, sums them with the weights, and turns
// the sums into group advantages; fills g->rs, g->lens and g->func (summed over ranks)
// and logs the rollouts (collective).
int ct_grpo_score(ct_grpo *g, const double *scored);

// step.c ---------------------------------------------------------------------

// One pass of the step's gradient over this rank's rollouts (forward, token loss,
// backward), adding to st. first_pass: the rollouts are fresh (their old log-probs are
// the policy's now). Collective: the loss's denominators span every rank.
int ct_grpo_train_pass(ct_grpo *g, bool first_pass, ct_grpo_step_stats *st);

// log.c ----------------------------------------------------------------------

// Appends this step's rollouts to completions.jsonl (collective): each with the score of
// every reward function (R, (n, K); null where NaN), the weighted sum r and advantage adv.
int ct_grpo_log_rollouts(ct_grpo *g, const double *R, const double *r, const double *adv);
// The step's line of metrics.jsonl (st summed over ranks). new_rollouts: the step
// generated its rollouts (else its generation and scoring times are 0).
int ct_grpo_log_step(ct_grpo *g, const ct_grpo_step_stats *st, double lr, double norm, bool new_rollouts,
                     double train_s);

// eval.c ---------------------------------------------------------------------

// Evaluation: one greedy completion of each eval prompt (split across ranks), scored by
// the reward functions: eval_reward (the weighted sum), eval_rewards/<name>/mean,
// eval_completions/mean_length, eval_completions/clipped_ratio.
int ct_grpo_evaluate(ct_grpo *g);

#endif
