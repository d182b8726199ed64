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
  const ct_prompt_set *set;
  ct_grpo_rollout *ro;
  int per;      // samples per prompt
  int per_req;  // per ct_generate request (1 with an environment: a request per episode)
  bool train;
  long done, total;  // completions (for the progress line)
  double tokens;     // completion tokens so far
} gen_ctx;

static int on_done(void *ctx, const ct_gen_result *r) {
  gen_ctx *c = ctx;
  ct_grpo *g = c->g;
  c->tokens += r->n;
  if (c->train) ct_log_phase(&g->tr->log, g->tr->step + 1, "rollouts", ++c->done, c->total, "completions", c->tokens, NULL);
  ct_grpo_rollout *ro = &c->ro[r->request * c->per_req + r->sample];
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
  ro->env_reward = NAN;
  if (g->agent) {
    ct_grpo_episode e;
    int rc = ct_grpo_agent_take(g->agent, r, &e);
    if (rc) return rc;
    ro->turns = e.turns, ro->tool_calls = e.calls, ro->tool_failures = e.failures;
    ro->own_prompt = e.prompt_ids, ro->prompt_msgs = e.prompt, ro->env_steps = e.steps, ro->env_reward = e.env_reward;
    for (size_t i = 0; i < json_array_size(ro->turns); i++) {
      const char *role = json_string_value(json_object_get(json_array_get(ro->turns, i), "role"));
      ro->n_turns += role && !strcmp(role, "assistant");
    }
    if (ro->own_prompt.n && ct_tokenizer_decode(g->tr->tok, ro->own_prompt.v, ro->own_prompt.n, &ro->prompt_text, NULL))
      return ct_wrap_error(CT_ENOMEM, "grpo: decoding a prompt");
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
    json_decref(ro[i].prompt_msgs);
    ct_ids_free(&ro[i].own_prompt);
    free(ro[i].prompt_text);
    ct_free_all(ro[i].ids, ro[i].old, ro[i].ref, ro[i].lp, ro[i].text, ro[i].tool_mask, ro[i].ord);
    memset(&ro[i], 0, sizeof ro[i]);
  }
}

const ct_ids *ct_grpo_prompt_ids(const ct_grpo *g, const ct_grpo_rollout *r) {
  return r->own_prompt.n ? &r->own_prompt : &g->prompts.ids[r->prompt];
}

const char *ct_grpo_prompt_text(const ct_prompt_set *set, const ct_grpo_rollout *r) {
  return r->prompt_text ? r->prompt_text : set->text[r->prompt];
}

void ct_grpo_batch(ct_grpo *g, int first, int n, bool share) {
  for (int i = 0; i < n; i++) {
    const ct_grpo_rollout *r = &g->ro[first + i];
    const ct_ids *p = ct_grpo_prompt_ids(g, r);
    g->seqs[i] = (ct_prompt_completion){p->v, r->ids, p->n, r->n, r->tool_mask};  // tool results: no loss
  }
  // a row holds a group's completions at most (as g->row_T counts)
  ct_batch_completions(&g->batch, g->seqs, n, ct_tokenizer_pad(g->tr->tok), share && g->row_T > 0 ? g->G : 1, g->row_T);
}

ct_grpo_rollout *ct_grpo_gathered(ct_grpo *g, int first, int q, int *j) {
  int at = g->head.rows[q];
  ct_grpo_rollout *r = &g->ro[first + g->batch.tok_seq[at]];
  *j = g->batch.tok_j[at];
  if (r->ord) *j = r->ord[*j];  // its index among the model's tokens
  return r;
}

int ct_grpo_ref_logps(ct_grpo *g) {
  int B = (int)g->cfg->per_device_train_batch_size;
  for (int first = 0; first < g->n_ro; first += B) {
    // the policy's rows (step 1's KL is then exactly 0); one row per completion for an int8
    // reference, which runs on the engine (no shared prefix there)
    ct_grpo_batch(g, first, g->n_ro - first < B ? g->n_ro - first : B, g->ref.dtype != CT_STORE_INT8);
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

// The environment's name for this generation's episodes: "train-<step>-<k>" (the k-th
// generation of that step: dynamic sampling makes several) or "eval-<step>-<k>".
static void episode_tag(ct_grpo *g, bool train, char *tag, size_t cap) {
  long step = g->tr->step + (train ? 1 : 0);
  if (step != g->tag_step || train != g->tag_train) g->tag_step = step, g->tag_train = train, g->tag_k = 0;
  snprintf(tag, cap, "%s-%ld-%d", train ? "train" : "eval", step, g->tag_k++);
}

int ct_grpo_generate(ct_grpo *g, const ct_prompt_set *set, const int *prompts, int n_prompts, int per,
                     ct_sample_params sp, ct_grpo_rollout *ro, bool train) {
  const ct_config *c = g->cfg;
  ct_train *tr = g->tr;
  bool env = ct_grpo_agent_env(g->agent);  // a request per episode: each has its own prompt
  int per_req = env ? 1 : per, nreq = env ? n_prompts * per : n_prompts;
  ct_gen_request *req = calloc(nreq > 0 ? nreq : 1, sizeof *req);
  if (!req) return ct_set_error(CT_ENOMEM, "out of memory");
  int rc = ct_policy_engine_sync(&g->pe);  // the weights as trained so far
  if (rc) return free(req), rc;
  const int *stop_ids;
  int n_stop = ct_tokenizer_stop_ids(tr->tok, &stop_ids);
  char tag[64];
  episode_tag(g, train, tag, sizeof tag);
  const char *path = set == &g->eval ? c->eval_dataset_path : c->dataset_path;
  if (g->agent && (rc = ct_grpo_agent_begin(g->agent, set, path, prompts, n_prompts, per, (int)c->max_completion_length,
                                            tag)))
    return free(req), rc;
  for (int i = 0; i < n_prompts; i++) {
    uint64_t seed = (uint64_t)c->seed * 1000003u + (uint64_t)tr->step * 7919u + (uint64_t)prompts[i];
    for (int k = 0; k < per; k++) ro[i * per + k].prompt = prompts[i];
    for (int k = 0; k < per / per_req; k++) {  // (env: each sample its own stream, as it would be in a group)
      const ct_ids *p = env ? ct_grpo_agent_prompt(g->agent, i * per + k) : &set->ids[prompts[i]];
      req[i * (per / per_req) + k] = (ct_gen_request){
          .prompt = p->v, .prompt_len = p->n, .n = per_req, .seed = env ? seed * 1000033u + (uint64_t)k : seed,
          .sp = sp, .max_new_tokens = (int)c->max_completion_length, .stop_ids = stop_ids, .n_stop_ids = n_stop};
    }
  }
  gen_ctx ctx = {g, set, ro, per, per_req, train, 0, (long)n_prompts * per, 0};
  ct_gen_callbacks cb = {.on_done = on_done, .ctx = &ctx};
  if (g->agent) cb.on_turn = ct_grpo_agent_turn, cb.poll = ct_grpo_agent_poll, cb.turn_ctx = g->agent;
  if (train) ct_log_phase(&tr->log, tr->step + 1, "rollouts", 0, ctx.total, "completions", 0, NULL);
  rc = ct_generate(g->pe.engine, tr->tok, req, nreq, &cb);
  free(req);
  return rc ? ct_wrap_error(rc, "generating completions") : 0;
}

// R (n, K): each reward function's score of each completion (NaN where one could not
