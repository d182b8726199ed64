// qkclip: QK-Clip (Kimi K2's MuonClip): the largest pre-softmax attention logit of each
// head over one training step's forwards, and — after the optimizer step — the rescaling
// of the query and key weights that brings every head whose maximum S_h is above the
// threshold τ down to exactly τ, leaving the other heads' logits as they were.
//
// Who does what: the training forward records (ct_acts.qk_max points at ct_qkclip.max;
// the attention kernel max-accumulates into it), common/train.c applies after every
// optimizer step and resets. The maxima are a statistic of the step: never saved.
//
// The rescaling. A head's logits are s = (q_h · k_g) / sqrt(hd) after RoPE, which is
// linear, so scaling q_h by a and k_g by c scales every logit of head h by a·c. The target
// per head is η_h = min(1, τ / S_h). With GQA the key head g is shared by its group of
// query heads, so: k_g (W_k rows and bias) by c_g = sqrt(min over the group of η_h), and
// each q_h (W_q rows and bias) by a_h = η_h / c_g — the products give each head exactly
// its own η_h (heads at or below τ get a_h = 1 / c_g: their logits do not change). With
// MHA this is sqrt(η_h) on both sides, as Kimi K2 does.
//
// With q/k RMSNorm (Qwen3) q_h = g_q ⊙ RMSNorm(W_q x + b_q): the norm undoes any scaling
// of W_q, W_k or their biases, so the logits scale only through the norm weights g_q,
// g_k — and those (hd) vectors are shared by every head of the layer. A per-head η is
// then impossible; the layer is scaled as a whole by η_l = min over its heads of η_h
// (sqrt(η_l) on g_q and g_k): its hottest head lands exactly on τ and the other heads'
// logits shrink by the same factor (they stay below τ, but they do change).
//
// Multi-token prediction depths (mtp.h) are decoder blocks too: rows L .. L + D - 1 of the
// maxima are theirs, recorded by ct_mtp_step and clipped the same way.
#pragma once
#include "model.h"

typedef struct {
  float tau;    // the threshold τ (> 0)
  int L, H, KV;  // L: the decoder layers, then the multi-token prediction depths' blocks
  float *max;   // (L, H) the largest logit each head produced in this step's forwards;
                // -inf before any forward of the step
} ct_qkclip;

int ct_qkclip_init(ct_qkclip *q, const ct_model_config *c, float tau);
void ct_qkclip_free(ct_qkclip *q);
// A new step: every head's maximum back to -inf.
void ct_qkclip_reset(ct_qkclip *q);
// The largest of q->max (-inf when nothing was recorded).
float ct_qkclip_max(const ct_qkclip *q);
// Rescales m's float32 weights (and their bf16 compute copy, when m has one) from q->max
// as above; returns how many heads were above τ (0: m is untouched, bit for bit).
int ct_qkclip_apply(const ct_qkclip *q, ct_model *m);
