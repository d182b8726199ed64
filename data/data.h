// data: TRL-format JSONL datasets, tokenized once into one flat token array, optionally
// packed, and cut into padded micro-batches.
//
// Row formats (first match wins):
//   {"input_ids": [...], "completion_mask"?: [...]}     pre-tokenized, no EOS added
//   {"prompt_input_ids": [...], "completion_input_ids": [...]}  the same, split
//   {"messages": [{"role", "content"}, ...]}            chat template applied
//   {"prompt": ..., "completion": ...}                   strings, or message lists
//   {"<text field>": "..."}                              plain text (default field "text")
// Each token carries a label flag: 1 when the loss trains its prediction from the
// tokens before it. A document's first token never has a label.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "tokenizer.h"

typedef struct {
  int max_length;             // truncate to this many tokens (keep the first)
  bool completion_only_loss;  // prompt/completion rows: labels on the completion only
  bool assistant_only_loss;   // messages rows: labels on assistant turns only
  bool skip_bad_rows;         // count and skip malformed rows instead of failing
  bool packing;               // best-fit-decreasing into bins of max_length
  const char *text_field;     // "text"
  int model_vocab;            // the model's vocab_size, named in token-id errors (0 = unknown)
} ct_data_opts;

typedef struct {
  char *path;
  // tokens of every kept row, back to back
  int *ids;          // (n_tokens)
  uint8_t *label;    // (n_tokens)
  long n_tokens;
  int n_rows;
  long *row_start;   // (n_rows) offset of each row in ids
  int *row_len;      // (n_rows)
  int *row_line;     // (n_rows) line in the file, for messages
  // sequences: what one row of a micro-batch holds — one row, or a packed bin of rows
  int n_seq;
  int *seq_first;    // (n_seq) index into seq_rows
  int *seq_count;    // (n_seq)
  int *seq_rows;     // row indices, sequence after sequence
  int *seq_len;      // (n_seq) tokens
  // what happened while reading
  int n_lines, n_bad, n_empty, n_truncated, n_prefix_mismatch;
  long n_label_tokens;
  char first_bad[512];  // message of the first skipped row
} ct_dataset;

// Reads and tokenizes path. Errors name the file, line and key.
int ct_dataset_load(ct_dataset *ds, const char *path, const ct_tokenizer *tok,
                    const ct_data_opts *o);
void ct_dataset_free(ct_dataset *ds);

// Packs rows into sequences of at most max_length tokens, best-fit decreasing
// (deterministic). Without packing each row is its own sequence.
int ct_dataset_pack(ct_dataset *ds, int max_length, bool packing);

// Labels a sequence would contribute.
long ct_seq_labels(const ct_dataset *ds, int seq);

// A micro-batch: B rows padded to T. Position n predicts token n+1 of the same
// document: target[n] is that token when it has a label, else -1.
typedef struct {
  int cap_B, cap_T;
  int B, T;
  int *ids, *pos, *seg, *target;  // (B*T) each
  int *pre;                       // (B*T) a prefix each token also sees (attention.h), when has_pre
  bool has_pre;
  int *row_seq;                   // (B) which sequence each row holds
  int *tok_seq, *tok_j;           // (B*T) ct_batch_completions: the sequence a target belongs
                                  // to and the index of the completion token it predicts
  long n_target;                  // targets in this batch
  long n_tokens;                  // non-padding tokens
} ct_batch;

int ct_batch_init(ct_batch *b, int cap_B, int cap_T);
void ct_batch_free(ct_batch *b);
// Fills b with the given sequences (n <= cap_B), T = the longest of them.
void ct_batch_fill(ct_batch *b, const ct_dataset *ds, const int *seqs, int n, int pad_id);

// Row `row` of b (b->T already set, >= np + nc) = prompt then completion, padded; targets
// on the completion's tokens only (position t predicts token t + 1). Adds to n_target and
// n_tokens. For prompt/completion batches built outside a dataset (DPO pairs, rollouts).
void ct_batch_row(ct_batch *b, int row, const int *prompt, int np, const int *comp, int nc,
                  int pad_id);
// Drops the targets of row `row`'s completion tokens j (after a prompt of np) whose keep[j]
// is 0 — tool results inside a completion, which the model did not sample (nc tokens).
void ct_batch_drop_targets(ct_batch *b, int row, int np, const unsigned char *keep, int nc);

// A prompt and its completion; keep (nc, or NULL = all) marks the completion tokens that
// are targets (tool results are not).
typedef struct {
  const int *prompt, *comp;
  int np, nc;
  const unsigned char *keep;
} ct_prompt_completion;

// b = the n sequences, targets on their completions' kept tokens, and tok_seq / tok_j for
// every target. With max_run > 1, each run of consecutive sequences (at most max_run) with
// the same prompt (2+ tokens) is one row: the prompt's first np − 1 tokens once, then per sequence its last
// prompt token and its completion, seeing that prefix through b->pre (attention.h) at the
// positions it would have alone. The same targets in the same order, and the same loss and
// gradients within float rounding, as one row per sequence, for fewer tokens. Shares only
// when the shared rows, padded, hold no more tokens than one row per sequence would, and
// are at most max_T long; returns whether it shared.
bool ct_batch_completions(ct_batch *b, const ct_prompt_completion *s, int n, int pad_id, int max_run, int max_T);
// The longest row ct_batch_completions makes with max_run = per_row.
int ct_shared_row_tokens(int max_prompt, int max_completion, int per_row);
