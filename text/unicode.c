// unicode: UTF-8 decoding, category and White_Space lookups, NFC (decompose, reorder,
// compose) and simple case mapping over the generated tables in unicode_tables.c. No
// locale, no full case folding, no normalization form other than NFC.
#include "unicode.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

// Generated tables (common/unicode_tables.c).
extern const uint32_t ct_uc_ccc_tab[][2], ct_uc_upper_tab[][2], ct_uc_lower_tab[][2],
    ct_uc_fold_tab[][2], ct_uc_decomp_tab[][2], ct_uc_decomp_pool[];
extern const uint64_t ct_uc_comp[][2];
extern const int ct_uc_ccc_tab_n, ct_uc_upper_tab_n, ct_uc_lower_tab_n, ct_uc_fold_tab_n,
    ct_uc_decomp_tab_n, ct_uc_comp_n;

size_t ct_utf8_prev(const char *s, size_t lo, size_t i) {
  size_t j = i - 1;
  while (j > lo && i - j < 4 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
  size_t k = j;
  uint32_t cp = ct_utf8_next(s, i, &k);
  return cp == CT_UC_INVALID || k != i ? i - 1 : j;
}

int ct_utf8_put(char *out, uint32_t cp) {
  unsigned char *o = (unsigned char *)out;
  if (cp < 0x80) {
    o[0] = (unsigned char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (unsigned char)(0xC0 | (cp >> 6));
    o[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (unsigned char)(0xE0 | (cp >> 12));
    o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (unsigned char)(0xF0 | (cp >> 18));
  o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

bool ct_utf8_valid(const char *s, size_t n) {
  for (size_t i = 0; i < n;)
    if (ct_utf8_next(s, n, &i) == CT_UC_INVALID) return false;
  return true;
}

// Binary search in a sorted {key, value} table; returns the index or -1.
static int find_pair(const uint32_t (*tab)[2], int n, uint32_t key) {
  int lo = 0, hi = n - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (tab[mid][0] == key) return mid;
    if (tab[mid][0] < key) lo = mid + 1;
    else hi = mid - 1;
  }
  return -1;
}

static uint32_t map_or_self(const uint32_t (*tab)[2], int n, uint32_t cp) {
  int k = find_pair(tab, n, cp);
  return k < 0 ? cp : tab[k][1];
}

uint32_t ct_uc_upper(uint32_t cp) {
  if (cp < 0x80) return cp >= 'a' && cp <= 'z' ? cp - 32 : cp;
  return map_or_self(ct_uc_upper_tab, ct_uc_upper_tab_n, cp);
}
uint32_t ct_uc_lower(uint32_t cp) {
  if (cp < 0x80) return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
  return map_or_self(ct_uc_lower_tab, ct_uc_lower_tab_n, cp);
}
uint32_t ct_uc_fold(uint32_t cp) {
  if (cp < 0x80) return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
  return map_or_self(ct_uc_fold_tab, ct_uc_fold_tab_n, cp);
}

uint32_t ct_uc_base(uint32_t cp) {
  if (cp < 0xC0) return cp;
  if (cp >= 0xAC00 && cp < 0xAC00 + 11172) return 0x1100 + (cp - 0xAC00) / (21 * 28);
  int k = find_pair(ct_uc_decomp_tab, ct_uc_decomp_tab_n, cp);
  return k < 0 ? cp : ct_uc_decomp_pool[ct_uc_decomp_tab[k][1] >> 8];
}

// ---------------------------------------------------------------------------
// NFC. A code point whose property bit 6 is clear (combining class 0, NFC_QC=Yes) is a
// boundary: nothing before it interacts with anything from it on. So only the stretch
// from the boundary before a "maybe" code point to the next boundary is normalized, with
// the textbook algorithm (full decomposition, canonical ordering, composition).

enum { HANGUL_S = 0xAC00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11A7,
       HANGUL_LN = 19, HANGUL_VN = 21, HANGUL_TN = 28, HANGUL_N = HANGUL_VN * HANGUL_TN,
       HANGUL_SN = HANGUL_LN * HANGUL_N };

// Invalid bytes travel through as 0x110000 + byte: starters that compose with nothing.
#define RAW_BYTE 0x110000u

static int ccc_of(uint32_t cp) {
  if (cp >= RAW_BYTE || !(ct_uc_prop(cp) & 64)) return 0;
  int k = find_pair(ct_uc_ccc_tab, ct_uc_ccc_tab_n, cp);
  return k < 0 ? 0 : (int)ct_uc_ccc_tab[k][1];
}

static uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= HANGUL_L && a < HANGUL_L + HANGUL_LN && b >= HANGUL_V && b < HANGUL_V + HANGUL_VN)
    return HANGUL_S + ((a - HANGUL_L) * HANGUL_VN + (b - HANGUL_V)) * HANGUL_TN;
  if (a >= HANGUL_S && a < HANGUL_S + HANGUL_SN && (a - HANGUL_S) % HANGUL_TN == 0 &&
      b > HANGUL_T && b < HANGUL_T + HANGUL_TN)
    return a + (b - HANGUL_T);
  if (a >= RAW_BYTE || b >= RAW_BYTE) return 0;
  uint64_t key = ((uint64_t)a << 21) | b;
  int lo = 0, hi = ct_uc_comp_n - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (ct_uc_comp[mid][0] == key) return (uint32_t)ct_uc_comp[mid][1];
    if (ct_uc_comp[mid][0] < key) lo = mid + 1;
    else hi = mid - 1;
  }
  return 0;
}

bool ct_uc_nfc_quick(const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    if ((unsigned char)s[i] < 0xCC) {  // below U+0300 nothing combines or decomposes
      i += (unsigned char)s[i] < 0x80 ? 1 : 2;
      if (i > n) return false;
      continue;
    }
    uint32_t cp = ct_utf8_next(s, n, &i);
    if (cp != CT_UC_INVALID && (ct_uc_prop(cp) & 64)) return false;
  }
  return true;
}

static int grow(char **out, size_t *cap, size_t need) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 256;
  while (c < need) c *= 2;
  char *p = realloc(*out, c);
  if (!p) return ct_set_error(CT_ENOMEM, "unicode: out of memory");
  *out = p;
  *cap = c;
  return 0;
}

// Normalizes one stretch s[0, n) (starting at a boundary) and appends it.
static int nfc_stretch(const char *s, size_t n, char **out, size_t *len, size_t *cap) {
  uint32_t stack_buf[256];
  int stack_ccc[256];
  size_t max = 4 * n + 4;  // a code point takes >= 1 byte and decomposes into <= 4
  uint32_t *cps = stack_buf;
  int *cc = stack_ccc;
  if (max > 256) {
    cps = malloc(max * sizeof *cps);
    cc = malloc(max * sizeof *cc);
    if (!cps || !cc) {
      free(cps);
      free(cc);
      return ct_set_error(CT_ENOMEM, "unicode: out of memory");
    }
  }
  size_t m = 0;
  for (size_t i = 0; i < n;) {
    size_t at = i;
    uint32_t cp = ct_utf8_next(s, n, &i);
    if (cp == CT_UC_INVALID) {
      cps[m++] = RAW_BYTE + (unsigned char)s[at];
    } else if (cp >= HANGUL_S && cp < HANGUL_S + HANGUL_SN) {
      uint32_t si = cp - HANGUL_S;
      cps[m++] = HANGUL_L + si / HANGUL_N;
      cps[m++] = HANGUL_V + (si % HANGUL_N) / HANGUL_TN;
      if (si % HANGUL_TN) cps[m++] = HANGUL_T + si % HANGUL_TN;
    } else {
      int k = cp >= 0xC0 ? find_pair(ct_uc_decomp_tab, ct_uc_decomp_tab_n, cp) : -1;
      if (k < 0) {
        cps[m++] = cp;
      } else {
        uint32_t v = ct_uc_decomp_tab[k][1];
        for (uint32_t j = 0; j < (v & 255); j++) cps[m++] = ct_uc_decomp_pool[(v >> 8) + j];
      }
    }
  }
  for (size_t j = 0; j < m; j++) cc[j] = ccc_of(cps[j]);
  // Canonical ordering: a stable insertion sort of each run of non-zero classes.
  for (size_t j = 1; j < m; j++) {
    if (!cc[j]) continue;
    for (size_t k = j; k > 0 && cc[k - 1] > cc[k]; k--) {
      uint32_t t = cps[k]; cps[k] = cps[k - 1]; cps[k - 1] = t;
      int tc = cc[k]; cc[k] = cc[k - 1]; cc[k - 1] = tc;
    }
  }
  // Composition: each code point joins the last starter unless blocked.
  size_t w = 0;
  long starter = -1;
  for (size_t j = 0; j < m; j++) {
    uint32_t cp = cps[j];
    int c = cc[j];
    // Blocked when something sits between the starter and cp whose class is 0 or >= cp's
    // (the classes are ordered now, so looking at the last one kept is enough).
    if (starter >= 0 && ((size_t)starter == w - 1 || (cc[w - 1] != 0 && cc[w - 1] < c))) {
      uint32_t comp = compose(cps[starter], cp);
      if (comp) {
        cps[starter] = comp;
        continue;
      }
    }
    if (c == 0) starter = (long)w;
    cps[w] = cp;
    cc[w] = c;
    w++;
  }
  int rc = grow(out, cap, *len + 4 * w + 1);
  if (!rc) {
    for (size_t j = 0; j < w; j++) {
      if (cps[j] >= RAW_BYTE) (*out)[(*len)++] = (char)(cps[j] - RAW_BYTE);
      else *len += (size_t)ct_utf8_put(*out + *len, cps[j]);
    }
  }
  if (cps != stack_buf) {
    free(cps);
    free(cc);
  }
  return rc;
}

static int map_add(ct_uc_nfc_map *map, size_t a, size_t b, size_t c, size_t d) {
  if (map->n + 4 > map->cap) {
    size_t cap = map->cap ? 2 * map->cap : 64;
    size_t *v = realloc(map->v, cap * sizeof *v);
    if (!v) return ct_set_error(CT_ENOMEM, "unicode: out of memory");
    map->v = v;
    map->cap = cap;
  }
  map->v[map->n++] = a;
  map->v[map->n++] = b;
  map->v[map->n++] = c;
  map->v[map->n++] = d;
  return 0;
}

int ct_uc_nfc(const char *s, size_t n, char **out, size_t *len, size_t *cap, ct_uc_nfc_map *map) {
  size_t copied = 0, prev = 0;  // prev: start of the last code point seen
  size_t base = *len;
  if (map) map->n = 0;
  for (size_t i = 0; i < n;) {
    size_t at = i;
    uint32_t cp = ct_utf8_next(s, n, &i);
    if (cp == CT_UC_INVALID || !(ct_uc_prop(cp) & 64)) {
      prev = at;
      continue;
    }
    // A "maybe" code point: normalize from the boundary before it (the previous code
    // point, a boundary itself) to the next boundary.
    size_t start = prev;
    size_t end = i;
    while (end < n) {
      size_t j = end;
      uint32_t c2 = ct_utf8_next(s, n, &j);
      if (c2 == CT_UC_INVALID || !(ct_uc_prop(c2) & 64)) break;
      end = j;
    }
    if (grow(out, cap, *len + (start - copied) + 1)) return CT_ENOMEM;
    memcpy(*out + *len, s + copied, start - copied);
    *len += start - copied;
    size_t out_start = *len;
    int rc = nfc_stretch(s + start, end - start, out, len, cap);
    if (rc) return rc;
    if (map && (*len - out_start != end - start || memcmp(*out + out_start, s + start, end - start)) &&
        map_add(map, out_start - base, *len - base, start, end))
      return CT_ENOMEM;
    copied = prev = end;
    i = end;
  }
  if (grow(out, cap, *len + (n - copied) + 1)) return CT_ENOMEM;
  memcpy(*out + *len, s + copied, n - copied);
  *len += n - copied;
  return 0;
}

char *ct_utf8_lossy(const char *s, size_t n, size_t *len) {
  char *out = malloc(3 * n + 1);  // each bad byte grows to 3
  if (!out) return NULL;
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    size_t start = i;
    uint32_t cp = ct_utf8_next(s, n, &i);
    if (cp == CT_UC_INVALID) {
      memcpy(out + o, "\xEF\xBF\xBD", 3);
      o += 3;
    } else {
      memcpy(out + o, s + start, i - start);
      o += i - start;
    }
  }
  out[o] = 0;
  if (len) *len = o;
  return out;
}
