// Tests for common/config: resolution order, base_config chains, every error case,
// round trips, origins, and that configs/base.yml and configs/sft.yml match the table.
// Run from the repository root (or pass the path of configs/base.yml as argv[1]).
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "optim.h"
#include "error.h"
#include "scratch.h"
#include "test.h"

// ---------------------------------------------------------------------------------
// Scratch files under one mkdtemp directory, removed at the end
// ---------------------------------------------------------------------------------

static char *made[256];  // files and directories created, in order
static int n_made;
static const char *base_yml_path = "configs/base.yml";
static const char *sft_yml_path = "configs/sft.yml";

// Absolute path of `rel` inside the scratch directory (8 rotating buffers).
static const char *tpath(const char *rel) {
  static char bufs[8][512];
  static int next;
  char *b = bufs[next++ % 8];
  snprintf(b, sizeof bufs[0], "%s/%s", scratch_dir, rel);
  return b;
}

static void remember(const char *path) {
  if (n_made < 256) made[n_made++] = strdup(path);
}

// Writes `text` to scratch_dir/rel, creating directories on the way; returns the path.
static const char *put(const char *rel, const char *text) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s", tpath(rel));
  for (char *p = dir + strlen(scratch_dir) + 1; (p = strchr(p, '/')); p++) {
    *p = 0;
    if (mkdir(dir, 0700) == 0) remember(dir);
    *p = '/';
  }
  const char *path = tpath(rel);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
  int known = 0;
  for (int i = 0; i < n_made; i++) known |= !strcmp(made[i], path);
  if (!known) remember(path);
  return path;
}

static void remove_scratch(void) {
  for (int i = n_made - 1; i >= 0; i--) {
    if (remove(made[i]) != 0) fprintf(stderr, "cannot remove %s\n", made[i]);
    free(made[i]);
  }
  if (rmdir(scratch_dir) != 0) fprintf(stderr, "cannot remove %s\n", scratch_dir);
}

// ---------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------

// rc must be CT_ECONFIG and the one-line message must contain every needle.
#define CHECK_ERR(expr, ...) \
  check_err_((expr), __LINE__, #expr, (const char *const[]){__VA_ARGS__, NULL})
static void check_err_(int rc, int line, const char *expr, const char *const *needles) {
  const char *msg = ct_last_error();
  int ok = rc == CT_ECONFIG && !strchr(msg, '\n');
  for (const char *const *n = needles; *n; n++) ok &= strstr(msg, *n) != NULL;
  test_checks++;
  if (!ok) {
    test_failures++;
    fprintf(stderr, "%s:%d: %s: %s returned %d with message \"%s\"; wanted %d and", __FILE__,
            line, test_current, expr, rc, msg, CT_ECONFIG);
    for (const char *const *n = needles; *n; n++) fprintf(stderr, " \"%s\"", *n);
    fputc('\n', stderr);
  }
}

#define CHECK_STR(a, b)                                                                \
  do {                                                                                 \
    const char *a_ = (a), *b_ = (b);                                                   \
    test_checks++;                                                                     \
    if (!a_ || !b_ || strcmp(a_, b_)) {                                                \
      test_failures++;                                                                 \
      fprintf(stderr, "%s:%d: %s: %s is \"%s\", expected \"%s\"\n", __FILE__, __LINE__, \
              test_current, #a, a_ ? a_ : "(null)", b_ ? b_ : "(null)");               \
    }                                                                                  \
  } while (0)

// Identical configs, else name the first key that differs.
#define CHECK_SAME(a, b)                                                                 \
  do {                                                                                   \
    const char *d_ = ct_config_diff((a), (b));                                           \
    test_checks++;                                                                       \
    if (d_) {                                                                            \
      test_failures++;                                                                   \
      fprintf(stderr, "%s:%d: %s: configs differ at '%s'\n", __FILE__, __LINE__,         \
              test_current, d_);                                                         \
    }                                                                                    \
  } while (0)

// ct_config_init(t) then the scratch file `rel`; the caller frees c either way.
static int load(ct_config *c, ct_trainer_kind t, const char *rel) {
  int rc = ct_config_init(c, t);
  return rc ? rc : ct_config_load_file(c, tpath(rel));
}

// Writes `text` as a scratch file, loads it for trainer t, frees; returns the result.
static int load_text(ct_trainer_kind t, const char *text) {
  ct_config c;
  put("t.yml", text);
  int rc = load(&c, t, "t.yml");
  ct_config_free(&c);
  return rc;
}

// ct_config_set on a fresh config for trainer t; returns the result.
static int set_one(ct_trainer_kind t, const char *key, const char *value) {
  ct_config c;
  int rc = ct_config_init(&c, t);
  if (!rc) rc = ct_config_set(&c, key, value, "command line");
  ct_config_free(&c);
  return rc;
}

// "<scratch>/t.yml:<line>", for matching messages.
static const char *at(int line) {
  static char b[600];
  snprintf(b, sizeof b, "%s:%d", tpath("t.yml"), line);
  return b;
}

static char *read_all(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *s = malloc(cap);
  size_t got;
  while ((got = fread(s + n, 1, cap - n - 1, f)) > 0) {
    n += got;
    if (n + 1 == cap) s = realloc(s, cap *= 2);
  }
  fclose(f);
  s[n] = 0;
  return s;
}

static const ct_trainer_kind TRAINERS[4] = {CT_TRAINER_SFT, CT_TRAINER_DPO, CT_TRAINER_GRPO,
                                            CT_TRAINER_DISTILL};

// ---------------------------------------------------------------------------------
// Resolution order
// ---------------------------------------------------------------------------------

static void test_defaults_come_from_the_table_then_the_trainer(void) {
  ct_config c;
  CHECK_OK(ct_config_init(&c, CT_TRAINER_SFT));
  CHECK(c.trainer == CT_TRAINER_SFT);
  CHECK_NEAR(c.learning_rate, 2e-5, 0);
  CHECK(c.seed == 42 && c.max_steps == -1 && c.max_length == 1024);
  CHECK_NEAR(c.num_train_epochs, 3.0, 0);
  CHECK(c.per_device_train_batch_size == 8 && c.per_device_eval_batch_size == 8);
  CHECK(c.gradient_accumulation_steps == 1 && c.warmup_steps == 0);
  CHECK(c.lr_scheduler_type == CT_LR_LINEAR && c.save_dtype == CT_DTYPE_FLOAT32);
  CHECK_NEAR(c.adam_beta1, 0.9, 0);
  CHECK_NEAR(c.adam_beta2, 0.999, 0);
  CHECK_NEAR(c.adam_epsilon, 1e-8, 0);
  CHECK_NEAR(c.max_grad_norm, 1.0, 0);
  CHECK(!c.packing && c.completion_only_loss && !c.assistant_only_loss);
  CHECK(c.shuffle_dataset && !c.skip_bad_rows);
  CHECK(c.logging_steps == 10 && c.save_steps == 500 && c.save_total_limit == 0);
  CHECK(c.eval_steps == 0 && c.num_vocab_tiling == 1 && c.num_threads == 0);
  CHECK_STR(c.output_dir, "out");
  CHECK_STR(c.model_path, "");
  CHECK_STR(c.dataset_text_field, "text");
  CHECK(c.loss_type.n == 1 && !strcmp(c.loss_type.v[0], "sigmoid"));
  CHECK(c.loss_weights.n == 0);
  CHECK(c.model.model_type == CT_MODEL_LLAMA && c.model.hidden_size == 256);
  CHECK(c.model.intermediate_size == 768 && c.model.num_hidden_layers == 4);
  CHECK(c.model.num_attention_heads == 4 && c.model.num_key_value_heads == 0);
  CHECK(c.model.head_dim == 0 && c.model.vocab_size == 0);
  CHECK(c.model.max_position_embeddings == 2048);
  CHECK_NEAR(c.model.rope_theta, 10000.0, 0);
  CHECK_NEAR(c.model.rms_norm_eps, 1e-6, 0);
  CHECK_NEAR(c.model.initializer_range, 0.02, 0);
  CHECK(c.model.tie_word_embeddings && !c.model.attention_bias && !c.model.use_qk_norm);
  CHECK(c.model.set_mask == 0);
  CHECK_STR(ct_config_origin(&c, "learning_rate"), "default");
  CHECK_STR(ct_config_origin(&c, "model.hidden_size"), "default");
  CHECK(ct_config_origin(&c, "no_such_key") == NULL);
  ct_config_free(&c);

  const double lr[4] = {2e-5, 1e-6, 1e-6, 2e-5};
  for (int i = 0; i < 4; i++) {
    CHECK_OK(ct_config_init(&c, TRAINERS[i]));
    CHECK_NEAR(c.learning_rate, lr[i], 0);
    ct_config_free(&c);
  }
  CHECK(ct_config_init(&c, (ct_trainer_kind)3) == CT_EINVAL);
  ct_config_free(&c);
  ct_config_free(&c);  // twice is safe
}

static void test_yml_overrides_defaults(void) {
  ct_config c, d;
  put("t.yml",
      "# a comment\n"
      "learning_rate: 3e-4\n"
      "max_steps: 100\n"
      "output_dir: runs/a\n"
      "lr_scheduler_type: cosine\n"
      "packing: yes\n"
      "model_path: \"/models/My Model\"\n"
      "warmup_ratio: 0.1\n");
  CHECK_OK(load(&c, CT_TRAINER_SFT, "t.yml"));
  CHECK_NEAR(c.learning_rate, 3e-4, 0);
  CHECK(c.max_steps == 100 && c.packing == 1 && c.lr_scheduler_type == CT_LR_COSINE);
  CHECK_STR(c.output_dir, "runs/a");
  CHECK_STR(c.model_path, "/models/My Model");
  CHECK_NEAR(c.warmup_ratio, 0.1, 0);
  CHECK(c.seed == 42 && c.max_length == 1024);  // untouched keys keep their defaults
  // Set every changed key back: the config equals the defaults again.
  CHECK_OK(ct_config_init(&d, CT_TRAINER_SFT));
  CHECK(ct_config_diff(&c, &d) != NULL);
  ct_config_free(&c);
  put("t.yml", "learning_rate: 2e-5\nmax_steps: -1\n");
  CHECK_OK(load(&c, CT_TRAINER_SFT, "t.yml"));
  CHECK_SAME(&c, &d);
  ct_config_free(&c);
  ct_config_free(&d);
}

static void test_cli_overrides_yml(void) {
  ct_config c;
  const char *file = put("t.yml", "learning_rate: 3e-4\nmax_steps: 100\noutput_dir: runs/a\n");
  char *argv[] = {"sft", (char *)file, "learning_rate=1e-3", "max_steps=7", "seed=1",
                  "max_steps=8"};
  CHECK_OK(ct_config_from_args(&c, CT_TRAINER_SFT, 6, argv));
  CHECK_NEAR(c.learning_rate, 1e-3, 0);
  CHECK(c.max_steps == 8);  // the last of two overrides wins
  CHECK(c.seed == 1);
  CHECK_STR(c.output_dir, "runs/a");
  CHECK_STR(ct_config_origin(&c, "learning_rate"), "command line");
  CHECK_STR(ct_config_origin(&c, "output_dir"), at(3));
  ct_config_free(&c);
}

static void test_from_args_without_a_file_takes_only_overrides(void) {
  ct_config c;
  char *argv[] = {"dpo", "seed=7", "output_dir=x=y"};
  CHECK_OK(ct_config_from_args(&c, CT_TRAINER_DPO, 3, argv));
  CHECK(c.seed == 7);
  CHECK_STR(c.output_dir, "x=y");  // only the first '=' separates key from value
  CHECK_NEAR(c.learning_rate, 1e-6, 0);
  ct_config_free(&c);
  char *argv0[] = {"grpo"};
  CHECK_OK(ct_config_from_args(&c, CT_TRAINER_GRPO, 1, argv0));
  CHECK(c.trainer == CT_TRAINER_GRPO);
  ct_config_free(&c);
}

static void test_base_config_chain_is_relative_to_each_files_directory(void) {
  ct_config c;
  put("base0.yml", "seed: 1\nmax_steps: 10\noutput_dir: from_base0\n");
  put("dir1/base1.yml", "base_config: ../base0.yml\nmax_steps: 20\nlogging_steps: 5\n");
  // base_config after a key: the base is still loaded first, so this file wins.
  put("dir1/dir2/top.yml", "logging_steps: 7\nbase_config: ../base1.yml\n");
  CHECK_OK(load(&c, CT_TRAINER_SFT, "dir1/dir2/top.yml"));
  CHECK(c.seed == 1);             // from base0
  CHECK(c.max_steps == 20);       // base1 over base0
  CHECK(c.logging_steps == 7);    // top over base1
  CHECK_STR(c.output_dir, "from_base0");
  CHECK(strstr(ct_config_origin(&c, "seed"), "base0.yml:1") != NULL);
  CHECK(strstr(ct_config_origin(&c, "max_steps"), "base1.yml:2") != NULL);
  CHECK(strstr(ct_config_origin(&c, "logging_steps"), "top.yml:1") != NULL);
  ct_config_free(&c);
  // An empty base_config names no file.
  CHECK_OK(load_text(CT_TRAINER_SFT, "base_config: \"\"\nseed: 3\n"));
  CHECK_OK(load_text(CT_TRAINER_SFT, "base_config:\nseed: 3\n"));
}

static void test_base_config_cycle_is_detected(void) {
  put("a.yml", "base_config: b.yml\nseed: 1\n");
  put("b.yml", "seed: 2\nbase_config: a.yml\n");
  ct_config c;
  CHECK_ERR(load(&c, CT_TRAINER_SFT, "a.yml"), "base_config cycle", "b.yml:2", "a.yml -> ");
  ct_config_free(&c);
  CHECK_ERR(load_text(CT_TRAINER_SFT, "base_config: t.yml\n"), "cycle", at(1));
  // Reaching the same file twice without a cycle is no error: a diamond is fine.
  put("d/x.yml", "base_config: ../b0.yml\n");
  put("b0.yml", "seed: 5\n");
  put("d/y.yml", "base_config: x.yml\nmax_steps: 3\n");
  CHECK_OK(load(&c, CT_TRAINER_SFT, "d/y.yml"));
  CHECK(c.seed == 5 && c.max_steps == 3);
  ct_config_free(&c);
}

static void test_model_keys_from_yml_block_and_cli_dots(void) {
  ct_config c;
  const char *file = put("t.yml",
                         "seed: 3\n"
                         "model:\n"
                         "  model_type: qwen2\n"
                         "  hidden_size: 64\n"
                         "  rope_theta: 1e6\n"
                         "model.vocab_size: 300\n");
  char *argv[] = {"sft", (char *)file, "model.num_hidden_layers=2", "model.attention_bias=true"};
  CHECK_OK(ct_config_from_args(&c, CT_TRAINER_SFT, 4, argv));
  CHECK(c.model.model_type == CT_MODEL_QWEN2 && c.model.hidden_size == 64);
  CHECK_NEAR(c.model.rope_theta, 1e6, 0);
  CHECK(c.model.vocab_size == 300 && c.model.num_hidden_layers == 2);
  CHECK(c.model.attention_bias == 1);
  CHECK(c.model.intermediate_size == 768);
  CHECK(CT_MODEL_SPEC_IS_SET(&c.model, model_type));
  CHECK(CT_MODEL_SPEC_IS_SET(&c.model, hidden_size));
  CHECK(CT_MODEL_SPEC_IS_SET(&c.model, rope_theta));
  CHECK(CT_MODEL_SPEC_IS_SET(&c.model, vocab_size));
  CHECK(CT_MODEL_SPEC_IS_SET(&c.model, num_hidden_layers));
  CHECK(CT_MODEL_SPEC_IS_SET(&c.model, attention_bias));
  CHECK(!CT_MODEL_SPEC_IS_SET(&c.model, use_qk_norm));
  CHECK(!CT_MODEL_SPEC_IS_SET(&c.model, tie_word_embeddings));
  CHECK(!CT_MODEL_SPEC_IS_SET(&c.model, intermediate_size));
  CHECK(!CT_MODEL_SPEC_IS_SET(&c.model, initializer_range));
  CHECK(__builtin_popcountll(c.model.set_mask) == 6);
  CHECK_STR(ct_config_origin(&c, "model.hidden_size"), at(4));
  CHECK_STR(ct_config_origin(&c, "model.attention_bias"), "command line");
  ct_config_free(&c);
  // An empty block (every key commented out) is allowed.
  CHECK_OK(load_text(CT_TRAINER_SFT, "model:\n  # hidden_size: 8\nseed: 1\n"));
  CHECK_ERR(load_text(CT_TRAINER_SFT, "seed: 1\nmodel: 5\n"), at(2), "'model'", "block");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "model", "x"), "command line", "'model'", "model.<key>");
}

// ---------------------------------------------------------------------------------
// Errors: each names the key and where it was set
// ---------------------------------------------------------------------------------

static void test_unknown_key_suggests_the_closest_key(void) {
  CHECK_ERR(load_text(CT_TRAINER_SFT, "seed: 1\n\nlearning_rat: 1e-4\n"), at(3),
            ": unknown key 'learning_rat' (did you mean 'learning_rate'?)");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "learning_rat", "1"),
            "command line: unknown key 'learning_rat' (did you mean 'learning_rate'?)");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "model:\n  hidden_sise: 3\n"), at(2),
            "unknown key 'model.hidden_sise' (did you mean 'model.hidden_size'?)");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "hidden_size: 64\n"), at(1),
            "did you mean 'model.hidden_size'?");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "batch_size", "4"),
            "did you mean 'per_device_train_batch_size'?");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "model.num_layers", "4"), "unknown key 'model.num_layers'");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "qqqqqqqqq", "4"), "unknown key 'qqqqqqqqq'");
  CHECK(!strstr(ct_last_error(), "did you mean"));
}

static void test_wrong_type_names_the_key_and_line(void) {
  CHECK_ERR(load_text(CT_TRAINER_SFT, "seed: 1\nmax_steps: ten\n"), at(2),
            "key 'max_steps': expected an integer, got 'ten'");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "packing: maybe\n"), at(1),
            "key 'packing': expected a boolean");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "learning_rate: fast\n"), at(1),
            "key 'learning_rate': expected a number, got 'fast'");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "output_dir: [a, b]\n"), at(1),
            "key 'output_dir': expected a string, got a list");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "max_steps:\n  a: 1\n"), at(1),
            "key 'max_steps': expected an integer, got a mapping");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "max_steps:\n"), at(1), "key 'max_steps'");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "max_steps", "ten"),
            "command line: key 'max_steps': expected an integer, got 'ten'");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "max_steps", ""), "key 'max_steps': expected an integer");
}

static void test_integers_reject_fractions_and_overflow(void) {
  CHECK_ERR(set_one(CT_TRAINER_SFT, "max_steps", "1.5"), "expected an integer, got '1.5'");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "max_steps", "2.0"), "expected an integer");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "max_steps", "1e3"), "expected an integer");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "max_steps", "0x10"), "expected an integer");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "max_steps", "99999999999999999999"),
            "key 'max_steps': 99999999999999999999 is out of range [-1, inf)");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "seed", "2147483648"), "out of range [0, 2147483647]");
  ct_config c;
  CHECK_OK(ct_config_init(&c, CT_TRAINER_SFT));
  CHECK_OK(ct_config_set(&c, "max_steps", "+5", "x"));
  CHECK(c.max_steps == 5);
  CHECK_OK(ct_config_set(&c, "max_steps", " 9223372036854775807 ", "x"));
  CHECK(c.max_steps == INT64_MAX);
  CHECK_OK(ct_config_set(&c, "seed", "2147483647", "x"));
  CHECK(c.seed == 2147483647);
  ct_config_free(&c);
}

static void test_floats_accept_exponents_and_reject_inf_and_nan(void) {
  ct_config c;
  CHECK_OK(ct_config_init(&c, CT_TRAINER_SFT));
  const char *ok[] = {"1e-5", "1E-5", "+2.5e-4", ".5", "3", "1.0e+2"};
  const double want[] = {1e-5, 1e-5, 2.5e-4, 0.5, 3, 100};
  for (int i = 0; i < 6; i++) {
    CHECK_OK(ct_config_set(&c, "learning_rate", ok[i], "x"));
    CHECK_NEAR(c.learning_rate, want[i], 0);
  }
  ct_config_free(&c);
  const char *bad[] = {"inf", ".inf", "nan", ".nan", "NaN", "Infinity"};
  for (int i = 0; i < 6; i++)
    CHECK_ERR(set_one(CT_TRAINER_SFT, "learning_rate", bad[i]), "key 'learning_rate'",
              "finite");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "learning_rate", "0x1p-3"), "expected a number");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "learning_rate", "1e999"),
            "key 'learning_rate': 1e999 is out of range [0, inf)");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "learning_rate", "1e-3x"), "expected a number");
}

static void test_out_of_range_names_the_key_range_and_line(void) {
  CHECK_ERR(load_text(CT_TRAINER_SFT, "seed: 1\nlearning_rate: -1\n"), at(2),
            "key 'learning_rate': -1 is out of range [0, inf)");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "warmup_ratio: 1.5\n"), at(1), "[0, 1]");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "adam_beta1: 1\n"), at(1),
            "key 'adam_beta1': 1 is out of range [0, 1)");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "num_train_epochs: 0\n"), at(1), "(0, inf)");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "max_steps: -2\n"), at(1), "[-1, inf)");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "model:\n  rms_norm_eps: 0\n"), at(2),
            "key 'model.rms_norm_eps': 0 is out of range (0, 1)");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "per_device_train_batch_size", "0"), "command line",
            "[1, 65536]");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "max_length", "1048577"), "[2, 1048576]");
  CHECK_OK(set_one(CT_TRAINER_SFT, "warmup_ratio", "1"));
  CHECK_OK(set_one(CT_TRAINER_SFT, "max_grad_norm", "0"));
}

static void test_booleans_accept_yaml_1_1_words(void) {
  const char *yes[] = {"true", "True", "TRUE", "yes", "Yes", "on", "ON"};
  const char *no[] = {"false", "False", "no", "NO", "off", "Off"};
  ct_config c;
  CHECK_OK(ct_config_init(&c, CT_TRAINER_SFT));
  for (int i = 0; i < 7; i++) {
    c.packing = 0;
    CHECK_OK(ct_config_set(&c, "packing", yes[i], "x"));
    CHECK(c.packing == 1);
  }
  for (int i = 0; i < 6; i++) {
    c.packing = 1;
    CHECK_OK(ct_config_set(&c, "packing", no[i], "x"));
    CHECK(c.packing == 0);
  }
  ct_config_free(&c);
  CHECK_ERR(set_one(CT_TRAINER_SFT, "packing", "1"), "key 'packing': expected a boolean");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "packing", "maybe"), "got 'maybe'");
  CHECK_OK(load_text(CT_TRAINER_SFT, "packing: on\nshuffle_dataset: off\n"));
}

// TRL's boolean spellings of resume_from_checkpoint (true = the latest checkpoint) and
// scale_rewards (true = group, false = none), from yml and the command line.
static void test_trl_boolean_spellings_of_string_and_enum_keys(void) {
  ct_config c;
  CHECK_OK(ct_config_init(&c, CT_TRAINER_GRPO));
  CHECK_OK(ct_config_set(&c, "resume_from_checkpoint", "true", "x"));
  CHECK(!strcmp(c.resume_from_checkpoint, "latest"));
  CHECK_OK(ct_config_set(&c, "resume_from_checkpoint", "False", "x"));
  CHECK(!strcmp(c.resume_from_checkpoint, ""));
  CHECK_OK(ct_config_set(&c, "resume_from_checkpoint", "out/checkpoint-5", "x"));
  CHECK(!strcmp(c.resume_from_checkpoint, "out/checkpoint-5"));
  CHECK_OK(ct_config_set(&c, "scale_rewards", "false", "x"));
  CHECK(c.scale_rewards == CT_SCALE_NONE);
  CHECK_OK(ct_config_set(&c, "scale_rewards", "true", "x"));
  CHECK(c.scale_rewards == CT_SCALE_GROUP);
  CHECK_OK(ct_config_set(&c, "scale_rewards", "batch", "x"));
  CHECK(c.scale_rewards == CT_SCALE_BATCH);
  ct_config_free(&c);
  put("t.yml", "scale_rewards: false\nresume_from_checkpoint: true\n");
  CHECK_OK(load(&c, CT_TRAINER_GRPO, "t.yml"));
  CHECK(c.scale_rewards == CT_SCALE_NONE && !strcmp(c.resume_from_checkpoint, "latest"));
  ct_config_free(&c);
  // other string keys stay strings: a file may be called "true"
  CHECK_OK(ct_config_init(&c, CT_TRAINER_SFT));
  CHECK_OK(ct_config_set(&c, "dataset_path", "true", "x"));
  CHECK(!strcmp(c.dataset_path, "true"));
  ct_config_free(&c);
}

// TRL's None for the GRPO numbers whose off value is 0 (epsilon_high, delta,
// off_policy_mask_threshold): null, ~ or nothing in a yml; other numbers still refuse it.
static void test_trl_none_of_number_keys_is_their_off_value(void) {
  ct_config c;
  put("t.yml", "epsilon_high: null\ndelta: ~\noff_policy_mask_threshold:\nepsilon: 0.1\n");
  CHECK_OK(load(&c, CT_TRAINER_GRPO, "t.yml"));
  CHECK(c.epsilon_high == 0 && c.delta == 0 && c.off_policy_mask_threshold == 0 && c.epsilon == 0.1);
  ct_config_free(&c);
  put("t.yml", "delta: 1.4\n");
  CHECK_OK(load(&c, CT_TRAINER_GRPO, "t.yml"));
  CHECK(c.delta == 1.4);
  ct_config_free(&c);
  CHECK_ERR(load_text(CT_TRAINER_GRPO, "epsilon: null\n"), at(1), "key 'epsilon': expected a number");
}

// TRL's older loss_type name aot_pair is its aot, in a YAML list and on one line.
static void test_trl_older_loss_type_names_read_as_the_current_ones(void) {
  ct_config c;
  put("t.yml", "loss_type: [sigmoid, aot_pair]\n");
  CHECK_OK(load(&c, CT_TRAINER_DPO, "t.yml"));
  CHECK(c.loss_type.n == 2 && !strcmp(c.loss_type.v[0], "sigmoid") && !strcmp(c.loss_type.v[1], "aot"));
  ct_config_free(&c);
  put("t.yml", "loss_type: aot_pair,sft\n");
  CHECK_OK(load(&c, CT_TRAINER_DPO, "t.yml"));
  CHECK(c.loss_type.n == 2 && !strcmp(c.loss_type.v[0], "aot") && !strcmp(c.loss_type.v[1], "sft"));
  ct_config_free(&c);
}

static void test_bad_enum_value_lists_the_choices(void) {
  CHECK_ERR(load_text(CT_TRAINER_SFT, "seed: 2\nlr_scheduler_type: cosin\n"), at(2),
            "key 'lr_scheduler_type': 'cosin' is not one of linear, cosine, constant, "
            "constant_with_warmup");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "model.model_type", "gpt2"),
            "key 'model.model_type': 'gpt2' is not one of llama, qwen2, qwen3, mistral");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "save_dtype", "Float32"), "float32, bfloat16");
}

static void test_key_for_another_trainer_is_rejected(void) {
  CHECK_ERR(load_text(CT_TRAINER_DPO, "seed: 1\npacking: true\n"), at(2),
            "key 'packing' does not apply to dpo (only to sft, distill)");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "loss_type", "sigmoid"),
            "command line: key 'loss_type' does not apply to sft (only to dpo, grpo)");
  CHECK_OK(set_one(CT_TRAINER_DISTILL, "packing", "true"));
}

static void test_duplicate_key_in_one_file_is_rejected(void) {
  CHECK_ERR(load_text(CT_TRAINER_SFT, "seed: 1\nmax_steps: 2\nseed: 3\n"), at(3),
            "duplicate key 'seed' (first at line 1)");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "model:\n  hidden_size: 1\n  hidden_size: 2\n"), at(3),
            "duplicate key 'model.hidden_size'");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "model.hidden_size: 8\nmodel:\n  hidden_size: 2\n"), at(3),
            "duplicate key 'model.hidden_size'");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "model:\n  hidden_size: 1\nseed: 1\nmodel:\n  head_dim: 2\n"),
            at(4), "duplicate key 'model'");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "base_config: a.yml\nbase_config: b.yml\n"), at(2),
            "duplicate key 'base_config'");
  // The same key in a base file and in the file that includes it is an override.
  put("dup_base.yml", "seed: 1\n");
  CHECK_OK(load_text(CT_TRAINER_SFT, "base_config: dup_base.yml\nseed: 2\n"));
}

static void test_non_mapping_document_is_rejected(void) {
  CHECK_ERR(load_text(CT_TRAINER_SFT, "- seed\n- 1\n"), at(1), "top level", "a list");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "just some text\n"), at(1), "top level");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "seed: 1\n---\nseed: 2\n"), at(3), "one YAML document");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "? [a, b]\n: 1\n"), at(1), "a key must be a name");
}

static void test_yaml_syntax_error_names_the_line(void) {
  CHECK_ERR(load_text(CT_TRAINER_SFT, "seed: 1\nmax_steps: 2: 3\n"), at(2), "YAML syntax error");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "seed: 1\nmax_steps: 2\n  bad_indent: 3\n"), at(3),
            "YAML syntax error");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "seed: 1\nloss_type: [sigmoid\nmax_steps: 2\n"),
            "YAML syntax error", "t.yml:");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "seed: \"unterminated\n"), "YAML syntax error");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "seed: \xff\xfe\n"), "t.yml", "UTF-8");
}

static void test_cli_argument_without_equals_is_rejected(void) {
  ct_config c;
  char *argv[] = {"sft", "seed=1", "oops"};
  CHECK_ERR(ct_config_from_args(&c, CT_TRAINER_SFT, 3, argv),
            "command line: argument 'oops' is not key=value");
  CHECK(c.origin_ == NULL && c.output_dir == NULL);  // freed and zeroed on failure
  ct_config_free(&c);
  const char *file = put("t.yml", "seed: 2\n");
  char *argv2[] = {"sft", (char *)file, (char *)file};
  CHECK_ERR(ct_config_from_args(&c, CT_TRAINER_SFT, 3, argv2), "is not key=value");
  ct_config_free(&c);
  char *argv3[] = {"sft", "learning_rate"};
  CHECK_ERR(ct_config_from_args(&c, CT_TRAINER_SFT, 2, argv3),
            "command line: 'learning_rate' is neither key=value nor a yml file");
  ct_config_free(&c);
  CHECK_ERR(set_one(CT_TRAINER_SFT, "base_config", "x.yml"),
            "key 'base_config' can only be given in a yml file");
}

static void test_missing_or_unreadable_file_is_rejected(void) {
  ct_config c;
  char *argv[] = {"sft", "/nonexistent/ctune/x.yml", "seed=1"};
  CHECK_ERR(ct_config_from_args(&c, CT_TRAINER_SFT, 3, argv),
            "/nonexistent/ctune/x.yml: cannot open");
  ct_config_free(&c);
  CHECK_ERR(load_text(CT_TRAINER_SFT, "seed: 1\nbase_config: nope.yml\n"), at(2),
            "base_config: cannot open", "nope.yml");
  CHECK_ERR(load_text(CT_TRAINER_SFT, "base_config: [a]\n"), at(1), "expected a file name");
  if (geteuid() != 0) {  // root reads anything
    const char *p = put("locked.yml", "seed: 1\n");
    chmod(p, 0);
    CHECK_OK(ct_config_init(&c, CT_TRAINER_SFT));
    CHECK_ERR(ct_config_load_file(&c, p), "locked.yml: cannot open");
    ct_config_free(&c);
  }
  CHECK_OK(ct_config_init(&c, CT_TRAINER_SFT));
  CHECK_ERR(ct_config_load_file(&c, scratch_dir), scratch_dir, "is a directory");
  ct_config_free(&c);
}

// ---------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------

static void test_null_resets_a_string_key_to_empty(void) {
  ct_config c;
  put("nb.yml", "tokenizer_path: tok\ndataset_path: d\neval_dataset_path: e\nmodel_path: m\n");
  put("t.yml",
      "base_config: nb.yml\n"
      "tokenizer_path: null\n"
      "dataset_path: ~\n"
      "eval_dataset_path:\n"
      "model_path: \"null\"\n");
  CHECK_OK(load(&c, CT_TRAINER_SFT, "t.yml"));
  CHECK_STR(c.tokenizer_path, "");
  CHECK_STR(c.dataset_path, "");
  CHECK_STR(c.eval_dataset_path, "");
  CHECK_STR(c.model_path, "null");  // quoted: the word itself
  CHECK_OK(ct_config_set(&c, "model_path", "~", "command line"));
  CHECK_STR(c.model_path, "");
  ct_config_free(&c);
  CHECK_ERR(load_text(CT_TRAINER_SFT, "seed: null\n"), at(1), "key 'seed': expected an integer");
}

static void test_list_keys_from_yaml_sequence_and_comma_cli(void) {
  ct_config c;
  put("t.yml", "loss_type: [sigmoid, sft]\nloss_weights:\n  - 1.0\n  - 0.5\n");
  CHECK_OK(load(&c, CT_TRAINER_DPO, "t.yml"));
  CHECK(c.loss_type.n == 2 && !strcmp(c.loss_type.v[0], "sigmoid") &&
        !strcmp(c.loss_type.v[1], "sft"));
  CHECK(c.loss_weights.n == 2);
  if (c.loss_weights.n == 2) {
    CHECK_NEAR(c.loss_weights.v[0], 1.0, 0);
    CHECK_NEAR(c.loss_weights.v[1], 0.5, 0);
  }
  CHECK_OK(ct_config_set(&c, "loss_type", "hinge, ipo,robust", "command line"));
  CHECK(c.loss_type.n == 3 && !strcmp(c.loss_type.v[0], "hinge") &&
        !strcmp(c.loss_type.v[1], "ipo") && !strcmp(c.loss_type.v[2], "robust"));
  CHECK_OK(ct_config_set(&c, "loss_type", "[simpo]", "command line"));
  CHECK(c.loss_type.n == 1 && !strcmp(c.loss_type.v[0], "simpo"));
  CHECK_OK(ct_config_set(&c, "loss_weights", "1,2e-1,3", "command line"));
  CHECK(c.loss_weights.n == 3);
  if (c.loss_weights.n == 3) CHECK_NEAR(c.loss_weights.v[1], 0.2, 0);
  CHECK_OK(ct_config_set(&c, "loss_weights", "", "command line"));
  CHECK(c.loss_weights.n == 0);
  CHECK_OK(ct_config_set(&c, "loss_weights", "[]", "command line"));
  CHECK(c.loss_weights.n == 0);
  ct_config_free(&c);

  // reward weights take any finite number (negative: a penalty); nothing else
  CHECK_OK(ct_config_init(&c, CT_TRAINER_GRPO));
  CHECK_OK(ct_config_set(&c, "reward_weights", "1.5,-0.5,0", "command line"));
  CHECK(c.reward_weights.n == 3 && c.reward_weights.v[0] == 1.5 && c.reward_weights.v[1] == -0.5);
  CHECK(ct_config_set(&c, "reward_weights", "1,nan", "command line") == CT_ECONFIG);
  ct_config_free(&c);

  put("t.yml", "loss_type: sigmoid,sft\nloss_weights: []\n");  // a scalar uses the CLI form
  CHECK_OK(load(&c, CT_TRAINER_DPO, "t.yml"));
  CHECK(c.loss_type.n == 2 && c.loss_weights.n == 0);
  ct_config_free(&c);

  CHECK_ERR(set_one(CT_TRAINER_DPO, "loss_type", "sigmoid,bogus"),
            "key 'loss_type': 'bogus' is not one of sigmoid, hinge, ipo, robust, sft, simpo");
  CHECK(!strstr(ct_last_error(), "grpo") && !strstr(ct_last_error(), "dapo"));  // one trainer's names only
  CHECK_ERR(set_one(CT_TRAINER_DPO, "loss_type", "dapo"), "'dapo' is not one of sigmoid,");
  CHECK_ERR(set_one(CT_TRAINER_GRPO, "loss_type", "sigmoid"), "'sigmoid' is not one of grpo, bnpo, dr_grpo, dapo");
  CHECK(!strstr(ct_last_error(), "simpo"));
  CHECK_ERR(set_one(CT_TRAINER_DPO, "loss_weights", "1,,2"), "key 'loss_weights'",
            "item 2", "empty");
  CHECK_ERR(set_one(CT_TRAINER_DPO, "loss_weights", "1,-2"),
            "key 'loss_weights': -2 is out of range [0, inf)");
  CHECK_ERR(set_one(CT_TRAINER_DPO, "loss_weights", "1,x"), "expected a number, got 'x'");
  CHECK_ERR(load_text(CT_TRAINER_DPO, "seed: 1\nloss_type:\n  - sigmoid\n  - [sft]\n"), at(4),
            "list items must be values");
  CHECK_ERR(load_text(CT_TRAINER_DPO, "loss_type:\n  - sigmoid\n  - nope\n"), "t.yml:",
            "'nope' is not one of");
}

// A config with every kind of value away from its default.
static void make_unusual(ct_config *c, ct_trainer_kind t) {
  CHECK_OK(ct_config_init(c, t));
  CHECK_OK(ct_config_set(c, "output_dir", "runs/my \"quoted\" dir\\ # not: a comment\n2\t", "x"));
  CHECK_OK(ct_config_set(c, "model_path", "-leading-dash", "x"));
  // NEL, LS and PS: line breaks to YAML even inside quotes (fuzz_config found the dump folding them)
  CHECK_OK(ct_config_set(c, "chat_template_path", "a\\\xc2\x85" "N b\xe2\x80\xa8" "c\xe2\x80\xa9" "d \xc2\xa0" "e", "x"));
  CHECK_OK(ct_config_set(c, "tokenizer_path", "caf\xc3\xa9/[x], {y}", "x"));
  CHECK_OK(ct_config_set(c, "resume_from_checkpoint", "latest", "x"));
  free(c->dataset_path);
  c->dataset_path = strdup("null");  // the word, which only a quoted scalar can hold
  free(c->eval_dataset_path);
  c->eval_dataset_path = strdup("yes");
  CHECK_OK(ct_config_set(c, "learning_rate", "0.1", "x"));
  CHECK_OK(ct_config_set(c, "num_train_epochs", "0.3333333333333333", "x"));
  CHECK_OK(ct_config_set(c, "adam_epsilon", "1e-300", "x"));
  CHECK_OK(ct_config_set(c, "weight_decay", "123456789.123", "x"));
  CHECK_OK(ct_config_set(c, "max_grad_norm", "1e300", "x"));
  CHECK_OK(ct_config_set(c, "max_steps", "9223372036854775807", "x"));
  CHECK_OK(ct_config_set(c, "lr_scheduler_type", "constant_with_warmup", "x"));
  CHECK_OK(ct_config_set(c, "save_dtype", "bfloat16", "x"));
  CHECK_OK(ct_config_set(c, "shuffle_dataset", "false", "x"));
  CHECK_OK(ct_config_set(c, "model.model_type", "qwen3", "x"));
  CHECK_OK(ct_config_set(c, "model.rms_norm_eps", "1e-5", "x"));
  CHECK_OK(ct_config_set(c, "model.use_qk_norm", "true", "x"));
  CHECK_OK(ct_config_set(c, "model.hidden_size", "256", "x"));  // set, though equal to default
  if (t == CT_TRAINER_DPO) {
    CHECK_OK(ct_config_set(c, "loss_type", "sigmoid,sft", "x"));
    CHECK_OK(ct_config_set(c, "loss_weights", "1,0.1", "x"));
  }
  if (t == CT_TRAINER_SFT) {
    CHECK_OK(ct_config_set(c, "packing", "true", "x"));
    CHECK_OK(ct_config_set(c, "dataset_text_field", "", "x"));
  }
}

// DPO's beta defaults to 2.0 with loss_type simpo: the config holds the value the run uses, so
// config.yml records it and re-running config.yml (with loss_type changed or not) reproduces it;
// an explicit beta stands; the shipped configs/dpo.yml leaves it to the default.
static void test_simpo_beta_default_is_in_the_config(void) {
  ct_config c, d;
  char *simpo[] = {"dpo", "configs/dpo.yml", "loss_type=simpo"};
  CHECK_OK(ct_config_from_args(&c, CT_TRAINER_DPO, 3, simpo));
  CHECK_NEAR(c.beta, 2.0, 0);
  CHECK_STR(ct_config_origin(&c, "beta"), "default with loss_type simpo");
  const char *path = put("written.yml", "");
  CHECK_OK(ct_config_write_yaml(&c, path));
  char *again[] = {"dpo", (char *)path};
  CHECK_OK(ct_config_from_args(&d, CT_TRAINER_DPO, 2, again));
  CHECK_NEAR(d.beta, 2.0, 0);
  CHECK_SAME(&c, &d);
  ct_config_free(&c);
  ct_config_free(&d);
  char *mixed[] = {"dpo", "loss_type=sigmoid,simpo"};
  CHECK_OK(ct_config_from_args(&c, CT_TRAINER_DPO, 2, mixed));
  CHECK_NEAR(c.beta, 2.0, 0);
  ct_config_free(&c);
  char *given[] = {"dpo", "configs/dpo.yml", "loss_type=simpo", "beta=0.1"};
  CHECK_OK(ct_config_from_args(&c, CT_TRAINER_DPO, 4, given));
  CHECK_NEAR(c.beta, 0.1, 0);
  ct_config_free(&c);
  char *plain[] = {"dpo", "configs/dpo.yml"};
  CHECK_OK(ct_config_from_args(&c, CT_TRAINER_DPO, 2, plain));
  CHECK_NEAR(c.beta, 0.1, 0);
  CHECK_STR(ct_config_origin(&c, "beta"), "default");
  ct_config_free(&c);
}

static void test_write_yaml_round_trip_gives_an_identical_config(void) {
  for (int i = 0; i < 4; i++) {
    ct_config a, b;
    // The defaults of each trainer, then a config with unusual values.
    for (int unusual = 0; unusual < 2; unusual++) {
      if (unusual) make_unusual(&a, TRAINERS[i]);
      else CHECK_OK(ct_config_init(&a, TRAINERS[i]));
      const char *path = put("written.yml", "");
      CHECK_OK(ct_config_write_yaml(&a, path));
      CHECK_OK(ct_config_init(&b, TRAINERS[i]));
      CHECK_OK(ct_config_load_file(&b, path));
      CHECK_SAME(&a, &b);
      CHECK(a.model.set_mask == b.model.set_mask);
      ct_config_free(&a);
      ct_config_free(&b);
    }
  }
  ct_config a;
  make_unusual(&a, CT_TRAINER_SFT);
  CHECK(ct_config_write_yaml(&a, "/nonexistent/ctune/config.yml") == CT_EIO);
  ct_config_free(&a);
}

static void test_diff_names_the_first_differing_key(void) {
  ct_config a, b;
  CHECK_OK(ct_config_init(&a, CT_TRAINER_DPO));
  CHECK_OK(ct_config_init(&b, CT_TRAINER_DPO));
  CHECK(ct_config_diff(&a, &b) == NULL);
  CHECK_OK(ct_config_set(&b, "loss_type", "sigmoid,sft", "x"));
  CHECK_STR(ct_config_diff(&a, &b), "loss_type");
  CHECK_OK(ct_config_set(&a, "loss_type", "sigmoid,sft", "y"));
  CHECK(ct_config_diff(&a, &b) == NULL);  // origins are not compared
  CHECK_OK(ct_config_set(&b, "model.hidden_size", "256", "x"));
  CHECK_STR(ct_config_diff(&a, &b), "model.set_mask");
  ct_config_free(&a);
  ct_config_free(&b);
}

static void test_origin_records_default_file_line_and_command_line(void) {
  ct_config c;
  const char *file = put("t.yml", "# comment\nseed: 5\n\nmodel:\n  head_dim: 16\n");
  char *argv[] = {"sft", (char *)file, "max_steps=3"};
  CHECK_OK(ct_config_from_args(&c, CT_TRAINER_SFT, 3, argv));
  CHECK_STR(ct_config_origin(&c, "seed"), at(2));
  CHECK_STR(ct_config_origin(&c, "model.head_dim"), at(5));
  CHECK_STR(ct_config_origin(&c, "max_steps"), "command line");
  CHECK_STR(ct_config_origin(&c, "learning_rate"), "default");
  CHECK_STR(ct_config_origin(&c, "model.hidden_size"), "default");
  CHECK_OK(ct_config_set(&c, "seed", "6", "env CTUNE_SEED"));
  CHECK_STR(ct_config_origin(&c, "seed"), "env CTUNE_SEED");
  ct_config_free(&c);
}

static void test_empty_and_comment_only_files_change_nothing(void) {
  ct_config c, d;
  CHECK_OK(ct_config_init(&d, CT_TRAINER_GRPO));
  const char *texts[] = {"", "# nothing here\n", "---\n", "model:\n", "~\n"};
  for (int i = 0; i < 5; i++) {
    put("t.yml", texts[i]);
    CHECK_OK(load(&c, CT_TRAINER_GRPO, "t.yml"));
    CHECK_SAME(&c, &d);
    ct_config_free(&c);
  }
  ct_config_free(&d);
}

static void test_key_table_names_are_unique_and_defaults_valid_for_every_trainer(void) {
  int n = ct_config_num_keys();
  CHECK(n > 40);
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++) CHECK(strcmp(ct_config_key_name(i), ct_config_key_name(j)));
  CHECK(ct_config_key_name(n) == NULL && ct_config_key_name(-1) == NULL);
  const char *names[4] = {"sft", "dpo", "grpo", "distill"};
  for (int i = 0; i < 4; i++) {  // init parses every default through the checked path
    ct_config c;
    CHECK_OK(ct_config_init(&c, TRAINERS[i]));
    CHECK_STR(ct_trainer_name(c.trainer), names[i]);
    ct_trainer_kind t;
    CHECK_OK(ct_trainer_from_name(ct_trainer_name(TRAINERS[i]), &t));
    CHECK(t == TRAINERS[i]);
    ct_config_free(&c);
  }
  ct_trainer_kind t;
  CHECK(ct_trainer_from_name("ppo", &t) == CT_EINVAL);
}

// ---------------------------------------------------------------------------------
// The shipped yml files
// ---------------------------------------------------------------------------------

static void test_base_yml_is_the_output_of_ctune_config_base(void) {
  char *want = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&want, &len);
  CHECK_OK(ct_config_write_base_yaml(f));
  fclose(f);
  char *have = read_all(base_yml_path);
  CHECK(have != NULL);
  if (have && strcmp(have, want) != 0) {
    int line = 1;
    const char *h = have, *w = want;
    for (; *h && *h == *w; h++, w++) line += *h == '\n';
    fprintf(stderr, "  %s differs from `ctune-config base` at line %d; regenerate it with "
                    "bin/ctune-config base > configs/base.yml\n", base_yml_path, line);
    CHECK(0);
  }
  // Every key is documented there.
  for (int i = 0; i < ct_config_num_keys(); i++) {
    const char *k = ct_config_key_name(i), *dot = strchr(k, '.');
    char line_start[128], after_hash[128];
    snprintf(line_start, sizeof line_start, "\n%s: ", dot ? dot + 1 : k);
    snprintf(after_hash, sizeof after_hash, "# %s: ", dot ? dot + 1 : k);
    if (!strstr(want, line_start) && !strstr(want, after_hash)) {
      fprintf(stderr, "  base.yml lacks key %s\n", k);
      CHECK(0);
    }
  }
  free(have);
  free(want);
}

static void test_base_yml_loads_for_every_trainer_without_changing_its_defaults(void) {
  for (int i = 0; i < 4; i++) {
    ct_config c, d;
    CHECK_OK(ct_config_init(&c, TRAINERS[i]));
    CHECK_OK(ct_config_load_file(&c, base_yml_path));
    CHECK_OK(ct_config_init(&d, TRAINERS[i]));
    CHECK_SAME(&c, &d);
    ct_config_free(&c);
    ct_config_free(&d);
  }
}

// Every trainer's yml resolves to its built-in defaults: the files cannot drift.
static void test_trainer_ymls_equal_the_built_in_defaults(void) {
  struct { const char *path; ct_trainer_kind t; } ymls[] = {{"configs/dpo.yml", CT_TRAINER_DPO},
                                                            {"configs/grpo.yml", CT_TRAINER_GRPO},
                                                            {"configs/distill.yml", CT_TRAINER_DISTILL}};
  for (size_t i = 0; i < sizeof ymls / sizeof ymls[0]; i++) {
    ct_config c, d;
    CHECK_OK(ct_config_init(&c, ymls[i].t));
    CHECK_OK(ct_config_load_file(&c, ymls[i].path));
    CHECK_OK(ct_config_init(&d, ymls[i].t));
    CHECK_SAME(&c, &d);
    ct_config_free(&c);
    ct_config_free(&d);
  }
}

static void test_sft_yml_equals_the_built_in_sft_defaults(void) {
  ct_config c, d;
  CHECK_OK(ct_config_init(&c, CT_TRAINER_SFT));
  CHECK_OK(ct_config_load_file(&c, sft_yml_path));
  CHECK_OK(ct_config_init(&d, CT_TRAINER_SFT));
  CHECK_SAME(&c, &d);
  // sft.yml itself sets the keys a user edits (and reaches base.yml through base_config).
  const char *o = ct_config_origin(&c, "learning_rate");
  CHECK(o && strstr(o, "sft.yml:"));
  ct_config_free(&c);
  ct_config_free(&d);
}

// ---------------------------------------------------------------------------------
// The command line as YAML, TRL names, every bad key at once, the sampler's skips
// ---------------------------------------------------------------------------------

// ct_config_from_args(t) on {"prog", args...}; the caller frees c.
#define FROM_ARGS(c, t, ...) \
  ct_config_from_args((c), (t), (int)(sizeof((char *[]){"prog", __VA_ARGS__}) / sizeof(char *)), \
                      (char *[]){"prog", __VA_ARGS__})

static int has_items(const ct_str_list *l, int n, const char *a, const char *b) {
  return l->n == n && (n < 1 || !strcmp(l->v[0], a)) && (n < 2 || !strcmp(l->v[1], b));
}

static void test_cli_values_are_yaml_quoted_scalars_and_flow_sequences(void) {
  ct_config c;
  CHECK_OK(FROM_ARGS(&c, CT_TRAINER_SAMPLER, "stop=[\"e\", \"a\"]"));
  CHECK(has_items(&c.stop, 2, "e", "a"));  // not "\"e\"" and "\"a\""
  ct_config_free(&c);
  CHECK_OK(FROM_ARGS(&c, CT_TRAINER_SAMPLER, "stop=[\\n]"));
  CHECK(has_items(&c.stop, 1, "\\n", NULL));  // a plain scalar: backslash and n
  ct_config_free(&c);
  CHECK_OK(FROM_ARGS(&c, CT_TRAINER_SAMPLER, "stop=[\"\\n\", ' ']"));
  CHECK(has_items(&c.stop, 2, "\n", " "));  // double quotes escape; quoted blanks stay
  ct_config_free(&c);
  CHECK_OK(FROM_ARGS(&c, CT_TRAINER_SAMPLER, "stop=[\"a,b\"]"));
  CHECK(has_items(&c.stop, 1, "a,b", NULL));
  ct_config_free(&c);
  CHECK_OK(FROM_ARGS(&c, CT_TRAINER_SAMPLER, "stop=\"a,b\"", "prompt=Q: 2+2? # no comment"));
  CHECK(has_items(&c.stop, 1, "a,b", NULL));  // a quoted scalar is one item
  CHECK_STR(c.prompt, "Q: 2+2? # no comment");  // plain text is taken as typed
  ct_config_free(&c);
  CHECK_OK(FROM_ARGS(&c, CT_TRAINER_SAMPLER, "stop=a, b"));
  CHECK(has_items(&c.stop, 2, "a", "b"));  // plain: comma-separated, as in a file
  ct_config_free(&c);
  CHECK_OK(FROM_ARGS(&c, CT_TRAINER_SFT, "output_dir=\"my out\"", "seed='5'", "model.hidden_size=64",
                     "run_name='it''s'"));
  CHECK_STR(c.output_dir, "my out");
  CHECK(c.seed == 5 && c.model.hidden_size == 64);
  CHECK_STR(c.run_name, "it's");
  ct_config_free(&c);
  CHECK_OK(FROM_ARGS(&c, CT_TRAINER_GRPO, "answer_regex=[0-9]+ #### (.*)"));
  CHECK_STR(c.answer_regex, "[0-9]+ #### (.*)");  // '[' starts a list only for list keys
  ct_config_free(&c);
  CHECK_ERR(FROM_ARGS(&c, CT_TRAINER_SFT, "output_dir=\"my out"),
            "command line: key 'output_dir': YAML syntax error");
  ct_config_free(&c);
  CHECK_ERR(FROM_ARGS(&c, CT_TRAINER_SFT, "output_dir=\"a\" b"), "command line: key 'output_dir'");
  ct_config_free(&c);
  CHECK_ERR(FROM_ARGS(&c, CT_TRAINER_SAMPLER, "stop=[a, [b]]"),
            "command line: key 'stop': list items must be values");
  ct_config_free(&c);
  // a file's quoted scalar is one item too, and quoted blanks in a sequence stay
  put("t.yml", "stop: \"a,b\"\n");
  CHECK_OK(load(&c, CT_TRAINER_SAMPLER, "t.yml"));
  CHECK(has_items(&c.stop, 1, "a,b", NULL));
  ct_config_free(&c);
  put("t.yml", "stop: [\"</s>\", \" \"]\n");
  CHECK_OK(load(&c, CT_TRAINER_SAMPLER, "t.yml"));
  CHECK(has_items(&c.stop, 2, "</s>", " "));
  ct_config_free(&c);
}

static void test_trl_names_are_renamed_mapped_or_explained(void) {
  ct_config c;
  CHECK_OK(FROM_ARGS(&c, CT_TRAINER_SFT, "max_seq_length=100", "per_gpu_train_batch_size=3",
                     "eval_dataset_path=e.jsonl", "eval_strategy=steps", "save_strategy=no",
                     "optim=adamw_torch_fused", "torch_dtype=float32", "logging_first_step=false"));
  CHECK(c.max_length == 100 && c.per_device_train_batch_size == 3 && c.save_steps == 0);
  CHECK_STR(c.eval_dataset_path, "e.jsonl");  // steps: eval_steps decides
  ct_config_free(&c);
  put("t.yml", "eval_dataset_path: e.jsonl\nevaluation_strategy: \"no\"\nmax_seq_length: 64\n"
               "optim: adamw_hf\n");
  CHECK_OK(load(&c, CT_TRAINER_DPO, "t.yml"));
  CHECK_STR(c.eval_dataset_path, "");  // no: no evaluation
  CHECK(c.max_length == 64);
  CHECK_STR(ct_config_origin(&c, "max_length"), at(3));
  ct_config_free(&c);
  CHECK_ERR(set_one(CT_TRAINER_SFT, "eval_strategy", "epoch"), "key 'eval_strategy'",
            "'epoch' is not supported", "eval_steps");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "save_strategy", "best"), "'best' is not one of steps, no");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "logging_strategy", "no"), "key 'logging_strategy'", "logging_steps");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "optim", "sgd"), "key 'optim': 'sgd'", "AdamW", "adamw_torch");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "torch_dtype", "bfloat16"), "key 'torch_dtype': 'bfloat16'",
            "float32", "save_dtype");
  CHECK_OK(set_one(CT_TRAINER_SFT, "logging_first_step", "true"));
  // bf16 is TRL's name and ctune's: true, false or auto, in every trainer
  CHECK_OK(set_one(CT_TRAINER_GRPO, "bf16", "true"));
  CHECK_OK(set_one(CT_TRAINER_DISTILL, "bf16", "auto"));
  CHECK_ERR(set_one(CT_TRAINER_SFT, "bf16", "yes please"), "key 'bf16'", "false, true, auto");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "fp16", "true"), "key 'fp16'", "bf16: true");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "dataset_name", "trl-lib/x"), "dataset_path");
  CHECK_ERR(set_one(CT_TRAINER_SFT, "report_to", "wandb"), "metrics.jsonl");
}

// Lines of the last message.
static int message_lines(void) {
  int n = 1;
  for (const char *p = ct_last_error(); *p; p++) n += *p == '\n';
  return n;
}

static void test_every_bad_key_is_reported_one_line_each(void) {
  ct_config c;
  const char *file = put("t.yml", "seed: x\nmax_steps: 5\nlearning_rat: 1\nbeta: 0.1\n");
  int rc = FROM_ARGS(&c, CT_TRAINER_SFT, (char *)file, "max_length=1", "foo=2", "optim=sgd", "seed=3");
  CHECK(rc == CT_ECONFIG);
  CHECK(message_lines() == 6);
  const char *m = ct_last_error();
  CHECK(strstr(m, at(1)) && strstr(m, "'seed'") && strstr(m, at(3)) && strstr(m, "learning_rat") &&
        strstr(m, at(4)) && strstr(m, "'beta' does not apply to sft") && strstr(m, "'max_length'") &&
        strstr(m, "'foo'") && strstr(m, "'optim'"));
  CHECK(!strstr(m, at(2)));
  ct_config_free(&c);
  CHECK(load_text(CT_TRAINER_SFT, "a1: 1\nb2: 2\n") == CT_ECONFIG && message_lines() == 2);
  // very many: the message says how many more there were
  char many[4096] = "";
  for (int i = 0; i < 60; i++) snprintf(many + strlen(many), sizeof many - strlen(many), "bad_key_%d: 1\n", i);
  CHECK(load_text(CT_TRAINER_SFT, many) == CT_ECONFIG && strstr(ct_last_error(), " more)"));
}

static void test_sampler_takes_its_keys_from_a_trainer_yml(void) {
  ct_config c;
  put("t.yml", "dataset_path: d.jsonl\nlearning_rate: 1e-3\nseed: 3\ntemperature: 0.5\n"
               "max_seq_length: 64\noptim: sgd\nmodel:\n  hidden_size: 8\n");
  CHECK_OK(load(&c, CT_TRAINER_SAMPLER, "t.yml"));
  CHECK(c.seed == 3 && c.temperature == 0.5);
  CHECK_STR(ct_config_ignored(&c), "dataset_path, learning_rate, max_seq_length, optim, model.hidden_size");
  ct_config_free(&c);
  CHECK_ERR(load(&c, CT_TRAINER_DISTILL, "t.yml"), "optim");  // trainers still reject
  ct_config_free(&c);
  CHECK_ERR(FROM_ARGS(&c, CT_TRAINER_SAMPLER, "dataset_path=d.jsonl"),
            "command line: key 'dataset_path' does not apply to sampler");
  ct_config_free(&c);
  for (int i = 0; i < 4; i++) {  // every trainer's resolved config.yml
    ct_config t;
    CHECK_OK(ct_config_init(&t, TRAINERS[i]));
    CHECK_OK(ct_config_write_yaml(&t, tpath("resolved.yml")));
    if (i == 0) remember(tpath("resolved.yml"));
    ct_config_free(&t);
    CHECK_OK(load(&c, CT_TRAINER_SAMPLER, "resolved.yml"));
    CHECK(strstr(ct_config_ignored(&c), "output_dir") != NULL);
    ct_config_free(&c);
  }
  CHECK_OK(ct_config_init(&c, CT_TRAINER_SAMPLER));
  CHECK_OK(ct_config_load_file(&c, sft_yml_path));
  ct_config_free(&c);
}

int main(int argc, char **argv) {
  if (argc > 1) {
    base_yml_path = argv[1];
    if (argc > 2) sft_yml_path = argv[2];
  }
  if (scratch_make("/tmp/ctune-test-config-XXXXXX")) return 1;
  RUN(test_defaults_come_from_the_table_then_the_trainer);
  RUN(test_yml_overrides_defaults);
  RUN(test_cli_overrides_yml);
  RUN(test_from_args_without_a_file_takes_only_overrides);
  RUN(test_simpo_beta_default_is_in_the_config);
  RUN(test_base_config_chain_is_relative_to_each_files_directory);
  RUN(test_base_config_cycle_is_detected);
  RUN(test_model_keys_from_yml_block_and_cli_dots);
  RUN(test_unknown_key_suggests_the_closest_key);
  RUN(test_wrong_type_names_the_key_and_line);
  RUN(test_integers_reject_fractions_and_overflow);
  RUN(test_floats_accept_exponents_and_reject_inf_and_nan);
  RUN(test_out_of_range_names_the_key_range_and_line);
  RUN(test_booleans_accept_yaml_1_1_words);
  RUN(test_trl_boolean_spellings_of_string_and_enum_keys);
  RUN(test_trl_none_of_number_keys_is_their_off_value);
  RUN(test_trl_older_loss_type_names_read_as_the_current_ones);
  RUN(test_bad_enum_value_lists_the_choices);
  RUN(test_key_for_another_trainer_is_rejected);
  RUN(test_duplicate_key_in_one_file_is_rejected);
  RUN(test_non_mapping_document_is_rejected);
  RUN(test_yaml_syntax_error_names_the_line);
  RUN(test_cli_argument_without_equals_is_rejected);
  RUN(test_missing_or_unreadable_file_is_rejected);
  RUN(test_null_resets_a_string_key_to_empty);
  RUN(test_list_keys_from_yaml_sequence_and_comma_cli);
  RUN(test_write_yaml_round_trip_gives_an_identical_config);
  RUN(test_diff_names_the_first_differing_key);
  RUN(test_origin_records_default_file_line_and_command_line);
  RUN(test_empty_and_comment_only_files_change_nothing);
  RUN(test_key_table_names_are_unique_and_defaults_valid_for_every_trainer);
  RUN(test_base_yml_is_the_output_of_ctune_config_base);
  RUN(test_base_yml_loads_for_every_trainer_without_changing_its_defaults);
  RUN(test_sft_yml_equals_the_built_in_sft_defaults);
  RUN(test_trainer_ymls_equal_the_built_in_defaults);
  RUN(test_cli_values_are_yaml_quoted_scalars_and_flow_sequences);
  RUN(test_trl_names_are_renamed_mapped_or_explained);
  RUN(test_every_bad_key_is_reported_one_line_each);
  RUN(test_sampler_takes_its_keys_from_a_trainer_yml);
  remove_scratch();
  return test_summary();
}
