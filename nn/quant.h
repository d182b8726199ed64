// quant: per-row absmax int8 quantization, shared by the sampler's int8 weights and an
// int8 LoRA base: W[n, k] ≈ q[n, k] · scale[n], scale = max_k |W[n, k]| / 127.
#pragma once
#include <stdint.h>

// q (rows, cols), scale (rows) from W (rows, cols); round to nearest, clamp to ±127.
void ct_quantize_rows_int8(const float *W, int rows, int cols, int8_t *q, float *scale);
