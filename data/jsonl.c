// jsonl: reads a data file row by row — JSONL (lines numbered as in the file) or one JSON
// array of rows, either optionally gzip-compressed — and hands each parsed row to a
// callback; bad rows stop the load or are skipped and counted. Parquet, Arrow and
// Hugging Face datasets directories are recognized only to say how to convert them.
#include "jsonl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "error.h"
#include "fs.h"

int ct_row_error(const char *path, int line, const char *fmt, ...) {
  char msg[512], where[4200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ct_jsonl_where(where, sizeof where, path, line);
  return ct_set_error(CT_EFORMAT, "%s: %s", where, msg);
}

int ct_row_chat_opts(const json_t *row, bool add_generation_prompt, ct_chat_opts *o) {
  const json_t *tools = json_object_get(row, "tools"), *kw = json_object_get(row, "chat_template_kwargs");
  if (json_is_null(tools)) tools = NULL;
  if (json_is_null(kw)) kw = NULL;
  *o = (ct_chat_opts){.add_generation_prompt = add_generation_prompt, .tools = tools, .extra = kw};
  if (tools && !json_is_array(tools))
    return ct_set_error(CT_EFORMAT, "key 'tools': expected a list of tool schemas");
  if (kw && !json_is_object(kw))
    return ct_set_error(CT_EFORMAT, "key 'chat_template_kwargs': expected an object of template variables");
  return 0;
}

// Renders msgs with each non-empty string content replaced by a marker; the index of the
// first message whose marker is missing from the text, or -1 (also when that render fails:
// no verdict). A marker has no white space and no tag, so templates that trim contents or
// cut reasoning out of them (Qwen3's '</think>' split) keep it whole.
static long dropped_message(const ct_tokenizer *t, const json_t *msgs, const ct_chat_opts *co) {
  json_t *probe = json_array();
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    json_t *c = json_copy(m);
    const char *s = json_string_value(json_object_get(m, "content"));
    char mark[48];
    snprintf(mark, sizeof mark, "ctune-probe-%zu-end", i);
    if (c && s && *s) json_object_set_new(c, "content", json_string(mark));
    json_array_append_new(probe, c);
  }
  char *text = NULL;
  long drop = -1;
  if (!ct_tokenizer_chat_render(t, probe, co, &text, NULL, NULL, NULL)) {
    json_array_foreach(msgs, i, m) {
      const char *s = json_string_value(json_object_get(m, "content"));
      char mark[48];
      snprintf(mark, sizeof mark, "ctune-probe-%zu-end", i);
      if (s && *s && !strstr(text, mark)) {
        drop = (long)i;
        break;
      }
    }
  }
  ct_set_error(CT_OK, "%s", "");  // a failed probe is no error of the row's
  free(text);
  json_decref(probe);
  return drop;
}

int ct_row_chat_check(const ct_tokenizer *t, const json_t *msgs, const ct_chat_opts *co, const char *key) {
  long i = dropped_message(t, msgs, co);
  if (i < 0) return 0;
  const char *role = json_string_value(json_object_get(json_array_get(msgs, (size_t)i), "role"));
  return ct_set_error(CT_EFORMAT, "key '%s'[%ld]: the chat template renders nothing of this message "
                      "(role '%s'): use a role the template knows, or set chat_template_path to a "
                      "template that renders it", key, i, role ? role : "?");
}

int ct_row_chat(const ct_tokenizer *t, const json_t *row, const json_t *msgs, const char *key,
                bool add_generation_prompt, char **out) {
  *out = NULL;  // callers free it on every path
  ct_chat_opts co;
  int rc = ct_row_chat_opts(row, add_generation_prompt, &co);
  if (!rc && (rc = ct_tokenizer_chat_render(t, msgs, &co, out, NULL, NULL, NULL)))
    ct_wrap_error(rc, "key '%s'", key);
  if (!rc && (rc = ct_row_chat_check(t, msgs, &co, key))) {
    free(*out);
    *out = NULL;
  }
  return rc;
}

int ct_jsonl_ids(const json_t *list, int V, int model_V, const char *key, ct_ids *out) {
  if (!json_is_array(list)) return ct_set_error(CT_EFORMAT, "key '%s': expected a list of token ids", key);
  size_t i;
  json_t *v;
  json_array_foreach(list, i, v) {
    if (!json_is_integer(v) || json_integer_value(v) < 0)
      return ct_set_error(CT_EFORMAT, "key '%s'[%zu]: expected a token id (an integer >= 0)", key, i);
    json_int_t id = json_integer_value(v);
    if (id >= V) {
      char model[96] = "the model's vocab_size is not known here";
      if (model_V > 0) snprintf(model, sizeof model, "the model's vocab_size is %d", model_V);
      return ct_set_error(CT_EFORMAT, "key '%s'[%zu]: token id %lld is not below the tokenizer's %d "
                          "tokens (%s; ids are checked against the tokenizer)", key, i, (long long)id, V, model);
    }
    if (ct_ids_push(out, (int)id)) return CT_ENOMEM;
  }
  return 0;
}

// ---------------------------------------------------------------------------
// Input: every file is read through zlib, which passes an uncompressed file through as it
// is (gzip is recognized by its magic bytes, not by the name).

typedef struct {
  gzFile f;
  char buf[1 << 16];
  size_t pos, len;  // unread bytes: buf[pos, len)
  bool failed;      // a read failed (gzerror says why)
} input;

// Refills buf; returns the bytes now unread, 0 at the end, -1 on a read error (a line cut
// off by a damaged file is not handed on as a row).
static int fill(input *in) {
  if (in->pos < in->len) return (int)(in->len - in->pos);
  int n = gzread(in->f, in->buf, sizeof in->buf), zerr = Z_OK;
  if (n == 0) gzerror(in->f, &zerr);  // a cut-off gzip stream ends in Z_BUF_ERROR, not an error return
  if (zerr != Z_OK) n = -1;
  in->failed |= n < 0;
  in->pos = 0;
  in->len = n > 0 ? (size_t)n : 0;
  return n;
}

// The longest line read: a file without newlines (/dev/zero, a binary file) stops here
// instead of growing memory until the machine runs out.
#define MAX_LINE_MIB 256

// The next line (newline kept) into *line: its length, 0 at the end, -1 on a read error,
// -2 past MAX_LINE_MIB.
static ssize_t next_line(input *in, char **line, size_t *cap) {
  size_t n = 0;
  for (;;) {
    int got = fill(in);
    if (got <= 0) return got < 0 ? -1 : (ssize_t)n;
    const char *from = in->buf + in->pos, *nl = memchr(from, '\n', (size_t)got);
    size_t take = nl ? (size_t)(nl - from) + 1 : (size_t)got;
    if (n + take > ((size_t)MAX_LINE_MIB << 20)) return -2;
    if (n + take + 1 > *cap) {
      size_t c = (n + take + 1) * 2;
      char *p = realloc(*line, c);
      if (!p) return ct_set_error(CT_ENOMEM, "out of memory reading a line"), -1;
      *line = p;
      *cap = c;
    }
    memcpy(*line + n, from, take);
    n += take;
    (*line)[n] = 0;
    in->pos += take;
    if (nl) return (ssize_t)n;
  }
}

static int read_error(const char *path, input *in) {
  int zerr = Z_OK;
  const char *msg = gzerror(in->f, &zerr);
  if (zerr == Z_ERRNO) msg = strerror(errno);
  return ct_set_error(CT_EIO, "%s: read error: %s", path, msg && *msg ? msg : "unknown");
}

// ---------------------------------------------------------------------------
// Formats ctune does not read, recognized so that the error says how to convert them.

// path with its extensions (after the last '/') replaced by ".jsonl", into out.
static void jsonl_name(const char *path, char *out, size_t n) {
  snprintf(out, n, "%s", path);
  size_t len = strlen(out);
  while (len > 1 && out[len - 1] == '/') out[--len] = 0;
  char *base = strrchr(out, '/'), *dot = strchr(base ? base + 1 : out, '.');
  if (dot && dot != (base ? base + 1 : out)) *dot = 0;
  snprintf(out + strlen(out), n - strlen(out), ".jsonl");
}

static int convert_hint(const char *path, const char *what, const char *load) {
  char out[1024];
  jsonl_name(path, out, sizeof out);
  return ct_set_error(CT_EFORMAT, "%s: this is %s; ctune reads JSONL, a JSON array of rows, or either "
                      "gzip-compressed. Convert it once: python -c \"import datasets; datasets.%s.to_json('%s')\"",
                      path, what, load, out);
}

// A directory: a Hugging Face datasets save_to_disk directory gets its conversion.
static int directory_error(const char *path) {
  char load[4300];
  if (ct_path_has_file(path, "dataset_dict.json")) {
    snprintf(load, sizeof load, "load_from_disk('%s')['train']", path);
    return convert_hint(path, "a Hugging Face datasets directory (a DatasetDict)", load);
  }
  if (ct_path_has_file(path, "dataset_info.json") || ct_path_has_file(path, "state.json")) {
    snprintf(load, sizeof load, "load_from_disk('%s')", path);
    return convert_hint(path, "a Hugging Face datasets directory", load);
  }
  return ct_set_error(CT_EIO, "%s: is a directory, not a data file", path);
}

// Parquet ("PAR1") and Arrow (IPC file "ARROW1", or the stream form Hugging Face datasets
// writes, which opens with the continuation marker 0xFFFFFFFF) by their first bytes.
static int binary_format_error(const char *path, const input *in) {
  const char *b = in->buf + in->pos;
  size_t n = in->len - in->pos;
  char load[4300];
  if (n >= 4 && !memcmp(b, "PAR1", 4)) {
    snprintf(load, sizeof load, "load_dataset('parquet', data_files='%s')['train']", path);
    return convert_hint(path, "a Parquet file", load);
  }
  if ((n >= 6 && !memcmp(b, "ARROW1", 6)) || (n >= 4 && !memcmp(b, "\xff\xff\xff\xff", 4))) {
    snprintf(load, sizeof load, "load_dataset('arrow', data_files='%s')['train']", path);
    return convert_hint(path, "an Arrow file", load);
  }
  return 0;
}

// ---------------------------------------------------------------------------
// Rows

void ct_jsonl_where(char *buf, size_t n, const char *path, int at) {
  if (at < 0) snprintf(buf, n, "%s: row %d", path, -at);
  else snprintf(buf, n, "%s:%d", path, at);
}

static bool blank(const char *s) {
  for (; *s; s++)
    if (*s != ' ' && *s != '\t' && *s != '\r' && *s != '\n') return false;
  return true;
}

// A row error is counted and skipped when skip_bad is set.
static int skip_row(int rc, bool skip_bad, ct_jsonl_stats *st) {
  if (rc != CT_EFORMAT || !skip_bad) return rc;
  if (!st->n_bad) snprintf(st->first_bad, sizeof st->first_bad, "%s", ct_last_error());
  st->n_bad++;
  return 0;
}

static int read_lines(const char *path, input *in, bool skip_bad, ct_jsonl_row_fn fn, void *ctx,
                      ct_jsonl_stats *st) {
  char *line = NULL;
  size_t cap = 0;
  ssize_t got;
  int rc = 0;
  while (!rc && (got = next_line(in, &line, &cap)) > 0) {
    int no = ++st->n_lines;
    if ((size_t)got != strlen(line)) {
      rc = ct_row_error(path, no, "line contains a NUL byte");
    } else if (blank(line)) {
      continue;
    } else {
      json_error_t err;
      json_t *row = json_loads(line, JSON_REJECT_DUPLICATES, &err);
      rc = row ? fn(ctx, row, no) : ct_row_error(path, no, "invalid JSON at column %d: %s", err.column, err.text);
      json_decref(row);
    }
    rc = skip_row(rc, skip_bad, st);
  }
  if (!rc && got == -2)
    rc = ct_row_error(path, st->n_lines + 1, "line is longer than %d MiB: a JSONL row is one line (is this "
                      "a JSONL file?)", MAX_LINE_MIB);
  else if (!rc && got < 0) rc = read_error(path, in);
  free(line);
  return rc;
}

static size_t feed_json(void *buf, size_t n, void *arg) {
  input *in = arg;
  int got = fill(in);
  if (got < 0) return (size_t)-1;
  size_t take = (size_t)got < n ? (size_t)got : n;
  memcpy(buf, in->buf + in->pos, take);
  in->pos += take;
  return take;
}

// A file holding one JSON array of row objects: row N is the array's Nth element.
static int read_array(const char *path, input *in, bool skip_bad, ct_jsonl_row_fn fn, void *ctx,
                      ct_jsonl_stats *st) {
  json_error_t err;
  json_t *rows = json_load_callback(feed_json, in, JSON_REJECT_DUPLICATES, &err);
  if (in->failed) {
    json_decref(rows);
    return read_error(path, in);
  }
  if (!rows)
    return ct_set_error(CT_EFORMAT, "%s: invalid JSON at line %d column %d: %s (the file starts with '[', "
                        "so it is read as one JSON array of rows)", path, err.line, err.column, err.text);
  int rc = 0;
  for (size_t i = 0; !rc && i < json_array_size(rows); i++) {
    int no = -(int)(++st->n_lines);
    rc = skip_row(fn(ctx, json_array_get(rows, i), no), skip_bad, st);
  }
  json_decref(rows);
  return rc;
}

// True when the first byte that is not white space is '[' (looked at, not consumed: blank
// lines still count; a file opening with more white space than buf holds is JSONL).
static bool starts_array(const input *in) {
  size_t i = in->pos;
  while (i < in->len && strchr(" \t\r\n", in->buf[i])) i++;
  return i < in->len && in->buf[i] == '[';
}

int ct_jsonl_read(const char *path, bool skip_bad, ct_jsonl_row_fn fn, void *ctx, ct_jsonl_stats *st) {
  memset(st, 0, sizeof *st);
  struct stat sb;
  if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return directory_error(path);
  input *in = malloc(sizeof *in);  // (not calloc: the 64 KiB buffer needs no zeroing)
  if (!in) return ct_set_error(CT_ENOMEM, "%s: out of memory", path);
  in->pos = in->len = 0;
  in->failed = false;
  in->f = gzopen(path, "rb");
  if (!in->f) {
    int e = errno;
    free(in);
    return ct_set_error(CT_EIO, "%s: cannot open: %s", path, strerror(e ? e : ENOMEM));
  }
  int rc = fill(in) < 0 ? read_error(path, in) : binary_format_error(path, in);
  if (!rc) rc = starts_array(in) ? read_array(path, in, skip_bad, fn, ctx, st) : read_lines(path, in, skip_bad, fn, ctx, st);
  gzclose(in->f);
  free(in);
  return rc;
}
