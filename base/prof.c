// prof: wall time by region when CT_PROFILE=1 (see prof.h).
#include "prof.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pool.h"

static int state = -1;  // -1 undecided, 0 off, 1 on
static double spent[CT_PROF_N];
static long loops[CT_PROF_N], loops_at_start;
static double first;  // the first ct_prof_now's time

static const char *const names[CT_PROF_N] = {
    "train: products", "train: bf16 narrowing", "train: LoRA", "train: attention", "train: norms",
    "train: RoPE/SwiGLU/residual", "train: LM head + loss", "engine: products", "engine: LoRA",
    "engine: attention", "engine: norms/RoPE/SwiGLU", "engine: LM head", "engine: sampling"};

static double wall(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

double ct_prof_now(void) {
  if (state < 0) {
    const char *e = getenv("CT_PROFILE");
    state = e && strcmp(e, "0") != 0 && *e;
  }
  if (!state) return 0;
  loops_at_start = ct_pool_loops();
  double t = wall();
  if (first == 0) first = t;
  return t;
}

void ct_prof_add(ct_prof_region r, double t0) {
  if (state <= 0 || t0 == 0) return;
  spent[r] += wall() - t0;
  loops[r] += ct_pool_loops() - loops_at_start;
}

void ct_prof_report(FILE *f) {
  if (state <= 0 || first == 0) return;
  double total = wall() - first;
  double sum = 0;
  for (int r = 0; r < CT_PROF_N; r++) sum += spent[r];
  fprintf(f, "profile (CT_PROFILE, %d threads): %.2f s in the regions below, of %.2f s since the first\n", ct_pool_threads(), sum, total);
  for (int r = 0; r < CT_PROF_N; r++)
    if (spent[r] > 0)
      fprintf(f, "profile: %-28s %8.2f s %5.1f%%  %9ld pool loops\n", names[r], spent[r],
              total > 0 ? 100 * spent[r] / total : 0, loops[r]);
}
