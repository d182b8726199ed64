// pool: every item runs exactly once, on a thread index below ct_pool_threads(), also
// for a job published right after the workers are (re)started.
#include <stdatomic.h>
#include <string.h>

#include "pool.h"
#include "test.h"

typedef struct {
  atomic_int hits[1000];
  atomic_int bad_thread;
} job_t;

static void count_task(void *ctx, int i, int thread) {
  job_t *j = ctx;
  atomic_fetch_add(&j->hits[i], 1);
  if (thread < 0 || thread >= ct_pool_threads()) atomic_fetch_add(&j->bad_thread, 1);
}

static void test_every_item_runs_once_on_a_valid_thread(void) {
  static job_t j;
  for (int n = 1; n <= 4; n++) {
    CHECK_OK(ct_pool_init(n));
    for (int items = 0; items < 1000; items += 37) {
      memset(&j, 0, sizeof j);
      ct_parallel_for(items, count_task, &j);
      int wrong = 0;
      for (int i = 0; i < 1000; i++) wrong += atomic_load(&j.hits[i]) != (i < items);
      CHECK(wrong == 0 && atomic_load(&j.bad_thread) == 0);
    }
  }
}

// Workers started by ct_pool_init may not have run yet when the first job is
// published; they must still take part (this used to hang).
static void test_job_right_after_restart_completes(void) {
  static job_t j;
  for (int r = 0; r < 300; r++) {
    CHECK_OK(ct_pool_init(r % 2 ? 2 : 3));
    memset(&j, 0, sizeof j);
    ct_parallel_for(64, count_task, &j);
    int sum = 0;
    for (int i = 0; i < 64; i++) sum += atomic_load(&j.hits[i]);
    CHECK(sum == 64);
  }
  ct_pool_free();
  CHECK(ct_pool_threads() == 1);
}

static void test_chunk_range_tiles_exactly(void) {
  for (long n = 0; n < 300; n += 7)
    for (int parts = 1; parts < 9; parts++)
      for (long align = 1; align < 40; align += 13) {
        long next = 0;
        for (int i = 0; i < parts; i++) {
          long lo, hi;
          ct_chunk_range(n, align, parts, i, &lo, &hi);
          CHECK(lo == next && hi >= lo && hi <= n);
          CHECK(lo % align == 0 || lo == n);
          next = hi;
        }
        CHECK(next == n);
      }
}

int main(void) {
  RUN(test_every_item_runs_once_on_a_valid_thread);
  RUN(test_job_right_after_restart_completes);
  RUN(test_chunk_range_tiles_exactly);
  return test_summary();
}
