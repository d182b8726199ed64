// hash: 64-bit FNV-1a, for checksums of data and weights (cache keys, "unchanged" checks).
// Not cryptographic. Chain calls by passing the previous result as h.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define CT_FNV1A_INIT 0xcbf29ce484222325ULL

static inline uint64_t ct_fnv1a(const void *p, size_t n, uint64_t h) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
  return h;
}
