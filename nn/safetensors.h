// safetensors: read (mmap, fully validated) and write Hugging Face .safetensors files,
// and open a model directory (one file, or an index.json plus shards).
//
// File layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"key": "value", ...}}, then the data section, which the tensors
// must cover exactly (no holes, no overlaps, no trailing bytes), as the reference
// implementation (huggingface/safetensors) requires.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "bf16.h"

typedef enum {
  CT_DT_F32,
  CT_DT_F16,
  CT_DT_BF16,
  CT_DT_F64,
  CT_DT_I8,
  CT_DT_U8,
  CT_DT_I16,
  CT_DT_I32,
  CT_DT_I64,
  CT_DT_BOOL,
} ct_dtype;

// Bytes per element (0 for a value outside the enum).
size_t ct_dtype_size(ct_dtype dt);
// The safetensors spelling ("F32", "BF16", ...); "?" for a value outside the enum.
const char *ct_dtype_name(ct_dtype dt);
// Parses a safetensors dtype string; CT_EFORMAT (message names `s`) if unknown.
int ct_dtype_parse(const char *s, ct_dtype *out);

// Scalar converters (bfloat16's are in bf16.h). Narrowing rounds to nearest, ties to
// even; overflow gives inf; NaN stays NaN (sign and top payload bits kept, quiet bit
// set). f16 covers subnormals.
float ct_f16_to_f32(uint16_t h);
uint16_t ct_f32_to_f16(float f);

#define CT_ST_MAX_DIMS 8
// Bounds checked before a header is parsed, so that a hostile header cannot make the
// parser take gigabytes (a JSON value costs ~15x its text): real headers hold ~100-150
// bytes per tensor, and the biggest real single files hold a few thousand tensors (a
// 20k-tensor MoE shard would be ~3 MB). The reference implementation allows 100 MB.
#define CT_ST_MAX_HEADER (16 << 20)  // bytes
#define CT_ST_MAX_TENSORS 65536      // entries of one file's header

typedef struct {
  char *name;
  ct_dtype dtype;
  int ndim;                        // 0 for a scalar
  int64_t shape[CT_ST_MAX_DIMS];   // shape[ndim..] are 0
  int64_t numel;                   // product of shape (1 for a scalar)
  uint64_t begin, end;             // byte offsets within the data section
} ct_st_tensor;

typedef struct {
  char *path;
  int fd;                          // -1: closed as soon as the file is mapped
  uint8_t *map;                    // the whole file, read-only
  size_t file_size;
  const uint8_t *data;             // data section start: map + 8 + N. Only 8-byte aligned
  size_t data_size;                //   if N is a multiple of 8; read via memcpy.
  int n;
  ct_st_tensor *tensors;           // (n) in data-section order (sorted by offsets)
  ct_st_tensor **by_name;          // (n) sorted by name, for ct_st_find
  int n_meta;
  char **meta_keys, **meta_vals;   // (n_meta) the __metadata__ map, header order
} ct_safetensors;

// Maps `path` read-only and validates the whole header. On failure `st` is left
// closed (ct_st_close is still safe) and the message names the path and tensor.
int ct_st_open(ct_safetensors *st, const char *path);
// Unmaps and frees; safe on a zeroed struct, a failed open, or twice.
void ct_st_close(ct_safetensors *st);
// The tensor called `name`, or NULL. O(log n).
const ct_st_tensor *ct_st_find(const ct_safetensors *st, const char *name);
// The __metadata__ value for `key`, or NULL.
const char *ct_st_meta(const ct_safetensors *st, const char *key);
// A tensor's raw bytes in the mapping (t->end - t->begin of them; maybe unaligned).
const void *ct_st_data(const ct_safetensors *st, const ct_st_tensor *t);
// Copies `t` into dst (n floats; n must equal t->numel), converting F32/F16/BF16/F64 to
// float32. Other dtypes are an error naming the tensor.
int ct_st_read_f32(const ct_safetensors *st, const ct_st_tensor *t, float *dst, int64_t n);

// Elements [i0, i0 + n) of `t` into dst, converted as ct_st_read_f32 does; the pages read
// are dropped from the mapping (ct_st_drop), so a tensor read piece by piece never has
// more than a piece resident. For streaming tools: memory is the caller's buffer.
int ct_st_read_f32_range(const ct_safetensors *st, const ct_st_tensor *t, int64_t i0, int64_t n, float *dst);
// Drops the pages of [p, p + len) (inside a read-only mapping) from resident memory; a
// later read of them reads the file again.
void ct_st_drop(const void *p, size_t len);

// One tensor to write. If data_f32 != NULL it holds numel float32 values converted to
// `dtype` (F32, F16 or BF16 only, round to nearest even); otherwise `data` holds
// numel * ct_dtype_size(dtype) raw little-endian bytes (may be NULL when that is 0).
typedef struct {
  const char *name;
  ct_dtype dtype;
  int ndim;
  int64_t shape[CT_ST_MAX_DIMS];
  const float *data_f32;
  const void *data;
} ct_st_entry;

// Writes `path` (created or truncated, mode 0644) holding e[0..n) in that order,
// contiguous, after a compact JSON header padded with spaces to a multiple of 8 bytes
// (as the reference writer does; __metadata__ first when n_meta > 0). fsync()s before
// returning. On failure a partially written regular file is removed and the message
// names the path (and the entry, for bad entries). `path` must not be a file whose
// mapping supplies the data (truncating it would fault); write elsewhere and rename.
int ct_st_write(const char *path, const ct_st_entry *e, int n, const char *const *meta_keys,
                const char *const *meta_vals, int n_meta);

// A file written as a stream: the header (from entries whose data fields are ignored)
// goes out at open; then ct_st_writer_put appends the tensors' raw little-endian bytes in
// entry order, in pieces of any size; close checks that every byte came, fsyncs and
// closes. On any failure (and at abort) a partially written regular file is removed.
// ct_st_write is open + put + close. Memory: the header only.
typedef struct {
  char *path;
  int fd;             // -1: closed
  int regular;        // a regular file (removed on failure)
  uint64_t left;      // data bytes still to come
  int err;            // first errno of a failed write
} ct_st_writer;

int ct_st_writer_open(ct_st_writer *w, const char *path, const ct_st_entry *e, int n,
                      const char *const *meta_keys, const char *const *meta_vals, int n_meta);
int ct_st_writer_put(ct_st_writer *w, const void *data, size_t len);
int ct_st_writer_close(ct_st_writer *w);
void ct_st_writer_abort(ct_st_writer *w);

// Checksummed files (ctune's own data files and caches, not models): ct_st_write_checked
// writes as ct_st_write does and adds __metadata__ "xxh64", the XXH64 of the tensors' bytes
// chained in entry order (ct_xxh64_blocks, hash.h); each entry must hold raw bytes (`data`)
// or float32 written as F32. ct_st_check_content recomputes it over an opened file (CT_EFORMAT
// naming the path when it differs or is missing: a flipped data byte is refused) and gives
// it in *sum (may be NULL): the contents' identity.
#define CT_ST_CHECKSUM_KEY "xxh64"
int ct_st_write_checked(const char *path, const ct_st_entry *e, int n, const char *const *meta_keys,
                        const char *const *meta_vals, int n_meta);
int ct_st_check_content(const ct_safetensors *st, uint64_t *sum);

// A model directory: `model.safetensors`, or else `model.safetensors.index.json` whose
// weight_map sends each tensor name to a shard file in the same directory. Every shard
// named is opened once; a tensor missing from its shard is an error naming both. With
// an index, only the tensors weight_map names are found. If both files exist, the
// single file wins (as in transformers).
typedef struct {
  const char *name;                // points into the owning file's tensor
  int file;                        // index into files
  const ct_st_tensor *t;
} ct_st_dir_entry;

typedef struct {
  char *path;                      // the directory
  int n_files;
  ct_safetensors *files;           // (n_files)
  int n;
  ct_st_dir_entry *entries;        // (n) sorted by name
} ct_st_dir;

int ct_st_dir_open(ct_st_dir *d, const char *dir);
// One safetensors file seen as a directory holding just it (path: the file's directory).
int ct_st_dir_open_file(ct_st_dir *d, const char *file);
// Safe on a zeroed struct, a failed open, or twice.
void ct_st_dir_close(ct_st_dir *d);
// 0 and *st, *t set (either may be NULL) if found; else CT_EFORMAT naming tensor and dir.
int ct_st_dir_find(const ct_st_dir *d, const char *name, const ct_safetensors **st,
                   const ct_st_tensor **t);
