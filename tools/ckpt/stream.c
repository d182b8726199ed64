// What inspect, convert, compare and shard share: opening a model's tensors, the
// streaming buffer, writing safetensors files and the index through it, and output
// directories written aside and renamed into place.
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "bf16.h"
#include "ckpt.h"
#include "error.h"
#include "fs.h"

// ---- streaming: inspect, convert, compare, shard ----
//
// These read tensors piece by piece through one buffer of CT_CKPT_BUFFER bytes (default
// 64 MiB; a test sets it small) and drop the pages they read from the input's mapping,
// so resident memory stays near the buffers whatever the model's size. Outputs are
// written into OUT.tmp-<pid> next to OUT and renamed into place when complete.

size_t ckpt_buffer_bytes(void) {
  const char *s = getenv("CT_CKPT_BUFFER");
  long long v = s ? atoll(s) : 64LL << 20;
  return v < 4096 ? 4096 : (size_t)v;
}

// The last line of a streaming command: resident memory at its peak.
double ckpt_peak_mib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);  // ru_maxrss: KiB on Linux
  return ru.ru_maxrss / 1024.0;
}

bool ckpt_is_dir(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

// A model directory (model.safetensors or its shards), an adapter directory with
// allow_adapter, or one .safetensors file.
int ckpt_open_tensors(ct_st_dir *d, const char *path, bool allow_adapter) {
  if (!ckpt_is_dir(path)) {
    if (access(path, R_OK)) return ct_set_error(CT_EIO, "%s: cannot open: %s", path, strerror(errno));
    return ct_st_dir_open_file(d, path);
  }
  bool model = ct_path_has_file(path, "model.safetensors") || ct_path_has_file(path, "model.safetensors.index.json");
  if (!model && ct_path_has_file(path, "adapter_model.safetensors")) {
    char p[CT_PATH_MAX];
    if (!allow_adapter)
      return ct_set_error(CT_EINVAL, "%s is a LoRA adapter (adapter_model.safetensors), not a model; "
                          "merge it first: ctune-ckpt merge-lora base=DIR adapter=%s out=DIR", path, path);
    return ct_path_join(p, sizeof p, path, "adapter_model.safetensors") ? CT_EINVAL : ct_st_dir_open_file(d, p);
  }
  return ct_st_dir_open(d, path);
}

const char *ckpt_base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

// Is tensor t of file f one the directory maps (an index may leave a shard's extras out)?
bool ckpt_mapped(const ct_st_dir *d, int f, const ct_st_tensor *t) {
  const ct_safetensors *st;
  const ct_st_tensor *hit;
  return ct_st_dir_find(d, t->name, &st, &hit) == 0 && st == &d->files[f] && hit == t;
}

bool ckpt_is_float(ct_dtype dt) {
  return dt == CT_DT_F32 || dt == CT_DT_F16 || dt == CT_DT_BF16 || dt == CT_DT_F64;
}

void ckpt_fmt_dims(char *buf, size_t n, const ct_st_tensor *t) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < t->ndim && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

static const ct_st_dir *sort_dir;  // (qsort has no context argument)
static int cmp_file_names(const void *a, const void *b) {
  return strcmp(ckpt_base_name(sort_dir->files[*(const int *)a].path), ckpt_base_name(sort_dir->files[*(const int *)b].path));
}

// order (n_files): d's files by name (shard 00001 first), or NULL when out of memory.
int *ckpt_file_order(const ct_st_dir *d) {
  int *order = malloc(sizeof(int) * (size_t)(d->n_files ? d->n_files : 1));
  if (!order) return ct_set_error(CT_ENOMEM, "out of memory"), NULL;
  for (int f = 0; f < d->n_files; f++) order[f] = f;
  sort_dir = d;
  qsort(order, (size_t)d->n_files, sizeof *order, cmp_file_names);
  return order;
}

// ---- output directories ----

// out must not exist, or be an empty directory; tmp gets "<out>.tmp-<pid>", created empty.
int ckpt_out_begin(const char *out, char *tmp, size_t n) {
  if (ckpt_is_dir(out)) {
    DIR *dp = opendir(out);
    struct dirent *e;
    int entries = 0;
    while (dp && (e = readdir(dp))) entries += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (dp) closedir(dp);
    if (entries) return ct_set_error(CT_EINVAL, "out=%s exists and is not empty; remove it or give another directory", out);
  } else if (access(out, F_OK) == 0) {
    return ct_set_error(CT_EINVAL, "out=%s exists and is not a directory", out);
  }
  if ((size_t)snprintf(tmp, n, "%s.tmp-%ld", out, (long)getpid()) >= n) return ct_set_error(CT_EINVAL, "out=%s: path too long", out);
  int rc = ct_remove_tree(tmp);
  return rc ? rc : ct_mkdirs(tmp);
}

// Every file of tmp and tmp itself reach the disk; then tmp becomes out.
int ckpt_out_commit(const char *tmp, const char *out) {
  DIR *dp = opendir(tmp);
  struct dirent *e;
  char p[CT_PATH_MAX];
  int rc = dp ? 0 : ct_set_error(CT_EIO, "%s: cannot open: %s", tmp, strerror(errno));
  while (!rc && (e = readdir(dp)))
    if (e->d_name[0] != '.') rc = ct_path_join(p, sizeof p, tmp, e->d_name) || ct_fsync_path(p, false);
  if (dp) closedir(dp);
  if (!rc) rc = ct_fsync_path(tmp, true);
  if (!rc && rename(tmp, out)) rc = ct_set_error(CT_EIO, "%s: cannot rename to %s: %s", tmp, out, strerror(errno));
  char parent[CT_PATH_MAX];
  snprintf(parent, sizeof parent, "%s", out);
  char *slash = strrchr(parent, '/');
  if (!rc) rc = ct_fsync_path(slash ? (slash == parent ? "/" : (*slash = 0, parent)) : ".", true);
  return rc;
}

static int copy_file(const char *from, const char *to) {
  char *buf;
  size_t len;
  int rc = ct_read_file(from, &buf, &len, NULL);
  if (rc) return rc;
  FILE *f = fopen(to, "wb");
  if (!f || fwrite(buf, 1, len, f) != len) rc = ct_set_error(CT_EIO, "%s: cannot write: %s", to, strerror(errno));
  if (f && fclose(f) && !rc) rc = ct_set_error(CT_EIO, "%s: cannot write: %s", to, strerror(errno));
  free(buf);
  return rc;
}

// config.json with its dtype key ("torch_dtype", or transformers 4.56+'s "dtype") set to
// `name`; every other byte as it was.
static int write_config_dtype(const char *from, const char *to, const char *name) {
  char *s;
  size_t len;
  int rc = ct_read_file(from, &s, &len, NULL);
  if (rc) return rc;
  json_error_t je;
  json_t *j = json_loads(s, 0, &je);
  if (!json_is_object(j)) {
    json_decref(j);
    free(s);
    return ct_set_error(CT_EFORMAT, "%s:%d: not a JSON object: %s", from, je.line, je.text);
  }
  json_decref(j);
  FILE *f = fopen(to, "wb");
  if (!f) {
    free(s);
    return ct_set_error(CT_EIO, "%s: cannot write: %s", to, strerror(errno));
  }
  bool found = false;
  size_t at = 0;
  for (const char *k = s; (k = strstr(k, "dtype\"")); k++) {
    if (k == s || (k[-1] != '"' && (k - s < 7 || strncmp(k - 7, "\"torch_", 7)))) continue;
    const char *v = k + 6;
    while (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r') v++;
    if (*v++ != ':') continue;
    while (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r') v++;
    const char *end = *v == '"' ? strchr(v + 1, '"') : NULL;
    if (!end) continue;
    fwrite(s + at, 1, (size_t)(v - s) - at, f);
    fprintf(f, "\"%s\"", name);
    at = (size_t)(end + 1 - s);
    found = true;
  }
  if (!found) {  // none: add torch_dtype after the opening brace
    const char *brace = strchr(s, '{');
    at = (size_t)(brace - s) + 1;
    fwrite(s, 1, at, f);
    fprintf(f, "\n  \"torch_dtype\": \"%s\",", name);
  }
  fwrite(s + at, 1, len - at, f);
  if (fclose(f)) rc = ct_set_error(CT_EIO, "%s: cannot write: %s", to, strerror(errno));
  free(s);
  return rc;
}

// What a model directory needs besides its tensors: every regular file but the tensors,
// the index, and the training state (optimizer moments, trainer_state.json, logs, the
// resolved config.yml). config.json gets dtype when non-NULL.
static bool training_file(const char *n) {
  size_t l = strlen(n);
  return n[0] == '.' || !strcmp(n, "trainer_state.json") || !strcmp(n, "config.yml") ||
         (l > 6 && !strcmp(n + l - 6, ".jsonl")) || (l > 12 && !strcmp(n + l - 12, ".safetensors")) ||
         !strcmp(n, "model.safetensors.index.json");
}

int ckpt_copy_model_files(const char *in, const char *tmp, const char *dtype) {
  DIR *dp = opendir(in);
  struct dirent *e;
  int rc = dp ? 0 : ct_set_error(CT_EIO, "%s: cannot open: %s", in, strerror(errno));
  char from[CT_PATH_MAX], to[CT_PATH_MAX], skipped[1024] = "";
  while (!rc && (e = readdir(dp))) {
    if (ct_path_join(from, sizeof from, in, e->d_name) || ct_path_join(to, sizeof to, tmp, e->d_name)) return CT_EINVAL;
    struct stat sb;
    if (stat(from, &sb) || !S_ISREG(sb.st_mode)) continue;
    if (training_file(e->d_name)) {
      bool model = !strncmp(e->d_name, "model", 5) && strstr(e->d_name, ".safetensors");
      if (!model && e->d_name[0] != '.' && strlen(skipped) + strlen(e->d_name) + 2 < sizeof skipped)
        strcat(strcat(skipped, " "), e->d_name);
      continue;
    }
    rc = dtype && !strcmp(e->d_name, "config.json") ? write_config_dtype(from, to, dtype) : copy_file(from, to);
  }
  if (dp) closedir(dp);
  if (!rc && skipped[0]) fprintf(stderr, "ctune-ckpt: left out (training state, not the model):%s\n", skipped);
  return rc;
}

// ---- writing tensors through the buffer ----

int ckpt_stream_buf_init(stream_buf *b) {
  b->cap = ckpt_buffer_bytes() / 8 * 8;
  b->raw = malloc(b->cap);
  b->f = malloc(b->cap);
  return b->raw && b->f ? 0 : ct_set_error(CT_ENOMEM, "cannot allocate the %zu-byte buffers (CT_CKPT_BUFFER)", b->cap);
}

void ckpt_stream_buf_free(stream_buf *b) {
  free(b->raw);
  free(b->f);
}

// Tensor t of st appended to w as dtype `to` (its bytes as they are when to == t->dtype).
static int stream_tensor(ct_st_writer *w, const ct_safetensors *st, const ct_st_tensor *t, ct_dtype to, stream_buf *b) {
  const uint8_t *src = ct_st_data(st, t);
  if (to == t->dtype) {
    for (uint64_t i = 0, n = t->end - t->begin; i < n; i += b->cap) {
      size_t k = n - i < b->cap ? (size_t)(n - i) : b->cap;
      int rc = ct_st_writer_put(w, src + i, k);
      ct_st_drop(src + i, k);
      if (rc) return rc;
    }
    return 0;
  }
  size_t per = b->cap / 4;
  for (int64_t i = 0; i < t->numel; i += (int64_t)per) {
    size_t k = t->numel - i < (int64_t)per ? (size_t)(t->numel - i) : per;
    int rc = ct_st_read_f32_range(st, t, i, (int64_t)k, b->f);
    if (rc) return rc;
    uint16_t *h = (uint16_t *)(void *)b->raw;
    if (to == CT_DT_F32) memcpy(b->raw, b->f, 4 * k);
    else if (to == CT_DT_BF16) for (size_t j = 0; j < k; j++) h[j] = ct_f32_to_bf16(b->f[j]);
    else for (size_t j = 0; j < k; j++) h[j] = ct_f32_to_f16(b->f[j]);
    if ((rc = ct_st_writer_put(w, b->raw, k * ct_dtype_size(to)))) return rc;
  }
  return 0;
}

// One output file: tensors list[0..n) (of d), each as dtype `to` (-1: as stored; floats
// only are converted), with src's metadata.
int ckpt_write_stream_file(const char *path, const ct_st_dir *d, const tensor_ref *list, int n, int to,
                           const ct_safetensors *meta, stream_buf *b, uint64_t *total) {
  ct_st_entry *e = calloc(n ? (size_t)n : 1, sizeof *e);
  if (!e) return ct_set_error(CT_ENOMEM, "%s: out of memory", path);
  for (int i = 0; i < n; i++) {
    const ct_st_tensor *t = list[i].t;
    e[i] = (ct_st_entry){.name = t->name, .ndim = t->ndim, .data = "",
                         .dtype = to >= 0 && ckpt_is_float(t->dtype) ? (ct_dtype)to : t->dtype};
    memcpy(e[i].shape, t->shape, sizeof e[i].shape);
    *total += (uint64_t)t->numel * ct_dtype_size(e[i].dtype);
  }
  ct_st_writer w;
  int rc = ct_st_writer_open(&w, path, e, n, (const char *const *)meta->meta_keys,
                             (const char *const *)meta->meta_vals, meta->n_meta);
  for (int i = 0; i < n && !rc; i++) rc = stream_tensor(&w, &d->files[list[i].file], list[i].t, e[i].dtype, b);
  if (rc) ct_st_writer_abort(&w);
  else rc = ct_st_writer_close(&w);
  free(e);
  return rc;
}

// Every mapped tensor of d, file by file (by name: shard 00001 first) in data order.
tensor_ref *ckpt_tensor_list(const ct_st_dir *d, int *n) {
  tensor_ref *list = malloc(sizeof *list * (d->n ? (size_t)d->n : 1));
  int *order = ckpt_file_order(d);
  *n = 0;
  if (!list || !order) {
    free(list);
    free(order);
    ct_set_error(CT_ENOMEM, "out of memory");
    return NULL;
  }
  for (int k = 0; k < d->n_files; k++)
    for (int f = order[k], i = 0; i < d->files[f].n; i++)
      if (ckpt_mapped(d, f, &d->files[f].tensors[i])) list[(*n)++] = (tensor_ref){f, &d->files[f].tensors[i]};
  free(order);
  return list;
}


// model.safetensors.index.json as transformers writes it: total_size, then weight_map
// sorted by name (json.dumps(indent=2, sort_keys=True)).
int ckpt_write_index(const char *dir, const char *const *names, const char *const *files, int n, uint64_t total) {
  json_t *j = json_pack("{s:{s:I},s:{}}", "metadata", "total_size", (json_int_t)total, "weight_map");
  json_t *wm = json_object_get(j, "weight_map");
  for (int i = 0; i < n; i++) json_object_set_new(wm, names[i], json_string(files[i]));
  char p[CT_PATH_MAX];
  int rc = ct_path_join(p, sizeof p, dir, "model.safetensors.index.json");
  char *text = rc ? NULL : json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
  FILE *f = text ? fopen(p, "w") : NULL;
  if (!rc && (!f || fprintf(f, "%s\n", text) < 0)) rc = ct_set_error(CT_EIO, "%s: cannot write: %s", p, strerror(errno));
  if (f && fclose(f) && !rc) rc = ct_set_error(CT_EIO, "%s: cannot write: %s", p, strerror(errno));
  free(text);
  json_decref(j);
  return rc;
}

int ckpt_rewrite(const char *cmd, ct_st_dir *d, const char *in, const char *out, const char *dtype,
                 ckpt_write_fn write, void *ctx) {
  if (!ckpt_is_dir(in)) {
    fprintf(stderr, "ctune-ckpt: %s: in=%s is not a directory\n", cmd, in);
    return 2;
  }
  stream_buf b = {0};
  char tmp[CT_PATH_MAX] = "";
  if (ckpt_open_tensors(d, in, false) || ckpt_out_begin(out, tmp, sizeof tmp) || ckpt_stream_buf_init(&b) ||
      write(d, tmp, &b, ctx) || ckpt_copy_model_files(in, tmp, dtype) || ckpt_out_commit(tmp, out)) {
    fprintf(stderr, "ctune-ckpt: %s\n", ct_last_error());
    if (tmp[0]) ct_remove_tree(tmp);
    exit(1);
  }
  ckpt_stream_buf_free(&b);
  return 0;
}
