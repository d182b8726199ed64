// ctune-tool-server: an example tool server for GRPO's tool calls (tool_url), speaking
// ctune's tool protocol: POST {"name", "arguments", "row"} → {"content": ...} or
// {"error": "..."}. Its tools:
//   calculator  {"expression"}: exact arithmetic (the built-in tool's, common/calculator.h)
//   lookup      {"key"}: the prompt row's field `key` (how a tool reads the row it serves)
//   echo        any arguments: their JSON text
// Any other name gets {"error": "unknown tool NAME"}. It listens on 127.0.0.1 only.
//
//   ctune-tool-server [port=0] [mode=ok] [delay_ms=1000] [api_key_env=NAME]
//
// Prints the port on stdout (port=0 picks a free one), then serves each request on its
// own thread until SIGTERM or SIGINT, logging each request on stderr (never a key). With
// api_key_env, requests without "Authorization: Bearer KEY" get HTTP 401. Other modes
// misbehave on purpose, for tests of the client:
//   slow     waits delay_ms before answering (requests still run concurrently)
//   500      answers HTTP 500
//   flaky    answers HTTP 500 to the first request of each call (each distinct body), and
//            serves its retry
//   badjson  answers 200 with a body that is not JSON
//   close    closes the connection without answering
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "calculator.h"
#include "httpd.h"

static const char *MODES[] = {"ok", "slow", "500", "flaky", "badjson", "close"};
static const char *mode = "ok";
static long delay_ms = 1000;
static const char *api_key;  // NULL: no key needed
static pthread_mutex_t seen_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long seen[1 << 16];  // flaky: hashes of the bodies served so far

// Whether this body came before (flaky); records it.
static bool seen_before(const char *s, size_t n) {
  unsigned long long h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
  h |= 1;
  pthread_mutex_lock(&seen_mu);
  size_t k = (size_t)(h >> 40) & ((1 << 16) - 1);
  while (seen[k] && seen[k] != h) k = (k + 1) & ((1 << 16) - 1);
  bool before = seen[k] == h;
  seen[k] = h;
  pthread_mutex_unlock(&seen_mu);
  return before;
}

// The reply to a call {"name", "arguments", "row"}: {"content"} or {"error"}; NULL (with
// err) for a request that is no call.
static json_t *call(const json_t *req, char *err, size_t cap) {
  const char *name = json_string_value(json_object_get(req, "name"));
  const json_t *args = json_object_get(req, "arguments"), *row = json_object_get(req, "row");
  if (!name || !json_is_object(args)) {
    snprintf(err, cap, "expected {\"name\": string, \"arguments\": object, \"row\": object}");
    return NULL;
  }
  if (!strcmp(name, "calculator")) {
    const char *e = json_string_value(json_object_get(args, "expression"));
    char out[256];
    if (!e) return json_pack("{s:s}", "error", "calculator: needs a string argument 'expression'");
    return ct_calculator_eval(e, out, sizeof out) ? json_pack("{s:s}", "content", out)
                                                  : json_pack("{s:s++}", "error", "calculator: ", out);
  }
  if (!strcmp(name, "lookup")) {
    const char *key = json_string_value(json_object_get(args, "key"));
    const json_t *v = key ? json_object_get(row, key) : NULL;
    if (!v) return json_pack("{s:s}", "error", "lookup: the row has no such field");
    return json_pack("{s:O}", "content", (json_t *)v);
  }
  if (!strcmp(name, "echo")) return json_pack("{s:O}", "content", (json_t *)args);
  char msg[300];
  snprintf(msg, sizeof msg, "unknown tool %.200s", name);
  return json_pack("{s:s}", "error", msg);
}

static void serve(void *ctx, int fd, const ct_httpd_request *r) {
  (void)ctx;
  bool ok = ct_httpd_authorized(r->head, api_key);
  fprintf(stderr, "ctune-tool-server: %s (%zu bytes), mode %s%s\n", r->line, r->len, mode,
          ok ? "" : ": no valid API key, 401");
  if (ok && !strcmp(mode, "slow")) ct_httpd_sleep_ms(delay_ms);
  if (!ok) {
    ct_httpd_respond(fd, 401, "text/plain", "missing or wrong API key (send Authorization: Bearer KEY)\n");
  } else if (strncmp(r->line, "POST ", 5)) {
    ct_httpd_respond(fd, 405, "text/plain", "POST a JSON body: {\"name\", \"arguments\", \"row\"}\n");
  } else if (!strcmp(mode, "close")) {
    // no reply at all: the connection closes
  } else if (!strcmp(mode, "500") || (!strcmp(mode, "flaky") && !seen_before(r->body, r->len))) {
    ct_httpd_respond(fd, 500, "text/plain", "internal error\n");
  } else if (!strcmp(mode, "badjson")) {
    ct_httpd_respond(fd, 200, "application/json", "this is not json {\n");
  } else {
    char err[256] = "";
    json_t *req = json_loadb(r->body, r->len, 0, NULL), *reply = req ? call(req, err, sizeof err - 1) : NULL;
    char *text = reply ? json_dumps(reply, JSON_COMPACT) : NULL;
    if (text) ct_httpd_respond(fd, 200, "application/json", text);
    else ct_httpd_respond(fd, 400, "text/plain", req ? strcat(err, "\n") : "request is not JSON\n");
    free(text);
    json_decref(reply);
    json_decref(req);
  }
}

static int usage(FILE *f) {
  fputs("usage: ctune-tool-server [port=0] [mode=ok|slow|500|flaky|badjson|close] [delay_ms=1000] "
        "[api_key_env=NAME]\n", f);
  return f == stdout ? 0 : 2;  // --help: exit 0
}

static bool parse_long(const char *v, long lo, long hi, long *x) {
  char *end;
  *x = strtol(v, &end, 10);
  return *v && !*end && *x >= lo && *x <= hi;
}

int main(int argc, char **argv) {
  if (ct_config_help_asked(argc, argv)) return usage(stdout);
  long port = 0;
  for (int i = 1; i < argc; i++) {
    char *v = strchr(argv[i], '=');
    if (!v) return usage(stderr);
    *v++ = 0;
    bool ok = false;
    if (!strcmp(argv[i], "port")) ok = parse_long(v, 0, 65535, &port);
    else if (!strcmp(argv[i], "delay_ms")) ok = parse_long(v, 0, 3600000, &delay_ms);
    else if (!strcmp(argv[i], "mode")) {
      for (size_t m = 0; m < sizeof MODES / sizeof *MODES; m++)
        if (!strcmp(v, MODES[m])) ok = true, mode = MODES[m];
    } else if (!strcmp(argv[i], "api_key_env")) {
      api_key = getenv(v);
      ok = api_key && *api_key;
      if (!ok) {  // name the variable, never a value
        fprintf(stderr, "ctune-tool-server: api_key_env: environment variable %s is %s\n", v,
                api_key ? "empty" : "unset");
        return 2;
      }
    }
    if (!ok) {
      fprintf(stderr, "ctune-tool-server: bad argument %s=%s\n", argv[i], v);
      return usage(stderr);
    }
  }
  fprintf(stderr, "ctune-tool-server: listening on 127.0.0.1 (mode %s%s)\n", mode, api_key ? ", API key required" : "");
  return ct_httpd_serve("ctune-tool-server", port, serve, NULL);
}
