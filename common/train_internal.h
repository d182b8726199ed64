// train_internal: what the train state's files (common/train*.c) share with each other and
// no trainer calls. The public header is train.h; this one only adds the helpers that one
// of these files defines and another uses, grouped by the file that defines them.
#pragma once
#include "train.h"

// train_setup.c
// A key naming a directory: an error naming the key when it is set and not one.
int ct_train_check_dir(const ct_config *c, const char *key, const char *dir);
// Positions of the RoPE tables a model starts with: max_length, except in GRPO (which has
// no max_length), whose rollouts reserve prompt + completion positions themselves.
int ct_train_rope_positions(const ct_config *c);
// A whole model (parameters allocated and filled): read from dir, or (dir NULL or "")
// built from the `model:` keys with the seeded initialization.
int ct_train_load_model(ct_train *tr, ct_model *m, const char *dir);

// train_state.c: trainer_state.json
// A resumed run's position (step, epoch, data order, rng, frozen inputs ...) from dir's
// trainer_state.json, with every file it lists checked against its checksum.
int ct_train_state_read(ct_train *tr, const char *dir);
// Writes dir/trainer_state.json, last: it lists the checksum of every other file of dir.
int ct_train_state_write(const ct_train *tr, const char *dir);

// train_moments.c: the optimizer's state on disk
// A resumed run's moments (this rank's shard of them with optimizer_sharding, read through
// the gradient buffer, zero before and after) and DiLoCo's outer momentum, from the checkpoint.
int ct_train_moments_load(ct_train *tr);
// Rank 0 writes moments m1, m2 (the whole layout) into rank r's optimizer file in dir.
int ct_train_moments_write(const ct_train *tr, const char *dir, int r, const float *m1, const float *m2);
// optimizer_sharding: every rank's shard to rank 0, patched into optimizer.safetensors.
// DiLoCo: rank r > 0's moments to rank 0, into optimizer-rank<r>.safetensors. Every rank
// calls them; *rc is rank 0's file error; they return an MPI failure.
int ct_train_moments_write_shards(ct_train *tr, const char *dir, int *rc);
int ct_train_moments_write_ranks(ct_train *tr, const char *dir, int *rc);

// train_overlap.c: ddp_bucket_cap_mb's buckets
// Cuts the gradient buffer into buckets of at most cap floats (tr->overlap).
int ct_train_overlap_setup(ct_train *tr, long cap);
void ct_train_overlap_free(ct_train *tr);
// Starts the buckets not yet started and waits for every sum (in ct_train_update).
int ct_train_overlap_finish(ct_train *tr);
