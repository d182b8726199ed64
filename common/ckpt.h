// ckpt: Hugging Face model directories (config.json + model.safetensors, or a sharded
// index) in and out, and atomic checkpoint directories:
//   output_dir/checkpoint-<step>/{config.json, model.safetensors, tokenizer.json,
//                                 optimizer.safetensors, trainer_state.json}
// A checkpoint is written into output_dir/.tmp-checkpoint-<step>, every file fsync'd,
// then renamed into place, so a crash mid-save leaves the previous one intact.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "model.h"
#include "safetensors.h"

// config.json -> ct_model_config, rejecting what the model cannot run (another
// architecture, an activation other than silu, MLP or o_proj biases, rope scaling other
// than llama3, a sliding window) with a message naming the file and key.
int ct_hf_config_read(ct_model_config *c, const char *path);
// ct_model_config -> config.json as transformers writes it for this model_type.
int ct_hf_config_write(const ct_model_config *c, const char *path, const char *torch_dtype);

// Reads config.json from dir and allocates the model with RoPE tables for positions
// < max_pos; then loads every tensor (F32/BF16/F16, converted to float32), checking
// names and shapes. An unexpected tensor is an error, except rotary_emb.inv_freq
// buffers and a tied model's lm_head.weight.
int ct_model_load(ct_model *m, const char *dir, int max_pos);

// Writes buffers with m's layout to one file with Hugging Face names, as `dtype`
// (CT_DT_F32 or CT_DT_BF16). Buffer i's names get suffixes[i] appended (NULL: none;
// ".exp_avg" for an optimizer moment). A tied model has no lm_head.weight, as in
// transformers.
int ct_save_tensors(const ct_model *m, int nbuf, const float *const *bufs,
                    const char *const *suffixes, const char *path, ct_dtype dtype);
// Reads tensors named as ct_save_tensors wrote them (with `suffix`) into buf.
int ct_load_tensors(const ct_model *m, float *buf, const char *path, const char *suffix);

// Creates an empty output_dir/.tmp-checkpoint-<step> (removing a stale one) and puts its
// path in tmp.
int ct_ckpt_begin(const char *output_dir, long step, char *tmp, size_t tmp_size);
// fsyncs every file of tmp and tmp itself, renames it to output_dir/checkpoint-<step>
// (replacing an older one of that step) and fsyncs output_dir.
int ct_ckpt_commit(const char *output_dir, long step, const char *tmp);
// Newest output_dir/checkpoint-<step> that is complete (has trainer_state.json).
// Returns 0 and fills path/step, or CT_EIO when there is none.
int ct_ckpt_latest(const char *output_dir, char *path, size_t path_size, long *step);
// Deletes the oldest checkpoint-* directories so that at most `keep` remain.
int ct_ckpt_rotate(const char *output_dir, int keep);

// Atomically replaces dir/name with the file tmp_path (rename + fsync of dir).
int ct_publish_file(const char *tmp_path, const char *dir, const char *name);
// Recursively removes a directory tree (the checkpoint rotation and stale temporaries).
int ct_remove_tree(const char *path);
// mkdir -p
int ct_mkdirs(const char *path);
// out = dir + "/" + name; an error (not a silently cut path) when it does not fit.
int ct_path_join(char *out, size_t size, const char *dir, const char *name);
#define CT_PATH_MAX 4096
