// jinja: the subset of Jinja2 that chat templates use, rendering as Hugging Face's
// @huggingface/jinja (and transformers' apply_chat_template) do: trim_blocks and
// lstrip_blocks on; statements for/if/elif/else/set (also block form)/macro/call/filter/
// generation; expressions with filters, tests, slicing, string/list/dict methods,
// namespace(), loop.*, raise_exception(). A construct outside the subset fails at parse
// or render time with "where:line:col: message" — never a silently different rendering.
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "ids.h"

typedef struct ct_jinja ct_jinja;

// Parses src[0, len). `where` names the template in messages, e.g.
// "tokenizer_config.json: chat_template".
int ct_jinja_parse(ct_jinja **out, const char *src, size_t len, const char *where);
void ct_jinja_free(ct_jinja *tpl);

// True when the template contains {% generation %} blocks.
bool ct_jinja_has_generation(const ct_jinja *tpl);

// Renders with the variables of `vars` (a JSON object) into a malloc'd NUL-terminated
// string (*len bytes). When gen is not NULL it receives the output ranges of
// {% generation %} blocks (malloc'd, *ngen entries; NULL/0 when there are none).
int ct_jinja_render(const ct_jinja *tpl, const json_t *vars, char **out, size_t *len,
                    ct_span **gen, int *ngen);
