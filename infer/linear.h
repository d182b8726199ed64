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
  int ext;                // bf16 panels: columns packed after cols, so p16 is (rows, cols + ext)
                          // and x gets ext more (zeros, or the adapters' x·Aᵀ: ct_linear_lora)
} ct_linear;

// LoRA adapters folded into a bf16-panel product (the engine's, engine.c): W's extension
// columns [16i, 16i + 16) hold adapter i's B (its rows' block of W, 0 elsewhere), and the
// product's x gets u_i = scale · x·A_iᵀ there, so y = x·Wᵀ + Σ_i u_i·B_iᵀ is one product:
// the adapters' terms in bf16 (u and B rounded, the sums fp32) at no pass of their own.
#define CT_LINEAR_LORA_MAX 3
typedef struct {
  int n;                                // adapters (16 extension columns each, in order)
  float scale;
  const float *A[CT_LINEAR_LORA_MAX];   // A_i transposed (cols, 16) as thin.h reads it; NULL: u_i = 0
} ct_linear_lora;

// y (S, rows) with row stride ldy = x (S, cols) with row stride ldx, times Wᵀ;
// accumulate != 0 adds to y instead of overwriting it. The first of q, p8, p16, p32, f32
// that is set is used. With bf16 panels x is rounded to bf16 and the products summed in fp32;
// with int8 weights each row of x
// is quantized too (absmax, one scale per row) and the dot products are exact integer
// sums (AVX-512 VNNI when the CPU has it, plain C otherwise: the same result).
// Call from one thread at a time (the int8 path keeps a scratch buffer).
void ct_linear_forward(const ct_linear *w, const float *x, int ldx, int S, float *y, int ldy,
                       int accumulate);

// ct_linear_forward of x = swiglu(gu) (S, cols) for fp32 or bf16 panels: gu (S, 2·cols; row
// stride ldgu) gate then up, x[s, k] = g / (1 + exp(−g)) · u computed as ct_swiglu_forward
// does, while x is packed for the panels (no pass writing it, none reading it back): the
// same bits as the two steps. Returns 1, doing nothing, for any other storage of W.
int ct_linear_forward_swiglu(const ct_linear *w, const float *gu, int ldgu, int S, float *y, int ldy,
                             int accumulate);

// ct_linear_forward for bf16 panels with extension columns: x (S, cols; row stride ldx) —
// or, swiglu, x = swiglu(gu) with gu (S, 2·cols; row stride ldx), computed as
// ct_swiglu_forward does while it is narrowed (no pass writing it) — plus the adapters
// lo (NULL: none, the extension's x columns 0). u_i is thin.h's chain from the fp32 x
// (bit-identical per token whatever shares the batch), so batching changes no bit here
// either. Returns 1, doing nothing, unless W has bf16 panels.
int ct_linear_forward_lora(const ct_linear *w, const float *x, int ldx, int S, float *y, int ldy, int accumulate,
                           const ct_linear_lora *lo, int swiglu);

// Row r of W as floats into out (cols) — the embedding lookup (of any storage).
void ct_linear_row(const ct_linear *w, int r, float *out);

// Per-row absmax int8 quantization of W (rows, cols): q (rows, cols), scale (rows), and
// rowsum (rows) = Σ_k q[n, k].
void ct_quantize_rows(const float *W, int rows, int cols, int8_t *q, float *scale, int32_t *rowsum);
// rowsum of already-quantized rows (a loaded int8 model).
void ct_rowsums(const int8_t *q, int rows, int cols, int32_t *rowsum);
