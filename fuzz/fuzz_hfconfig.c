// Fuzzes a model's config.json through the model's set-up (nn/hf.c, nn/model.c). The input
// is config.json in a directory that also holds a small llama's model.safetensors (vocab
// 17, hidden 8, 2 layers, 2 heads, 1 kv head, head_dim 4, intermediate 12, tied).
// What ct_hf_config_read accepts must lay out in little memory (its sizes are bounded:
// 10^9 layers once took 9 GB here) and fill RoPE tables for two positions (head_dim 10^9
// once overflowed the stack there); what ct_model_read_config accepts (config.json and
// the weights' headers agree) must load, its layout that of the weights.
#include "fuzz.h"
#include "hf.h"
#include "pool.h"

static char model_dir[192];

static void make_model(void) {
  snprintf(model_dir, sizeof model_dir, "%s", fuzz_dir());
  ct_model_config c = {.model_type = "llama", .vocab_size = 17, .hidden_size = 8, .intermediate_size = 12,
                       .num_layers = 2, .num_heads = 2, .num_kv_heads = 1, .head_dim = 4,
                       .max_position_embeddings = 64, .rope_theta = 10000, .rms_norm_eps = 1e-6f,
                       .tie_word_embeddings = true, .bos_token_id = 1, .eos_token_id = 2, .pad_token_id = -1};
  ct_model m;
  char path[256];
  snprintf(path, sizeof path, "%s/model.safetensors", model_dir);
  if (ct_model_init(&m, &c, 4)) abort();
  ct_model_init_random(&m, 1, 0.02f);
  const float *bufs[] = {m.params};
  if (ct_save_tensors(&ct_model_tensors(&m), 1, bufs, NULL, path, CT_DT_F32)) abort();
  ct_model_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!model_dir[0]) {
    ct_pool_init(1);
    make_model();
  }
  const char *path = fuzz_write("config.json", data, size);
  ct_model_config c;
  fuzz_clear_error();
  int rc = ct_hf_config_read(&c, path);
  fuzz_check_error(rc, "ct_hf_config_read");
  if (rc) return 0;
  ct_model lay;
  if (ct_model_layout(&lay, &c)) abort();  // read, so consistent
  if (lay.n_tensors > CT_MAX_LAYERS * 16 + 8 || lay.n_floats <= 0) abort();
  ct_model_free(&lay);
  float cos_t[CT_MAX_HEAD_DIM], sin_t[CT_MAX_HEAD_DIM];  // (2, head_dim / 2)
  ct_rope_fill(&c, 2, cos_t, sin_t);
  if (cos_t[0] != 1 || sin_t[0] != 0) abort();  // position 0: no rotation
  fuzz_clear_error();
  rc = ct_model_read_config(&c, model_dir);
  fuzz_check_error(rc, "ct_model_read_config");
  if (rc) return 0;
  ct_model m;
  fuzz_clear_error();
  rc = ct_model_load(&m, model_dir, 4);  // the weights' 20 tensors, and nothing else
  if (rc || m.n_tensors != 20) {
    fprintf(stderr, "fuzz: a config.json the weights agree with does not load: %s\n", ct_last_error());
    abort();
  }
  ct_model_free(&m);
  return 0;
}
