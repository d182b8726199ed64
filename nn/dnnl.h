// dnnl: the one module that calls oneDNN. bfloat16 matrix products with fp32 accumulation
// and fp32 output (OpenBLAS has no bf16 kernel); fp32 products stay on OpenBLAS (matmul.h).
#pragma once
#include <stdbool.h>
#include <stdint.h>

// True when this CPU multiplies bf16 in hardware (AVX512_BF16 or AMX-BF16); without it
// oneDNN would emulate bf16, slower than fp32 sgemm.
bool ct_dnnl_bf16_cpu(void);

// Creates oneDNN's CPU engine (idempotent). Fails (CT_EINVAL, with the reason) when the
// CPU has no bf16 hardware or oneDNN cannot start.
int ct_dnnl_init(void);

// Row-major C (M, N) = op(A) · op(B) + beta · C, A and B bf16, C fp32, the products summed
// in fp32. beta is 0 or 1. ta/tb: 'N' or 'T'. The rows or columns of C are split into parts
// of ~1024 that the pool's threads claim as they come free, each running oneDNN
// single-threaded (oneDNN's OpenMP threads would compete with the pool for the same cores). Primitives are created once per shape and
// split (creation takes ~0.1-1 ms) and kept until ct_dnnl_free. Needs ct_dnnl_init.
// It cannot fail as kernels do not (void): when oneDNN does (a broken install, memory for a
// primitive or scratchpad), the part of C it leaves is NaN and ct_dnnl_check reports why.
void ct_gemm_bf16(char ta, char tb, int M, int N, int K, const uint16_t *A, int lda,
                  const uint16_t *B, int ldb, float beta, float *C, int ldc);

// 0, or the first failure of a bf16 product since ct_dnnl_init (its code, its message set
// with ct_set_error); it stays until ct_dnnl_free. Callers that return an error check it
// where numbers computed in bf16 would be used (ct_forward_batch, ct_train_update).
int ct_dnnl_check(void);

// How many primitives the cache holds (tests: a repeated shape creates none).
int ct_dnnl_cached(void);
void ct_dnnl_free(void);
