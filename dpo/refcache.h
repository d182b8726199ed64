// dpo/refcache: reference log-probs computed once (precompute_ref_log_probs), cached in
// output_dir. A cache is reused only when it was made for the same data (tokens as
// truncated), the same truncation keys, the same reference (its identity: weights
// checksum, path key, ref_dtype; ident.h) and compute dtype, and its contents' checksum
// holds; else it is recomputed.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "ident.h"
#include "prefs.h"
#include "train.h"

typedef struct {
  float *c, *r;  // (pairs)
} ct_dpo_ref_cache;

// What a cache is made for: its __metadata__ values.
typedef struct {
  char data[20], truncation[128];
  const char *compute;  // "bfloat16" or "float32" matmuls
  char *reference;      // the reference's identity as JSON (malloc'd)
} ct_dpo_cache_key;

// The key of this run's cache of ds: the data's hash, the truncation keys, the compute dtype
// and the reference's identity (recorded by ct_train_reference). CT_ENOMEM; free k->reference.
int ct_dpo_cache_key_of(const ct_train *tr, const ct_pref_dataset *ds, ct_dpo_cache_key *k);
// Fills rc (ds->n pairs each) from path when the cache there was made for key k (ref: this
// run's reference identity); else returns false with the reason in why ("" when there is
// no file).
bool ct_dpo_cache_load(const char *path, const ct_pref_dataset *ds, const ct_dpo_cache_key *k, const ct_ident *ref,
                       ct_dpo_ref_cache *rc, char *why, size_t n);
// Writes rc with key k's metadata and a checksum to path (atomically: path.tmp, renamed).
int ct_dpo_cache_save(const char *path, const ct_pref_dataset *ds, const ct_dpo_cache_key *k,
                      const ct_dpo_ref_cache *rc);
