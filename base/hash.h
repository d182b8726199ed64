// hash: 64-bit FNV-1a and XXH64, for checksums of data, files and weights (cache keys,
// "unchanged" checks, identities). Not cryptographic. Chain calls by passing the previous
// result as h (FNV-1a) or as the seed (XXH64).
#pragma once
#include <stddef.h>
#include <stdint.h>

#define CT_FNV1A_INIT 0xcbf29ce484222325ULL

static inline uint64_t ct_fnv1a(const void *p, size_t n, uint64_t h) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
  return h;
}

// XXH64 (Yann Collet's xxHash, 64-bit; the published test vectors hold): fast enough to
// checksum checkpoint files (GB/s) where FNV-1a would take seconds.
#define CT_XXH_P1 0x9E3779B185EBCA87ULL
#define CT_XXH_P2 0xC2B2AE3D27D4EB4FULL
#define CT_XXH_P3 0x165667B19E3779F9ULL
#define CT_XXH_P4 0x85EBCA77C2B2AE63ULL
#define CT_XXH_P5 0x27D4EB2F165667C5ULL

static inline uint64_t ct_xxh_rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t ct_xxh_read64(const unsigned char *p) {
  uint64_t v;
  __builtin_memcpy(&v, p, 8);  // little-endian hosts (x86-64, aarch64)
  return v;
}
static inline uint64_t ct_xxh_round(uint64_t acc, uint64_t in) {
  return ct_xxh_rotl(acc + in * CT_XXH_P2, 31) * CT_XXH_P1;
}
static inline uint64_t ct_xxh_merge(uint64_t h, uint64_t v) {
  return (h ^ ct_xxh_round(0, v)) * CT_XXH_P1 + CT_XXH_P4;
}

static inline uint64_t ct_xxh64(const void *data, size_t n, uint64_t seed) {
  const unsigned char *p = data, *end = p + n;
  uint64_t h;
  if (n >= 32) {
    uint64_t v1 = seed + CT_XXH_P1 + CT_XXH_P2, v2 = seed + CT_XXH_P2, v3 = seed, v4 = seed - CT_XXH_P1;
    for (; p + 32 <= end; p += 32) {
      v1 = ct_xxh_round(v1, ct_xxh_read64(p));
      v2 = ct_xxh_round(v2, ct_xxh_read64(p + 8));
      v3 = ct_xxh_round(v3, ct_xxh_read64(p + 16));
      v4 = ct_xxh_round(v4, ct_xxh_read64(p + 24));
    }
    h = ct_xxh_rotl(v1, 1) + ct_xxh_rotl(v2, 7) + ct_xxh_rotl(v3, 12) + ct_xxh_rotl(v4, 18);
    h = ct_xxh_merge(ct_xxh_merge(ct_xxh_merge(ct_xxh_merge(h, v1), v2), v3), v4);
  } else {
    h = seed + CT_XXH_P5;
  }
  h += (uint64_t)n;
  for (; p + 8 <= end; p += 8) h = ct_xxh_rotl(h ^ ct_xxh_round(0, ct_xxh_read64(p)), 27) * CT_XXH_P1 + CT_XXH_P4;
  if (p + 4 <= end) {
    uint32_t w;
    __builtin_memcpy(&w, p, 4);
    h = ct_xxh_rotl(h ^ (uint64_t)w * CT_XXH_P1, 23) * CT_XXH_P2 + CT_XXH_P3;
    p += 4;
  }
  for (; p < end; p++) h = ct_xxh_rotl(h ^ *p * CT_XXH_P5, 11) * CT_XXH_P1;
  h ^= h >> 33;
  h *= CT_XXH_P2;
  h ^= h >> 29;
  h *= CT_XXH_P3;
  return h ^ (h >> 32);
}

// XXH64 chained over blocks of CT_XXH_BLOCK bytes (each block's seed is the hash of the
// ones before, the first's is h): the checksum ct_file_checksum (fs.h) gives a file of
// these n bytes when h = 0. Chain further buffers by passing the result as h.
#define CT_XXH_BLOCK ((size_t)4 << 20)
static inline uint64_t ct_xxh64_blocks(const void *data, size_t n, uint64_t h) {
  const unsigned char *p = data;
  for (size_t at = 0; at < n; at += CT_XXH_BLOCK) h = ct_xxh64(p + at, n - at < CT_XXH_BLOCK ? n - at : CT_XXH_BLOCK, h);
  return h;
}
