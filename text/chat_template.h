// chat_template: where a chat template comes from when it is not the tokenizer's own —
// TRL's chat_template_path: a Jinja file, or a tokenizer directory (its
// chat_template.jinja, else the chat_template of its tokenizer_config.json) — and how a
// tokenizer_config.json's chat_template value (a string, or a list of named templates)
// picks one.
#pragma once
#include <jansson.h>
#include <stddef.h>

// Reads the template source at path into *src (malloc'd, NUL-terminated, *len bytes).
// A directory without a template, or an empty file, is CT_EFORMAT naming the path.
int ct_chat_template_read(const char *path, char **src, size_t *len);

// The template a tokenizer_config.json's "chat_template" value holds: a string, or
// [{"name", "template"}] (the one named "default", else the first). *out is borrowed from
// v, NULL when v is absent or null. `file` names it in errors (CT_EFORMAT).
int ct_chat_template_pick(const json_t *v, const char *file, const char **out);
