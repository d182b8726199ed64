// generate: continuous batching gives every request the same output as running it
// alone (greedy and seeded sampling); multisampling's first tokens follow the logits;
// stop ids, stop strings and lengths end samples as documented; bad prompts fail early.
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "generate.h"
#include "matmul.h"
#include "pool.h"
#include "rng.h"
#include "test.h"
#include "tokenizer.h"

static ct_model model;
static ct_infer_weights weights;
static ct_tokenizer *tok;

#define MAXR 8192

typedef struct {
  int n;
  int req[MAXR], sample[MAXR], len[MAXR], finish[MAXR];
  int ids[MAXR][24];
  float lps[MAXR][24];
  char text[MAXR][64];
} results_t;

static int collect(void *ctx, const ct_gen_result *r) {
  results_t *R = ctx;
  if (R->n == MAXR) return 1;
  int k = R->n++;
  R->req[k] = r->request;
  R->sample[k] = r->sample;
  R->len[k] = r->n;
  R->finish[k] = r->finish;
  for (int i = 0; i < r->n && i < 24; i++) R->ids[k][i] = r->ids[i], R->lps[k][i] = r->logprobs[i];
  snprintf(R->text[k], sizeof R->text[k], "%.*s", (int)r->text_len, r->text);
  return 0;
}

static int find(const results_t *R, int req, int sample) {
  for (int k = 0; k < R->n; k++)
    if (R->req[k] == req && R->sample[k] == sample) return k;
  return -1;
}

static int run_on(const ct_infer_weights *w, int slots, const ct_gen_request *reqs, int nreq, results_t *R) {
  ct_engine *e;
  ct_engine_opts o = {.slots = slots, .max_len = 48, .max_tokens = slots > 64 ? slots : 64};
  int rc = ct_engine_init(&e, w, &o);
  if (rc) return rc;
  memset(R, 0, sizeof *R);
  ct_gen_callbacks cb = {.on_done = collect, .ctx = R};
  rc = ct_generate(e, tok, reqs, nreq, &cb);
  ct_engine_free(e);
  return rc;
}
static int run(int slots, const ct_gen_request *reqs, int nreq, results_t *R) {
  return run_on(&weights, slots, reqs, nreq, R);
}

static int prompts[6][12];
static const int plen[6] = {3, 7, 5, 11, 2, 9};

static void make_requests(ct_gen_request *reqs, float temperature) {
  for (int r = 0; r < 6; r++) {
    for (int i = 0; i < plen[r]; i++) prompts[r][i] = (r * 37 + i * 11) % 256;
    reqs[r] = (ct_gen_request){.prompt = prompts[r], .prompt_len = plen[r], .n = r % 3 + 1,
                               .seed = 1000 + r, .sp = {temperature, 0, 1.0f, 0.0f, 1.0f},
                               .max_new_tokens = 6 + r * 2};
  }
}

// Every sample of every request, generated with 3 slots among the others, equals the
// same request generated alone on 1 slot, token for token and log-prob for log-prob.
static void check_batching_invariance(float temperature) {
  ct_gen_request reqs[6];
  make_requests(reqs, temperature);
  static results_t all, alone;
  CHECK_OK(run(3, reqs, 6, &all));
  int expected = 0, same = 0;
  for (int r = 0; r < 6; r++) {
    expected += reqs[r].n;
    CHECK_OK(run(1, &reqs[r], 1, &alone));
    for (int k = 0; k < reqs[r].n; k++) {
      int a = find(&all, r, k), b = find(&alone, 0, k);
      if (a < 0 || b < 0) continue;
      same += all.len[a] == alone.len[b] && !memcmp(all.ids[a], alone.ids[b], sizeof(int) * all.len[a]) &&
              !memcmp(all.lps[a], alone.lps[b], sizeof(float) * all.len[a]);
    }
  }
  CHECK(all.n == expected);
  CHECK(same == expected);
}

static void test_continuous_batching_matches_running_alone_greedy(void) { check_batching_invariance(0); }
static void test_continuous_batching_matches_running_alone_seeded(void) { check_batching_invariance(1.0f); }

// bf16 panels with every product on the batched kernel (widths multiples of 32: AMX's
// tiles where the CPU has them, else AVX512_BF16 or its emulation; the head's last panel
// is narrow): 16 prompts x 8 seeded samples give the same tokens and log-probs, bit for
// bit, decoded 128 together, 16 at a time, and each prompt alone on one slot.
static void test_bf16_batched_decode_matches_one_slot_at_1_16_128(void) {
  ct_model m;
  ct_model_config c = model.cfg;
  c.hidden_size = 64, c.intermediate_size = 96, c.head_dim = 16;
  CHECK_OK(ct_model_init(&m, &c, 1));
  ct_model_init_random(&m, 9, 0.3f);
  ct_infer_weights w;
  CHECK_OK(ct_infer_from_model(&w, &m));
  CHECK_OK(ct_infer_pack(&w, CT_PACK_BF16));
  static int p16[16][12];
  ct_gen_request reqs[16];
  for (int r = 0; r < 16; r++) {
    int len = 2 + r % 9;
    for (int i = 0; i < len; i++) p16[r][i] = (r * 53 + i * 17) % 256;
    reqs[r] = (ct_gen_request){.prompt = p16[r], .prompt_len = len, .n = 8, .seed = 77 + r,
                               .sp = {1.0f, 0, 1.0f, 0.0f, 1.0f}, .max_new_tokens = 10 + r % 5};
  }
  static results_t R128, R16, alone;
  CHECK_OK(run_on(&w, 128, reqs, 16, &R128));
  CHECK_OK(run_on(&w, 16, reqs, 16, &R16));
  CHECK(R128.n == 128 && R16.n == 128);
  int same16 = 0, same1 = 0;
  for (int k = 0; k < R128.n; k++) {
    int j = find(&R16, R128.req[k], R128.sample[k]);
    same16 += j >= 0 && R16.len[j] == R128.len[k] && !memcmp(R16.ids[j], R128.ids[k], sizeof(int) * R128.len[k]) &&
              !memcmp(R16.lps[j], R128.lps[k], sizeof(float) * R128.len[k]);
  }
  for (int r = 0; r < 16; r++) {
    CHECK_OK(run_on(&w, 1, &reqs[r], 1, &alone));
    for (int s = 0; s < 8; s++) {
      int a = find(&R128, r, s), b = find(&alone, 0, s);
      same1 += a >= 0 && b >= 0 && alone.len[b] == R128.len[a] &&
               !memcmp(alone.ids[b], R128.ids[a], sizeof(int) * R128.len[a]) &&
               !memcmp(alone.lps[b], R128.lps[a], sizeof(float) * R128.len[a]);
    }
  }
  CHECK(same16 == 128);
  CHECK(same1 == 128);
  ct_infer_free(&w);
  ct_model_free(&m);
}

// A decode step's draws run on the pool, one slot per item: the same seeded samples, bit
// for bit, at 1, 2 and 3 threads.
static void test_seeded_samples_do_not_depend_on_the_thread_count(void) {
  ct_gen_request reqs[6];
  make_requests(reqs, 1.0f);
  static results_t R[3];
  for (int t = 1; t <= 3; t++) {
    CHECK_OK(ct_pool_init(t));
    CHECK_OK(run(4, reqs, 6, &R[t - 1]));
  }
  CHECK_OK(ct_pool_init(2));
  for (int t = 1; t < 3; t++) {
    CHECK(R[t].n == R[0].n && R[0].n > 0);
    int same = 0;
    for (int k = 0; k < R[0].n; k++) {
      int j = find(&R[t], R[0].req[k], R[0].sample[k]);
      same += j >= 0 && R[t].len[j] == R[0].len[k] && !memcmp(R[t].ids[j], R[0].ids[k], sizeof(int) * R[0].len[k]) &&
              !memcmp(R[t].lps[j], R[0].lps[k], sizeof(float) * R[0].len[k]);
    }
    CHECK(same == R[0].n);
  }
}

// n samples of one prompt share a prefill; their first tokens are draws from
// softmax(logits / T) of the prompt's last position (chi-square over the 8 likeliest
// tokens and the rest, 99.9% quantile for 8 degrees of freedom: 26.1).
static void test_multisampling_first_tokens_follow_the_logits(void) {
  int prompt[4] = {65, 66, 67, 68}, V = weights.cfg.vocab_size, n = 6000;
  float T = 0.7f;
  ct_gen_request req = {.prompt = prompt, .prompt_len = 4, .n = n, .seed = 77,
                        .sp = {T, 0, 1.0f, 0.0f, 1.0f}, .max_new_tokens = 1};
  static results_t R;
  CHECK_OK(run(16, &req, 1, &R));
  CHECK(R.n == n);
  // reference distribution from the engine's own logits
  ct_engine *e;
  ct_engine_opts o = {.slots = 1, .max_len = 16, .max_tokens = 8};
  CHECK_OK(ct_engine_init(&e, &weights, &o));
  float *logits = malloc(sizeof(float) * V);
  int slot[4] = {0}, pos[4] = {0, 1, 2, 3}, last = 3;
  CHECK_OK(ct_engine_forward(e, 4, prompt, slot, pos, &last, 1, logits));
  double *p = malloc(sizeof(double) * V), mx = -INFINITY, sum = 0;
  for (int v = 0; v < V; v++) mx = fmax(mx, logits[v] / T);
  for (int v = 0; v < V; v++) sum += p[v] = exp(logits[v] / T - mx);
  int top[8];
  for (int b = 0; b < 8; b++) {
    top[b] = -1;
    for (int v = 0; v < V; v++) {
      bool used = false;
      for (int c = 0; c < b; c++) used |= top[c] == v;
      if (!used && (top[b] < 0 || p[v] > p[top[b]])) top[b] = v;
    }
  }
  double obs[9] = {0}, expct[9] = {0}, rest = 1;
  for (int b = 0; b < 8; b++) {
    expct[b] = n * p[top[b]] / sum;
    rest -= p[top[b]] / sum;
  }
  expct[8] = n * rest;
  int distinct_streams = 0, bad_lp = 0;
  for (int k = 0; k < R.n; k++) {
    int t = R.ids[k][0], b = 8;
    for (int c = 0; c < 8; c++) if (top[c] == t) b = c;
    obs[b]++;
    // the reported log-prob is log softmax(logits / T) of the token
    bad_lp += fabs(R.lps[k][0] - log(p[t] / sum)) > 1e-4;
    distinct_streams += R.ids[k][0] != R.ids[0][0];
  }
  double chi2 = 0;
  for (int b = 0; b < 9; b++) chi2 += (obs[b] - expct[b]) * (obs[b] - expct[b]) / expct[b];
  fprintf(stderr, "  %d samples, chi-square %.2f over 9 bins (top token p=%.3f)\n", n, chi2, p[top[0]] / sum);
  CHECK(chi2 < 26.1);
  CHECK(bad_lp == 0);
  CHECK(distinct_streams > n / 10);  // the samples are not copies of one another
  free(p);
  free(logits);
  ct_engine_free(e);
}

// A stop id ends a sample as its last token, a stop string ends it and is cut from the
// text, max_new_tokens and a full cache end it with "length".
static void test_stop_ids_stop_strings_and_lengths(void) {
  int prompt[3] = {10, 20, 30};
  // greedy continuation, to pick stops from it
  ct_gen_request req = {.prompt = prompt, .prompt_len = 3, .n = 1, .seed = 1,
                        .sp = {0, 0, 1.0f, 0.0f, 1.0f}, .max_new_tokens = 12};
  static results_t R;
  CHECK_OK(run(2, &req, 1, &R));
  CHECK(R.n == 1 && R.len[0] == 12 && R.finish[0] == CT_FINISH_LENGTH);
  int free_run[12];
  memcpy(free_run, R.ids[0], sizeof free_run);
  // stop at the 4th token's id (first occurrence)
  int stop = free_run[3], at = 3;
  for (int i = 0; i < 3; i++) if (free_run[i] == stop) at = i;
  req.stop_ids = &stop;
  req.n_stop_ids = 1;
  CHECK_OK(run(2, &req, 1, &R));
  CHECK(R.finish[0] == CT_FINISH_STOP && R.len[0] == at + 1 && R.ids[0][at] == stop);
  // stop string: the bytes of tokens 5..6 of the free run
  req.stop_ids = NULL;
  req.n_stop_ids = 0;
  char *full;
  size_t flen;
  CHECK_OK(ct_tokenizer_decode(tok, free_run, 12, &full, &flen));
  char *head;
  size_t hlen;
  CHECK_OK(ct_tokenizer_decode(tok, free_run, 5, &head, &hlen));
  char ss[8];
  snprintf(ss, sizeof ss, "%.*s", (int)(flen - hlen >= 2 ? 2 : 1), full + hlen);
  const char *ssv[1] = {ss};
  req.stop_strings = ssv;
  req.n_stop_strings = 1;
  CHECK_OK(run(2, &req, 1, &R));
  CHECK(R.finish[0] == CT_FINISH_STOP);
  CHECK(strstr(R.text[0], ss) == NULL && strncmp(R.text[0], full, strlen(R.text[0])) == 0);
  // the cut is exact: the text is the free run's text up to the first occurrence of ss
  // (greedy, so the run matches the free run until it stops), not just some prefix of it
  const char *hit = strstr(full, ss);
  CHECK(hit != NULL && hit - full <= (ptrdiff_t)hlen);
  CHECK(hit != NULL && strlen(R.text[0]) == (size_t)(hit - full));
  free(full);
  free(head);
  // the cache ends a sample: 48 positions hold the prompt (3) and all new tokens but the
  // last, which is never fed back: 46 tokens
  req.stop_strings = NULL;
  req.n_stop_strings = 0;
  req.max_new_tokens = 1000;
  CHECK_OK(run(1, &req, 1, &R));
  CHECK(R.finish[0] == CT_FINISH_LENGTH && R.len[0] == 46);
}

// Multi-turn samples (tool calls): on_turn makes a sample wait; poll hands continuations
// back out of order and late (every other non-blocking poll says "none yet", so slots
// wait while others decode). Each turn of each sample — decoded after its continuation
// was fed into the same slot's cache — equals a fresh single-turn run of the sample's
// prompt + everything before that turn, token for token and log-prob for log-prob; the
// continuation's tokens are marked not sampled, with log-prob 0.
typedef struct {
  int q[64][2], nq;  // waiting (request, sample), handed back last-in first-out
  int turns[8][4];   // continuations given so far per (request, sample)
  int cont[8];       // scratch for the ids handed over
  int polls;
  results_t *R;
  unsigned char own[MAXR][24];
  int turn_start[MAXR];
} turns_t;

static int turn_end(void *ctx, const ct_gen_result *r) {
  turns_t *t = ctx;
  if (t->turns[r->request][r->sample] == 3) return 0;  // three continuations: done
  t->q[t->nq][0] = r->request, t->q[t->nq][1] = r->sample, t->nq++;
  return 1;
}

static int turn_poll(void *ctx, bool wait, ct_gen_cont *c) {
  turns_t *t = ctx;
  if (t->nq == 0 || (!wait && t->polls++ % 2 == 0)) return wait ? -1 : 0;
  t->nq--;
  int req = t->q[t->nq][0], smp = t->q[t->nq][1], k = t->turns[req][smp]++;
  for (int j = 0; j < 2 + k; j++) t->cont[j] = (req * 31 + smp * 5 + k * 13 + j * 7) % 256;
  *c = (ct_gen_cont){req, smp, t->cont, 2 + k};
  return 1;
}

static int turn_done(void *ctx, const ct_gen_result *r) {
  turns_t *t = ctx;
  int k = t->R->n;
  int rc = collect(t->R, r);
  for (int i = 0; i < r->n && i < 24; i++) t->own[k][i] = r->own ? r->own[i] : 1;
  t->turn_start[k] = r->turn_start;
  return rc;
}

static void test_turns_continue_in_their_slot_as_a_fresh_prompt_would(void) {
  static int stops[128], prompt[3][8];
  for (int i = 0; i < 128; i++) stops[i] = 2 * i;  // even ids end a turn
  ct_gen_request reqs[3];
  for (int r = 0; r < 3; r++) {
    for (int i = 0; i < 4 + r; i++) prompt[r][i] = (r * 41 + i * 19) % 256;
    reqs[r] = (ct_gen_request){.prompt = prompt[r], .prompt_len = 4 + r, .n = 2, .seed = 5 + r,
                               .sp = {0, 0, 1.0f, 0.0f, 1.0f}, .max_new_tokens = 24,
                               .stop_ids = stops, .n_stop_ids = 128};
  }
  static results_t R, one;
  static turns_t T;
  memset(&T, 0, sizeof T);
  memset(&R, 0, sizeof R);
  T.R = &R;
  ct_engine *e;
  ct_engine_opts o = {.slots = 3, .max_len = 48, .max_tokens = 64};
  CHECK_OK(ct_engine_init(&e, &weights, &o));
  ct_gen_callbacks cb = {.on_done = turn_done, .ctx = &T, .on_turn = turn_end, .poll = turn_poll};
  CHECK_OK(ct_generate(e, tok, reqs, 3, &cb));
  ct_engine_free(e);
  CHECK(R.n == 6);
  int checked = 0, continued = 0;
  for (int k = 0; k < R.n; k++) {
    int r = R.req[k], len = R.len[k];
    // walk the turns: each starts after a continuation (own 0 before it)
    int at = 0;
    while (at < len) {
      int end = at;
      while (end < len && T.own[k][end]) end++;  // the turn's sampled tokens [at, end)
      int ctx[48], n = 0;
      for (int i = 0; i < reqs[r].prompt_len; i++) ctx[n++] = reqs[r].prompt[i];
      for (int i = 0; i < at; i++) ctx[n++] = R.ids[k][i];
      ct_gen_request fresh = reqs[r];
      fresh.prompt = ctx, fresh.prompt_len = n, fresh.n = 1, fresh.max_new_tokens = 24 - at;
      CHECK_OK(run(1, &fresh, 1, &one));
      bool same = one.n == 1 && one.len[0] == end - at &&
                  !memcmp(one.ids[0], R.ids[k] + at, sizeof(int) * (end - at)) &&
                  !memcmp(one.lps[0], R.lps[k] + at, sizeof(float) * (end - at));
      CHECK(same);
      checked++;
      int c = end;
      for (; c < len && !T.own[k][c]; c++) CHECK(R.lps[k][c] == 0);
      continued += c > end;
      if (c > end) CHECK(T.turn_start[k] >= c);
      at = c;
    }
    CHECK(T.turns[r][R.sample[k]] == 3 || R.finish[k] == CT_FINISH_LENGTH);
  }
  CHECK(checked >= 12 && continued >= 12);
}

static void test_bad_requests_fail_before_any_work(void) {
  static int longp[48];
  ct_gen_request req = {.prompt = longp, .prompt_len = 48, .n = 1, .seed = 1,
                        .sp = {0, 0, 1.0f, 0.0f, 1.0f}, .max_new_tokens = 4};
  static results_t R;
  ct_set_error(CT_OK, "%s", "");  // a stale message cannot satisfy the check below
  CHECK(run(2, &req, 1, &R) == CT_EINVAL);
  CHECK(strstr(ct_last_error(), "request 0") && strstr(ct_last_error(), "48 tokens"));
  CHECK(R.n == 0);
  req.prompt_len = 3;
  req.sp.top_p = 0;
  ct_set_error(CT_OK, "%s", "");  // a stale message cannot satisfy the check below
  CHECK(run(2, &req, 1, &R) != 0);
  CHECK(strstr(ct_last_error(), "top_p") != NULL);
}

int main(int argc, char **argv) {
  ct_blas_init(argc, argv);
  ct_pool_init(2);
  if (ct_tokenizer_bytes(&tok)) return 1;
  ct_model_config c = {.model_type = "llama", .vocab_size = ct_tokenizer_vocab_size(tok),
                       .hidden_size = 32, .intermediate_size = 48, .num_layers = 2,
                       .num_heads = 4, .num_kv_heads = 2, .head_dim = 8,
                       .max_position_embeddings = 64, .rope_theta = 10000,
                       .rms_norm_eps = 1e-6f, .tie_word_embeddings = true,
                       .bos_token_id = -1, .eos_token_id = -1, .pad_token_id = -1};
  if (ct_model_init(&model, &c, 1)) return 1;
  ct_model_init_random(&model, 8, 0.4f);
  if (ct_infer_from_model(&weights, &model)) return 1;
  RUN(test_continuous_batching_matches_running_alone_greedy);
  RUN(test_continuous_batching_matches_running_alone_seeded);
  RUN(test_seeded_samples_do_not_depend_on_the_thread_count);
  RUN(test_bf16_batched_decode_matches_one_slot_at_1_16_128);
  RUN(test_multisampling_first_tokens_follow_the_logits);
  RUN(test_stop_ids_stop_strings_and_lengths);
  RUN(test_turns_continue_in_their_slot_as_a_fresh_prompt_would);
  RUN(test_bad_requests_fail_before_any_work);
  ct_infer_free(&weights);
  ct_model_free(&model);
  ct_tokenizer_free(tok);
  return test_summary();
}
