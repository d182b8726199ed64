// matmul: OpenBLAS kernel selection at start-up (re-exec with OPENBLAS_CORETYPE when
// Debian's build picked a generic kernel) and sgemm split over the pool's threads.
// OpenBLAS itself stays single-threaded.
#include "matmul.h"

#include <cblas.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "error.h"
#include "mem.h"
#include "pool.h"

// Not in every cblas.h; part of OpenBLAS's ABI.
char *openblas_get_corename(void);
void openblas_set_num_threads(int);

static bool in_list(const char *s, const char *const *list) {
  for (; *list; list++)
    if (strcasecmp(s, *list) == 0) return true;
  return false;
}

const char *ct_blas_wanted_core(const char *corename, bool avx512, bool avx2) {
  static const char *const k512[] = {"SkylakeX", "Cooperlake", "SapphireRapids", "Zen", NULL};
  static const char *const k256[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake",
                                     "SapphireRapids", "Excavator", NULL};
  if (!corename) return NULL;
  if (!avx2) return NULL;  // (an AVX-512 CPU without AVX2 exists only in odd VMs)
  if (avx512 && !in_list(corename, k512)) return "SKYLAKEX";
  if (!avx512 && !in_list(corename, k256)) return "HASWELL";
  return NULL;
}

const char *ct_blas_corename(void) { return openblas_get_corename(); }

// The command line the process was started with (/proc/self/cmdline), as an argv array in
// one allocation; NULL when it cannot be read. A main that shifted its argv (`bin/distill
// precompute ...`, `bin/reward eval ...`) must not restart as a different command.
static char **own_command_line(void) {
  FILE *f = fopen("/proc/self/cmdline", "rb");
  if (!f) return NULL;
  char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  bool whole = feof(f);
  fclose(f);
  if (!n || !whole) return NULL;  // (a command line over 64 KiB: use the caller's argv)
  buf[n] = 0;
  int argc = 0;
  for (size_t i = 0; i < n; i++) argc += !buf[i];
  char **argv = malloc(sizeof(char *) * (argc + 1) + n + 1);
  if (!argv) return NULL;
  char *text = (char *)(argv + argc + 1);
  memcpy(text, buf, n + 1);
  for (int a = 0; a < argc; a++, text += strlen(text) + 1) argv[a] = text;
  argv[argc] = NULL;
  return argv;
}

void ct_blas_init(int argc, char **argv) {
  (void)argc;
  openblas_set_num_threads(1);
  __builtin_cpu_init();
  const char *want = ct_blas_wanted_core(openblas_get_corename(),
                                         __builtin_cpu_supports("avx512f"),
                                         __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
  if (getenv("CT_BLAS_REEXEC")) return;
  bool user_core = getenv("OPENBLAS_CORETYPE") != NULL;
  if (user_core) {  // the user's choice stands, but say when it is slower
    if (want)
      fprintf(stderr, "ctune: OPENBLAS_CORETYPE=%s runs OpenBLAS's '%s' kernel on a CPU that runs '%s' "
              "(faster); unset OPENBLAS_CORETYPE to use it\n", getenv("OPENBLAS_CORETYPE"),
              openblas_get_corename(), want);
    want = NULL;
  }
  // CT_BLAS_FORCE_RESTART=1 restarts even where OpenBLAS chose well, so that tests on every
  // CPU run the path Debian's OpenBLAS takes on recent Xeons (tests/cli_e2e.sh).
  bool force = !user_core && getenv("CT_BLAS_FORCE_RESTART") && !strcmp(getenv("CT_BLAS_FORCE_RESTART"), "1");
  if (!want && force) want = openblas_get_corename();
  // OpenBLAS's own threads started at load time, each about to map a work buffer that a
  // tight limit cannot hold (they would retry for ever)
  bool threads = ct_mem_as_limit() != SIZE_MAX && !getenv("OPENBLAS_NUM_THREADS") && sysconf(_SC_NPROCESSORS_ONLN) > 1;
  if (!want && !threads) return;
  if (want) {
    fprintf(stderr, "ctune: OpenBLAS chose its '%s' kernel on a CPU that runs '%s'; "
            "restarting with OPENBLAS_CORETYPE=%s (set OPENBLAS_CORETYPE to override)\n",
            openblas_get_corename(), want, want);
    setenv("OPENBLAS_CORETYPE", want, 1);
  }
  if (threads) setenv("OPENBLAS_NUM_THREADS", "1", 1);
  setenv("CT_BLAS_REEXEC", "1", 1);
  char **own = own_command_line();
  // the binary by its real path, so that the process keeps its name (ps, pgrep, top):
  // exec of /proc/self/exe names it "exe"
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) self[n] = 0;
  execv(n > 0 ? self : "/proc/self/exe", own ? own : argv);
  free(own);
  fprintf(stderr, "ctune: re-exec failed; continuing%s\n", want ? " with the slow kernel" : "");
}

// The room held for OpenBLAS's work buffers (ct_blas_reserve): `slices_` buffers from
// reserve_, the first `taken_` given back. A thread gives one back before its first call.
static char *reserve_;
static int slices_;
static atomic_int taken_;
static atomic_int callers_;  // threads whose OpenBLAS buffer is mapped (counted in what is mapped now)
static _Thread_local bool called_;

static void release_slices(void) {
  int from = atomic_exchange(&taken_, slices_);
  for (int i = from; i < slices_; i++) munmap(reserve_ + (size_t)i * (size_t)CT_BLAS_BUFFER_BYTES, (size_t)CT_BLAS_BUFFER_BYTES);
  reserve_ = NULL;
  slices_ = 0;
  atomic_store(&taken_, 0);
}

static inline void first_call(void) {
  called_ = true;
  atomic_fetch_add(&callers_, 1);
  int i = atomic_fetch_add(&taken_, 1);
  if (i < slices_) munmap(reserve_ + (size_t)i * (size_t)CT_BLAS_BUFFER_BYTES, (size_t)CT_BLAS_BUFFER_BYTES);
}

int ct_blas_buffers_to_map(int threads) {
  int n = threads - atomic_load(&callers_);
  return n > 0 ? n : 0;
}

bool ct_blas_reserve(int threads, double more, double *need, double *used, double *limit) {
  size_t lim = ct_mem_as_limit();
  release_slices();
  threads = ct_blas_buffers_to_map(threads);  // (a thread that called has its buffer in `used`)
  *used = (double)ct_mem_as_used();
  *need = *used + threads * CT_BLAS_BUFFER_BYTES + more;
  *limit = (double)lim;
  if (lim == SIZE_MAX) return true;
  if (*need > *limit) return false;
  if (!threads) return true;
  void *r = mmap(NULL, (size_t)threads * (size_t)CT_BLAS_BUFFER_BYTES, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) return false;
  reserve_ = r;
  slices_ = threads;
  return true;
}

int ct_blas_room(int threads, double more, const char *more_what, const char *hint) {
  const double MiB = 1048576.0;
  double need, used, limit;
  if (ct_blas_reserve(threads, more, &need, &used, &limit)) return 0;
  char extra[96] = "";
  if (more_what) snprintf(extra, sizeof extra, ", %.0f MiB for %s", more / MiB, more_what);
  return ct_set_error(CT_ENOMEM, "address-space limit (ulimit -v) is %.0f MiB; ctune needs at least %.0f MiB to "
                      "start (%.0f MiB mapped now, %d x %.0f MiB for OpenBLAS's work buffer%s%s); raise ulimit -v%s%s",
                      limit / MiB, need / MiB, used / MiB, ct_blas_buffers_to_map(threads), CT_BLAS_BUFFER_BYTES / MiB,
                      ct_blas_buffers_to_map(threads) > 1 ? "s" : "", extra, hint ? " or " : "", hint ? hint : "");
}

static inline CBLAS_TRANSPOSE tr(char t) { return t == 'T' ? CblasTrans : CblasNoTrans; }

void ct_sgemm_serial(char ta, char tb, int M, int N, int K, float alpha, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (!called_) first_call();  // (this thread's share of the held room, for OpenBLAS's buffer)
  if (K <= 0) {  // cblas would only scale C; do the same without calling it
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) C[(long)i * ldc + j] = beta == 0 ? 0 : beta * C[(long)i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

typedef struct {
  char ta, tb;
  int M, N, K, lda, ldb, ldc, parts;
  bool split_rows;
  float alpha, beta;
  const float *A, *B;
  float *C;
} gemm_job;

static void gemm_part(void *ctx, int part, int thread) {
  (void)thread;
  const gemm_job *j = ctx;
  long lo, hi;
  if (j->split_rows) {
    ct_chunk_range(j->M, 16, j->parts, part, &lo, &hi);
    if (hi <= lo) return;
    // rows lo..hi of op(A): A's rows when not transposed, its columns otherwise
    const float *a = j->ta == 'N' ? j->A + lo * j->lda : j->A + lo;
    ct_sgemm_serial(j->ta, j->tb, (int)(hi - lo), j->N, j->K, j->alpha, a, j->lda, j->B, j->ldb,
                    j->beta, j->C + lo * j->ldc, j->ldc);
  } else {
    ct_chunk_range(j->N, 16, j->parts, part, &lo, &hi);
    if (hi <= lo) return;
    // columns lo..hi of op(B): B's rows when transposed, its columns otherwise
    const float *b = j->tb == 'T' ? j->B + lo * j->ldb : j->B + lo;
    ct_sgemm_serial(j->ta, j->tb, j->M, (int)(hi - lo), j->K, j->alpha, j->A, j->lda, b, j->ldb,
                    j->beta, j->C + lo, j->ldc);
  }
}

void ct_sgemm(char ta, char tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
  int threads = ct_pool_threads();
  // Small products are not worth waking the workers for.
  if (threads == 1 || (double)M * N * K < 64.0 * 64 * 64) {
    ct_sgemm_serial(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  gemm_job j = {ta, tb, M, N, K, lda, ldb, ldc, threads, M >= N, alpha, beta, A, B, C};
  ct_parallel_for(threads, gemm_part, &j);
}
