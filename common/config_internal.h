// config_internal: what the config_*.c files share and nothing else includes: the key
// table's row type and the table itself (config_keys.c), the helpers over it, and each
// file's functions the others call. Callers use config.h.
//
//   config_keys.c   the key table, the trainers' names, the enums' names tables
//   config_value.c  one value: text to a typed field, checked against its row
//   config.c        the public API: init, set, lookup, free, compare; the command line
//   config_trl.c    TRL / transformers names: renamed, mapped or rejected
//   config_yml.c    yml files and their base_config chains
//   config_help.c   --help
//   config_write.c  config.yml and configs/base.yml
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <yaml.h>

#include "config_types.h"

// ---------------------------------------------------------------------------------
// The key table (config_keys.c)
// ---------------------------------------------------------------------------------

enum {
  K_BOOL,
  K_INT,    // int64_t
  K_FLOAT,  // double
  K_STR,    // char *
  K_ENUM,   // int, index into choices
  K_STR_LIST,
  K_FLOAT_LIST,
  K_INCLUDE,  // base_config: read by the file loader, stored nowhere
};

typedef struct {
  const char *name;  // as written in yml; model.* keys live in the `model:` block
  int type;
  unsigned trainers;  // CT_TRAINER_* mask of the trainers that accept the key
  size_t offset;      // of the field in ct_config
  const char *def;    // built-in default, written as in a yml
  const char *per_trainer[6];  // default for sft, dpo, grpo, distill, sampler, reward; NULL = def
  double lo, hi;               // range of numbers (and of float-list items)
  int lo_open, hi_open;
  int nonfinite;                // floats: inf and nan are allowed
  const char *const *choices;   // enum values, or allowed string-list items
  const char *const *per_trainer_choices[6];  // string-list items one trainer takes; NULL = choices
  const char *section;          // this row starts a section of base.yml
  const char *comment;          // one sentence or two for base.yml
  unsigned required;            // CT_TRAINER_* mask of the trainers that cannot run without it
  const char *bool_as[2];       // string and enum keys TRL also takes as booleans: the
                                // values true and false stand for ({true, false})
  const char *null_as;          // number keys whose TRL default is None: what null (~,
                                // null, nothing) stands for here (their "off" value)
} key_def;

#define NKINDS 6  // sft, dpo, grpo, distill, sampler, reward
#define MODEL_PREFIX "model."

extern const key_def config_keys[];  // in base.yml order
extern const int config_nkeys;
extern const char *const config_trainer_names[NKINDS];  // "sft", ..., by CT_TRAINER_* bit

static inline int is_model_key(const key_def *k) {
  return !strncmp(k->name, MODEL_PREFIX, strlen(MODEL_PREFIX));
}

static inline uint64_t model_bit(const key_def *k) {
  return UINT64_C(1) << ((k->offset - offsetof(ct_config, model)) / 4);
}

static inline void *field_of(ct_config *c, const key_def *k) { return (char *)c + k->offset; }
static inline const void *cfield_of(const ct_config *c, const key_def *k) {
  return (const char *)c + k->offset;
}

// ---------------------------------------------------------------------------------
// Trainers and keys (config.c)
// ---------------------------------------------------------------------------------

// 0..NKINDS-1 for one CT_TRAINER_* bit, else -1.
int config_trainer_index(ct_trainer_kind t);
// The trainers of a mask, "sft, distill".
void config_trainer_list(unsigned mask, char *buf, size_t n);
// The row of `name` ("seed", "model.hidden_size"), or -1.
int config_key_index(const char *name);
// Defaults for `t`; t == 0 gives the built-in defaults alone (for base.yml).
int config_init_for(ct_config *c, unsigned t);

// Where a message says a value came from.
#define WHERE(w) ((w) ? (w) : "default")

// Applies one value (a scalar, or a sequence of `doc`) to key `name`, a ctune or a TRL
// name. `path`: the file the node comes from (list items name their own line), NULL for
// the command line.
int config_apply_node(ct_config *c, const char *name, const yaml_node_t *v, yaml_document_t *doc,
                      const char *where, const char *path);
// key = text, as a plain scalar from the same place (a TRL key's mapping sets keys so).
int config_apply_text(ct_config *c, const char *name, const char *text, const char *where,
                      const char *path);

// ---------------------------------------------------------------------------------
// One value (config_value.c)
// ---------------------------------------------------------------------------------

// A value quoted for a one-line message: at most 60 bytes, control characters as '?'.
const char *config_show(const char *s, char *buf, size_t n);
// YAML 1.1 null: ~, null, Null, NULL, or nothing at all.
int config_is_null_word(const char *s);
char *config_dup_str(const char *s);
// Shortest text that strtod reads back as exactly v, always recognisable as a float.
void config_fmt_double(double v, char *buf, size_t n);
// Key k's range: "[0, inf)", "[1, 65536]".
void config_fmt_range(const key_def *k, char *buf, size_t n);

// Records where key k's value came from (where == NULL: the default).
int config_set_origin(ct_config *c, int k, const char *where);
// A scalar value for key ki. `plain`: an unquoted scalar, where ~, null and nothing are
// null, true and false may stand for a TRL spelling (bool_as), and a list key's text
// splits at commas; a quoted scalar is the string itself (one item of a list key).
int config_set_scalar(ct_config *c, int ki, const char *text, int plain, const char *where);
// A list key from its items (already split and trimmed).
int config_set_list(ct_config *c, int ki, char **items, int n, const char *where);
// Frees the items of a list field f of key k.
void config_free_list(const key_def *k, void *f);

// ---------------------------------------------------------------------------------
// TRL / transformers names (config_trl.c)
// ---------------------------------------------------------------------------------

// A TrainingArguments (or TRL config) name ctune does not use: renamed to `ctune`, or
// its value mapped by `map`, or rejected with `note` (what to use instead).
typedef struct {
  const char *name;
  const char *ctune;
  int (*map)(ct_config *c, const char *name, const char *value, const char *where, const char *path);
  const char *note;
} trl_key;

// The TRL name's row, or NULL.
const trl_key *config_trl_find(const char *name);
// A TRL key's value (a scalar), renamed, mapped or rejected.
int config_apply_trl(ct_config *c, const trl_key *t, const yaml_node_t *v, yaml_document_t *doc,
                     const char *where, const char *path);

// ---------------------------------------------------------------------------------
// yml files (config_yml.c)
// ---------------------------------------------------------------------------------

// Every bad key of a run, one line each, reported together (up to what a message holds).
typedef struct {
  char text[900];
  int n, dropped;
} config_bad_keys;

// rc == CT_ECONFIG: the message joins the list and loading goes on (returns 0); any
// other failure stops it (returned as is).
int config_bad_note(config_bad_keys *b, int rc);
// 0, or one CT_ECONFIG message listing every bad key.
int config_bad_result(const config_bad_keys *b);
// Loads the user's yml file `path` (after its base_config chain) into c; a bad key joins
// `bad` and the keys after it still load; the file's own errors return.
int config_load_yml(ct_config *c, const char *path, config_bad_keys *bad);

// "a list", "a mapping" or "a value".
const char *config_node_kind(const yaml_node_t *n);
// A scalar holding a NUL: an error naming the key.
int config_scalar_ok(const yaml_node_t *n, const char *where, const char *key);

// ---------------------------------------------------------------------------------
// Writing (config_write.c)
// ---------------------------------------------------------------------------------

// Key k's value in c as yml ("3.0", "[a, \"b c\"]").
void config_write_value(FILE *f, const ct_config *c, const key_def *k);
