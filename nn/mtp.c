// mtp: multi-token prediction's depths over a batch the main model has just run — their
// forward, loss statistics, acceptance against the main model's argmax, backward — and
// mtp.safetensors. The decoder layer itself is forward.c's (ct_layer_forward); this file
// owns only the two norms and the projection in front of it and the chain of depths.
// Not here: speculative decoding (the sampler's).
#include "mtp.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "fs.h"
#include "hf.h"
#include "kernels.h"
#include "matmul.h"
#include "mem.h"

// Depth slots kept: every depth's for backward, or one reused.
static int slots(const ct_mtp *t) { return t->train ? t->D : 1; }

static long floats_of(const ct_model_config *c, int B, int T, int S) {
  long N = (long)B * T, C = c->hidden_size;
  return 2 * S * N * C + 2 * S * N + 4 * N * C + C;  // en, hn, rstds; w1..w3, dh0; wn
}

double ct_mtp_bytes(const ct_model *m, int B, int T, bool train) {
  const ct_model_config *c = &m->cfg;
  int S = train ? c->mtp_layers : 1;
  ct_model_config one = *c;
  one.num_layers = 1;
  double acts = ct_acts_bytes(&one, B, T, train ? CT_ACTS_KEEP : CT_ACTS_FORWARD);
  if (m->compute16) acts += ct_acts_bf16_bytes(&one, B, T);
  long N = (long)B * T;
  return S * acts + sizeof(float) * (double)floats_of(c, B, T, S) + sizeof(int) * (double)(S + 2) * N;
}

int ct_mtp_init(ct_mtp *t, const ct_model *m, int B, int T, bool train) {
  const ct_model_config *c = &m->cfg;
  memset(t, 0, sizeof *t);
  if (c->mtp_layers <= 0 || c->mtp_layers > CT_MTP_MAX)
    return ct_set_error(CT_EINVAL, "mtp: %d depths (1 to %d)", c->mtp_layers, CT_MTP_MAX);
  if (!m->w.lm_head) return ct_set_error(CT_EINVAL, "mtp: the model's LM head is not stored in float32");
  t->D = c->mtp_layers;
  t->B = B;
  t->T = T;
  t->train = train;
  int S = slots(t);
  long N = (long)B * T, C = c->hidden_size;
  t->acts = calloc(S, sizeof *t->acts);
  float *f = ct_big_alloc(sizeof(float) * floats_of(c, B, T, S));
  int *ip = malloc(sizeof(int) * (S + 2) * N);
  if (!t->acts || !f || !ip) {
    free(t->acts);
    ct_big_free(f);
    free(ip);
    memset(t, 0, sizeof *t);
    return ct_set_error(CT_ENOMEM, "mtp: cannot allocate the work space of %d depths", c->mtp_layers);
  }
  t->en = f;
  t->hn = t->en + S * N * C;
  t->rstd_e = t->hn + S * N * C;
  t->rstd_h = t->rstd_e + S * N;
  t->w1 = t->rstd_h + S * N;
  t->w2 = t->w1 + N * C;
  t->w3 = t->w2 + N * C;
  t->dh0 = t->w3 + N * C;
  t->wn = t->dh0 + N * C;
  t->ids = ip;
  t->target = ip + S * N;
  t->main_argmax = t->target + N;
  for (int s = 0; s < S; s++) {
    int rc = ct_acts_init_layer(&t->acts[s], m, B, T, train ? CT_ACTS_KEEP : CT_ACTS_FORWARD);
    if (rc) {
      ct_mtp_free(t);
      return rc;
    }
  }
  return 0;
}

void ct_mtp_free(ct_mtp *t) {
  if (t->acts)
    for (int s = 0; s < slots(t); s++) ct_acts_free(&t->acts[s]);
  free(t->acts);
  ct_big_free(t->en);
  free(t->ids);
  memset(t, 0, sizeof *t);
}

void ct_mtp_targets(const int *target, const int *seg, int B, int T, int k, int *out) {
  for (int r = 0; r < B; r++)
    for (int i = 0; i < T; i++) {
      long n = (long)r * T + i;
      out[n] = i + k < T && seg[n + k] == seg[n] ? target[n + k] : -1;
    }
}

void ct_mtp_count(const int *target, const int *seg, int B, int T, int D, double *n) {
  for (int k = 1; k <= D; k++)
    for (int r = 0; r < B; r++)
      for (int i = 0; i + k < T; i++) {
        long p = (long)r * T + i;
        n[k - 1] += seg[p + k] == seg[p] && target[p + k] >= 0;
      }
}

void ct_mtp_set_scale(ct_mtp *t, float lambda, const double *n) {
  for (int k = 0; k < t->D; k++) t->coef[k] = n[k] > 0 ? (float)(lambda / ((double)t->D * n[k])) : 0.0f;
}

double ct_mtp_mean_loss(const ct_mtp_stats *s, int D) {
  double sum = 0;
  int n = 0;
  for (int k = 0; k < D; k++)
    if (s->targets[k] > 0) sum += s->loss[k] / s->targets[k], n++;
  return n ? sum / n : 0;
}

double ct_mtp_acceptance(const ct_mtp_stats *s, int D, int k) {
  double acc = 0, n = 0;
  for (int j = k > 0 ? k - 1 : 0; j < (k > 0 ? k : D); j++) acc += s->accepted[j], n += s->targets[j];
  return n > 0 ? acc / n : 0;
}

// ---------------------------------------------------------------------------
// The depths

#define NW(w) ct_norm_weight(c, (w), c->hidden_size, t->wn)

// The input of depth k's block (k >= 1, slot s) into t->acts[s].x, from hprev (N, C).
static void depth_input(ct_mtp *t, const ct_model *m, const ct_acts *a, int k, int s, const float *hprev, int B,
                        int T) {
  const ct_model_config *c = &m->cfg;
  const ct_mtp_weights *w = &m->w.mtp[k - 1];
  int C = c->hidden_size;
  long N = (long)B * T;
  int *ids = t->ids + s * N;
  float *en = t->en + s * N * C, *hn = t->hn + s * N * C;
  ct_mtp_targets(a->ids, a->seg, B, T, k, ids);  // token i + k of the same document
  for (long n = 0; n < N; n++) ids[n] = ids[n] < 0 ? 0 : ids[n];  // past it (no target there): any id
  ct_model_embed(m, ids, (int)N, t->w1);
  if (c->gemma) {  // the input embedding's own scale, as the main model's
    float es = ct_embed_scale(c);
    for (long i = 0; i < N * C; i++) t->w1[i] *= es;
  }
  ct_rmsnorm_forward(en, t->rstd_e + s * N, t->w1, NW(w->enorm), (int)N, C, c->rms_norm_eps);
  ct_rmsnorm_forward(hn, t->rstd_h + s * N, hprev, NW(w->hnorm), (int)N, C, c->rms_norm_eps);
  ct_acts *d = &t->acts[s];
  // x (N, C) = en · W[:, :C]ᵀ + hn · W[:, C:]ᵀ, W = eh_proj (C, 2C)
  ct_sgemm('N', 'T', (int)N, C, C, 1, en, C, w->eh_proj, 2 * C, 0, d->x, C);
  ct_sgemm('N', 'T', (int)N, C, C, 1, hn, C, w->eh_proj + C, 2 * C, 1, d->x, C);
  memcpy(d->pos, a->pos, sizeof(int) * N);
  memcpy(d->seg, a->seg, sizeof(int) * N);
}

// Depth k's gradient back from its block input's (in acts[s].dres) to the MTP weights,
// the embedding, and hprev's gradient, written into dprev (N, C).
static void depth_input_backward(ct_mtp *t, const ct_model *m, const ct_weights *g, int k, int s,
                                 const float *hprev, float *dprev, int B, int T) {
  const ct_model_config *c = &m->cfg;
  const ct_mtp_weights *w = &m->w.mtp[k - 1];
  const ct_mtp_weights *gw = &g->mtp[k - 1];
  int C = c->hidden_size;
  long N = (long)B * T;
  ct_acts *d = &t->acts[s];
  const float *dx = d->dres, *en = t->en + s * N * C, *hn = t->hn + s * N * C;
  const int *ids = t->ids + s * N;
  float *den = t->w1, *dhn = t->w2, *emb = t->w3;
  ct_sgemm('N', 'N', (int)N, C, C, 1, dx, C, w->eh_proj, 2 * C, 0, den, C);
  ct_sgemm('N', 'N', (int)N, C, C, 1, dx, C, w->eh_proj + C, 2 * C, 0, dhn, C);
  ct_sgemm('T', 'N', C, C, (int)N, 1, dx, C, en, C, 1, gw->eh_proj, 2 * C);
  ct_sgemm('T', 'N', C, C, (int)N, 1, dx, C, hn, C, 1, gw->eh_proj + C, 2 * C);
  ct_rmsnorm_backward(dprev, gw->hnorm, dhn, hprev, NW(w->hnorm), t->rstd_h + s * N, (int)N, C, 0, d->scratch);
  ct_model_embed(m, ids, (int)N, emb);  // the norm's input again (cheaper than keeping it)
  float es = ct_embed_scale(c);
  if (c->gemma)
    for (long i = 0; i < N * C; i++) emb[i] *= es;
  ct_rmsnorm_backward(dhn, gw->enorm, den, emb, NW(w->enorm), t->rstd_e + s * N, (int)N, C, 0, d->scratch);
  if (c->gemma)
    for (long i = 0; i < N * C; i++) dhn[i] *= es;
  ct_embed_backward(g->embed, dhn, ids, (int)N, C);
}

// Depth k's logits over its targets: statistics, and with g the head's backward and the
// final norm's into acts[s].dres.
static int depth_head(ct_mtp *t, const ct_model *m, ct_head *h, const int *target, int k, int s, int B, int T,
                      const ct_weights *g, ct_mtp_stats *st) {
  const ct_model_config *c = &m->cfg;
  int C = c->hidden_size;
  long N = (long)B * T;
  ct_acts *d = &t->acts[s];
  const float *out = ct_acts_layer_out(d, C), *W = m->w.lm_head;
  ct_rmsnorm_forward(d->lnf, d->rstdf, out, NW(ct_model_norm(m)), (int)N, C, c->rms_norm_eps);
  ct_mtp_targets(target, d->seg, B, T, k, t->target);
  int n = ct_head_gather(h, d->lnf, t->target, (int)N);
  if (n < 0) return n;
  ct_head_ce ce = {t->coef[k - 1], 0};  // every target weighted by the depth's coefficient
  if (g) ct_head_fused(h, W, ct_model_w16(m, W), g->lm_head, t->w1, (int)N, ct_head_ce_rows, &ce);
  else ct_head_forward_bf16(h, W, ct_model_w16(m, W));  // (with g: d lnf (N, C) in t->w1)
  for (int r = 0; r < n; r++) {
    st->loss[k - 1] -= h->logp[r];
    st->targets[k - 1] += 1;
    st->accepted[k - 1] += h->argmax[r] == t->main_argmax[h->rows[r] + k];
  }
  if (!g) return 0;
  ct_rmsnorm_backward(d->dres, g->norm, t->w1, out, NW(ct_model_norm(m)), d->rstdf, (int)N, C, 0, d->scratch);
  return 0;
}

int ct_mtp_step(ct_mtp *t, const ct_model *m, ct_acts *a, ct_head *h, const int *target, int B, int T,
                const ct_weights *g, ct_mtp_stats *st) {
  const ct_model_config *c = &m->cfg;
  int C = c->hidden_size, kind = c->num_layers - 1;  // the blocks attend as the last layer does
  long N = (long)B * T;
  a->dx_top = NULL;
  if (B > t->B || T > t->T)
    return ct_set_error(CT_EINVAL, "mtp: batch of %d x %d tokens exceeds the work space's %d x %d", B, T, t->B, t->T);
  if (g && !t->train) return ct_set_error(CT_EINVAL, "mtp: a backward through forward-only work space");
  for (long n = 0; n < N; n++) t->main_argmax[n] = -1;
  for (int r = 0; r < h->n; r++) t->main_argmax[h->rows[r]] = h->argmax[r];
  const float *hprev = ct_acts_top(a, c);
  for (int k = 1; k <= t->D; k++) {
    int s = t->train ? k - 1 : 0;
    depth_input(t, m, a, k, s, hprev, B, T);
    // QK-Clip's maxima (qkclip.h): depth k's block is row L + k - 1, after the decoder's
    t->acts[s].qk_max = a->qk_max ? a->qk_max + (long)(c->num_layers + k - 1) * c->num_heads : NULL;
    ct_layer_forward(m, kind, &m->w.mtp[k - 1].block, &t->acts[s], B, T);
    int rc = depth_head(t, m, h, target, k, s, B, T, g, st);
    if (rc) return rc;
    hprev = ct_acts_layer_out(&t->acts[s], C);
  }
  if (!g) return 0;
  // backward, depth D down to 1: dh0 carries d h_k from depth k + 1 into depth k's output
  for (int k = t->D; k >= 1; k--) {
    ct_acts *d = &t->acts[k - 1];
    if (k < t->D) ct_add_rows(d->dres, t->dh0, N, C);
    ct_layer_backward(m, kind, &m->w.mtp[k - 1].block, &g->mtp[k - 1].block, d, B, T);
    const float *prev = k > 1 ? ct_acts_layer_out(&t->acts[k - 2], C) : ct_acts_top(a, c);
    depth_input_backward(t, m, g, k, k - 1, prev, t->dh0, B, T);
  }
  a->dx_top = t->dh0;
  return 0;
}

// ---------------------------------------------------------------------------
// mtp.safetensors

int ct_mtp_load(const ct_model *m, float *buf, const char *dir, bool *found) {
  char p[CT_PATH_MAX];
  *found = false;
  int rc = ct_path_join(p, sizeof p, dir, "mtp.safetensors");
  if (rc || access(p, R_OK) != 0) return rc;
  *found = true;
  ct_layout L = ct_model_mtp_tensors(m);
  ct_safetensors st = {0};
  if ((rc = ct_st_open(&st, p))) return rc;
  for (int i = 0; i < st.n && !rc; i++) {
    bool known = false;
    for (int j = 0; j < L.n_tensors && !known; j++) known = !strcmp(st.tensors[i].name, L.tensors[j].name);
    if (!known)
      rc = ct_set_error(CT_EFORMAT, "%s: tensor '%s' is not one of %d multi-token prediction depths "
                        "(mtp_num_layers)", p, st.tensors[i].name, m->cfg.mtp_layers);
  }
  for (int j = 0; j < L.n_tensors && !rc; j++) {
    const ct_tensor_info *ti = &L.tensors[j];
    const ct_st_tensor *tt = ct_st_find(&st, ti->name);
    if (!tt) {
      rc = ct_set_error(CT_EFORMAT, "%s: tensor '%s' is missing (the file holds fewer depths than "
                        "mtp_num_layers %d?)", p, ti->name, m->cfg.mtp_layers);
    } else if (tt->ndim != ti->ndim || tt->shape[0] != ti->shape[0] || (ti->ndim == 2 && tt->shape[1] != ti->shape[1])) {
      rc = ct_set_error(CT_EFORMAT, "%s: tensor '%s' does not have the shape config.json implies", p, ti->name);
    } else {
      rc = ct_st_read_f32(&st, tt, buf + ti->offset, ti->numel);
    }
  }
  ct_st_close(&st);
  return rc;
}

int ct_mtp_save(const ct_model *m, const float *buf, const char *dir, ct_dtype dtype) {
  char p[CT_PATH_MAX];
  int rc = ct_path_join(p, sizeof p, dir, "mtp.safetensors");
  const float *bufs[] = {buf};
  return rc ? rc : ct_save_tensors(&ct_model_mtp_tensors(m), 1, bufs, NULL, p, dtype);
}
