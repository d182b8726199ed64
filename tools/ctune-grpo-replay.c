// ctune-grpo-replay: recomputes a GRPO run's optimizer steps from its completions.jsonl,
// outside the trainer's rollout path (no sampling, no reward, no advantage computation):
//
//   bin/ctune-grpo-replay configs/grpo.yml RUN-KEYS... dataset_path=RUN/completions.jsonl output_dir=DIR
//
// RUN-KEYS are the run's own keys (model_path = its starting weights, max_steps, the
// learning rate and schedule, loss_type, epsilon, beta, per_device_train_batch_size,
// temperature, ...). For each step s = 1..max_steps it takes the logged rows of step s in
// their order: the prompt tokenized as GRPO tokenizes a dataset row (ct_prompt_tokens), the
// completion_ids, the advantage, and finish_reason (for mask_truncated_completions). Then,
// per_device_train_batch_size rows per micro-batch, the library's forward gives each
// completion token's log-prob; the token loss is ct_grpo_token_loss with old = that
// log-prob (the first pass over fresh rollouts: ratio 1, as in the trainer), weighted per
// loss_type by ct_grpo_token_weight, plus beta x k3 KL to the reference when beta > 0; its
// gradient goes back through the model and one AdamW step (ct_train_update) follows.
// Writes DIR/metrics.jsonl (step, loss, grad_norm, learning_rate, and
// replay/max_logprob_diff: the largest |recomputed − logged sampling log-prob| of the
// step) and the final model in DIR, to compare with the run's.
// A row with "tool_mask" (a completion with tool results) has its loss on the model's
// tokens only, as bin/grpo's; a prompt is rendered with the row's logged "tools" and
// "chat_template_kwargs".
// Limits: num_iterations 1 (later passes need the first pass's log-probs), one rank.
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "data.h"
#include "error.h"
#include "forward.h"
#include "objective.h"
#include "advantage.h"
#include "jsonl.h"
#include "lm.h"
#include "mem.h"
#include "prompts.h"
#include "train.h"
#include "die.h"
#include "loop.h"
#include "run.h"

// One logged completion.
typedef struct {
  long step;
  ct_ids prompt, ids;  // prompt tokens; completion tokens
  float *lp;           // (n_own) the logged sampling log-probs of the model's tokens
  unsigned char *keep; // (ids.n) tool_mask, or NULL: every token the model's
  int *ord;            // (ids.n) with keep: token j's index among the model's tokens
  int n_own;
  double adv;
  bool truncated;      // finish_reason "length"
} row_t;

typedef struct {
  const ct_tokenizer *tok;
  const char *path;
  ct_prompt_opts po;
  long max_step;
  row_t *rows;
  int n, cap;
  int model_vocab;     // the model's vocab_size: completion ids are below it
} reader_t;

// The logged prompt as a row ct_prompt_tokens reads: a string or message list stays
// "prompt"; a list of ids (a pre-tokenized row) becomes "prompt_input_ids".
static json_t *prompt_row(const json_t *j) {
  json_t *prompt = json_object_get(j, "prompt");
  bool ids = json_is_array(prompt) && json_array_size(prompt) > 0 && json_is_integer(json_array_get(prompt, 0));
  json_t *row = json_pack("{s:O}", ids ? "prompt_input_ids" : "prompt", prompt);
  static const char *const keys[] = {"tools", "chat_template_kwargs"};
  for (int k = 0; row && k < 2; k++)
    if (json_object_get(j, keys[k])) json_object_set(row, keys[k], json_object_get(j, keys[k]));
  return row;
}

// The row's "tool_mask" (0/1 per completion id) into o->keep and o->ord; none: all the model's.
static int read_mask(const json_t *m, row_t *o, const char *path, int line) {
  o->n_own = o->ids.n;
  if (!m) return 0;
  if (!json_is_array(m) || (int)json_array_size(m) != o->ids.n)
    return ct_row_error(path, line, "key 'tool_mask': expected a list of 0 and 1, one per completion id");
  o->keep = malloc(o->ids.n + 1);
  o->ord = malloc(sizeof(int) * (o->ids.n + 1));
  if (!o->keep || !o->ord) return ct_set_error(CT_ENOMEM, "out of memory");
  o->n_own = 0;
  for (int i = 0; i < o->ids.n; i++) {
    json_int_t v = json_integer_value(json_array_get(m, i));
    if (!json_is_integer(json_array_get(m, i)) || (v != 0 && v != 1))
      return ct_row_error(path, line, "key 'tool_mask'[%d]: expected 0 or 1", i);
    o->keep[i] = (unsigned char)v;
    o->ord[i] = o->n_own;
    o->n_own += (int)v;
  }
  return 0;
}

static int read_row(void *ctx, json_t *j, int line) {
  reader_t *r = ctx;
  json_t *st = json_object_get(j, "step"), *adv = json_object_get(j, "advantage"), *ids = json_object_get(j, "completion_ids");
  json_t *lp = json_object_get(j, "logprobs"), *fin = json_object_get(j, "finish_reason");
  if (!json_is_integer(st) || !json_is_number(adv) || !json_is_array(lp) || !json_is_string(fin) ||
      !json_object_get(j, "prompt"))
    return ct_row_error(r->path, line, "not a completions.jsonl row of GRPO (step, prompt, completion_ids, "
                        "logprobs, finish_reason, advantage)");
  if (json_integer_value(st) < 1 || json_integer_value(st) > r->max_step) return 0;
  if (r->n == r->cap) {
    r->cap = r->cap ? 2 * r->cap : 64;
    row_t *t = realloc(r->rows, sizeof *t * r->cap);
    if (!t) return ct_set_error(CT_ENOMEM, "out of memory");
    r->rows = t;
  }
  row_t *o = &r->rows[r->n];
  memset(o, 0, sizeof *o);
  o->step = json_integer_value(st);
  o->adv = json_number_value(adv);
  o->truncated = !strcmp(json_string_value(fin), "length");
  char where[4200];
  snprintf(where, sizeof where, "%s:%d", r->path, line);
  json_t *p = prompt_row(j);
  int rc = p ? ct_prompt_tokens(r->tok, p, where, &r->po, &o->prompt) : ct_set_error(CT_ENOMEM, "out of memory");
  json_decref(p);
  // the policy sampled these over its whole vocab_size: ids past the tokenizer's (a padded
  // embedding's rows, which an untrained model does sample) are the run's own tokens
  if (!rc && ct_jsonl_ids(ids, INT_MAX, r->model_vocab, "completion_ids", &o->ids))
    rc = ct_row_error(r->path, line, "%s", ct_last_error());
  for (int i = 0; !rc && i < o->ids.n; i++)
    if (o->ids.v[i] >= r->model_vocab)
      rc = ct_row_error(r->path, line, "key 'completion_ids'[%d]: token id %d is not below the model's "
                        "vocab_size %d (the ids its sampler draws)", i, o->ids.v[i], r->model_vocab);
  if (!rc && (int)json_array_size(lp) != o->ids.n)
    rc = ct_row_error(r->path, line, "key 'logprobs': %zu values for %d completion_ids", json_array_size(lp), o->ids.n);
  if (!rc) rc = read_mask(json_object_get(j, "tool_mask"), o, r->path, line);
  if (!rc && !(o->lp = malloc(sizeof(float) * (o->ids.n ? o->ids.n : 1)))) rc = ct_set_error(CT_ENOMEM, "out of memory");
  for (int i = 0, k = 0; !rc && i < o->ids.n; i++)
    if (!o->keep || o->keep[i]) o->lp[k++] = (float)json_number_value(json_array_get(lp, i));
  r->n += !rc;
  if (rc) ct_ids_free(&o->prompt), ct_ids_free(&o->ids), ct_free_all(o->lp, o->keep, o->ord);
  return rc;
}

typedef struct {
  ct_train *tr;
  const ct_config *cfg;
  int agg;
  ct_grpo_objective obj;
  ct_acts acts;
  ct_head head;
  ct_batch batch;
  ct_frozen ref;
  bool use_ref;
  ct_prompt_completion *seqs;  // (per_device_train_batch_size)
  int row_T;                   // the longest row of a shared prompt (0: not shared)
  float *ref_lp;  // (B·T) the reference's log-probs of the current micro-batch's targets
} replay_t;

typedef struct {
  double loss, max_diff;
  ct_grpo_span_info info;
} step_out;

// Rows [first, first + n) into the batch: prompt + completion, targets on the completion;
// shared prompts as bin/grpo shares them (share: the reference's batch has none).
static void fill_batch(replay_t *r, const row_t *rows, int n, bool share) {
  for (int i = 0; i < n; i++)
    r->seqs[i] = (ct_prompt_completion){rows[i].prompt.v, rows[i].ids.v, rows[i].prompt.n, rows[i].ids.n, rows[i].keep};
  int per_row = (int)r->cfg->num_generations;  // (as bin/grpo)
  ct_batch_completions(&r->batch, r->seqs, n, ct_tokenizer_pad(r->tr->tok), share && r->row_T > 0 ? per_row : 1,
                       r->row_T);
}

// One micro-batch's per-token loss for the head's rows a chunk at a time, as bin/grpo's.
typedef struct {
  ct_grpo_micro m;
  const row_t *rows;  // the micro-batch's
  const replay_t *r;
  step_out *out;
} token_loss;

// The rows' completion (index into t->rows) and the index among its model tokens of the
// token row q predicts.
static int row_of(const token_loss *t, const ct_head *h, int q, int *j) {
  int i = t->r->batch.tok_seq[h->rows[q]];
  *j = t->r->batch.tok_j[h->rows[q]];
  if (t->rows[i].ord) *j = t->rows[i].ord[*j];
  return i;
}

// As bin/grpo's: spans of one completion at a time, old = this forward's log-probs (num_iterations 1).
static void token_loss_rows(void *ctx, ct_head *h, int r0, int r1) {
  token_loss *t = ctx;
  const replay_t *r = t->r;
  bool mask = r->cfg->mask_truncated_completions;
  for (int q = r0; q < r1;) {
    int j, j2, i = row_of(t, h, q, &j), q1 = q + 1;
    while (q1 < r1 && row_of(t, h, q1, &j2) == i) q1++;
    const row_t *o = &t->rows[i];
    const float *lp = h->logp + q;
    for (int k = 0; k < q1 - q; k++) t->out->max_diff = fmax(t->out->max_diff, fabs(lp[k] - o->lp[j + k]));
    memset(h->zcoef + q, 0, sizeof(float) * (q1 - q));
    if (mask && o->truncated) memset(h->coef + q, 0, sizeof(float) * (q1 - q));
    else t->out->loss += ct_grpo_span_loss(&t->m, o->n_own, q1 - q, lp, lp, h->entropy + q, r->use_ref ? r->ref_lp + q : NULL,
                                           o->lp + j, o->adv, h->coef + q, &t->out->info, NULL);
    q = q1;
  }
}

// One optimizer step's gradient over the n rows of a step; returns its loss.
static int replay_step(replay_t *r, const row_t *rows, int n, step_out *out) {
  const ct_config *c = r->cfg;
  int B = (int)c->per_device_train_batch_size;
  bool mask = c->mask_truncated_completions;
  ct_grpo_counts counts = {0};
  for (int i = 0; i < n; i++)
    counts.tokens += mask && rows[i].truncated ? 0 : rows[i].n_own, counts.sequences += 1;
  counts.micro_batches = (n + B - 1) / B;
  for (int first = 0; first < n; first += B) {
    int m = n - first < B ? n - first : B;
    double micro_tokens = 0;
    for (int i = 0; i < m; i++) micro_tokens += mask && rows[first + i].truncated ? 0 : rows[first + i].n_own;
    ct_head *h = &r->head;
    if (r->use_ref) {
      fill_batch(r, rows + first, m, r->ref.dtype != CT_STORE_INT8);  // (as bin/grpo)
      ct_frozen_through(&r->ref, &r->acts);
      int k = ct_frozen_logps(&r->ref, &r->batch, h);
      if (k < 0) return k;
      memcpy(r->ref_lp, h->logp, sizeof(float) * k);  // (the same targets in the same order, shared or not)
    }
    fill_batch(r, rows + first, m, true);
    token_loss t = {{r->obj, r->agg, &counts, micro_tokens, (int)c->max_completion_length, 0}, rows + first, r, out};
    const ct_model *md = &r->tr->model;
    int k;
    if (!ct_grpo_needs_whole(&r->obj)) {
      if ((k = ct_lm_fused(md, &r->tr->g, &r->acts, h, &r->batch, token_loss_rows, &t)) >= 0)
        ct_backward(md, &r->tr->g, &r->acts, r->acts.dln, r->batch.B, r->batch.T);
    } else if ((k = ct_lm_forward(md, &r->acts, h, &r->batch)) >= 0) {
      if (r->obj.top_entropy < 1) {  // the entropy quantile of the completions not masked
        float *ent = malloc(sizeof(float) * (k > 0 ? k : 1));
        long e = 0;
        int j;
        if (!ent) return ct_set_error(CT_ENOMEM, "out of memory");
        for (int q = 0; q < k; q++)
          if (!(mask && rows[first + row_of(&t, h, q, &j)].truncated)) ent[e++] = h->entropy[q];
        int rc = ct_grpo_entropy_threshold(&r->obj, ent, e, &t.m.entropy_threshold);
        free(ent);
        if (rc) return rc;
      }
      token_loss_rows(&t, h, 0, k);
      ct_lm_backward(md, &r->tr->g, &r->acts, h, &r->batch);
    }
    if (k < 0) return k;
  }
  return 0;
}

static int agg_kind(const ct_config *c, int *kind) {
  ct_grpo_objective o;
  return ct_grpo_objective_of(c, false, &o, kind);
}

static int check_config(const ct_config *c) {
  int kind;
  if (c->num_iterations != 1)
    return ct_set_error(CT_ECONFIG, "%s: key 'num_iterations': the replay recomputes runs with num_iterations 1",
                        ct_config_origin(c, "num_iterations"));
  if (c->max_steps < 1)
    return ct_set_error(CT_ECONFIG, "%s: key 'max_steps': give the run's max_steps (the steps to replay)",
                        ct_config_origin(c, "max_steps"));
  return agg_kind(c, &kind);
}

static int usage(FILE *f) {
  fputs("usage: ctune-grpo-replay configs/grpo.yml RUN-KEYS... dataset_path=RUN/completions.jsonl output_dir=DIR\n"
        "Recomputes a GRPO run's optimizer steps from the completions.jsonl it logged (log_completions=true),\n"
        "without sampling or rewards, and writes DIR/metrics.jsonl and the final model to compare with the run's.\n"
        "RUN-KEYS are the run's own keys (model_path = its starting weights, max_steps, learning rate, loss_type,\n"
        "epsilon, beta, per_device_train_batch_size, temperature, ...): `bin/grpo --help` lists them.\n"
        "Limits: num_iterations 1, one rank.\n", f);
  return f == stdout ? 0 : 2;
}

int main(int argc, char **argv) {
  if (ct_config_help_asked(argc, argv)) return usage(stdout);
  if (argc < 2) return usage(stderr);
  ct_config cfg;
  ct_train tr;
  ct_train_start(&tr, &cfg, CT_TRAINER_GRPO, argc, argv, check_config);
  tr.name = "ctune-grpo-replay";
  ct_die_name(tr.name);  // (its own errors: ct_die)
  if (tr.world != 1) ct_die(1, (ct_set_error(CT_EINVAL, "replay runs on one rank"), NULL));
  replay_t r = {.tr = &tr, .cfg = &cfg, .use_ref = cfg.beta > 0};
  ct_grpo_objective_of(&cfg, r.use_ref, &r.obj, &r.agg);
  reader_t rd = {tr.tok, cfg.dataset_path, {true, (int)cfg.max_prompt_length, cfg.truncate_prompt == CT_TRUNCATE_LEFT,
                 "max_prompt_length", tr.model.cfg.vocab_size, false, NULL, false}, cfg.max_steps, NULL, 0, 0, tr.model.cfg.vocab_size};
  ct_jsonl_stats js;
  if (ct_jsonl_read(cfg.dataset_path, false, read_row, &rd, &js)) ct_die(1, NULL);
  int per_step = 0, T = 1, max_prompt = 1, max_comp = 0;
  for (int i = 0; i < rd.n; i++) {
    per_step += rd.rows[i].step == 1;
    T = rd.rows[i].prompt.n + rd.rows[i].ids.n > T ? rd.rows[i].prompt.n + rd.rows[i].ids.n : T;
    max_prompt = rd.rows[i].prompt.n > max_prompt ? rd.rows[i].prompt.n : max_prompt;
    max_comp = rd.rows[i].ids.n > max_comp ? rd.rows[i].ids.n : max_comp;
  }
  if (per_step == 0 || rd.n != per_step * cfg.max_steps)
    ct_die(1, (ct_set_error(CT_EINVAL, "%s: %d rows for steps 1..%ld, not the same number for every step",
                           cfg.dataset_path, rd.n, (long)cfg.max_steps), NULL));
  if (ct_train_schedule(&tr, rd.n, per_step, 0)) ct_die(1, NULL);  // (never resumes: no fingerprint)
  int B = (int)cfg.per_device_train_batch_size, V = tr.model.cfg.vocab_size, C = tr.model.cfg.hidden_size;
  int mode = cfg.gradient_checkpointing ? CT_ACTS_RECOMPUTE : CT_ACTS_KEEP;
  ct_plan plan = {0};
  ct_plan_addf(&plan, ct_train_acts_bytes(&tr, B, T, mode), "activations, %d x %d tokens", B, T);
  int per_row = (int)cfg.num_generations < B ? (int)cfg.num_generations : B;
  r.row_T = cfg.share_prompts && per_row > 1 ? ct_shared_row_tokens(max_prompt, max_comp, per_row) : 0;
  r.row_T = r.row_T > T ? r.row_T : 0;
  if (r.row_T) ct_plan_addf(&plan, ct_acts_rows_bytes(&tr.model.cfg, r.row_T), "attention blocks for shared prompts");
  if (r.use_ref) ct_train_plan_reference(&tr, &plan, B, T);
  if (ct_model_rope_reserve(&tr.model, T)) ct_die(1, NULL);
  if (ct_loop_memory(&tr, &plan, "a smaller per_device_train_batch_size")) {
    ct_train_release(&tr);
    return 0;
  }
  r.ref_lp = malloc(sizeof(float) * B * T);
  r.seqs = calloc(B, sizeof *r.seqs);
  if (!r.ref_lp || !r.seqs || ct_acts_init(&r.acts, &tr.model, B, T, mode) ||
      ct_acts_long_rows(&r.acts, &tr.model, r.row_T) || ct_train_attach(&tr, &r.acts) ||
      ct_batch_init(&r.batch, B, T) || ct_head_init(&r.head, B * T, ct_head_chunk_rows(B * T, V, CT_HEAD_MIN_ROWS_GRPO), V, C, (int)cfg.num_vocab_tiling))
    ct_die(1, NULL);
  r.head.inv_temp = cfg.temperature > 0 ? (float)(1.0 / cfg.temperature) : 1.0f;
  if (r.use_ref && (ct_train_reference(&tr, &r.ref, cfg.ref_dtype, B, T) || ct_frozen_long_rows(&r.ref, r.row_T)))
    ct_die(1, NULL);
  for (long s = 1; s <= cfg.max_steps; s++) {
    step_out out = {0};
    int first = 0;
    while (rd.rows[first].step != s) first++;  // a step's rows are contiguous as logged
    for (int i = first; i < first + per_step; i++)
      if (rd.rows[i].step != s) ct_die(1, (ct_set_error(CT_EINVAL, "%s: step %ld's rows are not together", cfg.dataset_path, s), NULL));
    if (replay_step(&r, rd.rows + first, per_step, &out)) ct_die(1, NULL);
    double norm, lr;
    if (ct_train_update(&tr, &norm, &lr)) ct_die(1, NULL);
    json_t *j = json_pack("{s:I,s:f,s:f,s:f,s:f}", "step", (json_int_t)tr.step, "loss", out.loss, "grad_norm", norm,
                          "learning_rate", lr, "replay/max_logprob_diff", out.max_diff);
    if (ct_log_metrics(&tr.log, j)) ct_die(1, NULL);
  }
  for (int i = 0; i < rd.n; i++)
    ct_ids_free(&rd.rows[i].prompt), ct_ids_free(&rd.rows[i].ids), ct_free_all(rd.rows[i].lp, rd.rows[i].keep, rd.rows[i].ord);
  free(rd.rows);
  free(r.ref_lp);
  free(r.seqs);
  if (r.use_ref) ct_frozen_free(&r.ref);
  ct_acts_free(&r.acts);
  ct_head_free(&r.head);
  ct_batch_free(&r.batch);
  return ct_train_finish(&tr, false);
}
