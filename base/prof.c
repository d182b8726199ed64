// prof: wall time by region when CT_PROFILE=1 (see prof.h).
#include "prof.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pool.h"

static int state = -1;  // -1 undecided, 0 off, 1 on
static double spent[CT_PROF_N];
static long loops[CT_PROF_N];
static double inner[CT_PROF_N];  // seconds of regions timed within this one while it was open
static long inner_loops[CT_PROF_N];
enum { DEPTH = 8 };
static long loops_at[DEPTH];  // the open regions, innermost last: the pool's loop count at
static int open_r[DEPTH];     // their start, and which they are
static int depth;
static double first;  // the first ct_prof_open's time

static const char *const names[CT_PROF_N] = {
    "train: products", "train: bf16 narrowing", "train: LoRA", "train: attention", "train: norms",
    "train: RoPE/SwiGLU/residual", "train: LM head + loss", "engine: products", "engine: LoRA",
    "engine: attention", "engine: norms/RoPE/SwiGLU", "engine: LM head", "engine: sampling",
    "train: LM head products"};

// A region timed inside another (when it is open): its time and loops are taken out of the
// outer one's in the report, so no second is counted twice.
static int outer_of(int r) { return r == CT_PROF_HEAD_PRODUCT ? CT_PROF_HEAD : -1; }

static double wall(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

double ct_prof_open(ct_prof_region r) {
  if (state < 0) {
    const char *e = getenv("CT_PROFILE");
    state = e && strcmp(e, "0") != 0 && *e;
  }
  if (!state) return 0;
  if (depth < DEPTH) loops_at[depth] = ct_pool_loops(), open_r[depth] = r;
  depth++;
  double t = wall();
  if (first == 0) first = t;
  return t;
}

void ct_prof_add(ct_prof_region r, double t0) {
  if (state <= 0 || t0 == 0) return;
  double dt = wall() - t0;
  if (depth > 0) depth--;
  long dl = depth < DEPTH ? ct_pool_loops() - loops_at[depth] : 0;
  spent[r] += dt;
  loops[r] += dl;
  int o = outer_of(r);
  for (int k = 0; o >= 0 && k < depth && k < DEPTH; k++)
    if (open_r[k] == o) {
      inner[o] += dt, inner_loops[o] += dl;
      break;
    }
}

void ct_prof_report(FILE *f) {
  if (state <= 0 || first == 0) return;
  double total = wall() - first;
  double own[CT_PROF_N], sum = 0;
  long own_loops[CT_PROF_N];
  for (int r = 0; r < CT_PROF_N; r++) own[r] = spent[r] - inner[r], own_loops[r] = loops[r] - inner_loops[r];
  for (int r = 0; r < CT_PROF_N; r++) sum += own[r];
  fprintf(f, "profile (CT_PROFILE, %d threads): %.2f s in the regions below, of %.2f s since the first\n", ct_pool_threads(), sum, total);
  for (int r = 0; r < CT_PROF_N; r++)
    if (spent[r] > 0)
      fprintf(f, "profile: %-28s %8.2f s %5.1f%%  %9ld pool loops\n", names[r], own[r],
              total > 0 ? 100 * own[r] / total : 0, own_loops[r]);
}
