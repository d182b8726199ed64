// calculator: the built-in `calculator` tool — exact arithmetic on an expression: integers
// and decimals, + - * / (exact fractions), ^ or ** (integer powers), % (remainder of
// integers), parentheses, unary signs. Values are exact rationals of up to ±2^126; a
// result that does not fit is an error, never a rounded number.
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

// Evaluates expr: true with the result in out ("56088", "-2.5", "1/3": a fraction whose
// decimal does not end is written as one), or false with why in out ("division by zero",
// "unexpected ')' at 7").
bool ct_calculator_eval(const char *expr, char *out, size_t cap);

// The tool's schema, as a chat template renders it among the row's tools (a new reference).
json_t *ct_calculator_schema(void);
