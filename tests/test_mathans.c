// grpo/mathans: math answers as TRL's math-verify accuracy_reward compares them on GSM8K /
// MATH-style data — extraction of the boxed or math-span answer, and equivalence of numbers,
// fractions, percentages and LaTeX spellings (each case: what math-verify gives for it).
#include <string.h>

#include "grpo/mathans.h"
#include "test.h"

static int eq(const char *a, const char *b) { return ct_math_equal(a, strlen(a), b, strlen(b)); }

// The extracted answer of completion c as a string (static buffer), or "(none)".
static const char *extracted(const char *c) {
  static char buf[256];
  const char *s;
  size_t n;
  if (!ct_math_extract(c, &s, &n)) return "(none)";
  memcpy(buf, s, n);
  buf[n] = 0;
  return buf;
}

static void test_extraction_takes_the_last_boxed_else_the_last_math_span(void) {
  CHECK(!strcmp(extracted("so the answer is \\boxed{\\frac{1}{3}}."), "\\frac{1}{3}"));
  CHECK(!strcmp(extracted("\\boxed{2} or rather \\boxed{\\frac{a}{b}+{c}}"), "\\frac{a}{b}+{c}"));  // nested braces
  CHECK(!strcmp(extracted("we get $x = 5$ and then $7$"), "7"));
  CHECK(!strcmp(extracted("$$\\frac{3}{4}$$"), "\\frac{3}{4}"));
  CHECK(!strcmp(extracted("thus \\(12\\) apples"), "12"));
  CHECK(!strcmp(extracted("\\[ 0.5 \\]"), " 0.5 "));
  CHECK(!strcmp(extracted("$1$ then \\boxed{9}"), "9"));  // boxed first, wherever
  CHECK(!strcmp(extracted("the answer is 42"), "(none)"));  // no anchor: no answer, as TRL
  CHECK(!strcmp(extracted("\\boxed{unclosed"), "(none)"));
  CHECK(!strcmp(extracted("a lone $ sign"), "(none)"));
}

static void test_numbers_fractions_and_percentages_compare_as_values(void) {
  CHECK(eq("42", "42") == 1);
  CHECK(eq("42.0", "42") == 1);
  CHECK(eq("1,000", "1000") == 1);
  CHECK(eq("1,000,000.5", "1000000.5") == 1);
  CHECK(eq("-3", "-3.000") == 1);
  CHECK(eq("+7", "7") == 1);
  CHECK(eq("41", "42") == 0);
  CHECK(eq("\\frac{1}{2}", "0.5") == 1);
  CHECK(eq("\\dfrac{3}{4}", "0.75") == 1);
  CHECK(eq("\\tfrac34", "\\frac{3}{4}") == 1);
  CHECK(eq("3/4", "\\frac{3}{4}") == 1);
  CHECK(eq("-\\frac{1}{2}", "-0.5") == 1);
  CHECK(eq("\\frac{-1}{2}", "-0.5") == 1);
  CHECK(eq("2\\frac{1}{2}", "2.5") == 1);  // a mixed number
  CHECK(eq("\\frac{1}{3}", "0.3333") == 0);  // not within 1e-6
  CHECK(eq("\\frac{1}{3}", "0.333333333") == 1);
  CHECK(eq("50\\%", "0.5") == 1);
  CHECK(eq("50%", "50") == 1);  // GSM8K writes the percentage's number alone
  CHECK(eq("0.5", "50\\%") == 1);
  CHECK(eq("25\\%", "0.5") == 0);
  CHECK(eq("1/0", "1/0") == 1);  // not a value: compared as texts
  CHECK(eq("3,00", "300") == 0);  // "3,00" is no thousands grouping
}

static void test_latex_spellings_normalize_before_comparing(void) {
  CHECK(eq("\\boxed{5}", "5") == 1);
  CHECK(eq("$5$", "5") == 1);
  CHECK(eq("x = 5", "5") == 1);
  CHECK(eq("5 \\text{ apples}", "5") == 1);  // a trailing unit
  CHECK(eq("\\text{Monday}", "Monday") == 1);
  CHECK(eq("90^\\circ", "90") == 1);
  CHECK(eq("90^{\\circ}", "90") == 1);
  CHECK(eq("12.", "12") == 1);
  CHECK(eq("\\left( 1, 2 \\right)", "(1,2)") == 1);
  CHECK(eq("\\dfrac{\\pi}{2}", "\\frac{\\pi}{2}") == 1);
  CHECK(eq("x^{2} + 1", "x^{2}+1") == 1);
  CHECK(eq("\\frac{\\pi}{3}", "\\frac{\\pi}{2}") == 0);
  CHECK(eq("\\!\\,5\\;", "5") == 1);
  CHECK(eq("anything", "") == -1);  // no reference: TRL skips the example
  CHECK(eq("", "5") == 0);
}

int main(void) {
  RUN(test_extraction_takes_the_last_boxed_else_the_last_math_span);
  RUN(test_numbers_fractions_and_percentages_compare_as_values);
  RUN(test_latex_spellings_normalize_before_comparing);
  return test_summary();
}
