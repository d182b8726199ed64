// policy_engine: the sampler's engine over the policy being trained, on its own weights (no
// copy, no export): GRPO's rollouts, distillation's on-policy batches. The base's panels are
// packed for decoding (bfloat16 where bf16 trains and this CPU has the kernel, else float32)
// and repacked before each generation when the base itself trains; LoRA adapters are read
// live. It samples; the train state (train.h) owns the weights.
#ifndef CT_POLICY_ENGINE_H
#define CT_POLICY_ENGINE_H

#include <stdbool.h>

#include "engine.h"
#include "plan.h"
#include "train.h"
#include "weights.h"

typedef struct {
  ct_infer_weights iw;  // the policy's weights as the engine reads them
  int pack;             // CT_PACK_F32 or CT_PACK_BF16
  bool repack;          // the base trains (no use_peft): its panels go stale with each step
  ct_engine *engine;    // NULL until ct_policy_engine_init
} ct_policy_engine;

// The panels' kind for tr's run, for the plan (before ct_policy_engine_init).
int ct_policy_engine_pack(const ct_train *tr);
// The memory plan's rows: the engine's KV cache over a model of config mc (eo's slots x
// positions) and, with `weights` (what is packed: "the weights", "the student"), the packed
// panels of kind pack, and with `peft` (tr's use_peft run, else NULL) its adapters packed
// for a generation (ct_engine_lora_pin).
void ct_policy_engine_plan(ct_plan *p, const ct_model_config *mc, const ct_engine_opts *eo, int pack,
                           const char *weights, const ct_train *peft);
// The engine over tr's model (and its adapters with use_peft), packed as pack says.
int ct_policy_engine_init(ct_policy_engine *p, ct_train *tr, int pack, const ct_engine_opts *eo);
// Before a generation: the panels as trained so far (nothing to do for LoRA, or before init).
int ct_policy_engine_sync(ct_policy_engine *p);
void ct_policy_engine_free(ct_policy_engine *p);

#endif
