// watch: a trainer's signal watch. SIGINT and SIGTERM stop the run at the next ct_stop_poll
// (the step in flight abandoned, nothing saved) and exit 128 + the signal; a long step
// keeps the log alive with ct_log_beat. It exits, so it is the executables', not the library's.
#include "watch.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "dist.h"
#include "stop.h"

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
