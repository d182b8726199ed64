// muon: one Muon step (ct_muon_step): for each hidden matrix the Nesterov momentum, its
// orthogonalization by five Newton–Schulz iterations through ct_sgemm, and the update scaled
// as Moonlight's; the other tensors take ct_adamw_step_range's AdamW step.
#include "muon.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "bf16.h"
#include "matmul.h"

// The hidden matrices: the decoder layers' and the multi-token prediction depths' (their
// blocks and eh_proj, the 2C -> C projection), never the embeddings or the head.
bool ct_muon_takes(const ct_tensor_info *ti) {
  return ti->ndim == 2 && (!strncmp(ti->name, "model.layers.", 13) || !strncmp(ti->name, "mtp.layers.", 11));
}

int ct_muon_count(const ct_layout *m) {
  int n = 0;
  for (int t = 0; t < m->n_tensors; t++) n += ct_muon_takes(&m->tensors[t]);
  return n;
}

long ct_muon_work_floats(const ct_layout *m) {
  long most = 0;
  for (int t = 0; t < m->n_tensors; t++) {
    const ct_tensor_info *ti = &m->tensors[t];
    if (!ct_muon_takes(ti)) continue;
    long k = ti->shape[0] < ti->shape[1] ? ti->shape[0] : ti->shape[1], K = ti->numel / (k ? k : 1);
    long w = 2 * k * K + 2 * k * k;
    if (w > most) most = w;
  }
  return most;
}

#define MUON_NS_STEPS 5
#define MUON_EPS 1e-7

// X (k, K) row-major to its orthogonalization's Newton–Schulz estimate, in place (the
// result is copied back into X); Y (k, K), A and B (k, k): scratch.
static void newton_schulz5(float *X, float *Y, float *A, float *B, int k, int K) {
  const float a = 3.4445f, b = -4.7750f, c = 2.0315f;
  float *x = X, *y = Y;
  for (int it = 0; it < MUON_NS_STEPS; it++) {
    ct_sgemm('N', 'T', k, k, K, 1.0f, x, K, x, K, 0.0f, A, k);          // A = X·Xᵀ
    memcpy(B, A, sizeof(float) * (size_t)k * (size_t)k);
    ct_sgemm('N', 'N', k, k, k, c, A, k, A, k, b, B, k);                // B = b·A + c·A·A
    memcpy(y, x, sizeof(float) * (size_t)k * (size_t)K);
    ct_sgemm('N', 'N', k, K, k, 1.0f, B, k, x, K, a, y, K);             // Y = a·X + B·X
    float *t = x;
    x = y, y = t;
  }
  if (x != X) memcpy(X, x, sizeof(float) * (size_t)k * (size_t)K);
}

// One Muon step of the matrix ti (m, n) at p, its gradient g and momentum buf.
static void muon_matrix(const ct_tensor_info *ti, float *p, uint16_t *p16, float *g, float *buf, float *work,
                        double lr, float grad_scale, double wd, double momentum) {
  long m = ti->shape[0], n = ti->shape[1], len = ti->numel;
  bool tr = m > n;  // orthogonalize the wide way round: X is (k, K), k <= K
  int k = (int)(tr ? n : m), K = (int)(tr ? m : n);
  float *X = work, *Y = X + len, *A = Y + len, *B = A + (long)k * k;
  float mu = (float)momentum;
  double sq = 0;
  for (long i = 0; i < len; i++) {  // Y (m, n) = the Nesterov update
    float gi = g[i] * grad_scale;
    g[i] = 0;
    buf[i] = mu * buf[i] + gi;
    Y[i] = gi + mu * buf[i];
    sq += (double)Y[i] * Y[i];
  }
  float inv = (float)(1.0 / (sqrt(sq) + MUON_EPS));
  for (long r = 0; r < m; r++)
    for (long col = 0; col < n; col++) X[tr ? col * m + r : r * n + col] = Y[r * n + col] * inv;
  newton_schulz5(X, Y, A, B, k, K);
  float decay = (float)(1.0 - lr * wd), scale = (float)(lr * 0.2 * sqrt((double)K));
  for (long r = 0; r < m; r++)
    for (long col = 0; col < n; col++)
      p[r * n + col] = p[r * n + col] * decay - scale * X[tr ? col * m + r : r * n + col];
  if (p16) ct_bf16_narrow(p16, p, len);
}

void ct_muon_step(const ct_layout *model, float *params, uint16_t *params16, float *grads, float *mom1,
                  float *mom2, float *work, long step, double lr, float grad_scale, const ct_adamw *h,
                  double momentum) {
  for (int t = 0; t < model->n_tensors; t++) {
    const ct_tensor_info *ti = &model->tensors[t];
    long a = ti->offset, b = a + ti->numel;
    if (!ct_muon_takes(ti)) {
      ct_adamw_step_range(model, a, b, params, params16, grads + a, mom1 + a, mom2 + a, step, lr, grad_scale, h);
      continue;
    }
    muon_matrix(ti, params + a, params16 ? params16 + a : NULL, grads + a, mom1 + a, work, lr, grad_scale,
                ti->decay ? h->weight_decay : 0.0, momentum);
  }
}
