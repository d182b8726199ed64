// linear: the inference engine's matrix products, y = x · Wᵀ for a few rows x, with W
// packed into panels (fp32 or bf16, see panel.h: register-blocked, the batched decode's
// kernels), in plain fp32 rows (the training parameters themselves, no copy: the
// adapters' small matrices), or int8 with one scale per output row. bf16 panels run on
// AMX tiles where the CPU has them (amx.h; the narrow last panel, and W whose width is not
// a multiple of 32, stay on the panel kernel). Each output is one
// chain of products in a fixed order, so a token's result is bit-identical whatever else
// shares the batch and whatever the thread count: the sampler's seeded outputs do not
// depend on continuous batching.
#pragma once
#include <stdint.h>

typedef struct {
  int rows, cols;         // W is (rows, cols) = [out, in]
  const float *f32;       // (rows, cols), or NULL
  const uint16_t *b16;    // (rows, cols) bf16 rows, or NULL: a source for ct_infer_pack only
  const int8_t *q;        // (rows, cols) int8, or NULL
  const float *scale;     // (rows): W[n, k] = q[n, k] * scale[n]
  const int32_t *rowsum;  // (rows): Σ_k q[n, k] (for the unsigned-times-signed dot product)
  const float *p32;       // (rows · cols) fp32 panels, or NULL
  const uint16_t *p16;    // (ct_panel16_size) bf16 panels, or NULL
  const int8_t *p8;       // (rows · cols) int8 panels (then q is NULL; scale, rowsum as for q)
} ct_linear;

// y (S, rows) with row stride ldy = x (S, cols) with row stride ldx, times Wᵀ;
// accumulate != 0 adds to y instead of overwriting it. The first of q, p8, p16, p32, f32
// that is set is used. With bf16 panels x is rounded to bf16 and the products summed in fp32;
// with int8 weights each row of x
// is quantized too (absmax, one scale per row) and the dot products are exact integer
// sums (AVX-512 VNNI when the CPU has it, plain C otherwise: the same result).
// Call from one thread at a time (the int8 path keeps a scratch buffer).
void ct_linear_forward(const ct_linear *w, const float *x, int ldx, int S, float *y, int ldy,
                       int accumulate);

// ct_linear_forward of x = swiglu(gu) (S, cols) for fp32 panels: gu (S, 2·cols; row stride
// ldgu) gate then up, x[s, k] = g / (1 + exp(−g)) · u computed as ct_swiglu_forward does,
// while x is packed for the panels (no pass writing it, none reading it back): the same
// bits as the two steps. Returns 1, doing nothing, for any other storage of W.
int ct_linear_forward_swiglu(const ct_linear *w, const float *gu, int ldgu, int S, float *y, int ldy,
                             int accumulate);

// Row r of W as floats into out (cols) — the embedding lookup (of any storage).
void ct_linear_row(const ct_linear *w, int r, float *out);

// Per-row absmax int8 quantization of W (rows, cols): q (rows, cols), scale (rows), and
// rowsum (rows) = Σ_k q[n, k].
void ct_quantize_rows(const float *W, int rows, int cols, int8_t *q, float *scale, int32_t *rowsum);
// rowsum of already-quantized rows (a loaded int8 model).
void ct_rowsums(const int8_t *q, int rows, int cols, int32_t *rowsum);
