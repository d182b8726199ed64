// tokenizer.json's normalizer (NFC, Prepend, Replace), pre_tokenizer (Split, ByteLevel,
// Metaspace, Digits), decoder (ByteLevel; Replace, ByteFallback, Fuse, Strip, Metaspace)
// and post_processor (TemplateProcessing: a leading or trailing special token), read into
// the tokenizer's ops, steps and decoded token bytes. The model is tokenizer_model.c's.
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "tokenizer_internal.h"
#include "tokenizer_regex.h"
#include "tokenizer_sp.h"

// A malloc'd copy of s[0, n) with a NUL after it.
static char *memdup(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

// Appends an op (copies of a and b) to *ops.
static int add_op(ct_sp_op **ops, int *nops, int kind, int scheme, const char *a, size_t alen, const char *b,
                  size_t blen) {
  ct_sp_op *o = realloc(*ops, sizeof *o * (size_t)(*nops + 1));
  if (!o) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  *ops = o;
  ct_sp_op op = {kind, scheme, memdup(a, alen), memdup(b, blen), alen, blen};
  if (!op.a || !op.b) {
    free(op.a);
    free(op.b);
    return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  }
  o[(*nops)++] = op;
  return 0;
}

// A Replace normalizer or decoder: {"pattern": {"String": s}, "content": c}.
static int load_replace(const loadctx *L, const json_t *n, const char *where, ct_sp_op **ops, int *nops) {
  const json_t *pat = json_object_get(n, "pattern"), *content = json_object_get(n, "content");
  const json_t *str = json_object_get(pat, "String");
  if (json_object_get(pat, "Regex"))
    return FAIL(CT_EFORMAT, "%s: %s.pattern: a Regex pattern is not supported in Replace (only {\"String\": ...})",
                L->file, where);
  if (!json_is_string(str) || json_string_length(str) == 0)
    return FAIL(CT_EFORMAT, "%s: %s.pattern: expected {\"String\": \"...\"} (non-empty)", L->file, where);
  if (!json_is_string(content)) return FAIL(CT_EFORMAT, "%s: %s.content: expected a string", L->file, where);
  return add_op(ops, nops, CT_SP_REPLACE, 0, json_string_value(str), json_string_length(str),
                json_string_value(content), json_string_length(content));
}

typedef int (*stage_loader)(ct_tokenizer *t, const loadctx *L, const json_t *n, const char *where);

// A Sequence: the list n[key], each of its items loaded by `load` as "<where>.<key>[i]", a
// path cut to room - 1 bytes (160 for pre-tokenizers, 128 for the others).
static int load_sequence(ct_tokenizer *t, const loadctx *L, const json_t *n, const char *where, const char *key,
                         size_t room, stage_loader load) {
  const json_t *list = json_object_get(n, key);
  if (!json_is_array(list)) return FAIL(CT_EFORMAT, "%s: %s.%s: expected a list", L->file, where, key);
  for (size_t i = 0; i < json_array_size(list); i++) {
    char sub[160];
    snprintf(sub, room, "%s.%s[%zu]", where, key, i);
    int rc = load(t, L, json_array_get(list, i), sub);
    if (rc) return rc;
  }
  return 0;
}

int ct_tok_load_normalizer(ct_tokenizer *t, const loadctx *L, const json_t *n, const char *where) {
  if (!n || json_is_null(n)) return 0;
  const char *type = ct_tok_type_of(n);
  if (!type) return FAIL(CT_EFORMAT, "%s: %s.type: missing", L->file, where);
  if (!strcmp(type, "NFC")) {
    if (t->nops) return FAIL(CT_EFORMAT, "%s: %s: NFC after Prepend or Replace is not supported", L->file, where);
    t->nfc = true;
    return 0;
  }
  if (!strcmp(type, "Prepend")) {
    const json_t *pre = json_object_get(n, "prepend");
    if (!json_is_string(pre) || json_string_length(pre) == 0)
      return FAIL(CT_EFORMAT, "%s: %s.prepend: expected a non-empty string", L->file, where);
    return add_op(&t->ops, &t->nops, CT_SP_PREPEND, CT_SP_PLAIN, json_string_value(pre), json_string_length(pre), "", 0);
  }
  if (!strcmp(type, "Replace")) return load_replace(L, n, where, &t->ops, &t->nops);
  if (!strcmp(type, "Sequence")) return load_sequence(t, L, n, where, "normalizers", 128, ct_tok_load_normalizer);
  return FAIL(CT_EFORMAT, "%s: %s.type: normalizer '%s' is not supported (NFC, Prepend, Replace, Sequence)", L->file,
              where, type);
}

static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int add_step(ct_tokenizer *t, pretok_step s) {
  pretok_step *st = realloc(t->steps, sizeof *st * (size_t)(t->nsteps + 1));
  if (!st) {
    ct_regex_free(s.re);
    return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  }
  t->steps = st;
  st[t->nsteps++] = s;
  return 0;
}

static int add_split(ct_tokenizer *t, const loadctx *L, const char *where, const char *pat, size_t len,
                     bool regex, bool keep_match, bool keep_gap, int merge) {
  ct_regex *re;
  int rc;
  if (regex) {
    rc = ct_regex_compile(&re, pat, len);
  } else {  // a literal string: escape every character
    char *esc = malloc(2 * len + 1);
    if (!esc) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
    size_t w = 0;
    for (size_t i = 0; i < len; i++) {
      unsigned char c = (unsigned char)pat[i];
      if (c < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == ' '))
        esc[w++] = '\\';
      esc[w++] = (char)c;
    }
    rc = ct_regex_compile(&re, esc, w);
    free(esc);
  }
  if (rc) return ct_wrap_error(rc, "%s: %s.pattern", L->file, where);
  return add_step(t, (pretok_step){.kind = STEP_SPLIT, .re = re, .keep_match = keep_match, .keep_gap = keep_gap,
                                   .merge = merge});
}

// Metaspace: spaces become the replacement, which is prepended per prepend_scheme (older
// files: add_prefix_space, meaning "always"), and the text splits before each
// replacement (split, default true). The first two are normalizer ops (they keep offsets).
static int load_metaspace(ct_tokenizer *t, const loadctx *L, const json_t *p, const char *where) {
  if (t->nsteps) return FAIL(CT_EFORMAT, "%s: %s: Metaspace must be the first pre-tokenizer", L->file, where);
  const json_t *rj = json_object_get(p, "replacement"), *sj = json_object_get(p, "prepend_scheme");
  const char *r = rj ? json_string_value(rj) : "\xe2\x96\x81";  // ▁
  if (!r || !*r) return FAIL(CT_EFORMAT, "%s: %s.replacement: expected a character", L->file, where);
  const char *scheme = json_string_value(sj);
  int sc;
  if (sj && !scheme) return FAIL(CT_EFORMAT, "%s: %s.prepend_scheme: expected a string", L->file, where);
  if (!scheme) sc = json_is_false(json_object_get(p, "add_prefix_space")) ? CT_SP_NEVER : CT_SP_ALWAYS;
  else if (!strcmp(scheme, "always")) sc = CT_SP_ALWAYS;
  else if (!strcmp(scheme, "first")) sc = CT_SP_FIRST;
  else if (!strcmp(scheme, "never")) sc = CT_SP_NEVER;
  else return FAIL(CT_EFORMAT, "%s: %s.prepend_scheme: '%s' is not one of always, first, never", L->file, where, scheme);
  size_t rl = strlen(r);
  if (add_op(&t->ops, &t->nops, CT_SP_REPLACE, 0, " ", 1, r, rl) ||
      add_op(&t->ops, &t->nops, CT_SP_PREPEND, sc, r, rl, "", 0))
    return CT_ENOMEM;
  const json_t *split = json_object_get(p, "split");
  if (split && !json_is_boolean(split)) return FAIL(CT_EFORMAT, "%s: %s.split: expected true or false", L->file, where);
  if (split && !json_is_true(split)) return 0;
  return add_split(t, L, where, r, rl, false, true, true, MERGE_NEXT);
}

int ct_tok_load_pretok(ct_tokenizer *t, const loadctx *L, const json_t *p, const char *where) {
  if (!p || json_is_null(p)) return 0;
  const char *type = ct_tok_type_of(p);
  if (!type) return FAIL(CT_EFORMAT, "%s: %s.type: missing", L->file, where);
  if (!strcmp(type, "Sequence")) return load_sequence(t, L, p, where, "pretokenizers", 160, ct_tok_load_pretok);
  if (!strcmp(type, "ByteLevel")) {
    if (ct_tok_is_true(json_object_get(p, "add_prefix_space")) && add_step(t, (pretok_step){.kind = STEP_PREFIX}))
      return CT_ENOMEM;
    const json_t *use_regex = json_object_get(p, "use_regex");
    if (!use_regex || ct_tok_is_true(use_regex))
      return add_split(t, L, where, gpt2_pattern, sizeof gpt2_pattern - 1, true, true, true, MERGE_NONE);
    return 0;
  }
  if (!strcmp(type, "Split")) {
    const json_t *pat = json_object_get(p, "pattern");
    const json_t *re = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
    if (!json_is_string(re) && !json_is_string(str))
      return FAIL(CT_EFORMAT, "%s: %s.pattern: expected {\"Regex\": ...} or {\"String\": ...}", L->file, where);
    const char *behavior = json_string_value(json_object_get(p, "behavior"));
    bool invert = ct_tok_is_true(json_object_get(p, "invert"));
    bool keep_match = true, keep_gap = true;
    int merge = MERGE_NONE;
    if (!behavior || !strcmp(behavior, "Isolated")) {
    } else if (!strcmp(behavior, "MergedWithPrevious") && !invert) {
      merge = MERGE_PREV;
    } else if (!strcmp(behavior, "MergedWithNext") && !invert) {
      merge = MERGE_NEXT;
    } else if (!strcmp(behavior, "Removed")) {
      keep_match = invert;
      keep_gap = !invert;
    } else {
      return FAIL(CT_EFORMAT,
                  "%s: %s.behavior: '%s'%s is not supported (Isolated, Removed, MergedWithPrevious, MergedWithNext)",
                  L->file, where, behavior, invert ? " with invert" : "");
    }
    const json_t *s = re ? re : str;
    return add_split(t, L, where, json_string_value(s), json_string_length(s), re != NULL, keep_match, keep_gap,
                     merge);
  }
  if (!strcmp(type, "Metaspace")) return load_metaspace(t, L, p, where);
  if (!strcmp(type, "Digits"))
    return add_step(t, (pretok_step){.kind = STEP_DIGITS, .individual = ct_tok_is_true(json_object_get(p, "individual_digits"))});
  return FAIL(CT_EFORMAT,
              "%s: %s.type: pre-tokenizer '%s' is not supported (Split, ByteLevel, Metaspace, Digits, Sequence)",
              L->file, where, type);
}

// Decoders. A byte-level tokenizer takes ByteLevel only; a SentencePiece-style one the
// per-token Replace, ByteFallback, Metaspace, then Fuse and Strip (which cuts the fused
// text: Strip before Fuse would cut every token and is refused).
int ct_tok_load_decoder(ct_tokenizer *t, const loadctx *L, const json_t *d, const char *where) {
  if (!d || json_is_null(d)) return 0;
  const char *type = ct_tok_type_of(d);
  if (!type) return FAIL(CT_EFORMAT, "%s: %s.type: missing", L->file, where);
  if (!strcmp(type, "ByteLevel")) return 0;
  if (!strcmp(type, "Sequence")) return load_sequence(t, L, d, where, "decoders", 128, ct_tok_load_decoder);
  if (!t->sp)
    return FAIL(CT_EFORMAT, "%s: %s.type: decoder '%s' is not supported with ByteLevel (only ByteLevel)", L->file,
                where, type);
  bool per_token = !strcmp(type, "Replace") || !strcmp(type, "ByteFallback") || !strcmp(type, "Metaspace");
  if (per_token && t->dec_fused)
    return FAIL(CT_EFORMAT, "%s: %s: decoder '%s' after Fuse is not supported", L->file, where, type);
  if (!strcmp(type, "Replace")) return load_replace(L, d, where, &t->drep, &t->ndrep);
  if (!strcmp(type, "ByteFallback")) {
    t->dec_bytefb = true;
    return 0;
  }
  if (!strcmp(type, "Fuse")) {
    t->dec_fused = true;
    return 0;
  }
  if (!strcmp(type, "Metaspace")) {  // the replacement reads as a space; the first one is cut
    const json_t *rj = json_object_get(d, "replacement");
    const char *r = rj ? json_string_value(rj) : "\xe2\x96\x81";
    if (!r || !*r) return FAIL(CT_EFORMAT, "%s: %s.replacement: expected a character", L->file, where);
    const char *scheme = json_string_value(json_object_get(d, "prepend_scheme"));
    bool cut = scheme ? strcmp(scheme, "never") != 0 : !json_is_false(json_object_get(d, "add_prefix_space"));
    if (add_op(&t->drep, &t->ndrep, CT_SP_REPLACE, 0, r, strlen(r), " ", 1)) return CT_ENOMEM;
    t->dec_fused = true;
    t->strip_c = ' ';
    t->strip_start = cut ? 1 : 0;
    return 0;
  }
  if (!strcmp(type, "Strip")) {
    const json_t *c = json_object_get(d, "content");
    int a, b;
    if (!json_is_string(c) || json_string_length(c) != 1)
      return FAIL(CT_EFORMAT, "%s: %s.content: expected a one-byte string", L->file, where);
    if (!ct_tok_get_id(json_object_get(d, "start"), &a) || !ct_tok_get_id(json_object_get(d, "stop"), &b))
      return FAIL(CT_EFORMAT, "%s: %s.start/stop: expected counts", L->file, where);
    if (!t->dec_fused)
      return FAIL(CT_EFORMAT, "%s: %s: Strip before Fuse (cutting every token) is not supported", L->file, where);
    t->strip_c = json_string_value(c)[0];
    t->strip_start = a;
    t->strip_stop = b;
    return 0;
  }
  return FAIL(CT_EFORMAT,
              "%s: %s.type: decoder '%s' is not supported (Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence)",
              L->file, where, type);
}

// SentencePiece-style: the bytes each token decodes to (ByteFallback's <0xNN> is byte NN,
// any other token its text through the decoder's Replace ops).
int ct_tok_build_dec(ct_tokenizer *t) {
  t->dec_off = calloc((size_t)t->vocab_size, sizeof *t->dec_off);
  t->dec_len = calloc((size_t)t->vocab_size, sizeof *t->dec_len);
  if (!t->dec_off || !t->dec_len) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  for (int id = 0; id < t->vocab_size; id++) {
    if (t->tok_kind[id] == TOK_NONE) continue;
    size_t n = t->tok_len[id];
    char *cur = memdup(t->bytes + t->tok_off[id], n);  // ct_tok_store_bytes may move t->bytes
    if (!cur) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
    int b = t->dec_bytefb ? ct_sp_byte_token(cur, n) : -1;
    if (b >= 0) {
      cur[0] = (char)b;
      n = 1;
    }
    for (int k = 0; b < 0 && k < t->ndrep; k++) {
      const ct_sp_op *o = &t->drep[k];
      char *next;
      if (ct_sp_replace_all(cur, n, o->a, o->alen, o->b, o->blen, &next, &n)) {
        free(cur);
        return CT_ENOMEM;
      }
      free(cur);
      cur = next;
    }
    int rc = ct_tok_store_bytes(t, cur, n, &t->dec_off[id]);
    free(cur);
    if (rc) return rc;
    t->dec_len[id] = (uint32_t)n;
  }
  return 0;
}

// Whether a pre-tokenizer or decoder (or a Sequence of them) has a ByteLevel step.
bool ct_tok_has_byte_level(const json_t *j) {
  const char *type = ct_tok_type_of(j);
  if (type && !strcmp(type, "ByteLevel")) return true;
  const char *lists[] = {"pretokenizers", "decoders"};
  for (int k = 0; k < 2; k++) {
    const json_t *l = json_object_get(j, lists[k]);
    for (size_t i = 0; i < json_array_size(l); i++)
      if (ct_tok_has_byte_level(json_array_get(l, i))) return true;
  }
  return false;
}

// The post-processor's TemplateProcessing says whether a document gets a leading or
// trailing special token. Returns the leading and trailing ids (or -1).
void ct_tok_post_template(const ct_tokenizer *t, const json_t *p, int *lead, int *trail) {
  if (!p || json_is_null(p)) return;
  const char *type = ct_tok_type_of(p);
  if (type && !strcmp(type, "Sequence")) {
    const json_t *list = json_object_get(p, "processors");
    for (size_t i = 0; i < json_array_size(list); i++) ct_tok_post_template(t, json_array_get(list, i), lead, trail);
    return;
  }
  if (!type || strcmp(type, "TemplateProcessing")) return;
  const json_t *single = json_object_get(p, "single");
  size_t n = json_array_size(single);
  for (size_t i = 0; i < n; i++) {
    const json_t *sp = json_object_get(json_array_get(single, i), "SpecialToken");
    if (!sp) continue;
    int id = ct_tokenizer_token_id(t, json_string_value(json_object_get(sp, "id")));
    if (i == 0) *lead = id;
    else if (i == n - 1) *trail = id;
  }
}
