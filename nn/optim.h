// optim: AdamW with decoupled weight decay (torch.optim.AdamW's arithmetic), DiLoCo's outer
// Nesterov step, the learning-rate schedules of Hugging Face's get_scheduler, and global-norm
// clipping. Muon, the other optimizer, is muon.h's.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "model.h"

typedef struct {
  double beta1, beta2, eps, weight_decay;
} ct_adamw;

// One AdamW update of every tensor of the layout at optimizer step `step` (1-based),
// with g = grad_scale · grads (the clipping factor, 1 when not clipping):
//   p -= lr·wd·p (tensors with decay only);  m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
//   p -= lr / (1−β1^t) · m / (sqrt(v) / sqrt(1−β2^t) + eps)
// and zeroes grads for the next step, all in one pass over memory. With params16 (not
// NULL) the same pass writes the updated parameters' bf16 copy (bf16 compute): once per
// optimizer step, not per micro-batch.
void ct_adamw_step(const ct_layout *m, float *params, uint16_t *params16, float *grads, float *mom1,
                   float *mom2, long step, double lr, float grad_scale, const ct_adamw *h);
// The same step on the flat range [lo, hi) of the layout only (a ZeRO-1 shard; tensors cut
// by the range keep their own weight decay): params and params16 are the whole buffers
// (n_floats), grads, mom1 and mom2 hold hi-lo floats, element 0 being element lo. Every
// element gets the arithmetic ct_adamw_step gives it, bit for bit.
void ct_adamw_step_range(const ct_layout *m, long lo, long hi, float *params, uint16_t *params16,
                         float *grads, float *mom1, float *mom2, long step, double lr, float grad_scale,
                         const ct_adamw *h);

// The optimizers, as config's `optimizer` names them (ct_optimizer_names).
enum { CT_OPT_ADAMW, CT_OPT_MUON, CT_OPT_COUNT };
extern const char *const ct_optimizer_names[];

// DiLoCo's outer step (Nesterov SGD, as torch.optim.SGD(nesterov=True) and the DiLoCo
// paper): with d = the ranks' mean pseudo-gradient θ_start − θ_local (n floats, in d),
//   mom = μ·mom + d;  θ_start -= lr · (d + μ·mom);  params = θ_start
// (start, mom, params: n floats each; params may be NULL).
void ct_nesterov_outer_step(float *start, float *mom, float *params, const float *d, long n, double lr,
                            double momentum);

// Learning rate for optimizer step `step` (0-based: the step about to be taken) out of
// `total`, as transformers' schedulers give it (warmup from 0 to peak, then the decay).
// The schedules, as config's lr_scheduler_type names them (ct_lr_scheduler_names).
enum { CT_LR_LINEAR, CT_LR_COSINE, CT_LR_CONSTANT, CT_LR_CONSTANT_WITH_WARMUP, CT_LR_COUNT };
extern const char *const ct_lr_scheduler_names[];
double ct_lr_at(int kind, double peak, long step, long warmup, long total);

// Σ g² over n floats, in double (fixed order, thread-count independent).
double ct_sum_squares(const float *g, long n);
