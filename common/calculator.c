// calculator: a recursive-descent evaluator over exact rationals (__int128 numerator and
// denominator, reduced, denominator > 0; every operation checks for overflow).
#include "calculator.h"

#include <stdio.h>
#include <string.h>

typedef __int128 i128;

typedef struct {
  i128 p, q;  // p / q, q > 0, gcd(p, q) = 1
} rat;

typedef struct {
  const char *s;
  size_t at;
  char *err;  // the first error (empty while none)
  size_t cap;
} parser;

static bool fail(parser *ps, const char *fmt, size_t at) {
  if (!ps->err[0]) snprintf(ps->err, ps->cap, fmt, at + 1);
  return false;
}

static bool unexpected(parser *ps, size_t at) {
  char c = ps->s[at];
  if (!ps->err[0]) {
    if (c > 32 && c < 127) snprintf(ps->err, ps->cap, "unexpected '%c' at %zu", c, at + 1);
    else snprintf(ps->err, ps->cap, "unexpected byte 0x%02x at %zu", (unsigned char)c, at + 1);
  }
  return false;
}

static i128 gcd(i128 a, i128 b) {
  if (a < 0) a = -a;
  if (b < 0) b = -b;
  while (b) {
    i128 t = a % b;
    a = b;
    b = t;
  }
  return a;
}

static bool make(parser *ps, i128 p, i128 q, rat *out) {
  if (q == 0) return fail(ps, "division by zero (at %zu)", ps->at);
  if (q < 0) p = -p, q = -q;
  i128 g = gcd(p, q);
  if (g > 1) p /= g, q /= g;
  *out = (rat){p, q};
  return true;
}

#define LIMIT (((i128)1) << 126)
static bool ok(i128 x) { return x < LIMIT && x > -LIMIT; }

static bool mul(i128 a, i128 b, i128 *r) { return !__builtin_mul_overflow(a, b, r) && ok(*r); }
static bool add(i128 a, i128 b, i128 *r) { return !__builtin_add_overflow(a, b, r) && ok(*r); }

static bool overflow(parser *ps) { return fail(ps, "the result does not fit in 126 bits (at %zu)", ps->at); }

static bool r_add(parser *ps, rat a, rat b, int sign, rat *out) {
  i128 x, y, q, p;
  if (!mul(a.p, b.q, &x) || !mul(b.p, a.q, &y) || !mul(a.q, b.q, &q) || !add(x, sign * y, &p)) return overflow(ps);
  return make(ps, p, q, out);
}

static bool r_mul(parser *ps, rat a, rat b, rat *out) {
  i128 p, q;
  if (!mul(a.p, b.p, &p) || !mul(a.q, b.q, &q)) return overflow(ps);
  return make(ps, p, q, out);
}

static bool r_div(parser *ps, rat a, rat b, rat *out) {
  if (b.p == 0) return fail(ps, "division by zero (at %zu)", ps->at);
  return r_mul(ps, a, (rat){b.q, b.p}, out) && make(ps, out->p, out->q, out);
}

static bool r_pow(parser *ps, rat a, rat e, rat *out) {
  if (e.q != 1) return fail(ps, "a power needs an integer exponent (at %zu)", ps->at);
  if (e.p > 4096 || e.p < -4096) return overflow(ps);
  int n = (int)(e.p < 0 ? -e.p : e.p);
  rat r = {1, 1};
  for (int i = 0; i < n; i++)
    if (!r_mul(ps, r, a, &r)) return false;
  if (e.p < 0) return r_div(ps, (rat){1, 1}, r, out);
  *out = r;
  return true;
}

static void skip(parser *ps) {
  while (ps->s[ps->at] == ' ' || ps->s[ps->at] == '\t' || ps->s[ps->at] == '\n') ps->at++;
}

static bool expr(parser *ps, rat *out);

// number: digits [. digits], with "_" or "," between digit groups ignored
static bool number(parser *ps, rat *out) {
  i128 p = 0, q = 1;
  size_t from = ps->at;
  bool frac = false, any = false;
  for (;; ps->at++) {
    char c = ps->s[ps->at];
    if (c >= '0' && c <= '9') {
      if (!mul(p, 10, &p) || !add(p, c - '0', &p) || (frac && !mul(q, 10, &q))) return overflow(ps);
      any = true;
    } else if (c == '.' && !frac) {
      frac = true;
    } else if ((c == '_' || c == ',') && any && ps->s[ps->at + 1] >= '0' && ps->s[ps->at + 1] <= '9' && !frac) {
      continue;
    } else {
      break;
    }
  }
  if (!any) return fail(ps, "a number expected at %zu", from);
  return make(ps, p, q, out);
}

static bool primary(parser *ps, rat *out) {
  skip(ps);
  char c = ps->s[ps->at];
  if (c == '(') {
    ps->at++;
    if (!expr(ps, out)) return false;
    skip(ps);
    if (ps->s[ps->at] != ')') return fail(ps, "')' expected at %zu", ps->at);
    ps->at++;
    return true;
  }
  if (c == '-' || c == '+') {
    ps->at++;
    if (!primary(ps, out)) return false;
    if (c == '-') out->p = -out->p;
    return true;
  }
  if ((c >= '0' && c <= '9') || c == '.') return number(ps, out);
  if (!c) return fail(ps, "the expression ends early (at %zu)", ps->at);
  return unexpected(ps, ps->at);
}

// power: primary [(^ | **) unary-power], right-associative, above unary minus (-2^2 = -4)
static bool power(parser *ps, rat *out) {
  skip(ps);
  if (ps->s[ps->at] == '-' || ps->s[ps->at] == '+') {
    char c = ps->s[ps->at++];
    if (!power(ps, out)) return false;
    if (c == '-') out->p = -out->p;
    return true;
  }
  if (!primary(ps, out)) return false;
  skip(ps);
  bool caret = ps->s[ps->at] == '^', stars = ps->s[ps->at] == '*' && ps->s[ps->at + 1] == '*';
  if (!caret && !stars) return true;
  ps->at += caret ? 1 : 2;
  rat e;
  return power(ps, &e) && r_pow(ps, *out, e, out);
}

static bool term(parser *ps, rat *out) {
  if (!power(ps, out)) return false;
  for (;;) {
    skip(ps);
    char c = ps->s[ps->at];
    if ((c != '*' && c != '/' && c != '%') || (c == '*' && ps->s[ps->at + 1] == '*')) return true;
    ps->at++;
    rat b;
    if (!power(ps, &b)) return false;
    if (c == '*' && !r_mul(ps, *out, b, out)) return false;
    if (c == '/' && !r_div(ps, *out, b, out)) return false;
    if (c == '%') {
      if (out->q != 1 || b.q != 1) return fail(ps, "%% needs integers (at %zu)", ps->at);
      if (b.p == 0) return fail(ps, "division by zero (at %zu)", ps->at);
      out->p %= b.p;
    }
  }
}

static bool expr(parser *ps, rat *out) {
  if (!term(ps, out)) return false;
  for (;;) {
    skip(ps);
    char c = ps->s[ps->at];
    if (c != '+' && c != '-') return true;
    ps->at++;
    rat b;
    if (!term(ps, &b) || !r_add(ps, *out, b, c == '+' ? 1 : -1, out)) return false;
  }
}

// |x| in decimal into buf (reversed, then flipped); returns the length.
static size_t digits(i128 x, char *buf) {
  unsigned __int128 u = x < 0 ? -(unsigned __int128)x : (unsigned __int128)x;
  size_t n = 0;
  do {
    buf[n++] = (char)('0' + (int)(u % 10));
    u /= 10;
  } while (u);
  for (size_t i = 0; i < n / 2; i++) {
    char t = buf[i];
    buf[i] = buf[n - 1 - i];
    buf[n - 1 - i] = t;
  }
  buf[n] = 0;
  return n;
}

static void write_rat(rat r, char *out, size_t cap) {
  char a[48], b[48];
  const char *sign = r.p < 0 ? "-" : "";
  digits(r.p, a);
  if (r.q == 1) {
    snprintf(out, cap, "%s%s", sign, a);
    return;
  }
  // a terminating decimal: q = 2^i 5^j; scale p to p·10^k / q with k = max(i, j)
  i128 q = r.q;
  int two = 0, five = 0;
  while (q % 2 == 0) q /= 2, two++;
  while (q % 5 == 0) q /= 5, five++;
  int k = two > five ? two : five;
  i128 scaled = r.p < 0 ? -r.p : r.p, m;
  bool fits = q == 1;
  for (int i = 0; fits && i < k; i++) fits = mul(scaled, 10, &scaled);
  if (fits) {
    m = scaled / r.q;
    size_t n = digits(m, a);
    char whole[48] = "0", frac[48];
    if (n > (size_t)k) {
      memcpy(whole, a, n - k);
      whole[n - k] = 0;
      snprintf(frac, sizeof frac, "%s", a + n - k);
    } else {
      memset(frac, '0', k - n);
      snprintf(frac + (k - n), sizeof frac - (k - n), "%s", a);
    }
    snprintf(out, cap, "%s%s.%s", sign, whole, frac);
    return;
  }
  digits(r.q, b);
  snprintf(out, cap, "%s%s/%s", sign, a, b);
}

bool ct_calculator_eval(const char *s, char *out, size_t cap) {
  parser ps = {s ? s : "", 0, out, cap};
  out[0] = 0;
  rat r;
  if (!expr(&ps, &r)) return false;
  skip(&ps);
  if (ps.s[ps.at]) return unexpected(&ps, ps.at);
  write_rat(r, out, cap);
  return true;
}

json_t *ct_calculator_schema(void) {
  return json_pack("{s:s, s:{s:s, s:s, s:{s:s, s:{s:{s:s, s:s}}, s:[s]}}}", "type", "function", "function", "name",
                   "calculator", "description",
                   "Evaluates an arithmetic expression exactly: integers and decimals, + - * /, ^ for powers, "
                   "parentheses.",
                   "parameters", "type", "object", "properties", "expression", "type", "string", "description",
                   "The expression, e.g. 123456 * 789012", "required", "expression");
}
