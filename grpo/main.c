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

#include "advantage.h"
#include "die.h"
#include "dist.h"
#include "error.h"
#include "fingerprint.h"
#include "grpo/grpo.h"
#include "lm.h"
#include "loop.h"
#include "mem.h"
#include "policy_engine.h"
#include "reward_model.h"
#include "run.h"
#include "watch.h"

// GRPO's own checks of the config, before anything is loaded.
static int agg_kind(const ct_config *c, int *kind) {
  ct_grpo_objective o;
  return ct_grpo_objective_of(c, false, &o, kind);
}

static int reward_init(const ct_config *c, int k, bool check_only, ct_reward **out);

// scale_rewards divides group_norm's advantages, normalize_advantages whitens rloo's:
// either set for another estimator would do nothing.
static int check_estimator(const ct_config *c) {
  const char *est = ct_advantage_estimator_names[c->advantage_estimator];
  if (c->multi_objective_aggregation == CT_MOA_NORMALIZE_THEN_SUM) {  // its own normalization
    static const char *const keys[] = {"scale_rewards", "advantage_estimator", "normalize_advantages"};
    bool other[] = {c->scale_rewards != CT_SCALE_GROUP, c->advantage_estimator != CT_ADV_GROUP_NORM,
                    c->normalize_advantages != 0};
    for (int i = 0; i < 3; i++)
      if (other[i])
        return ct_set_error(CT_ECONFIG, "%s: key '%s': multi_objective_aggregation normalize_then_sum "
                            "normalizes the rewards itself (per function in each group, then over the batch)",
                            ct_config_origin(c, keys[i]), keys[i]);
    return 0;
  }
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
  if (!c->filter_groups && ct_config_is_set(c, "max_num_gen_batches"))
    return ct_set_error(CT_ECONFIG, "%s: key 'max_num_gen_batches': caps filter_groups' batches, and "
                        "filter_groups is false", ct_config_origin(c, "max_num_gen_batches"));
  if (c->answer_math && c->answer_numeric)
    return ct_set_error(CT_ECONFIG, "%s: key 'answer_math': compares as math answers, and answer_numeric "
                        "as plain numbers: set one", ct_config_origin(c, "answer_math"));
  static const char *const own[][2] = {  // a reward function's keys, refused without it
      {"overlong_buffer_len", "overlong"},        {"repetition_ngram_size", "repetition_penalty"},
      {"repetition_max_penalty", "repetition_penalty"}, {"cosine_max_len", "cosine"},
      {"cosine_min_value_wrong", "cosine"},       {"cosine_max_value_wrong", "cosine"},
      {"cosine_min_value_correct", "cosine"},     {"cosine_max_value_correct", "cosine"}};
  for (size_t i = 0; i < sizeof own / sizeof *own; i++) {
    bool used = false;
    for (int k = 0; k < c->reward_funcs.n; k++) used |= !strcmp(c->reward_funcs.v[k], own[i][1]);
    if (!used && ct_config_is_set(c, own[i][0]))
      return ct_set_error(CT_ECONFIG, "%s: key '%s': the %s reward's, and reward_funcs has no %s",
                          ct_config_origin(c, own[i][0]), own[i][0], own[i][1], own[i][1]);
  }
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


// Tokens a reward model scores per text: prompt + completion + what its template adds.
static int reward_model_tokens(const ct_config *c) {
  return (int)(c->max_prompt_length > 0 ? c->max_prompt_length : 1024) + (int)c->max_completion_length + 128;
}

// The reward function k of the config (bad names, regexes, URLs, reward-model directories
// are config errors); check_only: a reward model is checked, not loaded.
static int reward_init(const ct_config *c, int k, bool check_only, ct_reward **out) {
  ct_reward_opts o = {.answer_field = c->answer_field, .answer_regex = c->answer_regex,
                      .numeric = c->answer_numeric, .math = c->answer_math, .format_regex = c->format_regex,
                      .target_length = (int)c->length_target, .url = c->reward_url,
                      .overlong_max_len = (int)c->max_completion_length,
                      .overlong_buffer = (int)c->overlong_buffer_len,
                      .ngram = (int)c->repetition_ngram_size, .max_penalty = c->repetition_max_penalty,
                      .cosine_max_len = (int)(c->cosine_max_len > 0 ? c->cosine_max_len : c->max_completion_length),
                      .min_value_wrong = c->cosine_min_value_wrong, .max_value_wrong = c->cosine_max_value_wrong,
                      .min_value_correct = c->cosine_min_value_correct, .max_value_correct = c->cosine_max_value_correct,
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
  if (!bad) ct_die(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  int marked = 0;
  for (int k = 0; k < c->reward_funcs.n; k++) {
    ct_reward *r;
    if (reward_init(c, k, true, &r)) ct_die(2, NULL);
    int rc = ct_reward_check_rows(r, s->rows, s->line, s->n, path, c->skip_bad_rows, bad);
    ct_reward_free(r);
    if (rc < 0) ct_die(rc == CT_ECONFIG ? 2 : 1, NULL);
    if (rc && !s->first_bad[0]) snprintf(s->first_bad, sizeof s->first_bad, "%s", ct_last_error());
    marked += rc;
  }
  if (marked) ct_prompt_set_drop(s, bad);
  free(bad);
  if (s->n_bad) ct_log_info(log, "%s: %d rows skipped (skip_bad_rows); the first: %s", path, s->n_bad, s->first_bad);
  if (!s->n) ct_die(1, (ct_set_error(CT_EFORMAT, "%s: no prompts left: every row was skipped, the first: %s", path,
                                   s->first_bad), NULL));
}

static void init_rewards(ct_grpo *g) {
  const ct_config *c = g->cfg;
  g->K = c->reward_funcs.n;
  g->rewards = calloc(g->K, sizeof *g->rewards);
  g->weights = malloc(sizeof(double) * g->K);
  g->func = calloc(g->K, sizeof *g->func);
  if (!g->rewards || !g->weights || !g->func) ct_die(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  for (int k = 0; k < g->K; k++) {
    if (reward_init(c, k, false, &g->rewards[k])) ct_die(2, NULL);
    g->weights[k] = c->reward_weights.n ? c->reward_weights.v[k] : 1.0;
  }
}

static void grpo_free(ct_grpo *g) {
  ct_grpo_rollouts_free(g->ro, g->n_ro);
  free(g->ro);
  ct_prompt_set_free(&g->eval);
  free(g->step_prompts);
  ct_policy_engine_free(&g->pe);
  if (g->use_ref) ct_frozen_free(&g->ref);
  for (int k = 0; k < g->K; k++) ct_reward_free(g->rewards[k]);
  ct_free_all(g->rewards, g->weights, g->func);
  ct_acts_free(&g->acts);
  ct_head_free(&g->head);
  ct_batch_free(&g->batch);
  free(g->seqs);
  ct_prompt_set_free(&g->prompts);
  ct_grpo_agent_free(g->agent);
}

// A step's shape: prompts (all ranks) and this rank's, sequence length, the fused head's
// rows at a time (grpo/step.c), the engine's slots and positions.
typedef struct {
  int step_prompts, per_rank_prompts, T, hrows, max_prompt;
  bool kv16;  // the engine's weights are bf16: so are its cached keys and values
  ct_engine_opts eo;
} shape_t;

// The engine's shape for `slots` decode slots: positions for the longest prompt and its
// completion; a pass holds the longest prompt's prefill, or one token per slot.
static ct_engine_opts engine_opts(const shape_t *s, int slots) {
  return (ct_engine_opts){slots, s->T, s->max_prompt > slots ? s->max_prompt : slots, s->kv16};
}

// The prompts (and eval prompts), each row checked by the reward functions, the step
// schedule over them, and the step's shape.
static shape_t load_prompts(ct_grpo *g) {
  const ct_config *cfg = g->cfg;
  ct_train *tr = g->tr;
  int B = (int)cfg->per_device_train_batch_size, accum = (int)cfg->gradient_accumulation_steps;
  ct_prompt_opts po = {true, (int)cfg->max_prompt_length, cfg->truncate_prompt == CT_TRUNCATE_LEFT,
                       "max_prompt_length", tr->model.cfg.vocab_size, cfg->skip_bad_rows,
                       ct_grpo_agent_schemas(g->agent), ct_grpo_agent_env(g->agent)};
  if (ct_prompt_set_load(&g->prompts, cfg->dataset_path, tr->tok, &po)) ct_die(1, NULL);
  check_reward_rows(cfg, &tr->log, &g->prompts, cfg->dataset_path);
  bool have_eval = cfg->eval_dataset_path[0] != 0;
  if (have_eval && ct_prompt_set_load(&g->eval, cfg->eval_dataset_path, tr->tok, &po)) ct_die(1, NULL);
  if (have_eval) check_reward_rows(cfg, &tr->log, &g->eval, cfg->eval_dataset_path);
  shape_t s = {.per_rank_prompts = B * accum / g->G};
  s.step_prompts = s.per_rank_prompts * tr->world;
  ct_log_info(&tr->log, "prompts: %s: %d rows; %d prompts x %d completions per generation", cfg->dataset_path,
              g->prompts.n, s.step_prompts, g->G);
  if (cfg->max_steps <= 0) tr->steps_per_batch = (int)cfg->num_iterations;  // epochs count generations
  if (ct_train_schedule(tr, g->prompts.n, s.step_prompts, ct_prompt_set_fingerprint(&g->prompts))) ct_die(1, NULL);
  int max_prompt = 1;
  for (int i = 0; i < g->prompts.n; i++) max_prompt = g->prompts.ids[i].n > max_prompt ? g->prompts.ids[i].n : max_prompt;
  for (int i = 0; i < g->eval.n; i++) max_prompt = g->eval.ids[i].n > max_prompt ? g->eval.ids[i].n : max_prompt;
  if (ct_grpo_agent_env(g->agent) && cfg->max_prompt_length > max_prompt)  // (an episode's prompt: the row's
    max_prompt = (int)cfg->max_prompt_length;                              // messages and an observation)
  s.T = max_prompt + (int)cfg->max_completion_length;
  s.max_prompt = max_prompt;
  s.kv16 = ct_policy_engine_pack(tr) == CT_PACK_BF16;
  s.eo = engine_opts(&s, (int)cfg->decode_slots);  // (decode_slots 0: plan() picks them)
  s.hrows = ct_head_chunk_rows(B * s.T, tr->model.cfg.vocab_size, CT_HEAD_MIN_ROWS_GRPO);
  return s;
}

// decode_slots 0: one slot per completion of the rank's generation batch, so that a step's
// rollouts decode together; fewer when the memory plan cannot hold that many KV caches beside
// `rest` (its other rows, the policy's, and the packed weights): then the most it holds, at
// least 16 (the plan refuses those as it would have). Says which, and why.
static int pick_slots(ct_grpo *g, const shape_t *s, const ct_plan *rest) {
  ct_train *tr = g->tr;
  const ct_model_config *mc = &tr->model.cfg;
  int want = s->per_rank_prompts * g->G, floor = want < 16 ? want : 16;
  ct_plan all = *rest;
  if (ct_train_plan_policy(tr, &all)) ct_die(1, NULL);
  double room = ct_plan_room(ct_dist_local_size(), NULL);
  double others = ct_plan_total(&all) + ct_infer_pack_bytes(mc, ct_policy_engine_pack(tr));
  int lo = floor, hi = want;  // the most slots whose engine fits: binary search (bytes grow with slots)
  while (room > 0 && lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    ct_engine_opts eo = engine_opts(s, mid);
    if (others + ct_engine_bytes(mc, &eo) <= room) lo = mid;
    else hi = mid - 1;
  }
  int slots = room > 0 ? lo : want;
  if (slots == want)
    ct_log_info(&tr->log, "decode_slots: %d, the rank's %d prompts x %d completions decoding together", slots,
                s->per_rank_prompts, g->G);
  else
    ct_log_info(&tr->log, "decode_slots: %d of the rank's %d completions: the memory plan holds no more KV caches "
                "beside the rest (decode_slots sets them)", slots, want);
  return slots;
}

// The plan's rows of the frozen models: the reference and the reward models.
static void frozen_rows(const ct_grpo *g, ct_plan *p, int B, int T) {
  const ct_config *cfg = g->cfg;
  if (g->use_ref) ct_train_plan_reference(g->tr, p, B, T);
  if (g->use_ref && g->row_T && cfg->ref_dtype != CT_STORE_INT8)
    ct_plan_addf(p, ct_acts_rows_bytes(&g->tr->model.cfg, g->row_T), "the reference's attention blocks for "
                 "shared prompts (at most)");
  for (int k = 0, kind; k < cfg->reward_funcs.n; k++)
    if (!ct_reward_kind(cfg->reward_funcs.v[k], &kind) && kind == CT_REWARD_MODEL)
      ct_plan_addf(p, ct_rm_bytes(cfg->reward_funcs.v[k], (int)cfg->reward_model_dtype, B, reward_model_tokens(cfg)),
                   "reward model %s (%s)", cfg->reward_funcs.v[k], ct_store_names[cfg->reward_model_dtype]);
}

// The memory plan: the policy's activations and head, the engine, the reference, the reward
// models. Returns true for a dry run.
static bool plan(ct_grpo *g, shape_t *s) {
  const ct_config *cfg = g->cfg;
  ct_train *tr = g->tr;
  const ct_model_config *mc = &tr->model.cfg;
  int B = (int)cfg->per_device_train_batch_size, T = s->T, V = mc->vocab_size, C = mc->hidden_size;
  int tiles = (int)cfg->num_vocab_tiling;
  g->use_ref = cfg->beta > 0;
  ct_plan plan = {0};
  ct_train_plan_acts(tr, &plan, B, 0, T);
  // a group's completions behind one copy of their prompt (an environment's episodes share
  // theirs when their observations are the same)
  int per_row = g->G < B ? g->G : B;
  int row_T = cfg->share_prompts && per_row > 1
                  ? ct_shared_row_tokens(s->max_prompt, (int)cfg->max_completion_length, per_row) : 0;
  g->row_T = row_T > T ? row_T : 0;
  if (g->row_T)
    ct_plan_addf(&plan, ct_acts_rows_bytes(mc, g->row_T), "attention blocks for a prompt's %d completions in one "
                 "row of up to %d tokens (share_prompts)", per_row, g->row_T);
  ct_plan_addf(&plan, ct_head_bytes(B * T, s->hrows, V, C, tiles),
               "LM head: logits of %d of %d x %d tokens at a time / %d chunks", s->hrows, B, T, tiles);
  if (!cfg->decode_slots) {  // (sized against every other row)
    ct_plan rest = plan;
    frozen_rows(g, &rest, B, T);
    s->eo = engine_opts(s, pick_slots(g, s, &rest));
  }
  ct_policy_engine_plan(&plan, mc, &s->eo, ct_policy_engine_pack(tr), "the weights",
                        cfg->use_peft ? tr : NULL);
  frozen_rows(g, &plan, B, T);
  if (ct_model_rope_reserve(&tr->model, T)) ct_die(1, NULL);
  return ct_loop_memory(tr, &plan, "gradient_checkpointing=true, ref_dtype=bfloat16 or int8 (or beta=0: "
                        "no reference), num_vocab_tiling, a smaller per_device_train_batch_size, "
                        "decode_slots or max_completion_length");
}

// What the plan counted: the reward functions (a reward model is loaded here, after the
// plan said it fits), completions.jsonl, the policy's buffers, the reference, the engine.
static void build(ct_grpo *g, const shape_t *s) {
  const ct_config *cfg = g->cfg;
  ct_train *tr = g->tr;
  const ct_model_config *mc = &tr->model.cfg;
  int B = (int)cfg->per_device_train_batch_size, T = s->T;
  int mode = tr->acts_mode;
  init_rewards(g);
  if (ct_completions_open(&g->log, cfg->output_dir, cfg->log_completions, (int)cfg->num_completions_to_print,
                          tr->step, &tr->log))
    ct_die(1, NULL);
  g->step_prompts = malloc(sizeof(int) * s->step_prompts);
  g->ro = calloc((size_t)s->per_rank_prompts * g->G, sizeof *g->ro);
  g->seqs = calloc(B, sizeof *g->seqs);
  if (!g->step_prompts || !g->ro || !g->seqs || ct_acts_init_kept(&g->acts, &tr->model, B, T, mode, tr->acts_kept) ||
      ct_acts_long_rows(&g->acts, &tr->model, g->row_T) || ct_train_attach(tr, &g->acts) ||
      ct_batch_init(&g->batch, B, T) ||
      ct_head_init(&g->head, B * T, s->hrows, mc->vocab_size, mc->hidden_size, (int)cfg->num_vocab_tiling))
    ct_die(1, NULL);
  g->head.inv_temp = cfg->temperature > 0 ? (float)(1.0 / cfg->temperature) : 1.0f;
  if (g->use_ref && (ct_train_reference(tr, &g->ref, cfg->ref_dtype, B, T) || ct_frozen_long_rows(&g->ref, g->row_T)))
    ct_die(1, NULL);
  if (ct_policy_engine_init(&g->pe, tr, ct_policy_engine_pack(tr), &s->eo)) ct_die(1, NULL);
  if (g->row_T)
    ct_log_info(&tr->log, "share_prompts: a prompt's completions train in one row behind one copy of it (rows "
                "of up to %d tokens)", g->row_T);
  if (tr->bf16) ct_log_info(&tr->log, "rollouts: %s", g->pe.pack == CT_PACK_BF16 ? "bfloat16 weights, float32 sums" :
                            "float32 (this build has no AVX512_BF16 kernel)");
  ct_log_info(&tr->log, "training %ld steps; %s loss; beta %g (%s)", tr->total_steps - tr->step,
              cfg->loss_type.v[0], g->use_ref ? cfg->beta : 0.0, g->use_ref ? "reference loaded" : "no reference model");
}

// New rollouts for the next num_iterations steps: this rank's share of the step's prompts,
// G completions each, scored into advantages, and the reference's log-probs of them.
// DAPO's dynamic sampling (verl's filter_groups): batches of prompts are generated and
// scored until this rank holds its per_rank_prompts groups whose rewards are not all equal
// (every rank: they stop together), at most max_num_gen_batches batches; the last batch
// allowed fills what is still missing with its other groups (zero-std ones included), and
// a batch's groups beyond what a rank needs are dropped unused, as verl drops them. The
// kept groups' scores go to ct_grpo_score, which computes the advantages over them.
static void filtered_rollouts(ct_grpo *g, int step_prompts, ct_sample_params sp) {
  const ct_config *cfg = g->cfg;
  ct_train *tr = g->tr;
  int G = g->G, K = g->K, want = (int)(cfg->per_device_train_batch_size * cfg->gradient_accumulation_steps);
  ct_grpo_rollout *tmp = calloc((size_t)want, sizeof *tmp);
  double *R = malloc(sizeof(double) * want * K), *Rtmp = malloc(sizeof(double) * want * K);
  double *r = malloc(sizeof(double) * G);  // a group's weighted sums
  ct_grpo_reward_mean *func = calloc((size_t)K, sizeof *func);
  if (!tmp || !R || !Rtmp || !r || !func) ct_die(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  int kept = 0;
  g->fg = (ct_grpo_filter_stats){0};
  for (int round = 0; round < cfg->max_num_gen_batches; round++) {
    int n = ct_train_next_seqs(tr, g->step_prompts, step_prompts);
    int lo = n * tr->rank / tr->world, hi = n * (tr->rank + 1) / tr->world, m = (hi - lo) * G;
    bool last = round + 1 == cfg->max_num_gen_batches;
    if (ct_grpo_generate(g, &g->prompts, g->step_prompts + lo, hi - lo, G, sp, tmp, true) ||
        ct_grpo_reward_matrix(g, &g->prompts, tmp, m, Rtmp, func))
      ct_die(1, NULL);
    g->fg.batches += 1;
    for (int p = 0; p < m / G; p++) {
      ct_grpo_total_rewards(Rtmp + (long)p * G * K, G, K, g->weights, r);
      bool same = true;
      for (int i = 1; i < G; i++) same &= r[i] == r[0];
      if (same) g->fg.zero_std_groups += 1;
      if (kept < want && (!same || last)) {  // moved into the step's rollouts
        memcpy(g->ro + kept, tmp + (long)p * G, sizeof *tmp * G);
        memset(tmp + (long)p * G, 0, sizeof *tmp * G);
        memcpy(R + (long)kept * K, Rtmp + (long)p * G * K, sizeof(double) * G * K);
        kept += G;
        g->fg.kept_zero_std += same;
      }
    }
    ct_grpo_rollouts_free(tmp, m);
    if (ct_dist_max_int(kept < want) == 0) break;
  }
  g->n_ro = kept;
  if (ct_grpo_score(g, R)) ct_die(1, NULL);
  ct_dist_sum_stats(&g->fg);
  g->fg.batches /= tr->world;  // (every rank ran the same batches)
  ct_free_all(tmp, R, Rtmp, r, func);
}

static void rollouts(ct_grpo *g, int step_prompts) {
  const ct_config *cfg = g->cfg;
  ct_train *tr = g->tr;
  double t0 = ct_now();
  ct_grpo_rollouts_free(g->ro, g->n_ro);
  ct_sample_params sp = {(float)cfg->temperature, (int)cfg->top_k, (float)cfg->top_p, (float)cfg->min_p,
                         (float)cfg->repetition_penalty};
  double ts = t0;
  if (cfg->filter_groups) {
    filtered_rollouts(g, step_prompts, sp);
  } else {
    int n = ct_train_next_seqs(tr, g->step_prompts, step_prompts);
    int lo = n * tr->rank / tr->world, hi = n * (tr->rank + 1) / tr->world;
    g->n_ro = (hi - lo) * g->G;
    if (ct_grpo_generate(g, &g->prompts, g->step_prompts + lo, hi - lo, g->G, sp, g->ro, true)) ct_die(1, NULL);
    ts = ct_now();
    if (ct_grpo_score(g, NULL)) ct_die(1, NULL);
  }
  g->score_s = ct_now() - ts;
  if (g->use_ref && ct_grpo_ref_logps(g)) ct_die(1, NULL);
  g->gen_s = ct_now() - t0;
}

int main(int argc, char **argv) {
  ct_config cfg;
  ct_train tr;
  ct_train_start(&tr, &cfg, CT_TRAINER_GRPO, argc, argv, check_config);
  ct_grpo g = {.cfg = &cfg, .tr = &tr, .G = (int)cfg.num_generations};
  // (checked by check_config, which also checked every reward function)
  ct_grpo_objective_of(&cfg, cfg.beta > 0, &g.obj, &g.agg);
  int rc = ct_grpo_agent_init(&g.agent, &cfg, tr.tok);
  if (rc) ct_die(rc == CT_ECONFIG ? 2 : 1, NULL);
  shape_t s = load_prompts(&g);
  if (plan(&g, &s)) {
    grpo_free(&g);
    ct_train_release(&tr);
    return 0;
  }
  build(&g, &s);
  ct_train_watch_signals(&tr);
  if (ct_loop_eval_on_start(&tr) && ct_grpo_evaluate(&g)) ct_die(1, NULL);
  bool stop = false;
  int iter = 0;  // passes over the current rollouts
  double t_win = ct_now();
  while (tr.step < tr.total_steps && !stop) {
    if (iter == 0) rollouts(&g, s.step_prompts);
    double t1 = ct_now();
    ct_grpo_step_stats st = {0};
    if (ct_grpo_train_pass(&g, iter == 0, &st) || ct_dist_max_f64((double *)&g.mx, 3)) ct_die(1, NULL);
    double norm, lr;
    ct_loop_update(&tr, &st, sizeof st, &norm, &lr);
    if (cfg.sync_ref_model && g.use_ref && tr.step % cfg.ref_model_sync_steps == 0 &&
        ct_train_sync_reference(&tr, &g.ref, cfg.ref_model_mixup_alpha))
      ct_die(1, NULL);
    double train_s = ct_now() - t1;
    tr.num_tokens += st.input_tokens;
    ct_log_progress(&tr.log, tr.step, g.rs.reward / (g.rs.scored > 0 ? g.rs.scored : 1),
                    st.input_tokens / (ct_now() - t_win));
    t_win = ct_now();
    if (ct_train_log_due(&tr) && ct_grpo_log_step(&g, &st, lr, norm, iter == 0, train_s)) ct_die(1, NULL);
    iter = (iter + 1) % (int)cfg.num_iterations;
    tr.mid_batch = iter != 0;  // resuming mid-batch would need these rollouts again
    if (ct_loop_eval_after_step(&tr) && ct_grpo_evaluate(&g)) ct_die(1, NULL);
    if (ct_train_after_step(&tr, &stop)) ct_die(1, NULL);
  }
  if (ct_loop_eval_at_end(&tr, stop) && ct_grpo_evaluate(&g)) ct_die(1, NULL);
  grpo_free(&g);
  return ct_train_finish(&tr, stop);
}
