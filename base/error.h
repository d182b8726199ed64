// error: the library's one way of reporting failure.
// Library functions return 0 on success and a negative CT_E* code on failure, after
// recording a one-line message with ct_set_error(); mains print ct_last_error().
#pragma once

enum {
  CT_OK = 0,
  CT_EIO = -1,      // a file could not be opened, read or written
  CT_EFORMAT = -2,  // a file or row is malformed
  CT_ECONFIG = -3,  // a configuration key is unknown, mistyped or out of range
  CT_ENOMEM = -4,   // an allocation failed
  CT_EINVAL = -5,   // an argument or combination of settings is invalid
  CT_EMPI = -6,     // an MPI call failed
};

// Records a printf-style message for this thread and returns `code`, so that a
// failing function can `return ct_set_error(CT_EIO, "...")`.
int ct_set_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// The message recorded by the last failing call on this thread ("" if none).
const char *ct_last_error(void);

// Prefixes the current message with more context: "ctx: previous message".
int ct_wrap_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
