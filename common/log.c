// log: metrics.jsonl (append, flush per line; on resume, lines after the checkpoint are
// dropped), the progress line on a terminal, and info lines. Only rank 0 writes.
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fs.h"
#include "error.h"

int ct_log_keep_steps(const char *path, long max_step) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *o = fopen(tmp, "w");
  if (!o) {
    fclose(f);
    return ct_set_error(CT_EIO, "%s: cannot write: %s", tmp, strerror(errno));
  }
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) >= 0) {
    json_t *j = json_loads(line, 0, NULL);
    json_t *s = json_object_get(j, "step");
    if (json_is_integer(s) && json_integer_value(s) <= max_step) fputs(line, o);
    json_decref(j);
  }
  free(line);
  fclose(f);
  if (fclose(o) || rename(tmp, path)) return ct_set_error(CT_EIO, "%s: cannot rewrite: %s", path, strerror(errno));
  return 0;
}

int ct_log_open(ct_log *l, const char *output_dir, long resume_step, long total, bool active) {
  memset(l, 0, sizeof *l);
  l->active = active;
  l->tty = isatty(2);
  const char *q = getenv("CT_PROGRESS_SECONDS");  // the longest silence of a log (tests: 0)
  l->quiet_s = q && *q ? atof(q) : 30.0;
  l->t0 = ct_now();
  l->step0 = resume_step;
  l->total = total;
  int rc = ct_path_join(l->path, sizeof l->path, output_dir, "metrics.jsonl");
  if (rc || !active) return rc;
  if (resume_step > 0) return ct_log_keep_steps(l->path, resume_step);
  FILE *f = fopen(l->path, "w");  // a fresh run starts a fresh file
  if (!f) return ct_set_error(CT_EIO, "%s: cannot write: %s", l->path, strerror(errno));
  fclose(f);
  return 0;
}


static void end_line(ct_log *l) {
  if (l->line_open) fputc('\n', stderr);
  l->line_open = false;
}

int ct_log_metrics(ct_log *l, json_t *obj) {
  int rc = 0;
  if (l->train_extra && json_object_get(obj, "learning_rate")) {
    json_object_update(obj, l->train_extra);
    json_decref(l->train_extra);
    l->train_extra = NULL;
  }
  if (l->active) {
    FILE *f = fopen(l->path, "a");
    char *s = json_dumps(obj, JSON_COMPACT | JSON_REAL_PRECISION(8));
    if (!f || !s || fprintf(f, "%s\n", s) < 0)
      rc = ct_set_error(CT_EIO, "%s: cannot append: %s", l->path, s ? strerror(errno) : "out of memory");
    if (f && fclose(f)) rc = ct_set_error(CT_EIO, "%s: cannot append: %s", l->path, strerror(errno));
    free(s);
    char *p = json_dumps(obj, JSON_COMPACT | JSON_REAL_PRECISION(6));  // and on stderr
    end_line(l);
    if (p) fprintf(stderr, "%s\n", p);
    free(p);
  }
  json_decref(obj);
  return rc;
}

static void fmt_time(char *buf, size_t n, double s) {
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

void ct_log_progress(ct_log *l, long step, double loss, double tokens_per_s) {
  if (!l->active || !l->tty) return;
  double el = ct_now() - l->t0;
  double per = step > l->step0 ? el / (step - l->step0) : 0;
  char eta[32], spent[32];
  fmt_time(eta, sizeof eta, per * (l->total - step));
  fmt_time(spent, sizeof spent, el);
  fprintf(stderr, "\r\033[Kstep %ld/%ld  loss %.4f  %.0f tok/s  %s elapsed  ETA %s", step, l->total,
          loss, tokens_per_s, spent, eta);
  fflush(stderr);
  l->line_open = true;
}

// Draws (terminal) or prints (log) the kept phase line, `where` appended.
static void show_phase(ct_log *l, double now, const char *where) {
  l->last_shown = now;
  double el = now - l->phase_t0;
  long done = l->at.done, total = l->at.total;
  char eta[32];
  fmt_time(eta, sizeof eta, done > 0 ? el / done * (total - done) : 0);
  char line[384];
  int n = snprintf(line, sizeof line, "step %ld/%ld: %s %ld/%ld %s, %.0f tok/s", l->at.step, l->total, l->phase,
                   done, total, l->at.unit, el > 0 ? l->at.tokens / el : 0);
  if (done > 0 && n < (int)sizeof line) n += snprintf(line + n, sizeof line - (size_t)n, ", phase ETA %s", eta);
  if (l->at.extra[0] && n < (int)sizeof line) n += snprintf(line + n, sizeof line - (size_t)n, ", %s", l->at.extra);
  if (where && n < (int)sizeof line) snprintf(line + n, sizeof line - (size_t)n, "; now %s", where);
  if (l->tty) {
    fprintf(stderr, "\r\033[K%s", line);
    fflush(stderr);
    l->line_open = true;
  } else {
    fprintf(stderr, "ctune: %s\n", line);
  }
}

void ct_log_phase(ct_log *l, long step, const char *phase, long done, long total, const char *unit,
                  double tokens, const char *extra) {
  if (!l->active) return;
  double now = ct_now();
  if (done == 0 || strncmp(l->phase, phase, sizeof l->phase - 1)) {
    snprintf(l->phase, sizeof l->phase, "%s", phase);
    l->phase_t0 = now;
    if (!l->tty) l->last_shown = now;  // the first log line comes 30 s into a phase
  }
  l->at.step = step, l->at.done = done, l->at.total = total, l->at.tokens = tokens;
  snprintf(l->at.unit, sizeof l->at.unit, "%s", unit);
  snprintf(l->at.extra, sizeof l->at.extra, "%s", extra ? extra : "");
  if (now - l->last_shown < (l->tty ? 0.25 : l->quiet_s)) return;
  show_phase(l, now, NULL);
}

void ct_log_beat(ct_log *l, const char *what, long done, long total) {
  if (!l->active || !l->phase[0]) return;
  double now = ct_now();
  if (now - l->last_shown < (l->tty ? 0.25 : l->quiet_s)) return;
  char where[96] = "";
  if (what && total > 0) snprintf(where, sizeof where, "%s %ld/%ld", what, done, total);
  else if (what) snprintf(where, sizeof where, "%s %ld", what, done);
  show_phase(l, now, what ? where : NULL);
}

void ct_log_info(ct_log *l, const char *fmt, ...) {
  if (!l->active) return;
  end_line(l);
  va_list ap;
  va_start(ap, fmt);
  fputs("ctune: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

void ct_log_close(ct_log *l) {
  end_line(l);
  json_decref(l->train_extra);
  l->train_extra = NULL;
}
