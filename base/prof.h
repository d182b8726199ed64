// prof: where a run's wall time goes, by region, when CT_PROFILE=1 (for machines without
// perf, such as the lent server). Regions are timed on the thread that runs the step (the
// one that starts every parallel loop), so a region's figure is the wall time the step
// spent in it, its parallel loops included. A region is not timed inside another, but for
// the LM head's products inside the head's region: the report gives the head's time
// without them.
// Off (the default), ct_prof_open() returns 0 and ct_prof_add does nothing.
#pragma once
#include <stdio.h>

typedef enum {
  CT_PROF_PRODUCT,    // training: the base's projections (oneDNN bf16 or OpenBLAS)
  CT_PROF_NARROW,     // training: fp32 -> bf16 of the projections' inputs
  CT_PROF_LORA,       // training: the adapters' forward and backward
  CT_PROF_ATTENTION,  // training: attention forward and backward
  CT_PROF_NORM,       // training: RMSNorm (and head norms) forward and backward
  CT_PROF_POINTWISE,  // training: RoPE, SwiGLU/GeGLU, bias, residual copies
  CT_PROF_HEAD,       // training: the LM head, its loss and gradient
  CT_PROF_E_LINEAR,   // engine: the base's products
  CT_PROF_E_LORA,     // engine: the adapters
  CT_PROF_E_ATTENTION,// engine: KV cache stores and attention
  CT_PROF_E_OTHER,    // engine: norms, RoPE, SwiGLU, embeddings
  CT_PROF_E_HEAD,     // engine: final norm and LM head
  CT_PROF_SAMPLE,     // engine: choosing the next tokens
  CT_PROF_HEAD_PRODUCT,  // training: the LM head's products (within CT_PROF_HEAD, reported apart)
  CT_PROF_N
} ct_prof_region;

// The time now in seconds, or 0 when profiling is off: opens a timed span of region r that
// ct_prof_add(r, that time) closes.
double ct_prof_open(ct_prof_region r);
// Adds the time since t0 (ct_prof_open's) to region r, and the pool loops run meanwhile.
void ct_prof_add(ct_prof_region r, double t0);
// One line per region: its time, its share of the time since the first timed region, and
// its pool loops; nothing when off.
void ct_prof_report(FILE *f);

// Runs the statement(s) and adds their time to region r.
#define CT_PROF(r, ...)                 \
  do {                                  \
    double ct_prof_t0_ = ct_prof_open(r); \
    __VA_ARGS__;                        \
    ct_prof_add((r), ct_prof_t0_);      \
  } while (0)
