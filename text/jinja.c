// jinja: a small Jinja2 interpreter for chat templates. The semantics follow
// @huggingface/jinja (what transformers.js renders with), which in turn follows Python
// Jinja2 with trim_blocks and lstrip_blocks as transformers configures it. Where the two
// differ we follow @huggingface/jinja (e.g. `{{ true }}` renders "true", a string method
// called without arguments trims JavaScript whitespace), except that strip/lstrip/rstrip
// with an argument strip those characters as Python does (the JavaScript one ignores it).
//
// Layout: preprocessing (whitespace control, {% generation %} markers), lexer, parser
// (an AST of `node`), values (arena-allocated), interpreter. Errors unwind with longjmp
// to the entry point; everything a render allocates lives in its arena.
#include "jinja.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "unicode.h"

// Bytes that cannot occur in UTF-8 mark where {% generation %} / {% endgeneration %}
// stood once the tags are cut out, so whitespace control can see through them.
#define GEN_START '\xFE'
#define GEN_END '\xFF'

// ===========================================================================
// Arena

typedef struct chunk {
  struct chunk *next;
  size_t used, cap;
  max_align_t data[];
} chunk;

typedef struct {
  chunk *head;
  jmp_buf *jmp;  // where to go when out of memory (NULL: return NULL)
  bool oom;      // an allocation failed: the error that unwound is CT_ENOMEM
} arena;

static void *arena_alloc(arena *a, size_t n) {
  n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
  if (!a->head || a->head->used + n > a->head->cap) {
    size_t cap = n > (1 << 16) ? n : (1 << 16);
    chunk *c = malloc(sizeof *c + cap);
    if (!c) {
      ct_set_error(CT_ENOMEM, "jinja: out of memory");
      a->oom = true;
      if (a->jmp) longjmp(*a->jmp, 1);
      return NULL;
    }
    c->next = a->head;
    c->used = 0;
    c->cap = cap;
    a->head = c;
  }
  void *p = (char *)a->head->data + a->head->used;
  a->head->used += n;
  return p;
}

static void *arena_zalloc(arena *a, size_t n) {
  void *p = arena_alloc(a, n);
  if (p) memset(p, 0, n);
  return p;
}

static void arena_free(arena *a) {
  for (chunk *c = a->head; c;) {
    chunk *n = c->next;
    free(c);
    c = n;
  }
  a->head = NULL;
}

// Growable byte buffer in the arena (old space is abandoned on growth).
typedef struct {
  char *p;
  size_t n, cap;
} sbuf;

static void sb_put(arena *a, sbuf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 64;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = arena_alloc(a, cap);
    if (b->n) memcpy(p, b->p, b->n);
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}
static void sb_puts(arena *a, sbuf *b, const char *s) { sb_put(a, b, s, strlen(s)); }
static void sb_putc(arena *a, sbuf *b, char c) { sb_put(a, b, &c, 1); }

// ===========================================================================
// Source, positions and errors

typedef struct {
  const char *src;  // the original template
  size_t len;
  const char *where;
  size_t *map;  // preprocessed offset -> original offset
} source;

static void line_col(const source *S, size_t off, int *line, int *col) {
  *line = 1;
  *col = 1;
  if (off > S->len) off = S->len;
  for (size_t i = 0; i < off; i++) {
    if (S->src[i] == '\n') {
      (*line)++;
      *col = 1;
    } else if (((unsigned char)S->src[i] & 0xC0) != 0x80) {
      (*col)++;
    }
  }
}

// ===========================================================================
// Preprocessing, as @huggingface/jinja does with regular expressions: drop one trailing
// newline; lstrip_blocks; trim_blocks; cut {% generation %} tags (leaving markers).

static bool js_space(uint32_t c) {  // JavaScript's \s
  return c == ' ' || (c >= 9 && c <= 13) || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

// Length of the JS whitespace character at s[i] (0 if none).
static size_t space_at(const char *s, size_t n, size_t i) {
  if (i >= n) return 0;
  unsigned char c = (unsigned char)s[i];
  if (c < 0x80) return js_space(c) ? 1 : 0;
  size_t j = i;
  uint32_t cp = ct_utf8_next(s, n, &j);
  return js_space(cp) ? j - i : 0;
}

// Length of the JS whitespace character ending at s[i) (0 if none).
static size_t space_before(const char *s, size_t i) {
  if (i == 0) return 0;
  unsigned char c = (unsigned char)s[i - 1];
  if (c < 0x80) return js_space(c) ? 1 : 0;
  size_t j = ct_utf8_prev(s, 0, i), k = j;
  return js_space(ct_utf8_next(s, i, &k)) ? i - j : 0;  // a stray byte is no space
}

typedef struct {
  char *s;
  size_t *map;
  size_t n;
} pstr;

static void pstr_init(arena *a, pstr *p, size_t cap) {
  p->s = arena_alloc(a, cap + 1);
  p->map = arena_alloc(a, (cap + 1) * sizeof *p->map);
  p->n = 0;
}
static void pstr_put(pstr *p, char c, size_t orig) {
  p->s[p->n] = c;
  p->map[p->n++] = orig;
}

static bool line_terminator_before(const char *s, size_t i) {
  if (i == 0) return true;
  char c = s[i - 1];
  if (c == '\n' || c == '\r') return true;
  // U+2028 / U+2029: E2 80 A8 / E2 80 A9
  return i >= 3 && (unsigned char)s[i - 3] == 0xE2 && (unsigned char)s[i - 2] == 0x80 &&
         ((unsigned char)s[i - 1] == 0xA8 || (unsigned char)s[i - 1] == 0xA9);
}

static pstr preprocess(arena *a, const char *src, size_t len) {
  pstr p0, p1, p2, p3;
  size_t n = len;
  if (n && src[n - 1] == '\n') n--;
  pstr_init(a, &p0, n);
  for (size_t i = 0; i < n; i++) pstr_put(&p0, src[i], i);
  // lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1"
  pstr_init(a, &p1, p0.n);
  for (size_t i = 0; i < p0.n;) {
    if (line_terminator_before(p0.s, i)) {
      size_t j = i;
      while (j < p0.n && (p0.s[j] == ' ' || p0.s[j] == '\t')) j++;
      if (j + 1 < p0.n && p0.s[j] == '{' && (p0.s[j + 1] == '#' || p0.s[j + 1] == '%' || p0.s[j + 1] == '-')) {
        pstr_put(&p1, p0.s[j], p0.map[j]);
        pstr_put(&p1, p0.s[j + 1], p0.map[j + 1]);
        i = j + 2;
        continue;
      }
    }
    pstr_put(&p1, p0.s[i], p0.map[i]);
    i++;
  }
  // trim_blocks: /([#%-]})\n/g -> "$1"
  pstr_init(a, &p2, p1.n);
  for (size_t i = 0; i < p1.n; i++) {
    pstr_put(&p2, p1.s[i], p1.map[i]);
    if (i >= 1 && p1.s[i] == '}' && (p1.s[i - 1] == '#' || p1.s[i - 1] == '%' || p1.s[i - 1] == '-') &&
        i + 1 < p1.n && p1.s[i + 1] == '\n') {
      // the "}" must itself start a fresh match (not be the "}" of a previous "-}" pair)
      i++;
    }
  }
  // generation tags: /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs
  pstr_init(a, &p3, p2.n);
  size_t done = 0;  // p2 bytes before this are final
  for (size_t i = 0; i < p2.n;) {
    if (!(p2.s[i] == '{' && i + 1 < p2.n && p2.s[i + 1] == '%')) {
      i++;
      continue;
    }
    size_t j = i + 2, k;
    bool lstrip = j < p2.n && p2.s[j] == '-';
    if (lstrip) j++;
    while ((k = space_at(p2.s, p2.n, j))) j += k;
    bool end = p2.n - j >= 3 && !memcmp(p2.s + j, "end", 3);
    if (end) j += 3;
    if (p2.n - j < 10 || memcmp(p2.s + j, "generation", 10)) {
      i += 2;
      continue;
    }
    j += 10;
    while ((k = space_at(p2.s, p2.n, j))) j += k;
    bool rstrip = j < p2.n && p2.s[j] == '-';
    if (rstrip) j++;
    if (!(j + 1 < p2.n && p2.s[j] == '%' && p2.s[j + 1] == '}')) {
      i += 2;
      continue;
    }
    j += 2;
    size_t before = i;
    while (before > done && (k = space_before(p2.s, before))) before -= k;
    size_t after = j;
    while ((k = space_at(p2.s, p2.n, after))) after += k;
    for (size_t q = done; q < (lstrip ? before : i); q++) pstr_put(&p3, p2.s[q], p2.map[q]);
    pstr_put(&p3, end ? GEN_END : GEN_START, p2.map[i]);
    if (!rstrip)
      for (size_t q = j; q < after; q++) pstr_put(&p3, p2.s[q], p2.map[q]);
    done = i = after;
  }
  for (size_t q = done; q < p2.n; q++) pstr_put(&p3, p2.s[q], p2.map[q]);
  p3.s[p3.n] = 0;
  p3.map[p3.n] = len;
  return p3;
}

// ===========================================================================
// Lexer

enum {
  T_TEXT, T_NUM, T_STR, T_IDENT, T_EQUALS, T_LPAREN, T_RPAREN, T_OPEN_STMT, T_CLOSE_STMT,
  T_OPEN_EXPR, T_CLOSE_EXPR, T_LBRACKET, T_RBRACKET, T_LBRACE, T_RBRACE, T_COMMA, T_DOT,
  T_COLON, T_PIPE, T_ADD, T_MUL, T_POW, T_CMP, T_UNARY, T_COMMENT, T_EOF
};

typedef struct {
  int type;
  const char *s;  // value (NUL-terminated, arena)
  size_t n;
  size_t pos;  // offset in the preprocessed text
} token;

typedef struct {
  arena *a;
  const source *S;
  jmp_buf *jmp;
  const char *p;  // preprocessed text
  size_t n;
  token *t;
  int nt, capt;
} lexer;

static _Noreturn void fail_at(const source *S, jmp_buf *jmp, size_t orig, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail_at(const source *S, jmp_buf *jmp, size_t orig, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int line, col;
  line_col(S, orig, &line, &col);
  ct_set_error(CT_EFORMAT, "%s:%d:%d: %s", S->where, line, col, msg);
  longjmp(*jmp, 1);
}

static _Noreturn void lex_fail(lexer *L, size_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void lex_fail(lexer *L, size_t pos, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fail_at(L->S, L->jmp, L->S->map[pos > L->n ? L->n : pos], "%s", msg);
}

static void push_tok(lexer *L, int type, const char *s, size_t n, size_t pos) {
  if (L->nt == L->capt) {
    int cap = L->capt ? 2 * L->capt : 256;
    token *t = arena_alloc(L->a, sizeof *t * (size_t)cap);
    if (L->nt) memcpy(t, L->t, sizeof *t * (size_t)L->nt);
    L->t = t;
    L->capt = cap;
  }
  char *v = arena_alloc(L->a, n + 1);
  memcpy(v, s, n);
  v[n] = 0;
  L->t[L->nt++] = (token){type, v, n, pos};
}

static int last_type(const lexer *L) { return L->nt ? L->t[L->nt - 1].type : -1; }

// trimEnd of the last text token, seeing through generation markers; pops it if empty.
static void strip_trailing(lexer *L) {
  if (last_type(L) != T_TEXT) return;
  token *t = &L->t[L->nt - 1];
  char *s = (char *)t->s;
  size_t n = t->n, w = n, k;
  // Remove whitespace from the end, keeping any markers in order.
  char marks[64];
  int nm = 0;
  for (;;) {
    if (w && (s[w - 1] == GEN_START || s[w - 1] == GEN_END)) {
      if (nm < 64) marks[nm++] = s[w - 1];
      w--;
    } else if ((k = space_before(s, w))) {
      w -= k;
    } else {
      break;
    }
  }
  for (int i = nm - 1; i >= 0; i--) s[w++] = marks[i];
  s[w] = 0;
  t->n = w;
  if (w == 0) L->nt--;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_word(char c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

static const struct {
  const char *seq;
  int type;
} op_table[] = {
    {"{%", T_OPEN_STMT}, {"%}", T_CLOSE_STMT}, {"{{", T_OPEN_EXPR}, {"}}", T_CLOSE_EXPR},
    {"(", T_LPAREN}, {")", T_RPAREN}, {"{", T_LBRACE}, {"}", T_RBRACE}, {"[", T_LBRACKET},
    {"]", T_RBRACKET}, {",", T_COMMA}, {".", T_DOT}, {":", T_COLON}, {"|", T_PIPE},
    {"<=", T_CMP}, {">=", T_CMP}, {"==", T_CMP}, {"!=", T_CMP}, {"<", T_CMP}, {">", T_CMP},
    {"+", T_ADD}, {"-", T_ADD}, {"~", T_ADD}, {"**", T_POW}, {"*", T_MUL}, {"//", T_MUL},
    {"/", T_MUL}, {"%", T_MUL}, {"=", T_EQUALS},
};

static void lex(lexer *L) {
  const char *p = L->p;
  size_t n = L->n, i = 0;
  int curly = 0;
  sbuf pending = {0};  // generation markers skipped over by "-%}" / "-}}"
  while (i < n) {
    int lt = last_type(L);
    if (lt < 0 || lt == T_CLOSE_STMT || lt == T_CLOSE_EXPR || lt == T_COMMENT) {
      size_t st = i;
      while (i < n && !(p[i] == '{' && i + 1 < n && (p[i + 1] == '%' || p[i + 1] == '{' || p[i + 1] == '#'))) i++;
      if (i > st || pending.n) {
        sbuf t = {0};
        if (pending.n) sb_put(L->a, &t, pending.p, pending.n);
        sb_put(L->a, &t, p + st, i - st);
        pending.n = 0;
        push_tok(L, T_TEXT, t.p, t.n, st);
        continue;
      }
    }
    if (p[i] == '{' && i + 1 < n && p[i + 1] == '#') {  // comment
      size_t st = i;
      i += 2;
      bool strip_before = i < n && p[i] == '-';
      if (strip_before) i++;
      size_t cs = i;
      while (!(i + 1 < n && p[i] == '#' && p[i + 1] == '}')) {
        if (i + 2 >= n) lex_fail(L, st, "missing end of comment tag '#}'");
        i++;
      }
      bool strip_after = i > cs && p[i - 1] == '-';
      if (strip_before) strip_trailing(L);
      push_tok(L, T_COMMENT, "", 0, st);
      i += 2;
      if (strip_after) {
        size_t k;
        for (;;) {
          if (i < n && (p[i] == GEN_START || p[i] == GEN_END)) sb_putc(L->a, &pending, p[i++]);
          else if ((k = space_at(p, n, i))) i += k;
          else break;
        }
      }
      continue;
    }
    if (n - i >= 3 && p[i] == '{' && (p[i + 1] == '%' || p[i + 1] == '{') && p[i + 2] == '-') {
      strip_trailing(L);
      if (pending.n) {
        push_tok(L, T_TEXT, pending.p, pending.n, i);
        pending.n = 0;
      }
      push_tok(L, p[i + 1] == '%' ? T_OPEN_STMT : T_OPEN_EXPR, p + i, 2, i);
      if (p[i + 1] == '{') curly = 0;
      i += 3;
      continue;
    }
    if (pending.n && p[i] == '{' && i + 1 < n && (p[i + 1] == '%' || p[i + 1] == '{')) {
      push_tok(L, T_TEXT, pending.p, pending.n, i);
      pending.n = 0;
    }
    size_t k;
    while ((k = space_at(p, n, i))) i += k;
    if (i >= n) break;
    if (n - i >= 3 && p[i] == '-' && ((p[i + 1] == '%' && p[i + 2] == '}') || (p[i + 1] == '}' && p[i + 2] == '}'))) {
      push_tok(L, p[i + 1] == '%' ? T_CLOSE_STMT : T_CLOSE_EXPR, p + i + 1, 2, i);
      i += 3;
      for (;;) {
        if (i < n && (p[i] == GEN_START || p[i] == GEN_END)) sb_putc(L->a, &pending, p[i++]);
        else if ((k = space_at(p, n, i))) i += k;
        else break;
      }
      continue;
    }
    char c = p[i];
    if (c == '-' || c == '+') {
      int t = last_type(L);
      if (t == T_TEXT || t < 0) lex_fail(L, i, "unexpected character '%c'", c);
      if (!(t == T_IDENT || t == T_NUM || t == T_STR || t == T_RPAREN || t == T_RBRACKET)) {
        size_t st = i++;
        size_t ds = i;
        while (i < n && is_digit(p[i])) i++;
        if (i > ds && i + 1 < n && p[i] == '.' && is_digit(p[i + 1])) {
          i++;
          while (i < n && is_digit(p[i])) i++;
        }
        push_tok(L, i > ds ? T_NUM : T_UNARY, p + st, i - st, st);
        continue;
      }
    }
    bool matched = false;
    for (size_t k2 = 0; k2 < sizeof op_table / sizeof op_table[0]; k2++) {
      size_t sl = strlen(op_table[k2].seq);
      if (op_table[k2].type == T_CLOSE_EXPR && curly > 0) continue;
      if (n - i >= sl && !memcmp(p + i, op_table[k2].seq, sl)) {
        push_tok(L, op_table[k2].type, p + i, sl, i);
        if (op_table[k2].type == T_OPEN_EXPR) curly = 0;
        else if (op_table[k2].type == T_LBRACE) curly++;
        else if (op_table[k2].type == T_RBRACE) curly--;
        i += sl;
        matched = true;
        break;
      }
    }
    if (matched) continue;
    if (c == '\'' || c == '"') {
      size_t st = i++;
      sbuf s = {0};
      sb_put(L->a, &s, "", 0);
      for (;;) {
        if (i >= n) lex_fail(L, st, "unterminated string literal");
        char ch = p[i];
        if (ch == c) break;
        if (ch == '\\') {
          if (++i >= n) lex_fail(L, st, "unterminated string literal");
          char e = p[i++];
          const char *rep = NULL;
          switch (e) {
            case 'n': rep = "\n"; break;
            case 't': rep = "\t"; break;
            case 'r': rep = "\r"; break;
            case 'b': rep = "\b"; break;
            case 'f': rep = "\f"; break;
            case 'v': rep = "\v"; break;
            case '\'': rep = "'"; break;
            case '"': rep = "\""; break;
            case '\\': rep = "\\"; break;
            case 'x': case 'u': {
              int len = e == 'x' ? 2 : 4;
              uint32_t v = 0;
              for (int q = 0; q < len; q++) {
                char h = i < n ? p[i] : 0;
                int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
                if (d < 0) lex_fail(L, i, "invalid \\%c escape", e);
                v = v * 16 + (uint32_t)d;
                i++;
              }
              if (v >= 0xD800 && v <= 0xDFFF) v = 0xFFFD;  // a lone surrogate has no UTF-8
              char u[4];
              sb_put(L->a, &s, u, (size_t)ct_utf8_put(u, v));
              continue;
            }
            default: lex_fail(L, i - 1, "unexpected escaped character '%c'", e);
          }
          sb_puts(L->a, &s, rep);
          continue;
        }
        sb_putc(L->a, &s, ch);
        i++;
      }
      i++;
      push_tok(L, T_STR, s.p, s.n, st);
      continue;
    }
    if (is_digit(c)) {
      size_t st = i;
      while (i < n && is_digit(p[i])) i++;
      if (last_type(L) != T_DOT && i + 1 < n && p[i] == '.' && is_digit(p[i + 1])) {
        i++;
        while (i < n && is_digit(p[i])) i++;
      }
      push_tok(L, T_NUM, p + st, i - st, st);
      continue;
    }
    if (is_word(c)) {
      size_t st = i;
      while (i < n && is_word(p[i])) i++;
      push_tok(L, T_IDENT, p + st, i - st, st);
      continue;
    }
    if (c == GEN_START || c == GEN_END)
      lex_fail(L, i, "{%% generation %%} is only allowed between statements");
    size_t q = i;
    ct_utf8_next(p, n, &q);
    lex_fail(L, i, "unexpected character '%.*s'", (int)(q - i), p + i);
  }
  if (pending.n) push_tok(L, T_TEXT, pending.p, pending.n, n);
  push_tok(L, T_EOF, "", 0, n);
}

// ===========================================================================
// Parser

enum {
  N_TEXT, N_GEN_START, N_GEN_END, N_OUTPUT, N_IF, N_FOR, N_SET, N_MACRO, N_BREAK, N_CONTINUE,
  N_FILTER_BLOCK, N_CALL_BLOCK,
  // expressions
  N_INT, N_FLOAT, N_STR, N_IDENT, N_ARRAY, N_TUPLE, N_OBJECT, N_MEMBER, N_CALL, N_UNARY,
  N_BINARY, N_FILTER, N_TEST, N_SELECT, N_TERNARY, N_SLICE, N_KWARG, N_SPREAD, N_KWSPREAD
};

typedef struct node node;
typedef struct {
  node **v;
  int n;
} nlist;

struct node {
  int kind;
  size_t pos;      // original template offset
  const char *s;   // text, identifier, operator, string literal
  size_t n;
  double num;
  bool flag;       // N_TEST negate, N_MEMBER computed
  node *a, *b, *c; // operands
  nlist body, alt, args;
};

typedef struct {
  arena *a;
  const source *S;
  jmp_buf *jmp;
  token *t;
  int nt, i;
  bool has_gen;
  int depth;
} parser;

static _Noreturn void parse_fail(parser *P, const token *t, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void parse_fail(parser *P, const token *t, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fail_at(P->S, P->jmp, P->S->map[t->pos], "%s", msg);
}

static node *mk(parser *P, int kind, const token *t) {
  node *nd = arena_zalloc(P->a, sizeof *nd);
  nd->kind = kind;
  nd->pos = P->S->map[t->pos];
  return nd;
}

static void nl_push(arena *a, nlist *l, node *x) {
  // grow by powers of two: reallocate when n hits one
  if ((l->n & (l->n - 1)) == 0) {
    int cap = l->n ? 2 * l->n : 1;
    node **v = arena_alloc(a, sizeof *v * (size_t)cap);
    if (l->n) memcpy(v, l->v, sizeof *v * (size_t)l->n);
    l->v = v;
  }
  l->v[l->n++] = x;
}

static token *cur(parser *P) { return &P->t[P->i]; }
static bool is(parser *P, int type) { return P->t[P->i].type == type; }
static bool is_ident(parser *P, const char *name) {
  return P->t[P->i].type == T_IDENT && !strcmp(P->t[P->i].s, name);
}
static bool is_stmt(parser *P, const char *const *names) {
  if (!is(P, T_OPEN_STMT) || P->t[P->i + 1].type != T_IDENT) return false;
  for (; *names; names++)
    if (!strcmp(P->t[P->i + 1].s, *names)) return true;
  return false;
}

static const char *tok_desc(const token *t) {
  switch (t->type) {
    case T_EOF: return "end of template";
    case T_TEXT: return "text";
    case T_CLOSE_STMT: return "'%}'";
    case T_CLOSE_EXPR: return "'}}'";
    case T_OPEN_STMT: return "'{%'";
    case T_OPEN_EXPR: return "'{{'";
    default: return t->s;
  }
}

static token *expect(parser *P, int type, const char *what) {
  token *t = cur(P);
  if (t->type != type) parse_fail(P, t, "expected %s, found %s", what, tok_desc(t));
  P->i++;
  return t;
}

static void expect_ident(parser *P, const char *name) {
  if (!is_ident(P, name)) parse_fail(P, cur(P), "expected '%s', found %s", name, tok_desc(cur(P)));
  P->i++;
}

static node *parse_expr(parser *P);
static node *parse_primary(parser *P);
static node *parse_any(parser *P);

static void enter(parser *P) {
  if (++P->depth > 200) parse_fail(P, cur(P), "template nested too deeply");
}

static node *parse_seq(parser *P, bool primary) {  // a, b, c -> tuple
  token *t0 = cur(P);
  node *first = primary ? parse_primary(P) : parse_expr(P);
  if (!is(P, T_COMMA)) return first;
  node *tup = mk(P, N_TUPLE, t0);
  nl_push(P->a, &tup->args, first);
  while (is(P, T_COMMA)) {
    P->i++;
    nl_push(P->a, &tup->args, primary ? parse_primary(P) : parse_expr(P));
  }
  return tup;
}

static void parse_args(parser *P, nlist *out, bool params) {
  expect(P, T_LPAREN, "'('");
  bool kw = false;
  while (!is(P, T_RPAREN)) {
    if (is(P, T_EOF)) parse_fail(P, cur(P), "expected ')', found end of template");
    token *t = cur(P);
    node *arg;
    if (is(P, T_POW) || (is(P, T_MUL) && !strcmp(cur(P)->s, "*"))) {
      if (params) parse_fail(P, t, "argument unpacking is not allowed in parameter declarations");
      bool kws = is(P, T_POW);
      P->i++;
      arg = mk(P, kws ? N_KWSPREAD : N_SPREAD, t);
      arg->a = parse_expr(P);
    } else {
      arg = parse_expr(P);
      if (is(P, T_EQUALS)) {
        P->i++;
        if (arg->kind != N_IDENT) parse_fail(P, t, "expected an identifier before '='");
        node *kwn = mk(P, N_KWARG, t);
        kwn->s = arg->s;
        kwn->n = arg->n;
        kwn->a = parse_expr(P);
        arg = kwn;
        kw = true;
      } else if (params && arg->kind != N_IDENT) {
        parse_fail(P, t, "expected an identifier for a parameter");
      } else if (kw && arg->kind != N_KWSPREAD) {
        parse_fail(P, t, params ? "non-default parameter follows a default one"
                                : "positional argument follows a keyword argument");
      }
    }
    nl_push(P->a, out, arg);
    if (is(P, T_COMMA)) P->i++;
    else if (!is(P, T_RPAREN)) parse_fail(P, cur(P), "expected ',' or ')', found %s", tok_desc(cur(P)));
  }
  P->i++;
}

static node *parse_member(parser *P, node *obj);

static node *parse_call(parser *P, node *callee) {
  node *c = mk(P, N_CALL, cur(P));
  c->pos = callee->pos;  // errors point at what is called
  c->a = callee;
  parse_args(P, &c->args, false);
  c = parse_member(P, c);
  if (is(P, T_LPAREN)) c = parse_call(P, c);
  return c;
}

static node *parse_member(parser *P, node *obj) {
  while (is(P, T_DOT) || is(P, T_LBRACKET)) {
    token *op = cur(P);
    P->i++;
    node *m = mk(P, N_MEMBER, op);
    m->pos = obj->pos;  // errors point at the start of the expression
    m->a = obj;
    if (op->type == T_LBRACKET) {
      m->flag = true;
      node *parts[3] = {NULL, NULL, NULL};
      int np = 0;
      bool slice = false;
      while (!is(P, T_RBRACKET)) {
        if (is(P, T_EOF)) parse_fail(P, cur(P), "expected ']', found end of template");
        if (np >= 3) parse_fail(P, cur(P), "a slice takes at most 3 parts");
        if (is(P, T_COLON)) {
          parts[np++] = NULL;
          P->i++;
          slice = true;
        } else {
          parts[np++] = parse_expr(P);
          if (is(P, T_COLON)) {
            P->i++;
            slice = true;
          }
        }
      }
      if (np == 0) parse_fail(P, op, "expected an index or a slice inside []");
      if (slice) {
        node *sl = mk(P, N_SLICE, op);
        sl->a = parts[0];
        sl->b = np > 1 ? parts[1] : NULL;
        sl->c = np > 2 ? parts[2] : NULL;
        m->b = sl;
      } else {
        m->b = parts[0];
      }
      expect(P, T_RBRACKET, "']'");
    } else {
      token *pt = cur(P);
      node *prop = parse_primary(P);
      if (prop->kind != N_IDENT && prop->kind != N_INT)
        parse_fail(P, pt, "expected an identifier or integer after '.'");
      m->b = prop;
    }
    obj = m;
  }
  return obj;
}

static node *parse_call_member(parser *P) {
  node *m = parse_member(P, parse_primary(P));
  if (is(P, T_LPAREN)) return parse_call(P, m);
  return m;
}

static node *parse_unary_sign(parser *P) {
  token *t = cur(P);
  if ((t->type == T_UNARY || t->type == T_ADD) && (!strcmp(t->s, "-") || !strcmp(t->s, "+"))) {
    P->i++;
    enter(P);
    node *u = mk(P, N_UNARY, t);
    u->s = t->s;
    u->a = parse_unary_sign(P);
    P->depth--;
    return u;
  }
  return parse_call_member(P);
}

// A filter: a name, or one call of a name (`f(args)`, nothing after it).
static node *parse_filter_name(parser *P, token *ft) {
  node *f = parse_primary(P);
  if (f->kind != N_IDENT) parse_fail(P, ft, "expected a filter name");
  if (!is(P, T_LPAREN)) return f;
  f = parse_call(P, f);
  if (f->kind != N_CALL || f->a->kind != N_IDENT) parse_fail(P, ft, "expected a filter name or call");
  return f;
}

static node *parse_filter(parser *P) {
  node *x = parse_unary_sign(P);
  while (is(P, T_PIPE)) {
    token *t = cur(P);
    P->i++;
    token *ft = cur(P);
    node *f = parse_filter_name(P, ft);
    node *fe = mk(P, N_FILTER, t);
    fe->a = x;
    fe->b = f;
    x = fe;
  }
  return x;
}

static node *parse_test(parser *P) {
  node *x = parse_filter(P);
  while (is_ident(P, "is")) {
    token *t = cur(P);
    P->i++;
    bool neg = is_ident(P, "not");
    if (neg) P->i++;
    token *tt = cur(P);
    if (tt->type != T_IDENT) parse_fail(P, tt, "expected a test name after 'is'");
    P->i++;
    node *te = mk(P, N_TEST, t);
    te->a = x;
    te->flag = neg;
    te->s = tt->s;
    te->n = tt->n;
    x = te;
  }
  return x;
}

static node *binary(parser *P, const token *op, const char *s, node *l, node *r) {
  node *b = mk(P, N_BINARY, op);
  b->s = s;
  b->a = l;
  b->b = r;
  return b;
}

typedef node *(*parse_fn)(parser *P);

// A left-associative chain `operand (op operand)*`: op is the keyword kw, or when kw is
// NULL a token of type `type` (its text names the operator).
static node *parse_binop(parser *P, int type, const char *kw, parse_fn operand) {
  node *l = operand(P);
  while (kw ? is_ident(P, kw) : is(P, type)) {
    token *op = cur(P);
    P->i++;
    l = binary(P, op, kw ? kw : op->s, l, operand(P));
  }
  return l;
}

// Precedence, tightest first: pow, mul, add, comparisons, not, and, or.
static node *parse_pow(parser *P) { return parse_binop(P, T_POW, NULL, parse_test); }
static node *parse_mul(parser *P) { return parse_binop(P, T_MUL, NULL, parse_pow); }
static node *parse_add(parser *P) { return parse_binop(P, T_ADD, NULL, parse_mul); }

static node *parse_cmp(parser *P) {
  node *l = parse_add(P);
  for (;;) {
    token *op = cur(P);
    const char *s;
    if (is_ident(P, "not") && P->t[P->i + 1].type == T_IDENT && !strcmp(P->t[P->i + 1].s, "in")) {
      s = "not in";
      P->i += 2;
    } else if (is_ident(P, "in")) {
      s = "in";
      P->i++;
    } else if (is(P, T_CMP)) {
      s = op->s;
      P->i++;
    } else {
      break;
    }
    l = binary(P, op, s, l, parse_add(P));
  }
  return l;
}

static node *parse_not(parser *P) {
  if (is_ident(P, "not")) {
    token *t = cur(P);
    P->i++;
    enter(P);
    node *u = mk(P, N_UNARY, t);
    u->s = "not";
    u->a = parse_not(P);
    P->depth--;
    return u;
  }
  return parse_cmp(P);
}

static node *parse_and(parser *P) { return parse_binop(P, T_IDENT, "and", parse_not); }
static node *parse_or(parser *P) { return parse_binop(P, T_IDENT, "or", parse_and); }

static node *parse_expr(parser *P) {
  enter(P);
  token *t = cur(P);
  node *a = parse_or(P);
  if (is_ident(P, "if")) {
    P->i++;
    node *test = parse_or(P);
    if (is_ident(P, "else")) {
      P->i++;
      node *tern = mk(P, N_TERNARY, t);
      tern->a = test;
      tern->b = a;
      tern->c = parse_expr(P);
      a = tern;
    } else {
      node *sel = mk(P, N_SELECT, t);
      sel->a = a;
      sel->b = test;
      a = sel;
    }
  }
  P->depth--;
  return a;
}

static node *parse_primary(parser *P) {
  token *t = cur(P);
  P->i++;
  switch (t->type) {
    case T_NUM: {
      node *nd = mk(P, strchr(t->s, '.') ? N_FLOAT : N_INT, t);
      nd->num = strtod(t->s, NULL);
      return nd;
    }
    case T_STR: {
      node *nd = mk(P, N_STR, t);
      if (!is(P, T_STR)) {
        nd->s = t->s;
        nd->n = t->n;
        return nd;
      }
      sbuf b = {0};
      sb_put(P->a, &b, t->s, t->n);
      while (is(P, T_STR)) {
        sb_put(P->a, &b, cur(P)->s, cur(P)->n);
        P->i++;
      }
      nd->s = b.p;
      nd->n = b.n;
      return nd;
    }
    case T_IDENT: {
      node *nd = mk(P, N_IDENT, t);
      nd->s = t->s;
      nd->n = t->n;
      return nd;
    }
    case T_LPAREN: {
      enter(P);
      node *x = parse_seq(P, false);
      P->depth--;
      expect(P, T_RPAREN, "')'");
      return x;
    }
    case T_LBRACKET: {
      node *arr = mk(P, N_ARRAY, t);
      enter(P);
      while (!is(P, T_RBRACKET)) {
        if (is(P, T_EOF)) parse_fail(P, cur(P), "expected ']', found end of template");
        nl_push(P->a, &arr->args, parse_expr(P));
        if (is(P, T_COMMA)) P->i++;
        else if (!is(P, T_RBRACKET)) parse_fail(P, cur(P), "expected ',' or ']', found %s", tok_desc(cur(P)));
      }
      P->depth--;
      P->i++;
      return arr;
    }
    case T_LBRACE: {
      node *obj = mk(P, N_OBJECT, t);
      enter(P);
      while (!is(P, T_RBRACE)) {
        if (is(P, T_EOF)) parse_fail(P, cur(P), "expected '}', found end of template");
        nl_push(P->a, &obj->args, parse_expr(P));
        expect(P, T_COLON, "':' between key and value");
        nl_push(P->a, &obj->args, parse_expr(P));
        if (is(P, T_COMMA)) P->i++;
        else if (!is(P, T_RBRACE)) parse_fail(P, cur(P), "expected ',' or '}', found %s", tok_desc(cur(P)));
      }
      P->depth--;
      P->i++;
      return obj;
    }
    default:
      parse_fail(P, t, "unexpected %s", tok_desc(t));
  }
}

static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_FOR[] = {"endfor", "else", NULL};

static void parse_until(parser *P, nlist *body, const char *const *ends, const token *start, const char *what) {
  while (!is_stmt(P, ends)) {
    if (is(P, T_EOF)) parse_fail(P, start, "unclosed '%s' (expected %s)", what, ends[0]);
    node *x = parse_any(P);
    if (x) nl_push(P->a, body, x);
  }
}

static node *parse_if(parser *P, const token *start) {
  node *nd = mk(P, N_IF, start);
  nd->a = parse_expr(P);
  expect(P, T_CLOSE_STMT, "'%}'");
  parse_until(P, &nd->body, END_IF, start, "if");
  if (is_stmt(P, (const char *const[]){"elif", NULL})) {
    token *t = &P->t[P->i + 1];
    P->i += 2;
    nl_push(P->a, &nd->alt, parse_if(P, t));
  } else if (is_stmt(P, (const char *const[]){"else", NULL})) {
    P->i += 2;
    expect(P, T_CLOSE_STMT, "'%}'");
    parse_until(P, &nd->alt, (const char *const[]){"endif", NULL}, start, "if");
  }
  return nd;
}

static node *parse_stmt(parser *P) {
  token *open = expect(P, T_OPEN_STMT, "'{%'");
  token *t = cur(P);
  if (t->type != T_IDENT) parse_fail(P, t, "expected a statement name, found %s", tok_desc(t));
  const char *name = t->s;
  P->i++;
  node *nd;
  enter(P);
  if (!strcmp(name, "set")) {
    nd = mk(P, N_SET, t);
    nd->a = parse_seq(P, false);
    if (is(P, T_EQUALS)) {
      P->i++;
      nd->b = parse_seq(P, false);
    } else {
      expect(P, T_CLOSE_STMT, "'=' or '%}'");
      parse_until(P, &nd->body, (const char *const[]){"endset", NULL}, t, "set");
      P->i++;
      expect_ident(P, "endset");
    }
    expect(P, T_CLOSE_STMT, "'%}'");
  } else if (!strcmp(name, "if")) {
    nd = parse_if(P, t);
    expect(P, T_OPEN_STMT, "'{%'");
    expect_ident(P, "endif");
    expect(P, T_CLOSE_STMT, "'%}'");
  } else if (!strcmp(name, "for")) {
    nd = mk(P, N_FOR, t);
    token *vt = cur(P);
    nd->a = parse_seq(P, true);
    if (nd->a->kind != N_IDENT && nd->a->kind != N_TUPLE) parse_fail(P, vt, "expected a loop variable");
    for (int k = 0; nd->a->kind == N_TUPLE && k < nd->a->args.n; k++)
      if (nd->a->args.v[k]->kind != N_IDENT) parse_fail(P, vt, "expected loop variable names");
    expect_ident(P, "in");
    nd->b = parse_expr(P);
    expect(P, T_CLOSE_STMT, "'%}'");
    parse_until(P, &nd->body, END_FOR, t, "for");
    if (is_stmt(P, (const char *const[]){"else", NULL})) {
      P->i += 2;
      expect(P, T_CLOSE_STMT, "'%}'");
      parse_until(P, &nd->alt, (const char *const[]){"endfor", NULL}, t, "for");
    }
    expect(P, T_OPEN_STMT, "'{%'");
    expect_ident(P, "endfor");
    expect(P, T_CLOSE_STMT, "'%}'");
  } else if (!strcmp(name, "macro")) {
    nd = mk(P, N_MACRO, t);
    token *nt = cur(P);
    nd->a = parse_primary(P);
    if (nd->a->kind != N_IDENT) parse_fail(P, nt, "expected a macro name");
    parse_args(P, &nd->args, true);
    expect(P, T_CLOSE_STMT, "'%}'");
    parse_until(P, &nd->body, (const char *const[]){"endmacro", NULL}, t, "macro");
    P->i++;
    expect_ident(P, "endmacro");
    expect(P, T_CLOSE_STMT, "'%}'");
  } else if (!strcmp(name, "break") || !strcmp(name, "continue")) {
    nd = mk(P, name[0] == 'b' ? N_BREAK : N_CONTINUE, t);
    expect(P, T_CLOSE_STMT, "'%}'");
  } else if (!strcmp(name, "filter")) {
    nd = mk(P, N_FILTER_BLOCK, t);
    token *ft = cur(P);
    nd->b = parse_filter_name(P, ft);
    expect(P, T_CLOSE_STMT, "'%}'");
    parse_until(P, &nd->body, (const char *const[]){"endfilter", NULL}, t, "filter");
    P->i++;
    expect_ident(P, "endfilter");
    expect(P, T_CLOSE_STMT, "'%}'");
  } else if (!strcmp(name, "call")) {
    nd = mk(P, N_CALL_BLOCK, t);
    if (is(P, T_LPAREN)) parse_args(P, &nd->args, true);
    token *ct = cur(P);
    node *callee = parse_primary(P);
    if (callee->kind != N_IDENT) parse_fail(P, ct, "expected a macro name after 'call'");
    node *call = mk(P, N_CALL, ct);
    call->a = callee;
    parse_args(P, &call->args, false);
    nd->a = call;
    expect(P, T_CLOSE_STMT, "'%}'");
    parse_until(P, &nd->body, (const char *const[]){"endcall", NULL}, t, "call");
    P->i++;
    expect_ident(P, "endcall");
    expect(P, T_CLOSE_STMT, "'%}'");
  } else {
    parse_fail(P, t, "unsupported statement '%s'", name);
  }
  (void)open;
  P->depth--;
  return nd;
}

// A text token becomes text nodes and generation markers.
static node *parse_text(parser *P, nlist *into) {
  token *t = cur(P);
  P->i++;
  size_t st = 0;
  for (size_t i = 0; i <= t->n; i++) {
    if (i < t->n && t->s[i] != GEN_START && t->s[i] != GEN_END) continue;
    if (i > st) {
      node *x = mk(P, N_TEXT, t);
      x->s = t->s + st;
      x->n = i - st;
      nl_push(P->a, into, x);
    }
    if (i < t->n) {
      nl_push(P->a, into, mk(P, t->s[i] == GEN_START ? N_GEN_START : N_GEN_END, t));
      P->has_gen = true;
    }
    st = i + 1;
  }
  return NULL;
}

static node *parse_any(parser *P) {
  token *t = cur(P);
  switch (t->type) {
    case T_COMMENT:
      P->i++;
      return NULL;
    case T_TEXT: {
      nlist tmp = {0};
      parse_text(P, &tmp);
      if (tmp.n == 1) return tmp.v[0];
      // several pieces: wrap them in an always-true if with no test
      node *blk = mk(P, N_IF, t);
      blk->a = NULL;
      blk->body = tmp;
      return blk;
    }
    case T_OPEN_STMT:
      return parse_stmt(P);
    case T_OPEN_EXPR: {
      P->i++;
      node *o = mk(P, N_OUTPUT, t);
      o->a = parse_expr(P);
      expect(P, T_CLOSE_EXPR, "'}}'");
      return o;
    }
    default:
      parse_fail(P, t, "unexpected %s", tok_desc(t));
  }
}

struct ct_jinja {
  arena a;
  source S;
  nlist program;
  bool has_gen;
};

int ct_jinja_parse(ct_jinja **out, const char *src, size_t len, const char *where) {
  *out = NULL;
  ct_jinja *tpl = calloc(1, sizeof *tpl);
  if (!tpl) return ct_set_error(CT_ENOMEM, "jinja: out of memory");
  jmp_buf jmp;
  tpl->a.jmp = &jmp;
  if (setjmp(jmp)) {
    int rc = tpl->a.oom ? CT_ENOMEM : CT_EFORMAT;
    ct_jinja_free(tpl);
    return rc;
  }
  char *copy = arena_alloc(&tpl->a, len + 1);
  memcpy(copy, src, len);
  copy[len] = 0;
  char *w = arena_alloc(&tpl->a, strlen(where) + 1);
  strcpy(w, where);
  tpl->S = (source){copy, len, w, NULL};
  if (!ct_utf8_valid(copy, len)) {
    size_t i = 0;
    while (i < len && ct_utf8_next(copy, len, &i) != CT_UC_INVALID) {}
    fail_at(&tpl->S, &jmp, i ? i - 1 : 0, "template is not valid UTF-8");
  }
  pstr pp = preprocess(&tpl->a, copy, len);
  tpl->S.map = pp.map;
  lexer L = {.a = &tpl->a, .S = &tpl->S, .jmp = &jmp, .p = pp.s, .n = pp.n};
  lex(&L);
  parser P = {.a = &tpl->a, .S = &tpl->S, .jmp = &jmp, .t = L.t, .nt = L.nt};
  while (!is(&P, T_EOF)) {
    node *x = parse_any(&P);
    if (x) nl_push(&tpl->a, &tpl->program, x);
  }
  tpl->has_gen = P.has_gen;
  tpl->a.jmp = NULL;
  *out = tpl;
  return 0;
}

void ct_jinja_free(ct_jinja *tpl) {
  if (!tpl) return;
  arena_free(&tpl->a);
  free(tpl);
}

bool ct_jinja_has_generation(const ct_jinja *tpl) { return tpl->has_gen; }

// ===========================================================================
// Values

enum { V_UNDEF, V_NULL, V_BOOL, V_INT, V_FLOAT, V_STR, V_ARRAY, V_OBJECT, V_NS, V_FUNC, V_KWARGS };

typedef struct val val;
typedef struct env env;

typedef struct {
  val **v;
  int n, cap;
  bool tuple;
} arr;

typedef struct {
  const char **k;
  size_t *kn;
  val **v;
  int n, cap;
} obj;

enum { F_METHOD, F_GLOBAL, F_MACRO, F_CALLER };
typedef struct {
  int kind;
  const char *name;  // method or global name
  val *self;         // F_METHOD
  const node *macro; // F_MACRO / F_CALLER (body and params)
  env *defenv;       // F_CALLER: where the call block stood
} fn;

struct val {
  int t;
  union {
    bool b;
    double num;
    struct {
      const char *s;
      size_t n;
    } str;
    arr *a;
    obj *o;
    fn *f;
  };
};

struct env {
  env *parent;
  obj vars;  // this scope's names
};

typedef struct {
  arena *a;
  const source *S;
  jmp_buf jmp;
  sbuf *out;     // current output
  sbuf *top;     // the template's own output
  ct_span *gen;  // generation ranges (arena)
  int ngen, capgen;
  long gen_open;  // start of an open range, -1 if none
  int depth;
  long steps;
} interp;

static val V_UNDEF_ = {.t = V_UNDEF}, V_NULL_ = {.t = V_NULL}, V_TRUE_ = {.t = V_BOOL, .b = true},
           V_FALSE_ = {.t = V_BOOL, .b = false};
#define UNDEF (&V_UNDEF_)
#define NUL (&V_NULL_)

static _Noreturn void rfail(interp *I, const node *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void rfail(interp *I, const node *at, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fail_at(I->S, &I->jmp, at ? at->pos : 0, "%s", msg);
}

static const char *type_name(const val *v) {
  static const char *const names[] = {"an undefined value", "none", "a boolean", "an integer", "a float",
                                      "a string", "a list", "a mapping", "a namespace", "a function",
                                      "keyword arguments"};
  return names[v->t];
}

static val *mkval(interp *I, int t) {
  val *v = arena_alloc(I->a, sizeof *v);
  v->t = t;
  return v;
}
static val *vbool(bool b) { return b ? &V_TRUE_ : &V_FALSE_; }
static val *vnum(interp *I, int t, double x) {
  val *v = mkval(I, t);
  v->num = x;
  return v;
}
static val *vstr(interp *I, const char *s, size_t n) {
  val *v = mkval(I, V_STR);
  v->str.s = s;
  v->str.n = n;
  return v;
}
static val *vstr_sb(interp *I, const sbuf *b) { return b->n ? vstr(I, b->p, b->n) : vstr(I, "", 0); }
static val *varr(interp *I, int cap) {
  val *v = mkval(I, V_ARRAY);
  v->a = arena_zalloc(I->a, sizeof *v->a);
  if (cap) {
    v->a->v = arena_alloc(I->a, sizeof(val *) * (size_t)cap);
    v->a->cap = cap;
  }
  return v;
}
static void arr_push(interp *I, arr *a, val *x) {
  if (a->n == a->cap) {
    int cap = a->cap ? 2 * a->cap : 4;
    val **v = arena_alloc(I->a, sizeof *v * (size_t)cap);
    if (a->n) memcpy(v, a->v, sizeof *v * (size_t)a->n);
    a->v = v;
    a->cap = cap;
  }
  a->v[a->n++] = x;
}
static val *vobj(interp *I, int t) {
  val *v = mkval(I, t);
  v->o = arena_zalloc(I->a, sizeof *v->o);
  return v;
}
static val **obj_slot(const obj *o, const char *k, size_t kn) {
  for (int i = 0; i < o->n; i++)
    if (o->kn[i] == kn && !memcmp(o->k[i], k, kn)) return &o->v[i];
  return NULL;
}
static val *obj_get(const obj *o, const char *k, size_t kn) {
  val **s = obj_slot(o, k, kn);
  return s ? *s : NULL;
}
static void obj_set(interp *I, obj *o, const char *k, size_t kn, val *x) {
  val **s = obj_slot(o, k, kn);
  if (s) {
    *s = x;
    return;
  }
  if (o->n == o->cap) {
    int cap = o->cap ? 2 * o->cap : 8;
    const char **nk = arena_alloc(I->a, sizeof *nk * (size_t)cap);
    size_t *nkn = arena_alloc(I->a, sizeof *nkn * (size_t)cap);
    val **nv = arena_alloc(I->a, sizeof *nv * (size_t)cap);
    if (o->n) {
      memcpy(nk, o->k, sizeof *nk * (size_t)o->n);
      memcpy(nkn, o->kn, sizeof *nkn * (size_t)o->n);
      memcpy(nv, o->v, sizeof *nv * (size_t)o->n);
    }
    o->k = nk;
    o->kn = nkn;
    o->v = nv;
    o->cap = cap;
  }
  o->k[o->n] = k;
  o->kn[o->n] = kn;
  o->v[o->n++] = x;
}
static val *vfn(interp *I, int kind, const char *name, val *self) {
  val *v = mkval(I, V_FUNC);
  v->f = arena_zalloc(I->a, sizeof *v->f);
  v->f->kind = kind;
  v->f->name = name;
  v->f->self = self;
  return v;
}

static val *from_json(interp *I, const json_t *j) {
  switch (json_typeof(j)) {
    case JSON_OBJECT: {
      val *v = vobj(I, V_OBJECT);
      const char *k;
      json_t *x;
      json_object_foreach((json_t *)j, k, x) obj_set(I, v->o, k, strlen(k), from_json(I, x));
      return v;
    }
    case JSON_ARRAY: {
      val *v = varr(I, (int)json_array_size(j));
      for (size_t i = 0; i < json_array_size(j); i++) arr_push(I, v->a, from_json(I, json_array_get(j, i)));
      return v;
    }
    case JSON_STRING: return vstr(I, json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return vnum(I, V_INT, (double)json_integer_value(j));
    case JSON_REAL: {
      double d = json_real_value(j);
      return vnum(I, d == floor(d) && isfinite(d) ? V_INT : V_FLOAT, d);
    }
    case JSON_TRUE: return vbool(true);
    case JSON_FALSE: return vbool(false);
    default: return NUL;
  }
}

static bool truthy(const val *v) {
  switch (v->t) {
    case V_BOOL: return v->b;
    case V_INT: case V_FLOAT: return v->num != 0 && !isnan(v->num);
    case V_STR: return v->str.n > 0;
    case V_ARRAY: return v->a->n > 0;
    case V_OBJECT: case V_KWARGS: return v->o->n > 0;
    case V_NS: case V_FUNC: return true;
    default: return false;
  }
}

// JavaScript's Number.prototype.toString().
static void js_number(interp *I, sbuf *b, double d) {
  char buf[64];
  if (isnan(d)) {
    sb_puts(I->a, b, "NaN");
    return;
  }
  if (isinf(d)) {
    sb_puts(I->a, b, d < 0 ? "-Infinity" : "Infinity");
    return;
  }
  if (d == 0) {
    sb_puts(I->a, b, "0");
    return;
  }
  if (d < 0) {
    sb_putc(I->a, b, '-');
    d = -d;
  }
  int p;
  for (p = 1; p <= 17; p++) {
    snprintf(buf, sizeof buf, "%.*e", p - 1, d);
    if (strtod(buf, NULL) == d) break;
  }
  // buf = "D.DDDDe[+-]XX": digits and decimal exponent
  char digits[32];
  int k = 0;
  const char *q = buf;
  for (; *q && *q != 'e'; q++)
    if (*q != '.') digits[k++] = *q;
  int e = atoi(q + 1), n = e + 1;
  while (k > 1 && digits[k - 1] == '0') k--;
  if (k <= n && n <= 21) {
    sb_put(I->a, b, digits, (size_t)k);
    for (int z = 0; z < n - k; z++) sb_putc(I->a, b, '0');
  } else if (0 < n && n <= 21) {
    sb_put(I->a, b, digits, (size_t)n);
    sb_putc(I->a, b, '.');
    sb_put(I->a, b, digits + n, (size_t)(k - n));
  } else if (-6 < n && n <= 0) {
    sb_puts(I->a, b, "0.");
    for (int z = 0; z < -n; z++) sb_putc(I->a, b, '0');
    sb_put(I->a, b, digits, (size_t)k);
  } else {
    sb_putc(I->a, b, digits[0]);
    if (k > 1) {
      sb_putc(I->a, b, '.');
      sb_put(I->a, b, digits + 1, (size_t)(k - 1));
    }
    snprintf(buf, sizeof buf, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
    sb_puts(I->a, b, buf);
  }
}

typedef struct {
  int indent;  // 0: none
  bool ascii, sort;
  const char *item_sep, *key_sep;
  size_t item_n, key_n;
} json_opts;

static void json_str(interp *I, sbuf *b, const char *s, size_t n, bool ascii) {
  sb_putc(I->a, b, '"');
  for (size_t i = 0; i < n;) {
    unsigned char c = (unsigned char)s[i];
    char esc[16];
    if (c == '"' || c == '\\') {
      esc[0] = '\\';
      esc[1] = (char)c;
      sb_put(I->a, b, esc, 2);
      i++;
    } else if (c < 0x20) {
      const char *e = c == '\b' ? "\\b" : c == '\f' ? "\\f" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
      if (e) sb_puts(I->a, b, e);
      else {
        snprintf(esc, sizeof esc, "\\u%04x", c);
        sb_puts(I->a, b, esc);
      }
      i++;
    } else if (ascii && c >= 0x7F) {
      size_t j = i;
      uint32_t cp = ct_utf8_next(s, n, &j);
      if (cp == CT_UC_INVALID) cp = 0xFFFD;
      if (cp >= 0x10000) {
        cp -= 0x10000;
        snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        snprintf(esc, sizeof esc, "\\u%04x", cp);
      }
      sb_puts(I->a, b, esc);
      i = j;
    } else {
      sb_putc(I->a, b, (char)c);
      i++;
    }
  }
  sb_putc(I->a, b, '"');
}

// An approximation of JavaScript's localeCompare (ICU root collation), which sort_keys
// uses: punctuation and symbols before digits before letters; letters by base letter
// ignoring case and accents first, then accents, then lower case before upper case.
static uint64_t collation_key(uint32_t cp, int level) {
  int cat = ct_uc_category(cp);
  uint32_t cls = (cat >= CT_UC_Nd && cat <= CT_UC_No) ? 1 : (cat >= CT_UC_Lu && cat <= CT_UC_Lo) ? 2 : 0;
  if (cls == 2 && level == 0) cp = ct_uc_lower(ct_uc_base(cp));
  else if (cls == 2 && level == 1) cp = ct_uc_lower(cp);
  else if (cls == 2 && level == 2) cp = ct_uc_upper(cp) == cp && ct_uc_lower(cp) != cp ? 1 : 0;
  return ((uint64_t)cls << 32) | cp;
}

static int key_cmp(const char *a, size_t an, const char *b, size_t bn) {
  for (int level = 0; level < 3; level++) {
    size_t i = 0, j = 0;
    while (i < an && j < bn) {
      uint64_t x = collation_key(ct_utf8_next(a, an, &i), level), y = collation_key(ct_utf8_next(b, bn, &j), level);
      if (x != y) return x < y ? -1 : 1;
    }
    if (i < an || j < bn) return i < an ? 1 : -1;
  }
  return 0;
}

static void to_json(interp *I, sbuf *b, const val *v, const json_opts *o, int depth, bool undef_null, const node *at) {
  if (++I->depth > 500) rfail(I, at, "value nested too deeply for tojson");
  switch (v->t) {
    case V_NULL: sb_puts(I->a, b, "null"); break;
    case V_UNDEF: sb_puts(I->a, b, undef_null ? "null" : "undefined"); break;
    case V_BOOL: sb_puts(I->a, b, v->b ? "true" : "false"); break;
    case V_INT: case V_FLOAT:
      if (!isfinite(v->num)) sb_puts(I->a, b, "null");
      else js_number(I, b, v->num);
      break;
    case V_STR: json_str(I, b, v->str.s, v->str.n, o->ascii); break;
    case V_ARRAY: {
      const arr *a = v->a;
      if (a->tuple) rfail(I, at, "cannot convert a tuple to JSON");
      sb_putc(I->a, b, '[');
      for (int i = 0; i < a->n; i++) {
        if (i) sb_put(I->a, b, o->item_sep, o->item_n);
        if (o->indent) {
          sb_putc(I->a, b, '\n');
          for (int s = 0; s < o->indent * (depth + 1); s++) sb_putc(I->a, b, ' ');
        }
        to_json(I, b, a->v[i], o, depth + 1, undef_null, at);
      }
      if (o->indent && a->n) {
        sb_putc(I->a, b, '\n');
        for (int s = 0; s < o->indent * depth; s++) sb_putc(I->a, b, ' ');
      }
      sb_putc(I->a, b, ']');
      break;
    }
    case V_OBJECT: case V_NS: case V_KWARGS: {
      const obj *ob = v->o;
      int *order = arena_alloc(I->a, sizeof(int) * (size_t)(ob->n + 1));
      for (int i = 0; i < ob->n; i++) order[i] = i;
      if (o->sort)
        for (int i = 1; i < ob->n; i++)
          for (int j = i; j > 0 && key_cmp(ob->k[order[j - 1]], ob->kn[order[j - 1]], ob->k[order[j]], ob->kn[order[j]]) > 0; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
          }
      sb_putc(I->a, b, '{');
      for (int i = 0; i < ob->n; i++) {
        int k = order[i];
        if (i) sb_put(I->a, b, o->item_sep, o->item_n);
        if (o->indent) {
          sb_putc(I->a, b, '\n');
          for (int s = 0; s < o->indent * (depth + 1); s++) sb_putc(I->a, b, ' ');
        }
        json_str(I, b, ob->k[k], ob->kn[k], o->ascii);
        sb_put(I->a, b, o->key_sep, o->key_n);
        to_json(I, b, ob->v[k], o, depth + 1, undef_null, at);
      }
      if (o->indent && ob->n) {
        sb_putc(I->a, b, '\n');
        for (int s = 0; s < o->indent * depth; s++) sb_putc(I->a, b, ' ');
      }
      sb_putc(I->a, b, '}');
      break;
    }
    default: rfail(I, at, "cannot convert %s to JSON", type_name(v));
  }
  I->depth--;
}

static const json_opts default_json = {0, false, false, ", ", ": ", 2, 2};

// String form of a value as rendered by {{ }} (RuntimeValue.toString).
static void to_str(interp *I, sbuf *b, const val *v, const node *at) {
  switch (v->t) {
    case V_STR: sb_put(I->a, b, v->str.s, v->str.n); break;
    case V_INT: js_number(I, b, v->num); break;
    case V_FLOAT:
      if (v->num == 0 && signbit(v->num)) sb_puts(I->a, b, "-0.0");
      else if (isfinite(v->num) && v->num == floor(v->num) && fabs(v->num) < 1e21) {
        js_number(I, b, v->num);
        sb_puts(I->a, b, ".0");
      } else js_number(I, b, v->num);
      break;
    case V_BOOL: sb_puts(I->a, b, v->b ? "true" : "false"); break;
    case V_NULL: sb_puts(I->a, b, "null"); break;
    case V_UNDEF: sb_puts(I->a, b, "undefined"); break;
    case V_ARRAY: case V_OBJECT: case V_NS: case V_KWARGS: to_json(I, b, v, &default_json, 0, false, at); break;
    case V_FUNC: sb_puts(I->a, b, "[function]"); break;
  }
}

// JavaScript's String(x.value) — what `+` and `~` concatenate.
static void raw_str(interp *I, sbuf *b, const val *v, const node *at) {
  switch (v->t) {
    case V_INT: case V_FLOAT: js_number(I, b, v->num); break;
    case V_ARRAY:
      for (int i = 0; i < v->a->n; i++) {
        if (i) sb_putc(I->a, b, ',');
        to_str(I, b, v->a->v[i], at);
      }
      break;
    case V_OBJECT: case V_NS: case V_KWARGS: sb_puts(I->a, b, "[object Map]"); break;
    default: to_str(I, b, v, at);
  }
}

static val *str_of(interp *I, const val *v, const node *at) {
  if (v->t == V_STR) return (val *)v;
  sbuf b = {0};
  to_str(I, &b, v, at);
  return vstr_sb(I, &b);
}

// JavaScript's loose equality (==) on the underlying values.
static double js_to_number(const val *v) {
  if (v->t == V_BOOL) return v->b ? 1 : 0;
  if (v->t == V_INT || v->t == V_FLOAT) return v->num;
  if (v->t == V_NULL) return 0;
  if (v->t == V_STR) {
    const char *s = v->str.s;
    size_t n = v->str.n, i = 0;
    while (i < n && js_space((unsigned char)s[i])) i++;
    while (n > i && js_space((unsigned char)s[n - 1])) n--;
    if (i == n) return 0;
    char buf[64];
    if (n - i >= sizeof buf) return NAN;
    memcpy(buf, s + i, n - i);
    buf[n - i] = 0;
    char *end;
    double d = strtod(buf, &end);
    return *end ? NAN : d;
  }
  return NAN;
}

static bool loose_eq(const val *a, const val *b) {
  bool an = a->t == V_NULL || a->t == V_UNDEF, bn = b->t == V_NULL || b->t == V_UNDEF;
  if (an || bn) return an && bn;
  bool aprim = a->t <= V_STR, bprim = b->t <= V_STR;
  if (!aprim || !bprim) return a == b || (a->t == b->t && a->t == V_ARRAY && a->a == b->a) ||
                               (a->t == b->t && (a->t == V_OBJECT || a->t == V_NS) && a->o == b->o);
  if (a->t == V_STR && b->t == V_STR) return a->str.n == b->str.n && !memcmp(a->str.s, b->str.s, a->str.n);
  return js_to_number(a) == js_to_number(b);
}

// JavaScript's === on the underlying values (list membership).
static bool strict_eq(const val *a, const val *b) {
  bool anum = a->t == V_INT || a->t == V_FLOAT, bnum = b->t == V_INT || b->t == V_FLOAT;
  if (anum || bnum) return anum && bnum && a->num == b->num;
  if (a->t != b->t) return false;
  switch (a->t) {
    case V_NULL: case V_UNDEF: return true;
    case V_BOOL: return a->b == b->b;
    case V_STR: return a->str.n == b->str.n && !memcmp(a->str.s, b->str.s, a->str.n);
    case V_ARRAY: return a->a == b->a;
    case V_OBJECT: case V_NS: case V_KWARGS: return a->o == b->o;
    default: return a == b;
  }
}

// ===========================================================================
// Environments

static env *env_new(interp *I, env *parent) {
  env *e = arena_zalloc(I->a, sizeof *e);
  e->parent = parent;
  return e;
}

static void env_set(interp *I, env *e, const char *k, size_t kn, val *v) { obj_set(I, &e->vars, k, kn, v); }

// The innermost scope's value of a name, or UNDEF.
static val *env_get(const env *e, const char *k, size_t kn) {
  for (; e; e = e->parent) {
    val **slot = obj_slot(&e->vars, k, kn);
    if (slot) return *slot;
  }
  return UNDEF;
}

// ===========================================================================
// String helpers (JavaScript semantics where the reference uses them)

static bool str_eq(const val *v, const char *s) { return v->t == V_STR && v->str.n == strlen(s) && !memcmp(v->str.s, s, v->str.n); }

static val *js_trim(interp *I, const val *v, bool left, bool right) {
  const char *s = v->str.s;
  size_t a = 0, b = v->str.n, k;
  if (left)
    while ((k = space_at(s, b, a))) a += k;
  if (right)
    while (b > a && (k = space_before(s, b))) b -= k;
  return vstr(I, s + a, b - a);
}

static bool in_set(uint32_t cp, const val *chars) {
  for (size_t i = 0; i < chars->str.n;)
    if (ct_utf8_next(chars->str.s, chars->str.n, &i) == cp) return true;
  return false;
}

static val *py_strip(interp *I, const val *v, const val *chars, bool left, bool right) {
  const char *s = v->str.s;
  size_t a = 0, b = v->str.n;
  if (left)
    while (a < b) {
      size_t j = a;
      if (!in_set(ct_utf8_next(s, b, &j), chars)) break;
      a = j;
    }
  if (right)
    while (b > a) {
      size_t j = ct_utf8_prev(s, a, b), q = j;
      if (!in_set(ct_utf8_next(s, b, &q), chars)) break;
      b = j;
    }
  return vstr(I, s + a, b - a);
}

static val *map_case(interp *I, const val *v, int mode) {  // 0 upper, 1 lower
  sbuf b = {0};
  const char *s = v->str.s;
  size_t n = v->str.n;
  for (size_t i = 0; i < n;) {
    size_t st = i;
    uint32_t cp = ct_utf8_next(s, n, &i);
    if (cp == CT_UC_INVALID) {
      sb_put(I->a, &b, s + st, 1);
      continue;
    }
    if (mode == 0 && cp == 0xDF) {  // ß -> SS
      sb_puts(I->a, &b, "SS");
      continue;
    }
    char u[4];
    sb_put(I->a, &b, u, (size_t)ct_utf8_put(u, mode == 0 ? ct_uc_upper(cp) : ct_uc_lower(cp)));
  }
  return vstr_sb(I, &b);
}

static size_t utf16_len(const val *v) {
  size_t n = 0;
  for (size_t i = 0; i < v->str.n;) n += ct_utf8_next(v->str.s, v->str.n, &i) >= 0x10000 ? 2 : 1;
  return n;
}

// Code points of a string as an array of one-character strings.
static val *chars_of(interp *I, const val *v) {
  val *out = varr(I, 0);
  for (size_t i = 0; i < v->str.n;) {
    size_t st = i;
    ct_utf8_next(v->str.s, v->str.n, &i);
    arr_push(I, out->a, vstr(I, v->str.s + st, i - st));
  }
  return out;
}

static const char *find_sub(const char *h, size_t hn, const char *nd, size_t nn) {
  if (nn == 0) return h;
  if (nn > hn) return NULL;
  for (size_t i = 0; i + nn <= hn; i++)
    if (h[i] == nd[0] && !memcmp(h + i, nd, nn)) return h + i;
  return NULL;
}

// ===========================================================================
// Interpreter

static val *eval(interp *I, const node *x, env *e);
static int exec_block(interp *I, const nlist *body, env *e);  // 0, or BREAK/CONTINUE
enum { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE };

typedef struct {
  val **pos;
  int npos;
  obj *kw;  // may be NULL
} args_t;

static args_t eval_args(interp *I, const nlist *args, env *e) {
  args_t r = {arena_alloc(I->a, sizeof(val *) * (size_t)(args->n + 1)), 0, NULL};
  int cap = args->n + 1;
  for (int i = 0; i < args->n; i++) {
    const node *a = args->v[i];
    if (a->kind == N_SPREAD) {
      val *v = eval(I, a->a, e);
      if (v->t != V_ARRAY) rfail(I, a, "cannot unpack %s with '*'", type_name(v));
      val **np = arena_alloc(I->a, sizeof(val *) * (size_t)(cap + v->a->n));
      memcpy(np, r.pos, sizeof(val *) * (size_t)r.npos);
      r.pos = np;
      cap += v->a->n;
      for (int k = 0; k < v->a->n; k++) r.pos[r.npos++] = v->a->v[k];
    } else if (a->kind != N_KWARG && a->kind != N_KWSPREAD) {
      r.pos[r.npos++] = eval(I, a, e);
    }
  }
  for (int i = 0; i < args->n; i++) {
    const node *a = args->v[i];
    if (a->kind == N_KWARG || a->kind == N_KWSPREAD) {
      if (!r.kw) r.kw = vobj(I, V_KWARGS)->o;
      if (a->kind == N_KWARG) {
        if (obj_get(r.kw, a->s, a->n)) rfail(I, a, "got multiple values for keyword argument '%s'", a->s);
        obj_set(I, r.kw, a->s, a->n, eval(I, a->a, e));
      } else {
        val *v = eval(I, a->a, e);
        if (v->t != V_OBJECT) rfail(I, a, "argument after ** must be a mapping, not %s", type_name(v));
        for (int k = 0; k < v->o->n; k++) obj_set(I, r.kw, v->o->k[k], v->o->kn[k], v->o->v[k]);
      }
    }
  }
  return r;
}

static val *kwarg(const args_t *a, const char *name) { return a->kw ? obj_get(a->kw, name, strlen(name)) : NULL; }
static val *arg_or(const args_t *a, int i, const char *name, val *dflt) {
  if (i >= 0 && i < a->npos) return a->pos[i];
  val *k = name ? kwarg(a, name) : NULL;
  return k ? k : dflt;
}

// A V_INT's number as a C integer, clamped (integers are doubles here: a template can
// compute 1e86 as an "integer"; the cast of an out-of-range double is undefined).
static long as_long(double x) {
  return x != x ? 0 : x >= 9.2e18 ? 9200000000000000000L : x <= -9.2e18 ? -9200000000000000000L : (long)x;
}
static int as_int(double x) { return x >= 2147483647.0 ? 2147483647 : x <= -2147483647.0 ? -2147483647 : (int)as_long(x); }

// Python-style slicing (utils.slice of @huggingface/jinja).
static void slice_bounds(int len, const val *start, const val *stop, const val *step, int *s0, int *s1, int *st) {
  int stp = step->t == V_INT ? as_int(step->num) : 1;
  *st = stp;
  if (stp >= 0) {
    int a = start->t == V_INT ? as_int(start->num) : 0, b = stop->t == V_INT ? as_int(stop->num) : len;
    *s0 = a < 0 ? (len + a > 0 ? len + a : 0) : (a < len ? a : len);
    *s1 = b < 0 ? (len + b > 0 ? len + b : 0) : (b < len ? b : len);
  } else {
    int a = start->t == V_INT ? as_int(start->num) : len - 1, b = stop->t == V_INT ? as_int(stop->num) : -1;
    *s0 = a < 0 ? (len + a > -1 ? len + a : -1) : (a < len - 1 ? a : len - 1);
    *s1 = b < -1 ? (len + b > -1 ? len + b : -1) : (b < len - 1 ? b : len - 1);
  }
}

static val *do_slice(interp *I, const node *x, val *objv, const node *sl, env *e) {
  if (objv->t != V_ARRAY && objv->t != V_STR) rfail(I, x, "only lists and strings can be sliced, not %s", type_name(objv));
  val *parts[3];
  const node *pn[3] = {sl->a, sl->b, sl->c};
  for (int k = 0; k < 3; k++) {
    parts[k] = pn[k] ? eval(I, pn[k], e) : UNDEF;
    if (parts[k]->t != V_INT && parts[k]->t != V_UNDEF) rfail(I, x, "slice indices must be integers");
  }
  if (parts[2]->t == V_INT && parts[2]->num == 0) rfail(I, x, "slice step cannot be zero");
  val *src = objv->t == V_STR ? chars_of(I, objv) : objv;
  int s0, s1, st;
  slice_bounds(src->a->n, parts[0], parts[1], parts[2], &s0, &s1, &st);
  val *out = varr(I, 0);
  int dir = st > 0 ? 1 : -1;
  for (int i = s0; dir * i < dir * s1; i += st) arr_push(I, out->a, src->a->v[i]);
  if (objv->t == V_ARRAY) return out;
  sbuf b = {0};
  sb_put(I->a, &b, "", 0);
  for (int i = 0; i < out->a->n; i++) sb_put(I->a, &b, out->a->v[i]->str.s, out->a->v[i]->str.n);
  return vstr_sb(I, &b);
}

static const char *const str_methods[] = {"upper", "lower", "strip", "title", "capitalize", "rstrip",
                                          "lstrip", "startswith", "endswith", "split", "replace", NULL};
static const char *const obj_methods[] = {"get", "items", "keys", "values", "dictsort", NULL};

static bool in_list(const char *const *l, const char *s, size_t n) {
  for (; *l; l++)
    if (strlen(*l) == n && !memcmp(*l, s, n)) return true;
  return false;
}

static val *member(interp *I, const node *x, val *o, val *prop) {
  if (o->t == V_OBJECT || o->t == V_NS || o->t == V_KWARGS) {
    if (prop->t != V_STR) rfail(I, x, "cannot access a mapping with %s key", type_name(prop));
    val *v = obj_get(o->o, prop->str.s, prop->str.n);
    if (v) return v;
    if (o->t != V_NS && in_list(obj_methods, prop->str.s, prop->str.n)) return vfn(I, F_METHOD, prop->str.s, o);
    return UNDEF;
  }
  if (o->t == V_ARRAY || o->t == V_STR) {
    if (prop->t == V_INT) {
      long i = as_long(prop->num);
      if (o->t == V_ARRAY) {
        long n = o->a->n;
        if (i < 0) i += n;
        return i >= 0 && i < n ? o->a->v[i] : UNDEF;
      }
      val *cs = chars_of(I, o);
      long n = cs->a->n;
      if (i < 0) i += n;
      return i >= 0 && i < n ? cs->a->v[i] : UNDEF;
    }
    if (prop->t == V_STR) {
      if (prop->str.n == 6 && !memcmp(prop->str.s, "length", 6))
        return vnum(I, V_INT, o->t == V_ARRAY ? o->a->n : (double)utf16_len(o));
      if (o->t == V_STR && in_list(str_methods, prop->str.s, prop->str.n)) return vfn(I, F_METHOD, prop->str.s, o);
      return UNDEF;
    }
    rfail(I, x, "cannot index %s with %s", type_name(o), type_name(prop));
  }
  if (prop->t != V_STR) rfail(I, x, "cannot access an attribute of %s with %s", type_name(o), type_name(prop));
  return UNDEF;
}

static val *call_value(interp *I, const node *x, val *fnv, args_t *a, env *e);

static val *str_method(interp *I, const node *x, const char *name, val *self, args_t *a) {
  if (!strcmp(name, "upper")) return map_case(I, self, 0);
  if (!strcmp(name, "lower")) return map_case(I, self, 1);
  if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
    bool l = name[0] != 'r', r = name[0] != 'l';
    val *chars = a->npos ? a->pos[0] : NULL;
    if (chars && chars->t == V_STR) return py_strip(I, self, chars, l, r);
    if (chars && chars->t != V_NULL && chars->t != V_UNDEF) rfail(I, x, "%s() argument must be a string or none", name);
    return js_trim(I, self, l, r);
  }
  if (!strcmp(name, "title")) {
    sbuf b = {0};
    sb_put(I->a, &b, "", 0);
    for (size_t i = 0; i < self->str.n; i++) {
      char c = self->str.s[i];
      bool start = is_word(c) && (i == 0 || !is_word(self->str.s[i - 1]));
      sb_putc(I->a, &b, start && c >= 'a' && c <= 'z' ? (char)(c - 32) : c);
    }
    return vstr_sb(I, &b);
  }
  if (!strcmp(name, "capitalize")) {
    if (!self->str.n) return self;
    size_t i = 0;
    uint32_t cp = ct_utf8_next(self->str.s, self->str.n, &i);
    sbuf b = {0};
    char u[4];
    if (cp == CT_UC_INVALID) sb_put(I->a, &b, self->str.s, 1);
    else sb_put(I->a, &b, u, (size_t)ct_utf8_put(u, ct_uc_upper(cp)));
    sb_put(I->a, &b, self->str.s + i, self->str.n - i);
    return vstr_sb(I, &b);
  }
  if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
    bool sw = name[0] == 's';
    if (!a->npos) rfail(I, x, "%s() requires an argument", name);
    val *p = a->pos[0];
    int n = p->t == V_ARRAY ? p->a->n : 1;
    for (int k = 0; k < n; k++) {
      val *q = p->t == V_ARRAY ? p->a->v[k] : p;
      if (q->t != V_STR) rfail(I, x, "%s() argument must be a string or a tuple of strings", name);
      if (q->str.n <= self->str.n &&
          !memcmp(self->str.s + (sw ? 0 : self->str.n - q->str.n), q->str.s, q->str.n))
        return vbool(true);
    }
    return vbool(false);
  }
  if (!strcmp(name, "split")) {
    val *sep = arg_or(a, 0, NULL, NUL), *maxv = arg_or(a, 1, NULL, NULL);
    if (sep->t != V_STR && sep->t != V_NULL) rfail(I, x, "split() separator must be a string or none");
    if (maxv && maxv->t != V_INT) rfail(I, x, "split() maxsplit must be an integer");
    long maxsplit = maxv ? as_long(maxv->num) : -1;
    val *out = varr(I, 0);
    const char *s = self->str.s;
    size_t n = self->str.n;
    if (sep->t == V_NULL) {
      size_t i = 0, k;
      while ((k = space_at(s, n, i))) i += k;
      while (i < n) {
        size_t st = i;
        if (maxsplit != -1 && out->a->n >= maxsplit) {
          arr_push(I, out->a, vstr(I, s + st, n - st));
          break;
        }
        while (i < n && !space_at(s, n, i)) {
          size_t q = i;
          ct_utf8_next(s, n, &q);
          i = q;
        }
        arr_push(I, out->a, vstr(I, s + st, i - st));
        while ((k = space_at(s, n, i))) i += k;
      }
      return out;
    }
    if (sep->str.n == 0) rfail(I, x, "empty separator");
    size_t i = 0;
    for (;;) {
      const char *hit = (maxsplit == -1 || out->a->n < maxsplit) ? find_sub(s + i, n - i, sep->str.s, sep->str.n) : NULL;
      if (!hit) {
        arr_push(I, out->a, vstr(I, s + i, n - i));
        break;
      }
      arr_push(I, out->a, vstr(I, s + i, (size_t)(hit - (s + i))));
      i = (size_t)(hit - s) + sep->str.n;
    }
    return out;
  }
  if (!strcmp(name, "replace")) {
    if (a->npos < 2) rfail(I, x, "replace() requires two arguments");
    val *ov = a->pos[0], *nv = a->pos[1];
    if (ov->t != V_STR || nv->t != V_STR) rfail(I, x, "replace() arguments must be strings");
    val *cnt = arg_or(a, 2, "count", NUL);
    if (cnt->t != V_INT && cnt->t != V_NULL) rfail(I, x, "replace() count must be an integer or none");
    long left = cnt->t == V_INT && cnt->num >= 0 ? as_long(cnt->num) : -1;
    if (left == 0) return self;
    sbuf b = {0};
    sb_put(I->a, &b, "", 0);
    const char *s = self->str.s;
    size_t n = self->str.n, i = 0;
    if (ov->str.n == 0) {  // insert between code points, as (?=) matches
      for (;;) {
        if (left != 0) {
          sb_put(I->a, &b, nv->str.s, nv->str.n);
          if (left > 0) left--;
        }
        if (i >= n) break;
        size_t q = i;
        ct_utf8_next(s, n, &q);
        sb_put(I->a, &b, s + i, q - i);
        i = q;
      }
      return vstr_sb(I, &b);
    }
    for (;;) {
      const char *hit = left != 0 ? find_sub(s + i, n - i, ov->str.s, ov->str.n) : NULL;
      if (!hit) {
        sb_put(I->a, &b, s + i, n - i);
        break;
      }
      sb_put(I->a, &b, s + i, (size_t)(hit - (s + i)));
      sb_put(I->a, &b, nv->str.s, nv->str.n);
      i = (size_t)(hit - s) + ov->str.n;
      if (left > 0) left--;
    }
    return vstr_sb(I, &b);
  }
  rfail(I, x, "unknown string method '%s'", name);
}

static int cmp_values(interp *I, const node *x, const val *a, const val *b, bool case_sensitive) {
  if (a->t == V_NULL && b->t == V_NULL) return 0;
  if (a->t == V_UNDEF && b->t == V_UNDEF) return 0;
  bool an = a->t == V_INT || a->t == V_FLOAT || a->t == V_BOOL, bn = b->t == V_INT || b->t == V_FLOAT || b->t == V_BOOL;
  if (an && bn) {
    double p = js_to_number(a), q = js_to_number(b);
    return p < q ? -1 : p > q ? 1 : 0;
  }
  if (a->t != b->t || a->t != V_STR) rfail(I, x, "cannot compare %s with %s", type_name(a), type_name(b));
  val *p = case_sensitive ? (val *)a : map_case(I, a, 1), *q = case_sensitive ? (val *)b : map_case(I, b, 1);
  size_t n = p->str.n < q->str.n ? p->str.n : q->str.n;
  int c = memcmp(p->str.s, q->str.s, n);
  if (c) return c < 0 ? -1 : 1;
  return p->str.n < q->str.n ? -1 : p->str.n > q->str.n ? 1 : 0;
}

static val *obj_items(interp *I, const obj *o) {
  val *out = varr(I, o->n);
  for (int i = 0; i < o->n; i++) {
    val *pair = varr(I, 2);
    arr_push(I, pair->a, vstr(I, o->k[i], o->kn[i]));
    arr_push(I, pair->a, o->v[i]);
    arr_push(I, out->a, pair);
  }
  return out;
}

static void sort_vals(interp *I, const node *x, val **v, int n, val **keys, bool cs, bool rev) {
  for (int i = 1; i < n; i++)  // stable insertion sort
    for (int j = i; j > 0; j--) {
      int c = cmp_values(I, x, keys[j - 1], keys[j], cs);
      if (rev) c = -c;
      if (c <= 0) break;
      val *t = v[j]; v[j] = v[j - 1]; v[j - 1] = t;
      t = keys[j]; keys[j] = keys[j - 1]; keys[j - 1] = t;
    }
}

static val *obj_method(interp *I, const node *x, const char *name, val *self, args_t *a) {
  const obj *o = self->o;
  if (!strcmp(name, "get")) {
    val *k = arg_or(a, 0, NULL, UNDEF);
    if (k->t != V_STR) rfail(I, x, "get() key must be a string, not %s", type_name(k));
    val *v = obj_get(o, k->str.s, k->str.n);
    return v ? v : a->npos > 1 ? a->pos[1] : NUL;
  }
  if (!strcmp(name, "items")) return obj_items(I, o);
  if (!strcmp(name, "keys") || !strcmp(name, "values")) {
    val *out = varr(I, o->n);
    for (int i = 0; i < o->n; i++) arr_push(I, out->a, name[0] == 'k' ? vstr(I, o->k[i], o->kn[i]) : o->v[i]);
    return out;
  }
  if (!strcmp(name, "dictsort")) {
    val *cs = arg_or(a, 0, "case_sensitive", vbool(false)), *by = arg_or(a, 1, "by", NULL),
        *rev = arg_or(a, 2, "reverse", vbool(false));
    if (cs->t != V_BOOL || rev->t != V_BOOL) rfail(I, x, "dictsort() flags must be booleans");
    bool by_value = by && str_eq(by, "value");
    if (by && !by_value && !str_eq(by, "key")) rfail(I, x, "dictsort() by must be 'key' or 'value'");
    val *items = obj_items(I, o);
    val **keys = arena_alloc(I->a, sizeof(val *) * (size_t)(items->a->n + 1));
    for (int i = 0; i < items->a->n; i++) keys[i] = items->a->v[i]->a->v[by_value ? 1 : 0];
    sort_vals(I, x, items->a->v, items->a->n, keys, cs->b, rev->b);
    return items;
  }
  rfail(I, x, "unknown mapping method '%s'", name);
}

// strftime_now: %Y %m %d %b %B %H %M %% as the reference implements them.
static val *strftime_now(interp *I, const node *x, const val *fmt) {
  static const char *const mon[] = {"January", "February", "March", "April", "May", "June", "July",
                                    "August", "September", "October", "November", "December"};
  if (fmt->t != V_STR) rfail(I, x, "strftime_now() format must be a string");
  time_t now = time(NULL);
  struct tm tm;
  localtime_r(&now, &tm);
  sbuf b = {0};
  sb_put(I->a, &b, "", 0);
  const char *s = fmt->str.s;
  size_t n = fmt->str.n;
  for (size_t i = 0; i < n; i++) {
    char buf[32];
    if (s[i] == '%' && i + 1 < n && strchr("YmdbBHM%", s[i + 1])) {
      switch (s[++i]) {
        case 'Y': snprintf(buf, sizeof buf, "%d", tm.tm_year + 1900); break;
        case 'm': snprintf(buf, sizeof buf, "%02d", tm.tm_mon + 1); break;
        case 'd': snprintf(buf, sizeof buf, "%02d", tm.tm_mday); break;
        case 'b': snprintf(buf, sizeof buf, "%.3s", mon[tm.tm_mon]); break;
        case 'B': snprintf(buf, sizeof buf, "%s", mon[tm.tm_mon]); break;
        case 'H': snprintf(buf, sizeof buf, "%02d", tm.tm_hour); break;
        case 'M': snprintf(buf, sizeof buf, "%02d", tm.tm_min); break;
        default: snprintf(buf, sizeof buf, "%%"); break;
      }
      sb_puts(I->a, &b, buf);
    } else {
      sb_putc(I->a, &b, s[i]);
    }
  }
  return vstr_sb(I, &b);
}

static bool is_param(const nlist *params, const char *k, size_t kn) {
  for (int i = 0; i < params->n; i++)
    if (params->v[i]->n == kn && !memcmp(params->v[i]->s, k, kn)) return true;
  return false;
}

// Binds a macro's (or call block's) parameters in a new scope under `callenv` and
// renders its body to a string. Extra keyword arguments land in `kwargs`, extra
// positional ones in `varargs`.
static val *call_macro(interp *I, const node *m, args_t *a, env *callenv) {
  env *scope = env_new(I, callenv);
  const nlist *params = &m->args;
  obj *kw = a->kw;
  for (int i = 0; i < params->n; i++) {
    const node *p = params->v[i];
    val *v = i < a->npos ? a->pos[i] : kw ? obj_get(kw, p->s, p->n) : NULL;
    env_set(I, scope, p->s, p->n, v ? v : UNDEF);
  }
  val *kv = vobj(I, V_OBJECT);
  for (int k = 0; kw && k < kw->n; k++)
    if (!is_param(params, kw->k[k], kw->kn[k])) obj_set(I, kv->o, kw->k[k], kw->kn[k], kw->v[k]);
  env_set(I, scope, "kwargs", 6, kv);
  val *va = varr(I, 0);
  for (int i = params->n; i < a->npos; i++) arr_push(I, va->a, a->pos[i]);
  env_set(I, scope, "varargs", 7, va);
  for (int i = 0; i < params->n; i++) {
    const node *p = params->v[i];
    if (p->kind == N_KWARG && i >= a->npos && !(kw && obj_get(kw, p->s, p->n)))
      env_set(I, scope, p->s, p->n, eval(I, p->a, scope));
  }
  sbuf buf = {0}, *save = I->out;
  sb_put(I->a, &buf, "", 0);
  I->out = &buf;
  exec_block(I, &m->body, scope);
  I->out = save;
  return vstr_sb(I, &buf);
}

static val *call_value(interp *I, const node *x, val *fnv, args_t *a, env *e) {
  if (fnv->t != V_FUNC) rfail(I, x, "cannot call %s (not a function)", type_name(fnv));
  fn *f = fnv->f;
  if (f->kind == F_METHOD) {
    if (f->self->t == V_STR) return str_method(I, x, f->name, f->self, a);
    return obj_method(I, x, f->name, f->self, a);
  }
  if (f->kind == F_MACRO) return call_macro(I, f->macro, a, e);
  if (f->kind == F_CALLER) return call_macro(I, f->macro, a, f->defenv);
  const char *g = f->name;
  if (!strcmp(g, "raise_exception")) {
    val *m = a->npos ? a->pos[0] : UNDEF;
    sbuf b = {0};
    sb_put(I->a, &b, "", 0);
    to_str(I, &b, m, x);
    rfail(I, x, "raise_exception: %s", b.p);
  }
  if (!strcmp(g, "namespace")) {
    if (a->npos > 1) rfail(I, x, "namespace() takes at most one positional argument");
    val *ns = vobj(I, V_NS);
    if (a->npos == 1) {
      val *s = a->pos[0];
      if (s->t == V_OBJECT) {
        for (int k = 0; k < s->o->n; k++) obj_set(I, ns->o, s->o->k[k], s->o->kn[k], s->o->v[k]);
      } else if (s->t == V_ARRAY) {
        for (int k = 0; k < s->a->n; k++) {
          val *pair = s->a->v[k];
          if (pair->t != V_ARRAY || pair->a->n != 2 || pair->a->v[0]->t != V_STR)
            rfail(I, x, "namespace() expects a mapping or a list of [key, value] pairs");
          obj_set(I, ns->o, pair->a->v[0]->str.s, pair->a->v[0]->str.n, pair->a->v[1]);
        }
      } else {
        rfail(I, x, "namespace() argument must be a mapping, not %s", type_name(s));
      }
    }
    for (int k = 0; a->kw && k < a->kw->n; k++) obj_set(I, ns->o, a->kw->k[k], a->kw->kn[k], a->kw->v[k]);
    return ns;
  }
  if (!strcmp(g, "range")) {
    double v[3] = {0, 0, 1};
    if (a->npos < 1 || a->npos > 3) rfail(I, x, "range() takes 1 to 3 arguments");
    for (int k = 0; k < a->npos; k++) {
      if (a->pos[k]->t != V_INT) rfail(I, x, "range() arguments must be integers");
      v[k] = a->pos[k]->num;
    }
    double start = a->npos == 1 ? 0 : v[0], stop = a->npos == 1 ? v[0] : v[1], step = a->npos == 3 ? v[2] : 1;
    if (step == 0) rfail(I, x, "range() step must not be zero");
    if (fabs((stop - start) / step) > 1e6) rfail(I, x, "range() too long");
    val *out = varr(I, 0);
    for (double i = start; step > 0 ? i < stop : i > stop; i += step) arr_push(I, out->a, vnum(I, V_INT, i));
    return out;
  }
  if (!strcmp(g, "strftime_now")) return strftime_now(I, x, a->npos ? a->pos[0] : UNDEF);
  rfail(I, x, "unknown function '%s'", g);
}

static bool run_test(interp *I, const node *x, const char *name, const val *v, const val *arg) {
  if (!strcmp(name, "boolean")) return v->t == V_BOOL;
  if (!strcmp(name, "callable")) return v->t == V_FUNC;
  if (!strcmp(name, "odd") || !strcmp(name, "even")) {
    if (v->t != V_INT) rfail(I, x, "cannot test '%s' on %s", name, type_name(v));
    bool odd = fmod(v->num, 2) != 0;
    return name[0] == 'o' ? odd : !odd;
  }
  if (!strcmp(name, "false")) return v->t == V_BOOL && !v->b;
  if (!strcmp(name, "true")) return v->t == V_BOOL && v->b;
  if (!strcmp(name, "none")) return v->t == V_NULL;
  if (!strcmp(name, "string")) return v->t == V_STR;
  if (!strcmp(name, "number")) return v->t == V_INT || v->t == V_FLOAT;
  if (!strcmp(name, "integer")) return v->t == V_INT;
  if (!strcmp(name, "iterable")) return v->t == V_ARRAY || v->t == V_STR;
  if (!strcmp(name, "mapping")) return v->t == V_OBJECT || v->t == V_KWARGS;
  if (!strcmp(name, "sequence")) return v->t == V_ARRAY || v->t == V_OBJECT || v->t == V_KWARGS || v->t == V_STR;
  if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
    if (v->t != V_STR) return false;
    val *m = map_case(I, v, name[0] == 'l' ? 1 : 0);
    return m->str.n == v->str.n && !memcmp(m->str.s, v->str.s, v->str.n);
  }
  if (!strcmp(name, "defined")) return v->t != V_UNDEF;
  if (!strcmp(name, "undefined")) return v->t == V_UNDEF;
  if (!strcmp(name, "equalto") || !strcmp(name, "eq")) return arg && strict_eq(v, arg);
  rfail(I, x, "unknown test '%s'", name);
}

static bool is_test_name(const char *name) {
  static const char *const t[] = {"boolean", "callable", "odd", "even", "false", "true", "none", "string",
                                  "number", "integer", "iterable", "mapping", "sequence", "lower", "upper",
                                  "defined", "undefined", "equalto", "eq", NULL};
  for (int i = 0; t[i]; i++)
    if (!strcmp(t[i], name)) return true;
  return false;
}

// Nested attribute "a.b.0" (getAttributeValue).
static val *attr_path(interp *I, val *item, const val *path) {
  const char *s = path->str.s;
  size_t n = path->str.n, st = 0;
  val *v = item;
  for (size_t i = 0; i <= n; i++) {
    if (i < n && s[i] != '.') continue;
    if (v->t == V_OBJECT || v->t == V_NS) {
      val *x = obj_get(v->o, s + st, i - st);
      v = x ? x : UNDEF;
    } else if (v->t == V_ARRAY) {
      char buf[32];
      size_t len = i - st < 31 ? i - st : 31;
      memcpy(buf, s + st, len);
      buf[len] = 0;
      char *end;
      long k = strtol(buf, &end, 10);
      if (end == buf || k < 0 || k >= v->a->n) return UNDEF;
      v = v->a->v[k];
    } else {
      return UNDEF;
    }
    st = i + 1;
  }
  (void)I;
  return v;
}

// Filters. One table row per filter, {name, function, flags}: the flags say which forms
// (`x | f`, `x | f(...)`) and which kinds of value a filter takes, and apply_filter
// rejects the rest with one message, so a function only handles what it supports.
// A filter used with parentheses gets its arguments evaluated even when it then fails.

enum {
  FILTER_BARE = 1 << 0,     // may be written without parentheses: `x | upper`
  FILTER_CALL = 1 << 1,     // may be written with them, even empty ones: `x | join(", ")`
  FILTER_ON_LIST = 1 << 2,  // the kinds of value it applies to
  FILTER_ON_STR = 1 << 3,
  FILTER_ON_NUM = 1 << 4,   // int or float
  FILTER_ON_BOOL = 1 << 5,
  FILTER_ON_MAP = 1 << 6,   // object or kwargs (not a namespace)
  FILTER_ON_ANY = 1 << 7,   // any value, none and undefined included: the function checks
};

typedef struct {
  const node *at;      // the filter expression: errors point here
  const char *name;    // as written: several filters share a function
  bool call;           // written with parentheses
  const nlist *argx;   // the argument expressions (selectattr needs them to be literals)
  args_t a;            // the evaluated arguments; empty when !call
} filter_call;

typedef val *filter_fn(interp *I, filter_call *c, val *v);

// The error for a filter that exists but does not take this value or this form.
static _Noreturn void filter_unsupported(interp *I, const filter_call *c, const val *v) {
  const char *kind = v->t == V_ARRAY ? "a list"
                     : v->t == V_STR ? "a string"
                     : v->t == V_INT || v->t == V_FLOAT ? "a number"
                     : v->t == V_OBJECT || v->t == V_KWARGS ? "a mapping"
                                                             : NULL;
  if (kind) rfail(I, c->at, "unsupported filter '%s' on %s", c->name, kind);
  rfail(I, c->at, "cannot apply filter '%s' to %s", c->name, type_name(v));
}

// The FILTER_ON_* bits that admit v.
static int filter_kind(const val *v) {
  switch (v->t) {
    case V_ARRAY: return FILTER_ON_LIST | FILTER_ON_ANY;
    case V_STR: return FILTER_ON_STR | FILTER_ON_ANY;
    case V_INT: case V_FLOAT: return FILTER_ON_NUM | FILTER_ON_ANY;
    case V_BOOL: return FILTER_ON_BOOL | FILTER_ON_ANY;
    case V_OBJECT: case V_KWARGS: return FILTER_ON_MAP | FILTER_ON_ANY;
    default: return FILTER_ON_ANY;
  }
}

// safe (output is never escaped), list of a list, bool of a boolean.
static val *filter_identity(interp *I, filter_call *c, val *v) {
  (void)I, (void)c;
  return v;
}

static val *filter_tojson(interp *I, filter_call *c, val *v) {
  json_opts o = default_json;
  val *ind = kwarg(&c->a, "indent"), *asc = kwarg(&c->a, "ensure_ascii"), *sk = kwarg(&c->a, "sort_keys"),
      *sep = kwarg(&c->a, "separators");
  if (ind && ind->t != V_INT && ind->t != V_NULL) rfail(I, c->at, "tojson indent must be an integer");
  if (asc && asc->t != V_BOOL) rfail(I, c->at, "tojson ensure_ascii must be a boolean");
  if (sk && sk->t != V_BOOL) rfail(I, c->at, "tojson sort_keys must be a boolean");
  if (ind && ind->t == V_INT && ind->num > 0) {
    o.indent = as_int(ind->num);
    o.item_sep = ",";
    o.item_n = 1;
  }
  o.ascii = asc && asc->b;
  o.sort = sk && sk->b;
  if (sep && sep->t != V_NULL) {
    if (sep->t != V_ARRAY || sep->a->n != 2 || sep->a->v[0]->t != V_STR || sep->a->v[1]->t != V_STR)
      rfail(I, c->at, "tojson separators must be two strings");
    o.item_sep = sep->a->v[0]->str.s;
    o.item_n = sep->a->v[0]->str.n;
    o.key_sep = sep->a->v[1]->str.s;
    o.key_n = sep->a->v[1]->str.n;
  }
  sbuf b = {0};
  sb_put(I->a, &b, "", 0);
  to_json(I, &b, v, &o, 0, true, c->at);
  return vstr_sb(I, &b);
}

// default(value="", boolean=false): value when v is undefined, or with boolean when falsy.
static val *filter_default(interp *I, filter_call *c, val *v) {
  val *d = c->a.npos ? c->a.pos[0] : vstr(I, "", 0);
  val *bv = arg_or(&c->a, 1, "boolean", vbool(false));
  if (bv->t != V_BOOL) rfail(I, c->at, "default() flag must be a boolean");
  return v->t == V_UNDEF || (bv->b && !truthy(v)) ? d : v;
}

static val *join_values(interp *I, val *list, const val *sep) {
  sbuf b = {0};
  sb_put(I->a, &b, "", 0);
  for (int i = 0; i < list->a->n; i++) {
    if (i) sb_put(I->a, &b, sep->str.s, sep->str.n);
    val *x = list->a->v[i];
    if (x->t != V_NULL && x->t != V_UNDEF) raw_str(I, &b, x, NULL);
  }
  return vstr_sb(I, &b);
}

// join(separator=""): of a list, or of a string's characters. Checks the value itself
// because the called form names it in a different message.
static val *filter_join(interp *I, filter_call *c, val *v) {
  if (!c->call) {
    if (v->t == V_ARRAY) return join_values(I, v, vstr(I, "", 0));
    if (v->t == V_STR) return v;
    filter_unsupported(I, c, v);
  }
  val *list;
  if (v->t == V_STR) list = chars_of(I, v);
  else if (v->t == V_ARRAY) list = v;
  else rfail(I, c->at, "cannot apply filter 'join' to %s", type_name(v));
  val *sep = arg_or(&c->a, 0, "separator", vstr(I, "", 0));
  if (sep->t != V_STR) rfail(I, c->at, "join() separator must be a string");
  return join_values(I, list, sep);
}

// The number strtol (isint) or strtod reads after JavaScript whitespace in the first 63
// bytes of string s; false when there is none.
static bool leading_number(const val *s, bool isint, double *x) {
  char buf[64];
  size_t n = s->str.n < 63 ? s->str.n : 63;
  memcpy(buf, s->str.s, n);
  buf[n] = 0;
  char *p = buf, *end;
  while (js_space((unsigned char)*p)) p++;
  *x = isint ? (double)strtol(p, &end, 10) : strtod(p, &end);
  return end != p;
}

// int / float. Called, int(default=0) returns a number unchanged and the default for a
// string without one; bare, int floors a number and a string without one gives 0.
// Checks the value itself because the called form names it in a different message.
static val *filter_number(interp *I, filter_call *c, val *v) {
  bool isint = c->name[0] == 'i';
  int t = isint ? V_INT : V_FLOAT;
  double x;
  if (c->call) {
    val *d = arg_or(&c->a, 0, "default", vnum(I, t, 0));
    if (v->t == V_STR) return leading_number(v, isint, &x) ? vnum(I, t, x) : d;
    if (v->t == V_INT || v->t == V_FLOAT) return v;
    if (v->t == V_BOOL) return vnum(I, t, v->b);
    rfail(I, c->at, "cannot apply filter '%s' to %s", c->name, type_name(v));
  }
  if (v->t == V_STR) return vnum(I, t, leading_number(v, isint, &x) ? x : 0);
  if (v->t == V_INT || v->t == V_FLOAT) return isint ? vnum(I, V_INT, floor(v->num)) : vnum(I, V_FLOAT, v->num);
  if (v->t == V_BOOL) return vnum(I, t, v->b);
  filter_unsupported(I, c, v);
}

static val *filter_first(interp *I, filter_call *c, val *v) {
  (void)I, (void)c;
  return v->a->n ? v->a->v[0] : UNDEF;
}

static val *filter_last(interp *I, filter_call *c, val *v) {
  (void)I, (void)c;
  return v->a->n ? v->a->v[v->a->n - 1] : UNDEF;
}

// Of a string, in UTF-16 code units as JavaScript counts.
static val *filter_length(interp *I, filter_call *c, val *v) {
  (void)c;
  if (v->t == V_ARRAY) return vnum(I, V_INT, v->a->n);
  if (v->t == V_STR) return vnum(I, V_INT, (double)utf16_len(v));
  return vnum(I, V_INT, v->o->n);  // a mapping: the table admits nothing else
}

static val *filter_reverse(interp *I, filter_call *c, val *v) {
  (void)c;
  const arr *ar = v->a;
  val *out = varr(I, ar->n);
  for (int i = ar->n - 1; i >= 0; i--) arr_push(I, out->a, ar->v[i]);
  return out;
}

// sort(reverse=false, case_sensitive=false, attribute=none); bare, all take their defaults.
static val *filter_sort(interp *I, filter_call *c, val *v) {
  const arr *ar = v->a;
  val *rev = arg_or(&c->a, 0, "reverse", vbool(false)), *cs = arg_or(&c->a, 1, "case_sensitive", vbool(false)),
      *at = arg_or(&c->a, 2, "attribute", NUL);
  if (rev->t != V_BOOL || cs->t != V_BOOL) rfail(I, c->at, "sort() flags must be booleans");
  if (at->t != V_STR && at->t != V_INT && at->t != V_NULL)
    rfail(I, c->at, "sort() attribute must be a string or integer");
  val *out = varr(I, ar->n);
  val **keys = arena_alloc(I->a, sizeof(val *) * (size_t)(ar->n + 1));
  val *path = at->t == V_INT ? str_of(I, at, c->at) : at;
  for (int i = 0; i < ar->n; i++) {
    arr_push(I, out->a, ar->v[i]);
    keys[i] = at->t == V_NULL ? ar->v[i] : attr_path(I, ar->v[i], path);
  }
  sort_vals(I, c->at, out->a->v, ar->n, keys, cs->b, rev->b);
  return out;
}

// A list renders as JSON, a boolean as true/false.
static val *filter_string(interp *I, filter_call *c, val *v) {
  if (v->t == V_ARRAY) {
    sbuf b = {0};
    sb_put(I->a, &b, "", 0);
    to_json(I, &b, v, &default_json, 0, false, c->at);
    return vstr_sb(I, &b);
  }
  if (v->t == V_STR) return v;
  if (v->t == V_BOOL) return vstr(I, v->b ? "true" : "false", v->b ? 4 : 5);
  return str_of(I, v, c->at);  // a number: the table admits nothing else
}

// Keeps the first of strictly equal items, in order.
static val *filter_unique(interp *I, filter_call *c, val *v) {
  (void)c;
  const arr *ar = v->a;
  val *out = varr(I, 0);
  for (int i = 0; i < ar->n; i++) {
    bool seen = false;
    for (int k = 0; k < out->a->n && !seen; k++) seen = strict_eq(out->a->v[k], ar->v[i]);
    if (!seen) arr_push(I, out->a, ar->v[i]);
  }
  return out;
}

// selectattr / rejectattr(attribute, test=truthy, argument) over a list of mappings.
static val *filter_select(interp *I, filter_call *c, val *v) {
  const arr *ar = v->a;
  const char *name = c->name;
  bool sel = name[0] == 's';
  for (int i = 0; i < ar->n; i++)
    if (ar->v[i]->t != V_OBJECT && ar->v[i]->t != V_NS)
      rfail(I, c->at, "'%s' can only be applied to a list of mappings", name);
  for (int i = 0; i < c->argx->n; i++)
    if (c->argx->v[i]->kind != N_STR) rfail(I, c->at, "arguments of '%s' must be string literals", name);
  val *attr = c->a.npos > 0 ? c->a.pos[0] : NULL, *test = c->a.npos > 1 ? c->a.pos[1] : NULL,
      *cmp = c->a.npos > 2 ? c->a.pos[2] : NULL;
  if (!attr) rfail(I, c->at, "'%s' needs an attribute name", name);
  if (test && !is_test_name(test->str.s)) rfail(I, c->at, "unknown test '%s'", test->str.s);
  val *out = varr(I, 0);
  for (int i = 0; i < ar->n; i++) {
    val *x = obj_get(ar->v[i]->o, attr->str.s, attr->str.n);
    bool r = x ? (test ? run_test(I, c->at, test->str.s, x, cmp) : truthy(x)) : false;
    if (r == sel) arr_push(I, out->a, ar->v[i]);
  }
  return out;
}

// map(attribute=path, default=undefined); mapping a filter over the list is not supported.
static val *filter_map(interp *I, filter_call *c, val *v) {
  const arr *ar = v->a;
  val *attr = kwarg(&c->a, "attribute");
  if (!attr) rfail(I, c->at, "map() without attribute= is not supported");
  if (attr->t != V_STR) rfail(I, c->at, "map() attribute must be a string");
  val *dflt = kwarg(&c->a, "default");
  val *out = varr(I, ar->n);
  for (int i = 0; i < ar->n; i++) {
    if (ar->v[i]->t != V_OBJECT && ar->v[i]->t != V_NS) rfail(I, c->at, "items in map() must be mappings");
    val *x = attr_path(I, ar->v[i], attr);
    arr_push(I, out->a, x->t == V_UNDEF ? (dflt ? dflt : UNDEF) : x);
  }
  return out;
}

// upper, lower, title, capitalize, replace: the string method of the same name.
static val *filter_str_method(interp *I, filter_call *c, val *v) { return str_method(I, c->at, c->name, v, &c->a); }

// JavaScript whitespace, both ends.
static val *filter_trim(interp *I, filter_call *c, val *v) {
  (void)c;
  return js_trim(I, v, true, true);
}

// indent(width=4, first=false, blank=false): indents every line but the first and blank ones.
static val *filter_indent(interp *I, filter_call *c, val *v) {
  val *w = arg_or(&c->a, 0, "width", vnum(I, V_INT, 4)), *first = arg_or(&c->a, 1, "first", vbool(false)),
      *blank = arg_or(&c->a, 2, "blank", vbool(false));
  if (w->t != V_INT) rfail(I, c->at, "indent() width must be an integer");
  sbuf b = {0};
  sb_put(I->a, &b, "", 0);
  const char *s = v->str.s;
  size_t n = v->str.n, st = 0;
  int line = 0;
  for (size_t i = 0; i <= n; i++) {
    if (i < n && s[i] != '\n') continue;
    bool empty = i == st;
    if (!((!truthy(first) && line == 0) || (!truthy(blank) && empty)))
      for (int k = 0; k < as_int(w->num); k++) sb_putc(I->a, &b, ' ');
    sb_put(I->a, &b, s + st, i - st);
    if (i < n) sb_putc(I->a, &b, '\n');
    st = i + 1;
    line++;
  }
  return vstr_sb(I, &b);
}

static val *filter_abs(interp *I, filter_call *c, val *v) {
  (void)c;
  return vnum(I, v->t, fabs(v->num));
}

// items, get, keys, values, dictsort: the mapping method of the same name.
static val *filter_obj_method(interp *I, filter_call *c, val *v) { return obj_method(I, c->at, c->name, v, &c->a); }

// The filters: X(name, function, flags). The rows expand into the table and into an enum
// whose enumerators would collide if a name were listed twice, so none can shadow another.
#define FILTER_BOTH (FILTER_BARE | FILTER_CALL)
#define JINJA_FILTERS(X)                                                                                  \
  X(safe, filter_identity, FILTER_BOTH | FILTER_ON_ANY)                                                   \
  X(tojson, filter_tojson, FILTER_BOTH | FILTER_ON_ANY)                                                   \
  X(default, filter_default, FILTER_CALL | FILTER_ON_ANY)                                                 \
  X(join, filter_join, FILTER_BOTH | FILTER_ON_ANY)                                                       \
  X(int, filter_number, FILTER_BOTH | FILTER_ON_ANY)                                                      \
  X(float, filter_number, FILTER_BOTH | FILTER_ON_ANY)                                                    \
  X(list, filter_identity, FILTER_BARE | FILTER_ON_LIST)                                                  \
  X(first, filter_first, FILTER_BARE | FILTER_ON_LIST)                                                    \
  X(last, filter_last, FILTER_BARE | FILTER_ON_LIST)                                                      \
  X(length, filter_length, FILTER_BARE | FILTER_ON_LIST | FILTER_ON_STR | FILTER_ON_MAP)                  \
  X(reverse, filter_reverse, FILTER_BARE | FILTER_ON_LIST)                                                \
  X(sort, filter_sort, FILTER_BOTH | FILTER_ON_LIST)                                                      \
  X(string, filter_string, FILTER_BARE | FILTER_ON_LIST | FILTER_ON_STR | FILTER_ON_NUM | FILTER_ON_BOOL) \
  X(unique, filter_unique, FILTER_BARE | FILTER_ON_LIST)                                                  \
  X(selectattr, filter_select, FILTER_CALL | FILTER_ON_LIST)                                              \
  X(rejectattr, filter_select, FILTER_CALL | FILTER_ON_LIST)                                              \
  X(map, filter_map, FILTER_CALL | FILTER_ON_LIST)                                                        \
  X(upper, filter_str_method, FILTER_BARE | FILTER_ON_STR)                                                \
  X(lower, filter_str_method, FILTER_BARE | FILTER_ON_STR)                                                \
  X(title, filter_str_method, FILTER_BARE | FILTER_ON_STR)                                                \
  X(capitalize, filter_str_method, FILTER_BARE | FILTER_ON_STR)                                           \
  X(trim, filter_trim, FILTER_BARE | FILTER_ON_STR)                                                       \
  X(indent, filter_indent, FILTER_BOTH | FILTER_ON_STR)                                                   \
  X(replace, filter_str_method, FILTER_BOTH | FILTER_ON_STR)                                              \
  X(abs, filter_abs, FILTER_BARE | FILTER_ON_NUM)                                                         \
  X(bool, filter_identity, FILTER_BARE | FILTER_ON_BOOL)                                                  \
  X(items, filter_obj_method, FILTER_BOTH | FILTER_ON_MAP)                                                \
  X(get, filter_obj_method, FILTER_BOTH | FILTER_ON_MAP)                                                  \
  X(keys, filter_obj_method, FILTER_BOTH | FILTER_ON_MAP)                                                 \
  X(values, filter_obj_method, FILTER_BOTH | FILTER_ON_MAP)                                               \
  X(dictsort, filter_obj_method, FILTER_BOTH | FILTER_ON_MAP)

typedef struct {
  const char *name;
  filter_fn *fn;
  int flags;  // FILTER_*
} filter_def;

#define FILTER_ID(name, fn, flags) FILTER_ID_##name,
#define FILTER_ROW(name, fn, flags) {#name, fn, flags},
enum { JINJA_FILTERS(FILTER_ID) N_FILTERS };
static const filter_def filters[N_FILTERS] = {JINJA_FILTERS(FILTER_ROW)};
#undef FILTER_ID
#undef FILTER_ROW

static const filter_def *filter_find(const char *name) {
  for (int i = 0; i < N_FILTERS; i++)
    if (!strcmp(filters[i].name, name)) return &filters[i];
  return NULL;
}

// v | f, where f is a filter name or a call of one.
static val *apply_filter(interp *I, const node *fx, val *v, const node *f, env *e) {
  bool call = f->kind == N_CALL;
  if (call && f->a->kind != N_IDENT) rfail(I, fx, "unsupported filter expression");
  filter_call c = {.at = fx, .name = call ? f->a->s : f->s, .call = call, .argx = &f->args};
  const filter_def *d = filter_find(c.name);
  if (!d) rfail(I, fx, "unsupported filter '%s'", c.name);
  if (call) c.a = eval_args(I, &f->args, e);
  if (!(d->flags & (call ? FILTER_CALL : FILTER_BARE)) || !(d->flags & filter_kind(v))) filter_unsupported(I, &c, v);
  return d->fn(I, &c, v);
}

static val *binary_op(interp *I, const node *x, env *e) {
  const char *op = x->s;
  val *l = eval(I, x->a, e);
  if (!strcmp(op, "and")) return truthy(l) ? eval(I, x->b, e) : l;
  if (!strcmp(op, "or")) return truthy(l) ? l : eval(I, x->b, e);
  val *r = eval(I, x->b, e);
  if (!strcmp(op, "==")) return vbool(loose_eq(l, r));
  if (!strcmp(op, "!=")) return vbool(!loose_eq(l, r));
  bool in = !strcmp(op, "in"), notin = !strcmp(op, "not in");
  if (l->t == V_UNDEF || r->t == V_UNDEF) {
    if (r->t == V_UNDEF && (in || notin)) return vbool(notin);
    rfail(I, x, "cannot apply '%s' to an undefined value", op);
  }
  if (l->t == V_NULL || r->t == V_NULL) rfail(I, x, "cannot apply '%s' to none", op);
  if (!strcmp(op, "~")) {
    sbuf b = {0};
    sb_put(I->a, &b, "", 0);
    raw_str(I, &b, l, x);
    raw_str(I, &b, r, x);
    return vstr_sb(I, &b);
  }
  bool lnum = l->t == V_INT || l->t == V_FLOAT || l->t == V_BOOL, rnum = r->t == V_INT || r->t == V_FLOAT || r->t == V_BOOL;
  if (!strcmp(op, "**") && lnum && rnum) {
    double p = js_to_number(l), q = js_to_number(r);
    if (p == 0 && q < 0) rfail(I, x, "0.0 cannot be raised to a negative power");
    double res = pow(p, q);
    if (!isfinite(res)) rfail(I, x, "exponentiation result is not a finite real number");
    return vnum(I, l->t == V_FLOAT || r->t == V_FLOAT || q < 0 ? V_FLOAT : V_INT, res);
  }
  if ((l->t == V_INT || l->t == V_FLOAT) && (r->t == V_INT || r->t == V_FLOAT)) {
    double p = l->num, q = r->num;
    int ft = l->t == V_FLOAT || r->t == V_FLOAT ? V_FLOAT : V_INT;
    if (!strcmp(op, "+")) return vnum(I, ft, p + q);
    if (!strcmp(op, "-")) return vnum(I, ft, p - q);
    if (!strcmp(op, "*")) return vnum(I, ft, p * q);
    if (!strcmp(op, "/")) return vnum(I, V_FLOAT, p / q);
    if (!strcmp(op, "//")) return vnum(I, ft, floor(p / q));
    if (!strcmp(op, "%")) return vnum(I, ft, fmod(p, q));
    if (!strcmp(op, "<")) return vbool(p < q);
    if (!strcmp(op, ">")) return vbool(p > q);
    if (!strcmp(op, "<=")) return vbool(p <= q);
    if (!strcmp(op, ">=")) return vbool(p >= q);
  } else if (l->t == V_ARRAY && r->t == V_ARRAY) {
    if (!strcmp(op, "+")) {
      val *out = varr(I, l->a->n + r->a->n);
      for (int i = 0; i < l->a->n; i++) arr_push(I, out->a, l->a->v[i]);
      for (int i = 0; i < r->a->n; i++) arr_push(I, out->a, r->a->v[i]);
      return out;
    }
  } else if (r->t == V_ARRAY && (in || notin)) {
    bool found = false;
    for (int i = 0; i < r->a->n && !found; i++) found = strict_eq(r->a->v[i], l);
    return vbool(found == in);
  }
  if ((l->t == V_STR || r->t == V_STR) && !strcmp(op, "+")) {
    sbuf b = {0};
    sb_put(I->a, &b, "", 0);
    raw_str(I, &b, l, x);
    raw_str(I, &b, r, x);
    return vstr_sb(I, &b);
  }
  if (l->t == V_STR && r->t == V_STR && (in || notin))
    return vbool((find_sub(r->str.s, r->str.n, l->str.s, l->str.n) != NULL) == in);
  if (l->t == V_STR && (r->t == V_OBJECT || r->t == V_KWARGS) && (in || notin))
    return vbool((obj_get(r->o, l->str.s, l->str.n) != NULL) == in);
  rfail(I, x, "unsupported operator '%s' between %s and %s", op, type_name(l), type_name(r));
}

static val *eval(interp *I, const node *x, env *e) {
  if (++I->depth > 400) rfail(I, x, "recursion too deep");
  if (++I->steps > 50000000) rfail(I, x, "template runs too long");
  val *r;
  switch (x->kind) {
    case N_INT: r = vnum(I, V_INT, x->num); break;
    case N_FLOAT: r = vnum(I, V_FLOAT, x->num); break;
    case N_STR: r = vstr(I, x->s, x->n); break;
    case N_IDENT: r = env_get(e, x->s, x->n); break;
    case N_ARRAY: case N_TUPLE:
      r = varr(I, x->args.n);
      r->a->tuple = x->kind == N_TUPLE;
      for (int i = 0; i < x->args.n; i++) arr_push(I, r->a, eval(I, x->args.v[i], e));
      break;
    case N_OBJECT:
      r = vobj(I, V_OBJECT);
      for (int i = 0; i + 1 < x->args.n; i += 2) {
        val *k = eval(I, x->args.v[i], e);
        if (k->t != V_STR) rfail(I, x->args.v[i], "mapping keys must be strings, not %s", type_name(k));
        obj_set(I, r->o, k->str.s, k->str.n, eval(I, x->args.v[i + 1], e));
      }
      break;
    case N_MEMBER: {
      val *o = eval(I, x->a, e);
      if (x->flag && x->b->kind == N_SLICE) {
        r = do_slice(I, x, o, x->b, e);
        break;
      }
      val *prop;
      if (x->flag) prop = eval(I, x->b, e);
      else if (x->b->kind == N_INT) prop = vnum(I, V_INT, x->b->num);
      else prop = vstr(I, x->b->s, x->b->n);
      r = member(I, x, o, prop);
      break;
    }
    case N_CALL: {
      args_t a = eval_args(I, &x->args, e);
      val *f = eval(I, x->a, e);
      r = call_value(I, x, f, &a, e);
      break;
    }
    case N_UNARY: {
      val *v = eval(I, x->a, e);
      if (!strcmp(x->s, "not")) {
        r = vbool(!truthy(v));
      } else {
        if (v->t != V_INT && v->t != V_FLOAT && v->t != V_BOOL) rfail(I, x, "unary '%s' needs a number, not %s", x->s, type_name(v));
        double d = js_to_number(v) * (x->s[0] == '-' ? -1 : 1);
        r = vnum(I, v->t == V_FLOAT ? V_FLOAT : V_INT, d);
      }
      break;
    }
    case N_BINARY: r = binary_op(I, x, e); break;
    case N_FILTER: r = apply_filter(I, x, eval(I, x->a, e), x->b, e); break;
    case N_TEST: {
      val *v = eval(I, x->a, e);
      bool t = run_test(I, x, x->s, v, NULL);
      r = vbool(x->flag ? !t : t);
      break;
    }
    case N_SELECT: r = truthy(eval(I, x->b, e)) ? eval(I, x->a, e) : UNDEF; break;
    case N_TERNARY: r = truthy(eval(I, x->a, e)) ? eval(I, x->b, e) : eval(I, x->c, e); break;
    case N_KWARG: case N_SPREAD: case N_KWSPREAD: rfail(I, x, "unexpected argument syntax here");
    default: rfail(I, x, "internal error: not an expression");
  }
  I->depth--;
  return r;
}

static void assign(interp *I, const node *target, val *v, env *e) {
  if (target->kind == N_IDENT) {
    env_set(I, e, target->s, target->n, v);
  } else if (target->kind == N_TUPLE) {
    if (v->t != V_ARRAY) rfail(I, target, "cannot unpack %s", type_name(v));
    if (v->a->n != target->args.n)
      rfail(I, target, "too %s values to unpack", target->args.n > v->a->n ? "few" : "many");
    for (int i = 0; i < target->args.n; i++) {
      if (target->args.v[i]->kind != N_IDENT) rfail(I, target, "can only unpack into names");
      env_set(I, e, target->args.v[i]->s, target->args.v[i]->n, v->a->v[i]);
    }
  } else if (target->kind == N_MEMBER && !target->flag && target->b->kind == N_IDENT) {
    val *o = eval(I, target->a, e);
    if (o->t != V_NS) rfail(I, target, "can only assign attributes of a namespace(), not of %s", type_name(o));
    obj_set(I, o->o, target->b->s, target->b->n, v);
  } else {
    rfail(I, target, "cannot assign to this expression");
  }
}

static void out_put(interp *I, const char *s, size_t n) { sb_put(I->a, I->out, s, n); }

static int exec_for(interp *I, const node *x, env *e) {
  env *scope = env_new(I, e);
  const node *it = x->b, *test = NULL;
  if (it->kind == N_SELECT) {
    test = it->b;
    it = it->a;
  }
  val *coll = eval(I, it, scope);
  if (coll->t == V_OBJECT || coll->t == V_KWARGS) {
    val *keys = varr(I, coll->o->n);
    for (int i = 0; i < coll->o->n; i++) arr_push(I, keys->a, vstr(I, coll->o->k[i], coll->o->kn[i]));
    coll = keys;
  }
  if (coll->t != V_ARRAY) rfail(I, x->b, "cannot loop over %s", type_name(coll));
  val **items = arena_alloc(I->a, sizeof(val *) * (size_t)(coll->a->n + 1));
  int n = 0;
  for (int i = 0; i < coll->a->n; i++) {
    val *cur = coll->a->v[i];
    if (x->a->kind == N_TUPLE && (cur->t != V_ARRAY || cur->a->n != x->a->args.n)) {
      if (cur->t != V_ARRAY) rfail(I, x->a, "cannot unpack %s", type_name(cur));
      rfail(I, x->a, "too %s values to unpack", x->a->args.n > cur->a->n ? "few" : "many");
    }
    if (test) {
      env *ls = env_new(I, scope);
      assign(I, x->a, cur, ls);
      if (!truthy(eval(I, test, ls))) continue;
    }
    items[n++] = cur;
  }
  bool none = true;
  for (int i = 0; i < n; i++) {
    val *loop = vobj(I, V_OBJECT);
    obj_set(I, loop->o, "index", 5, vnum(I, V_INT, i + 1));
    obj_set(I, loop->o, "index0", 6, vnum(I, V_INT, i));
    obj_set(I, loop->o, "revindex", 8, vnum(I, V_INT, n - i));
    obj_set(I, loop->o, "revindex0", 9, vnum(I, V_INT, n - i - 1));
    obj_set(I, loop->o, "first", 5, vbool(i == 0));
    obj_set(I, loop->o, "last", 4, vbool(i == n - 1));
    obj_set(I, loop->o, "length", 6, vnum(I, V_INT, n));
    obj_set(I, loop->o, "previtem", 8, i > 0 ? items[i - 1] : UNDEF);
    obj_set(I, loop->o, "nextitem", 8, i < n - 1 ? items[i + 1] : UNDEF);
    env_set(I, scope, "loop", 4, loop);
    assign(I, x->a, items[i], scope);
    int flow = exec_block(I, &x->body, scope);
    if (flow == FLOW_BREAK) break;
    if (flow == FLOW_CONTINUE) continue;
    none = false;
  }
  if (none) return exec_block(I, &x->alt, scope);
  return FLOW_NORMAL;
}

static int exec_stmt(interp *I, const node *x, env *e) {
  switch (x->kind) {
    case N_TEXT: out_put(I, x->s, x->n); return FLOW_NORMAL;
    case N_GEN_START:
      if (I->out == I->top) I->gen_open = (long)I->top->n;
      return FLOW_NORMAL;
    case N_GEN_END:
      if (I->out == I->top && I->gen_open >= 0) {
        if (I->ngen == I->capgen) {
          int cap = I->capgen ? 2 * I->capgen : 8;
          ct_span *g = arena_alloc(I->a, sizeof *g * (size_t)cap);
          if (I->ngen) memcpy(g, I->gen, sizeof *g * (size_t)I->ngen);
          I->gen = g;
          I->capgen = cap;
        }
        I->gen[I->ngen++] = (ct_span){(size_t)I->gen_open, I->top->n};
        I->gen_open = -1;
      }
      return FLOW_NORMAL;
    case N_OUTPUT: {
      val *v = eval(I, x->a, e);
      if (v->t != V_NULL && v->t != V_UNDEF) to_str(I, I->out, v, x);
      return FLOW_NORMAL;
    }
    case N_IF:
      if (!x->a || truthy(eval(I, x->a, e))) return exec_block(I, &x->body, e);
      return exec_block(I, &x->alt, e);
    case N_FOR: return exec_for(I, x, e);
    case N_SET: {
      val *v;
      if (x->b) {
        v = eval(I, x->b, e);
      } else {
        sbuf buf = {0}, *save = I->out;
        sb_put(I->a, &buf, "", 0);
        I->out = &buf;
        exec_block(I, &x->body, e);
        I->out = save;
        v = vstr_sb(I, &buf);
      }
      assign(I, x->a, v, e);
      return FLOW_NORMAL;
    }
    case N_MACRO: {
      val *f = vfn(I, F_MACRO, x->a->s, NULL);
      f->f->macro = x;
      env_set(I, e, x->a->s, x->a->n, f);
      return FLOW_NORMAL;
    }
    case N_BREAK: return FLOW_BREAK;
    case N_CONTINUE: return FLOW_CONTINUE;
    case N_FILTER_BLOCK: {
      sbuf buf = {0}, *save = I->out;
      sb_put(I->a, &buf, "", 0);
      I->out = &buf;
      exec_block(I, &x->body, e);
      I->out = save;
      val *v = apply_filter(I, x, vstr_sb(I, &buf), x->b, e);
      if (v->t != V_NULL && v->t != V_UNDEF) to_str(I, I->out, v, x);
      return FLOW_NORMAL;
    }
    case N_CALL_BLOCK: {
      val *caller = vfn(I, F_CALLER, "caller", NULL);
      caller->f->macro = x;  // params in x->args, body in x->body
      caller->f->defenv = e;
      args_t a = eval_args(I, &x->a->args, e);
      val *f = eval(I, x->a->a, e);
      env *ne = env_new(I, e);
      env_set(I, ne, "caller", 6, caller);
      val *v = call_value(I, x, f, &a, ne);
      if (v->t != V_NULL && v->t != V_UNDEF) to_str(I, I->out, v, x);
      return FLOW_NORMAL;
    }
    default: rfail(I, x, "internal error: not a statement");
  }
}

static int exec_block(interp *I, const nlist *body, env *e) {
  if (++I->depth > 400) rfail(I, body->n ? body->v[0] : NULL, "recursion too deep");
  for (int i = 0; i < body->n; i++) {
    int flow = exec_stmt(I, body->v[i], e);
    if (flow != FLOW_NORMAL) {
      I->depth--;
      return flow;
    }
  }
  I->depth--;
  return FLOW_NORMAL;
}

int ct_jinja_render(const ct_jinja *tpl, const json_t *vars, char **out, size_t *len, ct_span **gen, int *ngen) {
  *out = NULL;
  if (len) *len = 0;
  if (gen) {
    *gen = NULL;
    *ngen = 0;
  }
  arena a = {0};
  interp *I = calloc(1, sizeof *I);
  if (!I) return ct_set_error(CT_ENOMEM, "jinja: out of memory");
  I->a = &a;
  I->S = &tpl->S;
  I->gen_open = -1;
  a.jmp = &I->jmp;
  if (setjmp(I->jmp)) {
    int rc = a.oom ? CT_ENOMEM : CT_EFORMAT;
    arena_free(&a);
    free(I);
    return rc;
  }
  env *g = env_new(I, NULL);
  env_set(I, g, "namespace", 9, vfn(I, F_GLOBAL, "namespace", NULL));
  env_set(I, g, "false", 5, vbool(false));
  env_set(I, g, "true", 4, vbool(true));
  env_set(I, g, "none", 4, NUL);
  env_set(I, g, "raise_exception", 15, vfn(I, F_GLOBAL, "raise_exception", NULL));
  env_set(I, g, "range", 5, vfn(I, F_GLOBAL, "range", NULL));
  env_set(I, g, "strftime_now", 12, vfn(I, F_GLOBAL, "strftime_now", NULL));
  env_set(I, g, "True", 4, vbool(true));
  env_set(I, g, "False", 5, vbool(false));
  env_set(I, g, "None", 4, NUL);
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)vars, k, v) env_set(I, g, k, strlen(k), from_json(I, v));
  sbuf top = {0};
  sb_put(&a, &top, "", 0);
  I->out = I->top = &top;
  env *scope = env_new(I, g);
  exec_block(I, &tpl->program, scope);
  char *s = malloc(top.n + 1);
  ct_span *spans = NULL;
  if (s && gen && I->ngen) {
    spans = malloc(sizeof *spans * (size_t)I->ngen);
    if (spans) memcpy(spans, I->gen, sizeof *spans * (size_t)I->ngen);
  }
  if (!s || (gen && I->ngen && !spans)) {
    free(s);
    free(spans);
    arena_free(&a);
    free(I);
    return ct_set_error(CT_ENOMEM, "jinja: out of memory");
  }
  memcpy(s, top.p, top.n + 1);
  *out = s;
  if (len) *len = top.n;
  if (gen) {
    *gen = spans;
    *ngen = I->ngen;
  }
  arena_free(&a);
  free(I);
  return 0;
}
