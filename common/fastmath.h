// fastmath: an expf that the compiler can vectorize (glibc's expf is a call per
// element). Cephes' polynomial after rounding x·log2(e) to the nearest integer n with
// the 1.5·2^23 trick (no floorf, no float->int conversion: both stop GCC's vectorizer
// under -ftrapping-math). About 1 ulp on [-87, 88].
#pragma once
#include <stdint.h>
#include <string.h>

static inline float ct_expf(float x) {
  const float hi = 88.3762626647949f, lo = -87.3365447504f;
  // NaN compares false both ways: map it to 0 for the arithmetic, return it at the end
  float xc = x > hi ? hi : (x < lo ? lo : (x == x ? x : 0.0f));
  const float magic = 12582912.0f;  // 1.5·2^23: adding it rounds to an integer in the low bits
  float t = xc * 1.44269504088896341f + magic;
  float n = t - magic;
  float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float z = r * r;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * z + r + 1.0f;
  int32_t ti, mi;
  memcpy(&ti, &t, sizeof ti);
  memcpy(&mi, &magic, sizeof mi);
  int32_t bits = (int32_t)((uint32_t)(ti - mi + 127) << 23);  // 2^n
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  float y = p * scale;
  return x == x ? (x < lo ? 0.0f : y) : x;
}
