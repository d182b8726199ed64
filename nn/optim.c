// optim: the AdamW step over the flat parameter buffer (one pass: decay, moments,
// update, zeroing the gradient), DiLoCo's outer Nesterov step, Hugging Face's learning-rate
// schedules and the fixed-order sum of squares for clipping. Muon is muon.c's.
#include "optim.h"

#include <math.h>
#include <stddef.h>

#include "bf16.h"
#include "pool.h"

typedef struct {
  float *p, *m, *v, *g;
  uint16_t *p16;  // or NULL
  long n;
  float lr, wd, b1, b2, eps, step_size, bc2_sqrt, gscale;
  int parts;
} adam_job;

static void adam_task(void *ctx, int part, int thread) {
  (void)thread;
  const adam_job *j = ctx;
  long lo, hi;
  ct_chunk_range(j->n, 16, j->parts, part, &lo, &hi);
  float *p = j->p, *m = j->m, *v = j->v, *g = j->g;
  float decay = 1.0f - j->lr * j->wd;
  for (long i = lo; i < hi; i++) {
    float gi = g[i] * j->gscale;
    g[i] = 0;
    p[i] *= decay;
    m[i] = j->b1 * m[i] + (1.0f - j->b1) * gi;
    v[i] = j->b2 * v[i] + (1.0f - j->b2) * gi * gi;
    p[i] -= j->step_size * m[i] / (sqrtf(v[i]) / j->bc2_sqrt + j->eps);
  }
  if (j->p16) ct_bf16_narrow(j->p16 + lo, p + lo, hi - lo);  // the chunk is still in cache
}

// AdamW on the elements [a, b) of tensor ti (inside the range starting at lo).
static void adam_tensor(const ct_tensor_info *ti, long lo, long a, long b, float *params, uint16_t *params16,
                        float *grads, float *mom1, float *mom2, double lr, double bc1, double bc2,
                        float grad_scale, const ct_adamw *h) {
  long s = a - lo;  // in the shard's buffers
  adam_job j = {params + a, mom1 + s, mom2 + s, grads + s, params16 ? params16 + a : NULL, b - a, (float)lr,
                ti->decay ? (float)h->weight_decay : 0.0f, (float)h->beta1, (float)h->beta2,
                (float)h->eps, (float)(lr / bc1), (float)sqrt(bc2), grad_scale, 0};
  j.parts = b - a < 65536 ? 1 : ct_pool_threads() * 2;
  ct_parallel_for(j.parts, adam_task, &j);
}

void ct_adamw_step_range(const ct_layout *model, long lo, long hi, float *params, uint16_t *params16,
                         float *grads, float *mom1, float *mom2, long step, double lr, float grad_scale,
                         const ct_adamw *h) {
  double bc1 = 1 - pow(h->beta1, (double)step), bc2 = 1 - pow(h->beta2, (double)step);
  for (int t = 0; t < model->n_tensors; t++) {
    const ct_tensor_info *ti = &model->tensors[t];
    long a = ti->offset > lo ? ti->offset : lo, b = ti->offset + ti->numel < hi ? ti->offset + ti->numel : hi;
    if (a >= b) continue;  // the tensor is outside the range
    adam_tensor(ti, lo, a, b, params, params16, grads, mom1, mom2, lr, bc1, bc2, grad_scale, h);
  }
}

void ct_adamw_step(const ct_layout *model, float *params, uint16_t *params16, float *grads, float *mom1,
                   float *mom2, long step, double lr, float grad_scale, const ct_adamw *h) {
  ct_adamw_step_range(model, 0, model->n_floats, params, params16, grads, mom1, mom2, step, lr, grad_scale, h);
}

const char *const ct_optimizer_names[] = {"adamw", "muon", NULL};
_Static_assert(sizeof ct_optimizer_names / sizeof *ct_optimizer_names == CT_OPT_COUNT + 1,
               "ct_optimizer_names must name every CT_OPT_* value");

void ct_nesterov_outer_step(float *start, float *mom, float *params, const float *d, long n, double lr,
                            double momentum) {
  float l = (float)lr, mu = (float)momentum;
  for (long i = 0; i < n; i++) {
    mom[i] = mu * mom[i] + d[i];
    start[i] -= l * (d[i] + mu * mom[i]);
    if (params) params[i] = start[i];
  }
}

const char *const ct_lr_scheduler_names[] = {"linear", "cosine", "constant",
                                             "constant_with_warmup", NULL};
_Static_assert(sizeof ct_lr_scheduler_names / sizeof *ct_lr_scheduler_names == CT_LR_COUNT + 1,
               "ct_lr_scheduler_names must name every CT_LR_* value");

double ct_lr_at(int kind, double peak, long step, long warmup, long total) {
  if (kind == CT_LR_CONSTANT) return peak;
  if (step < warmup) return peak * (double)step / (double)(warmup > 1 ? warmup : 1);
  if (kind == CT_LR_CONSTANT_WITH_WARMUP) return peak;
  double span = (double)(total - warmup > 1 ? total - warmup : 1);
  double progress = (double)(step - warmup) / span;
  if (kind == CT_LR_LINEAR) return peak * fmax(0.0, 1.0 - progress);
  return peak * fmax(0.0, 0.5 * (1.0 + cos(M_PI * progress)));  // cosine, half a cycle
}

#define SQ_PARTS 64  // fixed, so the sum does not depend on the number of threads

typedef struct {
  const float *g;
  long n;
  double part[SQ_PARTS];
} sq_job;

static void sq_task(void *ctx, int part, int thread) {
  (void)thread;
  sq_job *j = ctx;
  long lo, hi;
  ct_chunk_range(j->n, 16, SQ_PARTS, part, &lo, &hi);
  double acc = 0;
  for (long i = lo; i < hi; i += 4096) {
    float f = 0;  // float inner sums over short runs, double across them
    long e = i + 4096 < hi ? i + 4096 : hi;
#pragma omp simd reduction(+ : f)
    for (long k = i; k < e; k++) f += j->g[k] * j->g[k];
    acc += f;
  }
  j->part[part] = acc;
}

double ct_sum_squares(const float *g, long n) {
  sq_job j = {.g = g, .n = n};
  ct_parallel_for(SQ_PARTS, sq_task, &j);
  double s = 0;
  for (int i = 0; i < SQ_PARTS; i++) s += j.part[i];
  return s;
}
