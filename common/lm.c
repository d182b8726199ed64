// lm: a batch through a model — positions checked, inputs copied into the activations,
// the forward, the LM head over target rows — and the causal-LM cross-entropy step SFT
// and every evaluation use.
#include "lm.h"

#include <string.h>

#include "dnnl.h"
#include "error.h"
#include "prof.h"

int ct_forward_batch(const ct_model *m, ct_acts *a, const ct_batch *b) {
  int N = b->B * b->T;
  if ((long)b->B * b->T > (long)a->B * a->T || b->T > (a->row_T > a->T ? a->row_T : a->T))
    return ct_set_error(CT_EINVAL, "batch of %d x %d tokens exceeds the activations' %d x %d",
                        b->B, b->T, a->B, a->row_T > a->T ? a->row_T : a->T);
  for (int i = 0; i < N; i++)
    if (b->pos[i] < 0 || b->pos[i] >= m->rope_max_pos)
      return ct_set_error(CT_EINVAL, "position %d is outside the model's %d-position RoPE table",
                          b->pos[i], m->rope_max_pos);
  memcpy(a->ids, b->ids, sizeof(int) * N);
  memcpy(a->pos, b->pos, sizeof(int) * N);
  memcpy(a->seg, b->seg, sizeof(int) * N);
  a->has_pre = b->has_pre;
  if (b->has_pre) memcpy(a->pre, b->pre, sizeof(int) * N);
  ct_forward(m, a, b->B, b->T);
  return ct_dnnl_check();  // (bf16 compute: a failed product)
}

// The head's logits callback for a model stored in bf16 (no fp32 matrix to hand it).
static void model_logits(void *ctx, const float *hidden, int n, int v0, int nv, float *out) {
  ct_model_logits(ctx, hidden, n, v0, nv, out);
}

const float *ct_lm_head_weight(const ct_model *m, const ct_acts *a) {
  return a->lora && a->lora->head ? a->lora->head : m->w.lm_head;
}

float *ct_lm_head_grad(const ct_weights *g, const ct_acts *a) {
  return a->lora && a->lora->head ? a->lora->g_head : g->lm_head;
}

int ct_lm_forward(const ct_model *m, ct_acts *a, ct_head *h, const ct_batch *b) {
  int rc = ct_forward_batch(m, a, b);
  if (rc) return rc;
  int n = ct_head_gather(h, a->lnf, b->target, b->B * b->T);
  const float *W = ct_lm_head_weight(m, a);
  double t0 = ct_prof_open(CT_PROF_HEAD);
  if (n >= 0 && !W) ct_head_forward_fn(h, model_logits, (void *)m);  // a bf16-stored head
  else if (n >= 0) ct_head_forward_bf16(h, W, ct_model_w16(m, W));  // bf16 products with bf16 compute
  ct_prof_add(CT_PROF_HEAD, t0);
  return n;
}

void ct_lm_backward(const ct_model *m, const ct_weights *g, ct_acts *a, ct_head *h, const ct_batch *b) {
  CT_PROF(CT_PROF_HEAD, ct_head_backward(h, ct_lm_head_weight(m, a), ct_lm_head_grad(g, a), a->dln, b->B * b->T));
  ct_backward(m, g, a, a->dln, b->B, b->T);
}

int ct_lm_fused(const ct_model *m, const ct_weights *g, ct_acts *a, ct_head *h, const ct_batch *b,
                ct_head_coef_fn coef, void *ctx) {
  int rc = ct_forward_batch(m, a, b);
  if (rc) return rc;
  int n = ct_head_gather(h, a->lnf, b->target, b->B * b->T);
  if (n < 0) return n;
  const float *W = ct_lm_head_weight(m, a);
  if (!W) return ct_set_error(CT_EINVAL, "training through an LM head stored without a float32 copy");
  CT_PROF(CT_PROF_HEAD, ct_head_fused(h, W, ct_model_w16(m, W), ct_lm_head_grad(g, a), a->dln, b->B * b->T, coef, ctx));
  return n;
}

int ct_lm_step(const ct_model *m, ct_acts *a, ct_head *h, const ct_batch *b,
                const ct_weights *grads, float scale, float z_loss, ct_lm_stats *st) {
  ct_head_ce k = {scale, z_loss};
  int n = grads ? ct_lm_fused(m, grads, a, h, b, ct_head_ce_rows, &k) : ct_lm_forward(m, a, h, b);
  if (n < 0) return n;
  int row = -1, row_ok = 0;
  for (int r = 0; r < n; r++) {
    bool hit = h->argmax[r] == h->target[r];
    st->loss -= h->logp[r];
    st->z += (double)h->lse[r] * h->lse[r];
    st->entropy += h->entropy[r];
    st->correct += hit;
    int br = h->rows[r] / b->T;  // gathered rows come in token order
    if (br != row) {
      st->seq_ok += row >= 0 && row_ok;
      row = br;
      row_ok = 1;
    }
    row_ok &= hit;
  }
  st->seq_ok += row >= 0 && row_ok;
  st->seqs += b->B;
  st->targets += n;
  st->tokens += b->n_tokens;
  // the head's backward (done, fused with its forward), then the depths (they reuse h, and
  // leave a->dx_top), then the trunk
  int rc = a->mtp ? ct_mtp_step(a->mtp, m, a, h, b->target, b->B, b->T, grads, &st->mtp) : 0;
  if (!rc && grads) ct_backward(m, grads, a, a->dln, b->B, b->T);
  return rc;
}
