// ctune-ckpt: checkpoint and model-directory tools.
//
//   bin/ctune-ckpt merge-lora base=DIR adapter=DIR out=DIR [dtype=float32|bfloat16]
//   bin/ctune-ckpt gguf in=DIR out=FILE.gguf [type=f32|f16|bf16|q8_0] [adapter=DIR] [name=NAME]
//
// merge-lora writes a plain Hugging Face model equal to base + adapter (W + s·B·A, and the
// adapter's modules_to_save in place of the base's): config.json, model.safetensors and
// the tokenizer files (the adapter directory's, else the base's).
//
// gguf writes a model directory or checkpoint (in=, optionally merged with a LoRA adapter
// on the way) as one GGUF file llama.cpp and Ollama load: llama.cpp's architecture
// metadata and tensor names (nn/gguf.h), and the tokenizer (tokenizer.json's vocabulary,
// merges and special tokens; tokenizer_config.json's chat template). type (default f16)
// is how matrices are stored; norms and biases stay f32. Without an adapter the tensors
// stream from the safetensors files one at a time.
//
//   bin/ctune-ckpt inspect DIR|FILE
//   bin/ctune-ckpt convert in=DIR out=DIR dtype=bfloat16|float16|float32
//   bin/ctune-ckpt compare a=DIR|FILE b=DIR|FILE [rtol=1e-5] [atol=1e-8]
//   bin/ctune-ckpt shard in=DIR out=DIR [max_shard_size=5GB]
//
// inspect lists each tensor (dtype, shape, bytes), the files' metadata and the parameter
// count (a training checkpoint's optimizer state is named, not counted). convert writes
// the model's floating-point tensors as dtype (config.json's torch_dtype follows) and the
// model's other files; from a training checkpoint it leaves the training state out, which
// gives a plain Hugging Face model. compare prints each tensor's largest absolute and
// relative difference and exits 1 when a tensor is missing, has another shape, or has an
// element past atol + rtol·|b| (numpy.allclose's rule and defaults); 2 on bad input.
// shard splits the tensors into model-0000N-of-0000M.safetensors files of at most
// max_shard_size ("2GB" = 2·10^9 bytes, "2GiB" = 2^31, as transformers reads them) plus
// model.safetensors.index.json, as save_pretrained does (one shard: model.safetensors).
//
// One file per sub-command (merge.c, to_gguf.c, inspect.c, convert.c, compare.c, shard.c);
// what they share is ckpt.h's.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "ckpt.h"
#include "config.h"
#include "error.h"
#include "matmul.h"
#include "pool.h"

int ckpt_usage(FILE *f) {
  fprintf(f, "usage: ctune-ckpt merge-lora base=DIR adapter=DIR out=DIR [dtype=float32|bfloat16]\n"
             "       ctune-ckpt gguf in=DIR out=FILE.gguf [type=f32|f16|bf16|q8_0] [adapter=DIR] [name=NAME]\n"
             "       ctune-ckpt inspect DIR|FILE\n"
             "       ctune-ckpt convert in=DIR out=DIR dtype=bfloat16|float16|float32\n"
             "       ctune-ckpt compare a=DIR|FILE b=DIR|FILE [rtol=1e-5] [atol=1e-8]\n"
             "       ctune-ckpt shard in=DIR out=DIR [max_shard_size=5GB]\n");
  return f == stdout ? 0 : 2;  // --help: exit 0
}

__attribute__((noreturn)) void ckpt_die(int code) {
  fprintf(stderr, "ctune-ckpt: %s\n", ct_last_error());
  exit(code);
}

// value of key=... among the sub-command's arguments, or NULL
static const char *ckpt_arg(int argc, char **argv, const char *key) {
  return ct_args_str(argc - 1, argv + 1, key, NULL);  // argv[1] is the command
}

// 0 when every argument is one of the keys (NULL-terminated, "key="); else a usage error
static int ckpt_check_args(int argc, char **argv, const char *const *known) {
  for (int i = 2; i < argc; i++) {
    bool ok = false;
    for (int k = 0; known[k]; k++) ok |= !strncmp(argv[i], known[k], strlen(known[k]));
    if (!ok) {
      fprintf(stderr, "ctune-ckpt: %s: unknown argument '%s'\n", argv[1], argv[i]);
      return ckpt_usage(stderr);
    }
  }
  return 0;
}

int ckpt_args(int argc, char **argv, const char *const *known, int required, const char **v) {
  if (ckpt_check_args(argc, argv, known)) return 2;
  for (int k = 0; known[k]; k++) {
    char key[64];
    snprintf(key, sizeof key, "%.*s", (int)strlen(known[k]) - 1, known[k]);  // without the '='
    v[k] = ckpt_arg(argc, argv, key);
    if (k < required && !v[k]) {
      fprintf(stderr, "ctune-ckpt: %s: %s= is required\n", argv[1], key);
      return ckpt_usage(stderr);
    }
  }
  return 0;
}

static const struct {
  const char *name;
  int (*run)(int argc, char **argv);
} commands[] = {
    {"merge-lora", ckpt_merge_lora}, {"gguf", ckpt_gguf},       {"inspect", ckpt_inspect},
    {"convert", ckpt_convert},       {"compare", ckpt_compare}, {"shard", ckpt_shard},
};

int main(int argc, char **argv) {
  if (ct_config_help_asked(argc, argv)) return ckpt_usage(stdout);
  ct_blas_init(argc, argv);
  if (argc < 2) return ckpt_usage(stderr);
  if (ct_pool_init(0) || ct_blas_room(ct_pool_threads(), 0, NULL, NULL)) ckpt_die(1);
  int (*run)(int argc, char **argv) = NULL;
  for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++)
    if (!strcmp(argv[1], commands[k].name)) run = commands[k].run;
  int rc = run ? run(argc, argv) : ckpt_usage(stderr);
  ct_pool_free();
  return rc;
}
