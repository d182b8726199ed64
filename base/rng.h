// rng: xoshiro256** seeded by splitmix64; its whole state is four integers, saved in
// checkpoints so that a resumed run draws the same numbers.
#pragma once
#include <math.h>
#include <stdint.h>

typedef struct {
  uint64_t s[4];
} ct_rng;

static inline uint64_t ct_splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static inline void ct_rng_seed(ct_rng *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = ct_splitmix64(&seed);
}

static inline uint64_t ct_rng_next(ct_rng *r) {
  uint64_t *s = r->s;
  uint64_t x = s[1] * 5, result = ((x << 7) | (x >> 57)) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = (s[3] << 45) | (s[3] >> 19);
  return result;
}

// Uniform in [0, 1) with 53 random bits.
static inline double ct_rng_uniform(ct_rng *r) { return (ct_rng_next(r) >> 11) * 0x1.0p-53; }

// Uniform integer in [0, n), n > 0 (Lemire's rejection: no modulo bias).
static inline uint64_t ct_rng_below(ct_rng *r, uint64_t n) {
  for (;;) {
    uint64_t x = ct_rng_next(r);
    __uint128_t m = (__uint128_t)x * n;
    uint64_t l = (uint64_t)m;
    if (l >= n || l >= (-n) % n) return (uint64_t)(m >> 64);
  }
}

// Standard normal (Box-Muller; one value per call, the other is discarded so that the
// state alone determines the stream).
static inline double ct_rng_normal(ct_rng *r) {
  double u1 = ct_rng_uniform(r), u2 = ct_rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
