// Encoding: added tokens cut out first (leftmost, longest), each stretch between them
// normalized, pre-tokenized (the pipeline's steps) and merged by BPE rank, with a word
// cache; byte offsets back into the caller's text; the masked encode of a rendered chat.
#include "tokenizer.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "tokenizer_internal.h"
#include "tokenizer_regex.h"
#include "tokenizer_sp.h"
#include "unicode.h"

static inline const merge_slot *merge_find(const ct_tokenizer *t, int a, int b) {
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  for (uint32_t i = ct_tok_hash_pair(key) & t->mmask;; i = (i + 1) & t->mmask) {
    const merge_slot *m = &t->mslot[i];
    if (m->id < 0) return NULL;
    if (m->key == key) return m;
  }
}

static inline bool junction_find(const ct_tokenizer *t, uint64_t key) {
  for (uint32_t i = ct_tok_hash_pair(key) & t->jmask;; i = (i + 1) & t->jmask) {
    if (t->jslot[i] == key) return true;
    if (!t->jslot[i]) return false;
  }
}

// (The tokenizer frees its own cache and scratch with these, in ct_tokenizer_free.)
void ct_tok_cache_free(word_cache *c) {
  free(c->hash);
  free(c->loc);
  free(c->arena);
  memset(c, 0, sizeof *c);
}

void ct_tok_scratch_free(const ct_tokenizer *t, enc_scratch *s) {
  if (s->steps)
    for (int i = 0; i < t->nsteps; i++) {
      ct_regex_text_free(&s->steps[i].rt);
      free(s->steps[i].buf);
    }
  free(s->steps);
  free(s->sym);
  free(s->prev);
  free(s->next);
  free(s->heap);
  free(s->norm);
  free(s->map.v);
  free(s->spos);
  ct_sp_buf_free(&s->spb);
  memset(s, 0, sizeof *s);
}

typedef struct {
  const ct_tokenizer *t;
  ct_ids *out, *offs;
  enc_scratch *sc;    // the tokenizer's (under cache_mu) or this call's own
  bool mapped;        // the section went through NFC (offsets go through sc->map)
  const uint32_t *pmap;  // the SentencePiece ops' map of the section (NULL: none)
  size_t sec_orig;    // offset of the current section in the caller's text
  word_cache *cache;  // NULL when another thread holds it
} enc;

// Byte offset in the caller's text of position `pos` of the current (normalized) section.
// The map's stretches are ordered and disjoint: bisect for the last one starting at or
// before pos. Inside it every position maps to its input start; after it (or before the
// first) bytes map one to one.
static size_t orig_offset(const enc *e, size_t pos) {
  if (e->pmap) pos = e->pmap[pos];  // back through Prepend/Replace to the NFC text
  if (!e->mapped) return e->sec_orig + pos;
  const size_t *m = e->sc->map.v;  // (stretches, 4): out_start, out_end, in_start, in_end
  size_t lo = 0, hi = e->sc->map.n / 4;
  while (lo < hi) {  // stretches [0, lo) start at or before pos, [hi, end) after it
    size_t mid = lo + (hi - lo) / 2;
    if (m[4 * mid] <= pos) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0) return e->sec_orig + pos;
  const size_t *st = m + 4 * (lo - 1);
  if (pos < st[1]) return e->sec_orig + st[2];
  return e->sec_orig + st[3] + (pos - st[1]);
}

static int emit(enc *e, int id, long pos) {
  if (ct_ids_push(e->out, id)) return CT_ENOMEM;
  if (e->offs && ct_ids_push(e->offs, (int)orig_offset(e, pos < 0 ? 0 : (size_t)pos))) return CT_ENOMEM;
  return 0;
}

static int grow_sym(enc_scratch *s, size_t n) {
  if (n <= s->capsym) return 0;
  size_t cap = s->capsym ? s->capsym : 64;
  while (cap < n) cap *= 2;
  int *a = realloc(s->sym, cap * sizeof *a);
  if (a) s->sym = a;
  int *b = realloc(s->prev, cap * sizeof *b);
  if (b) s->prev = b;
  int *c = realloc(s->next, cap * sizeof *c);
  if (c) s->next = c;
  int *d = realloc(s->spos, cap * sizeof *d);
  if (d) s->spos = d;
  uint64_t *h = realloc(s->heap, 2 * cap * sizeof *h);
  if (h) s->heap = h;
  if (!a || !b || !c || !d || !h) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  s->capsym = cap;
  return 0;
}

// Min-heap of (rank << 32 | position): the lowest rank merges first, leftmost on ties.
static inline void heap_push(uint64_t *h, size_t *n, uint64_t v) {
  size_t i = (*n)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (h[p] <= v) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = v;
}

static inline uint64_t heap_pop(uint64_t *h, size_t *n) {
  uint64_t top = h[0], v = h[--*n];
  size_t i = 0, m = *n;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= m) break;
    if (c + 1 < m && h[c + 1] < h[c]) c++;
    if (v <= h[c]) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = v;
  return top;
}

static inline void try_pair(const ct_tokenizer *t, enc_scratch *s, size_t *nh, int i) {
  int j = s->next[i];
  if (j < 0 || s->sym[i] < 0 || s->sym[j] < 0) return;
  const merge_slot *m = merge_find(t, s->sym[i], s->sym[j]);
  if (m) heap_push(s->heap, nh, ((uint64_t)(uint32_t)m->rank << 32) | (uint32_t)i);
}

static const int *cache_get(const word_cache *c, const char *w, size_t n, uint64_t h, int *nids) {
  if (!c->hash) return NULL;
  for (uint32_t i = (uint32_t)h & c->mask;; i = (i + 1) & c->mask) {
    if (!c->hash[i]) return NULL;
    if (c->hash[i] != h) continue;
    const char *p = c->arena + c->loc[i];
    uint16_t len, k;
    memcpy(&len, p, 2);
    memcpy(&k, p + 2, 2);
    if (len == n && memcmp(p + 4, w, n) == 0) {
      *nids = k;
      return (const int *)(p + 4 + ((n + 3) & ~(size_t)3));
    }
  }
}

static void cache_put(word_cache *c, const char *w, size_t n, uint64_t h, const int *ids, int nids) {
  enum { SLOTS = 1 << 17, ARENA = 8 << 20 };
  size_t need = 4 + ((n + 3) & ~(size_t)3) + sizeof(int) * (size_t)nids;
  if (!c->hash) {
    c->hash = calloc(SLOTS, sizeof *c->hash);
    c->loc = malloc(SLOTS * sizeof *c->loc);
    c->arena = malloc(ARENA);
    if (!c->hash || !c->loc || !c->arena) {
      ct_tok_cache_free(c);
      return;
    }
    c->mask = SLOTS - 1;
    c->cap = ARENA;
  }
  if (c->count >= SLOTS / 2 || c->used + need > c->cap) {  // full: start over
    memset(c->hash, 0, SLOTS * sizeof *c->hash);
    c->count = 0;
    c->used = 0;
  }
  uint32_t i = (uint32_t)h & c->mask;
  while (c->hash[i]) i = (i + 1) & c->mask;
  char *p = c->arena + c->used;
  uint16_t len = (uint16_t)n, k = (uint16_t)nids;
  memcpy(p, &len, 2);
  memcpy(p + 2, &k, 2);
  memcpy(p + 4, w, n);
  if (nids) memcpy(p + 4 + ((n + 3) & ~(size_t)3), ids, sizeof(int) * (size_t)nids);
  c->hash[i] = h;
  c->loc[i] = (uint32_t)c->used;
  c->used += need;
  c->count++;
}

// A byte-level word's first symbols: its bytes (-1 for a byte not in the vocabulary).
static size_t byte_symbols(const ct_tokenizer *t, const char *w, size_t n, enc_scratch *sc) {
  for (size_t i = 0; i < n; i++) {
    sc->sym[i] = t->byte_id[(unsigned char)w[i]];
    sc->spos[i] = (int)i;
  }
  return n;
}

// A SentencePiece-style word's first symbols: one per character (its vocabulary id), or
// the character's <0xNN> byte tokens when it is not in the vocabulary (byte_fallback),
// else unk (a run of unknown characters is one unk with fuse_unk), as in Hugging Face.
static size_t sp_symbols(const ct_tokenizer *t, const char *w, size_t n, enc_scratch *sc) {
  size_t k = 0;
  bool last_unk = false;
  for (size_t i = 0; i < n;) {
    size_t a = i;
    unsigned char c = (unsigned char)w[i];
    int id;
    if (c < 0x80) {
      id = t->byte_id[c];
      i++;
    } else {
      ct_utf8_next(w, n, &i);
      id = ct_tok_vocab_find(t, w + a, i - a);
    }
    bool bytes_ok = id < 0 && t->byte_fallback;
    for (size_t j = a; bytes_ok && j < i; j++) bytes_ok = t->fallback_id[(unsigned char)w[j]] >= 0;
    if (id >= 0 || bytes_ok) {
      for (size_t j = a; j < (id >= 0 ? a + 1 : i); j++, k++) {
        sc->sym[k] = id >= 0 ? id : t->fallback_id[(unsigned char)w[j]];
        sc->spos[k] = (int)j;
      }
      last_unk = false;
    } else if (t->unk >= 0 && !(t->fuse_unk && last_unk)) {
      sc->sym[k] = t->unk;
      sc->spos[k++] = (int)a;
      last_unk = true;
    }
  }
  return k;
}

// Merges sym[0, n) (linked through prev/next), lowest rank first, leftmost on ties.
static void merge_symbols(const ct_tokenizer *t, enc_scratch *sc, size_t n) {
  int *sym = sc->sym, *prev = sc->prev, *next = sc->next;
  for (size_t i = 0; i < n; i++) {
    prev[i] = (int)i - 1;
    next[i] = i + 1 < n ? (int)i + 1 : -1;
  }
  size_t nh = 0;
  for (size_t i = 0; i + 1 < n; i++) try_pair(t, sc, &nh, (int)i);
  while (nh) {
    uint64_t top = heap_pop(sc->heap, &nh);
    int i = (int)(uint32_t)top, rank = (int)(top >> 32);
    int j = next[i];
    if (sym[i] < 0 || j < 0 || sym[j] < 0) continue;  // i was merged away or lost its right neighbour
    const merge_slot *m = merge_find(t, sym[i], sym[j]);
    if (!m || m->rank != rank) continue;  // the pair changed since it was queued
    sym[i] = m->id;
    sym[j] = -2;  // dead
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    if (prev[i] >= 0) try_pair(t, sc, &nh, prev[i]);
    try_pair(t, sc, &nh, i);
  }
}

static int bpe_piece(enc *e, const char *w, size_t n, long pos);

// One pre-tokenized word: BPE merges, by rank, over its bytes (byte-level) or characters
// (SentencePiece-style, merged piecewise between characters no merge joins). `pos` is the
// word's position in the section, for offsets.
static int bpe_word(enc *e, const char *w, size_t n, long pos) {
  const ct_tokenizer *t = e->t;
  if (!t->sp || t->no_cut) return bpe_piece(e, w, n, pos);
  size_t start = 0, i = 0;
  uint32_t prev = ct_utf8_next(w, n, &i);
  while (i < n) {
    size_t at = i;
    uint32_t cp = ct_utf8_next(w, n, &i);
    if (!junction_find(t, ct_tok_junction_key(prev, cp))) {
      int rc = bpe_piece(e, w + start, at - start, pos + (long)start);
      if (rc) return rc;
      start = at;
    }
    prev = cp;
  }
  return bpe_piece(e, w + start, n - start, pos + (long)start);
}

// A word, or a piece of one no merge crosses.
static int bpe_piece(enc *e, const char *w, size_t n, long pos) {
  const ct_tokenizer *t = e->t;
  if (n == 0) return 0;
  if (n == 1 && !t->sp) {
    int id = t->byte_id[(unsigned char)w[0]];
    return id >= 0 ? emit(e, id, pos) : t->unk >= 0 ? emit(e, t->unk, pos) : 0;
  }
  // a cached word's offsets advance by token length, which byte tokens and unk break in sp
  bool cacheable = e->cache && n <= 255 && !(t->sp && e->offs);
  uint64_t h = cacheable || t->ignore_merges ? ct_tok_hash_bytes(w, n) : 0;
  if (cacheable) {
    int k;
    const int *ids = cache_get(e->cache, w, n, h, &k);
    if (ids) {
      for (int i = 0; i < k; i++) {
        if (emit(e, ids[i], pos)) return CT_ENOMEM;
        if (e->offs) pos += (long)t->tok_len[ids[i]];
      }
      return 0;
    }
  }
  if (t->ignore_merges) {
    int id = ct_tok_vocab_find_h(t, w, n, h);
    if (id >= 0) {
      if (cacheable) cache_put(e->cache, w, n, h, &id, 1);
      return emit(e, id, pos);
    }
  }
  enc_scratch *sc = e->sc;
  if (grow_sym(sc, n)) return CT_ENOMEM;
  size_t ns = t->sp ? sp_symbols(t, w, n, sc) : byte_symbols(t, w, n, sc);
  if (ns == 0) return 0;
  merge_symbols(t, sc, ns);
  // Symbols left: emit in order (a byte missing from the vocabulary becomes unk, or is
  // dropped when there is none, as in Hugging Face).
  int count = 0;
  for (int i = 0; i >= 0; i = sc->next[i]) {
    int id = sc->sym[i] >= 0 ? sc->sym[i] : t->unk;
    if (id < 0) continue;
    if (emit(e, id, pos + sc->spos[i])) return CT_ENOMEM;
    count++;
  }
  if (cacheable && count > 0 && count <= 1024) cache_put(e->cache, w, n, h, e->out->v + e->out->n - count, count);
  return 0;
}

static int piece(enc *e, int k, const char *s, size_t n, long pos);

// Emits s[a, b) (code point indices of the step's decoded text) as a piece.
static int sub_piece(enc *e, int k, const char *s, const ct_regex_text *rt, size_t a, size_t b, long pos) {
  size_t from = rt->off[a], to = rt->off[b];
  return piece(e, k + 1, s + from, to - from, pos + (long)from);
}

// Runs pre-tokenizer step k over s[0, n) and hands each resulting piece to step k+1;
// past the last step a piece is a word for BPE. `pos` locates s in the section.
static int piece(enc *e, int k, const char *s, size_t n, long pos) {
  const ct_tokenizer *t = e->t;
  if (n == 0) return 0;
  if (k == t->nsteps) return bpe_word(e, s, n, pos);
  const pretok_step *st = &t->steps[k];
  step_scratch *sc = &e->sc->steps[k];
  if (st->kind == STEP_PREFIX) {
    if (s[0] == ' ') return piece(e, k + 1, s, n, pos);
    if (n + 1 > sc->cap) {
      size_t cap = sc->cap ? sc->cap : 256;
      while (cap < n + 1) cap *= 2;
      char *b = realloc(sc->buf, cap);
      if (!b) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
      sc->buf = b;
      sc->cap = cap;
    }
    sc->buf[0] = ' ';
    memcpy(sc->buf + 1, s, n);
    // The added space has no source byte: offsets inside shift back by one.
    return piece(e, k + 1, sc->buf, n + 1, pos - 1);
  }
  ct_regex_text *rt = &sc->rt;
  if (ct_regex_text_set(rt, s, n)) return CT_ENOMEM;
  size_t end = rt->n;
  if (st->kind == STEP_DIGITS) {
    size_t a = 0;
    while (a < end) {
      size_t b = a + 1;
      bool dig = ct_uc_is_number(rt->cp[a]);
      if (!(dig && st->individual))
        while (b < end && ct_uc_is_number(rt->cp[b]) == dig) b++;
      int rc = sub_piece(e, k, s, rt, a, b, pos);
      if (rc) return rc;
      a = b;
    }
    return 0;
  }
  // Split: every match (and every gap between matches) is a piece.
  size_t gap = 0, at = 0;
  while (at < end) {
    long m = ct_regex_match(st->re, rt, at, end);
    if (m < -1) return CT_EFORMAT;
    if (m < 0 || (size_t)m == at) {
      at++;
      continue;
    }
    if (st->merge != MERGE_NONE) {  // a piece ends after (PREV) or before (NEXT) each match
      size_t cut = st->merge == MERGE_PREV ? (size_t)m : at;
      if (gap < cut) {
        int rc = sub_piece(e, k, s, rt, gap, cut, pos);
        if (rc) return rc;
      }
      gap = cut;
      at = (size_t)m;
      continue;
    }
    if (gap < at && st->keep_gap) {
      int rc = sub_piece(e, k, s, rt, gap, at, pos);
      if (rc) return rc;
    }
    if (st->keep_match) {
      int rc = sub_piece(e, k, s, rt, at, (size_t)m, pos);
      if (rc) return rc;
    }
    // sub_piece may re-enter deeper steps, which use their own scratch: rt stays valid.
    at = gap = (size_t)m;
  }
  if (gap < end && st->keep_gap) return sub_piece(e, k, s, rt, gap, end, pos);
  return 0;
}

// A stretch of text between added tokens: normalize, pre-tokenize, merge.
static int section(enc *e, const char *s, size_t n, size_t orig) {
  if (n == 0) return 0;
  e->sec_orig = orig;
  e->mapped = false;
  if (e->t->nfc && !ct_uc_nfc_quick(s, n)) {
    size_t len = 0;
    enc_scratch *sc = e->sc;
    if (ct_uc_nfc(s, n, &sc->norm, &len, &sc->normcap, e->offs ? &sc->map : NULL)) return CT_ENOMEM;
    s = sc->norm;
    n = len;
    e->mapped = e->offs != NULL;
  }
  e->pmap = NULL;
  if (e->t->nops) {  // Prepend / Replace / Metaspace; "first" means the start of the input
    const char *o;
    size_t on;
    if (ct_sp_normalize(e->t->ops, e->t->nops, s, n, orig == 0, e->offs != NULL, &e->sc->spb, &o, &on, &e->pmap))
      return CT_ENOMEM;
    s = o;
    n = on;
  }
  return piece(e, 0, s, n, 0);
}

static bool is_word_char(uint32_t cp) { return ct_uc_is_letter(cp) || ct_uc_is_number(cp) || cp == '_'; }

// Whether added token a, whose content is at text[i], counts there (special, single_word).
static bool added_applies(const added_token *a, const char *text, size_t len, size_t i, bool special) {
  if (a->special && !special) return false;
  if (a->single_word) {
    size_t k = i + a->len;
    if (i > 0) {
      size_t j = ct_utf8_prev(text, 0, i);
      if (is_word_char(ct_utf8_next(text, len, &j))) return false;
    }
    if (k < len && is_word_char(ct_utf8_next(text, len, &k))) return false;
  }
  return true;
}

// Buckets up to this size are scanned; larger ones are probed in the content hash once
// per distinct length (same order, same result).
enum { ADDED_SCAN_MAX = 32 };

// The first added token at or after `from`: its index and position, or -1.
static int find_added(const ct_tokenizer *t, const char *text, size_t len, size_t from, bool special,
                      size_t *at) {
  for (size_t i = from; i < len; i++) {
    if (t->only_first_byte >= 0) {
      const char *p = memchr(text + i, t->only_first_byte, len - i);
      if (!p) return -1;
      i = (size_t)(p - text);
    }
    unsigned char b = (unsigned char)text[i];
    if (t->bucket_start[b + 1] - t->bucket_start[b] <= ADDED_SCAN_MAX) {
      for (int q = t->bucket_start[b]; q < t->bucket_start[b + 1]; q++) {
        const added_token *a = &t->added[t->bucket_list[q]];
        if (a->len > len - i || memcmp(text + i, t->bytes + a->off, a->len)) continue;
        if (!added_applies(a, text, len, i, special)) continue;
        *at = i;
        return t->bucket_list[q];
      }
      continue;
    }
    for (int l = t->lens_start[b]; l < t->lens_start[b + 1]; l++) {  // longest first
      size_t n = (size_t)t->bucket_lens[l];
      if (n > len - i) continue;
      for (int k = ct_tok_added_find(t, text + i, n); k >= 0; k = t->anext[k])  // list order
        if (added_applies(&t->added[k], text, len, i, special)) {
          *at = i;
          return k;
        }
    }
  }
  return -1;
}

// Splits text at added tokens: each stretch between them is a section, each added token
// its id.
static int encode_text(enc *e, const char *text, size_t len, bool special) {
  const ct_tokenizer *t = e->t;
  int rc = 0;
  size_t start = 0, from = 0;
  while (!rc && start <= len) {
    size_t at = len;
    int k = t->nadded ? find_added(t, text, len, from, special, &at) : -1;
    if (k < 0) return section(e, text + start, len - start, start);
    const added_token *a = &t->added[k];
    size_t sec_end = at, next = at + a->len;
    if (a->lstrip)
      while (sec_end > start) {
        size_t p = ct_utf8_prev(text, start, sec_end), j = p;
        if (!ct_uc_is_space(ct_utf8_next(text, len, &j))) break;
        sec_end = p;
      }
    if (a->rstrip)
      while (next < len) {
        size_t j = next;
        if (!ct_uc_is_space(ct_utf8_next(text, len, &j))) break;
        next = j;
      }
    rc = section(e, text + start, sec_end - start, start);
    if (!rc) {
      e->mapped = false;
      e->pmap = NULL;
      e->sec_orig = 0;
      rc = emit(e, a->id, (long)sec_end);
    }
    start = from = next;
    if (start == len) break;
  }
  return rc;
}

// The tokenizer keeps its scratch after texts up to this many bytes: the buffers grow with
// the text, and past this size allocating them costs little next to encoding.
enum { SCRATCH_KEEP = 64 << 10 };

static int encode(const ct_tokenizer *t, const char *text, size_t len, bool special, ct_ids *out,
                  ct_ids *offs) {
  if (offs && len >= (size_t)INT32_MAX) return FAIL(CT_EINVAL, "tokenizer: text too long for offsets");
  ct_tokenizer *shared = (ct_tokenizer *)t;  // its cache and scratch change only under cache_mu
  bool locked = pthread_mutex_trylock(&shared->cache_mu) == 0;
  enc_scratch own = {0};
  enc e = {.t = t, .out = out, .offs = offs, .sc = locked ? &shared->scratch : &own,
           .cache = locked ? &shared->cache : NULL};
  int rc = 0;
  if (!e.sc->steps) e.sc->steps = calloc((size_t)t->nsteps + 1, sizeof *e.sc->steps);
  if (!e.sc->steps) rc = FAIL(CT_ENOMEM, "tokenizer: out of memory");
  if (!rc) rc = encode_text(&e, text, len, special);
  if (locked) {
    if (len > SCRATCH_KEEP) ct_tok_scratch_free(t, &shared->scratch);
    pthread_mutex_unlock(&shared->cache_mu);
  }
  ct_tok_scratch_free(t, &own);
  return rc;
}

int ct_tokenizer_encode(const ct_tokenizer *t, const char *text, size_t len, bool special, ct_ids *out) {
  return encode(t, text, len, special, out, NULL);
}

int ct_tokenizer_encode_offsets(const ct_tokenizer *t, const char *text, size_t len, bool special,
                                ct_ids *out, ct_ids *offsets) {
  return encode(t, text, len, special, out, offsets);
}

int ct_tokenizer_encode_doc(const ct_tokenizer *t, const char *text, size_t len, ct_ids *out) {
  int from = out->n, bos = ct_tokenizer_bos(t);
  bool add = ct_tokenizer_add_bos(t) && bos >= 0;
  if (add && ct_ids_push(out, bos)) return CT_ENOMEM;
  int rc = encode(t, text, len, true, out, NULL);
  if (!rc && add && out->n > from + 1 && out->v[from + 1] == bos) {  // the text wrote its own
    memmove(out->v + from, out->v + from + 1, sizeof(int) * (out->n - from - 1));
    out->n--;
  }
  return rc;
}

int ct_tokenizer_encode_masked(const ct_tokenizer *t, const char *text, size_t len, const ct_span *spans,
                               int nspans, ct_ids *ids, ct_ids *mask) {
  ct_ids offs = {0};
  int first = ids->n;
  int rc = ct_tokenizer_encode_offsets(t, text, len, true, ids, &offs);
  int s = 0;  // spans before s end at or before the token: ordered spans end in order too
  size_t last = 0;
  for (int i = 0; !rc && i < offs.n; i++) {
    size_t a = (size_t)offs.v[i];  // the token covers text[a, b)
    size_t b = i + 1 < offs.n ? (size_t)offs.v[i + 1] : len;
    if (b < a) b = a;
    if (b == a) b = a + t->tok_len[ids->v[first + i]];
    if (a < last) s = 0;  // an offset went back (an unk token's length): look from the start
    last = a;
    while (s < nspans && spans[s].end <= a) s++;
    rc = ct_ids_push(mask, s < nspans && spans[s].start < b);  // the first span ending after a
  }
  ct_ids_free(&offs);
  return rc;
}
