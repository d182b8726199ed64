// safetensors: an mmap reader that validates the whole header before any tensor is used
// (offsets, shapes, dtypes, coverage), a writer, and model directories with an index of
// shards. Conversion to float32 happens on read.
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "mem.h"
#include "hash.h"
#include "pool.h"

// The data section is little-endian; we copy it to memory as is.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

// ---------------------------------------------------------------------------- dtypes

static const struct {
  const char *name;
  size_t size;
} dtypes[] = {
    [CT_DT_F32] = {"F32", 4},  [CT_DT_F16] = {"F16", 2}, [CT_DT_BF16] = {"BF16", 2},
    [CT_DT_F64] = {"F64", 8},  [CT_DT_I8] = {"I8", 1},   [CT_DT_U8] = {"U8", 1},
    [CT_DT_I16] = {"I16", 2},  [CT_DT_I32] = {"I32", 4}, [CT_DT_I64] = {"I64", 8},
    [CT_DT_BOOL] = {"BOOL", 1},
};
enum { N_DTYPES = sizeof dtypes / sizeof dtypes[0] };

static int dtype_valid(ct_dtype dt) { return (unsigned)dt < N_DTYPES; }

size_t ct_dtype_size(ct_dtype dt) { return dtype_valid(dt) ? dtypes[dt].size : 0; }

const char *ct_dtype_name(ct_dtype dt) { return dtype_valid(dt) ? dtypes[dt].name : "?"; }

// Text that came from a file, made safe for a one-line message: at most 100 bytes,
// control characters shown as '?'. The struct lives until the end of the full
// expression that calls shown(), which is all a printf argument needs.
typedef struct {
  char s[112];
} shown_t;

static shown_t shown(const char *text) {
  shown_t r;
  size_t i = 0;
  for (; text[i] && i < 100; i++) r.s[i] = (unsigned char)text[i] < 0x20 ? '?' : text[i];
  if (text[i]) {
    memcpy(r.s + i, "...", 3);
    i += 3;
  }
  r.s[i] = 0;
  return r;
}

int ct_dtype_parse(const char *s, ct_dtype *out) {
  for (int i = 0; s && i < N_DTYPES; i++)
    if (strcmp(s, dtypes[i].name) == 0) {
      *out = (ct_dtype)i;
      return 0;
    }
  return ct_set_error(CT_EFORMAT, "unknown dtype '%s'", s ? shown(s).s : "(null)");
}

// ------------------------------------------------------------------------ converters

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float ct_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | man << 13);  // inf, NaN
  if (exp == 0) {                                                     // zero, subnormal
    float v = (float)man * 0x1p-24f;
    return sign ? -v : v;
  }
  return bits_f32(sign | (exp + 112) << 23 | man << 13);
}

uint16_t ct_f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((x >> 13) & 0x3ffu);  // NaN
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 (max 65504 + half ulp): inf
  if (x >= 0x38800000u) {                        // f16 normal range, >= 2^-14
    uint32_t r = x - 0x38000000u;                // rebias exponent 127 -> 15
    uint32_t h = r >> 13, rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return sign | (uint16_t)h;
  }
  // Subnormal or zero: result = round(m * 2^(e-126)) in units of 2^-24.
  uint32_t e = x >> 23;
  if (e < 102) return sign;  // below 2^-25: rounds to zero
  uint32_t m = (x & 0x7fffffu) | 0x800000u, s = 126 - e;
  uint32_t h = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
  if (rem > half || (rem == half && (h & 1u))) h++;
  return sign | (uint16_t)h;
}

// ------------------------------------------------------------------------- reading

void ct_st_close(ct_safetensors *st) {
  if (!st) return;
  if (st->map) munmap(st->map, st->file_size);
  for (int i = 0; i < st->n && st->tensors; i++) free(st->tensors[i].name);
  for (int i = 0; i < st->n_meta; i++) {
    free(st->meta_keys[i]);
    free(st->meta_vals[i]);
  }
  ct_free_all(st->tensors, st->by_name, st->meta_keys, st->meta_vals, st->path);
  memset(st, 0, sizeof *st);
  st->fd = -1;
}

static void fmt_shape(const int64_t *shape, int ndim, char *buf, size_t cap) {
  size_t k = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < ndim && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
}

// Non-negative JSON integer, or -1.
static int64_t json_nonneg(const json_t *v) {
  if (!json_is_integer(v)) return -1;
  json_int_t x = json_integer_value(v);
  return x < 0 ? -1 : (int64_t)x;
}

// Fills `t` from one header entry and checks it against itself and the data size.
static int parse_tensor(const ct_safetensors *st, const char *name, json_t *v,
                        ct_st_tensor *t) {
  const char *p = st->path;
  if (!json_is_object(v))
    return ct_set_error(CT_EFORMAT, "%s: tensor '%s': header entry is not a JSON object", p,
                        shown(name).s);
  json_t *dt = json_object_get(v, "dtype");
  if (!dt) return ct_set_error(CT_EFORMAT, "%s: tensor '%s': no dtype", p, shown(name).s);
  if (!json_is_string(dt) || ct_dtype_parse(json_string_value(dt), &t->dtype) != 0)
    return ct_set_error(CT_EFORMAT, "%s: tensor '%s': unknown dtype %s (ctune reads %s)", p,
                        shown(name).s,
                        json_is_string(dt) ? shown(json_string_value(dt)).s : "(not a string)",
                        "F32 F16 BF16 F64 I8 U8 I16 I32 I64 BOOL");

  json_t *sh = json_object_get(v, "shape");
  if (!sh) return ct_set_error(CT_EFORMAT, "%s: tensor '%s': no shape", p, shown(name).s);
  if (!json_is_array(sh))
    return ct_set_error(CT_EFORMAT, "%s: tensor '%s': shape is not a list", p, shown(name).s);
  if (json_array_size(sh) > CT_ST_MAX_DIMS)
    return ct_set_error(CT_EFORMAT, "%s: tensor '%s': shape has %zu dimensions, more than %d",
                        p, shown(name).s, json_array_size(sh), CT_ST_MAX_DIMS);
  t->ndim = (int)json_array_size(sh);
  int zero = 0;
  for (int i = 0; i < t->ndim; i++) {
    t->shape[i] = json_nonneg(json_array_get(sh, (size_t)i));
    if (t->shape[i] < 0)
      return ct_set_error(CT_EFORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                          p, shown(name).s, i);
    zero |= t->shape[i] == 0;
  }
  char shape_s[256];
  fmt_shape(t->shape, t->ndim, shape_s, sizeof shape_s);
  // numel * dtype size must fit in int64 (a zero dimension makes any shape fit).
  int64_t numel = 1, size = (int64_t)ct_dtype_size(t->dtype);
  for (int i = 0; i < t->ndim && !zero; i++) {
    if (numel > INT64_MAX / t->shape[i])
      goto overflow;
    numel *= t->shape[i];
  }
  if (zero) numel = 0;
  if (numel > INT64_MAX / size) goto overflow;
  t->numel = numel;
  uint64_t nbytes = (uint64_t)(numel * size);

  json_t *off = json_object_get(v, "data_offsets");
  if (!off) return ct_set_error(CT_EFORMAT, "%s: tensor '%s': no data_offsets", p, shown(name).s);
  int64_t b = json_nonneg(json_array_get(off, 0)), e = json_nonneg(json_array_get(off, 1));
  if (!json_is_array(off) || json_array_size(off) != 2 || b < 0 || e < 0)
    return ct_set_error(CT_EFORMAT,
                        "%s: tensor '%s': data_offsets is not a list of two non-negative integers",
                        p, shown(name).s);
  if (b > e)
    return ct_set_error(CT_EFORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] end before they begin",
                        p, shown(name).s, (long long)b, (long long)e);
  t->begin = (uint64_t)b;
  t->end = (uint64_t)e;
  if (t->end > st->data_size)
    return ct_set_error(CT_EFORMAT,
                        "%s: tensor '%s': data_offsets [%lld, %lld] run past the %zu-byte data section",
                        p, shown(name).s, (long long)b, (long long)e, st->data_size);
  if (t->end - t->begin != nbytes)
    return ct_set_error(CT_EFORMAT,
                        "%s: tensor '%s': data_offsets [%lld, %lld] hold %lld bytes but shape %s of %s needs %llu",
                        p, shown(name).s, (long long)b, (long long)e, (long long)(e - b), shape_s,
                        ct_dtype_name(t->dtype), (unsigned long long)nbytes);
  return 0;
overflow:
  return ct_set_error(CT_EFORMAT, "%s: tensor '%s': shape %s of %s is too large (byte count overflows)",
                      p, shown(name).s, shape_s, ct_dtype_name(t->dtype));
}

static int parse_meta(ct_safetensors *st, json_t *m) {
  if (json_is_null(m)) return 0;  // the reference reads null as "no metadata"
  if (!json_is_object(m))
    return ct_set_error(CT_EFORMAT, "%s: __metadata__ is not an object of strings", st->path);
  size_t cnt = json_object_size(m);
  st->meta_keys = calloc(cnt ? cnt : 1, sizeof *st->meta_keys);
  st->meta_vals = calloc(cnt ? cnt : 1, sizeof *st->meta_vals);
  if (!st->meta_keys || !st->meta_vals) return ct_set_error(CT_ENOMEM, "%s: out of memory", st->path);
  const char *k;
  json_t *v;
  json_object_foreach(m, k, v) {
    if (!json_is_string(v))
      return ct_set_error(CT_EFORMAT, "%s: __metadata__ value of '%s' is not a string", st->path,
                          shown(k).s);
    char *ks = strdup(k), *vs = strdup(json_string_value(v));
    if (!ks || !vs) {
      free(ks);
      free(vs);
      return ct_set_error(CT_ENOMEM, "%s: out of memory", st->path);
    }
    st->meta_keys[st->n_meta] = ks;
    st->meta_vals[st->n_meta++] = vs;
  }
  return 0;
}

static int cmp_offsets(const void *a, const void *b) {
  const ct_st_tensor *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int cmp_by_name(const void *a, const void *b) {
  return strcmp((*(ct_st_tensor *const *)a)->name, (*(ct_st_tensor *const *)b)->name);
}

// Sorted by offsets, the tensors must tile [0, data_size) exactly, as the reference
// requires: no overlaps, no holes, no trailing bytes.
static int check_tiling(const ct_safetensors *st) {
  uint64_t pos = 0;
  for (int i = 0; i < st->n; i++) {
    const ct_st_tensor *t = &st->tensors[i];
    if (t->begin < pos)
      return ct_set_error(CT_EFORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s'",
                          st->path, shown(t->name).s, (unsigned long long)t->begin,
                          (unsigned long long)t->end, shown(st->tensors[i - 1].name).s);
    if (t->begin > pos)
      return ct_set_error(CT_EFORMAT,
                          "%s: tensor '%s': data_offsets [%llu, %llu] leave a hole: bytes [%llu, %llu) of the data section belong to no tensor",
                          st->path, shown(t->name).s, (unsigned long long)t->begin,
                          (unsigned long long)t->end, (unsigned long long)pos,
                          (unsigned long long)t->begin);
    pos = t->end;
  }
  if (pos != st->data_size)
    return ct_set_error(CT_EFORMAT,
                        "%s: tensors cover %llu bytes but the data section holds %zu: %zu trailing bytes belong to no tensor",
                        st->path, (unsigned long long)pos, st->data_size,
                        st->data_size - (size_t)pos);
  return 0;
}

// Before the parse: the header's objects (a tensor entry is one, as are the whole and
// __metadata__) and its commas (a tensor entry has ~5-12) bound the tensors and the JSON
// values the parser would build. Strings holding '{' or ',' only make the counts larger.
static int count_entries(const ct_safetensors *st, size_t hn) {
  size_t objects = 0, commas = 0;
  for (const uint8_t *c = st->map + 8, *end = c + hn; c < end; c++) {
    objects += *c == '{';
    commas += *c == ',';
  }
  if (objects > CT_ST_MAX_TENSORS + 2)
    return ct_set_error(CT_EFORMAT, "%s: header lists %zu entries, over the limit of %d tensors a file",
                        st->path, objects - 1, CT_ST_MAX_TENSORS);
  if (commas > 16 * (size_t)CT_ST_MAX_TENSORS)
    return ct_set_error(CT_EFORMAT, "%s: header holds %zu list and object items, over the %d that %d "
                        "tensors can take", st->path, commas + 1, 16 * CT_ST_MAX_TENSORS, CT_ST_MAX_TENSORS);
  return 0;
}

static int parse_header(ct_safetensors *st) {
  const char *p = st->path;
  uint64_t hn = 0;
  for (int i = 7; i >= 0; i--) hn = hn << 8 | st->map[i];
  if (hn > CT_ST_MAX_HEADER)
    return ct_set_error(CT_EFORMAT, "%s: header length %llu is over the %d-byte limit (a real header takes "
                        "~150 bytes a tensor; not a safetensors file?)", p, (unsigned long long)hn, CT_ST_MAX_HEADER);
  if (hn > st->file_size - 8)
    return ct_set_error(CT_EFORMAT, "%s: header length %llu runs past the end of the %zu-byte file (truncated?)",
                        p, (unsigned long long)hn, st->file_size);
  if (hn == 0 || st->map[8] != '{')
    return ct_set_error(CT_EFORMAT, "%s: header does not start with '{'", p);
  st->data = st->map + 8 + hn;
  st->data_size = st->file_size - 8 - (size_t)hn;
  int rc = count_entries(st, (size_t)hn);
  if (rc) return rc;

  json_error_t je;
  json_t *root = json_loadb((const char *)st->map + 8, (size_t)hn, JSON_REJECT_DUPLICATES, &je);
  if (!root) {
    if (json_error_code(&je) == json_error_duplicate_key)
      return ct_set_error(CT_EFORMAT, "%s: header lists a key twice: %s", p, shown(je.text).s);
    return ct_set_error(CT_EFORMAT, "%s: header is not valid JSON: %s (column %d)", p,
                        shown(je.text).s, je.column);
  }
  if (!json_is_object(root)) {
    rc = ct_set_error(CT_EFORMAT, "%s: header is not a JSON object", p);
    goto out;
  }
  size_t cnt = json_object_size(root);
  if (cnt > CT_ST_MAX_TENSORS + (size_t)(json_object_get(root, "__metadata__") != NULL)) {
    rc = ct_set_error(CT_EFORMAT, "%s: header lists %zu entries, over the limit of %d tensors a file", p, cnt,
                      CT_ST_MAX_TENSORS);
    goto out;
  }
  st->tensors = calloc(cnt ? cnt : 1, sizeof *st->tensors);
  st->by_name = calloc(cnt ? cnt : 1, sizeof *st->by_name);
  if (!st->tensors || !st->by_name) {
    rc = ct_set_error(CT_ENOMEM, "%s: out of memory for %zu tensors", p, cnt);
    goto out;
  }
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    if (strcmp(key, "__metadata__") == 0) {
      if ((rc = parse_meta(st, v))) goto out;
      continue;
    }
    ct_st_tensor *t = &st->tensors[st->n];
    if (!(t->name = strdup(key))) {
      rc = ct_set_error(CT_ENOMEM, "%s: out of memory", p);
      goto out;
    }
    st->n++;
    if ((rc = parse_tensor(st, key, v, t))) goto out;
  }
  qsort(st->tensors, (size_t)st->n, sizeof *st->tensors, cmp_offsets);
  if ((rc = check_tiling(st))) goto out;
  for (int i = 0; i < st->n; i++) st->by_name[i] = &st->tensors[i];
  qsort(st->by_name, (size_t)st->n, sizeof *st->by_name, cmp_by_name);
out:
  json_decref(root);
  return rc;
}

int ct_st_open(ct_safetensors *st, const char *path) {
  memset(st, 0, sizeof *st);
  st->fd = -1;
  if (!path) return ct_set_error(CT_EINVAL, "ct_st_open: path is NULL");
  if (!(st->path = strdup(path))) return ct_set_error(CT_ENOMEM, "%s: out of memory", path);
  int rc, fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block
  if (fd < 0) {
    rc = ct_set_error(CT_EIO, "%s: cannot open: %s", path, strerror(errno));
    goto fail;
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    rc = ct_set_error(CT_EIO, "%s: not a regular file", path);
    close(fd);
    goto fail;
  }
  if (sb.st_size < 8) {
    rc = ct_set_error(CT_EFORMAT, "%s: file is %lld bytes, too short for the 8-byte header length",
                      path, (long long)sb.st_size);
    close(fd);
    goto fail;
  }
  void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  close(fd);  // the mapping stays valid
  if (map == MAP_FAILED) {
    rc = ct_set_error(CT_EIO, "%s: cannot mmap: %s", path, strerror(map_errno));
    goto fail;
  }
  st->map = map;
  st->file_size = (size_t)sb.st_size;
  if ((rc = parse_header(st))) goto fail;
  return 0;
fail:
  ct_st_close(st);
  return rc;
}

static int cmp_name_key(const void *key, const void *elem) {
  return strcmp(key, (*(ct_st_tensor *const *)elem)->name);
}

const ct_st_tensor *ct_st_find(const ct_safetensors *st, const char *name) {
  if (!st || !name || st->n == 0) return NULL;
  ct_st_tensor **hit = bsearch(name, st->by_name, (size_t)st->n, sizeof *st->by_name, cmp_name_key);
  return hit ? *hit : NULL;
}

const char *ct_st_meta(const ct_safetensors *st, const char *key) {
  for (int i = 0; st && key && i < st->n_meta; i++)
    if (strcmp(st->meta_keys[i], key) == 0) return st->meta_vals[i];
  return NULL;
}

const void *ct_st_data(const ct_safetensors *st, const ct_st_tensor *t) {
  return st->data + t->begin;
}

// Rounds to nearest like a cast, but defined for values beyond FLT_MAX.
static float f64_to_f32(double d) {
  if (d > FLT_MAX) return d < 0x1.ffffffp127 ? FLT_MAX : INFINITY;
  if (d < -FLT_MAX) return d > -0x1.ffffffp127 ? -FLT_MAX : -INFINITY;
  return (float)d;
}

// Conversion of one tensor to float32, in parts (the pool's threads for big tensors).
typedef struct {
  const uint8_t *src;
  float *dst;
  ct_dtype dtype;
} convert_job;

static void convert_range(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const convert_job *j = ctx;
  const uint8_t *src = j->src;
  float *dst = j->dst;
  switch (j->dtype) {
    case CT_DT_F32:
      memcpy(dst + lo, src + 4 * lo, (size_t)(hi - lo) * 4);
      break;
    case CT_DT_BF16:
      for (long i = lo; i < hi; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        dst[i] = ct_bf16_to_f32(h);
      }
      break;
    case CT_DT_F16:
      for (long i = lo; i < hi; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        dst[i] = ct_f16_to_f32(h);
      }
      break;
    default:  // F64
      for (long i = lo; i < hi; i++) {
        double d;
        memcpy(&d, src + 8 * i, 8);
        dst[i] = f64_to_f32(d);
      }
  }
}

int ct_st_read_f32(const ct_safetensors *st, const ct_st_tensor *t, float *dst, int64_t n) {
  if (!st || !t) return ct_set_error(CT_EINVAL, "ct_st_read_f32: NULL file or tensor");
  if (n != t->numel) {
    char shape_s[256];
    fmt_shape(t->shape, t->ndim, shape_s, sizeof shape_s);
    return ct_set_error(CT_EINVAL, "%s: tensor '%s': destination holds %lld floats but shape %s has %lld elements",
                        st->path, shown(t->name).s, (long long)n, shape_s, (long long)t->numel);
  }
  // the whole tensor is a range of it; its pages are dropped from this mapping once read,
  // so that a model being loaded does not count twice in the resident memory
  return ct_st_read_f32_range(st, t, 0, n, dst);
}

int ct_st_read_f32_range(const ct_safetensors *st, const ct_st_tensor *t, int64_t i0, int64_t n, float *dst) {
  if (!st || !t || (!dst && n > 0)) return ct_set_error(CT_EINVAL, "ct_st_read_f32_range: NULL argument");
  if (t->begin > t->end || t->end > st->data_size)
    return ct_set_error(CT_EINVAL, "%s: tensor '%s' does not belong to this file", st->path, shown(t->name).s);
  if (i0 < 0 || n < 0 || i0 > t->numel || n > t->numel - i0)
    return ct_set_error(CT_EINVAL, "%s: tensor '%s': elements [%lld, %lld) are outside its %lld", st->path,
                        shown(t->name).s, (long long)i0, (long long)(i0 + n), (long long)t->numel);
  if (t->dtype != CT_DT_F32 && t->dtype != CT_DT_BF16 && t->dtype != CT_DT_F16 && t->dtype != CT_DT_F64)
    return ct_set_error(CT_EFORMAT, "%s: tensor '%s' is %s, not a floating-point dtype (F32, F16, BF16, F64)",
                        st->path, shown(t->name).s, ct_dtype_name(t->dtype));
  size_t es = ct_dtype_size(t->dtype);
  const uint8_t *src = st->data + t->begin + (uint64_t)i0 * es;
  convert_job j = {src, dst, t->dtype};
  if (n < (1 << 18)) convert_range(&j, 0, n, 0);
  else ct_parallel_ranges(n, 64, ct_pool_threads() * 2, convert_range, &j);
  ct_st_drop(src, (size_t)n * es);
  return 0;
}

void ct_st_drop(const void *p, size_t len) {
  // Rounded outward: the mapping is read-only and private, so a dropped page that is
  // read again (a neighbour's bytes, the header) is simply read from the file again.
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)p & ~(page - 1);
  uintptr_t hi = ((uintptr_t)p + len + page - 1) & ~(page - 1);
  if (len && hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

// ------------------------------------------------------------------------- writing

// write(2) until done; 0 or an errno value.
static int write_all(int fd, const void *buf, size_t n) {
  const uint8_t *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

// Checks one entry and returns its byte count in *nbytes.
static int check_entry(const char *path, const ct_st_entry *e, int i, uint64_t *nbytes) {
  shown_t shown_name = shown(e->name ? e->name : "(null)");
  const char *nm = shown_name.s;
  if (!e->name || strcmp(e->name, "__metadata__") == 0)
    return ct_set_error(CT_EINVAL, "%s: entry %d: tensor name %s is not allowed", path, i, nm);
  if (!dtype_valid(e->dtype))
    return ct_set_error(CT_EINVAL, "%s: tensor '%s': invalid dtype %d", path, nm, (int)e->dtype);
  if (e->ndim < 0 || e->ndim > CT_ST_MAX_DIMS)
    return ct_set_error(CT_EINVAL, "%s: tensor '%s': ndim %d is not in [0, %d]", path, nm,
                        e->ndim, CT_ST_MAX_DIMS);
  int64_t numel = 1, size = (int64_t)dtypes[e->dtype].size;
  for (int d = 0; d < e->ndim; d++)
    if (e->shape[d] < 0)
      return ct_set_error(CT_EINVAL, "%s: tensor '%s': shape[%d] = %lld is negative", path, nm, d,
                          (long long)e->shape[d]);
  for (int d = 0; d < e->ndim && numel; d++) {
    if (e->shape[d] && numel > INT64_MAX / e->shape[d])
      return ct_set_error(CT_EINVAL, "%s: tensor '%s': shape is too large", path, nm);
    numel *= e->shape[d];
  }
  if (numel > INT64_MAX / size || (uint64_t)(numel * size) > SIZE_MAX)
    return ct_set_error(CT_EINVAL, "%s: tensor '%s': shape is too large", path, nm);
  if (e->data_f32 && e->dtype != CT_DT_F32 && e->dtype != CT_DT_F16 && e->dtype != CT_DT_BF16)
    return ct_set_error(CT_EINVAL, "%s: tensor '%s': float32 source can only be written as F32, F16 or BF16, not %s",
                        path, nm, ct_dtype_name(e->dtype));
  if (!e->data_f32 && !e->data && numel > 0)
    return ct_set_error(CT_EINVAL, "%s: tensor '%s': no data", path, nm);
  *nbytes = (uint64_t)(numel * size);
  return 0;
}

// The compact JSON header, padded with spaces to a multiple of 8; NULL on error.
static char *build_header(const char *path, const ct_st_entry *e, int n,
                          const char *const *mk, const char *const *mv, int n_meta,
                          size_t *len, int *rc) {
  json_t *root = json_object(), *meta = NULL;
  char *js = NULL, *out = NULL;
  *rc = CT_ENOMEM;
  if (!root) goto nomem;
  if (n_meta > 0) {
    if (!(meta = json_object()) || json_object_set_new(root, "__metadata__", meta)) goto nomem;
    for (int i = 0; i < n_meta; i++) {
      if (!mk || !mv || !mk[i] || !mv[i]) {
        *rc = ct_set_error(CT_EINVAL, "%s: metadata entry %d: NULL key or value", path, i);
        goto fail;
      }
      if (json_object_get(meta, mk[i])) {
        *rc = ct_set_error(CT_EINVAL, "%s: metadata key '%s' given twice", path, shown(mk[i]).s);
        goto fail;
      }
      if (json_object_set_new(meta, mk[i], json_string(mv[i]))) {
        *rc = ct_set_error(CT_EINVAL, "%s: metadata key '%s': key or value is not valid UTF-8",
                           path, shown(mk[i]).s);
        goto fail;
      }
    }
  }
  if (n > CT_ST_MAX_TENSORS) {
    *rc = ct_set_error(CT_EINVAL, "%s: %d tensors, over the limit of %d a file", path, n, CT_ST_MAX_TENSORS);
    goto fail;
  }
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    uint64_t nb;
    if ((*rc = check_entry(path, &e[i], i, &nb))) goto fail;
    if (json_object_get(root, e[i].name)) {
      *rc = ct_set_error(CT_EINVAL, "%s: tensor '%s' given twice", path, shown(e[i].name).s);
      goto fail;
    }
    if (off + nb > (uint64_t)INT64_MAX) {
      *rc = ct_set_error(CT_EINVAL, "%s: tensor '%s': file would be too large", path,
                         shown(e[i].name).s);
      goto fail;
    }
    json_t *t = json_object(), *shape = json_array(), *offs = json_array();
    if (t) {  // t takes the arrays (and frees them with itself) even if one is NULL
      json_object_set_new(t, "dtype", json_string(ct_dtype_name(e[i].dtype)));
      json_object_set_new(t, "shape", shape);
      json_object_set_new(t, "data_offsets", offs);
    } else {
      json_decref(shape);
      json_decref(offs);
    }
    if (!t || !shape || !offs || json_object_size(t) != 3) {
      json_decref(t);
      goto nomem;
    }
    for (int d = 0; d < e[i].ndim; d++)
      if (json_array_append_new(shape, json_integer(e[i].shape[d]))) {
        json_decref(t);
        goto nomem;
      }
    if (json_array_append_new(offs, json_integer((json_int_t)off)) ||
        json_array_append_new(offs, json_integer((json_int_t)(off + nb)))) {
      json_decref(t);
      goto nomem;
    }
    if (json_object_set_new(root, e[i].name, t)) {
      *rc = ct_set_error(CT_EINVAL, "%s: entry %d: tensor name is not valid UTF-8", path, i);
      goto fail;
    }
    off += nb;
  }
  if (!(js = json_dumps(root, JSON_COMPACT))) goto nomem;
  size_t jl = strlen(js), pl = (jl + 7) / 8 * 8;
  if (pl > CT_ST_MAX_HEADER) {
    *rc = ct_set_error(CT_EINVAL, "%s: header would be %zu bytes, over the %d-byte limit", path,
                       pl, CT_ST_MAX_HEADER);
    goto fail;
  }
  if (!(out = malloc(pl + 1))) goto nomem;
  memcpy(out, js, jl);
  memset(out + jl, ' ', pl - jl);
  out[pl] = 0;
  *len = pl;
  *rc = 0;
  goto fail;  // free the temporaries
nomem:
  *rc = ct_set_error(CT_ENOMEM, "%s: out of memory building the header", path);
fail:
  free(js);
  json_decref(root);
  return *rc ? NULL : out;
}

int ct_st_writer_open(ct_st_writer *w, const char *path, const ct_st_entry *e, int n,
                      const char *const *meta_keys, const char *const *meta_vals, int n_meta) {
  memset(w, 0, sizeof *w);
  w->fd = -1;
  if (!path) return ct_set_error(CT_EINVAL, "ct_st_write: path is NULL");
  if (n < 0 || (n > 0 && !e) || n_meta < 0)
    return ct_set_error(CT_EINVAL, "%s: bad tensor list (n = %d, n_meta = %d)", path, n, n_meta);
  int rc;
  size_t hlen;
  char *header = build_header(path, e, n, meta_keys, meta_vals, n_meta, &hlen, &rc);
  if (!header) return rc;
  for (int i = 0; i < n; i++) {
    uint64_t nb = 0;
    check_entry(path, &e[i], i, &nb);  // checked in build_header
    w->left += nb;
  }
  if (!(w->path = strdup(path))) {
    free(header);
    return ct_set_error(CT_ENOMEM, "%s: out of memory", path);
  }
  w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd < 0) {
    rc = ct_set_error(CT_EIO, "%s: cannot create: %s", path, strerror(errno));
    free(header);
    free(w->path);
    w->path = NULL;
    return rc;
  }
  struct stat sb;
  w->regular = fstat(w->fd, &sb) == 0 && S_ISREG(sb.st_mode);
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
  w->err = write_all(w->fd, len8, 8);
  if (!w->err) w->err = write_all(w->fd, header, hlen);
  free(header);
  return w->err ? ct_st_writer_close(w) : 0;
}

int ct_st_writer_put(ct_st_writer *w, const void *data, size_t len) {
  if (w->err) return CT_EIO;
  if (len > w->left) {
    w->err = EINVAL;
    return ct_set_error(CT_EINVAL, "%s: %zu bytes more than the header's tensors hold", w->path, len - (size_t)w->left);
  }
  w->left -= len;
  if (len && (w->err = write_all(w->fd, data, len)))
    return ct_set_error(CT_EIO, "%s: write failed: %s", w->path, strerror(w->err));
  return 0;
}

int ct_st_writer_close(ct_st_writer *w) {
  if (w->fd < 0) return 0;
  int err = w->err;
  const char *what = "write";
  if (!err && w->left) {
    close(w->fd);
    if (w->regular) unlink(w->path);
    int rc = ct_set_error(CT_EINVAL, "%s: %llu bytes of tensor data missing", w->path, (unsigned long long)w->left);
    free(w->path);
    memset(w, 0, sizeof *w);
    w->fd = -1;
    return rc;
  }
  // fsync is meaningless on a pipe or device (EINVAL); only a regular file must reach disk.
  if (!err && fsync(w->fd) != 0 && (w->regular || (errno != EINVAL && errno != EROFS))) {
    err = errno;
    what = "fsync";
  }
  if (close(w->fd) != 0 && !err) {
    err = errno;
    what = "close";
  }
  int rc = 0;
  if (err) {
    rc = ct_set_error(CT_EIO, "%s: %s failed: %s", w->path, what, strerror(err));
    if (w->regular) unlink(w->path);
  }
  free(w->path);
  memset(w, 0, sizeof *w);
  w->fd = -1;
  return rc;
}

void ct_st_writer_abort(ct_st_writer *w) {
  if (w->fd < 0) return;
  close(w->fd);
  if (w->regular) unlink(w->path);
  free(w->path);
  memset(w, 0, sizeof *w);
  w->fd = -1;
}

// Puts one entry's data, converting float32 through a bounded buffer.
static int write_entry(ct_st_writer *w, const ct_st_entry *e, uint64_t nbytes, uint8_t *buf, size_t cap) {
  if (!e->data_f32 || e->dtype == CT_DT_F32)
    return nbytes ? ct_st_writer_put(w, e->data_f32 ? (const void *)e->data_f32 : e->data, nbytes) : 0;
  size_t numel = (size_t)nbytes / 2, per = cap / 2;
  for (size_t i = 0; i < numel; i += per) {
    size_t k = numel - i < per ? numel - i : per;
    uint16_t *out = (uint16_t *)(void *)buf;  // (k) malloc'd, so aligned
    const float *in = e->data_f32 + i;
    if (e->dtype == CT_DT_BF16)
      for (size_t j = 0; j < k; j++) out[j] = ct_f32_to_bf16(in[j]);
    else
      for (size_t j = 0; j < k; j++) out[j] = ct_f32_to_f16(in[j]);
    int rc = ct_st_writer_put(w, buf, 2 * k);
    if (rc) return rc;
  }
  return 0;
}

int ct_st_write(const char *path, const ct_st_entry *e, int n, const char *const *meta_keys,
                const char *const *meta_vals, int n_meta) {
  enum { CAP = 1 << 16 };
  uint8_t *buf = malloc(CAP);
  if (!buf) return ct_set_error(CT_ENOMEM, "%s: out of memory", path ? path : "ct_st_write");
  ct_st_writer w;
  int rc = ct_st_writer_open(&w, path, e, n, meta_keys, meta_vals, n_meta);
  for (int i = 0; i < n && !rc; i++) {
    uint64_t nb = 0;
    check_entry(path, &e[i], i, &nb);  // checked in build_header
    rc = write_entry(&w, &e[i], nb, buf, CAP);
  }
  if (rc) ct_st_writer_abort(&w);  // (removes the file; the message stays)
  else rc = ct_st_writer_close(&w);
  free(buf);
  return rc;
}

// ----------------------------------------------------------------------- checksummed files

// XXH64 of the bytes of n tensors, chained in order (ct_xxh64_blocks).
static uint64_t chain_bytes(uint64_t h, const void *p, size_t n) { return ct_xxh64_blocks(p, n, h); }

int ct_st_write_checked(const char *path, const ct_st_entry *e, int n, const char *const *meta_keys,
                        const char *const *meta_vals, int n_meta) {
  uint64_t h = 0;
  for (int i = 0; i < n; i++) {
    uint64_t nb = 0;
    int rc = check_entry(path, &e[i], i, &nb);
    if (rc) return rc;
    const void *raw = e[i].data ? e[i].data : e[i].dtype == CT_DT_F32 ? (const void *)e[i].data_f32 : NULL;
    if (!raw && nb)
      return ct_set_error(CT_EINVAL, "%s: tensor '%s': a checksummed file takes raw bytes or F32", path, e[i].name);
    h = chain_bytes(h, raw, nb);
  }
  const char *keys[n_meta + 1], *vals[n_meta + 1];
  char hex[20];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  for (int i = 0; i < n_meta; i++) keys[i] = meta_keys[i], vals[i] = meta_vals[i];
  keys[n_meta] = CT_ST_CHECKSUM_KEY;
  vals[n_meta] = hex;
  return ct_st_write(path, e, n, keys, vals, n_meta + 1);
}

int ct_st_check_content(const ct_safetensors *st, uint64_t *sum) {
  uint64_t h = 0, want;
  for (int i = 0; i < st->n; i++)  // (data order: the order they were written in)
    h = chain_bytes(h, st->data + st->tensors[i].begin, st->tensors[i].end - st->tensors[i].begin);
  const char *v = ct_st_meta(st, CT_ST_CHECKSUM_KEY);
  char *end = NULL;
  if (!v || strlen(v) != 16 || (want = strtoull(v, &end, 16), *end))
    return ct_set_error(CT_EFORMAT, "%s: no checksum of its contents (__metadata__ '%s'): written by an older "
                        "ctune or damaged", st->path, CT_ST_CHECKSUM_KEY);
  if (want != h)
    return ct_set_error(CT_EFORMAT, "%s: its contents changed since it was written (xxh64 %016llx, recorded "
                        "%s): the file is damaged", st->path, (unsigned long long)h, v);
  if (sum) *sum = h;
  return 0;
}

// ----------------------------------------------------------------------- directory

void ct_st_dir_close(ct_st_dir *d) {
  if (!d) return;
  for (int i = 0; i < d->n_files && d->files; i++) ct_st_close(&d->files[i]);
  free(d->files);
  free(d->entries);
  free(d->path);
  memset(d, 0, sizeof *d);
}

static char *join(const char *dir, const char *name) {
  size_t dl = strlen(dir), nl = strlen(name);
  int slash = dl > 0 && dir[dl - 1] != '/';
  char *s = malloc(dl + slash + nl + 1);
  if (!s) return NULL;
  memcpy(s, dir, dl);
  if (slash) s[dl] = '/';
  memcpy(s + dl + slash, name, nl + 1);
  return s;
}

static int cmp_entry(const void *a, const void *b) {
  return strcmp(((const ct_st_dir_entry *)a)->name, ((const ct_st_dir_entry *)b)->name);
}

static int cmp_entry_key(const void *key, const void *elem) {
  return strcmp(key, ((const ct_st_dir_entry *)elem)->name);
}

static int dir_open_single(ct_st_dir *d, const char *file) {
  if (!(d->files = calloc(1, sizeof *d->files)))
    return ct_set_error(CT_ENOMEM, "%s: out of memory", file);
  int rc = ct_st_open(&d->files[0], file);
  if (rc) return rc;
  d->n_files = 1;
  const ct_safetensors *st = &d->files[0];
  if (!(d->entries = calloc(st->n ? (size_t)st->n : 1, sizeof *d->entries)))
    return ct_set_error(CT_ENOMEM, "%s: out of memory", file);
  for (int i = 0; i < st->n; i++)
    d->entries[i] = (ct_st_dir_entry){st->tensors[i].name, 0, &st->tensors[i]};
  d->n = st->n;
  return 0;
}

static int dir_open_index(ct_st_dir *d, const char *index) {
  json_error_t je;
  json_t *root = json_load_file(index, JSON_REJECT_DUPLICATES, &je), *shards = NULL;
  if (!root) {
    if (json_error_code(&je) == json_error_cannot_open_file)
      return ct_set_error(CT_EIO, "%s: cannot open: %s", index, shown(je.text).s);
    return ct_set_error(CT_EFORMAT, "%s:%d: not valid JSON: %s", index, je.line, shown(je.text).s);
  }
  int rc = 0;
  json_t *wm = json_object_get(root, "weight_map");
  if (!json_is_object(root) || !json_is_object(wm)) {
    rc = ct_set_error(CT_EFORMAT, "%s: no \"weight_map\" object", index);
    goto out;
  }
  // Shard file name -> index into d->files, in order of first mention.
  if (!(shards = json_object())) goto nomem;
  const char *name;
  json_t *v;
  json_object_foreach(wm, name, v) {
    const char *f = json_string_value(v);
    if (!f) {
      rc = ct_set_error(CT_EFORMAT, "%s: weight_map entry for tensor '%s' is not a string", index,
                        shown(name).s);
      goto out;
    }
    if (!*f || strchr(f, '/') || strcmp(f, ".") == 0 || strcmp(f, "..") == 0) {
      rc = ct_set_error(CT_EFORMAT, "%s: tensor '%s': shard '%s' is not a file name in this directory",
                        index, shown(name).s, shown(f).s);
      goto out;
    }
    if (!json_object_get(shards, f) &&
        json_object_set_new(shards, f, json_integer((json_int_t)json_object_size(shards))))
      goto nomem;
  }
  size_t nf = json_object_size(shards), nt = json_object_size(wm);
  d->files = calloc(nf ? nf : 1, sizeof *d->files);
  d->entries = calloc(nt ? nt : 1, sizeof *d->entries);
  if (!d->files || !d->entries) goto nomem;
  json_object_foreach(shards, name, v) {
    char *file = join(d->path, name);
    if (!file) goto nomem;
    rc = ct_st_open(&d->files[d->n_files], file);
    free(file);
    if (rc) {
      rc = ct_wrap_error(rc, "%s", index);
      goto out;
    }
    d->n_files++;
  }
  json_object_foreach(wm, name, v) {
    int k = (int)json_integer_value(json_object_get(shards, json_string_value(v)));
    const ct_st_tensor *t = ct_st_find(&d->files[k], name);
    if (!t) {
      rc = ct_set_error(CT_EFORMAT, "%s: tensor '%s' is mapped to %s, which has no such tensor",
                        index, shown(name).s, d->files[k].path);
      goto out;
    }
    d->entries[d->n++] = (ct_st_dir_entry){t->name, k, t};
  }
  goto out;
nomem:
  rc = ct_set_error(CT_ENOMEM, "%s: out of memory", index);
out:
  json_decref(shards);
  json_decref(root);
  return rc;
}

int ct_st_dir_open(ct_st_dir *d, const char *dir) {
  memset(d, 0, sizeof *d);
  if (!dir) return ct_set_error(CT_EINVAL, "ct_st_dir_open: dir is NULL");
  char *single = join(dir, "model.safetensors"), *index = join(dir, "model.safetensors.index.json");
  d->path = strdup(dir);
  int rc;
  if (!single || !index || !d->path)
    rc = ct_set_error(CT_ENOMEM, "%s: out of memory", dir);
  else if (access(single, F_OK) == 0)  // as transformers: the single file wins over an index
    rc = dir_open_single(d, single);
  else if (access(index, F_OK) == 0)
    rc = dir_open_index(d, index);
  else
    rc = ct_set_error(CT_EIO, "%s: no model.safetensors or model.safetensors.index.json", dir);
  free(single);
  free(index);
  if (rc) {
    ct_st_dir_close(d);
    return rc;
  }
  qsort(d->entries, (size_t)d->n, sizeof *d->entries, cmp_entry);
  return 0;
}

int ct_st_dir_open_file(ct_st_dir *d, const char *file) {
  memset(d, 0, sizeof *d);
  if (!file) return ct_set_error(CT_EINVAL, "ct_st_dir_open_file: file is NULL");
  const char *slash = strrchr(file, '/');
  d->path = slash ? strndup(file, (size_t)(slash - file)) : strdup(".");
  int rc = d->path ? dir_open_single(d, file) : ct_set_error(CT_ENOMEM, "%s: out of memory", file);
  if (rc) {
    ct_st_dir_close(d);
    return rc;
  }
  qsort(d->entries, (size_t)d->n, sizeof *d->entries, cmp_entry);
  return 0;
}

int ct_st_dir_find(const ct_st_dir *d, const char *name, const ct_safetensors **st,
                   const ct_st_tensor **t) {
  const ct_st_dir_entry *hit = NULL;
  if (d && name && d->n > 0)
    hit = bsearch(name, d->entries, (size_t)d->n, sizeof *d->entries, cmp_entry_key);
  if (!hit)
    return ct_set_error(CT_EFORMAT, "%s: model has no tensor '%s'", d && d->path ? d->path : "?",
                        name ? shown(name).s : "(null)");
  if (st) *st = &d->files[hit->file];
  if (t) *t = hit->t;
  return 0;
}
