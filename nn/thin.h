// thin: the products of a rank-16 LoRA adapter whose other side is a whole activation
// matrix (N tokens by K features), without the packing copies a general sgemm makes of
// that big operand (for these shapes OpenBLAS spent as long copying as multiplying).
// Each output element is one fixed-order sum, so results do not depend on the thread count.
#pragma once
#include <stdint.h>

#define CT_THIN_R 16  // the one rank these kernels serve; other ranks use ct_sgemm

// Whether a rank-r product should run here: rank 16 on AVX-512 builds (elsewhere the
// scalar loops are correct but OpenBLAS is faster).
static inline int ct_thin_takes(int r) {
#if defined(__AVX512F__)
  return r == CT_THIN_R;
#else
  (void)r;
  return 0;
#endif
}

// W (K, 16) = A (16, K) transposed: an adapter's A as ct_thin_out takes it.
void ct_thin_transpose(const float *A, int K, float *W);

// Y (N, 16) = alpha · X (N, K; row stride ldx) · W (K, 16): W is k-major (row k holds the
// 16 outputs' weights for input k).
void ct_thin_out(int N, int K, float alpha, const float *X, int ldx, const float *W, float *Y);

// ct_thin_out's rows [n0, n1) on the calling thread (n0 a multiple of 8): the same bits.
void ct_thin_out_rows(long n0, long n1, int K, float alpha, const float *X, int ldx, const float *W, float *Y);

// Y[n] (K; row stride ldy) += alpha · (V[n] · A) for rows [n0, n1) on the calling thread:
// V (N, 16), A (16, K). ct_thin_dx_masked's chain without a mask.
void ct_thin_add_rows(long n0, long n1, int K, float alpha, const float *V, const float *A, float *Y, int ldy);

// G (K, 16) += alpha · Σ_n X[n][k] · U[n][:]: X (N, K; row stride ldx), U (N, 16).
void ct_thin_grad(int N, int K, float alpha, const float *X, int ldx, const float *U, float *G);

// Both products that read an adapter's output gradient X (N, K; row stride ldx), in one pass
// over it: Y (N, 16) = X · W (W (K, 16) k-major: B) and G (K, 16) += alpha · Xᵀ · U (U (N,
// 16)). The rows run in fixed chunks of CT_THIN_CHUNK, each summing into its own partial G
// in `partials` (ct_thin_out_grad_floats), added in chunk order: the thread count changes
// no bit.
#define CT_THIN_CHUNK 256
long ct_thin_out_grad_floats(int N, int K);
void ct_thin_out_grad(int N, int K, float alpha, const float *X, int ldx, const float *W, const float *U, float *Y,
                      float *G, float *partials);

// With a dropout mask: bits (N rows of ceil(K / 32) words, bit k of row n set = kept; NULL =
// all kept) zero the dropped inputs.
// G (16, K; A's layout) += alpha · Σ_n U[n][:]ᵀ · (mask ⊙ X[n]): an adapter's dA from the
// inputs it saw. X (N, K; row stride ldx), U (N, 16). With `partials`
// (ct_thin_out_grad_floats(N, K) floats) X is read row by row: each chunk of CT_THIN_CHUNK
// rows sums into its own partial G, added in chunk order (a column-by-column walk down X,
// the way without, ran at a fifth of the speed of memory: 8192 x 4864, 2 threads, 62 ms).
void ct_thin_grad_masked(int N, int K, float alpha, const float *X, int ldx, const uint32_t *bits, const float *U,
                         float *G, float *partials);
// ct_thin_grad_masked (with partials) for an adapter on SwiGLU's output h = swiglu(gu) (a
// down projection's): X = h, computed from gu (N, 2F) as it is read, so no h need exist;
// the bits of ct_swiglu_forward then ct_thin_grad_masked.
void ct_thin_grad_masked_swiglu(int N, int F, float alpha, const float *gu, const uint32_t *bits, const float *U,
                                float *G, float *partials);

// dX[n] (K; row stride lddx) += alpha · mask ⊙ (V[n] · A): the input gradient through an
// adapter's A (16, K) and its dropout, in one pass. V (N, 16).
void ct_thin_dx_masked(int N, int K, float alpha, const float *V, const float *A, const uint32_t *bits, float *dX,
                       int lddx);
