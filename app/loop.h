// loop: what every trainer's loop shares, so that its main reads as its algorithm: the
// memory plan with its dry run, this rank's micro-batches of a step, the "training" phase
// of a step's progress line, and when to evaluate. The logging window is window.h.
//
//   if (ct_loop_memory(&tr, &plan, knobs)) { ...free what was loaded...; ct_train_release(&tr); return 0; }
//   if (ct_loop_eval_on_start(&tr)) evaluate(...);
//   while (tr.step < tr.total_steps && !stop) {
//     int n = ct_train_next_seqs(&tr, seqs, global);
//     ct_loop_phase(&tr, 0, accum, 0);
//     for (int k = 0, first, m; k < accum && (m = ct_loop_micro(&tr, k, B, n, &first)); k++) {
//       ... the micro-batch seqs[first .. first + m) ...
//       ct_loop_phase(&tr, k + 1, accum, tokens);
//     }
//     ct_loop_update(&tr, &st, sizeof st, &norm, &lr); ... the metrics line ...
//     if (ct_loop_eval_after_step(&tr)) evaluate(...);
//     if (ct_train_after_step(&tr, &stop)) ct_die(1, NULL);
//   }
//   if (ct_loop_eval_at_end(&tr, stop)) evaluate(...);
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "train.h"

// The memory plan and the train state's buffers (ct_train_memory: p holds the trainer's
// rows, knobs names what lowers them), dying on failure ("<trainer>: <message>", exit 1).
// Returns true for a dry run: nothing was allocated, and the trainer frees what it loaded,
// calls ct_train_release and exits 0.
bool ct_loop_memory(ct_train *tr, ct_plan *p, const char *knobs);

// This rank's k-th micro-batch of a step's n sequences (the list ct_train_next_seqs
// filled), B at a time: every rank's k-th micro-batch comes before any (k+1)-th, in rank
// order. Returns its count (1..B) with its first index in the list in *first, or 0 when
// this rank has no k-th micro-batch (a step the data's end made short).
int ct_loop_micro(const ct_train *tr, int k, int B, int n, int *first);
// Whether micro-batch k (of accum) is this rank's last of the step: the one whose backward
// may overlap the gradients' sum (ct_train_overlap_arm).
bool ct_loop_micro_last(const ct_train *tr, int k, int accum, int B, int n);
// A step's end, after its micro-batches: the step's statistics (stats: size bytes, doubles
// only, as ct_dist_sum_stats takes) summed over the ranks, then the optimizer step
// (ct_train_update, its gradient norm and learning rate into *norm, *lr), dying on failure.
void ct_loop_update(ct_train *tr, void *stats, size_t size, double *norm, double *lr);
// The progress line's "training" phase of the step being taken: `done` of accum
// micro-batches, `tokens` processed so far (0 before the first).
void ct_loop_phase(ct_train *tr, int done, int accum, double tokens);

// When a run with eval_dataset_path evaluates: before its first step (eval_on_start; not
// on a resumed run), after every eval_steps-th step but the last, and at the end of a
// run that was not stopped.
bool ct_loop_eval_on_start(const ct_train *tr);
bool ct_loop_eval_after_step(const ct_train *tr);
bool ct_loop_eval_at_end(const ct_train *tr, bool stop);
