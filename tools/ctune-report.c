// ctune-report: the curves of one or more runs as one self-contained HTML page — inline
// SVG, no script, no fonts, styles or images fetched from anywhere — read from each
// run's DIR/metrics.jsonl (x = optimizer step), with several runs overlaid, one colour each.
//
//   ctune-report DIR [DIR ...] [out=FILE]
//
// Writes out=FILE; by default DIR/report.html for one run (beside its metrics.jsonl) and
// ./report.html for several. Prints the path it wrote on stdout.
//
// Charts: one per numeric metric key found in any run; keys users look at first come in a
// fixed order (loss, learning_rate, grad_norm, tokens_per_s, then GRPO's, DPO's,
// distillation's and SFT's metrics: `chart_order` below), each eval_X right after X;
// every other key follows in the order it first appears, so new metrics appear without a
// change here. Nothing is smoothed; y is linear; every chart shares one step axis.
// A line is a train line when it holds a non-eval metric, an eval line when it holds an
// eval_* metric; a run's curve breaks (a gap) at a line of its kind that lacks the key
// or holds null or NaN (bare NaN / Infinity, as Python writes them, read as null).
// A curve has one vertex per value, except past 4 values per pixel column, where each
// column keeps its first, lowest, highest and last value.
// Per run: the last metrics line, the last line of its log (DIR/*.log, or DIR.log beside
// DIR as tests/ and scripts/demo.sh write it: a trainer itself leaves no log in
// output_dir) and the resolved DIR/config.yml.
// Exit status: 0 written; 1 bad input (a missing directory or metrics.jsonl, a malformed
// line: one line on stderr naming the file and line); 2 usage. An empty metrics.jsonl is
// no error: the page says there are no metrics yet. A last line without its newline
// that does not parse (a trainer writing it right now) is skipped with a warning.
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "error.h"
#include "fs.h"

// ------------------------------------------------------------------------------- runs

typedef struct {
  char *key;
  bool eval;     // an eval_* key: eval lines without it are its gaps
  long touched;  // the line that last gave it a value
  long n, cap;
  long *step;    // (n,) x
  double *val;   // (n,) y; NaN marks a gap
} rp_series;

typedef struct {
  const char *dir;        // as given on the command line
  char *label;            // the directory's name (its path when two runs share a name)
  char trainer[16];       // from config.yml's first line, "" when unknown
  long n_lines, n_train, n_eval, last_step;
  long partial_line;      // a skipped unfinished last line, 0 if none
  char *last_line;        // the last metrics line, as read
  char *config;           // DIR/config.yml, NULL when absent
  char *log_name[4];      // logs found, and each one's last line
  char *log_line[4];
  int n_logs;
  rp_series *s;
  int ns, cap;
} rp_run;

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) {
    fputs("ctune-report: out of memory\n", stderr);
    exit(1);
  }
  return q;
}

static char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  return memcpy(xrealloc(NULL, n), s, n);
}

static bool is_eval_key(const char *k) { return !strncmp(k, "eval_", 5); }

static rp_series *run_series(rp_run *r, const char *key) {
  for (int i = 0; i < r->ns; i++)
    if (!strcmp(r->s[i].key, key)) return &r->s[i];
  if (r->ns == r->cap) {
    r->cap = r->cap ? 2 * r->cap : 16;
    r->s = xrealloc(r->s, r->cap * sizeof *r->s);
  }
  rp_series *s = &r->s[r->ns++];
  memset(s, 0, sizeof *s);
  s->key = xstrdup(key);
  s->eval = is_eval_key(key);
  return s;
}

// Appends a point; v = NaN records a gap (never before the first point, never two).
static void series_push(rp_series *s, long step, double v) {
  if (isnan(v) && (s->n == 0 || isnan(s->val[s->n - 1]))) return;
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 64;
    s->step = xrealloc(s->step, s->cap * sizeof *s->step);
    s->val = xrealloc(s->val, s->cap * sizeof *s->val);
  }
  s->step[s->n] = step;
  s->val[s->n++] = v;
}

// A copy of line with bare NaN, Infinity and -Infinity (outside strings) as null.
static char *nan_to_null(const char *line) {
  static const char *const bare[] = {"-Infinity", "Infinity", "NaN"};
  char *out = xrealloc(NULL, 2 * strlen(line) + 1), *o = out;
  bool in_str = false;
  for (const char *p = line; *p;) {
    if (in_str) {
      if (*p == '\\' && p[1]) *o++ = *p++;
      else if (*p == '"') in_str = false;
      *o++ = *p++;
      continue;
    }
    if (*p == '"') in_str = true;
    size_t m = 0;
    for (int i = 0; i < 3 && !m; i++)
      if (!strncmp(p, bare[i], strlen(bare[i]))) m = strlen(bare[i]);
    if (m) {
      memcpy(o, "null", 4);
      o += 4;
      p += m;
    } else {
      *o++ = *p++;
    }
  }
  *o = 0;
  return out;
}

// One metrics line (trimmed, non-empty) into the run's series.
static int run_add_line(rp_run *r, const char *path, long lineno, const char *line, bool complete) {
  char *text = nan_to_null(line);
  json_error_t e;
  json_t *j = json_loads(text, 0, &e);
  free(text);
  if (!j && !complete) {  // an unfinished last line: the run may be writing it
    r->partial_line = lineno;
    return 0;
  }
  if (!j) return ct_set_error(CT_EFORMAT, "%s:%ld: not valid JSON: %s (column %d)", path, lineno, e.text, e.column);
  json_t *st = json_object_get(j, "step");
  double sv = json_is_number(st) ? json_number_value(st) : NAN;
  if (!json_is_object(j) || !(sv == floor(sv) && fabs(sv) < 1e15)) {
    bool obj = json_is_object(j);
    json_decref(j);
    return ct_set_error(CT_EFORMAT, obj ? "%s:%ld: no integer \"step\" (each metrics line needs one)"
                                        : "%s:%ld: not a JSON object", path, lineno);
  }
  long step = (long)sv;
  const char *k;
  json_t *v;
  bool train = false, eval = false;  // the line's kinds
  json_object_foreach(j, k, v) {
    if (strcmp(k, "step") && strcmp(k, "epoch") && (json_is_number(v) || json_is_null(v)))
      *(is_eval_key(k) ? &eval : &train) = true;
  }
  json_object_foreach(j, k, v) {
    if (!strcmp(k, "step") || !json_is_number(v)) continue;
    rp_series *s = run_series(r, k);
    series_push(s, step, json_number_value(v));
    s->touched = lineno;
  }
  for (int i = 0; i < r->ns; i++)
    if (r->s[i].touched != lineno && (r->s[i].eval ? eval : train)) series_push(&r->s[i], step, NAN);
  json_decref(j);
  r->n_lines++;
  r->n_train += train;
  r->n_eval += eval;
  r->last_step = step;
  free(r->last_line);
  r->last_line = xstrdup(line);
  return 0;
}

static int run_read_metrics(rp_run *r, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return ct_set_error(CT_EIO, "%s: cannot open: %s (is %s a run's output_dir?)", path, strerror(errno), r->dir);
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  long lineno = 0;
  int rc = 0;
  while (!rc && (len = getline(&line, &cap, f)) >= 0) {
    lineno++;
    bool complete = len > 0 && line[len - 1] == '\n';
    while (len > 0 && isspace((unsigned char)line[len - 1])) line[--len] = 0;
    if (len > 0) rc = run_add_line(r, path, lineno, line, complete);
  }
  if (!rc && ferror(f)) rc = ct_set_error(CT_EIO, "%s: read error", path);
  free(line);
  fclose(f);
  return rc;
}

// The last non-empty line of a log, as a terminal last showed it: the text after its
// last carriage return, without escape sequences. NULL when there is none.
static char *log_last_line(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char buf[1 << 16];
  long size = fseek(f, 0, SEEK_END) ? -1 : ftell(f);
  if (size > (long)sizeof buf - 1) fseek(f, size - (long)sizeof buf + 1, SEEK_SET);
  else rewind(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  for (;;) {  // strip trailing blank lines, then take the last line's last redraw
    while (n > 0 && isspace((unsigned char)buf[n - 1])) buf[--n] = 0;
    char *nl = strrchr(buf, '\n'), *start = nl ? nl + 1 : buf, *cr = strrchr(start, '\r');
    if (cr && cr[1]) start = cr + 1;
    else if (cr) {  // a line that ends in a bare carriage return: drop it and look again
      *cr = 0;
      n = (size_t)(cr - buf);
      continue;
    }
    if (!*start) return NULL;
    char *out = xrealloc(NULL, strlen(start) + 1), *o = out;
    for (const char *p = start; *p; p++) {
      if (*p == '\033' && p[1] == '[') {  // CSI: parameters, then one final byte
        p += 2;
        while (*p && !(*p >= 0x40 && *p <= 0x7e)) p++;
        if (!*p) break;
        continue;
      }
      *o++ = *p;
    }
    *o = 0;
    return out;
  }
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// DIR/*.log (by name), then DIR.log beside DIR: at most 4.
static void run_find_logs(rp_run *r) {
  char *names[64];
  int nn = 0;
  DIR *d = opendir(r->dir);
  for (struct dirent *e; d && (e = readdir(d)) && nn < 64;) {
    size_t l = strlen(e->d_name);
    if (l > 4 && !strcmp(e->d_name + l - 4, ".log")) names[nn++] = xstrdup(e->d_name);
  }
  if (d) closedir(d);
  if (nn) qsort(names, (size_t)nn, sizeof *names, cmp_str);
  char path[CT_PATH_MAX];
  for (int i = 0; i < nn; i++) {
    struct stat st;
    if (r->n_logs < 4 && !ct_path_join(path, sizeof path, r->dir, names[i]) && !stat(path, &st) &&
        S_ISREG(st.st_mode)) {
      r->log_name[r->n_logs] = xstrdup(names[i]);
      r->log_line[r->n_logs++] = log_last_line(path);
    }
    free(names[i]);
  }
  size_t l = strlen(r->dir);
  while (l > 1 && r->dir[l - 1] == '/') l--;
  struct stat st;
  if (r->n_logs < 4 && l + 5 < sizeof path) {
    snprintf(path, sizeof path, "%.*s.log", (int)l, r->dir);
    if (!stat(path, &st) && S_ISREG(st.st_mode)) {
      r->log_name[r->n_logs] = xstrdup(path);
      r->log_line[r->n_logs++] = log_last_line(path);
    }
  }
}

static int run_load(rp_run *r, const char *dir) {
  memset(r, 0, sizeof *r);
  r->dir = dir;
  struct stat st;
  if (stat(dir, &st)) return ct_set_error(CT_EIO, "%s: %s", dir, strerror(errno));
  if (!S_ISDIR(st.st_mode)) return ct_set_error(CT_EIO, "%s: not a directory (give a run's output_dir)", dir);
  char path[CT_PATH_MAX];
  int rc = ct_path_join(path, sizeof path, dir, "metrics.jsonl");
  if (!rc) rc = run_read_metrics(r, path);
  if (rc) return rc;
  size_t len;
  bool missing;
  if (!ct_path_join(path, sizeof path, dir, "config.yml") && ct_read_file(path, &r->config, &len, &missing))
    r->config = NULL;  // unreadable: shown as absent
  const char *head = "# ctune configuration, resolved for ";
  if (r->config && !strncmp(r->config, head, strlen(head))) {
    const char *t = r->config + strlen(head);
    size_t n = 0;
    while (n < sizeof r->trainer - 1 && (isalnum((unsigned char)t[n]) || t[n] == '_')) n++;
    memcpy(r->trainer, t, n);
  }
  run_find_logs(r);
  // the label: the directory's own name ("." and ".." resolved)
  char *real = realpath(dir, NULL);
  const char *p = real ? real : dir;
  const char *slash = strrchr(p, '/');
  r->label = xstrdup(slash && slash[1] ? slash + 1 : p);
  free(real);
  return 0;
}

static void run_free(rp_run *r) {
  for (int i = 0; i < r->ns; i++) {
    free(r->s[i].key);
    free(r->s[i].step);
    free(r->s[i].val);
  }
  for (int i = 0; i < r->n_logs; i++) {
    free(r->log_name[i]);
    free(r->log_line[i]);
  }
  free(r->s);
  free(r->label);
  free(r->last_line);
  free(r->config);
}

static rp_series *run_find(const rp_run *r, const char *key) {
  for (int i = 0; i < r->ns; i++)
    if (!strcmp(r->s[i].key, key)) return &r->s[i];
  return NULL;
}

// ------------------------------------------------------------------ which charts, in what order

// Known keys (without eval_), in the order their charts come. '*' matches one or more
// characters other than '/'. A key no pattern matches comes after all of these.
static const char *const chart_order[] = {
    "loss", "learning_rate", "grad_norm", "tokens_per_s",
    // GRPO
    "reward", "reward_std", "rewards/*/mean", "tools/call_frequency", "tools/failure_frequency", "turns/mean",
    "env/*", "frac_reward_zero_std", "kl", "clip_ratio/low_mean",
    "clip_ratio/high_mean", "clip_ratio/*", "completions/mean_length", "completions/clipped_ratio",
    "completions/*",
    // DPO
    "rewards/margins", "rewards/accuracies", "rewards/chosen", "rewards/rejected", "logps/chosen",
    "logps/rejected",
    // distillation
    "distill/soft_loss", "distill/hard_loss", "distill/student_perplexity", "distill/teacher_perplexity",
    // SFT (and the entropy GRPO logs too)
    "mean_token_accuracy", "sequence_accuracy", "entropy", "z_loss", "mtp_*",
};
enum { N_ORDER = sizeof chart_order / sizeof *chart_order };

static bool glob_match(const char *p, const char *s) {
  if (*p == '*') {
    for (const char *t = s; *t && *t != '/'; t++)
      if (glob_match(p + 1, t + 1)) return true;
    return false;
  }
  if (*p != *s) return false;
  return !*p || glob_match(p + 1, s + 1);
}

typedef struct {
  const char *key;  // owned by a run's series
  int rank;         // index in chart_order, N_ORDER when unknown
  int first;        // first appearance of the key or its train/eval twin
  int seen;         // first appearance of the key itself
} rp_chart;

static const char *base_key(const char *k) { return is_eval_key(k) ? k + 5 : k; }

static int chart_cmp(const void *a, const void *b) {
  const rp_chart *x = a, *y = b;
  if (x->rank != y->rank) return x->rank - y->rank;
  if (x->first != y->first) return x->first - y->first;
  if (is_eval_key(x->key) != is_eval_key(y->key)) return is_eval_key(x->key) - is_eval_key(y->key);
  return x->seen - y->seen;
}

// The charts to draw, sorted: every key of any run once. Returns how many.
static int charts_list(const rp_run *runs, int nr, rp_chart **out) {
  rp_chart *c = NULL;
  int n = 0;
  for (int i = 0; i < nr; i++)
    for (int j = 0; j < runs[i].ns; j++) {
      const char *k = runs[i].s[j].key;
      int f = 0;
      while (f < n && strcmp(c[f].key, k)) f++;
      if (f < n) continue;
      c = xrealloc(c, (n + 1) * sizeof *c);
      c[n] = (rp_chart){k, N_ORDER, n, n};
      for (int p = 0; p < N_ORDER; p++)
        if (glob_match(chart_order[p], base_key(k))) {
          c[n].rank = p;
          break;
        }
      n++;
    }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < i; j++)
      if (!strcmp(base_key(c[i].key), base_key(c[j].key))) c[i].first = c[j].first < c[i].first ? c[j].first : c[i].first;
  if (n) qsort(c, (size_t)n, sizeof *c, chart_cmp);
  *out = c;
  return n;
}

// ------------------------------------------------------------------------- HTML and SVG text

// Writes s (n bytes) escaped for HTML/XML text and attribute values: markup characters as
// references; control characters and bytes that are not UTF-8 as '?'.
static void put_esc(FILE *o, const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s, *end = p + n;
  while (p < end) {
    unsigned c = *p;
    if (c == '&') fputs("&amp;", o);
    else if (c == '<') fputs("&lt;", o);
    else if (c == '>') fputs("&gt;", o);
    else if (c == '"') fputs("&quot;", o);
    else if (c == '\'') fputs("&#39;", o);
    else if (c < 0x20 && c != '\n' && c != '\t') fputc('?', o);
    else if (c < 0x80) fputc((int)c, o);
    else {  // a UTF-8 sequence: shortest form, no surrogates, at most U+10FFFF
      int len = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
      if (c >= 0xf5) len = 0;
      unsigned cp = len == 4 ? c & 7 : len == 3 ? c & 15 : c & 31;
      for (int i = 1; i < len; i++) {
        if (p + i >= end || (p[i] & 0xc0) != 0x80) {
          len = 0;
          break;
        }
        cp = cp << 6 | (p[i] & 0x3f);
      }
      if (len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp < 0xe000))) len = 0;
      if (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) len = 0;
      if (!len) {
        fputc('?', o);
        p++;
        continue;
      }
      fwrite(p, 1, (size_t)len, o);
      p += len;
      continue;
    }
    p++;
  }
}

static void esc(FILE *o, const char *s) { put_esc(o, s, strlen(s)); }

// open, s escaped, close: a text inside its markup ("<code>", s, "</code>").
static void esc_in(FILE *o, const char *open, const char *s, const char *close) {
  fputs(open, o);
  esc(o, s);
  fputs(close, o);
}

// Tableau's ten colours; past ten runs the cycle repeats with dashes.
static const char *const colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
static const char *const dashes[] = {"", " stroke-dasharray=\"6 3\"", " stroke-dasharray=\"2 2\""};

static const char *run_colour(int i) { return colours[i % 10]; }
static const char *run_dash(int i) { return dashes[i / 10 % 3]; }

// A run's colour (and dashes) as a short line, for the HTML around the charts.
static void swatch_write(FILE *o, int i) {
  fprintf(o, "<svg class=\"swatch\" width=\"22\" height=\"6\"><line x1=\"0\" x2=\"22\" y1=\"3\" y2=\"3\" "
             "stroke=\"%s\"%s stroke-width=\"3\"/></svg>", run_colour(i), run_dash(i));
}

// ------------------------------------------------------------------------------- axes

typedef struct {
  double lo, hi;  // the axis spans [lo, hi]
  double tick;    // distance between ticks: 1, 2 or 5 times a power of ten
} rp_axis;

// Covers [min, max] with round ticks, about `target` of them.
static rp_axis axis_make(double min, double max, int target) {
  if (!(max - min < INFINITY)) min = -1e300, max = 1e300;  // beyond what ticks can show
  if (min == max) {
    double pad = min == 0 ? 1 : fabs(min) * 0.1;
    min -= pad;
    max += pad;
  }
  double raw = (max - min) / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
  rp_axis a;
  a.tick = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
  a.lo = floor(min / a.tick + 1e-6) * a.tick;  // -1e-17 rounds to 0, not to -tick
  a.hi = ceil(max / a.tick - 1e-6) * a.tick;
  return a;
}

// A tick's label: as many decimals as the tick distance needs; k, M, G past 10^4.
static void tick_label(char *buf, size_t n, double v, const rp_axis *a) {
  double big = fmax(fabs(a->lo), fabs(a->hi)), div = 1;
  const char *unit = "";
  if (big >= 1e13 || a->tick < 1e-4) {
    snprintf(buf, n, "%.3g", fabs(v) < a->tick * 1e-6 ? 0.0 : v);
    return;
  }
  if (big >= 1e10) div = 1e9, unit = "G";
  else if (big >= 1e7) div = 1e6, unit = "M";
  else if (big >= 1e4) div = 1e3, unit = "k";
  double t = a->tick / div;
  int dec = t >= 1 ? 0 : (int)ceil(-log10(t) - 1e-9);
  double x = v / div;
  if (fabs(x) < t * 1e-6) {  // "0", not "-0.000" nor "0k"
    snprintf(buf, n, "0");
    return;
  }
  snprintf(buf, n, "%.*f%s", dec, x, unit);
}

// ------------------------------------------------------------------------------- charts

// Chart geometry, in pixels: the plot area is [PL, PL + PW] x [PT, PT + PH].
enum { CW = 480, PL = 64, PW = 400, PT = 34, PH = 180, LEGEND_Y = 262, LEGEND_ROW = 16 };
enum { MARKERS_MAX = 30 };          // a curve this short also gets a dot per value
enum { VERTICES_PER_COLUMN = 4 };   // past this many values per pixel column, thin them

static double px_x(const rp_axis *x, double v) { return PL + (v - x->lo) / (x->hi - x->lo) * PW; }
static double px_y(const rp_axis *y, double v) { return PT + PH - (v - y->lo) / (y->hi - y->lo) * PH; }

static void fmt_value(char *buf, size_t n, double v) {
  snprintf(buf, n, fabs(v) >= 1e4 && fabs(v) < 1e9 ? "%.0f" : "%.4g", v);  // 38370, not 3.837e+04
}

// The vertices a curve keeps: all of them, or per pixel column (within a segment between
// gaps) the first, lowest, highest and last. keep[i] says whether value i stays.
static void curve_thin(const rp_series *s, const rp_axis *x, bool *keep) {
  long finite = 0;
  for (long i = 0; i < s->n; i++) finite += !isnan(s->val[i]);
  for (long i = 0; i < s->n; i++) keep[i] = !isnan(s->val[i]);
  if (finite <= (long)VERTICES_PER_COLUMN * PW) return;
  for (long i = 0; i < s->n;) {
    if (isnan(s->val[i])) {
      i++;
      continue;
    }
    long col = (long)px_x(x, (double)s->step[i]), lo = i, hi = i, j = i;
    while (j < s->n && !isnan(s->val[j]) && (long)px_x(x, (double)s->step[j]) == col) {
      if (s->val[j] < s->val[lo]) lo = j;
      if (s->val[j] > s->val[hi]) hi = j;
      j++;
    }
    for (long k = i; k < j; k++) keep[k] = k == i || k == j - 1 || k == lo || k == hi;
    i = j;
  }
}

// One run's curve in one chart: a path (a new subpath after each gap), and dots where the
// curve is short or a value stands alone between gaps.
static void curve_write(FILE *o, const rp_series *s, const rp_run *r, int ri, const rp_axis *x, const rp_axis *y) {
  bool *keep = xrealloc(NULL, (size_t)s->n * sizeof *keep);
  curve_thin(s, x, keep);
  esc_in(o, "<path class=\"line\" data-key=\"", s->key, "\" data-run=\"");
  esc(o, r->label);
  fprintf(o, "\" fill=\"none\" stroke=\"%s\"%s stroke-width=\"1.6\" stroke-linejoin=\"round\" d=\"", run_colour(ri),
          run_dash(ri));
  bool pen = false;
  long finite = 0;
  for (long i = 0; i < s->n; i++) {
    if (isnan(s->val[i])) pen = false;
    if (!keep[i]) continue;
    fprintf(o, "%c%.1f,%.1f", pen ? 'L' : 'M', px_x(x, (double)s->step[i]), px_y(y, s->val[i]));
    pen = true;
    finite++;
  }
  fputs("\"/>\n", o);
  fprintf(o, "<g class=\"points\" fill=\"%s\">", run_colour(ri));
  for (long i = 0; i < s->n; i++) {
    if (isnan(s->val[i])) continue;
    bool alone = (i == 0 || isnan(s->val[i - 1])) && (i + 1 == s->n || isnan(s->val[i + 1]));
    if (finite > MARKERS_MAX && !alone) continue;
    char v[32];
    fmt_value(v, sizeof v, s->val[i]);
    fprintf(o, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.2\"><title>", px_x(x, (double)s->step[i]), px_y(y, s->val[i]));
    esc(o, r->label);
    fprintf(o, ", step %ld: %s</title></circle>", s->step[i], v);
  }
  fputs("</g>\n", o);
  free(keep);
}

static void chart_write(FILE *o, const char *key, const rp_run *runs, int nr, const rp_axis *x) {
  double min = INFINITY, max = -INFINITY;
  int n_in = 0;  // runs with this key
  for (int i = 0; i < nr; i++) {
    const rp_series *s = run_find(&runs[i], key);
    if (!s) continue;
    n_in++;
    for (long j = 0; j < s->n; j++)
      if (!isnan(s->val[j])) min = fmin(min, s->val[j]), max = fmax(max, s->val[j]);
  }
  rp_axis y = axis_make(min, max, 5);
  int h = LEGEND_Y + LEGEND_ROW * (n_in - 1) + 10;
  fprintf(o, "<svg class=\"chart\" data-key=\"");
  esc(o, key);
  fprintf(o, "\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"", CW, h, CW, h);
  esc(o, key);
  fputs("\" font-family=\"sans-serif\" font-size=\"11\">\n<title>", o);
  esc(o, key);
  fprintf(o, "</title>\n<rect width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n", CW, h);
  fprintf(o, "<text class=\"title\" x=\"%d\" y=\"20\" font-size=\"14\" font-weight=\"bold\">", PL);
  esc(o, key);
  fputs("</text>\n", o);
  // grid, ticks and their labels (at most 40 per axis whatever the numbers)
  char lab[48];
  fputs("<g class=\"grid\" stroke=\"#e6e6e6\">", o);
  for (int i = 0; i <= 40 && y.lo + i * y.tick <= y.hi + y.tick * 1e-9; i++)
    fprintf(o, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\"/>", PL, PL + PW, px_y(&y, y.lo + i * y.tick),
            px_y(&y, y.lo + i * y.tick));
  for (int i = 0; i <= 40 && x->lo + i * x->tick <= x->hi + x->tick * 1e-9; i++)
    fprintf(o, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"/>", px_x(x, x->lo + i * x->tick),
            px_x(x, x->lo + i * x->tick), PT, PT + PH);
  fputs("</g>\n<g class=\"yticks\" fill=\"#444\" text-anchor=\"end\">", o);
  for (int i = 0; i <= 40 && y.lo + i * y.tick <= y.hi + y.tick * 1e-9; i++) {
    tick_label(lab, sizeof lab, y.lo + i * y.tick, &y);
    fprintf(o, "<text x=\"%d\" y=\"%.1f\">%s</text>", PL - 6, px_y(&y, y.lo + i * y.tick) + 4, lab);
  }
  fputs("</g>\n<g class=\"xticks\" fill=\"#444\" text-anchor=\"middle\">", o);
  for (int i = 0; i <= 40 && x->lo + i * x->tick <= x->hi + x->tick * 1e-9; i++) {
    tick_label(lab, sizeof lab, x->lo + i * x->tick, x);
    fprintf(o, "<text x=\"%.1f\" y=\"%d\">%s</text>", px_x(x, x->lo + i * x->tick), PT + PH + 15, lab);
  }
  fprintf(o, "</g>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>\n", PL, PT, PW, PH);
  fprintf(o, "<text class=\"xlabel\" x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#444\">step</text>\n", PL + PW / 2,
          PT + PH + 31);
  // curves, then the legend: run, colour, last value
  int row = 0;
  for (int i = 0; i < nr; i++) {
    const rp_series *s = run_find(&runs[i], key);
    if (!s) continue;
    curve_write(o, s, &runs[i], i, x, &y);
    long last = s->n - 1;
    while (last > 0 && isnan(s->val[last])) last--;
    char v[32];
    fmt_value(v, sizeof v, s->val[last]);
    int ly = LEGEND_Y + LEGEND_ROW * row++;
    fprintf(o, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"%s\"%s stroke-width=\"3\"/>", PL, PL + 22,
            ly - 4, ly - 4, run_colour(i), run_dash(i));
    fprintf(o, "<text class=\"legend\" x=\"%d\" y=\"%d\"><tspan font-weight=\"bold\">", PL + 28, ly);
    esc(o, runs[i].label);
    fprintf(o, "</tspan><tspan fill=\"#555\"> last %s at step %ld</tspan></text>\n", v, s->step[last]);
  }
  fputs("</svg>\n", o);
}

// ---------------------------------------------------------------------------------- page

static const char *page_style =
    "body { font-family: sans-serif; margin: 16px 24px; color: #222; background: #fafafa; }\n"
    "h1 { font-size: 20px; margin-bottom: 4px; }\n"
    "h2 { font-size: 16px; margin-top: 28px; }\n"
    ".charts { display: flex; flex-wrap: wrap; gap: 12px; }\n"
    ".charts svg { border: 1px solid #ddd; }\n"
    "table.runs { border-collapse: collapse; background: #fff; }\n"
    "table.runs td, table.runs th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }\n"
    ".swatch { vertical-align: middle; }\n"
    "code { font-size: 12px; overflow-wrap: anywhere; }\n"
    "pre { font-size: 12px; background: #fff; border: 1px solid #ddd; padding: 8px; max-height: 480px; overflow: auto; }\n"
    ".empty { font-style: italic; }\n";

static void page_write(FILE *o, const rp_run *runs, int nr, const rp_chart *charts, int nc) {
  fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
        "<meta name=\"generator\" content=\"ctune-report\"/>\n<title>ctune report: ",
        o);
  for (int i = 0; i < nr; i++) {
    if (i) fputs(", ", o);
    esc(o, runs[i].label);
  }
  fprintf(o, "</title>\n<style>\n%s</style>\n</head>\n<body>\n<h1>ctune report</h1>\n", page_style);
  long lines = 0, smin = 0, smax = 0;
  bool any = false;
  for (int i = 0; i < nr; i++) {
    lines += runs[i].n_lines;
    for (int j = 0; j < runs[i].ns; j++)
      for (long k = 0; k < runs[i].s[j].n; k++) {
        long s = runs[i].s[j].step[k];
        if (!any || s < smin) smin = s;
        if (!any || s > smax) smax = s;
        any = true;
      }
  }
  fprintf(o, "<p>%d run%s, %d chart%s (x: optimizer step", nr, nr == 1 ? "" : "s", nc, nc == 1 ? "" : "s");
  if (any) fprintf(o, ", %ld to %ld", smin, smax);
  fputs("), from each run&#39;s metrics.jsonl.</p>\n", o);
  // the runs at a glance
  fputs("<table class=\"runs\">\n<tr><th>run</th><th>trainer</th><th>metrics lines (train, eval)</th>"
        "<th>last step</th><th>last log line</th></tr>\n",
        o);
  for (int i = 0; i < nr; i++) {
    const rp_run *r = &runs[i];
    fputs("<tr class=\"run\"><td>", o);
    swatch_write(o, i);
    esc_in(o, " <b>", r->label, "</b>");
    if (strcmp(r->label, r->dir)) {
      esc_in(o, "<br/><code>", r->dir, "</code>");
    }
    fputs("</td><td>", o);
    esc(o, r->trainer[0] ? r->trainer : "?");
    if (r->n_lines) fprintf(o, "</td><td>%ld (%ld, %ld)</td><td>%ld</td><td>", r->n_lines, r->n_train, r->n_eval, r->last_step);
    else fputs("</td><td class=\"empty\">no metrics yet</td><td></td><td>", o);
    for (int k = 0; k < r->n_logs; k++) {
      if (k) fputs("<br/>", o);
      esc_in(o, "<code>", r->log_name[k], ":</code> ");
      esc_in(o, "<code>", r->log_line[k] ? r->log_line[k] : "(empty)", "</code>");
    }
    if (!r->n_logs) fputs("<span class=\"empty\">no log found</span>", o);
    fputs("</td></tr>\n", o);
  }
  fputs("</table>\n", o);
  // the charts
  if (!nc) {
    fputs("<p class=\"empty\">No metrics yet: metrics.jsonl has no lines. A trainer writes one at every "
          "logging_steps-th step and at each evaluation.</p>\n",
          o);
  } else {
    rp_axis x = axis_make((double)smin, (double)smax, 6);
    fputs("<h2>Charts</h2>\n<div class=\"charts\">\n", o);
    for (int i = 0; i < nc; i++) chart_write(o, charts[i].key, runs, nr, &x);
    fputs("</div>\n", o);
  }
  // each run's last line and configuration
  fputs("<h2>Runs</h2>\n", o);
  for (int i = 0; i < nr; i++) {
    const rp_run *r = &runs[i];
    fputs("<h3>", o);
    swatch_write(o, i);
    esc_in(o, " ", r->label, "</h3>\n<p>last metrics line: ");
    if (r->last_line) {
      esc_in(o, "<code class=\"last\">", r->last_line, "</code>");
    } else {
      fputs("<span class=\"empty\">none yet</span>", o);
    }
    if (r->partial_line) fprintf(o, " (line %ld, unfinished, was skipped)", r->partial_line);
    fputs("</p>\n", o);
    if (r->config) {
      esc_in(o, "<details><summary>config.yml (the resolved configuration)</summary>\n<pre>", r->config, "</pre>\n</details>\n");
    } else {
      fputs("<p class=\"empty\">no config.yml</p>\n", o);
    }
  }
  fputs("</body>\n</html>\n", o);
}

// ---------------------------------------------------------------------------------- main

static int usage(FILE *f) {
  fputs("usage: ctune-report DIR [DIR ...] [out=FILE]\n"
        "  one HTML page with the curves of each run's DIR/metrics.jsonl, runs overlaid;\n"
        "  out defaults to DIR/report.html for one run, ./report.html for several\n",
        f);
  return f == stdout ? 0 : 2;  // --help: exit 0
}

// Writes the page to path + ".tmp", then renames it over path.
static int report_save(const char *path, const rp_run *runs, int nr, const rp_chart *charts, int nc) {
  size_t n = strlen(path) + 5;
  char *tmp = xrealloc(NULL, n);
  snprintf(tmp, n, "%s.tmp", path);
  FILE *o = fopen(tmp, "w");
  int rc = 0;
  if (!o) rc = ct_set_error(CT_EIO, "%s: cannot write: %s", path, strerror(errno));
  else {
    page_write(o, runs, nr, charts, nc);
    bool bad = ferror(o);
    if (fclose(o) || bad) rc = ct_set_error(CT_EIO, "%s: cannot write: %s", tmp, strerror(errno));
    else if (rename(tmp, path)) rc = ct_set_error(CT_EIO, "%s: cannot write: %s", path, strerror(errno));
    if (rc) remove(tmp);
  }
  free(tmp);
  return rc;
}

int main(int argc, char **argv) {
  const char *out = NULL;
  const char **dirs = xrealloc(NULL, (size_t)argc * sizeof *dirs);
  int nr = 0;
  for (int i = 1; i < argc; i++) {
    if (!strncmp(argv[i], "out=", 4)) out = argv[i] + 4;
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return usage(stdout);
    else dirs[nr++] = argv[i];
  }
  if (!nr || (out && !*out)) {
    free(dirs);
    return usage(stderr);
  }
  char def[CT_PATH_MAX];
  if (!out && nr == 1 && ct_path_join(def, sizeof def, dirs[0], "report.html")) {
    fprintf(stderr, "ctune-report: %s\n", ct_last_error());
    return 1;
  }
  if (!out) out = nr == 1 ? def : "report.html";
  rp_run *runs = xrealloc(NULL, (size_t)nr * sizeof *runs);
  int rc = 0, loaded = 0;
  for (; loaded < nr && !rc; loaded++) rc = run_load(&runs[loaded], dirs[loaded]);
  rp_chart *charts = NULL;
  int nc = 0;
  if (!rc) {
    bool *same = xrealloc(NULL, (size_t)nr * sizeof *same);  // two runs of one name: use their paths
    for (int i = 0; i < nr; i++) {
      same[i] = false;
      for (int j = 0; j < nr; j++) same[i] |= i != j && !strcmp(runs[i].label, runs[j].label);
    }
    for (int i = 0; i < nr; i++) {
      if (same[i]) {
        free(runs[i].label);
        runs[i].label = xstrdup(runs[i].dir);
      }
      if (runs[i].partial_line)
        fprintf(stderr, "ctune-report: %s/metrics.jsonl:%ld: unfinished last line skipped\n", runs[i].dir,
                runs[i].partial_line);
    }
    free(same);
    nc = charts_list(runs, nr, &charts);
    rc = report_save(out, runs, nr, charts, nc);
  }
  if (rc) fprintf(stderr, "ctune-report: %s\n", ct_last_error());
  else printf("%s\n", out);
  for (int i = 0; i < loaded; i++) run_free(&runs[i]);
  free(charts);
  free(runs);
  free(dirs);
  return rc ? 1 : 0;
}
