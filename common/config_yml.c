// config_yml: yml files (libyaml's document API) applied to a ct_config: one document,
// a mapping of keys with a `model:` block, no duplicates; base_config chains loaded
// first, relative to the file that names them, with cycles and depth caught. Every bad
// key of a run is collected and reported together (config_bad_keys).
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

#include "config.h"
#include "config_internal.h"
#include "error.h"

#define MAX_INCLUDE_DEPTH 16

typedef struct {
  const char *name;  // canonical: "seed", "model.hidden_size"; "model" marks the block
  char *owned;       // name storage for model.* entries
  int line;          // 1-based line of the key
  yaml_node_t *value;
} entry;

typedef struct {
  const char *path[MAX_INCLUDE_DEPTH + 1];  // as shown in messages
  char *real[MAX_INCLUDE_DEPTH + 1];        // realpath, to detect cycles
  int depth;
} include_chain;

static int load_file(ct_config *c, const char *path, include_chain *chain, const char *from,
                     config_bad_keys *bad);

const char *config_node_kind(const yaml_node_t *n) {
  return n->type == YAML_SEQUENCE_NODE ? "a list" : n->type == YAML_MAPPING_NODE ? "a mapping"
                                                                                 : "a value";
}

static int scalar_is_null(const yaml_node_t *n) {
  return n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
         config_is_null_word((const char *)n->data.scalar.value);
}

int config_scalar_ok(const yaml_node_t *n, const char *where, const char *key) {
  if (strlen((const char *)n->data.scalar.value) != n->data.scalar.length)
    return ct_set_error(CT_ECONFIG, "%s: key '%s': value contains a NUL character", where, key);
  return 0;
}

// Applies one `key: value` pair of a file.
static int apply_entry(ct_config *c, const entry *e, yaml_document_t *doc, const char *path) {
  char where[PATH_MAX + 32];
  snprintf(where, sizeof where, "%s:%d", path, e->line);
  return config_apply_node(c, e->name, e->value, doc, where, path);
}

// rc == CT_ECONFIG: the message joins the list and loading goes on (returns 0); any
// other failure stops it (returned as is).
int config_bad_note(config_bad_keys *b, int rc) {
  if (rc != CT_ECONFIG) return rc;
  size_t len = strlen(b->text), need = strlen(ct_last_error()) + (len > 0);
  if (len && len + need >= sizeof b->text) b->dropped++;
  else snprintf(b->text + len, sizeof b->text - len, "%s%s", len ? "\n" : "", ct_last_error());
  b->n++;
  return 0;
}

int config_bad_result(const config_bad_keys *b) {
  if (!b->n) return 0;
  if (b->dropped) return ct_set_error(CT_ECONFIG, "%s\n(and %d more)", b->text, b->dropped);
  return ct_set_error(CT_ECONFIG, "%s", b->text);
}

// base_config is relative to the directory of the file that names it.
static char *join_relative(const char *file, const char *rel) {
  const char *slash = strrchr(file, '/');
  size_t dir = rel[0] == '/' || !slash ? 0 : (size_t)(slash - file) + 1;
  char *r = malloc(dir + strlen(rel) + 1);
  if (r) memcpy(r, file, dir), strcpy(r + dir, rel);
  return r;
}

static int add_entry(entry **es, int *n, int *cap, const entry *e, const char *path) {
  for (int i = 0; i < *n; i++)
    if (!strcmp((*es)[i].name, e->name))
      return ct_set_error(CT_ECONFIG, "%s:%d: duplicate key '%s' (first at line %d)", path,
                          e->line, e->name, (*es)[i].line);
  if (*n == *cap) {
    int nc = *cap ? 2 * *cap : 32;
    entry *ne = realloc(*es, (size_t)nc * sizeof *ne);
    if (!ne) return ct_set_error(CT_ENOMEM, "out of memory");
    *es = ne, *cap = nc;
  }
  (*es)[(*n)++] = *e;
  return 0;
}

// The name of pair p's key, its line in *line; NULL (the error set) when the key is not a
// scalar.
static const char *key_name(yaml_document_t *doc, const yaml_node_pair_t *p, const char *path, int *line) {
  yaml_node_t *k = yaml_document_get_node(doc, p->key);
  *line = (int)k->start_mark.line + 1;
  if (k->type == YAML_SCALAR_NODE) return (const char *)k->data.scalar.value;
  ct_set_error(CT_ECONFIG, "%s:%d: a key must be a name, got %s", path, *line, config_node_kind(k));
  return NULL;
}

// Flattens the document into entries (the model block becomes model.* entries),
// rejecting duplicates and anything that is not a mapping of names.
static int collect_entries(yaml_document_t *doc, const char *path, entry **es, int *n) {
  yaml_node_t *root = yaml_document_get_root_node(doc);
  int cap = 0, rc = 0;
  *es = NULL, *n = 0;
  if (!root) return 0;  // an empty file
  if (root->type != YAML_MAPPING_NODE) {
    if (scalar_is_null(root)) return 0;
    return ct_set_error(CT_ECONFIG, "%s:%lu: expected `key: value` lines at the top level, got %s",
                        path, (unsigned long)root->start_mark.line + 1,
                        root->type == YAML_SEQUENCE_NODE ? "a list" : "a lone value");
  }
  for (yaml_node_pair_t *p = root->data.mapping.pairs.start;
       !rc && p < root->data.mapping.pairs.top; p++) {
    yaml_node_t *vn = yaml_document_get_node(doc, p->value);
    int line;
    const char *name = key_name(doc, p, path, &line);
    if (!name) return CT_ECONFIG;
    entry e = {name, NULL, line, vn};
    if (strcmp(name, "model") != 0) {
      rc = add_entry(es, n, &cap, &e, path);
      continue;
    }
    e.value = NULL;  // marks the block, so that a second `model:` is a duplicate
    if ((rc = add_entry(es, n, &cap, &e, path))) break;
    if (scalar_is_null(vn)) continue;  // `model:` with every key commented out
    if (vn->type != YAML_MAPPING_NODE)
      return ct_set_error(CT_ECONFIG, "%s:%d: key 'model': expected a block of model.* keys, "
                          "got %s", path, line, config_node_kind(vn));
    for (yaml_node_pair_t *q = vn->data.mapping.pairs.start;
         !rc && q < vn->data.mapping.pairs.top; q++) {
      int sline;
      const char *sub = key_name(doc, q, path, &sline);
      if (!sub) return CT_ECONFIG;
      entry se = {NULL, malloc(strlen(MODEL_PREFIX) + strlen(sub) + 1), sline,
                  yaml_document_get_node(doc, q->value)};
      if (!se.owned) return ct_set_error(CT_ENOMEM, "out of memory");
      strcpy(se.owned, MODEL_PREFIX), strcat(se.owned, sub);
      se.name = se.owned;
      if ((rc = add_entry(es, n, &cap, &se, path))) free(se.owned);
    }
  }
  return rc;
}

static int yaml_error(yaml_parser_t *p, const char *path) {
  if (p->error == YAML_MEMORY_ERROR) return ct_set_error(CT_ENOMEM, "%s: out of memory", path);
  if (p->error == YAML_READER_ERROR)
    return ct_set_error(CT_ECONFIG, "%s: byte %lu: %s (a yml file must be UTF-8 text)", path,
                        (unsigned long)p->problem_offset, p->problem ? p->problem : "bad input");
  char ctx[128] = "";
  if (p->context)
    snprintf(ctx, sizeof ctx, " (%s, from line %lu)", p->context,
             (unsigned long)p->context_mark.line + 1);
  return ct_set_error(CT_ECONFIG, "%s:%lu: YAML syntax error: %s%s", path,
                      (unsigned long)p->problem_mark.line + 1,
                      p->problem ? p->problem : "invalid YAML", ctx);
}

// Loads base_config (if any) into c, then this file's keys. `from` is where this file
// was named ("a.yml:1"), NULL for the file given by the user. A bad key joins `bad` and
// the keys after it still load; the file's own errors (syntax, a missing base) return.
static int load_file(ct_config *c, const char *path, include_chain *chain, const char *from,
                     config_bad_keys *bad) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (from)
      return ct_set_error(CT_ECONFIG, "%s: base_config: cannot open %s: %s", from, path,
                          strerror(errno));
    return ct_set_error(CT_ECONFIG, "%s: cannot open: %s", path, strerror(errno));
  }
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
    fclose(f);
    if (from) return ct_set_error(CT_ECONFIG, "%s: base_config: %s is a directory", from, path);
    return ct_set_error(CT_ECONFIG, "%s: cannot open: is a directory", path);
  }
  char *real = realpath(path, NULL);
  if (!real) real = config_dup_str(path);
  if (!real) {
    fclose(f);
    return ct_set_error(CT_ENOMEM, "out of memory");
  }
  for (int i = 0; i < chain->depth; i++) {
    if (strcmp(chain->real[i], real) != 0) continue;
    char cyc[1024] = "";
    for (int j = i; j < chain->depth; j++)
      snprintf(cyc + strlen(cyc), sizeof cyc - strlen(cyc), "%s -> ", chain->path[j]);
    snprintf(cyc + strlen(cyc), sizeof cyc - strlen(cyc), "%s", path);
    free(real), fclose(f);
    return ct_set_error(CT_ECONFIG, "%s: base_config cycle: %s", from, cyc);
  }
  if (chain->depth == MAX_INCLUDE_DEPTH) {
    free(real), fclose(f);
    return ct_set_error(CT_ECONFIG, "%s: base_config chain is deeper than %d files", from,
                        MAX_INCLUDE_DEPTH);
  }
  chain->path[chain->depth] = path;
  chain->real[chain->depth++] = real;

  yaml_parser_t parser;
  yaml_document_t doc, extra;
  int rc = 0, have_doc = 0, n = 0;
  entry *es = NULL;
  char *base = NULL;
  if (!yaml_parser_initialize(&parser)) {
    rc = ct_set_error(CT_ENOMEM, "out of memory");
    goto out_file;
  }
  yaml_parser_set_input_file(&parser, f);
  if (!yaml_parser_load(&parser, &doc)) {
    rc = yaml_error(&parser, path);
    goto out_parser;
  }
  have_doc = 1;
  // A config file is one document: a second `---` is most likely a mistake.
  if (!yaml_parser_load(&parser, &extra)) {
    rc = yaml_error(&parser, path);
    goto out_parser;
  }
  yaml_node_t *extra_root = yaml_document_get_root_node(&extra);
  if (extra_root)
    rc = ct_set_error(CT_ECONFIG, "%s:%lu: a config file holds one YAML document; this is a "
                      "second one", path, (unsigned long)extra_root->start_mark.line + 1);
  yaml_document_delete(&extra);
  if (rc || (rc = collect_entries(&doc, path, &es, &n))) goto out_parser;

  // The base first, wherever base_config appears, so that this file's keys win.
  for (int i = 0; i < n && !rc; i++) {
    if (strcmp(es[i].name, "base_config") != 0) continue;
    char where[PATH_MAX + 32];
    snprintf(where, sizeof where, "%s:%d", path, es[i].line);
    yaml_node_t *v = es[i].value;
    if (v->type != YAML_SCALAR_NODE) {
      rc = ct_set_error(CT_ECONFIG, "%s: key 'base_config': expected a file name, got %s", where,
                        config_node_kind(v));
      break;
    }
    if (scalar_is_null(v) || !v->data.scalar.value[0]) continue;
    if (!(base = join_relative(path, (const char *)v->data.scalar.value))) {
      rc = ct_set_error(CT_ENOMEM, "out of memory");
      break;
    }
    rc = config_bad_note(bad, load_file(c, base, chain, where, bad));
  }
  for (int i = 0; i < n && !rc; i++)
    if (es[i].value && strcmp(es[i].name, "base_config") != 0)
      rc = config_bad_note(bad, apply_entry(c, &es[i], &doc, path));

out_parser:
  for (int i = 0; i < n; i++) free(es[i].owned);
  free(es);
  free(base);
  if (have_doc) yaml_document_delete(&doc);
  yaml_parser_delete(&parser);
out_file:
  fclose(f);
  free(chain->real[--chain->depth]);
  return rc;
}

int config_load_yml(ct_config *c, const char *path, config_bad_keys *bad) {
  include_chain chain = {.depth = 0};
  return load_file(c, path, &chain, NULL, bad);
}

int ct_config_load_file(ct_config *c, const char *path) {
  config_bad_keys bad = {.n = 0};
  int rc = config_bad_note(&bad, config_load_yml(c, path, &bad));
  return rc ? rc : config_bad_result(&bad);
}
