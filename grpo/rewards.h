// grpo/reward: reward functions for GRPO. Each scores a batch of completions; a reward
// that cannot be computed for a completion is NaN (never a crash), and the trainer
// leaves NaNs out. Built-in: accuracy (exact or numeric match of the completion's final
// answer against a row field, optional extraction regex), format (regex match), length
// (penalty for straying from a target length), env (an environment episode's reward,
// grpo/agent.h); remote: HTTP POST to a reward server
// with OpenRLHF's JSON protocol; a reward model: a sequence-classification model directory
// run in-process (reward/model.h), as TRL's GRPOTrainer takes one in reward_funcs.
#pragma once
#include <jansson.h>
#include <stdbool.h>

#include "config.h"  // CT_REWARD_*

// reward_funcs entries that name no built-in are reward-model directories.
#define CT_REWARD_MODEL CT_REWARD_COUNT

typedef struct {
  // accuracy
  const char *answer_field;   // row field holding the reference answer (NULL or "" =
                              // "answer"); the remote reward sends it as the label
  bool labels_required;       // remote: every row must have answer_field (else a row
                              // without it sends a null label)
  const char *answer_regex;   // Python re syntax (common/pyregex.h); of its last match, the
                              // group named "answer", else the first group, else the whole
                              // match is the completion's answer; "" = the whole completion
  bool numeric;               // compare as numbers (1e-6 relative, "," ignored) instead of
                              // strings (both trimmed of surrounding whitespace)
  bool math;                  // compare as math answers (mathans.h; without answer_regex the
                              // answer is the completion's last \boxed{} or math span)
  // format
  const char *format_regex;   // Python re syntax: reward 1 when re.search finds it in the
                              // completion, else 0
  // length
  int target_length;          // reward = -|length - target| / target, length in bytes
  // overlong (DAPO's soft overlong punishment): with L = max_len, B = buffer and n the
  // completion's tokens, 0 when n ≤ L − B, (L − B − n) / B when L − B < n ≤ L, else −1
  int overlong_max_len, overlong_buffer;
  // repetition_penalty (TRL's get_repetition_penalty_reward): over the completion's token
  // ids, (1 − unique n-grams / n-grams) × max_penalty; 0 below n tokens
  int ngram;
  double max_penalty;
  // cosine (TRL's get_cosine_scaled_reward): accuracy's verdict (same options) scaled by
  // the length n: v_lo + ½(v_hi − v_lo)(1 + cos(π·min(n / max_len, 1))), (v_lo, v_hi) =
  // (min_value_correct, max_value_correct) when correct, else (max_value_wrong,
  // min_value_wrong); NaN where accuracy is NaN
  int cosine_max_len;
  double min_value_wrong, max_value_wrong, min_value_correct, max_value_correct;
  // remote
  const char *url;            // http://host:port/path or https://...
  const char *api_key_env;    // NULL or "": no key; else the environment variable holding
                              // the key, sent as "Authorization: Bearer KEY"
  double connect_timeout_s, timeout_s;  // per attempt; both > 0
  int retries;                // attempts after the first, with exponential backoff
  double backoff_s;           // first wait between attempts
  bool failure_nan;           // after the last retry: NaN rewards (true) or an error (false)
  int batch;                  // completions per request; <= 0: all in one request
  // reward model
  const char *model_dir;      // the directory
  int model_dtype;            // CT_STORE_F32 or CT_STORE_BF16 (reward_model_dtype)
  int model_batch, model_max_length;  // rows per forward; tokens per text (longer: NaN)
  bool check_only;            // check the directory (config, score.weight, tokenizer), load nothing
  const ct_config *cfg;       // NULL, or the config the options came from: messages then
                              // start "file:line: key 'answer_regex': " (ct_config_origin)
} ct_reward_opts;

typedef struct ct_reward ct_reward;

// Compiles regexes and checks options now, so that a bad name, regex, URL or reward-model
// directory fails before any rollout; the message names the option (with its origin when
// o->cfg is set). A reward model is loaded here (unless check_only).
int ct_reward_init(ct_reward **r, int kind, const ct_reward_opts *o);
void ct_reward_free(ct_reward *r);
// "accuracy", "format", "length", "remote", or a reward model's directory's last part
const char *ct_reward_name(const ct_reward *r);
// Parses a name from configuration: a built-in, or (CT_REWARD_MODEL) a path to a
// directory; CT_ECONFIG naming the choices otherwise.
int ct_reward_kind(const char *name, int *kind);

// One completion to score: the prompt text, the completion text, and its dataset row
// (fields such as the answer).
typedef struct {
  const char *prompt;
  const char *completion;
  const json_t *row;
  int completion_tokens;       // (overlong, repetition_penalty, cosine) its token count
  const int *completion_ids;   // (repetition_penalty) its tokens
  double env_reward;           // (env) its episode's reward from the environment, or NaN
} ct_reward_item;

// Scores n items into out (NaN where a reward cannot be computed). Errors only for the
// remote reward when failure_nan is false: after its last retry, with a message naming
// the URL and what went wrong (timeout, HTTP status, malformed reply, wrong count), or at
// once on a non-finite reward (Python's bare NaN, Infinity, -Infinity, or 1e400), which
// with failure_nan is NaN for that item alone. A null reward is NaN (TRL's None).
// Not thread-safe: one ct_reward serves one thread (the remote reward reuses one
// connection handle).
int ct_reward_score(ct_reward *r, const ct_reward_item *items, int n, double *out);

// The dataset field r reads from each row (accuracy: answer_field; remote: answer_field
// when labels_required), or NULL when it reads none.
const char *ct_reward_field(const ct_reward *r);

// Checks the rows [0, n) of the dataset `path` (rows[i] at lines[i], jsonl.h) before any
// rollout: a field that no row has is CT_ECONFIG naming the key, the field and the file;
// a row without it (or with a list, an object, null, or with answer_numeric a text that is
// no number) is CT_EFORMAT naming path:line, or with skip_bad sets bad[i]. Returns how
// many rows it newly marked bad (0 when r reads no field); when > 0, ct_last_error() is
// the message of the first of them.
int ct_reward_check_rows(const ct_reward *r, json_t *const *rows, const int *lines, int n, const char *path,
                         bool skip_bad, bool *bad);

// Remote reward: how many batches have failed after their last retry so far (with
// failure_nan they scored NaN and ct_reward_score returned 0), and the message of the
// latest such failure ("" if none), for the trainer's log.
long ct_reward_failed_batches(const ct_reward *r);
const char *ct_reward_last_failure(const ct_reward *r);
