// pool: the worker threads behind ct_parallel_for (a fixed set, started once, woken per
// loop). It does not balance work: callers cut loops into parts themselves, in a fixed
// way, so results do not depend on the thread count.
#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "error.h"

#define GATE_CLOSED 0x40000000

// A job is published by bumping `generation`; workers spin briefly on it (parallel
// loops come back to back inside a training step) and then sleep on the condvar.
// A worker takes part in a job only by joining it through `gate` while it is open;
// the caller, once no item is left, closes the gate and waits only for the workers
// that joined. So a worker the OS has not scheduled yet never holds up a loop the
// caller has already finished (a decode step runs ~150 loops per token; on a loaded
// machine waiting for every worker to wake made 2 threads slower than 1).
static struct {
  int n;                   // threads including the caller
  pthread_t *workers;
  pthread_mutex_t mu;
  pthread_cond_t wake;
  atomic_uint generation;  // bumped once per job
  atomic_int next;         // next item to claim
  atomic_int gate;         // GATE_CLOSED | the number of workers inside the current job
  atomic_int stop;
  int items;
  unsigned start_generation;  // generation when the workers were created
  ct_task_fn fn;
  void *ctx;
} P = {.n = 1, .mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, .gate = GATE_CLOSED};

static atomic_long loops_run;  // parallel loops handed to the workers (ct_pool_loops)

long ct_pool_loops(void) { return atomic_load_explicit(&loops_run, memory_order_relaxed); }

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Set while this thread runs items: a parallel loop inside a task runs serially
// instead of overwriting the job in flight.
static _Thread_local int in_task, current_thread;

static void run_items(int thread) {
  in_task = 1;
  current_thread = thread;
  for (;;) {
    int i = atomic_fetch_add_explicit(&P.next, 1, memory_order_relaxed);
    if (i >= P.items) break;
    P.fn(P.ctx, i, thread);
  }
  in_task = 0;
}

// Enters the open job, if any: its fields stay fixed until this worker leaves.
static int join_job(void) {
  int v = atomic_load_explicit(&P.gate, memory_order_relaxed);
  while (!(v & GATE_CLOSED))
    if (atomic_compare_exchange_weak_explicit(&P.gate, &v, v + 1, memory_order_acquire, memory_order_relaxed))
      return 1;
  return 0;
}

static void *worker_main(void *arg) {
  int thread = (int)(long)arg;
  // Not the current generation: a job may already be published before this thread runs.
  unsigned seen = P.start_generation;
  for (;;) {
    // spin ~20-50 us before sleeping
    for (int spin = 0; spin < 20000 && atomic_load_explicit(&P.generation, memory_order_acquire) == seen; spin++)
      cpu_relax();
    if (atomic_load_explicit(&P.generation, memory_order_acquire) == seen) {
      pthread_mutex_lock(&P.mu);
      while (atomic_load(&P.generation) == seen && !P.stop) pthread_cond_wait(&P.wake, &P.mu);
      pthread_mutex_unlock(&P.mu);
    }
    if (P.stop) return NULL;
    seen = atomic_load_explicit(&P.generation, memory_order_acquire);
    if (!join_job()) continue;  // woke too late: the caller did every item itself
    run_items(thread);
    atomic_fetch_sub_explicit(&P.gate, 1, memory_order_release);
  }
}

int ct_pool_threads(void) { return P.n; }

int ct_pool_parts(long n) {
  int t = P.n * 4;
  return n < t ? (int)(n > 0 ? n : 1) : t;
}

void ct_pool_free(void) {
  if (!P.workers) return;
  pthread_mutex_lock(&P.mu);
  P.stop = 1;
  atomic_fetch_add(&P.generation, 1);
  pthread_cond_broadcast(&P.wake);
  pthread_mutex_unlock(&P.mu);
  for (int t = 1; t < P.n; t++) pthread_join(P.workers[t - 1], NULL);
  free(P.workers);
  P.workers = NULL;
  P.stop = 0;
  P.n = 1;
}

int ct_pool_init(int n) {
  if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = 1;
  if (n == P.n && (n == 1 || P.workers)) return 0;
  ct_pool_free();
  if (n == 1) return 0;
  P.workers = calloc((size_t)n - 1, sizeof *P.workers);
  if (!P.workers) return ct_set_error(CT_ENOMEM, "thread pool: out of memory");
  P.n = n;
  P.start_generation = atomic_load(&P.generation);
  for (int t = 1; t < n; t++)
    if (pthread_create(&P.workers[t - 1], NULL, worker_main, (void *)(long)t) != 0) {
      P.n = t;  // join the ones that started
      ct_pool_free();
      return ct_set_error(CT_EINVAL, "thread pool: cannot start thread %d of %d", t, n);
    }
  return 0;
}

void ct_parallel_for(int n, ct_task_fn task, void *ctx) {
  if (n <= 0) return;
  if (P.n == 1 || n == 1 || in_task) {
    // serial; inside a task, keep the caller's thread index for its scratch
    for (int i = 0; i < n; i++) task(ctx, i, in_task ? current_thread : 0);
    return;
  }
  atomic_fetch_add_explicit(&loops_run, 1, memory_order_relaxed);
  P.fn = task;
  P.ctx = ctx;
  P.items = n;
  atomic_store_explicit(&P.next, 0, memory_order_relaxed);
  atomic_store_explicit(&P.gate, 0, memory_order_release);  // open: the fields above are set
  pthread_mutex_lock(&P.mu);
  atomic_fetch_add_explicit(&P.generation, 1, memory_order_release);
  pthread_cond_broadcast(&P.wake);
  pthread_mutex_unlock(&P.mu);
  run_items(0);
  // no item is left: close the gate, then wait for the workers still finishing theirs
  atomic_fetch_or_explicit(&P.gate, GATE_CLOSED, memory_order_acq_rel);
  while (atomic_load_explicit(&P.gate, memory_order_acquire) != GATE_CLOSED) cpu_relax();
}

void ct_chunk_range(long n, long align, int parts, int i, long *lo, long *hi) {
  if (align < 1) align = 1;
  long units = (n + align - 1) / align;  // whole aligned units, the last may be short
  long per = units / parts, extra = units % parts;
  long u0 = i * per + (i < extra ? i : extra);
  long u1 = u0 + per + (i < extra ? 1 : 0);
  *lo = u0 * align < n ? u0 * align : n;
  *hi = u1 * align < n ? u1 * align : n;
}

typedef struct {
  ct_range_fn fn;
  void *ctx;
  long n, align;
  int parts;
} ranges_job;

static void ranges_task(void *ctx, int part, int thread) {
  const ranges_job *j = ctx;
  long lo, hi;
  ct_chunk_range(j->n, j->align, j->parts, part, &lo, &hi);
  if (hi > lo) j->fn(j->ctx, lo, hi, thread);
}

void ct_parallel_ranges(long n, long align, int parts, ct_range_fn fn, void *ctx) {
  ranges_job j = {fn, ctx, n, align, parts};
  ct_parallel_for(parts, ranges_task, &j);
}
