// lm: a batch through the model and its LM head. ct_forward_batch / ct_lm_forward are
// the one way every trainer feeds a ct_batch to a model; ct_lm_step adds causal-LM
// cross-entropy — statistics and (when training) backward with every token weighted by
// `scale` (1 / the number of target tokens in the whole optimizer step). SFT's loss and
// every trainer's evaluation go through ct_lm_step.
#pragma once
#include <stdbool.h>

#include "data.h"
#include "forward.h"
#include "head.h"
#include "model.h"
#include "mtp.h"

typedef struct {
  double loss;     // Σ cross-entropy over targets (nats)
  double z;        // Σ lse² over targets
  double entropy;  // Σ entropy of the predicted distribution over targets
  double correct;  // targets whose argmax is the target
  double targets;  // number of targets
  double tokens;   // non-padding input tokens
  double seq_ok;   // rows whose every target is the argmax (= greedy decoding reproduces them)
  double seqs;     // rows
  ct_mtp_stats mtp;  // multi-token prediction's depths (a->mtp set), else zeros
} ct_lm_stats;


// Runs the decoder over batch b (a->lnf holds the result). Fails if b is larger than a
// allows or a position lies past the model's RoPE table.
int ct_forward_batch(const ct_model *m, ct_acts *a, const ct_batch *b);

// ct_forward_batch, then the LM head over b's target rows (ct_head_gather +
// ct_head_forward). Returns the number of gathered rows, or a negative error.
int ct_lm_forward(const ct_model *m, ct_acts *a, ct_head *h, const ct_batch *b);

// The LM head a forward through a uses — the adapters' trained copy (lora_modules_to_save)
// or the model's own (NULL when it is stored in bf16) — and where its gradient goes (NULL:
// frozen).
const float *ct_lm_head_weight(const ct_model *m, const ct_acts *a);
float *ct_lm_head_grad(const ct_weights *g, const ct_acts *a);

// After ct_lm_forward and the caller's h->coef / h->zcoef: the gradient back through the
// head (its weight's, unless frozen) and the model (ct_backward) into g and a's adapters.
void ct_lm_backward(const ct_model *m, const ct_weights *g, ct_acts *a, ct_head *h, const ct_batch *b);

// ct_forward_batch, then the LM head's forward and backward over b's target rows a chunk
// of rows at a time (ct_head_fused: coef sets each chunk's coefficients), the head's weight
// gradient into g (unless frozen) and d lnf into a->dln; the caller runs ct_backward (or
// ct_lm_step does). Returns the number of gathered rows, or a negative error.
int ct_lm_fused(const ct_model *m, const ct_weights *g, ct_acts *a, ct_head *h, const ct_batch *b,
                ct_head_coef_fn coef, void *ctx);

// Runs batch b through the model. With grads != NULL, accumulates the gradient of
// scale·Σ(CE + z_loss·lse²) into grads. Fails only if b is larger than a and h allow.
// With a->mtp, multi-token prediction's depths run too (ct_mtp_step: their statistics
// into st->mtp, and their coef-weighted loss's gradient).
int ct_lm_step(const ct_model *m, ct_acts *a, ct_head *h, const ct_batch *b,
                const ct_weights *grads, float scale, float z_loss, ct_lm_stats *st);
