// model: the Llama-family decoder (Llama 2/3, Qwen2/2.5, Qwen3, SmolLM, Mistral, Gemma 3):
// token embedding, L x [RMSNorm -> GQA attention with rotate-half RoPE (optional q/k/v
// bias, optional per-head q/k RMSNorm) -> residual -> RMSNorm -> SwiGLU MLP -> residual],
// final RMSNorm, LM head (tied or separate). Gemma 3 (cfg.gemma) differs in: embeddings
// times sqrt(C); every RMSNorm applies (1 + w); a norm on the attention output and on the
// MLP output before each residual add; MLP gelu_tanh(gate)·up; attention scale
// query_pre_attn_scalar^-0.5; sliding-window layers with their own RoPE base. Parameters keep Hugging Face names and
// [out, in] layouts; y = x · Wᵀ.
//
// Dimensions, named once: B batch rows, T tokens per row, N = B*T, C hidden size,
// H query heads, KV key/value heads, hd head size, F MLP size, V vocabulary, L layers,
// QKV = (H + 2*KV) * hd (the fused q|k|v width).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Bounds on a model's sizes, checked by ct_model_config_check before any layout is built:
// well above every real model (vocab 262144 in Gemma 3; hidden 16384, intermediate 53248,
// 126 layers, 128 heads in Llama 3.1 405B; head_dim 64-256; 10M positions in Llama 4
// Scout) and low enough that no product of them overflows a long (a layout within them
// has < 2^49 floats), so that an absurd config.json is refused from its keys alone.
#define CT_MAX_LAYERS 256               // num_hidden_layers (and ct_model_config.sliding's size)
#define CT_MAX_VOCAB (1 << 22)          // vocab_size
#define CT_MAX_HIDDEN (1 << 17)         // hidden_size
#define CT_MAX_INTERMEDIATE (1 << 20)   // intermediate_size
#define CT_MAX_HEADS 1024               // num_attention_heads (and so num_key_value_heads)
#define CT_MAX_HEAD_DIM 1024            // head_dim
#define CT_MAX_POSITIONS (1 << 26)      // max_position_embeddings, sliding_window, rope positions

typedef struct {
  char model_type[32];  // llama | qwen2 | qwen3 | mistral | gemma3_text (written back to config.json)
  int vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim;
  int max_position_embeddings;
  float rope_theta, rms_norm_eps;
  bool tie_word_embeddings;
  bool qkv_bias;  // q/k/v projections carry biases (Qwen2; Llama's attention_bias)
  bool qk_norm;   // per-head RMSNorm of q and k before RoPE (Qwen3)
  // rope_scaling {"rope_type": "llama3", ...} (Llama 3.1+) or "linear" (Gemma 3 4B+):
  // rope_type 0 = none, 1 = llama3, 2 = linear (inv_freq / rope_factor)
  int rope_type;
  float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
  int rope_original_max_pos;
  int bos_token_id, eos_token_id, pad_token_id;  // -1 when absent
  // 0: a causal LM (lm_head). 1: a sequence-classification model (reward model,
  // *ForSequenceClassification): a score head (num_labels, C) = score.weight in place of
  // the LM head, which it has none of (lm_head views the embedding, as when tied).
  int num_labels;
  // Gemma 3 (gemma3_text): the layer differences listed at the top of this file
  bool gemma;
  float query_pre_attn_scalar;  // scores scaled by its ^-0.5; 0 = head_dim (Llama)
  float attn_softcap;           // attn_logit_softcapping: scores c·tanh(s/c); 0 = none
  // sliding-window layers: query i sees key j when 0 <= i - j < sliding_window, and
  // RoPE uses rope_local_theta (no scaling) there
  int sliding_window;           // 0 = every layer full
  float rope_local_theta;
  unsigned char sliding[CT_MAX_LAYERS];  // layer l is a sliding-window layer
  // Multi-token prediction depths D (mtp.h): not in config.json (the trainer's key
  // mtp_num_layers sets it); their tensors follow the Hugging Face ones in the layout
  int mtp_layers;
} ct_model_config;

// Layer l's attention window: sliding_window for a sliding layer, 0 (all) otherwise.
static inline int ct_layer_window(const ct_model_config *c, int l) {
  return c->sliding_window > 0 && l < CT_MAX_LAYERS && c->sliding[l] ? c->sliding_window : 0;
}
// The attention score scale: query_pre_attn_scalar^-0.5, or head_dim^-0.5.
float ct_attn_scale(const ct_model_config *c);
// The weight (n) a norm multiplies by: w itself, or for Gemma 1 + w written into buf (n).
const float *ct_norm_weight(const ct_model_config *c, const float *w, int n, float *buf);
// Gemma's embedding scale sqrt(C) as transformers applies it (a float32 scalar), or 1.
float ct_embed_scale(const ct_model_config *c);

// Pointers into one flat buffer laid out like the parameters. The same layout serves
// parameters, gradients and optimizer moments, so each of those is one allocation.
// Within a layer q|k|v weights are adjacent (one (QKV, C) matrix) and gate|up are
// adjacent (one (2F, C) matrix), so each pair runs as a single sgemm.
typedef struct {
  float *ln1;    // (C)        input_layernorm
  float *wqkv;   // (QKV, C)   q_proj | k_proj | v_proj
  float *bqkv;   // (QKV)      their biases, or NULL
  float *qnorm;  // (hd)       or NULL
  float *knorm;  // (hd)       or NULL
  float *wo;     // (C, H*hd)  o_proj
  float *post_attn;  // (C)    Gemma: post_attention_layernorm (on the attention output), else NULL
  float *ln2;    // (C)        post_attention_layernorm; Gemma: pre_feedforward_layernorm
  float *post_ff;    // (C)    Gemma: post_feedforward_layernorm (on the MLP output), else NULL
  float *wgu;    // (2F, C)    gate_proj | up_proj
  float *wdown;  // (C, F)     down_proj
} ct_layer_weights;

// One multi-token prediction depth (mtp.h): h_k = block(eh_proj · [enorm(emb); hnorm(h_{k-1})]).
typedef struct {
  float *enorm;    // (C)      RMSNorm of the embedding of token i+k
  float *hnorm;    // (C)      RMSNorm of the previous depth's hidden state
  float *eh_proj;  // (C, 2C)  over [enorm(emb) | hnorm(h)], DeepSeek-V3's order
  ct_layer_weights block;  // one decoder layer of the model's own kind
} ct_mtp_weights;

typedef struct {
  float *embed;              // (V, C)
  ct_layer_weights *layers;  // (L)
  float *norm;               // (C)
  float *lm_head;            // (V, C): embed when tied
  float *score;              // (num_labels, C) score.weight of a sequence classifier, or NULL
  ct_mtp_weights *mtp;       // (cfg.mtp_layers) multi-token prediction depths, or NULL
} ct_weights;

// One named tensor of the flat layout.
typedef struct {
  char name[96];  // Hugging Face name, e.g. model.layers.0.self_attn.q_proj.weight
  long offset;    // in floats from the start of the buffer
  long numel;
  int ndim;
  long shape[2];
  bool decay;  // receives weight decay (matrices; not norms or biases, as in HF Trainer)
} ct_tensor_info;

// A set of named tensors in one flat buffer: a model's parameters, or LoRA adapters. The
// optimizer and the tensor files work on this, whatever the set is.
typedef struct {
  int n_tensors;
  const ct_tensor_info *tensors;
  long n_floats;
} ct_layout;

typedef struct {
  ct_model_config cfg;
  int n_tensors;
  ct_tensor_info *tensors;
  int n_hf_tensors;       // the first n_hf_tensors are the Hugging Face model's (model.safetensors);
                          // the rest, cfg.mtp_layers > 0, are multi-token prediction's (mtp.safetensors)
  long n_floats;          // size of the flat buffer
  float *params;          // (n_floats) one allocation (ct_big_alloc); NULL when stored in bf16
  ct_weights w;           // views into params
  float *rope_cos, *rope_sin;  // (max_pos, hd/2)
  float *rope_cos_local, *rope_sin_local;  // (max_pos, hd/2) sliding layers' (rope_local_theta), or NULL
  int rope_max_pos;
  // bfloat16 storage (ct_model_to_bf16: frozen models only, never trained)
  uint16_t *params16;     // (n_floats) the parameters in bf16, params == NULL
  float *wide;            // one layer's span widened to fp32 (ct_model_layer), then the
                          // final norm; also the LM head's widening chunks
  long wide_floats;
  ct_layer_weights wide_layer;  // views into wide for the layer widened last
  long *off16;            // (L + 3) offsets in params16 of each layer, the embedding, the head,
                          // and of the layer widened into m->wide last
  float *emb32;           // float32 embedding (+ untied head) kept by ct_model_to_bf16(m, true)
  // bf16 compute (ct_model_bf16_compute, bf16: true): a bf16 copy of params that the
  // matmuls read, refreshed after each optimizer step (ct_adamw_step) from params; for a
  // model stored in bf16 it is params16 itself (no second copy)
  uint16_t *compute16;    // (n_floats), or NULL: matmuls in fp32
  // int8 storage (ct_model_to_int8: a LoRA base): matrices as int8 with one scale per row
  int8_t *params8;        // (n_floats) the matrices' values at their offsets
  float *s8;              // per tensor: a matrix's row scales, or a vector's float32 values
  long *s8off;            // (n_tensors) where each tensor's entry in s8 starts
} ct_model;

// Checks a config for consistency (heads divide, sizes positive, ...).
int ct_model_config_check(const ct_model_config *c);

// RoPE tables (max_pos, hd/2) as Hugging Face computes them in float32 (incl. llama3 scaling).
void ct_rope_fill(const ct_model_config *c, int max_pos, float *cos_t, float *sin_t);
// The same for sliding-window layers: rope_local_theta, no scaling.
void ct_rope_fill_local(const ct_model_config *c, int max_pos, float *cos_t, float *sin_t);
// Whether the config has sliding layers with their own RoPE tables.
static inline bool ct_has_local_rope(const ct_model_config *c) { return c->sliding_window > 0; }

// The model's tensor table as a ct_layout.
#define ct_model_tensors(m) ((ct_layout){(m)->n_tensors, (m)->tensors, (m)->n_floats})
// Its Hugging Face part (without multi-token prediction's tensors), and MTP's part.
#define ct_model_hf_tensors(m) ((ct_layout){(m)->n_hf_tensors, (m)->tensors, (m)->n_floats})
#define ct_model_mtp_tensors(m) \
  ((ct_layout){(m)->n_tensors - (m)->n_hf_tensors, (m)->tensors + (m)->n_hf_tensors, (m)->n_floats})

// Only the tensor table and n_floats (no parameters): the layout other stores share.
int ct_model_layout(ct_model *m, const ct_model_config *cfg);

// Allocates parameters (zeroed) for `cfg`; rope tables cover positions < max_pos.
int ct_model_init(ct_model *m, const ct_model_config *cfg, int max_pos);
// The same for a model whose layout is already set (ct_model_layout).
int ct_model_alloc(ct_model *m, int max_pos);

// How a model's weights are stored: the trained policy is always float32; a model that
// only runs forward (reference, teacher, LoRA base) may be bfloat16 (ct_model_to_bf16)
// or int8 (the inference engine's weights, see common/frozen.h).
enum { CT_STORE_F32, CT_STORE_BF16, CT_STORE_INT8, CT_STORE_COUNT };
extern const char *const ct_store_names[];  // "float32", "bfloat16", "int8"
void ct_model_free(ct_model *m);
// What makes the model big, for a message: its parameter count and the keys behind it
// (num_hidden_layers x a layer's, vocab_size x hidden_size).
void ct_model_size_text(const ct_model_config *c, char *buf, size_t n);
// Bytes the parameters take: 4 per float, or 2 in bf16.
double ct_model_param_bytes(const ct_model *m, bool bf16);
// A checksum of the weights as stored (float32, or bf16 / int8 with the float32 copies and
// scales they keep): XXH64 chained over the buffers (hash.h), ~6 GB/s on one core, so
// 0.36 s for the 2 GB of a 0.5B model in float32 (0.19 s in bf16). Equal weights stored alike give equal sums.
uint64_t ct_model_checksum(const ct_model *m);

// Converts the parameters to bfloat16 storage (round to nearest even) and frees the
// fp32 ones: half the memory, for models that only run forward. The accessors below
// widen what a forward needs, one layer (or one LM-head chunk) at a time.
// With keep_embeddings the embedding (and an untied head) stay float32 as well — what a
// LoRA base needs, whose backward goes through the head.
int ct_model_to_bf16(ct_model *m, bool keep_embeddings);
// Bytes a model of this layout takes in bf16 storage (m may be a layout only).
double ct_model_bf16_bytes(const ct_model *m, bool keep_embeddings);
// Makes the forward and backward matmuls run in bf16 (oneDNN, dnnl.h): allocates
// m->compute16 and fills it from m->params (round to nearest even), or, for a model stored
// in bf16 (ct_model_to_bf16, before or after this call), uses params16 as it is. Needs
// ct_dnnl_init. After changing params, call ct_model_bf16_refresh (AdamW does it); a
// frozen model (a LoRA base) is narrowed once. ct_model_to_int8 drops the copy (fp32).
int ct_model_bf16_compute(ct_model *m);
void ct_model_bf16_refresh(ct_model *m);
// The bf16 copy of fp32 weight w, or NULL (fp32) without bf16 compute or when w is not
// one of the model's weights (an adapter's own head). w: a pointer into m->params, or
// for bf16 storage into what ct_model_layer returned last or the float32 embedding/head.
const uint16_t *ct_model_w16(const ct_model *m, const float *w);
// int8 storage of the layers' matrices (row absmax, quant.h; norms and biases stay float32,
// and so do the embedding and head): a quarter of float32 for the layers, for a frozen
// LoRA base. Widened a layer at a time as bf16 is; a forward equals, bit for bit, a float32
// model of the dequantized weights.
int ct_model_to_int8(ct_model *m);
double ct_model_int8_bytes(const ct_model *m);
// Layer l's weights as fp32: the parameters themselves, or (bf16) layer l widened into
// m->wide — valid until the next call. Not thread-safe for bf16 models.
const ct_layer_weights *ct_model_layer(const ct_model *m, int l);
// The embedding rows of ids (n) into out (n, C), fp32.
void ct_model_embed(const ct_model *m, const int *ids, int n, float *out);
// The final norm's weight (C), fp32.
const float *ct_model_norm(const ct_model *m);
// LM-head logits out (n, nv) of vocabulary columns [v0, v0 + nv) for hidden rows (n, C).
void ct_model_logits(const ct_model *m, const float *hidden, int n, int v0, int nv, float *out);

// Grows the rope tables to cover positions < max_pos (no-op when they already do): for
// trainers whose sequences may run past max_length (GRPO: prompt + completion).
int ct_model_rope_reserve(ct_model *m, int max_pos);

// Binds views of any buffer with the parameter layout (grads, moments).
int ct_weights_bind(ct_weights *w, const ct_model *m, float *base);
void ct_weights_free(ct_weights *w);

// Seeded initialization as Hugging Face's _init_weights: normal(0, initializer_range)
// for matrices and embeddings, 1 for norm weights, 0 for biases. Each value is a
// function of (seed, tensor, index) alone (counter-based), so the result does not
// depend on the thread count, and the work runs on the pool.
void ct_model_init_random(ct_model *m, uint64_t seed, float std);
// The same for tensors first.. only (each value as ct_model_init_random gives it): MTP's
// tensors of a model whose Hugging Face part was read from a file.
void ct_model_init_random_from(ct_model *m, int first, uint64_t seed, float std);

const ct_tensor_info *ct_model_find_tensor(const ct_model *m, const char *name);

// The SmolLM-135M shape (hidden 576, 30 layers, 9 heads, 3 kv heads, intermediate 1536,
// vocab 49152, tied embeddings) with `layers` layers: what the benchmarks measure.
ct_model_config ct_model_config_smollm135m(int layers);
// The gemma-3-270m shape (hidden 640, 18 layers, 4 heads, 1 kv head, head_dim 256,
// intermediate 2048, vocab 262144, sliding window 512 with every sixth layer full, RoPE
// bases 1e6 / 1e4, tied) with `layers` layers.
ct_model_config ct_model_config_gemma3_270m(int layers);

// Matrix-multiply FLOPs of one training step per token (forward + backward), PaLM-style:
// 6 x (parameters used in matmuls) + 12 x L x H x hd x T (attention), T the row length.
double ct_model_train_flops_per_token(const ct_model_config *c, int T);
