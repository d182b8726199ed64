// mathans: extraction and equivalence of math answers (mathans.h).
#include "mathans.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { CAP = 512 };  // longer answers compare as texts cut here (both sides alike)

static bool starts(const char *s, size_t n, const char *p) {
  size_t k = strlen(p);
  return n >= k && !memcmp(s, p, k);
}

// The index of the '}' closing the '{' at s[i], or n.
static size_t closing(const char *s, size_t n, size_t i) {
  int depth = 0;
  for (; i < n; i++) {
    if (s[i] == '{') depth++;
    else if (s[i] == '}' && --depth == 0) return i;
  }
  return n;
}

// The content of the last \boxed{…} / \fbox{…} in [s, s + n).
static bool last_boxed(const char *s, size_t n, const char **o, size_t *on) {
  bool found = false;
  for (size_t i = 0; i < n; i++) {
    size_t k = starts(s + i, n - i, "\\boxed{") ? 7 : starts(s + i, n - i, "\\fbox{") ? 6 : 0;
    if (!k) continue;
    size_t end = closing(s, n, i + k - 1);
    if (end == n) break;
    *o = s + i + k, *on = end - (i + k), found = true;
    i = end;
  }
  return found;
}

// The last math span: $$…$$, $…$, \(…\), \[…\].
static bool last_math(const char *s, size_t n, const char **o, size_t *on) {
  bool found = false;
  for (size_t i = 0; i < n; i++) {
    const char *close = NULL;
    size_t k = 0;
    if (starts(s + i, n - i, "$$")) close = "$$", k = 2;
    else if (s[i] == '$') close = "$", k = 1;
    else if (starts(s + i, n - i, "\\(")) close = "\\)", k = 2;
    else if (starts(s + i, n - i, "\\[")) close = "\\]", k = 2;
    if (!close) continue;
    size_t j = i + k, kc = strlen(close);
    while (j + kc <= n && memcmp(s + j, close, kc)) j++;
    if (j + kc > n) break;
    *o = s + i + k, *on = j - (i + k), found = true;
    i = j + kc - 1;
  }
  return found;
}

bool ct_math_extract(const char *c, const char **s, size_t *n) {
  size_t len = strlen(c);
  return last_boxed(c, len, s, n) || last_math(c, len, s, n);
}

// ---------------------------------------------------------------------------
// normalization

// [s, s + n) without its own \boxed{…} or $…$ / \(…\) / \[…\] wrapper.
static void unwrap(const char **s, size_t *n) {
  for (bool again = true; again;) {
    again = false;
    while (*n && isspace((unsigned char)**s)) (*s)++, (*n)--;
    while (*n && isspace((unsigned char)(*s)[*n - 1])) (*n)--;
    const char *o;
    size_t on;
    if ((starts(*s, *n, "\\boxed{") || starts(*s, *n, "\\fbox{")) && (*s)[*n - 1] == '}' &&
        last_boxed(*s, *n, &o, &on) && o + on + 1 == *s + *n) {
      *s = o, *n = on, again = true;
    } else if (*n >= 2 && (*s)[0] == '$' && (*s)[*n - 1] == '$') {
      size_t k = *n >= 4 && starts(*s, *n, "$$") && (*s)[*n - 2] == '$' ? 2 : 1;
      *s += k, *n -= 2 * k, again = true;
    } else if (*n >= 4 && (starts(*s, *n, "\\(") || starts(*s, *n, "\\[")) && (*s)[*n - 2] == '\\' &&
               ((*s)[*n - 1] == ')' || (*s)[*n - 1] == ']')) {
      *s += 2, *n -= 4, again = true;
    }
  }
}

// The normalized text of [s, s + n) into out (CAP bytes, NUL-terminated).
static void normalize(const char *s, size_t n, char *out) {
  static const char *const drop[] = {"\\left", "\\right", "\\displaystyle", "\\!", "\\,", "\\;", "\\:",
                                     "\\ ", "^{\\circ}", "^\\circ", "\xc2\xb0", "~"};
  unwrap(&s, &n);
  size_t k = 0;
  for (size_t i = 0; i < n && k + 8 < CAP;) {
    bool skipped = false;
    for (size_t d = 0; d < sizeof drop / sizeof *drop && !skipped; d++)
      if (starts(s + i, n - i, drop[d])) i += strlen(drop[d]), skipped = true;
    if (skipped) continue;
    if (isspace((unsigned char)s[i])) {
      i++;
      continue;
    }
    if (starts(s + i, n - i, "\\dfrac") || starts(s + i, n - i, "\\tfrac")) {
      memcpy(out + k, "\\frac", 5), k += 5, i += 6;
      continue;
    }
    size_t t = starts(s + i, n - i, "\\text{") ? 6 : starts(s + i, n - i, "\\mbox{") ? 6 : 0;
    if (t) {  // after an answer a unit: dropped; alone, its text
      size_t end = closing(s, n, i + t - 1);
      if (k == 0)
        for (size_t j = i + t; j < end && k + 8 < CAP; j++)
          if (!isspace((unsigned char)s[j])) out[k++] = s[j];
      i = end < n ? end + 1 : n;
      continue;
    }
    if (starts(s + i, n - i, "\\%")) {
      out[k++] = '%', i += 2;
      continue;
    }
    out[k++] = s[i++];
  }
  while (k && out[k - 1] == '.') k--;
  out[k] = 0;
  // "x=5": the value of a single-letter variable
  if (k > 2 && isalpha((unsigned char)out[0]) && out[1] == '=' && !strchr(out + 2, '='))
    memmove(out, out + 2, k - 1);
}

// ---------------------------------------------------------------------------
// values

// A plain number at *p (sign, digits with 3-digit comma groups, a decimal part); advances *p.
static bool number(const char **p, double *x) {
  const char *s = *p;
  char buf[64];
  size_t k = 0;
  if (*s == '-' || *s == '+') buf[k++] = *s++;
  bool digits = false;
  while ((isdigit((unsigned char)*s) || *s == ',' || *s == '.') && k + 1 < sizeof buf) {
    if (*s == ',') {  // a thousands separator: three digits follow
      if (!(isdigit((unsigned char)s[1]) && isdigit((unsigned char)s[2]) && isdigit((unsigned char)s[3]) &&
            !isdigit((unsigned char)s[4])))
        return false;
      s++;
      continue;
    }
    digits |= isdigit((unsigned char)*s);
    buf[k++] = *s++;
  }
  buf[k] = 0;
  if (!digits) return false;
  char *end;
  *x = strtod(buf, &end);
  if (*end) return false;
  *p = s;
  return isfinite(*x);
}

// {A} or a single digit after \frac; advances *p.
static bool frac_arg(const char **p, double *x) {
  const char *s = *p;
  if (isdigit((unsigned char)*s)) {
    *x = *s - '0';
    *p = s + 1;
    return true;
  }
  if (*s != '{') return false;
  s++;
  if (!number(&s, x) || *s != '}') return false;
  *p = s + 1;
  return true;
}

// The whole normalized text as a number: a number, a/b, \frac{a}{b}, a\frac{b}{c}, each
// optionally negative; *pct when it ends in %.
static bool value(const char *s, double *x, bool *pct) {
  size_t n = strlen(s);
  *pct = n && s[n - 1] == '%';
  char t[CAP];
  memcpy(t, s, n + 1);
  if (*pct) t[--n] = 0;
  const char *p = t;
  double sign = 1, whole = 0, a, b;
  if (*p == '-' && starts(p + 1, strlen(p + 1), "\\frac")) sign = -1, p++;
  bool have_whole = false;
  if (!starts(p, strlen(p), "\\frac")) {
    if (!number(&p, &whole)) return false;
    have_whole = true;
    if (!*p) return *x = whole, true;
    if (*p == '/') {  // a/b
      p++;
      if (!number(&p, &b) || *p || b == 0) return false;
      return *x = whole / b, true;
    }
  }
  if (!starts(p, strlen(p), "\\frac")) return false;
  p += 5;
  if (!frac_arg(&p, &a) || !frac_arg(&p, &b) || *p || b == 0) return false;
  if (have_whole) return *x = whole + (whole < 0 ? -a / b : a / b), true;  // mixed number
  return *x = sign * a / b, true;
}

static bool close_to(double a, double b) { return fabs(a - b) <= fmax(1e-6 * fmax(fabs(a), fabs(b)), 1e-9); }

int ct_math_equal(const char *a, size_t na, const char *b, size_t nb) {
  char x[CAP], y[CAP];
  normalize(b, nb, y);
  if (!*y) return -1;
  normalize(a, na, x);
  if (!*x) return 0;
  double u, v;
  bool pu, pv;
  if (value(x, &u, &pu) && value(y, &v, &pv))  // a percentage stands for p/100 or p
    return close_to(u, v) || (pu && close_to(u / 100, v)) || (pv && close_to(u, v / 100));
  return strcmp(x, y) == 0;
}
