// train: the train state every trainer shares — start-up and end of a run, the model and
// its optimizer buffers, data order, the AdamW step with clipping, checkpoints with
// resume, and the frozen reference. A trainer's own loss is not here.
#include "train.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bf16.h"
#include "chat_template.h"
#include "ckpt.h"
#include "dist.h"
#include "dnnl.h"
#include "error.h"
#include "hf.h"
#include "lm.h"
#include "matmul.h"
#include "mem.h"
#include "mtp.h"
#include "fs.h"
#include "pool.h"
#include "safetensors.h"
#include "stop.h"

void ct_failpoint(const char *point) {
  static int hits;
  const char *fp = getenv("CT_FAILPOINT");
  size_t n = strlen(point);
  if (!fp || strncmp(fp, point, n) != 0 || (fp[n] && fp[n] != ':')) return;
  int at = fp[n] == ':' ? atoi(fp + n + 1) : 1;  // "checkpoint:2" = the second time
  if (++hits != at) return;
  double t0 = ct_now();  // 60 s, whatever signals come (a test sends them while it waits)
  while (ct_now() - t0 < 60) sleep(1);
}

// A signal's stop (ct_stop_watch's action, from the next ct_stop_poll): the step in flight is
// abandoned, nothing saved; the latest checkpoint is where the run resumes. Exits 128 +
// the signal, as a shell reports a process the signal ended.
static void stop_now(int sig, void *ctx) {
  ct_train *tr = ctx;
  char ckpt[CT_PATH_MAX];
  long at;
  if (tr->rank == 0 && !ct_ckpt_latest(tr->cfg->output_dir, ckpt, sizeof ckpt, &at))
    ct_log_info(&tr->log, "stopped in step %ld of %ld (%s); resume from %s with resume_from_checkpoint=latest",
                tr->step + 1, tr->total_steps, strsignal(sig), ckpt);
  else
    ct_log_info(&tr->log, "stopped in step %ld of %ld (%s); no checkpoint was saved yet (save_steps): a new run "
                "starts over", tr->step + 1, tr->total_steps, strsignal(sig));
  ct_log_close(&tr->log);
  ct_dist_abort(128 + sig);
  ct_dist_finalize();
  exit(128 + sig);
}

static void beat(void *ctx, const char *what, long done, long total) {
  ct_train *tr = ctx;
  ct_log_beat(&tr->log, what, done, total);
}

void ct_train_watch_signals(ct_train *tr) {
  // (on a terminal the progress line is cleared first)
  char say[256];
  snprintf(say, sizeof say, "%sctune: stopping: the step in flight is abandoned; the run resumes from its latest "
           "checkpoint (a second Ctrl-C stops at once)", tr->log.tty ? "\r\033[K" : "");
  ct_stop_watch(stop_now, tr, tr->rank == 0 ? say : NULL);
  ct_stop_heartbeat(beat, tr);
}

int ct_train_after_step(ct_train *tr, bool *stop) {
  const ct_config *c = tr->cfg;
  int rc = 0;
  ct_stop_poll(NULL, 0, 0);  // a signal since the last poll stops here, saving nothing
  tr->save_pending |= c->save_steps > 0 && tr->step % c->save_steps == 0;
  tr->stop_pending |= ct_failpoint_stop(tr->step);
  *stop = false;
  // a checkpoint or a stop waits for the batch's last step, or DiLoCo's next sync
  if (tr->mid_batch || tr->outer_pending) return 0;
  if (tr->save_pending && (rc = ct_train_save_checkpoint(tr))) return ct_wrap_error(rc, "saving a checkpoint");
  tr->save_pending = false;
  *stop = ct_dist_max_int(tr->stop_pending) != 0;  // every rank stops at the same step
  if (*stop) {
    ct_log_info(&tr->log, "interrupted at step %ld: saving a checkpoint to resume from", tr->step);
    if ((rc = ct_train_save_checkpoint(tr))) return ct_wrap_error(rc, "saving a checkpoint");
  }
  return 0;
}

void ct_train_log_schedule(ct_train *tr, int n_seq, int global, int B, int accum, const char *unit) {
  long steps = tr->total_steps - tr->step;
  const char *s = steps == 1 ? "" : "s";
  if (n_seq < global) {
    ct_log_info(&tr->log, "training %ld step%s of %d %s%s each: the data holds %d, fewer than a full "
                "step's %d (%d per device x %d accumulation x %d ranks), %d threads per rank", steps, s, n_seq,
                unit, n_seq == 1 ? "" : "s", n_seq, global, B, accum, tr->world, ct_pool_threads());
    return;
  }
  char tail[128] = "";
  if (n_seq % global)
    snprintf(tail, sizeof tail, "; each epoch of %d %ss ends with a step of %d", n_seq, unit, n_seq % global);
  ct_log_info(&tr->log, "training %ld step%s of %s%d %ss (%d per device x %d accumulation x %d ranks)%s, "
              "%d threads per rank", steps, s, n_seq % global ? "up to " : "", global, unit, B, accum, tr->world,
              tail, ct_pool_threads());
}

bool ct_train_log_due(const ct_train *tr) {
  const ct_config *c = tr->cfg;
  return tr->step % c->logging_steps == 0 || tr->step == tr->total_steps || (tr->step == 1 && c->logging_first_step);
}

void ct_train_log_done(ct_train *tr) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);  // ru_maxrss is in kilobytes on Linux
  ct_log_info(&tr->log, "done: %ld steps; model saved in %s; peak memory %.0f MiB", tr->step,
              tr->cfg->output_dir, ru.ru_maxrss / 1024.0);
  long steps = tr->step - tr->step0;
  if (tr->world > 1 && steps > 0)
    ct_log_info(&tr->log, "communication: %.3f MB sent per optimizer step by rank 0 (ring count, %ld steps)",
                (ct_dist_bytes_sent() - tr->comm0) / 1e6 / steps, steps);
}

bool ct_failpoint_stop(long step) {
  const char *s = getenv("CT_STOP_AFTER_STEP");
  return s && atol(s) == step;
}

// The rest of the train state is in train_setup.c, train_memory.c, train_reference.c, train_eval.c,
// train_schedule.c, train_update.c, train_overlap.c, train_state.c, train_moments.c and train_save.c.

void ct_train_die(const ct_train *tr, int rc, const char *what) {
  ct_dist_die(tr->name ? tr->name : "ctune", rc == CT_ECONFIG ? 2 : 1, what);
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
                    : !c->use_peft && c->base_dtype != CT_STORE_F32    ? "base_dtype"
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
