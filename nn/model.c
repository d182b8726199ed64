// model: the parameter layout (one flat buffer, Hugging Face names, fused q|k|v and
// gate|up groups), views into it, RoPE tables and the seeded initialization. Loading and
// saving files is hf.c's; running the model is forward.c's.
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "bf16.h"
#include "fastmath.h"
#include "hash.h"
#include "kernels.h"
#include "matmul.h"
#include "mem.h"
#include "pool.h"
#include "quant.h"
#include "rng.h"

// An integer size in [lo, hi], named by its config.json key; `real` says what real models use.
static int check_size(const char *key, long v, long lo, long hi, const char *real) {
  if (v < lo) return ct_set_error(CT_EINVAL, "key '%s' is %ld: must be at least %ld", key, v, lo);
  if (v > hi) return ct_set_error(CT_EINVAL, "key '%s' is %ld, more than %ld (%s)", key, v, hi, real);
  return 0;
}

// A float that must be finite and above lo (and, hi > 0, below hi).
static int check_real(const char *key, float v, double lo, double hi) {
  if (isfinite(v) && v > lo && (hi <= 0 || v < hi)) return 0;
  if (hi > 0) return ct_set_error(CT_EINVAL, "key '%s' is %g: must be in (%g, %g)", key, (double)v, lo, hi);
  return ct_set_error(CT_EINVAL, "key '%s' is %g: must be a finite number above %g", key, (double)v, lo);
}

int ct_model_config_check(const ct_model_config *c) {
  const struct { const char *key; long v, lo, hi; const char *real; } sizes[] = {
      {"vocab_size", c->vocab_size, 1, CT_MAX_VOCAB, "the largest real vocabulary is 262144, Gemma 3's"},
      {"hidden_size", c->hidden_size, 1, CT_MAX_HIDDEN, "real models go up to ~16384"},
      {"intermediate_size", c->intermediate_size, 1, CT_MAX_INTERMEDIATE, "real models go up to ~53248"},
      {"num_hidden_layers", c->num_layers, 1, CT_MAX_LAYERS, "real models go up to ~128"},
      {"num_attention_heads", c->num_heads, 1, CT_MAX_HEADS, "real models go up to ~128"},
      {"num_key_value_heads", c->num_kv_heads, 1, c->num_heads, "at most num_attention_heads"},
      {"head_dim", c->head_dim, 2, CT_MAX_HEAD_DIM, "real models use 64 to 256"},
      {"max_position_embeddings", c->max_position_embeddings, 1, CT_MAX_POSITIONS,
       "real models go up to ~10M"},
      {"sliding_window", c->sliding_window, 0, CT_MAX_POSITIONS, "real windows are 512 to 4096"},
      {"num_labels", c->num_labels, 0, 1, "a reward model has one output"},
      {"mtp_num_layers", c->mtp_layers, 0, 16, "DeepSeek-V3 has 1"},
  };
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    int rc = check_size(sizes[i].key, sizes[i].v, sizes[i].lo, sizes[i].hi, sizes[i].real);
    if (rc) return rc;
  }
  if (c->num_heads % c->num_kv_heads)
    return ct_set_error(CT_EINVAL, "model: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)",
                        c->num_heads, c->num_kv_heads);
  if (c->head_dim % 2) return ct_set_error(CT_EINVAL, "model: head_dim (%d) must be even (RoPE pairs)", c->head_dim);
  int rc = 0;
  if ((rc = check_real("rope_theta", c->rope_theta, 0, 0)) || (rc = check_real("rms_norm_eps", c->rms_norm_eps, 0, 1)))
    return rc;
  if (c->rope_type == 2 && (rc = check_real("rope_scaling's factor", c->rope_factor, 0, 0))) return rc;
  if (c->sliding_window > 0 && (rc = check_real("rope_local_base_freq", c->rope_local_theta, 0, 0))) return rc;
  if (!(isfinite(c->query_pre_attn_scalar) && c->query_pre_attn_scalar >= 0) ||
      !(isfinite(c->attn_softcap) && c->attn_softcap >= 0))
    return ct_set_error(CT_EINVAL, "model: query_pre_attn_scalar (%g) and attn_logit_softcapping (%g) must be "
                        "positive", (double)c->query_pre_attn_scalar, (double)c->attn_softcap);
  if (c->rope_type == 1 &&
      (!(isfinite(c->rope_factor) && c->rope_factor > 0 && isfinite(c->rope_high_freq_factor) &&
         c->rope_high_freq_factor > c->rope_low_freq_factor && c->rope_low_freq_factor > 0) ||
       check_size("rope_scaling's original_max_position_embeddings", c->rope_original_max_pos, 1, CT_MAX_POSITIONS,
                  "real models use 8192")))
    return ct_set_error(CT_EINVAL, "model: rope_scaling (llama3) needs factor > 0, high_freq_factor > "
                        "low_freq_factor > 0 and original_max_position_embeddings in [1, %d]", CT_MAX_POSITIONS);
  return 0;
}

// ---------------------------------------------------------------------------
// Layout. Tensors are appended in Hugging Face order; a group of tensors that one
// sgemm treats as a single matrix is packed without gaps, and every group starts on a
// 64-byte boundary.

typedef struct {
  ct_tensor_info *t;
  int n, cap;
  long off;
} layout;

static int layout_add(layout *lo, const char *name, long d0, long d1, bool decay, bool group_start) {
  if (lo->n == lo->cap) {
    int cap = lo->cap ? 2 * lo->cap : 64;
    ct_tensor_info *t = realloc(lo->t, sizeof *t * cap);
    if (!t) return ct_set_error(CT_ENOMEM, "model: out of memory");
    lo->t = t;
    lo->cap = cap;
  }
  if (group_start) lo->off = (lo->off + 15) / 16 * 16;
  ct_tensor_info *t = &lo->t[lo->n++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->offset = lo->off;
  t->ndim = d1 ? 2 : 1;
  t->shape[0] = d0;
  t->shape[1] = d1;
  t->numel = d1 ? d0 * d1 : d0;
  t->decay = decay;
  lo->off += t->numel;
  return 0;
}

// One decoder layer's tensors, named prefix + the Hugging Face suffix.
static int add_layer(layout *lo, const ct_model_config *c, const char *prefix) {
  long C = c->hidden_size, F = c->intermediate_size, hd = c->head_dim;
  long Hd = c->num_heads * hd, KVd = c->num_kv_heads * hd;
  char nm[96];
  int rc = 0;
#define ADD(suffix, d0, d1, decay, group)                                  \
  do {                                                                     \
    snprintf(nm, sizeof nm, "%s%s", prefix, suffix);                       \
    if (rc == 0) rc = layout_add(lo, nm, d0, d1, decay, group);            \
  } while (0)
  ADD("input_layernorm.weight", C, 0, false, true);
  ADD("self_attn.q_proj.weight", Hd, C, true, true);
  ADD("self_attn.k_proj.weight", KVd, C, true, false);
  ADD("self_attn.v_proj.weight", KVd, C, true, false);
  if (c->qkv_bias) {
    ADD("self_attn.q_proj.bias", Hd, 0, false, true);
    ADD("self_attn.k_proj.bias", KVd, 0, false, false);
    ADD("self_attn.v_proj.bias", KVd, 0, false, false);
  }
  if (c->qk_norm) {
    ADD("self_attn.q_norm.weight", hd, 0, false, true);
    ADD("self_attn.k_norm.weight", hd, 0, false, true);
  }
  ADD("self_attn.o_proj.weight", C, Hd, true, true);
  ADD("post_attention_layernorm.weight", C, 0, false, true);
  if (c->gemma) {  // (inside the layer's span: layer_span runs from input_layernorm to down_proj)
    ADD("pre_feedforward_layernorm.weight", C, 0, false, true);
    ADD("post_feedforward_layernorm.weight", C, 0, false, true);
  }
  ADD("mlp.gate_proj.weight", F, C, true, true);
  ADD("mlp.up_proj.weight", F, C, true, false);
  ADD("mlp.down_proj.weight", C, F, true, true);
#undef ADD
  return rc;
}

// Multi-token prediction depth k's tensors (mtp.h), after every Hugging Face tensor:
// mtp.layers.<k>.{enorm, hnorm, eh_proj} then its decoder layer's, named as a layer's.
static int add_mtp_depth(layout *lo, const ct_model_config *c, int k) {
  long C = c->hidden_size;
  char pre[64], nm[96];
  snprintf(pre, sizeof pre, "mtp.layers.%d.", k);
  const char *norms[] = {"enorm.weight", "hnorm.weight"};
  int rc = 0;
  for (int i = 0; i < 2 && !rc; i++) {
    snprintf(nm, sizeof nm, "%s%s", pre, norms[i]);
    rc = layout_add(lo, nm, C, 0, false, true);
  }
  snprintf(nm, sizeof nm, "%seh_proj.weight", pre);
  if (!rc) rc = layout_add(lo, nm, C, 2 * C, true, true);
  return rc ? rc : add_layer(lo, c, pre);
}

static int build_layout(ct_model *m) {
  const ct_model_config *c = &m->cfg;
  long C = c->hidden_size, V = c->vocab_size;
  layout lo = {0};
  char pre[64];
  int rc = layout_add(&lo, "model.embed_tokens.weight", V, C, true, true);
  for (int l = 0; l < c->num_layers && rc == 0; l++) {
    snprintf(pre, sizeof pre, "model.layers.%d.", l);
    rc = add_layer(&lo, c, pre);
  }
  if (rc == 0) rc = layout_add(&lo, "model.norm.weight", C, 0, false, true);
  if (rc == 0 && !c->tie_word_embeddings && !c->num_labels) rc = layout_add(&lo, "lm_head.weight", V, C, true, true);
  if (rc == 0 && c->num_labels) rc = layout_add(&lo, "score.weight", c->num_labels, C, true, true);
  int n_hf = lo.n;
  for (int k = 0; k < c->mtp_layers && rc == 0; k++) rc = add_mtp_depth(&lo, c, k);
  if (rc) {
    free(lo.t);
    return rc;
  }
  m->tensors = lo.t;
  m->n_tensors = lo.n;
  m->n_hf_tensors = n_hf;
  m->n_floats = (lo.off + 15) / 16 * 16;
  return 0;
}

const ct_tensor_info *ct_model_find_tensor(const ct_model *m, const char *name) {
  for (int i = 0; i < m->n_tensors; i++)
    if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
  return NULL;
}

// Views of one decoder layer's tensors, which start at *t (add_layer's order); advances *t.
static void bind_layer(ct_layer_weights *lw, const ct_tensor_info **tp, const ct_model_config *c, float *base) {
  const ct_tensor_info *t = *tp;
#define NEXT() (base + (t++)->offset)
  lw->ln1 = NEXT();
  lw->wqkv = NEXT();
  t += 2;  // k_proj, v_proj follow q_proj in the same matrix
  if (c->qkv_bias) {
    lw->bqkv = NEXT();
    t += 2;
  }
  if (c->qk_norm) {
    lw->qnorm = NEXT();
    lw->knorm = NEXT();
  }
  lw->wo = NEXT();
  if (c->gemma) {
    lw->post_attn = NEXT();
    lw->ln2 = NEXT();  // pre_feedforward_layernorm
    lw->post_ff = NEXT();
  } else {
    lw->ln2 = NEXT();
  }
  lw->wgu = NEXT();
  t++;  // up_proj follows gate_proj
  lw->wdown = NEXT();
#undef NEXT
  *tp = t;
}

int ct_weights_bind(ct_weights *w, const ct_model *m, float *base) {
  const ct_model_config *c = &m->cfg;
  memset(w, 0, sizeof *w);
  w->layers = calloc(c->num_layers, sizeof *w->layers);
  if (c->mtp_layers > 0) w->mtp = calloc(c->mtp_layers, sizeof *w->mtp);
  if (!w->layers || (c->mtp_layers > 0 && !w->mtp)) {
    ct_weights_free(w);
    return ct_set_error(CT_ENOMEM, "model: out of memory");
  }
  // Tensors come in the order build_layout appended them.
  const ct_tensor_info *t = m->tensors;
#define NEXT() (base + (t++)->offset)
  w->embed = NEXT();
  for (int l = 0; l < c->num_layers; l++) bind_layer(&w->layers[l], &t, c, base);
  w->norm = NEXT();
  w->lm_head = c->tie_word_embeddings || c->num_labels ? w->embed : NEXT();
  w->score = c->num_labels ? NEXT() : NULL;
  for (int k = 0; k < c->mtp_layers; k++) {
    w->mtp[k].enorm = NEXT();
    w->mtp[k].hnorm = NEXT();
    w->mtp[k].eh_proj = NEXT();
    bind_layer(&w->mtp[k].block, &t, c, base);
  }
#undef NEXT
  return 0;
}

void ct_weights_free(ct_weights *w) {
  free(w->layers);
  free(w->mtp);
  w->layers = NULL;
  w->mtp = NULL;
}

// ---------------------------------------------------------------------------
// RoPE tables, computed as Hugging Face does in float32: inv_freq = 1 / theta^(2i/hd),
// angle = pos * inv_freq, then cos and sin.

static void rope_inv_freq(const ct_model_config *c, float *inv_freq) {
  int half = c->head_dim / 2;
  for (int i = 0; i < half; i++) {
    float expo = (float)(2 * i) / (float)c->head_dim;
    inv_freq[i] = (float)(1.0 / pow((double)c->rope_theta, (double)expo));
  }
  if (c->rope_type == 2)  // linear: positions divided by factor
    for (int i = 0; i < half; i++) inv_freq[i] = (float)(inv_freq[i] / (double)c->rope_factor);
  if (c->rope_type != 1) return;
  // Llama 3.1 "llama3" scaling: long wavelengths divided by factor, short ones kept,
  // a smooth blend in between (transformers' _compute_llama3_parameters).
  double old = c->rope_original_max_pos, factor = c->rope_factor;
  double lo_f = c->rope_low_freq_factor, hi_f = c->rope_high_freq_factor;
  double low_wavelen = old / lo_f, high_wavelen = old / hi_f;
  for (int i = 0; i < half; i++) {
    double f = inv_freq[i], wavelen = 2 * M_PI / f;
    double g = wavelen > low_wavelen ? f / factor : f;
    if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
      double smooth = (old / wavelen - lo_f) / (hi_f - lo_f);
      g = (1 - smooth) * g / factor + smooth * g;
    }
    inv_freq[i] = (float)g;
  }
}

void ct_rope_fill(const ct_model_config *c, int max_pos, float *cos_t, float *sin_t) {
  int half = c->head_dim / 2;
  float inv_freq[half > 0 ? half : 1];
  rope_inv_freq(c, inv_freq);
  for (int p = 0; p < max_pos; p++)
    for (int i = 0; i < half; i++) {
      float angle = (float)p * inv_freq[i];
      cos_t[(long)p * half + i] = (float)cos((double)angle);
      sin_t[(long)p * half + i] = (float)sin((double)angle);
    }
}

void ct_rope_fill_local(const ct_model_config *c, int max_pos, float *cos_t, float *sin_t) {
  ct_model_config lc = *c;
  lc.rope_theta = c->rope_local_theta;
  lc.rope_type = 0;
  ct_rope_fill(&lc, max_pos, cos_t, sin_t);
}

float ct_attn_scale(const ct_model_config *c) {
  float s = c->query_pre_attn_scalar > 0 ? c->query_pre_attn_scalar : (float)c->head_dim;
  return (float)(1.0 / sqrt((double)s));
}

const float *ct_norm_weight(const ct_model_config *c, const float *w, int n, float *buf) {
  if (!c->gemma) return w;
  for (int i = 0; i < n; i++) buf[i] = 1.0f + w[i];
  return buf;
}

float ct_embed_scale(const ct_model_config *c) {
  return c->gemma ? (float)sqrt((double)c->hidden_size) : 1.0f;
}

int ct_model_layout(ct_model *m, const ct_model_config *cfg) {
  memset(m, 0, sizeof *m);
  m->cfg = *cfg;
  int rc = ct_model_config_check(cfg);
  if (!rc) rc = build_layout(m);
  return rc;
}

int ct_model_rope_reserve(ct_model *m, int max_pos) {
  if (max_pos <= m->rope_max_pos) return 0;
  long half = m->cfg.head_dim / 2;
  bool local = ct_has_local_rope(&m->cfg);
  float **tabs[4] = {&m->rope_cos, &m->rope_sin, &m->rope_cos_local, &m->rope_sin_local};
  for (int i = 0; i < (local ? 4 : 2); i++) {
    float *t = realloc(*tabs[i], sizeof(float) * max_pos * half);
    if (!t) return ct_set_error(CT_ENOMEM, "model: cannot allocate a RoPE table of %d positions", max_pos);
    *tabs[i] = t;
  }
  ct_rope_fill(&m->cfg, max_pos, m->rope_cos, m->rope_sin);
  if (local) ct_rope_fill_local(&m->cfg, max_pos, m->rope_cos_local, m->rope_sin_local);
  m->rope_max_pos = max_pos;
  return 0;
}

const char *const ct_store_names[] = {"float32", "bfloat16", "int8", NULL};
_Static_assert(sizeof ct_store_names / sizeof *ct_store_names == CT_STORE_COUNT + 1,
               "ct_store_names must name every CT_STORE_* value");

int ct_model_init(ct_model *m, const ct_model_config *cfg, int max_pos) {
  int rc = ct_model_layout(m, cfg);
  return rc ? rc : ct_model_alloc(m, max_pos);
}

int ct_model_alloc(ct_model *m, int max_pos) {
  int rc;
  m->params = ct_big_alloc(sizeof(float) * m->n_floats);  // zeroed by the kernel
  if (!m->params) {
    double mb = m->n_floats * 4.0 / 1e6;  // (ct_model_free clears the struct)
    ct_model_free(m);
    return ct_set_error(CT_ENOMEM, "model: cannot allocate %.1f MB of parameters", mb);
  }
  if ((rc = ct_model_rope_reserve(m, max_pos > 0 ? max_pos : 1)) ||
      (rc = ct_weights_bind(&m->w, m, m->params))) {
    ct_model_free(m);
    return rc;
  }
  return 0;
}

void ct_model_free(ct_model *m) {
  ct_weights_free(&m->w);
  free(m->tensors);
  ct_big_free(m->params);
  ct_big_free(m->params16);
  if (m->compute16 != m->params16) ct_big_free(m->compute16);  // (else the same buffer)
  ct_big_free(m->wide);
  ct_big_free(m->emb32);
  ct_big_free(m->params8);
  ct_big_free(m->s8);
  ct_free_all(m->s8off, m->off16, m->rope_cos, m->rope_sin, m->rope_cos_local, m->rope_sin_local);
  memset(m, 0, sizeof *m);
}

void ct_model_size_text(const ct_model_config *c, char *buf, size_t n) {
  double C = c->hidden_size, F = c->intermediate_size, hd = c->head_dim;
  double layer = C * (c->num_heads + 2.0 * c->num_kv_heads) * hd + C * c->num_heads * hd + 3 * C * F;
  double emb = (double)c->vocab_size * C * (c->tie_word_embeddings ? 1 : 2), total = emb + layer * c->num_layers;
  snprintf(buf, n, "%.3g billion parameters: num_hidden_layers %d x %.3g million a layer (hidden_size %d, "
           "intermediate_size %d, num_attention_heads %d x head_dim %d), vocab_size %d x hidden_size %d = %.3g "
           "million%s", total / 1e9, c->num_layers, layer / 1e6, c->hidden_size, c->intermediate_size, c->num_heads,
           c->head_dim, c->vocab_size, c->hidden_size, emb / 1e6, c->tie_word_embeddings ? "" : " with the LM head");
}

double ct_model_param_bytes(const ct_model *m, bool bf16) { return (double)m->n_floats * (bf16 ? 2 : 4); }

uint64_t ct_model_checksum(const ct_model *m) {
  long n = m->n_floats, VC = (long)m->cfg.vocab_size * m->cfg.hidden_size;
  bool tied = m->w.lm_head == m->w.embed;
  uint64_t h = 0;
  if (m->params) h = ct_xxh64_blocks(m->params, sizeof(float) * n, h);
  if (m->params16) h = ct_xxh64_blocks(m->params16, sizeof(uint16_t) * n, h);
  if (m->params8) {  // the matrices as int8, then the row scales and the vectors
    const ct_tensor_info *t = &m->tensors[m->n_tensors - 1];
    long s8 = m->s8off[m->n_tensors - 1] + (t->ndim == 2 ? t->shape[0] : t->numel);
    h = ct_xxh64_blocks(m->params8, (size_t)n, h);
    h = ct_xxh64_blocks(m->s8, sizeof(float) * s8, h);
  }
  if (m->emb32) h = ct_xxh64_blocks(m->emb32, sizeof(float) * VC * (tied ? 1 : 2), h);
  return h;
}

// ---------------------------------------------------------------------------
// Initialization. Value k of tensor i is a function of (seed, i, k) alone: Box-Muller
// over a counter hashed with splitmix64's finalizer, both outputs used, in float with
// vectorizable math (ct_logf, a polynomial sin/cos of 2πt accurate to 1e-7).

// out[2j], out[2j+1] = two standard normals from counter c0 + j, for j < n.
static void normals(uint64_t key, uint64_t c0, int n, float *out) {
#pragma omp simd
  for (int j = 0; j < n; j++) {
    uint64_t z = key + (c0 + (uint64_t)j) * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    int32_t hi = (int32_t)(z >> 40), lo = (int32_t)(z & 0xffffff);
    float u1 = ((float)hi + 0.5f) * 0x1p-24f;  // (0, 1)
    float t = (float)lo * 0x1p-24f;            // [0, 1): the angle in turns
    float r = sqrtf(-2.0f * ct_logf(u1));
    const float magic = 12582912.0f;           // 1.5·2^23: rounds to an integer (fastmath.h)
    float qm = t * 4.0f + magic, q = qm - magic;  // the nearest quarter turn, 0..4
    int32_t qb;
    memcpy(&qb, &qm, 4);
    int32_t k = qb & 3;
    float x = (t * 4.0f - q) * 1.5707963267948966f, x2 = x * x;  // x in [-π/4, π/4]
    float sx = x * (1 + x2 * (-1.0f / 6 + x2 * (1.0f / 120 + x2 * (-1.0f / 5040 + x2 * (1.0f / 362880)))));
    float cx = 1 + x2 * (-0.5f + x2 * (1.0f / 24 + x2 * (-1.0f / 720 + x2 * (1.0f / 40320))));
    // rotate by k quarter turns: (sin, cos) = (sx, cx), (cx, −sx), (−sx, −cx), (−cx, sx)
    float sgs = 1.0f - 2.0f * (float)((k >> 1) & 1), sgc = 1.0f - 2.0f * (float)(((k + 1) >> 1) & 1);
    bool odd = k & 1;
    out[2 * j] = r * sgc * (odd ? sx : cx);
    out[2 * j + 1] = r * sgs * (odd ? cx : sx);
  }
}

typedef struct {
  ct_model *m;
  uint64_t seed;
  float std;
  int parts;
  int first;  // the first tensor initialized
} init_job;

enum { INIT_BLOCK = 4096 };  // values per block: a block is the unit of work and of the counter

static void init_task(void *ctx, int part, int thread) {
  (void)thread;
  const init_job *j = ctx;
  float buf[INIT_BLOCK];
  for (int i = j->first; i < j->m->n_tensors; i++) {
    const ct_tensor_info *t = &j->m->tensors[i];
    float *p = j->m->params + t->offset;
    if (t->ndim == 1) {  // norms 1, biases 0: the first part writes them
      // Gemma's norms apply 1 + w: its identity is w = 0, as transformers initializes it
      bool is_norm = strstr(t->name, "norm") != NULL && !j->m->cfg.gemma;
      for (long k = 0; part == 0 && k < t->numel; k++) p[k] = is_norm ? 1.0f : 0.0f;
      continue;
    }
    long blocks = (t->numel + INIT_BLOCK - 1) / INIT_BLOCK, lo, hi;
    ct_chunk_range(blocks, 1, j->parts, part, &lo, &hi);
    uint64_t key = j->seed * 0xd1b54a32d192ed03ULL + (uint64_t)(i + 1) * 0x8cb92ba72f3d8dd7ULL;
    for (long b = lo; b < hi; b++) {
      long k0 = b * INIT_BLOCK, n = t->numel - k0 < INIT_BLOCK ? t->numel - k0 : INIT_BLOCK;
      normals(key, (uint64_t)k0 / 2, INIT_BLOCK / 2, buf);
      for (long k = 0; k < n; k++) p[k0 + k] = j->std * buf[k];
    }
  }
}

void ct_model_init_random(ct_model *m, uint64_t seed, float std) { ct_model_init_random_from(m, 0, seed, std); }

void ct_model_init_random_from(ct_model *m, int first, uint64_t seed, float std) {
  init_job j = {m, seed, std, ct_pool_threads() * 4, first};
  ct_parallel_for(j.parts, init_task, &j);
}

// ---------------------------------------------------------------------------
// bfloat16 storage: the whole layout narrowed; a layer is widened on demand into
// m->wide at the same offsets relative to its first tensor (every layer has the same
// relative layout: groups start on 16-float boundaries).

enum { HEAD_ROWS = 1024 };  // LM-head rows widened at a time

static long layer_start(const ct_model *m, int l) { return m->w.layers[l].ln1 - m->params; }
// Floats from a layer's first tensor (input_layernorm) to the end of its last (down_proj),
// from the tensor table (so a layout without parameters has it too).
static long layer_span(const ct_model *m) {
  const ct_tensor_info *first = ct_model_find_tensor(m, "model.layers.0.input_layernorm.weight");
  const ct_tensor_info *last = ct_model_find_tensor(m, "model.layers.0.mlp.down_proj.weight");
  return first && last ? last->offset + last->numel - first->offset : 0;
}

// m->wide_layer: views into m->wide (one layer's floats, widened there one layer at a time)
// at each tensor's offset from the layer's first (NULL for tensors the model lacks).
static void wide_views(ct_model *m) {
  const ct_layer_weights *L = &m->w.layers[0];
  float *w = m->wide;
#define REL(f) m->wide_layer.f = L->f ? w + (L->f - L->ln1) : NULL
  REL(ln1); REL(wqkv); REL(bqkv); REL(qnorm); REL(knorm); REL(wo); REL(post_attn); REL(ln2); REL(post_ff);
  REL(wgu); REL(wdown);
#undef REL
}

typedef struct {
  const float *src;
  uint16_t *dst;
} narrow_job;

static void narrow_range(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const narrow_job *j = ctx;
  ct_bf16_narrow(j->dst + lo, j->src + lo, hi - lo);
}

// dst (n) = bf16 of src (n), on the pool.
static void narrow_parallel(uint16_t *dst, const float *src, long n) {
  narrow_job j = {src, dst};
  ct_parallel_ranges(n, 64, ct_pool_threads() * 4, narrow_range, &j);
}

int ct_model_bf16_compute(ct_model *m) {
  if (m->params16) {  // stored in bf16 already: the matmuls read the stored weights
    m->compute16 = m->params16;
    return 0;
  }
  if (!m->params) return ct_set_error(CT_EINVAL, "model: bf16 compute needs float32 or bfloat16 parameters");
  if (!m->compute16) m->compute16 = ct_big_alloc(sizeof(uint16_t) * m->n_floats);
  if (!m->compute16) return ct_set_error(CT_ENOMEM, "model: out of memory for the bf16 weight copy");
  ct_model_bf16_refresh(m);
  return 0;
}

void ct_model_bf16_refresh(ct_model *m) {
  if (m->compute16 && m->params) narrow_parallel(m->compute16, m->params, m->n_floats);
}

// p within [base, base + n) (compared as integers: p and base may be distinct objects)
static bool points_into(const float *p, const float *base, long n) {
  uintptr_t u = (uintptr_t)p, b = (uintptr_t)base;
  return base && u >= b && u < b + sizeof(float) * (uintptr_t)n;
}

const uint16_t *ct_model_w16(const ct_model *m, const float *w) {
  if (!m->compute16 || !w) return NULL;
  if (m->params) return points_into(w, m->params, m->n_floats) ? m->compute16 + (w - m->params) : NULL;
  // bf16 storage (compute16 == params16): the fp32 views are the widened layer in m->wide
  // (off16[L + 2] says which) and the float32 embedding / head kept in emb32
  int L = m->cfg.num_layers;
  long VC = (long)m->cfg.vocab_size * m->cfg.hidden_size, C = m->cfg.hidden_size;
  if (points_into(w, m->wide, m->wide_floats - C)) return m->compute16 + m->off16[L + 2] + (w - m->wide);
  bool tied = m->cfg.tie_word_embeddings;
  if (points_into(w, m->emb32, VC)) return m->compute16 + m->off16[L] + (w - m->emb32);
  if (!tied && points_into(w, m->emb32 + VC, VC)) return m->compute16 + m->off16[L + 1] + (w - m->emb32 - VC);
  return NULL;
}

// Floats of m->wide: a layer's span or HEAD_ROWS rows of the head, then the final norm.
static long wide_floats(const ct_model *m) {
  long C = m->cfg.hidden_size, span = layer_span(m);
  return (span > HEAD_ROWS * C ? span : HEAD_ROWS * C) + C;
}

double ct_model_bf16_bytes(const ct_model *m, bool keep_embeddings) {
  long VC = (long)m->cfg.vocab_size * m->cfg.hidden_size;
  double emb = keep_embeddings ? sizeof(float) * (double)VC * (m->cfg.tie_word_embeddings ? 1 : 2) : 0;
  return sizeof(uint16_t) * (double)m->n_floats + sizeof(float) * (double)wide_floats(m) + emb;
}

int ct_model_to_bf16(ct_model *m, bool keep_embeddings) {
  if (m->params16) return 0;
  long C = m->cfg.hidden_size, wide = wide_floats(m);
  m->params16 = ct_big_alloc(sizeof(uint16_t) * m->n_floats);
  m->wide = ct_big_alloc(sizeof(float) * wide);
  if (!m->params16 || !m->wide) return ct_set_error(CT_ENOMEM, "model: out of memory for bf16 weights");
  m->wide_floats = wide;
  narrow_parallel(m->params16, m->params, m->n_floats);
  ct_bf16_widen(m->wide + wide - C, m->params16 + (m->w.norm - m->params), C);  // as stored
  // offsets of what gets widened later; the fp32 views go away with the fp32 parameters
  wide_views(m);
  m->off16 = malloc(sizeof(long) * (m->cfg.num_layers + 3));
  if (!m->off16) return ct_set_error(CT_ENOMEM, "model: out of memory");
  for (int l = 0; l < m->cfg.num_layers; l++) m->off16[l] = layer_start(m, l);
  m->off16[m->cfg.num_layers] = m->w.embed - m->params;
  m->off16[m->cfg.num_layers + 1] = m->w.lm_head - m->params;
  m->off16[m->cfg.num_layers + 2] = m->off16[0];
  if (m->compute16) {  // a bf16 compute copy equals the stored weights (same rounding): share it
    ct_big_free(m->compute16);
    m->compute16 = m->params16;
  }
  float *embed = NULL, *head = NULL;  // float32 copies kept when asked
  long VC = (long)m->cfg.vocab_size * C;
  if (keep_embeddings) {
    bool tied = m->w.lm_head == m->w.embed;
    m->emb32 = ct_big_alloc(sizeof(float) * VC * (tied ? 1 : 2));
    if (!m->emb32) return ct_set_error(CT_ENOMEM, "model: out of memory");
    memcpy(m->emb32, m->w.embed, sizeof(float) * VC);
    if (!tied) memcpy(m->emb32 + VC, m->w.lm_head, sizeof(float) * VC);
    embed = m->emb32;
    head = tied ? m->emb32 : m->emb32 + VC;
  }
  ct_weights_free(&m->w);
  memset(&m->w, 0, sizeof m->w);
  m->w.norm = m->wide + wide - C;
  m->w.embed = embed;  // NULL: widened from params16 row by row / chunk by chunk
  m->w.lm_head = head;
  ct_big_free(m->params);
  m->params = NULL;
  return 0;
}
ct_model_config ct_model_config_smollm135m(int layers) {
  return (ct_model_config){.model_type = "llama", .vocab_size = 49152, .hidden_size = 576,
                           .intermediate_size = 1536, .num_layers = layers, .num_heads = 9,
                           .num_kv_heads = 3, .head_dim = 64, .max_position_embeddings = 2048,
                           .rope_theta = 10000, .rms_norm_eps = 1e-5f,
                           .tie_word_embeddings = true, .bos_token_id = 0, .eos_token_id = 0,
                           .pad_token_id = 0};
}

ct_model_config ct_model_config_gemma3_270m(int layers) {
  ct_model_config c = {.model_type = "gemma3_text", .vocab_size = 262144, .hidden_size = 640,
                       .intermediate_size = 2048, .num_layers = layers, .num_heads = 4, .num_kv_heads = 1,
                       .head_dim = 256, .max_position_embeddings = 32768, .rope_theta = 1e6f,
                       .rms_norm_eps = 1e-6f, .tie_word_embeddings = true, .qk_norm = true,
                       .bos_token_id = 2, .eos_token_id = 1, .pad_token_id = 0, .gemma = true,
                       .query_pre_attn_scalar = 256, .sliding_window = 512, .rope_local_theta = 10000};
  for (int l = 0; l < layers && l < CT_MAX_LAYERS; l++) c.sliding[l] = (l + 1) % 6 != 0;
  return c;
}

double ct_model_train_flops_per_token(const ct_model_config *c, int T) {
  double C = c->hidden_size, F = c->intermediate_size, hd = c->head_dim;
  double H = c->num_heads, KV = c->num_kv_heads, V = c->vocab_size, L = c->num_layers;
  double per_layer = C * (H + 2 * KV) * hd + H * hd * C + 3 * C * F;
  double matmul_params = L * per_layer + V * C;  // the LM head is a matmul; the embedding lookup is not
  // causal attention: QKᵀ and PV each 2·hd FLOPs per (query, key) pair, T/2 keys on average
  double attn = L * H * 2 * (2 * hd) * (T / 2.0);
  return 6 * matmul_params + 3 * attn;
}

double ct_model_int8_bytes(const ct_model *m) {
  long VC = (long)m->cfg.vocab_size * m->cfg.hidden_size, s = 0;
  for (int i = 0; i < m->n_tensors; i++) s += m->tensors[i].ndim == 2 ? m->tensors[i].shape[0] : m->tensors[i].numel;
  return (double)m->n_floats + sizeof(float) * ((double)s + (double)wide_floats(m) +
                                                (double)VC * (m->cfg.tie_word_embeddings ? 1 : 2));
}

int ct_model_to_int8(ct_model *m) {
  if (m->params8 || m->params16 || !m->params) return ct_set_error(CT_EINVAL, "model: already narrowed");
  long C = m->cfg.hidden_size, wide = wide_floats(m), VC = (long)m->cfg.vocab_size * C, total = 0;
  bool tied = m->w.lm_head == m->w.embed;
  m->s8off = malloc(sizeof(long) * m->n_tensors);
  for (int i = 0; m->s8off && i < m->n_tensors; i++) {
    m->s8off[i] = total;
    total += m->tensors[i].ndim == 2 ? m->tensors[i].shape[0] : m->tensors[i].numel;
  }
  m->params8 = ct_big_alloc((size_t)m->n_floats);
  m->s8 = ct_big_alloc(sizeof(float) * (total ? total : 1));
  m->wide = ct_big_alloc(sizeof(float) * wide);
  m->emb32 = ct_big_alloc(sizeof(float) * VC * (tied ? 1 : 2));
  m->off16 = malloc(sizeof(long) * (m->cfg.num_layers + 3));
  if (!m->s8off || !m->params8 || !m->s8 || !m->wide || !m->emb32 || !m->off16)
    return ct_set_error(CT_ENOMEM, "model: out of memory for int8 weights");
  m->wide_floats = wide;
  for (int i = 0; i < m->n_tensors; i++) {
    const ct_tensor_info *t = &m->tensors[i];
    if (t->ndim == 2)
      ct_quantize_rows_int8(m->params + t->offset, (int)t->shape[0], (int)t->shape[1], m->params8 + t->offset,
                            m->s8 + m->s8off[i]);
    else
      memcpy(m->s8 + m->s8off[i], m->params + t->offset, sizeof(float) * t->numel);
  }
  memcpy(m->wide + wide - C, m->w.norm, sizeof(float) * C);  // a vector: kept as it is
  memcpy(m->emb32, m->w.embed, sizeof(float) * VC);
  if (!tied) memcpy(m->emb32 + VC, m->w.lm_head, sizeof(float) * VC);
  wide_views(m);
  for (int l = 0; l < m->cfg.num_layers; l++) m->off16[l] = layer_start(m, l);
  m->off16[m->cfg.num_layers] = m->off16[m->cfg.num_layers + 1] = 0;  // (the embeddings stay float32)
  m->off16[m->cfg.num_layers + 2] = m->off16[0];
  ct_big_free(m->compute16);  // int8 weights multiply in fp32 (dequantized), not from a bf16 copy
  m->compute16 = NULL;
  ct_weights_free(&m->w);
  memset(&m->w, 0, sizeof m->w);
  m->w.norm = m->wide + wide - C;
  m->w.embed = m->emb32;
  m->w.lm_head = tied ? m->emb32 : m->emb32 + VC;
  ct_big_free(m->params);
  m->params = NULL;
  return 0;
}

// int8: every tensor of layer l, dequantized (matrices) or copied (vectors) into m->wide.
static void widen_int8_layer(const ct_model *m, int l) {
  long start = m->off16[l], span = layer_span(m);
  for (int i = 0; i < m->n_tensors; i++) {
    const ct_tensor_info *t = &m->tensors[i];
    if (t->offset < start || t->offset >= start + span) continue;
    float *dst = m->wide + (t->offset - start);
    const float *s = m->s8 + m->s8off[i];
    if (t->ndim == 1) {
      memcpy(dst, s, sizeof(float) * t->numel);
      continue;
    }
    const int8_t *q = m->params8 + t->offset;
    long cols = t->shape[1];
    for (long r = 0; r < t->shape[0]; r++)
#pragma omp simd
      for (long c = 0; c < cols; c++) dst[r * cols + c] = (float)q[r * cols + c] * s[r];
  }
}

const ct_layer_weights *ct_model_layer(const ct_model *m, int l) {
  if (m->params8) widen_int8_layer(m, l);
  else if (m->params16) ct_bf16_widen(m->wide, m->params16 + m->off16[l], layer_span(m));
  else return &m->w.layers[l];
  m->off16[m->cfg.num_layers + 2] = m->off16[l];  // what m->wide holds (ct_model_w16)
  return &m->wide_layer;
}

void ct_model_embed(const ct_model *m, const int *ids, int n, float *out) {
  int C = m->cfg.hidden_size;
  if (m->w.embed) {
    ct_embed_forward(out, m->w.embed, ids, n, C);
    return;
  }
  const uint16_t *E = m->params16 + m->off16[m->cfg.num_layers];
  for (int i = 0; i < n; i++) ct_bf16_widen(out + (long)i * C, E + (long)ids[i] * C, C);
}

const float *ct_model_norm(const ct_model *m) { return m->w.norm; }

void ct_model_logits(const ct_model *m, const float *hidden, int n, int v0, int nv, float *out) {
  int C = m->cfg.hidden_size;
  if (m->w.lm_head) {
    ct_sgemm('N', 'T', n, nv, C, 1, hidden, C, m->w.lm_head + (long)v0 * C, C, 0, out, nv);
    return;
  }
  const uint16_t *W = m->params16 + m->off16[m->cfg.num_layers + 1];
  for (int r = 0; r < nv; r += HEAD_ROWS) {  // widen HEAD_ROWS rows, then their columns of out
    int k = nv - r < HEAD_ROWS ? nv - r : HEAD_ROWS;
    ct_bf16_widen(m->wide, W + (long)(v0 + r) * C, (long)k * C);
    ct_sgemm('N', 'T', n, k, C, 1, hidden, C, m->wide, C, 0, out + r, nv);
  }
}
