// kd: the soft (teacher) term of distillation over a student's gathered
// completion rows, with its gradient.
//
// Per token, with s = log_softmax(z_student / τ), t = log_softmax(z_teacher / τ):
//   β = 0  KL(T‖S) = Σ p_T (t − s)                       (forward KL)
//   β = 1  KL(S‖T) = Σ p_S (s − t)                       (reverse KL)
//   else   β·KL(T‖M) + (1−β)·KL(S‖M),  M = β·p_T + (1−β)·p_S   (generalized JSD)
// With g_i = ∂L/∂s_i (−p_T,i; p_S,i (s_i − t_i + 1); (1−β) p_S,i (s_i − m_i)), the
// gradient is ∂L/∂z_j = (g_j − p_S,j Σ_i g_i) / τ.
//
// The vocabulary is processed in `ntiles` chunks: logits of a chunk are computed,
// folded into running normalizers (pass 1), into the loss and Σ g (pass 2), and into the
// gradient (pass 3), so B×T×V teacher logits never sit in memory at once (with one chunk
// both models' logits are kept instead of recomputed). The teacher's logits come from a
// callback on its final hidden states, which the teacher computed before the student's
// pass, outside it.
#pragma once
#include <stdbool.h>

// Teacher logits (n, nv) of vocabulary columns [v0, v0 + nv) for the n gathered rows,
// unscaled (no temperature).
typedef void (*ct_kd_teacher_fn)(void *ctx, int n, int v0, int nv, float *out);

typedef struct {
  int cap, V, C, ntiles, tile;
  float *ls, *lt;             // (cap, tile) student and teacher logit chunks
  double *lse_s, *lse_t;      // (cap) normalizers at temperature τ (running max until done)
  double *sum_s, *sum_t;      // (cap) running sums of exponentials
  double *gsum;               // (cap) Σ_i g_i
  double *loss;               // (cap) each row's soft loss
  double *lse_t1, *tgt_t1;    // (cap) teacher at τ = 1: log Σ e^z and the target's logit
  double *sum_t1;
  float *dhs;                 // (cap, C) gradient for the gathered student rows
  long bytes;
} ct_kd;

int ct_kd_init(ct_kd *k, int cap_rows, int V, int C, int ntiles);
// The bytes ct_kd_init allocates.
double ct_kd_bytes(int cap_rows, int V, int C, int ntiles);
void ct_kd_free(ct_kd *k);

typedef struct {
  float tau, beta;
  float scale;  // the gradient is of scale · Σ_rows loss (e.g. α·τ²/N)
  bool frozen_head;  // compute k->dhs although dW is NULL (a frozen LM head: LoRA)
} ct_kd_opts;

// Soft loss of n student rows hs (n, C) against W (V, C); with dW != NULL also the
// gradient: dW += ..., k->dhs = ... (n, C). target (n) gives the teacher perplexity's
// targets. Returns Σ_rows loss; per-row values stay in k->loss, the teacher's target
// log-prob in k->tgt_t1 - k->lse_t1.
double ct_kd_soft(ct_kd *k, const float *hs, int n, const float *W, float *dW, const int *target,
                  ct_kd_teacher_fn teacher, void *ctx, const ct_kd_opts *o);

// The same against a teacher known only by its top-k logits per row: idx (n, kk) token
// ids, tl (n, kk) their teacher logits (unscaled). Both distributions are taken over
// those kk ids, renormalized. With kk = V it equals ct_kd_soft.
double ct_kd_soft_topk(ct_kd *k, const float *hs, int n, const float *W, float *dW, const int *idx,
                       const float *tl, int kk, const ct_kd_opts *o);

// Per-token loss and ∂L/∂z (V entries) for one row from plain logit arrays, in double:
// the definition the chunked code is tested against.
double ct_kd_reference(const double *zs, const double *zt, int V, double tau, double beta, double *dz);
