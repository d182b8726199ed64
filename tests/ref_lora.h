// ref_lora: LoRA adapters merged into the float64 reference's parameters, W += s·B·A, for
// tests that check adapters against ref_model.h. The module names are written here, not
// taken from the code under test.
#pragma once
#include <stdio.h>

#include "lora.h"
#include "model.h"

static const char *const ref_lora_module[CT_LORA_TARGETS] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

// P (m's flat layout, float64) = m's parameters with every adapter of lo merged in.
static inline void ref_lora_merged(double *P, const ct_model *m, const ct_lora *lo) {
  for (long i = 0; i < m->n_floats; i++) P[i] = m->params[i];
  char nm[96];
  for (int l = 0; l < m->cfg.num_layers; l++)
    for (int t = 0; t < CT_LORA_TARGETS; t++) {
      const ct_lora_ab *ab = &lo->w[l][t];
      if (!ab->A) continue;
      int in, out, row0, r = lo->cfg.r;
      ct_lora_dims(&m->cfg, t, &in, &out, &row0);
      snprintf(nm, sizeof nm, "model.layers.%d.%s.weight", l, ref_lora_module[t]);
      double *W = P + ct_model_find_tensor(m, nm)->offset;
      for (int o = 0; o < out; o++)
        for (int i = 0; i < in; i++) {
          double s = 0;
          for (int j = 0; j < r; j++) s += (double)ab->B[(long)o * r + j] * ab->A[(long)j * in + i];
          W[(long)o * in + i] += lo->scale * s;
        }
    }
}
