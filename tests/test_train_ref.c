// Five optimizer steps (two micro-batches each, AdamW with weight decay, warmup +
// cosine schedule, gradient clipping) must give the same losses and parameters as an
// independent float64 computation: reference model, central-difference gradients,
// and AdamW / schedule / clipping written from their definitions.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "error.h"
#include "lm.h"
#include "matmul.h"
#include "pool.h"
#include "ref_model.h"
#include "rng.h"
#include "test.h"
#include "tiny_model.h"
#include "train.h"

#define STEPS 5
#define T_ 6

typedef struct {
  int ids[2 * T_], pos[2 * T_], seg[2 * T_], target[2 * T_];
} mb_t;

// Micro-batch k: two causal rows of T_ tokens; different numbers of targets per
// micro-batch so that normalizing per micro-batch would give a different answer.
static mb_t make_mb(int k, int V) {
  mb_t b;
  ct_rng r;
  ct_rng_seed(&r, 100 + k);
  for (int n = 0; n < 2 * T_; n++) {
    b.ids[n] = (int)ct_rng_below(&r, V);
    b.pos[n] = n % T_;
    b.seg[n] = 0;
  }
  for (int n = 0; n < 2 * T_; n++) {
    int t = n % T_;
    bool has = t + 1 < T_ && (k == 0 ? t >= 1 : t >= 3);  // 8 targets vs 4 per micro-batch
    b.target[n] = has ? b.ids[n + 1] : -1;
  }
  return b;
}

static double ref_step_loss(const ref_t *r, const mb_t *mb, int *count) {
  int c0, c1;
  double s = ref_loss(r, 2, T_, mb[0].ids, mb[0].pos, mb[0].seg, mb[0].target, 0, &c0) +
             ref_loss(r, 2, T_, mb[1].ids, mb[1].pos, mb[1].seg, mb[1].target, 0, &c1);
  *count = c0 + c1;
  return s / (c0 + c1);
}

static double ref_lr(long step, double peak, long warmup, long total) {
  if (step < warmup) return peak * step / warmup;
  double progress = (double)(step - warmup) / (total - warmup);
  return peak * 0.5 * (1 + cos(M_PI * progress));
}

static void test_five_steps_match_float64_reference_training(void) {
  ct_model_config mc = mini_config();  // smaller still: V 13, C 8, F 12, 2 heads over 1
  mc.vocab_size = 13, mc.hidden_size = 8, mc.intermediate_size = 12, mc.num_heads = 2, mc.num_kv_heads = 1;
  ct_config cfg;
  CHECK_OK(ct_config_init(&cfg, CT_TRAINER_SFT));
  cfg.learning_rate = 3e-2;
  cfg.lr_scheduler_type = CT_LR_COSINE;
  cfg.weight_decay = 0.1;
  cfg.max_grad_norm = 0.5;
  ct_train tr = {.cfg = &cfg, .world = 1, .total_steps = STEPS, .warmup_steps = 2};
  CHECK_OK(ct_model_init(&tr.model, &mc, 16));
  ct_model *m = &tr.model;
  ct_model_init_random(m, 9, 0.5f);
  size_t bytes = sizeof(float) * m->n_floats;
  tr.grads = calloc(1, bytes);
  tr.mom1 = calloc(1, bytes);
  tr.mom2 = calloc(1, bytes);
  CHECK_OK(ct_weights_bind(&tr.g, m, tr.grads));
  tr.trained = ct_model_tensors(m);  // full fine-tuning: the model is what trains
  tr.params = m->params;
  tr.adam = (ct_adamw){cfg.adam_beta1, cfg.adam_beta2, cfg.adam_epsilon, cfg.weight_decay};
  ct_acts a;
  ct_head h;
  ct_batch b;
  CHECK_OK(ct_acts_init(&a, m, 2, T_, CT_ACTS_KEEP));
  CHECK_OK(ct_head_init(&h, 2 * T_, 2 * T_, mc.vocab_size, mc.hidden_size, 2));
  CHECK_OK(ct_batch_init(&b, 2, T_));
  mb_t mb[2] = {make_mb(0, mc.vocab_size), make_mb(1, mc.vocab_size)};

  long n = m->n_floats;
  double *P = calloc(n, 8), *G = calloc(n, 8), *M1 = calloc(n, 8), *M2 = calloc(n, 8);
  for (long i = 0; i < n; i++) P[i] = m->params[i];
  ref_t ref = {m, P};
  int clipped = 0;
  for (int s = 0; s < STEPS; s++) {
    // ours
    double labels = 0;
    for (int k = 0; k < 2; k++)
      for (int i = 0; i < 2 * T_; i++) labels += mb[k].target[i] >= 0;
    ct_lm_stats st = {0};
    for (int k = 0; k < 2; k++) {
      b.B = 2;
      b.T = T_;
      b.n_tokens = 2 * T_;
      memcpy(b.ids, mb[k].ids, sizeof mb[k].ids);
      memcpy(b.pos, mb[k].pos, sizeof mb[k].pos);
      memcpy(b.seg, mb[k].seg, sizeof mb[k].seg);
      memcpy(b.target, mb[k].target, sizeof mb[k].target);
      CHECK_OK(ct_lm_step(m, &a, &h, &b, &tr.g, (float)(1 / labels), 0, &st));
    }
    double ours = st.loss / st.targets, norm, lr;
    CHECK_OK(ct_train_update(&tr, &norm, &lr));

    // reference
    int count;
    double want = ref_step_loss(&ref, mb, &count);
    CHECK(count == (int)labels && count == 12);  // 8 + 4 targets
    for (long i = 0; i < n; i++) {
      double keep = P[i], e = 1e-6;
      P[i] = keep + e;
      double lp = ref_step_loss(&ref, mb, &count);
      P[i] = keep - e;
      double lm = ref_step_loss(&ref, mb, &count);
      P[i] = keep;
      G[i] = (lp - lm) / (2 * e);
    }
    double sq = 0;
    for (long i = 0; i < n; i++) sq += G[i] * G[i];
    double want_norm = sqrt(sq), clip = want_norm > 0.5 ? 0.5 / (want_norm + 1e-6) : 1;
    clipped += want_norm > 0.5;
    double want_lr = ref_lr(s, 3e-2, 2, STEPS), b1 = 0.9, b2 = 0.999;
    for (int ti = 0; ti < m->n_tensors; ti++) {
      const ct_tensor_info *t = &m->tensors[ti];
      bool decay = t->ndim == 2;  // matrices and the embedding; not norms
      for (long k = 0; k < t->numel; k++) {
        long i = t->offset + k;
        double g = G[i] * clip;
        if (decay) P[i] -= want_lr * 0.1 * P[i];
        M1[i] = b1 * M1[i] + (1 - b1) * g;
        M2[i] = b2 * M2[i] + (1 - b2) * g * g;
        double mh = M1[i] / (1 - pow(b1, s + 1)), vh = M2[i] / (1 - pow(b2, s + 1));
        P[i] -= want_lr * mh / (sqrt(vh) + 1e-8);
      }
    }
    fprintf(stderr, "  step %d: loss %.9f (reference %.9f), grad norm %.6f (%.6f), lr %.5f\n", s + 1,
            ours, want, norm, want_norm, lr);
    CHECK_NEAR(ours, want, 1e-5 * want);
    CHECK_NEAR(norm, want_norm, 1e-4 * want_norm);
    CHECK_NEAR(lr, want_lr, 1e-12);
  }
  CHECK(clipped >= 1);  // the clipping path was exercised
  double worst = 0;
  for (int ti = 0; ti < m->n_tensors; ti++) {
    const ct_tensor_info *t = &m->tensors[ti];
    for (long k = 0; k < t->numel; k++) {
      long i = t->offset + k;
      worst = fmax(worst, fabs(m->params[i] - P[i]));
    }
  }
  fprintf(stderr, "  largest parameter difference after %d steps: %.3g\n", STEPS, worst);
  CHECK(worst < 1e-4);
  free(P); free(G); free(M1); free(M2);
  ct_acts_free(&a);
  ct_head_free(&h);
  ct_batch_free(&b);
  free(tr.grads); free(tr.mom1); free(tr.mom2);
  ct_weights_free(&tr.g);
  ct_model_free(m);
  ct_config_free(&cfg);
}

// The schedules at their landmarks, as transformers' get_scheduler defines them.
static void test_lr_schedules_match_transformers_landmarks(void) {
  CHECK_NEAR(ct_lr_at(CT_LR_LINEAR, 1.0, 0, 10, 110), 0.0, 0);
  CHECK_NEAR(ct_lr_at(CT_LR_LINEAR, 1.0, 5, 10, 110), 0.5, 1e-15);
  CHECK_NEAR(ct_lr_at(CT_LR_LINEAR, 1.0, 10, 10, 110), 1.0, 1e-15);
  CHECK_NEAR(ct_lr_at(CT_LR_LINEAR, 1.0, 60, 10, 110), 0.5, 1e-15);
  CHECK_NEAR(ct_lr_at(CT_LR_LINEAR, 1.0, 110, 10, 110), 0.0, 1e-15);
  CHECK_NEAR(ct_lr_at(CT_LR_COSINE, 2.0, 60, 10, 110), 1.0, 1e-12);
  CHECK_NEAR(ct_lr_at(CT_LR_COSINE, 2.0, 35, 10, 110), 2.0 * 0.5 * (1 + cos(M_PI / 4)), 1e-12);
  CHECK_NEAR(ct_lr_at(CT_LR_CONSTANT, 3.0, 0, 10, 110), 3.0, 0);
  CHECK_NEAR(ct_lr_at(CT_LR_CONSTANT_WITH_WARMUP, 3.0, 5, 10, 110), 1.5, 1e-15);
  CHECK_NEAR(ct_lr_at(CT_LR_CONSTANT_WITH_WARMUP, 3.0, 50, 10, 110), 3.0, 0);
  CHECK_NEAR(ct_lr_at(CT_LR_LINEAR, 1.0, 0, 0, 4), 1.0, 0);  // no warmup: full rate at once
}

int main(int argc, char **argv) {
  ct_blas_init(argc, argv);
  ct_pool_init(2);
  RUN(test_five_steps_match_float64_reference_training);
  RUN(test_lr_schedules_match_transformers_landmarks);
  return test_summary();
}
