// tiny_model: the small random models the numeric tests run (a few hundred parameters
// per matrix), in each supported family, with non-trivial norm weights and biases.
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "matmul.h"
#include "model.h"
#include "rng.h"

// llama: tied, GQA 4/2; qwen2: + q/k/v biases, untied; qwen3: + q/k norms, head_dim 10;
// gemma3_text: Gemma 3's layer, layer 0 sliding (window 4, RoPE base 100), layer 1 full.
static inline ct_model_config tiny_config(const char *type) {
  ct_model_config c = {.vocab_size = 37, .hidden_size = 24, .intermediate_size = 40,
                       .num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 8,
                       .max_position_embeddings = 64, .rope_theta = 10000,
                       .rms_norm_eps = 1e-6f, .tie_word_embeddings = true,
                       .bos_token_id = -1, .eos_token_id = -1, .pad_token_id = -1};
  snprintf(c.model_type, sizeof c.model_type, "%s", type);
  if (!strcmp(type, "qwen2")) c.qkv_bias = true, c.tie_word_embeddings = false;
  if (!strcmp(type, "qwen3")) c.qk_norm = true, c.head_dim = 10;
  if (!strcmp(type, "gemma3_text")) {
    c.gemma = c.qk_norm = true;
    c.query_pre_attn_scalar = 12;
    c.sliding_window = 4;
    c.rope_local_theta = 100;
    c.sliding[0] = 1;
  }
  return c;
}

// The smaller llama the gradient checks run (every parameter against finite differences):
// V 17, C 12, F 20, 2 layers, 4 heads of head_dim 4 over 2 key/value heads, 16
// positions, tied. Tests change fields from here (type, sizes, Gemma's).
static inline ct_model_config mini_config(void) {
  ct_model_config c = {.model_type = "llama", .vocab_size = 17, .hidden_size = 12,
                       .intermediate_size = 20, .num_layers = 2, .num_heads = 4,
                       .num_kv_heads = 2, .head_dim = 4, .max_position_embeddings = 16,
                       .rope_theta = 10000, .rms_norm_eps = 1e-6f, .tie_word_embeddings = true,
                       .bos_token_id = -1, .eos_token_id = -1, .pad_token_id = -1};
  return c;
}

// Every 1-D tensor of m (norms, biases) set to center + normal(0, sd), in table order,
// from its own seed: non-trivial norms (center 1; 0 for Gemma's, which apply 1 + w).
static inline void tiny_vectors(ct_model *m, uint64_t seed, double center, double sd) {
  ct_rng r;
  ct_rng_seed(&r, seed);
  for (int i = 0; i < m->n_tensors; i++)
    if (m->tensors[i].ndim == 1)
      for (long k = 0; k < m->tensors[i].numel; k++)
        m->params[m->tensors[i].offset + k] = (float)(center + sd * ct_rng_normal(&r));
}

// A tiny_config model with RoPE tables for 64 positions: matrices normal(0, 0.3),
// vectors (norms, biases) 1 + normal(0, 0.2), from fixed seeds; Gemma's norms, which
// apply 1 + w, normal(0, 0.2) (the same scales).
static inline void tiny_model(ct_model *m, const char *type) {
  ct_model_config c = tiny_config(type);
  if (ct_model_init(m, &c, 64)) exit(1);
  ct_model_init_random(m, 5, 0.3f);
  tiny_vectors(m, 6, !c.gemma, 0.2);
}

// Logits (T, V) of one causal row through the training forward (what the sampler's engine
// must reproduce).
__attribute__((unused)) static float *train_logits(const ct_model *m, const int *ids, int T) {
  ct_acts a;
  if (ct_acts_init(&a, m, 1, T, CT_ACTS_FORWARD)) exit(1);
  for (int t = 0; t < T; t++) a.ids[t] = ids[t], a.pos[t] = t, a.seg[t] = 0;
  ct_forward(m, &a, 1, T);
  int V = m->cfg.vocab_size, C = m->cfg.hidden_size;
  float *lg = malloc(sizeof(float) * T * V);
  ct_sgemm('N', 'T', T, V, C, 1, a.lnf, C, m->w.lm_head, C, 0, lg, V);
  ct_acts_free(&a);
  return lg;
}
