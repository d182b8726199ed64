// matmul: OpenBLAS set-up and the parallel sgemm every layer uses.
#pragma once
#include <stdbool.h>

// Makes sure OpenBLAS runs its real kernel for this CPU. Debian's 0.3.21 does not
// know recent Xeons and falls back to a generic SSE3 kernel, five times slower; when
// that happened and the user did not set OPENBLAS_CORETYPE, this sets it and re-executes
// the program (OpenBLAS reads it only at load time) with the command line it was started
// with (/proc/self/cmdline; argv only when that cannot be read), so a main may shift its
// argv before calling. Call first thing in main(), before MPI_Init.
// Also pins OpenBLAS to one thread: ctune's pool splits the work itself.
void ct_blas_init(int argc, char **argv);

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
