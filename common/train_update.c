// train_update: one optimizer step (ct_train_update): the gradients summed across ranks,
// clipped, the step of AdamW or Muon at the scheduled learning rate, then QK-Clip. Its
// variants: ZeRO-1's sharded step and DiLoCo's local steps with their outer sync. The
// overlapped sum (ddp_bucket_cap_mb) is train_overlap.c's; the optimizers are nn/'s.
// And the common fields of a step's metrics line (ct_train_log_fields).
#include "train_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "dnnl.h"
#include "error.h"
#include "muon.h"

// The pre-clip norm from Σg² (a non-finite one is an error), the clipping factor, the
// scheduled learning rate; counts the step.
static int step_scalars(ct_train *tr, double sum_sq, double *grad_norm, float *clip, double *lr) {
  double norm = sqrt(sum_sq), max = tr->cfg->max_grad_norm;
  *grad_norm = norm;
  if (!isfinite(norm))
    return ct_set_error(CT_EINVAL, "step %ld: the gradient norm is %g; stopping before the weights "
                        "are damaged (lower learning_rate, or check the data)", tr->step + 1, norm);
  *clip = max > 0 && norm > max ? (float)(max / (norm + 1e-6)) : 1.0f;  // as torch
  *lr = ct_lr_at(tr->cfg->lr_scheduler_type, tr->cfg->learning_rate, tr->step, tr->warmup_steps,
                 tr->total_steps);
  tr->step++;
  return 0;
}

// The bf16 copy the matmuls read, which follows the trained weights (a LoRA base never
// changes): NULL when there is none to refresh.
static uint16_t *trained_copy16(const ct_train *tr) {
  return tr->cfg->use_peft ? NULL : tr->model.compute16;
}

// The whole step of the configured optimizer on the whole buffer (not sharded).
static void optimizer_step(ct_train *tr, double lr, float grad_scale) {
  if (tr->cfg->optimizer == CT_OPT_MUON)
    ct_muon_step(&tr->trained, tr->params, trained_copy16(tr), tr->grads, tr->mom1, tr->mom2, tr->muon_work,
                 tr->step, lr, grad_scale, &tr->adam, tr->cfg->muon_momentum);
  else
    ct_adamw_step(&tr->trained, tr->params, trained_copy16(tr), tr->grads, tr->mom1, tr->mom2, tr->step, lr,
                  grad_scale, &tr->adam);
}

// QK-Clip after an optimizer step (qkclip.h): the step's maxima (the largest over the ranks,
// which then all apply the same factors; DiLoCo's ranks, which step weights of their own,
// keep their own), the rescaling, a new step's maxima, and the logging window's metrics:
// max_attention_logit (largest before clipping) and clipped_heads (summed over the steps).
static int qk_clip_step(ct_train *tr) {
  ct_qkclip *q = &tr->qkclip;
  if (!q->max) return 0;
  long n = (long)q->L * q->H;
  if (tr->cfg->diloco_inner_steps == 0 && ct_dist_max_f32(q->max, (int)n)) return 1;
  float top = ct_qkclip_max(q);
  int clipped = ct_qkclip_apply(q, &tr->model);
  ct_qkclip_reset(q);
  json_t *x = tr->log.train_extra ? tr->log.train_extra : json_object();
  json_t *prev = json_object_get(x, "max_attention_logit");
  if (isfinite(top) && (!prev || top > json_real_value(prev))) json_object_set_new(x, "max_attention_logit", json_real(top));
  json_object_set_new(x, "clipped_heads",
                      json_integer(json_integer_value(json_object_get(x, "clipped_heads")) + clipped));
  tr->log.train_extra = x;
  return 0;
}

// ZeRO-1: reduce-scatter, the norm from every shard, this rank's shard stepped, all-gather.
static int update_sharded(ct_train *tr, double *grad_norm, double *lr) {
  const ct_shard *sh = &tr->shard;
  long n = tr->trained.n_floats, cnt = sh->hi - sh->lo;
  int rc = ct_dist_reduce_scatter_f32(tr->grads, sh);  // the shard's sum: grads[lo .. hi)
  float *g = tr->grads + sh->lo, clip;
  double sq = rc ? 0 : ct_sum_squares(g, cnt);
  if (rc || (rc = ct_dist_sum_f64(&sq, 1)) || (rc = step_scalars(tr, sq, grad_norm, &clip, lr))) return rc;
  uint16_t *p16 = trained_copy16(tr);
  ct_adamw_step_range(&tr->trained, sh->lo, sh->hi, tr->params, p16, g, tr->mom1, tr->mom2, tr->step, *lr, clip,
                      &tr->adam);
  memset(tr->grads, 0, sizeof(float) * (size_t)sh->lo);  // the rest is scratch: zero it
  memset(tr->grads + sh->hi, 0, sizeof(float) * (size_t)(n - sh->hi));
  if ((rc = ct_dist_allgather_f32(tr->params, sh))) return rc;
  if (p16) {  // the other ranks' shards, as their owners narrowed them
    ct_bf16_narrow(p16, tr->params, sh->lo);
    ct_bf16_narrow(p16 + sh->hi, tr->params + sh->hi, n - sh->hi);
  }
  return qk_clip_step(tr);
}

// DiLoCo's sync: the ranks' mean of θ_start − θ (in the zeroed gradient buffer), the outer
// Nesterov step, every rank's weights set to the new θ_start.
static int diloco_sync(ct_train *tr) {
  long n = tr->trained.n_floats;
  float *d = tr->grads, inv = 1.0f / (float)tr->world;
  for (long i = 0; i < n; i++) d[i] = tr->outer_start[i] - tr->params[i];
  int rc = ct_dist_sum_f32(d, n);
  if (rc) return rc;
  for (long i = 0; i < n; i++) d[i] *= inv;
  ct_nesterov_outer_step(tr->outer_start, tr->outer_mom, tr->params, d, n, tr->cfg->diloco_outer_lr,
                         tr->cfg->diloco_outer_momentum);
  memset(d, 0, sizeof(float) * (size_t)n);
  uint16_t *p16 = trained_copy16(tr);
  if (p16) ct_bf16_narrow(p16, tr->params, n);
  tr->outer_pending = false;
  return 0;
}

// DiLoCo: a local AdamW step on this rank's gradient as the mean over its own tokens,
// then the sync every diloco_inner_steps steps and at the last step.
static int update_diloco(ct_train *tr, double *grad_norm, double *lr) {
  long n = tr->trained.n_floats;
  float world = (float)tr->world, clip;
  int rc = step_scalars(tr, ct_sum_squares(tr->grads, n) * world * world, grad_norm, &clip, lr);
  if (rc) return rc;
  optimizer_step(tr, *lr, clip * world);
  if ((rc = qk_clip_step(tr))) return rc;  // (before a sync: θ_start must be the weights synced)
  tr->outer_pending = true;
  if (tr->step % tr->cfg->diloco_inner_steps == 0 || tr->step == tr->total_steps) return diloco_sync(tr);
  return 0;
}

int ct_train_update(ct_train *tr, double *grad_norm, double *lr) {
  int rc = ct_dnnl_check();  // a bf16 product of this step failed: no step on its numbers
  if (rc) return rc;
  if (tr->shard.n) return update_sharded(tr, grad_norm, lr);
  if (tr->cfg->diloco_inner_steps > 0) return update_diloco(tr, grad_norm, lr);
  long n = tr->trained.n_floats;
  rc = tr->overlap ? ct_train_overlap_finish(tr) : ct_dist_sum_f32(tr->grads, n);
  float clip;
  if (rc || (rc = step_scalars(tr, ct_sum_squares(tr->grads, n), grad_norm, &clip, lr))) return rc;
  optimizer_step(tr, *lr, clip);
  return qk_clip_step(tr);
}

void ct_train_log_fields(const ct_train *tr, json_t *j, double lr, double grad_norm, double tokens_per_s) {
  json_object_set_new(j, "epoch", json_real(tr->epoch + (double)tr->epoch_pos / tr->n_seq));
  json_object_set_new(j, "learning_rate", json_real(lr));
  json_object_set_new(j, "grad_norm", json_real(grad_norm));
  json_object_set_new(j, "num_tokens", json_real(tr->num_tokens));
  json_object_set_new(j, "tokens_per_s", json_real(tokens_per_s));
}
