// acts_mode: what a training forward keeps for backward (forward.h's ct_acts and the
// adapters' work space, adapter.h, are sized by it).
#pragma once

// What a forward keeps, which sets what ct_acts holds:
//   CT_ACTS_FORWARD    nothing for backward: every layer reuses one layer's storage and
//                      the residual is updated in place (references, teachers, eval);
//   CT_ACTS_KEEP       every layer's activations, for backward;
//   CT_ACTS_RECOMPUTE  only each layer's input (the residual stream x); backward runs
//                      the layer's forward again into one layer's storage first
//                      (gradient_checkpointing). Same kernels in the same order, so the
//                      gradients equal CT_ACTS_KEEP's bit for bit.
enum { CT_ACTS_FORWARD, CT_ACTS_KEEP, CT_ACTS_RECOMPUTE };
