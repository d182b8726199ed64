// distill/onpolicy: on-policy batches (GKD): each row keeps its prompt (the tokens before
// its first label) and gets a completion sampled at temperature τ through the engine, over
// the student's own weights (or the teacher's, seq_kd); completions.jsonl shows them.
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "distill/distill.h"
#include "error.h"
#include "generate.h"
#include "loop.h"
#include "mem.h"
#include "unicode.h"


// One generated completion: its tokens, and what completions.jsonl shows of it.
typedef struct {
  int *ids;
  int n;
  json_t *row;  // NULL unless completions are logged
} gen_sample;

typedef struct {
  gen_sample *out;  // (requests)
  const ct_tokenizer *tok;
  const int *const *prompt;  // (requests) the prompts' tokens, for the log
  const int *plen;
  long step;        // the optimizer step they train; < 0: no log
} gen_out;

// The completions.jsonl row of a generated sample (without rewards: distillation has none).
static json_t *gen_row(const gen_out *o, const ct_gen_result *r) {
  char *prompt;
  size_t len;
  if (ct_tokenizer_decode(o->tok, o->prompt[r->request], o->plen[r->request], &prompt, &len)) return NULL;
  char *valid = ct_utf8_lossy(prompt, len, &len);
  json_t *p = valid ? json_stringn(valid, len) : NULL;
  ct_free_all(prompt, valid);
  char *text = strndup(r->text, r->text_len);
  json_t *row = text ? ct_completion_row(o->step, p, text, r->ids, r->logprobs, r->n, ct_finish_names[r->finish])
                     : NULL;
  free(text);
  json_decref(p);
  return row;
}

static int gen_done(void *ctx, const ct_gen_result *r) {
  gen_out *o = ctx;
  gen_sample *g = &o->out[r->request];
  g->ids = malloc(sizeof(int) * (r->n ? r->n : 1));
  g->row = o->step >= 0 ? gen_row(o, r) : NULL;
  if (!g->ids || (o->step >= 0 && !g->row)) return ct_set_error(CT_ENOMEM, "out of memory");
  memcpy(g->ids, r->ids, sizeof(int) * r->n);
  g->n = r->n;
  return 0;
}

// The prompt of sequence s: the tokens of its (first) row before its first label, at
// least one, and never the whole row.
static int prompt_len(const ct_dataset *ds, int s) {
  int r = ds->seq_rows[ds->seq_first[s]], j0 = 1;
  while (j0 < ds->row_len[r] - 1 && !ds->label[ds->row_start[r] + j0]) j0++;
  return j0;
}

int ct_distill_generation_positions(const ct_dataset *ds, long max_new, int T) {
  long most = 1;
  for (int s = 0; s < ds->n_seq; s++) {
    long p = prompt_len(ds, s) + max_new;
    most = p > most ? p : most;
  }
  return most < T ? (int)most : T;
}

// Generates the completions of m sequences into b, each at most max_new tokens (and
// within b's length); with step >= 0, their completions.jsonl rows go to rows (m).
static int generate_batch(ct_engine *gen, const ct_tokenizer *tok, const ct_dataset *ds, const int *seqs, int m,
                           ct_batch *b, float tau, int max_new, uint64_t seed, long step, json_t **rows) {
  ct_gen_request req[m];
  gen_sample comp[m];
  int plen[m];
  const int *prompt[m];
  const int *stop_ids;
  int n_stop = ct_tokenizer_stop_ids(tok, &stop_ids);
  for (int i = 0; i < m; i++) {
    int r = ds->seq_rows[ds->seq_first[seqs[i]]], j0 = prompt_len(ds, seqs[i]);
    plen[i] = j0;
    req[i] = (ct_gen_request){.prompt = ds->ids + ds->row_start[r], .prompt_len = j0, .n = 1,
                              .seed = seed + (uint64_t)i, .sp = {tau, 0, 1, 0, 1},
                              .max_new_tokens = b->cap_T - j0 < max_new ? b->cap_T - j0 : max_new,
                              .stop_ids = stop_ids, .n_stop_ids = n_stop};
    prompt[i] = req[i].prompt;
    comp[i] = (gen_sample){0};
  }
  gen_out o = {comp, tok, prompt, plen, rows ? step : -1};
  ct_gen_callbacks cb = {.on_done = gen_done, .ctx = &o};
  int rc = ct_generate(gen, tok, req, m, &cb);
  if (rc) return ct_wrap_error(rc, "on-policy generation");
  int T = 1;
  for (int i = 0; i < m; i++) T = plen[i] + comp[i].n > T ? plen[i] + comp[i].n : T;
  b->B = m;
  b->T = T;
  b->n_target = b->n_tokens = 0;
  for (int i = 0; i < m; i++) {
    b->row_seq[i] = seqs[i];
    ct_batch_row(b, i, req[i].prompt, plen[i], comp[i].ids, comp[i].n, ct_tokenizer_pad(tok));
    free(comp[i].ids);
    if (rows) rows[i] = comp[i].row;
  }
  return 0;
}

int ct_distill_generate(ct_distill *d, const int *seqs, int n, long *labels) {
  const ct_config *cfg = d->cfg;
  ct_train *tr = d->tr;
  int B = d->B, accum = d->accum, n_rows = 0, rc;
  if ((rc = ct_policy_engine_sync(&d->student))) return rc;  // the student as trained (seq_kd: not set up)
  for (int k = 0, first, m; k < accum && (m = ct_loop_micro(tr, k, B, n, &first)); k++) {
    ct_log_phase(&tr->log, tr->step + 1, "on-policy generation", k, accum, "batches", 0, NULL);
    rc = generate_batch(d->gen, tr->tok, &d->train, seqs + first, m, &d->gen_batches[k], (float)d->tau,
                        (int)cfg->max_new_tokens,
                        (uint64_t)cfg->seed * 7919u + (uint64_t)tr->step * 104729u + (uint64_t)first, tr->step + 1,
                        d->log.on ? d->gen_rows + n_rows : NULL);
    if (rc) return rc;
    n_rows += d->log.on ? m : 0;
    *labels += d->gen_batches[k].n_target;
  }
  if ((rc = ct_completions_append(&d->log, d->gen_rows, n_rows))) return ct_wrap_error(rc, "logging completions");
  double l = (double)*labels;
  ct_dist_sum_f64(&l, 1);
  *labels = (long)l;
  return 0;
}
