// Fuzzes the YAML config loader (common/config_yml.c, config_value.c): the input is a
// trainer's yml file, in a directory that also holds base.yml, so that `base_config:
// base.yml` chains (every seed has one) resolve. Each trainer kind loads it; what loads
// must dump to yml that reloads into an identical config (config.h's contract), checked
// for one kind per input (the dump and reload cost more than the six loads).
//
// base.yml here is short: a few keys of every kind of value (string, integer, number,
// enum with a TRL bool spelling, list, a `model:` block), so that the input's keys
// override a base. The full base.yml (every key, written from the key table) is
// all.yml: every kind loads it and round-trips once at start-up, and an input may name
// it. Parsing the full file for every kind of every input made each input ~2x slower
// and reached no new code: it is the same file each time.
#include "config.h"
#include "fuzz.h"

static const ct_trainer_kind kinds[] = {CT_TRAINER_SFT,     CT_TRAINER_DPO,    CT_TRAINER_GRPO,
                                        CT_TRAINER_DISTILL, CT_TRAINER_REWARD, CT_TRAINER_SAMPLER};

static const char small_base[] =
    "# a short base: the input's keys override these\n"
    "output_dir: out/fuzz\n"
    "seed: 7\n"
    "learning_rate: 1e-4\n"
    "lr_scheduler_type: cosine\n"
    "bf16: true\n"
    "lora_target_modules: [q_proj, v_proj]\n"
    "model:\n"
    "  hidden_size: 64\n";

static void check_round_trip(const ct_config *c);

// Writes base.yml (short) and all.yml (every key), and checks that every kind loads
// all.yml and round-trips it.
static void write_bases(void) {
  char path[256];
  snprintf(path, sizeof path, "%s/all.yml", fuzz_dir());
  FILE *f = fopen(path, "w");
  if (!f || ct_config_write_base_yaml(f) || fclose(f)) abort();
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    ct_config c;
    if (ct_config_init(&c, kinds[i])) abort();
    if (ct_config_load_file(&c, path)) {
      fprintf(stderr, "fuzz: all.yml does not load: %s\n", ct_last_error());
      abort();
    }
    check_round_trip(&c);
    ct_config_free(&c);
  }
  fuzz_write("base.yml", small_base, sizeof small_base - 1);
}

// Dumps c, reloads the dump into a fresh config of the same trainer, and aborts when
// they differ.
static void check_round_trip(const ct_config *c) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f || ct_config_dump(c, f)) abort();
  fclose(f);
  const char *path = fuzz_write("dump.yml", text, len);
  ct_config r;
  if (ct_config_init(&r, c->trainer)) abort();
  if (ct_config_load_file(&r, path)) {
    fprintf(stderr, "fuzz: the dump does not reload: %s\n--- dump:\n%s", ct_last_error(), text);
    abort();
  }
  const char *key = ct_config_diff(c, &r);
  if (key) {
    fprintf(stderr, "fuzz: key '%s' differs after dump and reload\n--- dump:\n%s", key, text);
    abort();
  }
  ct_config_free(&r);
  free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static bool init;
  if (!init) write_bases(), init = true;
  // base_config may name any file: keep the fuzzer away from devices and /proc
  if (memmem(data, size, "/dev", 4) || memmem(data, size, "/proc", 5) || memmem(data, size, "/sys", 4))
    return -1;
  char path[256];
  snprintf(path, sizeof path, "%s", fuzz_write("fuzz.yml", data, size));  // check_round_trip writes too
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    ct_config c;
    if (ct_config_init(&c, kinds[i])) abort();
    fuzz_clear_error();
    int rc = ct_config_load_file(&c, path);
    fuzz_check_error(rc, "ct_config_load_file");
    if (!rc) {
      fuzz_clear_error();
      fuzz_check_error(ct_config_check_required(&c), "ct_config_check_required");
      if (i == size % (sizeof kinds / sizeof kinds[0])) check_round_trip(&c);  // one kind: speed
    }
    ct_config_free(&c);
    ct_config_free(&c);
  }
  return 0;
}
