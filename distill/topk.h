// distill/topk: the teacher's top-k logits file of offline distillation (`bin/distill
// precompute` writes it; a run with teacher_logits_path reads it instead of a teacher).
// For each labeled token of the dataset, in dataset order, the k token ids with the
// teacher's largest logits and those logits, in a checksummed safetensors file
// (ct_st_write_checked, safetensors.h):
//   indices   I32 (n, k)  token ids: each in [0, V) of the student's vocabulary, distinct in a row
//   logits    F32 (n, k)  the teacher's logits of those ids (no temperature), finite
//   __metadata__  dataset_hash (16 hex digits: the data it belongs to), teacher (the directory
//                 it came from), xxh64 (the checksum of both tensors' bytes)
#pragma once
#include <stdint.h>

typedef struct {
  int k;
  long n;              // labeled tokens (rows)
  int *idx;            // (n, k)
  float *logit;        // (n, k)
  uint64_t data_hash;  // of the dataset it was computed on (the caller's fingerprint)
  uint64_t sum;        // the contents' checksum (read: as verified): the file's identity
} ct_topk;

// Writes t (idx, logit, n, k, data_hash) to path with teacher in its metadata.
int ct_topk_write(const char *path, const ct_topk *t, const char *teacher);
// Reads path and checks all of it before anything trains, for a student of V tokens: its
// layout (two tensors of one (n, k) shape, 1 <= k <= V; a truncated or padded file fails
// to open), its checksum (a changed byte is refused), every index (0 <= id < V, distinct
// within a row) and logit (finite). A failure is one line naming the file, and the row and
// position of a bad value. The caller compares data_hash and n with its dataset.
int ct_topk_load(ct_topk *t, const char *path, int V);
void ct_topk_free(ct_topk *t);
