// sampler bench: prefill and decode throughput of the engine for the SmolLM-135M shape
// (hidden 576, 30 layers, 9 heads, 3 kv heads, intermediate 1536, vocab 49152, tied),
// fp32 and int8, next to the memory-bandwidth bound measured in the same run; and (bench
// speculative=mtp, on a model trained with MTP) speculative against plain greedy decoding.
//
// Decoding one token per slot reads every weight matrix once, so at batch 1 the rate
// is bounded by how fast memory streams the weights. The bound is measured in the same
// run with a memcpy on all threads: bound = (bytes copied per second) / (bytes of weights),
// the copy timed between the decode runs (best of all, see copier).
// A copy moves each byte twice (read, then write); counting that traffic instead
// doubles the bound, and the second percentage is taken against it.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "engine.h"
#include "error.h"
#include "forward.h"
#include "generate.h"
#include "log.h"
#include "panel.h"
#include "pool.h"
#include "speculative.h"
#include "weights.h"

static const char *const quant_names[3] = {"fp32", "bf16", "int8"};

typedef struct {
  char *dst;
  const char *src;
  long n;
} copy_job;

static void copy_range(void *ctx, long lo, long hi, int thread) {
  (void)thread;
  const copy_job *j = ctx;
  memcpy(j->dst + lo, j->src + lo, (size_t)(hi - lo));
}

// Two 512 MB buffers, copied on all threads: the memory bandwidth the batch-1 decode is
// held against. Copies are timed one at a time, between the decode runs, so the bound
// sees the same machine load as the decode; the best (the strictest bound) is kept.
typedef struct {
  char *a, *b;
  long n;
  double best, worst;  // bytes copied per second
  int runs;
} copier;

static int copier_init(copier *c) {
  *c = (copier){.n = 512L << 20};
  c->a = malloc((size_t)c->n), c->b = malloc((size_t)c->n);
  if (!c->a || !c->b) return fprintf(stderr, "sampler bench: cannot allocate 1 GB for the memcpy bound\n"), 1;
  memset(c->a, 1, (size_t)c->n);
  memset(c->b, 2, (size_t)c->n);
  return 0;
}

static void copy_once(copier *c) {
  copy_job j = {c->b, c->a, c->n};
  double t = ct_now();
  ct_parallel_ranges(j.n, 4096, ct_pool_threads(), copy_range, &j);
  double r = c->n / (ct_now() - t);
  c->best = r > c->best ? r : c->best;
  c->worst = c->runs == 0 || r < c->worst ? r : c->worst;
  c->runs++;
}

static double weight_bytes(const ct_infer_weights *w) {
  double b = 0;
  const ct_linear *mats[4];
  double per = w->int8 ? 1 : w->packed == CT_PACK_BF16 ? 2 : 4;  // bytes per weight
  for (int l = 0; l < w->cfg.num_layers; l++) {
    const ct_infer_layer *L = &w->layers[l];
    mats[0] = &L->qkv, mats[1] = &L->o, mats[2] = &L->gu, mats[3] = &L->down;
    for (int k = 0; k < 4; k++)
      b += (double)mats[k]->rows * mats[k]->cols * per + (w->int8 ? 4.0 * mats[k]->rows : 0);
  }
  b += (double)w->lm_head.rows * w->lm_head.cols * per;  // the LM head, read every step
  return b;
}

// tokens/s of decoding `batch` slots for `steps` steps after a `prompt`-token prefill, best
// of `reps` runs (each from position `prompt` again), each followed by one timed copy.
static double decode_rate(ct_engine *e, int batch, int prompt, int steps, int reps, float *logits, copier *c) {
  int n = batch, ids[64], slot[64], pos[64], outs[64];
  int *pids = malloc(sizeof(int) * prompt), *ps = malloc(sizeof(int) * prompt), *pp = malloc(sizeof(int) * prompt);
  for (int s = 0; s < batch; s++) {
    for (int i = 0; i < prompt; i++) pids[i] = (i * 31 + s * 7) % 49152, ps[i] = s, pp[i] = i;
    int last = prompt - 1;
    ct_engine_forward(e, prompt, pids, ps, pp, &last, 1, logits);
  }
  free(pids); free(ps); free(pp);
  double best = 0;
  for (int r = 0; r < reps; r++) {
    double t = ct_now();
    for (int k = 0; k < steps; k++) {
      for (int s = 0; s < n; s++) ids[s] = (k * 13 + s) % 49152, slot[s] = s, pos[s] = prompt + k, outs[s] = s;
      ct_engine_forward(e, n, ids, slot, pos, outs, n, logits);
    }
    t = (double)n * steps / (ct_now() - t);
    best = t > best ? t : best;
    copy_once(c);
  }
  return best;
}

// One timed pass of ct_forward over the bench's 4 x 256 tokens (no LM head): the
// training forward a prefill should at least match.
static double train_forward_once(const ct_model *m, ct_acts *a, int prompts, int len) {
  double t = ct_now();
  ct_forward(m, a, prompts, len);
  return prompts * len / (ct_now() - t);
}

// tokens/s of prefilling `prompts` prompts of `len` tokens in one pass (the last token's
// logits of each), best of `reps`; each repetition is followed by one training forward
// over the same tokens (best kept in *fwd), so the two see the same machine load.
static double prefill_rate(ct_engine *e, const ct_model *m, ct_acts *a, int prompts, int len, int reps,
                           float *logits, double *fwd) {
  int n = prompts * len;
  int *ids = malloc(sizeof(int) * n), *slot = malloc(sizeof(int) * n), *pos = malloc(sizeof(int) * n), outs[64];
  for (int i = 0; i < n; i++) ids[i] = (i * 17) % 49152, slot[i] = i / len, pos[i] = i % len;
  for (int p = 0; p < prompts; p++) outs[p] = p * len + len - 1;
  double best = 0;
  for (int r = 0; r < reps; r++) {
    double t = ct_now();
    ct_engine_forward(e, n, ids, slot, pos, outs, prompts, logits);
    t = ct_now() - t;
    if (n / t > best) best = n / t;
    double f = train_forward_once(m, a, prompts, len);
    if (f > *fwd) *fwd = f;
  }
  free(ids); free(slot); free(pos);
  return best;
}

// Options: threads=N, layers=N, steps=N (decode steps), reps=N (prefill repetitions), quant=fp32|bf16|int8 (one
// precision; all three by default), only=prefill|decode (one of the two measurements;
// profiling one kernel at a time).
int ct_sampler_bench(int argc, char **argv) {
  if (ct_pool_init((int)ct_args_long(argc, argv, "threads", 0))) return 1;
  int L = (int)ct_args_long(argc, argv, "layers", 30), steps = (int)ct_args_long(argc, argv, "steps", 32);
  int reps = (int)ct_args_long(argc, argv, "reps", 3);
  const char *quant = ct_args_str(argc, argv, "quant", "all"), *only = ct_args_str(argc, argv, "only", "all");
  bool do_prefill = strcmp(only, "decode") != 0, do_decode = strcmp(only, "prefill") != 0;
  if (strcmp(quant, "all") && strcmp(quant, "fp32") && strcmp(quant, "bf16") && strcmp(quant, "int8")) {
    fprintf(stderr, "sampler bench: quant=%s: expected fp32, bf16 or int8\n", quant);
    return 2;
  }
  if (do_prefill && do_decode && strcmp(only, "all")) {
    fprintf(stderr, "sampler bench: only=%s: expected prefill or decode\n", only);
    return 2;
  }
  ct_model_config c = ct_model_config_smollm135m(L);
  ct_model m;
  if (ct_model_init(&m, &c, 1)) return 1;
  ct_model_init_random(&m, 1, 0.02f);
  copier cp;
  if (do_decode) {
    if (copier_init(&cp)) return 1;
    for (int r = 0; r < 3; r++) copy_once(&cp);
  }
  printf("model: SmolLM-135M shape, %d layers; prefill 4 prompts x 256 tokens; decode after a "
         "128-token prompt\n", L);
  if (ct_model_rope_reserve(&m, 512)) return 1;
  ct_acts acts;  // the training forward's, over the prefill's tokens
  if (ct_acts_init(&acts, &m, 4, 256, CT_ACTS_FORWARD)) return 1;
  for (int i = 0; i < 4 * 256; i++) acts.ids[i] = (i * 17) % 49152, acts.pos[i] = i % 256, acts.seg[i] = i / 256;
  float *logits = malloc(sizeof(float) * 64 * c.vocab_size);
  double d1[3] = {0}, wbytes[3] = {0};
  for (int q = 0; q < 3; q++) {  // fp32, bf16, int8
    const char *name = quant_names[q];
    if (strcmp(quant, "all") != 0 && strcmp(quant, name) != 0) continue;
    ct_infer_weights w;
    if (q == 1 && !ct_panel16_native()) {
      printf("bf16: skipped (no AVX512_BF16 kernel in this build)\n");
      continue;
    }
    if (q < 2 ? ct_infer_from_model(&w, &m) || ct_infer_pack(&w, q ? CT_PACK_BF16 : CT_PACK_F32)
              : ct_infer_quantize(&w, &m) || ct_infer_pack(&w, CT_PACK_INT8))
      return 1;
    ct_engine_opts o = {16, 512, 1024, q == 1};
    ct_engine *e;
    if (ct_engine_init(&e, &w, &o)) return 1;
    wbytes[q] = weight_bytes(&w);
    printf("%s: weights %.0f MB", name, wbytes[q] / 1e6);
    if (do_prefill) {
      double f = 0, pre = prefill_rate(e, &m, &acts, 4, 256, reps, logits, &f);
      printf("; prefill %.0f tokens/s (%.2fx the training forward's %.0f, each the best of %d runs "
             "alternating with the other)", pre, pre / f, f, reps);
    }
    if (do_decode) {
      d1[q] = decode_rate(e, 1, 128, steps, reps, logits, &cp);
      double d16 = decode_rate(e, 16, 128, steps, 1, logits, &cp);
      printf("; decode batch 16: %.1f tokens/s; batch 1: %.1f tokens/s (best of %d runs of %d steps)", d16,
             d1[q], reps, steps);
    }
    printf("\n");
    ct_engine_free(e);
    ct_infer_free(&w);
  }
  if (do_decode) {
    // every batch-1 rate against the best copy of the whole run: the bound does not move
    // between precisions, and a copy slowed by a busy moment cannot lower it
    double bw = cp.best;
    printf("memcpy on %d threads: %.1f GB/s copied (%.1f GB/s read + written), the best of %d copies "
           "interleaved with the decode runs (slowest %.1f GB/s)\n", ct_pool_threads(), bw / 1e9, 2 * bw / 1e9,
           cp.runs, cp.worst / 1e9);
    for (int q = 0; q < 3; q++)
      if (d1[q] > 0) {
        double bound = bw / wbytes[q];
        printf("%s decode batch 1: %.1f tokens/s = %.0f%% of the memcpy bound (%.1f tokens/s; %.0f%% counting "
               "read + write traffic)\n", quant_names[q], d1[q], 100 * d1[q] / bound,
               bound, 50 * d1[q] / bound);
      }
    free(cp.a);
    free(cp.b);
  }
  free(logits);
  ct_acts_free(&acts);
  ct_model_free(&m);
  return 0;
}

// ---------------------------------------------------------------------------
// bench speculative=mtp (main.c loads the model, its depths and the prompts): plain
// greedy decoding against speculative=mtp on the same engine weights.
//
// Timed prompt by prompt, the two one after the other (which goes first alternates
// between repetitions), each prompt's best time of `reps` kept for each: a busy moment on
// a shared machine slows one prompt's run, not a whole side of the comparison. The
// tokens of both are compared (they must be identical). The passes and guesses printed
// are the last repetition's (the drafting rule has by then the record of the earlier ones).

typedef struct {
  int *ids;
  long n, cap;
} ids_log;

static int log_ids(void *ctx, const ct_gen_result *r) {
  ids_log *l = ctx;
  if (l->n + r->n + 1 > l->cap) {
    long cap = 2 * (l->n + r->n + 1) + 1024;
    int *p = realloc(l->ids, sizeof(int) * cap);
    if (!p) return ct_set_error(CT_ENOMEM, "out of memory");
    l->ids = p, l->cap = cap;
  }
  memcpy(l->ids + l->n, r->ids, sizeof(int) * r->n);
  l->n += r->n;
  l->ids[l->n++] = -1;  // (a separator)
  return 0;
}

int ct_sampler_bench_speculative(ct_engine *e, ct_spec_model *sm, const ct_tokenizer *tok,
                                 const ct_gen_request *reqs, int np, int reps) {
  double *best = malloc(sizeof(double) * 2 * np);  // (np, 2): plain, speculative
  if (!best) return ct_set_error(CT_ENOMEM, "out of memory");
  for (int i = 0; i < 2 * np; i++) best[i] = 1e30;
  ids_log a = {0}, b = {0};
  ct_spec_stats st = {0};
  int rc = 0;
  for (int rep = 0; rep < reps && !rc; rep++) {
    a.n = b.n = 0;
    st = (ct_spec_stats){0};
    ct_gen_callbacks ca = {.on_done = log_ids, .ctx = &a}, cb = {.on_done = log_ids, .ctx = &b};
    for (int r = 0; r < np && !rc; r++)
      for (int half = 0; half < 2 && !rc; half++) {
        int spec = half ^ (rep & 1);
        double t = ct_now();
        rc = spec ? ct_spec_generate(sm, tok, &reqs[r], 1, &cb, &st) : ct_generate(e, tok, &reqs[r], 1, &ca);
        t = ct_now() - t;
        if (t < best[2 * r + spec]) best[2 * r + spec] = t;
      }
  }
  if (!rc && (a.n != b.n || memcmp(a.ids, b.ids, sizeof(int) * a.n)))
    rc = ct_set_error(CT_EINVAL, "bench: speculative=mtp's tokens differ from plain greedy decoding's");
  if (!rc) {
    double plain = 0, spec = 0, toks = (double)st.tokens, checked = (double)(st.accepted + st.rejected);
    for (int r = 0; r < np; r++) plain += best[2 * r], spec += best[2 * r + 1];
    printf("greedy decoding of %d prompts, %.0f new tokens, one slot, %d threads (each prompt's best of %d, "
           "plain and speculative alternating)\n", np, toks, ct_pool_threads(), reps);
    printf("  plain:            %8.1f tokens/s  (%.0f passes of the model after the prefills)\n", toks / plain,
           toks - np);
    printf("  speculative=mtp:  %8.1f tokens/s  (%ld passes, %.2f tokens each; %d depths drafted %ld guesses, "
           "%ld kept: acceptance %.1f%% of those checked; the last repetition)\n", toks / spec, st.rounds,
           (toks - np) / (st.rounds > 0 ? st.rounds : 1), sm->D, st.drafted, st.accepted,
           100.0 * st.accepted / (checked > 0 ? checked : 1));
    printf("  speed-up:         %8.2fx  (identical tokens)\n", plain / spec);
  }
  free(a.ids), free(b.ids), free(best);
  return rc;
}
