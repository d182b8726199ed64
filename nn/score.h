// score: the sequence-classification head over the decoder's final hidden states.
// A sequence's reward is score·h at its last real token (Hugging Face's
// *ForSequenceClassification pools the same way, at the last non-padding token).
//
//   lnf (B·T, C) the final RMSNorm output (ct_forward_batch's a->lnf), w (C) = score.weight
//   last (B): index in [0, T) of each row's last real token
#pragma once

// r[b] = Σ_i w[i] · lnf[(b·T + last[b])·C + i]
void ct_score_forward(const float *lnf, const int *last, int B, int T, int C, const float *w, double *r);

// Given d[b] = dL/dr[b]: dlnf[(b·T + last[b])·C + i] += d[b]·w[i] (dlnf (B·T, C), its
// other rows untouched: the caller zeroes it) and dw[i] += Σ_b d[b]·lnf[…] (dw may be NULL:
// a frozen head).
void ct_score_backward(const float *lnf, const int *last, int B, int T, int C, const float *w, const double *d,
                       float *dlnf, float *dw);
