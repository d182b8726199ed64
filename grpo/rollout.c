// grpo/rollout: a step's completions, sampled through the engine over the policy's own
// weights, and the batches that carry them through the policy and the reference.
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "generate.h"
#include "grpo/grpo.h"
#include "lm.h"
#include "mem.h"


// Where ct_generate's finished samples go: ro[request · per + sample]; training rollouts
// also get room for old and reference log-probs.
typedef struct {
  ct_grpo *g;
  ct_grpo_rollout *ro;
  int per;
  bool train;
  long done, total;  // completions (for the progress line)
  double tokens;     // completion tokens so far
} gen_ctx;

static int on_done(void *ctx, const ct_gen_result *r) {
  gen_ctx *c = ctx;
  ct_grpo *g = c->g;
  c->tokens += r->n;
  if (c->train) ct_log_phase(&g->tr->log, g->tr->step + 1, "rollouts", ++c->done, c->total, "completions", c->tokens, NULL);
  ct_grpo_rollout *ro = &c->ro[r->request * c->per + r->sample];
  bool old = c->train && g->cfg->num_iterations > 1, ref = c->train && g->use_ref;
  ro->n = r->n;
  ro->n_own = r->n;
  size_t n = r->n ? r->n : 1;
  if (r->own) {
    ro->n_own = 0;
    for (int i = 0; i < r->n; i++) ro->n_own += r->own[i];
    if (!(ro->tool_mask = malloc(n)) || !(ro->q = malloc(sizeof(float) * n)) || !(ro->ord = malloc(sizeof(int) * n)))
      return ct_set_error(CT_ENOMEM, "grpo: out of memory");
    memcpy(ro->tool_mask, r->own, r->n);
    for (int i = 0, k = 0; i < r->n; i++) {
      ro->ord[i] = k;
      if (r->own[i]) ro->q[k++] = r->logprobs[i];
    }
  }
  if (g->agent) {
    ro->turns = ct_grpo_agent_take(g->agent, r, &ro->tool_calls, &ro->tool_failures);
    if (!ro->turns) return ct_set_error(CT_ENOMEM, "grpo: out of memory");
    for (size_t i = 0; i < json_array_size(ro->turns); i++)
      ro->n_turns += !strcmp(json_string_value(json_object_get(json_array_get(ro->turns, i), "role")), "assistant");
  }
  ro->ids = malloc(sizeof(int) * n);
  ro->text = malloc(r->text_len + 1);
  ro->old = old ? malloc(sizeof(float) * n) : NULL;
  ro->ref = ref ? malloc(sizeof(float) * n) : NULL;
  ro->lp = malloc(sizeof(float) * n);
  if (!ro->ids || !ro->text || !ro->lp || (old && !ro->old) || (ref && !ro->ref))
    return ct_set_error(CT_ENOMEM, "grpo: out of memory");
  memcpy(ro->ids, r->ids, sizeof(int) * r->n);
  memcpy(ro->lp, r->logprobs, sizeof(float) * r->n);
  if (!ro->q) ro->q = ro->lp;
  ro->finish = r->finish;
  memcpy(ro->text, r->text, r->text_len);
  ro->text[r->text_len] = 0;
  ro->truncated = r->finish == CT_FINISH_LENGTH;
  return 0;
}

void ct_grpo_rollouts_free(ct_grpo_rollout *ro, int n) {
  for (int i = 0; i < n; i++) {
    if (ro[i].q != ro[i].lp) free(ro[i].q);
    json_decref(ro[i].turns);
    ct_free_all(ro[i].ids, ro[i].old, ro[i].ref, ro[i].lp, ro[i].text, ro[i].tool_mask, ro[i].ord);
    memset(&ro[i], 0, sizeof ro[i]);
  }
}

void ct_grpo_batch(ct_grpo *g, int first, int n) {
  ct_batch *b = &g->batch;
  int T = 1, pad = ct_tokenizer_pad(g->tr->tok);
  for (int i = 0; i < n; i++) {
    const ct_grpo_rollout *r = &g->ro[first + i];
    int len = g->prompts.ids[r->prompt].n + r->n;
    T = len > T ? len : T;
  }
  b->B = n;
  b->T = T;
  b->n_target = b->n_tokens = 0;
  for (int i = 0; i < n; i++) {
    const ct_grpo_rollout *r = &g->ro[first + i];
    const ct_ids *p = &g->prompts.ids[r->prompt];
    ct_batch_row(b, i, p->v, p->n, r->ids, r->n, pad);
    ct_batch_drop_targets(b, i, p->n, r->tool_mask, r->n);  // tool results: no loss
  }
}

ct_grpo_rollout *ct_grpo_gathered(ct_grpo *g, int first, int q, int *j) {
  int T = g->batch.T, row = g->head.rows[q] / T, t = g->head.rows[q] % T;
  ct_grpo_rollout *r = &g->ro[first + row];
  *j = t + 1 - g->prompts.ids[r->prompt].n;
  if (r->ord) *j = r->ord[*j];  // its index among the model's tokens
  return r;
}

int ct_grpo_ref_logps(ct_grpo *g) {
  int B = (int)g->cfg->per_device_train_batch_size;
  for (int first = 0; first < g->n_ro; first += B) {
    ct_grpo_batch(g, first, g->n_ro - first < B ? g->n_ro - first : B);
    ct_frozen_through(&g->ref, &g->acts);  // (a LoRA policy's: idle until training)
    int k = ct_frozen_logps(&g->ref, &g->batch, &g->head), j;
    if (k < 0) return k;
    for (int q = 0; q < k; q++) {
      ct_grpo_rollout *r = ct_grpo_gathered(g, first, q, &j);
      r->ref[j] = g->head.logp[q];
    }
  }
  return 0;
}

int ct_grpo_generate(ct_grpo *g, const ct_prompt_set *set, const int *prompts, int n_prompts, int per,
                     ct_sample_params sp, ct_grpo_rollout *ro, bool train) {
  const ct_config *c = g->cfg;
  ct_train *tr = g->tr;
  ct_gen_request *req = calloc(n_prompts > 0 ? n_prompts : 1, sizeof *req);
  if (!req) return ct_set_error(CT_ENOMEM, "out of memory");
  int rc = ct_policy_engine_sync(&g->pe);  // the weights as trained so far
  if (rc) return free(req), rc;
  const int *stop_ids;
  int n_stop = ct_tokenizer_stop_ids(tr->tok, &stop_ids);
  if (g->agent && (rc = ct_grpo_agent_begin(g->agent, set, prompts, n_prompts, per, (int)c->max_completion_length)))
    return free(req), rc;
  for (int i = 0; i < n_prompts; i++) {
    const ct_ids *p = &set->ids[prompts[i]];
    uint64_t seed = (uint64_t)c->seed * 1000003u + (uint64_t)tr->step * 7919u + (uint64_t)prompts[i];
    req[i] = (ct_gen_request){.prompt = p->v, .prompt_len = p->n, .n = per, .seed = seed, .sp = sp,
                              .max_new_tokens = (int)c->max_completion_length,
                              .stop_ids = stop_ids, .n_stop_ids = n_stop};
    for (int k = 0; k < per; k++) ro[i * per + k].prompt = prompts[i];
  }
  gen_ctx ctx = {g, ro, per, train, 0, (long)n_prompts * per, 0};
  ct_gen_callbacks cb = {.on_done = on_done, .ctx = &ctx};
  if (g->agent) cb.on_turn = ct_grpo_agent_turn, cb.poll = ct_grpo_agent_poll, cb.turn_ctx = g->agent;
  if (train) ct_log_phase(&tr->log, tr->step + 1, "rollouts", 0, ctx.total, "completions", 0, NULL);
  rc = ct_generate(g->pe.engine, tr->tok, req, n_prompts, &cb);
  free(req);
  return rc ? ct_wrap_error(rc, "generating completions") : 0;
}

// R (n, K): each reward function's score of each completion (NaN where one could not
