// reward: a reward model from preference pairs, as TRL's RewardTrainer.
//
//   bin/reward configs/reward.yml model_path=DIR dataset_path=pairs.jsonl output_dir=out
//   bin/reward score model_path=RM data=rows.jsonl       {"row", "reward"} per row, stdout
//   bin/reward eval model_path=RM eval_dataset_path=pairs.jsonl   held-out pair accuracy
// (score and eval take a LoRA reward model as model_path=BASE adapter_path=ADAPTER, as
// bin/sampler does, or as the adapter directory alone: its base_model_name_or_path.)
//
// The model is a causal LM's backbone with a score head (1, C) (new: normal(0,
// initializer_range)), or a *ForSequenceClassification directory to continue. A
// sequence's reward is the head at its last token, found from the sequence's length, never
// from the pad id (which may be EOS). Each step takes per_device_train_batch_size x
// gradient_accumulation_steps x ranks pairs, a micro-batch of m pairs being 2m rows
// (chosen, then rejected); the loss is the step's mean of reward/loss.h's pair loss.
// Checkpoints, resume, MPI, bf16 and gradient_checkpointing are the train state's.
// use_peft: as PEFT's SEQ_CLS task, LoRA adapters on the backbone's projections
// (lora_target_modules) and the score head trained in full as a modules_to_save copy
// (the train state's adapters: nn/lora.h); output_dir holds adapter_config.json
// (task_type SEQ_CLS) and adapter_model.safetensors (base_model.model.score.weight).
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "die.h"
#include "dist.h"
#include "error.h"
#include "fingerprint.h"
#include "forward.h"
#include "fs.h"
#include "hf.h"
#include "jsonl.h"
#include "lm.h"
#include "loop.h"
#include "matmul.h"
#include "mem.h"
#include "pool.h"
#include "prefs.h"
#include "reward/loss.h"
#include "reward_model.h"
#include "run.h"
#include "score.h"
#include "rng.h"
#include "train.h"
#include "watch.h"
#include "window.h"

static int check_config(const ct_config *c) {
  if (c->num_vocab_tiling != 1)  // (base.yml sets every key: another value is the user's)
    return ct_set_error(CT_ECONFIG, "%s: key 'num_vocab_tiling' tiles the LM head, and a reward model has none "
                        "(its score head is one row); drop the key", ct_config_origin(c, "num_vocab_tiling"));
  for (int i = 0; i < c->lora_modules_to_save.n; i++)
    if (!strcmp(c->lora_modules_to_save.v[i], "lm_head"))
      return ct_set_error(CT_ECONFIG, "%s: key 'lora_modules_to_save': a reward model has no lm_head (with "
                          "use_peft its score head is saved with the adapters already); drop lm_head",
                          ct_config_origin(c, "lora_modules_to_save"));
  if (c->data[0])
    return ct_set_error(CT_ECONFIG, "%s: key 'data' is what `bin/reward score` scores; training reads "
                        "dataset_path", ct_config_origin(c, "data"));
  return 0;
}

// ---------------------------------------------------------------------------
// Pairs through the model

typedef struct {
  ct_rm_sums s;
  double tokens;
} rm_stats;

typedef struct {
  const ct_config *cfg;
  ct_train *tr;
  ct_acts acts;       // training: kept (or recomputed) for backward
  ct_acts eval_acts;  // evaluation: forward only
  ct_batch batch;
  int *pairs;
  int *last;          // (2m) each row's last real token
  double *r, *d;      // (2m) rewards, dL/dr
  ct_rm_range range;  // the logging window's extremes
} rm_t;

// Rewards of a micro-batch of m pairs (rows 0..m-1 chosen, m..2m-1 rejected) into d->r.
static void forward_pairs(rm_t *d, ct_acts *a, const ct_pref_dataset *ds, const int *pairs, int m) {
  ct_batch *b = &d->batch;
  ct_pref_batch(b, ds, pairs, m, ct_tokenizer_pad(d->tr->tok));
  for (int i = 0; i < m; i++) {  // pooled by length: the pad id plays no part
    int k = pairs[i];
    d->last[i] = ds->p_len[k] + ds->c_len[k] - 1;
    d->last[m + i] = ds->p_len[k] + ds->r_len[k] - 1;
  }
  if (ct_forward_batch(&d->tr->model, a, b)) ct_die(1, NULL);
  ct_score_forward(a->lnf, d->last, b->B, b->T, d->tr->model.cfg.hidden_size, d->tr->model.w.score, d->r);
}

// Pair losses of the micro-batch just run; with `train`, backward with each pair weighted
// by inv_pairs (1 / the whole step's pairs).
static void pair_step(rm_t *d, const ct_pref_dataset *ds, const int *pairs, int m, bool train, double inv_pairs,
                      rm_stats *st) {
  const ct_batch *b = &d->batch;
  double center = d->cfg->center_rewards_coefficient;
  for (int i = 0; i < m; i++) {
    double rc = d->r[i], rr = d->r[m + i], dc, dr;
    double L = ct_rm_pair_loss(rc, rr, ds->margin[pairs[i]], center, &dc, &dr);
    ct_rm_add_pair(&st->s, &d->range, rc, rr, L);
    d->d[i] = dc * inv_pairs;
    d->d[m + i] = dr * inv_pairs;
  }
  st->tokens += b->n_tokens;
  if (!train) return;
  ct_model *mo = &d->tr->model;
  int C = mo->cfg.hidden_size;
  memset(d->acts.dln, 0, sizeof(float) * (size_t)b->B * b->T * C);
  ct_score_backward(d->acts.lnf, d->last, b->B, b->T, C, mo->w.score, d->d, d->acts.dln, d->tr->g.score);
  ct_backward(mo, &d->tr->g, &d->acts, d->acts.dln, b->B, b->T);
}

// TRL's metric names (prefix "eval_" on the eval set); the extremes are maxima over ranks.
static json_t *stats_json(const rm_stats *st, ct_rm_range *e, const char *prefix, long step) {
  if (ct_dist_max_f64((double *)e, 2)) ct_die(1, NULL);
  double n = st->s.pairs > 0 ? st->s.pairs : 1;
  const struct {
    const char *key;
    double v;
  } m[] = {{"loss", st->s.loss / n}, {"accuracy", st->s.correct / n}, {"margin", st->s.margin / n},
           {"min_reward", -e->neg_min}, {"mean_reward", st->s.reward / (2 * n)}, {"max_reward", e->max}};
  json_t *j = json_pack("{s:I}", "step", (json_int_t)step);  // first, as the other trainers
  char k[64];
  for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
    snprintf(k, sizeof k, "%s%s", prefix, m[i].key);
    json_object_set_new(j, k, json_real(isfinite(m[i].v) ? m[i].v : 0));
  }
  return j;
}

static void evaluate(rm_t *d, const ct_pref_dataset *ev) {
  ct_train *tr = d->tr;
  int B = (int)d->cfg->per_device_eval_batch_size;
  rm_stats st = {0};
  ct_rm_range keep = d->range;
  d->range = (ct_rm_range){-INFINITY, -INFINITY};
  for (int first = tr->rank * B; first < ev->n; first += B * tr->world) {
    int m = 0;
    for (int k = first; k < ev->n && m < B; k++) d->pairs[m++] = k;
    forward_pairs(d, &d->eval_acts, ev, d->pairs, m);
    pair_step(d, ev, d->pairs, m, false, 0, &st);
  }
  ct_dist_sum_stats(&st);
  json_t *j = stats_json(&st, &d->range, "eval_", tr->step);
  d->range = keep;
  json_object_set_new(j, "eval_num_tokens", json_real(st.tokens));
  double n = st.s.pairs ? st.s.pairs : 1;
  ct_log_info(&tr->log, "eval at step %ld: loss %.4f, accuracy %.3f, margin %.4f (%.0f pairs)", tr->step,
              st.s.loss / n, st.s.correct / n, st.s.margin / n, st.s.pairs);
  if (ct_log_metrics(&tr->log, j)) ct_die(1, NULL);
}

// A new score head on a causal LM's backbone: normal(0, initializer_range of its
// config.json, 0.02 without), seeded (every rank draws the same).
static void init_score(ct_train *tr) {
  const ct_config *c = tr->cfg;
  // a checkpoint's head, an adapter's (adapter_path), or the seeded initialization's
  if (tr->resumed_from[0] || !c->model_path[0] || c->adapter_path[0]) return;
  ct_model_config have;
  if (ct_model_read_config(&have, c->model_path)) ct_die(1, NULL);
  if (have.num_labels) return;  // continuing a reward model
  char p[CT_PATH_MAX];
  double std = 0.02;
  json_t *j = ct_path_join(p, sizeof p, c->model_path, "config.json") ? NULL : json_load_file(p, 0, NULL);
  if (json_is_number(json_object_get(j, "initializer_range"))) std = json_number_value(json_object_get(j, "initializer_range"));
  json_decref(j);
  ct_rng r;
  ct_rng_seed(&r, (uint64_t)c->seed * 0x9e3779b97f4a7c15ULL + 0x5c0e);
  int C = tr->model.cfg.hidden_size;
  for (int i = 0; i < C; i++) tr->model.w.score[i] = (float)(std * ct_rng_normal(&r));
  ct_log_info(&tr->log, "score head: new, [1, %d], normal(0, %g)", C, std);
}

static void describe(ct_train *tr, const char *what, const ct_pref_dataset *ds) {
  ct_log_info(&tr->log, "%s: %s: %d pairs, %ld tokens", what, ds->path, ds->n, ds->n_tokens);
  if (ds->n_dropped)
    ct_log_info(&tr->log, "%s: %d pairs dropped: longer than max_length %d (as TRL)", what, ds->n_dropped,
                (int)tr->cfg->max_length);
  if (ds->n_bad) ct_log_info(&tr->log, "%s: %d malformed rows skipped; first: %s", what, ds->n_bad, ds->first_bad);
}

static void rm_free(rm_t *d) {
  ct_acts_free(&d->acts);
  ct_acts_free(&d->eval_acts);
  ct_batch_free(&d->batch);
  ct_free_all(d->pairs, d->last, d->r, d->d);
}

// The train pairs and the eval pairs (when eval_dataset_path is set), said.
static void load_data(ct_train *tr, ct_pref_dataset *train, ct_pref_dataset *eval) {
  const ct_config *cfg = tr->cfg;
  ct_pref_opts po = {.max_length = (int)cfg->max_length, .skip_bad_rows = cfg->skip_bad_rows,
                     .model_vocab = tr->model.cfg.vocab_size, .reward = true};
  if (ct_pref_load(train, cfg->dataset_path, tr->tok, &po)) ct_die(1, NULL);
  describe(tr, "train", train);
  if (cfg->eval_dataset_path[0]) {
    if (ct_pref_load(eval, cfg->eval_dataset_path, tr->tok, &po)) ct_die(1, NULL);
    describe(tr, "eval", eval);
  }
}

// The score head that trains (with use_peft the adapters' copy) and its first values; the
// buffers: pairs for a whole step (`global`), rows for 2·max(B, Be).
static void rm_init(rm_t *d, int B, int Be, int T, int global) {
  const ct_config *cfg = d->cfg;
  ct_train *tr = d->tr;
  int Bmax = B > Be ? B : Be;
  if (cfg->use_peft) {  // the head that trains is the adapters' copy (its base's, or the adapter's)
    ct_lora_attach(&tr->lora, &tr->model);
    tr->g.score = tr->lora.g_score;
  }
  init_score(tr);
  if (tr->bf16 && !cfg->use_peft)  // (the new head is not a matmul weight, but keep the copy exact)
    ct_model_bf16_refresh(&tr->model);
  d->pairs = malloc(sizeof(int) * (global > Bmax ? global : Bmax));
  d->last = malloc(sizeof(int) * 2 * Bmax);
  d->r = malloc(sizeof(double) * 2 * Bmax);
  d->d = malloc(sizeof(double) * 2 * Bmax);
  if (!d->pairs || !d->last || !d->r || !d->d || ct_batch_init(&d->batch, 2 * Bmax, T) ||
      ct_train_acts(tr, &d->acts, 2 * B, T) ||
      (Be && (ct_acts_init(&d->eval_acts, &tr->model, 2 * Be, T, CT_ACTS_FORWARD) ||
              ct_train_attach(tr, &d->eval_acts))))
    ct_die(1, NULL);
}

// One optimizer step's gradients from its n pairs (d->pairs), this rank's micro-batches of
// B; their statistics summed into st.
static void train_step(rm_t *d, const ct_pref_dataset *ds, int n, int B, rm_stats *st) {
  ct_train *tr = d->tr;
  int accum = (int)d->cfg->gradient_accumulation_steps;
  const int *step_pairs = d->pairs;
  ct_loop_phase(tr, 0, accum, 0);  // (the heartbeat's line)
  for (int k = 0, first, m; k < accum && (m = ct_loop_micro(tr, k, B, n, &first)); k++) {
    ct_train_dropout_key(tr, k);
    forward_pairs(d, &d->acts, ds, step_pairs + first, m);
    pair_step(d, ds, step_pairs + first, m, true, 1.0 / n, st);
    ct_loop_phase(tr, k + 1, accum, st->tokens);
  }
}

static int train_main(int argc, char **argv) {
  ct_config cfg;
  ct_train tr;
  ct_train_start(&tr, &cfg, CT_TRAINER_REWARD, argc, argv, check_config);
  rm_t d = {.cfg = &cfg, .tr = &tr, .range = {-INFINITY, -INFINITY}};
  ct_model_config *mc = &tr.model.cfg;
  if (mc->pad_token_id < 0) mc->pad_token_id = ct_tokenizer_pad(tr.tok);  // transformers pools with it
  ct_pref_dataset train, eval = {0};
  load_data(&tr, &train, &eval);
  int B = (int)cfg.per_device_train_batch_size, accum = (int)cfg.gradient_accumulation_steps;
  int Be = cfg.eval_dataset_path[0] ? (int)cfg.per_device_eval_batch_size : 0;
  int global = B * accum * tr.world, T = ct_pref_max_len(&train);
  if (Be && ct_pref_max_len(&eval) > T) T = ct_pref_max_len(&eval);
  if (ct_train_schedule(&tr, train.n, global, ct_pref_fingerprint(&train))) ct_die(1, NULL);
  ct_plan plan = {0};
  ct_train_plan_acts(&tr, &plan, 2 * B, 2 * Be, T);
  if (ct_loop_memory(&tr, &plan, "gradient_checkpointing=true, a smaller per_device_train_batch_size or max_length")) {
    ct_pref_free(&train);
    ct_pref_free(&eval);
    ct_train_release(&tr);
    return 0;
  }
  rm_init(&d, B, Be, T, global);
  ct_train_log_schedule(&tr, train.n, global, B, accum, "pair");
  ct_train_watch_signals(&tr);
  if (ct_loop_eval_on_start(&tr)) evaluate(&d, &eval);
  rm_stats win;  // the logging window's sums (its extremes: d.range)
  ct_window lw;
  ct_window_init(&lw, &win, sizeof win);
  bool stop = false;
  while (tr.step < tr.total_steps && !stop) {
    int n = ct_train_next_seqs(&tr, d.pairs, global);
    rm_stats st = {0};
    train_step(&d, &train, n, B, &st);
    double norm, lr;
    ct_loop_update(&tr, &st, sizeof st, &norm, &lr);
    tr.num_tokens += st.tokens;
    ct_window_add(&lw, &st, 0, norm);
    double tok_s = ct_window_rate(&lw, win.tokens);
    ct_log_progress(&tr.log, tr.step, st.s.loss / (st.s.pairs ? st.s.pairs : 1), tok_s);
    if (ct_train_log_due(&tr)) {
      json_t *j = stats_json(&win, &d.range, "", tr.step);
      ct_train_log_fields(&tr, j, lr, ct_window_norm(&lw), tok_s);
      if (ct_log_metrics(&tr.log, j)) ct_die(1, NULL);
      ct_window_reset(&lw);
      d.range = (ct_rm_range){-INFINITY, -INFINITY};
    }
    if (ct_loop_eval_after_step(&tr)) evaluate(&d, &eval);
    if (ct_train_after_step(&tr, &stop)) ct_die(1, NULL);
  }
  if (ct_loop_eval_at_end(&tr, stop)) evaluate(&d, &eval);
  rm_free(&d);
  ct_pref_free(&train);
  ct_pref_free(&eval);
  return ct_train_finish(&tr, stop);
}

// ---------------------------------------------------------------------------
// score and eval: a trained reward model, forward only

// The config of a command that trains nothing (no dataset_path, output_dir unused).
static void command_config(ct_config *cfg, int argc, char **argv, const char *cmd) {
  ct_blas_init(argc, argv);
  if (ct_config_from_args(cfg, CT_TRAINER_REWARD, argc, argv)) ct_die(2, NULL);
  if (!cfg->model_path[0]) ct_die(2, (ct_set_error(CT_ECONFIG, "%s: model_path=DIR (a reward model) is required", cmd), NULL));
  if (ct_pool_init(cfg->num_threads > 0 ? (int)cfg->num_threads : 0) ||
      ct_blas_room(ct_pool_threads(), 0, NULL, "lower num_threads"))
    ct_die(1, NULL);
}

typedef struct {
  ct_rm *rm;
  char **texts;
  bool *eos;  // (n) text rows: EOS appended as in training
  int n, cap;
  const char *path;
} score_rows;

// A row to score: messages; prompt + completion (text, or messages); or text.
static int score_row(void *ctx, json_t *row, int line) {
  score_rows *s = ctx;
  char *text = NULL, where[600];
  ct_jsonl_where(where, sizeof where, s->path, line);
  json_t *msgs = json_object_get(row, "messages"), *p = json_object_get(row, "prompt"),
         *c = json_object_get(row, "completion"), *t = json_object_get(row, "text");
  int rc;
  bool eos = false;
  if (json_is_array(msgs)) {
    rc = ct_row_chat(s->rm->tok, row, msgs, "messages", false, &text);
  } else if (p && json_is_array(c)) {
    json_t *all = json_is_array(p) ? json_copy(p) : NULL;
    rc = all ? (json_array_extend(all, c), ct_row_chat(s->rm->tok, row, all, "completion", false, &text))
             : ct_set_error(CT_EFORMAT, "key 'prompt': a message list with a message-list completion");
    json_decref(all);
  } else if (p && json_is_string(c)) {
    rc = ct_rm_render(s->rm, row, p, json_string_value(c), &text, &eos);
  } else if (json_is_string(t)) {
    rc = (text = strdup(json_string_value(t))) ? 0 : CT_ENOMEM;
    eos = true;
  } else {
    rc = ct_set_error(CT_EFORMAT, "expected messages, prompt + completion, or text");
  }
  if (rc) return ct_set_error(CT_EFORMAT, "%s: %s", where, ct_last_error());
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 256;
    char **x = realloc(s->texts, sizeof *x * cap);
    if (x) s->texts = x;
    bool *e = x ? realloc(s->eos, sizeof *e * cap) : NULL;
    if (!e) return free(text), ct_set_error(CT_ENOMEM, "out of memory");
    s->eos = e, s->cap = cap;
  }
  s->eos[s->n] = eos;
  s->texts[s->n++] = text;
  return 0;
}

static int score_main(int argc, char **argv) {
  ct_config cfg;
  command_config(&cfg, argc, argv, "score");
  if (!cfg.data[0]) ct_die(2, (ct_set_error(CT_ECONFIG, "score: data=FILE.jsonl (rows to score) is required"), NULL));
  ct_rm rm;
  int B = (int)cfg.per_device_eval_batch_size;
  if (ct_rm_open(&rm, cfg.model_path, cfg.adapter_path, CT_STORE_F32, B, (int)cfg.max_length)) ct_die(1, NULL);
  score_rows s = {.rm = &rm, .path = cfg.data};
  ct_jsonl_stats js;
  if (ct_jsonl_read(cfg.data, cfg.skip_bad_rows, score_row, &s, &js)) ct_die(1, NULL);
  double *r = malloc(sizeof(double) * (s.n ? s.n : 1));
  int too_long = 0;
  if (!r || ct_rm_score_texts(&rm, s.texts, s.eos, s.n, r, &too_long)) ct_die(1, NULL);
  for (int i = 0; i < s.n; i++) {
    if (isfinite(r[i])) printf("{\"row\": %d, \"reward\": %.9g}\n", i, r[i]);
    else printf("{\"row\": %d, \"reward\": null}\n", i);
  }
  fprintf(stderr, "reward score: %d rows of %s%s", s.n, cfg.data, too_long ? "" : "\n");
  if (too_long) fprintf(stderr, "; %d longer than max_length %d: reward null\n", too_long, (int)cfg.max_length);
  for (int i = 0; i < s.n; i++) free(s.texts[i]);
  ct_free_all(s.texts, s.eos, r);
  ct_rm_free(&rm);
  ct_config_free(&cfg);
  ct_pool_free();
  return fflush(stdout) ? 1 : 0;
}

static int eval_main(int argc, char **argv) {
  ct_config cfg;
  command_config(&cfg, argc, argv, "eval");
  // the pairs: data= as `score` takes its rows (the README's form), or eval_dataset_path / dataset_path
  const char *path = cfg.data[0] ? cfg.data : cfg.eval_dataset_path[0] ? cfg.eval_dataset_path : cfg.dataset_path;
  if (!path[0]) ct_die(2, (ct_set_error(CT_ECONFIG, "eval: data=PAIRS.jsonl (held-out preference pairs) is required"), NULL));
  ct_rm rm;
  if (ct_rm_open(&rm, cfg.model_path, cfg.adapter_path, CT_STORE_F32, (int)cfg.per_device_eval_batch_size,
                 (int)cfg.max_length))
    ct_die(1, NULL);
  ct_pref_opts po = {.max_length = (int)cfg.max_length, .skip_bad_rows = cfg.skip_bad_rows, .reward = true};
  ct_pref_dataset ds;
  if (ct_pref_load(&ds, path, rm.tok, &po)) ct_die(1, NULL);
  int n = ds.n;
  ct_ids *seq = calloc(2 * (size_t)n, sizeof *seq);
  const int **ids = malloc(sizeof *ids * 2 * n);
  int *len = malloc(sizeof(int) * 2 * n);
  double *r = malloc(sizeof(double) * 2 * n);
  if (!seq || !ids || !len || !r) ct_die(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  for (int k = 0; k < n; k++) {  // rows k: prompt + chosen, n + k: prompt + rejected
    const int *p = ds.ids + ds.start[k], *c = p + ds.p_len[k], *rj = c + ds.c_len[k];
    for (int h = 0; h < 2; h++) {
      ct_ids *s = &seq[h * n + k];
      for (int i = 0; i < ds.p_len[k]; i++) ct_ids_push(s, p[i]);
      for (int i = 0; i < (h ? ds.r_len[k] : ds.c_len[k]); i++) ct_ids_push(s, h ? rj[i] : c[i]);
      ids[h * n + k] = s->v, len[h * n + k] = s->n;
    }
  }
  if (ct_rm_score_ids(&rm, ids, len, 2 * n, r, NULL)) ct_die(1, NULL);
  ct_rm_sums s = {0};
  ct_rm_range e = {-INFINITY, -INFINITY};
  for (int k = 0; k < n; k++) {
    double dc, dr;
    ct_rm_add_pair(&s, &e, r[k], r[n + k], ct_rm_pair_loss(r[k], r[n + k], ds.margin[k], 0, &dc, &dr));
  }
  double m = n ? n : 1;
  printf("{\"eval_pairs\": %d, \"eval_accuracy\": %.6f, \"eval_margin\": %.6g, \"eval_loss\": %.6g}\n", n,
         s.correct / m, s.margin / m, s.loss / m);
  fprintf(stderr, "reward eval: %s: %d pairs, accuracy %.4f, margin %.4g%s\n", path, n, s.correct / m, s.margin / m,
          ds.n_dropped ? " (longer pairs dropped)" : "");
  for (int i = 0; i < 2 * n; i++) ct_ids_free(&seq[i]);
  ct_free_all(seq, ids, len, r);
  ct_pref_free(&ds);
  ct_rm_free(&rm);
  ct_config_free(&cfg);
  ct_pool_free();
  return fflush(stdout) ? 1 : 0;
}

int main(int argc, char **argv) {
  ct_die_name("reward");  // (score and eval: ct_train_start names it for training)
  if (argc >= 2 && (!strcmp(argv[1], "score") || !strcmp(argv[1], "eval"))) {
    bool score = !strcmp(argv[1], "score");
    argv[1] = argv[0];  // the command's own argv: program, then its arguments
    return score ? score_main(argc - 1, argv + 1) : eval_main(argc - 1, argv + 1);
  }
  return train_main(argc, argv);
}
