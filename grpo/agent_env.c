// grpo/agent_env: multi-turn environments over HTTP. An episode per sample:
//   POST env_url/reset {"episode", "row"} → {"observation"}: the first user message;
//   POST env_url/step {"episode", "action"} → {"observation", "reward"?, "done"}: the
//   model's turn is the action; the observation becomes the next user message, until done
//   or max_turns. The episode's reward is the sum of its steps' rewards.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "grpo/agent_internal.h"
#include "jsonl.h"
#include "toolcall.h"

int ct_agent_env_connect(const ct_config *c, ct_http **reset, ct_http **step) {
  char url[4200];
  if (strncmp(c->env_url, "http://", 7) && strncmp(c->env_url, "https://", 8))
    return ct_set_error(CT_ECONFIG, "%s: key 'env_url': \"%s\" is not an http:// or https:// URL",
                        ct_config_origin(c, "env_url"), c->env_url);
  size_t n = strlen(c->env_url);
  while (n && c->env_url[n - 1] == '/') n--;
  ct_http_opts o = {url, c->env_api_key_env, c->env_connect_timeout, c->env_timeout, (int)c->env_retries,
                    c->env_backoff, "environment server", "env_", c};
  snprintf(url, sizeof url, "%.*s/reset", (int)n, c->env_url);
  int rc = ct_http_init(reset, &o);
  snprintf(url, sizeof url, "%.*s/step", (int)n, c->env_url);
  return rc ? rc : ct_http_init(step, &o);
}

// A reply of the environment server into j.
static int read_env(void *ctx, const ct_http *h, const char *body, size_t len, ct_http_failure *f) {
  job *j = ctx;
  json_error_t je;
  json_t *r = json_loadb(body, len, 0, &je);
  const json_t *obs = json_object_get(r, "observation"), *rw = json_object_get(r, "reward");
  const json_t *done = json_object_get(r, "done");
  const char *bad = !r                                            ? je.text
                    : !json_is_object(r)                          ? "not a JSON object"
                    : j->kind == JOB_STEP && !json_is_boolean(done) ? "no \"done\" (true or false)"
                    : rw && !json_is_null(rw) && !json_is_number(rw) ? "\"reward\" is not a number"
                    : !json_is_string(obs) && (j->kind == JOB_RESET || !json_is_true(done))
                        ? "no \"observation\" string"
                        : NULL;
  if (bad) {
    char text[96];
    ct_http_snippet(h, body, len, text, sizeof text);
    snprintf(f->what, sizeof f->what, "malformed reply");
    snprintf(f->detail, sizeof f->detail, "%s: \"%s\"", bad, text);
    json_decref(r);
    return CT_HTTP_RETRY;
  }
  free(j->observation);
  j->observation = json_is_string(obs) ? strdup(json_string_value(obs)) : NULL;
  j->has_reward = json_is_number(rw);
  j->reward = j->has_reward ? json_number_value(rw) : 0;
  j->done = json_is_true(done);
  json_decref(r);
  return CT_HTTP_OK;
}

void ct_agent_run_env(job *j, ct_http *h) {
  ct_http_failure f;
  int tries, rc = ct_http_post(h, j->body, read_env, j, &f, &tries);
  if (rc == CT_HTTP_OK && isfinite(j->reward)) return;
  if (rc == CT_HTTP_OK) snprintf(f.what, sizeof f.what, "non-finite reward"), f.detail[0] = 0;
  j->failed = true;
  snprintf(j->why, sizeof j->why, "environment server %s: %s after %d attempt%s%s%s", ct_http_url(h), f.what, tries,
           tries == 1 ? "" : "s", f.detail[0] ? ": " : "", f.detail);
}

// The row's prompt messages (a new list: "prompt" or "messages"; empty when it has none),
// or NULL when its prompt is text (an environment's observations are chat messages).
static json_t *row_messages(const json_t *row) {
  const json_t *p = json_object_get(row, "prompt");
  if (!p) p = json_object_get(row, "messages");
  if (!p) return json_array();
  return json_is_array(p) ? json_copy((json_t *)p) : NULL;
}

// Sample s's prompt: the row's messages, then the observation as the user's; tokenized as
// GRPO tokenizes a dataset row (the row's tools and template variables, max_prompt_length).
static int episode_prompt(ct_grpo_agent *t, sample_state *s, const json_t *row, const char *obs, const char *where) {
  json_t *msgs = row_messages(row);
  if (!msgs)
    return ct_set_error(CT_EFORMAT, "%s: key 'prompt': env_url needs a message list (or none): the environment's "
                        "observations join it as user messages", where);
  json_t *r = json_pack("{s:o}", "prompt", msgs);
  int rc = r && !json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", obs))
               ? 0 : ct_set_error(CT_ENOMEM, "out of memory");
  static const char *const keys[] = {"tools", "chat_template_kwargs"};
  for (int k = 0; !rc && k < 2; k++)
    if (json_object_get(row, keys[k])) json_object_set(r, keys[k], json_object_get(row, keys[k]));
  const ct_config *c = t->cfg;
  ct_prompt_opts po = {true, (int)c->max_prompt_length, c->truncate_prompt == CT_TRUNCATE_LEFT, "max_prompt_length",
                       0, false, NULL, false};
  s->prompt_ids.n = 0;
  if (!rc) rc = ct_prompt_tokens(t->tok, r, where, &po, &s->prompt_ids);
  if (!rc) s->prompt = json_incref(msgs);
  json_decref(r);
  return rc;
}

int ct_agent_env_reset(ct_grpo_agent *t, const char *tag) {
  for (int i = 0; i < t->nst; i++) {
    sample_state *s = &t->st[i];
    int p = t->prompts[i / t->per];
    snprintf(s->episode, sizeof s->episode, "%s-%d-%d", tag, p, i % t->per);
    s->env_reward = 0;
    char *row = ct_agent_row_text(ct_agent_row(t, i));
    json_t *b = row ? json_pack("{s:s}", "episode", s->episode) : NULL;
    char *body = b ? json_dumps(b, JSON_COMPACT) : NULL;
    job *j = body ? calloc(1, sizeof *j) : NULL;
    size_t n = body ? strlen(body) : 0;
    char *full = j ? malloc(n + strlen(row) + 16) : NULL;
    if (full) snprintf(full, n + strlen(row) + 16, "%.*s,\"row\":%s}", (int)(n - 1), body, row);
    json_decref(b);
    free(body);
    free(row);
    if (!full) return free(j), ct_set_error(CT_ENOMEM, "out of memory");
    *j = (job){.kind = JOB_RESET, .idx = i, .body = full};
    ct_agent_push(t, j, false);
  }
  // every reset answers (or fails) before we return; the error named is the first sample's
  // that failed (whatever order the answers came in)
  int rc = 0, first = t->nst;
  char msg[6000] = "";
  for (int left = t->nst; left > 0; left--) {
    job *j = ct_agent_next_done(t, true);
    sample_state *s = &t->st[j->idx];
    char where[4200];
    ct_jsonl_where(where, sizeof where, t->path, t->set->line[t->prompts[j->idx / t->per]]);
    if (j->failed && j->idx < first) {
      first = j->idx;
      snprintf(msg, sizeof msg, "%s: episode %s: %s", where, s->episode, j->why);
    } else if (!j->failed && !rc) {
      rc = episode_prompt(t, s, ct_agent_row(t, j->idx), j->observation, where);
    }
    ct_agent_free_job(j);
  }
  if (!rc && first < t->nst) rc = ct_set_error(CT_EIO, "%s", msg);
  return rc;
}

int ct_agent_env_answer(ct_grpo_agent *t, job *j, int *cont) {
  sample_state *s = &t->st[j->idx];
  *cont = 0;
  s->steps++;
  if (j->failed) {  // the episode ends here, unscored by the environment
    s->env_reward = NAN;
    json_array_append_new(s->turns, json_pack("{s:s, s:s}", "role", "environment", "error", j->why));
    return 0;
  }
  if (j->has_reward) s->env_reward += j->reward;
  long max_turns = t->cfg->max_turns;
  if (j->done || (max_turns > 0 && s->steps >= max_turns)) return 0;
  json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", j->observation);
  if (!msgs) return ct_set_error(CT_ENOMEM, "out of memory");
  ct_chat_opts co;
  const json_t *row = ct_agent_row(t, j->idx);
  t->suffix.n = 0;
  int rc = ct_row_chat_opts(row, true, &co);
  if (!rc) rc = ct_toolcall_suffix(t->tok, msgs, &co, &t->suffix);
  if (rc) {
    char where[4200];
    ct_jsonl_where(where, sizeof where, t->path, t->set->line[t->prompts[j->idx / t->per]]);
    json_decref(msgs);
    return ct_wrap_error(rc, "%s: giving the observation back through the chat template", where);
  }
  if (s->n + t->suffix.n < t->max_new) {  // else the episode ends as it stands
    json_array_extend(s->turns, msgs);
    s->n += t->suffix.n;
    *cont = 1;
  }
  json_decref(msgs);
  return 0;
}
