// gguf: GGUF v3 writer and model export (see gguf.h).
#include "gguf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bf16.h"
#include "error.h"
#include "safetensors.h"

#define CVT_FLOATS 65536  // floats converted per write (a multiple of 32)

int ct_gguf_type_parse(const char *s, ct_gguf_type *t) {
  static const struct { const char *name; ct_gguf_type t; } tab[] = {
      {"f32", CT_GGUF_F32}, {"f16", CT_GGUF_F16}, {"bf16", CT_GGUF_BF16}, {"q8_0", CT_GGUF_Q8_0}};
  for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
    if (!strcmp(s, tab[i].name)) return *t = tab[i].t, 0;
  return ct_set_error(CT_EINVAL, "type '%s' is not one of f32, f16, bf16, q8_0", s);
}

const char *ct_gguf_type_name(ct_gguf_type t) {
  switch (t) {
    case CT_GGUF_F32: return "f32";
    case CT_GGUF_F16: return "f16";
    case CT_GGUF_BF16: return "bf16";
    case CT_GGUF_Q8_0: return "q8_0";
  }
  return "?";
}

uint64_t ct_gguf_nbytes(ct_gguf_type t, int64_t n) {
  switch (t) {
    case CT_GGUF_F32: return 4 * (uint64_t)n;
    case CT_GGUF_F16:
    case CT_GGUF_BF16: return 2 * (uint64_t)n;
    case CT_GGUF_Q8_0: return (uint64_t)n / CT_GGUF_QK8_0 * (2 + CT_GGUF_QK8_0);
  }
  return 0;
}

uint32_t ct_gguf_file_type(ct_gguf_type t) {
  switch (t) {
    case CT_GGUF_F32: return 0;
    case CT_GGUF_F16: return 1;
    case CT_GGUF_Q8_0: return 7;
    case CT_GGUF_BF16: return 32;
  }
  return 0;
}

void ct_gguf_q8_0(const float *x, int64_t n, uint8_t *out) {
  for (int64_t b = 0; b < n / CT_GGUF_QK8_0; b++, x += CT_GGUF_QK8_0, out += 2 + CT_GGUF_QK8_0) {
    float amax = 0;
    for (int j = 0; j < CT_GGUF_QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127, id = d ? 1 / d : 0;
    uint16_t h = ct_f32_to_f16(d);
    memcpy(out, &h, 2);  // little-endian host
    for (int j = 0; j < CT_GGUF_QK8_0; j++) out[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
  }
}

// ---- the writer ----

static int wfail(ct_gguf_writer *w) { return ct_set_error(CT_EIO, "%s: write failed", w->tmp); }

static int put(ct_gguf_writer *w, const void *p, size_t n) {
  return n && fwrite(p, 1, n, w->f) != n ? wfail(w) : 0;
}
static int put_u32(ct_gguf_writer *w, uint32_t v) { return put(w, &v, 4); }
static int put_u64(ct_gguf_writer *w, uint64_t v) { return put(w, &v, 8); }
static int put_str(ct_gguf_writer *w, const char *s, size_t n) {
  return put_u64(w, n) || put(w, s, n) ? CT_EIO : 0;
}

int ct_gguf_open(ct_gguf_writer *w, const char *path) {
  memset(w, 0, sizeof *w);
  size_t n = strlen(path);
  w->path = strdup(path);
  w->tmp = malloc(n + 5);
  w->cvt = malloc(CVT_FLOATS * sizeof(float));
  if (!w->path || !w->tmp || !w->cvt) {
    ct_gguf_abort(w);
    return ct_set_error(CT_ENOMEM, "%s: out of memory", path);
  }
  snprintf(w->tmp, n + 5, "%s.tmp", path);
  if (!(w->f = fopen(w->tmp, "wb"))) {
    int rc = ct_set_error(CT_EIO, "%s: cannot create the file", w->tmp);
    ct_gguf_abort(w);
    return rc;
  }
  setvbuf(w->f, NULL, _IOFBF, 1 << 20);
  // the counts are patched in by begin_data, when they are known
  if (put(w, "GGUF", 4) || put_u32(w, 3) || put_u64(w, 0) || put_u64(w, 0)) {
    int rc = wfail(w);
    ct_gguf_abort(w);
    return rc;
  }
  return 0;
}

static int kv_head(ct_gguf_writer *w, const char *key, int type) {
  if (w->data || w->arr_left)
    return ct_set_error(CT_EINVAL, "%s: key '%s' written %s", w->path, key,
                        w->data ? "after the tensor data began" : "inside an unfinished array");
  w->n_kv++;
  return put_str(w, key, strlen(key)) || put_u32(w, type) ? CT_EIO : 0;
}

int ct_gguf_kv_str(ct_gguf_writer *w, const char *key, const char *val) {
  return kv_head(w, key, CT_GGUF_V_STR) || put_str(w, val, strlen(val)) ? CT_EIO : 0;
}
int ct_gguf_kv_u32(ct_gguf_writer *w, const char *key, uint32_t val) {
  return kv_head(w, key, CT_GGUF_V_U32) || put_u32(w, val) ? CT_EIO : 0;
}
int ct_gguf_kv_i32(ct_gguf_writer *w, const char *key, int32_t val) {
  return kv_head(w, key, CT_GGUF_V_I32) || put(w, &val, 4) ? CT_EIO : 0;
}
int ct_gguf_kv_f32(ct_gguf_writer *w, const char *key, float val) {
  return kv_head(w, key, CT_GGUF_V_F32) || put(w, &val, 4) ? CT_EIO : 0;
}
int ct_gguf_kv_bool(ct_gguf_writer *w, const char *key, bool val) {
  uint8_t b = val;
  return kv_head(w, key, CT_GGUF_V_BOOL) || put(w, &b, 1) ? CT_EIO : 0;
}

int ct_gguf_arr_begin(ct_gguf_writer *w, const char *key, int type, uint64_t n) {
  int rc = kv_head(w, key, CT_GGUF_V_ARR);
  if (rc || (rc = put_u32(w, type)) || (rc = put_u64(w, n))) return rc;
  w->arr_left = (int)n;
  w->arr_type = type;
  return 0;
}

static int arr_elem(ct_gguf_writer *w, int type) {
  if (w->arr_left <= 0 || w->arr_type != type)
    return ct_set_error(CT_EINVAL, "%s: array element of type %d %s", w->path, type,
                        w->arr_left <= 0 ? "beyond the declared count" : "in an array of another type");
  w->arr_left--;
  return 0;
}
int ct_gguf_arr_str(ct_gguf_writer *w, const char *s, size_t len) {
  return arr_elem(w, CT_GGUF_V_STR) || put_str(w, s, len) ? CT_EIO : 0;
}
int ct_gguf_arr_i32(ct_gguf_writer *w, int32_t v) {
  return arr_elem(w, CT_GGUF_V_I32) || put(w, &v, 4) ? CT_EIO : 0;
}
int ct_gguf_arr_f32(ct_gguf_writer *w, float v) {
  return arr_elem(w, CT_GGUF_V_F32) || put(w, &v, 4) ? CT_EIO : 0;
}

static uint64_t align_up(uint64_t x) { return (x + CT_GGUF_ALIGN - 1) / CT_GGUF_ALIGN * CT_GGUF_ALIGN; }

int ct_gguf_add_tensor(ct_gguf_writer *w, const char *name, int ndim, const int64_t *ne, ct_gguf_type type) {
  if (w->data) return ct_set_error(CT_EINVAL, "%s: tensor '%s' declared after the data began", w->path, name);
  if (type == CT_GGUF_Q8_0 && ne[0] % CT_GGUF_QK8_0)
    return ct_set_error(CT_EINVAL, "%s: tensor '%s': Q8_0 needs rows of a multiple of 32 values, not %lld",
                        w->path, name, (long long)ne[0]);
  if (w->n_tensors == w->cap) {
    int cap = w->cap ? 2 * w->cap : 64;
    ct_gguf_tensor *t = realloc(w->tensors, cap * sizeof *t);
    if (!t) return ct_set_error(CT_ENOMEM, "%s: out of memory", w->path);
    w->tensors = t, w->cap = cap;
  }
  ct_gguf_tensor *t = &w->tensors[w->n_tensors];
  *t = (ct_gguf_tensor){.name = strdup(name), .ndim = ndim, .type = type, .offset = w->data_size};
  if (!t->name) return ct_set_error(CT_ENOMEM, "%s: out of memory", w->path);
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= t->ne[d] = ne[d];
  t->nbytes = ct_gguf_nbytes(type, n);
  w->data_size = align_up(w->data_size + t->nbytes);
  w->n_tensors++;
  return 0;
}

static int pad(ct_gguf_writer *w) {
  static const char zeros[CT_GGUF_ALIGN];
  long pos = ftell(w->f);
  if (pos < 0) return wfail(w);
  return put(w, zeros, align_up((uint64_t)pos) - (uint64_t)pos);
}

int ct_gguf_begin_data(ct_gguf_writer *w) {
  if (w->arr_left) return ct_set_error(CT_EINVAL, "%s: an array lacks %d elements", w->path, w->arr_left);
  for (int i = 0; i < w->n_tensors; i++) {
    const ct_gguf_tensor *t = &w->tensors[i];
    int rc = put_str(w, t->name, strlen(t->name)) || put_u32(w, t->ndim) ? CT_EIO : 0;
    for (int d = 0; d < t->ndim && !rc; d++) rc = put_u64(w, t->ne[d]);
    if (rc || (rc = put_u32(w, t->type)) || (rc = put_u64(w, t->offset))) return rc;
  }
  uint64_t counts[2] = {(uint64_t)w->n_tensors, w->n_kv};
  long end = ftell(w->f);
  if (end < 0 || fseek(w->f, 8, SEEK_SET) || put(w, counts, sizeof counts) || fseek(w->f, end, SEEK_SET))
    return wfail(w);
  w->data = true;
  return pad(w);
}

// x (n) as type t, written in chunks through w->cvt
static int put_values(ct_gguf_writer *w, const float *x, int64_t n, ct_gguf_type t) {
  if (t == CT_GGUF_F32) return put(w, x, 4 * (size_t)n);
  uint8_t *buf = (uint8_t *)w->cvt;
  int64_t chunk = CVT_FLOATS;  // converted: at most 2 bytes a value (Q8_0 34/32), within w->cvt
  for (int64_t i = 0; i < n; i += chunk) {
    int64_t m = n - i < chunk ? n - i : chunk;
    if (t == CT_GGUF_Q8_0) {
      ct_gguf_q8_0(x + i, m, buf);
    } else {
      uint16_t *h = (uint16_t *)buf;
      if (t == CT_GGUF_BF16) ct_bf16_narrow(h, x + i, m);
      else for (int64_t j = 0; j < m; j++) h[j] = ct_f32_to_f16(x[i + j]);
    }
    int rc = put(w, buf, ct_gguf_nbytes(t, m));
    if (rc) return rc;
  }
  return 0;
}

int ct_gguf_write_tensor(ct_gguf_writer *w, const float *x) {
  if (!w->data || w->next >= w->n_tensors)
    return ct_set_error(CT_EINVAL, "%s: tensor data written %s", w->path,
                        w->data ? "beyond the declared tensors" : "before ct_gguf_begin_data");
  const ct_gguf_tensor *t = &w->tensors[w->next++];
  int64_t n = t->ndim == 1 ? t->ne[0] : t->ne[0] * t->ne[1];
  int rc = put_values(w, x, n, t->type);
  return rc ? rc : pad(w);
}

int ct_gguf_close(ct_gguf_writer *w) {
  int rc = 0;
  if (!w->data && (rc = ct_gguf_begin_data(w))) goto out;
  if (w->next != w->n_tensors) {
    rc = ct_set_error(CT_EINVAL, "%s: %d of %d tensors written", w->path, w->next, w->n_tensors);
    goto out;
  }
  if (fflush(w->f) || fsync(fileno(w->f))) {
    rc = wfail(w);
    goto out;
  }
  FILE *f = w->f;
  w->f = NULL;
  if (fclose(f)) rc = wfail(w);
  else if (rename(w->tmp, w->path)) rc = ct_set_error(CT_EIO, "%s: cannot rename into place", w->path);
out:
  ct_gguf_abort(w);
  return rc;
}

void ct_gguf_abort(ct_gguf_writer *w) {
  if (w->f) {
    fclose(w->f);
    w->f = NULL;
  }
  if (w->tmp) unlink(w->tmp);  // after a successful rename there is nothing to remove
  for (int i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
  free(w->tensors);
  free(w->path);
  free(w->tmp);
  free(w->cvt);
  memset(w, 0, sizeof *w);
}

// ---- model export ----

// llama.cpp's gemma3 reads only the window from the file and fixes the rest (llama-model.cpp):
// layer l full when (l + 1) % 6 == 0, local RoPE base 10000, scale head_dim^-0.5 (62
// layers, the 27B: (hidden / heads)^-0.5), no attention softcapping. A model otherwise
// would run differently there, so it is refused.
static bool gemma3_ok(const ct_model_config *c) {
  const char *why = NULL;
  float scalar = c->num_layers == 62 ? (float)(c->hidden_size / c->num_heads) : (float)c->head_dim;
  if (c->attn_softcap > 0) why = "attn_logit_softcapping is set";
  else if (c->rope_local_theta != 10000) why = "rope_local_base_freq is not 10000";
  else if (c->query_pre_attn_scalar != scalar) why = "query_pre_attn_scalar is not the one llama.cpp assumes (head_dim)";
  else if (c->sliding_window <= 0) why = "there is no sliding_window";
  for (int l = 0; !why && l < c->num_layers; l++)
    if ((bool)c->sliding[l] != ((l + 1) % 6 != 0)) why = "the sliding layers do not follow sliding_window_pattern 6";
  if (why) ct_set_error(CT_EINVAL, "gemma3_text: llama.cpp's gemma3 cannot run this model: %s", why);
  return !why;
}

const char *ct_gguf_arch(const ct_model_config *c) {
  const char *t = c->model_type;
  if (!strcmp(t, "llama") || !strcmp(t, "mistral")) {
    if (c->qk_norm) {
      ct_set_error(CT_EINVAL, "model_type '%s' with q/k norm has no llama.cpp architecture", t);
      return NULL;
    }
    return "llama";
  }
  if (!strcmp(t, "qwen2")) {
    if (c->qk_norm || !c->qkv_bias) {
      ct_set_error(CT_EINVAL, "model_type 'qwen2' %s: llama.cpp's qwen2 has q/k/v biases and no q/k norms",
                   c->qk_norm ? "with q/k norm" : "without q/k/v biases");
      return NULL;
    }
    return "qwen2";
  }
  if (!strcmp(t, "qwen3")) {
    if (c->qkv_bias || !c->qk_norm) {
      ct_set_error(CT_EINVAL, "model_type 'qwen3' %s: llama.cpp's qwen3 has q/k norms and no biases",
                   c->qkv_bias ? "with q/k/v biases" : "without q/k norm");
      return NULL;
    }
    return "qwen3";
  }
  if (!strcmp(t, "gemma3_text")) return gemma3_ok(c) ? "gemma3" : NULL;
  ct_set_error(CT_EINVAL, "model_type '%s' has no GGUF mapping (llama, mistral, qwen2, qwen3, gemma3_text)", t);
  return NULL;
}

void ct_gguf_permute_rows(const float *in, float *out, int heads, int hd, long cols) {
  int half = hd / 2;
  for (int h = 0; h < heads; h++)
    for (int i = 0; i < half; i++)
      for (int j = 0; j < 2; j++)
        memcpy(out + ((long)h * hd + 2 * i + j) * cols, in + ((long)h * hd + j * half + i) * cols,
               cols * sizeof(float));
}

// A Hugging Face tensor's llama.cpp name; *perm_heads > 0 when its rows need the llama permutation.
static int gguf_name(const ct_model_config *c, bool llama, const char *hf, char *out, size_t n, int *perm_heads) {
  static const struct { const char *hf, *gg; } tab[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  // Gemma: the norm after attention has its own name, the norm before the MLP is ffn_norm
  static const struct { const char *hf, *gg; } gemma[] = {
      {"post_attention_layernorm.weight", "post_attention_norm.weight"},
      {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
      {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
  };
  *perm_heads = 0;
  int gl, gat = 0;
  if (c->gemma && sscanf(hf, "model.layers.%d.%n", &gl, &gat) == 1 && gat > 0)
    for (size_t i = 0; i < sizeof gemma / sizeof gemma[0]; i++)
      if (!strcmp(hf + gat, gemma[i].hf)) return snprintf(out, n, "blk.%d.%s", gl, gemma[i].gg), 0;
  if (!strcmp(hf, "model.embed_tokens.weight")) return snprintf(out, n, "token_embd.weight"), 0;
  if (!strcmp(hf, "model.norm.weight")) return snprintf(out, n, "output_norm.weight"), 0;
  if (!strcmp(hf, "lm_head.weight")) return snprintf(out, n, "output.weight"), 0;
  int l, at = 0;
  if (sscanf(hf, "model.layers.%d.%n", &l, &at) == 1 && at > 0)
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
      if (!strcmp(hf + at, tab[i].hf)) {
        snprintf(out, n, "blk.%d.%s", l, tab[i].gg);
        if (llama && !strncmp(tab[i].gg, "attn_q.", 7)) *perm_heads = c->num_heads;
        if (llama && !strncmp(tab[i].gg, "attn_k.", 7)) *perm_heads = c->num_kv_heads;
        return 0;
      }
  return ct_set_error(CT_EINVAL, "tensor '%s' has no GGUF name", hf);
}

// Llama 3 RoPE scaling as per-frequency divisors (hd/2), as convert_hf_to_gguf.py computes them.
static void llama3_rope_factors(const ct_model_config *c, float *out) {
  int hd = c->head_dim;
  double lo_wl = c->rope_original_max_pos / c->rope_low_freq_factor;
  double hi_wl = c->rope_original_max_pos / c->rope_high_freq_factor;
  for (int i = 0; i < hd / 2; i++) {
    float freq = 1.0f / powf(c->rope_theta, (float)(2 * i) / hd);
    double wl = 2 * M_PI / freq;
    if (wl < hi_wl) out[i] = 1;
    else if (wl > lo_wl) out[i] = c->rope_factor;
    else {
      double smooth = (c->rope_original_max_pos / wl - c->rope_low_freq_factor) /
                      (c->rope_high_freq_factor - c->rope_low_freq_factor);
      out[i] = (float)(1 / ((1 - smooth) / c->rope_factor + smooth));
    }
  }
}

static int arch_kv(ct_gguf_writer *w, const ct_model_config *c, const char *arch, ct_gguf_type type,
                   const char *name) {
  char k[128];
  int rc = 0;
#define KV(fn, key, v) \
  if (!rc) rc = (snprintf(k, sizeof k, "%s." key, arch), fn(w, k, v))
  rc = ct_gguf_kv_str(w, "general.architecture", arch);
  if (!rc) rc = ct_gguf_kv_str(w, "general.name", name);
  if (!rc) rc = ct_gguf_kv_u32(w, "general.file_type", ct_gguf_file_type(type));
  if (!rc && type == CT_GGUF_Q8_0) rc = ct_gguf_kv_u32(w, "general.quantization_version", 2);
  if (!rc) rc = ct_gguf_kv_u32(w, "general.alignment", CT_GGUF_ALIGN);
  KV(ct_gguf_kv_u32, "vocab_size", c->vocab_size);
  KV(ct_gguf_kv_u32, "context_length", c->max_position_embeddings);
  KV(ct_gguf_kv_u32, "embedding_length", c->hidden_size);
  KV(ct_gguf_kv_u32, "block_count", c->num_layers);
  KV(ct_gguf_kv_u32, "feed_forward_length", c->intermediate_size);
  KV(ct_gguf_kv_u32, "attention.head_count", c->num_heads);
  KV(ct_gguf_kv_u32, "attention.head_count_kv", c->num_kv_heads);
  KV(ct_gguf_kv_u32, "attention.key_length", c->head_dim);
  KV(ct_gguf_kv_u32, "attention.value_length", c->head_dim);
  KV(ct_gguf_kv_u32, "rope.dimension_count", c->head_dim);
  KV(ct_gguf_kv_f32, "rope.freq_base", c->rope_theta);
  KV(ct_gguf_kv_f32, "attention.layer_norm_rms_epsilon", c->rms_norm_eps);
  if (c->gemma) KV(ct_gguf_kv_u32, "attention.sliding_window", c->sliding_window);
  if (c->rope_type == 2) {  // linear (Gemma 3 4B+: the full layers only, as llama.cpp applies it)
    KV(ct_gguf_kv_str, "rope.scaling.type", "linear");
    KV(ct_gguf_kv_f32, "rope.scaling.factor", c->rope_factor);
  }
#undef KV
  return rc;
}

typedef struct {
  const ct_tensor_info *t;  // the Hugging Face tensor, or NULL (rope_freqs)
  int perm_heads;
  int64_t numel;
} export_item;

int ct_gguf_export(const ct_model_config *c, ct_gguf_type type, const char *name, ct_gguf_read_fn rd,
                   void *rctx, ct_gguf_kv_fn tok, void *tctx, const char *path) {
  if (c->num_labels > 0)
    return ct_set_error(CT_EINVAL, "gguf: a reward model (*ForSequenceClassification) has no LM head; llama.cpp "
                        "runs causal language models");
  const char *arch = ct_gguf_arch(c);
  if (!arch) return CT_EINVAL;
  bool llama = !strcmp(arch, "llama");
  ct_model lay = {0};
  int rc = ct_model_layout(&lay, c);
  if (rc) return rc;
  int cap = lay.n_tensors + 1;
  export_item *items = calloc(cap, sizeof *items);
  float *buf = NULL, *tmp = NULL;
  ct_gguf_writer w = {0};
  if (!items) {
    rc = ct_set_error(CT_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  if ((rc = ct_gguf_open(&w, path)) || (rc = arch_kv(&w, c, arch, type, name)) || (rc = tok(tctx, &w))) goto out;
  // declare every tensor in file order, and size one float32 buffer for the largest
  int n = 0;
  int64_t most = 0, most_perm = 0;
  char gname[96];
  for (int i = 0; i < lay.n_tensors; i++) {
    const ct_tensor_info *t = &lay.tensors[i];
    if ((rc = gguf_name(c, llama, t->name, gname, sizeof gname, &items[n].perm_heads))) goto out;
    items[n].t = t;
    items[n].numel = t->numel;
    int64_t ne[2] = {t->ndim == 1 ? t->shape[0] : t->shape[1], t->shape[0]};
    ct_gguf_type tt = t->ndim == 1 ? CT_GGUF_F32 : type;
    if (tt == CT_GGUF_Q8_0 && ne[0] % CT_GGUF_QK8_0) tt = CT_GGUF_F16;  // as llama-quantize falls back
    if ((rc = ct_gguf_add_tensor(&w, gname, t->ndim, ne, tt))) goto out;
    most = t->numel > most ? t->numel : most;
    if (items[n].perm_heads) most_perm = t->numel > most_perm ? t->numel : most_perm;
    n++;
  }
  if (c->rope_type == 1) {
    int64_t len = c->head_dim / 2;
    if ((rc = ct_gguf_add_tensor(&w, "rope_freqs.weight", 1, &len, CT_GGUF_F32))) goto out;
    items[n++] = (export_item){.numel = len};
  }
  buf = malloc(most * sizeof(float));
  tmp = most_perm ? malloc(most_perm * sizeof(float)) : NULL;  // llama's permuted q/k
  if (!buf || (most_perm && !tmp)) {
    rc = ct_set_error(CT_ENOMEM, "%s: out of memory for a %lld-float tensor", path, (long long)most);
    goto out;
  }
  if ((rc = ct_gguf_begin_data(&w))) goto out;
  for (int i = 0; i < n && !rc; i++) {
    const export_item *it = &items[i];
    const float *x = buf;
    if (!it->t) llama3_rope_factors(c, buf);
    else if ((rc = rd(rctx, it->t, buf))) break;
    if (it->t && strstr(it->t->name, "norm.weight"))  // Gemma: llama.cpp multiplies by w, so 1 + w
      ct_norm_weight(c, buf, (int)it->t->numel, buf);
    if (it->perm_heads) {
      long cols = it->t->ndim == 1 ? 1 : it->t->shape[1];
      ct_gguf_permute_rows(buf, tmp, it->perm_heads, c->head_dim, cols);
      x = tmp;
    }
    rc = ct_gguf_write_tensor(&w, x);
  }
  if (!rc) rc = ct_gguf_close(&w);
out:
  ct_gguf_abort(&w);
  free(buf);
  free(tmp);
  free(items);
  ct_model_free(&lay);
  return rc;
}
