// loop: what every trainer's loop shares (loop.h): the memory plan with its dry run,
// micro-batch slicing, the "training" phase, the evaluation schedule. Nothing here
// computes a loss.
#include "loop.h"

#include "die.h"
#include "dist.h"

bool ct_loop_memory(ct_train *tr, ct_plan *p, const char *knobs) {
  bool dry;
  if (ct_train_memory(tr, p, knobs, &dry)) ct_die(1, NULL);
  return dry;
}

int ct_loop_micro(const ct_train *tr, int k, int B, int n, int *first) {
  *first = (k * tr->world + tr->rank) * B;
  if (*first >= n) return 0;
  return n - *first < B ? n - *first : B;
}

bool ct_loop_micro_last(const ct_train *tr, int k, int accum, int B, int n) {
  int next;
  return k == accum - 1 || ct_loop_micro(tr, k + 1, B, n, &next) == 0;
}

void ct_loop_update(ct_train *tr, void *stats, size_t size, double *norm, double *lr) {
  ct_dist_sum_f64(stats, (int)(size / sizeof(double)));  // (its result unchecked, as the mains' always was)
  if (ct_train_update(tr, norm, lr)) ct_die(1, NULL);
}

void ct_loop_phase(ct_train *tr, int done, int accum, double tokens) {
  ct_log_phase(&tr->log, tr->step + 1, "training", done, accum, "micro-batches", tokens, NULL);
}

static bool have_eval(const ct_train *tr) { return tr->cfg->eval_dataset_path[0] != 0; }

bool ct_loop_eval_on_start(const ct_train *tr) {
  return have_eval(tr) && tr->cfg->eval_on_start && tr->step == 0;
}

bool ct_loop_eval_after_step(const ct_train *tr) {
  const ct_config *c = tr->cfg;
  return have_eval(tr) && c->eval_steps > 0 && tr->step % c->eval_steps == 0 && tr->step != tr->total_steps;
}

bool ct_loop_eval_at_end(const ct_train *tr, bool stop) { return !stop && have_eval(tr); }
