// generate: continuous batching over the engine's slots — admit requests, prefill
// (packed), copy a prompt's cache for its samples, decode one token per active slot,
// stop on stop ids or length, hand a multi-turn sample's turn to the caller and feed its
// continuation into the same slot (packed, only the new tokens), report each finished
// sample. Sampling itself is sample.c's.
#include "generate.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "mem.h"
#include "pool.h"
#include "prof.h"

const char *const ct_finish_names[] = {"stop", "length", NULL};

// A slot is free, decoding, waiting for its sample's continuation (on_turn said 1), or
// holding one to feed (`pend` tokens at the end of its ids).
enum { SLOT_FREE, SLOT_ACTIVE, SLOT_WAITING, SLOT_READY };

typedef struct {
  int state;      // SLOT_*
  int pend;       // SLOT_READY: continuation tokens not yet fed
  int pos;        // cache position where `last` goes next
  int last;       // the newest token, not yet fed to the model
  ct_rng rng;
  ct_gen_sample gs;  // ids (max_len), lps, seen, text
} slot_t;

typedef struct {
  ct_engine *e;
  const ct_tokenizer *tok;
  const ct_gen_request *reqs;
  const ct_gen_callbacks *cb;
  ct_engine_opts o;
  int V;
  slot_t *slots;
  ct_sampler_ws *ws;      // (threads) one per pool thread
  int nws;
  float *logits;          // (max_tokens, V)
  int *ids, *slot, *pos;  // one pass, (max_tokens)
  int *pick;              // (slots) a decode step's chosen tokens, or a negative error code
  float *pick_lp;         // (slots) their log-probs
  int nwait, nready;      // slots SLOT_WAITING, SLOT_READY
} gen_t;

// ---------------------------------------------------------------------------
// A sample's finishing step (shared with speculative.c)

static bool is_stop_id(const ct_gen_request *r, int t) {
  for (int i = 0; i < r->n_stop_ids; i++)
    if (r->stop_ids[i] == t) return true;
  return false;
}

static int text_append(ct_gen_sample *s, const char *b, size_t n) {
  if (s->tlen + n + 1 > s->tcap) {
    size_t cap = s->tcap ? s->tcap : 256;
    while (cap < s->tlen + n + 1) cap *= 2;
    char *t = realloc(s->text, cap);
    if (!t) return ct_set_error(CT_ENOMEM, "generate: out of memory");
    s->text = t;
    s->tcap = cap;
  }
  memcpy(s->text + s->tlen, b, n);
  s->tlen += n;
  s->text[s->tlen] = 0;
  return 0;
}

// A stop string that now appears in the text, searched only where the new bytes could
// complete one; truncates the text there and returns true.
static bool hit_stop_string(const ct_gen_request *r, ct_gen_sample *s, size_t added) {
  for (int i = 0; i < r->n_stop_strings; i++) {
    const char *ss = r->stop_strings[i];
    size_t m = strlen(ss);
    if (m == 0 || m > s->tlen) continue;
    size_t from = s->tlen - added >= m ? s->tlen - added - m + 1 : 0;
    for (size_t k = from; k + m <= s->tlen; k++)
      if (memcmp(s->text + k, ss, m) == 0) {
        s->tlen = k;
        s->text[k] = 0;
        return true;
      }
  }
  return false;
}

static ct_gen_result result(const ct_gen_sample *s, const ct_tokenizer *tok, int why) {
  const char *text = s->text ? s->text : "";
  size_t lead = s->turn_start ? 0 : ct_tokenizer_decode_lead(tok, text, s->tlen);  // as a decode of the ids
  return (ct_gen_result){s->req, s->sample, s->ids, s->lps, s->n, why, text + lead, s->tlen - lead,
                         s->turns ? s->own : NULL, s->turn_start};
}

// The result to cb->on_done; 1 (the sample ended) or an error.
static int finish(const ct_gen_sample *s, const ct_tokenizer *tok, const ct_gen_callbacks *cb, int why) {
  ct_gen_result res = result(s, tok, why);
  int rc = cb->on_done(cb->ctx, &res);
  if (rc < 0) return rc;  // the callback's own error and message
  return rc ? ct_set_error(CT_EINVAL, "generate: stopped by the caller") : 1;
}

// A turn ended by a stop: the caller's on_turn decides whether the sample waits (2).
static int end_turn(const ct_gen_sample *s, const ct_tokenizer *tok, const ct_gen_callbacks *cb) {
  if (cb->on_turn) {
    ct_gen_result res = result(s, tok, CT_FINISH_STOP);
    int rc = cb->on_turn(cb->turn_ctx ? cb->turn_ctx : cb->ctx, &res);
    if (rc < 0) return rc;
    if (rc) return 2;
  }
  return finish(s, tok, cb, CT_FINISH_STOP);
}

int ct_gen_sample_end(const ct_gen_sample *s, const ct_tokenizer *tok, const ct_gen_callbacks *cb) {
  return finish(s, tok, cb, CT_FINISH_STOP);
}

void ct_gen_sample_continue(ct_gen_sample *s, const int *ids, int n) {
  for (int i = 0; i < n && s->n < s->cap; i++) {
    s->ids[s->n] = ids[i];
    s->lps[s->n] = 0;
    s->own[s->n] = 0;
    s->n++;
    if (s->n_seen < s->cap) s->seen[s->n_seen++] = ids[i];
  }
  s->turns = true;
  s->turn_start = s->n;
  s->tlen = 0;
  if (s->text) s->text[0] = 0;
}

void ct_gen_sample_start(ct_gen_sample *s, const ct_gen_request *r, int req, int sample) {
  s->req = req;
  s->sample = sample;
  s->n = 0;
  s->tlen = 0;
  s->turns = false;
  s->turn_start = 0;
  if (s->text) s->text[0] = 0;
  int ns = r->prompt_len < s->cap ? r->prompt_len : s->cap;
  memcpy(s->seen, r->prompt + r->prompt_len - ns, sizeof(int) * ns);
  s->n_seen = ns;
}

int ct_gen_sample_add(ct_gen_sample *s, const ct_gen_request *r, const ct_tokenizer *tok,
                      const ct_gen_callbacks *cb, int t, float lp, bool full) {
  s->ids[s->n] = t;
  s->lps[s->n] = lp;
  if (s->own) s->own[s->n] = 1;
  s->n++;
  if (s->n_seen < s->cap) s->seen[s->n_seen++] = t;
  if (cb->on_token) cb->on_token(cb->ctx, s->req, s->sample, t);
  if (is_stop_id(r, t)) return end_turn(s, tok, cb);
  size_t len;
  const char *b = ct_tokenizer_token_bytes(tok, t, &len);
  int rc = text_append(s, b ? b : "", b ? len : 0);
  if (rc) return rc;
  if (hit_stop_string(r, s, len)) return end_turn(s, tok, cb);
  if (s->n >= r->max_new_tokens || full) return finish(s, tok, cb, CT_FINISH_LENGTH);
  return 0;
}

void ct_gen_sample_free(ct_gen_sample *s) {
  free(s->text);
  s->text = NULL;
  s->tlen = s->tcap = 0;
}

// ---------------------------------------------------------------------------
// Continuous batching

// Slot s takes token t: decides whether the sample is done.
static int take(gen_t *g, slot_t *s, int t, float lp) {
  const ct_gen_request *r = &g->reqs[s->gs.req];
  int rc = ct_gen_sample_add(&s->gs, r, g->tok, g->cb, t, lp, s->pos >= g->o.max_len);
  if (rc < 0) return rc;
  s->state = rc == 0 ? SLOT_ACTIVE : rc == 2 ? SLOT_WAITING : SLOT_FREE;
  g->nwait += rc == 2;
  s->last = t;
  return 0;
}

// Draws slot s's next token from logits (scratch ws); a negative CT_E* code on error.
static int draw(const gen_t *g, slot_t *s, const float *logits, ct_sampler_ws *ws, float *lp) {
  const ct_gen_request *r = &g->reqs[s->gs.req];
  return ct_sample_token(&r->sp, logits, g->V, s->gs.seen, s->gs.n_seen, &s->rng, ws, lp);
}

// Chooses the next token of slot s from logits and decides whether the sample is done.
static int choose(gen_t *g, slot_t *s, const float *logits) {
  float lp;
  int t = draw(g, s, logits, &g->ws[0], &lp);
  return t < 0 ? t : take(g, s, t, lp);
}

// A decode step's draws, one row per item on the pool: each slot has its own random
// stream, so the tokens do not depend on the thread count (a 151,936-token vocabulary
// makes a draw ~0.1 ms: 128 slots drawn serially left one core idle for a tenth of
// every rollout step).
static void draw_task(void *ctx, int k, int thread) {
  gen_t *g = ctx;
  g->pick[k] = draw(g, &g->slots[g->slot[k]], g->logits + (long)k * g->V, &g->ws[thread], &g->pick_lp[k]);
}

// Every row's token, then each slot takes its own in row order (callbacks run serially).
static int choose_all(gen_t *g, int n) {
  ct_parallel_for(n, draw_task, g);
  for (int k = 0; k < n; k++) {
    slot_t *s = &g->slots[g->slot[k]];
    s->pos++;
    // an error's message was set on the thread that drew: draw again here for it (a
    // failed draw takes no uniform, so this one fails the same way)
    int rc = g->pick[k] < 0 ? choose(g, s, g->logits + (long)k * g->V) : take(g, s, g->pick[k], g->pick_lp[k]);
    if (rc) return rc;
  }
  return 0;
}

typedef struct {
  int req, first_sample, count;
  int slots[64];
} group_t;

// Starts `grp`: the prompt is already in slot slots[0]'s cache; copy it to the others
// and draw each sample's first token from the shared logits.
static int start_group(gen_t *g, const group_t *grp, const float *logits) {
  const ct_gen_request *r = &g->reqs[grp->req];
  for (int k = 0; k < grp->count; k++) {
    int rc = ct_engine_copy_slot(g->e, grp->slots[0], grp->slots[k], r->prompt_len);
    if (rc) return rc;
    slot_t *s = &g->slots[grp->slots[k]];
    s->state = SLOT_ACTIVE;
    s->pos = r->prompt_len;
    ct_gen_sample_start(&s->gs, r, grp->req, grp->first_sample + k);
    ct_sample_rng(&s->rng, r->seed, s->gs.sample);
    if ((rc = choose(g, s, logits))) return rc;
  }
  return 0;
}

// Feeds n tokens into `slot` from cache position pos0, in passes of at most max_tokens;
// the last token's logits go to g->logits.
static int feed_long(gen_t *g, const int *ids, int n, int slot, int pos0) {
  int cap = g->o.max_tokens;
  for (int start = 0; start < n; start += cap) {
    int k = n - start < cap ? n - start : cap;
    for (int i = 0; i < k; i++) {
      g->slot[i] = slot;
      g->pos[i] = pos0 + start + i;
    }
    int last = k - 1, end = start + k == n;
    int rc = ct_engine_forward(g->e, k, ids + start, g->slot, g->pos, &last, end, g->logits);
    if (rc) return rc;
  }
  return 0;
}

// ---------------------------------------------------------------------------
// Multi-turn samples: continuations

static slot_t *waiting_slot(gen_t *g, int req, int sample) {
  for (int i = 0; i < g->o.slots; i++) {
    slot_t *s = &g->slots[i];
    if (s->state == SLOT_WAITING && s->gs.req == req && s->gs.sample == sample) return s;
  }
  return NULL;
}

// Takes every continuation the caller has ready (waiting for one when `wait`).
static int poll_continuations(gen_t *g, bool wait) {
  while (g->nwait > 0) {
    ct_gen_cont c;
    int rc = g->cb->poll(g->cb->turn_ctx ? g->cb->turn_ctx : g->cb->ctx, wait, &c);
    if (rc <= 0) return rc;
    wait = false;
    slot_t *s = waiting_slot(g, c.request, c.sample);
    if (!s) return ct_set_error(CT_EINVAL, "generate: a continuation for request %d sample %d, which is not waiting",
                                c.request, c.sample);
    g->nwait--;
    if (c.n <= 0) {
      s->state = SLOT_FREE;
      if ((rc = ct_gen_sample_end(&s->gs, g->tok, g->cb)) < 0) return rc;
      continue;
    }
    const ct_gen_request *r = &g->reqs[c.request];
    if (s->gs.n + c.n >= r->max_new_tokens || s->pos + c.n >= g->o.max_len)
      return ct_set_error(CT_EINVAL, "generate: request %d sample %d: a continuation of %d tokens after %d leaves no "
                          "room for another token (max_new_tokens %d, cache %d positions)", c.request, c.sample,
                          c.n, s->gs.n, r->max_new_tokens, g->o.max_len);
    ct_gen_sample_continue(&s->gs, c.ids, c.n);
    s->pend = c.n;
    s->state = SLOT_READY;
    g->nready++;
  }
  return 0;
}

// One packed pass over continuations: each ready slot's last token and its continuation
// (one longer than a pass goes alone, in chunks); then each samples its next turn's first
// token.
static int feed_continuations(gen_t *g) {
  int fed[256], nfed = 0, ntok = 0, outs[256];
  for (int i = 0; i < g->o.slots && nfed < 256; i++) {
    slot_t *s = &g->slots[i];
    if (s->state != SLOT_READY) continue;
    int m = s->pend + 1;
    const int *tok = s->gs.ids + s->gs.n - m;  // `last` and the continuation
    if (m > g->o.max_tokens) {
      if (ntok) continue;  // (the next pass)
      int rc = feed_long(g, tok, m, i, s->pos);
      if (rc) return rc;
      fed[nfed] = i, outs[nfed++] = 0;
      break;
    }
    if (ntok + m > g->o.max_tokens) continue;
    for (int k = 0; k < m; k++) {
      g->ids[ntok + k] = tok[k];
      g->slot[ntok + k] = i;
      g->pos[ntok + k] = s->pos + k;
    }
    ntok += m;
    fed[nfed] = i, outs[nfed++] = ntok - 1;
  }
  if (ntok) {
    int rc = ct_engine_forward(g->e, ntok, g->ids, g->slot, g->pos, outs, nfed, g->logits);
    if (rc) return rc;
  }
  for (int k = 0; k < nfed; k++) {
    slot_t *s = &g->slots[fed[k]];
    s->pos += s->pend + 1;
    s->pend = 0;
    g->nready--;
    int rc = choose(g, s, g->logits + (long)k * g->V);
    if (rc) return rc;
  }
  return 0;
}

static int free_slots(const gen_t *g, int *out) {
  int n = 0;
  for (int i = 0; i < g->o.slots; i++)
    if (g->slots[i].state == SLOT_FREE) out[n++] = i;
  return n;
}

int ct_generate(ct_engine *e, const ct_tokenizer *tok, const ct_gen_request *reqs, int nreq,
                const ct_gen_callbacks *cb) {
  gen_t g = {.e = e, .tok = tok, .reqs = reqs, .cb = cb, .o = ct_engine_options(e),
             .V = ct_engine_weights(e)->cfg.vocab_size};
  if (cb->on_turn && !cb->poll) return ct_set_error(CT_EINVAL, "generate: on_turn without poll");
  for (int r = 0; r < nreq; r++) {
    if (reqs[r].prompt_len < 1)
      return ct_set_error(CT_EINVAL, "request %d: the prompt is empty", r);
    if (reqs[r].prompt_len >= g.o.max_len)
      return ct_set_error(CT_EINVAL, "request %d: a prompt of %d tokens leaves no room in a cache of "
                          "%d positions (raise max_target_length or truncate the prompt)", r,
                          reqs[r].prompt_len, g.o.max_len);
    if (reqs[r].n < 1 || reqs[r].max_new_tokens < 1)
      return ct_set_error(CT_EINVAL, "request %d: needs n >= 1 and max_new_tokens >= 1", r);
    int rc = ct_sample_params_check(&reqs[r].sp);
    if (rc) return ct_wrap_error(rc, "request %d", r);
  }
  int S = g.o.slots, N = g.o.max_tokens, rc = 0;
  g.slots = calloc(S, sizeof *g.slots);
  // at most one row per slot or group, on huge pages where the kernel has them: the LM head
  // writes each slot's row, V floats apart, once a decode step
  g.logits = ct_big_alloc(sizeof(float) * (size_t)S * g.V);
  g.ids = malloc(sizeof(int) * N);
  g.slot = malloc(sizeof(int) * N);
  g.pos = malloc(sizeof(int) * N);
  int *freel = malloc(sizeof(int) * S), *outs = malloc(sizeof(int) * N);
  group_t *groups = malloc(sizeof(group_t) * S);
  if (!g.slots || !g.logits || !g.ids || !g.slot || !g.pos || !freel || !outs || !groups)
    rc = ct_set_error(CT_ENOMEM, "generate: out of memory");
  for (int i = 0; !rc && i < S; i++) {
    ct_gen_sample *s = &g.slots[i].gs;
    s->ids = malloc(sizeof(int) * g.o.max_len);
    s->lps = malloc(sizeof(float) * g.o.max_len);
    s->seen = malloc(sizeof(int) * g.o.max_len);
    s->cap = g.o.max_len;
    s->own = cb->on_turn ? malloc(g.o.max_len) : NULL;
    if (!s->ids || !s->lps || !s->seen || (cb->on_turn && !s->own)) rc = ct_set_error(CT_ENOMEM, "generate: out of memory");
  }
  g.nws = ct_pool_threads();
  g.ws = calloc(g.nws, sizeof *g.ws);
  g.pick = malloc(sizeof(int) * S);
  g.pick_lp = malloc(sizeof(float) * S);
  if (!rc && (!g.ws || !g.pick || !g.pick_lp)) rc = ct_set_error(CT_ENOMEM, "generate: out of memory");
  for (int t = 0; !rc && t < g.nws; t++) rc = ct_sampler_ws_init(&g.ws[t], g.V);
  if (!rc) CT_PROF(CT_PROF_E_LORA, ct_engine_lora_pin(e));  // (the adapters hold still until we return)
  int next_req = 0, next_sample = 0;
  while (!rc) {
    // 0. samples between turns: take the continuations ready (wait for one when nothing
    // else can run) and feed them
    int nfree = free_slots(&g, freel), nactive = 0;
    for (int i = 0; i < S; i++) nactive += g.slots[i].state == SLOT_ACTIVE;
    if (g.nwait > 0)
      rc = poll_continuations(&g, nactive == 0 && g.nready == 0 && (next_req >= nreq || nfree == 0));
    if (!rc && g.nready > 0) rc = feed_continuations(&g);
    if (rc) break;
    // 1. admit waiting samples into free slots; prompts that fit share one packed pass
    nfree = free_slots(&g, freel);
    int ngroups = 0, ntok = 0, used = 0;
    while (!rc && next_req < nreq && used < nfree) {
      const ct_gen_request *r = &reqs[next_req];
      int take = r->n - next_sample;
      if (take > nfree - used) take = nfree - used;
      if (take > 64) take = 64;
      group_t *grp = &groups[ngroups];
      grp->req = next_req;
      grp->first_sample = next_sample;
      grp->count = take;
      for (int k = 0; k < take; k++) grp->slots[k] = freel[used + k];
      if (r->prompt_len > N) {  // alone, in chunks
        if (ngroups > 0) break;
        used += take;
        if ((rc = feed_long(&g, r->prompt, r->prompt_len, grp->slots[0], 0)) || (rc = start_group(&g, grp, g.logits))) break;
      } else {
        if (ntok + r->prompt_len > N) break;
        for (int i = 0; i < r->prompt_len; i++) {
          g.ids[ntok + i] = r->prompt[i];
          g.slot[ntok + i] = grp->slots[0];
          g.pos[ntok + i] = i;
        }
        ntok += r->prompt_len;
        outs[ngroups++] = ntok - 1;
        used += take;
      }
      next_sample += take;
      if (next_sample == r->n) {
        next_req++;
        next_sample = 0;
      }
      if (r->prompt_len > N) break;
    }
    if (!rc && ngroups > 0) {
      rc = ct_engine_forward(e, ntok, g.ids, g.slot, g.pos, outs, ngroups, g.logits);
      CT_PROF(CT_PROF_SAMPLE, for (int k = 0; !rc && k < ngroups; k++) rc = start_group(&g, &groups[k], g.logits + (long)k * g.V));
    }
    if (rc) break;
    // 2. one decode step for every active slot
    int n = 0;
    for (int i = 0; i < S; i++)
      if (g.slots[i].state == SLOT_ACTIVE) {
        g.ids[n] = g.slots[i].last;
        g.slot[n] = i;
        g.pos[n] = g.slots[i].pos;
        outs[n] = n;
        n++;
      }
    if (n == 0) {
      if (next_req >= nreq && g.nwait == 0 && g.nready == 0) break;
      continue;
    }
    rc = ct_engine_forward(e, n, g.ids, g.slot, g.pos, outs, n, g.logits);
    if (!rc) CT_PROF(CT_PROF_SAMPLE, rc = choose_all(&g, n));
  }
  ct_engine_lora_unpin(e);
  for (int i = 0; g.slots && i < S; i++) {
    free(g.slots[i].gs.ids);
    free(g.slots[i].gs.lps);
    free(g.slots[i].gs.seen);
    free(g.slots[i].gs.own);
    ct_gen_sample_free(&g.slots[i].gs);
  }
  free(g.slots);
  ct_big_free(g.logits);
  free(g.ids);
  free(g.slot);
  free(g.pos);
  free(freel);
  free(outs);
  free(groups);
  for (int t = 0; g.ws && t < g.nws; t++) ct_sampler_ws_free(&g.ws[t]);
  free(g.ws);
  free(g.pick);
  free(g.pick_lp);
  return rc;
}
