// http: the POST-and-retry client of http.h over one libcurl easy handle.
#include "http.h"

#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "stop.h"

#define REPLY_MAX (16L << 20)  // bytes: a reply larger than this is malformed

struct ct_http {
  char *url;
  char *service, *prefix;
  char *key_env;  // the variable holding the API key (for messages), or NULL
  char *key;      // the API key itself, or NULL; wiped before it is freed
  int retries;
  double backoff_s;
  CURL *curl;
  struct curl_slist *headers;
  char curl_err[CURL_ERROR_SIZE];
  char *reply;    // the current reply body, NUL-terminated
  size_t reply_len, reply_cap;
  bool reply_too_big;
};

const char *ct_http_url(const ct_http *h) { return h->url; }

// The one-line error of option prefix + key, after where its value came from.
static int key_error(const ct_http_opts *o, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int key_error(const ct_http_opts *o, const char *key, const char *fmt, ...) {
  char msg[768], name[64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(name, sizeof name, "%s%s", o->key_prefix ? o->key_prefix : "", key);
  const char *from = o->cfg ? ct_config_origin(o->cfg, name) : NULL;
  if (from) return ct_set_error(CT_ECONFIG, "%s: key '%s': %s", from, name, msg);
  return ct_set_error(CT_ECONFIG, "%s: %s", name, msg);
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_global_rc;
static void curl_global(void) { curl_global_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

static size_t on_reply(char *data, size_t size, size_t nmemb, void *user) {
  ct_http *h = user;
  size_t n = size * nmemb;
  if (h->reply_len + n + 1 > h->reply_cap) {
    if (h->reply_len + n + 1 > (size_t)REPLY_MAX) {
      h->reply_too_big = true;
      return 0;  // makes curl fail the transfer with CURLE_WRITE_ERROR
    }
    size_t cap = h->reply_cap ? h->reply_cap : 4096;
    while (cap < h->reply_len + n + 1) cap *= 2;
    char *p = realloc(h->reply, cap);
    if (!p) return 0;
    h->reply = p;
    h->reply_cap = cap;
  }
  memcpy(h->reply + h->reply_len, data, n);
  h->reply_len += n;
  h->reply[h->reply_len] = 0;
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

// The API key from the environment variable `name` into h->key. Messages name the
// variable, never its value.
static int read_key(ct_http *h, const ct_http_opts *o, const char *name) {
  if (!(h->key_env = strdup(name))) return ct_set_error(CT_ENOMEM, "out of memory");
  const char *key = getenv(name);
  if (!key || !*key)
    return key_error(o, "api_key_env", "environment variable %s is %s; export the %s's API key in it", name,
                     key ? "empty" : "unset", h->service);
  for (const char *p = key; *p; p++)
    if ((unsigned char)*p < 32 || *p == 127)  // a line break would inject a header
      return key_error(o, "api_key_env", "the value of %s contains a control character (a trailing newline?)",
                       name);
  if (!(h->key = strdup(key))) return ct_set_error(CT_ENOMEM, "out of memory");
  return 0;
}

// Appends "Authorization: Bearer KEY" to h->headers (which copies it).
static int add_key_header(ct_http *h) {
  size_t cap = strlen(h->key) + sizeof "Authorization: Bearer ";
  char *line = malloc(cap);
  if (!line) return ct_set_error(CT_ENOMEM, "out of memory");
  snprintf(line, cap, "Authorization: Bearer %s", h->key);
  struct curl_slist *s = curl_slist_append(h->headers, line);
  wipe(line);
  free(line);
  if (!s) return ct_set_error(CT_ENOMEM, "out of memory");
  h->headers = s;
  return 0;
}

// A stop asked for (SIGINT, SIGTERM) ends a request in flight at once; the retry loop's
// ct_stop_poll then stops the run.
static int on_progress(void *p, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d) {
  (void)p, (void)a, (void)b, (void)c, (void)d;
  return ct_stop_signal() != 0;
}

static int check_opts(const ct_http_opts *o) {
  if (!o->url || (strncmp(o->url, "http://", 7) && strncmp(o->url, "https://", 8)))
    return key_error(o, "url", "\"%s\" is not an http:// or https:// URL", o->url ? o->url : "");
  if (!(o->connect_timeout_s > 0))
    return key_error(o, "connect_timeout", "must be > 0 seconds (got %g)", o->connect_timeout_s);
  if (!(o->timeout_s > 0)) return key_error(o, "timeout", "must be > 0 seconds (got %g)", o->timeout_s);
  if (o->retries < 0) return key_error(o, "retries", "must be >= 0 (got %d)", o->retries);
  if (!(o->backoff_s >= 0) || isinf(o->backoff_s))
    return key_error(o, "backoff", "must be >= 0 seconds (got %g)", o->backoff_s);
  CURLU *u = curl_url();
  CURLUcode uc = u ? curl_url_set(u, CURLUPART_URL, o->url, 0) : CURLUE_OUT_OF_MEMORY;
  curl_url_cleanup(u);
  if (uc != CURLUE_OK)
    return key_error(o, "url", "\"%s\" is not a valid URL (%s)", o->url,
                     uc == CURLUE_OUT_OF_MEMORY ? "out of memory" : "libcurl cannot parse it");
  return 0;
}

static int set_options(ct_http *h, const ct_http_opts *o) {
  CURL *c = h->curl;
  int bad = 0;
  bad |= curl_easy_setopt(c, CURLOPT_URL, h->url) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_HTTPHEADER, h->headers) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L) != CURLE_OK;  // timeouts without SIGALRM
  bad |= curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, to_ms(o->connect_timeout_s)) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, to_ms(o->timeout_s)) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_reply) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_WRITEDATA, h) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_ERRORBUFFER, h->curl_err) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L) != CURLE_OK;
  // libcurl's defaults, said out loud: an https server must prove it is the host named
  bad |= curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L) != CURLE_OK;
  bad |= curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L) != CURLE_OK;
  // a private CA (a server inside a company network): CURL_CA_BUNDLE names a certificate
  // bundle to trust, as it does for curl and Python requests (libcurl's CA directory, when
  // it was built with one, is still searched too)
  const char *ca = getenv("CURL_CA_BUNDLE");
  if (ca && ca[0]) bad |= curl_easy_setopt(c, CURLOPT_CAINFO, ca) != CURLE_OK;
#if LIBCURL_VERSION_NUM >= 0x075500
  bad |= curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK;
#else
  bad |= curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS)) != CURLE_OK;
#endif
  return bad ? ct_set_error(CT_EIO, "%s %s: libcurl rejected an option", h->service, h->url) : 0;
}

static int init(ct_http *h, const ct_http_opts *o) {
  int rc = check_opts(o);
  if (rc) return rc;
  if (!(h->url = strdup(o->url)) || !(h->service = strdup(o->service ? o->service : "server")) ||
      !(h->prefix = strdup(o->key_prefix ? o->key_prefix : "")))
    return ct_set_error(CT_ENOMEM, "out of memory");
  if (o->api_key_env && *o->api_key_env && (rc = read_key(h, o, o->api_key_env))) return rc;
  h->retries = o->retries;
  h->backoff_s = o->backoff_s;
  pthread_once(&curl_once, curl_global);
  if (curl_global_rc != CURLE_OK)
    return ct_set_error(CT_EIO, "%s: libcurl failed to initialize: %s", h->service,
                        curl_easy_strerror(curl_global_rc));
  if (!(h->curl = curl_easy_init())) return ct_set_error(CT_EIO, "%s: libcurl failed to create a handle", h->service);
  // "Expect:" stops curl from waiting up to a second for "100 Continue" on large bodies
  struct curl_slist *s = curl_slist_append(NULL, "Content-Type: application/json");
  if (s) h->headers = s;
  if (!s || !(s = curl_slist_append(h->headers, "Expect:"))) return ct_set_error(CT_ENOMEM, "out of memory");
  if (h->key && (rc = add_key_header(h))) return rc;
  return set_options(h, o);
}

int ct_http_init(ct_http **out, const ct_http_opts *o) {
  ct_http *h = calloc(1, sizeof *h);
  if (!h) return ct_set_error(CT_ENOMEM, "out of memory");
  int rc = init(h, o);
  if (rc) {
    ct_http_free(h);
    h = NULL;
  }
  *out = h;
  return rc;
}

void ct_http_free(ct_http *h) {
  if (!h) return;
  if (h->curl) curl_easy_cleanup(h->curl);
  for (struct curl_slist *s = h->headers; s; s = s->next) wipe(s->data);
  curl_slist_free_all(h->headers);
  wipe(h->key);
  free(h->key);
  free(h->key_env);
  free(h->reply);
  free(h->url);
  free(h->service);
  free(h->prefix);
  free(h);
}

bool ct_http_holds_key(const ct_http *h, const char *s, size_t n) {
  return h->key && s && memmem(s, n, h->key, strlen(h->key));
}

void ct_http_snippet(const ct_http *h, const char *s, size_t n, char *out, size_t cap) {
  if (ct_http_holds_key(h, s, n)) {
    snprintf(out, cap, "(reply withheld: it contains the API key)");
    return;
  }
  while (n && (*s == ' ' || (*s >= '\t' && *s <= '\r'))) s++, n--;
  while (n && (s[n - 1] == ' ' || (s[n - 1] >= '\t' && s[n - 1] <= '\r'))) n--;
  size_t k = 0, keep = n < cap - 1 ? n : cap - 4;  // room for "..."
  for (; k < keep; k++) out[k] = s[k] >= 32 && s[k] < 127 ? s[k] : ' ';
  if (keep < n) memcpy(out + k, "...", 3), k += 3;
  out[k] = 0;
}

// A transport failure (curl's code cc) into f; whether another attempt may help.
static int transport_failure(ct_http *h, CURLcode cc, ct_http_failure *f) {
  const char *detail = h->curl_err[0] ? h->curl_err : curl_easy_strerror(cc);
  snprintf(f->detail, sizeof f->detail, "%s", detail);
  const char *what = cc == CURLE_OPERATION_TIMEDOUT         ? "timeout"
                     : cc == CURLE_COULDNT_CONNECT          ? "cannot connect"
                     : cc == CURLE_GOT_NOTHING              ? "connection closed without a reply"
                     : cc == CURLE_SSL_CONNECT_ERROR        ? "TLS handshake failed"
                     : cc == CURLE_PEER_FAILED_VERIFICATION ? "TLS certificate not trusted"
                     : cc == CURLE_SSL_CACERT_BADFILE       ? "TLS: cannot read the CA certificates"
                                                            : curl_easy_strerror(cc);
  if (h->reply_too_big) {
    what = "malformed reply";
    snprintf(f->detail, sizeof f->detail, "larger than %ld bytes", REPLY_MAX);
  }
  snprintf(f->what, sizeof f->what, "%s", what);
  if (!strcmp(f->detail, f->what)) f->detail[0] = 0;
  // a URL curl cannot use, or a certificate it does not trust, will not work next time
  return cc == CURLE_URL_MALFORMAT || cc == CURLE_UNSUPPORTED_PROTOCOL || cc == CURLE_NOT_BUILT_IN ||
                 cc == CURLE_OUT_OF_MEMORY || cc == CURLE_PEER_FAILED_VERIFICATION ||
                 cc == CURLE_SSL_CACERT_BADFILE
             ? CT_HTTP_FATAL : CT_HTTP_RETRY;
}

// A reply other than 200 into f; whether another attempt may help (5xx).
static int status_failure(ct_http *h, long status, ct_http_failure *f) {
  snprintf(f->what, sizeof f->what, "HTTP %ld", status);
  char text[128];
  ct_http_snippet(h, h->reply_len ? h->reply : "", h->reply_len, text, sizeof text);
  if (status == 401 || status == 403) {
    char hint[160];
    if (h->key_env)
      snprintf(hint, sizeof hint, "the server refused the API key in %s (%sapi_key_env)", h->key_env, h->prefix);
    else
      snprintf(hint, sizeof hint, "no API key was sent (set %sapi_key_env)", h->prefix);
    snprintf(f->detail, sizeof f->detail, "%s%s%s", hint, text[0] ? "; the server says: " : "", text);
  } else {
    snprintf(f->detail, sizeof f->detail, "%s", text);
  }
  return status >= 500 ? CT_HTTP_RETRY : CT_HTTP_FATAL;
}

// One POST of body, its reply read by `read`.
static int attempt(ct_http *h, const char *body, ct_http_reader read, void *ctx, ct_http_failure *f) {
  h->reply_len = 0;
  h->reply_too_big = false;
  h->curl_err[0] = 0;
  f->detail[0] = 0;
  curl_easy_setopt(h->curl, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
  CURLcode cc = curl_easy_perform(h->curl);
  if (cc != CURLE_OK) return transport_failure(h, cc, f);
  long status = 0;
  curl_easy_getinfo(h->curl, CURLINFO_RESPONSE_CODE, &status);
  if (status != 200) return status_failure(h, status, f);
  return read(ctx, h, h->reply_len ? h->reply : "", h->reply_len, f);
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
  while (nanosleep(&ts, &ts) && errno == EINTR) ct_stop_poll(NULL, 0, 0);  // (a signal: stop now)
}

int ct_http_post(ct_http *h, const char *body, ct_http_reader read, void *ctx, ct_http_failure *f, int *tries) {
  char what[80];
  snprintf(what, sizeof what, "%s requests", h->service);
  int k = 0, rc = CT_HTTP_RETRY;
  double wait = h->backoff_s;
  for (; k <= h->retries && rc == CT_HTTP_RETRY; k++) {
    ct_stop_poll(what, k, h->retries + 1);
    if (k) {
      sleep_s(wait);
      wait *= 2;
    }
    rc = attempt(h, body, read, ctx, f);
    ct_stop_poll(what, k + 1, h->retries + 1);  // (a stop aborted the request: stop, not fail)
  }
  *tries = k;
  return rc;
}
