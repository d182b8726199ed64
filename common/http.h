// http: JSON over HTTP POST to the services a trainer calls — a reward server, a tool
// server. One reused libcurl handle per client (one thread each), a timeout per attempt,
// retries with exponential backoff, an optional bearer key read from an environment
// variable (never written into a message), http and https only, certificates always
// checked (CURL_CA_BUNDLE names a private CA), no redirects followed.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "config.h"

typedef struct ct_http ct_http;

typedef struct {
  const char *url;          // http://host:port/path or https://...
  const char *api_key_env;  // NULL or "": no key; else the variable holding it
  double connect_timeout_s, timeout_s;  // per attempt; both > 0
  int retries;              // attempts after the first
  double backoff_s;         // the first wait between attempts (doubling)
  const char *service;      // what messages call it: "remote reward", "tool server"
  const char *key_prefix;   // its configuration keys: prefix + "url", "api_key_env",
                            // "timeout", ... ("reward_", "tool_")
  const ct_config *cfg;     // NULL, or the config the options came from (messages then
                            // start "file:line: key 'reward_url': ")
} ct_http_opts;

// Checks the options (CT_ECONFIG naming the key) and reads the key from the environment.
int ct_http_init(ct_http **h, const ct_http_opts *o);
void ct_http_free(ct_http *h);
const char *ct_http_url(const ct_http *h);

// What an attempt came to: a usable reply, a failure another attempt may mend, a final
// failure, or (a reader's verdict) a reply usable in part, not retried.
enum { CT_HTTP_OK, CT_HTTP_RETRY, CT_HTTP_FATAL, CT_HTTP_PARTIAL };

// Why: a short kind ("HTTP 500", "timeout", "malformed JSON reply") and the detail.
typedef struct {
  char what[64], detail[320];
} ct_http_failure;

// Reads the body of a 200 reply (NUL-terminated, len bytes): CT_HTTP_OK, or a failure
// kind with f filled (CT_HTTP_RETRY for a reply that another attempt may mend).
typedef int (*ct_http_reader)(void *ctx, const ct_http *h, const char *body, size_t len,
                              ct_http_failure *f);

// POSTs body until read accepts a reply, a failure is final (HTTP 4xx, an untrusted
// certificate), or the retries are spent; HTTP 5xx, timeouts, lost connections and the
// reader's CT_HTTP_RETRY are tried again. Returns the last attempt's CT_HTTP_* (f filled
// unless CT_HTTP_OK) and the attempts made in *tries. A stop signal ends a request in
// flight; the retry loop then stops the run (ct_stop_poll, on the watching thread).
int ct_http_post(ct_http *h, const char *body, ct_http_reader read, void *ctx, ct_http_failure *f,
                 int *tries);

// Up to cap − 1 bytes of s on one printable line for a message, or a note that it is
// withheld because it holds the API key (a server that echoes the request back).
void ct_http_snippet(const ct_http *h, const char *s, size_t n, char *out, size_t cap);
// Whether [s, s + n) holds the API key.
bool ct_http_holds_key(const ct_http *h, const char *s, size_t n);
