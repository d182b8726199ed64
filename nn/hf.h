// hf: Hugging Face model directories in and out — config.json <-> ct_model_config, and
// the tensors of a model layout to and from safetensors with Hugging Face names.
#pragma once
#include <jansson.h>
#include <stdbool.h>

#include "model.h"
#include "safetensors.h"

// config.json -> ct_model_config, rejecting what the model cannot run (another
// architecture, an activation other than silu, MLP or o_proj biases, rope scaling other
// than llama3, a sliding window) with a message naming the file and key.
int ct_hf_config_read(ct_model_config *c, const char *path);
// ct_model_config -> config.json. With source_dir (the directory the model was read from;
// NULL or "" for a model from scratch), its config.json with only what differs from c
// changed (vocab_size after a resize, the architecture and labels of a reward model made
// from a causal LM, pad_token_id) and the dtype written: every other key, its order and
// JSON type kept (transformers 5 refuses 24.0 for an int). Without, the keys transformers
// writes for this model_type, typed as its config classes declare them. Floats are
// written the shortest way that reads back (hfjson.h).
int ct_hf_config_write(const ct_model_config *c, const char *path, const char *torch_dtype, const char *source_dir);
// The same object, unwritten (a new reference), for a writer that adds keys.
json_t *ct_hf_config_json(const ct_model_config *c, const char *torch_dtype, const char *source_dir);

// Reads config.json from dir and allocates the model with RoPE tables for positions
// < max_pos; then loads every tensor (F32/BF16/F16, converted to float32), checking
// names and shapes. An unexpected tensor is an error, except rotary_emb.inv_freq
// buffers and a tied model's lm_head.weight.
int ct_model_load(ct_model *m, const char *dir, int max_pos);
// Its two halves: dir/config.json alone, and every tensor of dir into buf (a buffer
// with m's layout), with the same checks. A *ForSequenceClassification config.json has
// num_labels 1 (any other count is an error); a sequence classifier (num_labels 1) read
// from a causal LM's directory takes its backbone, leaves score.weight as buf has it
// (the caller initializes the new head) and skips its lm_head.weight.
// ct_model_read_config also checks the weights' names and shapes (their headers only)
// against config.json, so that one they contradict is refused before any allocation.
int ct_model_read_config(ct_model_config *c, const char *dir);
// That check: every Hugging Face tensor of m's layout is in d with its shape (new_score:
// but score.weight, new) and, unless others_ok, d holds nothing else (rotary_emb.inv_freq
// and a tied model's lm_head.weight aside). A message names the tensor, both shapes and
// the config.json key behind the dimension that differs, or num_hidden_layers.
int ct_model_check_weights(const ct_model *m, const ct_st_dir *d, bool new_score, bool others_ok);
// Only the Hugging Face tensors: multi-token prediction's (cfg.mtp_layers) are mtp.h's,
// in mtp.safetensors.
int ct_model_load_weights(const ct_model *m, float *buf, const char *dir);

// Writes buffers with m's layout to one file with Hugging Face names, as `dtype`
// (CT_DT_F32 or CT_DT_BF16). Buffer i's names get suffixes[i] appended (NULL: none;
// ".exp_avg" for an optimizer moment). A tied model has no lm_head.weight, as in
// transformers.
int ct_save_tensors(const ct_layout *m, int nbuf, const float *const *bufs,
                    const char *const *suffixes, const char *path, ct_dtype dtype);
// Reads tensors named as ct_save_tensors wrote them (with `suffix`) into buf.
int ct_load_tensors(const ct_layout *m, float *buf, const char *path, const char *suffix);
