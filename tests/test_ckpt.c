// Tests for common/ckpt: config.json write/read round trips and every rejection,
// model save/load (F32, BF16, sharded) with name and shape checks, optimizer-moment
// files, and the atomic checkpoint directories (begin/commit, latest, rotate, publish).
// Every file lives under one mkdtemp directory, removed at the end.
#include "ckpt.h"

#include <dirent.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "hash.h"
#include "hf.h"
#include "hfjson.h"
#include "model.h"
#include "rng.h"
#include "safetensors.h"
#include "scratch.h"
#include "test.h"
#include "tiny_model.h"

// ------------------------------------------------------------------------- helpers


// scratch_dir + "/" + printf(fmt, ...). Each call returns a string of its own, valid until
// main frees them all, so that tests can keep and combine paths freely.
static char *tpaths[1024];
static int n_tpaths;

static const char *tpath(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *tpath(const char *fmt, ...) {
  if (n_tpaths == 1024) {
    fprintf(stderr, "tpath: too many paths\n");
    exit(1);
  }
  char *b = tpaths[n_tpaths++] = malloc(1024);
  int n = snprintf(b, 1024, "%s/", scratch_dir);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b + n, 1024 - (size_t)n, fmt, ap);
  va_end(ap);
  return b;
}

static void put(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

// The whole file as a string (caller frees), or NULL.
static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  s[fread(s, 1, (size_t)n, f)] = 0;
  fclose(f);
  return s;
}

static bool file_is(const char *path, const char *text) {
  char *s = slurp(path);
  bool ok = s && strcmp(s, text) == 0;
  free(s);
  return ok;
}

static bool exists(const char *path) {
  struct stat s;
  return lstat(path, &s) == 0;
}

static bool is_dir(const char *path) {
  struct stat s;
  return stat(path, &s) == 0 && S_ISDIR(s.st_mode);
}

// Entries of a directory other than . and .. (-1 if it cannot be listed).
static int count_entries(const char *path) {
  DIR *d = opendir(path);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

// A checkpoint-like directory output_dir/name, complete (with trainer_state.json) or not.
static void make_ckpt_dir(const char *out, const char *name, bool complete) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s", out, name);
  CHECK(mkdir(p, 0755) == 0);
  if (!complete) return;
  snprintf(p, sizeof p, "%s/%s/trainer_state.json", out, name);
  put(p, "{}");
}

// `expr` fails with `code` and ct_last_error() contains every one of the strings. The
// message is cleared first so that a stale one cannot satisfy the check.
#define CHECK_FAILS(expr, code, ...)                                                      \
  check_fails_((ct_set_error(CT_OK, "%s", ""), (expr)), (code), __LINE__, #expr,          \
               (const char *[]){__VA_ARGS__, NULL})

static void check_fails_(int rc, int code, int line, const char *what, const char **needles) {
  test_checks++;
  const char *msg = ct_last_error();
  bool ok = rc == code;
  for (int i = 0; needles[i]; i++)
    if (!strstr(msg, needles[i])) ok = false;
  if (ok) return;
  test_failures++;
  fprintf(stderr, "%s:%d: %s: %s returned %d (want %d), message \"%s\", want it to name", __FILE__,
          line, test_current, what, rc, code, msg);
  for (int i = 0; needles[i]; i++) fprintf(stderr, " '%s'", needles[i]);
  fprintf(stderr, "\n");
}

// ------------------------------------------------------------------------- configs

// mini_config as `type`, untied, with 64 positions.
static ct_model_config tiny(const char *type) {
  ct_model_config c = mini_config();
  snprintf(c.model_type, sizeof c.model_type, "%s", type);
  c.max_position_embeddings = 64, c.tie_word_embeddings = false;
  return c;
}

// Compares every field of ct_model_config, naming the ones that differ.
static bool config_equal(const ct_model_config *got, const ct_model_config *want, const char *what) {
  bool ok = strcmp(got->model_type, want->model_type) == 0;
  if (!ok) fprintf(stderr, "    %s: model_type '%s', want '%s'\n", what, got->model_type, want->model_type);
#define SAME(f)                                                                           \
  if (got->f != want->f) {                                                                \
    fprintf(stderr, "    %s: " #f " %.9g, want %.9g\n", what, (double)got->f, (double)want->f); \
    ok = false;                                                                           \
  }
  SAME(vocab_size) SAME(hidden_size) SAME(intermediate_size) SAME(num_layers) SAME(num_heads)
  SAME(num_kv_heads) SAME(head_dim) SAME(max_position_embeddings) SAME(rope_theta)
  SAME(rms_norm_eps) SAME(tie_word_embeddings) SAME(qkv_bias) SAME(qk_norm) SAME(rope_type)
  SAME(rope_factor) SAME(rope_low_freq_factor) SAME(rope_high_freq_factor)
  SAME(rope_original_max_pos) SAME(bos_token_id) SAME(eos_token_id) SAME(pad_token_id)
#undef SAME
  return ok;
}

static void test_hf_config_write_then_read_round_trips_every_field(void) {
  ct_model_config cs[5];
  const char *names[5] = {"llama tied", "qwen2 qkv_bias", "qwen3 qk_norm head_dim 8",
                          "llama3 rope_scaling", "mistral"};
  cs[0] = tiny("llama");
  cs[0].tie_word_embeddings = true;
  cs[0].bos_token_id = 1;
  cs[0].eos_token_id = 2;
  cs[0].rope_theta = 500000;
  cs[0].rms_norm_eps = 1e-5f;
  cs[1] = tiny("qwen2");
  cs[1].qkv_bias = true;  // implied by model_type on reading
  cs[1].rope_theta = 1000000;
  cs[1].eos_token_id = 15;
  cs[1].pad_token_id = 16;
  cs[2] = tiny("qwen3");
  cs[2].qk_norm = true;  // implied by model_type on reading
  cs[2].head_dim = 8;    // != hidden_size / num_heads = 3
  cs[2].num_kv_heads = 1;
  cs[2].tie_word_embeddings = true;
  cs[2].rms_norm_eps = 3.3e-7f;
  cs[3] = tiny("llama");
  cs[3].rope_type = 1;
  cs[3].rope_factor = 32;
  cs[3].rope_low_freq_factor = 1.5f;
  cs[3].rope_high_freq_factor = 4.25f;
  cs[3].rope_original_max_pos = 8192;
  cs[3].max_position_embeddings = 131072;
  cs[3].bos_token_id = 0;
  cs[4] = tiny("mistral");  // written with "sliding_window": null, which must read back
  cs[4].eos_token_id = 3;
  for (int i = 0; i < 5; i++) {
    const char *path = tpath("roundtrip-%d.json", i);
    CHECK_OK(ct_hf_config_write(&cs[i], path, "bfloat16", NULL));
    ct_model_config got;
    CHECK_OK(ct_hf_config_read(&got, path));
    CHECK(config_equal(&got, &cs[i], names[i]));
  }
}

// Floats as Python's repr writes them (what transformers and PEFT write): the shortest
// decimal that reads back, exponents below 1e-4 and from 1e16 on.
static void test_hf_json_real_writes_floats_as_python_repr(void) {
  const struct { double d; const char *want; } cases[] = {
      {0.05, "0.05"}, {1e-6, "1e-06"}, {1e-5, "1e-05"}, {1e-4, "0.0001"}, {10000.0, "10000.0"},
      {0.0, "0.0"}, {-2.5, "-2.5"}, {0.1 + 0.2, "0.30000000000000004"}, {1e15, "1000000000000000.0"},
      {1e16, "1e+16"}, {123.456, "123.456"}, {1.5e300, "1.5e+300"}, {5e-324, "5e-324"}, {0.001, "0.001"},
      {1.7976931348623157e308, "1.7976931348623157e+308"}, {12345678901234567890.0, "1.2345678901234567e+19"},
      {100.0, "100.0"}, {0.02, "0.02"}, {3.3e-7, "3.3e-07"}, {(double)1e-6f, "9.999999974752427e-07"},
      {NAN, "NaN"}, {INFINITY, "Infinity"}, {-INFINITY, "-Infinity"},  // (json.dumps; it crashed)
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char buf[32];
    ct_hfjson_real(cases[i].d, buf);
    CHECK(strcmp(buf, cases[i].want) == 0);
    if (strcmp(buf, cases[i].want)) fprintf(stderr, "    %.17g: %s, want %s\n", cases[i].d, buf, cases[i].want);
  }
}

// A valid llama config.json as a jansson object, for tests that change one key.
static json_t *base_json(void) {
  return json_pack("{s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:s,s:f,s:f,s:b,s:i}", "model_type", "llama",
                   "vocab_size", 17, "hidden_size", 16, "intermediate_size", 20,
                   "num_hidden_layers", 2, "num_attention_heads", 4, "num_key_value_heads", 2,
                   "hidden_act", "silu", "rope_theta", 10000.0, "rms_norm_eps", 1e-6,
                   "tie_word_embeddings", 1, "bos_token_id", 1);
}

static void write_json(json_t *j, const char *path) {
  CHECK(json_dump_file(j, path, JSON_INDENT(2)) == 0);
  json_decref(j);
}

static void test_hf_config_eos_token_id_list_reads_as_its_first_id(void) {
  json_t *j = base_json();
  json_object_set_new(j, "eos_token_id", json_pack("[i,i]", 128001, 128009));
  const char *path = tpath("eos-list.json");
  write_json(j, path);
  ct_model_config c;
  CHECK_OK(ct_hf_config_read(&c, path));
  CHECK(c.eos_token_id == 128001);
  CHECK(c.bos_token_id == 1);
  CHECK(c.pad_token_id == -1);
  CHECK(c.head_dim == 4);  // hidden_size / num_attention_heads when absent
}

typedef struct {
  const char *key, *value;    // value: JSON text, or NULL to delete the key
  const char *key2, *value2;  // a second change, or NULL
} config_change;

// Writes the base config with `ch` applied, returns its path.
static const char *changed_config(const config_change *ch, int i) {
  json_t *j = base_json();
  const char *keys[2] = {ch->key, ch->key2}, *vals[2] = {ch->value, ch->value2};
  for (int k = 0; k < 2; k++) {
    if (!keys[k]) continue;
    if (!vals[k]) {
      json_object_del(j, keys[k]);
      continue;
    }
    json_error_t e;
    json_t *v = json_loads(vals[k], JSON_DECODE_ANY, &e);
    CHECK(v != NULL);
    json_object_set_new(j, keys[k], v);
  }
  const char *path = tpath("bad-%d.json", i);
  write_json(j, path);
  return path;
}

static void test_hf_config_read_rejects_unsupported_or_mistyped_keys_naming_file_and_key(void) {
  const config_change cases[] = {
      {"hidden_size", NULL, NULL, NULL},
      {"hidden_size", "\"12\"", NULL, NULL},
      {"model_type", "\"gpt2\"", NULL, NULL},
      {"hidden_act", "\"gelu\"", NULL, NULL},
      {"mlp_bias", "true", NULL, NULL},
      {"attention_bias", "true", NULL, NULL},
      {"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}", NULL, NULL},
      {"sliding_window", "4096", "model_type", "\"mistral\""},
      {"use_sliding_window", "true", "model_type", "\"qwen2\""},
  };
  for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
    const char *path = changed_config(&cases[i], i);
    ct_model_config c;
    CHECK_FAILS(ct_hf_config_read(&c, path), CT_EFORMAT, path, cases[i].key);
  }
}

// Absurd, negative, zero, mistyped and inconsistent sizes: each refused from config.json
// alone (no layout built: 10^9 layers took 9 GB before), naming the file and the key.
static void test_hf_config_read_refuses_absurd_sizes_naming_the_key(void) {
  const config_change cases[] = {
      {"num_hidden_layers", "1000000000", NULL, NULL},
      {"num_hidden_layers", "0", NULL, NULL},
      {"head_dim", "1000000000", NULL, NULL},
      {"head_dim", "7", NULL, NULL},
      {"head_dim", "-4", NULL, NULL},
      {"vocab_size", "10000000000", NULL, NULL},
      {"vocab_size", "4194305", NULL, NULL},
      {"hidden_size", "-16", NULL, NULL},
      {"hidden_size", "0", NULL, NULL},
      {"hidden_size", "16.5", NULL, NULL},
      {"intermediate_size", "20.0", NULL, NULL},
      {"intermediate_size", "2000000", NULL, NULL},
      {"num_attention_heads", "4096", NULL, NULL},
      {"num_key_value_heads", "8", NULL, NULL},
      {"num_key_value_heads", "0", NULL, NULL},
      {"max_position_embeddings", "0", NULL, NULL},
      {"max_position_embeddings", "1000000000", NULL, NULL},
      {"rope_theta", "-1", NULL, NULL},
      {"rope_theta", "1e39", NULL, NULL},
      {"rope_theta", "\"10000\"", NULL, NULL},
      {"rms_norm_eps", "0", NULL, NULL},
      {"rms_norm_eps", "2.0", NULL, NULL},
      {"tie_word_embeddings", "1", NULL, NULL},
      {"bos_token_id", "\"<s>\"", NULL, NULL},
      {"eos_token_id", "2.5", NULL, NULL},
      {"pad_token_id", "[1.5]", "eos_token_id", NULL},
      {"rope_parameters", "[]", NULL, NULL},
      {"rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 0}", NULL, NULL},
      {"rope_scaling", "{\"rope_type\": \"linear\", \"factor\": \"x\"}", NULL, NULL},
      {"rope_scaling", "{\"rope_type\": \"llama3\", \"original_max_position_embeddings\": 1000000000}", NULL,
       NULL},
      {"num_attention_heads", "3", "head_dim", NULL},  // 16 / 3 heads, and no head_dim to say otherwise
  };
  for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
    const char *path = changed_config(&cases[i], 200 + i);
    ct_model_config c;
    CHECK_FAILS(ct_hf_config_read(&c, path), CT_EFORMAT, path, cases[i].key);
  }
}

// transformers 5 writes RoPE as rope_parameters (no rope_theta key): its base must be
// read, not replaced by the default 10000.
static void test_hf_config_read_takes_rope_parameters_of_transformers_5(void) {
  const config_change cases[] = {
      {"rope_theta", NULL, "rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 500000.0}"},
      {"rope_theta", NULL, "rope_parameters",
       "{\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, \"factor\": 32.0, \"low_freq_factor\": 1.0, "
       "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}"},
  };
  for (int i = 0; i < 2; i++) {
    ct_model_config c;
    CHECK_OK(ct_hf_config_read(&c, changed_config(&cases[i], 300 + i)));
    CHECK(c.rope_theta == 500000.0f);
    CHECK(c.rope_type == i && (i == 0 || (c.rope_factor == 32 && c.rope_original_max_pos == 8192)));
  }
}

static void test_hf_config_read_rejects_heads_not_a_multiple_of_kv_heads_with_eformat(void) {
  const config_change ch = {"num_attention_heads", "6", "num_key_value_heads", "4"};
  const char *path = changed_config(&ch, 100);
  ct_model_config c;
  CHECK_FAILS(ct_hf_config_read(&c, path), CT_EFORMAT, path, "num_attention_heads",
              "num_key_value_heads");
}

static void test_hf_config_read_reports_the_line_of_invalid_json(void) {
  const char *path = tpath("syntax.json");
  put(path, "{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 12,,\n}\n");
  ct_model_config c;
  char want[1100];
  snprintf(want, sizeof want, "%s:3", path);
  CHECK_FAILS(ct_hf_config_read(&c, path), CT_EFORMAT, want);
}

static void test_hf_config_read_rejects_a_json_array(void) {
  const char *path = tpath("array.json");
  put(path, "[{\"model_type\": \"llama\"}]\n");
  ct_model_config c;
  CHECK_FAILS(ct_hf_config_read(&c, path), CT_EFORMAT, path, "object");
}

static void test_hf_config_read_of_a_missing_file_is_eio_naming_it(void) {
  const char *path = tpath("no-such-dir/config.json");
  ct_model_config c;
  CHECK_FAILS(ct_hf_config_read(&c, path), CT_EIO, path);
}

// ------------------------------------------------------------------------- tensors

// llama tied, or qwen2 untied with q/k/v biases.
static ct_model_config model_cfg(bool tied) {
  ct_model_config c = tiny(tied ? "llama" : "qwen2");
  c.tie_word_embeddings = tied;
  c.qkv_bias = !tied;
  return c;
}

// A model with every parameter (norms and biases too) drawn from N(0, 0.7).
static void random_model(ct_model *m, const ct_model_config *c, uint64_t seed) {
  if (ct_model_init(m, c, 16)) {
    fprintf(stderr, "%s\n", ct_last_error());
    exit(1);
  }
  ct_rng r;
  ct_rng_seed(&r, seed);
  for (int i = 0; i < m->n_tensors; i++)
    for (long k = 0; k < m->tensors[i].numel; k++)
      m->params[m->tensors[i].offset + k] = (float)(0.7 * ct_rng_normal(&r));
}

static int write_config(const ct_model *m, const char *dir, const char *dtype) {
  char p[1100];
  snprintf(p, sizeof p, "%s/config.json", dir);
  int rc = ct_mkdirs(dir);
  return rc ? rc : ct_hf_config_write(&m->cfg, p, dtype, NULL);
}

// dir/{config.json, model.safetensors} for m, as `dt`.
static int save_model_dir(const ct_model *m, const char *dir, ct_dtype dt) {
  int rc = write_config(m, dir, dt == CT_DT_BF16 ? "bfloat16" : "float32");
  if (rc) return rc;
  char p[1100];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  const float *bufs[1] = {m->params};
  return ct_save_tensors(&ct_model_tensors(m), 1, bufs, NULL, p, dt);
}

// Same tensor table in both, and every tensor of a (in buffer pa) bit-identical to b's.
static bool same_tensors(const ct_model *a, const float *pa, const ct_model *b, const float *pb) {
  if (a->n_tensors != b->n_tensors || a->n_floats != b->n_floats) {
    fprintf(stderr, "    layouts differ: %d/%d tensors\n", a->n_tensors, b->n_tensors);
    return false;
  }
  bool ok = true;
  for (int i = 0; i < a->n_tensors; i++) {
    const ct_tensor_info *x = &a->tensors[i], *y = &b->tensors[i];
    if (strcmp(x->name, y->name) || x->offset != y->offset || x->numel != y->numel) {
      fprintf(stderr, "    tensor %d: %s vs %s\n", i, x->name, y->name);
      ok = false;
    } else if (memcmp(pa + x->offset, pb + y->offset, sizeof(float) * (size_t)x->numel)) {
      fprintf(stderr, "    tensor %s differs\n", x->name);
      ok = false;
    }
  }
  return ok;
}

static void test_f32_save_then_model_load_is_bit_exact(void) {
  for (int tied = 0; tied < 2; tied++) {
    ct_model_config c = model_cfg(tied);
    ct_model m, got = {0};
    random_model(&m, &c, 1 + tied);
    const char *dir = tpath("f32-%d", tied);
    CHECK_OK(save_model_dir(&m, dir, CT_DT_F32));
    int rc;
    CHECK_OK(rc = ct_model_load(&got, dir, 16));
    if (!rc) {
      CHECK(config_equal(&got.cfg, &m.cfg, dir));
      CHECK(same_tensors(&got, got.params, &m, m.params));
      const ct_tensor_info *head = ct_model_find_tensor(&got, "lm_head.weight");
      CHECK(tied ? !head && got.w.lm_head == got.w.embed
                 : head && got.w.lm_head == got.params + head->offset);
      ct_model_free(&got);
    }
    ct_model_free(&m);
  }
}

static void test_bf16_save_loads_as_bf16_rounded_parameters(void) {
  for (int tied = 0; tied < 2; tied++) {
    ct_model_config c = model_cfg(tied);
    ct_model m, got = {0};
    random_model(&m, &c, 3 + tied);
    const char *dir = tpath("bf16-%d", tied);
    CHECK_OK(save_model_dir(&m, dir, CT_DT_BF16));
    ct_safetensors st = {0};
    CHECK_OK(ct_st_open(&st, tpath("bf16-%d/model.safetensors", tied)));
    bool all_bf16 = st.n > 0;
    for (int i = 0; i < st.n; i++) all_bf16 &= st.tensors[i].dtype == CT_DT_BF16;
    CHECK(all_bf16);
    ct_st_close(&st);
    CHECK_OK(ct_model_load(&got, dir, 16));
    long bad = 0, rounded = 0, total = 0;
    for (int i = 0; i < m.n_tensors && got.n_tensors == m.n_tensors; i++)
      for (long k = 0; k < m.tensors[i].numel; k++) {
        float x = m.params[m.tensors[i].offset + k];
        float want = ct_bf16_to_f32(ct_f32_to_bf16(x)), have = got.params[got.tensors[i].offset + k];
        if (memcmp(&want, &have, sizeof want) && bad++ < 3)
          fprintf(stderr, "    %s[%ld]: %.9g, want %.9g\n", m.tensors[i].name, k, have, want);
        rounded += want != x;
        total++;
      }
    CHECK(bad == 0);
    CHECK(total > 1000 && rounded > total / 2);  // the rounding really happened
    ct_model_free(&got);
    ct_model_free(&m);
  }
}

static void test_tied_model_file_has_no_lm_head_and_untied_has_it(void) {
  for (int tied = 0; tied < 2; tied++) {
    ct_model_config c = model_cfg(tied);
    ct_model m;
    random_model(&m, &c, 5);
    const char *dir = tpath("head-%d", tied);
    CHECK_OK(save_model_dir(&m, dir, CT_DT_F32));
    ct_safetensors st = {0};
    CHECK_OK(ct_st_open(&st, tpath("head-%d/model.safetensors", tied)));
    CHECK((ct_st_find(&st, "lm_head.weight") != NULL) == !tied);
    CHECK(ct_st_find(&st, "model.embed_tokens.weight") != NULL);
    CHECK(st.n == m.n_tensors);
    CHECK(ct_st_meta(&st, "format") && strcmp(ct_st_meta(&st, "format"), "pt") == 0);
    ct_st_close(&st);
    ct_model_free(&m);
  }
}

// An F32 entry per tensor of m (names point into m); returns how many.
static int model_entries(const ct_model *m, const float *buf, ct_st_entry *e) {
  for (int i = 0; i < m->n_tensors; i++) {
    const ct_tensor_info *t = &m->tensors[i];
    e[i] = (ct_st_entry){.name = t->name, .dtype = CT_DT_F32, .ndim = t->ndim,
                         .data_f32 = buf + t->offset};
    e[i].shape[0] = t->shape[0];
    e[i].shape[1] = t->shape[1];
  }
  return m->n_tensors;
}

static int entry_index(const ct_st_entry *e, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(e[i].name, name) == 0) return i;
  fprintf(stderr, "    no entry %s\n", name);
  exit(1);
}

static void test_sharded_directory_loads_identically_to_single_file(void) {
  ct_model_config c = model_cfg(false);
  ct_model m, single = {0}, sharded = {0};
  random_model(&m, &c, 7);
  CHECK_OK(save_model_dir(&m, tpath("shard-single"), CT_DT_F32));
  const char *dir = tpath("shard-split");
  CHECK_OK(write_config(&m, dir, "float32"));
  // Alternate tensors between the shards so that each layer is split across both.
  ct_st_entry all[128], part[2][128];
  int n = model_entries(&m, m.params, all), np[2] = {0, 0};
  const char *files[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
  json_t *wm = json_object();
  long bytes = 0;
  for (int i = 0; i < n; i++) {
    part[i & 1][np[i & 1]++] = all[i];
    json_object_set_new(wm, all[i].name, json_string(files[i & 1]));
    bytes += 4 * m.tensors[i].numel;
  }
  CHECK(np[0] > 0 && np[1] > 0);
  for (int s = 0; s < 2; s++)
    CHECK_OK(ct_st_write(tpath("shard-split/%s", files[s]), part[s], np[s], NULL, NULL, 0));
  write_json(json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)bytes, "weight_map", wm),
             tpath("shard-split/model.safetensors.index.json"));
  CHECK(!exists(tpath("shard-split/model.safetensors")));
  CHECK_OK(ct_model_load(&single, tpath("shard-single"), 16));
  CHECK_OK(ct_model_load(&sharded, dir, 16));
  CHECK(config_equal(&sharded.cfg, &single.cfg, dir));
  CHECK(same_tensors(&sharded, sharded.params, &single, single.params));
  CHECK(same_tensors(&sharded, sharded.params, &m, m.params));
  ct_model_free(&sharded);
  ct_model_free(&single);
  ct_model_free(&m);
}

// dir/{config.json for m, model.safetensors holding e[0..n)}.
static void write_entries_dir(const ct_model *m, const char *dir, const ct_st_entry *e, int n) {
  CHECK_OK(write_config(m, dir, "float32"));
  char p[1100];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  CHECK_OK(ct_st_write(p, e, n, NULL, NULL, 0));
}

static void test_load_fails_naming_a_missing_tensor(void) {
  const char *drop[] = {"model.layers.1.mlp.up_proj.weight", "lm_head.weight",
                        "model.layers.0.self_attn.k_proj.bias"};
  for (int k = 0; k < 3; k++) {
    ct_model_config c = model_cfg(false);
    ct_model m, got = {0};
    random_model(&m, &c, 9);
    ct_st_entry e[128];
    int n = model_entries(&m, m.params, e), i = entry_index(e, n, drop[k]);
    memmove(&e[i], &e[i + 1], sizeof *e * (size_t)(n - i - 1));
    const char *dir = tpath("missing-%d", k);
    write_entries_dir(&m, dir, e, n - 1);
    CHECK_FAILS(ct_model_load(&got, dir, 16), CT_EFORMAT, drop[k]);
    CHECK(got.params == NULL && got.tensors == NULL);  // freed on failure
    ct_model_free(&m);
  }
}

static void test_load_fails_on_a_wrong_shape_naming_tensor_and_both_shapes(void) {
  ct_model_config c = model_cfg(true);
  ct_model m, got = {0};
  random_model(&m, &c, 11);
  ct_st_entry e[128];
  int n = model_entries(&m, m.params, e);
  // down_proj is (C, F) = (12, 20); stored transposed it has the right numel.
  int i = entry_index(e, n, "model.layers.0.mlp.down_proj.weight");
  e[i].shape[0] = 20;
  e[i].shape[1] = 12;
  write_entries_dir(&m, tpath("shape-2d"), e, n);
  CHECK_FAILS(ct_model_load(&got, tpath("shape-2d"), 16), CT_EFORMAT,
              "model.layers.0.mlp.down_proj.weight", "[20, 12]", "[12, 20]");
  ct_model_free(&m);
}

// A config.json its weights contradict is refused when it is read (headers only: nothing
// allocated), naming the key: a wider hidden_size, more heads, more or fewer layers.
static void test_read_config_refuses_a_config_its_weights_contradict_naming_the_key(void) {
  const config_change cases[] = {
      {"hidden_size", "100000", "head_dim", "4"},
      {"vocab_size", "4000000", NULL, NULL},
      {"num_attention_heads", "8", "head_dim", "4"},
      {"intermediate_size", "1000000", NULL, NULL},
      {"num_hidden_layers", "200", NULL, NULL},
      {"num_hidden_layers", "1", NULL, NULL},
  };
  ct_model_config c = model_cfg(true);
  ct_model m;
  random_model(&m, &c, 21);
  for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
    const char *dir = tpath("contradict-%d", i);
    CHECK_OK(save_model_dir(&m, dir, CT_DT_F32));
    char p[1100];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *j = json_load_file(p, 0, NULL);
    const char *keys[2] = {cases[i].key, cases[i].key2}, *vals[2] = {cases[i].value, cases[i].value2};
    for (int k = 0; k < 2 && keys[k]; k++) json_object_set_new(j, keys[k], json_loads(vals[k], JSON_DECODE_ANY, NULL));
    write_json(j, p);
    ct_model_config got;
    CHECK_FAILS(ct_model_read_config(&got, dir), CT_EFORMAT, dir, cases[i].key);
  }
  ct_model_free(&m);
}

static void test_load_fails_on_a_wrong_vector_shape_naming_both_shapes_as_vectors(void) {
  ct_model_config c = model_cfg(true);
  ct_model m, got = {0};
  random_model(&m, &c, 13);
  ct_st_entry e[128];
  int n = model_entries(&m, m.params, e);
  int i = entry_index(e, n, "model.layers.1.input_layernorm.weight");
  float thirteen[13] = {0};
  e[i].shape[0] = 13;
  e[i].data_f32 = thirteen;
  write_entries_dir(&m, tpath("shape-1d"), e, n);
  CHECK_FAILS(ct_model_load(&got, tpath("shape-1d"), 16), CT_EFORMAT,
              "model.layers.1.input_layernorm.weight", "[13]", "[12]");
  ct_model_free(&m);
}

static void test_load_fails_naming_an_extra_tensor_not_in_the_model(void) {
  // A bias this model has no place for, and a layer beyond num_hidden_layers.
  const char *extra[] = {"model.layers.0.mlp.gate_proj.bias", "model.layers.2.input_layernorm.weight"};
  float zeros[20] = {0};
  for (int k = 0; k < 2; k++) {
    ct_model_config c = model_cfg(true);
    ct_model m, got = {0};
    random_model(&m, &c, 15);
    ct_st_entry e[128];
    int n = model_entries(&m, m.params, e);
    e[n] = (ct_st_entry){.name = extra[k], .dtype = CT_DT_F32, .ndim = 1, .data_f32 = zeros};
    e[n].shape[0] = k == 0 ? 20 : 12;
    const char *dir = tpath("extra-%d", k);
    write_entries_dir(&m, dir, e, n + 1);
    CHECK_FAILS(ct_model_load(&got, dir, 16), CT_EFORMAT, extra[k]);
    CHECK(got.params == NULL);
    ct_model_free(&m);
  }
}

static void test_load_accepts_rotary_inv_freq_and_a_tied_models_lm_head(void) {
  ct_model_config c = model_cfg(true);
  ct_model m, got = {0};
  random_model(&m, &c, 17);
  ct_st_entry e[128];
  int n = model_entries(&m, m.params, e);
  float inv_freq[2] = {1.0f, 0.01f}, *head = malloc(sizeof(float) * 17 * 12);
  for (int i = 0; i < 17 * 12; i++) head[i] = (float)i;  // not the embedding: must be ignored
  e[n] = (ct_st_entry){.name = "model.layers.0.self_attn.rotary_emb.inv_freq", .dtype = CT_DT_F32,
                       .ndim = 1, .data_f32 = inv_freq};
  e[n++].shape[0] = 2;
  e[n] = (ct_st_entry){.name = "lm_head.weight", .dtype = CT_DT_F32, .ndim = 2, .data_f32 = head};
  e[n].shape[0] = 17;
  e[n++].shape[1] = 12;
  write_entries_dir(&m, tpath("accepted"), e, n);
  CHECK_OK(ct_model_load(&got, tpath("accepted"), 16));
  CHECK(same_tensors(&got, got.params, &m, m.params));
  CHECK(got.w.lm_head == got.w.embed);
  if (got.params) ct_model_free(&got);
  free(head);
  ct_model_free(&m);
}

static void test_save_two_buffers_with_suffixes_restores_each_exactly(void) {
  ct_model_config c = model_cfg(false);
  ct_model m;
  random_model(&m, &c, 19);
  size_t bytes = sizeof(float) * (size_t)m.n_floats;
  float *avg = aligned_alloc(64, bytes), *sq = aligned_alloc(64, bytes);
  float *got = aligned_alloc(64, bytes);
  ct_rng r;
  ct_rng_seed(&r, 21);
  for (long i = 0; i < m.n_floats; i++) {
    avg[i] = (float)ct_rng_normal(&r) * 1e-3f;
    sq[i] = (float)(ct_rng_uniform(&r) * 1e-6);
  }
  const float *bufs[2] = {avg, sq};
  const char *suffixes[2] = {".exp_avg", ".exp_avg_sq"};
  const char *path = tpath("optimizer.safetensors");
  CHECK_OK(ct_save_tensors(&ct_model_tensors(&m), 2, bufs, suffixes, path, CT_DT_F32));
  ct_safetensors st = {0};
  CHECK_OK(ct_st_open(&st, path));
  CHECK(st.n == 2 * m.n_tensors);
  CHECK(ct_st_find(&st, "model.layers.1.self_attn.v_proj.bias.exp_avg_sq") != NULL);
  CHECK(ct_st_find(&st, "lm_head.weight.exp_avg") != NULL);
  CHECK(ct_st_find(&st, "lm_head.weight") == NULL);
  ct_st_close(&st);
  for (int b = 0; b < 2; b++) {
    memset(got, 0xff, bytes);
    CHECK_OK(ct_load_tensors(&ct_model_tensors(&m), got, path, suffixes[b]));
    CHECK(same_tensors(&m, got, &m, bufs[b]));
  }
  CHECK_FAILS(ct_load_tensors(&ct_model_tensors(&m), got, path, NULL), CT_EFORMAT, "model.embed_tokens.weight");
  free(got);
  free(sq);
  free(avg);
  ct_model_free(&m);
}

// ------------------------------------------------------------------------- checkpoints

static void test_ckpt_commit_renames_tmp_to_checkpoint_step_and_removes_tmp(void) {
  const char *out = tpath("run-commit");
  CHECK_OK(ct_mkdirs(out));
  char tmp[1024], want[1024];
  CHECK_OK(ct_ckpt_begin(out, 5, tmp, sizeof tmp));
  snprintf(want, sizeof want, "%s/.tmp-checkpoint-5", out);
  CHECK(strcmp(tmp, want) == 0);
  CHECK(is_dir(tmp) && count_entries(tmp) == 0);
  char p[1100];
  snprintf(p, sizeof p, "%s/trainer_state.json", tmp);
  put(p, "{\"global_step\": 5}");
  snprintf(p, sizeof p, "%s/model.safetensors", tmp);
  put(p, "weights");
  CHECK_OK(ct_ckpt_commit(out, 5, tmp));
  CHECK(!exists(tmp));
  CHECK(file_is(tpath("run-commit/checkpoint-5/trainer_state.json"), "{\"global_step\": 5}"));
  CHECK(file_is(tpath("run-commit/checkpoint-5/model.safetensors"), "weights"));
  CHECK(count_entries(out) == 1);  // nothing else left behind
}

static void test_ckpt_commit_of_the_same_step_replaces_it(void) {
  const char *out = tpath("run-replace");
  CHECK_OK(ct_mkdirs(out));
  char tmp[1024], p[1100];
  CHECK_OK(ct_ckpt_begin(out, 8, tmp, sizeof tmp));
  snprintf(p, sizeof p, "%s/first.txt", tmp);
  put(p, "1");
  CHECK_OK(ct_ckpt_commit(out, 8, tmp));
  CHECK_OK(ct_ckpt_begin(out, 8, tmp, sizeof tmp));
  snprintf(p, sizeof p, "%s/second.txt", tmp);
  put(p, "2");
  CHECK_OK(ct_ckpt_commit(out, 8, tmp));
  CHECK(!exists(tpath("run-replace/checkpoint-8/first.txt")));
  CHECK(file_is(tpath("run-replace/checkpoint-8/second.txt"), "2"));
  CHECK(!exists(tmp));
  CHECK(count_entries(out) == 1);  // no moved-aside old copy either
}

static void test_ckpt_begin_removes_a_stale_tmp_from_a_crash(void) {
  const char *out = tpath("run-stale");
  CHECK_OK(ct_mkdirs(tpath("run-stale/.tmp-checkpoint-7/nested/deeper")));
  put(tpath("run-stale/.tmp-checkpoint-7/model.safetensors"), "half a file");
  put(tpath("run-stale/.tmp-checkpoint-7/nested/deeper/x"), "x");
  make_ckpt_dir(out, "checkpoint-6", true);
  char tmp[1024], p[1100];
  CHECK_OK(ct_ckpt_begin(out, 7, tmp, sizeof tmp));
  CHECK(is_dir(tmp) && count_entries(tmp) == 0);
  CHECK(exists(tpath("run-stale/checkpoint-6/trainer_state.json")));  // the previous one is intact
  snprintf(p, sizeof p, "%s/trainer_state.json", tmp);
  put(p, "{}");
  CHECK_OK(ct_ckpt_commit(out, 7, tmp));
  CHECK(count_entries(tpath("run-stale/checkpoint-7")) == 1);
}

static void test_ckpt_begin_fails_rather_than_truncating_the_tmp_path(void) {
  const char *out = tpath("run-short");
  CHECK_OK(ct_mkdirs(out));
  make_ckpt_dir(out, "checkpoint-3", true);
  // Room for output_dir only: a silently cut path would be output_dir itself.
  char tmp[1024];
  size_t small = strlen(out) + 1;
  CHECK(ct_ckpt_begin(out, 9, tmp, small) != 0);
  CHECK(exists(tpath("run-short/checkpoint-3/trainer_state.json")));
}

static void test_ckpt_latest_picks_highest_complete_step_ignoring_others(void) {
  const char *out = tpath("run-latest");
  CHECK_OK(ct_mkdirs(out));
  make_ckpt_dir(out, "checkpoint-9", true);
  make_ckpt_dir(out, "checkpoint-10", true);
  make_ckpt_dir(out, "checkpoint-2", true);
  make_ckpt_dir(out, "checkpoint-12", false);  // incomplete: no trainer_state.json
  make_ckpt_dir(out, ".tmp-checkpoint-20", true);
  make_ckpt_dir(out, ".old-checkpoint-21", true);
  make_ckpt_dir(out, "checkpoint-abc", true);
  make_ckpt_dir(out, "checkpoint-", true);
  make_ckpt_dir(out, "checkpoint-30x", true);
  put(tpath("run-latest/checkpoint-40"), "a file, not a directory");
  char path[1024], want[1024];
  long step = -1;
  CHECK_OK(ct_ckpt_latest(out, path, sizeof path, &step));
  snprintf(want, sizeof want, "%s/checkpoint-10", out);
  CHECK(step == 10);
  CHECK(strcmp(path, want) == 0);
}

static void test_ckpt_latest_returns_a_directory_that_exists(void) {
  // checkpoint-007 either is ignored or is returned under its own name.
  const char *out = tpath("run-zeros");
  CHECK_OK(ct_mkdirs(out));
  make_ckpt_dir(out, "checkpoint-3", true);
  make_ckpt_dir(out, "checkpoint-007", true);
  char path[1024], p[1100];
  long step = -1;
  CHECK_OK(ct_ckpt_latest(out, path, sizeof path, &step));
  snprintf(p, sizeof p, "%s/trainer_state.json", path);
  if (!exists(p)) fprintf(stderr, "    returned %s (step %ld), which does not exist\n", path, step);
  CHECK(exists(p));
  CHECK(step == 3 || step == 7);
}

static void test_ckpt_latest_fails_with_eio_naming_the_dir_when_none_exists(void) {
  const char *out = tpath("run-none");
  CHECK_OK(ct_mkdirs(out));
  make_ckpt_dir(out, "checkpoint-4", false);
  make_ckpt_dir(out, ".tmp-checkpoint-5", true);
  make_ckpt_dir(out, "checkpoint-", true);
  make_ckpt_dir(out, "checkpoint-abc", true);
  char path[1024];
  long step = -1;
  CHECK_FAILS(ct_ckpt_latest(out, path, sizeof path, &step), CT_EIO, out);
  CHECK(step == -1);
  const char *missing = tpath("run-does-not-exist");
  CHECK_FAILS(ct_ckpt_latest(missing, path, sizeof path, &step), CT_EIO, missing);
}

static void test_ckpt_rotate_keeps_the_two_newest_by_numeric_step_and_other_files(void) {
  const char *out = tpath("run-rotate");
  CHECK_OK(ct_mkdirs(out));
  const char *ckpts[] = {"checkpoint-1", "checkpoint-2", "checkpoint-9", "checkpoint-10"};
  for (int i = 0; i < 4; i++) make_ckpt_dir(out, ckpts[i], true);
  make_ckpt_dir(out, ".tmp-checkpoint-11", true);
  make_ckpt_dir(out, "logs", true);
  put(tpath("run-rotate/metrics.jsonl"), "{}\n");
  put(tpath("run-rotate/config.yml"), "a: 1\n");
  CHECK_OK(ct_ckpt_rotate(out, 0));  // keep=0 keeps everything
  CHECK(count_entries(out) == 8);
  CHECK_OK(ct_ckpt_rotate(out, 2));
  CHECK(!exists(tpath("run-rotate/checkpoint-1")));
  CHECK(!exists(tpath("run-rotate/checkpoint-2")));
  CHECK(exists(tpath("run-rotate/checkpoint-9/trainer_state.json")));
  CHECK(exists(tpath("run-rotate/checkpoint-10/trainer_state.json")));
  CHECK(exists(tpath("run-rotate/.tmp-checkpoint-11/trainer_state.json")));
  CHECK(exists(tpath("run-rotate/logs/trainer_state.json")));
  CHECK(file_is(tpath("run-rotate/metrics.jsonl"), "{}\n"));
  CHECK(file_is(tpath("run-rotate/config.yml"), "a: 1\n"));
  CHECK(count_entries(out) == 6);
  CHECK_OK(ct_ckpt_rotate(out, 2));  // already at the limit: nothing more goes
  CHECK(count_entries(out) == 6);
}

// ------------------------------------------------------------------------- files and paths

static void test_publish_file_replaces_the_destination_atomically(void) {
  const char *dir = tpath("publish");
  CHECK_OK(ct_mkdirs(dir));
  put(tpath("publish/trainer_state.json"), "old");
  put(tpath("publish/.trainer_state.json.tmp"), "new content");
  CHECK_OK(ct_publish_file(tpath("publish/.trainer_state.json.tmp"), dir, "trainer_state.json"));
  CHECK(file_is(tpath("publish/trainer_state.json"), "new content"));
  CHECK(!exists(tpath("publish/.trainer_state.json.tmp")));
  put(tpath("publish/.fresh.tmp"), "fresh");  // a destination that does not exist yet
  CHECK_OK(ct_publish_file(tpath("publish/.fresh.tmp"), dir, "fresh.json"));
  CHECK(file_is(tpath("publish/fresh.json"), "fresh"));
  CHECK(count_entries(dir) == 2);
}

static void test_path_join_fails_instead_of_truncating(void) {
  char out[16];
  CHECK_OK(ct_path_join(out, sizeof out, "abcdef", "ghijklmn"));  // 15 chars: fits
  CHECK(strcmp(out, "abcdef/ghijklmn") == 0);
  CHECK(ct_path_join(out, sizeof out, "abcdef", "ghijklmno") != 0);  // 16 chars: does not
  char *dir = malloc(CT_PATH_MAX), *big = malloc(CT_PATH_MAX);
  memset(dir, 'd', CT_PATH_MAX - 10);
  dir[CT_PATH_MAX - 10] = 0;
  CHECK(ct_path_join(big, CT_PATH_MAX, dir, "model.safetensors") != 0);
  free(big);
  free(dir);
}

static void test_mkdirs_creates_nested_dirs_and_accepts_existing_ones(void) {
  CHECK_OK(ct_mkdirs(tpath("mk/a/b/c")));
  CHECK(is_dir(tpath("mk/a/b/c")));
  CHECK_OK(ct_mkdirs(tpath("mk/a/b/c")));
  CHECK_OK(ct_mkdirs(tpath("mk/a/b")));
  CHECK_OK(ct_mkdirs(tpath("mk/a/x/")));
  CHECK(is_dir(tpath("mk/a/x")));
}

static void test_mkdirs_fails_when_the_path_is_a_file(void) {
  CHECK_OK(ct_mkdirs(tpath("mkf")));
  put(tpath("mkf/plain"), "x");
  CHECK(ct_mkdirs(tpath("mkf/plain/sub")) != 0);
  CHECK(ct_mkdirs(tpath("mkf/plain")) != 0);
}

static void test_xxh64_matches_the_published_vectors(void) {
  CHECK(ct_xxh64("", 0, 0) == 0xEF46DB3751D8E999ULL);
  CHECK(ct_xxh64("a", 1, 0) == 0xD24EC4F1A98C6E5BULL);
  CHECK(ct_xxh64("abc", 3, 0) == 0x44BC2CF5AD770999ULL);
  const char *t = "Nobody inspects the spammish repetition";  // 39 bytes: stripes and a tail
  CHECK(ct_xxh64(t, strlen(t), 0) == 0xFBCEA83C8A378BF1ULL);
}

// A file past one 4 MiB block: the checksum chains the blocks, and one flipped bit shows.
static void test_file_checksum_chains_blocks_and_sees_one_flipped_bit(void) {
  const char *p = tpath("checksum.bin");
  long n = (4L << 20) + 1000;
  unsigned char *b = malloc((size_t)n);
  for (long i = 0; i < n; i++) b[i] = (unsigned char)(i * 7 + (i >> 13));
  FILE *f = fopen(p, "wb");
  CHECK(f && fwrite(b, 1, (size_t)n, f) == (size_t)n);
  fclose(f);
  uint64_t h, h2;
  long size;
  CHECK_OK(ct_file_checksum(p, &h, &size));
  CHECK(size == n);
  CHECK(h == ct_xxh64(b + (4L << 20), 1000, ct_xxh64(b, 4L << 20, 0)));
  b[(4L << 20) + 3] ^= 1;
  f = fopen(p, "wb");
  CHECK(f && fwrite(b, 1, (size_t)n, f) == (size_t)n);
  fclose(f);
  CHECK_OK(ct_file_checksum(p, &h2, &size));
  CHECK(h2 != h);
  CHECK(ct_file_checksum(tpath("no-such-file"), &h, &size) == CT_EIO);
  free(b);
}

int main(void) {
  if (scratch_make("/tmp/ct-test-ckpt-XXXXXX")) return 1;
  RUN(test_xxh64_matches_the_published_vectors);
  RUN(test_file_checksum_chains_blocks_and_sees_one_flipped_bit);
  RUN(test_hf_config_write_then_read_round_trips_every_field);
  RUN(test_hf_config_eos_token_id_list_reads_as_its_first_id);
  RUN(test_hf_config_read_rejects_unsupported_or_mistyped_keys_naming_file_and_key);
  RUN(test_hf_json_real_writes_floats_as_python_repr);
  RUN(test_hf_config_read_refuses_absurd_sizes_naming_the_key);
  RUN(test_hf_config_read_takes_rope_parameters_of_transformers_5);
  RUN(test_hf_config_read_rejects_heads_not_a_multiple_of_kv_heads_with_eformat);
  RUN(test_hf_config_read_reports_the_line_of_invalid_json);
  RUN(test_hf_config_read_rejects_a_json_array);
  RUN(test_hf_config_read_of_a_missing_file_is_eio_naming_it);
  RUN(test_f32_save_then_model_load_is_bit_exact);
  RUN(test_bf16_save_loads_as_bf16_rounded_parameters);
  RUN(test_tied_model_file_has_no_lm_head_and_untied_has_it);
  RUN(test_sharded_directory_loads_identically_to_single_file);
  RUN(test_load_fails_naming_a_missing_tensor);
  RUN(test_load_fails_on_a_wrong_shape_naming_tensor_and_both_shapes);
  RUN(test_read_config_refuses_a_config_its_weights_contradict_naming_the_key);
  RUN(test_load_fails_on_a_wrong_vector_shape_naming_both_shapes_as_vectors);
  RUN(test_load_fails_naming_an_extra_tensor_not_in_the_model);
  RUN(test_load_accepts_rotary_inv_freq_and_a_tied_models_lm_head);
  RUN(test_save_two_buffers_with_suffixes_restores_each_exactly);
  RUN(test_ckpt_commit_renames_tmp_to_checkpoint_step_and_removes_tmp);
  RUN(test_ckpt_commit_of_the_same_step_replaces_it);
  RUN(test_ckpt_begin_removes_a_stale_tmp_from_a_crash);
  RUN(test_ckpt_begin_fails_rather_than_truncating_the_tmp_path);
  RUN(test_ckpt_latest_picks_highest_complete_step_ignoring_others);
  RUN(test_ckpt_latest_returns_a_directory_that_exists);
  RUN(test_ckpt_latest_fails_with_eio_naming_the_dir_when_none_exists);
  RUN(test_ckpt_rotate_keeps_the_two_newest_by_numeric_step_and_other_files);
  RUN(test_publish_file_replaces_the_destination_atomically);
  RUN(test_path_join_fails_instead_of_truncating);
  RUN(test_mkdirs_creates_nested_dirs_and_accepts_existing_ones);
  RUN(test_mkdirs_fails_when_the_path_is_a_file);
  scratch_remove();
  for (int i = 0; i < n_tpaths; i++) free(tpaths[i]);
  return test_summary();
}
