// grpo/agent: the rounds of a generation's acting samples — the queues of requests to tools
// and environments, the worker threads that run them, the continuations handed back to
// ct_generate, and each sample's record of its episode.
#include "grpo/agent.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "grpo/agent_internal.h"
#include "calculator.h"
#include "jsonl.h"
#include "mem.h"
#include "stop.h"
#include "toolcall.h"
#include "unicode.h"

// ---------------------------------------------------------------------------------------
// queues and workers

static void push_to(job **head, job **tail, job *j) {
  j->next = NULL;
  if (*tail) (*tail)->next = j;
  else *head = j;
  *tail = j;
}

static job *pop(job **head, job **tail) {
  job *j = *head;
  if (j && !(*head = j->next)) *tail = NULL;
  return j;
}

void ct_agent_push(ct_grpo_agent *t, job *j, bool done) {
  pthread_mutex_lock(&t->mu);
  if (done) {
    push_to(&t->done, &t->done_tail, j);
    pthread_cond_signal(&t->done_cv);
  } else {
    push_to(&t->todo, &t->todo_tail, j);
    pthread_cond_signal(&t->todo_cv);
  }
  pthread_mutex_unlock(&t->mu);
}

// Waits up to a quarter second at a time, for the stop signal's sake (ct_stop_poll acts on
// the generating thread).
job *ct_agent_next_done(ct_grpo_agent *t, bool wait) {
  pthread_mutex_lock(&t->mu);
  while (!t->done && wait) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 250000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&t->done_cv, &t->mu, &ts);
    if (!t->done) {
      pthread_mutex_unlock(&t->mu);
      ct_stop_poll("tool calls and environment steps", 0, 0);
      pthread_mutex_lock(&t->mu);
    }
  }
  job *j = pop(&t->done, &t->done_tail);
  pthread_mutex_unlock(&t->mu);
  return j;
}

void ct_agent_free_job(job *j) {
  json_decref(j->calls);
  json_decref(j->results);
  ct_free_all(j->row, j->body, j->observation, j);
}

typedef struct {
  ct_grpo_agent *t;
  int k;
} worker_arg;

static void *worker(void *p) {
  worker_arg *a = p;
  ct_grpo_agent *t = a->t;
  int k = a->k;
  free(a);
  pthread_mutex_lock(&t->mu);
  for (;;) {
    while (!t->todo && !t->quit) pthread_cond_wait(&t->todo_cv, &t->mu);
    if (t->quit) break;
    job *j = pop(&t->todo, &t->todo_tail);
    pthread_mutex_unlock(&t->mu);
    if (j->kind == JOB_TOOLS && ct_agent_run_calls(t, j, t->tool_http ? t->tool_http[k] : NULL)) {
      json_decref(j->results);  // out of memory: the job comes back without results
      j->results = NULL;
    }
    if (j->kind != JOB_TOOLS) ct_agent_run_env(j, j->kind == JOB_RESET ? t->reset_http[k] : t->step_http[k]);
    pthread_mutex_lock(&t->mu);
    push_to(&t->done, &t->done_tail, j);
    pthread_cond_signal(&t->done_cv);
  }
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

// ---------------------------------------------------------------------------------------
// set-up

static int key_error(const ct_config *c, const char *key, const char *msg) {
  return ct_set_error(CT_ECONFIG, "%s: key '%s': %s", ct_config_origin(c, key), key, msg);
}

static int start_workers(ct_grpo_agent *t) {
  const ct_config *c = t->cfg;
  int n = t->nworkers = (int)c->tool_concurrency;
  t->threads = calloc(n, sizeof *t->threads);
  t->tool_http = t->tool_server ? calloc(n, sizeof *t->tool_http) : NULL;
  t->reset_http = t->env ? calloc(n, sizeof *t->reset_http) : NULL;
  t->step_http = t->env ? calloc(n, sizeof *t->step_http) : NULL;
  if (!t->threads || (t->tool_server && !t->tool_http) || (t->env && (!t->reset_http || !t->step_http)))
    return ct_set_error(CT_ENOMEM, "out of memory");
  ct_http_opts o = {c->tool_url, c->tool_api_key_env, c->tool_connect_timeout, c->tool_timeout,
                    (int)c->tool_retries, c->tool_backoff, "tool server", "tool_", c};
  for (int k = 0; k < n; k++) {
    int rc = t->tool_server ? ct_http_init(&t->tool_http[k], &o) : 0;
    if (!rc && t->env) rc = ct_agent_env_connect(c, &t->reset_http[k], &t->step_http[k]);
    if (rc) return rc;
  }
  // the workers take no signals: a stop reaches the generating thread, whose poll acts on it
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  int rc = 0;
  for (int k = 0; k < n; k++) {
    worker_arg *a = malloc(sizeof *a);
    if (a) *a = (worker_arg){t, k};
    if (!a || pthread_create(&t->threads[k], NULL, worker, a)) {
      free(a);
      rc = ct_set_error(CT_EIO, "grpo: cannot start a thread for tool calls and environment steps");
      break;
    }
    t->nstarted = k + 1;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc;
}

// tools: the built-in tools' names into t (their schemas), else a config error.
static int builtin_tools(ct_grpo_agent *t) {
  const ct_config *c = t->cfg;
  for (int i = 0; i < c->tools.n; i++) {
    if (strcmp(c->tools.v[i], "calculator")) {
      char msg[300];
      snprintf(msg, sizeof msg, "'%.200s' is no built-in tool (calculator); other tools run on tool_url", c->tools.v[i]);
      return key_error(c, "tools", msg);
    }
    t->calculator = true;
    if (!t->schemas && !(t->schemas = json_array())) return ct_set_error(CT_ENOMEM, "out of memory");
    if (json_array_append_new(t->schemas, ct_calculator_schema())) return ct_set_error(CT_ENOMEM, "out of memory");
  }
  return 0;
}

static int check_unused(const ct_config *c, bool tools, bool env) {
  static const char *const tool_keys[] = {"max_tool_calling_iterations", "tool_call_format", "tool_api_key_env",
                                          "tool_timeout", "tool_connect_timeout", "tool_retries", "tool_backoff"};
  static const char *const env_keys[] = {"max_turns", "env_api_key_env", "env_timeout", "env_connect_timeout",
                                         "env_retries", "env_backoff"};
  for (size_t i = 0; !tools && i < sizeof tool_keys / sizeof *tool_keys; i++)
    if (ct_config_is_set(c, tool_keys[i]))
      return key_error(c, tool_keys[i], "configures tool calls, and neither tools nor tool_url offers a tool");
  for (size_t i = 0; !env && i < sizeof env_keys / sizeof *env_keys; i++)
    if (ct_config_is_set(c, env_keys[i])) return key_error(c, env_keys[i], "configures an environment, and env_url is not set");
  if (!tools && !env && ct_config_is_set(c, "tool_concurrency"))
    return key_error(c, "tool_concurrency", "sizes the requests to tool and environment servers, and neither is set");
  return 0;
}

int ct_grpo_agent_init(ct_grpo_agent **out, const ct_config *c, const ct_tokenizer *tok) {
  *out = NULL;
  bool tool_server = c->tool_url && c->tool_url[0], env = c->env_url && c->env_url[0];
  bool tools = c->tools.n || tool_server;
  int rc = check_unused(c, tools, env);
  if (rc || (!tools && !env)) return rc;
  if (env && c->max_prompt_length <= 0)
    return key_error(c, "max_prompt_length", "env_url needs a limit (> 0): the room for an episode's prompt, which "
                     "the environment's first observation completes");
  ct_grpo_agent *t = calloc(1, sizeof *t);
  if (!t) return ct_set_error(CT_ENOMEM, "out of memory");
  *t = (ct_grpo_agent){.cfg = c, .tok = tok, .tool_server = tool_server, .env = env};
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->todo_cv, NULL);
  pthread_cond_init(&t->done_cv, NULL);
  rc = builtin_tools(t);
  if (!rc && tools) {
    t->format = c->tool_call_format == CT_TOOLFMT_HERMES        ? CT_TOOLCALL_HERMES
                : c->tool_call_format == CT_TOOLFMT_LLAMA3_JSON ? CT_TOOLCALL_LLAMA3_JSON
                                                                : ct_toolcall_format_of(ct_tokenizer_chat_template_src(tok));
    if (t->format < 0) {  // (the most common format; said, not silent)
      t->format = CT_TOOLCALL_HERMES;
      fprintf(stderr, "ctune: tool_call_format: the chat template shows no tool-call format; reading hermes "
              "<tool_call> blocks (set tool_call_format: llama3_json for Llama 3's JSON calls)\n");
    }
  }
  if (!tools) t->format = -1;  // (an environment alone: no turn is read for calls)
  if (!rc && (tool_server || env)) rc = start_workers(t);
  if (rc) {
    ct_grpo_agent_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

static void end_generation(ct_grpo_agent *t) {
  for (int i = 0; i < t->nst; i++) {
    json_decref(t->st[i].turns);
    json_decref(t->st[i].prompt);
    ct_ids_free(&t->st[i].prompt_ids);
  }
  free(t->st);
  t->st = NULL;
  t->nst = 0;
}

void ct_grpo_agent_free(ct_grpo_agent *t) {
  if (!t) return;
  pthread_mutex_lock(&t->mu);
  t->quit = true;
  pthread_cond_broadcast(&t->todo_cv);
  pthread_mutex_unlock(&t->mu);
  for (int k = 0; k < t->nstarted; k++) pthread_join(t->threads[k], NULL);
  for (job *j; (j = pop(&t->todo, &t->todo_tail));) ct_agent_free_job(j);
  for (job *j; (j = pop(&t->done, &t->done_tail));) ct_agent_free_job(j);
  for (int k = 0; k < t->nworkers; k++) {
    if (t->tool_http) ct_http_free(t->tool_http[k]);
    if (t->reset_http) ct_http_free(t->reset_http[k]);
    if (t->step_http) ct_http_free(t->step_http[k]);
  }
  end_generation(t);
  ct_ids_free(&t->suffix);
  json_decref(t->schemas);
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->todo_cv);
  pthread_cond_destroy(&t->done_cv);
  ct_free_all(t->tool_http, t->reset_http, t->step_http, t->threads, t);
}

const json_t *ct_grpo_agent_schemas(const ct_grpo_agent *t) { return t ? t->schemas : NULL; }
bool ct_grpo_agent_env(const ct_grpo_agent *t) { return t && t->env; }

// ---------------------------------------------------------------------------------------
// a generation

const json_t *ct_agent_row(const ct_grpo_agent *t, int idx) { return t->set->rows[t->prompts[idx / t->per]]; }

char *ct_agent_row_text(const json_t *row) {
  json_t *r = json_deep_copy(row);
  static const char *const drop[] = {"prompt", "messages", "conversations", "prompt_input_ids", "tools",
                                     "chat_template_kwargs"};
  for (size_t i = 0; r && i < sizeof drop / sizeof *drop; i++) json_object_del(r, drop[i]);
  char *s = r ? json_dumps(r, JSON_COMPACT) : NULL;
  json_decref(r);
  return s;
}

int ct_grpo_agent_begin(ct_grpo_agent *t, const ct_prompt_set *set, const char *path, const int *prompts, int n,
                        int per, int max_new, const char *tag) {
  end_generation(t);
  t->set = set;
  t->path = path;
  t->prompts = prompts;
  t->per = per;
  t->per_req = t->env ? 1 : per;
  t->max_new = max_new;
  t->nst = n * per;
  if (!(t->st = calloc(t->nst > 0 ? t->nst : 1, sizeof *t->st))) return ct_set_error(CT_ENOMEM, "out of memory");
  for (int i = 0; i < t->nst; i++) {
    t->st[i].env_reward = NAN;
    if (!(t->st[i].turns = json_array())) return ct_set_error(CT_ENOMEM, "out of memory");
  }
  return t->env ? ct_agent_env_reset(t, tag) : 0;
}

const ct_ids *ct_grpo_agent_prompt(const ct_grpo_agent *t, int i) { return &t->st[i].prompt_ids; }

// The sample of ct_generate's (request, sample).
static int sample_of(const ct_grpo_agent *t, int request, int sample) { return request * t->per_req + sample; }

// The assistant message of a turn: its text, and its calls as "tool_calls" (the well-formed
// ones, as the chat template renders them).
static json_t *assistant_turn(const char *text, size_t n, const json_t *calls) {
  size_t len;
  char *valid = ct_utf8_lossy(text, n, &len);  // a turn may end inside a character
  json_t *m = valid ? json_pack("{s:s, s:s%}", "role", "assistant", "content", valid, len) : NULL;
  free(valid);
  json_t *tc = json_array();
  for (size_t i = 0; m && tc && i < json_array_size(calls); i++) {
    const json_t *c = json_array_get(calls, i);
    if (json_object_get(c, "error")) continue;
    json_array_append_new(tc, json_pack("{s:s, s:{s:O, s:O}}", "type", "function", "function", "name",
                                        json_object_get(c, "name"), "arguments", json_object_get(c, "arguments")));
  }
  if (m && tc && json_array_size(tc)) json_object_set(m, "tool_calls", tc);
  json_decref(tc);
  return m;
}

// A turn with calls: runs them (here when all are built in, else on the workers); 1 (the
// sample waits) or an error.
static int call_tools(ct_grpo_agent *t, int idx, json_t *calls) {
  sample_state *s = &t->st[idx];
  s->rounds++;
  s->calls += (int)json_array_size(calls);
  job *j = calloc(1, sizeof *j);
  if (!j) return json_decref(calls), ct_set_error(CT_ENOMEM, "out of memory");
  *j = (job){.kind = JOB_TOOLS, .idx = idx, .calls = calls};
  bool remote = ct_agent_needs_server(t, calls);
  if (remote && !(j->row = ct_agent_row_text(ct_agent_row(t, idx))))
    return ct_agent_free_job(j), ct_set_error(CT_ENOMEM, "out of memory");
  if (!remote && ct_agent_run_calls(t, j, NULL)) return ct_agent_free_job(j), ct_set_error(CT_ENOMEM, "out of memory");
  ct_agent_push(t, j, !remote);
  return 1;
}

// A turn as the environment's action: 1 (the sample waits for the step) or an error.
static int step_env(ct_grpo_agent *t, int idx, const char *text, size_t n) {
  size_t len;
  char *action = ct_utf8_lossy(text, n, &len);
  json_t *b = action ? json_pack("{s:s, s:s%}", "episode", t->st[idx].episode, "action", action, len) : NULL;
  char *body = b ? json_dumps(b, JSON_COMPACT) : NULL;
  job *j = body ? calloc(1, sizeof *j) : NULL;
  free(action);
  json_decref(b);
  if (!j) return free(body), ct_set_error(CT_ENOMEM, "out of memory");
  *j = (job){.kind = JOB_STEP, .idx = idx, .body = body};
  ct_agent_push(t, j, false);
  return 1;
}

int ct_grpo_agent_turn(void *ctx, const ct_gen_result *r) {
  ct_grpo_agent *t = ctx;
  int idx = sample_of(t, r->request, r->sample);
  sample_state *s = &t->st[idx];
  s->n = r->n;
  json_t *calls = t->format >= 0 ? ct_toolcall_parse(t->format, r->text, r->text_len) : json_array();
  json_t *m = calls ? assistant_turn(r->text, r->text_len, calls) : NULL;
  if (!m || json_array_append_new(s->turns, m)) return json_decref(calls), ct_set_error(CT_ENOMEM, "out of memory");
  long limit = t->cfg->max_tool_calling_iterations;
  if (json_array_size(calls) && (limit < 0 || s->rounds < limit)) return call_tools(t, idx, calls);
  json_decref(calls);
  return t->env ? step_env(t, idx, r->text, r->text_len) : 0;
}

// A tool job's results into the sample: 1 with the continuation in t->suffix, 0 when it
// ends (the results do not fit), or an error.
static int tools_answer(ct_grpo_agent *t, job *j, int *cont) {
  sample_state *s = &t->st[j->idx];
  *cont = 0;
  if (!j->results) return ct_set_error(CT_ENOMEM, "tool calls: out of memory");
  s->failures += j->failures;
  t->suffix.n = 0;
  ct_chat_opts co;
  int rc = ct_row_chat_opts(ct_agent_row(t, j->idx), true, &co);
  if (!rc) rc = ct_toolcall_suffix(t->tok, j->results, &co, &t->suffix);
  if (rc) {
    char where[4200];
    ct_jsonl_where(where, sizeof where, t->path, t->set->line[t->prompts[j->idx / t->per]]);
    return ct_wrap_error(rc, "%s: giving tool results back through the chat template", where);
  }
  if (s->n + t->suffix.n < t->max_new) {  // else the completion ends as it stands (TRL drops them)
    json_array_extend(s->turns, j->results);
    s->n += t->suffix.n;
    *cont = 1;
  }
  return 0;
}

int ct_grpo_agent_poll(void *ctx, bool wait, ct_gen_cont *c) {
  ct_grpo_agent *t = ctx;
  job *j = ct_agent_next_done(t, wait);
  if (!j) return 0;
  int cont, rc = j->kind == JOB_TOOLS ? tools_answer(t, j, &cont) : ct_agent_env_answer(t, j, &cont);
  int idx = j->idx;
  ct_agent_free_job(j);
  if (rc) return rc;
  *c = (ct_gen_cont){idx / t->per_req, idx % t->per_req, t->suffix.v, cont ? t->suffix.n : 0};
  return 1;
}

int ct_grpo_agent_take(ct_grpo_agent *t, const ct_gen_result *r, ct_grpo_episode *e) {
  sample_state *s = &t->st[sample_of(t, r->request, r->sample)];
  if (r->finish == CT_FINISH_LENGTH &&  // the last turn never ended: it was not recorded
      json_array_append_new(s->turns, assistant_turn(r->text, r->text_len, NULL)))
    return ct_set_error(CT_ENOMEM, "out of memory");
  *e = (ct_grpo_episode){s->turns, s->prompt, s->prompt_ids, s->calls, s->failures, s->steps, s->env_reward};
  s->turns = json_array();
  s->prompt = NULL;
  s->prompt_ids = (ct_ids){0};
  return s->turns ? 0 : ct_set_error(CT_ENOMEM, "out of memory");
}
