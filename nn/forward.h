// forward: the training forward pass (keeping what backward needs) and its backward,
// over one batch of B rows of T tokens. The LM head and the loss live in loss.h: the
// forward ends at the final RMSNorm's output `lnf`, the backward starts from its gradient.
#pragma once
#include <stdbool.h>

#include "model.h"

// Activations of one forward pass, allocated once for at most B x T tokens. With
// keep == false (inference, reference models) every layer reuses one layer's storage.
typedef struct {
  int B, T;   // capacity
  bool keep;  // per-layer activations kept for backward
  float *mem;  // one allocation holding everything below
  // inputs (N)
  int *ids, *pos, *seg;
  // per layer, each (L or 1, ...) — see forward.c for the use of each
  float *x;      // (L+1, N, C) residual stream into each layer; x[L] leaves the last one
  float *ln1;    // (L, N, C)
  float *rstd1;  // (L, N)
  float *qkv;    // (L, N, QKV) after bias, q/k-norm and RoPE
  float *qkv_pre;  // (L, N, QKV) before q/k-norm (Qwen3 only)
  float *qk_rstd;  // (L, N, H + KV) (Qwen3 only)
  float *att;    // (L, N, H*hd)
  float *lse;    // (L, N, H)
  float *x2;     // (L, N, C) residual after attention
  float *ln2;    // (L, N, C)
  float *rstd2;  // (L, N)
  float *gu;     // (L, N, 2F)
  float *h;      // (L, N, F)
  float *lnf;    // (N, C) final RMSNorm output: the LM head's input
  float *rstdf;  // (N)
  // backward work space, reused layer after layer
  float *dres;   // (N, C)
  float *dln;    // (N, C)
  float *dqkv;   // (N, QKV)
  float *datt;   // (N, H*hd)
  float *dgu;    // (N, 2F)
  float *dh;     // (N, F)
  float *scratch;  // reductions and attention blocks
} ct_acts;

int ct_acts_init(ct_acts *a, const ct_model *m, int B, int T, bool keep);
void ct_acts_free(ct_acts *a);

// Runs the decoder over a->ids/pos/seg (B*T each, filled by the caller) for B rows of
// T tokens (B, T within capacity). Leaves the LM head's input in a->lnf (N, C).
void ct_forward(const ct_model *m, ct_acts *a, int B, int T);

// Accumulates parameter gradients (+=) into g, given dlnf (N, C): the gradient of the
// loss with respect to a->lnf. Needs a->keep. dlnf may be a->dln.
void ct_backward(const ct_model *m, const ct_weights *g, ct_acts *a, const float *dlnf, int B,
                 int T);
