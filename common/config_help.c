// config_help: what `bin/<trainer> --help` prints, from the key table: the usage, the
// keys specific to the trainer with their defaults and the first sentence of their
// comment; and the mains' test for --help.
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "config_internal.h"
#include "error.h"

static const char *const USAGE[NKINDS] = {
    "usage: sft [config.yml] [key=value ...]\n"
    "Supervised fine-tuning on TRL rows: text, prompt/completion or messages.\n",
    "usage: dpo [config.yml] [key=value ...]\n"
    "Preference tuning (DPO, IPO, SimPO, RPO, ...) on prompt/chosen/rejected rows.\n",
    "usage: grpo [config.yml] [key=value ...]\n"
    "Reinforcement learning with rewards (GRPO, DAPO, Dr. GRPO) on prompt rows.\n",
    "usage: distill [precompute] [config.yml] [key=value ...]\n"
    "Knowledge distillation from teacher_path on SFT rows; `precompute` writes the teacher's\n"
    "top-k logits to teacher_logits_path for offline training.\n",
    "usage: sampler generate|score|accuracy|bench [config.yml] [key=value ...]\n"
    "  generate: model_path=DIR and prompt=TEXT or prompts_path=FILE.jsonl\n"
    "  score:    model_path=DIR data=FILE.jsonl (prompt/completion rows): log-probs\n"
    "  accuracy: model_path=DIR data=FILE.jsonl: completions == 'completion' (temperature=0: greedy)\n"
    "  bench:    speed of prefill and decode, fp32 and int8\n"
    "config.yml may be a trainer's yml or a run's config.yml: the keys the sampler uses are\n"
    "taken, the others named and skipped.\n",
    "usage: reward [score|eval] [config.yml] [key=value ...]\n"
    "Reward-model training (TRL's RewardTrainer) on prompt?/chosen/rejected(/margin) rows.\n"
    "  score: model_path=RM data=FILE.jsonl (prompt + completion, or messages): {row, reward} lines\n"
    "  eval:  model_path=RM eval_dataset_path=PAIRS.jsonl: held-out pair accuracy\n",
};

// The keys --help lists for t: those not every trainer takes, or with a default of t's own.
static int help_lists(const key_def *k, ct_trainer_kind t) {
  int ti = config_trainer_index(t);
  if (!(k->trainers & (unsigned)t) || k->type == K_INCLUDE || is_model_key(k)) return 0;
  return t == CT_TRAINER_SAMPLER || (k->trainers & CT_TRAINER_ALL) != CT_TRAINER_ALL || k->per_trainer[ti] ||
         (k->required & t);
}

int ct_config_write_help(FILE *f, ct_trainer_kind t) {
  int ti = config_trainer_index(t);
  if (ti < 0) return ct_set_error(CT_EINVAL, "ct_config_write_help: %d is not one trainer", (int)t);
  ct_config d;
  int rc = ct_config_init(&d, t);
  if (rc) return rc;
  fprintf(f, "%s\nKeys of %s (key=default: what it does; required keys first):\n", USAGE[ti],
          config_trainer_names[ti]);
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < config_nkeys; i++) {
      const key_def *k = &config_keys[i];
      if (!help_lists(k, t) || (pass == 0) != ((k->required & t) != 0)) continue;
      fprintf(f, "  %s=", k->name);
      config_write_value(f, &d, k);
      const char *dot = strstr(k->comment, ". ");  // the first sentence
      int len = dot ? (int)(dot - k->comment) + 1 : (int)strlen(k->comment);
      fprintf(f, "%s\n      %.*s\n", pass ? "" : "  (required)", len, k->comment);
    }
  if (t != CT_TRAINER_SAMPLER)
    fputs("\nEvery other key (model_path, max_steps, per_device_train_batch_size, the model: block,\n"
          "...) is listed with its default and meaning in configs/base.yml, or run\n"
          "`bin/ctune-config base`.", f);
  else
    fputs("\nThe full descriptions: configs/base.yml (Sampler section), or `bin/ctune-config base`.", f);
  fputs(" Values are YAML where quoted or a list:\noutput_dir=\"my out\", 'stop=[\"\\n\", \"a,b\"]'.\n", f);
  ct_config_free(&d);
  return ferror(f) ? ct_set_error(CT_EIO, "writing the help: %s", strerror(errno)) : 0;
}

int ct_config_help_asked(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
  return 0;
}

int ct_config_usage(ct_trainer_kind t, int argc, char **argv) {
  if (ct_config_help_asked(argc, argv)) return ct_config_write_help(stdout, t) || fflush(stdout) ? 1 : 0;
  if (argc < 2) return ct_config_write_help(stderr, t) ? 1 : 2;
  return -1;
}
