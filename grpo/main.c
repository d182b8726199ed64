// grpo: group relative policy optimization with rule-based or remote rewards, as TRL's
// GRPOTrainer; rollouts come from the embedded sampler running on the policy's own
// weights (no copy, no export).
//
//   bin/grpo configs/grpo.yml model_path=DIR dataset_path=prompts.jsonl output_dir=out
//
// Every num_iterations optimizer steps: take the step's prompts, sample num_generations
// completions of each (one shared prefill per prompt), score them, turn rewards into
// group-relative advantages. Each optimizer step then minimizes the clipped surrogate
// (+ beta x k3 KL to a frozen reference) over those completions' tokens, averaged as
// loss_type says (grpo / bnpo / dr_grpo / dapo).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "completions.h"
#include "fingerprint.h"
#include "config.h"
#include "data.h"
#include "dist.h"
#include "engine.h"
#include "panel.h"
#include "error.h"
#include "forward.h"
#include "generate.h"
#include "advantage.h"
#include "grpo/rewards.h"
#include "lm.h"
#include "head.h"
#include "matmul.h"
#include "mem.h"
#include "pool.h"
#include "prompts.h"
#include "reward_model.h"
#include "rng.h"
#include "train.h"
#include "die.h"
#include "run.h"
#include "watch.h"
#include "weights.h"

static int fail(int code, const char *what) {
  ct_die_name("grpo");
  ct_die(code, what);
}

// GRPO's own checks of the config, before anything is loaded.
static int agg_kind(const ct_config *c, int *kind) {
  const char *o = ct_config_origin(c, "loss_type");
  if (c->loss_type.n != 1)
    return ct_set_error(CT_ECONFIG, "%s: key 'loss_type': GRPO takes one loss_type (grpo, bnpo, "
                        "dr_grpo or dapo)", o);
  for (int i = 0; ct_grpo_loss_type_names[i]; i++)  // (the config took GRPO's names only)
    if (!strcmp(c->loss_type.v[0], ct_grpo_loss_type_names[i])) return *kind = i, 0;
  return ct_set_error(CT_ECONFIG, "%s: key 'loss_type': '%s' is no GRPO loss", o, c->loss_type.v[0]);
}

static int reward_init(const ct_config *c, int k, bool check_only, ct_reward **out);

// scale_rewards divides group_norm's advantages, normalize_advantages whitens rloo's:
// either set for another estimator would do nothing.
static int check_estimator(const ct_config *c) {
  const char *est = ct_advantage_estimator_names[c->advantage_estimator];
  if (c->scale_rewards != CT_SCALE_GROUP && c->advantage_estimator != CT_ADV_GROUP_NORM)
    return ct_set_error(CT_ECONFIG, "%s: key 'scale_rewards': '%s' scales group_norm's advantages, and "
                        "advantage_estimator is %s; drop the key or use group_norm",
                        ct_config_origin(c, "scale_rewards"), ct_scale_rewards_names[c->scale_rewards], est);
  if (c->normalize_advantages && c->advantage_estimator != CT_ADV_RLOO)
    return ct_set_error(CT_ECONFIG, "%s: key 'normalize_advantages': whitens rloo's advantages, and "
                        "advantage_estimator is %s%s", ct_config_origin(c, "normalize_advantages"), est,
                        c->advantage_estimator == CT_ADV_REINFORCE_BASELINE ? " (which always whitens)" : "");
  return 0;
}

static int check_config(const ct_config *c) {
  int kind, B = (int)c->per_device_train_batch_size, accum = (int)c->gradient_accumulation_steps;
  int rc = agg_kind(c, &kind);
  if (!rc) rc = check_estimator(c);
  if (!rc) rc = ct_train_check_reference(c);
  if (rc) return rc;
  if (c->reward_funcs.n < 1)
    return ct_set_error(CT_ECONFIG, "%s: key 'reward_funcs': give at least one reward function",
                        ct_config_origin(c, "reward_funcs"));
  if (c->reward_weights.n && c->reward_weights.n != c->reward_funcs.n)
    return ct_set_error(CT_ECONFIG, "%s: key 'reward_weights': needs one weight per reward function (or none)",
                        ct_config_origin(c, "reward_weights"));
  if ((B * accum) % c->num_generations)
    return ct_set_error(CT_ECONFIG, "%s: key 'num_generations': %d does not divide the %d completions "
                        "a rank trains on per step (per_device_train_batch_size x gradient_accumulation_steps)",
                        ct_config_origin(c, "num_generations"), (int)c->num_generations, B * accum);
  if (c->use_peft && c->base_dtype == CT_STORE_INT8)
    return ct_set_error(CT_ECONFIG, "%s: key 'base_dtype': GRPO samples its rollouts with the sampler's "
                        "engine, which runs a float32 or bfloat16 base, not int8", ct_config_origin(c, "base_dtype"));
  static const char *ref_keys[] = {"ref_model_path", "ref_dtype", "sync_ref_model", "ref_model_mixup_alpha",
                                   "ref_model_sync_steps"};
  for (int i = 0; i < 5 && c->beta == 0; i++)  // no KL term: no reference is loaded
    if (ct_config_is_set(c, ref_keys[i]))
      return ct_set_error(CT_ECONFIG, "%s: key '%s': GRPO loads a reference only for the KL term, and "
                          "beta is 0; set beta > 0 or drop the key", ct_config_origin(c, ref_keys[i]), ref_keys[i]);
  if (c->max_completion_length < 1)
    return ct_set_error(CT_ECONFIG, "%s: key 'max_completion_length' must be at least 1 for GRPO",
                        ct_config_origin(c, "max_completion_length"));
  for (int k = 0; k < c->reward_funcs.n; k++) {  // each reward function builds
    ct_reward *r;
    if ((rc = reward_init(c, k, true, &r))) return rc;
    ct_reward_free(r);
  }
  return 0;
}

// One sampled completion and everything training needs of it.
typedef struct {
  int prompt;           // index into the prompt set
  int *ids, n;          // completion tokens (a stop token, when one ended it, is last)
  float *old, *ref;     // (n) log-probs before the first update (num_iterations > 1) / of
                        // the reference (when used)
  float *lp;            // (n) the sampler's log-probs of the chosen tokens (for completions.jsonl)
  int finish;           // CT_FINISH_*
  double reward, adv;
  bool truncated;       // ended by length, not by a stop token
  bool masked;          // no loss (mask_truncated_completions)
  char *text;
} rollout_t;

// The metrics of one set of rollouts, summed over ranks (all doubles: ct_dist_sum_stats).
typedef struct {
  double reward, reward_sq;  // Σ r, Σ r² over completions
  double completions, truncated, length;
  double terminated_length;  // Σ length of the completions ended by a stop token
  double group_std, zero_std_groups, groups;
} rollout_stats;

// Completion lengths' extremes, as maxima over ranks (ct_dist_max_f64): a minimum is kept
// negated. -inf when there is no such completion.
typedef struct {
  double max, neg_min;            // all completions
  double term_max, term_neg_min;  // those ended by a stop token
} length_range;

// Per reward function: Σ of its non-NaN rewards, Σ of their squares, and their count.
typedef struct {
  double sum, sq, n;
} reward_mean;
#define REWARD_MEAN_DOUBLES ((int)(sizeof(reward_mean) / sizeof(double)))

typedef struct {
  const ct_config *cfg;
  ct_train *tr;
  ct_prompt_set prompts;
  ct_prompt_set eval;   // eval_dataset_path's prompts (n = 0 without)
  int G, agg, K;
  ct_reward **rewards;  // (K)
  double *weights;      // (K)
  ct_infer_weights iw;
  int pack;  // CT_PACK_*: the engine's panels, repacked before each generation when the base trains
  ct_engine *engine;
  ct_frozen ref;
  bool use_ref;
  ct_acts acts;      // the policy, kept for backward
  ct_head head;
  ct_batch batch;
  rollout_t *ro;        // (local completions)
  int n_ro;             // this rank's completions
  int *step_prompts;
  double gen_s;         // seconds spent generating and scoring the current rollouts
  double score_s;       // ... of which scoring them (reward functions, reward models)
  rollout_stats rs;     // metrics of the current rollouts
  length_range lens;    // their lengths' extremes
  reward_mean *func;    // (K) the same per reward function
  ct_completions log;   // completions.jsonl
} grpo_t;

// Tokens a reward model scores per text: prompt + completion + what its template adds.
static int reward_model_tokens(const ct_config *c) {
  return (int)(c->max_prompt_length > 0 ? c->max_prompt_length : 1024) + (int)c->max_completion_length + 128;
}

// The reward function k of the config (bad names, regexes, URLs, reward-model directories
// are config errors); check_only: a reward model is checked, not loaded.
static int reward_init(const ct_config *c, int k, bool check_only, ct_reward **out) {
  ct_reward_opts o = {.answer_field = c->answer_field, .answer_regex = c->answer_regex,
                      .numeric = c->answer_numeric, .format_regex = c->format_regex,
                      .target_length = (int)c->length_target, .url = c->reward_url,
                      .api_key_env = c->reward_api_key_env,
                      .connect_timeout_s = c->reward_connect_timeout, .timeout_s = c->reward_timeout,
                      .retries = (int)c->reward_retries, .backoff_s = c->reward_backoff,
                      .failure_nan = c->reward_failure == CT_REWARD_FAIL_NAN, .batch = (int)c->reward_batch,
                      .model_dir = c->reward_funcs.v[k], .model_dtype = c->reward_model_dtype,
                      .model_batch = (int)c->per_device_train_batch_size,
                      .model_max_length = reward_model_tokens(c), .check_only = check_only, .cfg = c,
                      .labels_required = ct_config_is_set(c, "answer_field")};
  int kind;
  if (ct_reward_kind(c->reward_funcs.v[k], &kind))
    return ct_wrap_error(CT_ECONFIG, "%s: key 'reward_funcs'", ct_config_origin(c, "reward_funcs"));
  int rc = ct_reward_init(out, kind, &o);  // a built-in's message names its own key
  if (rc && kind == CT_REWARD_MODEL)
    return ct_wrap_error(rc, "%s: key 'reward_funcs'", ct_config_origin(c, "reward_funcs"));
  return rc;
}

// Rows of `path` that a reward function cannot read (ct_reward_check_rows: no answer_field,
// say) stop the run before any rollout, naming file:line, or with skip_bad_rows are
// dropped and counted with the rows the loader skipped.
static void check_reward_rows(const ct_config *c, ct_log *log, ct_prompt_set *s, const char *path) {
  bool *bad = calloc(s->n > 0 ? (size_t)s->n : 1, sizeof *bad);
  if (!bad) fail(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  int marked = 0;
  for (int k = 0; k < c->reward_funcs.n; k++) {
    ct_reward *r;
    if (reward_init(c, k, true, &r)) fail(2, NULL);
    int rc = ct_reward_check_rows(r, s->rows, s->line, s->n, path, c->skip_bad_rows, bad);
    ct_reward_free(r);
    if (rc < 0) fail(rc == CT_ECONFIG ? 2 : 1, NULL);
    if (rc && !s->first_bad[0]) snprintf(s->first_bad, sizeof s->first_bad, "%s", ct_last_error());
    marked += rc;
  }
  if (marked) ct_prompt_set_drop(s, bad);
  free(bad);
  if (s->n_bad) ct_log_info(log, "%s: %d rows skipped (skip_bad_rows); the first: %s", path, s->n_bad, s->first_bad);
  if (!s->n) fail(1, (ct_set_error(CT_EFORMAT, "%s: no prompts left: every row was skipped, the first: %s", path,
                                   s->first_bad), NULL));
}

static void init_rewards(grpo_t *g) {
  const ct_config *c = g->cfg;
  g->K = c->reward_funcs.n;
  g->rewards = calloc(g->K, sizeof *g->rewards);
  g->weights = malloc(sizeof(double) * g->K);
  g->func = calloc(g->K, sizeof *g->func);
  if (!g->rewards || !g->weights || !g->func) fail(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  for (int k = 0; k < g->K; k++) {
    if (reward_init(c, k, false, &g->rewards[k])) fail(2, NULL);
    g->weights[k] = c->reward_weights.n ? c->reward_weights.v[k] : 1.0;
  }
}

// ---------------------------------------------------------------------------
// Rollouts

// Where ct_generate's finished samples go: ro[request · per + sample]; training rollouts
// also get room for old and reference log-probs.
typedef struct {
  grpo_t *g;
  rollout_t *ro;
  int per;
  bool train;
  long done, total;  // completions (for the progress line)
  double tokens;     // completion tokens so far
} gen_ctx;

static int on_done(void *ctx, const ct_gen_result *r) {
  gen_ctx *c = ctx;
  grpo_t *g = c->g;
  c->tokens += r->n;
  if (c->train) ct_log_phase(&g->tr->log, g->tr->step + 1, "rollouts", ++c->done, c->total, "completions", c->tokens, NULL);
  rollout_t *ro = &c->ro[r->request * c->per + r->sample];
  bool old = c->train && g->cfg->num_iterations > 1, ref = c->train && g->use_ref;
  ro->n = r->n;
  size_t n = r->n ? r->n : 1;
  ro->ids = malloc(sizeof(int) * n);
  ro->text = malloc(r->text_len + 1);
  ro->old = old ? malloc(sizeof(float) * n) : NULL;
  ro->ref = ref ? malloc(sizeof(float) * n) : NULL;
  ro->lp = malloc(sizeof(float) * n);
  if (!ro->ids || !ro->text || !ro->lp || (old && !ro->old) || (ref && !ro->ref))
    return ct_set_error(CT_ENOMEM, "grpo: out of memory");
  memcpy(ro->ids, r->ids, sizeof(int) * r->n);
  memcpy(ro->lp, r->logprobs, sizeof(float) * r->n);
  ro->finish = r->finish;
  memcpy(ro->text, r->text, r->text_len);
  ro->text[r->text_len] = 0;
  ro->truncated = r->finish == CT_FINISH_LENGTH;
  return 0;
}

static void free_rollouts(rollout_t *ro, int n) {
  for (int i = 0; i < n; i++) {
    ct_free_all(ro[i].ids, ro[i].old, ro[i].ref, ro[i].lp, ro[i].text);
    memset(&ro[i], 0, sizeof ro[i]);
  }
}

// Fills g->batch with rollouts [first, first + n): prompt + completion, targets on the
// completion tokens.
static void rollout_batch(grpo_t *g, int first, int n) {
  ct_batch *b = &g->batch;
  int T = 1, pad = ct_tokenizer_pad(g->tr->tok);
  for (int i = 0; i < n; i++) {
    const rollout_t *r = &g->ro[first + i];
    int len = g->prompts.ids[r->prompt].n + r->n;
    T = len > T ? len : T;
  }
  b->B = n;
  b->T = T;
  b->n_target = b->n_tokens = 0;
  for (int i = 0; i < n; i++) {
    const rollout_t *r = &g->ro[first + i];
    const ct_ids *p = &g->prompts.ids[r->prompt];
    ct_batch_row(b, i, p->v, p->n, r->ids, r->n, pad);
  }
}

// The rollout and completion-token index of gathered head row q of the batch starting
// at rollout `first`: completion token j is predicted at position t = prompt + j − 1.
static rollout_t *gathered(grpo_t *g, int first, int q, int *j) {
  int T = g->batch.T, row = g->head.rows[q] / T, t = g->head.rows[q] % T;
  rollout_t *r = &g->ro[first + row];
  *j = t + 1 - g->prompts.ids[r->prompt].n;
  return r;
}

// The reference's per-token log-probs (at the sampling temperature) of every rollout.
static void ref_logps(grpo_t *g) {
  int B = (int)g->cfg->per_device_train_batch_size;
  for (int first = 0; first < g->n_ro; first += B) {
    rollout_batch(g, first, g->n_ro - first < B ? g->n_ro - first : B);
    ct_frozen_through(&g->ref, &g->acts);  // (a LoRA policy's: idle until training)
    int k = ct_frozen_logps(&g->ref, &g->batch, &g->head), j;
    if (k < 0) fail(1, NULL);
    for (int q = 0; q < k; q++) {
      rollout_t *r = gathered(g, first, q, &j);
      r->ref[j] = g->head.logp[q];
    }
  }
}

// Samples `per` completions of each of the prompts (indices into set) into ro (one shared
// prefill per prompt) with sampling parameters sp; seeds come from (seed, step, prompt), so
// a resumed run samples the same.
static void generate(grpo_t *g, const ct_prompt_set *set, const int *prompts, int n_prompts, int per,
                     ct_sample_params sp, rollout_t *ro, bool train) {
  const ct_config *c = g->cfg;
  ct_train *tr = g->tr;
  ct_gen_request *req = calloc(n_prompts > 0 ? n_prompts : 1, sizeof *req);
  if (!req) fail(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  if (!c->use_peft && ct_infer_pack(&g->iw, g->pack)) fail(1, NULL);  // the weights as trained so far
  const int *stop_ids;
  int n_stop = ct_tokenizer_stop_ids(tr->tok, &stop_ids);
  for (int i = 0; i < n_prompts; i++) {
    const ct_ids *p = &set->ids[prompts[i]];
    uint64_t seed = (uint64_t)c->seed * 1000003u + (uint64_t)tr->step * 7919u + (uint64_t)prompts[i];
    req[i] = (ct_gen_request){.prompt = p->v, .prompt_len = p->n, .n = per, .seed = seed, .sp = sp,
                              .max_new_tokens = (int)c->max_completion_length,
                              .stop_ids = stop_ids, .n_stop_ids = n_stop};
    for (int k = 0; k < per; k++) ro[i * per + k].prompt = prompts[i];
  }
  gen_ctx ctx = {g, ro, per, train, 0, (long)n_prompts * per, 0};
  ct_gen_callbacks cb = {on_done, NULL, &ctx};
  if (train) ct_log_phase(&tr->log, tr->step + 1, "rollouts", 0, ctx.total, "completions", 0, NULL);
  if (ct_generate(g->engine, tr->tok, req, n_prompts, &cb)) fail(1, "generating completions");
  free(req);
}

// R (n, K): each reward function's score of each completion (NaN where one could not
// score), and func: per function the sum and count of its non-NaN scores.
static void reward_matrix(grpo_t *g, const ct_prompt_set *set, const rollout_t *ro, int n, double *R,
                          reward_mean *func) {
  int K = g->K;
  size_t m = n > 0 ? (size_t)n : 1;
  double *col = malloc(sizeof(double) * m);
  ct_reward_item *items = malloc(sizeof *items * m);
  if (!col || !items) fail(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  for (int i = 0; i < n; i++) items[i] = (ct_reward_item){set->text[ro[i].prompt], ro[i].text, set->rows[ro[i].prompt]};
  memset(func, 0, sizeof *func * K);
  for (int k = 0; k < K; k++) {
    if (ct_reward_score(g->rewards[k], items, n, col)) fail(1, "scoring completions");
    for (int i = 0; i < n; i++) {
      R[(long)i * K + k] = col[i];
      if (col[i] == col[i]) func[k].sum += col[i], func[k].sq += col[i] * col[i], func[k].n += 1;
    }
  }
  ct_free_all(col, items);
}

// The rollouts' lengths: sums into s, extremes into g->lens (over all ranks).
static void length_stats(grpo_t *g, rollout_stats *s) {
  length_range *e = &g->lens;
  e->max = e->neg_min = e->term_max = e->term_neg_min = -INFINITY;
  for (int i = 0; i < g->n_ro; i++) {
    double n = g->ro[i].n;
    s->completions += 1;
    s->length += n;
    e->max = fmax(e->max, n), e->neg_min = fmax(e->neg_min, -n);
    if (g->ro[i].truncated) {
      s->truncated += 1;
    } else {
      s->terminated_length += n;
      e->term_max = fmax(e->term_max, n), e->term_neg_min = fmax(e->term_neg_min, -n);
    }
  }
  if (ct_dist_max_f64((double *)e, (int)(sizeof *e / sizeof(double)))) fail(1, NULL);
}

// Appends this step's rollouts to completions.jsonl (collective): each with the score of
// every reward function (R, (n, K); null where NaN), the weighted sum r and advantage adv.
static void log_rollouts(grpo_t *g, const double *R, const double *r, const double *adv) {
  int n = g->n_ro, K = g->K;
  if (!g->log.on) return;
  json_t **rows = malloc(sizeof *rows * (n > 0 ? n : 1));
  if (!rows) fail(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  for (int i = 0; i < n; i++) {
    const rollout_t *o = &g->ro[i];
    rows[i] = ct_completion_row(g->tr->step + 1, ct_completion_prompt(g->prompts.rows[o->prompt]), o->text, o->ids,
                                o->lp, o->n, ct_finish_names[o->finish]);
    for (int k = 0; k < K; k++) {
      double v = R[(long)i * K + k];
      json_object_set_new(rows[i], ct_reward_name(g->rewards[k]), v == v ? json_real(v) : json_null());
    }
    json_object_set_new(rows[i], "reward", json_real(r[i]));
    json_object_set_new(rows[i], "advantage", json_real(adv[i]));
  }
  if (ct_completions_append(&g->log, rows, n)) fail(1, "logging completions");
  free(rows);
}

// The advantages adv (n_ro) of this rank's rewards r as advantage_estimator says (whitening
// is collective: its statistics span every rank). batch_std: of every rank's rewards.
// Returns the number of this rank's groups whose rewards are all equal.
static int advantages(grpo_t *g, const double *r, double batch_std, double *adv) {
  const ct_config *c = g->cfg;
  int n = g->n_ro, groups = n / g->G, zero;
  switch (c->advantage_estimator) {
    case CT_ADV_RLOO:
      zero = ct_grpo_rloo(r, groups, g->G, adv);
      if (c->normalize_advantages && ct_grpo_whiten(adv, NULL, n, CT_WHITEN_COMPLETIONS)) fail(1, NULL);
      return zero;
    case CT_ADV_REINFORCE_BASELINE: {
      zero = ct_grpo_group_baseline(r, groups, g->G, adv);
      double *tokens = malloc(sizeof(double) * (n > 0 ? n : 1));  // (n) each completion's weight
      if (!tokens) fail(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
      for (int i = 0; i < n; i++) tokens[i] = g->ro[i].n;
      if (ct_grpo_whiten(adv, tokens, n, CT_WHITEN_TOKENS)) fail(1, NULL);
      free(tokens);
      return zero;
    }
    default: return ct_grpo_advantages(r, groups, g->G, c->scale_rewards, batch_std, adv);
  }
}

// Scores every rollout with each reward function, sums them with the weights, and turns
// the sums into group advantages; fills g->rs, g->lens and g->func (summed over ranks)
// and logs the rollouts.
static void score(grpo_t *g) {
  const ct_config *c = g->cfg;
  int n = g->n_ro, K = g->K, groups = n / g->G;
  size_t m = n > 0 ? (size_t)n : 1;
  double *R = malloc(sizeof(double) * m * K), *r = malloc(sizeof(double) * m), *adv = malloc(sizeof(double) * m);
  if (!R || !r || !adv) fail(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  reward_matrix(g, &g->prompts, g->ro, n, R, g->func);
  ct_grpo_total_rewards(R, n, K, g->weights, r);
  rollout_stats *s = &g->rs;
  memset(s, 0, sizeof *s);
  for (int i = 0; i < n; i++) {
    s->reward += r[i];
    s->reward_sq += r[i] * r[i];
  }
  length_stats(g, s);
  for (int p = 0; p < groups; p++) {
    double mean;
    s->group_std += ct_grpo_group_std(r + (long)p * g->G, g->G, &mean);
  }
  s->groups = groups;
  // the batch std needs every rank's rewards; the zero-std count needs the advantages
  rollout_stats part = *s;
  ct_dist_sum_stats(&part);
  double mean = part.reward / part.completions;
  double var = (part.reward_sq - part.completions * mean * mean) / (part.completions > 1 ? part.completions - 1 : 1);
  double zero = advantages(g, r, sqrt(var > 0 ? var : 0), adv);
  ct_dist_sum_f64(&zero, 1);
  *s = part;
  s->zero_std_groups = zero;
  if (ct_dist_sum_f64((double *)g->func, REWARD_MEAN_DOUBLES * K)) fail(1, NULL);
  for (int i = 0; i < n; i++) {
    g->ro[i].reward = r[i];
    g->ro[i].adv = adv[i];
    g->ro[i].masked = c->mask_truncated_completions && g->ro[i].truncated;
  }
  log_rollouts(g, R, r, adv);
  ct_free_all(R, r, adv);
}

// ---------------------------------------------------------------------------
// One optimizer step's gradient over the rollouts

typedef struct {
  double loss, kl, clip_lo, clip_hi, entropy, tokens, input_tokens;
} step_stats;

// One micro-batch's per-token loss, for the head's rows a chunk at a time (ct_head_coef_fn).
typedef struct {
  grpo_t *g;
  int first;  // the micro-batch's first rollout
  bool first_pass;
  const ct_grpo_counts *counts;
  double micro_tokens;
  ct_grpo_clip clip;
  step_stats *st;
} token_loss;

static void token_loss_rows(void *ctx, ct_head *h, int r0, int r1) {
  token_loss *t = ctx;
  grpo_t *g = t->g;
  const ct_config *c = g->cfg;
  step_stats *st = t->st;
  for (int q = r0; q < r1; q++) {
    int j;
    rollout_t *r = gathered(g, t->first, q, &j);
    h->coef[q] = h->zcoef[q] = 0;
    // old log-probs: the policy's before this rollout's first update. The first pass
    // computes them (ratio exactly 1) and keeps them when later passes reuse the rollouts.
    double lp = h->logp[q], old = t->first_pass ? lp : r->old[j], d;
    if (t->first_pass && r->old) r->old[j] = h->logp[q];
    if (r->masked) continue;
    double w = ct_grpo_token_weight(g->agg, t->counts, r->n, t->micro_tokens, (int)c->max_completion_length);
    ct_grpo_token_info info;
    double l = ct_grpo_token_loss(&t->clip, lp, old, g->use_ref ? r->ref[j] : 0, r->adv, &d, &info);
    h->coef[q] = (float)(-w * d);  // coef = −dL/dlp
    st->loss += w * l;
    st->kl += info.kl;
    st->clip_lo += info.clipped_low;
    st->clip_hi += info.clipped_high;
    st->entropy += h->entropy[q];
    st->tokens += 1;
  }
}

static void train_pass(grpo_t *g, bool first_pass, step_stats *st) {
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
  ct_log_phase(&tr->log, tr->step + 1, "training", 0, (g->n_ro + B - 1) / B, "micro-batches", 0, NULL);
  for (int first = 0; first < g->n_ro; first += B) {
    int n = g->n_ro - first < B ? g->n_ro - first : B;
    double micro_tokens = 0;
    for (int i = 0; i < n; i++)
      if (!g->ro[first + i].masked) micro_tokens += g->ro[first + i].n;
    rollout_batch(g, first, n);
    ct_train_dropout_key(tr, first / B);
    const ct_batch *b = &g->batch;
    ct_acts *a = &g->acts;
    token_loss t = {g, first, first_pass, &counts, micro_tokens, clip, st};
    if (ct_lm_fused(&tr->model, &tr->g, a, &g->head, b, token_loss_rows, &t) < 0) fail(1, NULL);
    st->input_tokens += b->n_tokens;
    ct_backward(&tr->model, &tr->g, a, a->dln, b->B, b->T);
    char reward[48];
    snprintf(reward, sizeof reward, "reward %.3f", g->rs.reward / (g->rs.completions > 0 ? g->rs.completions : 1));
    ct_log_phase(&tr->log, tr->step + 1, "training", first / B + 1, (g->n_ro + B - 1) / B, "micro-batches",
                 st->input_tokens, reward);
  }
}

// Evaluation: one greedy completion of each eval prompt (split across ranks), scored by
// the reward functions: eval_reward (the weighted sum), eval_rewards/<name>/mean,
// eval_completions/mean_length, eval_completions/clipped_ratio.
static void evaluate(grpo_t *g) {
  ct_train *tr = g->tr;
  int n = g->eval.n, lo = (int)((long)n * tr->rank / tr->world), hi = (int)((long)n * (tr->rank + 1) / tr->world);
  int m = hi - lo, K = g->K;
  size_t mm = m > 0 ? (size_t)m : 1;
  int *idx = malloc(sizeof(int) * mm);
  rollout_t *ro = calloc(mm, sizeof *ro);
  double *R = malloc(sizeof(double) * mm * K), *r = malloc(sizeof(double) * mm);
  reward_mean *func = calloc(K, sizeof *func);
  if (!idx || !ro || !R || !r || !func) fail(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  for (int i = 0; i < m; i++) idx[i] = lo + i;
  ct_sample_params greedy = {0, 0, 1, 0, 1};
  if (m > 0) generate(g, &g->eval, idx, m, 1, greedy, ro, false);
  reward_matrix(g, &g->eval, ro, m, R, func);
  ct_grpo_total_rewards(R, m, K, g->weights, r);
  struct {
    double reward, length, clipped, count;
  } s = {0};
  for (int i = 0; i < m; i++) s.reward += r[i], s.length += ro[i].n, s.clipped += ro[i].truncated, s.count += 1;
  if (ct_dist_sum_stats(&s) || ct_dist_sum_f64((double *)func, REWARD_MEAN_DOUBLES * K)) fail(1, NULL);
  double c = s.count > 0 ? s.count : 1;
  json_t *j = json_pack("{s:I,s:f,s:f,s:f}", "step", (json_int_t)tr->step, "eval_reward", s.reward / c,
                        "eval_completions/mean_length", s.length / c, "eval_completions/clipped_ratio", s.clipped / c);
  char key[96];
  for (int k = 0; k < K; k++) {
    snprintf(key, sizeof key, "eval_rewards/%s/mean", ct_reward_name(g->rewards[k]));
    json_object_set_new(j, key, json_real(func[k].n > 0 ? func[k].sum / func[k].n : NAN));
  }
  ct_log_info(&tr->log, "eval at step %ld: mean reward %.4f of greedy completions of %d prompts", tr->step,
              s.reward / c, n);
  if (ct_log_metrics(&tr->log, j)) fail(1, NULL);
  free_rollouts(ro, m);
  ct_free_all(idx, ro, R, r, func);
}

static void grpo_free(grpo_t *g) {
  free_rollouts(g->ro, g->n_ro);
  free(g->ro);
  ct_prompt_set_free(&g->eval);
  free(g->step_prompts);
  if (g->engine) ct_engine_free(g->engine);
  ct_infer_free(&g->iw);
  if (g->use_ref) ct_frozen_free(&g->ref);
  for (int k = 0; k < g->K; k++) ct_reward_free(g->rewards[k]);
  ct_free_all(g->rewards, g->weights, g->func);
  ct_acts_free(&g->acts);
  ct_head_free(&g->head);
  ct_batch_free(&g->batch);
  ct_prompt_set_free(&g->prompts);
}

// TRL's completions/* lengths (in tokens, a stop token counted): of every completion, and
// of those ended by a stop token ("terminated"; 0 when none was).
static void set_length_metrics(json_t *j, const rollout_stats *s, const length_range *e) {
  double term = s->completions - s->truncated;
  json_object_set_new(j, "completions/min_length", json_real(s->completions > 0 ? -e->neg_min : 0));
  json_object_set_new(j, "completions/max_length", json_real(s->completions > 0 ? e->max : 0));
  json_object_set_new(j, "completions/mean_terminated_length", json_real(term > 0 ? s->terminated_length / term : 0));
  json_object_set_new(j, "completions/min_terminated_length", json_real(term > 0 ? -e->term_neg_min : 0));
  json_object_set_new(j, "completions/max_terminated_length", json_real(term > 0 ? e->term_max : 0));
}

static void log_step(grpo_t *g, const step_stats *st, double lr, double norm, bool new_rollouts,
                     double train_s) {
  const rollout_stats *s = &g->rs;
  ct_train *tr = g->tr;
  double tok = st->tokens > 0 ? st->tokens : 1, n = s->completions > 0 ? s->completions : 1;
  double groups = s->groups > 0 ? s->groups : 1;
  json_t *j = json_pack("{s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}",
                        "step", (json_int_t)tr->step, "loss", st->loss, "reward", s->reward / n,
                        "reward_std", s->group_std / groups, "frac_reward_zero_std", s->zero_std_groups / groups,
                        "kl", st->kl / tok, "clip_ratio/low_mean", st->clip_lo / tok,
                        "clip_ratio/high_mean", st->clip_hi / tok, "completions/mean_length", s->length / n,
                        "completions/clipped_ratio", s->truncated / n, "entropy", st->entropy / tok,
                        "learning_rate", lr, "grad_norm", norm, "num_tokens", tr->num_tokens,
                        "time/generation_s", new_rollouts ? g->gen_s : 0.0, "time/training_s", train_s);
  set_length_metrics(j, s, &g->lens);
  json_object_set_new(j, "time/scoring_s", json_real(new_rollouts ? g->score_s : 0.0));
  char key[96];
  for (int k = 0; k < g->K; k++) {  // std as TRL's nanstd: Bessel-corrected, NaN (left out) below 2
    const reward_mean *f = &g->func[k];
    snprintf(key, sizeof key, "rewards/%s/mean", ct_reward_name(g->rewards[k]));
    json_object_set_new(j, key, json_real(f->n > 0 ? f->sum / f->n : NAN));
    snprintf(key, sizeof key, "rewards/%s/std", ct_reward_name(g->rewards[k]));
    double var = f->n > 1 ? (f->sq - f->sum * f->sum / f->n) / (f->n - 1) : 0;
    json_object_set_new(j, key, json_real(f->n > 1 ? sqrt(fmax(var, 0)) : NAN));
  }
  if (ct_log_metrics(&tr->log, j)) fail(1, NULL);
}

int main(int argc, char **argv) {
  ct_config cfg;
  ct_train tr;
  ct_train_start(&tr, &cfg, CT_TRAINER_GRPO, argc, argv, check_config);
  grpo_t g = {.cfg = &cfg, .tr = &tr, .G = (int)cfg.num_generations};
  agg_kind(&cfg, &g.agg);  // (checked by check_config, which also checked every reward function)
  int B = (int)cfg.per_device_train_batch_size, accum = (int)cfg.gradient_accumulation_steps;
  ct_prompt_opts po = {true, (int)cfg.max_prompt_length, cfg.truncate_prompt == CT_TRUNCATE_LEFT,
                       "max_prompt_length", tr.model.cfg.vocab_size, cfg.skip_bad_rows};
  if (ct_prompt_set_load(&g.prompts, cfg.dataset_path, tr.tok, &po)) fail(1, NULL);
  check_reward_rows(&cfg, &tr.log, &g.prompts, cfg.dataset_path);
  bool have_eval = cfg.eval_dataset_path[0] != 0;
  if (have_eval && ct_prompt_set_load(&g.eval, cfg.eval_dataset_path, tr.tok, &po)) fail(1, NULL);
  if (have_eval) check_reward_rows(&cfg, &tr.log, &g.eval, cfg.eval_dataset_path);
  int per_rank_prompts = B * accum / g.G, step_prompts = per_rank_prompts * tr.world;
  ct_log_info(&tr.log, "prompts: %s: %d rows; %d prompts x %d completions per generation", cfg.dataset_path,
              g.prompts.n, step_prompts, g.G);
  if (cfg.max_steps <= 0) tr.steps_per_batch = (int)cfg.num_iterations;  // epochs count generations
  if (ct_train_schedule(&tr, g.prompts.n, step_prompts, ct_prompt_set_fingerprint(&g.prompts))) fail(1, NULL);
  int max_prompt = 1;
  for (int i = 0; i < g.prompts.n; i++) max_prompt = g.prompts.ids[i].n > max_prompt ? g.prompts.ids[i].n : max_prompt;
  for (int i = 0; i < g.eval.n; i++) max_prompt = g.eval.ids[i].n > max_prompt ? g.eval.ids[i].n : max_prompt;
  int T = max_prompt + (int)cfg.max_completion_length;
  const ct_model_config *mc = &tr.model.cfg;
  int V = mc->vocab_size, C = mc->hidden_size, tiles = (int)cfg.num_vocab_tiling;
  int mode = cfg.gradient_checkpointing ? CT_ACTS_RECOMPUTE : CT_ACTS_KEEP;
  g.use_ref = cfg.beta > 0;
  ct_engine_opts eo = {(int)cfg.decode_slots, T, max_prompt > (int)cfg.decode_slots ? max_prompt : (int)cfg.decode_slots};
  ct_plan plan = {0};
  ct_train_plan_acts(&tr, &plan, B, 0, T);
  int hrows = ct_head_chunk_rows(B * T, V, CT_HEAD_MIN_ROWS_GRPO);  // the fused head's rows at a time (train_pass)
  ct_plan_addf(&plan, ct_head_bytes(B * T, hrows, V, C, tiles),
               "LM head: logits of %d of %d x %d tokens at a time / %d chunks", hrows, B, T, tiles);
  ct_plan_addf(&plan, ct_engine_bytes(mc, &eo), "sampler: KV cache of %d slots x %d positions", eo.slots, T);
  g.pack = tr.bf16 && ct_panel16_native() ? CT_PACK_BF16 : CT_PACK_F32;
  ct_plan_addf(&plan, ct_infer_pack_bytes(mc, g.pack), "sampler: the weights packed for decoding (%s)",
               g.pack == CT_PACK_BF16 ? "bfloat16" : "float32");
  if (g.use_ref) ct_train_plan_reference(&tr, &plan, B, T);
  for (int k = 0, kind; k < cfg.reward_funcs.n; k++)
    if (!ct_reward_kind(cfg.reward_funcs.v[k], &kind) && kind == CT_REWARD_MODEL)
      ct_plan_addf(&plan, ct_rm_bytes(cfg.reward_funcs.v[k], (int)cfg.reward_model_dtype, B, reward_model_tokens(&cfg)),
                   "reward model %s (%s)", cfg.reward_funcs.v[k], ct_store_names[cfg.reward_model_dtype]);
  bool dry = false;
  if (ct_model_rope_reserve(&tr.model, T) ||
      ct_train_memory(&tr, &plan, "gradient_checkpointing=true, ref_dtype=bfloat16 or int8 (or beta=0: "
                      "no reference), num_vocab_tiling, a smaller per_device_train_batch_size, "
                      "decode_slots or max_completion_length", &dry))
    fail(1, NULL);
  if (dry) {
    grpo_free(&g);
    ct_train_release(&tr);
    return 0;
  }
  init_rewards(&g);  // (a reward model is loaded here: after the plan said it fits)
  if (ct_completions_open(&g.log, cfg.output_dir, cfg.log_completions, (int)cfg.num_completions_to_print, tr.step,
                          &tr.log))
    fail(1, NULL);
  g.step_prompts = malloc(sizeof(int) * step_prompts);
  g.ro = calloc((size_t)per_rank_prompts * g.G, sizeof *g.ro);
  if (!g.step_prompts || !g.ro || ct_acts_init(&g.acts, &tr.model, B, T, mode) || ct_train_attach(&tr, &g.acts) ||
      ct_batch_init(&g.batch, B, T) || ct_head_init(&g.head, B * T, hrows, V, C, tiles))
    fail(1, NULL);
  g.head.inv_temp = cfg.temperature > 0 ? (float)(1.0 / cfg.temperature) : 1.0f;
  if (g.use_ref && ct_train_reference(&tr, &g.ref, cfg.ref_dtype, B, T)) fail(1, NULL);
  if (ct_infer_from_model(&g.iw, &tr.model) || ct_infer_attach_lora(&g.iw, cfg.use_peft ? &tr.lora : NULL) ||
      ct_infer_pack(&g.iw, g.pack) || ct_engine_init(&g.engine, &g.iw, &eo))
    fail(1, NULL);
  if (tr.bf16) ct_log_info(&tr.log, "rollouts: %s", g.pack == CT_PACK_BF16 ? "bfloat16 weights, float32 sums" :
                           "float32 (this build has no AVX512_BF16 kernel)");
  ct_log_info(&tr.log, "training %ld steps; %s loss; beta %g (%s)", tr.total_steps - tr.step,
              cfg.loss_type.v[0], g.use_ref ? cfg.beta : 0.0, g.use_ref ? "reference loaded" : "no reference model");
  ct_train_watch_signals(&tr);
  if (have_eval && cfg.eval_on_start && tr.step == 0) evaluate(&g);
  bool stop = false;
  int iter = 0;
  double t_win = ct_now();
  while (tr.step < tr.total_steps && !stop) {
    if (iter == 0) {  // new rollouts
      double t0 = ct_now();
      int n = ct_train_next_seqs(&tr, g.step_prompts, step_prompts);
      int lo = n * tr.rank / tr.world, hi = n * (tr.rank + 1) / tr.world;
      free_rollouts(g.ro, g.n_ro);
      g.n_ro = (hi - lo) * g.G;
      ct_sample_params sp = {(float)cfg.temperature, (int)cfg.top_k, (float)cfg.top_p, (float)cfg.min_p,
                             (float)cfg.repetition_penalty};
      generate(&g, &g.prompts, g.step_prompts + lo, hi - lo, g.G, sp, g.ro, true);
      double ts = ct_now();
      score(&g);
      g.score_s = ct_now() - ts;
      if (g.use_ref) ref_logps(&g);
      g.gen_s = ct_now() - t0;
    }
    double t1 = ct_now();
    step_stats st = {0};
    train_pass(&g, iter == 0, &st);
    ct_dist_sum_stats(&st);
    double norm, lr;
    if (ct_train_update(&tr, &norm, &lr)) fail(1, NULL);
    if (cfg.sync_ref_model && g.use_ref && tr.step % cfg.ref_model_sync_steps == 0 &&
        ct_train_sync_reference(&tr, &g.ref, cfg.ref_model_mixup_alpha))
      fail(1, NULL);
    double train_s = ct_now() - t1;
    tr.num_tokens += st.input_tokens;
    ct_log_progress(&tr.log, tr.step, g.rs.reward / (g.rs.completions > 0 ? g.rs.completions : 1),
                    st.input_tokens / (ct_now() - t_win));
    t_win = ct_now();
    if (ct_train_log_due(&tr)) log_step(&g, &st, lr, norm, iter == 0, train_s);
    iter = (iter + 1) % (int)cfg.num_iterations;
    tr.mid_batch = iter != 0;  // resuming mid-batch would need these rollouts again
    if (have_eval && cfg.eval_steps > 0 && tr.step % cfg.eval_steps == 0 && tr.step != tr.total_steps) evaluate(&g);
    if (ct_train_after_step(&tr, &stop)) fail(1, NULL);
  }
  if (!stop && have_eval) evaluate(&g);
  grpo_free(&g);
  return ct_train_finish(&tr, stop);
}
