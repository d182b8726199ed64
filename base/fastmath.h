// fastmath: an expf and a logf that the compiler can vectorize (glibc's are a call per
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

// Natural log of a positive, finite, normal x (Cephes' logf polynomial on the mantissa
// in [sqrt(1/2), sqrt(2)); about 1 ulp). Zero, negatives, infinities, NaN and subnormals
// are outside its domain: callers keep their arguments inside it.
static inline float ct_logf(float x) {
  int32_t bits;
  memcpy(&bits, &x, sizeof bits);
  float e = (float)(((bits >> 23) & 0xff) - 126);  // x = m·2^e, m in [0.5, 1)
  bits = (bits & 0x007fffff) | 0x3f000000;
  float m;
  memcpy(&m, &bits, sizeof m);
  int low = m < 0.707106781186547524f;
  e = low ? e - 1.0f : e;
  float f = low ? m + m - 1.0f : m - 1.0f;  // now x = (1 + f)·2^e, f in [-0.29, 0.41)
  float z = f * f;
  float y = 7.0376836292E-2f;
  y = y * f - 1.1514610310E-1f;
  y = y * f + 1.1676998740E-1f;
  y = y * f - 1.2420140846E-1f;
  y = y * f + 1.4249322787E-1f;
  y = y * f - 1.6668057665E-1f;
  y = y * f + 2.0000714765E-1f;
  y = y * f - 2.4999993993E-1f;
  y = y * f + 3.3333331174E-1f;
  y = y * f * z;
  y += -2.12194440e-4f * e;
  y += -0.5f * z;
  return f + y + 0.693359375f * e;
}
