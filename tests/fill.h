// fill: zeroed allocations and seeded uniform fills shared by the numeric tests.
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "rng.h"

static void *xcalloc(long n, long size) {
  void *p = calloc((size_t)(n > 0 ? n : 1), (size_t)size);
  if (!p) {
    fprintf(stderr, "test: out of memory\n");
    exit(2);
  }
  return p;
}
static inline float *falloc(long n) { return xcalloc(n, sizeof(float)); }
static inline double *dalloc(long n) { return xcalloc(n, sizeof(double)); }

static ct_rng rng;
static inline void seed(uint64_t s) { ct_rng_seed(&rng, s); }
static inline double unif(double lo, double hi) { return lo + (hi - lo) * ct_rng_uniform(&rng); }
static inline void fill(float *x, long n, double lo, double hi) {
  for (long i = 0; i < n; i++) x[i] = (float)unif(lo, hi);
}
// x[i] = normal(0, 1) from r, in order.
static inline void fill_normal(float *x, long n, ct_rng *r) {
  for (long i = 0; i < n; i++) x[i] = (float)ct_rng_normal(r);
}
