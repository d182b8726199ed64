// toolcall: tool calls read out of a turn's text (hermes blocks, Llama 3 JSON), and the
// suffix tokens that give their results back.
#include "toolcall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "unicode.h"

const char *const ct_toolcall_format_names[] = {"hermes", "llama3_json", NULL};

int ct_toolcall_format_of(const char *src) {
  if (!src) return -1;
  if (strstr(src, "<tool_call>")) return CT_TOOLCALL_HERMES;
  if (strstr(src, "<|python_tag|>") || strstr(src, "ipython")) return CT_TOOLCALL_LLAMA3_JSON;
  return -1;
}

static bool space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// A malformed call: {"name"?, "error"} appended to calls.
// (jansson's messages quote the input near the error, which may be cut inside a character:
// made valid UTF-8 here)
static int add_error(json_t *calls, const char *name, const char *fmt, const char *detail) {
  char msg[256];
  snprintf(msg, sizeof msg, fmt, detail);
  size_t len;
  char *valid = ct_utf8_lossy(msg, strlen(msg), &len);
  json_t *e = valid ? json_object() : NULL;
  int rc = !e || (name && json_object_set_new(e, "name", json_string(name))) ||
           json_object_set_new(e, "error", json_stringn(valid, len)) || json_array_append_new(calls, e) ? -1 : 0;
  free(valid);
  return rc;
}

// One call's JSON text [s, s + n) → {"name", "arguments"} or an error entry. `args_key`:
// the format's own name for the arguments ("arguments" or "parameters"; both read).
static int add_call(json_t *calls, const char *s, size_t n) {
  json_error_t je;
  json_t *v = json_loadb(s, n, 0, &je);
  if (!json_is_object(v)) {
    json_decref(v);
    return add_error(calls, NULL, "malformed tool call: %s", v ? "not a JSON object" : je.text);
  }
  const json_t *name = json_object_get(v, "name");
  json_t *args = json_object_get(v, "arguments");
  if (!args) args = json_object_get(v, "parameters");
  int rc;
  if (!json_is_string(name) || !json_string_length(name)) {
    rc = add_error(calls, NULL, "malformed tool call: %s", "no \"name\"");
  } else {
    const char *nm = json_string_value(name);
    json_t *parsed = NULL;
    if (json_is_string(args)) args = parsed = json_loads(json_string_value(args), 0, &je);
    if (!args) args = parsed = json_object();  // a call without arguments
    if (!json_is_object(args)) {
      rc = add_error(calls, nm, "malformed tool call: %s", "its arguments are not a JSON object");
    } else {
      json_t *c = json_pack("{s:s, s:O}", "name", nm, "arguments", args);
      rc = c && !json_array_append_new(calls, c) ? 0 : -1;
    }
    json_decref(parsed);
  }
  json_decref(v);
  return rc;
}

static int parse_hermes(json_t *calls, const char *text, size_t n) {
  static const char open[] = "<tool_call>", close[] = "</tool_call>";
  const char *think = memmem(text, n, "</think>", 8);
  const char *p = think ? think + 8 : text, *end = text + n;
  while (p < end) {
    const char *a = memmem(p, end - p, open, sizeof open - 1);
    if (!a) break;
    a += sizeof open - 1;
    const char *b = memmem(a, end - a, close, sizeof close - 1);
    if (!b) return add_error(calls, NULL, "malformed tool call: %s", "<tool_call> without </tool_call>");
    if (add_call(calls, a, b - a)) return -1;
    p = b + sizeof close - 1;
  }
  return 0;
}

static int parse_llama3(json_t *calls, const char *text, size_t n) {
  const char *p = text, *end = text + n;
  while (p < end && space(*p)) p++;
  if (end - p >= 14 && !memcmp(p, "<|python_tag|>", 14)) p += 14;
  while (p < end && space(*p)) p++;
  if (p == end || *p != '{') return 0;  // an answer, not a call
  // objects separated by ';' at depth 0, outside strings
  int depth = 0;
  bool str = false;
  const char *from = p;
  for (const char *q = p; q <= end; q++) {
    bool last = q == end;
    char c = last ? ';' : *q;
    if (str) {
      if (c == '\\' && q + 1 < end) q++;
      else if (c == '"') str = false;
      continue;
    }
    if (c == '"') str = true;
    else if (c == '{' || c == '[') depth++;
    else if (c == '}' || c == ']') depth--;
    else if (c == ';' && (depth == 0 || last)) {
      const char *a = from, *b = q;
      while (a < b && space(*a)) a++;
      if (a < b && add_call(calls, a, b - a)) return -1;
      from = q + 1;
    }
  }
  return 0;
}

json_t *ct_toolcall_parse(int format, const char *text, size_t n) {
  json_t *calls = json_array();
  if (!calls) return NULL;
  int rc = format == CT_TOOLCALL_LLAMA3_JSON ? parse_llama3(calls, text, n) : parse_hermes(calls, text, n);
  if (rc) {
    json_decref(calls);
    return NULL;
  }
  return calls;
}

// The short conversation the suffix is measured against: a user message, an assistant
// turn — calling `name` with no arguments when name is set (tool results follow), else a
// plain answer — and, with msgs, the messages that follow it.
static json_t *dummy(const char *name, const json_t *msgs) {
  json_t *m = name ? json_pack("[{s:s, s:s}, {s:s, s:s, s:[{s:s, s:{s:s, s:{}}}]}]", "role", "user", "content",
                               "dummy", "role", "assistant", "content", "", "tool_calls", "type", "function",
                               "function", "name", name, "arguments")
                   : json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "user", "content", "dummy", "role", "assistant",
                               "content", "dummy");
  if (m && msgs && json_array_extend(m, (json_t *)msgs)) {
    json_decref(m);
    return NULL;
  }
  return m;
}

static int render_ids(const ct_tokenizer *t, const json_t *msgs, const ct_chat_opts *opts, bool gen, ct_ids *out) {
  ct_chat_opts o = opts ? *opts : (ct_chat_opts){0};
  o.add_generation_prompt = gen;
  char *s;
  size_t len;
  int rc = ct_tokenizer_chat_render(t, msgs, &o, &s, &len, NULL, NULL);
  if (!rc) rc = ct_tokenizer_encode(t, s, len, true, out);
  free(s);
  return rc;
}

int ct_toolcall_suffix(const ct_tokenizer *t, const json_t *tool_msgs, const ct_chat_opts *opts, ct_ids *out) {
  const json_t *first = json_array_get(tool_msgs, 0);
  const char *role = json_string_value(json_object_get(first, "role")), *name = NULL;
  if (role && !strcmp(role, "tool")) {
    name = json_string_value(json_object_get(first, "name"));
    if (!name) name = "tool";
  }
  json_t *shortc = dummy(name, NULL), *longc = dummy(name, tool_msgs);
  ct_ids a = {0}, b = {0};
  int rc = shortc && longc ? 0 : ct_set_error(CT_ENOMEM, "out of memory");
  if (!rc) rc = render_ids(t, shortc, opts, false, &a);
  if (!rc) rc = render_ids(t, longc, opts, true, &b);
  if (!rc) {
    // the short conversation's end: after its last end-of-turn token
    int cut = a.n, same = 0;
    for (int i = a.n - 1; i >= 0; i--)
      if (ct_tokenizer_is_stop(t, a.v[i])) {
        cut = i + 1;
        break;
      }
    while (same < a.n && same < b.n && a.v[same] == b.v[same]) same++;
    // a template may render the assistant turn differently once it is not the last
    // (Qwen3 drops the empty <think></think> of earlier turns): then the turn ends at the
    // first end-of-turn token after the two renderings part
    if (same < cut) {
      cut = -1;
      for (int i = same; i < b.n && cut < 0; i++)
        if (ct_tokenizer_is_stop(t, b.v[i])) cut = i + 1;
    }
    if (cut < 0 || cut >= b.n)
      rc = ct_set_error(CT_EFORMAT, "the chat template renders no end of the assistant turn before the tool "
                        "messages");
    for (int i = cut; !rc && i < b.n; i++) rc = ct_ids_push(out, b.v[i]);
  }
  json_decref(shortc);
  json_decref(longc);
  ct_ids_free(&a);
  ct_ids_free(&b);
  return rc;
}
