// train_save: a checkpoint (model files, the optimizer's moments, a trainer's own files, then
// trainer_state.json; committed atomically, old ones rotated) and the final model in
// output_dir (each file replaced atomically). Rank 0 writes; every rank learns the outcome.
#include "train_internal.h"

#include <stdbool.h>
#include <unistd.h>

#include "ckpt.h"
#include "error.h"
#include "fs.h"
#include "hf.h"
#include "mtp.h"

// The model files of dir: the whole model, or (use_peft) the adapters in PEFT's layout.
static int write_model_files(const ct_train *tr, const char *dir, ct_dtype dtype) {
  char p[CT_PATH_MAX];
  const ct_model *m = &tr->model;
  if (tr->cfg->use_peft) {
    const char *base = tr->cfg->model_path[0] ? tr->cfg->model_path : NULL;
    int rc = ct_lora_save(&tr->lora, dir, base);
    return rc ? rc : ct_tokenizer_save(tr->tok, dir);
  }
  // config.json from the one the model was read from (none: built from the `model:` keys)
  const char *from = tr->resumed_from[0] ? tr->resumed_from : tr->cfg->model_path;
  int rc = ct_path_join(p, sizeof p, dir, "config.json");
  if (!rc) rc = ct_hf_config_write(&m->cfg, p, dtype == CT_DT_BF16 ? "bfloat16" : "float32", from);
  if (!rc) rc = ct_path_join(p, sizeof p, dir, "model.safetensors");
  const float *bufs[] = {m->params};
  if (!rc) rc = ct_save_tensors(&ct_model_hf_tensors(m), 1, bufs, NULL, p, dtype);
  if (!rc && m->cfg.mtp_layers) rc = ct_mtp_save(m, m->params, dir, dtype);  // beside it (mtp.h)
  if (!rc) rc = ct_tokenizer_save(tr->tok, dir);
  return rc;
}

// Every rank learns whether rank 0's save worked.
static int agree(int rc) {
  int worst = ct_dist_max_int(rc < 0 ? -rc : 0);
  return rc ? rc : (worst ? ct_set_error(-worst, "saving failed on rank 0") : 0);
}

// Bytes a save writes into output_dir: the model files (the whole model in dt, or the
// adapters in float32) and the tokenizer's, and for a checkpoint the optimizer's moments
// (every rank's with DiLoCo, and its outer momentum) and a trainer's own files. The
// headers and small JSON files are some KB more.
static double save_bytes(const ct_train *tr, ct_dtype dt, bool checkpoint) {
  const ct_config *c = tr->cfg;
  double b = c->use_peft ? 4.0 * tr->lora.n_floats : ct_model_param_bytes(&tr->model, dt == CT_DT_BF16);
  b += ct_tokenizer_saved_bytes(tr->tok) + 65536;
  if (checkpoint) {
    double n = (double)tr->trained.n_floats;
    b += 8.0 * n * (c->diloco_inner_steps > 0 ? tr->world : 1) + (tr->outer_mom ? 4.0 * n : 0) + tr->save_extra_bytes;
  }
  return b;
}

// A failed save's temporary directory removed (its disk space back; the previous
// checkpoint was never touched), keeping the failure's message.
static int discard_save(const char *tmp, int rc) {
  if (!rc || !tmp[0]) return rc;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", ct_last_error());
  ct_remove_tree(tmp);
  return ct_set_error(rc, "%s", msg);
}

int ct_train_save_checkpoint(ct_train *tr) {
  bool sharded = tr->shard.n && tr->world > 1, diloco = tr->cfg->diloco_inner_steps > 0 && tr->world > 1;
  char tmp[CT_PATH_MAX] = "";
  const char *out = tr->cfg->output_dir;
  int rc = 0, mpi = 0;
  if (tr->rank == 0) {
    rc = ct_disk_room(out, save_bytes(tr, CT_DT_F32, true), "the checkpoint");
    if (!rc) rc = ct_ckpt_begin(out, tr->step, tmp, sizeof tmp);
    if (!rc) rc = write_model_files(tr, tmp, CT_DT_F32);  // fp32: resuming must be exact
    ct_failpoint("checkpoint");
    if (!rc && !sharded) rc = ct_train_moments_write(tr, tmp, 0, tr->mom1, tr->mom2);
  }
  if (sharded) mpi = ct_train_moments_write_shards(tr, tmp, &rc);
  if (diloco) mpi = ct_train_moments_write_ranks(tr, tmp, &rc);
  if (tr->rank == 0 && !mpi) {
    if (!rc && tr->save_extra) rc = tr->save_extra(tr->save_extra_ctx, tmp);
    if (!rc) rc = ct_train_state_write(tr, tmp);
    if (!rc) rc = ct_ckpt_commit(out, tr->step, tmp);
    else rc = discard_save(tmp, rc);
    if (!rc) rc = ct_ckpt_rotate(out, (int)tr->cfg->save_total_limit);
  }
  return mpi ? mpi : agree(rc);
}

int ct_train_save_final(ct_train *tr) {
  int rc = 0;
  if (tr->rank == 0) {
    const char *out = tr->cfg->output_dir;
    char tmp[CT_PATH_MAX] = "", p[CT_PATH_MAX];
    ct_dtype dt = tr->cfg->save_dtype == CT_DTYPE_BFLOAT16 ? CT_DT_BF16 : CT_DT_F32;
    rc = ct_disk_room(out, save_bytes(tr, dt, false), "the model");
    if (!rc) rc = ct_path_join(tmp, sizeof tmp, out, ".tmp-final");
    if (!rc) rc = ct_remove_tree(tmp);
    if (!rc) rc = ct_mkdirs(tmp);
    if (!rc) rc = discard_save(tmp, write_model_files(tr, tmp, dt));
    const char *files[] = {"config.json", "model.safetensors", "adapter_config.json",
                           "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json",
                           "mtp.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof *files && !rc; i++) {
      rc = ct_path_join(p, sizeof p, tmp, files[i]);
      if (!rc && access(p, R_OK) == 0) rc = ct_publish_file(p, out, files[i]);
    }
    if (!rc) rc = ct_remove_tree(tmp);
  }
  return agree(rc);
}
