// gguf_read: the header of a GGUF file (its key/values' names, a few of their values, and
// the tensor infos), for `ctune-ckpt inspect`. Every count and length is checked against
// what the file still holds before anything is allocated or skipped, so a damaged or
// hostile header is refused in time and memory bounded by the file's size.
#include "gguf_read.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "error.h"

typedef struct {
  FILE *f;
  const char *path;
  uint64_t size, at;  // the file's size, and the reader's position
} rd;

static int short_file(const rd *r, const char *what) {
  return ct_set_error(CT_EFORMAT, "%s: GGUF header: %s runs past the end of the file (byte %llu of %llu)", r->path,
                      what, (unsigned long long)r->at, (unsigned long long)r->size);
}

static int take(rd *r, void *dst, uint64_t n, const char *what) {
  if (n > r->size - r->at) return short_file(r, what);
  if (n && fread(dst, 1, n, r->f) != n) return ct_set_error(CT_EIO, "%s: read failed", r->path);
  r->at += n;
  return 0;
}

static int skip(rd *r, uint64_t n, const char *what) {
  if (n > r->size - r->at) return short_file(r, what);
  if (fseeko(r->f, (off_t)n, SEEK_CUR)) return ct_set_error(CT_EIO, "%s: seek failed", r->path);
  r->at += n;
  return 0;
}

static int u32(rd *r, uint32_t *v, const char *what) { return take(r, v, 4, what); }
static int u64(rd *r, uint64_t *v, const char *what) { return take(r, v, 8, what); }

// A string: u64 length, bytes. Into out (NUL-terminated, truncated to cap) when out is set.
static int str(rd *r, char *out, size_t cap, const char *what) {
  uint64_t len;
  int rc = u64(r, &len, what);
  if (rc) return rc;
  if (len > r->size - r->at) return short_file(r, what);
  size_t k = out ? (len < cap - 1 ? (size_t)len : cap - 1) : 0;
  if ((rc = take(r, out, k, what)) || (rc = skip(r, len - k, what))) return rc;
  if (out) out[k] = 0;
  return 0;
}

static const int fixed_size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};  // by CT_GGUF_V_* type

// Skips one value of the given type (arrays nest at most `depth` more levels).
static int skip_value(rd *r, uint32_t type, int depth, const char *key) {
  if (type == CT_GGUF_V_STR) return str(r, NULL, 0, key);
  if (type == CT_GGUF_V_ARR) {
    uint32_t et;
    uint64_t n;
    int rc;
    if ((rc = u32(r, &et, key)) || (rc = u64(r, &n, key))) return rc;
    if (et > CT_GGUF_V_F64 || depth <= 0)
      return ct_set_error(CT_EFORMAT, "%s: GGUF key '%s': array of unknown type %u", r->path, key, et);
    if (et != CT_GGUF_V_STR && et != CT_GGUF_V_ARR) {
      if (n > (r->size - r->at) / (uint64_t)fixed_size[et]) return short_file(r, key);
      return skip(r, n * (uint64_t)fixed_size[et], key);
    }
    if (n > (r->size - r->at) / 8) return short_file(r, key);  // each element is at least its u64 length
    for (uint64_t i = 0; i < n; i++)
      if ((rc = skip_value(r, et, depth - 1, key))) return rc;
    return 0;
  }
  if (type > CT_GGUF_V_F64)
    return ct_set_error(CT_EFORMAT, "%s: GGUF key '%s': unknown value type %u", r->path, key, type);
  return skip(r, (uint64_t)fixed_size[type], key);
}

// One key/value: the few that inspect shows are kept, the rest skipped.
static int read_kv(rd *r, ct_gguf_info *g) {
  char key[256];
  uint32_t type;
  int rc;
  if ((rc = str(r, key, sizeof key, "a key")) || (rc = u32(r, &type, key))) return rc;
  if (type == CT_GGUF_V_STR && !strcmp(key, "general.architecture")) return str(r, g->arch, sizeof g->arch, key);
  if (type == CT_GGUF_V_STR && !strcmp(key, "general.name")) return str(r, g->name, sizeof g->name, key);
  if (type == CT_GGUF_V_U32 && !strcmp(key, "general.file_type")) {
    g->has_file_type = true;
    return u32(r, &g->file_type, key);
  }
  if (type == CT_GGUF_V_U32 && !strcmp(key, "general.alignment")) {
    uint32_t a;
    if ((rc = u32(r, &a, key))) return rc;
    if (!a || (a & (a - 1))) return ct_set_error(CT_EFORMAT, "%s: GGUF general.alignment %u is not a power of two", r->path, a);
    g->alignment = a;
    return 0;
  }
  return skip_value(r, type, 4, key);
}

static int read_tensor(rd *r, ct_gguf_tinfo *t) {
  char name[256];
  uint32_t nd;
  int rc;
  if ((rc = str(r, name, sizeof name, "a tensor name")) || (rc = u32(r, &nd, name))) return rc;
  if (nd < 1 || nd > 4) return ct_set_error(CT_EFORMAT, "%s: GGUF tensor '%s' has %u dimensions (1-4)", r->path, name, nd);
  t->ndim = (int)nd;
  t->numel = 1;
  for (uint32_t d = 0; d < nd; d++) {
    uint64_t ne;
    if ((rc = u64(r, &ne, name))) return rc;
    if (ne > (uint64_t)1 << 40 || (ne && t->numel > ((uint64_t)1 << 50) / ne))
      return ct_set_error(CT_EFORMAT, "%s: GGUF tensor '%s': dimension %u of %llu elements is absurd", r->path, name,
                          d, (unsigned long long)ne);
    t->ne[d] = (int64_t)ne;
    t->numel *= ne;
  }
  if ((rc = u32(r, &t->type, name)) || (rc = u64(r, &t->offset, name))) return rc;
  return (t->name = strdup(name)) ? 0 : ct_set_error(CT_ENOMEM, "out of memory");
}

int ct_gguf_read_info(const char *path, ct_gguf_info *g) {
  memset(g, 0, sizeof *g);
  g->alignment = CT_GGUF_ALIGN;
  struct stat st;
  rd r = {fopen(path, "rb"), path, 0, 0};
  if (!r.f) return ct_set_error(CT_EIO, "%s: cannot open", path);
  if (fstat(fileno(r.f), &st)) {
    fclose(r.f);
    return ct_set_error(CT_EIO, "%s: cannot stat", path);
  }
  r.size = (uint64_t)st.st_size;
  char magic[4];
  uint64_t nt = 0;
  int rc = take(&r, magic, 4, "the magic");
  if (!rc && memcmp(magic, "GGUF", 4)) rc = ct_set_error(CT_EFORMAT, "%s: not a GGUF file", path);
  if (!rc) rc = u32(&r, &g->version, "the version");
  if (!rc && (g->version < 2 || g->version > 3))
    rc = ct_set_error(CT_EFORMAT, "%s: GGUF version %u (this reads 2 and 3)", path, g->version);
  if (!rc) rc = u64(&r, &nt, "the tensor count");
  if (!rc) rc = u64(&r, &g->n_kv, "the key/value count");
  // each key/value takes at least 12 bytes, each tensor info at least 28
  if (!rc && (g->n_kv > (r.size - r.at) / 12 || nt > (r.size - r.at) / 28))
    rc = ct_set_error(CT_EFORMAT, "%s: GGUF header counts %llu key/values and %llu tensors: more than the file's %llu bytes hold",
                      path, (unsigned long long)g->n_kv, (unsigned long long)nt, (unsigned long long)r.size);
  for (uint64_t i = 0; !rc && i < g->n_kv; i++) rc = read_kv(&r, g);
  if (!rc && !(g->t = calloc(nt ? nt : 1, sizeof *g->t))) rc = ct_set_error(CT_ENOMEM, "out of memory");
  for (uint64_t i = 0; !rc && i < nt; i++, g->n_tensors++) rc = read_tensor(&r, &g->t[i]);
  if (!rc) {
    g->data_offset = (r.at + g->alignment - 1) / g->alignment * g->alignment;
    g->file_size = r.size;
    for (int i = 0; !rc && i < g->n_tensors; i++)
      if (g->data_offset > r.size || g->t[i].offset > r.size - g->data_offset)
        rc = ct_set_error(CT_EFORMAT, "%s: GGUF tensor '%s' starts past the end of the file", path, g->t[i].name);
  }
  fclose(r.f);
  if (rc) ct_gguf_info_free(g);
  return rc;
}

void ct_gguf_info_free(ct_gguf_info *g) {
  for (int i = 0; i < g->n_tensors; i++) free(g->t[i].name);
  free(g->t);
  g->t = NULL;
  g->n_tensors = 0;
}

bool ct_gguf_is_file(const char *path) {
  FILE *f = fopen(path, "rb");
  char m[4] = {0};
  bool yes = f && fread(m, 1, 4, f) == 4 && !memcmp(m, "GGUF", 4);
  if (f) fclose(f);
  return yes;
}
