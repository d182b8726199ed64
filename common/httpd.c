// httpd: a loopback HTTP/1.1 server, a detached thread per connection.
#include "httpd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MAX_REQUEST (64 << 20)  // bytes

static void send_all(int fd, const char *s, size_t n) {
  while (n) {
    ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
    if (k <= 0) return;  // the client went away; nothing to do
    s += k, n -= (size_t)k;
  }
}

void ct_httpd_respond(int fd, int status, const char *type, const char *body) {
  const char *reason = status == 200 ? "OK" : status == 400 ? "Bad Request"
                       : status == 401 ? "Unauthorized"
                       : status == 404 ? "Not Found"
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

const char *ct_httpd_header(const char *head, const char *name) {
  for (const char *line = strstr(head, "\r\n"); line; line = strstr(line + 2, "\r\n"))
    if (!strncasecmp(line + 2, name, strlen(name))) {
      const char *v = line + 2 + strlen(name);
      while (*v == ' ' || *v == '\t') v++;
      return v;
    }
  return NULL;
}

void ct_httpd_header_line(const char *head, const char *name, char *out, size_t cap) {
  const char *v = ct_httpd_header(head, name);
  snprintf(out, cap, "%.*s", v ? (int)strcspn(v, "\r\n") : 4, v ? v : "none");
}

static size_t rtrim(const char *s, size_t n) {
  while (n && (s[n - 1] == ' ' || (s[n - 1] >= '\t' && s[n - 1] <= '\r'))) n--;
  return n;
}

bool ct_httpd_authorized(const char *head, const char *key) {
  if (!key) return true;
  const char *v = ct_httpd_header(head, "authorization:");
  if (!v || strncasecmp(v, "Bearer ", 7)) return false;
  for (v += 7; *v == ' '; v++) {}
  size_t n = rtrim(v, strcspn(v, "\r\n")), k = strlen(key);
  unsigned char diff = n != k;
  for (size_t i = 0; i < k; i++) diff |= (unsigned char)(v[i < n ? i : 0] ^ key[i]);
  return !diff;
}

void ct_httpd_sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) && errno == EINTR) {}
}

// Reads one request into r (body malloc'd); false when there is none. *not_http is set
// when the first byte cannot start an HTTP request (e.g. a TLS handshake).
static bool read_request(int fd, ct_httpd_request *r, bool *not_http) {
  size_t cap = 65536, n = 0;
  char *buf = malloc(cap + 1), *end = NULL;
  long want = -1;
  if (buf) buf[0] = 0;
  while (buf) {
    if (!end && (end = strstr(buf, "\r\n\r\n"))) {
      *end = 0;  // the header block is now a string of its own
      const char *cl = ct_httpd_header(buf, "content-length:");
      want = cl ? strtol(cl, NULL, 10) : 0;
      if (want < 0 || want > MAX_REQUEST) break;
      snprintf(r->head, sizeof r->head, "%s", buf);
      const char *ex = ct_httpd_header(buf, "expect:");
      if (ex && !strncasecmp(ex, "100-continue", 12)) send_all(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25);
      end += 4;
    }
    if (end && (long)(n - (size_t)(end - buf)) >= want) {
      r->len = (size_t)want;
      memmove(buf, end, r->len);
      buf[r->len] = 0;
      r->body = buf;
      snprintf(r->line, sizeof r->line, "%.*s", (int)strcspn(r->head, "\r\n"), r->head);
      return true;
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
  return false;
}

typedef struct {
  int fd;
  const char *name;
  ct_httpd_handler handle;
  void *ctx;
} conn;

static void *serve_conn(void *p) {
  conn *c = p;
  ct_httpd_request *r = calloc(1, sizeof *r);
  bool not_http = false;
  if (r && read_request(c->fd, r, &not_http)) {
    c->handle(c->ctx, c->fd, r);
    free(r->body);
  } else if (not_http) {
    fprintf(stderr, "%s: not an HTTP request (TLS to a plain-HTTP server?)\n", c->name);
    ct_httpd_respond(c->fd, 400, "text/plain", "this server speaks plain HTTP\n");
  }
  free(r);
  close(c->fd);
  free(c);
  return NULL;
}

static void on_signal(int sig) {
  (void)sig;
  _exit(0);
}

int ct_httpd_serve(const char *name, long port, ct_httpd_handler handle, void *ctx) {
  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);  // loopback only, never 0.0.0.0
  socklen_t alen = sizeof addr;
  if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
      bind(s, (struct sockaddr *)&addr, sizeof addr) || listen(s, 256) ||
      getsockname(s, (struct sockaddr *)&addr, &alen)) {
    fprintf(stderr, "%s: cannot listen on 127.0.0.1:%ld: %s\n", name, port, strerror(errno));
    return 1;
  }
  printf("%d\n", ntohs(addr.sin_port));
  fflush(stdout);
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  for (;;) {
    int fd = accept(s, NULL, NULL);
    if (fd < 0) continue;  // EINTR, or a connection reset before it was accepted
    // a client that connects and sends nothing must not hold a thread forever
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    conn *c = malloc(sizeof *c);
    pthread_t t;
    if (c) *c = (conn){fd, name, handle, ctx};
    if (!c || pthread_create(&t, &at, serve_conn, c)) {
      free(c);
      close(fd);
    }
  }
}
