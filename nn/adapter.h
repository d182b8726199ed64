// adapter: the LoRA term of one projection in the training forward and its backward,
//
//   y (N, ldy) += s · dropout(x) · Aᵀ · Bᵀ     into the target's columns [row0, row0 + out)
//
// with A (r, in), B (out, r) the adapters of layer l, target t (lora.h). Dropout masks
// (training forwards only) are a hash of (dropout_key, layer, target, element), so a
// recomputed forward draws the same ones; the forward keeps them as bits (one per input
// element, in the work space) and backward reads them back instead of hashing again.
//
// The products run in fp32, also under bf16 compute: in bf16 through oneDNN they measured
// faster alone (single-threaded, N 2240, r 16) but made the GRPO job's training 9 s slower
// (scripts/bench-grpo.sh), so they stay fp32. At rank 16 (thin.h) the training forward keeps
// each layer's and target's u = dropout(x)·Aᵀ (N x 16 floats): a recomputed forward only
// adds s·u·Bᵀ (no mask drawn, no masked copy), and the backward reads x under the mask bits
// for dA and adds the input gradient through A and the mask in one pass (no copy either).
#pragma once
#include <stdbool.h>

#include "acts_mode.h"
#include "lora.h"
#include "model.h"

// The adapters one forward applies and their work space (a ct_acts' lora and lora_mem).
typedef struct {
  const ct_lora *lora;  // NULL: none
  float *mem;           // ct_adapter_work_floats(&lora->cfg, &lora->mc, cap, mode) floats
  long cap;             // tokens the work space is carved for (the activations' B · T)
  int mode;             // CT_ACTS_*: a training forward applies dropout and keeps its masks
  bool again;           // a recomputation of the training forward (rank 16: its kept u)
} ct_adapter_run;

// y += s · dropout(x) · Aᵀ · Bᵀ. x (N, ldx).
void ct_adapter_forward(const ct_adapter_run *a, int l, int t, const float *x, int ldx,
                        float *y, int ldy, long N);

// ct_adapter_forward's first half, for a caller that adds s·u·Bᵀ itself: u (N, r) =
// dropout(x)·Aᵀ, kept for the backward (a recomputation reuses it), and Bt (r, out) = B
// transposed. Returns u, or NULL (nothing done) where the adapter is absent or keeps no u
// (then ct_adapter_forward does the whole).
const float *ct_adapter_forward_u(const ct_adapter_run *a, int l, int t, const float *x, int ldx, long N, float *Bt);

// dy (N, ldy): the gradient of the projection's output (its columns of the fused matrix).
// Accumulates dA, dB into the adapters' gradients (when bound) and s·(dy·B)·A, masked,
// into dx (N, lddx).
void ct_adapter_backward(const ct_adapter_run *a, int l, int t, const float *x, int ldx,
                         const float *dy, int ldy, float *dx, int lddx, long N);

// Whether layer l's down adapter can go backward over N tokens without h, its input
// (ct_adapter_backward_down_gu): rank 16 (thin.h), in a training forward that keeps u.
bool ct_adapter_down_from_gu(const ct_adapter_run *a, int l, long N);

// ct_adapter_backward of layer l's down adapter with its input x = swiglu(gu) (gu (N, 2·in),
// SwiGLU's input) computed as dA reads it: the same bits, and no h need exist.
void ct_adapter_backward_down_gu(const ct_adapter_run *a, int l, const float *gu, const float *dy, int ldy, float *dx,
                                 int lddx, long N);

// Floats of work space the adapters need for N tokens of activations in `mode`
// (ct_acts_attach_lora).
long ct_adapter_work_floats(const ct_lora_config *lc, const ct_model_config *c, long N, int mode);
