// ctune-reward-server: a small example reward server for GRPO's remote reward, speaking
// OpenRLHF's protocol: POST {"query": [...], "prompts": [...], "labels": [...]} →
// {"rewards": [...]}. A reward is 1.0 when the query (prompt + completion) ends with its
// label, ignoring surrounding whitespace and a final "<|im_end|>" or "<|endoftext|>";
// otherwise (or with a null label) 0.0. It listens on 127.0.0.1 only.
//
//   ctune-reward-server [port=0] [mode=ok] [delay_ms=1000] [api_key_env=NAME]
//
// Prints the port on stdout (port=0 picks a free one), then serves one request per
// connection until SIGTERM or SIGINT, logging each request on stderr (never a key).
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
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "config.h"

#define MAX_REQUEST (64 << 20)  // bytes

static const char *MODES[] = {"ok",     "slow",   "500",  "400",       "badjson", "close", "count",
                              "string", "nested", "null", "nonfinite", "nan",     "inf",   "echo"};
static const char *mode = "ok";
static long delay_ms = 1000;
static const char *api_key;  // NULL: no key needed

// In modes nonfinite, nan and inf, a string reward that becomes the bare 1e400, NaN or
// -Infinity in the reply (jansson writes none of them).
#define NONFINITE_MARK "ctune-nonfinite"

static void on_signal(int sig) {
  (void)sig;
  _exit(0);
}

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

static void send_all(int fd, const char *s, size_t n) {
  while (n) {
    ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
    if (k <= 0) return;  // the client went away; nothing to do
    s += k, n -= (size_t)k;
  }
}

static void respond(int fd, int status, const char *type, const char *body) {
  const char *reason = status == 200 ? "OK" : status == 400 ? "Bad Request"
                       : status == 401 ? "Unauthorized"
                       : status == 405 ? "Method Not Allowed"
                       : status == 500 ? "Internal Server Error" : "Error";
  char head[300];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 %d %s\r\n%sContent-Type: %s\r\nContent-Length: %zu\r\n"
                   "Connection: close\r\n\r\n", status, reason,
                   status == 401 ? "WWW-Authenticate: Bearer\r\n" : "", type, strlen(body));
  send_all(fd, head, (size_t)n);
  send_all(fd, body, strlen(body));
}

// The value of header `name` (e.g. "content-length:") in the header block, or NULL.
static const char *header(const char *head, const char *name) {
  for (const char *line = strstr(head, "\r\n"); line; line = strstr(line + 2, "\r\n"))
    if (!strncasecmp(line + 2, name, strlen(name))) {
      const char *v = line + 2 + strlen(name);
      while (*v == ' ' || *v == '\t') v++;
      return v;
    }
  return NULL;
}

// Reads one request; returns its body (NUL-terminated, *len bytes) or NULL, with its
// header block (request line first, up to head_cap - 1 bytes) in head. *not_http is set
// when the first byte cannot start an HTTP request (e.g. a TLS handshake).
static char *read_request(int fd, size_t *len, char *head, size_t head_cap, bool *not_http) {
  size_t cap = 65536, n = 0;
  char *buf = malloc(cap + 1), *end = NULL;
  long want = -1;
  if (buf) buf[0] = 0;
  while (buf) {
    if (!end && (end = strstr(buf, "\r\n\r\n"))) {
      *end = 0;  // the header block is now a string of its own
      const char *cl = header(buf, "content-length:");
      want = cl ? strtol(cl, NULL, 10) : 0;
      if (want < 0 || want > MAX_REQUEST) break;
      snprintf(head, head_cap, "%s", buf);
      const char *ex = header(buf, "expect:");
      if (ex && !strncasecmp(ex, "100-continue", 12))
        send_all(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25);
      end += 4;
    }
    if (end && (long)(n - (size_t)(end - buf)) >= want) {
      *len = (size_t)want;
      memmove(buf, end, *len);
      buf[*len] = 0;
      return buf;
    }
    if (n == cap) {
      if (cap > MAX_REQUEST) break;
      size_t off = end ? (size_t)(end - buf) : 0;
      char *p = realloc(buf, 2 * cap + 1);
      if (!p) break;
      buf = p, cap *= 2;
      if (end) end = buf + off;
    }
    ssize_t k = recv(fd, buf + n, cap - n, 0);
    if (k <= 0) break;  // closed, error, or no data for the receive timeout
    if (!n && (buf[0] < 'A' || buf[0] > 'Z')) {  // methods are upper-case words
      *not_http = true;
      break;
    }
    n += (size_t)k;
    buf[n] = 0;
  }
  free(buf);
  return NULL;
}

// Whether the request in the header block may be served: no key is needed, or it
// carries "Authorization: Bearer KEY" with the server's key (compared in constant time).
static bool authorized(const char *head) {
  if (!api_key) return true;
  const char *v = header(head, "authorization:");
  if (!v || strncasecmp(v, "Bearer ", 7)) return false;
  for (v += 7; *v == ' '; v++) {}
  size_t n = rtrim(v, strcspn(v, "\r\n")), k = strlen(api_key);
  unsigned char diff = n != k;
  for (size_t i = 0; i < k; i++) diff |= (unsigned char)(v[i < n ? i : 0] ^ api_key[i]);
  return !diff;
}

// The value of header `name` in the header block on one line (at most cap - 1 bytes).
static void header_line(const char *head, const char *name, char *out, size_t cap) {
  const char *v = header(head, name);
  snprintf(out, cap, "%.*s", v ? (int)strcspn(v, "\r\n") : 4, v ? v : "none");
}

static void serve(int fd) {
  char head[8192] = "", line[200], type[100];
  size_t len;
  bool not_http = false;
  char *body = read_request(fd, &len, head, sizeof head, &not_http);
  if (not_http) {
    fprintf(stderr, "ctune-reward-server: not an HTTP request (TLS to a plain-HTTP server?)\n");
    respond(fd, 400, "text/plain", "this server speaks plain HTTP\n");
  }
  if (!body) return;
  snprintf(line, sizeof line, "%.*s", (int)strcspn(head, "\r\n"), head);
  header_line(head, "content-type:", type, sizeof type);
  bool ok = authorized(head);
  fprintf(stderr, "ctune-reward-server: %s (%zu bytes, %s), mode %s%s\n", line, len, type, mode,
          ok ? "" : ": no valid API key, 401");
  if (ok && !strcmp(mode, "slow")) {
    struct timespec ts = {delay_ms / 1000, (delay_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  if (!ok) {
    respond(fd, 401, "text/plain", "missing or wrong API key (send Authorization: Bearer KEY)\n");
  } else if (strncmp(line, "POST ", 5)) {
    respond(fd, 405, "text/plain", "POST a JSON body: {\"query\": [...], \"labels\": [...]}\n");
  } else if (!strcmp(mode, "close")) {
    // no reply at all: the caller closes the connection
  } else if (!strcmp(mode, "500")) {
    respond(fd, 500, "text/plain", "internal error (mode 500)\n");
  } else if (!strcmp(mode, "400")) {
    respond(fd, 400, "text/plain", "bad request (mode 400)\n");
  } else if (!strcmp(mode, "badjson")) {
    respond(fd, 200, "application/json", "this is not json {\n");
  } else if (!strcmp(mode, "echo")) {
    char auth[1024], msg[1100];
    header_line(head, "authorization:", auth, sizeof auth);
    snprintf(msg, sizeof msg, "bad request; you sent Authorization: %s\n", auth);
    respond(fd, 400, "text/plain", msg);
  } else {
    char err[256] = "";
    char *reply = rewards_json(body, len, err, sizeof err - 1);  // room for "\n"
    if (reply) respond(fd, 200, "application/json", reply);
    else respond(fd, 400, "text/plain", strcat(err, "\n"));
    free(reply);
  }
  free(body);
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

  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);

  int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);  // loopback only, never 0.0.0.0
  socklen_t alen = sizeof addr;
  if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
      bind(s, (struct sockaddr *)&addr, sizeof addr) || listen(s, 64) ||
      getsockname(s, (struct sockaddr *)&addr, &alen)) {
    fprintf(stderr, "ctune-reward-server: cannot listen on 127.0.0.1:%ld: %s\n", port,
            strerror(errno));
    return 1;
  }
  printf("%d\n", ntohs(addr.sin_port));
  fflush(stdout);
  fprintf(stderr, "ctune-reward-server: listening on http://127.0.0.1:%d/ (mode %s%s)\n",
          ntohs(addr.sin_port), mode, api_key ? ", API key required" : "");

  for (;;) {
    int c = accept(s, NULL, NULL);
    if (c < 0) continue;  // EINTR, or a connection reset before it was accepted
    // a client that connects and sends nothing must not block the server forever
    struct timeval tv = {10, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    serve(c);
    close(c);
  }
}
