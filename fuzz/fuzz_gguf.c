// Fuzzes the GGUF header reader (nn/gguf_read.c, what `ctune-ckpt inspect` reads). What
// opens must be self-consistent: tensor names set, 1-4 dimensions whose product is numel,
// every offset inside the file's data section; a refusal leaves a message.
#include "fuzz.h"
#include "gguf_read.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_clear_error();
  const char *path = fuzz_write("fuzz.gguf", data, size);
  ct_gguf_info g;
  int rc = ct_gguf_read_info(path, &g);
  fuzz_check_error(rc, "ct_gguf_read_info");
  if (rc) return 0;
  if (g.data_offset % g.alignment || (g.n_tensors && g.data_offset > g.file_size)) abort();
  for (int i = 0; i < g.n_tensors; i++) {
    const ct_gguf_tinfo *t = &g.t[i];
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->ne[d];
    if (!t->name || t->ndim < 1 || t->ndim > 4 || n != t->numel || t->offset > g.file_size - g.data_offset) abort();
  }
  ct_gguf_info_free(&g);
  return 0;
}
