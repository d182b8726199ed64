// pyregex: Python-style regexes over PCRE2 (8-bit code units, UTF mode, Unicode
// properties for \d \s \w, invalid UTF-8 in texts tolerated).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "pyregex.h"

#include <pcre2.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

struct ct_pyregex {
  pcre2_code *code;
  pcre2_match_data *md;  // room for every group of code
};

// Python's \Z (the end of the text only) is PCRE2's \z (PCRE2's \Z also matches before a
// final newline): rewritten outside character classes, escapes kept as pairs. Same length.
static void python_escapes(const char *p, char *out) {
  bool in_class = false;
  for (size_t i = 0; p[i]; i++) {
    out[i] = p[i];
    if (p[i] == '\\' && p[i + 1]) {
      out[i + 1] = p[i + 1] == 'Z' && !in_class ? 'z' : p[i + 1];
      i++;
    } else if (!in_class && p[i] == '[') {
      in_class = true;
      if (p[i + 1] == '^') out[i + 1] = p[i + 1], i++;
      if (p[i + 1] == ']') out[i + 1] = p[i + 1], i++;  // (a ']' first is a member)
    } else if (in_class && p[i] == ']') {
      in_class = false;
    }
  }
  out[strlen(p)] = 0;
}

int ct_pyregex_compile(ct_pyregex **out, const char *pattern) {
  *out = NULL;
  int err;
  PCRE2_SIZE at;
  char *pcre = malloc(strlen(pattern) + 1);
  if (!pcre) return ct_set_error(CT_ENOMEM, "out of memory");
  python_escapes(pattern, pcre);
  pcre2_code *code = pcre2_compile((PCRE2_SPTR)pcre, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, NULL);
  free(pcre);
  if (!code) {
    PCRE2_UCHAR why[256];
    if (pcre2_get_error_message(err, why, sizeof why) < 0) why[0] = 0;
    size_t ch = 0;  // the offset in characters, as Python's "at position N"
    for (size_t i = 0; i < at && pattern[i]; i++) ch += ((unsigned char)pattern[i] & 0xC0) != 0x80;
    return ct_set_error(CT_ECONFIG, "cannot compile \"%s\": %s at character %zu", pattern, (char *)why, ch);
  }
  ct_pyregex *re = calloc(1, sizeof *re);
  pcre2_match_data *md = re ? pcre2_match_data_create_from_pattern(code, NULL) : NULL;
  if (!md) {
    pcre2_code_free(code);
    free(re);
    return ct_set_error(CT_ENOMEM, "out of memory");
  }
  re->code = code;
  re->md = md;
  *out = re;
  return 0;
}

void ct_pyregex_free(ct_pyregex *re) {
  if (!re) return;
  pcre2_match_data_free(re->md);
  pcre2_code_free(re->code);
  free(re);
}

int ct_pyregex_group_named(const ct_pyregex *re, const char *name) {
  int g = pcre2_substring_number_from_name(re->code, (PCRE2_SPTR)name);
  return g > 0 ? g : -1;
}

int ct_pyregex_groups(const ct_pyregex *re) {
  uint32_t n = 0;
  pcre2_pattern_info(re->code, PCRE2_INFO_CAPTURECOUNT, &n);
  return (int)n;
}

static int gave_up(int rc) {
  PCRE2_UCHAR why[256];
  if (pcre2_get_error_message(rc, why, sizeof why) < 0) why[0] = 0;
  return ct_set_error(CT_EINVAL, "regex match failed: %s", (char *)why);
}

int ct_pyregex_search(ct_pyregex *re, const char *s, size_t n) {
  int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, 0, 0, re->md, NULL);
  return rc >= 0 ? 1 : rc == PCRE2_ERROR_NOMATCH ? 0 : gave_up(rc);
}

int ct_pyregex_last(ct_pyregex *re, const char *s, size_t n, int group, size_t *from, size_t *len) {
  PCRE2_SIZE off = 0;
  uint32_t opts = 0;
  int found = 0;
  for (;;) {
    int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, off, opts, re->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH && opts) {
      // no non-empty match where the last (empty) one was: go on one character later
      do off++;
      while (off < n && ((unsigned char)s[off] & 0xC0) == 0x80);
      opts = 0;
      if (off > n) break;
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return gave_up(rc);
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(re->md);
    if (ov[2 * group] != PCRE2_UNSET) {
      *from = ov[2 * group];
      *len = ov[2 * group + 1] - ov[2 * group];
    } else {
      *from = ov[1];
      *len = 0;
    }
    found = 1;
    off = ov[1];
    // after an empty match, the next one must not be empty at the same place (as Python)
    opts = ov[0] == ov[1] ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
    if (opts && off >= n) break;
  }
  return found;
}
