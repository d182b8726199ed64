// ctune-ckpt: checkpoint and model-directory tools.
//
//   bin/ctune-ckpt merge-lora base=DIR adapter=DIR out=DIR [dtype=float32|bfloat16]
//
// merge-lora writes a plain Hugging Face model equal to base + adapter (W + s·B·A, and the
// adapter's modules_to_save in place of the base's): config.json, model.safetensors and
// the tokenizer files (the adapter directory's, else the base's).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "error.h"
#include "fs.h"
#include "hf.h"
#include "lora.h"
#include "matmul.h"
#include "pool.h"
#include "tokenizer.h"

static int usage(FILE *f) {
  fprintf(f, "usage: ctune-ckpt merge-lora base=DIR adapter=DIR out=DIR [dtype=float32|bfloat16]\n");
  return f == stdout ? 0 : 2;  // --help: exit 0
}

static __attribute__((noreturn)) void die(int code) {
  fprintf(stderr, "ctune-ckpt: %s\n", ct_last_error());
  exit(code);
}

// value of key=... among the arguments, or NULL
static const char *arg(int argc, char **argv, const char *key) {
  size_t n = strlen(key);
  for (int i = 2; i < argc; i++)
    if (!strncmp(argv[i], key, n) && argv[i][n] == '=') return argv[i] + n + 1;
  return NULL;
}

static int merge_lora(int argc, char **argv) {
  for (int i = 2; i < argc; i++) {
    const char *known[] = {"base=", "adapter=", "out=", "dtype="};
    bool ok = false;
    for (int k = 0; k < 4; k++) ok |= !strncmp(argv[i], known[k], strlen(known[k]));
    if (!ok) {
      fprintf(stderr, "ctune-ckpt: merge-lora: unknown argument '%s'\n", argv[i]);
      return usage(stderr);
    }
  }
  const char *base = arg(argc, argv, "base"), *adapter = arg(argc, argv, "adapter"), *out = arg(argc, argv, "out");
  const char *dtype = arg(argc, argv, "dtype");
  if (!base || !adapter || !out) return usage(stderr);
  if (dtype && strcmp(dtype, "float32") && strcmp(dtype, "bfloat16")) {
    fprintf(stderr, "ctune-ckpt: merge-lora: dtype '%s' is not float32 or bfloat16\n", dtype);
    return 2;
  }
  bool bf16 = dtype && !strcmp(dtype, "bfloat16");
  ct_model m;
  ct_lora lo;
  ct_tokenizer *tok;
  char p[CT_PATH_MAX];
  if (ct_model_load(&m, base, 1)) die(1);
  if (ct_lora_load(&lo, adapter, &m.cfg) || ct_lora_merge(&lo, &m)) die(1);
  const char *tdir = access((ct_path_join(p, sizeof p, adapter, "tokenizer.json"), p), R_OK) == 0 ? adapter : base;
  const float *bufs[] = {m.params};
  if (ct_mkdirs(out) || ct_tokenizer_load(&tok, tdir) || ct_path_join(p, sizeof p, out, "config.json") ||
      ct_hf_config_write(&m.cfg, p, bf16 ? "bfloat16" : "float32") ||
      ct_path_join(p, sizeof p, out, "model.safetensors") ||
      ct_save_tensors(&ct_model_tensors(&m), 1, bufs, NULL, p, bf16 ? CT_DT_BF16 : CT_DT_F32) ||
      ct_tokenizer_save(tok, out))
    die(1);
  fprintf(stderr, "ctune-ckpt: %s + %s (rank %d, %s) merged into %s\n", base, adapter, lo.cfg.r,
          lo.cfg.save_embed || lo.cfg.save_head ? "with modules_to_save" : "adapters only", out);
  ct_tokenizer_free(tok);
  ct_lora_free(&lo);
  ct_model_free(&m);
  return 0;
}

int main(int argc, char **argv) {
  if (ct_config_help_asked(argc, argv)) return usage(stdout);
  ct_blas_init(argc, argv);
  if (argc < 2) return usage(stderr);
  if (ct_pool_init(0)) die(1);
  int rc = !strcmp(argv[1], "merge-lora") ? merge_lora(argc, argv) : usage(stderr);
  ct_pool_free();
  return rc;
}
