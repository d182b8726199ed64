// The tokenizer's private parts, shared by its files (text/tokenizer*.c): struct
// ct_tokenizer, the lookups encoding and loading both use (vocabulary, added tokens,
// hashes), and each file's functions the others call. Not for use outside text/tokenizer*.c.
// (This header does not include tokenizer.h: it is the same typedef, repeated.)
#pragma once
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "error.h"
#include "jinja.h"
#include "tokenizer_regex.h"
#include "tokenizer_sp.h"
#include "unicode.h"

typedef struct ct_tokenizer ct_tokenizer;

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

// ===========================================================================
// Lookups that loading and encoding share

static inline uint64_t ct_tok_hash_bytes(const char *s, size_t n) {
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

static inline uint32_t ct_tok_hash_pair(uint64_t key) {
  key *= 0x9E3779B97F4A7C15ull;
  return (uint32_t)(key >> 32);
}

// The vocabulary id of bytes s[0, n) whose ct_tok_hash_bytes is h, or -1.
static inline int ct_tok_vocab_find_h(const ct_tokenizer *t, const char *s, size_t n, uint64_t h) {
  if (!t->vslot) return -1;
  for (uint32_t i = (uint32_t)h & t->vmask;; i = (i + 1) & t->vmask) {
    int id = t->vslot[i];
    if (id < 0) return -1;
    if (t->tok_len[id] == n && memcmp(t->bytes + t->tok_off[id], s, n) == 0) return id;
  }
}

static inline int ct_tok_vocab_find(const ct_tokenizer *t, const char *s, size_t n) {
  return ct_tok_vocab_find_h(t, s, n, ct_tok_hash_bytes(s, n));
}

static inline uint64_t ct_tok_junction_key(uint32_t left, uint32_t right) {
  return ((uint64_t)left << 21 | right) + 1;  // code points fit in 21 bits; 0 marks empty
}

// Index of the first added token whose content is s[0, n), or -1. The others with that
// content follow through anext, in list order.
static inline int ct_tok_added_find(const ct_tokenizer *t, const char *s, size_t n) {
  if (!t->aslot) return -1;
  for (uint32_t i = (uint32_t)ct_tok_hash_bytes(s, n) & t->amask;; i = (i + 1) & t->amask) {
    int k = t->aslot[i];
    if (k < 0) return -1;
    if (t->added[k].len == n && memcmp(t->bytes + t->added[k].off, s, n) == 0) return k;
  }
}

// ===========================================================================
// Loading: the file named in messages, errors, JSON fields

typedef struct {
  const char *file;  // for messages: "DIR/tokenizer.json"
} loadctx;

#define FAIL(code, ...) ct_set_error(code, __VA_ARGS__)

// An id: an integer, or a real with an integral value (files read with big integers).
static inline bool ct_tok_get_id(const json_t *j, int *out) {
  double v;
  if (json_is_integer(j)) v = (double)json_integer_value(j);
  else if (json_is_real(j)) v = json_real_value(j);
  else return false;
  if (!(v >= 0 && v <= 16000000) || v != (double)(int)v) return false;
  *out = (int)v;
  return true;
}

static inline const char *ct_tok_type_of(const json_t *j) { return json_string_value(json_object_get(j, "type")); }

static inline bool ct_tok_is_true(const json_t *j) { return json_is_true(j); }

// ===========================================================================
// Each file's functions the others call

// tokenizer.c: a JSON file's text (integers too big for jansson read as reals).
int ct_tok_parse_json(const char *file, const char *text, size_t len, json_t **out);

// tokenizer_model.c: GPT-2's byte <-> character map (ct_tok_gpt2_init once before use),
// the token bytes store, model (vocab, merges) and added_tokens.
void ct_tok_gpt2_init(void);
int ct_tok_gpt2_byte_char(int b);
long ct_tok_gpt2_decode(const char *s, size_t n, char *dst);
int ct_tok_store_bytes(ct_tokenizer *t, const char *s, size_t n, uint32_t *off);
int ct_tok_load_model(ct_tokenizer *t, const loadctx *L, const json_t *model);
int ct_tok_load_added(ct_tokenizer *t, const loadctx *L, const json_t *added);
int ct_tok_index_added(ct_tokenizer *t);
void ct_tok_free_added_index(ct_tokenizer *t);

// tokenizer_pipeline.c: normalizer, pre_tokenizer, decoder, post_processor.
int ct_tok_load_normalizer(ct_tokenizer *t, const loadctx *L, const json_t *n, const char *where);
int ct_tok_load_pretok(ct_tokenizer *t, const loadctx *L, const json_t *p, const char *where);
int ct_tok_load_decoder(ct_tokenizer *t, const loadctx *L, const json_t *d, const char *where);
int ct_tok_build_dec(ct_tokenizer *t);
bool ct_tok_has_byte_level(const json_t *j);
void ct_tok_post_template(const ct_tokenizer *t, const json_t *p, int *lead, int *trail);

// tokenizer_config.c: tokenizer_config.json, the chat template, the stop ids.
int ct_tok_load_config(ct_tokenizer *t, const char *file, const json_t *cfg, int lead, int trail);
int ct_tok_compile_template(ct_tokenizer *t, const char *where);
int ct_tok_collect_stops(ct_tokenizer *t, const json_t *gencfg);

// tokenizer_encode.c: the word cache and an encode's scratch.
void ct_tok_cache_free(word_cache *c);
void ct_tok_scratch_free(const ct_tokenizer *t, enc_scratch *s);
