// generate: continuous batching over the engine's slots. Requests wait in order; a
// request's n samples share one prefill (multisampling: the prompt's cache is computed
// once, copied into n slots, and each sample draws its first token from the shared
// logits with its own random stream); prompts admitted together are prefilled in one
// packed pass; every step advances all active slots by one token; a finished sample
// frees its slot for the next request at once.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "sample.h"
#include "tokenizer.h"

enum { CT_FINISH_STOP, CT_FINISH_LENGTH };
extern const char *const ct_finish_names[];  // "stop", "length"

typedef struct {
  const int *prompt;  // token ids
  int prompt_len;
  int n;              // samples of this prompt
  uint64_t seed;      // sample k draws from ct_sample_rng(seed, k)
  ct_sample_params sp;
  int max_new_tokens;
  const int *stop_ids;              // any of these ends a sample (kept as its last token)
  int n_stop_ids;
  const char *const *stop_strings;  // any of these in the text ends a sample
  int n_stop_strings;
} ct_gen_request;

typedef struct {
  int request, sample;
  const int *ids;         // completion token ids (a stop id, when one ended it, is last)
  const float *logprobs;  // (n) log_softmax(logits / temperature) of each chosen token
  int n;
  int finish;             // CT_FINISH_*
  const char *text;       // decoded completion without the stop token / stop string
  size_t text_len;
} ct_gen_result;

// Called once per finished sample (in finishing order); nonzero stops generation (a
// negative CT_E* code with its message is returned by ct_generate as it is).
typedef int (*ct_gen_sink)(void *ctx, const ct_gen_result *r);
// Optional: called for each new token of each sample, as it is chosen.
typedef void (*ct_gen_token_fn)(void *ctx, int request, int sample, int token);

typedef struct {
  ct_gen_sink on_done;
  ct_gen_token_fn on_token;  // may be NULL
  void *ctx;
} ct_gen_callbacks;

// One sample's completion as it grows, and the rule that ends it: the finishing step
// ct_generate and speculative decoding (speculative.h) share. ids, lps and seen are the
// caller's: seen holds cap ids (the cache's positions), ids and lps one entry per token
// the sample can reach.
typedef struct {
  int req, sample;
  int n;          // tokens generated
  int *ids;       // (cap)
  float *lps;     // (cap)
  int *seen;      // (cap) prompt + completion, for the repetition penalty
  int n_seen, cap;
  char *text;     // completion text so far (stop strings, results); owned
  size_t tlen, tcap;
} ct_gen_sample;

// Starts sample `sample` of request `req` (r): no tokens, no text, the prompt's last cap
// tokens seen.
void ct_gen_sample_start(ct_gen_sample *s, const ct_gen_request *r, int req, int sample);
// Adds the chosen token t (log-prob lp) and reports it (cb->on_token). Ends the sample
// when t is a stop id (kept as the last token), a stop string now appears in the text
// (cut there), max_new_tokens are reached, or `full` (no cache position left for the
// next token): cb->on_done gets the result and 1 is returned. 0: the sample goes on;
// negative: an error (cb->on_done's own, out of memory, or a nonzero on_done's stop).
int ct_gen_sample_add(ct_gen_sample *s, const ct_gen_request *r, const ct_tokenizer *tok,
                      const ct_gen_callbacks *cb, int t, float lp, bool full);
// Frees the text (not the caller's arrays).
void ct_gen_sample_free(ct_gen_sample *s);

// Runs every request to completion. tok decodes text for stop strings and results.
// A prompt that leaves no room in a slot's cache (prompt_len >= max_len) is an error
// naming the request, before any work.
int ct_generate(ct_engine *e, const ct_tokenizer *tok, const ct_gen_request *reqs, int nreq,
                const ct_gen_callbacks *cb);
