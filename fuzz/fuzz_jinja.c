// Fuzzes chat-template parsing and rendering (text/jinja.c): the input is a template,
// rendered with a fixed conversation (system, user, assistant with a tool call, tool
// reply), a tool list and the usual variables. {% generation %} ranges must be ordered,
// disjoint and inside the output.
#include "fuzz.h"
#include "jinja.h"

static const char vars_json[] =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"You are brief.\"},"
    "{\"role\": \"user\", \"content\": \"What is 2+2? <think>\"},"
    "{\"role\": \"assistant\", \"content\": \"<think>\\nadd\\n</think>\\n\\n4\", \"tool_calls\": [{\"type\": "
    "\"function\", \"function\": {\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 2}}}]},"
    "{\"role\": \"tool\", \"content\": \"4\"},"
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"thanks\"}]}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"add\", \"description\": \"a + b\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"number\"}}, \"required\": [\"a\"]}}}],"
    "\"add_generation_prompt\": true, \"enable_thinking\": false, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    "\"n\": 3, \"x\": 1.5, \"none\": null, \"list\": [1, \"two\", [3]], \"dict\": {\"k\": \"v\"}}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static json_t *vars;
  if (!vars) {
    json_error_t err;
    if (!(vars = json_loads(vars_json, 0, &err))) abort();
  }
  ct_jinja *tpl = NULL;
  fuzz_clear_error();
  int rc = ct_jinja_parse(&tpl, (const char *)data, size, "fuzz");
  fuzz_check_error(rc, "ct_jinja_parse");
  if (rc) return 0;
  char *out = NULL;
  size_t len = 0;
  ct_span *gen = NULL;
  int ngen = 0;
  fuzz_clear_error();
  rc = ct_jinja_render(tpl, vars, &out, &len, &gen, &ngen);
  fuzz_check_error(rc, "ct_jinja_render");
  if (!rc) {
    if (ngen && !ct_jinja_has_generation(tpl)) abort();
    for (int i = 0; i < ngen; i++)
      if (gen[i].start > gen[i].end || gen[i].end > len || (i && gen[i].start < gen[i - 1].end)) {
        fprintf(stderr, "fuzz: generation range %d [%zu, %zu) of a %zu-byte output\n", i, gen[i].start, gen[i].end, len);
        abort();
      }
  }
  free(out);
  free(gen);
  ct_jinja_free(tpl);
  return 0;
}
