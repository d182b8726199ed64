// jsonl: reads a JSONL file line by line (numbered as in the file) and hands each parsed
// row to a callback; bad rows stop the load or are skipped and counted.
#include "jsonl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

int ct_row_error(const char *path, int line, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return ct_set_error(CT_EFORMAT, "%s:%d: %s", path, line, msg);
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

int ct_row_chat(const ct_tokenizer *t, const json_t *row, const json_t *msgs, const char *key,
                bool add_generation_prompt, char **out) {
  ct_chat_opts co;
  int rc = ct_row_chat_opts(row, add_generation_prompt, &co);
  if (!rc && (rc = ct_tokenizer_chat_render(t, msgs, &co, out, NULL, NULL, NULL)))
    ct_wrap_error(rc, "key '%s'", key);
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

static bool blank(const char *s) {
  for (; *s; s++)
    if (*s != ' ' && *s != '\t' && *s != '\r' && *s != '\n') return false;
  return true;
}

int ct_jsonl_read(const char *path, bool skip_bad, ct_jsonl_row_fn fn, void *ctx, ct_jsonl_stats *st) {
  memset(st, 0, sizeof *st);
  FILE *f = fopen(path, "rb");
  if (!f) return ct_set_error(CT_EIO, "%s: cannot open: %s", path, strerror(errno));
  char *line = NULL;
  size_t cap = 0;
  ssize_t got;
  int rc = 0;
  while (!rc && (got = getline(&line, &cap, f)) >= 0) {
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
    if (rc == CT_EFORMAT && skip_bad) {
      if (!st->n_bad) snprintf(st->first_bad, sizeof st->first_bad, "%s", ct_last_error());
      st->n_bad++;
      rc = 0;
    }
  }
  if (!rc && ferror(f)) rc = ct_set_error(CT_EIO, "%s: read error: %s", path, strerror(errno));
  free(line);
  fclose(f);
  return rc;
}
