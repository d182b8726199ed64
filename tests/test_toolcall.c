// toolcall and the calculator tool: tool calls read from turns in the hermes and Llama 3
// JSON formats (several per turn, reasoning skipped, malformed ones as errors), and the
// calculator's exact arithmetic checked against independent __int128 / long double
// arithmetic on random expressions.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calculator.h"
#include "rng.h"
#include "test.h"
#include "toolcall.h"

static json_t *parse(int fmt, const char *text) { return ct_toolcall_parse(fmt, text, strlen(text)); }

static const char *name_of(const json_t *calls, size_t i) {
  return json_string_value(json_object_get(json_array_get(calls, i), "name"));
}
static const char *error_of(const json_t *calls, size_t i) {
  return json_string_value(json_object_get(json_array_get(calls, i), "error"));
}

static void test_hermes_calls(void) {
  json_t *c = parse(CT_TOOLCALL_HERMES,
                    "<think>maybe <tool_call>{\"name\": \"no\"}</tool_call></think>I will compute.\n"
                    "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1+2\"}}\n</tool_call>\n"
                    "<tool_call>{\"name\": \"lookup\", \"arguments\": \"{\\\"key\\\": 7}\"}</tool_call>");
  CHECK(json_array_size(c) == 2);
  CHECK(name_of(c, 0) && !strcmp(name_of(c, 0), "calculator"));
  json_t *args = json_object_get(json_array_get(c, 0), "arguments");
  CHECK(!strcmp(json_string_value(json_object_get(args, "expression")), "1+2"));
  CHECK(name_of(c, 1) && !strcmp(name_of(c, 1), "lookup"));  // arguments given as a JSON string
  CHECK(json_integer_value(json_object_get(json_object_get(json_array_get(c, 1), "arguments"), "key")) == 7);
  json_decref(c);
  c = parse(CT_TOOLCALL_HERMES, "The answer is 42.");
  CHECK(c && json_array_size(c) == 0);
  json_decref(c);
  c = parse(CT_TOOLCALL_HERMES, "<tool_call>{\"name\": \"x\", \"arguments\": [1]}</tool_call><tool_call>{oops"
                                "</tool_call><tool_call>{\"arguments\": {}}</tool_call><tool_call>{\"name\": \"y\"");
  CHECK(json_array_size(c) == 4);
  CHECK(error_of(c, 0) && strstr(error_of(c, 0), "arguments") && !strcmp(name_of(c, 0), "x"));
  CHECK(error_of(c, 1) && strstr(error_of(c, 1), "malformed"));
  CHECK(error_of(c, 2) && strstr(error_of(c, 2), "name"));
  CHECK(error_of(c, 3) && strstr(error_of(c, 3), "</tool_call>"));
  json_decref(c);
}

static void test_llama3_json_calls(void) {
  json_t *c = parse(CT_TOOLCALL_LLAMA3_JSON, " <|python_tag|>{\"name\": \"calculator\", \"parameters\": "
                                             "{\"expression\": \"2;3\"}}; {\"name\": \"b\", \"arguments\": {}}");
  CHECK(json_array_size(c) == 2);
  CHECK(!strcmp(name_of(c, 0), "calculator") && !strcmp(name_of(c, 1), "b"));
  CHECK(!strcmp(json_string_value(json_object_get(json_object_get(json_array_get(c, 0), "arguments"), "expression")),
                "2;3"));  // a ';' inside a string separates nothing
  json_decref(c);
  c = parse(CT_TOOLCALL_LLAMA3_JSON, "The answer is {probably} 4.");
  CHECK(json_array_size(c) == 0);
  json_decref(c);
  c = parse(CT_TOOLCALL_LLAMA3_JSON, "{\"name\": \"calc\", \"parameters\": {\"x\": ");
  CHECK(json_array_size(c) == 1 && error_of(c, 0));
  json_decref(c);
}

static void test_format_of_templates(void) {
  CHECK(ct_toolcall_format_of("{{- '<tool_call>\\n' }}") == CT_TOOLCALL_HERMES);
  CHECK(ct_toolcall_format_of("<|start_header_id|>ipython<|end_header_id|>") == CT_TOOLCALL_LLAMA3_JSON);
  CHECK(ct_toolcall_format_of("{{ message.content }}") == -1);
  CHECK(ct_toolcall_format_of(NULL) == -1);
}

static void expect(const char *e, const char *want) {
  char out[128];
  bool ok = ct_calculator_eval(e, out, sizeof out);
  CHECK(ok && !strcmp(out, want));
  if (!ok || strcmp(out, want)) fprintf(stderr, "  %s = %s (want %s)\n", e, out, want);
}

static void expect_error(const char *e, const char *part) {
  char out[128];
  CHECK(!ct_calculator_eval(e, out, sizeof out) && strstr(out, part));
  if (!strstr(out, part)) fprintf(stderr, "  %s: %s (want '%s')\n", e, out, part);
}

static void test_calculator_exact_cases(void) {
  expect("123456 * 789012", "97408265472");
  expect("999999*999999 - 1", "999998000000");
  expect("-2^2", "-4");
  expect("(-2)**3", "-8");
  expect("2^-2", "0.25");
  expect("1/3 + 1/6", "0.5");
  expect("10 / 4", "2.5");
  expect("1/3", "1/3");
  expect("-7 / 3", "-7/3");
  expect("0.1 + 0.2", "0.3");
  expect("17 % 5 + 1,000", "1002");
  expect("2^100", "1267650600228229401496703205376");
  expect("1/8", "0.125");
  expect("-0.05 * 2", "-0.1");
  expect_error("1/0", "division by zero");
  expect_error("2^200", "126 bits");
  expect_error("2^(1/2)", "integer exponent");
  expect_error("3 +", "ends early");
  expect_error("(1+2", "')' expected");
  expect_error("1 + x", "unexpected 'x' at 5");
  expect_error("5 % 2.5", "integers");
  expect_error("5 +% 2", "unexpected '%'");
  expect_error("", "ends early");
}

// Random sums, differences and products of up to 6-digit integers, and divisions, against
// __int128 arithmetic (a fraction's value against long double within rounding).
static void test_calculator_random_arithmetic(void) {
  ct_rng r;
  ct_rng_seed(&r, 11);
  int bad = 0;
  for (int k = 0; k < 2000; k++) {
    long a = (long)(ct_rng_next(&r) % 1999999) - 999999, b = (long)(ct_rng_next(&r) % 1999999) - 999999;
    long c = (long)(ct_rng_next(&r) % 999999) + 1;
    char e[96], out[128], want[64];
    snprintf(e, sizeof e, "(%ld) * (%ld) - %ld + (%ld)", a, b, c, a);
    __int128 v = (__int128)a * b - c + a;
    snprintf(want, sizeof want, "%lld", (long long)v);
    bad += !ct_calculator_eval(e, out, sizeof out) || strcmp(out, want);
    snprintf(e, sizeof e, "%ld / %ld", a, c);
    if (!ct_calculator_eval(e, out, sizeof out)) {
      bad++;
      continue;
    }
    long double got;
    char *slash = strchr(out, '/');
    if (slash) got = strtold(out, NULL) / strtold(slash + 1, NULL);
    else got = strtold(out, NULL);
    long double x = (long double)a / c;
    bad += fabsl(got - x) > 1e-15L * (fabsl(x) + 1);
  }
  CHECK(bad == 0);
}

int main(void) {
  RUN(test_hermes_calls);
  RUN(test_llama3_json_calls);
  RUN(test_format_of_templates);
  RUN(test_calculator_exact_cases);
  RUN(test_calculator_random_arithmetic);
  return test_summary();
}
