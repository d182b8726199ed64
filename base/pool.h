// pool: one process-wide set of worker threads that runs every parallel loop of
// ctune, matrix multiplies included (OpenBLAS itself is kept single-threaded, so
// that exactly one thread per core is ever busy: see ct_blas_init in matmul.h).
#pragma once

// task(ctx, i, thread): do item i of a parallel loop on worker `thread`
// (0 = the calling thread). Items must write disjoint outputs; any per-thread
// scratch is indexed by `thread`, which is < ct_pool_threads().
typedef void (*ct_task_fn)(void *ctx, int i, int thread);

// Starts n - 1 workers (n <= 0: one per online core). Idempotent: a second call
// with the same n does nothing; with a different n it restarts the workers.
int ct_pool_init(int n);
void ct_pool_free(void);
int ct_pool_threads(void);

// Runs task(ctx, i, t) for every i in [0, n) and returns when all are done.
// Items are claimed dynamically; a loop inside a task runs serially.
void ct_parallel_for(int n, ct_task_fn task, void *ctx);

// Parallel loops handed to the workers so far (serial ones not counted): each is a
// wake-up and a barrier.
long ct_pool_loops(void);

// How many parts to split n rows into for ct_parallel_for: 4 per thread (dynamic
// claiming evens out uneven rows), at most n, at least 1.
int ct_pool_parts(long n);

// The [*lo, *hi) range of chunk i when [0, n) is split into `parts` chunks aligned to `align`.
void ct_chunk_range(long n, long align, int parts, int i, long *lo, long *hi);

// fn(ctx, lo, hi, thread): rows [lo, hi) of a loop, on worker `thread` (as ct_task_fn's).
typedef void (*ct_range_fn)(void *ctx, long lo, long hi, int thread);
// Runs fn over [0, n) split into `parts` chunks aligned to `align` (ct_chunk_range's),
// chunks claimed as ct_parallel_for's items; an empty chunk is not run.
void ct_parallel_ranges(long n, long align, int parts, ct_range_fn fn, void *ctx);
