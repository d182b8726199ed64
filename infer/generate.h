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
  const float *logprobs;  // (n) log_softmax(logits / temperature) of each chosen token (0
                          // for a token the caller inserted)
  int n;
  int finish;             // CT_FINISH_*
  const char *text;       // decoded text of the last turn (the whole completion without
                          // turns) without the stop token / stop string
  size_t text_len;
  const unsigned char *own;  // (n) 1: a sampled token, 0: one a continuation inserted;
                             // NULL when every token was sampled
  int turn_start;         // where the last turn's tokens start in ids (0 without turns)
} ct_gen_result;

// Called once per finished sample (in finishing order); nonzero stops generation (a
// negative CT_E* code with its message is returned by ct_generate as it is).
typedef int (*ct_gen_sink)(void *ctx, const ct_gen_result *r);
// Optional: called for each new token of each sample, as it is chosen.
typedef void (*ct_gen_token_fn)(void *ctx, int request, int sample, int token);

// Multi-turn samples (tool calls, environments), optional. A sample's turn that ends by a
// stop id or stop string goes to on_turn first (r: the sample so far): 0 ends the sample
// (on_done follows), 1 makes it wait — its slot keeps its cache while the other slots go
// on — until poll hands over its continuation; negative is an error.
typedef int (*ct_gen_turn_fn)(void *ctx, const ct_gen_result *r);

// A waiting sample's continuation: tokens to feed after its last one (they join the
// completion, marked not sampled, and the next turn is sampled from their end); n = 0
// ends the sample as it stands.
typedef struct {
  int request, sample;
  const int *ids;
  int n;
} ct_gen_cont;

// Called while samples wait: 1 with *c filled (ids valid until the next call) when one
// continues, 0 when none is ready yet (never when `wait`: then it blocks until one is),
// negative for an error. A continuation must leave room for one more token within
// max_new_tokens and the slot's cache (an error otherwise).
typedef int (*ct_gen_poll_fn)(void *ctx, bool wait, ct_gen_cont *c);

typedef struct {
  ct_gen_sink on_done;
  ct_gen_token_fn on_token;  // may be NULL
  void *ctx;
  ct_gen_turn_fn on_turn;    // NULL: every sample has one turn
  ct_gen_poll_fn poll;       // with on_turn
  void *turn_ctx;            // theirs (NULL: ctx)
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
  char *text;     // the turn's text so far (stop strings, results); owned
  size_t tlen, tcap;
  unsigned char *own;  // (cap) or NULL: which tokens were sampled (multi-turn samples)
  bool turns;     // a continuation has been added (own is meaningful)
  int turn_start; // where the current turn began in ids
} ct_gen_sample;

// Starts sample `sample` of request `req` (r): no tokens, no text, the prompt's last cap
// tokens seen.
void ct_gen_sample_start(ct_gen_sample *s, const ct_gen_request *r, int req, int sample);
// Adds the chosen token t (log-prob lp) and reports it (cb->on_token). Ends the sample
// when t is a stop id (kept as the last token), a stop string now appears in the text
// (cut there), max_new_tokens are reached, or `full` (no cache position left for the
// next token): cb->on_done gets the result and 1 is returned. A turn that ends by a stop
// goes to cb->on_turn first (when set): 2 when the sample then waits. 0: the sample goes
// on; negative: an error (a callback's own, out of memory, or a nonzero on_done's stop).
int ct_gen_sample_add(ct_gen_sample *s, const ct_gen_request *r, const ct_tokenizer *tok,
                      const ct_gen_callbacks *cb, int t, float lp, bool full);
// Appends a continuation's n tokens (not sampled: log-prob 0) and starts a new turn.
void ct_gen_sample_continue(ct_gen_sample *s, const int *ids, int n);
// The sample as it stands, ended (cb->on_done, CT_FINISH_STOP): 1 or an error.
int ct_gen_sample_end(const ct_gen_sample *s, const ct_tokenizer *tok, const ct_gen_callbacks *cb);
// Frees the text (not the caller's arrays).
void ct_gen_sample_free(ct_gen_sample *s);

// Runs every request to completion. tok decodes text for stop strings and results.
// A prompt that leaves no room in a slot's cache (prompt_len >= max_len) is an error
// naming the request, before any work.
int ct_generate(ct_engine *e, const ct_tokenizer *tok, const ct_gen_request *reqs, int nreq,
                const ct_gen_callbacks *cb);
