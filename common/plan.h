// plan: the memory plan a trainer makes before it allocates anything big — one row per
// buffer (parameters, gradients, optimizer moments, frozen models, activations, logits,
// caches), each sized by the function the allocation itself uses, plus what the process
// already holds (tokenizer, data, libraries). Printed at start-up, compared with the
// machine's available memory (shared by the ranks on this machine), refused with the
// knobs that shrink it when it does not fit.
#pragma once
#include <stdbool.h>

#include "log.h"

#define CT_PLAN_ROWS 32

typedef struct {
  struct {
    char what[64];
    double bytes;
  } row[CT_PLAN_ROWS];
  int n;
  double resident;  // the row of what the process holds already (ct_plan_add_resident)
} ct_plan;

// Adds a row (rows of 0 bytes are left out; past CT_PLAN_ROWS, rows merge into the last).
void ct_plan_add(ct_plan *p, const char *what, double bytes);
// The same with the row's name formatted ("activations, %d x %d tokens", ...).
void ct_plan_addf(ct_plan *p, double bytes, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
double ct_plan_total(const ct_plan *p);
// The row of what the process holds already (libraries, tokenizer, data: resident now);
// add it last, after the rows of what is still to allocate.
void ct_plan_add_resident(ct_plan *p);

// The memory one of ranks_here ranks on this machine may plan for: MemAvailable, or a
// cgroup's room when that is less, shared evenly; 0 when neither is known. *cgroup_limit
// (may be NULL): the cgroup's limit when it is what binds, else 0.
double ct_plan_room(int ranks_here, double *cgroup_limit);
// Prints the plan (MiB per row, the total, the memory available to this rank) on the
// log, then: 0 when it fits; CT_ENOMEM naming the total, what is available and `knobs`
// (the settings that shrink this trainer's plan) when it does not. Available is the least
// of MemAvailable and a cgroup memory limit's room, shared by the ranks on this machine.
// Under an address-space limit (ulimit -v) the plan's new rows, OpenBLAS's work buffers
// for the pool's threads and what is mapped now must fit it too. *over_memory (may be NULL):
// whether memory (not the address-space limit) refused it.
int ct_plan_check(const ct_plan *p, ct_log *log, int ranks_here, const char *knobs, bool *over_memory);
