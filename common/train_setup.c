// train_setup: a run's start from its resolved config (ct_train_setup): threads and bf16,
// output_dir claimed and locked, resume_from_checkpoint resolved and its trainer_state.json
// read, the tokenizer, the model's shape (model_path, the checkpoint, or the `model:` keys)
// checked against the keys the user set, and LoRA's keys against the adapter continued.
// Nothing big is allocated here: that waits for the memory plan (train_memory.c).
#include "train_internal.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "dnnl.h"
#include "error.h"
#include "fs.h"
#include "hf.h"
#include "muon.h"
#include "pool.h"

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

int ct_train_check_dir(const ct_config *c, const char *key, const char *dir) {
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
  int rc = ct_train_check_dir(c, "model_path", c->model_path);
  if (!rc) rc = ct_train_check_dir(c, "tokenizer_path", c->tokenizer_path);
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
int ct_train_rope_positions(const ct_config *c) {
  return c->trainer == CT_TRAINER_GRPO ? 1 : (int)c->max_length;
}

int ct_train_load_model(ct_train *tr, ct_model *m, const char *dir) {
  int max_pos = ct_train_rope_positions(tr->cfg);
  if (dir && dir[0]) return ct_model_load(m, dir, max_pos);
  ct_model_config mc;
  int rc = config_from_spec(&mc, tr->cfg, tr->tok);
  if (!rc) rc = ct_model_init(m, &mc, max_pos);
  if (!rc) ct_model_init_random(m, (uint64_t)tr->cfg->seed, (float)tr->cfg->model.initializer_range);
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
ct_lora_config ct_train_lora_config(const ct_config *c) {
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
  ct_lora_config want = ct_train_lora_config(c);
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
  tr->base_dtype = cfg->base_dtype != CT_BASE_AUTO ? cfg->base_dtype : tr->bf16 ? CT_STORE_BF16 : CT_STORE_F32;
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
    ct_lora_config lc = ct_train_lora_config(cfg);
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
  if (tr->resumed_from[0] && (rc = ct_train_state_read(tr, tr->resumed_from))) return rc;
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
