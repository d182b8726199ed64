// plan: rows of bytes, their sum, and the one comparison with MemAvailable. It does not
// allocate anything itself; the sizes come from the modules' *_bytes functions.
#include "plan.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "mem.h"

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

int ct_plan_check(const ct_plan *p, ct_log *log, int ranks_here, const char *knobs) {
  const double MiB = 1048576.0;
  double total = ct_plan_total(p), avail = (double)ct_mem_available() / (ranks_here > 0 ? ranks_here : 1);
  ct_log_info(log, "memory plan (MiB):");
  for (int i = 0; i < p->n; i++) ct_log_info(log, "  %9.0f  %s", p->row[i].bytes / MiB, p->row[i].what);
  ct_log_info(log, "  %9.0f  total, of %.0f available%s", total / MiB, avail / MiB,
              ranks_here > 1 ? " to this rank" : "");
  if (avail <= 0 || total <= avail) return 0;
  return ct_set_error(CT_ENOMEM, "the memory plan needs %.0f MiB but %.0f MiB are available%s; "
                      "shrink it with %s", total / MiB, avail / MiB,
                      ranks_here > 1 ? " to each rank on this machine" : "", knobs);
}
