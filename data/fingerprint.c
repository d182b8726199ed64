// fingerprint: hashes of training sets (see fingerprint.h).
#include "fingerprint.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"

// h, then n elements of p (n first, so that arrays' boundaries count).
static uint64_t hash_bytes(uint64_t h, const void *p, long n, size_t elem) {
  h = ct_xxh64(&n, sizeof n, h);
  return p && n > 0 ? ct_xxh64(p, elem * (size_t)n, h) : h;
}
#define HASH_ARRAY(h, p, n) hash_bytes((h), (p), (long)(n), sizeof *(p))

uint64_t ct_dataset_fingerprint(const ct_dataset *ds) {
  uint64_t h = HASH_ARRAY(0, ds->ids, ds->n_tokens);
  h = HASH_ARRAY(h, ds->label, ds->n_tokens);
  h = HASH_ARRAY(h, ds->row_len, ds->n_rows);
  h = HASH_ARRAY(h, ds->seq_count, ds->n_seq);
  long n_rows_in_seqs = 0;
  for (int i = 0; i < ds->n_seq; i++) n_rows_in_seqs += ds->seq_count[i];
  return HASH_ARRAY(h, ds->seq_rows, n_rows_in_seqs);
}

uint64_t ct_pref_fingerprint(const ct_pref_dataset *ds) {
  uint64_t h = HASH_ARRAY(0, ds->ids, ds->n_tokens);
  h = HASH_ARRAY(h, ds->p_len, ds->n);
  h = HASH_ARRAY(h, ds->c_len, ds->n);
  h = HASH_ARRAY(h, ds->r_len, ds->n);
  return ds->label ? HASH_ARRAY(h, ds->label, ds->n) : h;  // (unpaired: a flipped label is other data)
}

uint64_t ct_prompt_set_fingerprint(const ct_prompt_set *s) {
  uint64_t h = 0;
  for (int i = 0; i < s->n; i++) {
    h = HASH_ARRAY(h, s->ids[i].v, s->ids[i].n);
    char *row = json_dumps(s->rows[i], JSON_COMPACT | JSON_SORT_KEYS);
    h = row ? hash_bytes(h, row, (long)strlen(row), 1) : h;
    free(row);
  }
  return h;
}
