// httpd: the small HTTP/1.1 server under ctune's example servers (ctune-reward-server,
// ctune-tool-server): loopback only, one request per connection, a thread per connection
// (a slow request holds up no other), a receive timeout for clients that send nothing,
// and a constant-time bearer-key check.
#pragma once
#include <stdbool.h>
#include <stddef.h>

// A request: its header block (request line first, NUL-terminated) and body.
typedef struct {
  char head[8192];
  char line[200];  // the request line
  char *body;      // NUL-terminated, len bytes
  size_t len;
} ct_httpd_request;

// Serves one request on fd: called on the connection's own thread, which closes fd after.
// A request that is not HTTP (a TLS handshake to this plain-HTTP server) never reaches it:
// it gets 400 at once.
typedef void (*ct_httpd_handler)(void *ctx, int fd, const ct_httpd_request *r);

// Listens on 127.0.0.1:port (0: a free one), prints the port on stdout, and serves until
// SIGTERM or SIGINT (exit 0). `name` starts its lines on stderr. Returns only on a failure
// to listen (1).
int ct_httpd_serve(const char *name, long port, ct_httpd_handler handle, void *ctx);

void ct_httpd_respond(int fd, int status, const char *type, const char *body);
// The value of header `name` (lower case with its colon: "authorization:"), or NULL.
const char *ct_httpd_header(const char *head, const char *name);
// The value of header `name` on one line into out (at most cap − 1 bytes; "none" if absent).
void ct_httpd_header_line(const char *head, const char *name, char *out, size_t cap);
// Whether the request carries "Authorization: Bearer KEY" with this key (key NULL: always).
bool ct_httpd_authorized(const char *head, const char *key);
// Sleeps ms milliseconds (a slow server, on purpose).
void ct_httpd_sleep_ms(long ms);
