// window: a trainer's logging window, the steps since its last metrics line. It sums the
// trainer's own step statistics (a struct made only of doubles, as ct_dist_sum_stats
// takes), each step's loss and gradient norm, counts the steps and keeps when the window
// began (for tokens per second).
//
//   kd_stats win = {0};              // the trainer's sums, owned by the trainer
//   ct_window w;
//   ct_window_init(&w, &win, sizeof win);
//   ... each step: ct_window_add(&w, &st, step_loss, norm);  tok_s = ct_window_rate(&w, win.tokens);
//   ... each metrics line: ct_window_loss(&w), ct_window_norm(&w); then ct_window_reset(&w)
#pragma once
#include <stddef.h>

typedef struct {
  double *sums;      // (n_sums) the trainer's statistics: the struct ct_window_init was given
  int n_sums;
  double loss, norm; // sums over the window's steps
  int steps;
  double t0;         // ct_now() when the window began
} ct_window;

// A window over `stats` (size bytes, doubles only), starting now with everything zero.
void ct_window_init(ct_window *w, void *stats, size_t size);
// Adds a step: its statistics (the same struct as the window's) into the window's, its loss
// and gradient norm into their sums.
void ct_window_add(ct_window *w, const void *step_stats, double loss, double norm);
// tokens / the seconds since the window began.
double ct_window_rate(const ct_window *w, double tokens);
// The mean loss and gradient norm over the window's steps.
double ct_window_loss(const ct_window *w);
double ct_window_norm(const ct_window *w);
// A new window, starting now: every sum zero (the trainer's statistics too).
void ct_window_reset(ct_window *w);
