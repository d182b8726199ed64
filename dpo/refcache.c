// dpo/refcache: the reference's log-probs computed once (precompute_ref_log_probs) and cached
// in output_dir, keyed by what they were made for (refcache.h). Computing them is main.c's
// (it runs the reference); this reads, checks and writes the file.
#include "dpo/refcache.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "fs.h"
#include "hash.h"
#include "safetensors.h"

static uint64_t dataset_hash(const ct_pref_dataset *ds) {
  uint64_t h = ct_fnv1a(ds->ids, sizeof(int) * ds->n_tokens, CT_FNV1A_INIT);
  h = ct_fnv1a(ds->p_len, sizeof(int) * ds->n, h);
  h = ct_fnv1a(ds->c_len, sizeof(int) * ds->n, h);
  return ct_fnv1a(ds->r_len, sizeof(int) * ds->n, h);
}

int ct_dpo_cache_key_of(const ct_train *tr, const ct_pref_dataset *ds, ct_dpo_cache_key *k) {
  const ct_config *c = tr->cfg;
  snprintf(k->data, sizeof k->data, "%016llx", (unsigned long long)dataset_hash(ds));
  snprintf(k->truncation, sizeof k->truncation, "max_length=%ld max_prompt_length=%ld max_completion_length=%ld",
           (long)c->max_length, (long)c->max_prompt_length, (long)c->max_completion_length);
  k->compute = tr->bf16 ? "bfloat16" : "float32";
  json_t *j = ct_ident_json(ct_train_frozen_find(tr, "reference"));  // (ct_train_reference recorded it)
  k->reference = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
  json_decref(j);
  return k->reference ? 0 : ct_set_error(CT_ENOMEM, "out of memory");
}

// Why the cache st cannot serve key k (into why), or "" when it can.
static void cache_mismatch(const ct_safetensors *st, const ct_dpo_cache_key *k, const ct_ident *ref, char *why,
                           size_t n) {
  const char *data = ct_st_meta(st, "dataset_hash"), *trunc = ct_st_meta(st, "truncation");
  const char *compute = ct_st_meta(st, "compute"), *was = ct_st_meta(st, "reference");
  json_t *j = was ? json_loads(was, 0, NULL) : NULL;
  ct_ident old;
  why[0] = 0;
  if (ct_st_check_content(st, NULL)) snprintf(why, n, "%s", ct_last_error());
  else if (!trunc || strcmp(trunc, k->truncation)) snprintf(why, n, "it was made with %s, this run has %s",
                                                             trunc ? trunc : "other truncation", k->truncation);
  else if (!data || strcmp(data, k->data)) snprintf(why, n, "it was made on other data (tokens or pairs differ)");
  else if (!j || ct_ident_parse(&old, "reference", j, st->path)) snprintf(why, n, "it names no reference model");
  else if (ct_ident_differs(&old, ref, why, n)) {
  } else if (!compute || strcmp(compute, k->compute))
    snprintf(why, n, "it was made with %s matmuls, this run's are %s (bf16)", compute ? compute : "other",
             k->compute);
  json_decref(j);
}

bool ct_dpo_cache_load(const char *path, const ct_pref_dataset *ds, const ct_dpo_cache_key *k, const ct_ident *ref,
                       ct_dpo_ref_cache *rc, char *why, size_t n) {
  ct_safetensors st = {0};
  why[0] = 0;
  if (access(path, F_OK)) return false;
  if (ct_st_open(&st, path)) {
    snprintf(why, n, "%s", ct_last_error());
    return false;
  }
  cache_mismatch(&st, k, ref, why, n);
  const ct_st_tensor *c = ct_st_find(&st, "chosen"), *r = ct_st_find(&st, "rejected");
  if (!why[0] && (!c || !r || c->numel != ds->n || r->numel != ds->n || ct_st_read_f32(&st, c, rc->c, ds->n) ||
                  ct_st_read_f32(&st, r, rc->r, ds->n)))
    snprintf(why, n, "it does not hold %d pairs' chosen and rejected sums", ds->n);
  ct_st_close(&st);
  return !why[0];
}

int ct_dpo_cache_save(const char *path, const ct_pref_dataset *ds, const ct_dpo_cache_key *k,
                      const ct_dpo_ref_cache *rc) {
  ct_st_entry e[2] = {{.name = "chosen", .dtype = CT_DT_F32, .ndim = 1, .shape = {ds->n}, .data = rc->c},
                      {.name = "rejected", .dtype = CT_DT_F32, .ndim = 1, .shape = {ds->n}, .data = rc->r}};
  const char *mk[] = {"dataset_hash", "truncation", "reference", "compute"};
  const char *mv[] = {k->data, k->truncation, k->reference, k->compute};
  char tmp[CT_PATH_MAX + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int err = ct_st_write_checked(tmp, e, 2, mk, mv, 4);
  if (!err && rename(tmp, path)) err = ct_set_error(CT_EIO, "%s: cannot rename", tmp);
  return err;
}

