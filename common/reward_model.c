// reward_model: a reward model that only scores — where it is (a model, or a LoRA adapter
// and its base), the checks that make a bad directory a clear error before any work, the
// rendering of (prompt, completion) with the model's own tokenizer and template, and
// batched forwards pooled at each text's last token. Training one is bin/reward's
// (reward/main.c).
#include "reward_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "fs.h"
#include "hf.h"
#include "jsonl.h"
#include "lora.h"
#include "mem.h"
#include "score.h"
#include "safetensors.h"
#include "train.h"

static const char *last_part(const char *dir, char *buf, size_t n) {
  size_t len = strlen(dir);
  while (len > 1 && dir[len - 1] == '/') len--;
  size_t start = len;
  while (start > 0 && dir[start - 1] != '/') start--;
  snprintf(buf, n, "%.*s", (int)(len - start), dir + start);
  return buf;
}

// The directories a reward model loads from: the base's weights, and an adapter ("":
// none) merged into them.
typedef struct {
  char base[CT_PATH_MAX], adapter[CT_PATH_MAX];
} rm_dirs;

// dir + adapter, or dir alone: a model, or an adapter naming its base.
static int resolve(const char *dir, const char *adapter, rm_dirs *d) {
  memset(d, 0, sizeof *d);
  snprintf(d->base, sizeof d->base, "%s", dir);
  if (adapter && adapter[0]) {
    snprintf(d->adapter, sizeof d->adapter, "%s", adapter);
    return 0;
  }
  if (!ct_path_has_file(dir, "adapter_config.json")) return 0;
  snprintf(d->adapter, sizeof d->adapter, "%s", dir);
  char p[CT_PATH_MAX];
  struct stat st;
  json_t *j = ct_path_join(p, sizeof p, dir, "adapter_config.json") ? NULL : json_load_file(p, 0, NULL);
  const char *b = json_string_value(json_object_get(j, "base_model_name_or_path"));
  int rc = 0;
  if (!b || !b[0])
    rc = ct_set_error(CT_ECONFIG, "reward model %s: an adapter whose adapter_config.json names no "
                      "base_model_name_or_path; give model_path=BASE adapter_path=%s", dir, dir);
  else if (stat(b, &st) || !S_ISDIR(st.st_mode))
    rc = ct_set_error(CT_ECONFIG, "reward model %s: its adapter's base_model_name_or_path %s is not a "
                      "directory here; give model_path=BASE adapter_path=%s", dir, b, dir);
  else
    snprintf(d->base, sizeof d->base, "%s", b);
  json_decref(j);
  return rc;
}

// config.json: a sequence classifier with one label (hf refuses other counts); with an
// adapter, the base may be a causal LM (read as a classifier: the adapter brings the head).
static int check_config(const rm_dirs *d, ct_model_config *mc) {
  int rc = ct_model_read_config(mc, d->base);
  if (rc) return ct_wrap_error(CT_ECONFIG, "reward model %s", d->base);
  if (d->adapter[0]) {
    mc->num_labels = 1;
    return 0;
  }
  if (!mc->num_labels)
    return ct_set_error(CT_ECONFIG, "reward model %s: config.json's architectures is not a "
                        "*ForSequenceClassification (this is a causal LM; train a reward model from it "
                        "with bin/reward)", d->base);
  return 0;
}

// With an adapter, its score among the adapter's tensors (all read: they are small) and
// every tensor fitting the base. (Without, ct_model_read_config checked score.weight's shape.)
static int check_score(const rm_dirs *d, const ct_model_config *mc) {
  if (!d->adapter[0]) return 0;
  ct_lora_config lc;
  ct_lora probe;
  if (ct_lora_read_config(&lc, d->adapter)) return ct_wrap_error(CT_ECONFIG, "reward model %s", d->adapter);
  if (!lc.save_score)
    return ct_set_error(CT_ECONFIG, "reward model %s: the adapter has no score head (its adapter_config.json's "
                        "modules_to_save lacks score: not a SEQ_CLS adapter)", d->adapter);
  if (ct_lora_load(&probe, d->adapter, mc)) return ct_wrap_error(CT_ECONFIG, "reward model %s", d->adapter);
  ct_lora_free(&probe);
  return 0;
}

// The tokenizer: an adapter directory's own when it has one (bin/reward saves it), else the base's.
static int load_tokenizer(const rm_dirs *d, ct_tokenizer **tok) {
  const char *dir = ct_lora_tokenizer_dir(d->adapter, d->base);
  if (!ct_path_has_file(dir, "tokenizer.json"))
    return ct_set_error(CT_ECONFIG, "reward model %s: its tokenizer cannot be loaded: no tokenizer.json", dir);
  if (ct_tokenizer_load_said(NULL, tok, dir))
    return ct_wrap_error(CT_ECONFIG, "reward model %s: its tokenizer cannot be loaded", dir);
  return 0;
}

// Every check of a reward model, without loading its weights: where it is, its config,
// its score head, and its tokenizer (loaded into *tok).
static int checks(const char *dir, const char *adapter, rm_dirs *d, ct_model_config *mc, ct_tokenizer **tok) {
  int rc = resolve(dir, adapter, d);
  if (!rc) rc = check_config(d, mc);
  if (!rc) rc = check_score(d, mc);
  if (!rc) rc = load_tokenizer(d, tok);
  return rc;
}

int ct_rm_check(const char *dir, const char *adapter) {
  rm_dirs d;
  ct_model_config mc;
  ct_tokenizer *tok = NULL;
  int rc = checks(dir, adapter, &d, &mc, &tok);
  if (tok) ct_tokenizer_free(tok);
  return rc;
}

double ct_rm_bytes(const char *dir, int dtype, int B, int T) {
  rm_dirs d;
  ct_model_config mc;
  if (resolve(dir, NULL, &d) || ct_model_read_config(&mc, d.base)) return 0;
  return ct_frozen_bytes(&mc, dtype, B, T) + sizeof(float) * ((double)mc.hidden_size * (B + 1)) +
         4.0 * sizeof(int) * B * T;
}

// The float32 classifier: the base's weights (a causal LM's backbone with a zero head),
// with the adapter merged in and its head in place.
static int load_model(const rm_dirs *d, const ct_model_config *mc, int T, ct_model *m) {
  int rc = ct_model_init(m, mc, T);
  if (rc) return rc;
  if (!(rc = ct_model_load_weights(m, m->params, d->base)) && d->adapter[0]) {
    ct_lora lo;
    if (!(rc = ct_lora_load(&lo, d->adapter, &m->cfg))) {
      rc = ct_lora_merge(&lo, m);
      ct_lora_free(&lo);
    }
  }
  if (rc) ct_model_free(m);
  return rc;
}

int ct_rm_open(ct_rm *r, const char *dir, const char *adapter, int dtype, int B, int T) {
  memset(r, 0, sizeof *r);
  rm_dirs d;
  ct_model_config mc;
  int rc = checks(dir, adapter, &d, &mc, &r->tok);
  if (rc) {
    ct_rm_free(r);
    return rc;
  }
  snprintf(r->dir, sizeof r->dir, "%s", d.adapter[0] ? d.adapter : d.base);
  last_part(r->dir, r->name, sizeof r->name);
  r->B = B, r->T = T, r->C = mc.hidden_size;
  ct_model m;
  if ((rc = load_model(&d, &mc, T, &m))) {
    ct_rm_free(r);
    return rc;
  }
  r->score = malloc(sizeof(float) * r->C);
  if (r->score) memcpy(r->score, m.w.score, sizeof(float) * r->C);  // (bf16 storage drops m.w)
  rc = r->score ? ct_frozen_init(&r->f, &m, dtype, B, T) : (ct_model_free(&m), CT_ENOMEM);
  r->hidden = malloc(sizeof(float) * (size_t)B * r->C);
  r->len = malloc(sizeof(int) * B);
  if (!rc && (!r->hidden || !r->len)) rc = ct_set_error(CT_ENOMEM, "reward model %s: out of memory", r->dir);
  if (!rc) rc = ct_batch_init(&r->batch, B, T);
  if (rc) ct_rm_free(r);
  return rc;
}

void ct_rm_free(ct_rm *r) {
  if (r->tok) ct_tokenizer_free(r->tok);
  if (r->f.B) ct_frozen_free(&r->f);
  ct_batch_free(&r->batch);
  ct_free_all(r->score, r->hidden, r->len);
  memset(r, 0, sizeof *r);
}

int ct_rm_render(const ct_rm *r, const json_t *row, const json_t *prompt, const char *completion, char **out,
                 bool *eos) {
  *out = NULL;
  *eos = !json_is_array(prompt);
  if (json_is_array(prompt)) {
    json_t *all = json_copy((json_t *)prompt);
    int rc = all ? json_array_append_new(all, json_pack("{s:s,s:s}", "role", "assistant", "content", completion)) : -1;
    rc = rc ? ct_set_error(CT_ENOMEM, "out of memory") : ct_row_chat(r->tok, row, all, "prompt", false, out);
    json_decref(all);
    return rc;
  }
  const char *p = json_is_string(prompt) ? json_string_value(prompt) : "";
  size_t np = strlen(p), nc = strlen(completion);
  if (!(*out = malloc(np + nc + 1))) return ct_set_error(CT_ENOMEM, "out of memory");
  memcpy(*out, p, np);
  memcpy(*out + np, completion, nc + 1);
  return 0;
}

// One forward of rows [0, n) (ids[i], len[i] <= T): rewards into out.
static int score_batch(ct_rm *r, const int *const *ids, const int *len, int n, double *out) {
  ct_batch *b = &r->batch;
  int T = 1, pad = ct_tokenizer_pad(r->tok);
  for (int i = 0; i < n; i++) T = len[i] > T ? len[i] : T;
  b->B = n, b->T = T, b->n_target = b->n_tokens = 0;
  for (int i = 0; i < n; i++) {
    ct_batch_row(b, i, ids[i], len[i], NULL, 0, pad);  // right-padded, no targets
    b->target[(long)i * T + len[i] - 1] = 0;           // the one row the forward hands back
  }
  b->n_target = n;
  int got = ct_frozen_hidden(&r->f, b, r->hidden);
  if (got < 0) return got;
  int zero[1] = {0};
  for (int i = 0; i < n; i++) ct_score_forward(r->hidden + (long)i * r->C, zero, 1, 1, r->C, r->score, &out[i]);
  return 0;
}

// Grows the forward buffers to rows of T tokens (rounded up to 64), saying so: the memory
// plan counted r->T.
static int grow(ct_rm *r, int T) {
  T = (T + 63) / 64 * 64;
  fprintf(stderr, "ctune: reward model %s: a text of more than %d tokens; its buffers grow to %d tokens "
          "(%.0f MiB more than the memory plan counted)\n", r->name, r->T, T,
          (ct_frozen_bytes(&r->f.cfg, r->f.dtype, r->B, T) - ct_frozen_bytes(&r->f.cfg, r->f.dtype, r->B, r->T)) /
              1048576.0);
  int rc = ct_frozen_reserve(&r->f, T);
  if (!rc) {
    ct_batch_free(&r->batch);
    rc = ct_batch_init(&r->batch, r->B, T);
  }
  if (!rc) r->T = T;
  return rc ? ct_wrap_error(rc, "reward model %s: growing to %d tokens", r->dir, T) : 0;
}

int ct_rm_score_ids(ct_rm *r, const int *const *ids, const int *len, int n, double *out, int *too_long) {
  int longest = 0;
  for (int i = 0; i < n; i++) longest = len[i] > longest ? len[i] : longest;
  if (!too_long && longest > r->T) {
    int rc = grow(r, longest);
    if (rc) return rc;
  }
  const int **bi = malloc(sizeof *bi * (size_t)r->B);
  int *bl = r->len, *slot = malloc(sizeof(int) * (size_t)r->B), k = 0, rc = 0;
  double *br = malloc(sizeof(double) * (size_t)r->B);
  if (!bi || !slot || !br) rc = ct_set_error(CT_ENOMEM, "out of memory");
  for (int i = 0; i < n && !rc; i++) {
    if (len[i] > r->T || len[i] < 1) {
      out[i] = NAN;
      if (too_long) *too_long += len[i] > r->T;
    } else {
      bi[k] = ids[i], bl[k] = len[i], slot[k++] = i;
    }
    if (k == r->B || (i == n - 1 && k > 0)) {
      if ((rc = score_batch(r, bi, bl, k, br))) break;
      for (int j = 0; j < k; j++) out[slot[j]] = br[j];
      k = 0;
    }
  }
  ct_free_all(bi, slot, br);
  return rc;
}

int ct_rm_score_texts(ct_rm *r, char *const *texts, const bool *eos, int n, double *out, int *too_long) {
  int eos_id = ct_tokenizer_eos(r->tok);
  ct_ids *t = calloc(n > 0 ? (size_t)n : 1, sizeof *t);
  const int **ids = malloc(sizeof *ids * (size_t)(n > 0 ? n : 1));
  int *len = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1)), rc = 0;
  if (!t || !ids || !len) rc = ct_set_error(CT_ENOMEM, "out of memory");
  for (int i = 0; i < n && !rc; i++) {
    if (ct_tokenizer_encode_doc(r->tok, texts[i], strlen(texts[i]), &t[i])) rc = CT_ENOMEM;
    if (!rc && eos && eos[i] && eos_id >= 0 && (t[i].n == 0 || t[i].v[t[i].n - 1] != eos_id))
      rc = ct_ids_push(&t[i], eos_id);
    ids[i] = t[i].v, len[i] = t[i].n;
  }
  if (!rc) rc = ct_rm_score_ids(r, ids, len, n, out, too_long);
  for (int i = 0; t && i < n; i++) ct_ids_free(&t[i]);
  ct_free_all(t, ids, len);
  return rc;
}
