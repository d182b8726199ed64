// ctune-env-server: an example environment server for GRPO's multi-turn episodes
// (env_url), speaking ctune's environment protocol:
//   POST /reset {"episode", "row"} → {"observation"}
//   POST /step  {"episode", "action"} → {"observation", "reward", "done"}
// Its game, "guess the number": the number is the row's "target" (1 to 100). The first
// observation asks for a guess; each action's last number is the guess, answered "Higher."
// or "Lower." (reward 0), or "Correct!" (reward 1, done); an action without a number is
// asked again. It listens on 127.0.0.1 only.
//
//   ctune-env-server [port=0] [mode=ok] [delay_ms=1000] [api_key_env=NAME]
//
// Prints the port on stdout (port=0 picks a free one), then serves each request on its own
// thread until SIGTERM or SIGINT, logging each request on stderr (never a key). With
// api_key_env, requests without "Authorization: Bearer KEY" get HTTP 401. Other modes
// misbehave on purpose, for tests of the client:
//   slow     waits delay_ms before answering each step (requests still run concurrently)
//   500      answers HTTP 500 to every step (resets are served)
//   badjson  answers a step with a body that is not JSON
//   nodone   answers a step without "done"
//   reset500 answers HTTP 500 to every reset
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "httpd.h"

// What the game says (ctune-demo-data guess-env writes the same lines in its demonstrations).
#define FIRST "Guess my number from 1 to 100."
#define HIGHER "Higher."
#define LOWER "Lower."
#define CORRECT "Correct!"
#define AGAIN "Answer with a number."

static const char *MODES[] = {"ok", "slow", "500", "badjson", "nodone", "reset500"};
static const char *mode = "ok";
static long delay_ms = 1000;
static const char *api_key;  // NULL: no key needed

// The episodes: id → target (0: none). A fixed table, oldest entries overwritten.
#define EPISODES 65536
static struct {
  char id[96];
  int target;
} episodes[EPISODES];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static unsigned slot_of(const char *id) {
  unsigned h = 2166136261u;
  for (const char *p = id; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
  return h % EPISODES;
}

static void remember(const char *id, int target) {
  pthread_mutex_lock(&mu);
  unsigned k = slot_of(id);
  snprintf(episodes[k].id, sizeof episodes[k].id, "%s", id);
  episodes[k].target = target;
  pthread_mutex_unlock(&mu);
}

static int recall(const char *id) {
  pthread_mutex_lock(&mu);
  unsigned k = slot_of(id);
  int t = !strcmp(episodes[k].id, id) ? episodes[k].target : 0;
  pthread_mutex_unlock(&mu);
  return t;
}

// The last whole number in s, or -1.
static long last_number(const char *s) {
  long v = -1;
  for (const char *p = s; *p; p++)
    if (*p >= '0' && *p <= '9' && (p == s || p[-1] < '0' || p[-1] > '9')) v = strtol(p, NULL, 10);
  return v;
}

static json_t *reset(const json_t *req, char *err, size_t cap) {
  const char *id = json_string_value(json_object_get(req, "episode"));
  const json_t *t = json_object_get(json_object_get(req, "row"), "target");
  if (!id || !json_is_integer(t) || json_integer_value(t) < 1 || json_integer_value(t) > 100) {
    snprintf(err, cap, "expected {\"episode\": string, \"row\": {\"target\": 1 to 100}}");
    return NULL;
  }
  remember(id, (int)json_integer_value(t));
  return json_pack("{s:s}", "observation", FIRST);
}

static json_t *step(const json_t *req, char *err, size_t cap) {
  const char *id = json_string_value(json_object_get(req, "episode"));
  const char *action = json_string_value(json_object_get(req, "action"));
  int target = id ? recall(id) : 0;
  if (!action || !target) {
    snprintf(err, cap, "expected {\"episode\": a reset episode's id, \"action\": string}");
    return NULL;
  }
  long g = last_number(action);
  if (g < 0) return json_pack("{s:s, s:f, s:b}", "observation", AGAIN, "reward", 0.0, "done", 0);
  if (g == target) return json_pack("{s:s, s:f, s:b}", "observation", CORRECT, "reward", 1.0, "done", 1);
  if (!strcmp(mode, "nodone")) return json_pack("{s:s}", "observation", g < target ? HIGHER : LOWER);
  return json_pack("{s:s, s:f, s:b}", "observation", g < target ? HIGHER : LOWER, "reward", 0.0, "done", 0);
}

static void serve(void *ctx, int fd, const ct_httpd_request *r) {
  (void)ctx;
  bool ok = ct_httpd_authorized(r->head, api_key);
  bool is_reset = !strncmp(r->line, "POST /reset ", 12), is_step = !strncmp(r->line, "POST /step ", 11);
  fprintf(stderr, "ctune-env-server: %s (%zu bytes), mode %s%s\n", r->line, r->len, mode,
          ok ? "" : ": no valid API key, 401");
  if (ok && is_step && !strcmp(mode, "slow")) ct_httpd_sleep_ms(delay_ms);
  if (!ok) {
    ct_httpd_respond(fd, 401, "text/plain", "missing or wrong API key (send Authorization: Bearer KEY)\n");
  } else if (!is_reset && !is_step) {
    ct_httpd_respond(fd, 404, "text/plain", "POST /reset or /step\n");
  } else if ((is_step && !strcmp(mode, "500")) || (is_reset && !strcmp(mode, "reset500"))) {
    ct_httpd_respond(fd, 500, "text/plain", "internal error\n");
  } else if (is_step && !strcmp(mode, "badjson")) {
    ct_httpd_respond(fd, 200, "application/json", "this is not json {\n");
  } else {
    char err[256] = "";
    json_t *req = json_loadb(r->body, r->len, 0, NULL);
    json_t *reply = req ? (is_reset ? reset : step)(req, err, sizeof err - 1) : NULL;
    char *text = reply ? json_dumps(reply, JSON_COMPACT) : NULL;
    if (text) ct_httpd_respond(fd, 200, "application/json", text);
    else ct_httpd_respond(fd, 400, "text/plain", req ? strcat(err, "\n") : "request is not JSON\n");
    free(text);
    json_decref(reply);
    json_decref(req);
  }
}

static int usage(FILE *f) {
  fputs("usage: ctune-env-server [port=0] [mode=ok|slow|500|badjson|nodone|reset500] [delay_ms=1000] "
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
        fprintf(stderr, "ctune-env-server: api_key_env: environment variable %s is %s\n", v,
                api_key ? "empty" : "unset");
        return 2;
      }
    }
    if (!ok) {
      fprintf(stderr, "ctune-env-server: bad argument %s=%s\n", argv[i], v);
      return usage(stderr);
    }
  }
  fprintf(stderr, "ctune-env-server: listening on 127.0.0.1 (mode %s%s)\n", mode, api_key ? ", API key required" : "");
  return ct_httpd_serve("ctune-env-server", port, serve, NULL);
}
