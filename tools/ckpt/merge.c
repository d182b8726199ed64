// ctune-ckpt merge-lora: base + adapter (W + s·B·A, and modules_to_save) written as a
// plain Hugging Face model; also the merged model gguf adapter= exports.
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "ckpt.h"
#include "error.h"
#include "fs.h"
#include "hf.h"
#include "lora.h"
#include "tokenizer.h"

// base + adapter merged into m (loaded here)
int ckpt_load_merged(ct_model *m, ct_lora *lo, const char *base, const char *adapter) {
  int rc = ct_model_load(m, base, 1);
  if (rc) return rc;
  if ((rc = ct_lora_load(lo, adapter, &m->cfg))) return ct_model_free(m), rc;
  if ((rc = ct_lora_merge(lo, m))) ct_lora_free(lo), ct_model_free(m);
  return rc;
}

int ckpt_merge_lora(int argc, char **argv) {
  static const char *const known[] = {"base=", "adapter=", "out=", "dtype=", NULL};
  const char *v[4];
  if (ckpt_args(argc, argv, known, 0, v)) return 2;
  const char *base = v[0], *adapter = v[1], *out = v[2], *dtype = v[3];
  if (!base || !adapter || !out) return ckpt_usage(stderr);
  if (dtype && strcmp(dtype, "float32") && strcmp(dtype, "bfloat16")) {
    fprintf(stderr, "ctune-ckpt: merge-lora: dtype '%s' is not float32 or bfloat16\n", dtype);
    return 2;
  }
  bool bf16 = dtype && !strcmp(dtype, "bfloat16");
  ct_model m;
  ct_lora lo;
  ct_tokenizer *tok;
  char p[CT_PATH_MAX];
  if (ckpt_load_merged(&m, &lo, base, adapter)) ckpt_die(1);
  const char *tdir = ct_lora_tokenizer_dir(adapter, base);
  const float *bufs[] = {m.params};
  if (ct_mkdirs(out) || ct_tokenizer_load(&tok, tdir) || ct_path_join(p, sizeof p, out, "config.json") ||
      ct_hf_config_write(&m.cfg, p, bf16 ? "bfloat16" : "float32", base) ||
      ct_path_join(p, sizeof p, out, "model.safetensors") ||
      ct_save_tensors(&ct_model_tensors(&m), 1, bufs, NULL, p, bf16 ? CT_DT_BF16 : CT_DT_F32) ||
      ct_tokenizer_save(tok, out))
    ckpt_die(1);
  fprintf(stderr, "ctune-ckpt: %s + %s (rank %d, %s) merged into %s\n", base, adapter, lo.cfg.r,
          lo.cfg.save_embed || lo.cfg.save_head ? "with modules_to_save" : "adapters only", out);
  ct_tokenizer_free(tok);
  ct_lora_free(&lo);
  ct_model_free(&m);
  return 0;
}
