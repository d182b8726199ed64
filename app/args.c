// args: key=VALUE arguments (args.h). No checking beyond the key: a command that must reject
// unknown keys does it itself (ctune-ckpt's ckpt_check_args).
#include "args.h"

#include <stdlib.h>
#include <string.h>

const char *ct_args_str(int argc, char **argv, const char *key, const char *def) {
  size_t n = strlen(key);
  for (int i = 1; i < argc; i++)
    if (strncmp(argv[i], key, n) == 0 && argv[i][n] == '=') return argv[i] + n + 1;
  return def;
}

long ct_args_long(int argc, char **argv, const char *key, long def) {
  const char *v = ct_args_str(argc, argv, key, NULL);
  return v ? atol(v) : def;
}
