// grpo/reward: the built-in reward functions (accuracy, format, length) and the remote
// reward client (OpenRLHF's JSON protocol over HTTP or HTTPS, via one reused libcurl
// handle, with an optional bearer key). It does not follow redirects, and it never turns
// TLS certificate checks off; the key never appears in a message.
#include "grpo/rewards.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sys/stat.h>

#include "config.h"
#include "error.h"
#include "grpo/mathans.h"
#include "jsonl.h"
#include "pyregex.h"
#include "reward_model.h"
#include "stop.h"
#include "unicode.h"

#define REPLY_MAX (16L << 20)  // bytes: a reward reply larger than this is malformed

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
  char *url;
  char *key_env;       // the variable holding the API key (for messages), or NULL
  char *key;           // the API key itself, or NULL; wiped before it is freed
  long connect_ms, timeout_ms;
  int retries, batch;
  double backoff_s;
  bool failure_nan;
  CURL *curl;
  struct curl_slist *headers;
  char curl_err[CURL_ERROR_SIZE];
  char *reply;         // the current reply body, NUL-terminated
  size_t reply_len, reply_cap;
  bool reply_too_big;
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
                      "length, overlong, think_format, repetition_penalty, cosine, remote, or a reward model's "
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

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_global_rc;
static void curl_global(void) { curl_global_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

static size_t on_reply(char *data, size_t size, size_t nmemb, void *user) {
  ct_reward *r = user;
  size_t n = size * nmemb;
  if (r->reply_len + n + 1 > r->reply_cap) {
    if (r->reply_len + n + 1 > (size_t)REPLY_MAX) {
      r->reply_too_big = true;
      return 0;  // makes curl fail the transfer with CURLE_WRITE_ERROR
    }
    size_t cap = r->reply_cap ? r->reply_cap : 4096;
    while (cap < r->reply_len + n + 1) cap *= 2;
    char *p = realloc(r->reply, cap);
    if (!p) return 0;
    r->reply = p;
    r->reply_cap = cap;
  }
  memcpy(r->reply + r->reply_len, data, n);
  r->reply_len += n;
  r->reply[r->reply_len] = 0;
  return n;
}

// Seconds → curl milliseconds, at least 1 (0 would mean "no limit").
static long to_ms(double s) {
  double ms = ceil(s * 1000.0);
  return ms < 1 ? 1 : ms > 1e9 ? 1000000000L : (long)ms;
}

// Overwrites s with zeros (volatile: the compiler may not drop stores to memory about
// to be freed).
static void wipe(char *s) {
  for (volatile char *p = s; p && *p; p++) *p = 0;
}

// The API key from the environment variable `name` into r->key. Messages name the
// variable, never its value.
static int read_key(ct_reward *r, const ct_reward_opts *o, const char *name) {
  if (!(r->key_env = strdup(name))) return ct_set_error(CT_ENOMEM, "out of memory");
  const char *key = getenv(name);
  if (!key || !*key)
    return key_error(o, CT_ECONFIG, "reward_api_key_env", "environment variable %s is %s; "
                     "export the reward server's API key in it", name,
                        key ? "empty" : "unset");
  for (const char *p = key; *p; p++)
    if ((unsigned char)*p < 32 || *p == 127)  // a line break would inject a header
      return key_error(o, CT_ECONFIG, "reward_api_key_env", "the value of %s contains a control "
                       "character (a trailing newline?)", name);
  if (!(r->key = strdup(key))) return ct_set_error(CT_ENOMEM, "out of memory");
  return 0;
}

// Appends "Authorization: Bearer KEY" to r->headers (which copies it).
static int add_key_header(ct_reward *r) {
  size_t cap = strlen(r->key) + sizeof "Authorization: Bearer ";
  char *line = malloc(cap);
  if (!line) return ct_set_error(CT_ENOMEM, "out of memory");
  snprintf(line, cap, "Authorization: Bearer %s", r->key);
  struct curl_slist *h = curl_slist_append(r->headers, line);
  wipe(line);
  free(line);
  if (!h) return ct_set_error(CT_ENOMEM, "out of memory");
  r->headers = h;
  return 0;
}

// A stop asked for (SIGINT, SIGTERM) ends a request in flight at once; the retry loop's
// ct_stop_poll then stops the run.
static int on_progress(void *p, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d) {
  (void)p, (void)a, (void)b, (void)c, (void)d;
  return ct_stop_signal() != 0;
}

static int init_remote(ct_reward *r, const ct_reward_opts *o) {
  if (!o->url || (strncmp(o->url, "http://", 7) && strncmp(o->url, "https://", 8)))
    return key_error(o, CT_ECONFIG, "reward_url", "\"%s\" is not an http:// or https:// URL",
                     o->url ? o->url : "");
  if (!(o->connect_timeout_s > 0))
    return key_error(o, CT_ECONFIG, "reward_connect_timeout", "must be > 0 seconds (got %g)",
                     o->connect_timeout_s);
  if (!(o->timeout_s > 0))
    return key_error(o, CT_ECONFIG, "reward_timeout", "must be > 0 seconds (got %g)", o->timeout_s);
  if (o->retries < 0)
    return key_error(o, CT_ECONFIG, "reward_retries", "must be >= 0 (got %d)", o->retries);
  if (!(o->backoff_s >= 0) || isinf(o->backoff_s))
    return key_error(o, CT_ECONFIG, "reward_backoff", "must be >= 0 seconds (got %g)", o->backoff_s);
  CURLU *u = curl_url();
  CURLUcode uc = u ? curl_url_set(u, CURLUPART_URL, o->url, 0) : CURLUE_OUT_OF_MEMORY;
  curl_url_cleanup(u);
  if (uc != CURLUE_OK)
    return key_error(o, CT_ECONFIG, "reward_url", "\"%s\" is not a valid URL (%s)", o->url,
                     uc == CURLUE_OUT_OF_MEMORY ? "out of memory" : "libcurl cannot parse it");
  if (o->api_key_env && *o->api_key_env) {
    int rc = read_key(r, o, o->api_key_env);
    if (rc) return rc;
  }
  if (!(r->url = strdup(o->url))) return ct_set_error(CT_ENOMEM, "out of memory");
  r->connect_ms = to_ms(o->connect_timeout_s);
  r->timeout_ms = to_ms(o->timeout_s);
  r->retries = o->retries;
  r->backoff_s = o->backoff_s;
  r->failure_nan = o->failure_nan;
  r->batch = o->batch;

  pthread_once(&curl_once, curl_global);
  if (curl_global_rc != CURLE_OK)
    return ct_set_error(CT_EIO, "remote reward: libcurl failed to initialize: %s",
                        curl_easy_strerror(curl_global_rc));
  if (!(r->curl = curl_easy_init()))
    return ct_set_error(CT_EIO, "remote reward: libcurl failed to create a handle");
  // "Expect:" stops curl from waiting up to a second for "100 Continue" on large bodies
  struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
  if (h) r->headers = h;
  if (!h || !(h = curl_slist_append(r->headers, "Expect:")))
    return ct_set_error(CT_ENOMEM, "out of memory");
  int rc = r->key ? add_key_header(r) : 0;
  if (rc) return rc;
  CURL *c = r->curl;
  int bad = 0;
  bad |= curl_easy_setopt(c, CURLOPT_URL, r->url) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_HTTPHEADER, r->headers) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L) != CURLE_OK;  // timeouts without SIGALRM
  bad |= curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, r->connect_ms) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, r->timeout_ms) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_reply) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_WRITEDATA, r) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_ERRORBUFFER, r->curl_err) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L) != CURLE_OK;
  // libcurl's defaults, said out loud: an https server must prove it is the host named
  bad |= curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L) != CURLE_OK;
  // a private CA (a reward server inside a company network): CURL_CA_BUNDLE names a
  // certificate bundle to trust, as it does for curl and Python requests (libcurl's CA
  // directory, when it was built with one, is still searched too)
  const char *ca = getenv("CURL_CA_BUNDLE");
  if (ca && ca[0]) bad |= curl_easy_setopt(c, CURLOPT_CAINFO, ca) != CURLE_OK;
#if LIBCURL_VERSION_NUM >= 0x075500
  bad |= curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK;
#else
  bad |= curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS)) !=
         CURLE_OK;
#endif
  if (bad) return ct_set_error(CT_EIO, "remote reward %s: libcurl rejected an option", r->url);
  return 0;
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
  if (r->curl) curl_easy_cleanup(r->curl);
  for (struct curl_slist *h = r->headers; h; h = h->next) wipe(h->data);
  curl_slist_free_all(r->headers);
  wipe(r->key);
  free(r->key);
  free(r->key_env);
  free(r->reply);
  free(r->url);
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

// Up to cap - 1 bytes of a reply on one printable line, for an error message.
static void snippet(const char *s, size_t n, char *out, size_t cap) {
  trim(&s, &n);
  size_t k = 0, keep = n < cap - 1 ? n : cap - 4;  // room for "..."
  for (; k < keep; k++) out[k] = s[k] >= 32 && s[k] < 127 ? s[k] : ' ';
  if (keep < n) memcpy(out + k, "...", 3), k += 3;
  out[k] = 0;
}

// Whether [s, s + n) holds the API key (a server that echoes the request back): then no
// part of it may go into a message.
static bool holds_key(const ct_reward *r, const char *s, size_t n) {
  return r->key && memmem(s, n, r->key, strlen(r->key));
}

// The reply on one printable line for a message, or a note that it is withheld.
static void reply_snippet(const ct_reward *r, char *out, size_t cap) {
  const char *reply = r->reply_len ? r->reply : "";
  if (holds_key(r, reply, r->reply_len))
    snprintf(out, cap, "(reply withheld: it contains the API key)");
  else
    snippet(reply, r->reply_len, out, cap);
}

// Why reward `i` of n (not a number) is unusable: its JSON text and type, e.g.
// "reward 1 of 4 is "NaN" (a string); rewards must be numbers or null".
static void bad_reward(const ct_reward *r, const json_t *v, int i, int n, char *out,
                       size_t cap) {
  static const char *const types[] = {[JSON_OBJECT] = "an object", [JSON_ARRAY] = "a list",
                                      [JSON_STRING] = "a string", [JSON_INTEGER] = "not finite",
                                      [JSON_REAL] = "not finite", [JSON_TRUE] = "a boolean",
                                      [JSON_FALSE] = "a boolean"};
  char text[48] = "";
  char *dump = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  if (dump && !holds_key(r, r->reply, r->reply_len))
    snippet(dump, strlen(dump), text, sizeof text);
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

enum { ATTEMPT_OK, ATTEMPT_RETRY, ATTEMPT_FATAL, ATTEMPT_PARTIAL };

// What went wrong with an attempt: a short kind ("HTTP 500", "timeout") and the detail.
typedef struct {
  char what[64], detail[320];
} failure;

// The n rewards of the reply in r->reply into out. A null reward is NaN (TRL maps a
// reward function's None to NaN). NaN, Infinity, -Infinity and 1e400 are NaN too, and
// then reward_failure decides: ATTEMPT_FATAL (error: no retry, the server has answered)
// or ATTEMPT_PARTIAL (nan: the other rewards stand). A reply that is not JSON, or holds
// the wrong count or a reward of another type, may be a passing fault: ATTEMPT_RETRY.
static int read_rewards(ct_reward *r, int n, double *out, failure *f) {
  const char *reply = r->reply_len ? r->reply : "";
  size_t len = mark_nonfinite(reply, r->reply_len, NULL);
  char *marked = len != r->reply_len ? malloc(len) : NULL;
  if (marked) mark_nonfinite(reply, r->reply_len, marked);
  json_error_t je;
  json_t *js = json_loadb(marked ? marked : reply, marked ? len : r->reply_len, JSON_ALLOW_NUL, &je);
  free(marked);
  json_t *rw = json_is_object(js) ? json_object_get(js, "rewards") : NULL;
  int rc = ATTEMPT_RETRY, nonfinite = 0;
  snprintf(f->what, sizeof f->what, "malformed JSON reply");
  if (!js) {
    char text[64];
    reply_snippet(r, text, sizeof text);
    if (holds_key(r, reply, r->reply_len)) snprintf(je.text, sizeof je.text, "bad JSON");
    snprintf(f->detail, sizeof f->detail, "%s at line %d column %d: \"%s\"", je.text, je.line,
             je.column, text);
  } else if (!json_is_array(rw)) {
    snprintf(f->detail, sizeof f->detail, "no \"rewards\" list");
  } else if (json_array_size(rw) != (size_t)n) {
    snprintf(f->what, sizeof f->what, "wrong reward count");
    snprintf(f->detail, sizeof f->detail, "reply has %zu rewards, expected %d (one per query)",
             json_array_size(rw), n);
  } else {
    rc = ATTEMPT_OK;
    for (int i = 0; i < n && rc == ATTEMPT_OK; i++) {
      json_t *v = json_array_get(rw, (size_t)i);
      const char *text = nonfinite_text(v);
      out[i] = json_is_number(v) ? json_number_value(v) : NAN;
      if (text && !nonfinite++) {
        snprintf(f->what, sizeof f->what, "non-finite reward");
        snprintf(f->detail, sizeof f->detail, "reward %d of %d is %.40s", i, n, text);
      } else if (!text && !json_is_number(v) && !json_is_null(v)) {
        snprintf(f->what, sizeof f->what, "bad reward in the reply");
        bad_reward(r, v, i, n, f->detail, sizeof f->detail);
        rc = ATTEMPT_RETRY;
      }
    }
  }
  json_decref(js);
  if (rc != ATTEMPT_OK || !nonfinite) return rc;
  size_t k = strlen(f->detail);
  snprintf(f->detail + k, sizeof f->detail - k, "%s%s",
           nonfinite > 1 ? " (and others)" : "",
           r->failure_nan ? "; those completions have NaN rewards"
                          : "; reward_failure: nan would leave such completions out");
  return r->failure_nan ? ATTEMPT_PARTIAL : ATTEMPT_FATAL;
}

// One POST of body; on success the n rewards are in out. Otherwise f says what went
// wrong and the result says whether another attempt may help.
static int attempt(ct_reward *r, const char *body, int n, double *out, failure *f) {
  r->reply_len = 0;
  r->reply_too_big = false;
  r->curl_err[0] = 0;
  f->detail[0] = 0;
  curl_easy_setopt(r->curl, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(r->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
  CURLcode cc = curl_easy_perform(r->curl);
  if (cc != CURLE_OK) {
    const char *detail = r->curl_err[0] ? r->curl_err : curl_easy_strerror(cc);
    snprintf(f->detail, sizeof f->detail, "%s", detail);
    const char *what =
        cc == CURLE_OPERATION_TIMEDOUT          ? "timeout"
        : cc == CURLE_COULDNT_CONNECT           ? "cannot connect"
        : cc == CURLE_GOT_NOTHING               ? "connection closed without a reply"
        : cc == CURLE_SSL_CONNECT_ERROR         ? "TLS handshake failed"
        : cc == CURLE_PEER_FAILED_VERIFICATION  ? "TLS certificate not trusted"
        : cc == CURLE_SSL_CACERT_BADFILE        ? "TLS: cannot read the CA certificates"
                                                : curl_easy_strerror(cc);
    if (r->reply_too_big) {
      what = "malformed reply";
      snprintf(f->detail, sizeof f->detail, "larger than %ld bytes", REPLY_MAX);
    }
    snprintf(f->what, sizeof f->what, "%s", what);
    if (!strcmp(f->detail, f->what)) f->detail[0] = 0;
    // a URL curl cannot use, or a certificate it does not trust, will not work next time
    return cc == CURLE_URL_MALFORMAT || cc == CURLE_UNSUPPORTED_PROTOCOL ||
                   cc == CURLE_NOT_BUILT_IN || cc == CURLE_OUT_OF_MEMORY ||
                   cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CACERT_BADFILE
               ? ATTEMPT_FATAL : ATTEMPT_RETRY;
  }
  long status = 0;
  curl_easy_getinfo(r->curl, CURLINFO_RESPONSE_CODE, &status);
  if (status != 200) {
    snprintf(f->what, sizeof f->what, "HTTP %ld", status);
    char text[128];
    reply_snippet(r, text, sizeof text);
    if (status == 401 || status == 403) {
      char hint[160];
      if (r->key_env)
        snprintf(hint, sizeof hint, "the server refused the API key in %s (reward_api_key_env)",
                 r->key_env);
      else
        snprintf(hint, sizeof hint, "no API key was sent (set reward_api_key_env)");
      snprintf(f->detail, sizeof f->detail, "%s%s%s", hint, text[0] ? "; the server says: " : "",
               text);
    } else {
      snprintf(f->detail, sizeof f->detail, "%s", text);
    }
    return status >= 500 ? ATTEMPT_RETRY : ATTEMPT_FATAL;
  }
  return read_rewards(r, n, out, f);
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
  while (nanosleep(&ts, &ts) && errno == EINTR) ct_stop_poll(NULL, 0, 0);  // (a signal: stop now)
}

// Scores one batch: one request, retried with exponential backoff.
static int remote_batch(ct_reward *r, const ct_reward_item *items, int n, double *out) {
  char *body = request_body(r, items, n);
  if (!body) return ct_set_error(CT_ENOMEM, "remote reward %s: cannot build the request", r->url);
  failure f;
  int tries = 0, rc = ATTEMPT_RETRY;
  double wait = r->backoff_s;
  for (; tries <= r->retries && rc == ATTEMPT_RETRY; tries++) {
    ct_stop_poll("reward requests", tries, r->retries + 1);
    if (tries) {
      sleep_s(wait);
      wait *= 2;
    }
    rc = attempt(r, body, n, out, &f);
    ct_stop_poll("reward requests", tries + 1, r->retries + 1);  // (a stop aborted the request: stop, not fail)
  }
  free(body);
  if (rc == ATTEMPT_OK) return 0;
  if (rc != ATTEMPT_PARTIAL)
    for (int i = 0; i < n; i++) out[i] = NAN;
  snprintf(r->last_failure, sizeof r->last_failure, "remote reward %s: %s after %d attempt%s%s%s",
           r->url, f.what, tries, tries == 1 ? "" : "s", f.detail[0] ? ": " : "", f.detail);
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
                                           : length(r, &items[i]);
  return 0;
}
