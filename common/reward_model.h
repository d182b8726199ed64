// reward_model: a trained reward model (a *ForSequenceClassification directory) that only
// scores: GRPO's in-process reward (grpo/rewards.c) and `bin/reward score` / `eval`. The
// backbone runs through the frozen-model module (float32 or bfloat16 storage, no
// activations kept); the score head is kept apart in float32. A text's reward is
// score · h at its last token, with the model's own tokenizer and chat template.
//
// Shapes: B rows of at most T tokens per forward; C hidden.
#pragma once
#include <jansson.h>
#include <stdbool.h>

#include "data.h"
#include "frozen.h"
#include "tokenizer.h"

typedef struct {
  char dir[4096];
  char name[64];       // the directory's last part: GRPO's rewards/<name>/mean
  ct_tokenizer *tok;
  ct_frozen f;
  float *score;        // (C) score.weight
  int B, T, C;
  ct_batch batch;
  float *hidden;       // (B, C) the last tokens' final hidden states
  int *len;            // (B) scratch
} ct_rm;

// A reward model is a directory, one of:
//   - a *ForSequenceClassification model (config.json, score.weight);
//   - a PEFT LoRA adapter with task_type SEQ_CLS (adapter_config.json, the head under
//     modules_to_save: what bin/reward writes with use_peft), whose base is its
//     adapter_config.json's base_model_name_or_path (a directory: a causal LM, or a
//     classifier whose head the adapter's replaces);
// or, as bin/sampler takes model_path + adapter_path, a base directory and `adapter`
// (NULL or "": none). The adapter is merged into the base's weights when it opens
// (W + s·B·A, as PEFT's merge_and_unload), so scoring costs what the plain model does.
//
// What opening needs, without reading the weights: a *ForSequenceClassification
// config.json with num_labels 1, a score.weight [1, hidden] among the tensors (or an
// adapter's score that fits the base), and a tokenizer that loads (an adapter directory's
// own, else the base's). Each failure is CT_ECONFIG naming the directory and what is wrong.
int ct_rm_check(const char *dir, const char *adapter);

// Opens dir (+ adapter) for forwards of B rows x T tokens, its backbone stored as dtype
// (CT_STORE_F32 or CT_STORE_BF16), after ct_rm_check's checks.
int ct_rm_open(ct_rm *r, const char *dir, const char *adapter, int dtype, int B, int T);
void ct_rm_free(ct_rm *r);
// Bytes ct_rm_open takes for a model of dir, an adapter directory sized by its base (0
// when it cannot be read): a memory-plan row.
double ct_rm_bytes(const char *dir, int dtype, int B, int T);

// The text a reward model scores for a prompt and a completion, as TRL's GRPOTrainer
// renders it for a reward model: a conversational prompt (a message list) is rendered with
// the completion as one more assistant message through r's chat template, no generation
// prompt (with the row's tools and chat_template_kwargs); a text prompt is prompt +
// completion, and *eos says so: it is scored with EOS appended, as bin/reward trains on
// text answers (TRL's RewardTrainer appends it). *out is malloc'd.
int ct_rm_render(const ct_rm *r, const json_t *row, const json_t *prompt, const char *completion, char **out,
                 bool *eos);

// The rewards of n texts into out: each tokenized as one document (one BOS), EOS appended
// where eos[i] (eos may be NULL: none) and not already last, then run in batches of B rows;
// a text longer than T tokens gets NaN and counts in *too_long; with too_long NULL the
// buffers grow to the longest text instead (one line on stderr says by how much).
int ct_rm_score_texts(ct_rm *r, char *const *texts, const bool *eos, int n, double *out, int *too_long);
// The same for n token sequences (ids[i], len[i] tokens each).
int ct_rm_score_ids(ct_rm *r, const int *const *ids, const int *len, int n, double *out, int *too_long);
