// tokenizer.json's model (a BPE: vocab, merges, unk_token, byte_fallback, ...) and
// added_tokens: the id -> bytes table, the vocabulary and merge hash tables, the
// junctions SentencePiece-style words are cut at, and the added tokens' index. Also
// GPT-2's byte <-> character map the byte-level vocabulary is spelled in.
#include "tokenizer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "mem.h"
#include "tokenizer_internal.h"
#include "tokenizer_sp.h"
#include "unicode.h"

// ---------------------------------------------------------------------------
// GPT-2's byte <-> printable character map (bytes_to_unicode).

static bool gpt2_printable(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

int ct_tok_gpt2_byte_char(int b) {
  if (gpt2_printable(b)) return b;
  int n = 0;
  for (int c = 0; c < b; c++)
    if (!gpt2_printable(c)) n++;
  return 256 + n;
}

static int gpt2_char_byte[324];  // code point (< 324) -> byte, -1 if none
static pthread_once_t gpt2_once = PTHREAD_ONCE_INIT;
static void gpt2_init(void) {
  for (int c = 0; c < 324; c++) gpt2_char_byte[c] = -1;
  for (int b = 0; b < 256; b++) gpt2_char_byte[ct_tok_gpt2_byte_char(b)] = b;
}

// Maps a vocabulary string to its bytes, appending to dst (room for n bytes). Returns
// the byte count, or -1 when some character is not in the byte-level alphabet (then,
// like Hugging Face's ByteLevel decoder, the token stands for its own UTF-8).
long ct_tok_gpt2_decode(const char *s, size_t n, char *dst) {
  size_t w = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp = ct_utf8_next(s, n, &i);
    if (cp >= 324 || gpt2_char_byte[cp] < 0) return -1;
    dst[w++] = (char)gpt2_char_byte[cp];
  }
  return (long)w;
}

void ct_tok_gpt2_init(void) { pthread_once(&gpt2_once, gpt2_init); }

// ---------------------------------------------------------------------------
// Small helpers for building

int ct_tok_store_bytes(ct_tokenizer *t, const char *s, size_t n, uint32_t *off) {
  if (t->nbytes + n + 1 > t->capbytes) {
    size_t cap = t->capbytes ? t->capbytes : 1 << 16;
    while (cap < t->nbytes + n + 1) cap *= 2;
    char *b = realloc(t->bytes, cap);
    if (!b) return ct_set_error(CT_ENOMEM, "tokenizer: out of memory");
    t->bytes = b;
    t->capbytes = cap;
  }
  if (t->nbytes > UINT32_MAX - n - 1) return ct_set_error(CT_ENOMEM, "tokenizer: vocabulary too large");
  memcpy(t->bytes + t->nbytes, s, n);
  *off = (uint32_t)t->nbytes;
  t->nbytes += n;
  t->bytes[t->nbytes] = 0;
  return 0;
}

static void vocab_insert(ct_tokenizer *t, int id) {
  const char *s = t->bytes + t->tok_off[id];
  size_t n = t->tok_len[id];
  uint32_t h = (uint32_t)ct_tok_hash_bytes(s, n);
  for (uint32_t i = h & t->vmask;; i = (i + 1) & t->vmask) {
    int other = t->vslot[i];
    if (other < 0) {
      t->vslot[i] = id;
      return;
    }
    if (t->tok_len[other] == n && memcmp(t->bytes + t->tok_off[other], s, n) == 0) return;  // first id wins
  }
}

// Records that merge (a, b) joins a's last character to b's first.
static void junction_add(ct_tokenizer *t, const char *a, size_t alen, const char *b, size_t blen) {
  if (ct_sp_byte_token(a, alen) >= 0 || ct_sp_byte_token(b, blen) >= 0 ||
      (t->unk >= 0 && ((alen == t->tok_len[t->unk] && !memcmp(a, t->bytes + t->tok_off[t->unk], alen)) ||
                       (blen == t->tok_len[t->unk] && !memcmp(b, t->bytes + t->tok_off[t->unk], blen)))))
    t->no_cut = true;
  size_t i = ct_utf8_prev(a, 0, alen), j = 0;
  uint64_t key = ct_tok_junction_key(ct_utf8_next(a, alen, &i), ct_utf8_next(b, blen, &j));
  for (uint32_t k = ct_tok_hash_pair(key) & t->jmask;; k = (k + 1) & t->jmask) {
    if (t->jslot[k] == key) return;
    if (!t->jslot[k]) {
      t->jslot[k] = key;
      return;
    }
  }
}

static int grow_ids_table(ct_tokenizer *t, int size) {
  uint32_t *off = realloc(t->tok_off, sizeof *off * (size_t)size);
  if (off) t->tok_off = off;
  uint32_t *len = realloc(t->tok_len, sizeof *len * (size_t)size);
  if (len) t->tok_len = len;
  uint8_t *kind = realloc(t->tok_kind, (size_t)size);
  if (kind) t->tok_kind = kind;
  uint8_t *sp = realloc(t->tok_special, (size_t)size);
  if (sp) t->tok_special = sp;
  if (!off || !len || !kind || !sp) return ct_set_error(CT_ENOMEM, "tokenizer: out of memory");
  for (int i = t->vocab_size; i < size; i++) {
    t->tok_off[i] = t->tok_len[i] = 0;
    t->tok_kind[i] = TOK_NONE;
    t->tok_special[i] = 0;
  }
  t->vocab_size = size;
  return 0;
}

// ===========================================================================
// model

int ct_tok_load_model(ct_tokenizer *t, const loadctx *L, const json_t *model) {
  const char *type = ct_tok_type_of(model);
  if (!json_is_object(model)) return FAIL(CT_EFORMAT, "%s: model: missing or not an object", L->file);
  if (type && strcmp(type, "BPE"))
    return FAIL(CT_EFORMAT,
                "%s: model.type: '%s' is not supported (only BPE models: byte-level or SentencePiece-style)",
                L->file, type);
  const json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
  if (!json_is_object(vocab))
    return FAIL(CT_EFORMAT, "%s: model.vocab: expected an object of token -> id", L->file);
  if (!type && !json_is_array(merges))
    return FAIL(CT_EFORMAT, "%s: model.type: missing (and no merges: not a BPE model)", L->file);
  if (merges && !json_is_array(merges)) return FAIL(CT_EFORMAT, "%s: model.merges: expected a list", L->file);
  const json_t *dropout = json_object_get(model, "dropout");
  if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0.0)
    return FAIL(CT_EFORMAT, "%s: model.dropout: BPE dropout is not supported (set it to null)", L->file);
  const char *fields[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int i = 0; i < 2; i++) {
    const json_t *f = json_object_get(model, fields[i]);
    if (f && !json_is_null(f) && !(json_is_string(f) && json_string_length(f) == 0))
      return FAIL(CT_EFORMAT, "%s: model.%s: not supported", L->file, fields[i]);
  }
  t->ignore_merges = ct_tok_is_true(json_object_get(model, "ignore_merges"));
  t->byte_fallback = ct_tok_is_true(json_object_get(model, "byte_fallback"));
  t->fuse_unk = ct_tok_is_true(json_object_get(model, "fuse_unk"));

  // ids
  int max_id = -1;
  const char *key;
  const json_t *val;
  json_object_foreach((json_t *)vocab, key, val) {
    int id;
    if (!ct_tok_get_id(val, &id))
      return FAIL(CT_EFORMAT, "%s: model.vocab['%s']: id must be an integer in [0, 16000000]", L->file, key);
    if (id > max_id) max_id = id;
  }
  if (max_id < 0) return FAIL(CT_EFORMAT, "%s: model.vocab: empty", L->file);
  if (grow_ids_table(t, max_id + 1)) return CT_ENOMEM;
  char *tmp = malloc(4096);
  if (!tmp) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  json_object_foreach((json_t *)vocab, key, val) {
    int id = 0;
    ct_tok_get_id(val, &id);
    size_t n = strlen(key);
    if (t->tok_kind[id] != TOK_NONE) {
      free(tmp);
      return FAIL(CT_EFORMAT, "%s: model.vocab['%s']: id %d is used twice", L->file, key, id);
    }
    long w = -1;
    if (n <= 1024 && !t->sp) w = ct_tok_gpt2_decode(key, n, tmp);
    int rc = w >= 0 ? ct_tok_store_bytes(t, tmp, (size_t)w, &t->tok_off[id]) : ct_tok_store_bytes(t, key, n, &t->tok_off[id]);
    if (rc) {
      free(tmp);
      return rc;
    }
    t->tok_len[id] = w >= 0 ? (uint32_t)w : (uint32_t)n;
    t->tok_kind[id] = TOK_VOCAB;
  }
  free(tmp);
  size_t nv = json_object_size(vocab), slots = 16;
  while (slots < 2 * nv) slots *= 2;
  t->vslot = malloc(sizeof *t->vslot * slots);
  if (!t->vslot) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  memset(t->vslot, 0xff, sizeof *t->vslot * slots);
  t->vmask = (uint32_t)(slots - 1);
  for (int id = 0; id < t->vocab_size; id++)
    if (t->tok_kind[id] == TOK_VOCAB) vocab_insert(t, id);
  for (int b = 0; b < 256; b++) {
    char ch = (char)b, name[8];
    t->byte_id[b] = ct_tok_vocab_find(t, &ch, 1);
    snprintf(name, sizeof name, "<0x%02X>", b);
    t->fallback_id[b] = ct_tok_vocab_find(t, name, 6);
  }

  // merges: "a b" strings or ["a", "b"] pairs, rank = position
  size_t nm = merges ? json_array_size(merges) : 0;
  slots = 16;
  while (slots < 2 * nm + 2) slots *= 2;
  t->mslot = malloc(sizeof *t->mslot * slots);
  if (!t->mslot) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  for (size_t i = 0; i < slots; i++) t->mslot[i] = (merge_slot){0, -1, -1};
  t->mmask = (uint32_t)(slots - 1);
  if (t->sp) {
    t->jslot = calloc(slots, sizeof *t->jslot);
    if (!t->jslot) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
    t->jmask = t->mmask;
  }
  const json_t *unk = json_object_get(model, "unk_token");
  if (json_is_string(unk)) {
    const json_t *u = json_object_get(vocab, json_string_value(unk));
    if (u) ct_tok_get_id(u, &t->unk);
  }
  char *cat = NULL;
  size_t catcap = 0;
  for (size_t r = 0; r < nm; r++) {
    const json_t *m = json_array_get(merges, r);
    const char *a, *b;
    size_t alen, blen;
    if (json_is_string(m)) {
      a = json_string_value(m);
      const char *sp = strchr(a, ' ');
      if (!sp || sp == a || !sp[1] || strchr(sp + 1, ' ')) {
        free(cat);
        return FAIL(CT_EFORMAT, "%s: model.merges[%zu]: expected \"left right\", got \"%s\"", L->file, r, a);
      }
      alen = (size_t)(sp - a);
      b = sp + 1;
      blen = strlen(b);
    } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
               json_is_string(json_array_get(m, 1))) {
      a = json_string_value(json_array_get(m, 0));
      b = json_string_value(json_array_get(m, 1));
      alen = strlen(a);
      blen = strlen(b);
    } else {
      free(cat);
      return FAIL(CT_EFORMAT, "%s: model.merges[%zu]: expected a string or a pair of strings", L->file, r);
    }
    if (alen + blen + 1 > catcap) {
      catcap = 2 * (alen + blen + 1);
      char *c = realloc(cat, catcap);
      if (!c) {
        free(cat);
        return FAIL(CT_ENOMEM, "tokenizer: out of memory");
      }
      cat = c;
    }
    memcpy(cat, a, alen);
    cat[alen] = 0;
    const json_t *ja = json_object_get(vocab, cat);
    memcpy(cat, b, blen);
    cat[blen] = 0;
    const json_t *jb = json_object_get(vocab, cat);
    memcpy(cat, a, alen);
    memcpy(cat + alen, b, blen);
    cat[alen + blen] = 0;
    const json_t *jab = json_object_get(vocab, cat);
    if (!ja || !jb || !jab) {
      int bad = !ja ? 0 : !jb ? 1 : 2;
      int len = bad == 0 ? (int)alen : bad == 1 ? (int)blen : (int)(alen + blen);
      const char *s = bad == 0 ? a : bad == 1 ? b : cat;
      int rc = FAIL(CT_EFORMAT, "%s: model.merges[%zu]: token '%.*s' is not in the vocabulary", L->file, r,
                    len, s);
      free(cat);
      return rc;
    }
    int ia = 0, ib = 0, iab = 0;
    ct_tok_get_id(ja, &ia);
    ct_tok_get_id(jb, &ib);
    ct_tok_get_id(jab, &iab);
    if (t->sp) junction_add(t, a, alen, b, blen);
    uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
    for (uint32_t i = ct_tok_hash_pair(key) & t->mmask;; i = (i + 1) & t->mmask) {
      merge_slot *s = &t->mslot[i];
      if (s->id < 0) {
        *s = (merge_slot){key, (int32_t)r, iab};
        break;
      }
      if (s->key == key) break;  // a repeated merge keeps its first (best) rank
    }
  }
  free(cat);
  // Never cut where a whole word may be one token (ignore_merges), or where a run of
  // unknown characters may fuse into one unk (no byte for every byte to fall back to).
  bool all_bytes = t->byte_fallback;
  for (int b = 0; b < 256; b++) all_bytes = all_bytes && t->fallback_id[b] >= 0;
  t->no_cut = t->no_cut || t->ignore_merges || (t->fuse_unk && t->unk >= 0 && !all_bytes);
  return 0;
}

// ===========================================================================
// added_tokens

// Bucket order of added tokens: first byte, then longest first, then list order.
typedef struct {
  uint32_t len;
  int idx;
  unsigned char b;
} added_key;

static int added_order(const void *x, const void *y) {
  const added_key *p = x, *q = y;
  if (p->b != q->b) return p->b < q->b ? -1 : 1;
  if (p->len != q->len) return p->len > q->len ? -1 : 1;
  return (p->idx > q->idx) - (p->idx < q->idx);
}

// Buckets by first byte, longest first, so the first hit at a position is the longest;
// each bucket's distinct lengths; and a hash of contents, for large buckets and lookups
// by name. O(n log n) in the number of added tokens.
int ct_tok_index_added(ct_tokenizer *t) {
  int n = t->nadded;
  t->only_first_byte = -1;
  t->bucket_list = malloc(sizeof(int) * (size_t)(n + 1));
  t->bucket_lens = malloc(sizeof(int) * (size_t)(n + 1));
  t->anext = malloc(sizeof(int) * (size_t)(n + 1));
  size_t slots = 16;
  while (slots < 2 * (size_t)n) slots *= 2;
  t->aslot = malloc(sizeof *t->aslot * slots);
  added_key *keys = malloc(sizeof *keys * (size_t)(n + 1));
  int *tail = malloc(sizeof(int) * (size_t)(n + 1));
  if (!t->bucket_list || !t->bucket_lens || !t->anext || !t->aslot || !keys || !tail) {
    free(keys);
    free(tail);
    return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  }
  for (int i = 0; i < n; i++)
    keys[i] = (added_key){t->added[i].len, i, (unsigned char)t->bytes[t->added[i].off]};
  qsort(keys, (size_t)n, sizeof *keys, added_order);
  int k = 0, nl = 0;
  for (int b = 0; b < 256; b++) {
    t->bucket_start[b] = k;
    t->lens_start[b] = nl;
    for (; k < n && keys[k].b == b; k++) {
      t->bucket_list[k] = keys[k].idx;
      if (k == t->bucket_start[b] || keys[k].len != keys[k - 1].len) t->bucket_lens[nl++] = (int)keys[k].len;
    }
  }
  t->bucket_start[256] = k;
  t->lens_start[256] = nl;
  if (n > 0 && keys[0].b == keys[n - 1].b) t->only_first_byte = keys[0].b;
  free(keys);

  memset(t->aslot, 0xff, sizeof *t->aslot * slots);
  t->amask = (uint32_t)(slots - 1);
  for (int i = 0; i < n; i++) {
    const added_token *a = &t->added[i];
    t->anext[i] = -1;
    for (uint32_t h = (uint32_t)ct_tok_hash_bytes(t->bytes + a->off, a->len) & t->amask;; h = (h + 1) & t->amask) {
      int first = t->aslot[h];
      if (first < 0) {
        t->aslot[h] = i;
        tail[i] = i;
        break;
      }
      if (t->added[first].len == a->len && memcmp(t->bytes + t->added[first].off, t->bytes + a->off, a->len) == 0) {
        t->anext[tail[first]] = i;  // list order within the same content
        tail[first] = i;
        break;
      }
    }
  }
  free(tail);
  return 0;
}

// The added tokens' lookup structures (ct_tok_index_added builds them).
void ct_tok_free_added_index(ct_tokenizer *t) {
  ct_free_all(t->bucket_list, t->bucket_lens, t->aslot, t->anext);
  t->bucket_list = t->bucket_lens = t->anext = NULL;
  t->aslot = NULL;
}

int ct_tok_load_added(ct_tokenizer *t, const loadctx *L, const json_t *added) {
  if (!added || json_is_null(added)) return 0;
  if (!json_is_array(added)) return FAIL(CT_EFORMAT, "%s: added_tokens: expected a list", L->file);
  size_t n = json_array_size(added);
  t->added = calloc(n + 1, sizeof *t->added);
  if (!t->added) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  for (size_t i = 0; i < n; i++) {
    const json_t *a = json_array_get(added, i);
    const json_t *content = json_object_get(a, "content");
    int tid;
    if (!ct_tok_get_id(json_object_get(a, "id"), &tid))
      return FAIL(CT_EFORMAT, "%s: added_tokens[%zu].id: expected an integer in [0, 16000000]", L->file, i);
    if (!json_is_string(content) || json_string_length(content) == 0)
      return FAIL(CT_EFORMAT, "%s: added_tokens[%zu].content: expected a non-empty string", L->file, i);
    if (tid >= t->vocab_size && grow_ids_table(t, tid + 1)) return CT_ENOMEM;
    added_token *at = &t->added[t->nadded++];
    at->id = tid;
    at->special = ct_tok_is_true(json_object_get(a, "special"));
    at->lstrip = ct_tok_is_true(json_object_get(a, "lstrip"));
    at->rstrip = ct_tok_is_true(json_object_get(a, "rstrip"));
    at->single_word = ct_tok_is_true(json_object_get(a, "single_word"));
    const char *s = json_string_value(content);
    size_t len = json_string_length(content);
    if (t->tok_kind[tid] == TOK_VOCAB && (t->tok_len[tid] != len || memcmp(t->bytes + t->tok_off[tid], s, len)))
      return FAIL(CT_EFORMAT, "%s: added_tokens[%zu]: id %d is '%s' here but another token in model.vocab",
                  L->file, i, tid, s);
    if (ct_tok_store_bytes(t, s, len, &at->off)) return CT_ENOMEM;
    at->len = (uint32_t)len;
    t->tok_off[tid] = at->off;
    t->tok_len[tid] = at->len;
    t->tok_kind[tid] = TOK_ADDED;
    t->tok_special[tid] = at->special;
  }
  return ct_tok_index_added(t);
}
