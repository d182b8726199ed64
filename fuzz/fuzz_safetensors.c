// Fuzzes the safetensors reader (nn/safetensors.c). An input that starts with '{' is a
// model.safetensors.index.json in a directory that holds two valid shards; any other is
// a .safetensors file. What opens must be self-consistent: every tensor found by name,
// readable as float32 when its dtype is a float, and inside the data section.
#include "fuzz.h"
#include "safetensors.h"

static char index_dir[192];

// The index directory with shards a.safetensors (x: F32 [2], y: BF16 [1, 2]) and
// b.safetensors (z: F16 [3], __metadata__ format=pt).
static void make_shards(void) {
  snprintf(index_dir, sizeof index_dir, "%s/index", fuzz_dir());
  char cmd[256];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", index_dir);
  if (system(cmd) != 0) abort();
  const float x[2] = {1.5f, -2}, y[2] = {3, 4}, z[3] = {0.5f, 0, -1};
  ct_st_entry a[2] = {{.name = "x", .dtype = CT_DT_F32, .ndim = 1, .shape = {2}, .data_f32 = x},
                      {.name = "y", .dtype = CT_DT_BF16, .ndim = 2, .shape = {1, 2}, .data_f32 = y}};
  ct_st_entry b[1] = {{.name = "z", .dtype = CT_DT_F16, .ndim = 1, .shape = {3}, .data_f32 = z}};
  const char *mk[] = {"format"}, *mv[] = {"pt"};
  char path[256];
  snprintf(path, sizeof path, "%s/a.safetensors", index_dir);
  if (ct_st_write(path, a, 2, NULL, NULL, 0)) abort();
  snprintf(path, sizeof path, "%s/b.safetensors", index_dir);
  if (ct_st_write(path, b, 1, mk, mv, 1)) abort();
}

static void check_file(const ct_safetensors *st) {
  for (int i = 0; i < st->n; i++) {
    const ct_st_tensor *t = &st->tensors[i];
    if (ct_st_find(st, t->name) != t || t->end > st->data_size || t->begin > t->end) abort();
    bool is_float = t->dtype == CT_DT_F32 || t->dtype == CT_DT_F16 || t->dtype == CT_DT_BF16 ||
                    t->dtype == CT_DT_F64;
    float *dst = malloc(sizeof(float) * (size_t)(t->numel ? t->numel : 1));
    if (!dst) abort();
    if ((ct_st_read_f32(st, t, dst, t->numel) == 0) != is_float) abort();
    free(dst);
  }
  for (int i = 0; i < st->n_meta; i++)
    if (!ct_st_meta(st, st->meta_keys[i])) abort();
  if (ct_st_find(st, "") && st->n == 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!index_dir[0]) make_shards();
  int rc;
  fuzz_clear_error();
  if (size && data[0] == '{') {
    fuzz_write("index/model.safetensors.index.json", data, size);
    ct_st_dir d;
    rc = ct_st_dir_open(&d, index_dir);
    fuzz_check_error(rc, "ct_st_dir_open");
    for (int i = 0; !rc && i < d.n; i++) {
      const ct_safetensors *st;
      const ct_st_tensor *t;
      if (ct_st_dir_find(&d, d.entries[i].name, &st, &t) || t != d.entries[i].t) abort();
    }
    ct_st_dir_close(&d);
    ct_st_dir_close(&d);
  } else {
    const char *path = fuzz_write("fuzz.safetensors", data, size);
    ct_safetensors st;
    rc = ct_st_open(&st, path);
    fuzz_check_error(rc, "ct_st_open");
    if (!rc) check_file(&st);
    ct_st_close(&st);
    ct_st_close(&st);
  }
  return 0;
}
