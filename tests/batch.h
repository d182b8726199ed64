// batch: the small hand-made batches of the gradient checks (two rows, one of them two
// packed documents), and loading one into a model's activations.
#pragma once
#include <string.h>

#include "forward.h"
#include "rng.h"

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
