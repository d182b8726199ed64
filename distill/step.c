// distill/step: one optimizer step's gradient for the student: per micro-batch the
// teacher's pass (or its top-k logits), the student's forward, the hard loss (1 − α)·CE
// and the soft loss α·τ²·JSD over the step's labeled tokens, and both gradients back
// through the model.
#include <string.h>

#include "distill/distill.h"
#include "error.h"
#include "lm.h"
#include "loop.h"

// The teacher's top-k logits of the q gathered rows of b, into d->tk's batch rows.
static void gather_topk(ct_distill *d, const ct_batch *b, int q) {
  ct_distill_topk *tk = &d->tk;
  ct_distill_label_index(&d->train, b, tk->row_off, d->where);
  int kk = tk->f.k;
  for (int r = 0; r < q; r++) {
    memcpy(tk->b_idx + (long)r * kk, tk->f.idx + d->where[r] * kk, sizeof(int) * kk);
    memcpy(tk->b_logit + (long)r * kk, tk->f.logit + d->where[r] * kk, sizeof(float) * kk);
  }
}

// Micro-batch k, b: forward, both losses (scaled by inv = 1 / the step's labels), backward.
static int micro_batch(ct_distill *d, int k, const ct_batch *b, bool generated, double inv, ct_distill_stats *st) {
  ct_train *tr = d->tr;
  const ct_model_config *mc = &tr->model.cfg;
  ct_head *head = &d->head;
  ct_kd *kd = &d->kd;
  double alpha = d->alpha, tau = d->tau;
  int rc;
  if (!d->offline && (rc = ct_distill_teacher_forward(&d->teacher, b))) return rc;  // before the student's pass
  ct_train_dropout_key(tr, k);
  int N = b->B * b->T, q = ct_lm_forward(&tr->model, &d->acts, head, b);
  if (q < 0) return q;
  for (int r = 0; r < q; r++) {  // hard loss: (1 − α) · CE / labels
    st->hard -= head->logp[r];
    st->correct += head->argmax[r] == head->target[r];
    head->coef[r] = generated ? 0.0f : (float)((1 - alpha) * inv);  // generated: soft only
    head->zcoef[r] = 0;
  }
  d->ko.scale = (float)(alpha * tau * tau * inv);
  const float *W = ct_lm_head_weight(&tr->model, &d->acts);  // the student's head and its gradient
  float *dW = ct_lm_head_grad(&tr->g, &d->acts);
  d->ko.frozen_head = dW == NULL;
  double soft;
  if (d->offline) {
    gather_topk(d, b, q);
    soft = ct_kd_soft_topk(kd, head->hc, q, W, dW, d->tk.b_idx, d->tk.b_logit, d->tk.f.k, &d->ko);
  } else {
    soft = ct_kd_soft(kd, head->hc, q, W, dW, head->target, ct_distill_teacher_chunk, &d->teacher, &d->ko);
    for (int r = 0; r < q; r++) st->teacher_nll -= kd->tgt_t1[r] - kd->lse_t1[r];
  }
  st->soft += soft;
  st->tokens += q;
  st->input_tokens += b->n_tokens;
  ct_head_backward(head, W, dW, d->acts.dln, N);
  for (int r = 0; r < q; r++) {  // + the soft loss's gradient on the same rows
    float *dx = d->acts.dln + (long)head->rows[r] * mc->hidden_size;
    const float *e = kd->dhs + (long)r * mc->hidden_size;
    for (int c = 0; c < mc->hidden_size; c++) dx[c] += e[c];
  }
  ct_backward(&tr->model, &tr->g, &d->acts, d->acts.dln, b->B, b->T);
  return 0;
}

int ct_distill_train_pass(ct_distill *d, int n, bool generated, long labels, ct_distill_stats *st) {
  ct_train *tr = d->tr;
  int B = d->B, accum = d->accum, rc;
  double inv = labels ? 1.0 / labels : 0;
  ct_loop_phase(tr, 0, accum, 0);  // (the heartbeat's line)
  for (int k = 0, first, m; k < accum && (m = ct_loop_micro(tr, k, B, n, &first)); k++) {
    ct_batch *bp = generated ? &d->gen_batches[k] : &d->batch;
    if (!generated) ct_batch_fill(&d->batch, &d->train, d->seqs + first, m, ct_tokenizer_pad(tr->tok));
    if ((rc = micro_batch(d, k, bp, generated, inv, st))) return rc;
    ct_loop_phase(tr, k + 1, accum, st->input_tokens);
  }
  return 0;
}
