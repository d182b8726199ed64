// ckpt: atomic checkpoint directories (the files in them are written by hf and train):
//   output_dir/checkpoint-<step>/{config.json, model.safetensors, tokenizer.json,
//                                 optimizer.safetensors, trainer_state.json}
// A checkpoint is written into output_dir/.tmp-checkpoint-<step>, every file fsync'd,
// then renamed into place, so a crash mid-save leaves the previous one intact.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "fs.h"

// Creates an empty output_dir/.tmp-checkpoint-<step> (removing a stale one) and puts its
// path in tmp.
int ct_ckpt_begin(const char *output_dir, long step, char *tmp, size_t tmp_size);
// fsyncs every file of tmp and tmp itself, renames it to output_dir/checkpoint-<step>
// (replacing an older one of that step) and fsyncs output_dir.
int ct_ckpt_commit(const char *output_dir, long step, const char *tmp);
// Newest output_dir/checkpoint-<step> that is complete (has trainer_state.json).
// Returns 0 and fills path/step, or CT_EIO when there is none.
int ct_ckpt_latest(const char *output_dir, char *path, size_t path_size, long *step);
// Deletes the oldest checkpoint-* directories so that at most `keep` remain (each renamed
// aside first: a kill mid-way never leaves a partial checkpoint-N).
int ct_ckpt_rotate(const char *output_dir, int keep);
// Removes what a killed save or rotation left: .tmp-checkpoint-*, .tmp-final, .tmp-delete-*.
int ct_ckpt_clean(const char *output_dir, int *removed);
// Takes an exclusive flock on output_dir/.lock (which then holds this pid) and keeps it in
// *fd until the process exits: the kernel drops it when a process dies, so a kill -9 leaves
// no stale lock. Fails naming the holder's pid when another process holds it.
int ct_ckpt_lock(const char *output_dir, int *fd);
