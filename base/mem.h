// mem: small helpers for the library's owned memory.
#pragma once
#include <stdlib.h>

// free() of every pointer given: ct_free_all(a->x, a->y, a->z).
static inline void ct_free_each(void *const *p, size_t n) {
  for (size_t i = 0; i < n; i++) free(p[i]);
}
#define ct_free_all(...) \
  ct_free_each((void *const[]){__VA_ARGS__}, sizeof((void *const[]){__VA_ARGS__}) / sizeof(void *))
