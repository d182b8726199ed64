// config_value: one value of one key, from text to its typed field in ct_config: booleans,
// integers and floats checked against the row's range, enum and list items against its
// choices, lists split at commas; where each value came from (its origin). Also the
// number formats the messages and the writers share. Which key a name is, and YAML, are
// config.c's and config_yml.c's.
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config_internal.h"
#include "error.h"

// A value quoted for a one-line message: at most 60 bytes, control characters as '?'.
const char *config_show(const char *s, char *buf, size_t n) {
  size_t len = strlen(s), max = n - 4 < 60 ? n - 4 : 60, i;
  for (i = 0; i < len && i < max; i++)
    buf[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
  if (i < len) buf[i++] = '.', buf[i++] = '.', buf[i++] = '.';
  buf[i] = 0;
  return buf;
}

// YAML 1.1 null: ~, null, Null, NULL, or nothing at all.
int config_is_null_word(const char *s) {
  return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
         !strcmp(s, "NULL");
}

// Copy of s without leading and trailing blanks (NULL when out of memory).
static char *trimmed(const char *s, size_t len) {
  while (len && (*s == ' ' || *s == '\t')) s++, len--;
  while (len && (s[len - 1] == ' ' || s[len - 1] == '\t')) len--;
  char *r = malloc(len + 1);
  if (r) memcpy(r, s, len), r[len] = 0;
  return r;
}

char *config_dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *r = malloc(n);
  if (r) memcpy(r, s, n);
  return r;
}

// Shortest text that strtod reads back as exactly v, always recognisable as a float:
// "3.0", "10000.0", "0.999", "5e-5", ".inf".
void config_fmt_double(double v, char *buf, size_t n) {
  if (isnan(v)) {
    snprintf(buf, n, ".nan");
    return;
  }
  if (isinf(v)) {
    snprintf(buf, n, v > 0 ? ".inf" : "-.inf");
    return;
  }
  if (v == floor(v) && fabs(v) < 1e15) {
    snprintf(buf, n, "%.1f", v);
    return;
  }
  for (int p = 1; p <= 17; p++) {
    snprintf(buf, n, "%.*g", p, v);
    if (strtod(buf, NULL) == v) break;
  }
  // "5e-05" -> "5e-5", "1.5e+20" -> "1.5e20"
  char *e = strchr(buf, 'e');
  if (e) {
    char *d = e + 1, *s = d;
    if (*s == '+') s++;
    else if (*s == '-') d++, s++;
    while (*s == '0' && s[1]) s++;
    memmove(d, s, strlen(s) + 1);
  }
  if (!strpbrk(buf, ".e")) snprintf(buf + strlen(buf), n - strlen(buf), ".0");
}

// Range bounds print without a trailing ".0": "[0, inf)", "[1, 65536]".
static void fmt_bound(double v, char *buf, size_t n) {
  if (isinf(v)) {
    snprintf(buf, n, v > 0 ? "inf" : "-inf");
    return;
  }
  config_fmt_double(v, buf, n);
  size_t len = strlen(buf);
  if (len > 2 && !strcmp(buf + len - 2, ".0")) buf[len - 2] = 0;
}

void config_fmt_range(const key_def *k, char *buf, size_t n) {
  char lo[40], hi[40];
  fmt_bound(k->lo, lo, sizeof lo);
  fmt_bound(k->hi, hi, sizeof hi);
  snprintf(buf, n, "%s%s, %s%s", k->lo_open ? "(" : "[", lo, hi, k->hi_open ? ")" : "]");
}

static int in_range(const key_def *k, double v) {
  if (isnan(v)) return 1;  // allowed only where nonfinite is set; checked there
  if (k->lo_open ? !(v > k->lo) : !(v >= k->lo)) return isinf(v) && isinf(k->lo) && v < 0;
  if (k->hi_open ? !(v < k->hi) : !(v <= k->hi)) return isinf(v) && isinf(k->hi) && v > 0;
  return 1;
}

// ---------------------------------------------------------------------------------
// Parsing and storing one value
// ---------------------------------------------------------------------------------

static int parse_bool(const char *s, int *out) {
  static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
  for (int i = 0; i < 3; i++) {
    if (!strcasecmp(s, yes[i])) return *out = 1, 0;
    if (!strcasecmp(s, no[i])) return *out = 0, 0;
  }
  return -1;
}

// 0 ok, -1 not an integer, -2 too large for int64_t.
static int parse_int(const char *s, int64_t *out) {
  const char *p = s;
  if (*p == '+' || *p == '-') p++;
  if (!*p) return -1;
  for (; *p; p++)
    if (*p < '0' || *p > '9') return -1;
  errno = 0;
  long long v = strtoll(s, NULL, 10);
  if (errno == ERANGE) return -2;
  *out = v;
  return 0;
}

// 0 ok, -1 not a number, -2 too large for a double. inf/nan words give inf/nan.
static int parse_float(const char *s, double *out) {
  const char *p = s + (*s == '+' || *s == '-');
  double sign = *s == '-' ? -1.0 : 1.0;
  if (!strcasecmp(p, ".inf") || !strcasecmp(p, "inf") || !strcasecmp(p, "infinity"))
    return *out = sign * INFINITY, 0;
  if (p == s && (!strcasecmp(p, ".nan") || !strcasecmp(p, "nan"))) return *out = NAN, 0;
  // strtod would also take hex, "nan(...)" and "infinity" spelt other ways: decimal only.
  if (!*p) return -1;
  for (const char *q = p; *q; q++)
    if (!strchr("0123456789.eE+-", *q)) return -1;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end) return -1;
  if (errno == ERANGE && isinf(v)) return -2;
  *out = v;
  return 0;
}

// Records where key k's value came from (where == NULL: the default).
int config_set_origin(ct_config *c, int k, const char *where) {
  char *o = NULL;
  if (where && !(o = config_dup_str(where))) return ct_set_error(CT_ENOMEM, "out of memory");
  free(c->origin_[k]);
  c->origin_[k] = o;
  if (is_model_key(&config_keys[k])) {
    if (where) c->model.set_mask |= model_bit(&config_keys[k]);
    else c->model.set_mask &= ~model_bit(&config_keys[k]);
  }
  return 0;
}

// One number, checked against the key's range; `text` has no surrounding blanks.
static int parse_number(const key_def *k, const char *text, const char *where, int64_t *iv,
                        double *dv) {
  char b[64];
  const char *what = k->type == K_INT ? "an integer" : "a number";
  double v;
  int rc;
  if (k->type == K_INT) {
    rc = parse_int(text, iv);
    v = (double)*iv;
  } else {
    rc = parse_float(text, dv);
    v = *dv;
  }
  if (rc == -1)
    return ct_set_error(CT_ECONFIG, "%s: key '%s': expected %s, got '%s'", WHERE(where),
                        k->name, what, config_show(text, b, sizeof b));
  if (rc == -2 || !in_range(k, v)) {
    char range[96];
    config_fmt_range(k, range, sizeof range);
    return ct_set_error(CT_ECONFIG, "%s: key '%s': %s is out of range %s", WHERE(where),
                        k->name, config_show(text, b, sizeof b), range);
  }
  if (k->type != K_INT && !isfinite(v) && !k->nonfinite)
    return ct_set_error(CT_ECONFIG, "%s: key '%s': expected a finite number, got '%s'",
                        WHERE(where), k->name, config_show(text, b, sizeof b));
  return 0;
}

// The values key k takes from `trainer` (a CT_TRAINER_* bit; 0: any trainer's).
static const char *const *choices_of(const key_def *k, unsigned trainer) {
  int ti = config_trainer_index((ct_trainer_kind)trainer);
  return ti >= 0 && k->per_trainer_choices[ti] ? k->per_trainer_choices[ti] : k->choices;
}

static int check_choice(const key_def *k, unsigned trainer, const char *text, const char *where, int *index) {
  const char *const *ch = choices_of(k, trainer);
  for (int i = 0; ch[i]; i++)
    if (!strcmp(text, ch[i])) return *index = i, 0;
  char b[64], list[256] = "";
  for (int i = 0; ch[i]; i++)
    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", ch[i]);
  return ct_set_error(CT_ECONFIG, "%s: key '%s': '%s' is not one of %s", WHERE(where),
                      k->name, config_show(text, b, sizeof b), list);
}

void config_free_list(const key_def *k, void *f) {
  if (k->type == K_STR_LIST) {
    ct_str_list *l = f;
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
  } else {
    free(((ct_float_list *)f)->v);
  }
}

// TRL's older names of list values, read as their current ones.
static const struct {
  const char *key, *old, *now;
} VALUE_ALIASES[] = {{"loss_type", "aot_pair", "aot"}};

// A list key from its items (already split and trimmed).
int config_set_list(ct_config *c, int ki, char **items, int n, const char *where) {
  const key_def *k = &config_keys[ki];
  const char *item[n > 0 ? n : 1];  // the items, TRL's older names read as the current ones
  for (int i = 0; i < n; i++) {
    item[i] = items[i];
    for (size_t a = 0; a < sizeof VALUE_ALIASES / sizeof VALUE_ALIASES[0]; a++)
      if (!strcmp(k->name, VALUE_ALIASES[a].key) && !strcmp(items[i], VALUE_ALIASES[a].old)) item[i] = VALUE_ALIASES[a].now;
  }
  for (int i = 0; i < n; i++)
    if (!item[i][0])
      return ct_set_error(CT_ECONFIG, "%s: key '%s': item %d of the list is empty",
                          WHERE(where), k->name, i + 1);
  if (k->type == K_STR_LIST) {
    int dummy;
    for (int i = 0; i < n; i++)
      if (k->choices && check_choice(k, c->trainer, item[i], where, &dummy)) return CT_ECONFIG;
    ct_str_list l = {calloc((size_t)n + 1, sizeof(char *)), n};
    if (!l.v) return ct_set_error(CT_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++)
      if (!(l.v[i] = config_dup_str(item[i]))) {
        config_free_list(k, &l);
        return ct_set_error(CT_ENOMEM, "out of memory");
      }
    config_free_list(k, field_of(c, k));
    *(ct_str_list *)field_of(c, k) = l;
  } else {
    ct_float_list l = {malloc(((size_t)n + 1) * sizeof(double)), n};
    if (!l.v) return ct_set_error(CT_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
      int64_t unused;
      if (parse_number(k, items[i], where, &unused, &l.v[i])) {
        free(l.v);
        return CT_ECONFIG;
      }
    }
    config_free_list(k, field_of(c, k));
    *(ct_float_list *)field_of(c, k) = l;
  }
  return config_set_origin(c, ki, where);
}

// Splits "a, b,c" or "[a, b, c]" at commas into trimmed items, then config_set_list.
static int set_list_text(ct_config *c, int ki, const char *text, const char *where) {
  size_t len = strlen(text);
  char *s = trimmed(text, len);
  if (!s) return ct_set_error(CT_ENOMEM, "out of memory");
  len = strlen(s);
  char *body = s;
  if (len >= 2 && s[0] == '[' && s[len - 1] == ']') body[len - 1] = 0, body++;
  int n = 0, rc;
  char **items = NULL;
  char *t = trimmed(body, strlen(body));
  if (!t) {
    free(s);
    return ct_set_error(CT_ENOMEM, "out of memory");
  }
  if (*t && !config_is_null_word(t)) {
    n = 1;
    for (char *p = t; *p; p++) n += *p == ',';
    items = calloc((size_t)n, sizeof *items);
    if (!items) {
      free(s), free(t);
      return ct_set_error(CT_ENOMEM, "out of memory");
    }
    char *p = t;
    for (int i = 0; i < n; i++) {
      char *comma = strchr(p, ',');
      size_t l = comma ? (size_t)(comma - p) : strlen(p);
      if (!(items[i] = trimmed(p, l))) {
        n = i;
        rc = ct_set_error(CT_ENOMEM, "out of memory");
        goto done;
      }
      p += l + (comma != NULL);
    }
  }
  rc = config_set_list(c, ki, items, n, where);
done:
  for (int i = 0; i < n; i++) free(items[i]);
  free(items), free(s), free(t);
  return rc;
}

// A scalar value for key ki. `plain`: an unquoted scalar, where ~, null and nothing are
// null, true and false may stand for a TRL spelling (bool_as), and a list key's text
// splits at commas; a quoted scalar is the string itself (one item of a list key).
int config_set_scalar(ct_config *c, int ki, const char *text, int plain, const char *where) {
  const key_def *k = &config_keys[ki];
  char b[64];
  void *f = field_of(c, k);
  int truth, is_null = plain && config_is_null_word(text);
  if (k->bool_as[0] && plain && !is_null && !parse_bool(text, &truth)) text = k->bool_as[truth ? 0 : 1];
  if (k->null_as && is_null) text = k->null_as;
  if (k->type == K_STR) {
    char *s = config_dup_str(is_null ? "" : text);
    if (!s) return ct_set_error(CT_ENOMEM, "out of memory");
    free(*(char **)f);
    *(char **)f = s;
    return config_set_origin(c, ki, where);
  }
  if ((k->type == K_STR_LIST || k->type == K_FLOAT_LIST) && !plain) {
    char *one[] = {(char *)text};
    return config_set_list(c, ki, one, 1, where);
  }
  if (k->type == K_STR_LIST || k->type == K_FLOAT_LIST)
    return set_list_text(c, ki, is_null ? "" : text, where);
  char *t = trimmed(text, strlen(text));
  if (!t) return ct_set_error(CT_ENOMEM, "out of memory");
  int rc = 0, iv = 0;
  int64_t i64 = 0;
  double d = 0;
  switch (k->type) {
    case K_BOOL:
      if (parse_bool(t, &iv))
        rc = ct_set_error(CT_ECONFIG, "%s: key '%s': expected a boolean (true or false), got '%s'",
                          WHERE(where), k->name, config_show(t, b, sizeof b));
      else *(int *)f = iv;
      break;
    case K_INT:
      if (!(rc = parse_number(k, t, where, &i64, &d))) *(int64_t *)f = i64;
      break;
    case K_FLOAT:
      if (!(rc = parse_number(k, t, where, &i64, &d))) *(double *)f = d;
      break;
    case K_ENUM:
      if (!(rc = check_choice(k, 0, t, where, &iv))) *(int *)f = iv;
      break;
    default:
      rc = ct_set_error(CT_ECONFIG, "%s: key '%s' can only be given in a yml file", WHERE(where),
                        k->name);
  }
  free(t);
  return rc ? rc : config_set_origin(c, ki, where);
}
