// distill: a student learns from a teacher, as MaxText's distillation and TRL's GKD.
//
//   bin/distill configs/distill.yml teacher_path=DIR model_path=DIR dataset_path=data.jsonl
//   bin/distill precompute configs/distill.yml teacher_path=DIR dataset_path=data.jsonl
//               teacher_logits_path=topk.safetensors
//
// Data as SFT. Loss per labeled token: α·τ²·soft + (1 − α)·hard, soft the generalized JSD
// between teacher and student at temperature τ (distill/kd.h), hard the cross-entropy;
// both averaged over the step's labeled tokens. The teacher runs forward only, before
// the student's pass, and keeps only its final hidden states for the step; offline mode
// reads its precomputed top-k logits instead and loads no teacher. With probability
// lmbda a batch's completions are generated first (by the student, or the teacher with
// seq_kd), and those get the soft loss only.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fingerprint.h"
#include "ckpt.h"
#include "completions.h"
#include "config.h"
#include "data.h"
#include "dist.h"
#include "kd.h"
#include "distill/topk.h"
#include "engine.h"
#include "panel.h"
#include "error.h"
#include "forward.h"
#include "generate.h"
#include "hash.h"
#include "hf.h"
#include "lm.h"
#include "matmul.h"
#include "mem.h"
#include "pool.h"
#include "sample.h"
#include "train.h"
#include "die.h"
#include "run.h"
#include "watch.h"
#include "unicode.h"
#include "weights.h"

static int fail(int code, const char *what) {
  ct_die_name("distill");
  ct_die(code, what);
}

// ---------------------------------------------------------------------------
// The teacher: a frozen model (teacher_dtype: float32, bfloat16 or int8) and the final hidden
// states of the current batch's target rows, from which the soft loss asks for logit
// chunks.

typedef struct {
  ct_frozen f;
  float *hidden;  // (B·T, C) the gathered rows of the current batch
} teacher_t;

static int teacher_load(teacher_t *t, const ct_config *c, int B, int T) {
  int dtype = c->teacher_dtype;
  t->hidden = NULL;
  int rc = ct_frozen_open(&t->f, c->teacher_path, dtype, B, T);
  if (rc) return ct_wrap_error(rc, "teacher");
  t->hidden = malloc(sizeof(float) * (size_t)B * T * t->f.cfg.hidden_size);
  return t->hidden ? 0 : ct_set_error(CT_ENOMEM, "teacher: out of memory");
}

static void teacher_free(teacher_t *t) {
  ct_frozen_free(&t->f);
  free(t->hidden);
}

static void teacher_forward(teacher_t *t, const ct_batch *b) {
  if (ct_frozen_hidden(&t->f, b, t->hidden) < 0) fail(1, "teacher");
}

static void teacher_chunk(void *ctx, int n, int v0, int nv, float *out) {
  teacher_t *t = ctx;
  ct_frozen_logits(&t->f, t->hidden, n, v0, nv, out);
}

// ---------------------------------------------------------------------------
// Offline logits: the teacher's top-k per labeled token, in dataset order (row by row,
// labeled tokens in order), with the data's hash so a stale file is refused.

typedef struct {
  ct_topk f;       // the file's (n, k) ids and logits (distill/topk.h)
  long *row_off;   // (rows + 1) first labeled token of each dataset row
  int *b_idx;      // (B·T, k) a micro-batch's rows of idx and logit
  float *b_logit;
} topk_t;

static uint64_t data_hash(const ct_dataset *ds) {
  uint64_t h = ct_fnv1a(ds->ids, sizeof(int) * (size_t)ds->n_tokens, CT_FNV1A_INIT);
  return ct_fnv1a(ds->label, (size_t)ds->n_tokens, h);
}

static long *label_offsets(const ct_dataset *ds) {
  long *off = malloc(sizeof(long) * (ds->n_rows + 1));
  if (!off) return NULL;
  off[0] = 0;
  for (int r = 0; r < ds->n_rows; r++) {
    long c = 0;
    for (int j = 1; j < ds->row_len[r]; j++) c += ds->label[ds->row_start[r] + j];
    off[r + 1] = off[r] + c;
  }
  return off;
}

// For each gathered row q of batch b: the index of its token in the offline file.
static void gathered_label_index(const ct_dataset *ds, const ct_batch *b, const long *off, long *out) {
  int q = 0;
  for (int i = 0; i < b->B; i++) {
    int s = b->row_seq[i];
    for (int d = 0; d < ds->seq_count[s]; d++) {
      int r = ds->seq_rows[ds->seq_first[s] + d];
      long k = off[r];
      for (int j = 1; j < ds->row_len[r]; j++)
        if (ds->label[ds->row_start[r] + j]) out[q++] = k++;
    }
  }
}

static void cmd_precompute(const ct_config *cfg, ct_train *tr, const ct_tokenizer *tok, const ct_dataset *ds) {
  if (!cfg->teacher_logits_path[0])
    fail(2, (ct_set_error(CT_ECONFIG, "precompute needs teacher_logits_path=FILE (where to write)"), NULL));
  int B = (int)cfg->per_device_eval_batch_size, T = (int)cfg->max_length;
  teacher_t t;
  if (teacher_load(&t, cfg, B, T) || (tr->bf16 && ct_frozen_compute_bf16(&t.f))) fail(1, NULL);
  int V = t.f.cfg.vocab_size, C = t.f.cfg.hidden_size, k = (int)cfg->distill_top_k < V ? (int)cfg->distill_top_k : V;
  long *off = label_offsets(ds);
  long total = off[ds->n_rows];
  enum { ROWS = 32 };  // teacher logits of ROWS labeled tokens at a time
  int *idx = malloc(sizeof(int) * (size_t)total * k), *ord = malloc(sizeof(int) * k);
  float *lg = malloc(sizeof(float) * (size_t)total * k), *rows = malloc(sizeof(float) * ROWS * (size_t)V);
  long *where = malloc(sizeof(long) * B * T);
  ct_batch b;
  int *seqs = malloc(sizeof(int) * B);
  if (!idx || !ord || !lg || !rows || !where || !seqs || ct_batch_init(&b, B, T)) fail(1, NULL);
  ct_log_info(&tr->log, "teacher top-%d logits for %ld labeled tokens of %s", k, total, ds->path);
  for (int first = 0; first < ds->n_seq; first += B) {
    int n = 0;
    for (int s = first; s < ds->n_seq && n < B; s++) seqs[n++] = s;
    ct_batch_fill(&b, ds, seqs, n, ct_tokenizer_pad(tok));
    teacher_forward(&t, &b);
    gathered_label_index(ds, &b, off, where);
    for (long q0 = 0; q0 < b.n_target; q0 += ROWS) {
      int nr = b.n_target - q0 < ROWS ? (int)(b.n_target - q0) : ROWS;
      ct_frozen_logits(&t.f, t.hidden + q0 * C, nr, 0, V, rows);
      for (int i = 0; i < nr; i++) {
        const float *row = rows + (long)i * V;
        long w = where[q0 + i] * k;
        ct_top_k_ids(row, V, k, ord);
        for (int j = 0; j < k; j++) idx[w + j] = ord[j], lg[w + j] = row[ord[j]];
      }
    }
  }
  ct_topk file = {.k = k, .n = total, .idx = idx, .logit = lg, .data_hash = data_hash(ds)};
  if (ct_topk_write(cfg->teacher_logits_path, &file, cfg->teacher_path)) fail(1, NULL);
  ct_log_info(&tr->log, "wrote %s", cfg->teacher_logits_path);
  ct_free_all(idx, ord, lg, rows, where, seqs, off);
  ct_batch_free(&b);
  teacher_free(&t);
}

// The file, checked whole (distill/topk.h) against the student's V tokens, then against
// this dataset; its checksum is the teacher's identity in the checkpoints.
static void load_topk(ct_train *tr, const ct_dataset *ds, topk_t *tk) {
  const char *path = tr->cfg->teacher_logits_path;
  if (ct_topk_load(&tk->f, path, tr->model.cfg.vocab_size)) fail(1, NULL);
  tk->row_off = label_offsets(ds);
  if (!tk->row_off) fail(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  if (tk->f.data_hash != data_hash(ds) || tk->f.n != tk->row_off[ds->n_rows])
    fail(1, (ct_set_error(CT_EFORMAT, "%s: not the teacher logits of this dataset (run `bin/distill "
                          "precompute` with the same data and max_length)", path), NULL));
  ct_ident id;
  ct_ident_set(&id, "teacher", "teacher_logits_path", path, NULL, NULL, tk->f.sum);
  if (ct_train_frozen_record(tr, &id)) fail(1, NULL);
}

// ---------------------------------------------------------------------------
// Checks before any work: the teacher exists and speaks the student's vocabulary.

static void check_vocabularies(const ct_config *cfg, const ct_tokenizer *student) {
  ct_tokenizer *tt;
  if (ct_tokenizer_load_said(NULL, &tt, cfg->teacher_path))
    fail(1, (ct_wrap_error(CT_EIO, "%s: key 'teacher_path'", ct_config_origin(cfg, "teacher_path")), NULL));
  int V = ct_tokenizer_vocab_size(student);
  if (ct_tokenizer_vocab_size(tt) != V)
    fail(1, (ct_set_error(CT_EINVAL, "the teacher's tokenizer has %d tokens, the student's %d: "
                          "distillation needs one vocabulary", ct_tokenizer_vocab_size(tt), V), NULL));
  for (int id = 0; id < V; id++) {
    size_t a, b;
    const char *x = ct_tokenizer_token_bytes(student, id, &a), *y = ct_tokenizer_token_bytes(tt, id, &b);
    if (a != b || (a && memcmp(x, y, a)))
      fail(1, (ct_set_error(CT_EINVAL, "the teacher's and the student's tokenizers differ at token "
                            "id %d: distillation needs one vocabulary", id), NULL));
  }
  ct_tokenizer_free(tt);
}

// ---------------------------------------------------------------------------
// On-policy batches (GKD): each row keeps its prompt (the tokens before its first label)
// and gets a completion sampled at temperature τ by `gen` (student or teacher weights).

// One generated completion: its tokens, and what completions.jsonl shows of it.
typedef struct {
  int *ids;
  int n;
  json_t *row;  // NULL unless completions are logged
} gen_sample;

typedef struct {
  gen_sample *out;  // (requests)
  const ct_tokenizer *tok;
  const int *const *prompt;  // (requests) the prompts' tokens, for the log
  const int *plen;
  long step;        // the optimizer step they train; < 0: no log
} gen_out;

// The completions.jsonl row of a generated sample (without rewards: distillation has none).
static json_t *gen_row(const gen_out *o, const ct_gen_result *r) {
  char *prompt;
  size_t len;
  if (ct_tokenizer_decode(o->tok, o->prompt[r->request], o->plen[r->request], &prompt, &len)) return NULL;
  char *valid = ct_utf8_lossy(prompt, len, &len);
  json_t *p = valid ? json_stringn(valid, len) : NULL;
  ct_free_all(prompt, valid);
  char *text = strndup(r->text, r->text_len);
  json_t *row = text ? ct_completion_row(o->step, p, text, r->ids, r->logprobs, r->n, ct_finish_names[r->finish])
                     : NULL;
  free(text);
  json_decref(p);
  return row;
}

static int gen_done(void *ctx, const ct_gen_result *r) {
  gen_out *o = ctx;
  gen_sample *g = &o->out[r->request];
  g->ids = malloc(sizeof(int) * (r->n ? r->n : 1));
  g->row = o->step >= 0 ? gen_row(o, r) : NULL;
  if (!g->ids || (o->step >= 0 && !g->row)) return ct_set_error(CT_ENOMEM, "out of memory");
  memcpy(g->ids, r->ids, sizeof(int) * r->n);
  g->n = r->n;
  return 0;
}

// The prompt of sequence s: the tokens of its (first) row before its first label, at
// least one, and never the whole row.
static int prompt_len(const ct_dataset *ds, int s) {
  int r = ds->seq_rows[ds->seq_first[s]], j0 = 1;
  while (j0 < ds->row_len[r] - 1 && !ds->label[ds->row_start[r] + j0]) j0++;
  return j0;
}

// Cache positions an on-policy completion needs: the longest prompt and max_new_tokens,
// within max_length T.
static int generation_positions(const ct_dataset *ds, long max_new, int T) {
  long most = 1;
  for (int s = 0; s < ds->n_seq; s++) {
    long p = prompt_len(ds, s) + max_new;
    most = p > most ? p : most;
  }
  return most < T ? (int)most : T;
}

// Generates the completions of m sequences into b, each at most max_new tokens (and
// within b's length); with step >= 0, their completions.jsonl rows go to rows (m).
static void generate_batch(ct_engine *gen, const ct_tokenizer *tok, const ct_dataset *ds, const int *seqs, int m,
                           ct_batch *b, float tau, int max_new, uint64_t seed, long step, json_t **rows) {
  ct_gen_request req[m];
  gen_sample comp[m];
  int plen[m];
  const int *prompt[m];
  const int *stop_ids;
  int n_stop = ct_tokenizer_stop_ids(tok, &stop_ids);
  for (int i = 0; i < m; i++) {
    int r = ds->seq_rows[ds->seq_first[seqs[i]]], j0 = prompt_len(ds, seqs[i]);
    plen[i] = j0;
    req[i] = (ct_gen_request){.prompt = ds->ids + ds->row_start[r], .prompt_len = j0, .n = 1,
                              .seed = seed + (uint64_t)i, .sp = {tau, 0, 1, 0, 1},
                              .max_new_tokens = b->cap_T - j0 < max_new ? b->cap_T - j0 : max_new,
                              .stop_ids = stop_ids, .n_stop_ids = n_stop};
    prompt[i] = req[i].prompt;
    comp[i] = (gen_sample){0};
  }
  gen_out o = {comp, tok, prompt, plen, rows ? step : -1};
  ct_gen_callbacks cb = {gen_done, NULL, &o};
  if (ct_generate(gen, tok, req, m, &cb)) fail(1, "on-policy generation");
  int T = 1;
  for (int i = 0; i < m; i++) T = plen[i] + comp[i].n > T ? plen[i] + comp[i].n : T;
  b->B = m;
  b->T = T;
  b->n_target = b->n_tokens = 0;
  for (int i = 0; i < m; i++) {
    b->row_seq[i] = seqs[i];
    ct_batch_row(b, i, req[i].prompt, plen[i], comp[i].ids, comp[i].n, ct_tokenizer_pad(tok));
    free(comp[i].ids);
    if (rows) rows[i] = comp[i].row;
  }
}

typedef struct {
  double loss, soft, hard, hard_n, teacher_nll, tokens, input_tokens, correct;
} kd_stats;

// The student's cross-entropy and greedy sequence accuracy on the eval set.
static void evaluate(ct_train *tr, ct_acts *a, ct_head *h, ct_batch *b, int *seqs, const ct_dataset *ev) {
  if (ct_train_eval_lm(tr, a, h, b, seqs, ev)) fail(1, "eval");
}

static bool precompute_mode;  // `bin/distill precompute ...`: write the teacher's top-k logits

// Distillation's own checks of the config, before anything is loaded.
static int check_config(const ct_config *c) {
  bool offline = !precompute_mode && c->teacher_logits_path[0];
  if (!offline && !c->teacher_path[0])
    return ct_set_error(CT_ECONFIG, "%s: key 'teacher_path' is required (or teacher_logits_path "
                        "for precomputed logits)", ct_config_origin(c, "teacher_path"));
  if (offline && c->lmbda > 0)
    return ct_set_error(CT_ECONFIG, "%s: key 'lmbda': on-policy distillation needs the teacher "
                        "itself, not precomputed logits", ct_config_origin(c, "lmbda"));
  const char *on_policy = c->seq_kd ? "seq_kd" : c->log_completions ? "log_completions"
                          : c->num_completions_to_print ? "num_completions_to_print"
                          : ct_config_is_set(c, "max_new_tokens") ? "max_new_tokens" : NULL;
  if (c->lmbda == 0 && on_policy)
    return ct_set_error(CT_ECONFIG, "%s: key '%s' acts on generated batches, and lmbda is 0 (none are "
                        "generated); set lmbda > 0 or drop the key", ct_config_origin(c, on_policy), on_policy);
  if (c->temperature <= 0)
    return ct_set_error(CT_ECONFIG, "%s: key 'temperature': distillation divides logits by it (and samples "
                        "at it); give a value above 0", ct_config_origin(c, "temperature"));
  if ((c->lmbda > 0 || c->teacher_dtype == CT_STORE_INT8) && c->packing)
    return ct_set_error(CT_ECONFIG, "%s: key 'packing' cannot be combined with lmbda or an int8 "
                        "teacher", ct_config_origin(c, "packing"));
  if (c->lmbda > 0 && !c->seq_kd && c->use_peft && c->base_dtype == CT_STORE_INT8)
    return ct_set_error(CT_ECONFIG, "%s: key 'base_dtype': on-policy batches are sampled by the sampler's "
                        "engine, which runs a float32 or bfloat16 student, not int8", ct_config_origin(c, "base_dtype"));
  if (c->lmbda > 0 && c->seq_kd && c->teacher_dtype == CT_STORE_BF16)
    return ct_set_error(CT_ECONFIG, "%s: key 'teacher_dtype': seq_kd generates with the teacher through "
                        "the sampler's engine, which runs float32 or int8 weights, not bfloat16",
                        ct_config_origin(c, "teacher_dtype"));
  return 0;
}

int main(int argc, char **argv) {
  precompute_mode = argc > 1 && !strcmp(argv[1], "precompute");
  if (precompute_mode) argv++, argc--;
  ct_config cfg;
  ct_train tr;
  ct_train_start(&tr, &cfg, CT_TRAINER_DISTILL, argc, argv, check_config);
  bool offline = !precompute_mode && cfg.teacher_logits_path[0];
  int rc;
  // `precompute` without a student (no model_path nor tokenizer_path) tokenizes with the
  // teacher's tokenizer: the student it will train must share it anyway, and the one built
  // from scratch (the byte tokenizer) would not
  ct_tokenizer *teacher_tok = NULL;
  int vocab = tr.model.cfg.vocab_size;
  if (precompute_mode && !cfg.model_path[0] && !cfg.tokenizer_path[0]) {
    if (ct_tokenizer_load_said(NULL, &teacher_tok, cfg.teacher_path))
      fail(1, (ct_wrap_error(CT_EIO, "%s: key 'teacher_path'", ct_config_origin(&cfg, "teacher_path")), NULL));
    vocab = ct_tokenizer_vocab_size(teacher_tok);
  } else if (!offline) {
    check_vocabularies(&cfg, tr.tok);
  }
  const ct_tokenizer *tok = teacher_tok ? teacher_tok : tr.tok;
  ct_data_opts o = {(int)cfg.max_length, cfg.completion_only_loss, cfg.assistant_only_loss,
                    cfg.skip_bad_rows, cfg.packing, cfg.dataset_text_field, vocab};
  ct_dataset train, eval = {0};
  if (ct_dataset_load(&train, cfg.dataset_path, tok, &o)) fail(1, NULL);
  bool have_eval = cfg.eval_dataset_path[0] && !precompute_mode;
  ct_data_opts eo = o;
  eo.packing = false;
  if (have_eval && ct_dataset_load(&eval, cfg.eval_dataset_path, tr.tok, &eo)) fail(1, NULL);
  ct_log_info(&tr.log, "train: %s: %d rows, %ld trained tokens", train.path, train.n_rows, train.n_label_tokens);
  if (precompute_mode) {
    cmd_precompute(&cfg, &tr, tok, &train);
    ct_dataset_free(&train);
    ct_tokenizer_free(teacher_tok);
    ct_train_release(&tr);  // nothing to save: the teacher's logits are the output
    return 0;
  }
  int B = (int)cfg.per_device_train_batch_size, accum = (int)cfg.gradient_accumulation_steps;
  int global = B * accum * tr.world, T = (int)cfg.max_length;
  const ct_model_config *mc = &tr.model.cfg;
  teacher_t teacher = {0};
  topk_t tk = {0};
  ct_model_config tc = *mc;  // the teacher's shape
  if (offline) load_topk(&tr, &train, &tk);
  else if (ct_model_read_config(&tc, cfg.teacher_path)) fail(1, "teacher");
  int V = mc->vocab_size, Vt = tc.vocab_size, C = mc->hidden_size, tiles = (int)cfg.num_vocab_tiling;
  if (Vt != V)
    ct_log_info(&tr.log, "teacher vocab_size %d, student %d: the soft loss uses the first %d logits",
                Vt, V, Vt < V ? Vt : V);
  if (Vt < V) V = Vt;
  if (ct_train_schedule(&tr, train.n_seq, global, ct_dataset_fingerprint(&train))) fail(1, NULL);
  int mode = cfg.gradient_checkpointing ? CT_ACTS_RECOMPUTE : CT_ACTS_KEEP;
  int Tg = generation_positions(&train, cfg.max_new_tokens, T);  // on-policy generation
  ct_engine_opts geo = {B, Tg, Tg > B ? Tg : B};
  ct_plan plan = {0};
  int Be = have_eval ? (int)cfg.per_device_eval_batch_size : 0, Bmax = B > Be ? B : Be;
  ct_train_plan_acts(&tr, &plan, B, Be, T);
  ct_plan_addf(&plan, ct_head_bytes(Bmax * T, B * T, mc->vocab_size, C, tiles) + ct_kd_bytes(B * T, V, C, tiles),
               "LM head and soft loss: %d x %d tokens / %d chunks", B, T, tiles);
  if (!offline)
    ct_plan_addf(&plan, ct_frozen_bytes(&tc, (int)cfg.teacher_dtype, B, T) + 4.0 * B * T * tc.hidden_size +
                            (tr.bf16 ? ct_frozen_bf16_bytes(&tc, (int)cfg.teacher_dtype, B, T) : 0),
                 "teacher (%s%s)", ct_store_names[cfg.teacher_dtype], tr.bf16 ? ", bf16 compute" : "");
  else
    ct_plan_addf(&plan, 8.0 * B * T * tk.f.k, "teacher top-%d logits of a batch", tk.f.k);
  if (cfg.lmbda > 0)
    ct_plan_addf(&plan, ct_engine_bytes(cfg.seq_kd ? &tc : mc, &geo), "sampler: KV cache of %d slots x %d positions",
                 B, Tg);
  int gen_pack = tr.bf16 && ct_panel16_native() ? CT_PACK_BF16 : CT_PACK_F32;  // the student's rollouts
  if (cfg.lmbda > 0 && !cfg.seq_kd)
    ct_plan_addf(&plan, ct_infer_pack_bytes(mc, gen_pack), "sampler: the student packed for decoding (%s)",
                 gen_pack == CT_PACK_BF16 ? "bfloat16" : "float32");
  bool dry;
  if (ct_train_memory(&tr, &plan, "gradient_checkpointing=true, teacher_dtype=bfloat16 or int8, "
                      "num_vocab_tiling, a smaller per_device_train_batch_size or max_length", &dry))
    fail(1, NULL);
  if (dry) {
    ct_topk_free(&tk.f);
    free(tk.row_off);
    ct_dataset_free(&train);
    ct_train_release(&tr);
    return 0;
  }
  if (!offline && (teacher_load(&teacher, &cfg, B, T) || (tr.bf16 && ct_frozen_compute_bf16(&teacher.f))))
    fail(1, NULL);
  uint64_t teacher_sum = offline ? 0 : ct_frozen_checksum(&teacher.f);
  if (!offline) {  // the teacher's identity: a resumed run must distil from the same one
    ct_ident id;
    ct_ident_set(&id, "teacher", "teacher_path", cfg.teacher_path, "teacher_dtype", ct_store_names[cfg.teacher_dtype],
                 teacher_sum);
    if (ct_train_frozen_record(&tr, &id)) fail(1, NULL);
  }
  ct_acts acts;
  ct_head head;
  ct_kd kd;
  ct_batch batch;
  int *seqs = malloc(sizeof(int) * (global > Bmax ? global : Bmax));
  ct_acts eval_acts = {0};
  if (have_eval && (ct_acts_init(&eval_acts, &tr.model, Be, T, CT_ACTS_FORWARD) || ct_train_attach(&tr, &eval_acts)))
    fail(1, NULL);
  long *where = malloc(sizeof(long) * B * T);
  if (offline) {
    tk.b_idx = malloc(sizeof(int) * (size_t)B * T * tk.f.k);
    tk.b_logit = malloc(sizeof(float) * (size_t)B * T * tk.f.k);
    if (!tk.b_idx || !tk.b_logit) fail(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  }
  if (!seqs || !where || ct_acts_init(&acts, &tr.model, B, T, mode) || ct_train_attach(&tr, &acts) || ct_batch_init(&batch, Bmax, T) ||
      ct_head_init(&head, Bmax * T, B * T, mc->vocab_size, C, tiles) || ct_kd_init(&kd, B * T, V, C, tiles))
    fail(1, NULL);
  // on-policy generation: the student's weights as they are, or the teacher's
  ct_infer_weights gen_w = {0};
  ct_engine *gen = NULL;
  ct_batch *gen_batches = cfg.lmbda > 0 ? calloc((size_t)accum, sizeof *gen_batches) : NULL;
  if (cfg.lmbda > 0 && !gen_batches) fail(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  ct_completions log;  // on-policy samples, in completions.jsonl
  json_t **gen_rows = calloc((size_t)B * accum, sizeof *gen_rows);
  if (!gen_rows || ct_completions_open(&log, cfg.output_dir, cfg.lmbda > 0 && cfg.log_completions,
                                       (int)cfg.num_completions_to_print, tr.step, &tr.log))
    fail(1, NULL);
  for (int k = 0; cfg.lmbda > 0 && k < accum; k++)
    if (ct_batch_init(&gen_batches[k], B, T)) fail(1, NULL);
  if (cfg.lmbda > 0) {
    if (cfg.seq_kd) rc = ct_engine_init(&gen, &teacher.f.iw, &geo);  // the teacher's engine view
    else rc = ct_infer_from_model(&gen_w, &tr.model) || ct_infer_attach_lora(&gen_w, cfg.use_peft ? &tr.lora : NULL) ||
              ct_infer_pack(&gen_w, gen_pack) || ct_engine_init(&gen, &gen_w, &geo);
    if (rc) fail(1, NULL);
  }
  ct_kd_opts ko = {(float)cfg.temperature, (float)cfg.beta, 0, false};
  double tau = ko.tau, alpha = cfg.distill_alpha;
  ct_log_info(&tr.log, "training %ld steps; teacher %s; alpha %g, beta %g, temperature %g%s",
              tr.total_steps - tr.step, offline ? "offline top-k logits" : cfg.teacher_path, alpha,
              cfg.beta, tau, cfg.lmbda > 0 ? (cfg.seq_kd ? ", teacher-generated batches" : ", on-policy batches") : "");
  ct_train_watch_signals(&tr);
  if (have_eval && cfg.eval_on_start && tr.step == 0) evaluate(&tr, &eval_acts, &head, &batch, seqs, &eval);
  bool stop = false;
  kd_stats win = {0};
  double t_win = ct_now();
  while (tr.step < tr.total_steps && !stop) {
    int n = ct_train_next_seqs(&tr, seqs, global);
    // on-policy for this step? one draw from the train state's rng (saved, so resumable)
    bool generated = cfg.lmbda > 0 && ct_rng_uniform(&tr.rng) < cfg.lmbda;
    long labels = 0;
    if (generated) {  // all of the step's completions first: the denominator needs them
      int n_rows = 0;
      if (!cfg.seq_kd && !cfg.use_peft && ct_infer_pack(&gen_w, gen_pack)) fail(1, NULL);  // the student as trained
      for (int k = 0; k < accum; k++) {
        int first = (k * tr.world + tr.rank) * B;
        if (first >= n) break;
        int m = n - first < B ? n - first : B;
        ct_log_phase(&tr.log, tr.step + 1, "on-policy generation", k, accum, "batches", 0, NULL);
        generate_batch(gen, tr.tok, &train, seqs + first, m, &gen_batches[k], (float)tau, (int)cfg.max_new_tokens,
                       (uint64_t)cfg.seed * 7919u + (uint64_t)tr.step * 104729u + (uint64_t)first, tr.step + 1,
                       log.on ? gen_rows + n_rows : NULL);
        n_rows += log.on ? m : 0;
        labels += gen_batches[k].n_target;
      }
      if (ct_completions_append(&log, gen_rows, n_rows)) fail(1, "logging completions");
      double l = (double)labels;
      ct_dist_sum_f64(&l, 1);
      labels = (long)l;
    } else {
      for (int i = 0; i < n; i++) labels += ct_seq_labels(&train, seqs[i]);
    }
    double inv = labels ? 1.0 / labels : 0;
    kd_stats st = {0};
    ct_log_phase(&tr.log, tr.step + 1, "training", 0, accum, "micro-batches", 0, NULL);  // (the heartbeat's line)
    for (int k = 0; k < accum; k++) {
      int first = (k * tr.world + tr.rank) * B;
      if (first >= n) break;
      int m = n - first < B ? n - first : B;
      ct_batch *bp = generated ? &gen_batches[k] : &batch;
      if (!generated) ct_batch_fill(&batch, &train, seqs + first, m, ct_tokenizer_pad(tr.tok));
      const ct_batch *b = bp;
      if (!offline) teacher_forward(&teacher, b);  // before the student's pass
      ct_train_dropout_key(&tr, k);
      int N = b->B * b->T, q = ct_lm_forward(&tr.model, &acts, &head, b);
      if (q < 0) fail(1, NULL);
      for (int r = 0; r < q; r++) {  // hard loss: (1 − α) · CE / labels
        st.hard -= head.logp[r];
        st.correct += head.argmax[r] == head.target[r];
        head.coef[r] = generated ? 0.0f : (float)((1 - alpha) * inv);  // generated: soft only
        head.zcoef[r] = 0;
      }
      ko.scale = (float)(alpha * tau * tau * inv);
      const float *W = ct_lm_head_weight(&tr.model, &acts);  // the student's head and its gradient
      float *dW = ct_lm_head_grad(&tr.g, &acts);
      ko.frozen_head = dW == NULL;
      double soft;
      if (offline) {
        gathered_label_index(&train, b, tk.row_off, where);
        int kk = tk.f.k;
        for (int r = 0; r < q; r++) {
          memcpy(tk.b_idx + (long)r * kk, tk.f.idx + where[r] * kk, sizeof(int) * kk);
          memcpy(tk.b_logit + (long)r * kk, tk.f.logit + where[r] * kk, sizeof(float) * kk);
        }
        soft = ct_kd_soft_topk(&kd, head.hc, q, W, dW, tk.b_idx, tk.b_logit, kk, &ko);
      } else {
        soft = ct_kd_soft(&kd, head.hc, q, W, dW, head.target, teacher_chunk,
                          &teacher, &ko);
        for (int r = 0; r < q; r++) st.teacher_nll -= kd.tgt_t1[r] - kd.lse_t1[r];
      }
      st.soft += soft;
      st.tokens += q;
      st.input_tokens += b->n_tokens;
      ct_head_backward(&head, W, dW, acts.dln, N);
      for (int r = 0; r < q; r++) {  // + the soft loss's gradient on the same rows
        float *d = acts.dln + (long)head.rows[r] * mc->hidden_size;
        const float *e = kd.dhs + (long)r * mc->hidden_size;
        for (int c = 0; c < mc->hidden_size; c++) d[c] += e[c];
      }
      ct_backward(&tr.model, &tr.g, &acts, acts.dln, b->B, b->T);
      ct_log_phase(&tr.log, tr.step + 1, "training", k + 1, accum, "micro-batches", st.input_tokens, NULL);
    }
    ct_dist_sum_stats(&st);
    double norm, lr;
    if (ct_train_update(&tr, &norm, &lr)) fail(1, NULL);
    tr.num_tokens += st.input_tokens;
    ct_stats_add(&win, &st);
    double tok = win.tokens > 0 ? win.tokens : 1;
    double step_loss = (alpha * tau * tau * st.soft + (1 - alpha) * st.hard) / (st.tokens > 0 ? st.tokens : 1);
    ct_log_progress(&tr.log, tr.step, step_loss, win.input_tokens / (ct_now() - t_win));
    if (ct_train_log_due(&tr)) {
      json_t *j = json_pack("{s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}", "step", (json_int_t)tr.step,
                            "loss", (alpha * tau * tau * win.soft + (1 - alpha) * win.hard) / tok,
                            "distill/soft_loss", win.soft / tok, "distill/hard_loss", win.hard / tok,
                            "distill/student_perplexity", exp(win.hard / tok), "mean_token_accuracy",
                            win.correct / tok, "learning_rate", lr, "grad_norm", norm,
                            "num_tokens", tr.num_tokens, "tokens_per_s", win.input_tokens / (ct_now() - t_win));
      if (!offline) json_object_set_new(j, "distill/teacher_perplexity", json_real(exp(win.teacher_nll / tok)));
      if (ct_log_metrics(&tr.log, j)) fail(1, NULL);
      memset(&win, 0, sizeof win);
      t_win = ct_now();
    }
    if (have_eval && cfg.eval_steps > 0 && tr.step % cfg.eval_steps == 0 && tr.step != tr.total_steps)
      evaluate(&tr, &eval_acts, &head, &batch, seqs, &eval);
    if (ct_train_after_step(&tr, &stop)) fail(1, NULL);
  }
  if (!stop && have_eval) evaluate(&tr, &eval_acts, &head, &batch, seqs, &eval);
  if (!stop && !offline) {
    if (ct_frozen_checksum(&teacher.f) != teacher_sum)
      fail(1, (ct_set_error(CT_EINVAL, "the teacher's weights changed during training"), NULL));
    ct_log_info(&tr.log, "teacher weights unchanged (checksum %016llx)", (unsigned long long)teacher_sum);
  }
  if (gen) ct_engine_free(gen);
  for (int k = 0; cfg.lmbda > 0 && k < accum; k++) ct_batch_free(&gen_batches[k]);
  free(gen_batches);
  free(gen_rows);
  ct_infer_free(&gen_w);
  if (!offline) teacher_free(&teacher);
  ct_topk_free(&tk.f);
  ct_free_all(tk.row_off, tk.b_idx, tk.b_logit, seqs, where);
  ct_acts_free(&acts);
  ct_head_free(&head);
  ct_kd_free(&kd);
  ct_batch_free(&batch);
  ct_acts_free(&eval_acts);
  ct_dataset_free(&train);
  ct_dataset_free(&eval);
  return ct_train_finish(&tr, stop);
}
