// ctune-ckpt shard: a model's tensors split into model-0000N-of-0000M.safetensors files
// of at most max_shard_size plus model.safetensors.index.json, as save_pretrained does.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ckpt.h"
#include "error.h"
#include "fs.h"

// "2GB" (10^9, as transformers), "500MiB" (2^20), "1000" bytes; 0 when malformed.
static uint64_t parse_size(const char *s) {
  static const struct {
    const char *unit;
    double mult;
  } units[] = {{"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
               {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  char *end;
  double v = strtod(s, &end);
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (!strcasecmp(end, units[i].unit) && end != s && v > 0 && isfinite(v)) return (uint64_t)(v * units[i].mult);
  return 0;
}

// The shards: tensors in data order, a new shard when the next one would pass max (a
// tensor larger than max gets a shard of its own), as huggingface_hub splits state dicts.
static int plan_shards(const tensor_ref *list, int n, uint64_t max, int *shard_of) {
  int s = 0;
  uint64_t size = 0;
  for (int i = 0; i < n; i++) {
    uint64_t nb = list[i].t->end - list[i].t->begin;
    if (i > 0 && size + nb > max) s++, size = 0;
    shard_of[i] = s;
    size += nb;
  }
  return n ? s + 1 : 1;
}

typedef struct {
  uint64_t max;  // bytes a shard may hold
  int n_shards;  // written
} shard_job;

// ckpt_write_fn: the tensors in shards of at most job->max bytes.
static int shard_files(const ct_st_dir *d, const char *tmp, stream_buf *b, void *ctx) {
  shard_job *job = ctx;
  uint64_t max = job->max;
  int n, rc = 0;
  tensor_ref *list = ckpt_tensor_list(d, &n);
  if (!list) return CT_ENOMEM;
  int *shard_of = malloc(sizeof(int) * (n ? n : 1));
  const char **names = malloc(sizeof *names * (n ? n : 1)), **files = malloc(sizeof *files * (n ? n : 1));
  char (*fname)[64] = NULL;
  if (!shard_of || !names || !files) rc = ct_set_error(CT_ENOMEM, "out of memory");
  int S = rc ? 0 : plan_shards(list, n, max, shard_of);
  if (!rc && !(fname = calloc((size_t)S, sizeof *fname))) rc = ct_set_error(CT_ENOMEM, "out of memory");
  uint64_t total = 0;
  for (int s = 0, at = 0; s < S && !rc; s++) {
    if (S == 1) snprintf(fname[s], sizeof fname[s], "model.safetensors");  // one shard: no index, as transformers
    else snprintf(fname[s], sizeof fname[s], "model-%05d-of-%05d.safetensors", s + 1, S);
    int k = 0;
    while (at + k < n && shard_of[at + k] == s) names[at + k] = list[at + k].t->name, files[at + k] = fname[s], k++;
    char p[CT_PATH_MAX];
    rc = ct_path_join(p, sizeof p, tmp, fname[s]);
    if (!rc) rc = ckpt_write_stream_file(p, d, list + at, k, -1, &d->files[k ? list[at].file : 0], b, &total);
    at += k;
  }
  if (!rc && S > 1) rc = ckpt_write_index(tmp, names, files, n, total);
  job->n_shards = S;
  free(fname);
  free(names);
  free(files);
  free(shard_of);
  free(list);
  return rc;
}

int ckpt_shard(int argc, char **argv) {
  static const char *const known[] = {"in=", "out=", "max_shard_size=", NULL};
  const char *v[3];
  if (ckpt_args(argc, argv, known, 2, v)) return 2;
  const char *in = v[0], *out = v[1], *ms = v[2];
  uint64_t max = parse_size(ms ? ms : "5GB");  // transformers' default for save_pretrained
  if (!max) {
    fprintf(stderr, "ctune-ckpt: shard: max_shard_size '%s' is not a size like 2GB, 500MB, 1GiB or a byte count\n", ms);
    return 2;
  }
  ct_st_dir d;
  shard_job job = {max, 0};
  int rc = ckpt_rewrite("shard", &d, in, out, NULL, shard_files, &job);
  if (rc) return rc;
  int S = job.n_shards;
  fprintf(stderr, "ctune-ckpt: %s (%d tensors) written to %s as %d shard%s of at most %llu bytes; peak memory %.1f MiB\n",
          in, d.n, out, S, S == 1 ? "" : "s", (unsigned long long)max, ckpt_peak_mib());
  ct_st_dir_close(&d);
  return 0;
}
