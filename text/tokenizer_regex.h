// tokenizer_regex: the small regex engine behind the Split pre-tokenizer. It covers what
// Hugging Face tokenizer.json patterns use (GPT-2, Llama 3, Qwen2/3, DeepSeek, GPT-4o
// style): literals, classes with \p{..}/\P{..}/\s/\d/\w, alternation, groups (?:..),
// (?i:..), lookahead (?=..) (?!..), quantifiers ? * + {n,m} (greedy and lazy). Matching
// follows Oniguruma (what Hugging Face tokenizers uses): leftmost alternative first,
// backtracking, Unicode \s \d \w. Anything else is rejected when compiling, naming the
// position, rather than matched differently.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct ct_regex ct_regex;

// Compiles pat[0, len). On failure returns CT_EFORMAT with ct_set_error() set to
// "position N: what" (the caller prefixes the file and field).
int ct_regex_compile(ct_regex **out, const char *pat, size_t len);
void ct_regex_free(ct_regex *re);

// A decoded text the matcher runs on, plus its backtracking stack. Reused across calls
// (buffers only grow), one per thread.
typedef struct {
  uint32_t *cp;    // (n) code points (CT_UC_INVALID for a stray byte)
  uint8_t *prop;   // (n) ct_uc_prop of each code point
  uint32_t *off;   // (n + 1) byte offset of each code point, off[n] = byte length
  size_t n, cap;
  void *stack;     // backtracking entries
  size_t stack_cap;
} ct_regex_text;

// Decodes s[0, len) into t. Returns 0 or CT_ENOMEM.
int ct_regex_text_set(ct_regex_text *t, const char *s, size_t len);
void ct_regex_text_free(ct_regex_text *t);

// Anchored match of re at code point index `at`, seeing the text as [0, end) (end of text
// for lookahead and $ is `end`). Returns the end index of the match (>= at), -1 when
// there is none, -2 on error (out of memory, or a pattern that backtracks beyond a sane
// budget; ct_last_error() says which).
long ct_regex_match(const ct_regex *re, ct_regex_text *t, size_t at, size_t end);
