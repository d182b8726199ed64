// Fuzzes the teacher top-k logits reader (distill/topk.c) for a student of 260 tokens. An
// input that starts with 'P' is a payload: k = 1 + its second byte % 8, then int32 ids and
// float32 logits of as many (k)-rows as fit, written as a proper checksummed file first,
// so that the value checks (ids in range and distinct, finite logits) are reached; any
// other input is the file itself (layout, metadata, checksum). What loads must hold only
// valid values.
#include <math.h>

#include "distill/topk.h"
#include "fuzz.h"

enum { V = 260 };

static void check_loaded(const ct_topk *t) {
  if (t->k < 1 || t->k > V || t->n < 0 || (t->n && (!t->idx || !t->logit))) abort();
  for (long i = 0; i < t->n * t->k; i++)
    if (t->idx[i] < 0 || t->idx[i] >= V || !isfinite(t->logit[i])) abort();
}

// The payload's rows as a file (NULL: too short for one row).
static const char *payload_file(const uint8_t *data, size_t size) {
  if (size < 2) return NULL;
  int k = 1 + data[1] % 8;
  size_t row = (size_t)8 * k;
  long n = (long)((size - 2) / row);
  if (n == 0) return NULL;
  int *idx = malloc(sizeof(int) * n * k);
  float *logit = malloc(sizeof(float) * n * k);
  if (!idx || !logit) abort();
  memcpy(idx, data + 2, sizeof(int) * n * k);
  memcpy(logit, data + 2 + sizeof(int) * n * k, sizeof(float) * n * k);
  ct_topk t = {.k = k, .n = n, .idx = idx, .logit = logit, .data_hash = 1};
  static char path[256];
  snprintf(path, sizeof path, "%s/payload.safetensors", fuzz_dir());
  if (ct_topk_write(path, &t, "fuzz")) abort();
  free(idx);
  free(logit);
  return path;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = size && data[0] == 'P' ? payload_file(data, size) : fuzz_write("topk.safetensors", data, size);
  if (!path) return 0;
  ct_topk t;
  fuzz_clear_error();
  int rc = ct_topk_load(&t, path, V);
  fuzz_check_error(rc, "ct_topk_load");
  if (!rc) check_loaded(&t);
  else if (t.idx || t.logit) abort();  // a failed load holds nothing
  ct_topk_free(&t);
  return 0;
}
