// grpo/tools: the tool-call rounds of a generation — a queue of turns whose calls run,
// worker threads for the tool server, and the continuations handed back to ct_generate.
#include "grpo/agent.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "grpo/calculator.h"
#include "http.h"
#include "jsonl.h"
#include "mem.h"
#include "stop.h"
#include "toolcall.h"
#include "unicode.h"

// One turn's calls, from the turn that made them to the continuation that answers them.
typedef struct job {
  int req, sample;
  json_t *calls;    // ct_toolcall_parse's list (the job's own)
  char *row;        // the prompt row's fields but its prompt, as JSON text (the tool server's)
  json_t *results;  // the tool messages, in call order (filled by whoever runs the job)
  int failures;
  struct job *next;
} job;

typedef struct {
  json_t *turns;  // the messages after the prompt
  int n;          // tokens so far
  int rounds, calls, failures;
} sample_state;

struct ct_grpo_agent {
  const ct_config *cfg;
  const ct_tokenizer *tok;
  int format;        // CT_TOOLCALL_*
  bool calculator;   // offered
  json_t *schemas;   // the built-in tools' (NULL: none)
  bool remote;       // tool_url set
  // the tool server's workers
  int nworkers, nstarted;
  pthread_t *threads;
  ct_http **http;    // (nworkers) one connection each
  pthread_mutex_t mu;
  pthread_cond_t todo_cv, done_cv;
  job *todo, *todo_tail, *done, *done_tail;
  bool quit;
  // the generation
  const ct_prompt_set *set;
  const int *prompts;
  int per, max_new;
  sample_state *st;
  int nst;
  json_t *answered;  // the job handed back last: its ids are the continuation (kept until the next poll)
  ct_ids suffix;
};

// ---------------------------------------------------------------------------------------
// running calls

static json_t *tool_message(const char *name, const char *content) {
  return json_pack("{s:s, s:s, s:s}", "role", "tool", "name", name ? name : "unknown", "content", content);
}

// {"error": msg} as the content's JSON text.
static char *error_text(const char *msg) {
  json_t *e = json_pack("{s:s}", "error", msg);
  char *s = e ? json_dumps(e, JSON_COMPACT) : NULL;
  json_decref(e);
  return s;
}

static char *run_calculator(const json_t *args, bool *failed) {
  const json_t *e = json_object_get(args, "expression");
  char out[256];
  if (!json_is_string(e)) {
    *failed = true;
    return error_text("calculator: needs a string argument 'expression'");
  }
  if (ct_calculator_eval(json_string_value(e), out, sizeof out)) return strdup(out);
  *failed = true;
  char msg[300];
  snprintf(msg, sizeof msg, "calculator: %s", out);
  return error_text(msg);
}

// What a tool server's reply says: the content's text into *out.
typedef struct {
  char *content;
  bool tool_error;  // the reply was {"error"}
} reply_t;

static int read_reply(void *ctx, const ct_http *h, const char *body, size_t len, ct_http_failure *f) {
  reply_t *r = ctx;
  json_error_t je;
  json_t *j = json_loadb(body, len, 0, &je);
  const json_t *c = json_object_get(j, "content"), *e = json_object_get(j, "error");
  if (json_is_string(e) && !c) {
    r->content = error_text(json_string_value(e));
    r->tool_error = true;
  } else if (json_is_string(c)) {
    r->content = strdup(json_string_value(c));
  } else if (c) {
    r->content = json_dumps(c, JSON_COMPACT | JSON_ENCODE_ANY);
  } else {
    char text[96];
    ct_http_snippet(h, body, len, text, sizeof text);
    snprintf(f->what, sizeof f->what, "malformed reply");
    snprintf(f->detail, sizeof f->detail, "%s: \"%s\"", j ? "no \"content\" or \"error\"" : je.text, text);
    json_decref(j);
    return CT_HTTP_RETRY;
  }
  json_decref(j);
  return CT_HTTP_OK;
}

static char *run_remote(ct_http *h, const char *name, const json_t *args, const char *row, bool *failed) {
  json_t *body = json_pack("{s:s, s:O}", "name", name, "arguments", args);
  char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  if (!text) return NULL;
  // splice the row in as text (it was serialized on the generating thread)
  size_t n = strlen(text), m = strlen(row);
  char *full = malloc(n + m + 16);
  if (full) snprintf(full, n + m + 16, "%.*s,\"row\":%s}", (int)(n - 1), text, row);
  free(text);
  if (!full) return NULL;
  reply_t r = {0};
  ct_http_failure f;
  int tries, rc = ct_http_post(h, full, read_reply, &r, &f, &tries);
  free(full);
  if (rc == CT_HTTP_OK) {
    *failed = r.tool_error;
    return r.content;
  }
  free(r.content);
  *failed = true;
  char msg[512];
  snprintf(msg, sizeof msg, "tool server: %s after %d attempt%s%s%s", f.what, tries, tries == 1 ? "" : "s",
           f.detail[0] ? ": " : "", f.detail);
  return error_text(msg);
}

// Runs every call of j into j->results (h: a connection, NULL when none is needed).
// Returns 0, or CT_ENOMEM.
static int run_job(ct_grpo_agent *t, job *j, ct_http *h) {
  if (!(j->results = json_array())) return CT_ENOMEM;
  for (size_t i = 0; i < json_array_size(j->calls); i++) {
    const json_t *call = json_array_get(j->calls, i), *args = json_object_get(call, "arguments");
    const char *name = json_string_value(json_object_get(call, "name"));
    const char *err = json_string_value(json_object_get(call, "error"));
    bool failed = false;
    char *content;
    if (err) {
      failed = true;
      content = error_text(err);
    } else if (t->calculator && !strcmp(name, "calculator")) {
      content = run_calculator(args, &failed);
    } else if (h) {
      content = run_remote(h, name, args, j->row, &failed);
    } else {
      char msg[300];
      snprintf(msg, sizeof msg, "tool '%.200s' not found", name);
      failed = true;
      content = error_text(msg);
    }
    json_t *m = content ? tool_message(name, content) : NULL;
    free(content);
    if (!m || json_array_append_new(j->results, m)) return CT_ENOMEM;
    j->failures += failed;
  }
  return 0;
}

static bool needs_server(const ct_grpo_agent *t, const json_t *calls) {
  for (size_t i = 0; i < json_array_size(calls); i++) {
    const json_t *c = json_array_get(calls, i);
    const char *name = json_string_value(json_object_get(c, "name"));
    if (name && !json_object_get(c, "error") && !(t->calculator && !strcmp(name, "calculator"))) return t->remote;
  }
  return false;
}

static void push(job **head, job **tail, job *j) {
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

typedef struct {
  ct_grpo_agent *t;
  int k;
} worker_arg;

static void *worker(void *p) {
  worker_arg *a = p;
  ct_grpo_agent *t = a->t;
  ct_http *h = t->http[a->k];
  free(a);
  pthread_mutex_lock(&t->mu);
  for (;;) {
    while (!t->todo && !t->quit) pthread_cond_wait(&t->todo_cv, &t->mu);
    if (t->quit) break;
    job *j = pop(&t->todo, &t->todo_tail);
    pthread_mutex_unlock(&t->mu);
    if (run_job(t, j, h)) {  // out of memory: the job comes back without results
      json_decref(j->results);
      j->results = NULL;
    }
    pthread_mutex_lock(&t->mu);
    push(&t->done, &t->done_tail, j);
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
  t->nworkers = (int)c->tool_concurrency;
  t->http = calloc(t->nworkers, sizeof *t->http);
  t->threads = calloc(t->nworkers, sizeof *t->threads);
  if (!t->http || !t->threads) return ct_set_error(CT_ENOMEM, "out of memory");
  ct_http_opts o = {c->tool_url, c->tool_api_key_env, c->tool_connect_timeout, c->tool_timeout,
                    (int)c->tool_retries, c->tool_backoff, "tool server", "tool_", c};
  for (int k = 0; k < t->nworkers; k++) {
    int rc = ct_http_init(&t->http[k], &o);
    if (rc) return rc;
  }
  // the workers take no signals: a stop reaches the generating thread, whose poll acts on it
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  int rc = 0;
  for (int k = 0; k < t->nworkers; k++) {
    worker_arg *a = malloc(sizeof *a);
    if (a) *a = (worker_arg){t, k};
    if (!a || pthread_create(&t->threads[k], NULL, worker, a)) {
      free(a);
      rc = ct_set_error(CT_EIO, "tool server: cannot start a thread");
      break;
    }
    t->nstarted = k + 1;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc;
}

int ct_grpo_agent_init(ct_grpo_agent **out, const ct_config *c, const ct_tokenizer *tok) {
  *out = NULL;
  bool remote = c->tool_url && c->tool_url[0];
  if (!c->tools.n && !remote) {
    static const char *const keys[] = {"max_tool_calling_iterations", "tool_call_format", "tool_api_key_env",
                                       "tool_timeout", "tool_connect_timeout", "tool_retries", "tool_backoff",
                                       "tool_concurrency"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
      if (ct_config_is_set(c, keys[i])) return key_error(c, keys[i], "configures tool calls, and neither tools nor tool_url offers a tool");
    return 0;
  }
  ct_grpo_agent *t = calloc(1, sizeof *t);
  if (!t) return ct_set_error(CT_ENOMEM, "out of memory");
  t->cfg = c;
  t->tok = tok;
  t->remote = remote;
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->todo_cv, NULL);
  pthread_cond_init(&t->done_cv, NULL);
  int rc = 0;
  for (int i = 0; i < c->tools.n && !rc; i++) {
    if (!strcmp(c->tools.v[i], "calculator")) {
      t->calculator = true;
      if (!t->schemas && !(t->schemas = json_array())) rc = ct_set_error(CT_ENOMEM, "out of memory");
      if (!rc && json_array_append_new(t->schemas, ct_calculator_schema())) rc = ct_set_error(CT_ENOMEM, "out of memory");
    } else {
      char msg[300];
      snprintf(msg, sizeof msg, "'%.200s' is no built-in tool (calculator); other tools run on tool_url", c->tools.v[i]);
      rc = key_error(c, "tools", msg);
    }
  }
  if (!rc) {
    t->format = c->tool_call_format == CT_TOOLFMT_HERMES        ? CT_TOOLCALL_HERMES
                : c->tool_call_format == CT_TOOLFMT_LLAMA3_JSON ? CT_TOOLCALL_LLAMA3_JSON
                                                                : ct_toolcall_format_of(ct_tokenizer_chat_template_src(tok));
    if (t->format < 0)
      rc = key_error(c, "tool_call_format", "the chat template shows no tool-call format ctune reads (<tool_call> "
                     "blocks, Llama 3 JSON); set hermes or llama3_json, or a template (chat_template_path) that "
                     "renders tools");
  }
  if (!rc && remote) rc = start_workers(t);
  if (rc) {
    ct_grpo_agent_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

static void end_generation(ct_grpo_agent *t) {
  for (int i = 0; i < t->nst; i++) json_decref(t->st[i].turns);
  free(t->st);
  t->st = NULL;
  t->nst = 0;
  json_decref(t->answered);
  t->answered = NULL;
}

static void free_job(job *j) {
  json_decref(j->calls);
  json_decref(j->results);
  free(j->row);
  free(j);
}

void ct_grpo_agent_free(ct_grpo_agent *t) {
  if (!t) return;
  pthread_mutex_lock(&t->mu);
  t->quit = true;
  pthread_cond_broadcast(&t->todo_cv);
  pthread_mutex_unlock(&t->mu);
  for (int k = 0; k < t->nstarted; k++) pthread_join(t->threads[k], NULL);
  for (job *j; (j = pop(&t->todo, &t->todo_tail));) free_job(j);
  for (job *j; (j = pop(&t->done, &t->done_tail));) free_job(j);
  for (int k = 0; t->http && k < t->nworkers; k++) ct_http_free(t->http[k]);
  end_generation(t);
  ct_ids_free(&t->suffix);
  json_decref(t->schemas);
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->todo_cv);
  pthread_cond_destroy(&t->done_cv);
  ct_free_all(t->http, t->threads);
  free(t);
}

const json_t *ct_grpo_agent_schemas(const ct_grpo_agent *t) { return t ? t->schemas : NULL; }

// ---------------------------------------------------------------------------------------
// a generation

int ct_grpo_agent_begin(ct_grpo_agent *t, const ct_prompt_set *set, const int *prompts, int n, int per,
                        int max_new) {
  end_generation(t);
  t->set = set;
  t->prompts = prompts;
  t->per = per;
  t->max_new = max_new;
  t->nst = n * per;
  if (!(t->st = calloc(t->nst > 0 ? t->nst : 1, sizeof *t->st))) return ct_set_error(CT_ENOMEM, "out of memory");
  for (int i = 0; i < t->nst; i++)
    if (!(t->st[i].turns = json_array())) return ct_set_error(CT_ENOMEM, "out of memory");
  return 0;
}

static const json_t *row_of(const ct_grpo_agent *t, int req) { return t->set->rows[t->prompts[req]]; }

// The row's fields but its prompt, as JSON text, for the tool server.
static char *row_text(const json_t *row) {
  json_t *r = json_deep_copy(row);
  static const char *const drop[] = {"prompt", "messages", "conversations", "prompt_input_ids", "tools",
                                     "chat_template_kwargs"};
  for (size_t i = 0; r && i < sizeof drop / sizeof *drop; i++) json_object_del(r, drop[i]);
  char *s = r ? json_dumps(r, JSON_COMPACT) : NULL;
  json_decref(r);
  return s;
}

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

int ct_grpo_agent_turn(void *ctx, const ct_gen_result *r) {
  ct_grpo_agent *t = ctx;
  sample_state *s = &t->st[r->request * t->per + r->sample];
  s->n = r->n;
  json_t *calls = ct_toolcall_parse(t->format, r->text, r->text_len);
  json_t *m = calls ? assistant_turn(r->text, r->text_len, calls) : NULL;
  if (!m || json_array_append_new(s->turns, m)) return json_decref(calls), ct_set_error(CT_ENOMEM, "out of memory");
  long limit = t->cfg->max_tool_calling_iterations;
  if (!json_array_size(calls) || (limit >= 0 && s->rounds >= limit)) {
    json_decref(calls);
    return 0;
  }
  s->rounds++;
  s->calls += (int)json_array_size(calls);
  job *j = calloc(1, sizeof *j);
  if (!j) return json_decref(calls), ct_set_error(CT_ENOMEM, "out of memory");
  *j = (job){.req = r->request, .sample = r->sample, .calls = calls};
  if (needs_server(t, calls)) {
    if (!(j->row = row_text(row_of(t, r->request)))) return free_job(j), ct_set_error(CT_ENOMEM, "out of memory");
    pthread_mutex_lock(&t->mu);
    push(&t->todo, &t->todo_tail, j);
    pthread_cond_signal(&t->todo_cv);
    pthread_mutex_unlock(&t->mu);
  } else {  // built-in calls run here, now
    if (run_job(t, j, NULL)) return free_job(j), ct_set_error(CT_ENOMEM, "out of memory");
    pthread_mutex_lock(&t->mu);
    push(&t->done, &t->done_tail, j);
    pthread_mutex_unlock(&t->mu);
  }
  return 1;
}

// The next answered job (waiting up to a quarter second at a time when `wait`, for the
// stop signal's sake), or NULL.
static job *next_done(ct_grpo_agent *t, bool wait) {
  pthread_mutex_lock(&t->mu);
  while (!t->done && wait) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 250000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&t->done_cv, &t->mu, &ts);
    if (!t->done) {
      pthread_mutex_unlock(&t->mu);
      ct_stop_poll("tool calls", 0, 0);
      pthread_mutex_lock(&t->mu);
    }
  }
  job *j = pop(&t->done, &t->done_tail);
  pthread_mutex_unlock(&t->mu);
  return j;
}

int ct_grpo_agent_poll(void *ctx, bool wait, ct_gen_cont *c) {
  ct_grpo_agent *t = ctx;
  job *j = next_done(t, wait);
  if (!j) return 0;
  if (!j->results) return free_job(j), ct_set_error(CT_ENOMEM, "tool calls: out of memory");
  sample_state *s = &t->st[j->req * t->per + j->sample];
  s->failures += j->failures;
  t->suffix.n = 0;
  ct_chat_opts co;
  const json_t *row = row_of(t, j->req);
  int rc = ct_row_chat_opts(row, true, &co);
  if (!rc) rc = ct_toolcall_suffix(t->tok, j->results, &co, &t->suffix);
  if (rc) {
    char where[4200];
    ct_jsonl_where(where, sizeof where, t->cfg->dataset_path, t->set->line[t->prompts[j->req]]);
    free_job(j);
    return ct_wrap_error(rc, "%s: giving tool results back through the chat template", where);
  }
  *c = (ct_gen_cont){j->req, j->sample, t->suffix.v, t->suffix.n};
  if (s->n + t->suffix.n >= t->max_new) {
    c->n = 0;  // the results do not fit: the completion ends as it stands (TRL drops them)
  } else {
    json_array_extend(s->turns, j->results);
    s->n += t->suffix.n;
  }
  free_job(j);
  return 1;
}

json_t *ct_grpo_agent_take(ct_grpo_agent *t, const ct_gen_result *r, int *calls, int *failures) {
  sample_state *s = &t->st[r->request * t->per + r->sample];
  if (r->finish == CT_FINISH_LENGTH)  // the last turn never ended: it was not recorded
    json_array_append_new(s->turns, assistant_turn(r->text, r->text_len, NULL));
  *calls = s->calls;
  *failures = s->failures;
  json_t *turns = s->turns;
  s->turns = json_array();
  return turns;
}
