// grpo/agent_internal: what grpo/agent.c (the loop, the queues, the workers), agent_calls.c
// (tool calls) and agent_env.c (the environment server) share.
#pragma once
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>

#include "grpo/agent.h"
#include "http.h"

enum { JOB_TOOLS, JOB_RESET, JOB_STEP };

// One request to a tool or the environment, from the sample that made it to the answer.
typedef struct job {
  int kind;         // JOB_*
  int idx;          // the sample (index into the generation's samples)
  // JOB_TOOLS: in calls (ct_toolcall_parse's list) and the row (JSON text, for the tool
  // server); out the tool messages in call order, and how many failed
  json_t *calls;
  char *row;
  json_t *results;
  int failures;
  // JOB_RESET, JOB_STEP: in the request body (JSON text); out the reply's parts, or why it
  // failed (failed, why)
  char *body;
  char *observation;
  double reward;
  bool has_reward, done, failed;
  char why[600];
  struct job *next;
} job;

// One sample's episode so far.
typedef struct {
  json_t *turns;      // the messages after the prompt
  int n;              // tokens so far
  int rounds, calls, failures;  // tool-call rounds, calls, failed calls
  char episode[96];   // the environment's id for it
  int steps;          // environment steps taken
  double env_reward;  // their rewards' sum (NaN once a step failed)
  json_t *prompt;     // with an environment: the prompt messages (the row's, then the first observation)
  ct_ids prompt_ids;  // ... tokenized
} sample_state;

struct ct_grpo_agent {
  const ct_config *cfg;
  const ct_tokenizer *tok;
  int format;        // CT_TOOLCALL_*
  bool calculator;   // offered
  json_t *schemas;   // the built-in tools' (NULL: none)
  bool tool_server;  // tool_url set
  bool env;          // env_url set
  // the workers (tool_concurrency of them), each with its own connections
  int nworkers, nstarted;
  pthread_t *threads;
  ct_http **tool_http, **reset_http, **step_http;  // (nworkers) or NULL
  pthread_mutex_t mu;
  pthread_cond_t todo_cv, done_cv;
  job *todo, *todo_tail, *done, *done_tail;
  bool quit;
  // the generation
  const ct_prompt_set *set;
  const char *path;  // the set's file, for messages
  const int *prompts;
  int per, per_req, max_new;  // samples per prompt; per ct_generate request (1 with an environment)
  sample_state *st;
  int nst;
  ct_ids suffix;     // the continuation handed back last (valid until the next poll)
};

void ct_agent_push(ct_grpo_agent *t, job *j, bool done);  // onto the todo or done queue
job *ct_agent_next_done(ct_grpo_agent *t, bool wait);
void ct_agent_free_job(job *j);
const json_t *ct_agent_row(const ct_grpo_agent *t, int idx);  // the sample's dataset row
char *ct_agent_row_text(const json_t *row);  // its fields but its prompt, as JSON text

// agent_calls.c: runs j's calls (h: the worker's tool-server connection, NULL for none);
// 0 or CT_ENOMEM.
int ct_agent_run_calls(ct_grpo_agent *t, job *j, ct_http *h);
// Whether any of the calls goes to the tool server.
bool ct_agent_needs_server(const ct_grpo_agent *t, const json_t *calls);

// agent_env.c: runs a reset or step (h: the worker's connection for it).
void ct_agent_run_env(job *j, ct_http *h);
// The connections of a worker to the environment server (env_url + /reset, /step).
int ct_agent_env_connect(const ct_config *c, ct_http **reset, ct_http **step);
// Resets one episode per sample (concurrently) and builds each sample's prompt.
int ct_agent_env_reset(ct_grpo_agent *t, const char *tag);
// A step's answer into the episode: 0 (it ends: *cont 0) or the continuation's tokens in
// t->suffix (*cont 1); negative for an error.
int ct_agent_env_answer(ct_grpo_agent *t, job *j, int *cont);
