// sample: choosing the next token from a row of logits, as Hugging Face's generate()
// and vLLM do: repetition penalty, temperature, then top-k, top-p and min-p filtering,
// then a draw from the request's own random stream. The log-prob returned for the
// chosen token is log_softmax(logits / temperature) — filters and penalties shape the
// choice only, never the reported log-prob (GRPO trains against it).
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "rng.h"

typedef struct {
  float temperature;         // 0 = greedy (argmax; log-probs then use temperature 1)
  int top_k;                 // 0 = off
  float top_p;               // 1 = off; keep the smallest set with probability >= top_p
  float min_p;               // 0 = off; drop tokens below min_p x the top probability
  float repetition_penalty;  // 1 = off; HF's CTRL-style penalty on tokens already seen
} ct_sample_params;

// Scratch for ct_sample_token, sized for a vocabulary of V (one per thread); a call may
// use any V' <= V. Nothing is allocated per call.
typedef struct {
  int V;
  float *prob;  // (V) scaled scores, then the unnormalized kept probabilities
  int *idx;     // (V) top-k heap or candidates, then top-p candidates
  double *blk;  // (V / CT_SAMPLE_BLOCK + 1) mass of each block of prob, for the draw
} ct_sampler_ws;

#define CT_SAMPLE_BLOCK 256

int ct_sampler_ws_init(ct_sampler_ws *ws, int V);
void ct_sampler_ws_free(ct_sampler_ws *ws);

// Picks a token from logits (V floats, left unchanged). `seen` lists the token ids the
// repetition penalty applies to (prompt and completion so far; duplicates allowed, each
// distinct id is penalized once). Draws exactly one uniform from `rng` when
// temperature > 0, none when greedy, so a request's stream depends only on its own seed
// and history. *logprob (may be NULL) receives the chosen token's log-prob as described
// above. Returns the token id (>= 0), or a negative CT_E* code with a message: NaN or
// +inf logits, all logits -inf, a `seen` id outside [0, V), bad parameters. On error
// no uniform is drawn.
//
// Filters follow transformers' warpers exactly: top_k keeps every token whose score is
// >= the k-th largest (ties at the boundary all stay); top_p then works on the
// renormalized survivors and drops, in ascending order, the tokens whose cumulative
// probability is <= 1 - top_p (the top token always stays; equal probabilities are
// ordered by id, lower ids kept first); min_p then drops tokens below min_p x the top
// probability. The draw is the inverse CDF of the kept distribution walked in
// ascending token id: the uniform u picks the first id whose cumulative mass exceeds
// u x total. Work is O(V) in a few vectorized passes, except top_k <= 256, which keeps
// a heap: O(V log k) at worst, about one vector compare per 16 tokens in practice.
int ct_sample_token(const ct_sample_params *p, const float *logits, int V, const int *seen,
                    int n_seen, ct_rng *rng, ct_sampler_ws *ws, float *logprob);

// ct_sample_token with the uniform given (0 <= u < 1) instead of drawn: the token is a
// function of (params, logits, seen, u) alone. u is ignored when greedy.
int ct_sample_token_u(const ct_sample_params *p, const float *logits, int V, const int *seen,
                      int n_seen, double u, ct_sampler_ws *ws, float *logprob);

// The ids of the k largest of s (V), 0 < k <= V, into h (k), in descending order of
// score; equal scores: lower id first (also at the boundary of the k). No NaN in s.
void ct_top_k_ids(const float *s, int V, int k, int *h);

// Checks parameters (temperature >= 0, top_k >= 0, 0 < top_p <= 1, 0 <= min_p < 1,
// repetition_penalty > 0); the message names the bad one.
int ct_sample_params_check(const ct_sample_params *p);

// The per-request random stream: seed and sample index (the n-th of n samples of a
// prompt) decide it, nothing else. Both go through splitmix64, so neighbouring seeds
// and indices give unrelated streams.
void ct_sample_rng(ct_rng *rng, uint64_t seed, int sample_index);
