// speculative: self-speculative greedy decoding with a model's multi-token prediction
// depths (nn/mtp.h, mtp.safetensors) as the draft. Each round the D depths guess the next
// D tokens, chained (depth k reads depth k-1's hidden state and the guess before it; a
// depth whose guesses are kept too rarely to pay for its reads sits out most rounds), and
// one engine pass over [the newest token, guess 1..D] verifies them all: the guesses that
// equal the main model's greedy choices are kept, plus that pass's own next choice. Every
// token the engine computes is batch-invariant (linear.h), so the output is the plain
// greedy decoding's, token for token and log-prob for log-prob; only the number of main
// passes changes. Each depth's decoder layer runs as a one-layer engine with its own KV
// cache, fed the projected [enorm(embedding); hnorm(h)] rows; its matrices are held in the
// main model's format (quantization=int8 or bf16 quantizes the draft too: the guesses may
// change, never the output).
#pragma once
#include <stdbool.h>

#include "engine.h"
#include "generate.h"
#include "mtp.h"
#include "weights.h"

typedef struct {
  int D;                    // depths read from mtp.safetensors
  const ct_infer_weights *w;  // the main model's (its embedding, final norm and head are shared)
  ct_model mtp;             // the depths' float32 weights (a layout whose Hugging Face part stays untouched)
  ct_infer_weights *dw;     // (D) each depth's block as a one-layer model
  ct_linear *eh;            // (D) each depth's eh_proj (C, 2C), packed
  void *panels;             // the blocks' matrices in the main model's format (fp32, bf16 or int8 panels)
  ct_engine_opts o;         // one slot; max_tokens bounds a prefill pass (at least D + 1)
  ct_engine *e;             // the main model's engine
  ct_engine **de;           // (D) each depth's
  // the drafting rule's record (speculative.c's depths_to_draft), over every request so far
  long checked[CT_MTP_MAX + 1], kept[CT_MTP_MAX + 1];  // depth k's guesses verified / kept
  long round;               // verifying passes so far
} ct_spec_model;

// The depths of the model in dir (dir/mtp.safetensors, written by training with
// mtp_num_layers) on top of w, the engine weights of dir's model, and the engines for
// o's max_len and max_tokens (o.slots is ignored: one slot). An error names the file
// when it is missing.
int ct_spec_load(ct_spec_model *sm, const ct_infer_weights *w, const char *dir, const ct_engine_opts *o);
void ct_spec_free(ct_spec_model *sm);

typedef struct {
  long rounds;    // verifying passes of the main model after the prefill
  long drafted;   // tokens the depths guessed
  long accepted;  // guesses kept
  long rejected;  // guesses that differed from the model's choice (the rest of a round's
                  // guesses, after a rejection or the sample's end, are neither)
  long tokens;    // tokens generated
} ct_spec_stats;

// ct_generate for greedy requests (temperature 0, n = 1), one at a time, each sample's
// result through cb as ct_generate reports it. Adds to st. Errors for sampled or
// multi-sample requests.
int ct_spec_generate(ct_spec_model *sm, const ct_tokenizer *tok, const ct_gen_request *reqs, int nreq,
                     const ct_gen_callbacks *cb, ct_spec_stats *st);

// The depths' guesses for tokens n .. n + D - 1 after tokens[0, n): the main model runs
// over tokens [0, n - 1), depth 1 guesses token n from position n - 2, depth k token
// n + k - 1 from depth k - 1's guess (a round's draft, for tests and evaluation).
int ct_spec_guess(ct_spec_model *sm, const int *tokens, int n, int *guesses);
