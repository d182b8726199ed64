// log: what a user sees while a trainer runs — output_dir/metrics.jsonl (one JSON object
// per logged step, TRL metric names), a live progress line on a terminal (plain lines
// otherwise), and informational messages. Only rank 0 writes.
#pragma once
#include <jansson.h>
#include <stdbool.h>

typedef struct {
  char path[4096];
  bool active;   // rank 0
  bool tty;      // stderr is a terminal: redraw one progress line
  bool line_open;
  double t0;     // seconds, when the run (or resume) started
  long step0;    // step at t0
  long total;
  char phase[32];     // the phase within a step that ct_log_phase last showed
  double phase_t0;    // when it started
  double last_shown;  // when a phase line was last drawn (terminal) or printed (log)
  double quiet_s;     // a log's longest silence within a step: 30 s (CT_PROGRESS_SECONDS)
  struct {            // the phase line ct_log_phase last showed or kept, for ct_log_beat
    long step, done, total;
    char unit[32], extra[64];
    double tokens;
  } at;
  json_t *train_extra;  // or NULL: metrics common/ keeps over the logging window (QK-Clip's),
                        // merged into the next training line (one with "learning_rate"), then dropped
} ct_log;

// Opens output_dir/metrics.jsonl for appending. When resuming at `resume_step`, lines
// of later steps (written after that checkpoint by the interrupted run) are dropped.
int ct_log_open(ct_log *l, const char *output_dir, long resume_step, long total, bool active);
// Appends one object (takes the reference) and flushes.
int ct_log_metrics(ct_log *l, json_t *obj);
// The progress line: step/total, loss, tokens/s, ETA.
void ct_log_progress(ct_log *l, long step, double loss, double tokens_per_s);
// Progress within a step, for steps that take minutes: `phase` ("rollouts", "training"),
// `done` of `total` `unit`s ("completions", "micro-batches"), `tokens` processed in the
// phase so far, `extra` (e.g. "reward 0.41") or NULL. A phase starts when its name changes
// or done is 0. On a terminal the progress line shows it (redrawn at most 4 times a
// second); otherwise a line is printed at most every 30 s (CT_PROGRESS_SECONDS), so a log is never silent for
// long: "ctune: step 3/10: rollouts 64/128 completions, 812 tok/s, phase ETA 0:41".
void ct_log_phase(ct_log *l, long step, const char *phase, long done, long total, const char *unit,
                  double tokens, const char *extra);
// The heartbeat within a phase's unit of work (a micro-batch of minutes, a slow rollout):
// the phase's line again, with where the work is now ("..., now backward, layer 3/24";
// `what` NULL: nothing added), as often as ct_log_phase shows one. Nothing before the
// first phase.
void ct_log_beat(ct_log *l, const char *what, long done, long total);
// A message line on stderr ("ctune: ..."), keeping the progress line intact; silent
// unless l->active (rank 0).
void ct_log_info(ct_log *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ct_log_close(ct_log *l);
// Rewrites the JSONL file at path keeping only the lines whose "step" is <= max_step (a
// resumed run's logs lose what the interrupted run wrote after its checkpoint). A
// missing file is not an error.
int ct_log_keep_steps(const char *path, long max_step);

double ct_now(void);  // monotonic seconds
