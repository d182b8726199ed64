// ctune-ckpt convert: a model's floating-point tensors rewritten as another dtype, one
// output file per input file, with the model's other files (config.json's dtype set).
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "error.h"
#include "fs.h"

static const struct {
  const char *name;
  ct_dtype dt;
} out_dtypes[] = {{"float32", CT_DT_F32}, {"bfloat16", CT_DT_BF16}, {"float16", CT_DT_F16}};

// ckpt_write_fn: the tensors as the dtype *ctx.
static int convert_files(const ct_st_dir *d, const char *tmp, stream_buf *b, void *ctx) {
  ct_dtype to = *(const ct_dtype *)ctx;
  int n, rc = 0;
  tensor_ref *list = ckpt_tensor_list(d, &n);
  if (!list) return CT_ENOMEM;
  const char **names = malloc(sizeof *names * (n ? n : 1)), **files = malloc(sizeof *files * (n ? n : 1));
  if (!names || !files) rc = ct_set_error(CT_ENOMEM, "out of memory");
  uint64_t total = 0;
  for (int at = 0; at < n && !rc;) {  // one output file per input file, in list order
    int f = list[at].file, k = 0;
    while (at + k < n && list[at + k].file == f) {
      names[at + k] = list[at + k].t->name;
      files[at + k] = ckpt_base_name(d->files[f].path);
      k++;
    }
    char p[CT_PATH_MAX];
    rc = ct_path_join(p, sizeof p, tmp, ckpt_base_name(d->files[f].path));
    if (!rc) rc = ckpt_write_stream_file(p, d, list + at, k, (int)to, &d->files[f], b, &total);
    at += k;
  }
  bool index = d->n_files > 1 || strcmp(ckpt_base_name(d->files[0].path), "model.safetensors");
  if (!rc && index) rc = ckpt_write_index(tmp, names, files, n, total);
  free(names);
  free(files);
  free(list);
  return rc;
}

int ckpt_convert(int argc, char **argv) {
  static const char *const known[] = {"in=", "out=", "dtype=", NULL};
  const char *v[3];
  if (ckpt_args(argc, argv, known, 3, v)) return 2;
  const char *in = v[0], *out = v[1], *dname = v[2];
  int k = 0;
  while (k < 3 && strcmp(dname, out_dtypes[k].name)) k++;
  if (k == 3) {
    fprintf(stderr, "ctune-ckpt: convert: dtype '%s' is not bfloat16, float16 or float32\n", dname);
    return 2;
  }
  ct_st_dir d;
  ct_dtype to = out_dtypes[k].dt;
  int rc = ckpt_rewrite("convert", &d, in, out, dname, convert_files, &to);
  if (rc) return rc;
  fprintf(stderr, "ctune-ckpt: %s (%d tensors) written to %s as %s; peak memory %.1f MiB\n", in, d.n, out, dname,
          ckpt_peak_mib());
  ct_st_dir_close(&d);
  return 0;
}
