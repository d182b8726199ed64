// muon: the Muon optimizer (Keller Jordan's, with Moonlight's update scale) for the hidden
// matrices, each orthogonalized by a Newton–Schulz iteration; AdamW (optim.h) for the rest.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "model.h"
#include "optim.h"

// Muon (Keller Jordan's, with Moonlight's update scale) takes the 2-D matrices of the
// decoder layers (q/k/v/o, gate/up/down): the tensors named model.layers.* with two
// dimensions. Embeddings, the LM head, norms and biases stay with AdamW.
bool ct_muon_takes(const ct_tensor_info *ti);
// How many tensors of the layout Muon takes, and the scratch floats ct_muon_step needs
// (for its largest matrix, (m, n), k = min, K = max: 2·k·K + 2·k²).
int ct_muon_count(const ct_layout *m);
long ct_muon_work_floats(const ct_layout *m);

// One optimizer step with Muon for the tensors ct_muon_takes and AdamW (ct_adamw_step's
// arithmetic, bit for bit, with mom1 and mom2) for the others. For a Muon matrix P (m, n),
// with g = grad_scale · grads and μ = momentum (Moonlight's form, Nesterov):
//   buf = μ·buf + g  (buf: the matrix's part of mom1; mom2 is left untouched)
//   u = g + μ·buf;  X = u / (‖u‖_F + 1e-7), transposed when m > n so that X is (k, K)
//   5 times: A = X·Xᵀ;  B = b·A + c·A·A;  X = a·X + B·X   ((a, b, c) = (3.4445, −4.7750, 2.0315))
//   P = P·(1 − lr·wd) − lr · 0.2·sqrt(max(m, n)) · X (transposed back)
// in float32, the products through ct_sgemm (threads inside each product, one matrix after
// the other). work: ct_muon_work_floats floats. Zeroes grads; writes params16 when not NULL.
void ct_muon_step(const ct_layout *m, float *params, uint16_t *params16, float *grads, float *mom1,
                  float *mom2, float *work, long step, double lr, float grad_scale, const ct_adamw *h,
                  double momentum);
