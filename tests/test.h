// test: a minimal harness. Each tests/test_<module>.c has a main() that RUNs its
// cases and returns test_summary(); any failed CHECK makes the binary exit 1.
#pragma once
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "error.h"

static int test_failures, test_checks;
static const char *test_current = "";

#define CHECK(cond)                                                              \
  do {                                                                           \
    test_checks++;                                                               \
    if (!(cond)) {                                                               \
      test_failures++;                                                           \
      fprintf(stderr, "%s:%d: %s: CHECK(%s) failed\n", __FILE__, __LINE__,       \
              test_current, #cond);                                              \
    }                                                                            \
  } while (0)

// |a - b| <= tol, printing both values when it does not hold (NaN fails).
#define CHECK_NEAR(a, b, tol)                                                    \
  do {                                                                           \
    double a_ = (a), b_ = (b), t_ = (tol);                                       \
    test_checks++;                                                               \
    if (!(fabs(a_ - b_) <= t_)) {                                                \
      test_failures++;                                                           \
      fprintf(stderr, "%s:%d: %s: %s = %.9g, %s = %.9g, |diff| %.3g > %.3g\n",   \
              __FILE__, __LINE__, test_current, #a, a_, #b, b_, fabs(a_ - b_), t_); \
    }                                                                            \
  } while (0)

// 0 == expr, printing ct_last_error() when it is not.
#define CHECK_OK(expr)                                                           \
  do {                                                                           \
    int rc_ = (expr);                                                            \
    test_checks++;                                                               \
    if (rc_ != 0) {                                                              \
      test_failures++;                                                           \
      fprintf(stderr, "%s:%d: %s: %s returned %d: %s\n", __FILE__, __LINE__,     \
              test_current, #expr, rc_, ct_last_error());                        \
    }                                                                            \
  } while (0)

#define RUN(fn)                       \
  do {                                \
    test_current = #fn;               \
    int before_ = test_failures;      \
    fn();                             \
    fprintf(stderr, "  %s %s\n", test_failures == before_ ? "ok  " : "FAIL", #fn); \
  } while (0)

static inline int test_summary(void) {
  fprintf(stderr, "%d checks, %d failed\n", test_checks, test_failures);
  return test_failures ? 1 : 0;
}

// Largest |a_i - b_i| / max(1, |b_i|) over n floats.
static inline double test_max_rel_diff(const float *a, const float *b, long n) {
  double m = 0;
  for (long i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]) / fmax(1.0, fabs((double)b[i]));
    if (d > m || d != d) m = d != d ? INFINITY : d;
  }
  return m;
}
