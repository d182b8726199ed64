// gguf_read: a GGUF file's header (what `ctune-ckpt inspect model.gguf` shows). The
// layout is gguf.h's; reading is bounded by the file's size.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "gguf.h"

typedef struct {
  char *name;
  int ndim;
  int64_t ne[4];     // ne[0] the fastest-varying dimension
  uint64_t numel;
  uint32_t type;     // ggml type (any: only some have a ct_gguf_type)
  uint64_t offset;   // in the data section
} ct_gguf_tinfo;

typedef struct {
  uint32_t version;
  uint64_t n_kv;
  char arch[64], name[128];  // general.architecture, general.name ("" when absent)
  bool has_file_type;
  uint32_t file_type;        // general.file_type
  uint64_t alignment, data_offset, file_size;
  int n_tensors;
  ct_gguf_tinfo *t;          // (n_tensors)
} ct_gguf_info;

// Reads path's header; CT_EFORMAT naming the file and what is wrong for anything that is
// not a well-formed GGUF v2/v3 header.
int ct_gguf_read_info(const char *path, ct_gguf_info *g);
void ct_gguf_info_free(ct_gguf_info *g);
// Whether path starts with GGUF's magic.
bool ct_gguf_is_file(const char *path);
