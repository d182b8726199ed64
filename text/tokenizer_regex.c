// tokenizer_regex: a backtracking matcher for the Split pre-tokenizer's patterns,
// compiled to a small node graph. It implements only the syntax tokenizer.json files use
// and rejects the rest at compile time; it is not a general regex engine.
#include "tokenizer_regex.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "mem.h"
#include "unicode.h"

// ---------------------------------------------------------------------------
// Character classes. For code points >= 128 a class is usually a function of the
// property byte alone (category + White_Space): `propmask` has bit v set when
// (prop & 63) == v is a member. Ranges reaching past ASCII make a class "complex".

typedef struct {
  uint32_t lo, hi;
} range;

typedef struct {
  uint32_t ascii[4];  // membership of 0..127, final (negation applied)
  uint64_t propmask;  // union of category/space items (before negation)
  range *ranges;      // explicit ranges (before negation)
  int nranges;
  bool neg, complex, fold;
} cclass;

static bool class_eval(const cclass *c, uint32_t cp, unsigned prop) {
  bool in = (c->propmask >> (prop & 63)) & 1;
  for (int i = 0; !in && i < c->nranges; i++) in = cp >= c->ranges[i].lo && cp <= c->ranges[i].hi;
  return in != c->neg;
}

static inline bool class_has(const cclass *c, uint32_t cp, unsigned prop) {
  if (cp < 128) return (c->ascii[cp >> 5] >> (cp & 31)) & 1;
  bool in;
  if (!c->complex) in = ((c->propmask >> (prop & 63)) & 1) != c->neg;
  else in = class_eval(c, cp, prop);
  if (!in && c->fold) {
    uint32_t u = ct_uc_upper(cp), l = ct_uc_lower(cp);
    in = (u != cp && class_eval(c, u, ct_uc_prop(u))) || (l != cp && class_eval(c, l, ct_uc_prop(l)));
  }
  return in;
}

// ---------------------------------------------------------------------------
// Parse tree.

enum { N_EMPTY, N_CHAR, N_CLASS, N_ANY, N_CAT, N_ALT, N_REP, N_LOOK, N_BOL, N_EOL };

typedef struct node {
  int kind;
  uint32_t c;      // N_CHAR
  bool fold;       // N_CHAR: case-insensitive
  int cls;         // N_CLASS
  int min, max;    // N_REP (max -1: unbounded)
  bool greedy;     // N_REP
  bool neg;        // N_LOOK
  struct node **kids;
  int nkids;
} node;

// Instructions.
enum { OP_CHAR, OP_CLASS, OP_ANY, OP_STAR, OP_SPLIT, OP_JMP, OP_LOOK, OP_MATCH, OP_BOL, OP_EOL };

typedef struct {
  uint8_t op;
  bool flag;    // OP_CHAR: fold; OP_STAR: greedy; OP_LOOK: negative
  int32_t cls;  // OP_CLASS / OP_STAR: class index, -1 for "any but \n"
  int32_t x, y; // jump targets; OP_STAR: min, max (-1 unbounded)
  uint32_t c;   // OP_CHAR: the code point (folded when flag)
} inst;

// What can come first from an instruction on: lets a SPLIT skip an alternative that
// cannot match the next code point. `all` is set when that is unknown or when the
// branch may match the empty string.
typedef struct {
  uint32_t ascii[4];
  uint64_t propmask;  // for code points >= 128, by property byte
  bool all;
} first_set;

struct ct_regex {
  inst *code;
  int ncode, capcode;
  cclass *classes;
  int nclasses;
  first_set *first;  // (ncode)
  bool *to_match;    // (ncode) only jumps lead from here to MATCH: nothing to backtrack for
};

typedef struct {
  const char *p;
  size_t n, i;
  bool fold;  // inside (?i: ...)
  ct_regex *re;
  node **all;  // every node, for freeing
  int nall, capall;
  int depth;
  int err;
} parser;

static int perr(parser *ps, const char *msg) {
  if (!ps->err) ps->err = ct_set_error(CT_EFORMAT, "position %zu: %s", ps->i, msg);
  return ps->err;
}

static node *mk(parser *ps, int kind) {
  if (ps->err) return NULL;
  if (ps->nall == ps->capall) {
    int cap = ps->capall ? 2 * ps->capall : 64;
    node **all = realloc(ps->all, sizeof *all * (size_t)cap);
    if (!all) {
      perr(ps, "out of memory");
      return NULL;
    }
    ps->all = all;
    ps->capall = cap;
  }
  node *nd = calloc(1, sizeof *nd);
  if (!nd) {
    perr(ps, "out of memory");
    return NULL;
  }
  ps->all[ps->nall++] = nd;
  nd->kind = kind;
  return nd;
}

static int add_kid(parser *ps, node *parent, node *kid) {
  if (!kid) return ps->err ? ps->err : perr(ps, "out of memory");
  node **k = realloc(parent->kids, sizeof *k * (size_t)(parent->nkids + 1));
  if (!k) return perr(ps, "out of memory");
  parent->kids = k;
  k[parent->nkids++] = kid;
  return 0;
}

static int new_class(parser *ps) {
  ct_regex *re = ps->re;
  cclass *c = realloc(re->classes, sizeof *c * (size_t)(re->nclasses + 1));
  if (!c) return perr(ps, "out of memory"), -1;
  re->classes = c;
  memset(&c[re->nclasses], 0, sizeof *c);
  c[re->nclasses].fold = ps->fold;
  return re->nclasses++;
}

static int class_add_range(parser *ps, cclass *c, uint32_t lo, uint32_t hi) {
  range *r = realloc(c->ranges, sizeof *r * (size_t)(c->nranges + 1));
  if (!r) return perr(ps, "out of memory");
  c->ranges = r;
  r[c->nranges++] = (range){lo, hi};
  if (hi >= 128) c->complex = true;
  return 0;
}

// Property-byte mask of a set of categories (bit per category), optionally White_Space.
static uint64_t mask_of_cats(uint32_t cats) {
  uint64_t m = 0;
  for (int v = 0; v < 64; v++)
    if ((cats >> (v & 31)) & 1) m |= 1ull << v;
  return m;
}
static uint64_t mask_space(void) {
  uint64_t m = 0;
  for (int v = 32; v < 64; v++) m |= 1ull << v;
  return m;
}

#define CAT(x) (1u << CT_UC_##x)
static const struct {
  const char *name;
  uint32_t cats;
} cat_names[] = {
    {"L", CAT(Lu) | CAT(Ll) | CAT(Lt) | CAT(Lm) | CAT(Lo)},
    {"Letter", CAT(Lu) | CAT(Ll) | CAT(Lt) | CAT(Lm) | CAT(Lo)},
    {"LC", CAT(Lu) | CAT(Ll) | CAT(Lt)},
    {"Lu", CAT(Lu)}, {"Ll", CAT(Ll)}, {"Lt", CAT(Lt)}, {"Lm", CAT(Lm)}, {"Lo", CAT(Lo)},
    {"M", CAT(Mn) | CAT(Mc) | CAT(Me)}, {"Mark", CAT(Mn) | CAT(Mc) | CAT(Me)},
    {"Mn", CAT(Mn)}, {"Mc", CAT(Mc)}, {"Me", CAT(Me)},
    {"N", CAT(Nd) | CAT(Nl) | CAT(No)}, {"Number", CAT(Nd) | CAT(Nl) | CAT(No)},
    {"Nd", CAT(Nd)}, {"Nl", CAT(Nl)}, {"No", CAT(No)},
    {"P", CAT(Pc) | CAT(Pd) | CAT(Ps) | CAT(Pe) | CAT(Pi) | CAT(Pf) | CAT(Po)},
    {"Punctuation", CAT(Pc) | CAT(Pd) | CAT(Ps) | CAT(Pe) | CAT(Pi) | CAT(Pf) | CAT(Po)},
    {"Pc", CAT(Pc)}, {"Pd", CAT(Pd)}, {"Ps", CAT(Ps)}, {"Pe", CAT(Pe)}, {"Pi", CAT(Pi)},
    {"Pf", CAT(Pf)}, {"Po", CAT(Po)},
    {"S", CAT(Sm) | CAT(Sc) | CAT(Sk) | CAT(So)}, {"Symbol", CAT(Sm) | CAT(Sc) | CAT(Sk) | CAT(So)},
    {"Sm", CAT(Sm)}, {"Sc", CAT(Sc)}, {"Sk", CAT(Sk)}, {"So", CAT(So)},
    {"Z", CAT(Zs) | CAT(Zl) | CAT(Zp)}, {"Separator", CAT(Zs) | CAT(Zl) | CAT(Zp)},
    {"Zs", CAT(Zs)}, {"Zl", CAT(Zl)}, {"Zp", CAT(Zp)},
    {"C", CAT(Cc) | CAT(Cf) | CAT(Cs) | CAT(Co) | CAT(Cn)},
    {"Other", CAT(Cc) | CAT(Cf) | CAT(Cs) | CAT(Co) | CAT(Cn)},
    {"Cc", CAT(Cc)}, {"Cf", CAT(Cf)}, {"Cs", CAT(Cs)}, {"Co", CAT(Co)}, {"Cn", CAT(Cn)},
};

static bool peek(parser *ps, char c) { return ps->i < ps->n && ps->p[ps->i] == c; }

static uint32_t next_cp(parser *ps) {
  uint32_t cp = ct_utf8_next(ps->p, ps->n, &ps->i);
  if (cp == CT_UC_INVALID) perr(ps, "pattern is not valid UTF-8");
  return cp;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// An escape after '\': either one code point (*cp, returns 0) or a property-byte
// mask (*mask, *neg; returns 1). -1 on error.
static int parse_escape(parser *ps, uint32_t *cp, uint64_t *mask, bool *neg) {
  if (ps->i >= ps->n) return perr(ps, "pattern ends after '\\'"), -1;
  char e = ps->p[ps->i++];
  *neg = false;
  switch (e) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case 'a': *cp = 7; return 0;
    case 'e': *cp = 27; return 0;
    case '0': *cp = 0; return 0;
    case 's': case 'S': *mask = mask_space(); *neg = e == 'S'; return 1;
    case 'd': case 'D': *mask = mask_of_cats(CAT(Nd)); *neg = e == 'D'; return 1;
    case 'w': case 'W':
      *mask = mask_of_cats(CAT(Lu) | CAT(Ll) | CAT(Lt) | CAT(Lm) | CAT(Lo) | CAT(Mn) | CAT(Mc) |
                           CAT(Me) | CAT(Nd) | CAT(Pc));
      *neg = e == 'W';
      return 1;
    case 'p': case 'P': {
      *neg = e == 'P';
      char name[32];
      size_t len = 0;
      if (peek(ps, '{')) {
        ps->i++;
        if (peek(ps, '^')) {
          *neg = !*neg;
          ps->i++;
        }
        while (ps->i < ps->n && ps->p[ps->i] != '}' && len + 1 < sizeof name) name[len++] = ps->p[ps->i++];
        if (!peek(ps, '}')) return perr(ps, "unterminated \\p{...}"), -1;
        ps->i++;
      } else if (ps->i < ps->n) {
        name[len++] = ps->p[ps->i++];
      }
      name[len] = 0;
      for (size_t k = 0; k < sizeof cat_names / sizeof cat_names[0]; k++)
        if (!strcmp(cat_names[k].name, name)) {
          *mask = mask_of_cats(cat_names[k].cats);
          return 1;
        }
      ps->i -= 1;
      return perr(ps, "unsupported Unicode property (only general categories)"), -1;
    }
    case 'x': case 'u': {
      uint32_t v = 0;
      int digits = 0, want = e == 'x' ? 2 : 4;
      bool brace = peek(ps, '{');
      if (brace) ps->i++;
      while (ps->i < ps->n && hexval(ps->p[ps->i]) >= 0 && (brace ? digits < 6 : digits < want)) {
        v = v * 16 + (uint32_t)hexval(ps->p[ps->i++]);
        digits++;
      }
      if (brace) {
        if (!peek(ps, '}')) return perr(ps, "unterminated \\x{...}"), -1;
        ps->i++;
      }
      if (!digits || (!brace && digits != want) || v > 0x10FFFF) return perr(ps, "bad hex escape"), -1;
      *cp = v;
      return 0;
    }
    default:
      if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '1' && e <= '9')) {
        ps->i--;
        return perr(ps, "unsupported escape"), -1;
      }
      ps->i--;
      *cp = next_cp(ps);
      return ps->err ? -1 : 0;
  }
}

static void class_finish(cclass *c) {
  for (uint32_t cp = 0; cp < 128; cp++) {
    bool in = class_eval(c, cp, ct_uc_prop(cp));
    if (!in && c->fold) {
      uint32_t u = ct_uc_upper(cp), l = ct_uc_lower(cp);
      in = class_eval(c, u, ct_uc_prop(u)) || class_eval(c, l, ct_uc_prop(l));
    }
    if (in) c->ascii[cp >> 5] |= 1u << (cp & 31);
  }
  if (c->fold) c->complex = true;
}

static node *parse_class(parser *ps) {
  size_t open = ps->i;
  ps->i++;  // '['
  int k = new_class(ps);
  if (k < 0) return NULL;
  bool neg = false;
  if (peek(ps, '^')) {
    neg = true;
    ps->i++;
  }
  bool first = true;
  for (;;) {
    if (ps->i >= ps->n) {
      ps->i = open;
      perr(ps, "unterminated character class");
      return NULL;
    }
    char ch = ps->p[ps->i];
    if (ch == ']' && !first) {
      ps->i++;
      break;
    }
    first = false;
    if (ch == '[') {
      perr(ps, "nested classes and class set operations are not supported");
      return NULL;
    }
    if (ch == '&' && ps->i + 1 < ps->n && ps->p[ps->i + 1] == '&') {
      perr(ps, "class intersection '&&' is not supported");
      return NULL;
    }
    uint32_t lo;
    if (ch == '\\') {
      ps->i++;
      uint64_t mask;
      bool mneg;
      int r = parse_escape(ps, &lo, &mask, &mneg);
      if (r < 0) return NULL;
      if (r == 1) {
        if (mneg) {
          // A negated item inside a class: covers code points whose property is not in
          // mask; explicit-range classes are evaluated per code point, so fold it in.
          ps->re->classes[k].propmask |= ~mask;
        } else {
          ps->re->classes[k].propmask |= mask;
        }
        continue;
      }
    } else {
      lo = next_cp(ps);
      if (ps->err) return NULL;
    }
    uint32_t hi = lo;
    if (peek(ps, '-') && ps->i + 1 < ps->n && ps->p[ps->i + 1] != ']') {
      ps->i++;
      if (peek(ps, '\\')) {
        ps->i++;
        uint64_t mask;
        bool mneg;
        int r = parse_escape(ps, &hi, &mask, &mneg);
        if (r < 0) return NULL;
        if (r == 1) {
          perr(ps, "a class escape cannot end a range");
          return NULL;
        }
      } else {
        hi = next_cp(ps);
        if (ps->err) return NULL;
      }
      if (hi < lo) {
        perr(ps, "range out of order in character class");
        return NULL;
      }
    }
    if (class_add_range(ps, &ps->re->classes[k], lo, hi)) return NULL;
  }
  cclass *c = &ps->re->classes[k];
  c->neg = neg;
  class_finish(c);
  node *nd = mk(ps, N_CLASS);
  if (nd) nd->cls = k;
  return nd;
}

static node *parse_alt(parser *ps);

static node *parse_atom(parser *ps) {
  char ch = ps->p[ps->i];
  if (ch == '(') {
    size_t open = ps->i;
    ps->i++;
    bool save_fold = ps->fold;
    node *look = NULL;
    if (peek(ps, '?')) {
      ps->i++;
      if (peek(ps, ':')) {
        ps->i++;
      } else if (peek(ps, '=') || peek(ps, '!')) {
        look = mk(ps, N_LOOK);
        if (!look) return NULL;
        look->neg = ps->p[ps->i] == '!';
        ps->i++;
      } else if (peek(ps, 'i') && ps->i + 1 < ps->n && ps->p[ps->i + 1] == ':') {
        ps->fold = true;
        ps->i += 2;
      } else {
        perr(ps, "unsupported group syntax (only (?:, (?i:, (?= and (?!)");
        return NULL;
      }
    }
    if (++ps->depth > 100) {
      perr(ps, "groups nested too deeply");
      return NULL;
    }
    node *inner = parse_alt(ps);
    ps->depth--;
    ps->fold = save_fold;
    if (!inner) return NULL;
    if (!peek(ps, ')')) {
      ps->i = open;
      perr(ps, "unbalanced parenthesis");
      return NULL;
    }
    ps->i++;
    if (look) {
      if (add_kid(ps, look, inner)) return NULL;
      return look;
    }
    return inner;
  }
  if (ch == '[') return parse_class(ps);
  if (ch == '.') {
    ps->i++;
    return mk(ps, N_ANY);
  }
  if (ch == '^') {
    ps->i++;
    return mk(ps, N_BOL);
  }
  if (ch == '$') {
    ps->i++;
    return mk(ps, N_EOL);
  }
  if (ch == ')' || ch == '*' || ch == '+' || ch == '?' || ch == '{') {
    perr(ps, ch == ')' ? "unbalanced parenthesis" : "nothing to repeat");
    return NULL;
  }
  uint32_t cp;
  if (ch == '\\') {
    ps->i++;
    uint64_t mask;
    bool neg;
    int r = parse_escape(ps, &cp, &mask, &neg);
    if (r < 0) return NULL;
    if (r == 1) {
      int k = new_class(ps);
      if (k < 0) return NULL;
      cclass *c = &ps->re->classes[k];
      c->propmask = mask;
      c->neg = neg;
      class_finish(c);
      node *nd = mk(ps, N_CLASS);
      if (nd) nd->cls = k;
      return nd;
    }
  } else {
    cp = next_cp(ps);
    if (ps->err) return NULL;
  }
  node *nd = mk(ps, N_CHAR);
  if (nd) {
    nd->fold = ps->fold;
    nd->c = ps->fold ? ct_uc_fold(cp) : cp;
  }
  return nd;
}

static bool parse_int(parser *ps, int *v) {
  size_t start = ps->i;
  long x = 0;
  while (ps->i < ps->n && ps->p[ps->i] >= '0' && ps->p[ps->i] <= '9') {
    x = x * 10 + (ps->p[ps->i++] - '0');
    if (x > 100000) x = 100000;
  }
  *v = (int)x;
  return ps->i > start;
}

static node *parse_seq(parser *ps) {
  node *cat = mk(ps, N_CAT);
  if (!cat) return NULL;
  while (ps->i < ps->n && ps->p[ps->i] != '|' && ps->p[ps->i] != ')') {
    node *a = parse_atom(ps);
    if (!a) return NULL;
    for (;;) {
      int min, max;
      size_t qpos = ps->i;
      if (peek(ps, '*')) min = 0, max = -1, ps->i++;
      else if (peek(ps, '+')) min = 1, max = -1, ps->i++;
      else if (peek(ps, '?')) min = 0, max = 1, ps->i++;
      else if (peek(ps, '{')) {
        ps->i++;
        if (!parse_int(ps, &min)) {
          ps->i = qpos;
          perr(ps, "bad {n,m} repetition");
          return NULL;
        }
        max = min;
        if (peek(ps, ',')) {
          ps->i++;
          if (!parse_int(ps, &max)) max = -1;
        }
        if (!peek(ps, '}') || (max >= 0 && max < min) || min > 1000 || max > 1000) {
          ps->i = qpos;
          perr(ps, "bad {n,m} repetition");
          return NULL;
        }
        ps->i++;
      } else break;
      if (a->kind == N_REP || a->kind == N_LOOK || a->kind == N_BOL || a->kind == N_EOL) {
        ps->i = qpos;
        perr(ps, a->kind == N_REP ? "nested quantifier (possessive and stacked quantifiers are "
                                    "not supported)"
                                  : "nothing to repeat");
        return NULL;
      }
      node *rep = mk(ps, N_REP);
      if (!rep) return NULL;
      rep->min = min;
      rep->max = max;
      rep->greedy = true;
      if (peek(ps, '?')) {
        rep->greedy = false;
        ps->i++;
      }
      if (add_kid(ps, rep, a)) return NULL;
      a = rep;
    }
    if (add_kid(ps, cat, a)) return NULL;
  }
  return cat;
}

static node *parse_alt(parser *ps) {
  node *first = parse_seq(ps);
  if (!first || !peek(ps, '|')) return first;
  node *alt = mk(ps, N_ALT);
  if (!alt || add_kid(ps, alt, first)) return NULL;
  while (peek(ps, '|')) {
    ps->i++;
    node *s = parse_seq(ps);
    if (!s || add_kid(ps, alt, s)) return NULL;
  }
  return alt;
}

// ---------------------------------------------------------------------------
// Code generation.

static int emit(parser *ps, inst in) {
  ct_regex *re = ps->re;
  if (re->ncode >= 200000) return perr(ps, "pattern too large"), -1;
  if (re->ncode == re->capcode) {
    int cap = re->capcode ? 2 * re->capcode : 64;
    inst *c = realloc(re->code, sizeof *c * (size_t)cap);
    if (!c) return perr(ps, "out of memory"), -1;
    re->code = c;
    re->capcode = cap;
  }
  re->code[re->ncode] = in;
  return re->ncode++;
}

static bool nullable(const node *nd) {
  switch (nd->kind) {
    case N_CHAR: case N_CLASS: case N_ANY: return false;
    case N_CAT:
      for (int i = 0; i < nd->nkids; i++)
        if (!nullable(nd->kids[i])) return false;
      return true;
    case N_ALT:
      for (int i = 0; i < nd->nkids; i++)
        if (nullable(nd->kids[i])) return true;
      return false;
    case N_REP: return nd->min == 0 || nullable(nd->kids[0]);
    default: return true;
  }
}

static int gen(parser *ps, const node *nd) {
  if (ps->err) return -1;
  switch (nd->kind) {
    case N_EMPTY: return 0;
    case N_CHAR: return emit(ps, (inst){.op = OP_CHAR, .flag = nd->fold, .c = nd->c}) < 0 ? -1 : 0;
    case N_CLASS: return emit(ps, (inst){.op = OP_CLASS, .cls = nd->cls}) < 0 ? -1 : 0;
    case N_ANY: return emit(ps, (inst){.op = OP_ANY}) < 0 ? -1 : 0;
    case N_BOL: return emit(ps, (inst){.op = OP_BOL}) < 0 ? -1 : 0;
    case N_EOL: return emit(ps, (inst){.op = OP_EOL}) < 0 ? -1 : 0;
    case N_CAT:
      for (int i = 0; i < nd->nkids; i++)
        if (gen(ps, nd->kids[i])) return -1;
      return 0;
    case N_ALT: {
      int *jumps = malloc(sizeof *jumps * (size_t)nd->nkids);
      if (!jumps) return perr(ps, "out of memory"), -1;
      for (int i = 0; i < nd->nkids; i++) {
        int split = -1;
        if (i + 1 < nd->nkids) split = emit(ps, (inst){.op = OP_SPLIT});
        if (gen(ps, nd->kids[i])) {
          free(jumps);
          return -1;
        }
        if (i + 1 < nd->nkids) {
          jumps[i] = emit(ps, (inst){.op = OP_JMP});
          if (split < 0 || jumps[i] < 0) {
            free(jumps);
            return -1;
          }
          ps->re->code[split].x = split + 1;
          ps->re->code[split].y = ps->re->ncode;
        }
      }
      for (int i = 0; i + 1 < nd->nkids; i++) ps->re->code[jumps[i]].x = ps->re->ncode;
      free(jumps);
      return 0;
    }
    case N_LOOK: {
      int look = emit(ps, (inst){.op = OP_LOOK, .flag = nd->neg});
      if (look < 0 || gen(ps, nd->kids[0]) || emit(ps, (inst){.op = OP_MATCH}) < 0) return -1;
      ps->re->code[look].x = ps->re->ncode;
      return 0;
    }
    case N_REP: {
      const node *k = nd->kids[0];
      if (k->kind == N_CHAR || k->kind == N_CLASS || k->kind == N_ANY) {
        int cls;
        if (k->kind == N_CLASS) {
          cls = k->cls;
        } else if (k->kind == N_ANY) {
          cls = -1;
        } else {  // a repeated literal becomes a one-code-point class
          bool save = ps->fold;
          ps->fold = k->fold;
          cls = new_class(ps);
          ps->fold = save;
          if (cls < 0 || class_add_range(ps, &ps->re->classes[cls], k->c, k->c)) return -1;
          class_finish(&ps->re->classes[cls]);
        }
        return emit(ps, (inst){.op = OP_STAR, .flag = nd->greedy, .cls = cls, .x = nd->min,
                               .y = nd->max}) < 0 ? -1 : 0;
      }
      if (nd->max != 0 && nullable(k)) return perr(ps, "a repeated group can match the empty string"), -1;
      for (int i = 0; i < nd->min; i++)
        if (gen(ps, k)) return -1;
      if (nd->max < 0) {
        int split = emit(ps, (inst){.op = OP_SPLIT});
        if (split < 0 || gen(ps, k) || emit(ps, (inst){.op = OP_JMP, .x = split}) < 0) return -1;
        int out = ps->re->ncode;
        ps->re->code[split].x = nd->greedy ? split + 1 : out;
        ps->re->code[split].y = nd->greedy ? out : split + 1;
        return 0;
      }
      int nopt = nd->max - nd->min, *splits = malloc(sizeof(int) * (size_t)(nopt + 1));
      if (!splits) return perr(ps, "out of memory"), -1;
      for (int i = 0; i < nopt; i++) {
        splits[i] = emit(ps, (inst){.op = OP_SPLIT});
        if (splits[i] < 0 || gen(ps, k)) {
          free(splits);
          return -1;
        }
      }
      int out = ps->re->ncode;
      for (int i = 0; i < nopt; i++) {
        ps->re->code[splits[i]].x = nd->greedy ? splits[i] + 1 : out;
        ps->re->code[splits[i]].y = nd->greedy ? out : splits[i] + 1;
      }
      free(splits);
      return 0;
    }
  }
  return perr(ps, "internal error"), -1;
}

static void fs_union(first_set *a, const first_set *b) {
  for (int i = 0; i < 4; i++) a->ascii[i] |= b->ascii[i];
  a->propmask |= b->propmask;
  a->all |= b->all;
}

static void fs_class(const ct_regex *re, int cls, first_set *out) {
  if (cls < 0) {  // any but \n
    out->all = true;
    return;
  }
  const cclass *c = &re->classes[cls];
  if (c->complex) {
    out->all = true;
    return;
  }
  for (int i = 0; i < 4; i++) out->ascii[i] |= c->ascii[i];
  out->propmask |= c->neg ? ~c->propmask : c->propmask;
}

// state: 0 not computed, 1 in progress, 2 done
static first_set fs_of(const ct_regex *re, int pc, uint8_t *state, first_set *memo) {
  first_set f = {{0}, 0, false};
  if (pc < 0 || pc >= re->ncode || state[pc] == 1) {
    f.all = true;
    return f;
  }
  if (state[pc] == 2) return memo[pc];
  state[pc] = 1;
  const inst *in = &re->code[pc];
  switch (in->op) {
    case OP_CHAR:
      if (in->c >= 128) {
        f.all = true;  // non-ASCII literal: no quick test
      } else if (in->flag) {  // folded: both ASCII cases, and any non-ASCII (long s, Kelvin)
        for (uint32_t c = 0; c < 128; c++)
          if (ct_uc_fold(c) == in->c) f.ascii[c >> 5] |= 1u << (c & 31);
        f.propmask = ~0ull;
      } else {
        f.ascii[in->c >> 5] |= 1u << (in->c & 31);
      }
      break;
    case OP_CLASS: fs_class(re, in->cls, &f); break;
    case OP_ANY: f.all = true; break;
    case OP_STAR: {
      fs_class(re, in->cls, &f);
      if (in->x == 0) {
        first_set g = fs_of(re, pc + 1, state, memo);
        fs_union(&f, &g);
      }
      break;
    }
    case OP_SPLIT: {
      first_set g = fs_of(re, in->x, state, memo), h = fs_of(re, in->y, state, memo);
      fs_union(&f, &g);
      fs_union(&f, &h);
      break;
    }
    case OP_JMP: f = fs_of(re, in->x, state, memo); break;
    default: f.all = true;  // MATCH, LOOK, BOL, EOL may match without consuming
  }
  state[pc] = 2;
  memo[pc] = f;
  return f;
}

static inline bool fs_has(const first_set *f, const ct_regex_text *t, size_t at) {
  if (f->all) return true;
  uint32_t cp = t->cp[at];
  if (cp < 128) return (f->ascii[cp >> 5] >> (cp & 31)) & 1;
  return (f->propmask >> (t->prop[at] & 63)) & 1;
}

void ct_regex_free(ct_regex *re) {
  if (!re) return;
  free(re->first);
  free(re->to_match);
  for (int i = 0; i < re->nclasses; i++) free(re->classes[i].ranges);
  free(re->classes);
  free(re->code);
  free(re);
}

int ct_regex_compile(ct_regex **out, const char *pat, size_t len) {
  *out = NULL;
  ct_regex *re = calloc(1, sizeof *re);
  if (!re) return ct_set_error(CT_ENOMEM, "regex: out of memory");
  parser ps = {.p = pat, .n = len, .re = re};
  node *root = parse_alt(&ps);
  if (root && ps.i < ps.n) perr(&ps, "unbalanced parenthesis");
  if (!ps.err && root) {
    gen(&ps, root);
    emit(&ps, (inst){.op = OP_MATCH});
  }
  for (int i = 0; i < ps.nall; i++) {
    free(ps.all[i]->kids);
    free(ps.all[i]);
  }
  free(ps.all);
  if (ps.err || !root) {
    ct_regex_free(re);
    return ps.err ? ps.err : ct_set_error(CT_EFORMAT, "position %zu: bad pattern", ps.i);
  }
  re->first = calloc((size_t)re->ncode, sizeof *re->first);
  uint8_t *state = calloc((size_t)re->ncode, 1);
  if (!re->first || !state) {
    free(state);
    ct_regex_free(re);
    return ct_set_error(CT_ENOMEM, "regex: out of memory");
  }
  for (int pc = 0; pc < re->ncode; pc++) {
    // Recompute from a clean slate per root so cycles only ever widen a set.
    memset(state, 0, (size_t)re->ncode);
    first_set *memo = calloc((size_t)re->ncode, sizeof *memo);
    if (!memo) {
      free(state);
      ct_regex_free(re);
      return ct_set_error(CT_ENOMEM, "regex: out of memory");
    }
    re->first[pc] = fs_of(re, pc, state, memo);
    free(memo);
  }
  free(state);
  re->to_match = calloc((size_t)re->ncode, sizeof *re->to_match);
  if (!re->to_match) {
    ct_regex_free(re);
    return ct_set_error(CT_ENOMEM, "regex: out of memory");
  }
  for (int pc = 0; pc < re->ncode; pc++) {
    int q = pc, hops = 0;
    while (re->code[q].op == OP_JMP && hops++ < re->ncode) q = re->code[q].x;
    re->to_match[pc] = re->code[q].op == OP_MATCH;
  }
  *out = re;
  return 0;
}

// ---------------------------------------------------------------------------
// Matching: a backtracking machine over code points with an explicit stack.

int ct_regex_text_set(ct_regex_text *t, const char *s, size_t len) {
  if (len + 1 > t->cap) {
    size_t cap = t->cap ? t->cap : 1024;
    while (cap < len + 1) cap *= 2;
    uint32_t *cp = realloc(t->cp, cap * sizeof *cp);
    if (cp) t->cp = cp;
    uint8_t *pr = realloc(t->prop, cap);
    if (pr) t->prop = pr;
    uint32_t *off = realloc(t->off, cap * sizeof *off);
    if (off) t->off = off;
    if (!cp || !pr || !off) return ct_set_error(CT_ENOMEM, "regex: out of memory");
    t->cap = cap;
  }
  size_t n = 0;
  for (size_t i = 0; i < len;) {
    t->off[n] = (uint32_t)i;
    unsigned char b = (unsigned char)s[i];
    uint32_t c;
    if (b < 0x80) {
      c = b;
      i++;
    } else {
      c = ct_utf8_next(s, len, &i);
    }
    t->cp[n] = c;
    t->prop[n] = (uint8_t)ct_uc_prop(c);
    n++;
  }
  t->off[n] = (uint32_t)len;
  t->n = n;
  return 0;
}

void ct_regex_text_free(ct_regex_text *t) {
  ct_free_all(t->cp, t->prop, t->off, t->stack);
  memset(t, 0, sizeof *t);
}

enum { BT_PC, BT_STAR_GREEDY, BT_STAR_LAZY };
typedef struct {
  int32_t pc, kind;
  size_t at, lim;  // BT_STAR_GREEDY: lim = smallest position; LAZY: largest
} bt;

static inline bool one(const ct_regex *re, int cls, const ct_regex_text *t, size_t at) {
  if (cls < 0) return t->cp[at] != '\n';
  return class_has(&re->classes[cls], t->cp[at], t->prop[at]);
}

static inline int push(ct_regex_text *t, size_t *sp, bt e) {
  if (__builtin_expect(*sp == t->stack_cap, 0)) {
    size_t cap = t->stack_cap ? 2 * t->stack_cap : 256;
    bt *s = realloc(t->stack, cap * sizeof *s);
    if (!s) return ct_set_error(CT_ENOMEM, "regex: out of memory");
    t->stack = s;
    t->stack_cap = cap;
  }
  ((bt *)t->stack)[(*sp)++] = e;
  return 0;
}

// Runs from pc at position at; the stack above `base` belongs to this run.
static long run(const ct_regex *re, ct_regex_text *t, size_t end, int pc, size_t at, size_t base,
                long *budget) {
  size_t sp = base;
  for (;;) {
    if (--*budget < 0) {
      ct_set_error(CT_EFORMAT, "pattern backtracks too much on this text");
      return -2;
    }
    const inst *in = &re->code[pc];
    switch (in->op) {
      case OP_CHAR:
        if (at < end && (in->flag ? ct_uc_fold(t->cp[at]) : t->cp[at]) == in->c) {
          at++;
          pc++;
          continue;
        }
        goto fail;
      case OP_CLASS:
        if (at < end && one(re, in->cls, t, at)) {
          at++;
          pc++;
          continue;
        }
        goto fail;
      case OP_ANY:
        if (at < end && t->cp[at] != '\n') {
          at++;
          pc++;
          continue;
        }
        goto fail;
      case OP_STAR: {
        size_t max = in->y < 0 ? end - at : (size_t)in->y, k = 0;
        if (max > end - at) max = end - at;
        if (in->cls >= 0) {
          const cclass *c = &re->classes[in->cls];
          while (k < max && class_has(c, t->cp[at + k], t->prop[at + k])) k++;
        } else {
          while (k < max && t->cp[at + k] != '\n') k++;
        }
        if (k < (size_t)in->x) goto fail;
        if (in->flag) {
          if (k > (size_t)in->x && !re->to_match[pc + 1] &&
              push(t, &sp, (bt){pc + 1, BT_STAR_GREEDY, at + k - 1, at + (size_t)in->x}))
            return -2;
          at += k;
        } else {
          if (k > (size_t)in->x &&
              push(t, &sp, (bt){pc + 1, BT_STAR_LAZY, at + (size_t)in->x + 1, at + k}))
            return -2;
          at += (size_t)in->x;
        }
        pc++;
        continue;
      }
      case OP_SPLIT:
        if (at < end) {  // skip an alternative that cannot start with the next code point
          bool ox = fs_has(&re->first[in->x], t, at), oy = fs_has(&re->first[in->y], t, at);
          if (!ox && !oy) goto fail;
          if (!oy) {
            pc = in->x;
            continue;
          }
          if (!ox) {
            pc = in->y;
            continue;
          }
        }
        if (push(t, &sp, (bt){in->y, BT_PC, at, 0})) return -2;
        pc = in->x;
        continue;
      case OP_JMP:
        pc = in->x;
        continue;
      case OP_LOOK: {
        long r = run(re, t, end, pc + 1, at, sp, budget);
        if (r < -1) return r;
        if ((r >= 0) != in->flag) {
          pc = in->x;
          continue;
        }
        goto fail;
      }
      case OP_BOL:
        if (at == 0 || t->cp[at - 1] == '\n') {
          pc++;
          continue;
        }
        goto fail;
      case OP_EOL:
        if (at == end || t->cp[at] == '\n') {
          pc++;
          continue;
        }
        goto fail;
      case OP_MATCH:
        return (long)at;
    }
  fail:
    for (;;) {
      if (sp == base) return -1;
      bt *e = &((bt *)t->stack)[sp - 1];
      if (e->kind == BT_PC) {
        pc = e->pc;
        at = e->at;
        sp--;
        break;
      }
      if (e->kind == BT_STAR_GREEDY) {
        pc = e->pc;
        at = e->at;
        if (e->at > e->lim) e->at--;
        else sp--;
        break;
      }
      // BT_STAR_LAZY: one more repetition
      pc = e->pc;
      at = e->at;
      if (e->at < e->lim) e->at++;
      else sp--;
      break;
    }
  }
}

long ct_regex_match(const ct_regex *re, ct_regex_text *t, size_t at, size_t end) {
  long budget = 100000 + 100 * (long)(end - at);
  return run(re, t, end, 0, at, 0, &budget);
}
