// grpo/reward: reward functions for GRPO. Each scores a batch of completions; a reward
// that cannot be computed for a completion is NaN (never a crash), and the trainer
// leaves NaNs out. Built-in: accuracy (exact or numeric match of the completion's final
// answer against a row field, optional extraction regex), format (regex match), length
// (penalty for straying from a target length); remote: HTTP POST to a reward server
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
  const char *answer_regex;   // POSIX ERE; the last match's first group (or whole match) is
                              // the completion's answer; "" = the whole completion, trimmed
  bool numeric;               // compare as numbers (1e-6 relative, "," ignored) instead of
                              // strings (both trimmed of surrounding whitespace)
  // format
  const char *format_regex;   // POSIX ERE: reward 1 when it matches the completion, else 0
  // length
  int target_length;          // reward = -|length - target| / target, length in bytes
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
} ct_reward_opts;

typedef struct ct_reward ct_reward;

// Compiles regexes and checks options now, so that a bad name, regex, URL or reward-model
// directory fails before any rollout; the message names the option. A reward model is
// loaded here (unless check_only).
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
} ct_reward_item;

// Scores n items into out (NaN where a reward cannot be computed). Errors only for the
// remote reward after its last retry when failure_nan is false, with a message naming
// the URL and what went wrong (timeout, HTTP status, malformed reply, wrong count).
// Not thread-safe: one ct_reward serves one thread (the remote reward reuses one
// connection handle).
int ct_reward_score(ct_reward *r, const ct_reward_item *items, int n, double *out);

// Remote reward: how many batches have failed after their last retry so far (with
// failure_nan they scored NaN and ct_reward_score returned 0), and the message of the
// latest such failure ("" if none), for the trainer's log.
long ct_reward_failed_batches(const ct_reward *r);
const char *ct_reward_last_failure(const ct_reward *r);
