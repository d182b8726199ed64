#include "tokenizer_sp.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

void ct_sp_buf_free(ct_sp_buf *b) {
  for (int k = 0; k < 2; k++) {
    free(b->text[k]);
    free(b->map[k]);
  }
  memset(b, 0, sizeof *b);
}

static int reserve(ct_sp_buf *b, int k, size_t n) {
  if (n <= b->cap[k]) return 0;
  size_t cap = b->cap[k] ? b->cap[k] : 256;
  while (cap < n) cap *= 2;
  char *t = realloc(b->text[k], cap);
  if (t) b->text[k] = t;
  uint32_t *m = realloc(b->map[k], sizeof *m * cap);
  if (m) b->map[k] = m;
  if (!t || !m) return ct_set_error(CT_ENOMEM, "tokenizer: out of memory");
  b->cap[k] = cap;
  return 0;
}

static bool prepend_applies(const ct_sp_op *op, const char *s, size_t n, bool first) {
  bool has = n >= op->alen && memcmp(s, op->a, op->alen) == 0;
  switch (op->scheme) {
    case CT_SP_PLAIN: return n > 0;
    case CT_SP_ALWAYS: return !has;
    case CT_SP_FIRST: return first && !has;
    default: return false;
  }
}

// Where the input byte of position i of the current text is (map NULL: the identity).
static inline uint32_t src_of(const uint32_t *map, size_t i) { return map ? map[i] : (uint32_t)i; }

// One op from (s, n, map) into buffer k; returns the output length.
static size_t apply(const ct_sp_op *op, const char *s, size_t n, const uint32_t *map, char *dst,
                    uint32_t *dmap) {
  size_t w = 0;
  if (op->kind == CT_SP_PREPEND) {
    for (size_t i = 0; i < op->alen; i++) dmap[w + i] = src_of(map, 0);
    memcpy(dst, op->a, op->alen);
    w = op->alen;
    for (size_t i = 0; i < n; i++) dmap[w + i] = src_of(map, i);
    memcpy(dst + w, s, n);
    return w + n;
  }
  for (size_t i = 0; i < n;) {
    const char *hit = memmem(s + i, n - i, op->a, op->alen);
    size_t stop = hit ? (size_t)(hit - s) : n;
    for (size_t j = i; j < stop; j++) dmap[w + j - i] = src_of(map, j);
    memcpy(dst + w, s + i, stop - i);
    w += stop - i;
    if (!hit) break;
    for (size_t j = 0; j < op->blen; j++) dmap[w + j] = src_of(map, stop);
    memcpy(dst + w, op->b, op->blen);
    w += op->blen;
    i = stop + op->alen;
  }
  return w;
}

// The output size bound of one op over n bytes.
static size_t bound(const ct_sp_op *op, const char *s, size_t n) {
  if (op->kind == CT_SP_PREPEND) return n + op->alen;
  if (op->blen <= op->alen) return n;
  size_t hits = 0;
  for (const char *p = s, *e = s + n; (p = memmem(p, (size_t)(e - p), op->a, op->alen)); p += op->alen) hits++;
  return n + hits * (op->blen - op->alen);
}

int ct_sp_normalize(const ct_sp_op *ops, int nops, const char *s, size_t n, bool first, bool want_map,
                    ct_sp_buf *b, const char **out, size_t *outn, const uint32_t **map) {
  const char *cur = s;
  const uint32_t *cmap = NULL;
  size_t n0 = n;
  int k = 0;
  for (int i = 0; i < nops; i++) {
    const ct_sp_op *op = &ops[i];
    if (op->kind == CT_SP_PREPEND ? !prepend_applies(op, cur, n, first) : !memmem(cur, n, op->a, op->alen))
      continue;
    if (reserve(b, k, bound(op, cur, n) + 1)) return CT_ENOMEM;
    n = apply(op, cur, n, want_map ? cmap : NULL, b->text[k], b->map[k]);
    cur = b->text[k];
    cmap = want_map ? b->map[k] : NULL;
    k ^= 1;
  }
  if (cmap) b->map[k ^ 1][n] = (uint32_t)n0;  // the end maps to the end
  *out = cur;
  *outn = n;
  if (map) *map = cmap;
  return 0;
}

int ct_sp_byte_token(const char *token, size_t n) {
  if (n != 6 || memcmp(token, "<0x", 3) || token[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; i++) {
    char c = token[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

int ct_sp_replace_all(const char *s, size_t n, const char *from, size_t flen, const char *to, size_t tlen,
                      char **out, size_t *outn) {
  ct_sp_op op = {.kind = CT_SP_REPLACE, .a = (char *)from, .b = (char *)to, .alen = flen, .blen = tlen};
  size_t cap = bound(&op, s, n) + 1;
  char *dst = malloc(cap);
  uint32_t *m = malloc(sizeof *m * cap);
  if (!dst || !m) {
    free(dst);
    free(m);
    return ct_set_error(CT_ENOMEM, "tokenizer: out of memory");
  }
  *outn = apply(&op, s, n, NULL, dst, m);
  dst[*outn] = 0;
  free(m);
  *out = dst;
  return 0;
}
