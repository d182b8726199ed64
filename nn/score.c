// score: the score head's forward and backward at each row's last real token. The
// backbone's forward and backward are nn/forward's (ct_forward_batch, ct_backward).
#include "score.h"

void ct_score_forward(const float *lnf, const int *last, int B, int T, int C, const float *w, double *r) {
  for (int b = 0; b < B; b++) {
    const float *h = lnf + ((long)b * T + last[b]) * C;  // (C)
    double s = 0;
    for (int i = 0; i < C; i++) s += (double)w[i] * h[i];
    r[b] = s;
  }
}

void ct_score_backward(const float *lnf, const int *last, int B, int T, int C, const float *w, const double *d,
                       float *dlnf, float *dw) {
  for (int b = 0; b < B; b++) {
    long row = ((long)b * T + last[b]) * C;
    for (int i = 0; i < C; i++) {
      dlnf[row + i] += (float)(d[b] * w[i]);
      if (dw) dw[i] += (float)(d[b] * lnf[row + i]);
    }
  }
}
