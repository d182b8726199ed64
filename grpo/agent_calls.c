// grpo/agent_calls: a turn's tool calls run — the built-in calculator in place, the others
// on the tool server — each becoming a tool message; a failing call's message is
// {"error": "..."}.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "grpo/agent_internal.h"
#include "calculator.h"

static json_t *tool_message(const char *name, const char *content) {
  return json_pack("{s:s, s:s, s:s}", "role", "tool", "name", name ? name : "unknown", "content", content);
}

// {"error": msg} as JSON text.
static char *error_text(const char *msg) {
  json_t *e = json_pack("{s:s}", "error", msg);
  char *s = e ? json_dumps(e, JSON_COMPACT) : NULL;
  json_decref(e);
  return s;
}

static char *run_calculator(const json_t *args, bool *failed) {
  const json_t *e = json_object_get(args, "expression");
  char out[256];
  if (!json_is_string(e)) {
    *failed = true;
    return error_text("calculator: needs a string argument 'expression'");
  }
  if (ct_calculator_eval(json_string_value(e), out, sizeof out)) return strdup(out);
  *failed = true;
  char msg[300];
  snprintf(msg, sizeof msg, "calculator: %s", out);
  return error_text(msg);
}

// What a tool server's reply says.
typedef struct {
  char *content;
  bool tool_error;  // the reply was {"error"}
} reply_t;

static int read_reply(void *ctx, const ct_http *h, const char *body, size_t len, ct_http_failure *f) {
  reply_t *r = ctx;
  json_error_t je;
  json_t *j = json_loadb(body, len, 0, &je);
  const json_t *c = json_object_get(j, "content"), *e = json_object_get(j, "error");
  if (json_is_string(e) && !c) {
    r->content = error_text(json_string_value(e));
    r->tool_error = true;
  } else if (json_is_string(c)) {
    r->content = strdup(json_string_value(c));
  } else if (c) {
    r->content = json_dumps(c, JSON_COMPACT | JSON_ENCODE_ANY);
  } else {
    char text[96];
    ct_http_snippet(h, body, len, text, sizeof text);
    snprintf(f->what, sizeof f->what, "malformed reply");
    snprintf(f->detail, sizeof f->detail, "%s: \"%s\"", j ? "no \"content\" or \"error\"" : je.text, text);
    json_decref(j);
    return CT_HTTP_RETRY;
  }
  json_decref(j);
  return CT_HTTP_OK;
}

static char *run_remote(ct_http *h, const char *name, const json_t *args, const char *row, bool *failed) {
  json_t *body = json_pack("{s:s, s:O}", "name", name, "arguments", args);
  char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  if (!text) return NULL;
  // splice the row in as text (it was serialized on the generating thread)
  size_t n = strlen(text), m = strlen(row);
  char *full = malloc(n + m + 16);
  if (full) snprintf(full, n + m + 16, "%.*s,\"row\":%s}", (int)(n - 1), text, row);
  free(text);
  if (!full) return NULL;
  reply_t r = {0};
  ct_http_failure f;
  int tries, rc = ct_http_post(h, full, read_reply, &r, &f, &tries);
  free(full);
  if (rc == CT_HTTP_OK) {
    *failed = r.tool_error;
    return r.content;
  }
  free(r.content);
  *failed = true;
  char msg[512];
  snprintf(msg, sizeof msg, "tool server: %s after %d attempt%s%s%s", f.what, tries, tries == 1 ? "" : "s",
           f.detail[0] ? ": " : "", f.detail);
  return error_text(msg);
}

int ct_agent_run_calls(ct_grpo_agent *t, job *j, ct_http *h) {
  if (!(j->results = json_array())) return CT_ENOMEM;
  for (size_t i = 0; i < json_array_size(j->calls); i++) {
    const json_t *call = json_array_get(j->calls, i), *args = json_object_get(call, "arguments");
    const char *name = json_string_value(json_object_get(call, "name"));
    const char *err = json_string_value(json_object_get(call, "error"));
    bool failed = false;
    char *content;
    if (err) {
      failed = true;
      content = error_text(err);
    } else if (t->calculator && !strcmp(name, "calculator")) {
      content = run_calculator(args, &failed);
    } else if (h) {
      content = run_remote(h, name, args, j->row, &failed);
    } else {
      char msg[300];
      snprintf(msg, sizeof msg, "tool '%.200s' not found", name);
      failed = true;
      content = error_text(msg);
    }
    json_t *m = content ? tool_message(name, content) : NULL;
    free(content);
    if (!m || json_array_append_new(j->results, m)) return CT_ENOMEM;
    j->failures += failed;
  }
  return 0;
}

bool ct_agent_needs_server(const ct_grpo_agent *t, const json_t *calls) {
  for (size_t i = 0; i < json_array_size(calls); i++) {
    const json_t *c = json_array_get(calls, i);
    const char *name = json_string_value(json_object_get(c, "name"));
    if (name && !json_object_get(c, "error") && !(t->calculator && !strcmp(name, "calculator"))) return t->tool_server;
  }
  return false;
}
