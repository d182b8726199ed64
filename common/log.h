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
} ct_log;

// Opens output_dir/metrics.jsonl for appending. When resuming at `resume_step`, lines
// of later steps (written after that checkpoint by the interrupted run) are dropped.
int ct_log_open(ct_log *l, const char *output_dir, long resume_step, long total, bool active);
// Appends one object (takes the reference) and flushes.
int ct_log_metrics(ct_log *l, json_t *obj);
// The progress line: step/total, loss, tokens/s, ETA.
void ct_log_progress(ct_log *l, long step, double loss, double tokens_per_s);
// A message line on stderr ("ctune: ..."), keeping the progress line intact; silent
// unless l->active (rank 0).
void ct_log_info(ct_log *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ct_log_close(ct_log *l);
// Rewrites the JSONL file at path keeping only the lines whose "step" is <= max_step (a
// resumed run's logs lose what the interrupted run wrote after its checkpoint). A
// missing file is not an error.
int ct_log_keep_steps(const char *path, long max_step);

double ct_now(void);  // monotonic seconds
