// gguf: writes GGUF v3 files, the format llama.cpp and Ollama load, and exports a model
// of this project's layout (llama, mistral, qwen2, qwen3, gemma3_text) into one. Gemma's
// norms are written as 1 + w, as convert_hf_to_gguf.py does (llama.cpp multiplies by the weight).
//
// File layout (little-endian): "GGUF", u32 version 3, u64 tensor count, u64 key/value
// count; the key/values (u64-length string key, u32 value type, value; an array is u32
// element type, u64 count, elements); the tensor infos (name, u32 ndim, u64 ne[ndim] with
// ne[0] the fastest-varying dimension, u32 ggml type, u64 offset in the data section);
// zero padding to the alignment (32); the data section, each tensor starting at a
// multiple of 32. A Hugging Face (out, in) matrix is ne = {in, out}: the same bytes.
//
// The writer streams: key/values go straight to the file, tensor infos are kept (small)
// until ct_gguf_begin_data, then each tensor's float32 values are converted to its type
// in chunks as they are written. The caller holds one tensor at a time.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model.h"

#define CT_GGUF_ALIGN 32
#define CT_GGUF_QK8_0 32  // values per Q8_0 block: an fp16 scale d, then 32 int8 q; x ≈ d·q

// ggml tensor types written here (ggml's numbering)
typedef enum { CT_GGUF_F32 = 0, CT_GGUF_F16 = 1, CT_GGUF_Q8_0 = 8, CT_GGUF_BF16 = 30 } ct_gguf_type;

// GGUF metadata value types
enum {
  CT_GGUF_V_U8 = 0, CT_GGUF_V_I8, CT_GGUF_V_U16, CT_GGUF_V_I16, CT_GGUF_V_U32, CT_GGUF_V_I32,
  CT_GGUF_V_F32, CT_GGUF_V_BOOL, CT_GGUF_V_STR, CT_GGUF_V_ARR, CT_GGUF_V_U64, CT_GGUF_V_I64,
  CT_GGUF_V_F64,
};

// llama.cpp's token types (tokenizer.ggml.token_type)
enum { CT_TOK_NORMAL = 1, CT_TOK_UNKNOWN = 2, CT_TOK_CONTROL = 3, CT_TOK_USER_DEFINED = 4,
       CT_TOK_UNUSED = 5, CT_TOK_BYTE = 6 };

// "f32" | "f16" | "bf16" | "q8_0" -> type; CT_EINVAL naming s otherwise.
int ct_gguf_type_parse(const char *s, ct_gguf_type *t);
const char *ct_gguf_type_name(ct_gguf_type t);
// Bytes n values take as type t (n a multiple of 32 for Q8_0).
uint64_t ct_gguf_nbytes(ct_gguf_type t, int64_t n);
// general.file_type of a model written as t (ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q8_0 7, MOSTLY_BF16 32).
uint32_t ct_gguf_file_type(ct_gguf_type t);

// x (n, a multiple of 32) -> n/32 Q8_0 blocks of 34 bytes, as ggml's reference quantizer:
// d = max|x|/127 (stored as fp16), q = round-half-away(x/d) with the fp32 d.
void ct_gguf_q8_0(const float *x, int64_t n, uint8_t *out);

typedef struct {
  char *name;
  int ndim;
  int64_t ne[2];
  ct_gguf_type type;
  uint64_t offset, nbytes;
} ct_gguf_tensor;

typedef struct {
  FILE *f;
  char *path, *tmp;        // the file, and where it is written until ct_gguf_close renames it
  uint64_t n_kv;
  int n_tensors, cap, next;  // tensors declared, and the next one to write
  ct_gguf_tensor *tensors;
  uint64_t data_size;      // offset of the next tensor declared
  int arr_left;            // elements an open array still expects
  int arr_type;
  bool data;               // ct_gguf_begin_data was called
  float *cvt;              // conversion scratch
} ct_gguf_writer;

// Opens path.tmp for writing (renamed to path by ct_gguf_close).
int ct_gguf_open(ct_gguf_writer *w, const char *path);
int ct_gguf_kv_str(ct_gguf_writer *w, const char *key, const char *val);
int ct_gguf_kv_u32(ct_gguf_writer *w, const char *key, uint32_t val);
int ct_gguf_kv_i32(ct_gguf_writer *w, const char *key, int32_t val);
int ct_gguf_kv_f32(ct_gguf_writer *w, const char *key, float val);
int ct_gguf_kv_bool(ct_gguf_writer *w, const char *key, bool val);
// An array of n elements of one type (CT_GGUF_V_STR, _I32, _F32), then exactly n element calls.
int ct_gguf_arr_begin(ct_gguf_writer *w, const char *key, int type, uint64_t n);
int ct_gguf_arr_str(ct_gguf_writer *w, const char *s, size_t len);
int ct_gguf_arr_i32(ct_gguf_writer *w, int32_t v);
int ct_gguf_arr_f32(ct_gguf_writer *w, float v);
// Declares the next tensor: ne[0] the row length (Hugging Face's last dimension).
int ct_gguf_add_tensor(ct_gguf_writer *w, const char *name, int ndim, const int64_t *ne, ct_gguf_type type);
// Ends the key/values: writes the tensor infos and the padding before the data.
int ct_gguf_begin_data(ct_gguf_writer *w);
// The next declared tensor's values (its ne[0]·ne[1] floats), converted to its type.
int ct_gguf_write_tensor(ct_gguf_writer *w, const float *x);
// Checks every tensor was written, patches the counts, fsyncs and renames into place.
int ct_gguf_close(ct_gguf_writer *w);
// Drops a writer after a failure: closes and removes the temporary file. Safe twice.
void ct_gguf_abort(ct_gguf_writer *w);

// ---- model export ----

// llama.cpp's architecture name for a model_type: llama (llama, mistral), qwen2, qwen3,
// gemma3 (gemma3_text); NULL and CT_EINVAL naming the model_type for one without a
// mapping, or for a config that architecture cannot hold (q/k norm on llama, biases on
// qwen3, a Gemma 3 off llama.cpp's fixed sliding pattern, ...).
const char *ct_gguf_arch(const ct_model_config *c);

// Reads the tensor t (Hugging Face name and shape, ct_model_layout) into dst (t->numel floats).
typedef int (*ct_gguf_read_fn)(void *ctx, const ct_tensor_info *t, float *dst);
// Writes the tokenizer's key/values.
typedef int (*ct_gguf_kv_fn)(void *ctx, ct_gguf_writer *w);

// Writes the model to path: architecture metadata, the tokenizer's key/values (tok), then
// the tensors under llama.cpp's names, read one at a time through rd. Matrices are stored
// as `type` (Q8_0 falls back to F16 for a row length not a multiple of 32), vectors as
// F32. llama's q/k rows are permuted into the interleaved RoPE order llama.cpp's llama
// architecture expects; Llama 3 RoPE scaling becomes the rope_freqs tensor. Peak memory: the largest tensor in
// float32 plus a fixed conversion buffer.
int ct_gguf_export(const ct_model_config *c, ct_gguf_type type, const char *name, ct_gguf_read_fn rd,
                   void *rctx, ct_gguf_kv_fn tok, void *tctx, const char *path);

// The llama-architecture row order of a q or k projection (rows, cols) with heads of hd
// rows: within each head, row 2i+j of the output is row j·hd/2 + i of the input
// (convert_hf_to_gguf.py's LlamaModel.permute). cols = 1 for a bias.
void ct_gguf_permute_rows(const float *in, float *out, int heads, int hd, long cols);
