#include "prompts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static int chat_tokens(const ct_tokenizer *tok, const json_t *msgs, const char *where,
                       const char *key, const ct_prompt_opts *o, ct_ids *out) {
  char *t;
  int rc = ct_tokenizer_chat(tok, msgs, o->add_generation_prompt, &t);
  if (rc) return ct_wrap_error(CT_EFORMAT, "%s: key '%s'", where, key);
  int bos = ct_tokenizer_bos(tok), from = out->n;
  if (ct_tokenizer_add_bos(tok) && bos >= 0 && (rc = ct_ids_push(out, bos))) {
    free(t);
    return rc;
  }
  rc = ct_tokenizer_encode(tok, t, strlen(t), true, out);
  free(t);
  if (!rc && out->n > from + 1 && out->v[from] == bos && out->v[from + 1] == bos) {  // one BOS
    memmove(out->v + from, out->v + from + 1, sizeof(int) * (out->n - from - 1));
    out->n--;
  }
  return rc;
}

int ct_prompt_tokens(const ct_tokenizer *tok, const json_t *row, const char *where,
                     const ct_prompt_opts *o, ct_ids *out) {
  if (!json_is_object(row)) return ct_set_error(CT_EFORMAT, "%s: expected a JSON object", where);
  const json_t *p = json_object_get(row, "prompt"), *msgs = json_object_get(row, "messages");
  const json_t *ids = json_object_get(row, "prompt_input_ids");
  int from = out->n, rc = 0, bos = ct_tokenizer_bos(tok), V = ct_tokenizer_vocab_size(tok);
  if (json_is_string(p)) {
    if (ct_tokenizer_add_bos(tok) && bos >= 0) rc = ct_ids_push(out, bos);
    const char *t = json_string_value(p);
    if (!rc) rc = ct_tokenizer_encode(tok, t, strlen(t), true, out);
  } else if (json_is_array(p)) {
    rc = chat_tokens(tok, p, where, "prompt", o, out);
  } else if (json_is_array(msgs)) {
    rc = chat_tokens(tok, msgs, where, "messages", o, out);
  } else if (json_is_array(ids)) {
    size_t i;
    json_t *v;
    json_array_foreach(ids, i, v) {
      json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
      if (id < 0 || id >= V)
        return ct_set_error(CT_EFORMAT, "%s: key 'prompt_input_ids'[%zu]: expected a token id in [0, %d)",
                            where, i, V);
      if ((rc = ct_ids_push(out, (int)id))) return rc;
    }
  } else {
    return ct_set_error(CT_EFORMAT, "%s: expected 'prompt' (a string or a message list), "
                        "'messages' or 'prompt_input_ids'", where);
  }
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

int ct_prompt_set_load(ct_prompt_set *s, const char *path, const ct_tokenizer *tok,
                       const ct_prompt_opts *o) {
  memset(s, 0, sizeof *s);
  FILE *f = fopen(path, "r");
  if (!f) return ct_set_error(CT_EIO, "%s: cannot open", path);
  char *line = NULL, where[4200];
  size_t lcap = 0;
  int lineno = 0, cap = 0, rc = 0;
  while (!rc && getline(&line, &lcap, f) >= 0) {
    lineno++;
    if (strspn(line, " \t\r\n") == strlen(line)) continue;
    snprintf(where, sizeof where, "%s:%d", path, lineno);
    if (s->n == cap) {
      cap = cap ? 2 * cap : 64;
      json_t **r = realloc(s->rows, sizeof *r * cap);
      ct_ids *i = r ? realloc(s->ids, sizeof *i * cap) : NULL;
      char **t = i ? realloc(s->text, sizeof *t * cap) : NULL;
      int *l = t ? realloc(s->line, sizeof *l * cap) : NULL;
      if (r) s->rows = r;
      if (i) s->ids = i;
      if (t) s->text = t;
      if (l) s->line = l;
      if (!l) {
        rc = ct_set_error(CT_ENOMEM, "prompts: out of memory");
        break;
      }
    }
    json_error_t err;
    json_t *row = json_loads(line, JSON_REJECT_DUPLICATES, &err);
    if (!row) {
      rc = ct_set_error(CT_EFORMAT, "%s: invalid JSON at column %d: %s", where, err.column, err.text);
      break;
    }
    int k = s->n;
    memset(&s->ids[k], 0, sizeof s->ids[k]);
    s->rows[k] = row;
    s->text[k] = NULL;
    s->line[k] = lineno;
    s->n++;
    rc = ct_prompt_tokens(tok, row, where, o, &s->ids[k]);
    if (!rc) rc = ct_tokenizer_decode(tok, s->ids[k].v, s->ids[k].n, &s->text[k], NULL);
  }
  free(line);
  fclose(f);
  if (!rc && s->n == 0) rc = ct_set_error(CT_EFORMAT, "%s: no prompts", path);
  if (rc) ct_prompt_set_free(s);  // frees only: the error message stays
  return rc;
}

void ct_prompt_set_free(ct_prompt_set *s) {
  for (int i = 0; i < s->n; i++) {
    json_decref(s->rows[i]);
    ct_ids_free(&s->ids[i]);
    free(s->text[i]);
  }
  free(s->rows);
  free(s->ids);
  free(s->text);
  free(s->line);
  memset(s, 0, sizeof *s);
}
