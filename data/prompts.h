// prompts: JSONL rows that start a generation — for bin/sampler, GRPO and on-policy
// distillation. A row gives its prompt as "prompt" (a string, or a message list for
// the chat template, as TRL's conversational prompts), "messages" (a message list), or
// "prompt_input_ids"; every other field stays with the row (GRPO's reward functions
// read them, e.g. "answer").
#pragma once
#include <jansson.h>
#include <stdbool.h>

#include "tokenizer.h"

typedef struct {
  bool add_generation_prompt;  // for message lists
  int max_length;              // longest prompt in tokens (0 = no limit)
  bool truncate_left;          // keep the last max_length tokens instead of failing
  const char *length_key;      // the option named in the error ("max_prompt_length")
  int model_vocab;             // the model's vocab_size, named in token-id errors (0 = unknown)
  bool skip_bad_rows;          // count and skip malformed rows instead of failing (jsonl.h)
  const json_t *tools;         // tool schemas for message-list rows without "tools" of their
                               // own (set into the row, NULL: none)
  bool prompt_optional;        // a row without a prompt loads with no tokens (an environment
                               // gives its prompt)
} ct_prompt_opts;

// Appends the tokens of one row's prompt to out (one BOS when the tokenizer adds it and
// the template did not write it). `where` ("file:line") and the key name errors.
int ct_prompt_tokens(const ct_tokenizer *tok, const json_t *row, const char *where,
                     const ct_prompt_opts *o, ct_ids *out);

typedef struct {
  int n;
  json_t **rows;  // (n) each row as read
  ct_ids *ids;    // (n) its prompt tokens
  char **text;    // (n) its prompt as text (decoded from the tokens)
  int *line;      // (n)
  int n_bad;      // rows skipped (skip_bad_rows, or ct_prompt_set_drop)
  char first_bad[512];  // the message of the first row skipped while loading
} ct_prompt_set;

// Reads every row of a JSONL file; the first bad row is an error naming file:line, or
// with o->skip_bad_rows is skipped and counted.
int ct_prompt_set_load(ct_prompt_set *s, const char *path, const ct_tokenizer *tok,
                       const ct_prompt_opts *o);
void ct_prompt_set_free(ct_prompt_set *s);
// Removes the rows i with drop[i] (keeping the others' order) and counts them in n_bad.
void ct_prompt_set_drop(ct_prompt_set *s, const bool *drop);
