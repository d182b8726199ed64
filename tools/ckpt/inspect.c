// ctune-ckpt inspect: a model directory's, a safetensors file's or a GGUF file's tensors
// (dtype, shape, bytes), metadata and parameter count; a checkpoint's training state named.
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ckpt.h"
#include "error.h"
#include "fs.h"
#include "gguf_read.h"

static void inspect_file(const ct_st_dir *d, int f, int64_t *params, uint64_t *bytes, long *by_dtype) {
  const ct_safetensors *st = &d->files[f];
  printf("%s: %d tensors, %zu bytes\n", st->path, st->n, st->file_size);
  if (st->n_meta) {
    printf("  metadata:");
    for (int i = 0; i < st->n_meta; i++) printf(" %s=%s", st->meta_keys[i], st->meta_vals[i]);
    printf("\n");
  }
  for (int i = 0; i < st->n; i++) {
    const ct_st_tensor *t = &st->tensors[i];
    if (!ckpt_mapped(d, f, t)) continue;
    char dims[160];
    ckpt_fmt_dims(dims, sizeof dims, t);
    printf("  %-48s %-5s %-16s %12llu\n", t->name, ct_dtype_name(t->dtype), dims, (unsigned long long)(t->end - t->begin));
    *params += t->numel;
    *bytes += t->end - t->begin;
    by_dtype[t->dtype]++;
  }
}

// What a training checkpoint holds besides the model (parameters only are counted).
static void inspect_training_files(const char *dir) {
  if (!ckpt_is_dir(dir)) return;
  DIR *dp = opendir(dir);
  struct dirent *e;
  while (dp && (e = readdir(dp))) {
    const char *n = e->d_name;
    if (strncmp(n, "optimizer", 9) && strcmp(n, "ref_model.safetensors")) continue;
    char p[CT_PATH_MAX];
    ct_safetensors st;
    if (ct_path_join(p, sizeof p, dir, n) || ct_st_open(&st, p)) continue;
    printf("training state (not counted): %s: %d tensors, %zu bytes\n", n, st.n, st.file_size);
    ct_st_close(&st);
  }
  if (dp) closedir(dp);
  char p[CT_PATH_MAX];
  json_t *j = ct_path_join(p, sizeof p, dir, "trainer_state.json") ? NULL : json_load_file(p, 0, NULL);
  if (j) printf("training state (not counted): trainer_state.json at step %lld\n",
                (long long)json_integer_value(json_object_get(j, "global_step")));
  json_decref(j);
}

// A GGUF file (ctune-ckpt gguf's output, or llama.cpp's): its header, tensor by tensor.
static int inspect_gguf(const char *path) {
  ct_gguf_info g;
  if (ct_gguf_read_info(path, &g)) ckpt_die(1);
  printf("%s: GGUF v%u, %llu bytes, architecture %s", path, g.version, (unsigned long long)g.file_size,
         g.arch[0] ? g.arch : "(none)");
  if (g.name[0]) printf(", name \"%s\"", g.name);
  if (g.has_file_type) printf(", file type %u", g.file_type);
  printf(", %llu key/values, %d tensors\n", (unsigned long long)g.n_kv, g.n_tensors);
  uint64_t params = 0, bytes = 0;
  for (int i = 0; i < g.n_tensors; i++) {
    const ct_gguf_tinfo *t = &g.t[i];
    char dims[160] = "", type[16], nbytes[24] = "?";
    for (int d = 0; d < t->ndim; d++)  // ne[0] varies fastest: shown last, as a row-major shape
      snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", d ? ", " : "[", (long long)t->ne[t->ndim - 1 - d]);
    snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "]");
    const char *tn = ct_gguf_type_name((ct_gguf_type)t->type);
    uint64_t nb = ct_gguf_nbytes((ct_gguf_type)t->type, (int64_t)t->numel);
    if (!strcmp(tn, "?")) snprintf(type, sizeof type, "type %u", t->type);
    else snprintf(type, sizeof type, "%s", tn);
    if (nb) snprintf(nbytes, sizeof nbytes, "%llu", (unsigned long long)nb);
    printf("  %-48s %-7s %-16s %12s\n", t->name, type, dims, nbytes);
    params += t->numel;
    bytes += nb;
  }
  printf("total: %d tensors, %llu parameters (%.2f M), %llu bytes of tensor data (of the types this reads)\n",
         g.n_tensors, (unsigned long long)params, params / 1e6, (unsigned long long)bytes);
  ct_gguf_info_free(&g);
  return 0;
}

int ckpt_inspect(int argc, char **argv) {
  if (argc != 3 || strchr(argv[2], '=')) {
    fprintf(stderr, "ctune-ckpt: inspect takes one DIR or FILE\n");
    return ckpt_usage(stderr);
  }
  if (!ckpt_is_dir(argv[2]) && ct_gguf_is_file(argv[2])) return inspect_gguf(argv[2]);
  ct_st_dir d;
  if (ckpt_open_tensors(&d, argv[2], true)) ckpt_die(1);
  int64_t params = 0;
  uint64_t bytes = 0;
  long by_dtype[CT_DT_BOOL + 1] = {0};
  int *order = ckpt_file_order(&d);
  if (!order) ckpt_die(1);
  for (int k = 0; k < d.n_files; k++) inspect_file(&d, order[k], &params, &bytes, by_dtype);
  free(order);
  printf("total: %d tensors, %lld parameters (%.2f M), %llu bytes of tensor data;", d.n, (long long)params,
         params / 1e6, (unsigned long long)bytes);
  for (int t = 0; t <= CT_DT_BOOL; t++)
    if (by_dtype[t]) printf(" %s x %ld", ct_dtype_name((ct_dtype)t), by_dtype[t]);
  printf("\n");
  inspect_training_files(argv[2]);
  fprintf(stderr, "ctune-ckpt: inspect: peak memory %.1f MiB\n", ckpt_peak_mib());
  ct_st_dir_close(&d);
  return 0;
}
