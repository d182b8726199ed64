// Decoding: a token's bytes (the decoder's view for SentencePiece-style tokenizers),
// and ids back to text with the Strip decoder's cut.
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "tokenizer_internal.h"

const char *ct_tokenizer_token_bytes(const ct_tokenizer *t, int id, size_t *len) {
  if (id < 0 || id >= t->vocab_size || t->tok_kind[id] == TOK_NONE) {
    *len = 0;
    return NULL;
  }
  *len = t->dec_len ? t->dec_len[id] : t->tok_len[id];
  return t->bytes + (t->dec_off ? t->dec_off[id] : t->tok_off[id]);
}

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
