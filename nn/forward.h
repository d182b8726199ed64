// forward: the training forward pass (keeping what backward needs) and its backward,
// over one batch of B rows of T tokens. The LM head and the loss live in loss.h: the
// forward ends at the final RMSNorm's output `lnf`, the backward starts from its gradient.
#pragma once
#include <stdbool.h>

#include "acts_mode.h"
#include "lora.h"
#include "model.h"

// Activations of one forward pass, allocated once for at most B x T tokens.
typedef struct {
  int B, T;   // capacity
  long n;     // tokens of the last forward (B x T): the per-layer slots' stride, so a
              // smaller batch touches only the memory its tokens need
  int mode;   // CT_ACTS_*
  int kept_from;  // CT_ACTS_RECOMPUTE: layers from this one keep their activations (L: none)
  bool keep;  // per-layer activations kept for backward (mode == CT_ACTS_KEEP)
  float *mem;  // one allocation holding everything below
  long bytes;  // its size
  // inputs (N): pre is read when has_pre (attention.h: a prefix shared by a row's documents)
  int *ids, *pos, *seg, *pre;
  bool has_pre;
  // attention blocks for rows longer than T (ct_acts_long_rows); NULL: none
  float *row_scratch;
  int row_T;
  // per layer, each (L or 1, ...) — see forward.c for the use of each
  // per-layer buffers hold their L slots of n rows each back to back (n = the last
  // forward's tokens), within room for L slots of the capacity
  float *x;      // (L+1, N, C) residual stream into each layer; x[L] leaves the last one
                 // (one slot, updated in place, for CT_ACTS_FORWARD)
  float *ln1;    // (N, C) one slot: the layer's first norm output, then its second (ln2 is
                 // the same slot); backward recomputes both from x, x2 and the rstds
  float *rstd1;  // (L, N)
  float *qkv;    // (L, N, QKV) after bias, q/k-norm and RoPE
  float *qkv_pre;  // (L, N, QKV) before q/k-norm (Qwen3 only)
  float *qk_rstd;  // (L, N, H + KV) (Qwen3 only)
  float *att;    // (L, N, H*hd)
  float *lse;    // (L, N, H)
  float *x2;     // (L, N, C) residual after attention (in place in x for CT_ACTS_FORWARD)
  float *ln2;    // (N, C) = ln1's slot
  float *rstd2;  // (L, N)
  float *gu;     // (L, N, 2F)
  float *h;      // (N, F) one slot: backward recomputes each layer's from gu
  float *lnf;    // (N, C) final RMSNorm output: the LM head's input
  float *rstdf;  // (N)
  // backward work space, reused layer after layer (not for CT_ACTS_FORWARD)
  float *dres;   // (N, C)
  float *dln;    // (N, C)
  float *dqkv;   // (N, QKV)
  float *datt;   // (N, H*hd)
  float *dh;     // (N, F)   (the MLP's input gradient dgu (N, 2F) is written over the layer's gu)
  float *scratch;  // reductions and attention blocks
  // Gemma (cfg.gemma): the outputs the post-attention / post-feedforward norms normalize
  float *ao;     // (L, N, C) attention output projection
  float *rstd_ao;  // (L, N)
  float *mo;     // (L, N, C) MLP output (down projection)
  float *rstd_mo;  // (L, N)
  float *tmp;    // (N, C) a post-norm's output before the residual add
  float *wn;     // (max(C, hd)) a norm's 1 + w
  // bf16 compute (the model has ct_model_bf16_compute): matmul inputs rounded to bf16
  uint16_t *mem16;  // one allocation holding:
  uint16_t *x16;    // (N, max(C, H*hd, F)) a projection's input
  uint16_t *dy16;   // (N, max(QKV, C, 2F)) a projection's output gradient
  // CT_ACTS_RECOMPUTE keeping layers (not Gemma): their gu in bf16 (kept layers, N, 2F) —
  // bf16 compute rounds gu to bf16 anyway (ct_swiglu_forward_lora) — and gu's one fp32
  // slot the scratch a kept layer's product writes and its backward widens into
  uint16_t *gu16;
  // LoRA (ct_acts_attach_lora): the adapters this forward applies; NULL = the base alone
  const ct_lora *lora;
  float *lora_mem;  // their work space (adapter.c)
  // QK-Clip (qkclip.h): (L, H) each head's largest attention logit, max-accumulated by
  // every forward through these activations; NULL = not recorded
  float *qk_max;
  // Called by ct_backward once layer l's parameter gradients are complete (l = L-1 down
  // to 0), then with l = -1 after the embedding's (the last); NULL: none. For starting
  // each layer's gradient sum across ranks while backward goes on (ct_train_overlap_arm).
  void (*grad_ready)(void *ctx, int l);
  void *grad_ready_ctx;
  // Multi-token prediction (mtp.h): the depths ct_lm_step runs after this forward, or NULL;
  // and a gradient (N, C) ct_backward adds to the last layer's output's (their h_0), or NULL
  struct ct_mtp *mtp;
  const float *dx_top;
} ct_acts;

// Bytes ct_acts_init allocates for B x T tokens in `mode` (the memory plan uses it).
double ct_acts_bytes(const ct_model_config *c, int B, int T, int mode);
// Bytes of the bf16 inputs ct_acts_init adds for a model with bf16 compute.
double ct_acts_bf16_bytes(const ct_model_config *c, int B, int T);
// Allocates (ct_big_alloc: zeroed, huge pages) for B rows of T tokens (and the bf16
// inputs when m has bf16 compute: its projections then multiply in bf16).
int ct_acts_init(ct_acts *a, const ct_model *m, int B, int T, int mode);
// CT_ACTS_RECOMPUTE that keeps the top `kept` layers' activations (at most L − 1) besides the
// one layer the recomputation reuses: those layers' backward runs without recomputing. The
// same gradients, bit for bit. Other modes: as ct_acts_init. Bytes: ct_acts_kept_bytes.
int ct_acts_init_kept(ct_acts *a, const ct_model *m, int B, int T, int mode, int kept);
double ct_acts_kept_bytes(const ct_model_config *c, int B, int T, int mode, int kept);
// Everything ct_acts_init_kept allocates for a model with bf16 compute (bf16 inputs, kept
// layers' gu in bf16 included).
double ct_acts_kept_bytes_bf16(const ct_model_config *c, int B, int T, int mode, int kept);
void ct_acts_free(ct_acts *a);
// Lets batches hold rows of up to T_row > T tokens (still at most B x T tokens in all):
// GRPO's rows of a prompt and its completions. Bytes it allocates: ct_acts_rows_bytes.
int ct_acts_long_rows(ct_acts *a, const ct_model *m, int T_row);
double ct_acts_rows_bytes(const ct_model_config *c, int T_row);
// Makes the forwards (and backwards) through a apply adapters lo (NULL: none; the
// reference of a LoRA policy is its base run through activations without adapters), and
// allocates their work space. Training forwards (CT_ACTS_KEEP / RECOMPUTE) apply
// lo's dropout with lo->dropout_key.
int ct_acts_attach_lora(ct_acts *a, const ct_lora *lo);
// Bytes of that work space for B x T tokens.
double ct_lora_acts_bytes(const ct_lora_config *lc, const ct_model_config *c, int B, int T, int mode);

// Runs the decoder over a->ids/pos/seg(/pre) (B*T each, filled by the caller) for B rows
// of T tokens (B x T within capacity, T within T or row_T). Leaves the LM head's input in a->lnf (N, C).
void ct_forward(const ct_model *m, ct_acts *a, int B, int T);

// Accumulates parameter gradients (+=) into g, given dlnf (N, C): the gradient of the
// loss with respect to a->lnf. Needs CT_ACTS_KEEP or CT_ACTS_RECOMPUTE (which runs each
// layer's forward again from its kept input). dlnf may be a->dln.
void ct_backward(const ct_model *m, const ct_weights *g, ct_acts *a, const float *dlnf, int B,
                 int T);

// One decoder layer outside m's stack (multi-token prediction's blocks), run through
// activations a sized for one layer (ct_acts_init_layer): input a->x (N, C), output
// ct_acts_layer_out(a). Its attention is layer `kind`'s of m (window, RoPE base); a's
// adapters and QK-Clip maxima must be off (NULL). The backward takes the output's
// gradient in a->dres and leaves the input's there, accumulating (+=) into g.
int ct_acts_init_layer(ct_acts *a, const ct_model *m, int B, int T, int mode);
void ct_layer_forward(const ct_model *m, int kind, const ct_layer_weights *w, ct_acts *a, int B, int T);
void ct_layer_backward(const ct_model *m, int kind, const ct_layer_weights *w, const ct_layer_weights *g,
                       ct_acts *a, int B, int T);
// Where a layer's output is: the input slot itself (CT_ACTS_FORWARD, in place) or the next.
static inline float *ct_acts_layer_out(const ct_acts *a, int C) {
  return a->mode == CT_ACTS_FORWARD ? a->x : a->x + a->n * C;
}
// The last decoder layer's output (N, C) after ct_forward: the final norm's input.
static inline float *ct_acts_top(const ct_acts *a, const ct_model_config *c) {
  return a->mode == CT_ACTS_FORWARD ? a->x : a->x + (long)c->num_layers * a->n * c->hidden_size;
}
