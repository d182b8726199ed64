// dnnl: every oneDNN call of ctune: the CPU check, the engine, a cache of bf16 matmul
// primitives keyed by shape, and their execution split over the pool's threads.
// Not here: fp32 products (OpenBLAS, matmul.c) and bf16 conversion (bf16.h).
#include "dnnl.h"

#include <cpuid.h>
#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"
#include "pool.h"

void omp_set_num_threads(int);  // libgomp, which the Debian build of oneDNN runs on

enum { MAX_THREADS = 256 };
enum { PART_ROWS = 1024, MAX_PARTS = 1024 };  // ct_gemm_bf16's split (see there)


typedef struct {
  char ta, tb;
  int M, N, K, lda, ldb, ldc;
  bool acc;  // beta = 1: a sum post-op adds into C
} gemm_key;

typedef struct {
  gemm_key k;
  dnnl_primitive_t prim;
  dnnl_memory_desc_t a, b, c, scratch;
  size_t scratch_bytes;
} gemm_prim;

// One per pool thread: its stream and its scratchpad (user-owned, so that two threads
// may run the same primitive at once).
typedef struct {
  dnnl_stream_t stream;
  void *scratch;
  size_t scratch_bytes;
  bool single;  // omp_set_num_threads(1) done on this thread
} thread_state;

static struct {
  dnnl_engine_t engine;
  pthread_mutex_t mu;
  gemm_prim **prims;
  int n, cap;
  thread_state th[MAX_THREADS];
  int fail_rc;         // the first failure since ct_dnnl_init (0: none), read by ct_dnnl_check
  char fail_msg[256];  // ... and its message (written under mu, before fail_rc)
} D = {.mu = PTHREAD_MUTEX_INITIALIZER};

// oneDNN failing on a CPU that passed ct_dnnl_init, or memory running out for its
// primitives or scratchpad, on a pool thread inside a kernel that has no result to return:
// the first failure is kept (its code and message) for ct_dnnl_check. Call without D.mu.
__attribute__((format(printf, 2, 3))) static int fail(int code, const char *fmt, ...) {
  char msg[sizeof D.fail_msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&D.mu);
  if (!D.fail_rc) {
    memcpy(D.fail_msg, msg, sizeof msg);
    __atomic_store_n(&D.fail_rc, code, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&D.mu);
  return code;
}

int ct_dnnl_check(void) {
  if (!__atomic_load_n(&D.fail_rc, __ATOMIC_ACQUIRE)) return 0;
  char msg[sizeof D.fail_msg];
  pthread_mutex_lock(&D.mu);
  memcpy(msg, D.fail_msg, sizeof msg);
  pthread_mutex_unlock(&D.mu);
  return ct_set_error(D.fail_rc, "%s", msg);
}

// oneDNN's own cap on the instruction set: a user who limits it below bf16 gets fp32's
// behaviour from `bf16: auto` (and the same error from `bf16: true`) as on an older CPU.
static bool isa_cap_allows_bf16(void) {
  const char *cap = getenv("DNNL_MAX_CPU_ISA");
  if (!cap || !*cap) return true;
  static const char *const ok[] = {"ALL", "AVX512_CORE_BF16", "AVX512_CORE_AMX", "AVX512_CORE_FP16", NULL};
  for (int i = 0; ok[i]; i++)
    if (strcasecmp(cap, ok[i]) == 0) return true;
  return false;
}

bool ct_dnnl_bf16_cpu(void) {
  unsigned a, b, c, d;
  bool avx512bf16 = false, amx = false;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) avx512bf16 = (a >> 5) & 1;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) amx = (d >> 22) & 1;
  return (avx512bf16 || amx) && isa_cap_allows_bf16();
}

int ct_dnnl_init(void) {
  if (D.engine) return 0;
  if (!ct_dnnl_bf16_cpu())
    return ct_set_error(CT_EINVAL, "bf16: this CPU has neither AVX512_BF16 nor AMX-BF16 (or "
                        "DNNL_MAX_CPU_ISA excludes them); set bf16: false, or bf16: auto to fall back to fp32");
  if (dnnl_engine_create(&D.engine, dnnl_cpu, 0) != dnnl_success)
    return ct_set_error(CT_EINVAL, "bf16: oneDNN could not create its CPU engine");
  return 0;
}

void ct_dnnl_free(void) {
  for (int i = 0; i < D.n; i++) {
    dnnl_primitive_destroy(D.prims[i]->prim);
    free(D.prims[i]);
  }
  free(D.prims);
  D.prims = NULL;
  D.n = D.cap = 0;
  for (int t = 0; t < MAX_THREADS; t++) {
    if (D.th[t].stream) dnnl_stream_destroy(D.th[t].stream);
    free(D.th[t].scratch);
  }
  memset(D.th, 0, sizeof D.th);
  if (D.engine) dnnl_engine_destroy(D.engine);
  D.engine = NULL;
  D.fail_rc = 0;
}

int ct_dnnl_cached(void) { return D.n; }

// A (rows, cols) row-major bf16/f32 matrix as op() sees it: transposed = a view of the
// stored (cols, rows) matrix with leading dimension ld.
static void md_init(dnnl_memory_desc_t *md, int rows, int cols, int ld, bool transposed, dnnl_data_type_t dt) {
  dnnl_dims_t dims = {rows, cols};
  dnnl_dims_t strides = {transposed ? 1 : ld, transposed ? ld : 1};
  dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides);
}

static gemm_prim *prim_create(const gemm_key *k) {
  gemm_prim *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->k = *k;
  md_init(&p->a, k->M, k->K, k->lda, k->ta == 'T', dnnl_bf16);
  md_init(&p->b, k->K, k->N, k->ldb, k->tb == 'T', dnnl_bf16);
  md_init(&p->c, k->M, k->N, k->ldc, false, dnnl_f32);
  dnnl_matmul_desc_t desc;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_primitive_desc_t pd = NULL;
  bool ok = dnnl_matmul_desc_init(&desc, &p->a, &p->b, NULL, &p->c) == dnnl_success &&
            dnnl_primitive_attr_create(&attr) == dnnl_success &&
            dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
  if (ok && k->acc)
    ok = dnnl_post_ops_create(&po) == dnnl_success && dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
         dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
  ok = ok && dnnl_primitive_desc_create(&pd, &desc, attr, D.engine, NULL) == dnnl_success;
  if (ok) {
    p->scratch = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    p->scratch_bytes = dnnl_memory_desc_get_size(&p->scratch);
    ok = dnnl_primitive_create(&p->prim, pd) == dnnl_success;
  }
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (po) dnnl_post_ops_destroy(po);
  if (attr) dnnl_primitive_attr_destroy(attr);
  if (!ok) {
    free(p);
    return NULL;
  }
  return p;
}

static bool key_eq(const gemm_key *x, const gemm_key *y) {
  return x->ta == y->ta && x->tb == y->tb && x->M == y->M && x->N == y->N && x->K == y->K &&
         x->lda == y->lda && x->ldb == y->ldb && x->ldc == y->ldc && x->acc == y->acc;
}

// The cached primitive for k, created on first use. oneDNN refusing a plain bf16 matmul
// is a broken install, not a user error (CT_EINVAL, kept by fail()).
static int prim_get(const gemm_key *k, gemm_prim **out) {
  pthread_mutex_lock(&D.mu);
  gemm_prim *p = NULL;
  int rc = 0;
  for (int i = 0; i < D.n && !p; i++)
    if (key_eq(&D.prims[i]->k, k)) p = D.prims[i];
  if (!p) {
    if (D.n == D.cap) {
      int cap = D.cap ? 2 * D.cap : 64;
      gemm_prim **grown = realloc(D.prims, sizeof *grown * (size_t)cap);
      if (grown) D.prims = grown, D.cap = cap;
      else rc = CT_ENOMEM;
    }
    if (!rc && !(p = prim_create(k))) rc = CT_EINVAL;
    if (!rc) D.prims[D.n++] = p;
  }
  pthread_mutex_unlock(&D.mu);
  if (rc == CT_ENOMEM) return fail(rc, "bf16: out of memory for the oneDNN primitive cache");
  if (rc) return fail(rc, "bf16: oneDNN refused a bf16 matmul of %dx%dx%d", k->M, k->N, k->K);
  *out = p;
  return 0;
}

static int thread_scratch(thread_state *ts, size_t bytes, void **out) {
  if (bytes > ts->scratch_bytes) {
    free(ts->scratch);
    ts->scratch_bytes = 0;
    if (!(ts->scratch = aligned_alloc(64, (bytes + 63) / 64 * 64)))
      return fail(CT_ENOMEM, "bf16: out of memory for a oneDNN scratchpad of %zu bytes", bytes);
    ts->scratch_bytes = bytes;
  }
  *out = ts->scratch;
  return 0;
}

// C (M, N) (+)= op(A) op(B) on pool thread `thread`, oneDNN single-threaded.
static int gemm_run(const gemm_key *k, const uint16_t *A, const uint16_t *B, float *C, int thread) {
  thread_state *ts = &D.th[thread];
  if (!ts->single) {
    omp_set_num_threads(1);
    ts->single = true;
  }
  if (!ts->stream && dnnl_stream_create(&ts->stream, D.engine, dnnl_stream_default_flags) != dnnl_success) {
    ts->stream = NULL;
    return fail(CT_EINVAL, "bf16: oneDNN could not create a stream");
  }
  gemm_prim *p = NULL;
  void *scratch = NULL;
  int rc = prim_get(k, &p);
  if (rc || (rc = thread_scratch(ts, p->scratch_bytes, &scratch))) return rc;
  dnnl_memory_t m[4] = {0};
  bool ok = dnnl_memory_create(&m[0], &p->a, D.engine, (void *)A) == dnnl_success &&
            dnnl_memory_create(&m[1], &p->b, D.engine, (void *)B) == dnnl_success &&
            dnnl_memory_create(&m[2], &p->c, D.engine, C) == dnnl_success &&
            dnnl_memory_create(&m[3], &p->scratch, D.engine, scratch) == dnnl_success;
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]}, {DNNL_ARG_DST, m[2]},
                             {DNNL_ARG_SCRATCHPAD, m[3]}};
  ok = ok && dnnl_primitive_execute(p->prim, ts->stream, 4, args) == dnnl_success &&
       dnnl_stream_wait(ts->stream) == dnnl_success;
  for (int i = 0; i < 4; i++)
    if (m[i]) dnnl_memory_destroy(m[i]);
  return ok ? 0 : fail(CT_EINVAL, "bf16: oneDNN failed to run a %dx%dx%d matmul", k->M, k->N, k->K);
}

typedef struct {
  gemm_key k;  // the whole product
  const uint16_t *A, *B;
  float *C;
  int pr, pc;  // a grid of pr x pc blocks, multiples of 64 rows and columns
} gemm_job;

static void gemm_part(void *ctx, int part, int thread) {
  const gemm_job *j = ctx;
  gemm_key k = j->k;
  long r0, r1, c0, c1;
  ct_chunk_range(k.M, 64, j->pr, part / j->pc, &r0, &r1);
  ct_chunk_range(k.N, 64, j->pc, part % j->pc, &c0, &c1);
  const uint16_t *A = j->A + (k.ta == 'N' ? r0 * k.lda : r0);  // rows r0..r1 of op(A)
  const uint16_t *B = j->B + (k.tb == 'T' ? c0 * k.ldb : c0);  // columns c0..c1 of op(B)
  float *C = j->C + r0 * k.ldc + c0;
  k.M = (int)(r1 - r0), k.N = (int)(c1 - c0);
  if (k.M > 0 && k.N > 0 && gemm_run(&k, A, B, C, thread))  // (kept for ct_dnnl_check) no numbers: NaN
    for (int i = 0; i < k.M; i++)
      for (int c = 0; c < k.N; c++) C[(long)i * k.ldc + c] = NAN;
}

// The grid of blocks a product is cut into for `threads` threads. Parts of ~PART_ROWS rows
// (or columns) of the longer side, claimed as threads come free: on a shared host a thread
// slowed by its neighbour no longer holds the others at the barrier (one half per thread
// measured 434-652 tokens/s in alternated runs of a 0.5B LoRA step on 2 cores, these parts
// 625-636), and oneDNN ran faster on blocks of ~1000 rows than on 4000+. Their count is a
// multiple of the threads, so that no last round runs on a few threads (33 parts on 16
// threads take 3 rounds, 48 take the same 3 at two thirds the size). Blocks are multiples of
// 64 rows and columns: parts of 976 or 992 rows (multiples of 16: M 18,560 or 24,000 in 19
// or 24 parts) ran at 90-260 GFLOP/s where 960 / 1024 ran at 600-790 (2 threads). Where
// strips along the longer side would be thinner than 256, the grid is two-dimensional, the
// blocks as square as the 64-multiples allow: each part runs its own oneDNN primitive, which
// packs its whole slice of B, so thin strips of a short product (M 1024 on 16 threads: 64
// rows) pack all of B on every thread. Measured on the 16-core Xeon (alternated, 2026-11-27):
// SmolLM-135M bf16 training 1791-1879 -> 2000-2040 tokens/s; the 0.5B shapes at M 33,344
// unchanged within the machine's noise (4.4-4.6 TFLOP/s both ways).
static void gemm_grid(int M, int N, int threads, int *pr, int *pc) {
  long split = M >= N ? M : N, parts = (split + PART_ROWS - 1) / PART_ROWS;
  if (threads <= 1) {
    *pr = *pc = 1;
    return;
  }
  parts = (parts + threads - 1) / threads * threads;
  if (parts > MAX_PARTS) parts = MAX_PARTS / threads * threads;
  if (split / parts >= 256 || parts < 2) {  // strips along the longer side
    *pr = M >= N ? (int)parts : 1, *pc = M >= N ? 1 : (int)parts;
    return;
  }
  // a grid of `parts` blocks: the largest block's cost, its products plus the packing of
  // its rows of A and columns of B (weighted as if one packed element took ~100
  // multiply-adds' time: an estimate, not a measurement)
  long mu = (M + 63) / 64, nu = (N + 63) / 64;
  double best = 1e300;
  for (long r = 1; r <= parts; r++) {
    if (parts % r) continue;
    long c = parts / r;
    double bm = (double)((mu + r - 1) / r) * 64, bn = (double)((nu + c - 1) / c) * 64;
    double cost = bm * bn + 50 * (bm + bn);
    if (cost < best) best = cost, *pr = (int)r, *pc = (int)c;
  }
}

void ct_gemm_bf16(char ta, char tb, int M, int N, int K, const uint16_t *A, int lda,
                  const uint16_t *B, int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // only the scaling of C is left
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) C[(long)i * ldc + j] = beta == 0 ? 0 : C[(long)i * ldc + j];
    return;
  }
  int threads = ct_pool_threads();
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  if ((double)M * N * K < 64.0 * 64 * 64) threads = 1;  // not worth waking the workers
  gemm_job j = {{ta, tb, M, N, K, lda, ldb, ldc, beta != 0}, A, B, C, 1, 1};
  gemm_grid(M, N, threads, &j.pr, &j.pc);
  ct_parallel_for(j.pr * j.pc, gemm_part, &j);
}
