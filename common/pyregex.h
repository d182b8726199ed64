// pyregex: the regular expressions users write in configs (GRPO's answer_regex and
// format_regex), with Python re's syntax and meaning, through PCRE2: \d \s \w are
// Unicode classes as in Python's str patterns, non-greedy quantifiers, (?P<name>...) and
// (?<name>...) groups, inline flags (?i) (?s) (?m) (?x); no flag is on unless the pattern
// sets it, as in re.search(pattern, text). Patterns and texts are UTF-8; a text's invalid
// bytes (a completion cut inside a character) match nothing but do not stop the match.
// Not thread-safe: one ct_pyregex serves one thread (it owns its match data).
#pragma once
#include <stddef.h>

typedef struct ct_pyregex ct_pyregex;

// Compiles pattern; one PCRE2 rejects is CT_ECONFIG "cannot compile "PATTERN": WHY at
// character N" (callers add the key).
int ct_pyregex_compile(ct_pyregex **re, const char *pattern);
void ct_pyregex_free(ct_pyregex *re);

// The number of the group named `name`, or -1; the number of capturing groups.
int ct_pyregex_group_named(const ct_pyregex *re, const char *name);
int ct_pyregex_groups(const ct_pyregex *re);

// re.search: 1 when the pattern matches somewhere in [s, s + n), 0 when it does not,
// CT_EINVAL when the matcher gives up (PCRE2's backtracking limits).
int ct_pyregex_search(ct_pyregex *re, const char *s, size_t n);

// The last of re.finditer's matches in [s, s + n): group `group` of it (0: the whole
// match) is [s + *from, s + *from + *len); a group that took no part in that match is
// empty, at the match's end. 1 when there is a match, 0 when none, CT_EINVAL as above.
int ct_pyregex_last(ct_pyregex *re, const char *s, size_t n, int group, size_t *from, size_t *len);
