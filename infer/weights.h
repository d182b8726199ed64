// weights: the model as the inference engine reads it — fp32 views of the training
// parameters (no copy), or int8 matrices with one scale per output row (embedding and
// LM head included; norms and biases stay fp32). An int8 model saves to and loads from
// a Hugging Face-style directory: each matrix `<name>` as an I8 tensor plus
// `<name>_scale` (F32, one per row), config.json with a quantization_config block;
// loading it never materializes fp32 matrices.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "linear.h"
#include "lora.h"
#include "model.h"

typedef struct {
  ct_linear qkv;   // (QKV, C)  q_proj | k_proj | v_proj
  ct_linear o;     // (C, H*hd)
  ct_linear gu;    // (2F, C)   gate_proj | up_proj
  ct_linear down;  // (C, F)
  const float *ln1, *ln2;             // (C) (Gemma: ln2 is pre_feedforward_layernorm)
  const float *post_attn, *post_ff;   // (C) Gemma's post-attention / post-feedforward norms, else NULL
  const float *bqkv;                  // (QKV) or NULL
  const float *qnorm, *knorm;         // (hd) or NULL
} ct_infer_layer;

typedef struct {
  ct_model_config cfg;
  bool int8;
  ct_linear embed;          // (V, C): token rows
  ct_linear lm_head;        // (V, C): the same matrix as embed when tied
  const float *norm;        // (C)
  ct_infer_layer *layers;   // (L)
  const ct_lora *lora;      // adapters the engine applies after each projection (NULL: none)
  // owned storage (NULL for views of a training model)
  ct_model layout;          // int8: the tensor table (offsets) only
  ct_model *model;          // a model this struct loaded and owns (fp32 mode)
  int8_t *qmem;             // (n_floats) int8 matrices at the layout's offsets
  float *smem;              // row scales, then fp32 vectors
  int32_t *rmem;            // row sums of the int8 matrices (same offsets as smem)
  long *soff;               // (n_tensors) offset of each tensor's scales / values in smem
  int packed;               // CT_PACK_*: the matrices' panels (ct_infer_pack)
  void *pmem;               // the panels, when not packed in place
  long pmem_bytes;
} ct_infer_weights;

enum { CT_PACK_NONE, CT_PACK_F32, CT_PACK_BF16, CT_PACK_INT8 };

// Makes the engine apply adapters lo (which must outlive w): after each adapted projection
// y += s·(x·Aᵀ)·Bᵀ, computed per token in a fixed order like every engine product; the
// modules_to_save copies replace the embedding / head (float32 weights only).
int ct_infer_attach_lora(ct_infer_weights *w, const ct_lora *lo);
// Packs the float32 (or bf16-stored) matrices into panels for the batched kernels (panel.h): CT_PACK_F32
// (in place when w owns its model, else a copy) or CT_PACK_BF16 (a bf16 copy). Copies
// are taken from the weights as they are now: call again after they change (GRPO's full
// fine-tuning does before each generation; a frozen LoRA base needs it once). Adapters'
// modules_to_save are left unpacked (they train). int8 weights pack in place whatever
// mode says (matrices whose width is not a multiple of 4 stay in rows: the results are
// exact integer sums either way); save an int8 model before packing it.
int ct_infer_pack(ct_infer_weights *w, int mode);
// Bytes ct_infer_pack allocates for a model with config c viewed from a training model.
double ct_infer_pack_bytes(const ct_model_config *c, int mode);
// At most the bytes bf16 packing adds for attached LoRA adapters at rank 16: each layer's
// matrices get extension columns (linear.h) for the adapters' B, which the engine folds
// into its products (engine.h: ct_engine_lora_pin).
double ct_infer_lora_ext_bytes(const ct_model_config *c);
// fp32 views of a training model's parameters (the model must outlive w).
int ct_infer_from_model(ct_infer_weights *w, const ct_model *m);
// Bytes of the int8 weights of a model with config c (matrices, scales, row sums, vectors).
double ct_infer_int8_bytes(const ct_model_config *c);
// int8 copies of m's matrices, fp32 copies of its vectors: independent of m afterwards.
int ct_infer_quantize(ct_infer_weights *w, const ct_model *m);
// Loads a directory: a full-precision Hugging Face model (kept fp32, or converted to
// int8 when `int8`), or a ctune int8 model (loaded as int8 whatever `int8` says).
int ct_infer_load(ct_infer_weights *w, const char *dir, bool int8);
// Writes an int8 model: config.json (with quantization_config; from source_dir's, the model
// it was read from, when given: hf.h) and model.safetensors.
int ct_infer_save_int8(const ct_infer_weights *w, const char *dir, const char *source_dir);
void ct_infer_free(ct_infer_weights *w);
