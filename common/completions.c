// completions: the completions.jsonl log (rows built, gathered to rank 0, appended and
// synced) and the num_completions_to_print blocks on stderr. What goes into a row beyond
// the common fields is the trainer's.
#include "completions.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist.h"
#include "error.h"
#include "fs.h"
#include "unicode.h"

int ct_completions_open(ct_completions *c, const char *output_dir, bool on, int print_n, long resume_step,
                        ct_log *log) {
  memset(c, 0, sizeof *c);
  c->on = on;
  c->print_n = print_n;
  c->log = log;
  int rc = ct_path_join(c->path, sizeof c->path, output_dir, "completions.jsonl");
  if (rc || !on || ct_dist_rank() != 0) return rc;
  if (resume_step > 0) return ct_log_keep_steps(c->path, resume_step);
  FILE *f = fopen(c->path, "w");
  if (!f || fclose(f)) return ct_set_error(CT_EIO, "%s: cannot write: %s", c->path, strerror(errno));
  return 0;
}

json_t *ct_completion_prompt(const json_t *row) {
  static const char *const keys[] = {"prompt", "messages", "prompt_input_ids"};
  for (int k = 0; k < 3; k++) {
    json_t *p = json_object_get(row, keys[k]);
    if (p) return p;
  }
  return NULL;
}

json_t *ct_completion_row(long step, json_t *prompt, const char *text, const int *ids, const float *logprobs,
                          int n, const char *finish_reason) {
  json_t *jid = json_array(), *jlp = json_array();
  for (int i = 0; i < n; i++) {
    json_array_append_new(jid, json_integer(ids[i]));
    json_array_append_new(jlp, json_real(logprobs[i]));
  }
  size_t len;
  char *valid = ct_utf8_lossy(text, strlen(text), &len);  // a sample may end inside a character
  json_t *row = valid ? json_pack("{s:I,s:O,s:s%,s:o,s:o,s:s}", "step", (json_int_t)step, "prompt",
                                  prompt ? prompt : json_null(), "completion", valid, len, "completion_ids", jid,
                                  "logprobs", jlp, "finish_reason", finish_reason)
                      : NULL;
  if (!valid) json_decref(jid), json_decref(jlp);
  free(valid);
  return row;
}

// One line of stderr per field, at most `max` bytes of it, newlines shown as \n.
static void print_field(const char *name, const char *s, size_t max) {
  fprintf(stderr, "  %s: ", name);
  size_t i = 0;
  for (; s[i] && i < max; i++) s[i] == '\n' ? fputs("\\n", stderr) : fputc(s[i], stderr);
  fputs(s[i] ? " ...\n" : "\n", stderr);
}

static void print_rows(const ct_completions *c, const char *text) {
  int shown = 0;
  for (const char *line = text; *line && shown < c->print_n; shown++) {
    const char *end = strchr(line, '\n');
    json_t *r = json_loadb(line, end ? (size_t)(end - line) : strlen(line), 0, NULL);
    json_t *p = json_object_get(r, "prompt"), *rw = json_object_get(r, "reward");
    char *ps = json_is_string(p) ? strdup(json_string_value(p)) : json_dumps(p, JSON_COMPACT | JSON_ENCODE_ANY);
    char reward[48] = "";
    if (json_is_number(rw)) snprintf(reward, sizeof reward, ", reward %.4g", json_number_value(rw));
    ct_log_info(c->log, "completion %d of step %lld%s:", shown + 1,
                (long long)json_integer_value(json_object_get(r, "step")), reward);
    if (c->log->active) {
      print_field("prompt", ps ? ps : "", 300);
      print_field("completion", json_string_value(json_object_get(r, "completion")) ?: "", 300);
    }
    free(ps);
    json_decref(r);
    line = end ? end + 1 : line + strlen(line);
  }
}

// Rank 0 appends text to the file and syncs it.
static int write_synced(const char *path, const char *text, size_t len) {
  FILE *f = fopen(path, "a");
  int rc = 0;
  if (!f || fwrite(text, 1, len, f) != len || fflush(f) || fsync(fileno(f)))
    rc = ct_set_error(CT_EIO, "%s: cannot append: %s", path, strerror(errno));
  if (f && fclose(f) && !rc) rc = ct_set_error(CT_EIO, "%s: cannot append: %s", path, strerror(errno));
  return rc;
}

int ct_completions_append(ct_completions *c, json_t **rows, int n) {
  if (!c->on) {
    for (int i = 0; i < n; i++) json_decref(rows[i]);
    return 0;
  }
  size_t len = 0, cap = 4096;
  char *local = malloc(cap);
  int rc = local ? 0 : ct_set_error(CT_ENOMEM, "out of memory");
  for (int i = 0; i < n; i++) {
    char *s = rc || !rows[i] ? NULL : json_dumps(rows[i], JSON_COMPACT);  // 17 digits: advantages round-trip
    size_t k = s ? strlen(s) : 0;
    if (!rc && !s) rc = ct_set_error(CT_ENOMEM, "%s: cannot encode a row", c->path);
    if (!rc && len + k + 2 > cap) {
      while (len + k + 2 > cap) cap *= 2;
      char *t = realloc(local, cap);
      if (t) local = t;
      else rc = ct_set_error(CT_ENOMEM, "out of memory");
    }
    if (!rc) memcpy(local + len, s, k), local[len + k] = '\n', len += k + 1;
    free(s);
    json_decref(rows[i]);
  }
  char *all = NULL;
  size_t total;
  rc = ct_dist_max_int(rc ? 1 : 0) ? (rc ? rc : ct_set_error(CT_EIO, "another rank failed to log completions"))
                                   : ct_dist_gather_text(local ? local : "", len, &all, &total);
  if (!rc && all) {
    rc = write_synced(c->path, all, total);
    if (!rc && c->print_n > 0) print_rows(c, all);
  }
  free(local);
  free(all);
  return rc;
}
