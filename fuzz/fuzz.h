// fuzz.h: what the libFuzzer targets in fuzz/ share. The parsers under test read files,
// so each target writes its input into a private directory (on /dev/shm when there is
// one), made on first use and removed at exit.
//
// A target aborts (and libFuzzer reports a crash) when a library call breaks its
// contract: a failure must leave a message in ct_last_error().
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fuzz_dir_path[128];

static inline void fuzz_dir_remove(void) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir_path);
  if (system(cmd) != 0) fprintf(stderr, "fuzz: cannot remove %s\n", fuzz_dir_path);
}

// The private directory, "/dev/shm/ct_fuzz_XXXXXX" (or under /tmp).
static inline const char *fuzz_dir(void) {
  if (fuzz_dir_path[0]) return fuzz_dir_path;
  const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/ct_fuzz_XXXXXX", base);
  if (!mkdtemp(fuzz_dir_path)) {
    perror("fuzz: mkdtemp");
    abort();
  }
  atexit(fuzz_dir_remove);
  return fuzz_dir_path;
}

// Writes data[0, n) to fuzz_dir()/name and returns that path (a static buffer that the
// next call overwrites).
static inline const char *fuzz_write(const char *name, const void *data, size_t n) {
  static char path[256];
  snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
    perror(path);
    abort();
  }
  return path;
}

// Clears the error message before a call whose failure must set one.
static inline void fuzz_clear_error(void) { ct_set_error(CT_OK, "%s", ""); }

// A failed call (rc != 0) left no message: a contract violation, reported as a crash.
// With CT_FUZZ_VERBOSE set, every failure's message is printed (to check seeds).
static inline void fuzz_check_error(int rc, const char *call) {
  if (rc != 0 && getenv("CT_FUZZ_VERBOSE")) fprintf(stderr, "fuzz: %s: %s\n", call, ct_last_error());
  if (rc != 0 && ct_last_error()[0] == 0) {
    fprintf(stderr, "fuzz: %s failed (%d) without a message\n", call, rc);
    abort();
  }
}
