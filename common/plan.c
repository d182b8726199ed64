// plan: rows of bytes, their sum, and the one comparison with MemAvailable. It does not
// allocate anything itself; the sizes come from the modules' *_bytes functions.
#include "plan.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "matmul.h"
#include "mem.h"
#include "pool.h"

void ct_plan_add(ct_plan *p, const char *what, double bytes) {
  if (bytes <= 0) return;
  if (p->n == CT_PLAN_ROWS) {
    p->row[CT_PLAN_ROWS - 1].bytes += bytes;
    snprintf(p->row[CT_PLAN_ROWS - 1].what, sizeof p->row[0].what, "other buffers");
    return;
  }
  snprintf(p->row[p->n].what, sizeof p->row[0].what, "%s", what);
  p->row[p->n++].bytes = bytes;
}

void ct_plan_addf(ct_plan *p, double bytes, const char *fmt, ...) {
  char what[64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  ct_plan_add(p, what, bytes);
}

double ct_plan_total(const ct_plan *p) {
  double t = 0;
  for (int i = 0; i < p->n; i++) t += p->row[i].bytes;
  return t;
}

void ct_plan_add_resident(ct_plan *p) {
  double before = ct_plan_total(p);
  ct_plan_add(p, "resident already (libraries, tokenizer, data)", (double)ct_rss_now());
  p->resident = ct_plan_total(p) - before;
}

// Slack for what the plan has no row for under an address-space limit: the 2 MiB that
// aligns each big buffer (about one per row), small allocations, oneDNN's scratch.
#define AS_SLACK(p) ((16.0 + 2.0 * (p)->n) * 1048576)

// The address-space side of the check: 0 when no limit, or when it holds the plan (then
// the room for OpenBLAS's buffers is held until they are mapped: ct_blas_reserve).
static int check_address_space(const ct_plan *p, ct_log *log, double total, const char *knobs) {
  const double MiB = 1048576.0;
  int threads = ct_blas_buffers_to_map(ct_pool_threads());  // (shown: what reserve counts)
  double fresh = total - p->resident, need, used, limit;
  bool fits = ct_blas_reserve(ct_pool_threads(), fresh + AS_SLACK(p), &need, &used, &limit);
  if (limit >= (double)SIZE_MAX) return 0;
  ct_log_info(log, "  %9.0f  address space: %.0f mapped now + the plan's new rows + %d x %.0f OpenBLAS work "
              "buffers + %.0f slack, of the %.0f of ulimit -v", need / MiB, used / MiB, threads,
              CT_BLAS_BUFFER_BYTES / MiB, AS_SLACK(p) / MiB, limit / MiB);
  if (fits) return 0;
  return ct_set_error(CT_ENOMEM, "address-space limit (ulimit -v) is %.0f MiB; the memory plan needs %.0f MiB of "
                      "address space (%.0f MiB mapped now, %.0f MiB of new buffers, %d x %.0f MiB for OpenBLAS's "
                      "work buffers, %.0f MiB slack); raise ulimit -v, lower num_threads or shrink the plan with %s",
                      limit / MiB, need / MiB, used / MiB, fresh / MiB, threads, CT_BLAS_BUFFER_BYTES / MiB,
                      AS_SLACK(p) / MiB, knobs);
}

double ct_plan_room(int ranks_here, double *cgroup_limit) {
  size_t cg_room, cg_limit;
  ct_mem_cgroup_room("", &cg_room, &cg_limit);
  double machine = (double)ct_mem_available(), room = cg_room < machine || machine <= 0 ? (double)cg_room : machine;
  bool cg = cg_room != SIZE_MAX && (machine <= 0 || (double)cg_room < machine);
  if (room >= (double)SIZE_MAX) room = 0;  // (neither known)
  if (cgroup_limit) *cgroup_limit = cg ? (double)cg_limit : 0;
  return room / (ranks_here > 0 ? ranks_here : 1);
}

int ct_plan_check(const ct_plan *p, ct_log *log, int ranks_here, const char *knobs, bool *over_memory) {
  const double MiB = 1048576.0;
  if (over_memory) *over_memory = false;
  double cg_limit, avail = ct_plan_room(ranks_here, &cg_limit), total = ct_plan_total(p);
  char src[96] = "";
  if (cg_limit > 0) snprintf(src, sizeof src, " (cgroup memory limit %.0f MiB)", cg_limit / MiB);
  ct_log_info(log, "memory plan (MiB):");
  for (int i = 0; i < p->n; i++) ct_log_info(log, "  %9.0f  %s", p->row[i].bytes / MiB, p->row[i].what);
  ct_log_info(log, "  %9.0f  total, of %.0f available%s%s", total / MiB, avail / MiB,
              ranks_here > 1 ? " to this rank" : "", src);
  if (avail > 0 && total > avail && over_memory) *over_memory = true;
  if (avail > 0 && total > avail)
    return ct_set_error(CT_ENOMEM, "the memory plan needs %.0f MiB but %.0f MiB are available%s%s; "
                        "shrink it with %s", total / MiB, avail / MiB,
                        ranks_here > 1 ? " to each rank on this machine" : "", src, knobs);
  return check_address_space(p, log, total, knobs);
}
