// grpo/reward: the built-in reward functions (accuracy, format, length) and the remote
// reward client (OpenRLHF's JSON protocol over common/http.h's client).
#include "grpo/rewards.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include "config.h"
#include "error.h"
#include "grpo/mathans.h"
#include "http.h"
#include "jsonl.h"
#include "pyregex.h"
#include "reward_model.h"
#include "stop.h"
#include "unicode.h"


struct ct_reward {
  int kind;
  char *answer_field;  // accuracy and remote (labels)
  char *field_origin;  // where answer_field came from, for messages
  bool labels_required;  // remote: every row must have answer_field
  bool numeric;
  bool math;            // answer_math
  ct_pyregex *re;      // accuracy: answer_regex (or NULL); format: format_regex
  int group;           // accuracy: the group of re's last match that is the answer
  int target_length;
  int overlong_max_len, overlong_buffer;  // overlong
  int ngram;                              // repetition_penalty
  double max_penalty;
  int cosine_max_len;                     // cosine
  double cos_lo_wrong, cos_hi_wrong, cos_lo_right, cos_hi_right;
  // remote
  ct_http *http;
  bool failure_nan;
  int batch;
  long failed_batches;
  char last_failure[512];
  ct_rm *model;        // a reward model (NULL for the others)
  char model_name[64];
};

int ct_reward_kind(const char *name, int *kind) {
  for (int k = 0; k < CT_REWARD_COUNT; k++)
    if (name && !strcmp(name, ct_reward_func_names[k])) {
      *kind = k;
      return 0;
    }
  struct stat st;
  if (name && (strchr(name, '/') || (stat(name, &st) == 0 && S_ISDIR(st.st_mode)))) {
    *kind = CT_REWARD_MODEL;
    return 0;
  }
  return ct_set_error(CT_ECONFIG,
                      "reward function \"%s\" does not exist; choose accuracy, format, "
                      "length, overlong, think_format, repetition_penalty, cosine, remote, env, or a reward model's "
                      "directory (a path with a /)", name ? name : "(null)");
}

const char *ct_reward_name(const ct_reward *r) {
  return r->kind == CT_REWARD_MODEL ? r->model_name : ct_reward_func_names[r->kind];
}


// A reward model: checked (check_only) or opened. Its name is the directory's last part.
// The directory may be a SEQ_CLS LoRA adapter (bin/reward with use_peft): its
// adapter_config.json's base_model_name_or_path is the base (reward/model.h).
static int init_model(ct_reward *r, const ct_reward_opts *o) {
  if (!o->model_dir || !*o->model_dir) return ct_set_error(CT_ECONFIG, "reward model: no directory");
  struct stat st;
  if (stat(o->model_dir, &st) || !S_ISDIR(st.st_mode))
    return ct_set_error(CT_ECONFIG, "reward model %s: not a directory", o->model_dir);
  if (o->check_only) return ct_rm_check(o->model_dir, NULL);
  if (o->model_batch < 1 || o->model_max_length < 2)
    return ct_set_error(CT_EINVAL, "reward model %s: batch %d x %d tokens", o->model_dir, o->model_batch,
                        o->model_max_length);
  if (!(r->model = calloc(1, sizeof *r->model))) return ct_set_error(CT_ENOMEM, "out of memory");
  int rc = ct_rm_open(r->model, o->model_dir, NULL, o->model_dtype, o->model_batch, o->model_max_length);
  if (rc) {
    free(r->model);
    r->model = NULL;
    return rc;
  }
  snprintf(r->model_name, sizeof r->model_name, "%s", r->model->name);
  return 0;
}

// Each item's prompt (the row's own, messages or text) and completion through the reward
// model's tokenizer and template, in batches.
static int model_score(ct_reward *r, const ct_reward_item *items, int n, double *out) {
  char **texts = calloc(n > 0 ? (size_t)n : 1, sizeof *texts);
  bool *eos = calloc(n > 0 ? (size_t)n : 1, sizeof *eos);
  int rc = texts && eos ? 0 : ct_set_error(CT_ENOMEM, "out of memory");
  for (int i = 0; i < n && !rc; i++) {
    const json_t *p = items[i].row ? json_object_get(items[i].row, "prompt") : NULL;
    json_t *own = p ? NULL : json_string(items[i].prompt ? items[i].prompt : "");
    rc = ct_rm_render(r->model, items[i].row, p ? p : own, items[i].completion, &texts[i], &eos[i]);
    json_decref(own);
    if (rc) ct_wrap_error(rc, "reward model %s", r->model_name);
  }
  if (!rc) rc = ct_rm_score_texts(r->model, texts, eos, n, out, NULL);
  for (int i = 0; texts && i < n; i++) free(texts[i]);
  free(texts);
  free(eos);
  return rc;
}

long ct_reward_failed_batches(const ct_reward *r) { return r->failed_batches; }

const char *ct_reward_last_failure(const ct_reward *r) { return r->last_failure; }

// ---------------------------------------------------------------------------------------
// set-up

// The one-line error of option `key`, after where its value came from (o->cfg).
static int key_error(const ct_reward_opts *o, int code, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int key_error(const ct_reward_opts *o, int code, const char *key, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *from = o->cfg ? ct_config_origin(o->cfg, key) : NULL;
  if (from) return ct_set_error(code, "%s: key '%s': %s", from, key, msg);
  return ct_set_error(code, "%s: %s", key, msg);
}

// key's pattern (Python re syntax, common/pyregex.h) into r->re; the answer is the group
// named "answer" if there is one, else the first group, else the whole match.
static int compile(ct_reward *r, const ct_reward_opts *o, const char *key, const char *pattern) {
  if (ct_pyregex_compile(&r->re, pattern)) return key_error(o, CT_ECONFIG, key, "%s", ct_last_error());
  r->group = ct_pyregex_group_named(r->re, "answer");
  if (r->group < 0) r->group = ct_pyregex_groups(r->re) > 0 ? 1 : 0;
  return 0;
}

static int init_remote(ct_reward *r, const ct_reward_opts *o) {
  r->failure_nan = o->failure_nan;
  r->batch = o->batch;
  ct_http_opts h = {o->url, o->api_key_env, o->connect_timeout_s, o->timeout_s, o->retries, o->backoff_s,
                    "remote reward", "reward_", o->cfg};
  return ct_http_init(&r->http, &h);
}

int ct_reward_init(ct_reward **out, int kind, const ct_reward_opts *o) {
  *out = NULL;
  if (kind < CT_REWARD_ACCURACY || kind > CT_REWARD_MODEL)
    return ct_set_error(CT_EINVAL, "reward: unknown kind %d", kind);
  if (!o) return ct_set_error(CT_EINVAL, "reward: no options");
  ct_reward *r = calloc(1, sizeof *r);
  if (!r) return ct_set_error(CT_ENOMEM, "out of memory");
  r->kind = kind;
  r->numeric = o->numeric;
  r->math = o->math;
  r->answer_field = strdup(o->answer_field && *o->answer_field ? o->answer_field : "answer");
  const char *from = o->cfg ? ct_config_origin(o->cfg, "answer_field") : NULL;
  r->field_origin = strdup(from ? from : "answer_field");
  r->labels_required = o->labels_required;
  int rc = r->answer_field && r->field_origin ? 0 : ct_set_error(CT_ENOMEM, "out of memory");
  if (!rc && (kind == CT_REWARD_ACCURACY || kind == CT_REWARD_COSINE) && o->answer_regex && *o->answer_regex)
    rc = compile(r, o, "answer_regex", o->answer_regex);
  if (!rc && kind == CT_REWARD_FORMAT) {
    if (!o->format_regex || !*o->format_regex)
      rc = key_error(o, CT_ECONFIG, "format_regex", "the format reward needs a regex");
    else
      rc = compile(r, o, "format_regex", o->format_regex);
  }
  if (!rc && kind == CT_REWARD_LENGTH) {
    if (o->target_length <= 0)
      rc = key_error(o, CT_ECONFIG, "length_target", "must be > 0 (got %d)", o->target_length);
    r->target_length = o->target_length;
  }
  if (!rc && kind == CT_REWARD_OVERLONG) {
    if (o->overlong_buffer <= 0 || o->overlong_buffer > o->overlong_max_len)
      rc = key_error(o, CT_ECONFIG, "overlong_buffer_len", "the overlong reward needs 0 < overlong_buffer_len "
                     "<= max_completion_length (%d; got %d)", o->overlong_max_len, o->overlong_buffer);
    r->overlong_max_len = o->overlong_max_len, r->overlong_buffer = o->overlong_buffer;
  }
  if (!rc && kind == CT_REWARD_REPETITION) {
    if (o->ngram < 1) rc = key_error(o, CT_ECONFIG, "repetition_ngram_size", "must be at least 1 (got %d)", o->ngram);
    else if (!(o->max_penalty <= 0))
      rc = key_error(o, CT_ECONFIG, "repetition_max_penalty", "must not be positive (got %g)", o->max_penalty);
    r->ngram = o->ngram, r->max_penalty = o->max_penalty;
  }
  if (!rc && kind == CT_REWARD_COSINE) {
    if (o->cosine_max_len < 1)
      rc = key_error(o, CT_ECONFIG, "cosine_max_len", "must be at least 1 (got %d)", o->cosine_max_len);
    r->cosine_max_len = o->cosine_max_len;
    r->cos_lo_wrong = o->min_value_wrong, r->cos_hi_wrong = o->max_value_wrong;
    r->cos_lo_right = o->min_value_correct, r->cos_hi_right = o->max_value_correct;
  }
  if (!rc && kind == CT_REWARD_REMOTE) rc = init_remote(r, o);
  if (!rc && kind == CT_REWARD_MODEL) rc = init_model(r, o);
  if (rc) {
    ct_reward_free(r);
    return rc;
  }
  *out = r;
  return 0;
}

void ct_reward_free(ct_reward *r) {
  if (!r) return;
  ct_pyregex_free(r->re);
  if (r->model) ct_rm_free(r->model);
  free(r->model);
  ct_http_free(r->http);
  free(r->answer_field);
  free(r->field_origin);
  free(r);
}

// ---------------------------------------------------------------------------------------
// built-in rewards

static bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// [*s, *s + *n) without surrounding whitespace.
static void trim(const char **s, size_t *n) {
  while (*n && is_space(**s)) (*s)++, (*n)--;
  while (*n && is_space((*s)[*n - 1])) (*n)--;
}

// The row's answer as text into buf (a number becomes its shortest round-trip text);
// false when the field is missing or neither a string nor a number.
static bool answer_text(const json_t *row, const char *field, char *buf, size_t cap,
                        const char **s) {
  const json_t *v = json_is_object(row) ? json_object_get(row, field) : NULL;
  if (json_is_string(v)) {
    *s = json_string_value(v);
    return true;
  }
  if (json_is_integer(v)) {
    snprintf(buf, cap, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
  } else if (json_is_real(v)) {
    double x = json_real_value(v);
    for (int prec = 15; prec <= 17; prec++) {
      snprintf(buf, cap, "%.*g", prec, x);
      if (strtod(buf, NULL) == x) break;
    }
  } else {
    return false;
  }
  *s = buf;
  return true;
}

// Parses [s, s + n) as a number after removing thousands separators; false unless the
// whole (trimmed) text is one finite number.
static bool parse_number(const char *s, size_t n, double *x) {
  trim(&s, &n);
  char buf[128];
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == ',') continue;
    if (k + 1 >= sizeof buf) return false;
    buf[k++] = s[i];
  }
  buf[k] = 0;
  if (!k) return false;
  char *end;
  *x = strtod(buf, &end);
  return *end == 0 && isfinite(*x);
}

// The completion's answer: r->group of the regex's last match, or the whole completion;
// 0 when the regex does not match, < 0 when the matcher gives up.
static int extract(const ct_reward *r, const char *c, const char **s, size_t *n) {
  *s = c;
  *n = strlen(c);
  if (!r->re) return 1;
  size_t from = 0;
  int rc = ct_pyregex_last(r->re, c, *n, r->group, &from, n);
  *s = c + from;
  return rc;
}

// answer_math: the completion's answer (answer_regex's, else its last \boxed{} or math span)
// against the reference as math answers; NaN when the reference reads as nothing.
static double math_accuracy(const ct_reward *r, const char *want, const char *completion) {
  if (ct_math_equal("x", 1, want, strlen(want)) < 0) return NAN;
  const char *got;
  size_t got_n;
  if (r->re) {
    int found = extract(r, completion, &got, &got_n);
    if (found <= 0) return found ? NAN : 0;
  } else if (!ct_math_extract(completion, &got, &got_n)) {
    return 0;
  }
  return ct_math_equal(got, got_n, want, strlen(want)) > 0 ? 1 : 0;
}

static double accuracy(const ct_reward *r, const ct_reward_item *it) {
  char buf[64];
  const char *want;
  if (!answer_text(it->row, r->answer_field, buf, sizeof buf, &want)) return NAN;
  if (r->math) return it->completion ? math_accuracy(r, want, it->completion) : NAN;
  size_t want_n = strlen(want);
  double b = 0;
  if (r->numeric && !parse_number(want, want_n, &b)) return NAN;
  if (!it->completion) return NAN;
  const char *got;
  size_t got_n;
  int found = extract(r, it->completion, &got, &got_n);
  if (found <= 0) return found ? NAN : 0;
  if (r->numeric) {
    double a;
    return parse_number(got, got_n, &a) && fabs(a - b) <= 1e-6 * fmax(1.0, fabs(b)) ? 1 : 0;
  }
  trim(&got, &got_n);
  trim(&want, &want_n);
  return got_n == want_n && !memcmp(got, want, got_n) ? 1 : 0;
}

static double format(const ct_reward *r, const ct_reward_item *it) {
  if (!it->completion) return NAN;
  int rc = ct_pyregex_search(r->re, it->completion, strlen(it->completion));
  return rc < 0 ? NAN : rc;
}

// ---------------------------------------------------------------------------------------
// the dataset field a reward reads

const char *ct_reward_field(const ct_reward *r) {
  bool reads = r->kind == CT_REWARD_ACCURACY || r->kind == CT_REWARD_COSINE ||
               (r->kind == CT_REWARD_REMOTE && r->labels_required);
  return reads ? r->answer_field : NULL;
}

static const char *json_kind(const json_t *v) {
  return json_is_object(v) ? "an object" : json_is_array(v) ? "a list" : json_is_boolean(v) ? "a boolean"
         : json_is_null(v) ? "null" : "not a string";
}

// Whether r can read its field from row; if not, why (without the row's place).
static bool row_readable(const ct_reward *r, const char *field, const json_t *row, char *why, size_t cap) {
  const json_t *v = json_object_get(row, field);
  char buf[64];
  const char *text;
  double x;
  if (!v)
    snprintf(why, cap, "no field '%s'", field);
  else if (!answer_text(row, field, buf, sizeof buf, &text))
    snprintf(why, cap, "field '%s' is %s; it must be a string or a number", field, json_kind(v));
  else if ((r->kind == CT_REWARD_ACCURACY || r->kind == CT_REWARD_COSINE) && r->numeric &&
           !parse_number(text, strlen(text), &x))
    snprintf(why, cap, "field '%s' is \"%.40s%s\", not a number (answer_numeric is true)", field, text,
             strlen(text) > 40 ? "..." : "");
  else
    return true;
  return false;
}

// "prompt, answer" (the first row's fields) into buf.
static void field_names(const json_t *row, char *buf, size_t cap) {
  const char *key;
  const json_t *v;
  size_t k = 0;
  buf[0] = 0;
  json_object_foreach((json_t *)row, key, v) {
    if (k + strlen(key) + 8 >= cap) {
      snprintf(buf + k, cap - k, "%s...", k ? ", " : "");
      return;
    }
    k += (size_t)snprintf(buf + k, cap - k, "%s%s", k ? ", " : "", key);
  }
}

int ct_reward_check_rows(const ct_reward *r, json_t *const *rows, const int *lines, int n, const char *path,
                         bool skip_bad, bool *bad) {
  const char *field = ct_reward_field(r);
  if (!field) return 0;
  const char *name = ct_reward_name(r);
  int have = 0, marked = 0;
  for (int i = 0; i < n; i++) have += json_object_get(rows[i], field) != NULL;
  if (n > 0 && !have) {
    char names[160];
    field_names(rows[0], names, sizeof names);
    return ct_set_error(CT_ECONFIG, "%s: key 'answer_field': no row of %s has the field '%s', which the %s "
                        "reward reads (its first row has: %s)", r->field_origin, path, field, name, names);
  }
  char why[160];
  for (int i = 0; i < n; i++) {
    if (bad[i] || row_readable(r, field, rows[i], why, sizeof why)) continue;
    if (!skip_bad)
      return ct_row_error(path, lines[i], "%s, which the %s reward reads (answer_field); fix the row, or set "
                          "skip_bad_rows: true to skip such rows", why, name);
    if (!marked++)  // the first row it skips: its message
      ct_row_error(path, lines[i], "%s, which the %s reward reads (answer_field)", why, name);
    bad[i] = true;
  }
  return marked;
}

static double length(const ct_reward *r, const ct_reward_item *it) {
  if (!it->completion) return NAN;
  double len = (double)strlen(it->completion), t = r->target_length;
  return -fabs(len - t) / t;
}

// TRL's think_format_reward: re.match(r"^<think>(?!.*<think>)(.*?)</think>.*$", c, DOTALL |
// MULTILINE) — the completion starts with <think>, holds no second <think>, and closes one.
static double think_format(const ct_reward_item *it) {
  const char *c = it->completion, *open = "<think>";
  if (!c) return NAN;
  size_t n = strlen(open);
  return !strncmp(c, open, n) && !strstr(c + n, open) && strstr(c + n, "</think>") ? 1 : 0;
}

static int cmp_gram(const void *a, const void *b, void *ng) {
  return memcmp(*(const int *const *)a, *(const int *const *)b, sizeof(int) * (size_t)*(int *)ng);
}

// TRL's repetition penalty over the completion's token n-grams.
static double repetition(const ct_reward *r, const ct_reward_item *it) {
  int n = it->completion_tokens, g = r->ngram;
  if (n < g) return 0;
  if (!it->completion_ids) return NAN;
  int total = n - g + 1, unique = 0;
  const int **grams = malloc(sizeof *grams * (size_t)total);
  if (!grams) return NAN;
  for (int i = 0; i < total; i++) grams[i] = it->completion_ids + i;
  qsort_r(grams, (size_t)total, sizeof *grams, cmp_gram, &g);
  for (int i = 0; i < total; i++) unique += i == 0 || cmp_gram(&grams[i - 1], &grams[i], &g) != 0;
  free(grams);
  double scaling = 1 - (double)unique / total;
  return scaling ? scaling * r->max_penalty : 0.0;
}

static double accuracy(const ct_reward *r, const ct_reward_item *it);

// TRL's cosine-scaled correctness.
static double cosine(const ct_reward *r, const ct_reward_item *it) {
  double right = accuracy(r, it);
  if (right != right) return NAN;
  double progress = fmin((double)it->completion_tokens / r->cosine_max_len, 1.0), c = cos(progress * M_PI);
  double lo = right > 0 ? r->cos_lo_right : r->cos_hi_wrong, hi = right > 0 ? r->cos_hi_right : r->cos_lo_wrong;
  return lo + 0.5 * (hi - lo) * (1.0 + c);
}

static double overlong(const ct_reward *r, const ct_reward_item *it) {
  int L = r->overlong_max_len, B = r->overlong_buffer, n = it->completion_tokens;
  if (n <= L - B) return 0;
  return n <= L ? (double)(L - B - n) / B : -1;
}

// ---------------------------------------------------------------------------------------
// remote reward

// a + b as a JSON string; bytes that are not valid UTF-8 (a completion cut inside a
// character) become U+FFFD, so that every completion reaches the server.
static json_t *json_text(const char *a, const char *b) {
  size_t na = strlen(a), nb = strlen(b), n = na + nb, k = 0;
  char *s = malloc(3 * n + 1);  // each invalid byte grows to 3
  if (!s) return NULL;
  for (int part = 0; part < 2; part++) {
    const char *t = part ? b : a;
    size_t nt = part ? nb : na;
    for (size_t i = 0; i < nt;) {
      size_t from = i;
      if (ct_utf8_next(t, nt, &i) == CT_UC_INVALID) {
        memcpy(s + k, "\xEF\xBF\xBD", 3);
        k += 3;
      } else {
        memcpy(s + k, t + from, i - from);
        k += i - from;
      }
    }
  }
  json_t *j = json_stringn(s, k);
  free(s);
  return j;
}

// The request body for items [0, n): {"query": [...], "prompts": [...], "labels": [...]}.
static char *request_body(const ct_reward *r, const ct_reward_item *items, int n) {
  json_t *q = json_array(), *p = json_array(), *l = json_array();
  json_t *body = json_object();
  char *text = NULL;
  if (!q || !p || !l || !body) goto done;
  for (int i = 0; i < n; i++) {
    const char *prompt = items[i].prompt ? items[i].prompt : "";
    const char *comp = items[i].completion ? items[i].completion : "";
    char buf[64];
    const char *label;
    json_t *lab = answer_text(items[i].row, r->answer_field, buf, sizeof buf, &label)
                      ? json_string(label) : json_null();
    // the _new appends take their reference even when they fail (and ignore NULL)
    if (json_array_append_new(q, json_text(prompt, comp)) ||
        json_array_append_new(p, json_text(prompt, "")) || json_array_append_new(l, lab))
      goto done;
  }
  if (json_object_set(body, "query", q) || json_object_set(body, "prompts", p) ||
      json_object_set(body, "labels", l))
    goto done;
  text = json_dumps(body, JSON_COMPACT);
done:
  json_decref(q);
  json_decref(p);
  json_decref(l);
  json_decref(body);
  return text;
}

// Why reward `i` of n (not a number) is unusable: its JSON text and type, e.g.
// "reward 1 of 4 is "NaN" (a string); rewards must be numbers or null".
static void bad_reward(const ct_http *h, const char *reply, size_t reply_len, const json_t *v, int i,
                       int n, char *out, size_t cap) {
  static const char *const types[] = {[JSON_OBJECT] = "an object", [JSON_ARRAY] = "a list",
                                      [JSON_STRING] = "a string", [JSON_INTEGER] = "not finite",
                                      [JSON_REAL] = "not finite", [JSON_TRUE] = "a boolean",
                                      [JSON_FALSE] = "a boolean"};
  char text[48] = "";
  char *dump = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  if (dump && !ct_http_holds_key(h, reply, reply_len)) ct_http_snippet(h, dump, strlen(dump), text, sizeof text);
  free(dump);
  json_type t = json_typeof(v);
  const char *type = t <= JSON_FALSE ? types[t] : "not a number";
  if (text[0])
    snprintf(out, cap, "reward %d of %d is %s (%s); rewards must be numbers or null", i, n,
             text, type);
  else
    snprintf(out, cap, "reward %d of %d is %s; rewards must be numbers or null", i, n, type);
}

// Python's json.dumps writes float('nan') and float('inf') as bare NaN, Infinity and
// -Infinity, which are not JSON (jansson refuses them), and a number past DBL_MAX (1e400)
// is JSON but no double. Outside strings, each such token of [s, s + n) becomes the string
// "\u0000" + its text, which no other reply value decodes to (JSON_ALLOW_NUL): a
// non-finite reward. Writes into out when it is not NULL; returns the rewritten length.
static size_t mark_nonfinite(const char *s, size_t n, char *out) {
  size_t k = 0;
  bool in_str = false;
  for (size_t i = 0; i < n;) {
    char c = s[i];
    size_t len = 1;
    bool mark = false;
    if (in_str) {
      if (c == '\\' && i + 1 < n) len = 2;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == 'N' || c == 'I' || c == '-' || (c >= '0' && c <= '9')) {
      while (i + len < n && (isalnum((unsigned char)s[i + len]) || (s[i + len] && strchr("+-.", s[i + len]))))
        len++;
      char *end = (char *)s + i;
      double x = c == 'N' || c == 'I' ? 0 : strtod(s + i, &end);  // s is NUL-terminated
      mark = (len == 3 && !memcmp(s + i, "NaN", 3)) || (len == 8 && !memcmp(s + i, "Infinity", 8)) ||
             (len == 9 && !memcmp(s + i, "-Infinity", 9)) || (end == s + i + len && !isfinite(x));
    }
    size_t open = mark ? 7 : 0;  // strlen("\"\\u0000")
    if (out && mark) memcpy(out + k, "\"\\u0000", open);
    if (out) memcpy(out + k + open, s + i, len);
    if (out && mark) out[k + open + len] = '"';
    k += len + (mark ? open + 1 : 0);
    i += len;
  }
  return k;
}

// The text of a reward mark_nonfinite made ("NaN", "1e400"), or NULL.
static const char *nonfinite_text(const json_t *v) {
  return json_is_string(v) && json_string_length(v) > 1 && json_string_value(v)[0] == 0
             ? json_string_value(v) + 1 : NULL;
}

// What read_rewards reads into: n rewards into out.
typedef struct {
  ct_reward *r;
  int n;
  double *out;
} reply_ctx;

// The n rewards of a reply into out (an ct_http_reader). A null reward is NaN (TRL maps a
// reward function's None to NaN). NaN, Infinity, -Infinity and 1e400 are NaN too, and
// then reward_failure decides: CT_HTTP_FATAL (error: no retry, the server has answered)
// or CT_HTTP_PARTIAL (nan: the other rewards stand). A reply that is not JSON, or holds
// the wrong count or a reward of another type, may be a passing fault: CT_HTTP_RETRY.
static int read_rewards(void *ctx, const ct_http *h, const char *reply, size_t reply_len, ct_http_failure *f) {
  reply_ctx *c = ctx;
  ct_reward *r = c->r;
  int n = c->n;
  double *out = c->out;
  size_t len = mark_nonfinite(reply, reply_len, NULL);
  char *marked = len != reply_len ? malloc(len) : NULL;
  if (marked) mark_nonfinite(reply, reply_len, marked);
  json_error_t je;
  json_t *js = json_loadb(marked ? marked : reply, marked ? len : reply_len, JSON_ALLOW_NUL, &je);
  free(marked);
  json_t *rw = json_is_object(js) ? json_object_get(js, "rewards") : NULL;
  int rc = CT_HTTP_RETRY, nonfinite = 0;
  snprintf(f->what, sizeof f->what, "malformed JSON reply");
  if (!js) {
    char text[64];
    ct_http_snippet(h, reply, reply_len, text, sizeof text);
    if (ct_http_holds_key(h, reply, reply_len)) snprintf(je.text, sizeof je.text, "bad JSON");
    snprintf(f->detail, sizeof f->detail, "%s at line %d column %d: \"%s\"", je.text, je.line,
             je.column, text);
  } else if (!json_is_array(rw)) {
    snprintf(f->detail, sizeof f->detail, "no \"rewards\" list");
  } else if (json_array_size(rw) != (size_t)n) {
    snprintf(f->what, sizeof f->what, "wrong reward count");
    snprintf(f->detail, sizeof f->detail, "reply has %zu rewards, expected %d (one per query)",
             json_array_size(rw), n);
  } else {
    rc = CT_HTTP_OK;
    for (int i = 0; i < n && rc == CT_HTTP_OK; i++) {
      json_t *v = json_array_get(rw, (size_t)i);
      const char *text = nonfinite_text(v);
      out[i] = json_is_number(v) ? json_number_value(v) : NAN;
      if (text && !nonfinite++) {
        snprintf(f->what, sizeof f->what, "non-finite reward");
        snprintf(f->detail, sizeof f->detail, "reward %d of %d is %.40s", i, n, text);
      } else if (!text && !json_is_number(v) && !json_is_null(v)) {
        snprintf(f->what, sizeof f->what, "bad reward in the reply");
        bad_reward(h, reply, reply_len, v, i, n, f->detail, sizeof f->detail);
        rc = CT_HTTP_RETRY;
      }
    }
  }
  json_decref(js);
  if (rc != CT_HTTP_OK || !nonfinite) return rc;
  size_t k = strlen(f->detail);
  snprintf(f->detail + k, sizeof f->detail - k, "%s%s",
           nonfinite > 1 ? " (and others)" : "",
           r->failure_nan ? "; those completions have NaN rewards"
                          : "; reward_failure: nan would leave such completions out");
  return r->failure_nan ? CT_HTTP_PARTIAL : CT_HTTP_FATAL;
}

// Scores one batch: one request, retried with exponential backoff.
static int remote_batch(ct_reward *r, const ct_reward_item *items, int n, double *out) {
  const char *url = ct_http_url(r->http);
  char *body = request_body(r, items, n);
  if (!body) return ct_set_error(CT_ENOMEM, "remote reward %s: cannot build the request", url);
  ct_http_failure f;
  reply_ctx ctx = {r, n, out};
  int tries, rc = ct_http_post(r->http, body, read_rewards, &ctx, &f, &tries);
  free(body);
  if (rc == CT_HTTP_OK) return 0;
  if (rc != CT_HTTP_PARTIAL)
    for (int i = 0; i < n; i++) out[i] = NAN;
  snprintf(r->last_failure, sizeof r->last_failure, "remote reward %s: %s after %d attempt%s%s%s",
           url, f.what, tries, tries == 1 ? "" : "s", f.detail[0] ? ": " : "", f.detail);
  r->failed_batches++;
  if (r->failure_nan) return 0;
  return ct_set_error(CT_EIO, "%s", r->last_failure);
}

static int remote(ct_reward *r, const ct_reward_item *items, int n, double *out) {
  int per = r->batch > 0 ? r->batch : n;
  for (int i = 0; i < n; i += per) {
    int k = n - i < per ? n - i : per;
    int rc = remote_batch(r, items + i, k, out + i);
    if (rc) return rc;
  }
  return 0;
}

int ct_reward_score(ct_reward *r, const ct_reward_item *items, int n, double *out) {
  if (n < 0)
    return ct_set_error(CT_EINVAL, "reward %s: negative batch size %d", ct_reward_name(r), n);
  for (int i = 0; i < n; i++) out[i] = NAN;
  if (r->kind == CT_REWARD_REMOTE) return n ? remote(r, items, n, out) : 0;
  if (r->kind == CT_REWARD_MODEL) return r->model ? model_score(r, items, n, out) : 0;
  for (int i = 0; i < n; i++)
    out[i] = r->kind == CT_REWARD_ACCURACY ? accuracy(r, &items[i])
             : r->kind == CT_REWARD_FORMAT ? format(r, &items[i])
             : r->kind == CT_REWARD_OVERLONG ? overlong(r, &items[i])
             : r->kind == CT_REWARD_THINK_FORMAT ? think_format(&items[i])
             : r->kind == CT_REWARD_REPETITION ? repetition(r, &items[i])
             : r->kind == CT_REWARD_COSINE ? cosine(r, &items[i])
             : r->kind == CT_REWARD_ENV ? items[i].env_reward
                                           : length(r, &items[i]);
  return 0;
}
