// grpo/agent: rollouts that act — tool calls and multi-turn environments inside GRPO's
// generation, as TRL's GRPOTrainer runs its `tools` and `environment_factory`.
//
// Tool calls. A turn that ends with an end-of-turn token and holds tool calls
// (text/toolcall.h) makes its sample wait in its slot (infer/generate.h's on_turn); the
// calls run — built-in ones (calculator) at once, the others on the tool server
// (tool_url) — and their results, as tool messages rendered by the chat template, are fed
// into the same slot; the model's next turn follows. Up to max_tool_calling_iterations
// rounds. A malformed call, an unknown tool, a calculator error, or a tool server that
// fails after its retries gives the tool message {"error": "..."} and counts as a failed
// call (TRL turns a raising tool into {"error": str(e)}); the run goes on.
//   Tool server: POST tool_url {"name", "arguments", "row"} (row: the prompt row's fields
//   but its prompt) → 200 {"content": ...} (a string, or any JSON, given to the model as
//   its JSON text) or {"error": "..."} (the tool's own failure).
//
// Environments (env_url, agent_env.c). Each sample is an episode: its prompt is the row's
// messages and the observation of POST env_url/reset; each turn without tool calls is an
// action, POSTed to env_url/step, whose observation is fed back as the next user message
// until the environment says done or max_turns actions were taken. The episode's reward
// (the sum of its steps') is the reward function `env`.
//
// Both: the requests of a step run concurrently on tool_concurrency threads while the
// other slots decode. A round whose results would pass max_completion_length is dropped
// and the completion ends as it stands (TRL's rollback). Tool results and observations are
// not the model's tokens: they get no loss.
#pragma once
#include <jansson.h>
#include <stdbool.h>

#include "config.h"
#include "generate.h"
#include "prompts.h"
#include "tokenizer.h"

typedef struct ct_grpo_agent ct_grpo_agent;

// *out is NULL when the config offers neither tools nor an environment. Checks the tool
// names, the servers' options and the chat template's tool-call format (CT_ECONFIG naming
// the key); starts the worker threads when a server is used.
int ct_grpo_agent_init(ct_grpo_agent **out, const ct_config *c, const ct_tokenizer *tok);
void ct_grpo_agent_free(ct_grpo_agent *t);

// The built-in tools' schemas, for prompt rows without "tools" of their own (NULL: none).
const json_t *ct_grpo_agent_schemas(const ct_grpo_agent *t);
// An environment gives every sample its own prompt: one ct_generate request per sample.
bool ct_grpo_agent_env(const ct_grpo_agent *t);

// Starts a generation of `per` samples of each of the n prompts (indices into set, read
// from `path`); max_new: its max_new_tokens. With an environment it first resets an episode
// per sample (ids "tag-<prompt>-<sample>"), concurrently; a reset that fails is an error.
// Sample i of prompt p is ct_generate's request p·per + i, sample 0, with an environment;
// else request p, sample i.
int ct_grpo_agent_begin(ct_grpo_agent *t, const ct_prompt_set *set, const char *path, const int *prompts, int n,
                        int per, int max_new, const char *tag);
// With an environment: sample i's prompt tokens (index p·per + i).
const ct_ids *ct_grpo_agent_prompt(const ct_grpo_agent *t, int i);

// ct_generate's on_turn and poll (ctx: the ct_grpo_agent).
int ct_grpo_agent_turn(void *ctx, const ct_gen_result *r);
int ct_grpo_agent_poll(void *ctx, bool wait, ct_gen_cont *c);

// A finished sample's episode.
typedef struct {
  json_t *turns;       // the messages after the prompt (assistant turns with "tool_calls",
                       // tool messages, observations), a new reference
  json_t *prompt;      // with an environment: the prompt messages (new reference), else NULL
  ct_ids prompt_ids;   // ... and their tokens (the caller's to free)
  int calls, failures; // tool calls, failed ones
  int steps;           // environment steps
  double env_reward;   // the sum of their rewards; NaN without an environment or after a failed step
} ct_grpo_episode;

int ct_grpo_agent_take(ct_grpo_agent *t, const ct_gen_result *r, ct_grpo_episode *e);
