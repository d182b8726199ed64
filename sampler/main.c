// sampler: try a model, or score completions, from the command line.
//
//   bin/sampler generate model_path=DIR prompt="Once upon a time"
//   bin/sampler generate model_path=DIR prompts_path=prompts.jsonl n=4 output=json
//   bin/sampler score    model_path=DIR data=rows.jsonl     (prompt/completion rows)
//   bin/sampler accuracy model_path=DIR data=eval.jsonl   (greedy exact match)
//   bin/sampler generate model_path=DIR prompt=... temperature=0 speculative=mtp   (MTP self-draft)
//   bin/sampler bench
//   bin/sampler bench speculative=mtp model_path=DIR prompts_path=prompts.jsonl
//
// Options are config keys (configs/base.yml, "Sampler" section); an optional yml file
// may come right after the command.
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat_template.h"
#include "config.h"
#include "data.h"
#include "die.h"
#include "engine.h"
#include "error.h"
#include "fs.h"
#include "generate.h"
#include "jsonl.h"
#include "matmul.h"
#include "mem.h"
#include "panel.h"
#include "pool.h"
#include "prompts.h"
#include "speculative.h"
#include "tokenizer.h"
#include "train.h"
#include "unicode.h"
#include "weights.h"

int ct_sampler_bench(int argc, char **argv);  // bench.c
int ct_sampler_bench_speculative(ct_engine *e, ct_spec_model *sm, const ct_tokenizer *tok,
                                 const ct_gen_request *reqs, int np, int reps);

static int usage(void) {
  ct_config_write_help(stderr, CT_TRAINER_SAMPLER);  // the usage, the sampler's keys
  return 2;
}

typedef struct {
  const ct_config *cfg;
  ct_tokenizer *tok;
  ct_infer_weights w;
  ct_lora lora;  // adapter_path: applied by the engine on top of the model
} setup_t;

// save_quantized=DIR: the int8 model as loaded, with its tokenizer.
static void save_quantized(const setup_t *s) {
  const ct_config *cfg = s->cfg;
  if (!s->w.int8)
    ct_die(2, (ct_set_error(CT_ECONFIG, "%s: key 'save_quantized' needs quantization=int8",
                            ct_config_origin(cfg, "save_quantized")), NULL));
  if (ct_infer_save_int8(&s->w, cfg->save_quantized, cfg->model_path) || ct_tokenizer_save(s->tok, cfg->save_quantized))
    ct_die(1, "saving the int8 model");
  fprintf(stderr, "sampler: int8 model saved in %s\n", cfg->save_quantized);
}

// The model (with its adapters and the tokenizer) every command runs; dies on failure.
static void setup(setup_t *s, const ct_config *cfg) {
  memset(s, 0, sizeof *s);
  s->cfg = cfg;
  if (!cfg->model_path[0])
    ct_die(2, (ct_set_error(CT_ECONFIG, "%s: key 'model_path' is required", ct_config_origin(cfg, "model_path")), NULL));
  long cores = sysconf(_SC_NPROCESSORS_ONLN), threads = (long)cfg->num_threads;
  if (threads > cores && cores > 0) {  // more spinning threads than cores: crawls
    fprintf(stderr, "sampler: num_threads %ld is more than this machine's %ld cores: using %ld\n",
            threads, cores, cores);
    threads = cores;
  }
  if (ct_pool_init((int)threads) || ct_blas_room(ct_pool_threads(), 0, NULL, "lower num_threads")) ct_die(1, NULL);
  const char *tdir = cfg->tokenizer_path[0] ? cfg->tokenizer_path : cfg->model_path;
  if (ct_tokenizer_load_said(NULL, &s->tok, tdir)) ct_die(1, NULL);
  if (cfg->chat_template_path[0] && ct_tokenizer_load_chat_template(s->tok, cfg->chat_template_path))
    ct_die(1, (ct_wrap_error(CT_EFORMAT, "%s: key 'chat_template_path'", ct_config_origin(cfg, "chat_template_path")), NULL));
  if (ct_infer_load(&s->w, cfg->model_path, cfg->quantization == CT_QUANT_INT8)) ct_die(1, NULL);
  if (cfg->adapter_path[0] &&
      (ct_lora_load(&s->lora, cfg->adapter_path, &s->w.cfg) || ct_infer_attach_lora(&s->w, &s->lora)))
    ct_die(1, NULL);
  if (cfg->quantization == CT_QUANT_BF16 && !s->w.int8 && !ct_panel16_native())
    ct_die(2, (ct_set_error(CT_ECONFIG, "%s: key 'quantization': bf16 needs a CPU with AVX512_BF16 (and a build "
                          "for it: -march=native); use none or int8", ct_config_origin(cfg, "quantization")), NULL));
  int dropped, had = ct_tokenizer_vocab_size(s->tok);
  if (ct_tokenizer_fit(s->tok, s->w.cfg.vocab_size, &dropped))
    ct_die(1, (ct_wrap_error(CT_EINVAL, "the tokenizer has %d tokens, the model only %d", had, s->w.cfg.vocab_size),
             NULL));
  if (dropped)
    fprintf(stderr, "sampler: %d added token%s past the model's vocab_size %d left out (read as plain text)\n",
            dropped, dropped > 1 ? "s" : "", s->w.cfg.vocab_size);
  if (cfg->save_quantized[0]) save_quantized(s);
  if (ct_infer_pack(&s->w, cfg->quantization == CT_QUANT_BF16 ? CT_PACK_BF16 : CT_PACK_F32)) ct_die(1, NULL);
}

static void setup_free(setup_t *s) {
  ct_infer_free(&s->w);
  ct_lora_free(&s->lora);
  ct_tokenizer_free(s->tok);
}

// The sampling keys, and the engine's shape from decode_slots, max_target_length and
// max_prefill_length.
static ct_sample_params sample_params(const ct_config *cfg) {
  return (ct_sample_params){(float)cfg->temperature, (int)cfg->top_k, (float)cfg->top_p, (float)cfg->min_p,
                            (float)cfg->repetition_penalty};
}

static ct_engine_opts engine_opts(const ct_config *cfg) {
  int slots = cfg->decode_slots > 0 ? (int)cfg->decode_slots : 16;  // (0: the default)
  return (ct_engine_opts){slots, (int)cfg->max_target_length,
                          (int)(cfg->max_prefill_length > slots ? cfg->max_prefill_length : slots),
                          cfg->quantization == CT_QUANT_BF16};
}

// ---------------------------------------------------------------------------
// generate

typedef struct {
  ct_ids ids;
  uint64_t seed;
} prompt_t;

static ct_prompt_opts prompt_opts(const setup_t *s) {
  const ct_config *c = s->cfg;
  return (ct_prompt_opts){c->add_generation_prompt, (int)c->max_prefill_length,
                          c->truncate_prompt == CT_TRUNCATE_LEFT, "max_prefill_length", s->w.cfg.vocab_size, false, NULL, false};
}

// A row's optional "seed" into *seed.
static int row_seed(const json_t *row, const char *path, int line, uint64_t *seed) {
  json_t *v = json_object_get(row, "seed");
  if (v && !json_is_integer(v)) return ct_row_error(path, line, "key 'seed': expected an integer");
  if (v) *seed = (uint64_t)json_integer_value(v);
  return 0;
}

// The prompts of a JSONL file (common/prompts.h): their tokens move into ps (n).
static int load_prompts(const setup_t *s, const char *path, ct_prompt_set *set, prompt_t **ps) {
  ct_prompt_opts o = prompt_opts(s);
  int rc = ct_prompt_set_load(set, path, s->tok, &o);
  if (rc) return rc;
  *ps = calloc(set->n, sizeof **ps);
  if (!*ps) return ct_set_error(CT_ENOMEM, "out of memory");
  for (int k = 0; k < set->n; k++) {
    (*ps)[k].ids = set->ids[k];
    set->ids[k] = (ct_ids){0};
  }
  return 0;
}

static int read_prompts(const setup_t *s, prompt_t **out, int *n_out) {
  const ct_config *c = s->cfg;
  if (c->prompt[0] && c->prompts_path[0])
    return ct_set_error(CT_ECONFIG, "%s: set either 'prompt' or 'prompts_path', not both", ct_config_origin(c, "prompt"));
  if (c->prompt[0]) {
    prompt_t *ps = calloc(1, sizeof *ps);
    json_t *row = json_pack("{s:s}", "prompt", c->prompt);
    ct_prompt_opts o = prompt_opts(s);
    int rc = ps && row ? ct_prompt_tokens(s->tok, row, "prompt", &o, &ps[0].ids) : CT_ENOMEM;
    if (ps) ps[0].seed = (uint64_t)c->seed;
    json_decref(row);
    *out = ps;
    *n_out = 1;
    return rc;
  }
  if (!c->prompts_path[0])
    return ct_set_error(CT_ECONFIG, "generate needs prompt=TEXT or prompts_path=FILE.jsonl");
  ct_prompt_set set;
  int rc = load_prompts(s, c->prompts_path, &set, out);
  *n_out = set.n;
  for (int k = 0; !rc && k < set.n; k++) {
    (*out)[k].seed = (uint64_t)c->seed + (uint64_t)k;
    rc = row_seed(set.rows[k], c->prompts_path, set.line[k], &(*out)[k].seed);
  }
  ct_prompt_set_free(&set);
  return rc;
}

typedef struct {
  const setup_t *s;
  int n_per, total, next;  // results are written in input order
  json_t **done;           // (total) finished, not yet written
  char **texts;            // text mode
  bool stream;
  bool streamed;  // the first piece is out (the decoder's Strip applies to it only)
} out_t;

static int write_result(out_t *o, int k) {
  if (o->s->cfg->output == CT_OUTPUT_JSON) {
    char *line = json_dumps(o->done[k], JSON_COMPACT);
    if (!line) return ct_set_error(CT_ENOMEM, "out of memory");
    printf("%s\n", line);
    free(line);
  } else if (!o->stream) {
    json_t *j = o->done[k];
    if (o->total > 1)
      printf("=== row %d, sample %d (%s)\n", (int)json_integer_value(json_object_get(j, "row")),
             (int)json_integer_value(json_object_get(j, "sample")),
             json_string_value(json_object_get(j, "finish_reason")));
    printf("%s\n", json_string_value(json_object_get(j, "completion")));
  }
  fflush(stdout);
  json_decref(o->done[k]);
  o->done[k] = NULL;
  return 0;
}

static int on_done(void *ctx, const ct_gen_result *r) {
  out_t *o = ctx;
  json_t *ids = json_array(), *lps = json_array();
  for (int i = 0; i < r->n; i++) {
    json_array_append_new(ids, json_integer(r->ids[i]));
    json_array_append_new(lps, json_real(r->logprobs[i]));
  }
  int k = r->request * o->n_per + r->sample;
  size_t tlen;
  char *text = ct_utf8_lossy(r->text, r->text_len, &tlen);  // JSON needs valid UTF-8
  o->done[k] = text ? json_pack("{s:i,s:i,s:s%,s:o,s:o,s:s}", "row", r->request, "sample", r->sample,
                                "completion", text, tlen, "completion_ids", ids, "logprobs", lps,
                                "finish_reason", ct_finish_names[r->finish])
                    : NULL;
  free(text);
  if (!o->done[k]) return ct_set_error(CT_ENOMEM, "out of memory");
  if (o->stream) printf("\n");
  while (o->next < o->total && o->done[o->next])
    if (write_result(o, o->next++)) return 1;
  return 0;
}

static void on_token(void *ctx, int request, int sample, int token) {
  out_t *o = ctx;
  (void)request;
  (void)sample;
  if (!o->stream || ct_tokenizer_is_stop(o->s->tok, token)) return;
  size_t len;
  const char *b = ct_tokenizer_token_bytes(o->s->tok, token, &len);
  if (b && !o->streamed) {  // the first piece: what the decoder's Strip cuts is not printed
    size_t lead = ct_tokenizer_decode_lead(o->s->tok, b, len);
    b += lead, len -= lead;
  }
  o->streamed |= b != NULL;
  if (b) fwrite(b, 1, len, stdout);
  fflush(stdout);
}

// speculative=mtp: greedy decoding drafted by the model's multi-token prediction depths.
static int speculate(const setup_t *s, const ct_engine_opts *eo, const ct_gen_request *reqs, int np,
                     const ct_gen_callbacks *cb) {
  const ct_config *c = s->cfg;
  const char *key = c->temperature > 0 ? "temperature" : c->n != 1 ? "n" : c->adapter_path[0] ? "adapter_path" : NULL;
  if (key)
    ct_die(2, (ct_set_error(CT_ECONFIG, "%s: key '%s': speculative=mtp decodes greedily, one sample, without adapters "
                          "(temperature=0, n=1, no adapter_path)", ct_config_origin(c, key), key), NULL));
  ct_spec_model sm;
  ct_spec_stats st = {0};
  int rc = ct_spec_load(&sm, &s->w, c->model_path, eo);
  double t0 = ct_now();
  if (!rc) rc = ct_spec_generate(&sm, s->tok, reqs, np, cb, &st);
  if (!rc)
    fprintf(stderr, "sampler: speculative=mtp (%d depths): %ld tokens in %ld passes of the model after %d prefills, "
            "%ld of %ld guesses kept (%.1f%% of those checked), %.1f tokens/s\n", sm.D, st.tokens, st.rounds, np,
            st.accepted, st.drafted, 100.0 * st.accepted / (st.accepted + st.rejected > 0 ? st.accepted + st.rejected : 1),
            st.tokens / (ct_now() - t0));
  ct_spec_free(&sm);
  return rc;
}

// One request per prompt: n samples each with sp, the config's length and stop strings,
// the tokenizer's stop ids.
static ct_gen_request *requests(const ct_config *cfg, const setup_t *s, const prompt_t *ps, int np, int n,
                                ct_sample_params sp) {
  const int *stop_ids;
  int n_stop = ct_tokenizer_stop_ids(s->tok, &stop_ids);
  ct_gen_request *reqs = calloc(np > 0 ? np : 1, sizeof *reqs);
  if (!reqs) ct_die(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  for (int i = 0; i < np; i++)
    reqs[i] = (ct_gen_request){ps[i].ids.v, ps[i].ids.n, n, ps[i].seed, sp, (int)cfg->max_new_tokens, stop_ids, n_stop,
                               (const char *const *)cfg->stop.v, cfg->stop.n};
  return reqs;
}

static int cmd_generate(const ct_config *cfg) {
  setup_t s;
  setup(&s, cfg);
  prompt_t *ps = NULL;
  int np = 0;
  if (read_prompts(&s, &ps, &np)) ct_die(1, NULL);
  ct_gen_request *reqs = requests(cfg, &s, ps, np, (int)cfg->n, sample_params(cfg));
  ct_engine_opts eo = engine_opts(cfg);
  ct_engine *e = NULL;  // (speculative=mtp runs its own)
  if (cfg->speculative != CT_SPEC_MTP && ct_engine_init(&e, &s.w, &eo)) ct_die(1, NULL);
  out_t o = {.s = &s, .n_per = (int)cfg->n, .total = np * (int)cfg->n};
  o.done = calloc(o.total, sizeof *o.done);
  o.stream = cfg->output == CT_OUTPUT_TEXT && o.total == 1;
  ct_gen_callbacks cb = {.on_done = on_done, .on_token = on_token, .ctx = &o};
  if (cfg->speculative == CT_SPEC_MTP) {
    if (speculate(&s, &eo, reqs, np, &cb)) ct_die(1, NULL);
  } else if (ct_generate(e, s.tok, reqs, np, &cb)) {
    ct_die(1, NULL);
  }
  ct_engine_free(e);
  for (int i = 0; i < np; i++) ct_ids_free(&ps[i].ids);
  free(ps);
  free(reqs);
  free(o.done);
  setup_free(&s);
  return 0;
}

// ---------------------------------------------------------------------------
// accuracy: completions of `data` rows (sampled with the sampling keys; temperature=0
// for greedy) compared with their "completion" field.

typedef struct {
  char **want;
  int hits, done;
} acc_t;

static int acc_done(void *ctx, const ct_gen_result *r) {
  acc_t *a = ctx;
  const char *w = a->want[r->request];
  a->hits += strlen(w) == r->text_len && memcmp(w, r->text, r->text_len) == 0;
  a->done++;
  return 0;
}

// Each row's "completion" (malloc'd strings, n of them): what accuracy compares with.
static char **read_wants(const ct_config *cfg, const ct_prompt_set *set) {
  char **want = calloc(set->n, sizeof *want);
  if (!want) ct_die(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  for (int k = 0; k < set->n; k++) {
    const char *c = json_string_value(json_object_get(set->rows[k], "completion"));
    if (!c) ct_die(1, (ct_row_error(cfg->data, set->line[k], "key 'completion': expected a string"), NULL));
    if (!(want[k] = strdup(c))) ct_die(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  }
  return want;
}

// One request per row: one sample with the sampling keys, seeded by its row, as long as its
// expected answer and a stop token, a little more.
static ct_gen_request *accuracy_requests(const ct_config *cfg, const setup_t *s, const prompt_t *ps, char **want,
                                         int n) {
  const int *stop_ids;
  int n_stop = ct_tokenizer_stop_ids(s->tok, &stop_ids);
  ct_gen_request *reqs = calloc(n, sizeof *reqs);
  ct_sample_params sp = sample_params(cfg);
  for (int i = 0; i < n; i++) {
    ct_ids w = {0};
    ct_tokenizer_encode(s->tok, want[i], strlen(want[i]), true, &w);
    reqs[i] = (ct_gen_request){.prompt = ps[i].ids.v, .prompt_len = ps[i].ids.n, .n = 1,
                               .seed = (uint64_t)cfg->seed + (uint64_t)i, .sp = sp,
                               .max_new_tokens = w.n + 4, .stop_ids = stop_ids, .n_stop_ids = n_stop,
                               .stop_strings = (const char *const *)cfg->stop.v, .n_stop_strings = cfg->stop.n};
    ct_ids_free(&w);
  }
  return reqs;
}

static int cmd_accuracy(const ct_config *cfg) {
  setup_t s;
  setup(&s, cfg);
  if (!cfg->data[0])
    ct_die(2, (ct_set_error(CT_ECONFIG, "accuracy needs data=FILE.jsonl (rows with prompt and completion)"), NULL));
  ct_prompt_set set;
  prompt_t *ps = NULL;
  if (load_prompts(&s, cfg->data, &set, &ps)) ct_die(1, NULL);
  int n = set.n;
  char **want = read_wants(cfg, &set);
  ct_prompt_set_free(&set);
  ct_gen_request *reqs = accuracy_requests(cfg, &s, ps, want, n);
  ct_engine_opts eo = engine_opts(cfg);
  ct_engine *e;
  if (ct_engine_init(&e, &s.w, &eo)) ct_die(1, NULL);
  acc_t a = {want, 0, 0};
  ct_gen_callbacks cb = {.on_done = acc_done, .ctx = &a};
  if (ct_generate(e, s.tok, reqs, n, &cb)) ct_die(1, NULL);
  printf("{\"data\": \"%s\", \"rows\": %d, \"temperature\": %g, \"exact_match\": %.4f}\n", cfg->data,
         n, cfg->temperature, (double)a.hits / n);
  ct_engine_free(e);
  for (int i = 0; i < n; i++) {
    ct_ids_free(&ps[i].ids);
    free(want[i]);
  }
  free(ps);
  free(want);
  free(reqs);
  setup_free(&s);
  return 0;
}

// ---------------------------------------------------------------------------
// score: log-prob of each row's completion given its prompt, at `temperature` (0: at 1),
// as generate reports the log-probs of what it samples.

typedef struct {
  ct_engine *e;   // one slot, prefilling `chunk` positions at a time
  int chunk, V;
  double tau;     // the temperature the log-probs are at
  float *logits;  // (chunk, V)
  int *slot, *pos, *outs, *tgt;  // (chunk) each
} scorer_t;

// One row's line: {"row", "logp" (the sum), "token_logps"} of its labeled tokens, each
// token t predicted at t - 1.
static void score_row(scorer_t *sc, int r, const int *ids, const uint8_t *lab, int len) {
  int chunk = sc->chunk, V = sc->V;
  double total = 0;
  json_t *tl = json_array();
  for (int start = 0; start < len; start += chunk) {
    int n = len - start < chunk ? len - start : chunk, nout = 0;
    for (int i = 0; i < n; i++) {
      sc->pos[i] = start + i;
      int t = start + i + 1;
      if (t < len && lab[t]) {
        sc->outs[nout] = i;
        sc->tgt[nout++] = ids[t];
      }
    }
    if (ct_engine_forward(sc->e, n, ids + start, sc->slot, sc->pos, sc->outs, nout, sc->logits)) ct_die(1, NULL);
    for (int k = 0; k < nout; k++) {  // log-softmax of logits / tau
      const float *l = sc->logits + (long)k * V;
      float mx = l[0];
      for (int v = 1; v < V; v++) mx = l[v] > mx ? l[v] : mx;
      double sum = 0;
      for (int v = 0; v < V; v++) sum += exp(((double)l[v] - mx) / sc->tau);
      double lp = ((double)l[sc->tgt[k]] - mx) / sc->tau - log(sum);
      total += lp;
      json_array_append_new(tl, json_real(lp));
    }
  }
  json_t *j = json_pack("{s:i,s:f,s:o}", "row", r, "logp", total, "token_logps", tl);
  char *line = json_dumps(j, JSON_COMPACT);
  printf("%s\n", line);
  free(line);
  json_decref(j);
}

static int cmd_score(const ct_config *cfg) {
  setup_t s;
  setup(&s, cfg);
  if (!cfg->data[0])
    ct_die(2, (ct_set_error(CT_ECONFIG, "score needs data=FILE.jsonl (rows with prompt and completion)"), NULL));
  // prompt/completion rows score the completion; a plain {"text"} row scores every token
  // after its first
  ct_data_opts o = {.max_length = (int)cfg->max_target_length, .completion_only_loss = true,
                    .text_field = "text", .model_vocab = s.w.cfg.vocab_size};
  ct_dataset ds;
  if (ct_dataset_load(&ds, cfg->data, s.tok, &o)) ct_die(1, NULL);
  if (ds.n_empty || ds.n_truncated)
    ct_die(1, (ct_set_error(CT_EFORMAT, "%s: %d rows have no completion tokens and %d were cut at "
                          "max_target_length %ld", cfg->data, ds.n_empty, ds.n_truncated,
                          (long)cfg->max_target_length), NULL));
  int chunk = 256;
  scorer_t sc = {.chunk = chunk, .V = s.w.cfg.vocab_size,
                 .tau = cfg->temperature > 0 ? cfg->temperature : 1.0};  // as generate reports log-probs
  ct_engine_opts eo = {1, (int)cfg->max_target_length, chunk, cfg->quantization == CT_QUANT_BF16};
  if (ct_engine_init(&sc.e, &s.w, &eo)) ct_die(1, NULL);
  sc.logits = malloc(sizeof(float) * (size_t)chunk * sc.V);
  sc.slot = calloc(chunk, sizeof(int)), sc.pos = malloc(sizeof(int) * chunk), sc.outs = malloc(sizeof(int) * chunk);
  sc.tgt = malloc(sizeof(int) * chunk);
  for (int r = 0; r < ds.n_rows; r++)
    score_row(&sc, r, ds.ids + ds.row_start[r], ds.label + ds.row_start[r], ds.row_len[r]);
  ct_free_all(sc.logits, sc.slot, sc.pos, sc.outs, sc.tgt);
  ct_engine_free(sc.e);
  ct_dataset_free(&ds);
  setup_free(&s);
  return 0;
}

// ---------------------------------------------------------------------------
// bench speculative=mtp model_path=DIR prompts_path=FILE: plain greedy decoding (one
// slot, as speculative=mtp decodes) against speculative=mtp on the same prompts
// (bench.c's ct_sampler_bench_speculative); the two outputs must be identical.

static int cmd_bench_speculative(const ct_config *cfg) {
  if (cfg->speculative != CT_SPEC_MTP)
    ct_die(2, (ct_set_error(CT_ECONFIG, "%s: key 'speculative': bench compares speculative=mtp with plain decoding",
                          ct_config_origin(cfg, "speculative")), NULL));
  setup_t s;
  setup(&s, cfg);
  prompt_t *ps = NULL;
  int np = 0;
  if (read_prompts(&s, &ps, &np)) ct_die(1, NULL);
  ct_gen_request *reqs = requests(cfg, &s, ps, np, 1, (ct_sample_params){0, 0, 1.0f, 0.0f, 1.0f});  // greedy
  ct_engine_opts eo = {1, (int)cfg->max_target_length, (int)cfg->max_prefill_length,
                       cfg->quantization == CT_QUANT_BF16};
  ct_engine *e;
  ct_spec_model sm;
  if (ct_engine_init(&e, &s.w, &eo) || ct_spec_load(&sm, &s.w, cfg->model_path, &eo)) ct_die(1, NULL);
  if (ct_sampler_bench_speculative(e, &sm, s.tok, reqs, np, 3)) ct_die(1, NULL);
  ct_spec_free(&sm);
  ct_engine_free(e);
  for (int i = 0; i < np; i++) ct_ids_free(&ps[i].ids);
  free(ps);
  free(reqs);
  setup_free(&s);
  return 0;
}

int main(int argc, char **argv) {
  ct_die_name("sampler");
  int help = ct_config_usage(CT_TRAINER_SAMPLER, argc, argv);  // --help, -h, or nothing
  if (help >= 0) return help;
  ct_blas_init(argc, argv);
  const char *cmd = argv[1];
  bool spec_bench = false;  // bench speculative=...: on a model (the config's key), not the synthetic shape
  for (int i = 2; i < argc; i++) spec_bench |= !strncmp(argv[i], "speculative=", 12);
  if (strcmp(cmd, "bench") == 0 && !spec_bench) return ct_sampler_bench(argc - 1, argv + 1);
  if (strcmp(cmd, "generate") && strcmp(cmd, "score") && strcmp(cmd, "accuracy") && strcmp(cmd, "bench")) return usage();
  ct_config cfg;
  if (ct_config_from_args(&cfg, CT_TRAINER_SAMPLER, argc - 1, argv + 1)) ct_die(2, NULL);
  if (ct_config_ignored(&cfg)[0])  // a trainer's yml or a run's config.yml
    fprintf(stderr, "sampler: %s: skipped keys the sampler does not use: %s\n", argv[2], ct_config_ignored(&cfg));
  int rc = !strcmp(cmd, "generate") ? cmd_generate(&cfg)
           : !strcmp(cmd, "score")  ? cmd_score(&cfg)
           : !strcmp(cmd, "bench")  ? cmd_bench_speculative(&cfg)
                                    : cmd_accuracy(&cfg);
  ct_config_free(&cfg);
  ct_pool_free();
  return rc;
}
