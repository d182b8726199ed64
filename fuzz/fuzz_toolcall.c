// Fuzzes what GRPO reads out of a model's turn (a policy writes anything): the input is a
// turn's text, read as tool calls in both formats (text/toolcall.h), and the argument of
// every call that names the calculator evaluated (common/calculator.h), as is the whole
// input as an expression. Every call must come back as {"name", "arguments": {...}} or an
// error entry; the calculator must answer or say why.
#include "calculator.h"
#include "fuzz.h"
#include "toolcall.h"

static void check_calls(const json_t *calls) {
  if (!json_is_array(calls)) abort();
  for (size_t i = 0; i < json_array_size(calls); i++) {
    const json_t *c = json_array_get(calls, i);
    const json_t *err = json_object_get(c, "error"), *args = json_object_get(c, "arguments");
    if (err ? !json_is_string(err) : !json_is_string(json_object_get(c, "name")) || !json_is_object(args)) abort();
    const char *e = json_string_value(json_object_get(args, "expression"));
    char out[256];
    if (e && !ct_calculator_eval(e, out, sizeof out) && !out[0]) abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *text = (const char *)data;
  for (int fmt = CT_TOOLCALL_HERMES; fmt <= CT_TOOLCALL_LLAMA3_JSON; fmt++) {
    json_t *calls = ct_toolcall_parse(fmt, text, size);
    if (!calls) abort();  // (only when out of memory)
    check_calls(calls);
    json_decref(calls);
  }
  char *s = malloc(size + 1), out[256];
  if (!s) return 0;
  memcpy(s, data, size);
  s[size] = 0;
  if (!ct_calculator_eval(s, out, sizeof out) && !out[0]) abort();  // a failure says why
  free(s);
  return 0;
}
