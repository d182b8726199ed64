// train: what a run does between its steps — after a step (a checkpoint when one is due, a
// stop that every rank takes at the same step), the lines that say what it trains and when it
// is done, and the test hooks (CT_FAILPOINT, CT_STOP_AFTER_STEP). A run's start and end, and
// the signal watch that exits, are the executables' (app/run.c, app/watch.c).
#include "train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "dist.h"
#include "error.h"
#include "prof.h"
#include "fs.h"
#include "pool.h"
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
  ct_prof_report(stderr);
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
