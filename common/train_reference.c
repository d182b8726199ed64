// train_reference: the frozen inputs a run records (their identities, checked on resume) and
// the frozen reference model of DPO and GRPO: built, planned, checked, synced (TR-DPO) and
// saved into a checkpoint. Running it is common/frozen.c's.
#include "train_internal.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "fs.h"
#include "hf.h"

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
    if ((rc = ct_train_check_dir(c, "ref_model_path", c->ref_model_path))) return rc;
    rc = ct_frozen_open(ref, c->ref_model_path, dtype, B, T);
  } else {
    if (!tr->resumed_from[0]) {  // the starting policy, as it is now
      rc = ct_model_init(&m, &tr->model.cfg, T);
      if (!rc) memcpy(m.params, tr->model.params, sizeof(float) * m.n_floats);
    } else {
      rc = ct_train_load_model(tr, &m, c->model_path);
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
