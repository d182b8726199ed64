// swiglu: SwiGLU's elementwise formulas, one definition for every kernel that computes them
// (kernels.c's passes and thin.c's fused adapter backward), so they agree to the bit.
#pragma once
#include "fastmath.h"

// h = silu(g) · u = g / (1 + e^−g) · u
static inline float ct_swiglu_h(float g, float u) { return g / (1.0f + ct_expf(-g)) * u; }

// The gradients of h through g and u for dh: du = dh · silu(g), dg = dh · u · σ(g)(1 + g(1 − σ(g))).
static inline void ct_swiglu_grads(float g, float u, float dh, float *dg, float *du) {
  float s = 1.0f / (1.0f + ct_expf(-g));
  *du = dh * (g * s);
  *dg = dh * u * s * (1.0f + g * (1.0f - s));
}
