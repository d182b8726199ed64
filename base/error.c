// error: the per-thread last-error message behind ct_set_error / ct_last_error. It only
// records; printing and exiting belong to the mains.
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char err_msg[1024];

int ct_set_error(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err_msg, sizeof err_msg, fmt, ap);
  va_end(ap);
  return code;
}

int ct_wrap_error(int code, const char *fmt, ...) {
  char prev[sizeof err_msg];
  memcpy(prev, err_msg, sizeof prev);
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(err_msg, sizeof err_msg, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof err_msg && prev[0]) {
    // a message too long for the buffer is cut short, on purpose
    int m = snprintf(err_msg + n, sizeof err_msg - (size_t)n, ": %s", prev);
    if (m < 0) err_msg[n] = 0;
  }
  return code;
}

const char *ct_last_error(void) { return err_msg; }
