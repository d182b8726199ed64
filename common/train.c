// train: the train state every trainer shares — start-up and end of a run, the model and
// its optimizer buffers, data order, the AdamW step with clipping, checkpoints with
// resume, and the frozen reference. A trainer's own loss is not here.
#include "train.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bf16.h"
#include "chat_template.h"
#include "ckpt.h"
#include "dist.h"
#include "dnnl.h"
#include "error.h"
#include "hf.h"
#include "lm.h"
#include "matmul.h"
#include "mem.h"
#include "mtp.h"
#include "fs.h"
#include "pool.h"
#include "safetensors.h"
#include "stop.h"

void ct_failpoint(const char *point) {
  static int hits;
  const char *fp = getenv("CT_FAILPOINT");
  size_t n = strlen(point);
  if (!fp || strncmp(fp, point, n) != 0 || (fp[n] && fp[n] != ':')) return;
  int at = fp[n] == ':' ? atoi(fp + n + 1) : 1;  // "checkpoint:2" = the second time
  if (++hits != at) return;
  double t0 = ct_now();  // 60 s, whatever signals come (a test sends them while it waits)
  while (ct_now() - t0 < 60) sleep(1);
}

int ct_train_after_step(ct_train *tr, bool *stop) {
  const ct_config *c = tr->cfg;
  int rc = 0;
  ct_stop_poll(NULL, 0, 0);  // a signal since the last poll stops here, saving nothing
  tr->save_pending |= c->save_steps > 0 && tr->step % c->save_steps == 0;
  tr->stop_pending |= ct_failpoint_stop(tr->step);
  *stop = false;
  // a checkpoint or a stop waits for the batch's last step, or DiLoCo's next sync
  if (tr->mid_batch || tr->outer_pending) return 0;
  if (tr->save_pending && (rc = ct_train_save_checkpoint(tr))) return ct_wrap_error(rc, "saving a checkpoint");
  tr->save_pending = false;
  *stop = ct_dist_max_int(tr->stop_pending) != 0;  // every rank stops at the same step
  if (*stop) {
    ct_log_info(&tr->log, "interrupted at step %ld: saving a checkpoint to resume from", tr->step);
    if ((rc = ct_train_save_checkpoint(tr))) return ct_wrap_error(rc, "saving a checkpoint");
  }
  return 0;
}

void ct_train_log_schedule(ct_train *tr, int n_seq, int global, int B, int accum, const char *unit) {
  long steps = tr->total_steps - tr->step;
  const char *s = steps == 1 ? "" : "s";
  if (n_seq < global) {
    ct_log_info(&tr->log, "training %ld step%s of %d %s%s each: the data holds %d, fewer than a full "
                "step's %d (%d per device x %d accumulation x %d ranks), %d threads per rank", steps, s, n_seq,
                unit, n_seq == 1 ? "" : "s", n_seq, global, B, accum, tr->world, ct_pool_threads());
    return;
  }
  char tail[128] = "";
  if (n_seq % global)
    snprintf(tail, sizeof tail, "; each epoch of %d %ss ends with a step of %d", n_seq, unit, n_seq % global);
  ct_log_info(&tr->log, "training %ld step%s of %s%d %ss (%d per device x %d accumulation x %d ranks)%s, "
              "%d threads per rank", steps, s, n_seq % global ? "up to " : "", global, unit, B, accum, tr->world,
              tail, ct_pool_threads());
}

bool ct_train_log_due(const ct_train *tr) {
  const ct_config *c = tr->cfg;
  return tr->step % c->logging_steps == 0 || tr->step == tr->total_steps || (tr->step == 1 && c->logging_first_step);
}

void ct_train_log_done(ct_train *tr) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);  // ru_maxrss is in kilobytes on Linux
  ct_log_info(&tr->log, "done: %ld steps; model saved in %s; peak memory %.0f MiB", tr->step,
              tr->cfg->output_dir, ru.ru_maxrss / 1024.0);
  long steps = tr->step - tr->step0;
  if (tr->world > 1 && steps > 0)
    ct_log_info(&tr->log, "communication: %.3f MB sent per optimizer step by rank 0 (ring count, %ld steps)",
                (ct_dist_bytes_sent() - tr->comm0) / 1e6 / steps, steps);
}

bool ct_failpoint_stop(long step) {
  const char *s = getenv("CT_STOP_AFTER_STEP");
  return s && atol(s) == step;
}

// The `model:` block -> a model config; zeros mean "derive".
static int config_from_spec(ct_model_config *mc, const ct_config *cfg, const ct_tokenizer *tok) {
  const ct_model_spec *s = &cfg->model;
  memset(mc, 0, sizeof *mc);
  snprintf(mc->model_type, sizeof mc->model_type, "%s", ct_model_type_names[s->model_type]);
  mc->vocab_size = s->vocab_size ? (int)s->vocab_size : ct_tokenizer_vocab_size(tok);
  mc->hidden_size = (int)s->hidden_size;
  mc->intermediate_size = (int)s->intermediate_size;
  mc->num_layers = (int)s->num_hidden_layers;
  mc->num_heads = (int)s->num_attention_heads;
  mc->num_kv_heads = s->num_key_value_heads ? (int)s->num_key_value_heads : mc->num_heads;
  mc->head_dim = s->head_dim ? (int)s->head_dim : (mc->num_heads ? mc->hidden_size / mc->num_heads : 0);
  if (!s->head_dim && mc->num_heads && mc->hidden_size % mc->num_heads)
    return ct_set_error(CT_ECONFIG, "%s: key 'model.num_attention_heads' (%d) does not divide model.hidden_size "
                        "(%d); set model.head_dim", ct_config_origin(cfg, "model.num_attention_heads"), mc->num_heads,
                        mc->hidden_size);
  mc->max_position_embeddings = (int)s->max_position_embeddings;
  mc->rope_theta = (float)s->rope_theta;
  mc->rms_norm_eps = (float)s->rms_norm_eps;
  mc->tie_word_embeddings = s->tie_word_embeddings;
  bool qwen2 = s->model_type == CT_MODEL_QWEN2, qwen3 = s->model_type == CT_MODEL_QWEN3;
  bool gemma = s->model_type == CT_MODEL_GEMMA3;
  mc->qkv_bias = CT_MODEL_SPEC_IS_SET(s, attention_bias) ? s->attention_bias : qwen2;
  mc->qk_norm = gemma || (CT_MODEL_SPEC_IS_SET(s, use_qk_norm) ? s->use_qk_norm : qwen3);
  if (gemma) {  // Gemma 3's layer (model.h); scale head_dim^-0.5, local RoPE base 10000 as Gemma 3's
    mc->gemma = true;
    mc->query_pre_attn_scalar = (float)mc->head_dim;
    mc->rope_local_theta = 10000;
    mc->sliding_window = (int)s->sliding_window;
    for (int l = 0; l < mc->num_layers && l < CT_MAX_LAYERS; l++)
      mc->sliding[l] = mc->sliding_window > 0 && (l + 1) % s->sliding_window_pattern != 0;
  } else if (CT_MODEL_SPEC_IS_SET(s, sliding_window) && s->sliding_window) {
    return ct_set_error(CT_ECONFIG, "%s: key 'model.sliding_window': sliding-window layers exist only in "
                        "model_type gemma3_text", ct_config_origin(cfg, "model.sliding_window"));
  }
  if (mc->qkv_bias && !qwen2)
    return ct_set_error(CT_ECONFIG, "%s: key 'model.attention_bias': q/k/v biases without an "
                        "o_proj bias exist only in model_type qwen2; use model.model_type=qwen2",
                        ct_config_origin(cfg, "model.attention_bias"));
  if (mc->qk_norm && !qwen3 && !gemma)
    return ct_set_error(CT_ECONFIG, "%s: key 'model.use_qk_norm': per-head q/k norms exist only "
                        "in model_type qwen3; use model.model_type=qwen3",
                        ct_config_origin(cfg, "model.use_qk_norm"));
  mc->bos_token_id = ct_tokenizer_bos(tok);
  mc->eos_token_id = ct_tokenizer_eos(tok);
  mc->pad_token_id = ct_tokenizer_pad(tok);
  int rc = ct_model_config_check(mc);
  if (rc) ct_wrap_error(CT_ECONFIG, "the `model:` block");
  return rc ? CT_ECONFIG : 0;
}

// A model read from dir (model_path, or the checkpoint resumed) against the `model:` keys
// the user set: a set key that differs would be silently ignored, so it is an error.
static int check_spec_keys(const ct_config *cfg, const ct_model_config *mc, const char *dir) {
  const ct_model_spec *s = &cfg->model;
  struct { const char *key; bool set; double want, have; } k[] = {
#define SPEC_ROW(field, value) {"model." #field, CT_MODEL_SPEC_IS_SET(s, field), (double)s->field, (double)(value)}
      SPEC_ROW(vocab_size, mc->vocab_size), SPEC_ROW(hidden_size, mc->hidden_size),
      SPEC_ROW(intermediate_size, mc->intermediate_size), SPEC_ROW(num_hidden_layers, mc->num_layers),
      SPEC_ROW(num_attention_heads, mc->num_heads), SPEC_ROW(num_key_value_heads, mc->num_kv_heads),
      SPEC_ROW(head_dim, mc->head_dim), SPEC_ROW(tie_word_embeddings, mc->tie_word_embeddings),
      SPEC_ROW(attention_bias, mc->qkv_bias), SPEC_ROW(use_qk_norm, mc->qk_norm),
      SPEC_ROW(rope_theta, mc->rope_theta), SPEC_ROW(rms_norm_eps, mc->rms_norm_eps),
      SPEC_ROW(max_position_embeddings, mc->max_position_embeddings),
      SPEC_ROW(sliding_window, mc->sliding_window),
#undef SPEC_ROW
  };
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
    if (k[i].set && (float)k[i].want != (float)k[i].have)
      return ct_set_error(CT_ECONFIG, "%s: key '%s' is %g but the model in %s has %g; the model's own "
                          "shape is used, so drop the key (or start from scratch without model_path "
                          "and resume_from_checkpoint)", ct_config_origin(cfg, k[i].key), k[i].key,
                          k[i].want, dir, k[i].have);
  if (CT_MODEL_SPEC_IS_SET(s, initializer_range) && cfg->model_path[0] && !strcmp(dir, cfg->model_path))
    return ct_set_error(CT_ECONFIG, "%s: key 'model.initializer_range' only applies to a model built from "
                        "scratch, and this one is read from %s; drop the key",
                        ct_config_origin(cfg, "model.initializer_range"), dir);
  if (CT_MODEL_SPEC_IS_SET(s, model_type) && strcmp(ct_model_type_names[s->model_type], mc->model_type))
    return ct_set_error(CT_ECONFIG, "%s: key 'model.model_type' is %s but the model in %s is %s; drop the key",
                        ct_config_origin(cfg, "model.model_type"), ct_model_type_names[s->model_type], dir,
                        mc->model_type);
  return 0;
}

static int check_dir(const ct_config *c, const char *key, const char *dir) {
  struct stat st;
  if (dir[0] && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)))
    return ct_set_error(CT_EIO, "%s: key '%s': %s is not a directory", ct_config_origin(c, key), key, dir);
  return 0;
}

int ct_tokenizer_load_said(ct_log *log, ct_tokenizer **tok, const char *dir) {
  ct_log stderr_log = {.active = ct_dist_rank() == 0};
  if (!log) log = &stderr_log;
  char p[CT_PATH_MAX];
  struct stat st;
  double t0 = ct_now();
  if (!ct_path_join(p, sizeof p, dir, "tokenizer.json") && stat(p, &st) == 0 && st.st_size >= (2 << 20))
    ct_log_info(log, "reading the tokenizer: %s (%.1f MB)", p, st.st_size / 1e6);
  int rc = ct_tokenizer_load(tok, dir);
  if (!rc && ct_now() - t0 >= 1.0)
    ct_log_info(log, "tokenizer: %d tokens, read in %.1f s", ct_tokenizer_vocab_size(*tok), ct_now() - t0);
  return rc;
}

static int load_tokenizer_dir(ct_train *tr, const char *dir) { return ct_tokenizer_load_said(&tr->log, &tr->tok, dir); }

static int load_tokenizer_files(ct_train *tr) {
  const ct_config *c = tr->cfg;
  int rc = check_dir(c, "model_path", c->model_path);
  if (!rc) rc = check_dir(c, "tokenizer_path", c->tokenizer_path);
  if (rc) return rc;
  if (c->tokenizer_path[0]) return load_tokenizer_dir(tr, c->tokenizer_path);
  if (tr->resumed_from[0] && ct_path_has_file(tr->resumed_from, "tokenizer.json"))
    return load_tokenizer_dir(tr, tr->resumed_from);
  if (c->model_path[0]) {
    if (!ct_path_has_file(c->model_path, "tokenizer.json"))
      return ct_set_error(CT_EIO, "%s has no tokenizer.json; set tokenizer_path", c->model_path);
    return load_tokenizer_dir(tr, c->model_path);
  }
  return ct_tokenizer_bytes(&tr->tok);
}

// The tokenizer, with chat_template_path's template in place of its own.
static int load_tokenizer(ct_train *tr) {
  const ct_config *c = tr->cfg;
  int rc = load_tokenizer_files(tr);
  if (!rc && c->chat_template_path[0] && (rc = ct_tokenizer_load_chat_template(tr->tok, c->chat_template_path)))
    ct_wrap_error(rc, "%s: key 'chat_template_path'", ct_config_origin(c, "chat_template_path"));
  return rc;
}

// Positions of the RoPE tables a model starts with: max_length, except in GRPO (which has
// no max_length), whose rollouts reserve prompt + completion positions themselves.
static int rope_positions(const ct_config *c) {
  return c->trainer == CT_TRAINER_GRPO ? 1 : (int)c->max_length;
}

const ct_ident *ct_train_frozen_find(const ct_train *tr, const char *role) {
  for (int i = 0; i < tr->n_frozen; i++)
    if (!strcmp(tr->frozen[i].role, role)) return &tr->frozen[i];
  return NULL;
}

int ct_train_frozen_record(ct_train *tr, const ct_ident *id) {
  for (int i = 0; i < tr->n_saved_frozen && tr->resumed_from[0]; i++) {
    char why[1400];
    if (!strcmp(tr->saved_frozen[i].role, id->role) && ct_ident_differs(&tr->saved_frozen[i], id, why, sizeof why))
      return ct_set_error(CT_EINVAL, "%s was trained with other frozen inputs: %s; resume with the ones it was "
                          "trained with, or start a new run in another output_dir", tr->resumed_from, why);
  }
  ct_ident *slot = (ct_ident *)ct_train_frozen_find(tr, id->role);
  if (!slot && tr->n_frozen == CT_TRAIN_FROZEN_MAX)
    return ct_set_error(CT_EINVAL, "more than %d frozen inputs", CT_TRAIN_FROZEN_MAX);
  *(slot ? slot : &tr->frozen[tr->n_frozen++]) = *id;
  return 0;
}

static int load_model_or_spec(ct_train *tr, ct_model *m, const char *dir) {
  int max_pos = rope_positions(tr->cfg);
  if (dir && dir[0]) return ct_model_load(m, dir, max_pos);
  ct_model_config mc;
  int rc = config_from_spec(&mc, tr->cfg, tr->tok);
  if (!rc) rc = ct_model_init(m, &mc, max_pos);
  if (!rc) ct_model_init_random(m, (uint64_t)tr->cfg->seed, (float)tr->cfg->model.initializer_range);
  return rc;
}

int ct_train_reference(ct_train *tr, ct_frozen *ref, int dtype, int B, int T) {
  const ct_config *c = tr->cfg;
  ct_model m;
  int rc;
  memset(ref, 0, sizeof *ref);
  if (c->use_peft) {  // the base, adapters off (ct_frozen_through)
    ct_log_info(&tr->log, "reference: the base, adapters off, through the policy's activations (no copy)");
    const ct_ident *base = ct_train_frozen_find(tr, "base");  // (ct_train_memory recorded it)
    if (!base) return ct_set_error(CT_EINVAL, "reference: the LoRA base is not loaded yet (ct_train_memory)");
    ct_ident id = *base;
    snprintf(id.role, sizeof id.role, "reference");
    rc = ct_frozen_view(ref, &tr->model, 0, T);
    return rc ? rc : ct_train_frozen_record(tr, &id);
  }
  if (c->ref_model_path[0]) {
    if ((rc = check_dir(c, "ref_model_path", c->ref_model_path))) return rc;
    rc = ct_frozen_open(ref, c->ref_model_path, dtype, B, T);
  } else {
    if (!tr->resumed_from[0]) {  // the starting policy, as it is now
      rc = ct_model_init(&m, &tr->model.cfg, T);
      if (!rc) memcpy(m.params, tr->model.params, sizeof(float) * m.n_floats);
    } else {
      rc = load_model_or_spec(tr, &m, c->model_path);
    }
    if (!rc) rc = ct_frozen_init(ref, &m, dtype, B, T);
  }
  if (!rc && tr->bf16 && (rc = ct_frozen_compute_bf16(ref))) ct_frozen_free(ref);
  if (rc) return ct_wrap_error(rc, "reference model");
  if (ref->cfg.vocab_size != tr->model.cfg.vocab_size) {
    ct_frozen_free(ref);
    return ct_set_error(CT_EINVAL, "the reference model has %d tokens of vocabulary, the policy %d",
                        ref->cfg.vocab_size, tr->model.cfg.vocab_size);
  }
  ct_ident id;  // as built, before a synced reference's weights are read over it
  bool own = c->ref_model_path[0];
  ct_ident_set(&id, "reference", own ? "ref_model_path" : "model_path", own ? c->ref_model_path : c->model_path,
               "ref_dtype", ct_store_names[dtype], ct_frozen_checksum(ref));
  if ((rc = ct_train_frozen_record(tr, &id))) {
    ct_frozen_free(ref);
    return rc;
  }
  char p[CT_PATH_MAX];
  if (tr->resumed_from[0] && c->sync_ref_model &&
      !(rc = ct_path_join(p, sizeof p, tr->resumed_from, "ref_model.safetensors"))) {
    rc = ct_load_tensors(&ct_model_tensors(&ref->model), ct_frozen_params(ref), p, NULL);
    if (rc) ct_frozen_free(ref);
    else ct_frozen_params_changed(ref);
  }
  return rc;
}

void ct_train_plan_reference(const ct_train *tr, ct_plan *p, int B, int T) {
  const ct_config *c = tr->cfg;
  if (c->use_peft) return;  // no memory of its own (ct_train_reference)
  ct_plan_addf(p, ct_frozen_bytes(&tr->model.cfg, (int)c->ref_dtype, B, T) +
                     (tr->bf16 ? ct_frozen_bf16_bytes(&tr->model.cfg, (int)c->ref_dtype, B, T) : 0),
               "reference model (%s%s)%s", ct_store_names[c->ref_dtype], tr->bf16 ? ", bf16 compute" : "",
               c->precompute_ref_log_probs ? ", freed after its pass" : "");
}

int ct_train_eval_lm(ct_train *tr, ct_acts *a, ct_head *h, ct_batch *b, int *seqs, const ct_dataset *ev) {
  int B = (int)tr->cfg->per_device_eval_batch_size, rc = 0;
  ct_lm_stats st = {0};
  long batches = (ev->n_seq + (long)B * tr->world - 1) / ((long)B * tr->world), done = 0;
  ct_log_phase(&tr->log, tr->step, "evaluating", 0, batches, "batches", 0, NULL);
  for (int first = tr->rank * B; first < ev->n_seq && !rc; first += B * tr->world) {
    int n = 0;
    for (int s = first; s < ev->n_seq && n < B; s++) seqs[n++] = s;
    ct_batch_fill(b, ev, seqs, n, ct_tokenizer_pad(tr->tok));
    rc = ct_lm_step(&tr->model, a, h, b, NULL, 0, 0, &st);
    ct_log_phase(&tr->log, tr->step, "evaluating", ++done, batches, "batches", st.tokens, NULL);
  }
  if (rc || (rc = ct_dist_sum_stats(&st))) return rc;
  double t = st.targets > 0 ? st.targets : 1, seq = st.seq_ok / (st.seqs > 0 ? st.seqs : 1);
  ct_log_info(&tr->log, "eval at step %ld: loss %.4f, token accuracy %.4f, sequence accuracy %.4f", tr->step,
              st.loss / t, st.correct / t, seq);
  json_t *j = json_pack("{s:I,s:f,s:f,s:f,s:f}", "step", (json_int_t)tr->step, "eval_loss", st.loss / t,
                        "eval_mean_token_accuracy", st.correct / t, "eval_entropy", st.entropy / t,
                        "eval_sequence_accuracy", seq);
  int D = a->mtp ? tr->model.cfg.mtp_layers : 0;
  if (D) {  // multi-token prediction: depth k's predictions that equal the main model's greedy token
    ct_log_info(&tr->log, "eval at step %ld: mtp loss %.4f, acceptance rate %.4f", tr->step,
                ct_mtp_mean_loss(&st.mtp, D), ct_mtp_acceptance(&st.mtp, D, 0));
    json_object_set_new(j, "eval_mtp_loss", json_real(ct_mtp_mean_loss(&st.mtp, D)));
    json_object_set_new(j, "eval_mtp_acceptance_rate", json_real(ct_mtp_acceptance(&st.mtp, D, 0)));
    for (int k = 1; k <= D && D > 1; k++) {
      char key[64];
      snprintf(key, sizeof key, "eval_mtp_acceptance_rate_%d", k);
      json_object_set_new(j, key, json_real(ct_mtp_acceptance(&st.mtp, D, k)));
    }
  }
  return ct_log_metrics(&tr->log, j);
}

int ct_train_check_reference(const ct_config *c) {
  if (c->use_peft && (c->ref_model_path[0] || c->ref_dtype != CT_STORE_F32 || c->sync_ref_model)) {
    const char *key = c->ref_model_path[0] ? "ref_model_path" : c->sync_ref_model ? "sync_ref_model" : "ref_dtype";
    return ct_set_error(CT_ECONFIG, "%s: key '%s': with use_peft the reference is the base model itself "
                        "(adapters off), held as base_dtype", ct_config_origin(c, key), key);
  }
  if (c->sync_ref_model && c->ref_dtype != CT_STORE_F32)
    return ct_set_error(CT_ECONFIG, "%s: key 'ref_dtype': sync_ref_model mixes the policy into the "
                        "reference's weights, which needs ref_dtype float32", ct_config_origin(c, "ref_dtype"));
  return 0;
}

int ct_train_sync_reference(ct_train *tr, ct_frozen *ref, double alpha) {
  float *r = ct_frozen_params(ref);
  if (!r || ref->model.n_floats != tr->model.n_floats)
    return ct_set_error(CT_EINVAL, "sync_ref_model needs a float32 reference with the policy's architecture");
  float a = (float)alpha;
  const float *p = tr->model.params;
  for (long i = 0; i < ref->model.n_floats; i++) r[i] = (1 - a) * r[i] + a * p[i];
  ct_frozen_params_changed(ref);
  return 0;
}

int ct_train_save_reference(const ct_frozen *ref, const char *dir) {
  char p[CT_PATH_MAX];
  const float *bufs[] = {ref->model.params};
  int rc = ct_path_join(p, sizeof p, dir, "ref_model.safetensors");
  return rc ? rc : ct_save_tensors(&ct_model_tensors(&ref->model), 1, bufs, NULL, p, CT_DT_F32);
}

// A checkpoint's files against the checksums its trainer_state.json recorded ("files":
// {name: {"bytes", "xxh64"}}; older checkpoints have none and are not checked).
static int verify_files(const char *dir, json_t *files) {
  const char *name;
  json_t *f;
  json_object_foreach(files, name, f) {
    char p[CT_PATH_MAX];
    uint64_t h;
    long size;
    const char *want = json_string_value(json_object_get(f, "xxh64"));
    json_int_t bytes = json_integer_value(json_object_get(f, "bytes"));
    int rc = ct_path_join(p, sizeof p, dir, name);
    if (rc) return rc;
    if (access(p, R_OK))
      return ct_set_error(CT_EFORMAT, "%s: missing (trainer_state.json lists it): the checkpoint is "
                          "incomplete; resume from another one", p);
    if ((rc = ct_file_checksum(p, &h, &size))) return rc;
    char got[20];
    snprintf(got, sizeof got, "%016llx", (unsigned long long)h);
    if (!want || size != bytes || strcmp(got, want))
      return ct_set_error(CT_EFORMAT, "%s: changed since it was saved (%ld bytes, xxh64 %s; saved: %lld "
                          "bytes, xxh64 %s): the checkpoint is damaged; resume from another one", p,
                          size, got, (long long)bytes, want ? want : "?");
  }
  return 0;
}

// A hex string of 1 to 16 digits -> *v.
static bool parse_hex64(const char *s, uint64_t *v) {
  if (!s || !*s || strlen(s) > 16 || strspn(s, "0123456789abcdefABCDEF") != strlen(s)) return false;
  *v = strtoull(s, NULL, 16);
  return true;
}

static int read_trainer_state(ct_train *tr, const char *dir) {
  char path[CT_PATH_MAX];
  int rc = ct_path_join(path, sizeof path, dir, "trainer_state.json");
  if (rc) return rc;
  json_error_t err;
  json_t *j = json_load_file(path, 0, &err);
  if (!j) return ct_set_error(CT_EFORMAT, "%s: %s", path, err.text);
  json_t *ct = json_object_get(j, "ctune");
  json_t *rng = json_object_get(ct, "rng"), *files = json_object_get(ct, "files");
  json_t *frozen = json_object_get(ct, "frozen");  // NULL: saved before identities were recorded
  const char *bad = NULL;
  if (!json_is_integer(json_object_get(j, "global_step")) || !json_is_array(rng) || json_array_size(rng) != 4) {
    rc = ct_set_error(CT_EFORMAT, "%s: not a ctune trainer state (global_step, ctune.rng missing)", path);
    goto done;
  }
  tr->step = (long)json_integer_value(json_object_get(j, "global_step"));
  tr->epoch = (long)json_integer_value(json_object_get(ct, "epoch"));
  tr->epoch_pos = (long)json_integer_value(json_object_get(ct, "epoch_pos"));
  tr->n_seq = (int)json_integer_value(json_object_get(ct, "n_seq"));
  tr->num_tokens = json_number_value(json_object_get(ct, "num_tokens"));
  tr->global_batch = (int)json_integer_value(json_object_get(ct, "global_batch"));  // 0: older state
  tr->saved_diloco_ranks = (int)json_integer_value(json_object_get(ct, "diloco_ranks"));  // 0: none
  const char *opt = json_string_value(json_object_get(ct, "optimizer"));  // NULL: older state, AdamW
  const char *want = ct_optimizer_names[tr->cfg->optimizer];
  if (strcmp(opt ? opt : "adamw", want)) {
    rc = ct_set_error(CT_ECONFIG, "%s: the checkpoint's optimizer state is %s's, and optimizer is %s; resume "
                      "with optimizer: %s", path, opt ? opt : "adamw", want, opt ? opt : "adamw");
    goto done;
  }
  bool zero = true;
  for (int i = 0; i < 4 && !bad; i++) {
    if (!parse_hex64(json_string_value(json_array_get(rng, i)), &tr->rng.s[i])) bad = "ctune.rng (16 hex digits each)";
    zero = zero && tr->rng.s[i] == 0;
  }
  const char *hash = json_string_value(json_object_get(ct, "data_hash"));
  if (!bad && hash && !parse_hex64(hash, &tr->data_hash)) bad = "ctune.data_hash";
  bad = bad                                          ? bad
        : zero                                       ? "ctune.rng (all zero)"
        : tr->step < 0                               ? "global_step"
        : tr->epoch < 0                              ? "ctune.epoch"
        : tr->n_seq < 0                              ? "ctune.n_seq"
        : tr->epoch_pos < 0 || tr->epoch_pos > tr->n_seq ? "ctune.epoch_pos (past the end of the data)"
        : !(tr->num_tokens >= 0)                     ? "ctune.num_tokens"
        : tr->global_batch < 0                       ? "ctune.global_batch"
        : tr->saved_diloco_ranks < 0                 ? "ctune.diloco_ranks"
        : files && !json_is_object(files)            ? "ctune.files"
        : frozen && (!json_is_object(frozen) || json_object_size(frozen) > CT_TRAIN_FROZEN_MAX) ? "ctune.frozen"
                                                     : NULL;
  if (bad) rc = ct_set_error(CT_EFORMAT, "%s: %s is out of range or unreadable: the trainer state is damaged; "
                             "resume from another checkpoint", path, bad);
  else if (files) rc = verify_files(dir, files);
  const char *role;
  json_t *id;
  tr->n_saved_frozen = 0;
  json_object_foreach(frozen, role, id) {
    if (rc) break;
    rc = ct_ident_parse(&tr->saved_frozen[tr->n_saved_frozen++], role, id, path);
  }
done:
  json_decref(j);
  return rc;
}

// A checkpoint holds LoRA adapters or a whole model: use_peft must say the same.
static int check_resume_kind(const ct_train *tr) {
  const char *d = tr->resumed_from;
  bool adapters = ct_path_has_file(d, "adapter_model.safetensors");
  if (adapters && !tr->cfg->use_peft)
    return ct_set_error(CT_ECONFIG, "%s: key 'use_peft': %s holds a LoRA adapter (adapter_model.safetensors), "
                        "not a model; resume it with use_peft: true and its base as model_path",
                        ct_config_origin(tr->cfg, "use_peft"), d);
  if (!adapters && tr->cfg->use_peft && ct_path_has_file(d, "model.safetensors"))
    return ct_set_error(CT_ECONFIG, "%s: key 'use_peft': %s holds a whole model (model.safetensors), not LoRA "
                        "adapters; resume it with use_peft: false", ct_config_origin(tr->cfg, "use_peft"), d);
  return 0;
}

static int resolve_resume(ct_train *tr) {
  const char *r = tr->cfg->resume_from_checkpoint;
  if (!r[0]) return 0;
  if (strcmp(r, "latest") == 0) {
    long step;
    int rc = ct_ckpt_latest(tr->cfg->output_dir, tr->resumed_from, sizeof tr->resumed_from, &step);
    return rc ? rc : check_resume_kind(tr);
  }
  if (!ct_path_has_file(r, "trainer_state.json"))
    return ct_set_error(CT_EIO, "%s: key 'resume_from_checkpoint': %s is not a checkpoint "
                        "(no trainer_state.json)", ct_config_origin(tr->cfg, "resume_from_checkpoint"), r);
  snprintf(tr->resumed_from, sizeof tr->resumed_from, "%s", r);
  return check_resume_kind(tr);
}

// Whether two existing paths name the same directory.
static bool same_dir(const char *a, const char *b) {
  struct stat sa, sb;
  return a[0] && b[0] && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// output_dir for this run alone: created, locked (a second run on it stops naming this
// one's pid), not one of the run's inputs (the final save would overwrite them), and
// cleared of what a killed save left (.tmp-*).
static int claim_output_dir(ct_train *tr) {
  const ct_config *c = tr->cfg;
  int rc = ct_mkdirs(c->output_dir), fd, removed;
  if (rc || (rc = ct_ckpt_lock(c->output_dir, &fd))) return rc;
  tr->lock_fd1 = fd + 1;
  const char *inputs[] = {"model_path", "tokenizer_path", "adapter_path", "teacher_path", "ref_model_path"};
  const char *dirs[] = {c->model_path, c->tokenizer_path, c->adapter_path, c->teacher_path, c->ref_model_path};
  for (int i = 0; i < 5; i++)
    if (same_dir(dirs[i], c->output_dir))
      return ct_set_error(CT_ECONFIG, "%s: key '%s' is output_dir (%s): saving would overwrite the "
                          "files this run reads; choose another output_dir",
                          ct_config_origin(c, inputs[i]), inputs[i], c->output_dir);
  if ((rc = ct_ckpt_clean(c->output_dir, &removed))) return rc;
  if (removed)
    ct_log_info(&tr->log, "removed %d unfinished save%s (.tmp-*) left in %s by an earlier run", removed,
                removed == 1 ? "" : "s", c->output_dir);
  return 0;
}

// The adapters' config from the keys (use_peft without adapter_path).
static ct_lora_config lora_config_of(const ct_config *c) {
  ct_lora_config lc = {.r = (int)c->lora_r, .alpha = c->lora_alpha, .rslora = c->use_rslora,
                       .dropout = c->lora_dropout};
  for (int i = 0; i < c->lora_target_modules.n; i++) {
    const char *nm = c->lora_target_modules.v[i];
    for (int t = 0; t < CT_LORA_TARGETS; t++)
      if (!strcmp(nm, ct_lora_target_names[t]) || !strcmp(nm, "all-linear")) lc.targets |= 1u << t;
  }
  for (int i = 0; i < c->lora_modules_to_save.n; i++) {
    lc.save_embed |= !strcmp(c->lora_modules_to_save.v[i], "embed_tokens");
    lc.save_head |= !strcmp(c->lora_modules_to_save.v[i], "lm_head");
  }
  lc.save_score = c->trainer == CT_TRAINER_REWARD;  // PEFT's SEQ_CLS: the score head trains in full, saved
  return lc;
}

// An adapter being continued (adapter_path, or a checkpoint) against the lora_* keys the
// user set: its adapter_config.json decides, so a set key that differs is an error.
static int check_adapter_keys(const ct_config *c, const ct_lora_config *have, const char *dir) {
  ct_lora_config want = lora_config_of(c);
  const char *key = ct_config_is_set(c, "lora_r") && want.r != have->r                  ? "lora_r"
                    : ct_config_is_set(c, "lora_alpha") && want.alpha != have->alpha    ? "lora_alpha"
                    : ct_config_is_set(c, "use_rslora") && want.rslora != have->rslora  ? "use_rslora"
                    : ct_config_is_set(c, "lora_dropout") && want.dropout != have->dropout ? "lora_dropout"
                    : ct_config_is_set(c, "lora_target_modules") && want.targets != have->targets
                        ? "lora_target_modules"
                    : ct_config_is_set(c, "lora_modules_to_save") &&
                            (want.save_embed != have->save_embed || want.save_head != have->save_head)
                        ? "lora_modules_to_save"
                        : NULL;
  if (!key) return 0;
  return ct_set_error(CT_ECONFIG, "%s: key '%s' differs from the adapter in %s, whose "
                      "adapter_config.json decides (r %d, alpha %g, dropout %g); drop the key",
                      ct_config_origin(c, key), key, dir, have->r, have->alpha, have->dropout);
}

// bf16: true needs bf16 hardware (an error naming the key without it); auto uses it when
// there and says when it is not. A LoRA base gets a bf16 copy made once (float32) or
// multiplies from its stored bf16 weights (bfloat16); an int8 base has no bf16 form.
static int bf16_setup(ct_train *tr) {
  const ct_config *c = tr->cfg;
  if (c->bf16 == CT_BF16_FALSE) return 0;
  if (c->use_peft && c->base_dtype == CT_STORE_INT8)
    return ct_set_error(CT_ECONFIG, "%s: key 'bf16': with base_dtype int8 the base multiplies from its int8 "
                        "weights; use base_dtype bfloat16 or float32 with bf16, or bf16: false",
                        ct_config_origin(c, "bf16"));
  if (c->bf16 == CT_BF16_AUTO && !ct_dnnl_bf16_cpu()) {
    ct_log_info(&tr->log, "bf16: auto: this CPU has no AVX512_BF16 or AMX-BF16; computing in float32");
    return 0;
  }
  if (ct_dnnl_init()) return ct_wrap_error(CT_ECONFIG, "%s: key 'bf16'", ct_config_origin(c, "bf16"));
  tr->bf16 = true;
  ct_log_info(&tr->log, "bf16: matmuls in bfloat16 (oneDNN), float32 sums, master weights and optimizer state");
  return 0;
}

// bin/reward trains a sequence classifier (a causal LM's backbone gets a new score head);
// every other trainer trains causal LMs and refuses a reward model.
static int model_kind(const ct_config *c, ct_model_config *mc, const char *dir) {
  if (c->trainer == CT_TRAINER_REWARD) {
    mc->num_labels = 1;
    return 0;
  }
  if (mc->num_labels)
    return ct_set_error(CT_ECONFIG, "%s: %s is a sequence-classification model (a reward model); %s trains "
                        "causal language models (use it in GRPO's reward_funcs)", ct_config_origin(c, "model_path"),
                        dir, ct_trainer_name(c->trainer));
  return 0;
}

static int overlap_setup(ct_train *tr, long cap);  // (with ct_train_update)
static void overlap_free(ct_train *tr);

int ct_train_setup(ct_train *tr, ct_config *cfg) {
  memset(tr, 0, sizeof *tr);
  tr->cfg = cfg;
  tr->rank = ct_dist_rank();
  tr->world = ct_dist_world();
  tr->log.active = tr->rank == 0;  // until ct_train_schedule opens the metrics file
  int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
  int threads = cfg->num_threads > 0 ? (int)cfg->num_threads : cores / ct_dist_local_size();
  if (threads > cores && cores > 0) {  // more spin-waiting threads than cores: every step crawls
    ct_log_info(&tr->log, "num_threads %d is more than this machine's %d cores: using %d", threads, cores, cores);
    threads = cores;
  }
  int rc = ct_pool_init(threads > 0 ? threads : 1);
  if (!rc) rc = bf16_setup(tr);
  if (!rc && tr->rank == 0) rc = claim_output_dir(tr);
  if (!rc) rc = resolve_resume(tr);
  if (!rc) rc = load_tokenizer(tr);
  if (rc) return rc;
  // the model's shape only: its buffers wait for the memory plan (ct_train_memory)
  ct_model_config mc;
  // (a LoRA checkpoint holds adapters only: its base is model_path's)
  const char *dir = tr->resumed_from[0] && !cfg->use_peft ? tr->resumed_from : cfg->model_path;
  rc = dir[0] ? ct_model_read_config(&mc, dir) : config_from_spec(&mc, cfg, tr->tok);
  if (!rc && dir[0]) rc = check_spec_keys(cfg, &mc, dir);
  if (!rc) rc = model_kind(cfg, &mc, dir);
  mc.mtp_layers = (int)cfg->mtp_num_layers;  // (not in config.json: mtp.h)
  if (!rc) rc = ct_model_layout(&tr->model, &mc);
  if (rc) return rc;
  if (cfg->optimizer == CT_OPT_MUON && !ct_muon_count(&(ct_layout){tr->model.n_tensors, tr->model.tensors, 0}))
    return ct_set_error(CT_ECONFIG, "%s: key 'optimizer': muon trains the decoder layers' matrices, and this "
                        "model has none (%d layers); use optimizer: adamw", ct_config_origin(cfg, "optimizer"),
                        mc.num_layers);
  int dropped, had = ct_tokenizer_vocab_size(tr->tok);
  if (ct_tokenizer_fit(tr->tok, mc.vocab_size, &dropped))
    return ct_wrap_error(CT_EINVAL, "the tokenizer has %d tokens but the model's vocab_size is %d", had,
                         mc.vocab_size);
  if (dropped)
    ct_log_info(&tr->log, "tokenizer: %d added token%s past the model's vocab_size %d left out (read as plain text)",
                dropped, dropped > 1 ? "s" : "", mc.vocab_size);
  if (cfg->use_peft && !cfg->adapter_path[0] && !tr->resumed_from[0]) {  // the adapters' keys vs this base
    ct_lora_config lc = lora_config_of(cfg);
    if (ct_lora_config_check(&lc, &mc))
      return ct_wrap_error(CT_ECONFIG, "%s", ct_config_origin(cfg, cfg->lora_modules_to_save.n ? "lora_modules_to_save" : "use_peft"));
  } else if (cfg->use_peft) {  // an adapter to continue: does it fit this base? (before any big read)
    const char *from = tr->resumed_from[0] ? tr->resumed_from : cfg->adapter_path;
    ct_lora probe;
    if ((rc = ct_lora_load(&probe, from, &mc))) return rc;
    rc = check_adapter_keys(cfg, &probe.cfg, from);
    ct_lora_free(&probe);
    if (rc) return rc;
  }
  tr->adam = (ct_adamw){cfg->adam_beta1, cfg->adam_beta2, cfg->adam_epsilon, cfg->weight_decay};
  ct_rng_seed(&tr->rng, (uint64_t)cfg->seed * 0x9e3779b97f4a7c15ULL + 1);
  if (tr->resumed_from[0] && (rc = read_trainer_state(tr, tr->resumed_from))) return rc;
  int saved = tr->saved_diloco_ranks;  // (checked before anything big is read)
  if (cfg->diloco_inner_steps > 0 && saved && saved != tr->world)
    return ct_set_error(CT_ECONFIG, "%s was saved by %d DiLoCo ranks, each with its own AdamW moments; "
                        "resume it with mpirun -np %d", tr->resumed_from, saved, saved);
  if (tr->rank == 0) {
    char p[CT_PATH_MAX];
    rc = ct_path_join(p, sizeof p, cfg->output_dir, "config.yml");
    if (!rc) rc = ct_config_write_yaml(cfg, p);
  }
  return rc;
}

// The adapters: the checkpoint's (resuming), adapter_path's, or new ones from the keys.
static int lora_setup(ct_train *tr) {
  const ct_config *c = tr->cfg;
  const char *from = tr->resumed_from[0] ? tr->resumed_from : c->adapter_path;
  if (from[0]) return ct_lora_load(&tr->lora, from, &tr->model.cfg);
  ct_lora_config lc = lora_config_of(c);
  int rc = ct_lora_init(&tr->lora, &lc, &tr->model.cfg);
  if (rc) return ct_wrap_error(CT_ECONFIG, "%s: key 'use_peft'", ct_config_origin(c, "use_peft"));
  ct_lora_init_weights(&tr->lora, &tr->model, (uint64_t)c->seed);
  return 0;
}

// The optimizer's rows of the plan for `trained_bytes` of trained float32 weights: the
// moments (this rank's shard with optimizer_sharding; a checkpoint passes the other
// shards through the gradient buffer), DiLoCo's outer state.
static int plan_optimizer(const ct_train *tr, ct_plan *p, double trained_bytes) {
  const ct_config *c = tr->cfg;
  if (c->optimizer_sharding) {
    ct_shard s;
    int rc = ct_dist_shard_init(&s, (long)(trained_bytes / sizeof(float)));
    if (rc) return rc;
    double frac = s.n ? (double)(s.hi - s.lo) / (double)s.n : 0;
    ct_plan_addf(p, 2 * trained_bytes * frac, "AdamW moments (2 x float32), shard %d of %d", tr->rank + 1,
                 tr->world);
    ct_dist_shard_free(&s);
  } else if (c->optimizer == CT_OPT_MUON) {  // the matrices' second moment: allocated, unused
    ct_plan_add(p, "Muon momentum + AdamW moments (2 x float32)", 2 * trained_bytes);
    ct_layout L = {tr->model.n_tensors, tr->model.tensors, 0};
    ct_plan_add(p, "Muon Newton-Schulz scratch (largest matrix)", sizeof(float) * (double)ct_muon_work_floats(&L));
  } else {
    ct_plan_add(p, "AdamW moments (2 x float32)", 2 * trained_bytes);
  }
  if (c->diloco_inner_steps > 0) ct_plan_add(p, "DiLoCo: weights at the last sync, outer momentum", 2 * trained_bytes);
  return 0;
}

// The file of optimizer state rank `r` reads and writes: rank 0 and every rank of a run
// whose ranks share their moments, optimizer.safetensors; a DiLoCo rank r > 0 its own.
static void optimizer_file(char *name, size_t n, int r) {
  if (r == 0) snprintf(name, n, "optimizer.safetensors");
  else snprintf(name, n, "optimizer-rank%d.safetensors", r);
}

// A resumed run's optimizer state: the moments (this rank's shard of them, read through
// the still-zero gradient buffer), and DiLoCo's outer momentum (θ_start is the model read).
static int load_optimizer(ct_train *tr) {
  const ct_config *c = tr->cfg;
  char p[CT_PATH_MAX], name[64];
  int diloco_ranks = tr->saved_diloco_ranks, rc;
  bool diloco = c->diloco_inner_steps > 0;
  optimizer_file(name, sizeof name, diloco && diloco_ranks ? tr->rank : 0);
  if ((rc = ct_path_join(p, sizeof p, tr->resumed_from, name))) return rc;
  float *bufs[] = {tr->mom1, tr->mom2};
  const char *suffixes[] = {".exp_avg", ".exp_avg_sq"};
  for (int i = 0; i < 2; i++) {
    if (!tr->shard.n) {
      if ((rc = ct_load_tensors(&tr->trained, bufs[i], p, suffixes[i]))) return rc;
      continue;
    }
    rc = ct_load_tensors(&tr->trained, tr->grads, p, suffixes[i]);
    if (!rc) memcpy(bufs[i], tr->grads + tr->shard.lo, sizeof(float) * (size_t)(tr->shard.hi - tr->shard.lo));
    memset(tr->grads, 0, sizeof(float) * (size_t)tr->trained.n_floats);
    if (rc) return rc;
  }
  if (diloco && diloco_ranks) {
    optimizer_file(name, sizeof name, 0);
    if ((rc = ct_path_join(p, sizeof p, tr->resumed_from, name)) ||
        (rc = ct_load_tensors(&tr->trained, tr->outer_mom, p, ".outer_momentum")))
      return rc;
  }
  return 0;
}

// Multi-token prediction's weights beside a model read from dir: its mtp.safetensors, or
// (a model trained without MTP) new ones from the seeded initialization, as a model built
// from scratch gets them; a checkpoint must have them (its moments do).
static int mtp_weights(ct_train *tr, const char *dir) {
  ct_model *m = &tr->model;
  bool found;
  int rc = ct_mtp_load(m, m->params, dir, &found);
  if (rc || found) return rc;
  if (tr->resumed_from[0])
    return ct_set_error(CT_ECONFIG, "%s has no mtp.safetensors: it was saved by a run without multi-token "
                        "prediction; resume it with mtp_num_layers: 0", dir);
  ct_model_init_random_from(m, m->n_hf_tensors, (uint64_t)tr->cfg->seed, (float)tr->cfg->model.initializer_range);
  ct_log_info(&tr->log, "multi-token prediction: %s has no mtp.safetensors; %d new depth%s initialized", dir,
              m->cfg.mtp_layers, m->cfg.mtp_layers > 1 ? "s" : "");
  return 0;
}

int ct_train_memory(ct_train *tr, ct_plan *p, const char *knobs, bool *dry) {
  const ct_config *cfg = tr->cfg;
  ct_model *m = &tr->model;
  bool peft = cfg->use_peft, bf16 = peft && cfg->base_dtype == CT_STORE_BF16, i8 = peft && cfg->base_dtype == CT_STORE_INT8;
  double trained_bytes;
  if (peft) {
    ct_lora_config lc = lora_config_of(cfg);
    if (cfg->adapter_path[0] && ct_lora_read_config(&lc, cfg->adapter_path)) return CT_EFORMAT;
    trained_bytes = ct_lora_bytes(&lc, &m->cfg);
    ct_plan_addf(p, bf16 ? ct_model_bf16_bytes(m, true) : i8 ? ct_model_int8_bytes(m) : ct_model_param_bytes(m, false),
                 "base model (%s, frozen)", bf16 ? "bfloat16, embeddings float32" : i8 ? "int8, embeddings float32" : "float32");
    ct_plan_addf(p, trained_bytes, "LoRA adapters, rank %d", lc.r);
  } else {
    trained_bytes = ct_model_param_bytes(m, false);
    ct_plan_add(p, "policy parameters (float32)", trained_bytes);
  }
  ct_plan_add(p, "gradients (float32)", trained_bytes);
  int rc = plan_optimizer(tr, p, trained_bytes);
  if (rc) return rc;
  if (tr->bf16 && !bf16) ct_plan_add(p, "bf16 weight copy for the matmuls", ct_model_param_bytes(m, true));
  ct_plan_add_resident(p);
  *dry = cfg->dry_run;
  bool over_memory;
  rc = ct_plan_check(p, &tr->log, ct_dist_local_size(), knobs, &over_memory);
  const char *from = tr->resumed_from[0] && !peft ? tr->resumed_from : cfg->model_path;
  if (rc == CT_ENOMEM && over_memory) {  // name what made it big (not for an address-space limit)
    char size[320];
    ct_model_size_text(&m->cfg, size, sizeof size);
    return ct_wrap_error(rc, "%s%s: %s", from, from[0] ? "/config.json" : "the `model:` keys", size);
  }
  if (rc || *dry) {
    if (!rc) ct_log_info(&tr->log, "dry run: nothing allocated");
    return rc;
  }
  double t0 = ct_now();
  if ((rc = ct_model_alloc(m, rope_positions(cfg)))) return rc;
  // with LoRA a checkpoint holds the adapters only: the base always comes from model_path
  const char *dir = from;
  if (dir[0]) rc = ct_model_load_weights(m, m->params, dir);
  else ct_model_init_random(m, (uint64_t)cfg->seed, (float)cfg->model.initializer_range);
  if (!rc && dir[0] && m->cfg.mtp_layers) rc = mtp_weights(tr, dir);
  if (!rc && dir[0] && !m->cfg.mtp_layers && ct_path_has_file(dir, "mtp.safetensors"))
    ct_log_info(&tr->log, "%s has multi-token prediction depths (mtp.safetensors); mtp_num_layers is 0, so "
                "they are neither trained nor saved", dir);
  if (rc) return rc;
  if (dir[0])
    ct_log_info(&tr->log, "weights read from %s in %.2f s", dir, ct_now() - t0);
  if (peft) {
    if ((rc = lora_setup(tr))) return rc;
    if (bf16 && (rc = ct_model_to_bf16(m, true))) return rc;
    if (i8 && (rc = ct_model_to_int8(m))) return rc;
    ct_ident base;  // (as stored: after the narrowing to base_dtype)
    ct_ident_set(&base, "base", "model_path", cfg->model_path, "base_dtype", ct_store_names[cfg->base_dtype],
                 ct_model_checksum(m));
    if ((rc = ct_train_frozen_record(tr, &base))) return rc;
    tr->trained = ct_lora_tensors(&tr->lora);
    tr->params = tr->lora.params;
  } else {
    tr->trained = ct_model_tensors(m);
    tr->params = m->params;
  }
  // from the weights just read; a bfloat16 LoRA base is its own bf16 copy
  if (tr->bf16 && (rc = ct_model_bf16_compute(m))) return rc;
  size_t bytes = sizeof(float) * tr->trained.n_floats;
  if (cfg->optimizer_sharding && (rc = ct_dist_shard_init(&tr->shard, tr->trained.n_floats))) return rc;
  size_t mbytes = cfg->optimizer_sharding ? sizeof(float) * (size_t)(tr->shard.hi - tr->shard.lo) : bytes;
  tr->grads = ct_big_alloc(bytes);  // zeroed
  tr->mom1 = ct_big_alloc(mbytes ? mbytes : 1);
  tr->mom2 = ct_big_alloc(mbytes ? mbytes : 1);
  if (!tr->grads || !tr->mom1 || !tr->mom2)
    return ct_set_error(CT_ENOMEM, "cannot allocate %.1f MB for gradients and optimizer moments",
                        (bytes + 2.0 * mbytes) / 1e6);
  if (cfg->qk_clip_threshold > 0 && (rc = ct_qkclip_init(&tr->qkclip, &m->cfg, (float)cfg->qk_clip_threshold)))
    return rc;
  if (cfg->optimizer == CT_OPT_MUON) {
    size_t wb = sizeof(float) * (size_t)ct_muon_work_floats(&tr->trained);
    if (!(tr->muon_work = ct_big_alloc(wb ? wb : 1)))
      return ct_set_error(CT_ENOMEM, "cannot allocate %.1f MB for Muon's scratch", wb / 1e6);
  }
  if (cfg->diloco_inner_steps > 0) {
    tr->outer_start = ct_big_alloc(bytes);
    tr->outer_mom = ct_big_alloc(bytes);  // zeroed
    if (!tr->outer_start || !tr->outer_mom)
      return ct_set_error(CT_ENOMEM, "cannot allocate %.1f MB for DiLoCo's outer state", 2.0 * bytes / 1e6);
    memcpy(tr->outer_start, tr->params, bytes);
    ct_log_info(&tr->log, "DiLoCo: %ld local %s steps between syncs of %d ranks, outer Nesterov lr %g, "
                "momentum %g", (long)cfg->diloco_inner_steps, cfg->optimizer == CT_OPT_MUON ? "Muon" : "AdamW",
                tr->world, cfg->diloco_outer_lr,
                cfg->diloco_outer_momentum);
  }
  if (peft) {  // every base weight frozen: gradient views all NULL
    tr->g.layers = calloc(m->cfg.num_layers, sizeof *tr->g.layers);
    if (!tr->g.layers) return ct_set_error(CT_ENOMEM, "out of memory");
    ct_lora_bind_grads(&tr->lora, tr->grads);
  } else if ((rc = ct_weights_bind(&tr->g, m, tr->grads))) {
    return rc;
  }
  long cap = (long)(cfg->ddp_bucket_cap_mb * (1 << 20) / sizeof(float));
  if (cap > 0 && tr->world > 1 && !cfg->optimizer_sharding && cfg->diloco_inner_steps == 0 &&
      (rc = overlap_setup(tr, cap)))
    return rc;
  return tr->resumed_from[0] ? load_optimizer(tr) : 0;
}

int ct_train_attach(const ct_train *tr, ct_acts *a) {
  a->qk_max = a->mode != CT_ACTS_FORWARD ? tr->qkclip.max : NULL;
  return ct_acts_attach_lora(a, tr->cfg->use_peft ? &tr->lora : NULL);
}

double ct_train_acts_bytes(const ct_train *tr, int B, int T, int mode) {
  const ct_config *c = tr->cfg;
  double b = ct_acts_bytes(&tr->model.cfg, B, T, mode);
  if (tr->bf16) b += ct_acts_bf16_bytes(&tr->model.cfg, B, T);
  if (c->use_peft) {
    ct_lora_config lc = lora_config_of(c);
    if (c->adapter_path[0]) ct_lora_read_config(&lc, c->adapter_path);
    b += ct_lora_acts_bytes(&lc, &tr->model.cfg, B, T, mode);
  }
  return b;
}

void ct_train_log_fields(const ct_train *tr, json_t *j, double lr, double grad_norm, double tokens_per_s) {
  json_object_set_new(j, "epoch", json_real(tr->epoch + (double)tr->epoch_pos / tr->n_seq));
  json_object_set_new(j, "learning_rate", json_real(lr));
  json_object_set_new(j, "grad_norm", json_real(grad_norm));
  json_object_set_new(j, "num_tokens", json_real(tr->num_tokens));
  json_object_set_new(j, "tokens_per_s", json_real(tokens_per_s));
}

void ct_train_plan_acts(const ct_train *tr, ct_plan *plan, int rows, int eval_rows, int T) {
  bool ckpt = tr->cfg->gradient_checkpointing;
  ct_plan_addf(plan, ct_train_acts_bytes(tr, rows, T, ckpt ? CT_ACTS_RECOMPUTE : CT_ACTS_KEEP),
               "activations, %d x %d tokens (%s)", rows, T, ckpt ? "layer inputs + one layer" : "every layer");
  if (eval_rows > 0)
    ct_plan_addf(plan, ct_train_acts_bytes(tr, eval_rows, T, CT_ACTS_FORWARD), "evaluation activations, %d x %d tokens",
                 eval_rows, T);
}

void ct_train_dropout_key(ct_train *tr, int micro) {
  tr->lora.dropout_key = ((uint64_t)tr->cfg->seed * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)tr->step << 20) ^
                         ((uint64_t)micro << 4) ^ (uint64_t)tr->rank;
}

void ct_train_free(ct_train *tr) {
  ct_log_close(&tr->log);
  ct_lora_free(&tr->lora);
  ct_weights_free(&tr->g);
  ct_model_free(&tr->model);
  ct_big_free(tr->grads);
  ct_big_free(tr->mom1);
  ct_big_free(tr->mom2);
  ct_big_free(tr->muon_work);
  ct_qkclip_free(&tr->qkclip);
  ct_big_free(tr->outer_start);
  ct_big_free(tr->outer_mom);
  ct_dist_shard_free(&tr->shard);
  overlap_free(tr);
  free(tr->order);
  if (tr->tok) ct_tokenizer_free(tr->tok);
  if (tr->lock_fd1) close(tr->lock_fd1 - 1);  // (the lock goes with it)
  memset(tr, 0, sizeof *tr);
}

// This epoch's order: a seeded shuffle of 0..n-1 (seed and epoch alone decide it, so a
// resumed run sees the same order).
static void epoch_order(ct_train *tr) {
  int n = tr->n_seq;
  for (int i = 0; i < n; i++) tr->order[i] = i;
  if (!tr->cfg->shuffle_dataset) return;
  ct_rng r;
  ct_rng_seed(&r, (uint64_t)tr->cfg->seed ^ ((uint64_t)(tr->epoch + 1) << 32));
  for (int i = n - 1; i > 0; i--) {
    int j = (int)ct_rng_below(&r, (uint64_t)i + 1);
    int t = tr->order[i];
    tr->order[i] = tr->order[j];
    tr->order[j] = t;
  }
}

// A resumed run against its checkpoint: the same data (count and content) and the same
// global batch, or the promised data order would silently not hold.
static int check_resume_plan(const ct_train *tr, int n_seq, int global, uint64_t data_hash) {
  const char *from = tr->resumed_from;
  if (tr->n_seq != n_seq)
    return ct_set_error(CT_EINVAL, "%s was saved with %d training sequences per epoch, the "
                        "dataset now gives %d: resuming would not continue the same data order",
                        from, tr->n_seq, n_seq);
  if (tr->data_hash && tr->data_hash != data_hash)
    return ct_set_error(CT_EINVAL, "%s was saved training on other data (the same number of "
                        "sequences, different tokens or order): resuming would not continue the "
                        "same data order; give the dataset (and tokenizer, template, max_length) it "
                        "was trained with", from);
  if (tr->global_batch && tr->global_batch != global)
    return ct_set_error(CT_EINVAL, "%s was saved with a global batch of %d, this run's is %d "
                        "(per_device_train_batch_size x gradient_accumulation_steps x %d ranks): "
                        "resuming would change the data order; keep the product at %d",
                        from, tr->global_batch, global, tr->world, tr->global_batch);
  if (tr->step > tr->total_steps)
    return ct_set_error(CT_EINVAL, "%s is at step %ld, past the %ld steps this run would train; "
                        "raise max_steps or num_train_epochs to continue", from, tr->step, tr->total_steps);
  return 0;
}

int ct_train_schedule(ct_train *tr, int n_seq, int global, uint64_t data_hash) {
  const ct_config *c = tr->cfg;
  long per_epoch = (n_seq + global - 1) / global * (tr->steps_per_batch > 1 ? tr->steps_per_batch : 1);
  tr->total_steps = c->max_steps > 0 ? c->max_steps : (long)ceil(c->num_train_epochs * per_epoch);
  tr->warmup_steps = c->warmup_steps > 0 ? c->warmup_steps : (long)ceil(c->warmup_ratio * tr->total_steps);
  int rc = tr->resumed_from[0] ? check_resume_plan(tr, n_seq, global, data_hash) : 0;
  if (rc) return rc;
  if (tr->resumed_from[0] && tr->step == tr->total_steps)  // killed before its final save
    ct_log_info(&tr->log, "%s is at the last step (%ld): writing the final model", tr->resumed_from, tr->step);
  tr->n_seq = n_seq;
  tr->data_hash = data_hash;
  tr->global_batch = global;
  tr->order = malloc(sizeof(int) * (n_seq > 0 ? n_seq : 1));
  if (!tr->order) return ct_set_error(CT_ENOMEM, "out of memory");
  epoch_order(tr);
  tr->comm0 = ct_dist_bytes_sent();
  tr->step0 = tr->step;
  return ct_log_open(&tr->log, c->output_dir, tr->step, tr->total_steps, tr->rank == 0);
}

int ct_train_next_seqs(ct_train *tr, int *seqs, int global) {
  if (tr->epoch_pos >= tr->n_seq) {
    tr->epoch++;
    tr->epoch_pos = 0;
    epoch_order(tr);
  }
  int n = 0;
  while (n < global && tr->epoch_pos < tr->n_seq) seqs[n++] = tr->order[tr->epoch_pos++];
  return n;
}

// The pre-clip norm from Σg² (a non-finite one is an error), the clipping factor, the
// scheduled learning rate; counts the step.
static int step_scalars(ct_train *tr, double sum_sq, double *grad_norm, float *clip, double *lr) {
  double norm = sqrt(sum_sq), max = tr->cfg->max_grad_norm;
  *grad_norm = norm;
  if (!isfinite(norm))
    return ct_set_error(CT_EINVAL, "step %ld: the gradient norm is %g; stopping before the weights "
                        "are damaged (lower learning_rate, or check the data)", tr->step + 1, norm);
  *clip = max > 0 && norm > max ? (float)(max / (norm + 1e-6)) : 1.0f;  // as torch
  *lr = ct_lr_at(tr->cfg->lr_scheduler_type, tr->cfg->learning_rate, tr->step, tr->warmup_steps,
                 tr->total_steps);
  tr->step++;
  return 0;
}

// The bf16 copy the matmuls read, which follows the trained weights (a LoRA base never
// changes): NULL when there is none to refresh.
static uint16_t *trained_copy16(const ct_train *tr) {
  return tr->cfg->use_peft ? NULL : tr->model.compute16;
}

// The whole step of the configured optimizer on the whole buffer (not sharded).
static void optimizer_step(ct_train *tr, double lr, float grad_scale) {
  if (tr->cfg->optimizer == CT_OPT_MUON)
    ct_muon_step(&tr->trained, tr->params, trained_copy16(tr), tr->grads, tr->mom1, tr->mom2, tr->muon_work,
                 tr->step, lr, grad_scale, &tr->adam, tr->cfg->muon_momentum);
  else
    ct_adamw_step(&tr->trained, tr->params, trained_copy16(tr), tr->grads, tr->mom1, tr->mom2, tr->step, lr,
                  grad_scale, &tr->adam);
}

// QK-Clip after an optimizer step (qkclip.h): the step's maxima (the largest over the ranks,
// which then all apply the same factors; DiLoCo's ranks, which step weights of their own,
// keep their own), the rescaling, a new step's maxima, and the logging window's metrics:
// max_attention_logit (largest before clipping) and clipped_heads (summed over the steps).
static int qk_clip_step(ct_train *tr) {
  ct_qkclip *q = &tr->qkclip;
  if (!q->max) return 0;
  long n = (long)q->L * q->H;
  if (tr->cfg->diloco_inner_steps == 0 && ct_dist_max_f32(q->max, (int)n)) return 1;
  float top = ct_qkclip_max(q);
  int clipped = ct_qkclip_apply(q, &tr->model);
  ct_qkclip_reset(q);
  json_t *x = tr->log.train_extra ? tr->log.train_extra : json_object();
  json_t *prev = json_object_get(x, "max_attention_logit");
  if (isfinite(top) && (!prev || top > json_real_value(prev))) json_object_set_new(x, "max_attention_logit", json_real(top));
  json_object_set_new(x, "clipped_heads",
                      json_integer(json_integer_value(json_object_get(x, "clipped_heads")) + clipped));
  tr->log.train_extra = x;
  return 0;
}

// ZeRO-1: reduce-scatter, the norm from every shard, this rank's shard stepped, all-gather.
static int update_sharded(ct_train *tr, double *grad_norm, double *lr) {
  const ct_shard *sh = &tr->shard;
  long n = tr->trained.n_floats, cnt = sh->hi - sh->lo;
  int rc = ct_dist_reduce_scatter_f32(tr->grads, sh);  // the shard's sum: grads[lo .. hi)
  float *g = tr->grads + sh->lo, clip;
  double sq = rc ? 0 : ct_sum_squares(g, cnt);
  if (rc || (rc = ct_dist_sum_f64(&sq, 1)) || (rc = step_scalars(tr, sq, grad_norm, &clip, lr))) return rc;
  uint16_t *p16 = trained_copy16(tr);
  ct_adamw_step_range(&tr->trained, sh->lo, sh->hi, tr->params, p16, g, tr->mom1, tr->mom2, tr->step, *lr, clip,
                      &tr->adam);
  memset(tr->grads, 0, sizeof(float) * (size_t)sh->lo);  // the rest is scratch: zero it
  memset(tr->grads + sh->hi, 0, sizeof(float) * (size_t)(n - sh->hi));
  if ((rc = ct_dist_allgather_f32(tr->params, sh))) return rc;
  if (p16) {  // the other ranks' shards, as their owners narrowed them
    ct_bf16_narrow(p16, tr->params, sh->lo);
    ct_bf16_narrow(p16 + sh->hi, tr->params + sh->hi, n - sh->hi);
  }
  return qk_clip_step(tr);
}

// DiLoCo's sync: the ranks' mean of θ_start − θ (in the zeroed gradient buffer), the outer
// Nesterov step, every rank's weights set to the new θ_start.
static int diloco_sync(ct_train *tr) {
  long n = tr->trained.n_floats;
  float *d = tr->grads, inv = 1.0f / (float)tr->world;
  for (long i = 0; i < n; i++) d[i] = tr->outer_start[i] - tr->params[i];
  int rc = ct_dist_sum_f32(d, n);
  if (rc) return rc;
  for (long i = 0; i < n; i++) d[i] *= inv;
  ct_nesterov_outer_step(tr->outer_start, tr->outer_mom, tr->params, d, n, tr->cfg->diloco_outer_lr,
                         tr->cfg->diloco_outer_momentum);
  memset(d, 0, sizeof(float) * (size_t)n);
  uint16_t *p16 = trained_copy16(tr);
  if (p16) ct_bf16_narrow(p16, tr->params, n);
  tr->outer_pending = false;
  return 0;
}

// DiLoCo: a local AdamW step on this rank's gradient as the mean over its own tokens,
// then the sync every diloco_inner_steps steps and at the last step.
static int update_diloco(ct_train *tr, double *grad_norm, double *lr) {
  long n = tr->trained.n_floats;
  float world = (float)tr->world, clip;
  int rc = step_scalars(tr, ct_sum_squares(tr->grads, n) * world * world, grad_norm, &clip, lr);
  if (rc) return rc;
  optimizer_step(tr, *lr, clip * world);
  if ((rc = qk_clip_step(tr))) return rc;  // (before a sync: θ_start must be the weights synced)
  tr->outer_pending = true;
  if (tr->step % tr->cfg->diloco_inner_steps == 0 || tr->step == tr->total_steps) return diloco_sync(tr);
  return 0;
}

// ---------------------------------------------------------------------------------
// Overlap (ddp_bucket_cap_mb): the gradient sum in buckets started during backward
// ---------------------------------------------------------------------------------

// A bucket: grads[lo, hi), final once backward is done with layer `ready` (the lowest
// layer it holds; -1: it holds a tensor outside the layers, final only at the end).
typedef struct {
  long lo, hi;
  int ready;
} ov_bucket;

struct ct_overlap {
  int n, next;     // buckets; the next one to start
  ov_bucket *b;    // (n) in the order their sums start: by ready, top layer first
  ct_acts *armed;  // the activations whose backward starts them (NULL: none)
  int rc;          // the hook's first failure, returned by ct_train_update
  bool told;       // the first step's count of sums started during backward is logged
};

// The decoder layer a tensor belongs to ("...layers.<l>...."), or -1.
static int tensor_layer(const char *name) {
  const char *p = strstr(name, "layers.");
  return p ? atoi(p + 7) : -1;
}

static int by_offset(const void *a, const void *b) {
  long x = (*(const ct_tensor_info *const *)a)->offset, y = (*(const ct_tensor_info *const *)b)->offset;
  return (x > y) - (x < y);
}

// Start order: the bucket final first (higher `ready`), then the higher offsets.
static int by_start(const void *a, const void *b) {
  const ov_bucket *x = a, *y = b;
  if (x->ready != y->ready) return y->ready - x->ready;
  return (y->lo > x->lo) - (y->lo < x->lo);
}

// Cuts the whole gradient buffer into buckets of at most cap floats, each ending at a
// tensor's end or at the cap (a tensor larger than cap spans several); the gaps between
// tensors go with the tensor after them.
static int overlap_setup(ct_train *tr, long cap) {
  const ct_layout *t = &tr->trained;
  const ct_tensor_info **ts = malloc(sizeof *ts * (size_t)(t->n_tensors ? t->n_tensors : 1));
  struct ct_overlap *o = calloc(1, sizeof *o);
  long most = t->n_floats / cap + t->n_tensors + 2;
  if (o) o->b = malloc(sizeof *o->b * (size_t)most);
  if (!ts || !o || !o->b) {
    free(ts);
    if (o) free(o->b);
    free(o);
    return ct_set_error(CT_ENOMEM, "out of memory");
  }
  for (int i = 0; i < t->n_tensors; i++) ts[i] = &t->tensors[i];
  qsort(ts, (size_t)t->n_tensors, sizeof *ts, by_offset);
  ov_bucket cur = {0, 0, INT_MAX};
  for (int i = 0; i <= t->n_tensors; i++) {
    long end = i < t->n_tensors ? ts[i]->offset + ts[i]->numel : t->n_floats;
    int layer = i < t->n_tensors ? tensor_layer(ts[i]->name) : INT_MAX;
    while (cur.hi < end) {
      long take = end - cur.hi < cap - (cur.hi - cur.lo) ? end - cur.hi : cap - (cur.hi - cur.lo);
      cur.hi += take;
      if (layer < cur.ready) cur.ready = layer;
      if (cur.hi - cur.lo == cap || (cur.hi == end && i == t->n_tensors)) {
        if (cur.ready == INT_MAX) cur.ready = -1;
        o->b[o->n++] = cur;
        cur = (ov_bucket){cur.hi, cur.hi, INT_MAX};
      }
    }
  }
  if (cur.hi > cur.lo) o->b[o->n++] = (ov_bucket){cur.lo, cur.hi, cur.ready == INT_MAX ? -1 : cur.ready};
  free(ts);
  qsort(o->b, (size_t)o->n, sizeof *o->b, by_start);
  tr->overlap = o;
  ct_log_info(&tr->log, "overlap: the gradient sum in %d buckets of at most %.1f MB, each handed to MPI as "
              "backward finishes its layers", o->n, cap * 4.0 / (1 << 20));
  return 0;
}

static void overlap_free(ct_train *tr) {
  if (tr->overlap) free(tr->overlap->b);
  free(tr->overlap);
  tr->overlap = NULL;
}

// Starts every bucket not yet started that is final once layer l is done.
static void overlap_start(ct_train *tr, int l) {
  struct ct_overlap *o = tr->overlap;
  while (!o->rc && o->next < o->n && o->b[o->next].ready >= l) {
    const ov_bucket *b = &o->b[o->next++];
    o->rc = ct_dist_isum_f32(tr->grads + b->lo, b->hi - b->lo);
  }
}

// The backward hook (ct_acts.grad_ready): starts what layer l completed, and lets MPI
// move the sums already under way.
static void overlap_ready(void *ctx, int l) {
  ct_train *tr = ctx;
  struct ct_overlap *o = tr->overlap;
  overlap_start(tr, l);
  if (!o->rc) o->rc = ct_dist_progress();
  if (l < 0 && o->armed) o->armed->grad_ready = NULL, o->armed = NULL;
}

void ct_train_overlap_arm(ct_train *tr, ct_acts *a) {
  if (!tr->overlap) return;
  a->grad_ready = overlap_ready;
  a->grad_ready_ctx = tr;
  tr->overlap->armed = a;
}

// The rest of the buckets started, all of them waited for.
static int overlap_finish(ct_train *tr) {
  struct ct_overlap *o = tr->overlap;
  if (!o->told) {
    ct_log_info(&tr->log, "overlap: step %ld handed %d of %d bucket sums to MPI during backward", tr->step + 1,
                o->next, o->n);
    o->told = true;
  }
  overlap_start(tr, INT_MIN);
  int rc = o->rc, w = ct_dist_wait_all();
  if (o->armed) o->armed->grad_ready = NULL, o->armed = NULL;  // armed, but no backward ran
  o->next = 0, o->rc = 0;
  return rc ? rc : w;
}

int ct_train_update(ct_train *tr, double *grad_norm, double *lr) {
  if (tr->shard.n) return update_sharded(tr, grad_norm, lr);
  if (tr->cfg->diloco_inner_steps > 0) return update_diloco(tr, grad_norm, lr);
  long n = tr->trained.n_floats;
  int rc = tr->overlap ? overlap_finish(tr) : ct_dist_sum_f32(tr->grads, n);
  float clip;
  if (rc || (rc = step_scalars(tr, ct_sum_squares(tr->grads, n), grad_norm, &clip, lr))) return rc;
  optimizer_step(tr, *lr, clip);
  return qk_clip_step(tr);
}

// Every file already in dir -> {name: {"bytes", "xxh64"}}, or NULL on failure.
static json_t *file_checksums(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return ct_set_error(CT_EIO, "%s: cannot list: %s", dir, strerror(errno)), NULL;
  json_t *files = json_object();
  struct dirent *e;
  while ((e = readdir(d))) {
    char p[CT_PATH_MAX], hex[20];
    struct stat st;
    uint64_t h;
    long size;
    if (ct_path_join(p, sizeof p, dir, e->d_name) || stat(p, &st) || !S_ISREG(st.st_mode)) continue;
    if (ct_file_checksum(p, &h, &size)) {
      json_decref(files);
      files = NULL;
      break;
    }
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    json_object_set_new(files, e->d_name, json_pack("{s:I,s:s}", "bytes", (json_int_t)size, "xxh64", hex));
  }
  closedir(d);
  return files;
}

// trainer_state.json, written last: it lists the checksum of every other file of dir.
static int write_trainer_state(const ct_train *tr, const char *dir) {
  json_t *files = file_checksums(dir);
  if (!files) return CT_EIO;
  json_t *rng = json_array();
  char hex[32], data_hash[20];
  for (int i = 0; i < 4; i++) {
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)tr->rng.s[i]);
    json_array_append_new(rng, json_string(hex));
  }
  snprintf(data_hash, sizeof data_hash, "%016llx", (unsigned long long)tr->data_hash);
  double epoch = tr->epoch + (tr->n_seq ? (double)tr->epoch_pos / tr->n_seq : 0);
  json_t *j = json_pack("{s:I,s:f,s:I,s:{s:I,s:I,s:i,s:i,s:s,s:f,s:o,s:o}}", "global_step",
                        (json_int_t)tr->step, "epoch", epoch, "max_steps",
                        (json_int_t)tr->total_steps, "ctune", "epoch", (json_int_t)tr->epoch,
                        "epoch_pos", (json_int_t)tr->epoch_pos, "n_seq", tr->n_seq,
                        "global_batch", tr->global_batch, "data_hash", data_hash,
                        "num_tokens", tr->num_tokens, "rng", rng, "files", files);
  if (j)  // what the moments are: optimizer.safetensors is the same file for either
    json_object_set_new(json_object_get(j, "ctune"), "optimizer", json_string(ct_optimizer_names[tr->cfg->optimizer]));
  json_t *frozen = tr->n_frozen ? json_object() : NULL;  // what the run read and never trained
  for (int i = 0; i < tr->n_frozen; i++) json_object_set_new(frozen, tr->frozen[i].role, ct_ident_json(&tr->frozen[i]));
  if (j && frozen) json_object_set_new(json_object_get(j, "ctune"), "frozen", frozen);
  else json_decref(frozen);
  if (j && tr->cfg->diloco_inner_steps > 0)  // whose moments the optimizer-rank<r> files hold
    json_object_set_new(json_object_get(j, "ctune"), "diloco_ranks", json_integer(tr->world));
  char p[CT_PATH_MAX];
  int rc = ct_path_join(p, sizeof p, dir, "trainer_state.json");
  if (rc) {
    json_decref(j);
    return rc;
  }
  rc = json_dump_file(j, p, JSON_INDENT(2));
  json_decref(j);
  return rc ? ct_set_error(CT_EIO, "%s: cannot write: %s", p, strerror(errno)) : 0;
}

// The model files of dir: the whole model, or (use_peft) the adapters in PEFT's layout.
static int write_model_files(const ct_train *tr, const char *dir, ct_dtype dtype) {
  char p[CT_PATH_MAX];
  const ct_model *m = &tr->model;
  if (tr->cfg->use_peft) {
    const char *base = tr->cfg->model_path[0] ? tr->cfg->model_path : NULL;
    int rc = ct_lora_save(&tr->lora, dir, base);
    return rc ? rc : ct_tokenizer_save(tr->tok, dir);
  }
  // config.json from the one the model was read from (none: built from the `model:` keys)
  const char *from = tr->resumed_from[0] ? tr->resumed_from : tr->cfg->model_path;
  int rc = ct_path_join(p, sizeof p, dir, "config.json");
  if (!rc) rc = ct_hf_config_write(&m->cfg, p, dtype == CT_DT_BF16 ? "bfloat16" : "float32", from);
  if (!rc) rc = ct_path_join(p, sizeof p, dir, "model.safetensors");
  const float *bufs[] = {m->params};
  if (!rc) rc = ct_save_tensors(&ct_model_hf_tensors(m), 1, bufs, NULL, p, dtype);
  if (!rc && m->cfg.mtp_layers) rc = ct_mtp_save(m, m->params, dir, dtype);  // beside it (mtp.h)
  if (!rc) rc = ct_tokenizer_save(tr->tok, dir);
  return rc;
}

// Every rank learns whether rank 0's save worked.
static int agree(int rc) {
  int worst = ct_dist_max_int(rc < 0 ? -rc : 0);
  return rc ? rc : (worst ? ct_set_error(-worst, "saving failed on rank 0") : 0);
}

static const char *const moment_suffixes[] = {".exp_avg", ".exp_avg_sq", ".outer_momentum"};

// Rank 0 writes moments m1, m2 (the whole layout) into dir/<optimizer_file(r)>, with
// DiLoCo's outer momentum in rank 0's file.
static int write_optimizer(const ct_train *tr, const char *dir, int r, const float *m1, const float *m2) {
  char p[CT_PATH_MAX], name[64];
  const float *bufs[] = {m1, m2, tr->outer_mom};
  optimizer_file(name, sizeof name, r);
  int rc = ct_path_join(p, sizeof p, dir, name);
  return rc ? rc : ct_save_tensors(&tr->trained, r == 0 && tr->outer_mom ? 3 : 2, bufs, moment_suffixes, p,
                                   CT_DT_F32);
}

// An optimizer file rank 0 fills piece by piece, as the pieces arrive from the ranks that
// hold them: written whole first from the zero gradient buffer (its header and size are
// then final), mapped to find each tensor's bytes, patched through fd.
typedef struct {
  ct_safetensors st;
  int fd;
  long data_pos;  // the data section's position in the file
} patch_file;

static int patch_open(const ct_train *tr, patch_file *f, const char *dir, int r) {
  char p[CT_PATH_MAX], name[64];
  memset(f, 0, sizeof *f);
  f->fd = -1;
  optimizer_file(name, sizeof name, r);
  int rc = ct_path_join(p, sizeof p, dir, name);
  if (!rc) rc = write_optimizer(tr, dir, r, tr->grads, tr->grads);
  if (!rc) rc = ct_st_open(&f->st, p);
  if (rc) return rc;
  f->data_pos = (long)(f->st.data - f->st.map);
  f->fd = open(p, O_WRONLY);
  return f->fd < 0 ? ct_set_error(CT_EIO, "%s: cannot open for writing: %s", p, strerror(errno)) : 0;
}

// Elements [lo, hi) of the layout's moment k (suffix moment_suffixes[k]) from src[0 .. hi-lo).
static int patch_range(const ct_train *tr, patch_file *f, int k, long lo, long hi, const float *src) {
  for (int t = 0; t < tr->trained.n_tensors; t++) {
    const ct_tensor_info *ti = &tr->trained.tensors[t];
    long a = ti->offset > lo ? ti->offset : lo, b = ti->offset + ti->numel < hi ? ti->offset + ti->numel : hi;
    if (a >= b) continue;
    char name[160];
    snprintf(name, sizeof name, "%s%s", ti->name, moment_suffixes[k]);
    const ct_st_tensor *st = ct_st_find(&f->st, name);
    if (!st) return ct_set_error(CT_EFORMAT, "%s: tensor '%s' is missing", f->st.path, name);
    off_t pos = f->data_pos + (off_t)st->begin + (off_t)sizeof(float) * (a - ti->offset);
    size_t bytes = sizeof(float) * (size_t)(b - a);
    const char *from = (const char *)(src + (a - lo));
    for (size_t done = 0; done < bytes;) {
      ssize_t w = pwrite(f->fd, from + done, bytes - done, pos + (off_t)done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return ct_set_error(CT_EIO, "%s: cannot write: %s", f->st.path, strerror(errno));
      done += (size_t)w;
    }
  }
  return 0;
}

static int patch_close(patch_file *f, int rc) {
  if (f->fd >= 0) {
    if (!rc && fsync(f->fd)) rc = ct_set_error(CT_EIO, "%s: cannot fsync: %s", f->st.path, strerror(errno));
    close(f->fd);
  }
  ct_st_close(&f->st);
  return rc;
}

// optimizer_sharding: every rank's shard of both moments to rank 0, one shard at a time
// through its gradient buffer (no full-size copy), patched into optimizer.safetensors:
// the file an unsharded run writes. *rc is rank 0's file error (the ranks keep sending).
static int write_sharded_moments(ct_train *tr, const char *dir, int *rc) {
  const ct_shard *sh = &tr->shard;
  patch_file f = {.fd = -1};
  if (tr->rank == 0 && !*rc) *rc = patch_open(tr, &f, dir, 0);
  int mpi = 0;
  for (int k = 0; k < 2 && !mpi; k++) {
    float *mine = k == 0 ? tr->mom1 : tr->mom2;
    for (int r = 0; r < tr->world && !mpi; r++) {
      float *buf = tr->rank == 0 && r != 0 ? tr->grads : mine;
      mpi = ct_dist_fetch_f32(buf, sh->counts[r], r);
      long lo = sh->displs[r], hi = lo + sh->counts[r];
      if (!mpi && tr->rank == 0 && !*rc) *rc = patch_range(tr, &f, k, lo, hi, buf);
    }
  }
  if (tr->rank == 0) {
    *rc = patch_close(&f, *rc);
    memset(tr->grads, 0, sizeof(float) * (size_t)tr->trained.n_floats);  // zero again for the next step
  }
  return mpi;
}

// DiLoCo: rank r > 0's moments to rank 0, one moment at a time through its gradient buffer,
// patched into optimizer-rank<r>.safetensors.
static int write_rank_moments(ct_train *tr, const char *dir, int *rc) {
  long n = tr->trained.n_floats;
  int mpi = 0;
  for (int r = 1; r < tr->world && !mpi; r++) {
    patch_file f = {.fd = -1};
    if (tr->rank == 0 && !*rc) *rc = patch_open(tr, &f, dir, r);
    for (int k = 0; k < 2 && !mpi; k++) {
      float *buf = tr->rank == 0 ? tr->grads : k == 0 ? tr->mom1 : tr->mom2;
      mpi = ct_dist_fetch_f32(buf, n, r);
      if (!mpi && tr->rank == 0 && !*rc) *rc = patch_range(tr, &f, k, 0, n, buf);
    }
    if (tr->rank == 0) {
      *rc = patch_close(&f, *rc);
      memset(tr->grads, 0, sizeof(float) * (size_t)n);
    }
  }
  return mpi;
}

// Bytes a save writes into output_dir: the model files (the whole model in dt, or the
// adapters in float32) and the tokenizer's, and for a checkpoint the optimizer's moments
// (every rank's with DiLoCo, and its outer momentum) and a trainer's own files. The
// headers and small JSON files are some KB more.
static double save_bytes(const ct_train *tr, ct_dtype dt, bool checkpoint) {
  const ct_config *c = tr->cfg;
  double b = c->use_peft ? 4.0 * tr->lora.n_floats : ct_model_param_bytes(&tr->model, dt == CT_DT_BF16);
  b += ct_tokenizer_saved_bytes(tr->tok) + 65536;
  if (checkpoint) {
    double n = (double)tr->trained.n_floats;
    b += 8.0 * n * (c->diloco_inner_steps > 0 ? tr->world : 1) + (tr->outer_mom ? 4.0 * n : 0) + tr->save_extra_bytes;
  }
  return b;
}

// A failed save's temporary directory removed (its disk space back; the previous
// checkpoint was never touched), keeping the failure's message.
static int discard_save(const char *tmp, int rc) {
  if (!rc || !tmp[0]) return rc;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", ct_last_error());
  ct_remove_tree(tmp);
  return ct_set_error(rc, "%s", msg);
}

int ct_train_save_checkpoint(ct_train *tr) {
  bool sharded = tr->shard.n && tr->world > 1, diloco = tr->cfg->diloco_inner_steps > 0 && tr->world > 1;
  char tmp[CT_PATH_MAX] = "";
  const char *out = tr->cfg->output_dir;
  int rc = 0, mpi = 0;
  if (tr->rank == 0) {
    rc = ct_disk_room(out, save_bytes(tr, CT_DT_F32, true), "the checkpoint");
    if (!rc) rc = ct_ckpt_begin(out, tr->step, tmp, sizeof tmp);
    if (!rc) rc = write_model_files(tr, tmp, CT_DT_F32);  // fp32: resuming must be exact
    ct_failpoint("checkpoint");
    if (!rc && !sharded) rc = write_optimizer(tr, tmp, 0, tr->mom1, tr->mom2);
  }
  if (sharded) mpi = write_sharded_moments(tr, tmp, &rc);
  if (diloco) mpi = write_rank_moments(tr, tmp, &rc);
  if (tr->rank == 0 && !mpi) {
    if (!rc && tr->save_extra) rc = tr->save_extra(tr->save_extra_ctx, tmp);
    if (!rc) rc = write_trainer_state(tr, tmp);
    if (!rc) rc = ct_ckpt_commit(out, tr->step, tmp);
    else rc = discard_save(tmp, rc);
    if (!rc) rc = ct_ckpt_rotate(out, (int)tr->cfg->save_total_limit);
  }
  return mpi ? mpi : agree(rc);
}

int ct_train_save_final(ct_train *tr) {
  int rc = 0;
  if (tr->rank == 0) {
    const char *out = tr->cfg->output_dir;
    char tmp[CT_PATH_MAX] = "", p[CT_PATH_MAX];
    ct_dtype dt = tr->cfg->save_dtype == CT_DTYPE_BFLOAT16 ? CT_DT_BF16 : CT_DT_F32;
    rc = ct_disk_room(out, save_bytes(tr, dt, false), "the model");
    if (!rc) rc = ct_path_join(tmp, sizeof tmp, out, ".tmp-final");
    if (!rc) rc = ct_remove_tree(tmp);
    if (!rc) rc = ct_mkdirs(tmp);
    if (!rc) rc = discard_save(tmp, write_model_files(tr, tmp, dt));
    const char *files[] = {"config.json", "model.safetensors", "adapter_config.json",
                           "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json",
                           "mtp.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof *files && !rc; i++) {
      rc = ct_path_join(p, sizeof p, tmp, files[i]);
      if (!rc && access(p, R_OK) == 0) rc = ct_publish_file(p, out, files[i]);
    }
    if (!rc) rc = ct_remove_tree(tmp);
  }
  return agree(rc);
}
