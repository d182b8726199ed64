// config: the public API over the key table (config_keys.c): init with the built-in and
// per-trainer defaults, one key set from text or a YAML node (a ctune or a TRL name; the
// closest key named when unknown), the command line (key=value after a yml file), the
// defaults that depend on other keys, required keys, origins, compare, free. Parsing one
// value is config_value.c's, yml files config_yml.c's, writing config_write.c's.
#include "config.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "config_internal.h"
#include "error.h"

// ---------------------------------------------------------------------------------
// Trainers and keys
// ---------------------------------------------------------------------------------

const char *ct_trainer_name(ct_trainer_kind t) {
  for (int i = 0; i < NKINDS; i++)
    if ((unsigned)t == 1u << i) return config_trainer_names[i];
  return NULL;
}

int ct_trainer_from_name(const char *name, ct_trainer_kind *out) {
  for (int i = 0; i < NKINDS; i++)
    if (!strcmp(name, config_trainer_names[i])) {
      *out = (ct_trainer_kind)(1u << i);
      return 0;
    }
  return ct_set_error(CT_EINVAL, "unknown trainer '%s' (expected sft, dpo, grpo, distill, sampler or reward)",
                      name);
}

int config_trainer_index(ct_trainer_kind t) {
  for (int i = 0; i < NKINDS; i++)
    if ((unsigned)t == 1u << i) return i;
  return -1;
}

// "sft, distill"
void config_trainer_list(unsigned mask, char *buf, size_t n) {
  buf[0] = 0;
  for (int i = 0; i < NKINDS; i++)
    if (mask & (1u << i))
      snprintf(buf + strlen(buf), n - strlen(buf), "%s%s", buf[0] ? ", " : "",
               config_trainer_names[i]);
}

int config_key_index(const char *name) {
  for (int i = 0; i < config_nkeys; i++)  // the first byte before strcmp: most keys differ there
    if (config_keys[i].name[0] == name[0] && !strcmp(config_keys[i].name, name)) return i;
  return -1;
}

// Edit distance (insert, delete, substitute) between short strings, exact up to `limit`:
// any distance above it comes back as limit + 1 (the distance is at least the length
// difference and at least the smallest entry of each row, so those end the work early).
static int edit_distance(const char *a, const char *b, int limit) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 63 || lb > 63 || (la > lb ? la - lb : lb - la) > (size_t)limit) return limit + 1;
  int row[64];
  for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    int diag = row[0], low = (int)i;
    row[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int up = row[j];
      int best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
      if (best < low) low = best;
    }
    if (low > limit) return limit + 1;
  }
  return row[lb] <= limit ? row[lb] : limit + 1;
}

// The known key closest to a misspelt one, preferring keys this trainer accepts:
// small edit distance to the full name or to the name inside the model block, else a
// known key that contains it ("batch_size" -> per_device_train_batch_size).
static const char *suggest_key(const char *name, ct_trainer_kind t) {
  for (int pass = 0; pass < 2; pass++) {
    const char *best = NULL;
    int best_score = 1000;
    size_t len = strlen(name);
    int limit = len < 6 ? 1 : len < 12 ? 2 : 3;
    for (int i = 0; i < config_nkeys; i++) {
      const key_def *k = &config_keys[i];
      if (pass == 0 && !(k->trainers & (unsigned)t)) continue;
      int d = edit_distance(name, k->name, limit);
      if (is_model_key(k)) {
        int d2 = edit_distance(name, k->name + strlen(MODEL_PREFIX), limit);
        if (d2 < d) d = d2;
      }
      int score = d <= limit ? d : len >= 4 && strstr(k->name, name) ? limit + 1 : 1000;
      if (score < best_score) best_score = score, best = k->name;
    }
    if (best) return best;
  }
  return NULL;
}

// The row for `name` if this trainer accepts it; a message naming the closest key otherwise.
static int lookup(const ct_config *c, const char *name, const char *where) {
  char b[64];
  int i = config_key_index(name);
  if (i < 0 && !strcmp(name, "model"))
    return ct_set_error(CT_ECONFIG, "%s: key 'model' is a block: set its keys as "
                        "model.<key>=value", WHERE(where));
  if (i < 0) {
    const char *s = suggest_key(name, c->trainer);
    if (s)
      return ct_set_error(CT_ECONFIG, "%s: unknown key '%s' (did you mean '%s'?)",
                          WHERE(where), config_show(name, b, sizeof b), s);
    return ct_set_error(CT_ECONFIG, "%s: unknown key '%s' (configs/base.yml lists every key)",
                        WHERE(where), config_show(name, b, sizeof b));
  }
  if (!(config_keys[i].trainers & (unsigned)c->trainer)) {
    char list[64];
    config_trainer_list(config_keys[i].trainers, list, sizeof list);
    return ct_set_error(CT_ECONFIG, "%s: key '%s' does not apply to %s (only to %s)",
                        WHERE(where), name, ct_trainer_name(c->trainer), list);
  }
  return i;
}

// ---------------------------------------------------------------------------------
// Init, set, free, compare
// ---------------------------------------------------------------------------------

void ct_config_free(ct_config *c) {
  if (!c) return;
  for (int i = 0; i < config_nkeys; i++) {
    const key_def *k = &config_keys[i];
    if (k->type == K_STR) free(*(char **)field_of(c, k));
    if (k->type == K_STR_LIST || k->type == K_FLOAT_LIST) config_free_list(k, field_of(c, k));
    if (c->origin_) free(c->origin_[i]);
  }
  free(c->origin_);
  free(c->ignored_);
  memset(c, 0, sizeof *c);
}

// Defaults for `t`; t == 0 gives the built-in defaults alone (for base.yml).
int config_init_for(ct_config *c, unsigned t) {
  memset(c, 0, sizeof *c);
  c->trainer = (ct_trainer_kind)t;
  if (!(c->origin_ = calloc(config_nkeys, sizeof *c->origin_)))
    return ct_set_error(CT_ENOMEM, "out of memory");
  int ti = config_trainer_index((ct_trainer_kind)t);
  for (int i = 0; i < config_nkeys; i++) {
    const key_def *k = &config_keys[i];
    if (k->type == K_INCLUDE) continue;
    const char *def = ti >= 0 && k->per_trainer[ti] ? k->per_trainer[ti] : k->def;
    int rc = config_set_scalar(c, i, def, 1, NULL);
    if (rc) {
      ct_config_free(c);
      return ct_wrap_error(rc, "built-in default of '%s'", k->name);
    }
  }
  return 0;
}

int ct_config_init(ct_config *c, ct_trainer_kind trainer) {
  if (config_trainer_index(trainer) < 0) {
    memset(c, 0, sizeof *c);
    return ct_set_error(CT_EINVAL, "ct_config_init: %d is not one trainer", (int)trainer);
  }
  return config_init_for(c, (unsigned)trainer);
}

int ct_config_set(ct_config *c, const char *key, const char *value, const char *origin) {
  return config_apply_text(c, key, value ? value : "", origin ? origin : "command line", NULL);
}

int ct_config_check_required(const ct_config *c) {
  for (int i = 0; i < config_nkeys; i++) {
    const key_def *k = &config_keys[i];
    if (!(k->required & c->trainer) || k->type != K_STR) continue;
    if (!(*(char *const *)((const char *)c + k->offset))[0])
      return ct_set_error(CT_ECONFIG, "%s: key '%s' is required (%s)", ct_config_origin(c, k->name),
                          k->name, k->comment);
  }
  return 0;
}

const char *ct_config_ignored(const ct_config *c) { return c->ignored_ ? c->ignored_ : ""; }

bool ct_config_is_set(const ct_config *c, const char *key) {
  const char *o = ct_config_origin(c, key);
  return o && strcmp(o, "default") != 0;
}

const char *ct_config_origin(const ct_config *c, const char *key) {
  int i = config_key_index(key);
  if (i < 0) return NULL;
  return c->origin_ && c->origin_[i] ? c->origin_[i] : "default";
}

int ct_config_num_keys(void) { return config_nkeys; }
const char *ct_config_key_name(int i) { return i >= 0 && i < config_nkeys ? config_keys[i].name : NULL; }

static int same_double(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

const char *ct_config_diff(const ct_config *a, const ct_config *b) {
  if (a->trainer != b->trainer) return "trainer";
  for (int i = 0; i < config_nkeys; i++) {
    const key_def *k = &config_keys[i];
    const void *fa = cfield_of(a, k), *fb = cfield_of(b, k);
    int same = 1;
    switch (k->type) {
      case K_BOOL:
      case K_ENUM: same = *(const int *)fa == *(const int *)fb; break;
      case K_INT: same = *(const int64_t *)fa == *(const int64_t *)fb; break;
      case K_FLOAT: same = same_double(*(const double *)fa, *(const double *)fb); break;
      case K_STR: same = !strcmp(*(char *const *)fa, *(char *const *)fb); break;
      case K_STR_LIST: {
        const ct_str_list *la = fa, *lb = fb;
        same = la->n == lb->n;
        for (int j = 0; same && j < la->n; j++) same = !strcmp(la->v[j], lb->v[j]);
        break;
      }
      case K_FLOAT_LIST: {
        const ct_float_list *la = fa, *lb = fb;
        same = la->n == lb->n;
        for (int j = 0; same && j < la->n; j++) same = same_double(la->v[j], lb->v[j]);
        break;
      }
      default: break;
    }
    if (!same) return k->name;
  }
  if (a->model.set_mask != b->model.set_mask) return "model.set_mask";
  return NULL;
}

// ---------------------------------------------------------------------------------
// Applying values
// ---------------------------------------------------------------------------------

// A lone plain scalar outside any document (a command-line value typed as it is).
static yaml_node_t plain_node(const char *text) {
  yaml_node_t n;
  memset(&n, 0, sizeof n);
  n.type = YAML_SCALAR_NODE;
  n.data.scalar.value = (yaml_char_t *)text;
  n.data.scalar.length = strlen(text);
  n.data.scalar.style = YAML_PLAIN_SCALAR_STYLE;
  return n;
}

// key = text, as a plain scalar from the same place (a TRL key's mapping sets keys so).
int config_apply_text(ct_config *c, const char *name, const char *text, const char *where,
                      const char *path) {
  yaml_node_t n = plain_node(text);
  return config_apply_node(c, name, &n, NULL, where, path);
}

// bin/sampler reads a trainer's yml or a run's config.yml for the keys it uses: a key
// from a file that only trainers take is skipped (and listed by ct_config_ignored).
static int sampler_skips(const ct_config *c, const char *name, const char *path) {
  if (!path || c->trainer != CT_TRAINER_SAMPLER) return 0;
  int i = config_key_index(name);
  if (i >= 0) return !(config_keys[i].trainers & CT_TRAINER_SAMPLER);
  const trl_key *t = config_trl_find(name);
  return t && !(t->ctune && (config_keys[config_key_index(t->ctune)].trainers & CT_TRAINER_SAMPLER));
}

static int note_ignored(ct_config *c, const char *name) {
  size_t len = c->ignored_ ? strlen(c->ignored_) : 0, n = strlen(name);
  for (const char *p = c->ignored_; p && (p = strstr(p, name)); p += n)
    if ((p == c->ignored_ || p[-1] == ' ') && (!p[n] || p[n] == ',')) return 0;  // listed
  char *r = realloc(c->ignored_, len + n + 3);
  if (!r) return ct_set_error(CT_ENOMEM, "out of memory");
  snprintf(r + len, n + 3, "%s%s", len ? ", " : "", name);
  c->ignored_ = r;
  return 0;
}

// Applies one value (a scalar, or a sequence of `doc`) to key `name`. `path`: the file
// the node comes from (list items name their own line), NULL for the command line.
int config_apply_node(ct_config *c, const char *name, const yaml_node_t *v, yaml_document_t *doc,
                      const char *where, const char *path) {
  if (sampler_skips(c, name, path)) return note_ignored(c, name);
  const trl_key *t = config_key_index(name) < 0 ? config_trl_find(name) : NULL;
  if (t) return config_apply_trl(c, t, v, doc, where, path);
  int ki = lookup(c, name, where);
  if (ki < 0) return ki;
  const key_def *k = &config_keys[ki];
  if (k->type == K_INCLUDE)
    return ct_set_error(CT_ECONFIG, "%s: key 'base_config' can only be given in a yml file", where);
  int is_list = k->type == K_STR_LIST || k->type == K_FLOAT_LIST;
  if (v->type == YAML_SCALAR_NODE) {
    if (config_scalar_ok(v, where, k->name)) return CT_ECONFIG;
    return config_set_scalar(c, ki, (const char *)v->data.scalar.value,
                             v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE, where);
  }
  if (v->type == YAML_SEQUENCE_NODE && is_list) {
    int n = (int)(v->data.sequence.items.top - v->data.sequence.items.start), rc = 0;
    char **items = calloc((size_t)n + 1, sizeof *items);
    if (!items) return ct_set_error(CT_ENOMEM, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
      yaml_node_t *it = yaml_document_get_node(doc, v->data.sequence.items.start[i]);
      char iwhere[PATH_MAX + 32];
      if (path) snprintf(iwhere, sizeof iwhere, "%s:%lu", path, (unsigned long)it->start_mark.line + 1);
      else snprintf(iwhere, sizeof iwhere, "%s", where);
      if (it->type != YAML_SCALAR_NODE)
        rc = ct_set_error(CT_ECONFIG, "%s: key '%s': list items must be values, got %s",
                          iwhere, k->name, config_node_kind(it));
      else if (!(rc = config_scalar_ok(it, iwhere, k->name)))
        items[i] = (char *)it->data.scalar.value;  // as YAML gives it: quoted blanks stay
    }
    if (!rc) rc = config_set_list(c, ki, items, n, where);
    free(items);
    return rc;
  }
  static const char *const expected[] = {
      [K_BOOL] = "a boolean", [K_INT] = "an integer", [K_FLOAT] = "a number",
      [K_STR] = "a string",   [K_ENUM] = "one value", [K_STR_LIST] = "a list",
      [K_FLOAT_LIST] = "a list", [K_INCLUDE] = "a file name"};
  return ct_set_error(CT_ECONFIG, "%s: key '%s': expected %s, got %s", where, k->name,
                      expected[k->type], config_node_kind(v));
}

// ---------------------------------------------------------------------------------
// The command line
// ---------------------------------------------------------------------------------

// A command-line value is YAML where YAML syntax says what plain text would not: a
// quoted scalar ("my out", "\n") for any key, a flow sequence ([a, "b,c"]) for a list
// key. Anything else is taken as typed, as a plain scalar: regexes, prompts holding ": "
// or " #", paths (where YAML would read a comment, a mapping or an error).
static int cli_is_yaml(const char *name, const char *text) {
  int i = config_key_index(name);
  const trl_key *t = i < 0 ? config_trl_find(name) : NULL;
  if (t && t->ctune) i = config_key_index(t->ctune);
  int list = i >= 0 && (config_keys[i].type == K_STR_LIST || config_keys[i].type == K_FLOAT_LIST);
  while (*text == ' ' || *text == '\t') text++;
  return *text == '"' || *text == '\'' || (*text == '[' && list);
}

// The value text of a command-line key=value as one YAML node, through libyaml.
static int cli_yaml_value(const char *name, const char *text, yaml_document_t *doc) {
  yaml_parser_t p;
  yaml_document_t extra;
  if (!yaml_parser_initialize(&p)) return ct_set_error(CT_ENOMEM, "out of memory");
  yaml_parser_set_input_string(&p, (const unsigned char *)text, strlen(text));
  int rc = 0, loaded = yaml_parser_load(&p, doc);
  if (loaded && yaml_parser_load(&p, &extra)) {
    if (yaml_document_get_root_node(&extra))
      rc = ct_set_error(CT_ECONFIG, "command line: key '%s': the value is more than one YAML value", name);
    yaml_document_delete(&extra);
  } else if (p.error == YAML_MEMORY_ERROR) {
    rc = ct_set_error(CT_ENOMEM, "out of memory");
  } else {
    rc = ct_set_error(CT_ECONFIG, "command line: key '%s': YAML syntax error in the value at "
                      "column %lu: %s", name, (unsigned long)p.problem_mark.column + 1,
                      p.problem ? p.problem : "invalid YAML");
  }
  if (loaded && rc) yaml_document_delete(doc);
  yaml_parser_delete(&p);
  return rc;
}

// One command-line argument, key=value.
static int apply_arg(ct_config *c, const char *arg) {
  char b[64];
  const char *eq = strchr(arg, '=');
  if (!eq)
    return ct_set_error(CT_ECONFIG, "command line: argument '%s' is not key=value (only the "
                        "first argument may be a yml file)", config_show(arg, b, sizeof b));
  char *key = malloc((size_t)(eq - arg) + 1);
  if (!key) return ct_set_error(CT_ENOMEM, "out of memory");
  memcpy(key, arg, (size_t)(eq - arg));
  key[eq - arg] = 0;
  int rc;
  if (cli_is_yaml(key, eq + 1)) {
    yaml_document_t doc;
    if (!(rc = cli_yaml_value(key, eq + 1, &doc))) {
      rc = config_apply_node(c, key, yaml_document_get_root_node(&doc), &doc, "command line", NULL);
      yaml_document_delete(&doc);
    }
  } else {
    rc = config_apply_text(c, key, eq + 1, "command line", NULL);
  }
  free(key);
  return rc;
}

// Defaults that depend on another key, applied once every key is read, so that the run,
// its config.yml and its resume all see the value used: DPO's beta is 2.0 when loss_type
// holds simpo (SimPO's paper and torchtune's SimPOLoss; TRL's CPOConfig keeps 0.1).
static int resolve_dependent_defaults(ct_config *c) {
  if (c->trainer != CT_TRAINER_DPO || ct_config_is_set(c, "beta")) return 0;
  for (int k = 0; k < c->loss_type.n; k++)
    if (!strcmp(c->loss_type.v[k], "simpo")) {
      c->beta = 2.0;
      return config_set_origin(c, config_key_index("beta"), "default with loss_type simpo");
    }
  return 0;
}

int ct_config_from_args(ct_config *c, ct_trainer_kind t, int argc, char **argv) {
  int rc = ct_config_init(c, t), i = 1;
  if (rc) return rc;
  config_bad_keys bad = {.n = 0};
  if (argc > 1 && !strchr(argv[1], '=')) {
    const char *ext = strrchr(argv[1], '.');
    int yml_name = ext && (!strcmp(ext, ".yml") || !strcmp(ext, ".yaml"));
    if (!yml_name && access(argv[1], F_OK) != 0) {
      char b[64];
      rc = ct_set_error(CT_ECONFIG, "command line: '%s' is neither key=value nor a yml file",
                        config_show(argv[1], b, sizeof b));
      goto fail;
    }
    if ((rc = config_bad_note(&bad, config_load_yml(c, argv[1], &bad)))) goto fail;
    i = 2;
  }
  for (; i < argc; i++)
    if ((rc = config_bad_note(&bad, apply_arg(c, argv[i])))) goto fail;
  if (!(rc = config_bad_result(&bad)) && !(rc = resolve_dependent_defaults(c))) return 0;
fail:
  ct_config_free(c);
  return rc;
}
