// ids: the growable token-id array.
#include "ids.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

int ct_ids_push(ct_ids *ids, int id) {
  if (ids->n == ids->cap) {
    int cap = ids->cap ? 2 * ids->cap : 64;
    int *v = realloc(ids->v, sizeof(int) * (size_t)cap);
    if (!v) return ct_set_error(CT_ENOMEM, "tokenizer: out of memory");
    ids->v = v;
    ids->cap = cap;
  }
  ids->v[ids->n++] = id;
  return 0;
}

void ct_ids_free(ct_ids *ids) {
  free(ids->v);
  memset(ids, 0, sizeof *ids);
}
