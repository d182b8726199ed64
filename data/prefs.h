// prefs: preference pairs for DPO — TRL's {"prompt", "chosen", "rejected"} rows, as
// strings, as conversations (chat template), or pre-tokenized (prompt_input_ids,
// chosen_input_ids, rejected_input_ids). As TRL does, the prompt and each completion
// are tokenized separately and then concatenated; text completions get EOS appended.
// Truncation: the prompt keeps its last max_prompt_length tokens, completions their
// first max_completion_length, and completions are cut further so that prompt +
// completion fits max_length.
#pragma once
#include <stdbool.h>

#include "data.h"
#include "tokenizer.h"

typedef struct {
  int max_length, max_prompt_length, max_completion_length;  // 0 = no limit (the last two)
  bool skip_bad_rows;
  int model_vocab;  // the model's vocab_size, named in token-id errors (0 = unknown)
  // Reward-model pairs (TRL's RewardTrainer): the prompt is optional (a row without one
  // whose answers share no start holds two whole sequences), chosen_ids / rejected_ids
  // (or chosen_input_ids / rejected_input_ids) alone are a pre-tokenized pair, a
  // "margin" number is kept, and a pair with an answer longer than max_length (prompt
  // included) is dropped and counted in n_dropped, never truncated.
  bool reward;
  // Unpaired rows (TRL's KTOTrainer): {"prompt", "completion", "label": true|false}, strings
  // or conversations; a file of pairs instead is unpaired as TRL does (each pair's chosen
  // answer desirable, its rejected one undesirable; per block of 1000 pairs, the chosen
  // answers first, so no example sits beside its own prompt's other answer).
  bool unpaired;
} ct_pref_opts;

typedef struct {
  char *path;
  int n;                 // pairs
  int *ids;              // every pair's tokens: prompt, chosen, rejected, back to back
  long n_tokens;
  long *start;           // (n) offset of the pair's prompt in ids
  int *p_len, *c_len, *r_len;  // (n) lengths; chosen follows the prompt, rejected the chosen
  int *line;             // (n) line in the file
  float *margin;         // (n) reward pairs: the row's margin (0 without one); else NULL
  signed char *label;    // (n) unpaired examples: 1 desirable, 0 undesirable (r_len 0); else NULL
  int max_length;        // the options' (KL rows are cut to it)
  int n_lines, n_bad, n_truncated, n_dropped;
  char first_bad[512];
} ct_pref_dataset;

int ct_pref_load(ct_pref_dataset *ds, const char *path, const ct_tokenizer *tok,
                 const ct_pref_opts *o);
void ct_pref_free(ct_pref_dataset *ds);

// A batch of n pairs as 2n rows: rows 0..n-1 prompt+chosen, rows n..2n-1
// prompt+rejected, targets on completion tokens only. b needs cap_B >= 2n and cap_T >=
// the longest prompt + completion.
void ct_pref_batch(ct_batch *b, const ct_pref_dataset *ds, const int *pairs, int n, int pad_id);

// A batch of n unpaired examples: rows 0..n-1 prompt + completion; with `kl`, rows n..2n-1
// prompt i + the completion of example i − 1 (example n − 1's for row n: TRL's KTO pairs,
// cycled by one within the batch), cut to max_length: the mismatched pairs its KL term
// reads. Targets on completion tokens only.
void ct_pref_batch_unpaired(ct_batch *b, const ct_pref_dataset *ds, const int *rows, int n, bool kl, int pad_id);

// Longest prompt + completion of the dataset (unpaired: of any prompt with any completion,
// up to max_length, which bounds the KL rows).
int ct_pref_max_len(const ct_pref_dataset *ds);
