// bf16: bfloat16 <-> float32, inline so that conversion loops vectorize. Narrowing
// rounds to nearest, ties to even; overflow gives inf; NaN stays NaN (quiet bit set).
#pragma once
#include <stdint.h>
#include <string.h>

static inline float ct_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t ct_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest, ties to even; may carry into inf
  return (uint16_t)(x >> 16);
}

// dst (n) = widened src (n); narrowing the other way.
static inline void ct_bf16_widen(float *dst, const uint16_t *src, long n) {
#pragma omp simd
  for (long i = 0; i < n; i++) dst[i] = ct_bf16_to_f32(src[i]);
}
static inline void ct_bf16_narrow(uint16_t *dst, const float *src, long n) {
#pragma omp simd
  for (long i = 0; i < n; i++) dst[i] = ct_f32_to_bf16(src[i]);
}
