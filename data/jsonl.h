// jsonl: the one row reader behind every dataset loader (SFT rows, preference pairs,
// prompts). A data file is JSONL — lines numbered as in the file, blank lines skipped but
// counted — or one JSON array of row objects (the first non-blank byte is '['), either of
// them optionally gzip-compressed (recognized by its magic bytes, whatever the name).
// A line holding a NUL byte or invalid JSON is a row error like any the row callback
// reports, and row errors (CT_EFORMAT) are skipped and counted when skip_bad is set.
// Parquet, Arrow and Hugging Face datasets directories are refused with the one-line
// Python command that converts them to JSONL.
//
// A row's place (`line` below) is its line number (> 0) in a JSONL file, or minus its
// 1-based index in a JSON array; ct_jsonl_where prints "path:12" or "path: row 12".
#pragma once
#include <jansson.h>
#include <stdbool.h>

#include "ids.h"
#include "tokenizer.h"

typedef struct {
  int n_lines;          // lines read (rows, for a JSON array)
  int n_bad;            // rows skipped (skip_bad)
  char first_bad[512];  // message of the first skipped row
} ct_jsonl_stats;

// Called for each row with its parsed value (borrowed: json_incref to keep it) and place
// (see above). Returns 0, CT_EFORMAT for a bad row, or another error to stop.
typedef int (*ct_jsonl_row_fn)(void *ctx, json_t *row, int line);

// Reads path row by row. Returns the first error not skipped (0 at the end of the file).
int ct_jsonl_read(const char *path, bool skip_bad, ct_jsonl_row_fn fn, void *ctx, ct_jsonl_stats *st);

// Appends the token ids of a row's JSON list under `key` to out; anything but a list of
// integers in [0, V) — V the tokenizer's size — is CT_EFORMAT naming the key and index
// (callers add where). model_V, the model's vocab_size (0 = unknown), is only named in
// the message: a model's embedding is often larger than its tokenizer, and ids past the
// tokenizer's are not tokens the tokenizer can decode or the chat template can produce.
int ct_jsonl_ids(const json_t *list, int V, int model_V, const char *key, ct_ids *out);

// The chat template options of a row, as TRL passes them to apply_chat_template: its
// "tools" (a list of tool schemas) and "chat_template_kwargs" (an object of further
// template variables, e.g. enable_thinking). Borrowed from row; a key of the wrong type is
// CT_EFORMAT naming the key (callers add path:line).
int ct_row_chat_opts(const json_t *row, bool add_generation_prompt, ct_chat_opts *o);

// Renders msgs (the row's message list under `key`) with the tokenizer's chat template
// and the row's options into a malloc'd string (NULL on error), refusing a message the
// template drops (ct_row_chat_check); errors name the key (callers add path:line).
int ct_row_chat(const ct_tokenizer *t, const json_t *row, const json_t *msgs, const char *key,
                bool add_generation_prompt, char **out);

// "path:line" for a JSONL row, "path: row N" for the Nth row of a JSON array (line = -N).
void ct_jsonl_where(char *buf, size_t n, const char *path, int line);

// A message the chat template rendered nothing of (a role it does not handle, which it
// would otherwise drop silently) is CT_EFORMAT naming key[index] and the role. The rule:
// msgs is rendered once more with every non-empty string content replaced by a unique
// marker, and a marker missing from that text is a dropped message. (Checking that the
// real content appears would fail on templates that trim or rewrite contents; checking
// that each message changes the text would fail on templates that fold a system message
// into the first user turn.) Messages without string content (tool calls) are not checked.
int ct_row_chat_check(const ct_tokenizer *t, const json_t *msgs, const ct_chat_opts *co, const char *key);

// A row error: records "path:line: message" (or "path: row N: message") and returns CT_EFORMAT.
int ct_row_error(const char *path, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
