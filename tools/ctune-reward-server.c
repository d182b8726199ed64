// ctune-reward-server: a small example reward server for GRPO's remote reward, speaking
// OpenRLHF's protocol: POST {"query": [...], "prompts": [...], "labels": [...]} →
// {"rewards": [...]}. A reward is 1.0 when the query (prompt + completion) ends with its
// label, ignoring surrounding whitespace and a final "<|im_end|>" or "<|endoftext|>";
// otherwise (or with a null label) 0.0. It listens on 127.0.0.1 only.
//
//   ctune-reward-server [port=0] [mode=ok] [delay_ms=1000]
//
// Prints the port on stdout (port=0 picks a free one), then serves one request per
// connection until SIGTERM or SIGINT, logging each request on stderr. The other modes
// misbehave on purpose, for tests of the client:
//   slow     waits delay_ms before answering
//   500      answers HTTP 500
//   400      answers HTTP 400
//   badjson  answers 200 with a body that is not JSON
//   close    closes the connection without answering
//   count    answers one reward too few
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

#define MAX_REQUEST (64 << 20)  // bytes

static const char *MODES[] = {"ok", "slow", "500", "400", "badjson", "close", "count"};
static const char *mode = "ok";
static long delay_ms = 1000;

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
    json_t *reply = json_pack("{s:o}", "rewards", rewards);
    out = json_dumps(reply, JSON_COMPACT);
    json_decref(reply);
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
                       : status == 405 ? "Method Not Allowed"
                       : status == 500 ? "Internal Server Error" : "Error";
  char head[256];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                   "Connection: close\r\n\r\n", status, reason, type, strlen(body));
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

// Reads one request; returns its body (NUL-terminated, *len bytes) or NULL.
static char *read_request(int fd, size_t *len, char *line, size_t line_cap, char *type,
                          size_t type_cap) {
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
      snprintf(line, line_cap, "%.*s", (int)strcspn(buf, "\r\n"), buf);
      const char *ct = header(buf, "content-type:");
      if (!ct) ct = "no type";
      snprintf(type, type_cap, "%.*s", (int)strcspn(ct, "\r\n"), ct);
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
    n += (size_t)k;
    buf[n] = 0;
  }
  free(buf);
  return NULL;
}

static void serve(int fd) {
  char line[200] = "", type[100] = "";
  size_t len;
  char *body = read_request(fd, &len, line, sizeof line, type, sizeof type);
  if (!body) return;
  fprintf(stderr, "ctune-reward-server: %s (%zu bytes, %s), mode %s\n", line, len, type, mode);
  if (!strcmp(mode, "slow")) {
    struct timespec ts = {delay_ms / 1000, (delay_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  if (strncmp(line, "POST ", 5)) {
    respond(fd, 405, "text/plain", "POST a JSON body: {\"query\": [...], \"labels\": [...]}\n");
  } else if (!strcmp(mode, "close")) {
    // no reply at all: the caller closes the connection
  } else if (!strcmp(mode, "500")) {
    respond(fd, 500, "text/plain", "internal error (mode 500)\n");
  } else if (!strcmp(mode, "400")) {
    respond(fd, 400, "text/plain", "bad request (mode 400)\n");
  } else if (!strcmp(mode, "badjson")) {
    respond(fd, 200, "application/json", "this is not json {\n");
  } else {
    char err[256] = "";
    char *reply = rewards_json(body, len, err, sizeof err - 1);  // room for "\n"
    if (reply) respond(fd, 200, "application/json", reply);
    else respond(fd, 400, "text/plain", strcat(err, "\n"));
    free(reply);
  }
  free(body);
}

static int usage(void) {
  fputs("usage: ctune-reward-server [port=0] [mode=ok|slow|500|400|badjson|close|count] "
        "[delay_ms=1000]\n", stderr);
  return 2;
}

// v as an integer in [lo, hi] into *x; false if it is not one.
static bool parse_long(const char *v, long lo, long hi, long *x) {
  char *end;
  errno = 0;
  *x = strtol(v, &end, 10);
  return *v && !*end && !errno && *x >= lo && *x <= hi;
}

int main(int argc, char **argv) {
  long port = 0;
  for (int i = 1; i < argc; i++) {
    char *v = strchr(argv[i], '=');
    if (!v) return usage();
    *v++ = 0;
    bool ok = false;
    if (!strcmp(argv[i], "port")) ok = parse_long(v, 0, 65535, &port);
    else if (!strcmp(argv[i], "delay_ms")) ok = parse_long(v, 0, 3600000, &delay_ms);
    else if (!strcmp(argv[i], "mode"))
      for (size_t m = 0; m < sizeof MODES / sizeof *MODES; m++)
        if (!strcmp(v, MODES[m])) ok = true, mode = MODES[m];
    if (!ok) {
      fprintf(stderr, "ctune-reward-server: bad argument %s=%s\n", argv[i], v);
      return usage();
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
  fprintf(stderr, "ctune-reward-server: listening on http://127.0.0.1:%d/ (mode %s)\n",
          ntohs(addr.sin_port), mode);

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
