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

#include "config.h"
#include "data.h"
#include "dist.h"
#include "engine.h"
#include "error.h"
#include "forward.h"
#include "generate.h"
#include "grpo/advantage.h"
#include "grpo/reward.h"
#include "lm.h"
#include "head.h"
#include "matmul.h"
#include "pool.h"
#include "prompts.h"
#include "rng.h"
#include "train.h"
#include "weights.h"

static int fail(int code, const char *what) { ct_dist_die("grpo", code, what); }

static void config_error(const ct_config *c, const char *key, const char *fmt, const char *arg) {
  char msg[512];
  snprintf(msg, sizeof msg, fmt, arg);
  fail(2, (ct_set_error(CT_ECONFIG, "%s: key '%s': %s", ct_config_origin(c, key), key, msg), NULL));
}

// One sampled completion and everything training needs of it.
typedef struct {
  int prompt;           // index into the prompt set
  int *ids, n;          // completion tokens (a stop token, when one ended it, is last)
  float *old, *ref;     // (n) log-probs before the first update (num_iterations > 1) / of
                        // the reference (when used)
  double reward, adv;
  bool truncated;       // ended by length, not by a stop token
  bool masked;          // no loss (mask_truncated_completions)
  char *text;
} rollout_t;

typedef struct {
  const ct_config *cfg;
  ct_train *tr;
  ct_prompt_set prompts;
  int G, agg, K;
  ct_reward *rewards[8];
  double weights[8];
  ct_infer_weights iw;
  ct_engine *engine;
  ct_model ref;
  bool use_ref;
  ct_acts acts;      // the policy, kept for backward
  ct_acts ref_acts;  // the reference, forward only
  ct_head head;
  ct_batch batch;
  rollout_t *ro;        // (local completions)
  int n_ro;             // this rank's completions
  int *step_prompts;
  double gen_s;         // seconds spent generating for the current rollouts
  // metrics of the current rollouts (summed over ranks)
  double m_reward, m_reward_std, m_zero_std, m_len, m_clipped, m_func[8], m_func_n[8];
} grpo_t;

static int agg_kind(const ct_config *c) {
  if (c->loss_type.n != 1) config_error(c, "loss_type", "GRPO takes one loss_type (%s)", "grpo, bnpo, dr_grpo or dapo");
  for (int i = 0; ct_grpo_loss_type_names[i]; i++)
    if (!strcmp(c->loss_type.v[0], ct_grpo_loss_type_names[i])) return i;
  config_error(c, "loss_type", "'%s' is a DPO loss; GRPO takes grpo, bnpo, dr_grpo or dapo", c->loss_type.v[0]);
  return 0;
}

static void init_rewards(grpo_t *g) {
  const ct_config *c = g->cfg;
  g->K = c->reward_funcs.n;
  if (g->K < 1 || g->K > 8) config_error(c, "reward_funcs", "give 1 to 8 reward functions%s", "");
  if (c->reward_weights.n && c->reward_weights.n != g->K)
    config_error(c, "reward_weights", "needs one weight per reward function (%s)", "or none");
  ct_reward_opts o = {.answer_field = c->answer_field, .answer_regex = c->answer_regex,
                      .numeric = c->answer_numeric, .format_regex = c->format_regex,
                      .target_length = (int)c->length_target, .url = c->reward_url,
                      .connect_timeout_s = c->reward_connect_timeout, .timeout_s = c->reward_timeout,
                      .retries = (int)c->reward_retries, .backoff_s = c->reward_backoff,
                      .failure_nan = c->reward_failure == CT_REWARD_FAIL_NAN, .batch = (int)c->reward_batch};
  for (int k = 0; k < g->K; k++) {
    int kind;
    if (ct_reward_kind(c->reward_funcs.v[k], &kind) || ct_reward_init(&g->rewards[k], kind, &o))
      fail(2, (ct_wrap_error(CT_ECONFIG, "%s", ct_config_origin(c, "reward_funcs")), NULL));
    g->weights[k] = c->reward_weights.n ? c->reward_weights.v[k] : 1.0;
  }
}

// ---------------------------------------------------------------------------
// Rollouts

static int on_done(void *ctx, const ct_gen_result *r) {
  grpo_t *g = ctx;
  rollout_t *ro = &g->ro[r->request * g->G + r->sample];
  ro->n = r->n;
  size_t n = r->n ? r->n : 1;
  ro->ids = malloc(sizeof(int) * n);
  ro->text = malloc(r->text_len + 1);
  ro->old = g->cfg->num_iterations > 1 ? malloc(sizeof(float) * n) : NULL;
  ro->ref = g->use_ref ? malloc(sizeof(float) * n) : NULL;
  if (!ro->ids || !ro->text || (g->cfg->num_iterations > 1 && !ro->old) || (g->use_ref && !ro->ref))
    return ct_set_error(CT_ENOMEM, "grpo: out of memory");
  memcpy(ro->ids, r->ids, sizeof(int) * r->n);
  memcpy(ro->text, r->text, r->text_len);
  ro->text[r->text_len] = 0;
  ro->truncated = r->finish == CT_FINISH_LENGTH;
  return 0;
}

static void free_rollouts(grpo_t *g) {
  for (int i = 0; i < g->n_ro; i++) {
    free(g->ro[i].ids);
    free(g->ro[i].old);
    free(g->ro[i].ref);
    free(g->ro[i].text);
    memset(&g->ro[i], 0, sizeof g->ro[i]);
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
    int k = ct_lm_forward(&g->ref, &g->ref_acts, &g->head, &g->batch), j;
    if (k < 0) fail(1, NULL);
    for (int q = 0; q < k; q++) {
      rollout_t *r = gathered(g, first, q, &j);
      r->ref[j] = g->head.logp[q];
    }
  }
}

// Samples G completions of each of this rank's prompts, scores them, and computes the
// advantages (and, when needed, old and reference log-probs).
static void rollouts(grpo_t *g, const int *prompts, int n_prompts) {
  const ct_config *c = g->cfg;
  ct_train *tr = g->tr;
  double t0 = ct_now();
  free_rollouts(g);
  g->n_ro = n_prompts * g->G;
  ct_gen_request *req = calloc(n_prompts, sizeof *req);
  const int *stop_ids;
  int n_stop = ct_tokenizer_stop_ids(tr->tok, &stop_ids);
  ct_sample_params sp = {(float)c->temperature, (int)c->top_k, (float)c->top_p, (float)c->min_p,
                         (float)c->repetition_penalty};
  for (int i = 0; i < n_prompts; i++) {
    const ct_ids *p = &g->prompts.ids[prompts[i]];
    uint64_t seed = (uint64_t)c->seed * 1000003u + (uint64_t)tr->step * 7919u + (uint64_t)prompts[i];
    req[i] = (ct_gen_request){.prompt = p->v, .prompt_len = p->n, .n = g->G, .seed = seed, .sp = sp,
                              .max_new_tokens = (int)c->max_completion_length,
                              .stop_ids = stop_ids, .n_stop_ids = n_stop};
    for (int k = 0; k < g->G; k++) g->ro[i * g->G + k].prompt = prompts[i];
  }
  ct_gen_callbacks cb = {on_done, NULL, g};
  if (ct_generate(g->engine, tr->tok, req, n_prompts, &cb)) fail(1, "generating rollouts");
  free(req);
  // rewards: one column per function, NaN where a function could not score
  int n = g->n_ro, K = g->K;
  double *R = malloc(sizeof(double) * n * K), *r = malloc(sizeof(double) * n), *adv = malloc(sizeof(double) * n);
  ct_reward_item *items = malloc(sizeof *items * n);
  double *col = malloc(sizeof(double) * n);
  for (int i = 0; i < n; i++)
    items[i] = (ct_reward_item){g->prompts.text[g->ro[i].prompt], g->ro[i].text, g->prompts.rows[g->ro[i].prompt]};
  double stats[4 + 16] = {0};  // reward sum, reward² sum, count, clipped; per func: sum, count
  for (int k = 0; k < K; k++) {
    if (ct_reward_score(g->rewards[k], items, n, col)) fail(1, "scoring rollouts");
    for (int i = 0; i < n; i++) {
      R[(long)i * K + k] = col[i];
      if (col[i] == col[i]) stats[4 + 2 * k] += col[i], stats[5 + 2 * k] += 1;
    }
  }
  ct_grpo_total_rewards(R, n, K, g->weights, r);
  double len = 0;
  for (int i = 0; i < n; i++) {
    stats[0] += r[i];
    stats[1] += r[i] * r[i];
    stats[2] += 1;
    stats[3] += g->ro[i].truncated;
    len += g->ro[i].n;
  }
  ct_dist_sum_f64(stats, 4 + 2 * K);
  double mean = stats[0] / stats[2], var = (stats[1] - stats[2] * mean * mean) / (stats[2] > 1 ? stats[2] - 1 : 1);
  int zero = ct_grpo_advantages(r, n_prompts, g->G, c->scale_rewards, sqrt(var > 0 ? var : 0), adv);
  double gstd = 0;  // mean of the groups' reward std
  for (int p = 0; p < n_prompts; p++) {
    double m;
    gstd += ct_grpo_group_std(r + (long)p * g->G, g->G, &m);
  }
  double more[4] = {gstd, zero, len, n_prompts};
  ct_dist_sum_f64(more, 4);
  for (int i = 0; i < n; i++) {
    g->ro[i].reward = r[i];
    g->ro[i].adv = adv[i];
    g->ro[i].masked = c->mask_truncated_completions && g->ro[i].truncated;
  }
  g->m_reward = mean;
  g->m_reward_std = more[0] / more[3];
  g->m_zero_std = more[1] / more[3];
  g->m_len = more[2] / stats[2];
  g->m_clipped = stats[3] / stats[2];
  for (int k = 0; k < K; k++) g->m_func[k] = stats[4 + 2 * k], g->m_func_n[k] = stats[5 + 2 * k];
  free(R); free(r); free(adv); free(items); free(col);
  if (g->use_ref) ref_logps(g);
  g->gen_s = ct_now() - t0;
}

// ---------------------------------------------------------------------------
// One optimizer step's gradient over the rollouts

typedef struct {
  double loss, kl, clip_lo, clip_hi, entropy, tokens, input_tokens;
} step_stats;
#define STEP_STATS_N 7

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
  ct_dist_sum_f64((double *)&counts, 3);
  for (int first = 0; first < g->n_ro; first += B) {
    int n = g->n_ro - first < B ? g->n_ro - first : B;
    double micro_tokens = 0;
    for (int i = 0; i < n; i++)
      if (!g->ro[first + i].masked) micro_tokens += g->ro[first + i].n;
    rollout_batch(g, first, n);
    const ct_batch *b = &g->batch;
    ct_acts *a = &g->acts;
    ct_head *h = &g->head;
    int k = ct_lm_forward(&tr->model, a, h, b);
    if (k < 0) fail(1, NULL);
    for (int q = 0; q < k; q++) {
      int j;
      rollout_t *r = gathered(g, first, q, &j);
      h->coef[q] = h->zcoef[q] = 0;
      // old log-probs: the policy's before this rollout's first update. The first pass
      // computes them (ratio exactly 1) and keeps them when later passes reuse the rollouts.
      double lp = h->logp[q], old = first_pass ? lp : r->old[j], d;
      if (first_pass && r->old) r->old[j] = h->logp[q];
      if (r->masked) continue;
      double w = ct_grpo_token_weight(g->agg, &counts, r->n, micro_tokens, (int)c->max_completion_length);
      ct_grpo_token_info info;
      double l = ct_grpo_token_loss(&clip, lp, old, g->use_ref ? r->ref[j] : 0, r->adv, &d, &info);
      h->coef[q] = (float)(-w * d);  // coef = −dL/dlp
      st->loss += w * l;
      st->kl += info.kl;
      st->clip_lo += info.clipped_low;
      st->clip_hi += info.clipped_high;
      st->entropy += h->entropy[q];
      st->tokens += 1;
    }
    st->input_tokens += b->n_tokens;
    ct_head_backward(h, tr->model.w.lm_head, tr->g.lm_head, a->dln, b->B * b->T);
    ct_backward(&tr->model, &tr->g, a, a->dln, b->B, b->T);
  }
}

int main(int argc, char **argv) {
  ct_blas_init(argc, argv);
  if (ct_dist_init(&argc, &argv)) fail(1, NULL);
  ct_config cfg;
  if (ct_config_from_args(&cfg, CT_TRAINER_GRPO, argc, argv)) fail(2, NULL);
  if (!cfg.dataset_path[0])
    fail(2, (ct_set_error(CT_ECONFIG, "%s: key 'dataset_path' is required: name a JSONL file of prompts",
                          ct_config_origin(&cfg, "dataset_path")), NULL));
  grpo_t g = {.cfg = &cfg, .G = (int)cfg.num_generations, .agg = agg_kind(&cfg)};
  init_rewards(&g);  // bad names, regexes, URLs: before any work
  int B = (int)cfg.per_device_train_batch_size, accum = (int)cfg.gradient_accumulation_steps;
  if ((B * accum) % g.G)
    fail(2, (ct_set_error(CT_ECONFIG, "%s: key 'num_generations': %d does not divide the %d completions "
                          "a rank trains on per step (per_device_train_batch_size x gradient_accumulation_steps)",
                          ct_config_origin(&cfg, "num_generations"), g.G, B * accum), NULL));
  if (cfg.max_completion_length < 1)
    fail(2, (ct_set_error(CT_ECONFIG, "%s: key 'max_completion_length' must be at least 1 for GRPO",
                          ct_config_origin(&cfg, "max_completion_length")), NULL));
  ct_train tr;
  int rc = ct_train_setup(&tr, &cfg);
  if (rc) fail(rc == CT_ECONFIG ? 2 : 1, NULL);
  g.tr = &tr;
  ct_prompt_opts po = {true, (int)cfg.max_prompt_length, cfg.truncate_prompt == CT_TRUNCATE_LEFT,
                       "max_prompt_length"};
  if (ct_prompt_set_load(&g.prompts, cfg.dataset_path, tr.tok, &po)) fail(1, NULL);
  int per_rank_prompts = B * accum / g.G, step_prompts = per_rank_prompts * tr.world;
  ct_log_info(&tr.log, "prompts: %s: %d rows; %d prompts x %d completions per generation", cfg.dataset_path,
              g.prompts.n, step_prompts, g.G);
  if (ct_train_plan(&tr, g.prompts.n, step_prompts)) fail(1, NULL);
  if (cfg.max_steps <= 0) tr.total_steps *= cfg.num_iterations;  // epochs count generations
  int max_prompt = 1;
  for (int i = 0; i < g.prompts.n; i++) max_prompt = g.prompts.ids[i].n > max_prompt ? g.prompts.ids[i].n : max_prompt;
  int T = max_prompt + (int)cfg.max_completion_length;
  const ct_model_config *mc = &tr.model.cfg;
  g.use_ref = cfg.beta > 0;
  g.step_prompts = malloc(sizeof(int) * step_prompts);
  g.ro = calloc((size_t)per_rank_prompts * g.G, sizeof *g.ro);
  if (!g.step_prompts || !g.ro || ct_model_rope_reserve(&tr.model, T) || ct_acts_init(&g.acts, &tr.model, B, T, true) ||
      ct_batch_init(&g.batch, B, T) ||
      ct_head_init(&g.head, B * T, mc->vocab_size, mc->hidden_size, (int)cfg.num_vocab_tiling))
    fail(1, NULL);
  g.head.inv_temp = cfg.temperature > 0 ? (float)(1.0 / cfg.temperature) : 1.0f;
  if (g.use_ref && (ct_train_reference(&tr, &g.ref) || ct_model_rope_reserve(&g.ref, T) ||
                    ct_acts_init(&g.ref_acts, &g.ref, B, T, false)))
    fail(1, NULL);
  ct_engine_opts eo = {(int)cfg.decode_slots, T, max_prompt > (int)cfg.decode_slots ? max_prompt : (int)cfg.decode_slots};
  if (ct_infer_from_model(&g.iw, &tr.model) || ct_engine_init(&g.engine, &g.iw, &eo)) fail(1, NULL);
  ct_log_info(&tr.log, "training %ld steps; %s loss; beta %g (%s)", tr.total_steps - tr.step,
              cfg.loss_type.v[0], g.use_ref ? cfg.beta : 0.0, g.use_ref ? "reference loaded" : "no reference model");
  ct_train_watch_signals();
  bool stop = false;
  int iter = 0;
  double t_win = ct_now();
  while (tr.step < tr.total_steps && !stop) {
    if (iter == 0) {  // new rollouts
      int n = ct_train_next_seqs(&tr, g.step_prompts, step_prompts);
      int lo = n * tr.rank / tr.world, hi = n * (tr.rank + 1) / tr.world;
      rollouts(&g, g.step_prompts + lo, hi - lo);
    }
    double t1 = ct_now();
    step_stats st = {0};
    train_pass(&g, iter == 0, &st);
    ct_dist_sum_f64((double *)&st, STEP_STATS_N);
    double norm, lr;
    if (ct_train_update(&tr, &norm, &lr)) fail(1, NULL);
    if (cfg.sync_ref_model && g.use_ref && tr.step % cfg.ref_model_sync_steps == 0 &&
        ct_train_sync_reference(&tr, &g.ref, cfg.ref_model_mixup_alpha))
      fail(1, NULL);
    double train_s = ct_now() - t1, tok = st.tokens > 0 ? st.tokens : 1;
    tr.num_tokens += st.input_tokens;
    ct_log_progress(&tr.log, tr.step, g.m_reward, st.input_tokens / (ct_now() - t_win));
    t_win = ct_now();
    if (tr.step % cfg.logging_steps == 0 || tr.step == tr.total_steps) {
      json_t *j = json_pack("{s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}",
                            "step", (json_int_t)tr.step, "loss", st.loss, "reward", g.m_reward,
                            "reward_std", g.m_reward_std, "frac_reward_zero_std", g.m_zero_std,
                            "kl", st.kl / tok, "clip_ratio/low_mean", st.clip_lo / tok,
                            "clip_ratio/high_mean", st.clip_hi / tok, "completions/mean_length", g.m_len,
                            "completions/clipped_ratio", g.m_clipped, "entropy", st.entropy / tok,
                            "learning_rate", lr, "grad_norm", norm, "num_tokens", tr.num_tokens,
                            "time/generation_s", iter == 0 ? g.gen_s : 0.0, "time/training_s", train_s);
      char key[96];
      for (int k = 0; k < g.K; k++) {
        snprintf(key, sizeof key, "rewards/%s/mean", ct_reward_name(g.rewards[k]));
        json_object_set_new(j, key, json_real(g.m_func_n[k] > 0 ? g.m_func[k] / g.m_func_n[k] : NAN));
      }
      if (ct_log_metrics(&tr.log, j)) fail(1, NULL);
    }
    iter = (iter + 1) % (int)cfg.num_iterations;
    if (ct_train_after_step(&tr, &stop)) fail(1, NULL);
  }
  if (stop) {
    ct_dist_finalize();
    return 130;
  }
  if (ct_train_save_final(&tr)) fail(1, "saving the model");
  ct_train_log_done(&tr);
  free_rollouts(&g);
  free(g.ro);
  free(g.step_prompts);
  ct_engine_free(g.engine);
  ct_infer_free(&g.iw);
  if (g.use_ref) ct_model_free(&g.ref);
  for (int k = 0; k < g.K; k++) ct_reward_free(g.rewards[k]);
  ct_acts_free(&g.acts);
  ct_acts_free(&g.ref_acts);
  ct_head_free(&g.head);
  ct_batch_free(&g.batch);
  ct_prompt_set_free(&g.prompts);
  ct_train_free(&tr);
  ct_config_free(&cfg);
  ct_pool_free();
  ct_dist_finalize();
  return 0;
}
