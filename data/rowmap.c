// rowmap: ShareGPT conversations and Alpaca rows as TRL message lists (see the header).
// It maps shapes only; rendering and tokenizing stay with the loaders.
#include "rowmap.h"

#include <string.h>

#include "error.h"

// ShareGPT speaker names and the chat roles they stand for.
static const struct { const char *from, *role; } speakers[] = {
    {"human", "user"}, {"user", "user"}, {"gpt", "assistant"}, {"assistant", "assistant"},
    {"system", "system"}, {"tool", "tool"},
};

static const char *speaker_role(const char *from) {
  for (size_t i = 0; i < sizeof speakers / sizeof speakers[0]; i++)
    if (!strcmp(speakers[i].from, from)) return speakers[i].role;
  return NULL;
}

static json_t *message(const char *role, const char *content) {
  return json_pack("{s:s,s:s}", "role", role, "content", content);
}

// Prepends the row's top-level "system" string unless msgs already opens with a system turn.
static int add_system(const json_t *row, json_t *msgs) {
  const json_t *sys = json_object_get(row, "system");
  if (!sys || json_is_null(sys)) return 0;
  if (!json_is_string(sys)) return ct_set_error(CT_EFORMAT, "key 'system': expected a string");
  const char *first = json_string_value(json_object_get(json_array_get(msgs, 0), "role"));
  if (first && !strcmp(first, "system")) return 0;
  if (!*json_string_value(sys)) return 0;
  return json_array_insert_new(msgs, 0, message("system", json_string_value(sys))) ? CT_ENOMEM : 0;
}

// One ShareGPT turn as a message.
static json_t *sharegpt_turn(const json_t *turn, size_t i) {
  if (!json_is_object(turn))
    return ct_set_error(CT_EFORMAT, "key 'conversations'[%zu]: expected an object", i), NULL;
  if (json_object_get(turn, "role")) return json_copy((json_t *)turn);
  const json_t *from = json_object_get(turn, "from"), *value = json_object_get(turn, "value");
  if (!json_is_string(from) || !json_is_string(value))
    return ct_set_error(CT_EFORMAT, "key 'conversations'[%zu]: expected {\"from\", \"value\"} strings "
                        "(or {\"role\", \"content\"})", i), NULL;
  const char *role = speaker_role(json_string_value(from));
  if (!role)
    return ct_set_error(CT_EFORMAT, "key 'conversations'[%zu]: unknown speaker \"from\": \"%s\" (expected "
                        "human, gpt, system or tool)", i, json_string_value(from)), NULL;
  json_t *m = message(role, json_string_value(value));
  if (!m) ct_set_error(CT_ENOMEM, "out of memory");
  return m;
}

static int sharegpt(const json_t *row, const json_t *conv, json_t **msgs) {
  if (!json_is_array(conv) || !json_array_size(conv))
    return ct_set_error(CT_EFORMAT, "key 'conversations': expected a non-empty list of {\"from\", \"value\"}");
  json_t *out = json_array();
  size_t i;
  json_t *turn;
  json_array_foreach(conv, i, turn) {
    json_t *m = sharegpt_turn(turn, i);
    if (!m || json_array_append_new(out, m)) {
      json_decref(out);
      return m ? ct_set_error(CT_ENOMEM, "out of memory") : CT_EFORMAT;
    }
  }
  int rc = add_system(row, out);
  if (rc) json_decref(out);
  else *msgs = out;
  return rc;
}

int ct_rowmap_messages(const json_t *row, json_t **msgs, const char **key) {
  *msgs = NULL;
  json_t *m = json_object_get(row, "messages");
  if (m) {
    *key = "messages";
    *msgs = json_incref(m);
    return 0;
  }
  const json_t *conv = json_object_get(row, "conversations");
  *key = "conversations";
  return conv ? sharegpt(row, conv, msgs) : 0;
}

int ct_rowmap_alpaca(const json_t *row, json_t **prompt, json_t **completion) {
  *prompt = NULL;
  if (completion) *completion = NULL;
  const json_t *ins = json_object_get(row, "instruction"), *in = json_object_get(row, "input"),
               *out = json_object_get(row, "output");
  if (!ins) return 0;
  if (!json_is_string(ins)) return ct_set_error(CT_EFORMAT, "key 'instruction': expected a string");
  if (in && !json_is_null(in) && !json_is_string(in)) return ct_set_error(CT_EFORMAT, "key 'input': expected a string");
  if (completion && !json_is_string(out))
    return ct_set_error(CT_EFORMAT, "key 'output': expected a string (the Alpaca row's answer)");
  const char *q = json_string_value(in);
  json_t *user = q && *q ? json_sprintf("%s\n%s", json_string_value(ins), q) : json_copy((json_t *)ins);
  json_t *p = json_pack("[{s:s,s:o}]", "role", "user", "content", user);
  json_t *c = completion ? json_pack("[{s:s,s:O}]", "role", "assistant", "content", out) : NULL;
  int rc = !p || (completion && !c) ? ct_set_error(CT_ENOMEM, "out of memory") : add_system(row, p);
  if (rc) {
    json_decref(p);
    json_decref(c);
    return rc;
  }
  *prompt = p;
  if (completion) *completion = c;
  return 0;
}
