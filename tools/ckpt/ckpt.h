// ctune-ckpt's shared parts: argument handling (main.c), the merged model (merge.c), and
// the streaming helpers inspect, convert, compare and shard use (stream.c), with the
// sub-commands main.c dispatches to. Each sub-command returns the exit status.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "lora.h"
#include "model.h"
#include "safetensors.h"

// The sub-commands: argv[1] is the sub-command, argv[2..] its key=value arguments.
int ckpt_merge_lora(int argc, char **argv);  // merge.c
int ckpt_gguf(int argc, char **argv);        // to_gguf.c
int ckpt_inspect(int argc, char **argv);     // inspect.c
int ckpt_convert(int argc, char **argv);     // convert.c
int ckpt_compare(int argc, char **argv);     // compare.c
int ckpt_shard(int argc, char **argv);       // shard.c

// main.c: the usage (to stdout for --help: returns 0; else 2), the last error and exit.
int ckpt_usage(FILE *f);
__attribute__((noreturn)) void ckpt_die(int code);
// A sub-command's key=value arguments: v[k] = the value of known[k] ("key=", NULL-terminated),
// or NULL. Returns 0, or 2 after a usage error: an argument that is none of the keys
// ("ctune-ckpt: <command>: unknown argument '...'"), or the first missing one of the first
// `required` keys ("ctune-ckpt: <command>: <key>= is required").
int ckpt_args(int argc, char **argv, const char *const *known, int required, const char **v);

// merge.c
int ckpt_load_merged(ct_model *m, ct_lora *lo, const char *base, const char *adapter);

// stream.c: reading
size_t ckpt_buffer_bytes(void);
double ckpt_peak_mib(void);
bool ckpt_is_dir(const char *p);
int ckpt_open_tensors(ct_st_dir *d, const char *path, bool allow_adapter);
const char *ckpt_base_name(const char *p);
bool ckpt_mapped(const ct_st_dir *d, int f, const ct_st_tensor *t);
bool ckpt_is_float(ct_dtype dt);
void ckpt_fmt_dims(char *buf, size_t n, const ct_st_tensor *t);
int *ckpt_file_order(const ct_st_dir *d);

// stream.c: output directories
int ckpt_out_begin(const char *out, char *tmp, size_t n);
int ckpt_out_commit(const char *tmp, const char *out);
int ckpt_copy_model_files(const char *in, const char *tmp, const char *dtype);

// stream.c: writing tensors through the buffer
typedef struct {
  uint8_t *raw;  // (cap) bytes
  float *f;      // (cap / 4) floats
  size_t cap;
} stream_buf;

typedef struct {
  int file;
  const ct_st_tensor *t;
} tensor_ref;

int ckpt_stream_buf_init(stream_buf *b);
void ckpt_stream_buf_free(stream_buf *b);
int ckpt_write_stream_file(const char *path, const ct_st_dir *d, const tensor_ref *list, int n, int to,
                           const ct_safetensors *meta, stream_buf *b, uint64_t *total);
tensor_ref *ckpt_tensor_list(const ct_st_dir *d, int *n);
int ckpt_write_index(const char *dir, const char *const *names, const char *const *files, int n, uint64_t total);

// stream.c: a sub-command that rewrites a model's tensors into out= (convert, shard). With
// in= not a directory it prints "ctune-ckpt: <cmd>: in=<in> is not a directory" and returns 2.
// Else it opens in's tensors into *d and calls write(d, tmp, b, ctx) to put the tensor files
// into a fresh temporary directory tmp through the buffer b; the model's other files follow
// (config.json's dtype set to dtype, unless NULL), then tmp becomes out and it returns 0 with
// *d open for the caller's summary (ct_st_dir_close). On any failure it prints the error,
// removes tmp and exits 1.
typedef int (*ckpt_write_fn)(const ct_st_dir *d, const char *tmp, stream_buf *b, void *ctx);
int ckpt_rewrite(const char *cmd, ct_st_dir *d, const char *in, const char *out, const char *dtype,
                 ckpt_write_fn write, void *ctx);
