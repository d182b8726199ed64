// batch: the small hand-made batches of the gradient checks (two rows, one of them two
// packed documents), loading one into a model's activations, and its loss and gradient.
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "forward.h"
#include "head.h"
#include "model.h"
#include "rng.h"

// Layers a CT_ACTS_RECOMPUTE batch_loss_grads keeps (ct_acts_init_kept).
static int batch_kept = 0;

typedef struct {
  int B, T;
  int ids[64], pos[64], seg[64], target[64];  // (B, T), B·T <= 64
} batch_t;

// Two rows of T random ids below V (seed 7). Row 0: one document, its last three tokens
// without a target (the last two padding). Row 1: two packed documents, the second from
// `split` (positions restart, seg = its start), each one's last token without a target.
static inline batch_t two_row_batch(int V, int T, int split) {
  batch_t b = {.B = 2, .T = T};
  ct_rng r;
  ct_rng_seed(&r, 7);
  for (int n = 0; n < 2 * T; n++) b.ids[n] = (int)ct_rng_below(&r, V);
  for (int t = 0; t < T; t++) {
    b.pos[t] = t;
    b.seg[t] = 0;
    b.target[t] = t < T - 3 ? b.ids[t + 1] : -1;
    b.pos[T + t] = t < split ? t : t - split;
    b.seg[T + t] = t < split ? 0 : split;
    b.target[T + t] = (t == split - 1 || t == T - 1) ? -1 : b.ids[T + t + 1];
  }
  return b;
}

// The batch's ids, positions and segments into a's first B·T tokens.
static inline void batch_load(ct_acts *a, const batch_t *b) {
  int N = b->B * b->T;
  memcpy(a->ids, b->ids, sizeof(int) * N);
  memcpy(a->pos, b->pos, sizeof(int) * N);
  memcpy(a->seg, b->seg, sizeof(int) * N);
}

// The float32 system under test: the mean over b's targets of cross-entropy + z·lse² through
// m's forward and head (ntiles vocabulary chunks), its gradient into grads (zeroed first; g
// views them). The activations have `extra` rows and tokens of room past b (a batch smaller
// than the capacity, as most are); with extra, a forward of a whole-capacity batch of other
// tokens runs first, so stale values sit in every buffer.
static inline double batch_loss_grads(const ct_model *m, const ct_weights *g, const batch_t *b, double z,
                                      int ntiles, int mode, float *grads, int extra) {
  const ct_model_config *c = &m->cfg;
  int N = b->B * b->T;
  ct_acts a;
  ct_head h;
  if (ct_acts_init_kept(&a, m, b->B + extra, b->T + extra, mode, batch_kept) ||
      ct_head_init(&h, N, N, c->vocab_size, c->hidden_size, ntiles)) {
    fprintf(stderr, "%s\n", ct_last_error());
    exit(1);
  }
  if (extra) {
    long cap = (long)a.B * a.T;
    for (long n = 0; n < cap; n++) a.ids[n] = (int)(n * 7 % c->vocab_size), a.pos[n] = (int)(n % a.T), a.seg[n] = 0;
    ct_forward(m, &a, a.B, a.T);
  }
  batch_load(&a, b);
  ct_forward(m, &a, b->B, b->T);
  int n = ct_head_gather(&h, a.lnf, b->target, N);
  ct_head_forward(&h, m->w.lm_head);
  double loss = 0;
  for (int r = 0; r < n; r++) {
    loss += -h.logp[r] + z * h.lse[r] * h.lse[r];
    h.coef[r] = 1.0f / n;
    h.zcoef[r] = (float)(2 * z * h.lse[r] / n);
  }
  memset(grads, 0, sizeof(float) * m->n_floats);
  ct_head_backward(&h, m->w.lm_head, g->lm_head, a.dln, N);
  ct_backward(m, g, &a, a.dln, b->B, b->T);
  ct_head_free(&h);
  ct_acts_free(&a);
  return loss / n;
}
