// grpo/tools: tool calls inside GRPO's rollouts, as TRL's GRPOTrainer runs its `tools`.
// A turn that ends with an end-of-turn token and holds tool calls (text/toolcall.h) makes
// its sample wait in its slot (infer/generate.h's on_turn); the calls run — built-in ones
// (calculator) at once, the others on the tool server (tool_url) from a pool of
// tool_concurrency threads while the other slots decode — and their results, as tool
// messages rendered by the chat template, are fed into the same slot; the model's next
// turn follows. Up to max_tool_calling_iterations rounds; a round whose results would pass
// max_completion_length is dropped and the completion ends as it stands (TRL's rollback).
//
// A malformed call, an unknown tool, a calculator error, or a tool server that fails after
// its retries gives the tool message {"error": "..."} as its content and counts as a failed
// call (TRL turns a raising tool into {"error": str(e)}); the run goes on.
//
// Tool server protocol: POST tool_url {"name", "arguments", "row"} (row: the prompt row's
// fields but its prompt) → 200 {"content": ...} (a string, or any JSON, which is sent to
// the model as its JSON text) or {"error": "..."} (the tool's own failure).
#pragma once
#include <jansson.h>
#include <stdbool.h>

#include "config.h"
#include "generate.h"
#include "prompts.h"
#include "tokenizer.h"

typedef struct ct_grpo_agent ct_grpo_agent;

// *out is NULL when the config offers no tools (neither `tools` nor `tool_url`). Checks
// the tool names, the tool server's options and the chat template's tool-call format
// (CT_ECONFIG naming the key); starts the tool server's threads.
int ct_grpo_agent_init(ct_grpo_agent **out, const ct_config *c, const ct_tokenizer *tok);
void ct_grpo_agent_free(ct_grpo_agent *t);

// The built-in tools' schemas, for prompt rows without "tools" of their own (NULL: none).
const json_t *ct_grpo_agent_schemas(const ct_grpo_agent *t);

// Starts a generation of `per` samples of each of the n prompts (indices into set),
// ct_generate's request i being prompts[i]; max_new: its max_new_tokens.
int ct_grpo_agent_begin(ct_grpo_agent *t, const ct_prompt_set *set, const int *prompts, int n, int per,
                        int max_new);

// ct_generate's on_turn and poll (ctx: the ct_grpo_agent).
int ct_grpo_agent_turn(void *ctx, const ct_gen_result *r);
int ct_grpo_agent_poll(void *ctx, bool wait, ct_gen_cont *c);

// A finished sample's trajectory: the messages after the prompt (assistant turns with their
// "tool_calls", tool messages), as a new reference, and its tool calls and failed calls.
json_t *ct_grpo_agent_take(ct_grpo_agent *t, const ct_gen_result *r, int *calls, int *failures);
