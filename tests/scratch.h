// scratch: a test binary's one scratch directory: made with mkdtemp before the tests run,
// the files they write into it, removed with all it holds at the end (kept, and named,
// when CT_TEST_KEEP is set).
#pragma once
#include <stdio.h>
#include <stdlib.h>

#include "error.h"
#include "fs.h"

static char scratch_dir[256];

// scratch_dir from tmpl ("/tmp/name-XXXXXX"); 0, or 1 with the reason printed.
static inline int scratch_make(const char *tmpl) {
  snprintf(scratch_dir, sizeof scratch_dir, "%s", tmpl);
  if (!mkdtemp(scratch_dir)) {
    perror("mkdtemp");
    return 1;
  }
  return 0;
}

// Removes scratch_dir and everything under it; 0, or 1 with the reason printed.
static inline int scratch_remove(void) {
  if (getenv("CT_TEST_KEEP")) {
    fprintf(stderr, "kept %s\n", scratch_dir);
    return 0;
  }
  if (ct_remove_tree(scratch_dir)) {
    fprintf(stderr, "could not remove %s: %s\n", scratch_dir, ct_last_error());
    return 1;
  }
  return 0;
}

// scratch_dir/name, in one of eight buffers used in turn (a call may combine a few paths).
static inline const char *scratch_path(const char *name) {
  static char buf[8][512];
  static int k;
  char *p = buf[k++ & 7];
  snprintf(p, sizeof buf[0], "%s/%s", scratch_dir, name);
  return p;
}

// Writes text to scratch_dir/name (parent directories must exist); returns its path.
static inline const char *write_file(const char *name, const char *text) {
  const char *path = scratch_path(name);
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
  return path;
}
