#include "tokenizer.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat_template.h"
#include "error.h"
#include "fs.h"
#include "jinja.h"
#include "tokenizer_regex.h"
#include "tokenizer_sp.h"
#include "unicode.h"

// ===========================================================================
// The tokenizer

enum { TOK_NONE, TOK_VOCAB, TOK_ADDED };  // what an id is

typedef struct {
  int id;
  uint32_t off, len;  // content in t->bytes
  bool special, lstrip, rstrip, single_word;
} added_token;

enum { STEP_SPLIT, STEP_PREFIX, STEP_DIGITS };
enum { MERGE_NONE, MERGE_PREV, MERGE_NEXT };
typedef struct {
  int kind;
  ct_regex *re;          // STEP_SPLIT
  bool keep_match, keep_gap;
  int merge;             // STEP_SPLIT: MERGE_PREV / MERGE_NEXT glue a match to its neighbour
  bool individual;       // STEP_DIGITS
} pretok_step;

// Word cache: bytes of a pre-tokenized word -> its ids. Entries live in an arena as
// [u16 len][u16 nids][len bytes][pad][nids int32].
typedef struct {
  uint64_t *hash;  // (slots) 0 = empty
  uint32_t *loc;   // (slots) arena offset
  char *arena;
  size_t used, cap;
  uint32_t mask, count;
} word_cache;

typedef struct {
  uint64_t key;  // a << 32 | b
  int32_t rank, id;
} merge_slot;

typedef struct {
  ct_regex_text rt;
  char *buf;  // STEP_PREFIX: " " + piece
  size_t cap;
} step_scratch;

// An encode's buffers; they only grow. The tokenizer keeps one set for whichever thread
// holds cache_mu, a thread that finds it busy uses a set of its own.
typedef struct {
  step_scratch *steps;     // (nsteps + 1) one per pre-tokenizer step
  int *sym, *prev, *next;  // (capsym) a word's BPE symbols, as a linked list
  int *spos;               // (capsym) where each symbol starts in the word
  uint64_t *heap;          // (2 * capsym) candidate merges
  size_t capsym;
  char *norm;              // (normcap) NFC form of the current section
  size_t normcap;
  ct_uc_nfc_map map;       // where NFC changed the current section
  ct_sp_buf spb;           // the section after the SentencePiece ops
} enc_scratch;

struct ct_tokenizer {
  int vocab_size;
  int bos, eos, pad, unk;
  bool add_bos, add_eos;

  // id -> bytes
  char *bytes;
  size_t nbytes, capbytes;
  uint32_t *tok_off, *tok_len;
  uint8_t *tok_kind;
  uint8_t *tok_special;

  // BPE model
  int32_t *vslot;  // bytes -> id (vocab entries only); -1 empty
  uint32_t vmask;
  merge_slot *mslot;
  uint32_t mmask;
  int byte_id[256];
  bool ignore_merges;

  // SentencePiece-style BPE (no ByteLevel in the file): symbols are characters, the
  // vocabulary is spelled as in tokenizer.json (with ▁), and a token decodes to
  // dec_off/dec_len (the decoder's Replace and ByteFallback applied).
  bool sp, byte_fallback, fuse_unk;
  int fallback_id[256];         // the <0xNN> tokens, -1 when absent
  ct_sp_op *ops;                // normalizers after NFC, then Metaspace's replace/prepend
  int nops;
  ct_sp_op *drep;               // the decoder's Replace ops, in order
  int ndrep;
  bool dec_bytefb, dec_fused;   // ByteFallback; Fuse seen (Strip then cuts the whole text)
  int strip_start, strip_stop;  // Strip: at most this many strip_c cut from each end
  char strip_c;
  uint32_t *dec_off, *dec_len;  // (vocab_size) sp only
  // sp: the character pairs some merge joins (last of its left, first of its right). No
  // merge ever crosses a boundary between two other characters, so a word is merged in
  // pieces cut there (the same result; the pieces are short enough for the word cache).
  uint64_t *jslot;              // pair keys, 0 empty
  uint32_t jmask;
  bool no_cut;                  // a merge of byte or unk tokens: never cut

  // added tokens, bucketed by first byte, longest first within a bucket (in list order
  // among equal lengths)
  added_token *added;
  int nadded;
  int *bucket_list, bucket_start[257];
  int *bucket_lens, lens_start[257];  // a bucket's distinct lengths, longest first
  int only_first_byte;  // >= 0 when every added token starts with this byte
  int32_t *aslot;       // content -> index of the first added token with it; -1 empty
  uint32_t amask;
  int *anext;           // (nadded) the next added token with the same content, or -1

  bool nfc;
  pretok_step *steps;
  int nsteps;

  // tokenizer_config.json
  char *template_src;
  bool template_overridden;  // set by ct_tokenizer_set_chat_template: saved into the config
  ct_jinja *tmpl;
  char *template_err;  // why the template did not parse, or NULL
  char *bos_str, *eos_str, *pad_str, *unk_str;
  int *stops;
  int nstops;

  // the files, kept to save them back unchanged
  char *json_text, *cfg_text;
  size_t json_len, cfg_len;

  pthread_mutex_t cache_mu;  // guards cache and scratch
  word_cache cache;
  enc_scratch scratch;
};

// The byte tokenizer's special tokens, in id order after the 256 bytes.
static const char *const byte_specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"};

// ChatML. Assistant replies and their <|im_end|> sit in {% generation %} blocks, the
// markers transformers (return_assistant_tokens_mask) and assistant_only_loss use.
static const char chatml_template[] =
    "{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\\n' }}{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Special tokens that end a turn or a document in common chat formats.
static const char *const stop_names[] = {
    "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "</s>",
    "<end_of_turn>", "<|end|>", "<|return|>", "<|end▁of▁sentence|>", "<|EOT|>", "<eos>",
};


static inline uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0x100000001B3ull);
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, s, 8);
    h = (h ^ v) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
    s += 8;
    n -= 8;
  }
  uint64_t v = 0;
  memcpy(&v, s, n);
  h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 29;
  return h | 1;  // never 0, which marks an empty cache slot
}

static inline uint32_t hash_pair(uint64_t key) {
  key *= 0x9E3779B97F4A7C15ull;
  return (uint32_t)(key >> 32);
}

// ---------------------------------------------------------------------------
// GPT-2's byte <-> printable character map (bytes_to_unicode).

static bool gpt2_printable(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

static int gpt2_byte_char(int b) {
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
  for (int b = 0; b < 256; b++) gpt2_char_byte[gpt2_byte_char(b)] = b;
}

// Maps a vocabulary string to its bytes, appending to dst (room for n bytes). Returns
// the byte count, or -1 when some character is not in the byte-level alphabet (then,
// like Hugging Face's ByteLevel decoder, the token stands for its own UTF-8).
static long gpt2_decode(const char *s, size_t n, char *dst) {
  size_t w = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp = ct_utf8_next(s, n, &i);
    if (cp >= 324 || gpt2_char_byte[cp] < 0) return -1;
    dst[w++] = (char)gpt2_char_byte[cp];
  }
  return (long)w;
}

// ---------------------------------------------------------------------------
// Small helpers for building

static int store_bytes(ct_tokenizer *t, const char *s, size_t n, uint32_t *off) {
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

// The vocabulary id of bytes s[0, n) whose hash_bytes is h, or -1.
static int vocab_find_h(const ct_tokenizer *t, const char *s, size_t n, uint64_t h) {
  if (!t->vslot) return -1;
  for (uint32_t i = (uint32_t)h & t->vmask;; i = (i + 1) & t->vmask) {
    int id = t->vslot[i];
    if (id < 0) return -1;
    if (t->tok_len[id] == n && memcmp(t->bytes + t->tok_off[id], s, n) == 0) return id;
  }
}

static int vocab_find(const ct_tokenizer *t, const char *s, size_t n) {
  return vocab_find_h(t, s, n, hash_bytes(s, n));
}

static void vocab_insert(ct_tokenizer *t, int id) {
  const char *s = t->bytes + t->tok_off[id];
  size_t n = t->tok_len[id];
  uint32_t h = (uint32_t)hash_bytes(s, n);
  for (uint32_t i = h & t->vmask;; i = (i + 1) & t->vmask) {
    int other = t->vslot[i];
    if (other < 0) {
      t->vslot[i] = id;
      return;
    }
    if (t->tok_len[other] == n && memcmp(t->bytes + t->tok_off[other], s, n) == 0) return;  // first id wins
  }
}

static inline const merge_slot *merge_find(const ct_tokenizer *t, int a, int b) {
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  for (uint32_t i = hash_pair(key) & t->mmask;; i = (i + 1) & t->mmask) {
    const merge_slot *m = &t->mslot[i];
    if (m->id < 0) return NULL;
    if (m->key == key) return m;
  }
}

static inline uint64_t junction_key(uint32_t left, uint32_t right) {
  return ((uint64_t)left << 21 | right) + 1;  // code points fit in 21 bits; 0 marks empty
}

static inline bool junction_find(const ct_tokenizer *t, uint64_t key) {
  for (uint32_t i = hash_pair(key) & t->jmask;; i = (i + 1) & t->jmask) {
    if (t->jslot[i] == key) return true;
    if (!t->jslot[i]) return false;
  }
}

// Records that merge (a, b) joins a's last character to b's first.
static void junction_add(ct_tokenizer *t, const char *a, size_t alen, const char *b, size_t blen) {
  if (ct_sp_byte_token(a, alen) >= 0 || ct_sp_byte_token(b, blen) >= 0 ||
      (t->unk >= 0 && ((alen == t->tok_len[t->unk] && !memcmp(a, t->bytes + t->tok_off[t->unk], alen)) ||
                       (blen == t->tok_len[t->unk] && !memcmp(b, t->bytes + t->tok_off[t->unk], blen)))))
    t->no_cut = true;
  size_t i = ct_utf8_prev(a, 0, alen), j = 0;
  uint64_t key = junction_key(ct_utf8_next(a, alen, &i), ct_utf8_next(b, blen, &j));
  for (uint32_t k = hash_pair(key) & t->jmask;; k = (k + 1) & t->jmask) {
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

static void cache_free(word_cache *c) {
  free(c->hash);
  free(c->loc);
  free(c->arena);
  memset(c, 0, sizeof *c);
}

static void scratch_free(const ct_tokenizer *t, enc_scratch *s) {
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

static void free_ops(ct_sp_op *ops, int n) {
  for (int i = 0; i < n; i++) {
    free(ops[i].a);
    free(ops[i].b);
  }
  free(ops);
}

// The added tokens' lookup structures (index_added builds them).
static void free_added_index(ct_tokenizer *t) {
  free(t->bucket_list);
  free(t->bucket_lens);
  free(t->aslot);
  free(t->anext);
  t->bucket_list = t->bucket_lens = t->anext = NULL;
  t->aslot = NULL;
}

void ct_tokenizer_free(ct_tokenizer *t) {
  if (!t) return;
  free(t->bytes);
  free(t->tok_off);
  free(t->tok_len);
  free(t->tok_kind);
  free(t->tok_special);
  free(t->vslot);
  free(t->mslot);
  free_ops(t->ops, t->nops);
  free_ops(t->drep, t->ndrep);
  free(t->dec_off);
  free(t->dec_len);
  free(t->jslot);
  free(t->added);
  free_added_index(t);
  for (int i = 0; i < t->nsteps; i++) ct_regex_free(t->steps[i].re);
  free(t->steps);
  free(t->template_src);
  ct_jinja_free(t->tmpl);
  free(t->template_err);
  free(t->bos_str);
  free(t->eos_str);
  free(t->pad_str);
  free(t->unk_str);
  free(t->stops);
  free(t->json_text);
  free(t->cfg_text);
  pthread_mutex_destroy(&t->cache_mu);
  cache_free(&t->cache);
  scratch_free(t, &t->scratch);
  free(t);
}

// ===========================================================================
// Loading tokenizer.json

typedef struct {
  const char *file;  // for messages: "DIR/tokenizer.json"
} loadctx;

#define FAIL(code, ...) ct_set_error(code, __VA_ARGS__)

// An id: an integer, or a real with an integral value (files read with big integers).
static bool get_id(const json_t *j, int *out) {
  double v;
  if (json_is_integer(j)) v = (double)json_integer_value(j);
  else if (json_is_real(j)) v = json_real_value(j);
  else return false;
  if (!(v >= 0 && v <= 16000000) || v != (double)(int)v) return false;
  *out = (int)v;
  return true;
}

static const char *type_of(const json_t *j) { return json_string_value(json_object_get(j, "type")); }

static bool is_true(const json_t *j) { return json_is_true(j); }

static int load_model(ct_tokenizer *t, const loadctx *L, const json_t *model) {
  const char *type = type_of(model);
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
  t->ignore_merges = is_true(json_object_get(model, "ignore_merges"));
  t->byte_fallback = is_true(json_object_get(model, "byte_fallback"));
  t->fuse_unk = is_true(json_object_get(model, "fuse_unk"));

  // ids
  int max_id = -1;
  const char *key;
  const json_t *val;
  json_object_foreach((json_t *)vocab, key, val) {
    int id;
    if (!get_id(val, &id))
      return FAIL(CT_EFORMAT, "%s: model.vocab['%s']: id must be an integer in [0, 16000000]", L->file, key);
    if (id > max_id) max_id = id;
  }
  if (max_id < 0) return FAIL(CT_EFORMAT, "%s: model.vocab: empty", L->file);
  if (grow_ids_table(t, max_id + 1)) return CT_ENOMEM;
  char *tmp = malloc(4096);
  if (!tmp) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  json_object_foreach((json_t *)vocab, key, val) {
    int id = 0;
    get_id(val, &id);
    size_t n = strlen(key);
    if (t->tok_kind[id] != TOK_NONE) {
      free(tmp);
      return FAIL(CT_EFORMAT, "%s: model.vocab['%s']: id %d is used twice", L->file, key, id);
    }
    long w = -1;
    if (n <= 1024 && !t->sp) w = gpt2_decode(key, n, tmp);
    int rc = w >= 0 ? store_bytes(t, tmp, (size_t)w, &t->tok_off[id]) : store_bytes(t, key, n, &t->tok_off[id]);
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
    t->byte_id[b] = vocab_find(t, &ch, 1);
    snprintf(name, sizeof name, "<0x%02X>", b);
    t->fallback_id[b] = vocab_find(t, name, 6);
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
    if (u) get_id(u, &t->unk);
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
    get_id(ja, &ia);
    get_id(jb, &ib);
    get_id(jab, &iab);
    if (t->sp) junction_add(t, a, alen, b, blen);
    uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
    for (uint32_t i = hash_pair(key) & t->mmask;; i = (i + 1) & t->mmask) {
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

// Index of the first added token whose content is s[0, n), or -1. The others with that
// content follow through anext, in list order.
static int added_find(const ct_tokenizer *t, const char *s, size_t n) {
  if (!t->aslot) return -1;
  for (uint32_t i = (uint32_t)hash_bytes(s, n) & t->amask;; i = (i + 1) & t->amask) {
    int k = t->aslot[i];
    if (k < 0) return -1;
    if (t->added[k].len == n && memcmp(t->bytes + t->added[k].off, s, n) == 0) return k;
  }
}

// Buckets by first byte, longest first, so the first hit at a position is the longest;
// each bucket's distinct lengths; and a hash of contents, for large buckets and lookups
// by name. O(n log n) in the number of added tokens.
static int index_added(ct_tokenizer *t) {
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
    for (uint32_t h = (uint32_t)hash_bytes(t->bytes + a->off, a->len) & t->amask;; h = (h + 1) & t->amask) {
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

static int load_added(ct_tokenizer *t, const loadctx *L, const json_t *added) {
  if (!added || json_is_null(added)) return 0;
  if (!json_is_array(added)) return FAIL(CT_EFORMAT, "%s: added_tokens: expected a list", L->file);
  size_t n = json_array_size(added);
  t->added = calloc(n + 1, sizeof *t->added);
  if (!t->added) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  for (size_t i = 0; i < n; i++) {
    const json_t *a = json_array_get(added, i);
    const json_t *content = json_object_get(a, "content");
    int tid;
    if (!get_id(json_object_get(a, "id"), &tid))
      return FAIL(CT_EFORMAT, "%s: added_tokens[%zu].id: expected an integer in [0, 16000000]", L->file, i);
    if (!json_is_string(content) || json_string_length(content) == 0)
      return FAIL(CT_EFORMAT, "%s: added_tokens[%zu].content: expected a non-empty string", L->file, i);
    if (tid >= t->vocab_size && grow_ids_table(t, tid + 1)) return CT_ENOMEM;
    added_token *at = &t->added[t->nadded++];
    at->id = tid;
    at->special = is_true(json_object_get(a, "special"));
    at->lstrip = is_true(json_object_get(a, "lstrip"));
    at->rstrip = is_true(json_object_get(a, "rstrip"));
    at->single_word = is_true(json_object_get(a, "single_word"));
    const char *s = json_string_value(content);
    size_t len = json_string_length(content);
    if (t->tok_kind[tid] == TOK_VOCAB && (t->tok_len[tid] != len || memcmp(t->bytes + t->tok_off[tid], s, len)))
      return FAIL(CT_EFORMAT, "%s: added_tokens[%zu]: id %d is '%s' here but another token in model.vocab",
                  L->file, i, tid, s);
    if (store_bytes(t, s, len, &at->off)) return CT_ENOMEM;
    at->len = (uint32_t)len;
    t->tok_off[tid] = at->off;
    t->tok_len[tid] = at->len;
    t->tok_kind[tid] = TOK_ADDED;
    t->tok_special[tid] = at->special;
  }
  return index_added(t);
}

// A malloc'd copy of s[0, n) with a NUL after it.
static char *memdup(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

// Appends an op (copies of a and b) to *ops.
static int add_op(ct_sp_op **ops, int *nops, int kind, int scheme, const char *a, size_t alen, const char *b,
                  size_t blen) {
  ct_sp_op *o = realloc(*ops, sizeof *o * (size_t)(*nops + 1));
  if (!o) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  *ops = o;
  ct_sp_op op = {kind, scheme, memdup(a, alen), memdup(b, blen), alen, blen};
  if (!op.a || !op.b) {
    free(op.a);
    free(op.b);
    return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  }
  o[(*nops)++] = op;
  return 0;
}

// A Replace normalizer or decoder: {"pattern": {"String": s}, "content": c}.
static int load_replace(const loadctx *L, const json_t *n, const char *where, ct_sp_op **ops, int *nops) {
  const json_t *pat = json_object_get(n, "pattern"), *content = json_object_get(n, "content");
  const json_t *str = json_object_get(pat, "String");
  if (json_object_get(pat, "Regex"))
    return FAIL(CT_EFORMAT, "%s: %s.pattern: a Regex pattern is not supported in Replace (only {\"String\": ...})",
                L->file, where);
  if (!json_is_string(str) || json_string_length(str) == 0)
    return FAIL(CT_EFORMAT, "%s: %s.pattern: expected {\"String\": \"...\"} (non-empty)", L->file, where);
  if (!json_is_string(content)) return FAIL(CT_EFORMAT, "%s: %s.content: expected a string", L->file, where);
  return add_op(ops, nops, CT_SP_REPLACE, 0, json_string_value(str), json_string_length(str),
                json_string_value(content), json_string_length(content));
}

static int load_normalizer(ct_tokenizer *t, const loadctx *L, const json_t *n, const char *where) {
  if (!n || json_is_null(n)) return 0;
  const char *type = type_of(n);
  if (!type) return FAIL(CT_EFORMAT, "%s: %s.type: missing", L->file, where);
  if (!strcmp(type, "NFC")) {
    if (t->nops) return FAIL(CT_EFORMAT, "%s: %s: NFC after Prepend or Replace is not supported", L->file, where);
    t->nfc = true;
    return 0;
  }
  if (!strcmp(type, "Prepend")) {
    const json_t *pre = json_object_get(n, "prepend");
    if (!json_is_string(pre) || json_string_length(pre) == 0)
      return FAIL(CT_EFORMAT, "%s: %s.prepend: expected a non-empty string", L->file, where);
    return add_op(&t->ops, &t->nops, CT_SP_PREPEND, CT_SP_PLAIN, json_string_value(pre), json_string_length(pre), "", 0);
  }
  if (!strcmp(type, "Replace")) return load_replace(L, n, where, &t->ops, &t->nops);
  if (!strcmp(type, "Sequence")) {
    const json_t *list = json_object_get(n, "normalizers");
    if (!json_is_array(list)) return FAIL(CT_EFORMAT, "%s: %s.normalizers: expected a list", L->file, where);
    for (size_t i = 0; i < json_array_size(list); i++) {
      char sub[128];
      snprintf(sub, sizeof sub, "%s.normalizers[%zu]", where, i);
      int rc = load_normalizer(t, L, json_array_get(list, i), sub);
      if (rc) return rc;
    }
    return 0;
  }
  return FAIL(CT_EFORMAT, "%s: %s.type: normalizer '%s' is not supported (NFC, Prepend, Replace, Sequence)", L->file,
              where, type);
}

static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int add_step(ct_tokenizer *t, pretok_step s) {
  pretok_step *st = realloc(t->steps, sizeof *st * (size_t)(t->nsteps + 1));
  if (!st) {
    ct_regex_free(s.re);
    return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  }
  t->steps = st;
  st[t->nsteps++] = s;
  return 0;
}

static int add_split(ct_tokenizer *t, const loadctx *L, const char *where, const char *pat, size_t len,
                     bool regex, bool keep_match, bool keep_gap, int merge) {
  ct_regex *re;
  int rc;
  if (regex) {
    rc = ct_regex_compile(&re, pat, len);
  } else {  // a literal string: escape every character
    char *esc = malloc(2 * len + 1);
    if (!esc) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
    size_t w = 0;
    for (size_t i = 0; i < len; i++) {
      unsigned char c = (unsigned char)pat[i];
      if (c < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == ' '))
        esc[w++] = '\\';
      esc[w++] = (char)c;
    }
    rc = ct_regex_compile(&re, esc, w);
    free(esc);
  }
  if (rc) return ct_wrap_error(rc, "%s: %s.pattern", L->file, where);
  return add_step(t, (pretok_step){.kind = STEP_SPLIT, .re = re, .keep_match = keep_match, .keep_gap = keep_gap,
                                   .merge = merge});
}

// Metaspace: spaces become the replacement, which is prepended per prepend_scheme (older
// files: add_prefix_space, meaning "always"), and the text splits before each
// replacement (split, default true). The first two are normalizer ops (they keep offsets).
static int load_metaspace(ct_tokenizer *t, const loadctx *L, const json_t *p, const char *where) {
  if (t->nsteps) return FAIL(CT_EFORMAT, "%s: %s: Metaspace must be the first pre-tokenizer", L->file, where);
  const json_t *rj = json_object_get(p, "replacement"), *sj = json_object_get(p, "prepend_scheme");
  const char *r = rj ? json_string_value(rj) : "\xe2\x96\x81";  // ▁
  if (!r || !*r) return FAIL(CT_EFORMAT, "%s: %s.replacement: expected a character", L->file, where);
  const char *scheme = json_string_value(sj);
  int sc;
  if (sj && !scheme) return FAIL(CT_EFORMAT, "%s: %s.prepend_scheme: expected a string", L->file, where);
  if (!scheme) sc = json_is_false(json_object_get(p, "add_prefix_space")) ? CT_SP_NEVER : CT_SP_ALWAYS;
  else if (!strcmp(scheme, "always")) sc = CT_SP_ALWAYS;
  else if (!strcmp(scheme, "first")) sc = CT_SP_FIRST;
  else if (!strcmp(scheme, "never")) sc = CT_SP_NEVER;
  else return FAIL(CT_EFORMAT, "%s: %s.prepend_scheme: '%s' is not one of always, first, never", L->file, where, scheme);
  size_t rl = strlen(r);
  if (add_op(&t->ops, &t->nops, CT_SP_REPLACE, 0, " ", 1, r, rl) ||
      add_op(&t->ops, &t->nops, CT_SP_PREPEND, sc, r, rl, "", 0))
    return CT_ENOMEM;
  const json_t *split = json_object_get(p, "split");
  if (split && !json_is_boolean(split)) return FAIL(CT_EFORMAT, "%s: %s.split: expected true or false", L->file, where);
  if (split && !json_is_true(split)) return 0;
  return add_split(t, L, where, r, rl, false, true, true, MERGE_NEXT);
}

static int load_pretok(ct_tokenizer *t, const loadctx *L, const json_t *p, const char *where) {
  if (!p || json_is_null(p)) return 0;
  const char *type = type_of(p);
  if (!type) return FAIL(CT_EFORMAT, "%s: %s.type: missing", L->file, where);
  if (!strcmp(type, "Sequence")) {
    const json_t *list = json_object_get(p, "pretokenizers");
    if (!json_is_array(list)) return FAIL(CT_EFORMAT, "%s: %s.pretokenizers: expected a list", L->file, where);
    for (size_t i = 0; i < json_array_size(list); i++) {
      char sub[160];
      snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", where, i);
      int rc = load_pretok(t, L, json_array_get(list, i), sub);
      if (rc) return rc;
    }
    return 0;
  }
  if (!strcmp(type, "ByteLevel")) {
    if (is_true(json_object_get(p, "add_prefix_space")) && add_step(t, (pretok_step){.kind = STEP_PREFIX}))
      return CT_ENOMEM;
    const json_t *use_regex = json_object_get(p, "use_regex");
    if (!use_regex || is_true(use_regex))
      return add_split(t, L, where, gpt2_pattern, sizeof gpt2_pattern - 1, true, true, true, MERGE_NONE);
    return 0;
  }
  if (!strcmp(type, "Split")) {
    const json_t *pat = json_object_get(p, "pattern");
    const json_t *re = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
    if (!json_is_string(re) && !json_is_string(str))
      return FAIL(CT_EFORMAT, "%s: %s.pattern: expected {\"Regex\": ...} or {\"String\": ...}", L->file, where);
    const char *behavior = json_string_value(json_object_get(p, "behavior"));
    bool invert = is_true(json_object_get(p, "invert"));
    bool keep_match = true, keep_gap = true;
    int merge = MERGE_NONE;
    if (!behavior || !strcmp(behavior, "Isolated")) {
    } else if (!strcmp(behavior, "MergedWithPrevious") && !invert) {
      merge = MERGE_PREV;
    } else if (!strcmp(behavior, "MergedWithNext") && !invert) {
      merge = MERGE_NEXT;
    } else if (!strcmp(behavior, "Removed")) {
      keep_match = invert;
      keep_gap = !invert;
    } else {
      return FAIL(CT_EFORMAT,
                  "%s: %s.behavior: '%s'%s is not supported (Isolated, Removed, MergedWithPrevious, MergedWithNext)",
                  L->file, where, behavior, invert ? " with invert" : "");
    }
    const json_t *s = re ? re : str;
    return add_split(t, L, where, json_string_value(s), json_string_length(s), re != NULL, keep_match, keep_gap,
                     merge);
  }
  if (!strcmp(type, "Metaspace")) return load_metaspace(t, L, p, where);
  if (!strcmp(type, "Digits"))
    return add_step(t, (pretok_step){.kind = STEP_DIGITS, .individual = is_true(json_object_get(p, "individual_digits"))});
  return FAIL(CT_EFORMAT,
              "%s: %s.type: pre-tokenizer '%s' is not supported (Split, ByteLevel, Metaspace, Digits, Sequence)",
              L->file, where, type);
}

// Decoders. A byte-level tokenizer takes ByteLevel only; a SentencePiece-style one the
// per-token Replace, ByteFallback, Metaspace, then Fuse and Strip (which cuts the fused
// text: Strip before Fuse would cut every token and is refused).
static int load_decoder(ct_tokenizer *t, const loadctx *L, const json_t *d, const char *where) {
  if (!d || json_is_null(d)) return 0;
  const char *type = type_of(d);
  if (!type) return FAIL(CT_EFORMAT, "%s: %s.type: missing", L->file, where);
  if (!strcmp(type, "ByteLevel")) return 0;
  if (!strcmp(type, "Sequence")) {
    const json_t *list = json_object_get(d, "decoders");
    if (!json_is_array(list)) return FAIL(CT_EFORMAT, "%s: %s.decoders: expected a list", L->file, where);
    for (size_t i = 0; i < json_array_size(list); i++) {
      char sub[128];
      snprintf(sub, sizeof sub, "%s.decoders[%zu]", where, i);
      int rc = load_decoder(t, L, json_array_get(list, i), sub);
      if (rc) return rc;
    }
    return 0;
  }
  if (!t->sp)
    return FAIL(CT_EFORMAT, "%s: %s.type: decoder '%s' is not supported with ByteLevel (only ByteLevel)", L->file,
                where, type);
  bool per_token = !strcmp(type, "Replace") || !strcmp(type, "ByteFallback") || !strcmp(type, "Metaspace");
  if (per_token && t->dec_fused)
    return FAIL(CT_EFORMAT, "%s: %s: decoder '%s' after Fuse is not supported", L->file, where, type);
  if (!strcmp(type, "Replace")) return load_replace(L, d, where, &t->drep, &t->ndrep);
  if (!strcmp(type, "ByteFallback")) {
    t->dec_bytefb = true;
    return 0;
  }
  if (!strcmp(type, "Fuse")) {
    t->dec_fused = true;
    return 0;
  }
  if (!strcmp(type, "Metaspace")) {  // the replacement reads as a space; the first one is cut
    const json_t *rj = json_object_get(d, "replacement");
    const char *r = rj ? json_string_value(rj) : "\xe2\x96\x81";
    if (!r || !*r) return FAIL(CT_EFORMAT, "%s: %s.replacement: expected a character", L->file, where);
    const char *scheme = json_string_value(json_object_get(d, "prepend_scheme"));
    bool cut = scheme ? strcmp(scheme, "never") != 0 : !json_is_false(json_object_get(d, "add_prefix_space"));
    if (add_op(&t->drep, &t->ndrep, CT_SP_REPLACE, 0, r, strlen(r), " ", 1)) return CT_ENOMEM;
    t->dec_fused = true;
    t->strip_c = ' ';
    t->strip_start = cut ? 1 : 0;
    return 0;
  }
  if (!strcmp(type, "Strip")) {
    const json_t *c = json_object_get(d, "content");
    int a, b;
    if (!json_is_string(c) || json_string_length(c) != 1)
      return FAIL(CT_EFORMAT, "%s: %s.content: expected a one-byte string", L->file, where);
    if (!get_id(json_object_get(d, "start"), &a) || !get_id(json_object_get(d, "stop"), &b))
      return FAIL(CT_EFORMAT, "%s: %s.start/stop: expected counts", L->file, where);
    if (!t->dec_fused)
      return FAIL(CT_EFORMAT, "%s: %s: Strip before Fuse (cutting every token) is not supported", L->file, where);
    t->strip_c = json_string_value(c)[0];
    t->strip_start = a;
    t->strip_stop = b;
    return 0;
  }
  return FAIL(CT_EFORMAT,
              "%s: %s.type: decoder '%s' is not supported (Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence)",
              L->file, where, type);
}

// SentencePiece-style: the bytes each token decodes to (ByteFallback's <0xNN> is byte NN,
// any other token its text through the decoder's Replace ops).
static int build_dec(ct_tokenizer *t) {
  t->dec_off = calloc((size_t)t->vocab_size, sizeof *t->dec_off);
  t->dec_len = calloc((size_t)t->vocab_size, sizeof *t->dec_len);
  if (!t->dec_off || !t->dec_len) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  for (int id = 0; id < t->vocab_size; id++) {
    if (t->tok_kind[id] == TOK_NONE) continue;
    size_t n = t->tok_len[id];
    char *cur = memdup(t->bytes + t->tok_off[id], n);  // store_bytes may move t->bytes
    if (!cur) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
    int b = t->dec_bytefb ? ct_sp_byte_token(cur, n) : -1;
    if (b >= 0) {
      cur[0] = (char)b;
      n = 1;
    }
    for (int k = 0; b < 0 && k < t->ndrep; k++) {
      const ct_sp_op *o = &t->drep[k];
      char *next;
      if (ct_sp_replace_all(cur, n, o->a, o->alen, o->b, o->blen, &next, &n)) {
        free(cur);
        return CT_ENOMEM;
      }
      free(cur);
      cur = next;
    }
    int rc = store_bytes(t, cur, n, &t->dec_off[id]);
    free(cur);
    if (rc) return rc;
    t->dec_len[id] = (uint32_t)n;
  }
  return 0;
}

// Whether a pre-tokenizer or decoder (or a Sequence of them) has a ByteLevel step.
static bool has_byte_level(const json_t *j) {
  const char *type = type_of(j);
  if (type && !strcmp(type, "ByteLevel")) return true;
  const char *lists[] = {"pretokenizers", "decoders"};
  for (int k = 0; k < 2; k++) {
    const json_t *l = json_object_get(j, lists[k]);
    for (size_t i = 0; i < json_array_size(l); i++)
      if (has_byte_level(json_array_get(l, i))) return true;
  }
  return false;
}

// The post-processor's TemplateProcessing says whether a document gets a leading or
// trailing special token. Returns the leading and trailing ids (or -1).
static void post_template(const ct_tokenizer *t, const json_t *p, int *lead, int *trail) {
  if (!p || json_is_null(p)) return;
  const char *type = type_of(p);
  if (type && !strcmp(type, "Sequence")) {
    const json_t *list = json_object_get(p, "processors");
    for (size_t i = 0; i < json_array_size(list); i++) post_template(t, json_array_get(list, i), lead, trail);
    return;
  }
  if (!type || strcmp(type, "TemplateProcessing")) return;
  const json_t *single = json_object_get(p, "single");
  size_t n = json_array_size(single);
  for (size_t i = 0; i < n; i++) {
    const json_t *sp = json_object_get(json_array_get(single, i), "SpecialToken");
    if (!sp) continue;
    int id = ct_tokenizer_token_id(t, json_string_value(json_object_get(sp, "id")));
    if (i == 0) *lead = id;
    else if (i == n - 1) *trail = id;
  }
}

// ===========================================================================
// tokenizer_config.json

// A token field is a string or {"__type": "AddedToken", "content": ...}.
static const char *token_field(const json_t *cfg, const char *key) {
  const json_t *v = json_object_get(cfg, key);
  if (json_is_object(v)) v = json_object_get(v, "content");
  return json_string_value(v);
}

static int dup_str(char **dst, const char *s) {
  if (!s) return 0;
  *dst = strdup(s);
  return *dst ? 0 : FAIL(CT_ENOMEM, "tokenizer: out of memory");
}

static int load_config(ct_tokenizer *t, const char *file, const json_t *cfg, int lead, int trail) {
  if (!json_is_object(cfg)) return FAIL(CT_EFORMAT, "%s: expected a JSON object", file);
  const char *keys[] = {"bos_token", "eos_token", "pad_token", "unk_token"};
  char **dst[] = {&t->bos_str, &t->eos_str, &t->pad_str, &t->unk_str};
  int *ids[] = {&t->bos, &t->eos, &t->pad, &t->unk};
  for (int k = 0; k < 4; k++) {
    const json_t *v = json_object_get(cfg, keys[k]);
    if (!v || json_is_null(v)) continue;
    const char *s = token_field(cfg, keys[k]);
    if (!s) return FAIL(CT_EFORMAT, "%s: %s: expected a string, an AddedToken object or null", file, keys[k]);
    if (dup_str(dst[k], s)) return CT_ENOMEM;
    int id = ct_tokenizer_token_id(t, s);
    if (id < 0) return FAIL(CT_EFORMAT, "%s: %s: '%s' is not a token of tokenizer.json", file, keys[k], s);
    *ids[k] = id;
  }
  const json_t *ab = json_object_get(cfg, "add_bos_token");
  if (ab && !json_is_boolean(ab) && !json_is_null(ab)) return FAIL(CT_EFORMAT, "%s: add_bos_token: expected true or false", file);
  t->add_bos = json_is_boolean(ab) ? json_is_true(ab) : (lead >= 0 && lead == t->bos);
  if (t->bos < 0) t->add_bos = false;
  const json_t *ae = json_object_get(cfg, "add_eos_token");
  if (ae && !json_is_boolean(ae) && !json_is_null(ae)) return FAIL(CT_EFORMAT, "%s: add_eos_token: expected true or false", file);
  t->add_eos = json_is_boolean(ae) ? json_is_true(ae) : (trail >= 0 && trail == t->eos);
  if (t->eos < 0) t->add_eos = false;

  const char *tpl;
  int rc = ct_chat_template_pick(json_object_get(cfg, "chat_template"), file, &tpl);
  if (rc) return rc;
  return tpl && dup_str(&t->template_src, tpl) ? CT_ENOMEM : 0;
}

// Compiles the chat template; a template that does not parse leaves the tokenizer
// usable for encoding and makes ct_tokenizer_chat fail with the parse error.
static int compile_template(ct_tokenizer *t, const char *where) {
  if (!t->template_src) return 0;
  int rc = ct_jinja_parse(&t->tmpl, t->template_src, strlen(t->template_src), where);
  if (rc == CT_ENOMEM) return rc;
  if (rc) return dup_str(&t->template_err, ct_last_error());
  return 0;
}

static int add_stop(ct_tokenizer *t, int id) {
  if (id < 0 || id >= t->vocab_size) return 0;
  for (int i = 0; i < t->nstops; i++)
    if (t->stops[i] == id) return 0;
  int *s = realloc(t->stops, sizeof *s * (size_t)(t->nstops + 1));
  if (!s) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  t->stops = s;
  int i = t->nstops++;
  while (i > 0 && s[i - 1] > id) {
    s[i] = s[i - 1];
    i--;
  }
  s[i] = id;
  return 0;
}

static int collect_stops(ct_tokenizer *t, const json_t *gencfg) {
  if (add_stop(t, t->eos)) return CT_ENOMEM;
  const json_t *e = json_object_get(gencfg, "eos_token_id");
  int id;
  if (get_id(e, &id) && add_stop(t, id)) return CT_ENOMEM;
  for (size_t i = 0; json_is_array(e) && i < json_array_size(e); i++)
    if (get_id(json_array_get(e, i), &id) && add_stop(t, id)) return CT_ENOMEM;
  for (size_t k = 0; k < sizeof stop_names / sizeof stop_names[0]; k++) {
    id = ct_tokenizer_token_id(t, stop_names[k]);
    if (id >= 0 && t->tok_kind[id] == TOK_ADDED && t->tok_special[id] && add_stop(t, id)) return CT_ENOMEM;
  }
  return 0;
}

// ---------------------------------------------------------------------------

static int parse_json(const char *file, const char *text, size_t len, json_t **out) {
  json_error_t err;
  *out = json_loadb(text, len, 0, &err);
  // Python writes integers of any size (model_max_length = 1e30): read them as reals.
  if (!*out && strstr(err.text, "too big integer")) *out = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &err);
  if (!*out) return FAIL(CT_EFORMAT, "%s:%d:%d: %s", file, err.line, err.column, err.text);
  return 0;
}

// Builds a tokenizer from the text of its files (cfg/gen may be NULL). Takes ownership
// of json_text and cfg_text. `dir` is for messages.
static int build(ct_tokenizer **out, const char *dir, char *json_text, size_t json_len, char *cfg_text,
                 size_t cfg_len, const json_t *gencfg) {
  *out = NULL;
  pthread_once(&gpt2_once, gpt2_init);
  ct_tokenizer *t = calloc(1, sizeof *t);
  if (!t) {
    free(json_text);
    free(cfg_text);
    return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  }
  pthread_mutex_init(&t->cache_mu, NULL);
  t->json_text = json_text;
  t->json_len = json_len;
  t->cfg_text = cfg_text;
  t->cfg_len = cfg_len;
  t->bos = t->eos = t->pad = t->unk = -1;
  char file[4200], cfgfile[4200];
  snprintf(file, sizeof file, "%s/tokenizer.json", dir);
  snprintf(cfgfile, sizeof cfgfile, "%s/tokenizer_config.json", dir);
  loadctx L = {file};
  json_t *j = NULL, *cfg = NULL;
  int rc = parse_json(file, json_text, json_len, &j);
  if (!rc && !json_is_object(j)) rc = FAIL(CT_EFORMAT, "%s: expected a JSON object", file);
  // A file with no ByteLevel anywhere is SentencePiece-style: its vocabulary is text.
  t->sp = !rc && !has_byte_level(json_object_get(j, "pre_tokenizer")) && !has_byte_level(json_object_get(j, "decoder"));
  if (!rc) rc = load_model(t, &L, json_object_get(j, "model"));
  if (!rc) rc = load_added(t, &L, json_object_get(j, "added_tokens"));
  if (!rc) rc = load_normalizer(t, &L, json_object_get(j, "normalizer"), "normalizer");
  if (!rc) rc = load_pretok(t, &L, json_object_get(j, "pre_tokenizer"), "pre_tokenizer");
  if (!rc) rc = load_decoder(t, &L, json_object_get(j, "decoder"), "decoder");
  if (!rc && t->sp) rc = build_dec(t);
  int lead = -1, trail = -1;
  if (!rc) post_template(t, json_object_get(j, "post_processor"), &lead, &trail);
  if (!rc && cfg_text) rc = parse_json(cfgfile, cfg_text, cfg_len, &cfg);
  if (!rc && cfg) {
    rc = load_config(t, cfgfile, cfg, lead, trail);
    char where[4300];
    snprintf(where, sizeof where, "%s: chat_template", cfgfile);
    if (!rc) rc = compile_template(t, where);
  } else if (!rc) {
    t->add_bos = lead >= 0;
    if (lead >= 0) t->bos = lead;
  }
  if (!rc) rc = collect_stops(t, gencfg);
  json_decref(j);
  json_decref(cfg);
  if (rc) {
    ct_tokenizer_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

int ct_tokenizer_load(ct_tokenizer **out, const char *dir) {
  *out = NULL;
  char path[4200];
  char *json_text, *cfg_text, *gen_text;
  size_t json_len, cfg_len, gen_len;
  bool missing;
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  int rc = ct_read_file(path, &json_text, &json_len, NULL);
  if (rc) return rc;
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  rc = ct_read_file(path, &cfg_text, &cfg_len, &missing);
  if (rc) {
    free(json_text);
    return rc;
  }
  json_t *gen = NULL;
  snprintf(path, sizeof path, "%s/generation_config.json", dir);
  rc = ct_read_file(path, &gen_text, &gen_len, &missing);
  if (!rc && gen_text) {
    rc = parse_json(path, gen_text, gen_len, &gen);
    free(gen_text);
  }
  if (rc) {
    free(json_text);
    free(cfg_text);
    return rc;
  }
  rc = build(out, dir, json_text, json_len, cfg_text, cfg_len, gen);
  json_decref(gen);
  // transformers (4.47+) saves the template as chat_template.jinja, which then wins over
  // tokenizer_config.json's
  snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
  if (!rc && access(path, F_OK) == 0 && (rc = ct_tokenizer_load_chat_template(*out, path))) {
    ct_tokenizer_free(*out);
    *out = NULL;
  }
  return rc;
}

// The byte tokenizer's files: a byte-level BPE with no merges whose vocabulary maps id b
// to GPT-2's printable stand-in for byte b, so Hugging Face encodes every byte to its
// own id, as ctune does.
static int byte_files(char **tok_text, char **cfg_text) {
  pthread_once(&gpt2_once, gpt2_init);
  json_t *vocab = json_object(), *added = json_array();
  char ch[8];
  for (int b = 0; b < 256; b++) {
    ch[ct_utf8_put(ch, (uint32_t)gpt2_byte_char(b))] = 0;
    json_object_set_new(vocab, ch, json_integer(b));
  }
  for (int s = 0; s < 4; s++) {
    json_object_set_new(vocab, byte_specials[s], json_integer(256 + s));
    json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 256 + s, "content",
                                           byte_specials[s], "single_word", 0, "lstrip", 0, "rstrip", 0,
                                           "normalized", 0, "special", 1));
  }
  json_t *tok = json_pack(
      "{s:s,s:n,s:n,s:o,s:n,s:{s:s,s:b,s:b,s:b},s:n,s:{s:s,s:b,s:b,s:b},"
      "s:{s:s,s:n,s:n,s:n,s:n,s:b,s:b,s:b,s:o,s:o}}",
      "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "pre_tokenizer", "type",
      "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0, "post_processor", "decoder",
      "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0, "model", "type", "BPE",
      "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
      "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", json_array());
  json_t *cfg = json_pack("{s:s,s:s,s:s,s:b,s:s,s:i,s:s}", "bos_token", byte_specials[0], "eos_token",
                          byte_specials[0], "pad_token", byte_specials[3], "add_bos_token", 0, "chat_template",
                          chatml_template, "model_max_length", 1 << 20, "tokenizer_class",
                          "PreTrainedTokenizerFast");
  *tok_text = tok ? json_dumps(tok, JSON_INDENT(2) | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER) : NULL;
  *cfg_text = cfg ? json_dumps(cfg, JSON_INDENT(2) | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER) : NULL;
  json_decref(tok);
  json_decref(cfg);
  if (!*tok_text || !*cfg_text) {
    free(*tok_text);
    free(*cfg_text);
    return FAIL(CT_ENOMEM, "tokenizer: cannot build the byte tokenizer");
  }
  return 0;
}

int ct_tokenizer_bytes(ct_tokenizer **out) {
  char *tok, *cfg;
  int rc = byte_files(&tok, &cfg);
  if (rc) return rc;
  return build(out, "(byte tokenizer)", tok, strlen(tok), cfg, strlen(cfg), NULL);
}

static int write_file(const char *dir, const char *name, const char *text, size_t len) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) return FAIL(CT_EIO, "%s: cannot write: %s", path, strerror(errno));
  int err = fwrite(text, 1, len, f) == len ? 0 : errno;
  if (fclose(f) && !err) err = errno;  // (a full disk may show only here, at the flush)
  return err ? FAIL(CT_EIO, "%s: write failed: %s", path, strerror(err)) : 0;
}

double ct_tokenizer_saved_bytes(const ct_tokenizer *t) {
  // a replaced chat template goes into the config too
  return (double)t->json_len + (double)t->cfg_len + (t->template_overridden && t->template_src ? strlen(t->template_src) : 0);
}

int ct_tokenizer_save(const ct_tokenizer *t, const char *dir) {
  int rc = write_file(dir, "tokenizer.json", t->json_text, t->json_len);
  if (rc || (!t->cfg_text && !t->template_overridden)) return rc;
  if (!t->template_overridden) return write_file(dir, "tokenizer_config.json", t->cfg_text, t->cfg_len);
  // A replaced chat template goes into the saved config, so the checkpoint renders alike.
  json_t *cfg = NULL;
  if (t->cfg_text) parse_json("tokenizer_config.json", t->cfg_text, t->cfg_len, &cfg);  // parsed at load
  if (!cfg) cfg = json_object();
  char *text = NULL;
  if (cfg && !json_object_set_new(cfg, "chat_template", json_string(t->template_src)))
    text = json_dumps(cfg, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  json_decref(cfg);
  if (!text) return FAIL(CT_ENOMEM, "tokenizer: cannot write tokenizer_config.json");
  rc = write_file(dir, "tokenizer_config.json", text, strlen(text));
  free(text);
  return rc;
}

// ===========================================================================
// Queries

int ct_tokenizer_fit(ct_tokenizer *t, int V, int *dropped) {
  *dropped = 0;
  if (t->vocab_size <= V) return 0;
  for (int id = V; id < t->vocab_size; id++)
    if (t->tok_kind[id] == TOK_VOCAB)
      return ct_set_error(CT_EINVAL, "the tokenizer's vocabulary has id %d ('%.*s'), past the model's vocab_size %d",
                          id, (int)t->tok_len[id], t->bytes + t->tok_off[id], V);
  int specials[] = {t->bos, t->eos, t->pad, t->unk};
  for (int i = 0; i < 4; i++)
    if (specials[i] >= V)
      return ct_set_error(CT_EINVAL, "the tokenizer's special token %d is past the model's vocab_size %d",
                          specials[i], V);
  int k = 0;
  for (int i = 0; i < t->nadded; i++)
    if (t->added[i].id < V) t->added[k++] = t->added[i];
  *dropped = t->nadded - k;
  t->nadded = k;
  int n = 0;
  for (int i = 0; i < t->nstops; i++)
    if (t->stops[i] < V) t->stops[n++] = t->stops[i];
  t->nstops = n;
  t->vocab_size = V;
  if (!*dropped) return 0;
  free_added_index(t);
  return index_added(t);
}

int ct_tokenizer_vocab_size(const ct_tokenizer *t) { return t->vocab_size; }
int ct_tokenizer_bos(const ct_tokenizer *t) { return t->bos; }
int ct_tokenizer_eos(const ct_tokenizer *t) { return t->eos; }
int ct_tokenizer_pad(const ct_tokenizer *t) { return t->pad >= 0 ? t->pad : t->eos; }
bool ct_tokenizer_add_bos(const ct_tokenizer *t) { return t->add_bos; }
bool ct_tokenizer_add_eos(const ct_tokenizer *t) { return t->add_eos; }

int ct_tokenizer_stop_ids(const ct_tokenizer *t, const int **ids) {
  *ids = t->stops;
  return t->nstops;
}

bool ct_tokenizer_is_stop(const ct_tokenizer *t, int id) {
  for (int i = 0; i < t->nstops; i++)
    if (t->stops[i] == id) return true;
  return false;
}

const char *ct_tokenizer_token_bytes(const ct_tokenizer *t, int id, size_t *len) {
  if (id < 0 || id >= t->vocab_size || t->tok_kind[id] == TOK_NONE) {
    *len = 0;
    return NULL;
  }
  *len = t->dec_len ? t->dec_len[id] : t->tok_len[id];
  return t->bytes + (t->dec_off ? t->dec_off[id] : t->tok_off[id]);
}

bool ct_tokenizer_is_special(const ct_tokenizer *t, int id) {
  return id >= 0 && id < t->vocab_size && t->tok_special[id];
}

int ct_tokenizer_token_id(const ct_tokenizer *t, const char *token) {
  if (!token) return -1;
  size_t n = strlen(token);
  int k = added_find(t, token, n);
  if (k >= 0) return t->added[k].id;
  // a vocabulary entry, spelled as in tokenizer.json (byte-level characters)
  char buf[256] = "";
  long w = n < sizeof buf && !t->sp ? gpt2_decode(token, n, buf) : -1;
  int id = w >= 0 ? vocab_find(t, buf, (size_t)w) : -1;
  if (id < 0) id = vocab_find(t, token, n);
  return id;
}

// ===========================================================================
// Encoding

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
      cache_free(c);
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
      id = vocab_find(t, w + a, i - a);
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
    if (!junction_find(t, junction_key(prev, cp))) {
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
  uint64_t h = cacheable || t->ignore_merges ? hash_bytes(w, n) : 0;
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
    int id = vocab_find_h(t, w, n, h);
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
      for (int k = added_find(t, text + i, n); k >= 0; k = t->anext[k])  // list order
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
    if (len > SCRATCH_KEEP) scratch_free(t, &shared->scratch);
    pthread_mutex_unlock(&shared->cache_mu);
  }
  scratch_free(t, &own);
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

// ===========================================================================
// Decoding

size_t ct_tokenizer_decode_lead(const ct_tokenizer *t, const char *s, size_t n) {
  size_t a = 0;
  for (int i = 0; i < t->strip_start && a < n && s[a] == t->strip_c; i++) a++;
  return a;
}

int ct_tokenizer_decode(const ct_tokenizer *t, const int *ids, int n, char **out, size_t *len) {
  size_t total = 1;
  for (int i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= t->vocab_size || t->tok_kind[ids[i]] == TOK_NONE)
      return FAIL(CT_EINVAL, "tokenizer: id %d is not in the vocabulary (size %d)", ids[i], t->vocab_size);
    size_t k;
    ct_tokenizer_token_bytes(t, ids[i], &k);
    total += k;
  }
  char *s = malloc(total);
  if (!s) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  size_t used = 0;
  for (int i = 0; i < n; i++) {
    size_t k;
    const char *b = ct_tokenizer_token_bytes(t, ids[i], &k);
    memcpy(s + used, b, k);
    used += k;
  }
  // the Strip decoder (Llama 2's cuts the space its Prepend put before the text)
  size_t a = ct_tokenizer_decode_lead(t, s, used);
  for (int i = 0; i < t->strip_stop && used > a && s[used - 1] == t->strip_c; i++) used--;
  memmove(s, s + a, used - a);
  used -= a;
  s[used] = 0;
  *out = s;
  if (len) *len = used;
  return 0;
}

// ===========================================================================
// Chat templates

int ct_tokenizer_set_chat_template(ct_tokenizer *t, const char *src, size_t len, const char *where) {
  ct_jinja *tpl;
  int rc = ct_jinja_parse(&tpl, src, len, where);
  if (rc) return rc;
  char *copy = malloc(len + 1);
  if (!copy) {
    ct_jinja_free(tpl);
    return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  }
  memcpy(copy, src, len);
  copy[len] = 0;
  ct_jinja_free(t->tmpl);
  free(t->template_src);
  free(t->template_err);
  t->tmpl = tpl;
  t->template_src = copy;
  t->template_err = NULL;
  t->template_overridden = true;
  return 0;
}

int ct_tokenizer_load_chat_template(ct_tokenizer *t, const char *path) {
  char *src;
  size_t len;
  int rc = ct_chat_template_read(path, &src, &len);
  if (rc) return rc;
  rc = ct_tokenizer_set_chat_template(t, src, len, path);
  free(src);
  return rc;
}

bool ct_tokenizer_chat_has_generation(const ct_tokenizer *t) { return t->tmpl && ct_jinja_has_generation(t->tmpl); }

int ct_tokenizer_chat_render(const ct_tokenizer *t, const json_t *messages, const ct_chat_opts *opts,
                             char **out, size_t *len, ct_span **gen, int *ngen) {
  *out = NULL;
  if (gen) {
    *gen = NULL;
    *ngen = 0;
  }
  if (!json_is_array(messages)) return FAIL(CT_EFORMAT, "messages: expected a list");
  for (size_t i = 0; i < json_array_size(messages); i++) {
    const json_t *m = json_array_get(messages, i), *c = json_object_get(m, "content");
    if (!json_is_string(json_object_get(m, "role")))
      return FAIL(CT_EFORMAT, "messages[%zu]: needs a string 'role'", i);
    if (!(json_is_string(c) || json_is_array(c) || (json_is_null(c) && json_object_get(m, "tool_calls")) ||
          (!c && json_object_get(m, "tool_calls"))))
      return FAIL(CT_EFORMAT, "messages[%zu]: needs a string 'content'", i);
  }
  if (!t->tmpl) {
    if (t->template_err) return FAIL(CT_EFORMAT, "%s", t->template_err);
    return FAIL(CT_EINVAL, "tokenizer: no chat_template in tokenizer_config.json");
  }
  json_t *vars = json_object();
  if (!vars) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  if (opts && opts->extra) {
    if (!json_is_object(opts->extra)) {
      json_decref(vars);
      return FAIL(CT_EINVAL, "chat: extra template variables must be a JSON object");
    }
    json_object_update(vars, (json_t *)opts->extra);
  }
  json_object_set(vars, "messages", (json_t *)messages);
  json_object_set_new(vars, "add_generation_prompt", json_boolean(opts && opts->add_generation_prompt));
  if (opts && opts->tools) json_object_set(vars, "tools", (json_t *)opts->tools);
  // the tokenizer's special tokens, unless the extra variables set them
  const char *names[] = {"bos_token", "eos_token", "pad_token", "unk_token"};
  const char *vals[] = {t->bos_str, t->eos_str, t->pad_str, t->unk_str};
  for (int i = 0; i < 4; i++)
    if (vals[i] && !json_object_get(vars, names[i])) json_object_set_new(vars, names[i], json_string(vals[i]));
  size_t n = 0;
  int rc = ct_jinja_render(t->tmpl, vars, out, &n, gen, ngen);
  json_decref(vars);
  if (len) *len = n;
  return rc;
}

int ct_tokenizer_chat(const ct_tokenizer *t, const json_t *messages, bool add_generation_prompt, char **out) {
  ct_chat_opts o = {.add_generation_prompt = add_generation_prompt};
  return ct_tokenizer_chat_render(t, messages, &o, out, NULL, NULL, NULL);
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
