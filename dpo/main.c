// dpo: preference tuning with a policy and a frozen reference, as TRL's DPOTrainer.
//
//   bin/dpo configs/dpo.yml model_path=DIR dataset_path=prefs.jsonl output_dir=out
//
// Each step takes per_device_train_batch_size x gradient_accumulation_steps x ranks
// pairs. A micro-batch of m pairs is 2m rows (chosen rows, then rejected rows) through
// one forward per model; logπ(y) is the SUM of the completion tokens' log-probs. The
// loss is the mean over the step's pairs of Σ_k weight_k · loss_k (dpo/loss.h); the
// `sft` loss is the cross-entropy averaged over the step's chosen tokens. Per-pair
// metrics are means over the logging window's pairs; per-token ones (dpo/metrics.h) are
// means over its micro-batches, as TRL logs them.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fingerprint.h"
#include "ckpt.h"
#include "config.h"
#include "die.h"
#include "dist.h"
#include "dpo/loss.h"
#include "dpo/metrics.h"
#include "dpo/refcache.h"
#include "error.h"
#include "forward.h"
#include "hash.h"
#include "lm.h"
#include "loop.h"
#include "matmul.h"
#include "mem.h"
#include "pool.h"
#include "prefs.h"
#include "run.h"
#include "safetensors.h"
#include "train.h"
#include "watch.h"
#include "window.h"

// The losses from config: loss_type list, loss_weights, beta (the config made it 2.0 by default for simpo).
static int losses_from(const ct_config *c, ct_dpo_loss *o) {
  *o = (ct_dpo_loss){.n = c->loss_type.n, .beta = c->beta, .label_smoothing = c->label_smoothing,
                     .simpo_gamma = c->simpo_gamma, .discopop_tau = c->discopop_tau, .cpo_alpha = c->cpo_alpha,
                     .desirable_weight = c->desirable_weight, .undesirable_weight = c->undesirable_weight,
                     .alpha = c->alpha};
  if (o->n > 8)
    return ct_set_error(CT_ECONFIG, "%s: key 'loss_type': at most 8 losses", ct_config_origin(c, "loss_type"));
  if (c->loss_weights.n && c->loss_weights.n != c->loss_type.n)
    return ct_set_error(CT_ECONFIG, "%s: key 'loss_weights': %d weights for %d loss_type entries",
                        ct_config_origin(c, "loss_weights"), c->loss_weights.n, c->loss_type.n);
  bool simpo = false;
  for (int k = 0; k < o->n; k++) {
    o->type[k] = -1;
    for (int t = 0; ct_dpo_loss_type_names[t]; t++)
      if (!strcmp(c->loss_type.v[k], ct_dpo_loss_type_names[t])) o->type[k] = t;
    if (o->type[k] < 0)  // (the config took DPO's names only)
      return ct_set_error(CT_ECONFIG, "%s: key 'loss_type': '%s' is no DPO loss", ct_config_origin(c, "loss_type"),
                          c->loss_type.v[k]);
    o->weight[k] = c->loss_weights.n ? c->loss_weights.v[k] : 1.0;
    simpo |= o->type[k] == CT_DPO_SIMPO || o->type[k] == CT_DPO_ORPO || ct_dpo_is_cpo(o->type[k]);
  }
  for (int k = 0; k < o->n; k++)
    if (o->type[k] == CT_DPO_EXO_PAIR && !(c->label_smoothing > 0))
      return ct_set_error(CT_ECONFIG, "%s: key 'label_smoothing': exo_pair divides by it (its epsilon): set it "
                          "above 0 (the EXO paper uses 1e-3)", ct_config_origin(c, "label_smoothing"));
  bool disco = false, cpo = false;
  for (int k = 0; k < o->n; k++) disco |= o->type[k] == CT_DPO_DISCOPOP, cpo |= ct_dpo_is_cpo(o->type[k]);
  if (!cpo && ct_config_is_set(c, "cpo_alpha") && c->cpo_alpha != 1.0)
    return ct_set_error(CT_ECONFIG, "%s: key 'cpo_alpha': cpo's, and loss_type has no cpo",
                        ct_config_origin(c, "cpo_alpha"));
  if (!cpo && c->alpha != 0)
    return ct_set_error(CT_ECONFIG, "%s: key 'alpha': the cpo losses' AlphaPO reward shape, and loss_type has "
                        "none of cpo, cpo_hinge, cpo_ipo, cpo_simpo, alphapo", ct_config_origin(c, "alpha"));
  if (!disco && c->discopop_tau != 0.05 && ct_config_is_set(c, "discopop_tau"))
    return ct_set_error(CT_ECONFIG, "%s: key 'discopop_tau': discopop's, and loss_type has no discopop",
                        ct_config_origin(c, "discopop_tau"));
  if (ct_dpo_unpaired(o) && o->n > 1)
    return ct_set_error(CT_ECONFIG, "%s: key 'loss_type': kto and apo_zero_unpaired train on unpaired rows "
                        "{prompt, completion, label}, so they take no other loss_type beside them",
                        ct_config_origin(c, "loss_type"));
  for (int k = 0; k < 2 && !ct_dpo_unpaired(o); k++) {
    const char *key = k ? "undesirable_weight" : "desirable_weight";
    if (ct_config_is_set(c, key) && (k ? c->undesirable_weight : c->desirable_weight) != 1.0)
      return ct_set_error(CT_ECONFIG, "%s: key '%s': kto's and apo_zero_unpaired's, and loss_type has neither",
                          ct_config_origin(c, key), key);
  }
  if (ct_dpo_kto_kl(o) && c->precompute_ref_log_probs)
    return ct_set_error(CT_ECONFIG, "%s: kto's KL term reads the reference on each micro-batch's mismatched "
                        "pairs, which are made per batch: its log-probs cannot be precomputed (apo_zero_unpaired's can)",
                        ct_config_origin(c, "precompute_ref_log_probs"));
  if (ct_dpo_kto_kl(o) && c->per_device_train_batch_size < 2)
    return ct_set_error(CT_ECONFIG, "%s: key 'per_device_train_batch_size': kto pairs each prompt with another "
                        "example's completion of its micro-batch (its KL term), so it needs at least 2",
                        ct_config_origin(c, "per_device_train_batch_size"));
  if (o->beta <= 0 && o->n && (ct_dpo_needs_reference(o) || simpo))
    return ct_set_error(CT_ECONFIG, "%s: key 'beta' must be positive for DPO losses", ct_config_origin(c, "beta"));
  return 0;
}

// DPO's own checks of the config, before anything is loaded.
static int check_config(const ct_config *c) {
  ct_dpo_loss o;
  int rc = losses_from(c, &o);
  if (!rc) rc = ct_train_check_reference(c);
  if (!rc && c->sync_ref_model && c->precompute_ref_log_probs)
    rc = ct_set_error(CT_ECONFIG, "%s: sync_ref_model changes the reference during training, "
                      "so its log-probs cannot be precomputed", ct_config_origin(c, "sync_ref_model"));
  return rc;
}

// ---------------------------------------------------------------------------
// Summed completion log-probs of every row of a batch, from the head's gathered rows.

typedef struct {
  float *row_lp;     // (2m) Σ log-probs of each row's completion
  int *row_len;      // (2m) its tokens
  double *row_sum;   // (2m) scratch: the sums, in double
} row_sums;

// Sums the n gathered rows of head h (after a forward of batch b) per batch row.
static void sum_rows(row_sums *s, const ct_head *h, int n, const ct_batch *b) {
  if (n < 0) ct_die(1, NULL);
  for (int r = 0; r < b->B; r++) s->row_len[r] = 0, s->row_sum[r] = 0;
  for (int r = 0; r < n; r++) {
    int row = h->rows[r] / b->T;
    s->row_sum[row] += h->logp[r];
    s->row_len[row]++;
  }
  for (int r = 0; r < b->B; r++) s->row_lp[r] = (float)s->row_sum[r];
}

static int row_sums_init(row_sums *s, int rows) {
  s->row_lp = malloc(sizeof(float) * rows);
  s->row_len = malloc(sizeof(int) * rows);
  s->row_sum = malloc(sizeof(double) * rows);
  return s->row_lp && s->row_len && s->row_sum ? 0 : ct_set_error(CT_ENOMEM, "out of memory");
}

static void row_sums_free(row_sums *s) { ct_free_all(s->row_lp, s->row_len, s->row_sum); }

// ---------------------------------------------------------------------------

typedef struct {
  double loss, lp_c, lp_r, rw_c, rw_r, acc, margin, pairs, tokens;
  double log_odds, log_odds_sig;  // orpo: Σ log odds, Σ log σ(log odds)
  double n_c, n_r, kl, kl_n;      // unpaired: desirable and undesirable examples; Σ KL, its micro-batches
  ct_dpo_token_means tok;  // added after the ranks' sums (its micro-batches already are)
} dpo_stats;

typedef struct {
  const ct_config *cfg;
  ct_train *tr;
  ct_dpo_loss loss;
  bool need_ref;
  bool orpo;  // loss_type has orpo: its log_odds_* metrics
  bool unpaired, kl;  // kto / apo_zero_unpaired: unpaired examples; kto: and its KL rows
  ct_frozen ref;         // the reference, when resident (not precomputed)
  bool ref_loaded;
  ct_acts acts;          // the policy's, kept (or recomputed) for backward
  ct_acts eval_acts;     // the policy's on evaluation batches: forward only
  row_sums pol, refs;    // completion log-prob sums of the policy and the reference
  ct_head head;
  ct_batch batch;
  int *pairs;
  float *ref_c, *ref_r;  // (m) the micro-batch's reference sums
  float *coef_row;       // (2m) −dL/dlogp of each row's tokens
  ct_dpo_token_sums *tok;  // (gradient_accumulation_steps) one step's per-token sums
} dpo_t;

// The policy's completion sums for batch b (through acts); its head keeps the logits
// for backward.
static void policy_rows(dpo_t *d, ct_acts *acts, const ct_batch *b) {
  sum_rows(&d->pol, &d->head, ct_lm_forward(&d->tr->model, acts, &d->head, b), b);
}

// Loads the reference (sized like the batch) the first time it is needed.
static void load_reference(dpo_t *d) {
  if (d->ref_loaded) return;
  if (ct_train_reference(d->tr, &d->ref, (int)d->cfg->ref_dtype, d->batch.cap_B, d->batch.cap_T)) ct_die(1, NULL);
  d->ref_loaded = true;
}

// Reference sums for the batch: from the cache, or by running the reference.
static void reference_rows(dpo_t *d, const ct_batch *b, const ct_dpo_ref_cache *cache, int m, const ct_acts *through) {
  if (!d->need_ref) return;
  if (cache) {
    for (int i = 0; i < m; i++) d->ref_c[i] = cache->c[b->row_seq[i]], d->ref_r[i] = cache->r[b->row_seq[i]];
    return;
  }
  ct_frozen_through(&d->ref, through);  // (a LoRA policy's: idle until its pass after this)
  sum_rows(&d->refs, &d->head, ct_frozen_logps(&d->ref, b, &d->head), b);
  for (int i = 0; i < m; i++)  // (unpaired: the KL rows, or none)
    d->ref_c[i] = d->refs.row_lp[i], d->ref_r[i] = b->B == 2 * m ? d->refs.row_lp[m + i] : 0;
}

// Micro-batch of m pairs, or of m unpaired examples (with their KL rows for kto).
static void make_batch(dpo_t *d, const ct_pref_dataset *ds, const int *rows, int m) {
  int pad = ct_tokenizer_pad(d->tr->tok);
  if (d->unpaired) ct_pref_batch_unpaired(&d->batch, ds, rows, m, d->kl, pad);
  else ct_pref_batch(&d->batch, ds, rows, m, pad);
}

// kto's KL estimate for this micro-batch: the mean over its m KL rows of logπ − logπ_ref,
// averaged over the ranks that hold a micro-batch here (TRL's gather().mean()), at least 0.
// Every rank calls it once per micro-batch of the step, m = 0 where it holds none.
static double batch_kl(dpo_t *d, int m) {
  double s[2] = {0, 0};
  for (int i = 0; i < m; i++) s[0] += ((double)d->pol.row_lp[m + i] - d->ref_r[i]) / m;
  s[1] = m > 0;
  if (ct_dist_sum_f64(s, 2)) ct_die(1, NULL);
  return s[1] > 0 && s[0] > 0 ? s[0] / s[1] : 0;
}

// KTO's micro-batch (rows 0..m-1 the examples of ds, then kto's KL rows, which take no
// gradient); inv_n normalizes by the step's examples. As pair_step otherwise.
static void unpaired_step(dpo_t *d, const ct_pref_dataset *ds, int m, bool train, double inv_n, double kl,
                          dpo_stats *st, ct_dpo_token_sums *tok) {
  const ct_batch *b = &d->batch;
  ct_head *h = &d->head;
  signed char cls[2 * m + 1];  // token metrics: desirable rows chosen, undesirable rejected, KL rows out
  for (int i = 0; i < b->B; i++) {
    bool ex = i < m, des = ex && ds->label[b->row_seq[i]];
    double lp = d->pol.row_lp[i], ref = ex ? d->ref_c[i] : 0, dl = 0;
    cls[i] = ex ? des : -1;
    d->coef_row[i] = 0;
    if (!ex) continue;
    st->loss += ct_dpo_kto_loss(&d->loss, des, lp, ref, kl, &dl);
    st->pairs += 1;
    *(des ? &st->lp_c : &st->lp_r) += lp;
    *(des ? &st->rw_c : &st->rw_r) += d->loss.beta * (lp - ref);
    *(des ? &st->n_c : &st->n_r) += 1;
    st->tokens += ds->p_len[b->row_seq[i]] + ds->c_len[b->row_seq[i]];  // (TRL's num_tokens: not the KL rows)
    d->coef_row[i] = (float)(-dl * inv_n);
  }
  if (d->kl && d->tr->rank == 0) st->kl += kl, st->kl_n += 1;  // (the same on every rank)
  for (int r = 0; r < h->n; r++) h->coef[r] = d->coef_row[h->rows[r] / b->T], h->zcoef[r] = 0;
  ct_dpo_token_sums_add_rows(tok, h, b->T, cls);
  if (train) ct_lm_backward(&d->tr->model, &d->tr->g, &d->acts, h, b);
}

// Pair losses of a micro-batch; with `train`, the gradient goes back through the policy.
// `inv_pairs` and `inv_chosen` normalize by the whole step (all micro-batches, ranks).
// The micro-batch's per-token sums go to *tok.
static void pair_step(dpo_t *d, int m, bool train, double inv_pairs, double inv_chosen, dpo_stats *st,
                      ct_dpo_token_sums *tok) {
  const ct_batch *b = &d->batch;
  ct_head *h = &d->head;
  double sft_w = ct_dpo_sft_weight(&d->loss), beta = d->loss.beta;
  bool ref = d->need_ref;
  float *coef_row = d->coef_row;
  // the micro-batch-wide terms (aot): every pair's share first
  // (bt: each pair's L, d_c, d_r, then its log-probs lc, lr, rc, rr in double)
  double *bt = calloc((size_t)(m > 0 ? m : 1) * 7, sizeof *bt), *lcs = bt + 3 * m, *lrs = bt + 4 * m;
  double *rcs = bt + 5 * m, *rrs = bt + 6 * m;
  if (!bt) ct_die(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  for (int i = 0; i < m; i++) {
    lcs[i] = d->pol.row_lp[i], lrs[i] = d->pol.row_lp[m + i];
    rcs[i] = ref ? d->ref_c[i] : 0, rrs[i] = ref ? d->ref_r[i] : 0;
  }
  ct_dpo_batch_terms(&d->loss, m, lcs, lrs, rcs, rrs, bt, bt + m, bt + 2 * m);
  for (int i = 0; i < m; i++) {
    double lc = d->pol.row_lp[i], lr = d->pol.row_lp[m + i];
    double rc = rcs[i], rr = rrs[i], dc, dr;
    int nc = d->pol.row_len[i], nr = d->pol.row_len[m + i];
    double L = ct_dpo_pair_loss(&d->loss, lc, lr, rc, rr, nc, nr, &dc, &dr) + bt[i];
    dc += bt[m + i], dr += bt[2 * m + i];
    // the implicit rewards: β·(logπ − logπ_ref), or β·(mean log-prob) without a reference, or
    // (a cpo loss first) CPOTrainer's
    double wc = ref ? beta * (lc - rc) : beta * lc / nc, wr = ref ? beta * (lr - rr) : beta * lr / nr;
    if (!ref && ct_dpo_is_cpo(d->loss.type[0]))
      wc = ct_dpo_cpo_reward(&d->loss, d->loss.type[0], lc, nc), wr = ct_dpo_cpo_reward(&d->loss, d->loss.type[0], lr, nr);
    st->loss += L;
    st->lp_c += lc;
    st->lp_r += lr;
    st->rw_c += wc;
    st->rw_r += wr;
    st->acc += wc > wr;
    st->margin += wc - wr;
    st->pairs += 1;
    if (d->orpo) {
      double lo = ct_dpo_log_odds(lc, lr, nc, nr);
      st->log_odds += lo, st->log_odds_sig += ct_dpo_log_sigmoid(lo);
    }
    coef_row[i] = (float)(-dc * inv_pairs);       // coef = −dL/dlogp of each of the row's tokens
    coef_row[m + i] = (float)(-dr * inv_pairs);
  }
  free(bt);
  for (int r = 0; r < h->n; r++) {
    int row = h->rows[r] / b->T;
    bool chosen = row < m;
    if (chosen) st->loss += sft_w * -h->logp[r] * inv_chosen / inv_pairs;  // sft, per pair units
    h->coef[r] = coef_row[row] + (chosen ? (float)(sft_w * inv_chosen) : 0.0f);
    h->zcoef[r] = 0;
  }
  ct_dpo_token_sums_add(tok, h, b->T, m);
  st->tokens += b->n_tokens;
  if (!train) return;
  ct_lm_backward(&d->tr->model, &d->tr->g, &d->acts, h, b);
}

static long chosen_tokens(const ct_pref_dataset *ds, const int *pairs, int n) {
  long t = 0;
  for (int i = 0; i < n; i++) t += ds->c_len[pairs[i]];
  return t;
}

// The metrics of st with TRL's names; nll_loss only with an sft term (RPO), as TRL.
static json_t *stats_json(const dpo_stats *st, const char *prefix, bool sft, bool orpo) {
  double n = st->pairs > 0 ? st->pairs : 1, nm = st->tok.micro > 0 ? st->tok.micro : 1;
  json_t *j = json_object();
  const struct {
    const char *key;
    double value, count;
  } m[] = {{"loss", st->loss, n}, {"rewards/chosen", st->rw_c, n}, {"rewards/rejected", st->rw_r, n},
           {"rewards/accuracies", st->acc, n}, {"rewards/margins", st->margin, n},
           {"logps/chosen", st->lp_c, n}, {"logps/rejected", st->lp_r, n},
           {"logits/chosen", st->tok.logits_c, nm}, {"logits/rejected", st->tok.logits_r, nm},
           {"entropy", st->tok.entropy, nm}, {"mean_token_accuracy", st->tok.accuracy, nm},
           {sft ? "nll_loss" : NULL, st->tok.nll, nm},
           {orpo ? "log_odds_ratio" : NULL, st->log_odds_sig, n}, {orpo ? "log_odds_chosen" : NULL, st->log_odds, n}};
  char k[64];
  for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
    if (!m[i].key) continue;
    snprintf(k, sizeof k, "%s%s", prefix, m[i].key);
    json_object_set_new(j, k, json_real(m[i].value / m[i].count));
  }
  return j;
}

// KTO's metrics with TRL's names (KTOTrainer): each mean over its own examples or micro-batches.
static json_t *unpaired_json(const dpo_stats *st, const char *prefix, bool kl) {
  const ct_dpo_token_means *t = &st->tok;
  const struct {
    const char *key;
    double value, count;
  } m[] = {{"loss", st->loss, st->pairs}, {kl ? "kl" : NULL, st->kl, st->kl_n},
           {"rewards/chosen", st->rw_c, st->n_c}, {"rewards/rejected", st->rw_r, st->n_r},
           {"logps/chosen", st->lp_c, st->n_c}, {"logps/rejected", st->lp_r, st->n_r},
           {"logits/chosen", t->logits_c, t->micro_c}, {"logits/rejected", t->logits_r, t->micro_r},
           {"entropy", t->entropy, t->micro}};
  json_t *j = json_object();
  char k[64];
  for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
    if (!m[i].key || m[i].count <= 0) continue;  // (TRL logs a mean only when it has values)
    snprintf(k, sizeof k, "%s%s", prefix, m[i].key);
    json_object_set_new(j, k, json_real(m[i].value / m[i].count));
  }
  if (st->n_c > 0 && st->n_r > 0) {
    snprintf(k, sizeof k, "%srewards/margins", prefix);
    json_object_set_new(j, k, json_real(st->rw_c / st->n_c - st->rw_r / st->n_r));
  }
  return j;
}

static json_t *metrics_json(const dpo_t *d, const dpo_stats *st, const char *prefix) {
  if (d->unpaired) return unpaired_json(st, prefix, d->kl);
  return stats_json(st, prefix, ct_dpo_sft_weight(&d->loss) != 0, d->orpo);
}

// Sums n micro-batches' per-token sums over the ranks and adds their means to st.
static void add_token_means(const dpo_t *d, dpo_stats *st, ct_dpo_token_sums *tok, int n) {
  if (ct_dist_sum_f64((double *)tok, n * (int)(sizeof *tok / sizeof(double)))) ct_die(1, NULL);
  if (d->unpaired) ct_dpo_token_means_add_unpaired(&st->tok, tok, n);
  else ct_dpo_token_means_add(&st->tok, tok, n);
}

// One micro-batch's losses after the forwards: pairs, or unpaired examples (kto: its KL
// estimate first, a collective over the ranks).
static void micro_step(dpo_t *d, const ct_pref_dataset *ds, int m, bool train, double inv_n, double inv_chosen,
                       dpo_stats *st, ct_dpo_token_sums *tok) {
  if (!d->unpaired) {
    pair_step(d, m, train, inv_n, inv_chosen, st, tok);
    return;
  }
  unpaired_step(d, ds, m, train, inv_n, d->kl ? batch_kl(d, m) : 0, st, tok);
}

// kto: a rank with fewer micro-batches (`mine`) than the most any rank holds (rank 0's, which
// every rank can count) still joins their KL collectives.
static void join_kl(dpo_t *d, int mine, int most) {
  for (int k = mine; d->kl && k < most; k++) batch_kl(d, 0);
}

static void evaluate(dpo_t *d, const ct_pref_dataset *ev, const ct_dpo_ref_cache *cache) {
  ct_train *tr = d->tr;
  int B = (int)d->cfg->per_device_eval_batch_size;
  long nc = 0;  // the whole set is one "step": the sft term averages over all its tokens
  for (int k = 0; k < ev->n; k++) nc += ev->c_len[k];
  dpo_stats st = {0};
  int batches = (ev->n + B * tr->world - 1) / (B * tr->world);  // batch i: pairs of every rank
  ct_dpo_token_sums *tok = calloc(batches > 0 ? batches : 1, sizeof *tok);
  if (!tok) ct_die(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  int mine = 0;
  for (int i = 0, first = tr->rank * B; first < ev->n; i++, first += B * tr->world, mine++) {
    int m = 0;
    for (int k = first; k < ev->n && m < B; k++) d->pairs[m++] = k;
    make_batch(d, ev, d->pairs, m);
    reference_rows(d, &d->batch, cache, m, &d->eval_acts);
    policy_rows(d, &d->eval_acts, &d->batch);
    micro_step(d, ev, m, false, 1.0 / ev->n, nc ? 1.0 / nc : 0, &st, &tok[i]);
  }
  join_kl(d, mine, batches);
  ct_dist_sum_stats(&st);
  add_token_means(d, &st, tok, batches);
  free(tok);
  json_t *j = metrics_json(d, &st, "eval_");
  json_object_set_new(j, "step", json_integer(tr->step));
  if (d->unpaired)
    ct_log_info(&tr->log, "eval at step %ld: loss %.4f, reward margin %.4f", tr->step, st.loss / (st.pairs ? st.pairs : 1),
                (st.n_c ? st.rw_c / st.n_c : 0) - (st.n_r ? st.rw_r / st.n_r : 0));
  else
    ct_log_info(&tr->log, "eval at step %ld: loss %.4f, reward accuracy %.3f, margin %.4f", tr->step,
                st.loss / (st.pairs ? st.pairs : 1), st.acc / (st.pairs ? st.pairs : 1),
                st.margin / (st.pairs ? st.pairs : 1));
  if (ct_log_metrics(&tr->log, j)) ct_die(1, NULL);
}

// The reference's sums for a whole dataset, computed once and cached in output_dir.
static void precompute(dpo_t *d, const ct_pref_dataset *ds, const char *name, ct_dpo_ref_cache *cache) {
  ct_train *tr = d->tr;
  char path[CT_PATH_MAX];
  if (ct_path_join(path, sizeof path, d->cfg->output_dir, name)) ct_die(1, NULL);
  cache->c = malloc(sizeof(float) * ds->n);
  cache->r = malloc(sizeof(float) * ds->n);
  if (!cache->c || !cache->r) ct_die(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  load_reference(d);  // its identity keys the cache
  ct_dpo_cache_key key;
  if (ct_dpo_cache_key_of(tr, ds, &key)) ct_die(1, NULL);
  char why[1600];
  if (ct_dpo_cache_load(path, ds, &key, ct_train_frozen_find(tr, "reference"), cache, why, sizeof why)) {
    ct_log_info(&tr->log, "reference log-probs: reusing %s", path);
    free(key.reference);
    return;
  }
  if (why[0]) ct_log_info(&tr->log, "reference log-probs: %s does not fit this run (%s): recomputing", path, why);
  ct_log_info(&tr->log, "reference log-probs: one pass over %d pairs of %s", ds->n, ds->path);
  memset(cache->c, 0, sizeof(float) * ds->n);
  memset(cache->r, 0, sizeof(float) * ds->n);
  int B = (int)d->cfg->per_device_train_batch_size;
  long batches = (ds->n + (long)B * tr->world - 1) / ((long)B * tr->world), done = 0;
  double tokens = 0;
  ct_log_phase(&tr->log, tr->step + 1, "reference log-probs", 0, batches, "batches", 0, NULL);
  for (int first = tr->rank * B; first < ds->n; first += B * tr->world) {
    int m = 0;
    for (int k = first; k < ds->n && m < B; k++) d->pairs[m++] = k;
    make_batch(d, ds, d->pairs, m);
    reference_rows(d, &d->batch, NULL, m, &d->acts);
    tokens += d->batch.n_tokens;
    ct_log_phase(&tr->log, tr->step + 1, "reference log-probs", ++done, batches, "batches", tokens, NULL);
    for (int i = 0; i < m; i++) cache->c[d->pairs[i]] = d->ref_c[i], cache->r[d->pairs[i]] = d->ref_r[i];
  }
  // every rank filled its share: sum the shares (the others are 0)
  if (ct_dist_sum_f32(cache->c, ds->n) || ct_dist_sum_f32(cache->r, ds->n)) ct_die(1, NULL);
  if (tr->rank == 0 && ct_dpo_cache_save(path, ds, &key, cache)) ct_die(1, NULL);
  free(key.reference);
}

static int save_ref(void *ctx, const char *dir) {
  dpo_t *d = ctx;
  return ct_train_save_reference(&d->ref, dir);
}

static void dpo_free(dpo_t *d) {
  if (d->ref_loaded) ct_frozen_free(&d->ref);
  ct_acts_free(&d->acts);
  ct_acts_free(&d->eval_acts);
  row_sums_free(&d->pol);
  row_sums_free(&d->refs);
  ct_head_free(&d->head);
  ct_batch_free(&d->batch);
  ct_free_all(d->pairs, d->ref_c, d->ref_r, d->coef_row, d->tok);
}

// The train pairs and the eval pairs (when eval_dataset_path is set), said.
static void load_data(dpo_t *d, ct_pref_dataset *train, ct_pref_dataset *eval) {
  const ct_config *cfg = d->cfg;
  ct_train *tr = d->tr;
  ct_pref_opts po = {(int)cfg->max_length, (int)cfg->max_prompt_length, (int)cfg->max_completion_length,
                     cfg->skip_bad_rows, tr->model.cfg.vocab_size, false, d->unpaired};
  if (ct_pref_load(train, cfg->dataset_path, tr->tok, &po)) ct_die(1, NULL);
  if (d->unpaired) {
    int des = 0;
    for (int k = 0; k < train->n; k++) des += train->label[k];
    ct_log_info(&tr->log, "train: %s: %d unpaired examples (%d desirable, %d undesirable), %ld tokens", train->path,
                train->n, des, train->n - des, train->n_tokens);
  } else {
    ct_log_info(&tr->log, "train: %s: %d pairs, %ld tokens%s", train->path, train->n, train->n_tokens,
                d->need_ref ? "" : " (reference-free loss: no reference model)");
  }
  if (train->n_truncated) ct_log_info(&tr->log, "train: %d %s truncated", train->n_truncated, d->unpaired ? "rows" : "pairs");
  if (train->n_bad)
    ct_log_info(&tr->log, "train: %d malformed rows skipped; first: %s", train->n_bad, train->first_bad);
  if (cfg->eval_dataset_path[0] && ct_pref_load(eval, cfg->eval_dataset_path, tr->tok, &po)) ct_die(1, NULL);
}

// DPO's rows of the memory plan: activations of 2B x T training and 2Be x T eval rows, the
// LM head, the reference. Returns the head's rows at a time.
static int plan_rows(const dpo_t *d, ct_plan *plan, int B, int Be, int T) {
  const ct_model_config *mc = &d->tr->model.cfg;
  int V = mc->vocab_size, C = mc->hidden_size, tiles = (int)d->cfg->num_vocab_tiling, Bmax = B > Be ? B : Be;
  ct_train_plan_acts(d->tr, plan, 2 * B, 2 * Be, T);
  // DPO's coefficients need every row's log-prob first: past hrows target tokens, the
  // backward computes the logits a second time instead of keeping them all
  int hrows = ct_head_chunk_rows(2 * B * T, V, CT_HEAD_MIN_ROWS);
  ct_plan_addf(plan, ct_head_bytes(2 * Bmax * T, hrows, V, C, tiles),
               "LM head: logits of %d of %d x %d tokens (more: computed twice) / %d chunks", hrows, 2 * B, T, tiles);
  if (d->need_ref) ct_train_plan_reference(d->tr, plan, 2 * Bmax, T);
  return hrows;
}

// The buffers the plan counted: pairs for a whole step (`global`), rows for 2·max(B, Be).
static void dpo_init(dpo_t *d, int B, int Be, int T, int hrows, int global) {
  ct_train *tr = d->tr;
  const ct_model_config *mc = &tr->model.cfg;
  int Bmax = B > Be ? B : Be, accum = (int)d->cfg->gradient_accumulation_steps;
  d->pairs = malloc(sizeof(int) * (global > Bmax ? global : Bmax));
  d->ref_c = malloc(sizeof(float) * Bmax);
  d->ref_r = malloc(sizeof(float) * Bmax);
  d->coef_row = malloc(sizeof(float) * 2 * Bmax);
  d->tok = malloc(sizeof *d->tok * accum);
  if (!d->pairs || !d->ref_c || !d->ref_r || !d->coef_row || !d->tok || ct_batch_init(&d->batch, 2 * Bmax, T) ||
      ct_head_init(&d->head, 2 * Bmax * T, hrows, mc->vocab_size, mc->hidden_size, (int)d->cfg->num_vocab_tiling) ||
      row_sums_init(&d->pol, 2 * Bmax) || row_sums_init(&d->refs, 2 * Bmax) ||
      ct_train_acts(tr, &d->acts, 2 * B, T) ||
      (Be && (ct_acts_init(&d->eval_acts, &tr->model, 2 * Be, T, CT_ACTS_FORWARD) ||
              ct_train_attach(tr, &d->eval_acts))))
    ct_die(1, NULL);
}

// The reference's log-probs: precomputed once for both sets (the reference then freed), or
// the reference loaded for every step (synced into checkpoints with sync_ref_model).
static void reference_setup(dpo_t *d, const ct_pref_dataset *train, const ct_pref_dataset *eval,
                            ct_dpo_ref_cache *cache_train, ct_dpo_ref_cache *cache_eval) {
  const ct_config *cfg = d->cfg;
  ct_train *tr = d->tr;
  if (d->need_ref && cfg->precompute_ref_log_probs) {
    precompute(d, train, "ref_logps_train.safetensors", cache_train);
    if (cfg->eval_dataset_path[0]) precompute(d, eval, "ref_logps_eval.safetensors", cache_eval);
    if (d->ref_loaded) {  // the reference is not needed any more
      ct_frozen_free(&d->ref);
      d->ref_loaded = false;
    }
  } else if (d->need_ref) {
    load_reference(d);
    if (cfg->sync_ref_model) {
      tr->save_extra = save_ref;
      tr->save_extra_ctx = d;
      tr->save_extra_bytes = ct_model_param_bytes(&tr->model, false);  // (a float32 copy of the policy's shape)
    }
  }
}

// One optimizer step's gradients from its n pairs (d->pairs), this rank's micro-batches of
// B; their statistics summed into st and each micro-batch's per-token sums into d->tok.
static void train_step(dpo_t *d, const ct_pref_dataset *ds, const ct_dpo_ref_cache *cache, int n, int B,
                       dpo_stats *st) {
  ct_train *tr = d->tr;
  int accum = (int)d->cfg->gradient_accumulation_steps;
  long nc = chosen_tokens(ds, d->pairs, n);
  double inv_pairs = 1.0 / n, inv_chosen = nc ? 1.0 / nc : 0;
  memset(d->tok, 0, sizeof *d->tok * accum);
  const int *step_pairs = d->pairs;  // (eval, which reuses d->pairs, runs after the step)
  ct_loop_phase(tr, 0, accum, 0);  // (the heartbeat's line)
  int k = 0;
  for (int first, m; k < accum && (m = ct_loop_micro(tr, k, B, n, &first)); k++) {
    make_batch(d, ds, step_pairs + first, m);
    reference_rows(d, &d->batch, cache, m, &d->acts);  // before the policy: the head keeps its logits
    ct_train_dropout_key(tr, k);
    policy_rows(d, &d->acts, &d->batch);
    micro_step(d, ds, m, true, inv_pairs, inv_chosen, st, &d->tok[k]);
    ct_loop_phase(tr, k + 1, accum, st->tokens);
  }
  int per_k = B * tr->world, most = (n + per_k - 1) / per_k;  // (rank 0's micro-batches)
  join_kl(d, k, most < accum ? most : accum);
}

int main(int argc, char **argv) {
  ct_config cfg;
  ct_train tr;
  ct_train_start(&tr, &cfg, CT_TRAINER_DPO, argc, argv, check_config);
  dpo_t d = {.cfg = &cfg, .tr = &tr};
  losses_from(&cfg, &d.loss);  // (checked by check_config)
  d.need_ref = ct_dpo_needs_reference(&d.loss);
  for (int k = 0; k < d.loss.n; k++) d.orpo |= d.loss.type[k] == CT_DPO_ORPO;
  d.unpaired = ct_dpo_unpaired(&d.loss), d.kl = ct_dpo_kto_kl(&d.loss);
  ct_pref_dataset train, eval = {0};
  load_data(&d, &train, &eval);

  int B = (int)cfg.per_device_train_batch_size, accum = (int)cfg.gradient_accumulation_steps;
  int Be = cfg.eval_dataset_path[0] ? (int)cfg.per_device_eval_batch_size : 0, global = B * accum * tr.world;
  int T = ct_pref_max_len(&train);
  if (Be && ct_pref_max_len(&eval) > T) T = ct_pref_max_len(&eval);
  if (ct_train_schedule(&tr, train.n, global, ct_pref_fingerprint(&train))) ct_die(1, NULL);
  ct_plan plan = {0};
  int hrows = plan_rows(&d, &plan, B, Be, T);
  if (ct_loop_memory(&tr, &plan, "gradient_checkpointing=true, ref_dtype=bfloat16 or int8, "
                     "precompute_ref_log_probs=true, num_vocab_tiling (more chunks), a smaller "
                     "per_device_train_batch_size or max_length")) {
    ct_pref_free(&train);
    ct_pref_free(&eval);
    ct_train_release(&tr);
    return 0;
  }
  dpo_init(&d, B, Be, T, hrows, global);
  ct_dpo_ref_cache cache_train = {0}, cache_eval = {0};
  ct_train_watch_signals(&tr);  // (the reference pass can be long too)
  reference_setup(&d, &train, &eval, &cache_train, &cache_eval);
  const ct_dpo_ref_cache *ct_ = cfg.precompute_ref_log_probs ? &cache_train : NULL;
  const ct_dpo_ref_cache *ce_ = cfg.precompute_ref_log_probs ? &cache_eval : NULL;
  ct_train_log_schedule(&tr, train.n, global, B, accum, d.unpaired ? "example" : "pair");
  if (ct_loop_eval_on_start(&tr)) evaluate(&d, &eval, ce_);
  dpo_stats win;  // the logging window's sums
  ct_window lw;
  ct_window_init(&lw, &win, sizeof win);
  bool stop = false;
  while (tr.step < tr.total_steps && !stop) {
    int n = ct_train_next_seqs(&tr, d.pairs, global);
    dpo_stats st = {0};
    train_step(&d, &train, ct_, n, B, &st);
    double norm, lr;
    ct_loop_update(&tr, &st, sizeof st, &norm, &lr);
    add_token_means(&d, &st, d.tok, accum);
    if (cfg.sync_ref_model && d.ref_loaded && tr.step % cfg.ref_model_sync_steps == 0 &&
        ct_train_sync_reference(&tr, &d.ref, cfg.ref_model_mixup_alpha))
      ct_die(1, NULL);
    tr.num_tokens += st.tokens;
    ct_window_add(&lw, &st, 0, norm);
    double tok_s = ct_window_rate(&lw, win.tokens);
    ct_log_progress(&tr.log, tr.step, st.loss / (st.pairs ? st.pairs : 1), tok_s);
    if (ct_train_log_due(&tr)) {
      json_t *j = metrics_json(&d, &win, "");
      json_object_set_new(j, "step", json_integer(tr.step));
      ct_train_log_fields(&tr, j, lr, ct_window_norm(&lw), tok_s);
      if (ct_log_metrics(&tr.log, j)) ct_die(1, NULL);
      ct_window_reset(&lw);
    }
    if (ct_loop_eval_after_step(&tr)) evaluate(&d, &eval, ce_);
    if (ct_train_after_step(&tr, &stop)) ct_die(1, NULL);
  }
  if (ct_loop_eval_at_end(&tr, stop)) evaluate(&d, &eval, ce_);
  dpo_free(&d);
  ct_free_all(cache_train.c, cache_train.r, cache_eval.c, cache_eval.r);
  ct_pref_free(&train);
  ct_pref_free(&eval);
  return ct_train_finish(&tr, stop);
}
