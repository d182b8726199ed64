// kernels: the element-wise and row-wise layers of the model, each a forward/backward
// pair over raw float pointers, parallel over rows on the pool. Backward functions
// accumulate (+=) into parameter gradients; activation gradients are written (=)
// unless the name says _acc. Kernels never allocate: reductions over rows use the
// caller's `scratch` of CT_RED_CHUNKS * C floats, and results do not depend on the
// number of threads (rows are cut into CT_RED_CHUNKS fixed chunks, summed in order).
//
// N = number of rows (B*T tokens), C = row width.
#pragma once
#include <stdint.h>

#include "fastmath.h"

#define CT_RED_CHUNKS 32

// y = x / rms(x) * w;  rstd (N) saved for backward.
void ct_rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int N, int C,
                        float eps);
// ct_rmsnorm_forward's y again from the rstd it saved: the same bits (backward recomputes the
// norms' outputs instead of keeping them).
void ct_rmsnorm_apply(float *y, const float *rstd, const float *x, const float *w, int N, int C);
// dx = (written unless accumulate) ..., dw += Σ_rows dy * x * rstd.
void ct_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w,
                         const float *rstd, int N, int C, int accumulate, float *scratch);

// The same RMSNorm applied to `heads` vectors of width `hd` inside each row of a strided
// matrix: rows of x have stride `ld`, and head h starts at column h*hd (q/k-norm in Qwen3).
// In place: xio holds x on entry and y on exit; xsave (same layout) keeps x for backward.
void ct_headnorm_forward(float *xio, float *xsave, float *rstd, const float *w, int N, int heads,
                         int hd, int ld, float eps);
// dxio holds dy on entry and dx on exit.
void ct_headnorm_backward(float *dxio, float *dw, const float *xsave, const float *w,
                          const float *rstd, int N, int heads, int hd, int ld, float *scratch);

// Rotate-half RoPE in place on `heads` heads of width hd in rows of stride ld.
// pos (N) gives each row's position; cos/sin tables are (max_pos, hd/2).
// inverse != 0 applies the transpose rotation (the backward pass).
void ct_rope(float *x, const int *pos, const float *cos_t, const float *sin_t, int N, int heads,
             int hd, int ld, int inverse);

// h = silu(g) * u where gu rows are [g (F) | u (F)]; h (N, F). h16 (N, F), or NULL: h
// rounded to bf16 as well (the next product's input, in the same pass).
void ct_swiglu_forward(float *h, uint16_t *h16, const float *gu, int N, int F);
// The gate and up adapters' terms added to gu first, then ct_swiglu_forward: gu[n] (2F) +=
// s · (ug[n]·Bgt | uu[n]·But) (ug, uu (N, 16), each NULL for none; Bgt, But (16, F): the
// adapters' B transposed, ct_adapter_forward_u), 8 rows at a time, each row's h from its
// sums while it is in cache; h and h16 both NULL: the sums only. (The adapters' own pass
// and SwiGLU's each read all of gu once more.) round != 0 (bf16 compute): the sums are
// rounded to bf16 in gu before h reads them — what a bf16 product's output holds under
// autocast — and gu16 (N, 2F), unless NULL, gets their bits too (a bf16 copy kept for
// backward).
void ct_swiglu_forward_lora(float *h, uint16_t *h16, float *gu, int N, int F, float s, const float *ug,
                            const float *Bgt, const float *uu, const float *But, int round, uint16_t *gu16);
// dgu = [dg | du] from dh; dgu may be gu (in place). dgu16 (N, 2F), or NULL: dgu rounded to
// bf16 as well.
void ct_swiglu_backward(float *dgu, uint16_t *dgu16, const float *dh, const float *gu, int N, int F);

// tanh(x) = 1 - 2 / (e^(2x) + 1), vectorizable (ct_expf); absolute error ~1e-7.
static inline float ct_tanhf(float x) { return 1.0f - 2.0f / (ct_expf(2.0f * x) + 1.0f); }

// Gemma's MLP: h = gelu_tanh(g) * u where gu rows are [g (F) | u (F)]; h (N, F).
// gelu_tanh(x) = x/2 · (1 + tanh(sqrt(2/π) · (x + 0.044715 x³))) (gelu_pytorch_tanh).
void ct_geglu_forward(float *h, const float *gu, int N, int F);
// dgu = [dg | du] from dh; dgu may be gu (in place).
void ct_geglu_backward(float *dgu, const float *dh, const float *gu, int N, int F);

// y (N, C) += x (N, C) (a residual add), on the pool.
void ct_add_rows(float *y, const float *x, long N, int C);
// y (N, C) = x (N, C), on the pool (the residual stream's copies: a GRPO micro-batch's are
// 100+ MB each, and the first write of a fresh page costs the kernel's zeroing of it).
void ct_copy_rows(float *y, const float *x, long N, int C);

// y[i,:] += b for bias b (C) over rows with stride ld; db += Σ_rows dy.
void ct_bias_forward(float *y, const float *b, int N, int C, int ld);
void ct_bias_backward(float *db, const float *dy, int N, int C, int ld, float *scratch);

// Embedding lookup: out (N, C) = table[ids[n]]; backward dtable[ids[n]] += dout[n]
// (serial over rows: token ids repeat; parallel over columns).
void ct_embed_forward(float *out, const float *table, const int *ids, int N, int C);
void ct_embed_backward(float *dtable, const float *dout, const int *ids, int N, int C);

// dst (N, C) = x (N, ld)'s first C columns rounded to bf16 (nearest even): the input of a
// bf16 matmul (dnnl.h).
void ct_bf16_narrow_rows(uint16_t *dst, const float *x, int N, int C, int ld);
// dst (n) = src (n) widened, on the pool.
void ct_bf16_widen_all(float *dst, const uint16_t *src, long n);
