// completions: output_dir/completions.jsonl (TRL's log_completions) — one JSON row per
// generated completion per step: GRPO's rollouts with their rewards and advantages,
// on-policy distillation's samples. A step's rows are written and synced to disk as soon
// as its rollouts are scored, so they outlive a crash of a later step. Every rank's rows
// are gathered to rank 0 (in rank order) and only rank 0 writes; a resumed run first
// drops the rows of steps after its checkpoint.
#pragma once
#include <jansson.h>
#include <stdbool.h>

#include "log.h"

typedef struct {
  char path[4096];
  bool on;        // log_completions
  int print_n;    // num_completions_to_print: rows of each logged step shown on stderr
  ct_log *log;    // prints go through it (rank 0 only, keeping the progress line intact)
} ct_completions;

// A fresh run (resume_step 0) starts an empty file; a resumed one keeps the rows of steps
// <= resume_step. With on false nothing is written (a file already there is left alone).
int ct_completions_open(ct_completions *c, const char *output_dir, bool on, int print_n, long resume_step,
                        ct_log *log);

// The prompt as a dataset row gave it: its "prompt" (string or message list), else
// "messages", else "prompt_input_ids"; NULL if none (borrowed).
json_t *ct_completion_prompt(const json_t *row);

// A new row with the fields every generated completion has: step, prompt (may be NULL:
// null), completion (text), completion_ids (n), logprobs (n, at sampling time), and
// finish_reason ("stop" or "length": ct_finish_names). The caller adds its own fields.
json_t *ct_completion_row(long step, json_t *prompt, const char *text, const int *ids, const float *logprobs,
                          int n, const char *finish_reason);

// Collective: every rank calls it with its own n rows (their references are taken). Rank 0
// appends all ranks' rows, flushes and fsyncs, then prints the first print_n of them
// (prompt, completion, reward when the rows have one) on stderr. Does nothing when off.
int ct_completions_append(ct_completions *c, json_t **rows, int n);
