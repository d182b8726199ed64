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
} ct_prompt_set;

// Reads every row of a JSONL file; the first bad row is an error naming file:line.
int ct_prompt_set_load(ct_prompt_set *s, const char *path, const ct_tokenizer *tok,
                       const ct_prompt_opts *o);
void ct_prompt_set_free(ct_prompt_set *s);
