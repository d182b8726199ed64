// Gemma 3 (gemma3_text) against a float64 reference written from transformers'
// modeling_gemma3.py (ref_model.h's gemma_ref_loss; test_lora checks adapters with it
// too): embeddings × sqrt(C), RMSNorm with (1 + w), four norms per layer, q/k norms
// before RoPE, gelu_tanh MLP, query_pre_attn_scalar, sliding-window layers with their
// own RoPE base, attention logit softcapping. The float32 loss must match
// the reference, and every parameter's gradient central differences of the reference.
// Then the sampler's engine (a sliding layer's ring of KV rows) against the training
// forward, and config.json: read (layer_types, sliding_window_pattern), written back,
// refused keys.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batch.h"
#include "engine.h"
#include "error.h"
#include "forward.h"
#include "head.h"
#include "hf.h"
#include "matmul.h"
#include "model.h"
#include "pool.h"
#include "rng.h"
#include "scratch.h"
#include "test.h"
#include "ref_model.h"
#include "tiny_model.h"
#include "weights.h"

// ---------------------------------------------------------------------------
// The float32 model under test

// Mean cross-entropy (no z-loss, one vocabulary chunk) and its gradient.
static double ours(const ct_model *m, const ct_weights *g, const batch_t *b, int mode, float *grads) {
  return batch_loss_grads(m, g, b, 0, 1, mode, grads, 0);
}

// 3 layers: sliding, full, sliding (pattern 2), window 3, T = 9.
static ct_model_config tiny_gemma(void) {
  ct_model_config c = mini_config();
  snprintf(c.model_type, sizeof c.model_type, "gemma3_text");
  c.num_layers = 3, c.head_dim = 6, c.max_position_embeddings = 32;
  c.gemma = c.qk_norm = true, c.query_pre_attn_scalar = 10, c.sliding_window = 3, c.rope_local_theta = 50;
  for (int l = 0; l < c.num_layers; l++) c.sliding[l] = (l + 1) % 2 != 0;
  return c;
}

static void check_gemma(ct_model_config cfg) {
  ct_model m;
  CHECK_OK(ct_model_init(&m, &cfg, 16));
  ct_model_init_random(&m, 3, 0.3f);
  tiny_vectors(&m, 11, 0, 0.3);  // Gemma norms: w around 0 (the norm applies 1 + w)
  float *grads = aligned_alloc(64, sizeof(float) * m.n_floats), *grads_rc = aligned_alloc(64, sizeof(float) * m.n_floats);
  ct_weights g, g_rc;
  CHECK_OK(ct_weights_bind(&g, &m, grads));
  CHECK_OK(ct_weights_bind(&g_rc, &m, grads_rc));
  // row 0: one document of 9 tokens, the last two padding; row 1: two packed documents
  // (4 + 5 tokens, positions restart); 9 > the window, so it is crossed in both
  batch_t b = two_row_batch(cfg.vocab_size, 9, 4);
  double loss = ours(&m, &g, &b, CT_ACTS_KEEP, grads);
  double loss_rc = ours(&m, &g_rc, &b, CT_ACTS_RECOMPUTE, grads_rc);
  CHECK(loss_rc == loss);  // gradient checkpointing: the same bits
  CHECK(!memcmp(grads_rc, grads, sizeof(float) * m.n_floats));
  batch_kept = 1;  // ... with the top layer's activations kept
  CHECK(ours(&m, &g_rc, &b, CT_ACTS_RECOMPUTE, grads_rc) == loss);
  CHECK(!memcmp(grads_rc, grads, sizeof(float) * m.n_floats));
  batch_kept = 0;

  double *P = calloc(m.n_floats, sizeof(double));
  for (long i = 0; i < m.n_floats; i++) P[i] = m.params[i];
  ref_t ref = {&m, P};
  double want = ref_mean_loss(&ref, b.B, b.T, b.ids, b.pos, b.seg, b.target, 0);
  CHECK_NEAR(loss, want, 2e-5 * fabs(want));

  int checked;
  CHECK(ref_check_gradients(&ref, P, grads, b.B, b.T, b.ids, b.pos, b.seg, b.target, 0, &checked) == 0);
  // every parameter, counted from the config by hand: 4 norms per layer and q/k norms
  long V = cfg.vocab_size, C = cfg.hidden_size, F = cfg.intermediate_size, hd = cfg.head_dim;
  long QKV = (cfg.num_heads + 2L * cfg.num_kv_heads) * hd;
  long per_layer = 4 * C + QKV * C + 2 * hd + C * cfg.num_heads * hd + 3 * F * C;
  CHECK(checked == V * C + cfg.num_layers * per_layer + C + (cfg.tie_word_embeddings ? 0 : V * C));
  CHECK(m.n_tensors == 1 + cfg.num_layers * 13 + 1 + (cfg.tie_word_embeddings ? 0 : 1));
  free(P);
  ct_weights_free(&g);
  ct_weights_free(&g_rc);
  free(grads);
  free(grads_rc);
  ct_model_free(&m);
}

static void test_gemma_sliding_window_both_rope_bases_matches_float64_reference(void) {
  check_gemma(tiny_gemma());
}

static void test_gemma_attn_softcap_untied_linear_rope_matches_float64_reference(void) {
  ct_model_config c = tiny_gemma();
  c.attn_softcap = 1.5f;  // small enough that tanh bends the scores
  c.tie_word_embeddings = false;
  c.rope_type = 2;  // linear scaling on the full layers only
  c.rope_factor = 4;
  c.num_kv_heads = 1;
  check_gemma(c);
}

// The window matters: the same model with the window as long as the sequence (every
// layer sees everything) gives another loss; and one with no sliding layers but the
// same bases the global one.
static void test_gemma_window_changes_the_loss(void) {
  ct_model_config c = tiny_gemma();
  ct_model m;
  CHECK_OK(ct_model_init(&m, &c, 16));
  ct_model_init_random(&m, 3, 0.3f);
  float *grads = aligned_alloc(64, sizeof(float) * m.n_floats);
  ct_weights g;
  CHECK_OK(ct_weights_bind(&g, &m, grads));
  batch_t b = two_row_batch(c.vocab_size, 9, 4);
  double l3 = ours(&m, &g, &b, CT_ACTS_KEEP, grads);
  m.cfg.sliding_window = 9;  // (the RoPE tables stay the local ones for the sliding layers)
  double l9 = ours(&m, &g, &b, CT_ACTS_KEEP, grads);
  m.cfg.sliding_window = 3;
  double again = ours(&m, &g, &b, CT_ACTS_KEEP, grads);
  CHECK(again == l3);
  CHECK(fabs(l9 - l3) > 1e-4);
  ct_weights_free(&g);
  free(grads);
  ct_model_free(&m);
}

// ---------------------------------------------------------------------------
// The sampler's engine: a sliding layer keeps a ring of rows

enum { RT = 30, RP = 9, RMAX = 3 };  // tokens, prefilled (in passes of RMAX), tokens per pass

// Prefill RP tokens into slot 1 in passes of RMAX, decode the rest one by one: the logits
// (RT, V) of every position. The sliding layer's ring is window + RMAX - 1 = 6 rows, so
// positions wrap around it five times.
static float *engine_logits(const ct_infer_weights *w, const int *ids, ct_engine **keep) {
  int V = w->cfg.vocab_size, slot[RMAX] = {1, 1, 1}, pos[RT], outs[RMAX] = {0, 1, 2};
  for (int t = 0; t < RT; t++) pos[t] = t;
  float *lg = malloc(sizeof(float) * RT * V);
  ct_engine *e;
  ct_engine_opts o = {.slots = 2, .max_len = RT + 4, .max_tokens = RMAX};
  CHECK_OK(ct_engine_init(&e, w, &o));
  for (int t = 0; t < RP; t += RMAX) CHECK_OK(ct_engine_forward(e, RMAX, ids + t, slot, pos + t, outs, RMAX, lg + (long)t * V));
  for (int t = RP; t < RT; t++) CHECK_OK(ct_engine_forward(e, 1, ids + t, slot, pos + t, outs, 1, lg + (long)t * V));
  if (keep) *keep = e;
  else ct_engine_free(e);
  return lg;
}

static double max_diff(const float *a, const float *b, long n, double *scale) {
  double worst = 0;
  *scale = 0;
  for (long k = 0; k < n; k++) worst = fmax(worst, fabs(a[k] - b[k])), *scale = fmax(*scale, fabs(b[k]));
  return worst;
}

static void test_gemma_engine_ring_decode_matches_training_forward(void) {
  ct_model m;
  tiny_model(&m, "gemma3_text");  // layer 0 slides over 4 positions, layer 1 sees all
  int V = m.cfg.vocab_size, ids[RT];
  for (int t = 0; t < RT; t++) ids[t] = (t * 11 + 5) % V;
  float *want = train_logits(&m, ids, RT);
  const char *names[] = {"rows", "fp32 panels", "bf16 panels"};
  for (int pack = CT_PACK_NONE; pack <= CT_PACK_BF16; pack++) {
    ct_infer_weights w;
    CHECK_OK(ct_infer_from_model(&w, &m));
    CHECK_OK(ct_infer_pack(&w, pack));
    ct_engine *e;
    float *got = engine_logits(&w, ids, &e);
    double scale, worst = max_diff(got, want, (long)RT * V, &scale);
    fprintf(stderr, "  %s: %d positions through a 6-row ring, max |logit diff| %.3g (max |logit| %.3g)\n",
            names[pack], RT, worst, scale);
    CHECK(worst < (pack == CT_PACK_BF16 ? 0.05 * scale : 2e-5));  // test_engine's bounds
    // a slot copied after the ring wrapped decodes exactly like its source
    int id = 3, s0 = 0, s1 = 1, p = RT, zero = 0;
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    CHECK_OK(ct_engine_copy_slot(e, 1, 0, RT));
    CHECK_OK(ct_engine_forward(e, 1, &id, &s1, &p, &zero, 1, a));
    CHECK_OK(ct_engine_forward(e, 1, &id, &s0, &p, &zero, 1, b));
    CHECK(!memcmp(a, b, sizeof(float) * V));
    free(a), free(b), free(got);
    ct_engine_free(e);
    ct_infer_free(&w);
  }
  // the ring is what the sliding layer's cache costs: 6 rows, against 34 for a full layer
  ct_engine_opts o = {.slots = 2, .max_len = RT + 4, .max_tokens = RMAX};
  ct_model_config full = m.cfg;
  full.sliding[0] = 0;  // (the window stays set: the same RoPE tables)
  double KVd = m.cfg.num_kv_heads * m.cfg.head_dim;
  CHECK_NEAR(ct_engine_bytes(&full, &o) - ct_engine_bytes(&m.cfg, &o), 2 * 4.0 * 2 * (34 - 6) * KVd, 0);
  // int8 weights: close to fp32
  ct_infer_weights w8;
  CHECK_OK(ct_infer_quantize(&w8, &m));
  CHECK_OK(ct_infer_pack(&w8, CT_PACK_INT8));
  float *got8 = engine_logits(&w8, ids, NULL);
  double scale, worst = max_diff(got8, want, (long)RT * V, &scale);
  int agree = 0;
  for (int t = 0; t < RT; t++) {
    int a = 0, b = 0;
    for (int v = 1; v < V; v++) {
      if (got8[t * V + v] > got8[t * V + a]) a = v;
      if (want[t * V + v] > want[t * V + b]) b = v;
    }
    agree += a == b;
  }
  fprintf(stderr, "  int8: max |logit diff| %.3g (max |logit| %.3g), greedy tokens agree %d/%d\n", worst, scale,
          agree, RT);
  CHECK(worst < 0.1 * scale && agree >= RT * 3 / 4);
  free(got8);
  ct_infer_free(&w8);
  free(want);
  ct_model_free(&m);
}

// ---------------------------------------------------------------------------
// config.json

// gemma-3-270m's config.json (transformers 4.55), with its layer_types
static const char *cfg_270m =
    "{\"architectures\": [\"Gemma3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    "\"attn_logit_softcapping\": null, \"bos_token_id\": 2, \"eos_token_id\": 1,"
    "\"final_logit_softcapping\": null, \"head_dim\": 256, \"hidden_activation\": \"gelu_pytorch_tanh\","
    "\"hidden_size\": 640, \"initializer_range\": 0.02, \"intermediate_size\": 2048,"
    "\"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"sliding_attention\","
    "\"sliding_attention\", \"full_attention\", \"sliding_attention\", \"sliding_attention\", \"sliding_attention\","
    "\"sliding_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"sliding_attention\","
    "\"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"full_attention\"],"
    "\"max_position_embeddings\": 32768, \"model_type\": \"gemma3_text\", \"num_attention_heads\": 4,"
    "\"num_hidden_layers\": 18, \"num_key_value_heads\": 1, \"pad_token_id\": 0, \"query_pre_attn_scalar\": 256,"
    "\"rms_norm_eps\": 1e-06, \"rope_local_base_freq\": 10000.0, \"rope_scaling\": null, \"rope_theta\": 1000000.0,"
    "\"sliding_window\": 512, \"torch_dtype\": \"bfloat16\", \"use_bidirectional_attention\": false,"
    "\"use_cache\": true, \"vocab_size\": 262144}";

static void test_gemma_config_read_write_round_trip(void) {
  ct_model_config c;
  CHECK_OK(ct_hf_config_read(&c, write_file("config.json", cfg_270m)));
  CHECK(c.gemma && c.qk_norm && !c.qkv_bias && c.tie_word_embeddings);  // tied by default for Gemma
  CHECK(c.hidden_size == 640 && c.num_layers == 18 && c.num_heads == 4 && c.num_kv_heads == 1 && c.head_dim == 256);
  CHECK(c.sliding_window == 512 && c.query_pre_attn_scalar == 256 && c.rope_local_theta == 10000 &&
        c.rope_theta == 1e6f && c.attn_softcap == 0 && c.rope_type == 0);
  for (int l = 0; l < 18; l++) CHECK(ct_layer_window(&c, l) == ((l + 1) % 6 ? 512 : 0));
  CHECK(fabsf(ct_attn_scale(&c) - 0.0625f) == 0);
  CHECK(ct_embed_scale(&c) == (float)sqrt(640.0));
  // written back and read again: the same config
  c.attn_softcap = 50;
  c.rope_type = 2;
  c.rope_factor = 8;
  char path[512];
  snprintf(path, sizeof path, "%s/out.json", scratch_dir);
  CHECK_OK(ct_hf_config_write(&c, path, "float32", NULL));
  ct_model_config d;
  CHECK_OK(ct_hf_config_read(&d, path));
  CHECK(!memcmp(&c, &d, sizeof c));
  FILE *f = fopen(path, "r");
  char text[8192] = "";
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = 0;
  fclose(f);
  CHECK(strstr(text, "\"Gemma3ForCausalLM\"") && strstr(text, "\"gelu_pytorch_tanh\"") &&
        strstr(text, "\"sliding_window_pattern\": 6") && strstr(text, "\"model_type\": \"gemma3_text\""));
}

// No layer_types: transformers' rule, layer l full when (l + 1) % sliding_window_pattern == 0.
static void test_gemma_config_sliding_window_pattern(void) {
  ct_model_config c;
  CHECK_OK(ct_hf_config_read(&c, write_file("config.json",
      "{\"model_type\": \"gemma3_text\", \"vocab_size\": 10, \"hidden_size\": 8, \"intermediate_size\": 8,"
      "\"num_hidden_layers\": 7, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 4,"
      "\"sliding_window\": 16, \"sliding_window_pattern\": 3}")));
  for (int l = 0; l < 7; l++) CHECK(ct_layer_window(&c, l) == ((l + 1) % 3 ? 16 : 0));
  CHECK(c.query_pre_attn_scalar == 256 && c.rope_local_theta == 10000 && c.rope_theta == 1e6f);
}

static void refuses(const char *json, const char *needle) {
  ct_model_config c;
  int rc = ct_hf_config_read(&c, write_file("config.json", json));
  CHECK(rc != 0);
  CHECK(strstr(ct_last_error(), needle) != NULL);
  if (!strstr(ct_last_error(), needle)) fprintf(stderr, "  got: %s\n", ct_last_error());
}

#define BASE "\"model_type\": \"gemma3_text\", \"vocab_size\": 10, \"hidden_size\": 8, \"intermediate_size\": 8," \
             "\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 4"

static void test_gemma_config_refusals_name_the_key(void) {
  refuses("{" BASE ", \"final_logit_softcapping\": 30.0}", "final_logit_softcapping");
  refuses("{" BASE ", \"hidden_activation\": \"silu\"}", "hidden_activation 'silu'");
  refuses("{" BASE ", \"layer_types\": [\"full_attention\"]}", "layer_types");
  refuses("{" BASE ", \"layer_types\": [\"full_attention\", \"chunked\"]}", "layer_types[1] 'chunked'");
  refuses("{" BASE ", \"use_bidirectional_attention\": true}", "use_bidirectional_attention");
  refuses("{" BASE ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2}}", "rope_scaling type 'yarn'");
  refuses("{\"model_type\": \"llama\", \"vocab_size\": 10, \"hidden_size\": 8, \"intermediate_size\": 8,"
          "\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"attn_logit_softcapping\": 50}",
          "attn_logit_softcapping");
  refuses("{" BASE ", \"query_pre_attn_scalar\": 0}", "query_pre_attn_scalar");
  refuses("{" BASE ", \"query_pre_attn_scalar\": \"256\"}", "query_pre_attn_scalar");
  refuses("{" BASE ", \"sliding_window\": -1}", "sliding_window");
  refuses("{" BASE ", \"sliding_window\": 1000000000}", "sliding_window");
  refuses("{" BASE ", \"sliding_window\": 4, \"rope_local_base_freq\": 0}", "rope_local_base_freq");
  refuses("{" BASE ", \"sliding_window_pattern\": 0}", "sliding_window_pattern");
  refuses("{" BASE ", \"rope_parameters\": {\"sliding_attention\": {\"rope_theta\": \"x\"}}}",
          "rope_parameters.sliding_attention.rope_theta");
  refuses("{" BASE ", \"num_hidden_layers\": 100000}", "num_hidden_layers");
}

// transformers 5 writes Gemma 3's RoPE as rope_parameters, one per layer type, with no
// rope_theta or rope_local_base_freq keys: both bases and the full layers' scaling are read.
static void test_gemma_config_reads_rope_parameters_per_layer_type(void) {
  ct_model_config c;
  CHECK_OK(ct_hf_config_read(&c, write_file("config.json",
      "{" BASE ", \"sliding_window\": 4, \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"linear\", "
      "\"factor\": 8.0, \"rope_theta\": 1000000.0}, \"sliding_attention\": {\"rope_type\": \"default\", "
      "\"rope_theta\": 10000.0}}}")));
  CHECK(c.rope_theta == 1e6f && c.rope_local_theta == 1e4f && c.rope_type == 2 && c.rope_factor == 8);
  CHECK_OK(ct_hf_config_read(&c, write_file("config.json",
      "{" BASE ", \"sliding_window\": 4, \"rope_theta\": 10.0, \"rope_parameters\": {\"full_attention\": "
      "{\"rope_type\": \"default\", \"rope_theta\": 50000.0}, \"sliding_attention\": {\"rope_type\": "
      "\"default\", \"rope_theta\": 500.0}}}")));
  CHECK(c.rope_theta == 5e4f && c.rope_local_theta == 500 && c.rope_type == 0);
  refuses("{" BASE ", \"rope_parameters\": {\"sliding_attention\": {\"rope_type\": \"linear\", \"factor\": 2}}}",
          "rope_parameters.sliding_attention");
}

int main(int argc, char **argv) {
  ct_blas_init(argc, argv);
  ct_pool_init(2);
  if (scratch_make("/tmp/test_gemma.XXXXXX")) return 1;
  RUN(test_gemma_sliding_window_both_rope_bases_matches_float64_reference);
  RUN(test_gemma_attn_softcap_untied_linear_rope_matches_float64_reference);
  RUN(test_gemma_window_changes_the_loss);
  RUN(test_gemma_engine_ring_decode_matches_training_forward);
  RUN(test_gemma_config_read_write_round_trip);
  RUN(test_gemma_config_sliding_window_pattern);
  RUN(test_gemma_config_refusals_name_the_key);
  RUN(test_gemma_config_reads_rope_parameters_per_layer_type);
  if (scratch_remove()) return 1;
  return test_summary();
}
