// mathans: math answers compared as math-verify does on GSM8K / MATH-style data (TRL's
// accuracy_reward), in the forms that matter there, without a computer algebra system.
//
// Extraction (ct_math_extract) from a completion: the last \boxed{…} or \fbox{…} (balanced
// braces), else the last math span $…$, $$…$$, \(…\) or \[…\]; none: no answer (TRL's
// try_extract_without_anchor=False). A reference answer is taken whole (its own \boxed or
// $…$ unwrapped).
//
// Equivalence (ct_math_equal) after normalization — spaces, \left \right, \! \, \; \:, \displaystyle
// dropped; \dfrac and \tfrac read as \frac; a leading "x =" dropped; degrees (^\circ, °) and
// trailing units in \text{…} or \mbox{…} dropped; a final "." dropped:
//   numbers     integers and decimals, signs, thousands separators (1,000 = 1000); equal
//               within 1e-6 relative (1e-9 absolute near 0)
//   fractions   \frac{a}{b}, \frac ab, a/b, a mixed number a\frac{b}{c}, each a number
//   percentages p\% or p% equals p/100 and p itself (GSM8K writes either)
//   otherwise   the normalized texts equal (\frac{\pi}{2} = \dfrac{\pi}{2}, x^{2} = x^2)
#pragma once
#include <stdbool.h>
#include <stddef.h>

// The answer span of completion c: *s, *n. False when c holds no boxed or math span.
bool ct_math_extract(const char *c, const char **s, size_t *n);

// Whether answer [a, a + na) equals the reference [b, b + nb); −1 when the reference
// cannot be read at all (empty after normalization).
int ct_math_equal(const char *a, size_t na, const char *b, size_t nb);
