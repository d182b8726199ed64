// adapter: the LoRA term of one projection in the training forward and its backward,
//
//   y (N, ldy) += s · dropout(x) · Aᵀ · Bᵀ     into the target's columns [row0, row0 + out)
//
// with A (r, in), B (out, r) the adapters of layer l, target t (lora.h). Dropout masks
// (training forwards only) are a hash of (dropout_key, layer, target, element), so backward
// and a recomputed forward draw the same ones without storing them.
//
// fp32 products run on OpenBLAS. With bf16 compute (the model has a bf16 copy) the products
// whose inner dimension is in, out or N run in bf16 through oneDNN, fp32 results, as every
// other projection does; y += s·u·Bᵀ (inner dimension r) stays fp32: measured faster there.
#pragma once
#include "forward.h"
#include "model.h"

// y += s · dropout(x) · Aᵀ · Bᵀ. x (N, ldx). With bf16 compute and no dropout, a->x16 must
// hold x rounded to bf16 (the projection's own forward, run just before, leaves it there).
void ct_adapter_forward(const ct_model *m, const ct_acts *a, int l, int t, const float *x, int ldx,
                        float *y, int ldy, long N);

// dy (N, ldy): the gradient of the projection's output (its columns of the fused matrix).
// Accumulates dA, dB into the adapters' gradients (when bound) and s·(dy·B)·A, masked,
// into dx (N, lddx). With bf16 compute a->dy16 must hold dy rounded to bf16 with row
// stride ldy (the projection's own backward, run just before, leaves it there).
void ct_adapter_backward(const ct_model *m, const ct_acts *a, int l, int t, const float *x, int ldx,
                         const float *dy, int ldy, float *dx, int lddx, long N);

// Floats of work space the adapters need for N tokens (ct_acts_attach_lora).
long ct_adapter_work_floats(const ct_lora_config *lc, const ct_model_config *c, long N);
