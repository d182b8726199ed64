// speculative: greedy decoding drafted by the model's own multi-token prediction depths
// and verified in one engine pass per round (speculative.h). Not here: sampled decoding
// (it needs rejection sampling against the draft's distribution) and several samples or
// requests at once (one slot, requests in turn).
#include "speculative.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kernels.h"
#include "matmul.h"
#include "mtp.h"
#include "panel.h"
#include "safetensors.h"
#include "fs.h"

// Depths in dir/mtp.safetensors: 1 + the largest k of mtp.layers.<k>.eh_proj.weight.
static int count_depths(const char *dir, int *D) {
  char p[CT_PATH_MAX];
  int rc = ct_path_join(p, sizeof p, dir, "mtp.safetensors");
  ct_safetensors st = {0};
  if (!rc && (rc = ct_st_open(&st, p)))
    return ct_wrap_error(rc, "speculative=mtp needs the depths a run with mtp_num_layers > 0 saves beside the model");
  *D = 0;
  for (int i = 0; i < st.n; i++) {
    int k;
    char tail[64];
    if (sscanf(st.tensors[i].name, "mtp.layers.%d.%63s", &k, tail) == 2 && !strcmp(tail, "eh_proj.weight") &&
        k + 1 > *D)
      *D = k + 1;
  }
  ct_st_close(&st);
  if (!rc && (*D < 1 || *D > CT_MTP_MAX))
    rc = ct_set_error(CT_EFORMAT, "%s: %d multi-token prediction depths (1 to %d)", p, *D, CT_MTP_MAX);
  return rc;
}

// Bytes of one (rows, cols) matrix in the main model's format (mode CT_PACK_*): fp32 or
// bf16 panels, or int8 panels (rows as they are when cols % 4) with row scales and row
// sums; each piece 64-byte aligned.
static long matrix_bytes(int mode, long rows, long cols) {
  long a = 64;
  if (mode == CT_PACK_BF16) return (2 * ct_panel16_size((int)rows, (int)cols) + a - 1) / a * a;
  if (mode == CT_PACK_INT8) return (rows * cols + a - 1) / a * a + 2 * ((4 * rows + a - 1) / a * a);
  return (4 * rows * cols + a - 1) / a * a;
}

// W (rows, cols) in the main model's format at *at (advanced): the depths cost what a layer
// of the main model costs to read (a draft in float32 beside an int8 model read 4x its
// bytes). Only the guesses see the rounding: every kept token is the main model's own.
// scratch: one panel of int8 rows (CT_PANEL · cols bytes).
static void pack_matrix(ct_linear *L, const float *W, int rows, int cols, int mode, int8_t *scratch, char **at) {
  *L = (ct_linear){.rows = rows, .cols = cols};
  long a = 64, n = (long)rows * cols;
  if (mode == CT_PACK_BF16) {
    ct_panel_pack16(W, rows, cols, (uint16_t *)*at);
    L->p16 = (const uint16_t *)*at;
  } else if (mode == CT_PACK_INT8) {
    int8_t *q = (int8_t *)*at;
    float *scale = (float *)(*at + (n + a - 1) / a * a);
    int32_t *rowsum = (int32_t *)((char *)scale + (4L * rows + a - 1) / a * a);
    ct_quantize_rows(W, rows, cols, q, scale, rowsum);
    L->scale = scale, L->rowsum = rowsum;
    if (cols % 4) {
      L->q = q;  // (as ct_infer_pack leaves such a matrix)
    } else {
      ct_panel8_pack_inplace(q, rows, cols, scratch);
      L->p8 = q;
    }
  } else {
    ct_panel_pack(W, rows, cols, (float *)*at);
    L->p32 = (const float *)*at;
  }
  *at += matrix_bytes(mode, rows, cols);
}

// A depth's block as a one-layer engine model, and its eh_proj, the matrices packed at *at
// in the main model's format (mode).
static void depth_weights(ct_infer_weights *dw, ct_infer_layer *L, ct_linear *eh, const ct_spec_model *sm, int k,
                          int mode, int8_t *scratch, char **at) {
  const ct_model_config *c = &sm->w->cfg;
  const ct_layer_weights *b = &sm->mtp.w.mtp[k].block;
  int C = c->hidden_size, F = c->intermediate_size, Hd = c->num_heads * c->head_dim;
  int QKV = (c->num_heads + 2 * c->num_kv_heads) * c->head_dim;
  struct {
    ct_linear *dst;
    const float *src;
    int rows, cols;
  } m[5] = {{&L->qkv, b->wqkv, QKV, C}, {&L->o, b->wo, C, Hd}, {&L->gu, b->wgu, 2 * F, C}, {&L->down, b->wdown, C, F},
              {eh, sm->mtp.w.mtp[k].eh_proj, C, 2 * C}};
  for (int i = 0; i < 5; i++) pack_matrix(m[i].dst, m[i].src, m[i].rows, m[i].cols, mode, scratch, at);
  L->ln1 = b->ln1, L->ln2 = b->ln2, L->post_attn = b->post_attn, L->post_ff = b->post_ff;
  L->bqkv = b->bqkv, L->qnorm = b->qnorm, L->knorm = b->knorm;
  memset(dw, 0, sizeof *dw);
  dw->cfg = *c;
  dw->cfg.num_layers = 1;  // (its attention: a full layer's, as training runs the last layer's kind)
  dw->cfg.sliding_window = ct_layer_window(c, c->num_layers - 1);
  memset(dw->cfg.sliding, 0, sizeof dw->cfg.sliding);
  dw->cfg.sliding[0] = dw->cfg.sliding_window > 0;
  dw->int8 = sm->w->int8;
  dw->embed = sm->w->embed;
  dw->lm_head = sm->w->lm_head;
  dw->norm = sm->w->norm;
  dw->layers = L;
  dw->packed = mode;
}

int ct_spec_load(ct_spec_model *sm, const ct_infer_weights *w, const char *dir, const ct_engine_opts *o) {
  memset(sm, 0, sizeof *sm);
  sm->w = w;
  if (w->lora) return ct_set_error(CT_EINVAL, "speculative=mtp: not with adapters (adapter_path)");
  ct_model_config c = w->cfg;
  int rc = count_depths(dir, &c.mtp_layers);
  if (rc) return rc;
  sm->D = c.mtp_layers;
  bool found;
  // the whole layout is mapped but only the depths' pages are ever written (ct_big_alloc)
  if ((rc = ct_model_init(&sm->mtp, &c, 1)) || (rc = ct_mtp_load(&sm->mtp, sm->mtp.params, dir, &found))) {
    ct_spec_free(sm);
    return rc;
  }
  long C = c.hidden_size, F = c.intermediate_size, Hd = (long)c.num_heads * c.head_dim;
  long QKV = (long)(c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
  // the depths in the main model's format (an unpacked float32 model: fp32 panels)
  int mode = w->int8 ? CT_PACK_INT8 : w->packed == CT_PACK_BF16 ? CT_PACK_BF16 : CT_PACK_F32;
  long per = matrix_bytes(mode, QKV, C) + matrix_bytes(mode, C, Hd) + matrix_bytes(mode, 2 * F, C) +
             matrix_bytes(mode, C, F) + matrix_bytes(mode, C, 2 * C);
  sm->dw = calloc(sm->D, sizeof *sm->dw);
  sm->eh = calloc(sm->D, sizeof *sm->eh);
  ct_infer_layer *layers = calloc(sm->D, sizeof *layers);
  sm->panels = aligned_alloc(64, (size_t)per * sm->D);
  long widest = 2 * C > F ? 2 * C : F;  // (the widest matrix's columns)
  int8_t *scratch = malloc((size_t)CT_PANEL * widest);
  if (!sm->dw || !sm->eh || !layers || !sm->panels || !scratch) {
    free(layers);
    free(scratch);
    ct_spec_free(sm);
    return ct_set_error(CT_ENOMEM, "speculative: out of memory");
  }
  char *at = sm->panels;
  for (int k = 0; k < sm->D; k++) depth_weights(&sm->dw[k], &layers[k], &sm->eh[k], sm, k, mode, scratch, &at);
  free(scratch);
  sm->o = (ct_engine_opts){1, o->max_len, o->max_tokens > sm->D + 1 ? o->max_tokens : sm->D + 1, o->kv_bf16};
  if (!(sm->de = calloc(sm->D, sizeof *sm->de))) rc = ct_set_error(CT_ENOMEM, "speculative: out of memory");
  if (!rc) rc = ct_engine_init(&sm->e, w, &sm->o);
  for (int k = 0; !rc && k < sm->D; k++) rc = ct_engine_init(&sm->de[k], &sm->dw[k], &sm->o);
  if (rc) ct_spec_free(sm);
  return rc;
}

void ct_spec_free(ct_spec_model *sm) {
  for (int k = 0; sm->de && k < sm->D; k++) ct_engine_free(sm->de[k]);
  free(sm->de);
  ct_engine_free(sm->e);
  if (sm->dw) free(sm->dw[0].layers);  // (one allocation for every depth's layer)
  free(sm->dw);
  free(sm->eh);
  free(sm->panels);
  ct_model_free(&sm->mtp);
  memset(sm, 0, sizeof *sm);
}

// ---------------------------------------------------------------------------
// One request

typedef struct {
  ct_spec_model *sm;  // (its drafting record is updated)
  const ct_tokenizer *tok;
  const ct_gen_callbacks *cb;
  ct_engine *e;       // the main model, one slot
  ct_engine **de;     // (D) the depths, one slot each
  int D, C, V, max_len, cap;
  ct_sampler_ws ws;
  int *tok_ids;       // (max_len + D + 1) prompt, committed tokens, then this round's guesses
  int *guess;         // (D + 1) guess[k] of depth k
  int *valid;         // (D + 1) depth k's cache holds committed inputs at positions [0, valid[k])
  float *h;           // (D, max_len, C) h_k[p]: the main model's last layer (k = 0), depth k's block
  float *x, *cat, *logits, *row;  // (cap, C), (cap, 2C), (cap, V), (C)
  int *ids, *pos, *slot, *outs;       // (cap)
  ct_gen_sample gs;    // the sample being generated: ids, lps, seen (max_len + D + 1), text
  bool done;
  double cost;        // a depth's weights to read per guess / the main model's per pass (all alike)
} run_t;

// The greedy choice from logits as the token at index at (generate.c's choose: same
// sampler, same finishing step); sets g->done when the sample ends.
static int commit(run_t *g, const ct_gen_request *r, const float *logits, int at, int *t_out) {
  float lp;
  int t = ct_sample_token(&r->sp, logits, g->V, g->gs.seen, g->gs.n_seen, NULL, &g->ws, &lp);
  if (t < 0) return t;
  *t_out = t;
  g->tok_ids[at] = t;
  int rc = ct_gen_sample_add(&g->gs, r, g->tok, g->cb, t, lp, at >= g->max_len);
  g->done = rc != 0;
  return rc < 0 ? rc : 0;
}

static int argmax(const float *v, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (v[i] > v[b]) b = i;
  return b;
}

// Depth k's projection input at position p: [enorm(emb(token p + k)); hnorm(h_{k-1}[p])] into
// cat (2C); en, hn: the two norms' weights as applied (ct_norm_weight).
static void depth_row(run_t *g, int k, int p, const float *en, const float *hn, float *cat) {
  const ct_model_config *c = &g->sm->w->cfg;
  int C = g->C;
  ct_linear_row(&g->sm->w->embed, g->tok_ids[p + k], g->row);
  if (c->gemma) {
    float es = ct_embed_scale(c);
    for (int i = 0; i < C; i++) g->row[i] *= es;
  }
  float rstd;
  ct_rmsnorm_forward(cat, &rstd, g->row, en, 1, C, c->rms_norm_eps);
  ct_rmsnorm_forward(cat + C, &rstd, g->h + ((long)(k - 1) * g->max_len + p) * C, hn, 1, C, c->rms_norm_eps);
}

// Depth k over positions [valid[k], n) — committed tokens up to index n, this round's
// guesses past it — then its guess for token n + k from position n - 1.
static int draft_depth(run_t *g, int k, int n) {
  int p0 = g->valid[k], rc = 0;
  const ct_model_config *c = &g->sm->w->cfg;
  const ct_mtp_weights *w = &g->sm->mtp.w.mtp[k - 1];
  float wn_e[g->C], wn_h[g->C];  // (Gemma's 1 + w, built once per call rather than per row)
  const float *en = ct_norm_weight(c, w->enorm, g->C, wn_e), *hn = ct_norm_weight(c, w->hnorm, g->C, wn_h);
  for (int start = p0; start < n && !rc; start += g->cap) {
    int m = n - start < g->cap ? n - start : g->cap, last = m - 1, end = start + m == n;
    for (int i = 0; i < m; i++) {
      depth_row(g, k, start + i, en, hn, g->cat + (long)i * 2 * g->C);
      g->pos[i] = start + i;
      g->slot[i] = 0;
    }
    ct_linear_forward(&g->sm->eh[k - 1], g->cat, 2 * g->C, m, g->x, g->C, 0);  // x (m, C) = cat · eh_projᵀ
    float *top = k < g->D ? g->h + ((long)k * g->max_len + start) * g->C : NULL;
    rc = ct_engine_forward_top(g->de[k - 1], m, NULL, g->x, g->slot, g->pos, &last, end, g->logits, top);
  }
  if (rc) return rc;
  g->guess[k] = argmax(g->logits, g->V);
  g->tok_ids[n + k] = g->guess[k];
  if (n - k + 1 > g->valid[k]) g->valid[k] = n - k + 1;  // positions whose token p + k is committed
  return 0;
}

// The prompt through the main model (h_0 of every position kept) and the first token.
static int prefill(run_t *g, const ct_gen_request *r) {
  int rc = 0;
  memcpy(g->tok_ids, r->prompt, sizeof(int) * r->prompt_len);
  for (int start = 0; start < r->prompt_len && !rc; start += g->cap) {
    int m = r->prompt_len - start < g->cap ? r->prompt_len - start : g->cap, last = m - 1;
    int end = start + m == r->prompt_len;
    for (int i = 0; i < m; i++) g->pos[i] = start + i, g->slot[i] = 0;
    rc = ct_engine_forward_top(g->e, m, r->prompt + start, NULL, g->slot, g->pos, &last, end, g->logits,
                               g->h + (long)start * g->C);
  }
  int t;
  return rc ? rc : commit(g, r, g->logits, r->prompt_len, &t);
}

// How many depths draft this round (at most Dn): depth k only while the chance that its
// guess is kept — the product of depths 1..k's kept shares so far — is above what
// drafting it costs in main-model passes (its block, eh_proj and the LM head against all
// layers and the head: the reads of a memory-bound decode step), a share being trusted
// once 32 of its guesses were checked. A draft that is mostly wrong (an undertrained
// depth, a text it does not know) then costs nothing past its first guesses and every
// 16th round's, which keep the shares measured. The output never depends on it.
static int depths_to_draft(const run_t *g, int Dn) {
  const ct_spec_model *sm = g->sm;
  if (sm->round % 16 == 0) return Dn;
  double p = 1;
  for (int k = 1; k <= Dn; k++) {
    p *= (sm->kept[k] + 1.0) / (sm->checked[k] + 2.0);
    if (sm->checked[k] >= 32 && p <= g->cost) return k - 1;
  }
  return Dn;
}

static int run_request(run_t *g, const ct_gen_request *r, ct_spec_stats *st) {
  g->done = false;
  memset(g->valid, 0, sizeof(int) * (g->D + 1));
  int rc = prefill(g, r), n = r->prompt_len;  // tok_ids[n] is the newest token, not yet fed
  while (!rc && !g->done) {
    int Dn = g->max_len - 1 - n < g->D ? g->max_len - 1 - n : g->D;  // guesses whose positions fit
    Dn = depths_to_draft(g, Dn);
    g->sm->round++;
    for (int k = 1; k <= Dn && !rc; k++) rc = draft_depth(g, k, n);
    if (rc) break;
    for (int j = 0; j <= Dn; j++) {  // one pass verifies every guess
      g->ids[j] = g->tok_ids[n + j];
      g->pos[j] = n + j;
      g->slot[j] = 0;
      g->outs[j] = j;
    }
    rc = ct_engine_forward_top(g->e, Dn + 1, g->ids, NULL, g->slot, g->pos, g->outs, Dn + 1, g->logits,
                               g->h + (long)n * g->C);
    st->rounds++;
    st->drafted += Dn;
    int kept = 0;
    for (int j = 0; !rc && j <= Dn && !g->done; j++) {
      int t;
      rc = commit(g, r, g->logits + (long)j * g->V, n + 1 + j, &t);
      kept++;
      if (j < Dn) {
        g->sm->checked[j + 1]++;
        g->sm->kept[j + 1] += t == g->guess[j + 1];
      }
      if (j < Dn && t != g->guess[j + 1]) {
        st->rejected++;
        break;
      }
      st->accepted += j < Dn && !g->done;
    }
    n += kept;
  }
  st->tokens += g->gs.n;
  return rc;
}

static void run_free(run_t *g) {
  ct_sampler_ws_free(&g->ws);
  free(g->tok_ids), free(g->guess), free(g->valid), free(g->h), free(g->x), free(g->cat), free(g->logits), free(g->row);
  free(g->ids), free(g->gs.ids), free(g->gs.seen), free(g->gs.lps);
  ct_gen_sample_free(&g->gs);
}

static int run_init(run_t *g, ct_spec_model *sm, const ct_tokenizer *tok, const ct_gen_callbacks *cb) {
  const ct_model_config *c = &sm->w->cfg;
  *g = (run_t){.sm = sm, .tok = tok, .cb = cb, .e = sm->e, .de = sm->de, .D = sm->D, .C = c->hidden_size,
               .V = c->vocab_size, .max_len = sm->o.max_len, .cap = sm->o.max_tokens};
  long T = g->max_len + sm->D + 1;
  g->tok_ids = malloc(sizeof(int) * T);
  g->guess = calloc(sm->D + 1, sizeof(int));
  g->valid = calloc(sm->D + 1, sizeof(int));
  g->h = malloc(sizeof(float) * sm->D * T * g->C);
  g->x = malloc(sizeof(float) * g->cap * g->C);
  g->logits = malloc(sizeof(float) * g->cap * g->V);
  g->cat = malloc(sizeof(float) * 2 * g->cap * g->C);
  g->row = malloc(sizeof(float) * g->C);
  g->ids = malloc(sizeof(int) * 4 * g->cap);
  g->gs.ids = malloc(sizeof(int) * T);
  g->gs.seen = malloc(sizeof(int) * T);
  g->gs.lps = malloc(sizeof(float) * T);
  g->gs.cap = g->max_len;  // (the seen tokens: as generate.c keeps them)
  if (!g->tok_ids || !g->guess || !g->valid || !g->h || !g->x || !g->cat || !g->logits || !g->row || !g->ids ||
      !g->gs.ids || !g->gs.seen || !g->gs.lps) {
    run_free(g);
    memset(g, 0, sizeof *g);
    return ct_set_error(CT_ENOMEM, "speculative: out of memory");
  }
  g->pos = g->ids + g->cap, g->slot = g->pos + g->cap, g->outs = g->slot + g->cap;
  // weights read per token, in values (both in the same format)
  long C = c->hidden_size, F = c->intermediate_size, Hd = (long)c->num_heads * c->head_dim;
  long layer = (long)(c->num_heads + 2 * c->num_kv_heads) * c->head_dim * C + C * Hd + 3 * F * C;
  long head = (long)c->vocab_size * C;
  g->cost = (double)(layer + 2 * C * C + head) / ((double)c->num_layers * layer + head);
  int rc = ct_sampler_ws_init(&g->ws, g->V);
  if (rc) {
    run_free(g);
    memset(g, 0, sizeof *g);
  }
  return rc;
}

int ct_spec_generate(ct_spec_model *sm, const ct_tokenizer *tok, const ct_gen_request *reqs, int nreq,
                     const ct_gen_callbacks *cb, ct_spec_stats *st) {
  const ct_engine_opts *o = &sm->o;
  if (cb->on_turn) return ct_set_error(CT_EINVAL, "speculative=mtp decodes single-turn samples only");
  for (int r = 0; r < nreq; r++) {
    if (reqs[r].n != 1 || reqs[r].sp.temperature > 0)
      return ct_set_error(CT_EINVAL, "request %d: speculative=mtp decodes greedily: needs n = 1 and temperature 0", r);
    if (reqs[r].prompt_len < 1 || reqs[r].prompt_len >= o->max_len || reqs[r].max_new_tokens < 1)
      return ct_set_error(CT_EINVAL, "request %d: a prompt of %d tokens, %d new tokens, in a cache of %d positions",
                          r, reqs[r].prompt_len, reqs[r].max_new_tokens, o->max_len);
  }
  run_t g;
  int rc = run_init(&g, sm, tok, cb);
  for (int r = 0; !rc && r < nreq; r++) {
    ct_gen_sample_start(&g.gs, &reqs[r], r, 0);
    rc = run_request(&g, &reqs[r], st);
  }
  run_free(&g);  // (zeroed when run_init failed)
  return rc;
}

int ct_spec_guess(ct_spec_model *sm, const int *tokens, int n, int *guesses) {
  if (n < 2 || n + sm->D > sm->o.max_len)
    return ct_set_error(CT_EINVAL, "speculative: %d tokens to guess after (2 to %d)", n, sm->o.max_len - sm->D);
  run_t g;
  int rc = run_init(&g, sm, NULL, NULL);
  if (rc) return rc;
  memcpy(g.tok_ids, tokens, sizeof(int) * n);
  for (int start = 0; start < n - 1 && !rc; start += g.cap) {  // the main model over tokens [0, n - 1)
    int m = n - 1 - start < g.cap ? n - 1 - start : g.cap;
    for (int i = 0; i < m; i++) g.pos[i] = start + i, g.slot[i] = 0;
    rc = ct_engine_forward_top(g.e, m, tokens + start, NULL, g.slot, g.pos, NULL, 0, NULL, g.h + (long)start * g.C);
  }
  for (int k = 1; k <= sm->D && !rc; k++) rc = draft_depth(&g, k, n - 1);
  for (int k = 1; k <= sm->D && !rc; k++) guesses[k - 1] = g.guess[k];
  run_free(&g);
  return rc;
}
