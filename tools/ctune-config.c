// ctune-config: prints configs/base.yml, or the configuration a trainer would resolve.
//
//   ctune-config base > configs/base.yml
//   ctune-config resolve sft configs/sft.yml learning_rate=1e-5 model.hidden_size=64
//   ctune-config keys
//
// Exit status: 0 ok, 2 configuration error (the one-line message on stderr), 1 other.
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "error.h"

static int usage(FILE *f) {
  fputs("usage: ctune-config base                 print configs/base.yml\n"
        "       ctune-config keys                 list every key\n"
        "       ctune-config resolve <sft|dpo|grpo|distill> [file.yml] [key=value ...]\n"
        "                                         print the resolved configuration\n",
        f);
  return f == stdout ? 0 : 2;  // --help: exit 0
}

int main(int argc, char **argv) {
  if (ct_config_help_asked(argc, argv)) return usage(stdout);
  if (argc < 2) return usage(stderr);
  if (!strcmp(argv[1], "base") && argc == 2) {
    if (ct_config_write_base_yaml(stdout) || fflush(stdout)) {
      fprintf(stderr, "ctune-config: %s\n", ct_last_error());
      return 1;
    }
    return 0;
  }
  if (!strcmp(argv[1], "keys") && argc == 2) {
    for (int i = 0; i < ct_config_num_keys(); i++) puts(ct_config_key_name(i));
    return 0;
  }
  if (!strcmp(argv[1], "resolve") && argc >= 3) {
    ct_trainer_kind t;
    if (ct_trainer_from_name(argv[2], &t)) {
      fprintf(stderr, "ctune-config: %s\n", ct_last_error());
      return 2;
    }
    // argv + 2: the trainer name stands where a trainer's own argv[0] would.
    ct_config c;
    int rc = ct_config_from_args(&c, t, argc - 2, argv + 2);
    if (rc) {
      fprintf(stderr, "ctune-config: %s\n", ct_last_error());
      return rc == CT_ECONFIG ? 2 : 1;
    }
    rc = ct_config_dump(&c, stdout);
    ct_config_free(&c);
    if (rc || fflush(stdout)) {
      fprintf(stderr, "ctune-config: %s\n", ct_last_error());
      return 1;
    }
    return 0;
  }
  return usage(stderr);
}
