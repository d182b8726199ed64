// prompts: rows that start a generation (text, messages, or token ids), tokenized with
// the chat template's generation prompt, truncated or refused as configured.
#include "prompts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "jsonl.h"
#include "rowmap.h"

static int chat_tokens(const ct_tokenizer *tok, const json_t *row, const json_t *msgs, const char *where,
                       const char *key, const ct_prompt_opts *o, ct_ids *out) {
  char *t;
  int rc = ct_row_chat(tok, row, msgs, key, o->add_generation_prompt, &t);
  if (rc) return ct_wrap_error(CT_EFORMAT, "%s", where);
  rc = ct_tokenizer_encode_doc(tok, t, strlen(t), out);
  free(t);
  return rc;
}

// The row's prompt as a message list (a new reference, or NULL): "prompt" as a list,
// "messages" or ShareGPT "conversations", or an Alpaca instruction (rowmap.h).
static int prompt_messages(const json_t *row, json_t **msgs, const char **key) {
  const json_t *p = json_object_get(row, "prompt");
  if (json_is_array(p)) {
    *msgs = json_incref((json_t *)p);
    return 0;
  }
  if (ct_rowmap_messages(row, msgs, key)) return CT_EFORMAT;
  if (*msgs) return 0;
  *key = "instruction";
  return ct_rowmap_alpaca(row, msgs, NULL);
}

int ct_prompt_tokens(const ct_tokenizer *tok, const json_t *row, const char *where,
                     const ct_prompt_opts *o, ct_ids *out) {
  if (!json_is_object(row)) return ct_set_error(CT_EFORMAT, "%s: expected a JSON object", where);
  const json_t *p = json_object_get(row, "prompt");
  const json_t *ids = json_object_get(row, "prompt_input_ids");
  json_t *msgs = NULL;
  const char *key = "prompt";
  if (!json_is_string(p) && prompt_messages(row, &msgs, &key)) return ct_wrap_error(CT_EFORMAT, "%s", where);
  int from = out->n, rc = 0;
  if (json_is_string(p)) {
    rc = ct_tokenizer_encode_doc(tok, json_string_value(p), json_string_length(p), out);
  } else if (json_is_array(msgs)) {
    rc = chat_tokens(tok, row, msgs, where, key, o, out);
  } else if (json_is_array(ids)) {
    if (ct_jsonl_ids(ids, ct_tokenizer_vocab_size(tok), o->model_vocab, "prompt_input_ids", out))
      rc = ct_wrap_error(CT_EFORMAT, "%s", where);
  } else {
    rc = ct_set_error(CT_EFORMAT, "%s: expected 'prompt' (a string or a message list), 'messages', "
                      "'conversations', 'instruction' or 'prompt_input_ids'", where);
  }
  json_decref(msgs);
  if (rc) return rc;
  int n = out->n - from;
  if (n == 0) return ct_set_error(CT_EFORMAT, "%s: the prompt is empty", where);
  if (o->max_length > 0 && n > o->max_length) {
    if (!o->truncate_left)
      return ct_set_error(CT_EINVAL, "%s: the prompt has %d tokens, more than %s %d (raise it, or "
                          "set truncate_prompt=left)", where, n, o->length_key, o->max_length);
    memmove(out->v + from, out->v + out->n - o->max_length, sizeof(int) * o->max_length);
    out->n = from + o->max_length;
  }
  return 0;
}

// ct_prompt_set_load's reader: what it reads with, then the set it fills (cap rows allocated).
typedef struct {
  const char *path;
  const ct_tokenizer *tok;
  const ct_prompt_opts *o;
  ct_prompt_set *s;
  int cap;
} set_loader;

static void free_row(ct_prompt_set *s, int i) {
  json_decref(s->rows[i]);
  ct_ids_free(&s->ids[i]);
  free(s->text[i]);
}

static int load_row(void *ctx, json_t *row, int line) {
  set_loader *L = ctx;
  ct_prompt_set *s = L->s;
  if (s->n == L->cap) {
    L->cap = L->cap ? 2 * L->cap : 64;
    json_t **r = realloc(s->rows, sizeof *r * L->cap);
    ct_ids *i = r ? realloc(s->ids, sizeof *i * L->cap) : NULL;
    char **t = i ? realloc(s->text, sizeof *t * L->cap) : NULL;
    int *l = t ? realloc(s->line, sizeof *l * L->cap) : NULL;
    if (r) s->rows = r;
    if (i) s->ids = i;
    if (t) s->text = t;
    if (l) s->line = l;
    if (!l) return ct_set_error(CT_ENOMEM, "prompts: out of memory");
  }
  int k = s->n++;
  s->ids[k] = (ct_ids){0};
  s->rows[k] = json_incref(row);
  s->text[k] = NULL;
  s->line[k] = line;
  if (L->o->tools && json_is_object(row) && !json_object_get(row, "tools") &&
      json_object_set(row, "tools", (json_t *)L->o->tools))
    return free_row(s, --s->n), ct_set_error(CT_ENOMEM, "prompts: out of memory");
  char where[4200];
  ct_jsonl_where(where, sizeof where, L->path, line);
  bool none = L->o->prompt_optional && json_is_object(row) && !json_object_get(row, "prompt") &&
              !json_object_get(row, "messages") && !json_object_get(row, "conversations") &&
              !json_object_get(row, "instruction") && !json_object_get(row, "prompt_input_ids");
  int rc = none ? 0 : ct_prompt_tokens(L->tok, row, where, L->o, &s->ids[k]);
  if (!rc) rc = ct_tokenizer_decode(L->tok, s->ids[k].v, s->ids[k].n, &s->text[k], NULL);
  if (rc) free_row(s, --s->n);  // a skipped row (skip_bad_rows) leaves nothing behind
  return rc;
}

int ct_prompt_set_load(ct_prompt_set *s, const char *path, const ct_tokenizer *tok,
                       const ct_prompt_opts *o) {
  memset(s, 0, sizeof *s);
  set_loader L = {path, tok, o, s, 0};
  ct_jsonl_stats st;
  int rc = ct_jsonl_read(path, o->skip_bad_rows, load_row, &L, &st);
  s->n_bad = st.n_bad;
  snprintf(s->first_bad, sizeof s->first_bad, "%s", st.first_bad);
  if (!rc && s->n == 0)
    rc = ct_set_error(CT_EFORMAT, "%s: no prompts%s%s", path, st.n_bad ? "; every row was skipped, the first: " : "",
                      st.n_bad ? st.first_bad : "");
  if (rc) ct_prompt_set_free(s);  // frees only: the error message stays
  return rc;
}

void ct_prompt_set_free(ct_prompt_set *s) {
  for (int i = 0; i < s->n; i++) free_row(s, i);
  free(s->rows);
  free(s->ids);
  free(s->text);
  free(s->line);
  memset(s, 0, sizeof *s);
}

void ct_prompt_set_drop(ct_prompt_set *s, const bool *drop) {
  int k = 0;
  for (int i = 0; i < s->n; i++) {
    if (drop[i]) {
      free_row(s, i);
      s->n_bad++;
      continue;
    }
    s->rows[k] = s->rows[i];
    s->ids[k] = s->ids[i];
    s->text[k] = s->text[i];
    s->line[k++] = s->line[i];
  }
  s->n = k;
}
