// window: a trainer's logging window (window.h): sums over the steps since the last
// metrics line, and the time since.
#include "window.h"

#include <string.h>

#include "dist.h"
#include "log.h"

void ct_window_init(ct_window *w, void *stats, size_t size) {
  w->sums = stats;
  w->n_sums = (int)(size / sizeof(double));
  ct_window_reset(w);
}

void ct_window_add(ct_window *w, const void *step_stats, double loss, double norm) {
  ct_f64_add(w->sums, step_stats, w->n_sums);
  w->loss += loss;
  w->norm += norm;
  w->steps++;
}

double ct_window_rate(const ct_window *w, double tokens) { return tokens / (ct_now() - w->t0); }

double ct_window_loss(const ct_window *w) { return w->loss / w->steps; }

double ct_window_norm(const ct_window *w) { return w->norm / w->steps; }

void ct_window_reset(ct_window *w) {
  memset(w->sums, 0, sizeof(double) * w->n_sums);
  w->loss = w->norm = 0;
  w->steps = 0;
  w->t0 = ct_now();
}
