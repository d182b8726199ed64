// engine: the inference engine over a fixed set of decode slots, each with its own KV
// cache region (the MaxEngine shape). Everything is one primitive, ct_engine_forward:
// a pass over tokens that each name a slot and a position; a token writes its k/v into
// its slot's cache and attends to that slot's positions 0..pos. A prefill is a pass over
// a prompt's tokens (several prompts in one pass = packed prefill), a decode step is a
// pass over one token per active slot (continuous batching), multisampling copies one
// slot's cache into others. Every token's result is computed the same way whatever else
// is in the pass (see linear.h), so batching never changes an output.
//
// Shapes: S slots, T = max_len positions per slot, KVd = KV*hd; cache (L, S, T, KVd).
#pragma once
#include "weights.h"

typedef struct ct_engine ct_engine;

typedef struct {
  int slots;       // decode slots
  int max_len;     // cache positions per slot: prompt + completion
  int max_tokens;  // tokens one pass may hold (>= slots; the packed-prefill budget)
  bool kv_bf16;    // keys and values cached as bfloat16 (a bf16 model's rollouts: half the
                   // cache's bytes and of what decode's attention reads; sums stay float32)
} ct_engine_opts;

int ct_engine_init(ct_engine **e, const ct_infer_weights *w, const ct_engine_opts *o);
// The bytes ct_engine_init allocates (KV caches and work buffers; not the weights).
double ct_engine_bytes(const ct_model_config *c, const ct_engine_opts *o);
void ct_engine_free(ct_engine *e);

// One pass over n tokens: token i is ids[i] at position pos[i] of slot slot[i]. Writes
// the logits (nout, V) of the tokens listed in out[0..nout) (indices into the n tokens).
// Errors for a slot or position out of range, or n > max_tokens.
int ct_engine_forward(ct_engine *e, int n, const int *ids, const int *slot, const int *pos,
                      const int *out, int nout, float *logits);

// The same pass, writing the final RMSNorm's output (nout, C) of the listed tokens — the
// LM head's input — instead of logits (distillation applies the head in vocabulary
// chunks itself).
int ct_engine_forward_hidden(ct_engine *e, int n, const int *ids, const int *slot, const int *pos,
                             const int *out, int nout, float *hidden);

// ct_engine_forward that also writes every token's last-layer output before the final norm
// into top (n, C) (multi-token prediction's h_0), and that takes the first layer's input
// rows x_in (n, C) instead of ids' embeddings when x_in is not NULL (an MTP depth's
// block run as a one-layer engine; top may be NULL, nout 0).
int ct_engine_forward_top(ct_engine *e, int n, const int *ids, const float *x_in, const int *slot, const int *pos,
                          const int *out, int nout, float *logits, float *top);

// Packs every LoRA adapter of the weights once (A as the thin kernel or the panels read
// it, B into panels) for the passes that follow, until ct_engine_lora_unpin; unpinned, a
// pass packs each adapter it applies (at 16 threads that serial packing and its loops
// were a third of GRPO's rollout time). The adapters must not change while pinned:
// ct_generate pins for its own duration. The same bits either way. Without adapters, or
// without memory for the copy (ct_engine_lora_bytes), passes keep packing per call.
void ct_engine_lora_pin(ct_engine *e);
void ct_engine_lora_unpin(ct_engine *e);
// The bytes of that packed copy: the adapters' size.
double ct_engine_lora_bytes(const ct_lora *lo);

// Copies positions [0, len) of slot src's cache into slot dst (multisampling).
int ct_engine_copy_slot(ct_engine *e, int src, int dst, int len);

const ct_infer_weights *ct_engine_weights(const ct_engine *e);
ct_engine_opts ct_engine_options(const ct_engine *e);
