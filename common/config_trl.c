// config_trl: the TrainingArguments / TRL config names ctune does not use, each renamed
// to a ctune key (max_seq_length -> max_length), its value mapped (optim: adamw_torch ->
// optimizer: adamw) or rejected with what to use instead (fp16, deepspeed, ...).
#include <stddef.h>
#include <string.h>
#include <yaml.h>

#include "config_internal.h"
#include "error.h"

static int is_word(const char *v, const char *a, const char *b) {
  return !strcmp(v, a) || (b && !strcmp(v, b));
}

// eval_strategy, save_strategy, logging_strategy: steps (the *_steps key decides), no
// (off, as ctune says it), epoch (not supported: ctune counts steps).
static int map_strategy(ct_config *c, const char *name, const char *v, const char *where,
                        const char *path) {
  char b[64];
  const char *steps = name[0] == 's' ? "save_steps" : name[0] == 'l' ? "logging_steps" : "eval_steps";
  if (is_word(v, "steps", NULL)) return 0;
  if (is_word(v, "no", "false") && name[0] == 's')
    return config_apply_text(c, "save_steps", "0", where, path);
  if (is_word(v, "no", "false") && name[0] != 'l')  // no evaluation: no eval data
    return config_apply_text(c, "eval_dataset_path", "", where, path);
  if (is_word(v, "no", "false"))
    return ct_set_error(CT_ECONFIG, "%s: key '%s': 'no' has no equivalent: ctune always writes "
                        "metrics.jsonl, every logging_steps steps", where, name);
  if (is_word(v, "epoch", NULL))
    return ct_set_error(CT_ECONFIG, "%s: key '%s': 'epoch' is not supported: ctune counts in steps; "
                        "set %s", where, name, steps);
  return ct_set_error(CT_ECONFIG, "%s: key '%s': '%s' is not one of steps, no (set %s)", where,
                      name, config_show(v, b, sizeof b), steps);
}

static int map_optim(ct_config *c, const char *name, const char *v, const char *where, const char *path) {
  char b[64];
  if (is_word(v, "adamw_torch", "adamw_torch_fused") || is_word(v, "adamw_hf", NULL))
    return config_apply_text(c, "optimizer", "adamw", where, path);
  if (is_word(v, "muon", NULL)) return config_apply_text(c, "optimizer", "muon", where, path);
  return ct_set_error(CT_ECONFIG, "%s: key '%s': '%s' is not supported: ctune's optimizers are AdamW "
                      "(adamw_torch, adamw_torch_fused, adamw_hf) and muon (see the key optimizer)", where,
                      name, config_show(v, b, sizeof b));
}

static int map_torch_dtype(ct_config *c, const char *name, const char *v, const char *where,
                           const char *path) {
  (void)c, (void)path;
  char b[64];
  if (is_word(v, "float32", "auto") || config_is_null_word(v)) return 0;
  return ct_set_error(CT_ECONFIG, "%s: key '%s': '%s' is not supported: ctune trains in float32 "
                      "(only float32 or auto); save_dtype sets the saved weights' type, base_dtype, "
                      "ref_dtype and teacher_dtype the frozen weights'", where, name,
                      config_show(v, b, sizeof b));
}

#define NO_EQ(name, note) {name, NULL, NULL, note}
static const trl_key TRL_KEYS[] = {
    {"max_seq_length", "max_length", NULL, NULL},
    {"vllm_importance_sampling_cap", "vllm_importance_sampling_clip_max", NULL, NULL},  // TRL < 0.26
    {"per_gpu_train_batch_size", "per_device_train_batch_size", NULL, NULL},
    {"per_gpu_eval_batch_size", "per_device_eval_batch_size", NULL, NULL},
    {"model_name_or_path", "model_path", NULL, NULL},
    {"evaluation_strategy", NULL, map_strategy, NULL},
    {"eval_strategy", NULL, map_strategy, NULL},
    {"save_strategy", NULL, map_strategy, NULL},
    {"logging_strategy", NULL, map_strategy, NULL},
    {"optim", NULL, map_optim, NULL},
    {"torch_dtype", NULL, map_torch_dtype, NULL},
    {"dtype", NULL, map_torch_dtype, NULL},
    NO_EQ("fp16", "use bf16: true (bfloat16 matmuls); save_dtype sets the saved weights' type"),
    NO_EQ("tf32", "ctune computes in float32 on the CPU"),
    NO_EQ("dataset_name", "use dataset_path (a local JSONL file in TRL format)"),
    NO_EQ("dataset_train_split", "use dataset_path (a local JSONL file)"),
    NO_EQ("dataset_test_split", "use eval_dataset_path (a local JSONL file)"),
    NO_EQ("do_train", "every run trains"),
    NO_EQ("do_eval", "evaluation runs when eval_dataset_path is set"),
    NO_EQ("report_to", "metrics go to output_dir/metrics.jsonl"),
    NO_EQ("logging_dir", "metrics go to output_dir/metrics.jsonl"),
    NO_EQ("overwrite_output_dir", "no equivalent"),
    NO_EQ("push_to_hub", "the model is saved in output_dir in Hugging Face layout"),
    NO_EQ("hub_model_id", "the model is saved in output_dir in Hugging Face layout"),
    NO_EQ("load_best_model_at_end", "no equivalent: the last step's model is saved"),
    NO_EQ("metric_for_best_model", "no equivalent: the last step's model is saved"),
    NO_EQ("lr_scheduler_kwargs", "no equivalent; lr_scheduler_type picks the schedule"),
    NO_EQ("gradient_checkpointing_kwargs", "no equivalent; gradient_checkpointing turns it on"),
    NO_EQ("dataloader_num_workers", "no equivalent; num_threads sets the compute threads"),
    NO_EQ("dataset_num_proc", "no equivalent; num_threads sets the compute threads"),
    NO_EQ("data_seed", "no equivalent; seed seeds everything"),
    NO_EQ("deepspeed", "no equivalent; run under mpirun for several processes"),
    NO_EQ("fsdp", "no equivalent; run under mpirun for several processes"),
    NO_EQ("use_vllm", "no equivalent; generation uses ctune's built-in sampler (decode_slots)"),
    NO_EQ("attn_implementation", "no equivalent"),
    NO_EQ("use_liger_kernel", "no equivalent"),
    NO_EQ("torch_compile", "no equivalent"),
    NO_EQ("load_in_4bit", "no equivalent; base_dtype: int8 holds a LoRA base in int8"),
    NO_EQ("load_in_8bit", "use base_dtype: int8 (with use_peft)"),
    NO_EQ("eval_accumulation_steps", "no equivalent"),
    NO_EQ("remove_unused_columns", "no equivalent; extra fields are kept for rewards"),
};
#undef NO_EQ

const trl_key *config_trl_find(const char *name) {
  for (size_t i = 0; i < sizeof TRL_KEYS / sizeof *TRL_KEYS; i++)
    if (!strcmp(TRL_KEYS[i].name, name)) return &TRL_KEYS[i];
  return NULL;
}

// A TRL key's value (a scalar), renamed, mapped or rejected.
int config_apply_trl(ct_config *c, const trl_key *t, const yaml_node_t *v, yaml_document_t *doc,
                     const char *where, const char *path) {
  if (t->ctune) return config_apply_node(c, t->ctune, v, doc, where, path);
  if (t->note)
    return ct_set_error(CT_ECONFIG, "%s: key '%s' (TRL/transformers) is not a ctune key: %s", where,
                        t->name, t->note);
  if (v->type != YAML_SCALAR_NODE)
    return ct_set_error(CT_ECONFIG, "%s: key '%s': expected one value, got %s", where, t->name,
                        config_node_kind(v));
  return t->map(c, t->name, (const char *)v->data.scalar.value, where, path);
}
