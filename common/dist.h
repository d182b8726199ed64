// dist: MPI across processes. Every trainer runs the same code at world size 1 (a
// plain `bin/sft ...` is an MPI singleton) and under `mpirun -np N bin/sft ...`.
// Each rank holds the whole model; gradients are summed across ranks before the
// optimizer step, so every rank takes the same step.
#pragma once
#include <stddef.h>

int ct_dist_init(int *argc, char ***argv);
void ct_dist_finalize(void);
int ct_dist_rank(void);
int ct_dist_world(void);
// Ranks of this job on this machine (to divide the cores between them).
int ct_dist_local_size(void);

// In-place sums across ranks (no-ops at world size 1).
int ct_dist_sum_f32(float *buf, long n);
int ct_dist_sum_f64(double *buf, int n);
// A struct made only of doubles (a trainer's step statistics): summed across ranks in
// place, and added into another of its kind (a logging window).
#define ct_dist_sum_stats(s) ct_dist_sum_f64((double *)(s), (int)(sizeof *(s) / sizeof(double)))
#define ct_stats_add(dst, src) ct_f64_add((double *)(dst), (const double *)(src), (int)(sizeof *(src) / sizeof(double)))
static inline void ct_f64_add(double *dst, const double *src, int n) {
  for (int i = 0; i < n; i++) dst[i] += src[i];
}
// The largest value across ranks: error codes agree before anyone stops.
int ct_dist_max_int(int v);
// In-place element-wise maxima across ranks (a minimum is the max of the negated values).
int ct_dist_max_f64(double *buf, int n);
// Every rank's n bytes of text, concatenated in rank order, into *out on rank 0 (malloc'd,
// NUL-terminated, *len bytes without the NUL); *out is NULL on the other ranks. At world
// size 1 it is a copy of s.
int ct_dist_gather_text(const char *s, size_t n, char **out, size_t *len);
// Stops every other rank after a fatal error on this one (returns at world size 1).
void ct_dist_abort(int code);

// A trainer's fatal error: prints "prog: what: <ct_last_error()>" (what may be NULL),
// stops every rank and exits with `code` (2: bad configuration, 1: anything else).
__attribute__((noreturn)) void ct_dist_die(const char *prog, int code, const char *what);
