// frozen: a model that only ever runs forward — DPO's and GRPO's reference, distillation's
// teacher (and, later, a LoRA base and a reward model). One module so that each storage
// choice (CT_STORE_*, model.h) is written once and every trainer gets it:
//   float32   the training forward over a ct_model, keeping no activations for backward
//             (CT_ACTS_FORWARD): the same kernels, so its log-probs equal the policy's bit
//             for bit when the weights are equal;
//   bfloat16  the same forward over bf16 weights widened one layer at a time (half the
//             memory; log-probs move by what rounding the weights to bf16 explains);
//   int8      the inference engine's int8 weights (infer/weights.h), one scale per row.
// It never has gradients or optimizer state. Its weights do not change while it is open,
// except through ct_frozen_params (TR-DPO's reference sync, float32 only).
//
// Shapes: B rows of at most T tokens per forward; N = B*T; C hidden; V vocabulary.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "data.h"
#include "engine.h"
#include "forward.h"
#include "head.h"
#include "model.h"
#include "weights.h"

typedef struct {
  int dtype;              // CT_STORE_*
  bool view;              // the model is another's (ct_frozen_view): nothing of it is freed
  bool borrowed;          // acts are another's (ct_frozen_through): not freed either
  ct_model_config cfg;
  int B, T;               // capacity of one forward
  int row_T;              // rows up to this long too (ct_frozen_long_rows; 0: T)
  ct_model model;         // float32 / bfloat16: the parameters
  ct_acts acts;           // float32 / bfloat16: one layer's activations, reused
  ct_infer_weights iw;    // the engine's view: float32 views of model, or the int8 weights
                          // (none for bfloat16)
  ct_engine *engine;      // int8: runs the forward (slot = row, one pass per batch)
  int *slot, *pos, *outs; // int8: (N) the engine pass's token placement
} ct_frozen;

// Bytes a frozen model of config c stored as dtype takes with forwards of B x T tokens
// (weights, activations, engine buffers): its row of the memory plan.
double ct_frozen_bytes(const ct_model_config *c, int dtype, int B, int T);

// Takes ownership of m (loaded or copied by the caller: nothing to free on failure either)
// and readies it for forwards of B rows x T tokens; with CT_STORE_BF16 or CT_STORE_INT8
// the weights are converted and the float32 parameters freed.
int ct_frozen_init(ct_frozen *f, ct_model *m, int dtype, int B, int T);
// A view of model m, which stays the owner: the reference of a LoRA policy is its own
// base run without adapters (no copy). m's RoPE table must cover T.
int ct_frozen_view(ct_frozen *f, const ct_model *m, int B, int T);
// Points a view's forwards at activations a of the same model, borrowed from their owner
// (a LoRA policy's, idle between its own passes: its next forward overwrites what the
// view's left) instead of activations of its own, which are freed; B x T become a's. A
// view made with B = 0 has none until this is called. No-op for a model of its own.
void ct_frozen_through(ct_frozen *f, const ct_acts *a);
// Loads a Hugging Face model directory (a ctune int8 directory loads as int8).
int ct_frozen_open(ct_frozen *f, const char *dir, int dtype, int B, int T);
// Grows an owned float32/bfloat16 model's forward buffers to rows of T tokens (no-op when
// they hold T already): its RoPE table and activations are allocated again.
int ct_frozen_reserve(ct_frozen *f, int T);
// Lets an owned float32/bfloat16 model's forwards take rows of up to T_row tokens (GRPO's
// shared prompts: ct_acts_long_rows); a view borrows its activations, an int8 model runs
// one row per sequence on the engine: no-op for both.
int ct_frozen_long_rows(ct_frozen *f, int T_row);
void ct_frozen_free(ct_frozen *f);

// bf16 compute (the trainer's bf16: true): a float32 or bfloat16 model multiplies in
// bfloat16 as the policy does (float32: through a bf16 copy of its weights; bfloat16: its
// stored weights, no copy); int8 is unchanged. Call after init / open.
int ct_frozen_compute_bf16(ct_frozen *f);
// The bytes that adds (the copy and the activations' bf16 inputs): its memory plan row.
double ct_frozen_bf16_bytes(const ct_model_config *c, int dtype, int B, int T);

// The float32 parameters (NULL for bf16 and int8): TR-DPO's reference sync writes them,
// then calls ct_frozen_params_changed (which refreshes a bf16 copy).
float *ct_frozen_params(ct_frozen *f);
void ct_frozen_params_changed(ct_frozen *f);
// A checksum of the stored weights (ct_model_checksum; int8: the engine's matrices, scales
// and vectors): that training left them exactly as loaded, and their identity (ident.h).
uint64_t ct_frozen_checksum(const ct_frozen *f);

// Runs b through the model and writes the final hidden states (the LM head's input) of
// b's target tokens, in token order (the order ct_head_gather takes), into out (n, C).
// Returns n, or a negative error (b larger than the capacity, a position past T).
int ct_frozen_hidden(ct_frozen *f, const ct_batch *b, float *out);
// Logits (n, nv) of vocabulary columns [v0, v0 + nv) for hidden rows (n, C).
void ct_frozen_logits(const ct_frozen *f, const float *hidden, int n, int v0, int nv, float *out);
// The log-probs of b's targets at h->inv_temp: runs b, then the LM head over the target
// rows (h->logp, lse, entropy, argmax as ct_lm_forward leaves them). Returns the number
// of gathered rows, or a negative error.
int ct_frozen_logps(ct_frozen *f, const ct_batch *b, ct_head *h);
