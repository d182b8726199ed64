// distill/topk: writes and reads the teacher's top-k logits file, checking every byte of
// it on load (layout, checksum, index range and uniqueness, finite logits).
#include "distill/topk.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "safetensors.h"

int ct_topk_write(const char *path, const ct_topk *t, const char *teacher) {
  char hash[20];
  snprintf(hash, sizeof hash, "%016llx", (unsigned long long)t->data_hash);
  ct_st_entry e[2] = {{.name = "indices", .dtype = CT_DT_I32, .ndim = 2, .shape = {t->n, t->k}, .data = t->idx},
                      {.name = "logits", .dtype = CT_DT_F32, .ndim = 2, .shape = {t->n, t->k}, .data = t->logit}};
  const char *mk[] = {"dataset_hash", "teacher"}, *mv[] = {hash, teacher};
  return ct_st_write_checked(path, e, 2, mk, mv, 2);
}

// The two tensors' layout and the metadata's dataset_hash.
static int check_layout(const ct_safetensors *st, int V, const ct_st_tensor **ti, const ct_st_tensor **tl,
                        uint64_t *data_hash) {
  const char *p = st->path, *h = ct_st_meta(st, "dataset_hash");
  *ti = ct_st_find(st, "indices");
  *tl = ct_st_find(st, "logits");
  if (!*ti || !*tl || st->n != 2)
    return ct_set_error(CT_EFORMAT, "%s: not a teacher top-k file (tensors 'indices' and 'logits' only; "
                        "`bin/distill precompute` writes one)", p);
  const ct_st_tensor *i = *ti, *l = *tl;
  if (i->dtype != CT_DT_I32 || l->dtype != CT_DT_F32 || i->ndim != 2 || l->ndim != 2 ||
      i->shape[0] != l->shape[0] || i->shape[1] != l->shape[1])
    return ct_set_error(CT_EFORMAT, "%s: 'indices' (I32) and 'logits' (F32) must have one (n, k) shape; they are "
                        "%s %s and %s %s", p, ct_dtype_name(i->dtype), i->ndim == 2 ? "(n, k)" : "not 2-D",
                        ct_dtype_name(l->dtype), l->ndim == 2 ? "(n, k)" : "not 2-D");
  if (i->shape[1] < 1 || i->shape[1] > V)
    return ct_set_error(CT_EFORMAT, "%s: k = %lld ids per row, for a vocabulary of %d tokens (1 <= k <= %d)", p,
                        (long long)i->shape[1], V, V);
  char *end = NULL;
  if (!h || strlen(h) != 16 || (*data_hash = strtoull(h, &end, 16), *end))
    return ct_set_error(CT_EFORMAT, "%s: __metadata__ 'dataset_hash' (16 hex digits) is missing or unreadable", p);
  return 0;
}

// Every value: ids in [0, V) and distinct in their row (seen: V stamps), logits finite.
static int check_values(const ct_topk *t, const char *path, int V, long *seen) {
  for (long r = 0; r < t->n; r++)
    for (int j = 0; j < t->k; j++) {
      long at = r * t->k + j;
      int id = t->idx[at];
      if (id < 0 || id >= V)
        return ct_set_error(CT_EFORMAT, "%s: indices row %ld, position %d: token id %d is outside the student's "
                            "vocabulary [0, %d)", path, r, j, id, V);
      if (seen[id] == r + 1)
        return ct_set_error(CT_EFORMAT, "%s: indices row %ld, position %d: token id %d appears twice in the row",
                            path, r, j, id);
      seen[id] = r + 1;
      if (!isfinite(t->logit[at]))
        return ct_set_error(CT_EFORMAT, "%s: logits row %ld, position %d: %g is not a finite logit", path, r, j,
                            (double)t->logit[at]);
    }
  return 0;
}

int ct_topk_load(ct_topk *t, const char *path, int V) {
  memset(t, 0, sizeof *t);
  ct_safetensors st = {0};
  const ct_st_tensor *ti, *tl;
  long *seen = NULL;
  int rc = ct_st_open(&st, path);
  if (!rc) rc = check_layout(&st, V, &ti, &tl, &t->data_hash);
  if (!rc) rc = ct_st_check_content(&st, &t->sum);
  if (!rc) {
    t->n = ti->shape[0];
    t->k = (int)ti->shape[1];
    size_t nk = (size_t)ti->numel ? (size_t)ti->numel : 1;
    t->idx = malloc(sizeof(int) * nk);
    t->logit = malloc(sizeof(float) * nk);
    seen = calloc((size_t)V, sizeof *seen);
    if (!t->idx || !t->logit || !seen) rc = ct_set_error(CT_ENOMEM, "%s: out of memory", path);
  }
  if (!rc) {
    memcpy(t->idx, ct_st_data(&st, ti), sizeof(int) * (size_t)ti->numel);
    rc = ct_st_read_f32(&st, tl, t->logit, tl->numel);
  }
  if (!rc) rc = check_values(t, path, V, seen);
  free(seen);
  ct_st_close(&st);
  if (rc) ct_topk_free(t);
  return rc;
}

void ct_topk_free(ct_topk *t) {
  free(t->idx);
  free(t->logit);
  memset(t, 0, sizeof *t);
}
