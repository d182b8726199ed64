// hfjson: Hugging Face JSON files as Python writes them, and a config merged into its source.
#include "hfjson.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "fs.h"

int ct_hfjson_read(const char *dir, const char *name, char *path, size_t n, json_t **j) {
  int rc = ct_path_join(path, n, dir, name);
  if (rc) return rc;
  json_error_t err;
  *j = json_load_file(path, 0, &err);
  return *j ? 0 : ct_set_error(CT_EFORMAT, "%s: %s", path, err.text);
}

void ct_hfjson_real(double d, char *buf) {
  if (!isfinite(d)) {  // json.dumps' spellings (not JSON, but what Python writes)
    snprintf(buf, 32, "%s", isnan(d) ? "NaN" : d > 0 ? "Infinity" : "-Infinity");
    return;
  }
  char e[40];
  int p = 1;
  for (; p < 17; p++) {  // the fewest significant digits that read back as d
    snprintf(e, sizeof e, "%.*e", p - 1, d);
    if (strtod(e, NULL) == d) break;
  }
  snprintf(e, sizeof e, "%.*e", p - 1, d);  // [-]d.ddde[+-]xx
  const char *s = e[0] == '-' ? e + 1 : e, *x = strchr(s, 'e');
  char digits[24];
  int nd = 0, exp10 = atoi(x + 1);
  for (const char *c = s; c < x; c++)
    if (*c != '.') digits[nd++] = *c;
  while (nd > 1 && digits[nd - 1] == '0') nd--;
  int k = e[0] == '-' ? snprintf(buf, 32, "-") : 0;
  if (exp10 < -4 || exp10 >= 16) {  // Python's repr switches to exponents there
    k += snprintf(buf + k, 32 - k, "%c%s%.*s", digits[0], nd > 1 ? "." : "", nd - 1, digits + 1);
    snprintf(buf + k, 32 - k, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
  } else if (exp10 < 0) {
    snprintf(buf + k, 32 - k, "0.%0*d%.*s", -exp10 - 1, 0, nd, digits);
    if (exp10 == -1) snprintf(buf + k, 32 - k, "0.%.*s", nd, digits);  // (%0*d prints one 0 for width 0)
  } else if (nd <= exp10 + 1) {
    snprintf(buf + k, 32 - k, "%.*s%0*d.0", nd, digits, exp10 + 1 - nd, 0);
    if (nd == exp10 + 1) snprintf(buf + k, 32 - k, "%.*s.0", nd, digits);
  } else {
    snprintf(buf + k, 32 - k, "%.*s.%.*s", exp10 + 1, digits, nd - exp10 - 1, digits + exp10 + 1);
  }
}

static void indent(FILE *f, int depth) {
  fputc('\n', f);
  for (int i = 0; i < depth; i++) fputs("  ", f);
}

static void put_string(FILE *f, const char *s) {
  json_t *v = json_string(s);
  char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
  fputs(t ? t : "\"\"", f);
  free(t);
  json_decref(v);
}

static void put(FILE *f, const json_t *j, int depth) {
  char num[32];
  const char *key;
  json_t *v;
  size_t i, n = 0;
  switch (json_typeof(j)) {
  case JSON_OBJECT:
    if (!json_object_size(j)) return (void)fputs("{}", f);
    fputc('{', f);
    json_object_foreach((json_t *)j, key, v) {
      fputs(n++ ? "," : "", f);
      indent(f, depth + 1);
      put_string(f, key);
      fputs(": ", f);
      put(f, v, depth + 1);
    }
    indent(f, depth);
    fputc('}', f);
    return;
  case JSON_ARRAY:
    if (!json_array_size(j)) return (void)fputs("[]", f);
    fputc('[', f);
    json_array_foreach(j, i, v) {
      fputs(i ? "," : "", f);
      indent(f, depth + 1);
      put(f, v, depth + 1);
    }
    indent(f, depth);
    fputc(']', f);
    return;
  case JSON_STRING: put_string(f, json_string_value(j)); return;
  case JSON_INTEGER: fprintf(f, "%" JSON_INTEGER_FORMAT, json_integer_value(j)); return;
  case JSON_REAL:
    ct_hfjson_real(json_real_value(j), num);
    fputs(num, f);
    return;
  case JSON_TRUE: fputs("true", f); return;
  case JSON_FALSE: fputs("false", f); return;
  case JSON_NULL: fputs("null", f); return;
  }
}

int ct_hfjson_write(const json_t *j, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) return ct_set_error(CT_EIO, "%s: cannot write: %s", path, strerror(errno));
  put(f, j, 0);
  fputc('\n', f);
  int bad = ferror(f);
  if (fclose(f) || bad) return ct_set_error(CT_EIO, "%s: cannot write: %s", path, strerror(errno));
  return 0;
}

// Whether source's value says what fresh's does: numbers equal as ctune read them (exactly
// for two integers, else as float32), a list whose first element agrees with a scalar
// (eos_token_id [1, 2] read as 1), objects whose shared keys agree.
static bool agree(const json_t *s, const json_t *f) {
  if (json_is_integer(s) && json_is_integer(f)) return json_integer_value(s) == json_integer_value(f);
  if (json_is_number(s) && json_is_number(f)) return (float)json_number_value(s) == (float)json_number_value(f);
  if (json_is_array(s) && !json_is_array(f)) return json_array_size(s) && agree(json_array_get(s, 0), f);
  if (json_is_object(s) && json_is_null(f)) {  // {"rope_type": "default"} is no rope scaling
    const char *t = json_string_value(json_object_get(s, "rope_type"));
    if (!t) t = json_string_value(json_object_get(s, "type"));
    return t && !strcmp(t, "default");
  }
  if (json_is_object(s) && json_is_object(f)) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)f, k, v) {
      const json_t *sv = json_object_get(s, k);
      if (sv && !agree(sv, v)) return false;
    }
    return true;
  }
  if (json_is_array(s) && json_is_array(f)) {
    if (json_array_size(s) != json_array_size(f)) return false;
    for (size_t i = 0; i < json_array_size(s); i++)
      if (!agree(json_array_get(s, i), json_array_get(f, i))) return false;
    return true;
  }
  return json_equal((json_t *)s, (json_t *)f);
}

// fresh's value in source's number type: an integer stays one when the value is whole.
static json_t *typed(const json_t *s, json_t *f) {
  if (json_is_integer(s) && json_is_real(f) && json_real_value(f) == (double)(json_int_t)json_real_value(f))
    return json_integer((json_int_t)json_real_value(f));
  if (json_is_real(s) && json_is_integer(f)) return json_real((double)json_integer_value(f));
  return json_incref(f);
}

json_t *ct_hfjson_merge(const json_t *source, const json_t *fresh, const char *const *add) {
  json_t *out = json_deep_copy(source);
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)fresh, k, v) {
    const json_t *s = json_object_get(source, k);
    bool listed = false;
    for (int i = 0; add && add[i]; i++) listed |= !strcmp(add[i], k);
    if (!s && listed && !json_is_null(v)) json_object_set(out, k, v);
    else if (s && json_is_object(s) && json_is_object(v)) json_object_set_new(out, k, ct_hfjson_merge(s, v, NULL));
    else if (s && !agree(s, v)) json_object_set_new(out, k, typed(s, v));
  }
  return out;
}
