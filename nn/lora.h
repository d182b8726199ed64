// lora: low-rank adapters over a frozen model's linear projections, as PEFT's LoRA.
// For a targeted projection y = x·Wᵀ (W [out, in]) the adapted layer computes
//   y = x·Wᵀ + s · dropout(x)·Aᵀ·Bᵀ,   A [r, in], B [out, r],
// s = lora_alpha / r (use_rslora: lora_alpha / sqrt(r)). A starts kaiming-uniform
// (a = sqrt(5): U(−1/sqrt(in), 1/sqrt(in))) and B at zero, so step 0 equals the base.
// modules_to_save (embed_tokens, lm_head of an untied model; score, the head of a
// sequence classifier, as PEFT's SEQ_CLS task saves it) are full trainable copies.
//
// Tensors keep PEFT's names, so adapter_model.safetensors loads with
// PeftModel.from_pretrained: base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight,
// ... and base_model.model.lm_head.weight / base_model.model.model.embed_tokens.weight /
// base_model.model.score.weight (PEFT's get_peft_model_state_dict drops the
// ModulesToSaveWrapper's "modules_to_save.default" from the wrapped module's keys).
// The forward and backward that use them are forward.c's (ct_acts.lora).
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "model.h"

// The projections LoRA can target, in a layer's order, named as PEFT names them.
enum { CT_LORA_Q, CT_LORA_K, CT_LORA_V, CT_LORA_O, CT_LORA_GATE, CT_LORA_UP, CT_LORA_DOWN, CT_LORA_TARGETS };
extern const char *const ct_lora_target_names[];  // "q_proj", ..., "down_proj", NULL

typedef struct {
  int r;
  double alpha;
  bool rslora;
  double dropout;     // probability of zeroing an input element (training forwards only)
  unsigned targets;   // bit t set: CT_LORA_* t is adapted in every layer
  bool save_embed;    // modules_to_save: embed_tokens
  bool save_head;     // modules_to_save: lm_head (untied models)
  bool save_score;    // modules_to_save: score (a sequence classifier; adapter_config's task_type SEQ_CLS)
} ct_lora_config;

// A and B of one adapted projection (NULL when the projection is not a target).
typedef struct {
  float *A;  // (r, in)
  float *B;  // (out, r)
} ct_lora_ab;

typedef struct {
  ct_lora_config cfg;
  ct_model_config mc;  // the base's shape
  float scale;         // s
  int n_tensors;
  ct_tensor_info *tensors;
  long n_floats;
  float *params;       // (n_floats) one allocation
  float *grads;        // (n_floats) the gradient buffer a trainer binds (NULL: not trained)
  ct_lora_ab (*w)[CT_LORA_TARGETS];  // (L) views into params
  ct_lora_ab (*g)[CT_LORA_TARGETS];  // (L) views into grads
  float *embed, *head;    // modules_to_save copies in params (NULL when not saved)
  float *g_embed, *g_head;  // their gradients
  float *score, *g_score;   // save_score: the head (num_labels, C) and its gradient
  uint64_t dropout_key;   // which dropout masks the next training forward draws
} ct_lora;

#define ct_lora_tensors(lo) ((ct_layout){(lo)->n_tensors, (lo)->tensors, (lo)->n_floats})

// The input and output widths of target t in a model of config c, and the first row of
// its output within the fused matrix it lives in (q|k|v, gate|up).
void ct_lora_dims(const ct_model_config *c, int t, int *in, int *out, int *row0);

// Checks a config against a base (rank, targets, tied heads) with messages naming the key.
int ct_lora_config_check(const ct_lora_config *lc, const ct_model_config *mc);
// The layout and a zeroed allocation for adapters of config lc over a model of config mc.
int ct_lora_init(ct_lora *lo, const ct_lora_config *lc, const ct_model_config *mc);
// Bytes ct_lora_init allocates.
double ct_lora_bytes(const ct_lora_config *lc, const ct_model_config *mc);
void ct_lora_free(ct_lora *lo);
// PEFT's initialization: A kaiming-uniform from (seed, tensor) alone, B zero; the
// modules_to_save copies take the base's values.
void ct_lora_init_weights(ct_lora *lo, const ct_model *base, uint64_t seed);
// Views of a gradient buffer with the adapters' layout (kept in lo->g, lo->grads).
int ct_lora_bind_grads(ct_lora *lo, float *grads);

// The base's weights with the modules_to_save copies in place of its own (the model
// a LoRA policy runs): m->w's embed / lm_head / score are pointed at the copies.
void ct_lora_attach(const ct_lora *lo, ct_model *m);

// adapter_config.json <-> config; `base_name` is written as base_model_name_or_path.
int ct_lora_read_config(ct_lora_config *lc, const char *dir);
// Writes dir/adapter_config.json and dir/adapter_model.safetensors (PEFT's layout).
int ct_lora_save(const ct_lora *lo, const char *dir, const char *base_name);
// Reads dir (adapter_config.json decides r, alpha, targets) over a base of config mc.
// An adapter of another peft_type, or whose shapes do not fit the base, is an error.
int ct_lora_load(ct_lora *lo, const char *dir, const ct_model_config *mc);

// W += s·B·A for every adapted projection, and the modules_to_save copies into the base
// (fp32 parameters): a plain model equal to base + adapters.
int ct_lora_merge(const ct_lora *lo, ct_model *base);

// The directory whose tokenizer goes with base + adapter: the adapter's when it holds a
// tokenizer.json (the trainers save one beside the adapter), else the base's.
const char *ct_lora_tokenizer_dir(const char *adapter, const char *base);
