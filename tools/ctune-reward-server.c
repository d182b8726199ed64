// ctune-reward-server: a small example reward server for GRPO's remote reward, speaking
// OpenRLHF's protocol: POST {"query": [...], "prompts": [...], "labels": [...]} →
// {"rewards": [...]}. A reward is 1.0 when the query (prompt + completion) ends with its
// label, ignoring surrounding whitespace and a final "<|im_end|>" or "<|endoftext|>";
// otherwise (or with a null label) 0.0. It listens on 127.0.0.1 only.
//
//   ctune-reward-server [port=0] [mode=ok] [delay_ms=1000] [api_key_env=NAME]
//
// Prints the port on stdout (port=0 picks a free one), then serves one request per
// connection (each on its own thread, common/httpd.h) until SIGTERM or SIGINT, logging
// each request on stderr (never a key).
// With api_key_env, the environment variable NAME holds an API key, and any request
// without "Authorization: Bearer KEY" gets HTTP 401. The other modes misbehave on
// purpose, for tests of the client:
//   slow       waits delay_ms before answering
//   500        answers HTTP 500
//   400        answers HTTP 400
//   badjson    answers 200 with a body that is not JSON
//   close      closes the connection without answering
//   count      answers one reward too few
//   string     the second reward is the string "NaN"
//   nested     the second reward is a list, [1.0]
//   null       the second reward is null (a reward the server could not compute)
//   nonfinite  the second reward is 1e400, beyond any double
//   nan        the second reward is NaN, bare, as Python's json.dumps writes float('nan')
//              (not JSON)
//   inf        the second reward is -Infinity, bare, as json.dumps writes float('-inf')
//   echo       answers HTTP 400 quoting the request's Authorization header, as a careless
//              server might (a client must keep the key out of its messages)
// (with one query, "the second reward" is the first.) A request that is not HTTP (a TLS
// handshake sent to this plain-HTTP server) gets HTTP 400 at once.
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "httpd.h"


static const char *MODES[] = {"ok",     "slow",   "500",  "400",       "badjson", "close", "count",
                              "string", "nested", "null", "nonfinite", "nan",     "inf",   "echo"};
static const char *mode = "ok";
static long delay_ms = 1000;
static const char *api_key;  // NULL: no key needed

// In modes nonfinite, nan and inf, a string reward that becomes the bare 1e400, NaN or
// -Infinity in the reply (jansson writes none of them).
#define NONFINITE_MARK "ctune-nonfinite"


// ---------------------------------------------------------------------------------------
// scoring

static bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// Shortens n until [s, s + n) has no trailing whitespace.
static size_t rtrim(const char *s, size_t n) {
  while (n && is_space(s[n - 1])) n--;
  return n;
}

static bool ends_with(const char *s, size_t n, const char *tail) {
  size_t k = strlen(tail);
  return n >= k && !memcmp(s + n - k, tail, k);
}

static double score(const char *query, const char *label) {
  size_t n = rtrim(query, strlen(query));
  const char *stops[] = {"<|im_end|>", "<|endoftext|>"};
  for (int i = 0; i < 2; i++)
    if (ends_with(query, n, stops[i])) {
      n = rtrim(query, n - strlen(stops[i]));
      break;
    }
  while (is_space(*label)) label++;
  size_t k = rtrim(label, strlen(label));
  return k > 0 && n >= k && !memcmp(query + n - k, label, k) ? 1.0 : 0.0;
}

// The reply body for a request body, or NULL with *status 400 and a message in err.
static char *rewards_json(const char *body, size_t len, char *err, size_t cap) {
  json_error_t je;
  json_t *req = json_loadb(body, len, 0, &je);
  json_t *query = json_object_get(req, "query"), *labels = json_object_get(req, "labels");
  char *out = NULL;
  if (!req) {
    snprintf(err, cap, "request is not JSON: %s", je.text);
  } else if (!json_is_array(query)) {
    snprintf(err, cap, "request has no \"query\" list");
  } else if (labels && !json_is_array(labels)) {
    snprintf(err, cap, "\"labels\" is not a list");
  } else {
    size_t n = json_array_size(query);
    if (!strcmp(mode, "count") && n > 0) n--;
    json_t *rewards = json_array();
    for (size_t i = 0; i < n; i++) {
      const char *q = json_string_value(json_array_get(query, i));
      const char *l = json_string_value(json_array_get(labels, i));  // NULL: none
      json_array_append_new(rewards, json_real(q && l ? score(q, l) : 0.0));
    }
    json_t *bad = !strcmp(mode, "string")      ? json_string("NaN")
                  : !strcmp(mode, "nested")    ? json_pack("[f]", 1.0)
                  : !strcmp(mode, "null")      ? json_null()
                  : !strcmp(mode, "nonfinite") || !strcmp(mode, "nan") || !strcmp(mode, "inf")
                      ? json_string(NONFINITE_MARK)
                      : NULL;
    if (bad && n) json_array_set(rewards, n > 1 ? 1 : 0, bad);
    json_decref(bad);
    json_t *reply = json_pack("{s:o}", "rewards", rewards);
    out = json_dumps(reply, JSON_COMPACT);
    json_decref(reply);
    const char *quoted = "\"" NONFINITE_MARK "\"";
    char *mark = out ? strstr(out, quoted) : NULL;
    if (mark) {  // each text is shorter than the quoted mark: rewrite in place
      const char *text = !strcmp(mode, "nan") ? "NaN" : !strcmp(mode, "inf") ? "-Infinity" : "1e400";
      const char *rest = mark + strlen(quoted);
      size_t k = strlen(text);
      memcpy(mark, text, k);
      memmove(mark + k, rest, strlen(rest) + 1);
    }
  }
  json_decref(req);
  return out;
}

// ---------------------------------------------------------------------------------------
// HTTP

static void serve(void *ctx, int fd, const ct_httpd_request *r) {
  (void)ctx;
  char type[100];
  ct_httpd_header_line(r->head, "content-type:", type, sizeof type);
  bool ok = ct_httpd_authorized(r->head, api_key);
  fprintf(stderr, "ctune-reward-server: %s (%zu bytes, %s), mode %s%s\n", r->line, r->len, type, mode,
          ok ? "" : ": no valid API key, 401");
  if (ok && !strcmp(mode, "slow")) ct_httpd_sleep_ms(delay_ms);
  if (!ok) {
    ct_httpd_respond(fd, 401, "text/plain", "missing or wrong API key (send Authorization: Bearer KEY)\n");
  } else if (strncmp(r->line, "POST ", 5)) {
    ct_httpd_respond(fd, 405, "text/plain", "POST a JSON body: {\"query\": [...], \"labels\": [...]}\n");
  } else if (!strcmp(mode, "close")) {
    // no reply at all: the connection closes
  } else if (!strcmp(mode, "500")) {
    ct_httpd_respond(fd, 500, "text/plain", "internal error (mode 500)\n");
  } else if (!strcmp(mode, "400")) {
    ct_httpd_respond(fd, 400, "text/plain", "bad request (mode 400)\n");
  } else if (!strcmp(mode, "badjson")) {
    ct_httpd_respond(fd, 200, "application/json", "this is not json {\n");
  } else if (!strcmp(mode, "echo")) {
    char auth[1024], msg[1100];
    ct_httpd_header_line(r->head, "authorization:", auth, sizeof auth);
    snprintf(msg, sizeof msg, "bad request; you sent Authorization: %s\n", auth);
    ct_httpd_respond(fd, 400, "text/plain", msg);
  } else {
    char err[256] = "";
    char *reply = rewards_json(r->body, r->len, err, sizeof err - 1);  // room for "\n"
    if (reply) ct_httpd_respond(fd, 200, "application/json", reply);
    else ct_httpd_respond(fd, 400, "text/plain", strcat(err, "\n"));
    free(reply);
  }
}

static int usage(FILE *f) {
  fputs("usage: ctune-reward-server [port=0] [mode=ok|slow|500|400|badjson|close|count|string|"
        "nested|null|nonfinite|nan|inf|echo] [delay_ms=1000] [api_key_env=NAME]\n", f);
  return f == stdout ? 0 : 2;  // --help: exit 0
}

// v as an integer in [lo, hi] into *x; false if it is not one.
static bool parse_long(const char *v, long lo, long hi, long *x) {
  char *end;
  errno = 0;
  *x = strtol(v, &end, 10);
  return *v && !*end && !errno && *x >= lo && *x <= hi;
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
        fprintf(stderr, "ctune-reward-server: api_key_env: environment variable %s is %s\n", v,
                api_key ? "empty" : "unset");
        return 2;
      }
    }
    if (!ok) {
      fprintf(stderr, "ctune-reward-server: bad argument %s=%s\n", argv[i], v);
      return usage(stderr);
    }
  }

  fprintf(stderr, "ctune-reward-server: listening on 127.0.0.1 (mode %s%s)\n", mode,
          api_key ? ", API key required" : "");
  return ct_httpd_serve("ctune-reward-server", port, serve, NULL);
}
