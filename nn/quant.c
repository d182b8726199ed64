// quant: the row-absmax int8 quantizer (no dequantization kernels: their users own those).
#include "quant.h"

#include <math.h>

void ct_quantize_rows_int8(const float *W, int rows, int cols, int8_t *q, float *scale) {
  for (int n = 0; n < rows; n++) {
    const float *w = W + (long)n * cols;
    float mx = 0;
    for (int k = 0; k < cols; k++) mx = fmaxf(mx, fabsf(w[k]));
    float s = mx > 0 ? mx / 127.0f : 1.0f;
    scale[n] = s;
    for (int k = 0; k < cols; k++) {
      float v = rintf(w[k] / s);
      q[(long)n * cols + k] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
  }
}
