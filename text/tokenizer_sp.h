// tokenizer_sp: the text rewrites of SentencePiece-style tokenizer.json files (Llama 2,
// Mistral, Gemma): the normalizers Prepend and Replace and the Metaspace pre-tokenizer's
// "space -> ▁, maybe prepend ▁" (as normalizer ops that remember where each output byte
// came from, for token offsets), and the decoders' per-token rewrite (Replace,
// ByteFallback's <0xNN> -> byte).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { CT_SP_PREPEND, CT_SP_REPLACE };

// When a prepend applies: the normalizer Prepend (any non-empty text), or Metaspace's
// prepend_scheme (only when the text does not start with the string already; "first":
// only for the text at the very start of the input).
enum { CT_SP_PLAIN, CT_SP_ALWAYS, CT_SP_FIRST, CT_SP_NEVER };

typedef struct {
  int kind;      // CT_SP_PREPEND: prepend a; CT_SP_REPLACE: every a -> b
  int scheme;    // CT_SP_PREPEND: one of CT_SP_PLAIN..CT_SP_NEVER
  char *a, *b;   // owned, NUL-terminated
  size_t alen, blen;
} ct_sp_op;

// Buffers of ct_sp_normalize; they only grow. Zero-initialize; free with ct_sp_buf_free.
typedef struct {
  char *text[2];
  uint32_t *map[2];
  size_t cap[2];
} ct_sp_buf;

void ct_sp_buf_free(ct_sp_buf *b);

// Applies ops in order to s[0, n) (`first`: s starts the input). *out (*outn bytes)
// points into b, or is s when nothing changed. With want_map, *map (or NULL when nothing
// changed) gives for each output byte i the input byte it came from ((*map)[*outn] = n):
// an inserted string maps to the byte it stands before, a replacement to the first
// byte it replaced.
int ct_sp_normalize(const ct_sp_op *ops, int nops, const char *s, size_t n, bool first, bool want_map,
                    ct_sp_buf *b, const char **out, size_t *outn, const uint32_t **map);

// The byte <0xNN> stands for, or -1 when token[0, n) is not such a token.
int ct_sp_byte_token(const char *token, size_t n);

// Replaces every `from` in s[0, n) by `to` into a malloc'd string (*out, *outn bytes).
int ct_sp_replace_all(const char *s, size_t n, const char *from, size_t flen, const char *to, size_t tlen,
                      char **out, size_t *outn);
