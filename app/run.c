// run: a trainer's run from its command line to its exit code — OpenBLAS and MPI set up, the
// config with the keys every trainer checks, the train state, the final save and the
// release of it all, and the fatal error that ends a run early. The loop between is the
// trainer's own (loop.h has what every loop shares).
#include "run.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "die.h"
#include "dist.h"
#include "error.h"
#include "matmul.h"
#include "pool.h"

void ct_train_die(const ct_train *tr, int rc, const char *what) {
  ct_die_name(tr->name ? tr->name : "ctune");
  ct_die(rc == CT_ECONFIG ? 2 : 1, what);
}

// The keys that go together (before anything is loaded).
static int check_common_keys(const ct_config *c) {
  if (c->use_peft && c->save_dtype != CT_DTYPE_FLOAT32)
    return ct_set_error(CT_ECONFIG, "%s: key 'save_dtype': with use_peft the adapters are saved in "
                        "float32 (they are small); drop the key", ct_config_origin(c, "save_dtype"));
  if (c->max_steps == 0)
    return ct_set_error(CT_ECONFIG, "%s: key 'max_steps': 0 would train nothing; give a number of "
                        "steps, or -1 to train num_train_epochs", ct_config_origin(c, "max_steps"));
  const char *key = !c->use_peft && c->adapter_path[0]                ? "adapter_path"
                    : !c->use_peft && c->base_dtype != CT_BASE_AUTO && c->base_dtype != CT_STORE_F32 ? "base_dtype"
                    : !c->use_peft && c->lora_modules_to_save.n        ? "lora_modules_to_save"
                                                                       : NULL;
  if (key)
    return ct_set_error(CT_ECONFIG, "%s: key '%s' needs use_peft: true", ct_config_origin(c, key), key);
  for (int i = 0; i < c->lora_modules_to_save.n && c->trainer != CT_TRAINER_REWARD; i++) {
    const char *nm = c->lora_modules_to_save.v[i];
    if (!strcmp(nm, "score") || !strcmp(nm, "classifier"))
      return ct_set_error(CT_ECONFIG, "%s: key 'lora_modules_to_save': '%s' is a sequence classifier's head; "
                          "only bin/reward trains one", ct_config_origin(c, "lora_modules_to_save"), nm);
  }
  // (base.yml sets every key: a value other than the default is what the user asked for)
  const char *outer = c->diloco_outer_lr != 0.7        ? "diloco_outer_lr"
                      : c->diloco_outer_momentum != 0.9 ? "diloco_outer_momentum"
                                                        : NULL;
  if (c->diloco_inner_steps == 0 && outer)
    return ct_set_error(CT_ECONFIG, "%s: key '%s' acts on DiLoCo's syncs, and diloco_inner_steps is 0; "
                        "set diloco_inner_steps or drop the key", ct_config_origin(c, outer), outer);
  if (c->diloco_inner_steps > 0 && c->optimizer_sharding)
    return ct_set_error(CT_ECONFIG, "%s: key 'optimizer_sharding': DiLoCo's ranks step their own weights "
                        "with their own AdamW moments, which cannot be split between them; drop one of "
                        "optimizer_sharding and diloco_inner_steps", ct_config_origin(c, "optimizer_sharding"));
  if (c->ddp_bucket_cap_mb > 0 && (c->optimizer_sharding || c->diloco_inner_steps > 0)) {
    const char *k = c->optimizer_sharding ? "optimizer_sharding" : "diloco_inner_steps";
    return ct_set_error(CT_ECONFIG, "%s: key 'ddp_bucket_cap_mb' overlaps data parallel's gradient all-reduce, "
                        "which %s has none of; drop one of ddp_bucket_cap_mb and %s",
                        ct_config_origin(c, "ddp_bucket_cap_mb"), k, k);
  }
  if (c->optimizer == CT_OPT_MUON && (c->use_peft || c->optimizer_sharding)) {
    const char *k = c->use_peft ? "use_peft" : "optimizer_sharding";
    return ct_set_error(CT_ECONFIG, "%s: key 'optimizer': muon orthogonalizes whole matrices, and %s; use "
                        "optimizer: adamw or drop %s", ct_config_origin(c, "optimizer"),
                        c->use_peft ? "LoRA trains each matrix as two thin factors (Muon on the factors "
                                      "is not Muon on their product)"
                                    : "ZeRO-1's shards cut through them",
                        k);
  }
  if (c->optimizer != CT_OPT_MUON && c->muon_momentum != 0.95)
    return ct_set_error(CT_ECONFIG, "%s: key 'muon_momentum' acts on Muon's matrices, and optimizer is "
                        "adamw; set optimizer: muon or drop the key", ct_config_origin(c, "muon_momentum"));
  if (c->qk_clip_threshold > 0 && c->use_peft)
    return ct_set_error(CT_ECONFIG, "%s: key 'qk_clip_threshold': QK-Clip rescales the query and key weights, "
                        "which with use_peft are the frozen base (shared with the reference, not saved), and an "
                        "adapter's low-rank update cannot express a rescaling of W; drop one of the two",
                        ct_config_origin(c, "qk_clip_threshold"));
  if (c->mtp_num_layers == 0 && ct_config_is_set(c, "mtp_loss_scaling_factor"))
    return ct_set_error(CT_ECONFIG, "%s: key 'mtp_loss_scaling_factor' weighs multi-token prediction's loss, and "
                        "mtp_num_layers is 0; set mtp_num_layers or drop the key",
                        ct_config_origin(c, "mtp_loss_scaling_factor"));
  if (c->mtp_num_layers > 0 && c->use_peft)
    return ct_set_error(CT_ECONFIG, "%s: key 'mtp_num_layers': multi-token prediction trains new weights beside "
                        "the model, and use_peft trains adapters only; drop one of the two",
                        ct_config_origin(c, "mtp_num_layers"));
  if (c->mtp_num_layers > 0 && c->mtp_num_layers > c->max_length - 2)
    return ct_set_error(CT_ECONFIG, "%s: key 'mtp_num_layers': depth %ld predicts the token %ld places ahead, "
                        "which no sequence of max_length %ld tokens has a target for; use at most %ld",
                        ct_config_origin(c, "mtp_num_layers"), (long)c->mtp_num_layers, (long)c->mtp_num_layers + 1,
                        (long)c->max_length, (long)(c->max_length - 2 > 0 ? c->max_length - 2 : 0));
  const char *ev = c->eval_dataset_path[0] ? NULL : c->eval_steps > 0 ? "eval_steps" : c->eval_on_start ? "eval_on_start" : NULL;
  if (ev)
    return ct_set_error(CT_ECONFIG, "%s: key '%s' evaluates on eval_dataset_path, which is not set; set it or "
                        "drop the key", ct_config_origin(c, ev), ev);
  if (c->use_peft && c->adapter_path[0] && c->resume_from_checkpoint[0])
    return ct_set_error(CT_ECONFIG, "%s: key 'adapter_path': resume_from_checkpoint already restores the "
                        "adapters; give one of the two", ct_config_origin(c, "adapter_path"));
  return 0;
}

void ct_train_start(ct_train *tr, ct_config *cfg, ct_trainer_kind kind, int argc, char **argv,
                    int (*check)(const ct_config *cfg)) {
  memset(tr, 0, sizeof *tr);
  tr->name = ct_trainer_name(kind);
  ct_die_name(tr->name);  // (a trainer's own fatal errors: ct_die)
  int usage = ct_config_usage(kind, argc, argv);  // --help, -h, or no arguments at all
  if (usage >= 0) exit(usage);
  ct_blas_init(argc, argv);
  if (ct_blas_room(1, CT_MPI_INIT_BYTES, "MPI's start", NULL)) ct_train_die(tr, CT_ENOMEM, NULL);
  if (ct_dist_init(&argc, &argv)) ct_train_die(tr, CT_EMPI, NULL);
  int rc = ct_config_from_args(cfg, kind, argc, argv);  // every failure here is the config's
  if (!rc && ((rc = ct_config_check_required(cfg)) || (rc = check_common_keys(cfg)) || (check && (rc = check(cfg)))))
    ct_config_free(cfg);
  if (rc) ct_train_die(tr, CT_ECONFIG, NULL);
  rc = ct_train_setup(tr, cfg);
  tr->name = ct_trainer_name(kind);  // (setup cleared the struct)
  if (rc) ct_train_die(tr, rc, NULL);
  const ct_model_config *mc = &tr->model.cfg;
  ct_log_info(&tr->log, "model: %s, %d layers, hidden %d, %.1fM parameters%s%s", mc->model_type,
              mc->num_layers, mc->hidden_size, tr->model.n_floats / 1e6,
              tr->resumed_from[0] ? ", resumed from " : "", tr->resumed_from);
}

int ct_train_finish(ct_train *tr, bool stop) {
  if (!stop) {
    if (ct_train_save_final(tr)) ct_train_die(tr, CT_EIO, "saving the model");
    ct_train_log_done(tr);
  }
  ct_train_release(tr);
  return stop ? 128 + SIGINT : 0;  // (CT_STOP_AFTER_STEP's stop: as an interrupt's)
}

void ct_train_release(ct_train *tr) {
  ct_config *cfg = tr->cfg;
  ct_train_free(tr);
  ct_config_free(cfg);
  ct_pool_free();
  ct_dist_finalize();
}
