// The whole model against an independent float64 reference written here from first
// principles: the float32 loss must match the reference loss, and every parameter's
// analytic gradient must match central differences of the reference.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "error.h"
#include "forward.h"
#include "head.h"
#include "matmul.h"
#include "model.h"
#include "pool.h"
#include "rng.h"
#include "test.h"
#include "ref_model.h"
#include "tiny_model.h"

// ---------------------------------------------------------------------------
// The system under test: float32 forward, head, backward.

static double ours(const ct_model *m, const ct_weights *g, const batch_t *b, double z, int ntiles,
                   int mode, float *grads) {
  return batch_loss_grads(m, g, b, z, ntiles, mode, grads, 0);
}

static void check_model(ct_model_config cfg, double z) {
  ct_model m;
  CHECK_OK(ct_model_init(&m, &cfg, 16));
  ct_model_init_random(&m, 3, 0.3f);
  tiny_vectors(&m, 11, 1, 0.2);  // make norms and biases non-trivial too
  float *grads = aligned_alloc(64, sizeof(float) * m.n_floats);
  ct_weights g;
  CHECK_OK(ct_weights_bind(&g, &m, grads));
  // two rows of T=7: row 0 causal with two padding tokens at the end (no target), row 1
  // two packed documents (positions restart, attention block-diagonal)
  batch_t b = two_row_batch(cfg.vocab_size, 7, 3);
  double loss = ours(&m, &g, &b, z, 1, CT_ACTS_KEEP, grads);
  // gradient checkpointing recomputes each layer from its input: the same gradients, bit for bit
  float *grads_rc = aligned_alloc(64, sizeof(float) * m.n_floats);
  ct_weights g_rc;
  CHECK_OK(ct_weights_bind(&g_rc, &m, grads_rc));
  double loss_rc = ours(&m, &g_rc, &b, z, 1, CT_ACTS_RECOMPUTE, grads_rc);
  CHECK(loss_rc == loss);
  CHECK(!memcmp(grads_rc, grads, sizeof(float) * m.n_floats));
  // the top layer kept, the other recomputed: the same gradients, bit for bit
  batch_kept = 1;
  CHECK(ours(&m, &g_rc, &b, z, 1, CT_ACTS_RECOMPUTE, grads_rc) == loss);
  CHECK(!memcmp(grads_rc, grads, sizeof(float) * m.n_floats));
  batch_kept = 0;
  // a batch smaller than its activations' capacity, after a larger one: the same gradients
  for (int mode = CT_ACTS_KEEP; mode <= CT_ACTS_RECOMPUTE; mode++) {
    CHECK(batch_loss_grads(&m, &g_rc, &b, z, 1, mode, grads_rc, 2) == loss);
    CHECK(!memcmp(grads_rc, grads, sizeof(float) * m.n_floats));
  }
  ct_weights_free(&g_rc);
  free(grads_rc);

  double *P = calloc(m.n_floats, sizeof(double));
  for (long i = 0; i < m.n_floats; i++) P[i] = m.params[i];
  ref_t ref = {&m, P};
  double want = ref_mean_loss(&ref, b.B, b.T, b.ids, b.pos, b.seg, b.target, z);
  CHECK_NEAR(loss, want, 2e-5 * fabs(want));

  int checked;
  CHECK(ref_check_gradients(&ref, P, grads, b.B, b.T, b.ids, b.pos, b.seg, b.target, z, &checked) == 0);
  long numel = 0;
  for (int ti = 0; ti < m.n_tensors; ti++) numel += m.tensors[ti].numel;
  CHECK(checked == numel && numel > 2000);
  // ... and that is every parameter of the architecture, counted from the config by
  // hand, not from the tensor table the loop above walked: a tensor missing from the
  // table (so never checked) fails here
  long V = cfg.vocab_size, C = cfg.hidden_size, F = cfg.intermediate_size, hd = cfg.head_dim;
  long QKV = (cfg.num_heads + 2L * cfg.num_kv_heads) * hd;
  long per_layer = C /* input_layernorm */ + QKV * C /* q|k|v_proj */ +
                   (cfg.qkv_bias ? QKV : 0) + (cfg.qk_norm ? 2 * hd : 0) +
                   C * cfg.num_heads * hd /* o_proj */ + C /* post_attention_layernorm */ +
                   2 * F * C /* gate|up_proj */ + C * F /* down_proj */;
  long want_params = V * C /* embed */ + cfg.num_layers * per_layer + C /* norm */ +
                     (cfg.tie_word_embeddings ? 0 : V * C /* lm_head */);
  CHECK(checked == want_params);
  CHECK(m.n_floats >= want_params);  // groups of tensors start on 16-float boundaries
  CHECK(m.n_tensors == 1 + cfg.num_layers * (9 + (cfg.qkv_bias ? 3 : 0) + (cfg.qk_norm ? 2 : 0)) +
                       1 + (cfg.tie_word_embeddings ? 0 : 1));

  // Tiling the vocabulary changes nothing but rounding.
  float *g3 = aligned_alloc(64, sizeof(float) * m.n_floats);
  ct_weights gw3;
  CHECK_OK(ct_weights_bind(&gw3, &m, g3));
  double loss3 = ours(&m, &gw3, &b, z, 3, CT_ACTS_KEEP, g3);
  CHECK_NEAR(loss3, loss, 1e-6 * fabs(loss));
  CHECK(test_max_rel_diff(g3, grads, m.n_floats) < 1e-5);
  ct_weights_free(&gw3);
  free(g3);
  free(P);
  ct_weights_free(&g);
  free(grads);
  ct_model_free(&m);
}

static void test_llama_tied_gradients_match_float64_reference(void) { check_model(mini_config(), 0); }

static void test_qwen2_untied_qkv_bias_with_z_loss_gradients_match_reference(void) {
  ct_model_config c = mini_config();
  c.tie_word_embeddings = false;
  c.qkv_bias = true;
  check_model(c, 1e-2);
}

static void test_qwen3_qk_norm_mqa_gradients_match_reference(void) {
  ct_model_config c = mini_config();
  c.qk_norm = true;
  c.num_kv_heads = 1;
  c.head_dim = 6;  // H*hd != C
  c.tie_word_embeddings = false;
  check_model(c, 0);
}

// gradient_checkpointing keeping the top layers that fit: 4 layers, the top 1, 2 or 3 kept,
// the rest recomputed into the one shared layer's storage: the gradients of keeping all, bit
// for bit (a kept layer reading the shared storage would read another layer's activations).
static void test_keeping_the_top_layers_gives_the_same_gradients(void) {
  ct_model_config cfg = mini_config();
  cfg.num_layers = 4;
  cfg.qkv_bias = true;
  ct_model m;
  CHECK_OK(ct_model_init(&m, &cfg, 16));
  ct_model_init_random(&m, 3, 0.3f);
  tiny_vectors(&m, 11, 1, 0.2);
  float *g0 = aligned_alloc(64, sizeof(float) * m.n_floats), *g1 = aligned_alloc(64, sizeof(float) * m.n_floats);
  ct_weights w0, w1;
  CHECK_OK(ct_weights_bind(&w0, &m, g0));
  CHECK_OK(ct_weights_bind(&w1, &m, g1));
  batch_t b = two_row_batch(cfg.vocab_size, 7, 3);
  double loss = ours(&m, &w0, &b, 0, 1, CT_ACTS_KEEP, g0);
  for (int kept = 1; kept <= 3; kept++) {
    batch_kept = kept;
    CHECK(ours(&m, &w1, &b, 0, 1, CT_ACTS_RECOMPUTE, g1) == loss);
    CHECK(!memcmp(g0, g1, sizeof(float) * m.n_floats));
  }
  batch_kept = 0;
  CHECK(ct_acts_kept_bytes(&cfg, 2, 7, CT_ACTS_RECOMPUTE, 2) > ct_acts_kept_bytes(&cfg, 2, 7, CT_ACTS_RECOMPUTE, 1));
  CHECK(ct_acts_kept_bytes(&cfg, 2, 7, CT_ACTS_RECOMPUTE, 3) <= ct_acts_bytes(&cfg, 2, 7, CT_ACTS_KEEP));
  ct_weights_free(&w0);
  ct_weights_free(&w1);
  free(g0), free(g1);
  ct_model_free(&m);
}

int main(int argc, char **argv) {
  ct_blas_init(argc, argv);
  ct_pool_init(2);
  RUN(test_llama_tied_gradients_match_float64_reference);
  RUN(test_qwen2_untied_qkv_bias_with_z_loss_gradients_match_reference);
  RUN(test_qwen3_qk_norm_mqa_gradients_match_reference);
  RUN(test_keeping_the_top_layers_gives_the_same_gradients);
  return test_summary();
}
