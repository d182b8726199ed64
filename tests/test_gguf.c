// gguf: Q8_0 blocks and fp16 scales against hand-computed values, the byte layout of a
// small file (header, key/values, tensor infos, 32-byte alignment, data), the llama q/k
// row permutation, a model export read back tensor by tensor, and bad input.
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_read.h"
#include "safetensors.h"
#include "test.h"

// ---- a minimal reader for the checks ----

typedef struct {
  uint8_t *b;
  size_t n, at;
} rd;

static rd slurp(const char *path) {
  rd r = {0};
  FILE *f = fopen(path, "rb");
  if (!f) return r;
  fseek(f, 0, SEEK_END);
  r.n = ftell(f);
  fseek(f, 0, SEEK_SET);
  r.b = malloc(r.n ? r.n : 1);
  if (fread(r.b, 1, r.n, f) != r.n) r.n = 0;
  fclose(f);
  return r;
}
static uint32_t u32(rd *r) {
  uint32_t v = 0;
  if (r->at + 4 <= r->n) memcpy(&v, r->b + r->at, 4);
  r->at += 4;
  return v;
}
static uint64_t u64(rd *r) {
  uint64_t v = 0;
  if (r->at + 8 <= r->n) memcpy(&v, r->b + r->at, 8);
  r->at += 8;
  return v;
}
// a string into out (NUL-terminated, truncated to cap)
static void str(rd *r, char *out, size_t cap) {
  uint64_t len = u64(r);
  size_t k = len < cap - 1 ? len : cap - 1;
  if (r->at + k <= r->n) memcpy(out, r->b + r->at, k);
  out[k] = 0;
  r->at += len;
}
static void skip_value(rd *r, uint32_t type) {
  static const int size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  char s[8];
  if (type == CT_GGUF_V_STR) str(r, s, sizeof s);
  else if (type == CT_GGUF_V_ARR) {
    uint32_t et = u32(r);
    uint64_t n = u64(r);
    for (uint64_t i = 0; i < n && r->at < r->n; i++) skip_value(r, et);
  } else r->at += size[type < 13 ? type : 0];
}

typedef struct {
  char name[64];
  uint32_t ndim, type;
  uint64_t ne[2], offset;
} info;

// Reads the header of path: key names into keys (n_kv of them), tensor infos into t; the
// data section's offset in *data. Returns the tensor count.
static int read_header(rd *r, char keys[][64], int max_keys, info *t, int max_t, size_t *data) {
  r->at = 0;
  CHECK(r->n > 24 && !memcmp(r->b, "GGUF", 4));
  r->at = 4;
  CHECK(u32(r) == 3);
  uint64_t nt = u64(r), nkv = u64(r);
  for (uint64_t i = 0; i < nkv; i++) {
    char k[64];
    str(r, k, sizeof k);
    if ((int)i < max_keys) memcpy(keys[i], k, 64);
    skip_value(r, u32(r));
  }
  for (uint64_t i = 0; i < nt && (int)i < max_t; i++) {
    str(r, t[i].name, sizeof t[i].name);
    t[i].ndim = u32(r);
    for (uint32_t d = 0; d < t[i].ndim && d < 2; d++) t[i].ne[d] = u64(r);
    t[i].type = u32(r);
    t[i].offset = u64(r);
  }
  *data = (r->at + 31) / 32 * 32;
  return (int)nt;
}

static char tmpl[] = "/tmp/ct_test_gguf.XXXXXX";
static char path[128];

// ---- tests ----

static void test_q8_0_block(void) {
  float x[32];
  uint8_t b[34];
  // max |x| = 127: d = 1, q = round half away from zero of x
  for (int j = 0; j < 32; j++) x[j] = 0;
  x[0] = 127, x[1] = 2.5f, x[2] = -2.5f, x[3] = 0.49f, x[4] = -127, x[5] = 1.5f;
  ct_gguf_q8_0(x, 32, b);
  uint16_t d;
  memcpy(&d, b, 2);
  CHECK(d == 0x3C00);  // 1.0 in fp16
  int8_t *q = (int8_t *)(b + 2);
  CHECK(q[0] == 127 && q[1] == 3 && q[2] == -3 && q[3] == 0 && q[4] == -127 && q[5] == 2 && q[6] == 0);
  // x_j = j - 16: max 16, d = 16/127 (fp16 0x3008 = 0.1259766), q = round(x · 127/16)
  for (int j = 0; j < 32; j++) x[j] = (float)(j - 16);
  ct_gguf_q8_0(x, 32, b);
  memcpy(&d, b, 2);
  CHECK(d == ct_f32_to_f16(16.0f / 127));
  CHECK(d == 0x3008);
  CHECK_NEAR(ct_f16_to_f32(d), 0.1259765625, 0);
  CHECK(q[0] == -127 && q[31] == 119 && q[17] == 8 && q[16] == 0 && q[15] == -8);  // 15·127/16 = 119.06; 127/16 = 7.94
  // all zero: d = 0, q = 0 (no division by zero)
  memset(x, 0, sizeof x);
  memset(b, 0xff, sizeof b);
  ct_gguf_q8_0(x, 32, b);
  for (int j = 0; j < 34; j++) CHECK(b[j] == 0);
  // two blocks each with its own scale
  float y[64];
  for (int j = 0; j < 64; j++) y[j] = j < 32 ? 0.5f : -254;
  uint8_t bb[68];
  ct_gguf_q8_0(y, 64, bb);
  memcpy(&d, bb, 2);
  CHECK_NEAR(ct_f16_to_f32(d), 0.5 / 127, 0.5 / 127 * 1e-3);
  memcpy(&d, bb + 34, 2);
  CHECK(d == 0x4000);  // 2.0
  CHECK((int8_t)bb[2] == 127 && (int8_t)bb[36] == -127);
  CHECK(ct_gguf_nbytes(CT_GGUF_Q8_0, 64) == 68 && ct_gguf_nbytes(CT_GGUF_F16, 5) == 10 &&
        ct_gguf_nbytes(CT_GGUF_BF16, 5) == 10 && ct_gguf_nbytes(CT_GGUF_F32, 5) == 20);
}

static void test_fp16(void) {
  CHECK(ct_f32_to_f16(1.0f) == 0x3C00);
  CHECK(ct_f32_to_f16(-2.0f) == 0xC000);
  CHECK(ct_f32_to_f16(65504.0f) == 0x7BFF);
  CHECK(ct_f32_to_f16(1e6f) == 0x7C00);             // overflow: inf
  CHECK(ct_f32_to_f16(5.9604645e-8f) == 0x0001);    // the smallest subnormal
  CHECK(ct_f32_to_f16(1.0f + 1.0f / 2048) == 0x3C00);  // a tie rounds to even
  CHECK(ct_f32_to_f16(1.0f + 3.0f / 2048) == 0x3C02);
}

static void test_header_layout(void) {
  ct_gguf_writer w;
  CHECK(ct_gguf_open(&w, "/nonexistent-dir/x.gguf") == CT_EIO && strstr(ct_last_error(), "/nonexistent-dir/x.gguf.tmp"));
  CHECK_OK(ct_gguf_open(&w, path));
  CHECK_OK(ct_gguf_kv_str(&w, "general.architecture", "llama"));
  CHECK_OK(ct_gguf_kv_u32(&w, "llama.block_count", 7));
  CHECK_OK(ct_gguf_arr_begin(&w, "tokenizer.ggml.tokens", CT_GGUF_V_STR, 2));
  CHECK_OK(ct_gguf_arr_str(&w, "ab", 2));
  CHECK(ct_gguf_kv_u32(&w, "too.early", 1) != 0);  // inside the unfinished array
  CHECK_OK(ct_gguf_arr_str(&w, "c", 1));
  CHECK(ct_gguf_arr_str(&w, "d", 1) != 0);  // beyond the declared count
  int64_t ne1 = 3, ne2[2] = {32, 2};
  CHECK_OK(ct_gguf_add_tensor(&w, "v", 1, &ne1, CT_GGUF_F32));
  CHECK_OK(ct_gguf_add_tensor(&w, "m", 2, ne2, CT_GGUF_Q8_0));
  int64_t bad[2] = {16, 2};
  CHECK(ct_gguf_add_tensor(&w, "bad", 2, bad, CT_GGUF_Q8_0) != 0);  // rows not a multiple of 32
  CHECK_OK(ct_gguf_begin_data(&w));
  float v[3] = {1, 2, 3}, m[64];
  for (int i = 0; i < 64; i++) m[i] = i < 32 ? 127 - i : 0;
  CHECK_OK(ct_gguf_write_tensor(&w, v));
  CHECK_OK(ct_gguf_write_tensor(&w, m));
  CHECK(ct_gguf_write_tensor(&w, m) != 0);
  CHECK_OK(ct_gguf_close(&w));

  rd r = slurp(path);
  // hand-laid-out header: magic, version, counts, then key "general.architecture" (u64 20)
  CHECK(r.n > 40 && !memcmp(r.b, "GGUF\3\0\0\0\2\0\0\0\0\0\0\0\3\0\0\0\0\0\0\0\x14\0\0\0\0\0\0\0general.architecture", 52));
  r.at = 52;
  CHECK(u32(&r) == CT_GGUF_V_STR && u64(&r) == 5 && !memcmp(r.b + r.at, "llama", 5));
  char keys[3][64];
  info t[2];
  size_t data;
  CHECK(read_header(&r, keys, 3, t, 2, &data) == 2);
  CHECK(!strcmp(keys[1], "llama.block_count") && !strcmp(keys[2], "tokenizer.ggml.tokens"));
  CHECK(!strcmp(t[0].name, "v") && t[0].ndim == 1 && t[0].ne[0] == 3 && t[0].type == 0 && t[0].offset == 0);
  CHECK(!strcmp(t[1].name, "m") && t[1].ndim == 2 && t[1].ne[0] == 32 && t[1].ne[1] == 2 && t[1].type == 8);
  CHECK(t[1].offset == 32);  // 12 bytes of v, padded to 32
  CHECK(data % 32 == 0 && r.n == data + 32 + 68 + 28);  // the file ends padded too
  float back[3];
  memcpy(back, r.b + data, 12);
  CHECK(back[0] == 1 && back[1] == 2 && back[2] == 3);
  for (size_t i = data + 12; i < data + 32; i++) CHECK(r.b[i] == 0);
  const uint8_t *q = r.b + data + 32;
  CHECK(q[0] == 0x00 && q[1] == 0x3C && (int8_t)q[2] == 127 && (int8_t)q[33] == 96);  // d = 1, x = 127 - 31
  CHECK(q[34] == 0 && q[35] == 0);  // the zero row: d = 0
  free(r.b);
  CHECK(access(path, F_OK) == 0);
  char tmp[160];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  CHECK(access(tmp, F_OK) != 0);
  unlink(path);
}

static void test_permute(void) {
  // one head of 4 rows: row 2i+j of the output is row j·2 + i of the input
  float in[8] = {0, 1, 2, 3, 4, 5, 6, 7}, out[8];
  ct_gguf_permute_rows(in, out, 2, 4, 1);
  float want[8] = {0, 2, 1, 3, 4, 6, 5, 7};
  CHECK(!memcmp(out, want, sizeof want));
  // rows of 2 columns move whole; head size 6: rows 0 3 1 4 2 5
  float a[12], b[12];
  for (int i = 0; i < 12; i++) a[i] = (float)i;
  ct_gguf_permute_rows(a, b, 1, 6, 2);
  int rows[6] = {0, 3, 1, 4, 2, 5};
  for (int r = 0; r < 6; r++) CHECK(b[2 * r] == 2 * rows[r] && b[2 * r + 1] == 2 * rows[r] + 1);
}

static ct_model_config tiny(const char *type) {
  ct_model_config c = ct_model_config_smollm135m(2);
  snprintf(c.model_type, sizeof c.model_type, "%s", type);
  c.vocab_size = 40, c.hidden_size = 32, c.intermediate_size = 64, c.num_heads = 2, c.num_kv_heads = 1;
  c.head_dim = 16, c.max_position_embeddings = 128, c.tie_word_embeddings = false;
  c.qkv_bias = !strcmp(type, "qwen2"), c.qk_norm = !strcmp(type, "qwen3");
  return c;
}

// value i of the tensor with table index k: k·1000 + i
static int fill(void *ctx, const ct_tensor_info *t, float *dst) {
  const ct_model *lay = ctx;
  long k = ct_model_find_tensor(lay, t->name) - lay->tensors;  // t is the exporter's own table
  for (long i = 0; i < t->numel; i++) dst[i] = (float)(k * 1000 + i);
  return 0;
}
static int tok_kv(void *ctx, ct_gguf_writer *w) {
  (void)ctx;
  return ct_gguf_kv_str(w, "tokenizer.ggml.model", "gpt2");
}

// An export of a model config into path, read back: its layout, the file's bytes, its keys
// (the first 40; the rest zero) and tensor infos, the data section's offset, the tensor count.
typedef struct {
  ct_model lay;
  rd r;
  char keys[40][64];
  info t[100];
  size_t data;
  int nt;
} exported;

// Exports c as type into path and reads back the header's keys and max_t tensor infos.
static void export_and_read(exported *e, const ct_model_config *c, ct_gguf_type type, int max_t) {
  memset(e->keys, 0, sizeof e->keys);
  CHECK_OK(ct_model_layout(&e->lay, c));
  CHECK_OK(ct_gguf_export(c, type, "tiny", fill, &e->lay, tok_kv, NULL, path));
  e->r = slurp(path);
  e->nt = read_header(&e->r, e->keys, 40, e->t, max_t, &e->data);
}

static void exported_free(exported *e) {
  free(e->r.b);
  unlink(path);
  ct_model_free(&e->lay);
}

static void test_export_llama(void) {
  ct_model_config c = tiny("llama");
  c.rope_type = 1, c.rope_factor = 8, c.rope_low_freq_factor = 1, c.rope_high_freq_factor = 4;
  c.rope_original_max_pos = 64, c.rope_theta = 10000;
  exported e;
  export_and_read(&e, &c, CT_GGUF_F32, 40);
  CHECK(e.nt == e.lay.n_tensors + 1);  // + rope_freqs
  CHECK(!strcmp(e.keys[0], "general.architecture") && !strcmp(e.keys[4], "llama.vocab_size"));
  CHECK(!strcmp(e.t[0].name, "token_embd.weight") && e.t[0].ne[0] == 32 && e.t[0].ne[1] == 40);
  CHECK(!strcmp(e.t[e.nt - 2].name, "output.weight") && !strcmp(e.t[e.nt - 3].name, "output_norm.weight"));
  CHECK(!strcmp(e.t[e.nt - 1].name, "rope_freqs.weight") && e.t[e.nt - 1].ne[0] == 8);
  for (int i = 0; i < e.nt; i++) {
    CHECK(e.t[i].offset % 32 == 0);
    CHECK(e.t[i].type == 0);
    const ct_tensor_info *ti = i < e.lay.n_tensors ? &e.lay.tensors[i] : NULL;
    if (!ti) continue;
    const float *x = (const float *)(e.r.b + e.data + e.t[i].offset);
    bool q = strstr(e.t[i].name, "attn_q.weight") != NULL, k = strstr(e.t[i].name, "attn_k.weight") != NULL;
    long cols = ti->ndim == 2 ? ti->shape[1] : 1;
    for (long row = 0; row < ti->shape[0]; row++) {
      long src = row;  // q/k: within each 16-row head, output row 2a+b is input row 8b+a
      if (q || k) src = row / 16 * 16 + (row % 16) % 2 * 8 + (row % 16) / 2;
      CHECK(x[row * cols] == (float)(i * 1000 + src * cols));
    }
  }
  // rope factors: wavelength 2π·10000^(2i/16) against 64/4 = 16 and 64/1 = 64
  const float *f = (const float *)(e.r.b + e.data + e.t[e.nt - 1].offset);
  for (int i = 0; i < 8; i++) {
    double wl = 2 * M_PI * pow(10000, 2.0 * i / 16), want;
    if (wl < 16) want = 1;
    else if (wl > 64) want = 8;
    else {
      double s = (64 / wl - 1) / 3;
      want = 1 / ((1 - s) / 8 + s);
    }
    CHECK_NEAR(f[i], want, 1e-5 * want);
  }
  CHECK(f[0] == 1 && f[7] == 8);
  exported_free(&e);
}

static void test_export_qwen_q8(void) {
  // qwen3: q/k norms, no permutation, q8_0 matrices (rows of 32) and f32 vectors; tied: no output
  ct_model_config c = tiny("qwen3");
  c.tie_word_embeddings = true;
  exported e;
  export_and_read(&e, &c, CT_GGUF_Q8_0, 40);
  CHECK(e.nt == e.lay.n_tensors);
  bool norms = false;
  for (int i = 0; i < e.nt; i++) {
    CHECK(strcmp(e.t[i].name, "output.weight") != 0);
    norms |= !strcmp(e.t[i].name, "blk.1.attn_k_norm.weight");
    CHECK(e.t[i].type == (e.t[i].ndim == 1 ? 0u : 8u));
    if (!strcmp(e.t[i].name, "blk.0.attn_q.weight")) {  // row 1 unpermuted: 1000·i + 32 .. + 63
      const uint8_t *b = e.r.b + e.data + e.t[i].offset + 34;
      uint16_t d;
      memcpy(&d, b, 2);
      float amax = (float)(i * 1000 + 63);
      CHECK(d == ct_f32_to_f16(amax / 127) && (int8_t)b[2 + 31] == 127);
    }
  }
  CHECK(norms);
  CHECK(!strcmp(e.keys[3], "general.quantization_version"));
  exported_free(&e);
}

// Gemma 3 the way llama.cpp's gemma3 runs it: 6 layers, the last full (pattern 6).
static ct_model_config gemma_tiny(void) {
  ct_model_config c = tiny("qwen3");
  snprintf(c.model_type, sizeof c.model_type, "gemma3_text");
  c.num_layers = 6, c.gemma = true, c.tie_word_embeddings = true, c.query_pre_attn_scalar = 16;
  c.sliding_window = 8, c.rope_local_theta = 10000, c.rope_theta = 1e6f;
  for (int l = 0; l < 6; l++) c.sliding[l] = (l + 1) % 6 != 0;
  return c;
}

static void test_export_gemma3(void) {
  // names: the four norms of a layer; norms written as 1 + w; the window in the metadata
  ct_model_config c = gemma_tiny();
  c.rope_type = 2, c.rope_factor = 8;
  exported e;
  export_and_read(&e, &c, CT_GGUF_F32, 100);
  CHECK(e.nt == e.lay.n_tensors && e.nt == 1 + 6 * 13 + 1);
  CHECK(!strcmp(e.keys[0], "general.architecture"));
  bool win = false, scal = false;
  for (int k = 0; k < 40; k++) {
    win |= !strcmp(e.keys[k], "gemma3.attention.sliding_window");
    scal |= !strcmp(e.keys[k], "gemma3.rope.scaling.type");
  }
  CHECK(win && scal);
  const char *want[] = {"blk.2.attn_norm.weight", "blk.2.post_attention_norm.weight", "blk.2.ffn_norm.weight",
                        "blk.2.post_ffw_norm.weight", "blk.2.attn_q_norm.weight", "output_norm.weight"};
  const char *hf[] = {"model.layers.2.input_layernorm.weight", "model.layers.2.post_attention_layernorm.weight",
                      "model.layers.2.pre_feedforward_layernorm.weight", "model.layers.2.post_feedforward_layernorm.weight",
                      "model.layers.2.self_attn.q_norm.weight", "model.norm.weight"};
  for (int k = 0; k < 6; k++) {
    int i = 0;
    while (i < e.nt && strcmp(e.t[i].name, want[k])) i++;
    CHECK(i < e.nt);
    if (i == e.nt) continue;
    long src = ct_model_find_tensor(&e.lay, hf[k]) - e.lay.tensors;
    const float *x = (const float *)(e.r.b + e.data + e.t[i].offset);
    CHECK(x[0] == (float)(src * 1000) + 1 && x[3] == (float)(src * 1000 + 3) + 1);  // 1 + w
  }
  for (int i = 0; i < e.nt; i++) {  // matrices as they are (no permutation, no shift)
    CHECK(strcmp(e.t[i].name, "output.weight") != 0);
    if (strcmp(e.t[i].name, "blk.1.attn_q.weight")) continue;
    long src = ct_model_find_tensor(&e.lay, "model.layers.1.self_attn.q_proj.weight") - e.lay.tensors;
    const float *x = (const float *)(e.r.b + e.data + e.t[i].offset);
    CHECK(x[32] == (float)(src * 1000 + 32));
  }
  exported_free(&e);
}

// ct_gguf_read_info (what `ctune-ckpt inspect` shows) against this file's own reader, on an
// export; then every truncation of its header, an absurd tensor count, a wrong magic: refused
// with CT_EFORMAT, never a crash or an allocation beyond the file's size.
static void test_header_reader(void) {
  ct_model_config c = tiny("qwen3");
  exported e;
  export_and_read(&e, &c, CT_GGUF_Q8_0, 40);
  ct_gguf_info g;
  CHECK_OK(ct_gguf_read_info(path, &g));
  CHECK(g.version == 3 && g.n_tensors == e.nt && g.data_offset == e.data && g.file_size == e.r.n);
  CHECK(!strcmp(g.arch, "qwen3") && !strcmp(g.name, "tiny") && g.has_file_type && g.file_type == 7);
  for (int i = 0; i < e.nt && i < g.n_tensors; i++) {
    CHECK(!strcmp(g.t[i].name, e.t[i].name) && g.t[i].type == e.t[i].type && g.t[i].offset == e.t[i].offset);
    CHECK(g.t[i].ndim == (int)e.t[i].ndim && g.t[i].ne[0] == (int64_t)e.t[i].ne[0]);
  }
  ct_gguf_info_free(&g);
  CHECK(ct_gguf_is_file(path));
  char cut[160];
  snprintf(cut, sizeof cut, "%s.cut", path);
  for (size_t n = 0; n < e.data; n += n < 64 ? 1 : 7) {  // every header prefix (the e.data section is not read)
    FILE *f = fopen(cut, "wb");
    fwrite(e.r.b, 1, n, f);
    fclose(f);
    CHECK(ct_gguf_read_info(cut, &g) == CT_EFORMAT);
  }
  uint8_t *b = malloc(e.r.n);
  memcpy(b, e.r.b, e.r.n);
  uint64_t huge = (uint64_t)1 << 60;
  memcpy(b + 8, &huge, 8);  // tensor count
  FILE *f = fopen(cut, "wb");
  fwrite(b, 1, e.r.n, f);
  fclose(f);
  CHECK(ct_gguf_read_info(cut, &g) == CT_EFORMAT && strstr(ct_last_error(), "more than the file's"));
  memcpy(b, "GGUG", 4);
  f = fopen(cut, "wb");
  fwrite(b, 1, e.r.n, f);
  fclose(f);
  CHECK(!ct_gguf_is_file(cut) && ct_gguf_read_info(cut, &g) == CT_EFORMAT && strstr(ct_last_error(), "not a GGUF file"));
  free(b);
  unlink(cut);
  exported_free(&e);
}

static void test_bad_input(void) {
  ct_gguf_type t;
  CHECK(ct_gguf_type_parse("q4_k", &t) == CT_EINVAL && strstr(ct_last_error(), "'q4_k'"));
  CHECK_OK(ct_gguf_type_parse("bf16", &t));
  CHECK(t == CT_GGUF_BF16);
  ct_model_config c = tiny("llama");
  CHECK(!strcmp(ct_gguf_arch(&c), "llama"));
  snprintf(c.model_type, sizeof c.model_type, "mistral");
  CHECK(!strcmp(ct_gguf_arch(&c), "llama"));
  snprintf(c.model_type, sizeof c.model_type, "phi3");
  CHECK(!ct_gguf_arch(&c) && strstr(ct_last_error(), "model_type 'phi3' has no GGUF mapping"));
  // Gemma 3: what llama.cpp's gemma3 fixes must hold
  c = gemma_tiny();
  CHECK(!strcmp(ct_gguf_arch(&c), "gemma3"));
  c.sliding[5] = 1;
  CHECK(!ct_gguf_arch(&c) && strstr(ct_last_error(), "sliding_window_pattern 6"));
  c = gemma_tiny();
  c.query_pre_attn_scalar = 8;
  CHECK(!ct_gguf_arch(&c) && strstr(ct_last_error(), "query_pre_attn_scalar"));
  c = gemma_tiny();
  c.rope_local_theta = 500;
  CHECK(!ct_gguf_arch(&c) && strstr(ct_last_error(), "rope_local_base_freq"));
  c = gemma_tiny();
  c.attn_softcap = 50;
  CHECK(!ct_gguf_arch(&c) && strstr(ct_last_error(), "attn_logit_softcapping"));
  c = tiny("qwen3");
  c.qk_norm = false;
  CHECK(!ct_gguf_arch(&c) && strstr(ct_last_error(), "without q/k norm"));
  c = tiny("qwen2");
  c.qkv_bias = false;
  CHECK(!ct_gguf_arch(&c) && strstr(ct_last_error(), "without q/k/v biases"));
  c = tiny("llama");
  c.qk_norm = true;
  CHECK(!ct_gguf_arch(&c));
  // a failed export leaves no file
  snprintf(c.model_type, sizeof c.model_type, "phi3");
  CHECK(ct_gguf_export(&c, CT_GGUF_F32, "x", fill, NULL, tok_kv, NULL, path) == CT_EINVAL);
  CHECK(access(path, F_OK) != 0);
}

int main(void) {
  char *dir = mkdtemp(tmpl);
  if (!dir) return 1;
  snprintf(path, sizeof path, "%s/t.gguf", dir);
  RUN(test_q8_0_block);
  RUN(test_fp16);
  RUN(test_header_layout);
  RUN(test_permute);
  RUN(test_export_llama);
  RUN(test_export_qwen_q8);
  RUN(test_export_gemma3);
  RUN(test_header_reader);
  RUN(test_bad_input);
  rmdir(dir);
  return test_summary();
}
