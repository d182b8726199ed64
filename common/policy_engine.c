// policy_engine: the engine over the policy being trained (policy_engine.h): its packing,
// its rows of the memory plan, set-up, the repack before a generation, and teardown.
#include "policy_engine.h"

#include <string.h>

#include "panel.h"

int ct_policy_engine_pack(const ct_train *tr) {
  return tr->bf16 && ct_panel16_native() ? CT_PACK_BF16 : CT_PACK_F32;
}

void ct_policy_engine_plan(ct_plan *p, const ct_model_config *mc, const ct_engine_opts *eo, int pack,
                           const char *weights, const ct_train *peft) {
  ct_plan_addf(p, ct_engine_bytes(mc, eo), "sampler: KV cache of %d slots x %d positions", eo->slots, eo->max_len);
  if (weights)
    ct_plan_addf(p, ct_infer_pack_bytes(mc, pack), "sampler: %s packed for decoding (%s)", weights,
                 pack == CT_PACK_BF16 ? "bfloat16" : "float32");
  if (!peft) return;
  ct_lora_config lc = ct_train_lora_config(peft->cfg);  // (an adapter_path's own config, if it reads)
  if (peft->cfg->adapter_path[0]) ct_lora_read_config(&lc, peft->cfg->adapter_path);
  ct_plan_addf(p, ct_lora_bytes(&lc, mc) + (pack == CT_PACK_BF16 && weights ? ct_infer_lora_ext_bytes(mc) : 0),
               "sampler: the LoRA adapters packed for a generation%s", pack == CT_PACK_BF16 && weights ? ", B in panels" : "");
}

int ct_policy_engine_init(ct_policy_engine *p, ct_train *tr, int pack, const ct_engine_opts *eo) {
  p->pack = pack;
  p->repack = !tr->cfg->use_peft;
  int rc = ct_infer_from_model(&p->iw, &tr->model);
  if (!rc) rc = ct_infer_attach_lora(&p->iw, tr->cfg->use_peft ? &tr->lora : NULL);
  if (!rc) rc = ct_infer_pack(&p->iw, pack);
  if (!rc) rc = ct_engine_init(&p->engine, &p->iw, eo);
  return rc;
}

int ct_policy_engine_sync(ct_policy_engine *p) {
  return p->engine && p->repack ? ct_infer_pack(&p->iw, p->pack) : 0;
}

void ct_policy_engine_free(ct_policy_engine *p) {
  if (p->engine) ct_engine_free(p->engine);
  ct_infer_free(&p->iw);
  memset(p, 0, sizeof *p);
}
