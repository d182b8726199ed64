// matmul: OpenBLAS set-up and the parallel sgemm every layer uses.
#pragma once
#include <stdbool.h>

// Makes sure OpenBLAS runs its real kernel for this CPU. Debian's 0.3.21 does not
// know recent Xeons and falls back to a generic SSE3 kernel, five times slower; when
// that happened and the user did not set OPENBLAS_CORETYPE, this sets it and re-executes
// the program (OpenBLAS reads it only at load time) with the command line it was started
// with (/proc/self/cmdline; argv only when that cannot be read), so a main may shift its
// argv before calling. Call first thing in main(), before MPI_Init.
// Also pins OpenBLAS to one thread: ctune's pool splits the work itself. Under an
// address-space limit it also re-executes with OPENBLAS_NUM_THREADS=1 (unless set): the
// threads OpenBLAS starts at load time would each map a work buffer (below) for nothing.
void ct_blas_init(int argc, char **argv);

// The address space OpenBLAS maps for each thread that calls it: its work buffer
// (BUFFER_SIZE, 128 MiB in OpenBLAS 0.3 for x86-64), mapped at the thread's first call,
// resident only as far as used. Under an address-space limit (ulimit -v) a buffer that
// does not fit makes OpenBLAS retry the mapping for ever: a hang, with no message. So
// the room for them is checked before.
#define CT_BLAS_BUFFER_BYTES (128.0 * 1048576)

// Under an address-space limit: whether `threads` threads' OpenBLAS work buffers and
// `more` bytes fit beside what is mapped now (*need, *used and *limit in bytes, for the
// caller's message). When they fit, the buffers' room is held (an unreadable mapping)
// until each thread's first matmul gives its part back just before OpenBLAS maps its
// buffer, so that big buffers allocated in between fail cleanly instead of OpenBLAS
// hanging. True, holding nothing, when there is no limit.
bool ct_blas_reserve(int threads, double more, double *need, double *used, double *limit);
// How many of `threads` have not mapped their OpenBLAS buffer yet (those that have are in
// what is mapped now): what ct_blas_reserve holds room for.
int ct_blas_buffers_to_map(int threads);
// ct_blas_reserve with the message: 0, or CT_ENOMEM with the figures ("address-space
// limit (ulimit -v) is 146 MiB; ctune needs at least 310 MiB to start (86 MiB mapped now,
// 1 x 128 MiB for OpenBLAS's work buffer, 96 MiB for MPI's start); raise ulimit -v").
// `more_what` names `more` (NULL with 0); `hint` (or NULL) is what else lowers the need.
int ct_blas_room(int threads, double more, const char *more_what, const char *hint);

// The OPENBLAS_CORETYPE that should replace `corename` on a CPU with these features,
// or NULL when `corename` already fits it.
const char *ct_blas_wanted_core(const char *corename, bool avx512, bool avx2);
const char *ct_blas_corename(void);

// Row-major C (M, N) = alpha * op(A) · op(B) + beta * C, as cblas_sgemm, with the rows
// or columns of C split across the pool's threads (whichever dimension is larger).
// ta/tb: 'N' or 'T'.
void ct_sgemm(char ta, char tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

// The same on the calling thread only (for use inside a parallel task).
void ct_sgemm_serial(char ta, char tb, int M, int N, int K, float alpha, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc);
