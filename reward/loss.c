// reward/loss: the Bradley–Terry pair loss with TRL's margin and reward centering, and the
// per-pair sums behind loss, accuracy, margin and the reward extremes. The score head and
// the batching are the trainer's.
#include "reward/loss.h"

#include <math.h>

// log σ(z) without overflow for large |z|
static double log_sigmoid(double z) { return z >= 0 ? -log1p(exp(-z)) : z - log1p(exp(z)); }

double ct_rm_pair_loss(double r_c, double r_r, double margin, double center, double *d_c, double *d_r) {
  double z = r_c - r_r - margin, s = 1.0 / (1.0 + exp(z));  // s = σ(−z)
  double sum = r_c + r_r;
  *d_c = -s + 2 * center * sum;
  *d_r = s + 2 * center * sum;
  return -log_sigmoid(z) + center * sum * sum;
}

void ct_rm_add_pair(ct_rm_sums *s, ct_rm_range *e, double r_c, double r_r, double loss) {
  s->loss += loss;
  s->correct += r_c > r_r;
  s->margin += r_c - r_r;
  s->reward += r_c + r_r;
  s->pairs += 1;
  e->max = fmax(e->max, fmax(r_c, r_r));
  e->neg_min = fmax(e->neg_min, -fmin(r_c, r_r));
}
