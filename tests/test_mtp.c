// Multi-token prediction (nn/mtp.h) through the production step (ct_lm_step with a->mtp)
// against a float64 reference written here: DeepSeek-V3's depths on top of ref_model.h's
// decoder, every gradient (MTP weights, trunk, embedding, head) against central finite
// differences of the reference's total loss; λ's effect on the trunk; the layout and
// mtp.safetensors; the targets of packed rows by hand.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batch.h"
#include "error.h"
#include "fs.h"
#include "lm.h"
#include "matmul.h"
#include "mtp.h"
#include "panel.h"
#include "pool.h"
#include "ref_model.h"
#include "rng.h"
#include "speculative.h"
#include "test.h"
#include "tiny_model.h"
#include "tokenizer.h"

// Two rows of T=8: row 0 one document with two padding tokens at the end and an unlabeled
// prompt token; row 1 two packed documents (positions restart, seg = document start).
static batch_t make_batch(int V) {
  batch_t b = two_row_batch(V, 8, 3);
  for (int t = 0; t < 8; t++) {
    b.seg[t] = t < 6 ? 0 : t;  // 6, 7 padding: their own segment
    b.target[t] = t >= 1 && t < 5 ? b.ids[t + 1] : -1;  // token 1 is the prompt's last: unlabeled
  }
  return b;
}

// A model of cfg with random weights and non-trivial norms.
static void make_model(ct_model *m, ct_model_config cfg) {
  if (ct_model_init(m, &cfg, 16)) exit(1);
  ct_model_init_random(m, 3, 0.3f);
  tiny_vectors(m, 11, 1, 0.2);
}

// ---------------------------------------------------------------------------
// The system under test: ct_lm_step over the batch with the depths attached; the
// gradient of mean CE + λ · mean_k CE_k into grads (zeroed first). Returns that loss.

static double ours(const ct_model *m, const batch_t *bt, float lambda, int mode, float *grads, ct_lm_stats *out) {
  const ct_model_config *c = &m->cfg;
  int B = bt->B, T = bt->T, N = B * T;
  ct_acts a;
  ct_head h;
  ct_mtp t;
  ct_batch b;
  ct_weights g;
  bool train = grads != NULL;
  if (ct_acts_init(&a, m, B, T, train ? mode : CT_ACTS_FORWARD) ||
      ct_head_init(&h, N, N, c->vocab_size, c->hidden_size, 1) || ct_batch_init(&b, B, T) ||
      (c->mtp_layers && ct_mtp_init(&t, m, B, T, train)) || (train && ct_weights_bind(&g, m, grads))) {
    fprintf(stderr, "%s\n", ct_last_error());
    exit(1);
  }
  b.B = B;
  b.T = T;
  b.n_target = 0;
  for (int n = 0; n < N; n++) {
    b.ids[n] = bt->ids[n], b.pos[n] = bt->pos[n], b.seg[n] = bt->seg[n], b.target[n] = bt->target[n];
    b.n_target += bt->target[n] >= 0;
  }
  double nk[CT_MTP_MAX] = {0};
  if (c->mtp_layers) {
    ct_mtp_count(b.target, b.seg, B, T, c->mtp_layers, nk);
    ct_mtp_set_scale(&t, lambda, nk);
    a.mtp = &t;
  }
  if (train) memset(grads, 0, sizeof(float) * m->n_floats);
  ct_lm_stats st = {0};
  CHECK_OK(ct_lm_step(m, &a, &h, &b, train ? &g : NULL, 1.0f / (float)b.n_target, 0, &st));
  for (int k = 0; k < c->mtp_layers; k++) CHECK(st.mtp.targets[k] == nk[k]);
  if (out) *out = st;
  if (train) ct_weights_free(&g);
  if (c->mtp_layers) ct_mtp_free(&t);
  ct_batch_free(&b);
  ct_head_free(&h);
  ct_acts_free(&a);
  return st.loss / st.targets + lambda * ct_mtp_mean_loss(&st.mtp, c->mtp_layers);
}

// ---------------------------------------------------------------------------
// The float64 reference. Depth k's block runs through ref_layers as a one-layer model
// whose "embedding" rows are the block's inputs (ids 0..N-1) and whose layer 0 is
// mtp.layers.<k-1>'s tensors; the final norm and head are the main model's.

typedef struct {
  double total;            // mean CE + λ · mean_k CE_k
  double main_loss;
  double loss[CT_MTP_MAX];  // Σ CE of depth k
  int count[CT_MTP_MAX];
  int accepted[CT_MTP_MAX];
  int arg1[64];  // depth 1's argmax at every position
} ref_out;

static int argmax_logits(const ref_t *r, const double *x, double *lg) {
  const ct_model_config *c = &r->m->cfg;
  int C = c->hidden_size, V = c->vocab_size;
  double xn[64];
  const double *head = c->tie_word_embeddings ? W(r, "model.embed_tokens.weight", 0) : W(r, "lm_head.weight", 0);
  rmsnorm(xn, x, W(r, "model.norm.weight", 0), C, c->rms_norm_eps);
  linear(lg, xn, head, NULL, C, V);
  int best = 0;
  for (int i = 1; i < V; i++)
    if (lg[i] > lg[best]) best = i;
  return best;
}

static ref_out ref_total(const ref_t *r, const batch_t *b, double lambda) {
  const ct_model *m = r->m;
  const ct_model_config *c = &m->cfg;
  int B = b->B, T = b->T, N = B * T, C = c->hidden_size, D = c->mtp_layers;
  ref_out o = {0};
  double *x = calloc((size_t)N * C, 8), *hk = calloc((size_t)N * C, 8), *lg = calloc(c->vocab_size, 8);
  int cnt, *iota = malloc(sizeof(int) * N), *tk = malloc(sizeof(int) * N), *main_arg = malloc(sizeof(int) * N);
  for (int n = 0; n < N; n++) iota[n] = n;
  ref_layers(r, B, T, b->ids, b->pos, b->seg, x);
  o.main_loss = ref_head_sum(r, x, N, b->target, 0, &cnt) / cnt;
  for (int n = 0; n < N; n++) main_arg[n] = argmax_logits(r, x + (long)n * C, lg);
  ct_model_config one = *c;
  one.num_layers = 1;
  one.vocab_size = N;
  one.mtp_layers = 0;
  one.tie_word_embeddings = true;
  ct_model blk;
  if (ct_model_layout(&blk, &one)) exit(1);
  double *Pb = calloc(blk.n_floats, 8), *en = calloc(C, 8), *hn = calloc(C, 8);
  double mean = 0;
  for (int k = 1; k <= D; k++) {
    char name[96];
    for (int i = 0; i < blk.n_tensors; i++) {  // layer 0 <- mtp.layers.<k-1>
      const ct_tensor_info *ti = &blk.tensors[i];
      if (strncmp(ti->name, "model.layers.0.", 15)) continue;
      snprintf(name, sizeof name, "mtp.layers.%d.%s", k - 1, ti->name + 15);
      const ct_tensor_info *src = ct_model_find_tensor(m, name);
      if (!src) exit(1);
      memcpy(Pb + ti->offset, r->P + src->offset, 8 * ti->numel);
    }
    char nm[96];
    snprintf(nm, sizeof nm, "mtp.layers.%d.enorm.weight", k - 1);
    const double *we = r->P + ct_model_find_tensor(m, nm)->offset;
    snprintf(nm, sizeof nm, "mtp.layers.%d.hnorm.weight", k - 1);
    const double *wh = r->P + ct_model_find_tensor(m, nm)->offset;
    snprintf(nm, sizeof nm, "mtp.layers.%d.eh_proj.weight", k - 1);
    const double *M = r->P + ct_model_find_tensor(m, nm)->offset;
    const double *E = W(r, "model.embed_tokens.weight", 0);
    double *xin = Pb + ct_model_find_tensor(&blk, "model.embed_tokens.weight")->offset;
    for (int n = 0; n < N; n++) {
      int t = n % T, id = t + k < T && b->seg[n + k] == b->seg[n] ? b->ids[n + k] : 0;
      rmsnorm(en, E + (long)id * C, we, C, c->rms_norm_eps);
      rmsnorm(hn, x + (long)n * C, wh, C, c->rms_norm_eps);
      for (int o2 = 0; o2 < C; o2++) {  // [en; hn] · Mᵀ, M (C, 2C)
        double s = 0;
        for (int i = 0; i < C; i++) s += M[(long)o2 * 2 * C + i] * en[i] + M[(long)o2 * 2 * C + C + i] * hn[i];
        xin[(long)n * C + o2] = s;
      }
      tk[n] = t + k < T && b->seg[n + k] == b->seg[n] ? b->target[n + k] : -1;
    }
    ref_t rb = {&blk, Pb};
    ref_layers(&rb, B, T, iota, b->pos, b->seg, hk);
    o.loss[k - 1] = ref_head_sum(r, hk, N, tk, 0, &o.count[k - 1]);
    for (int n = 0; k == 1 && n < N; n++) o.arg1[n] = argmax_logits(r, hk + (long)n * C, lg);
    for (int n = 0; n < N; n++)
      if (tk[n] >= 0) o.accepted[k - 1] += argmax_logits(r, hk + (long)n * C, lg) == main_arg[n + k];
    mean += o.loss[k - 1] / o.count[k - 1] / D;
    memcpy(x, hk, 8 * (size_t)N * C);  // h_k feeds depth k + 1
  }
  o.total = o.main_loss + lambda * mean;
  ct_model_free(&blk);
  free(Pb); free(en); free(hn); free(x); free(hk); free(lg); free(iota); free(tk); free(main_arg);
  return o;
}

// ---------------------------------------------------------------------------

static void check_against_reference(ct_model_config cfg, int D, float lambda) {
  cfg.mtp_layers = D;
  ct_model m;
  make_model(&m, cfg);
  batch_t b = make_batch(cfg.vocab_size);
  float *grads = aligned_alloc(64, sizeof(float) * m.n_floats);
  ct_lm_stats st;
  double loss = ours(&m, &b, lambda, CT_ACTS_KEEP, grads, &st);
  double *P = calloc(m.n_floats, 8);
  for (long i = 0; i < m.n_floats; i++) P[i] = m.params[i];
  ref_t ref = {&m, P};
  ref_out want = ref_total(&ref, &b, lambda);
  CHECK_NEAR(loss, want.total, 2e-5 * fabs(want.total));
  for (int k = 0; k < D; k++) {
    CHECK(st.mtp.targets[k] == want.count[k] && want.count[k] > 0);
    CHECK_NEAR(st.mtp.loss[k], want.loss[k], 2e-5 * want.loss[k]);
    CHECK(st.mtp.accepted[k] == want.accepted[k]);
  }
  // gradient checkpointing of the trunk: the same gradients bit for bit
  float *g2 = aligned_alloc(64, sizeof(float) * m.n_floats);
  CHECK(ours(&m, &b, lambda, CT_ACTS_RECOMPUTE, g2, NULL) == loss);
  CHECK(!memcmp(g2, grads, sizeof(float) * m.n_floats));
  // forward-only (evaluation) work space: the same statistics
  ct_lm_stats se;
  ours(&m, &b, lambda, CT_ACTS_FORWARD, NULL, &se);
  for (int k = 0; k < D; k++) {
    CHECK_NEAR(se.mtp.loss[k], st.mtp.loss[k], 1e-6 * st.mtp.loss[k]);
    CHECK(se.mtp.accepted[k] == st.mtp.accepted[k] && se.mtp.targets[k] == st.mtp.targets[k]);
  }
  // every gradient against central differences of the reference's total loss
  int bad = 0, checked = 0, mtp_checked = 0;
  double worst = 0;
  for (int ti = 0; ti < m.n_tensors; ti++) {
    const ct_tensor_info *t = &m.tensors[ti];
    for (long k = 0; k < t->numel; k++) {
      long i = t->offset + k;
      double keep = P[i], e = 1e-5;
      P[i] = keep + e;
      double lp = ref_total(&ref, &b, lambda).total;
      P[i] = keep - e;
      double lm = ref_total(&ref, &b, lambda).total;
      P[i] = keep;
      double fd = (lp - lm) / (2 * e), err = fabs(grads[i] - fd);
      checked++;
      mtp_checked += ti >= m.n_hf_tensors;
      worst = err > worst ? err : worst;
      if (err > 1e-5 + 1e-3 * fabs(fd) && bad++ < 5)
        fprintf(stderr, "  %s[%ld]: analytic %.8g, finite difference %.8g\n", t->name, k, grads[i], fd);
    }
  }
  fprintf(stderr, "  %d gradients checked (%d of MTP's), worst |diff| %.3g\n", checked, mtp_checked, worst);
  CHECK(bad == 0);
  long C = cfg.hidden_size, F = cfg.intermediate_size, hd = cfg.head_dim;
  long QKV = (cfg.num_heads + 2L * cfg.num_kv_heads) * hd;
  long block = 2 * C + QKV * C + (cfg.qkv_bias ? QKV : 0) + (cfg.qk_norm ? 2 * hd : 0) + C * cfg.num_heads * hd +
               3 * F * C;
  CHECK(mtp_checked == D * (2 * C /* enorm, hnorm */ + 2 * C * C /* eh_proj */ + block));
  free(P);
  free(g2);
  free(grads);
  ct_model_free(&m);
}

static void test_one_depth_llama_tied_loss_and_gradients_match_float64_reference(void) {
  check_against_reference(mini_config(), 1, 0.3f);
}

static void test_two_depths_qwen3_untied_loss_and_gradients_match_float64_reference(void) {
  ct_model_config c = mini_config();
  c.qk_norm = true;
  c.tie_word_embeddings = false;
  c.qkv_bias = true;
  check_against_reference(c, 2, 0.5f);
}

// Gemma 3's layer (1 + w norms, sandwich norms, embedding scale, a sliding layer 0):
// directional derivatives of our own loss along the gradient's MTP part and its Hugging
// Face part match the gradient (no float64 Gemma reference of the depths here).
static void test_gemma_directional_derivatives_match_the_gradient(void) {
  ct_model_config c = mini_config();
  c.gemma = c.qk_norm = true;
  c.query_pre_attn_scalar = 12;
  c.sliding_window = 3;
  c.rope_local_theta = 100;
  c.sliding[0] = 1;
  snprintf(c.model_type, sizeof c.model_type, "gemma3_text");
  c.mtp_layers = 2;
  ct_model m;
  CHECK_OK(ct_model_init(&m, &c, 16));
  ct_model_init_random(&m, 3, 0.3f);
  tiny_vectors(&m, 5, 0, 0.2);  // Gemma's norms apply 1 + w
  batch_t b = make_batch(c.vocab_size);
  long n = m.n_floats, hf_end = m.tensors[m.n_hf_tensors].offset;
  float *g = aligned_alloc(64, 4 * n), *keep = malloc(4 * n), *tmp = aligned_alloc(64, 4 * n);
  ours(&m, &b, 0.5f, CT_ACTS_KEEP, g, NULL);
  memcpy(keep, m.params, 4 * n);
  long parts[2][2] = {{0, hf_end}, {hf_end, n}};
  for (int part = 0; part < 2; part++) {
    double norm2 = 0;
    for (long i = parts[part][0]; i < parts[part][1]; i++) norm2 += (double)g[i] * g[i];
    double h = 1e-2 / sqrt(norm2), lp, lm;
    for (long i = parts[part][0]; i < parts[part][1]; i++) m.params[i] = keep[i] + (float)(h * g[i]);
    lp = ours(&m, &b, 0.5f, CT_ACTS_KEEP, tmp, NULL);
    for (long i = parts[part][0]; i < parts[part][1]; i++) m.params[i] = keep[i] - (float)(h * g[i]);
    lm = ours(&m, &b, 0.5f, CT_ACTS_KEEP, tmp, NULL);
    memcpy(m.params, keep, 4 * n);
    double fd = (lp - lm) / (2 * h);
    fprintf(stderr, "  %s part: |g|^2 %.6g, directional difference %.6g\n", part ? "MTP" : "Hugging Face", norm2, fd);
    CHECK_NEAR(fd, norm2, 5e-3 * norm2);
  }
  free(g);
  free(keep);
  free(tmp);
  ct_model_free(&m);
}

// The MTP loss reaches the trunk: its gradient moves with λ, linearly, and λ = 0 leaves
// exactly the gradient of a model without MTP.
static void test_lambda_changes_trunk_gradients_linearly(void) {
  ct_model_config c = mini_config();
  ct_model plain;
  make_model(&plain, c);
  c.mtp_layers = 2;
  ct_model m;
  make_model(&m, c);  // the same seeds: the Hugging Face part equals plain's
  CHECK(m.n_hf_tensors == plain.n_tensors);
  CHECK(!memcmp(m.params, plain.params, sizeof(float) * (size_t)m.tensors[m.n_hf_tensors].offset));
  batch_t b = make_batch(c.vocab_size);
  long n = m.n_floats;
  float *g0 = aligned_alloc(64, 4 * n), *g1 = aligned_alloc(64, 4 * n), *g2 = aligned_alloc(64, 4 * n);
  float *gp = aligned_alloc(64, 4 * plain.n_floats);
  ours(&m, &b, 0.0f, CT_ACTS_KEEP, g0, NULL);
  ours(&m, &b, 0.1f, CT_ACTS_KEEP, g1, NULL);
  ours(&m, &b, 0.4f, CT_ACTS_KEEP, g2, NULL);
  ours(&plain, &b, 0.0f, CT_ACTS_KEEP, gp, NULL);
  long hf_end = m.tensors[m.n_hf_tensors].offset;
  double same = 0;
  for (long i = 0; i < hf_end; i++) same = fmax(same, fabs(g0[i] - gp[i]));
  CHECK(same == 0);
  const ct_tensor_info *q = ct_model_find_tensor(&m, "model.layers.0.self_attn.q_proj.weight");
  const ct_tensor_info *e = ct_model_find_tensor(&m, "model.embed_tokens.weight");
  const ct_tensor_info *mq = ct_model_find_tensor(&m, "mtp.layers.1.self_attn.q_proj.weight");
  const ct_tensor_info *ts[] = {q, e, mq};
  for (int j = 0; j < 3; j++) {
    double d1 = 0, lin = 0;
    for (long i = ts[j]->offset; i < ts[j]->offset + ts[j]->numel; i++) {
      double a = g1[i] - g0[i], bb = g2[i] - g0[i];
      d1 = fmax(d1, fabs(a));
      lin = fmax(lin, fabs(bb - 4 * a));
    }
    fprintf(stderr, "  %s: |g(0.1) - g(0)| up to %.3g, off linear by %.3g\n", ts[j]->name, d1, lin);
    CHECK(d1 > 1e-4);
    CHECK(lin < 1e-5 + 1e-3 * d1);
  }
  // at λ = 0 the MTP weights get no gradient at all
  double mtp0 = 0;
  for (long i = hf_end; i < n; i++) mtp0 = fmax(mtp0, fabs(g0[i]));
  CHECK(mtp0 == 0);
  free(g0); free(g1); free(g2); free(gp);
  ct_model_free(&m);
  ct_model_free(&plain);
}

// D = 0 is the plain layout; D > 0 only appends after it.
static void test_layout_appends_mtp_after_the_hugging_face_tensors(void) {
  ct_model_config c = mini_config();
  ct_model a, b;
  CHECK_OK(ct_model_layout(&a, &c));
  c.mtp_layers = 2;
  CHECK_OK(ct_model_layout(&b, &c));
  CHECK(a.n_hf_tensors == a.n_tensors);
  CHECK(b.n_hf_tensors == a.n_tensors);
  for (int i = 0; i < a.n_tensors; i++)
    CHECK(!strcmp(a.tensors[i].name, b.tensors[i].name) && a.tensors[i].offset == b.tensors[i].offset);
  CHECK(b.n_tensors == a.n_tensors + 2 * (3 + 9));
  CHECK(!strcmp(b.tensors[a.n_tensors].name, "mtp.layers.0.enorm.weight"));
  CHECK(!strcmp(b.tensors[a.n_tensors + 2].name, "mtp.layers.0.eh_proj.weight"));
  CHECK(b.tensors[a.n_tensors + 2].shape[0] == 12 && b.tensors[a.n_tensors + 2].shape[1] == 24);
  CHECK(!strcmp(b.tensors[a.n_tensors + 3].name, "mtp.layers.0.input_layernorm.weight"));
  CHECK(!strcmp(b.tensors[b.n_tensors - 1].name, "mtp.layers.1.mlp.down_proj.weight"));
  c.mtp_layers = -1;
  ct_model bad;
  CHECK(ct_model_layout(&bad, &c) == CT_EINVAL);
  free(a.tensors);
  free(b.tensors);
}

// Targets of depth k by hand: token i+k+1 when i+k is in i's document and labeled.
static void test_targets_stay_inside_documents(void) {
  batch_t b = make_batch(17);
  int out[16];
  ct_mtp_targets(b.target, b.seg, 2, 8, 1, out);
  // row 0: targets at 1..4 (of tokens 2..5); depth 1 at i sees target[i + 1]
  int want0[8] = {b.ids[2], b.ids[3], b.ids[4], b.ids[5], -1, -1, -1, -1};
  // row 1: documents [0, 3) and [3, 8); target[8 + t] for t != 2, 7
  int want1[8] = {b.ids[10], -1, -1, b.ids[13], b.ids[14], b.ids[15], -1, -1};
  for (int i = 0; i < 8; i++) CHECK(out[i] == want0[i] && out[8 + i] == want1[i]);
  ct_mtp_targets(b.target, b.seg, 2, 8, 2, out);
  int want2[16] = {b.ids[3], b.ids[4], b.ids[5], -1, -1, -1, -1, -1,
                   -1, -1, -1, b.ids[14], b.ids[15], -1, -1, -1};
  for (int i = 0; i < 16; i++) CHECK(out[i] == want2[i]);
  double n[CT_MTP_MAX] = {0};
  ct_mtp_count(b.target, b.seg, 2, 8, 3, n);
  CHECK(n[0] == 8 && n[1] == 5 && n[2] == 3);
  ct_mtp_stats s = {0};
  s.loss[0] = 6, s.targets[0] = 3, s.accepted[0] = 2;
  s.loss[1] = 4, s.targets[1] = 1, s.accepted[1] = 1;
  // the mean of the depths' means (6/3 and 4/1), not the pooled mean 10/4
  CHECK_NEAR(ct_mtp_mean_loss(&s, 2), (2.0 + 4.0) / 2, 1e-12);
  CHECK_NEAR(ct_mtp_acceptance(&s, 2, 0), 0.75, 1e-12);  // all depths: 3 of 4
  CHECK_NEAR(ct_mtp_acceptance(&s, 2, 1), 2.0 / 3, 1e-12);
  CHECK_NEAR(ct_mtp_acceptance(&s, 2, 2), 1.0, 1e-12);  // depth 2 alone: 1 of 1
}

// mtp.safetensors round trip; no file = not found; another depth count = an error.
static void test_mtp_safetensors_round_trip_and_refusals(void) {
  char dir[] = "/tmp/ctune-mtp-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  ct_model_config c = mini_config();
  c.mtp_layers = 2;
  ct_model m, m2;
  make_model(&m, c);
  CHECK_OK(ct_model_init(&m2, &c, 16));
  bool found = true;
  CHECK_OK(ct_mtp_load(&m2, m2.params, dir, &found));
  CHECK(!found);
  CHECK_OK(ct_mtp_save(&m, m.params, dir, CT_DT_F32));
  CHECK_OK(ct_mtp_load(&m2, m2.params, dir, &found));
  CHECK(found);
  long hf_end = m.tensors[m.n_hf_tensors].offset;
  CHECK(!memcmp(m.params + hf_end, m2.params + hf_end, sizeof(float) * (m.n_floats - hf_end)));
  for (long i = 0; i < hf_end; i++) CHECK(m2.params[i] == 0);  // the Hugging Face part untouched
  ct_model m1, m3;
  c.mtp_layers = 1;
  CHECK_OK(ct_model_init(&m1, &c, 16));
  CHECK(ct_mtp_load(&m1, m1.params, dir, &found) == CT_EFORMAT);  // the file has a second depth
  CHECK(strstr(ct_last_error(), "mtp.layers.1.") != NULL);
  c.mtp_layers = 3;
  CHECK_OK(ct_model_init(&m3, &c, 16));
  CHECK(ct_mtp_load(&m3, m3.params, dir, &found) == CT_EFORMAT);  // ... and no third
  CHECK(strstr(ct_last_error(), "mtp.layers.2.") != NULL);
  char p[CT_PATH_MAX];
  snprintf(p, sizeof p, "%s/mtp.safetensors", dir);
  unlink(p);
  rmdir(dir);
  ct_model_free(&m);
  ct_model_free(&m1);
  ct_model_free(&m2);
  ct_model_free(&m3);
}


// ---------------------------------------------------------------------------
// Self-speculative decoding (infer/speculative.h): greedy output identical to plain
// decoding, token for token and log-prob for log-prob.

typedef struct {
  int n;
  int len[16], finish[16];
  int ids[16][64];
  float lps[16][64];
  char text[16][256];
} results_t;

static int collect(void *ctx, const ct_gen_result *r) {
  results_t *R = ctx;
  int k = r->request;
  R->n++;
  R->len[k] = r->n;
  R->finish[k] = r->finish;
  for (int i = 0; i < r->n && i < 64; i++) R->ids[k][i] = r->ids[i], R->lps[k][i] = r->logprobs[i];
  snprintf(R->text[k], sizeof R->text[k], "%.*s", (int)r->text_len, r->text);
  return 0;
}

// Plain ct_generate against ct_spec_generate on the same requests, the model's weights
// in format `mode` (CT_PACK_F32, _BF16 or _INT8: the depths' matrices follow); returns
// the stats.
static ct_spec_stats spec_matches_plain_as(const ct_model *m, const char *dir, const ct_tokenizer *tok,
                                           const ct_gen_request *reqs, int nreq, int max_len, int max_tokens,
                                           results_t *out, int mode) {
  ct_infer_weights w;
  ct_spec_model sm;
  CHECK_OK(mode == CT_PACK_INT8 ? ct_infer_quantize(&w, m) : ct_infer_from_model(&w, m));
  CHECK_OK(ct_infer_pack(&w, mode));
  ct_engine_opts o = {.slots = 4, .max_len = max_len, .max_tokens = max_tokens};
  CHECK_OK(ct_spec_load(&sm, &w, dir, &o));
  CHECK(sm.D == m->cfg.mtp_layers);
  for (int k = 0; k < sm.D; k++) {  // every depth matrix in the model's format
    const ct_infer_layer *L = &sm.dw[k].layers[0];
    const ct_linear *mats[5] = {&L->qkv, &L->o, &L->gu, &L->down, &sm.eh[k]};
    for (int i = 0; i < 5; i++)
      CHECK(mode == CT_PACK_INT8   ? (mats[i]->p8 || mats[i]->q) && mats[i]->scale && !mats[i]->p32
            : mode == CT_PACK_BF16 ? mats[i]->p16 && !mats[i]->p32
                                   : mats[i]->p32 && !mats[i]->p16);
  }
  results_t *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
  ct_engine *e;
  CHECK_OK(ct_engine_init(&e, &w, &o));
  ct_gen_callbacks ca = {.on_done = collect, .ctx = a}, cbb = {.on_done = collect, .ctx = b};
  CHECK_OK(ct_generate(e, tok, reqs, nreq, &ca));
  ct_spec_stats st = {0};
  CHECK_OK(ct_spec_generate(&sm, tok, reqs, nreq, &cbb, &st));
  CHECK(a->n == nreq && b->n == nreq);
  for (int r = 0; r < nreq; r++) {
    CHECK(a->len[r] == b->len[r] && a->finish[r] == b->finish[r]);
    CHECK(!memcmp(a->ids[r], b->ids[r], sizeof(int) * a->len[r]));
    CHECK(!memcmp(a->lps[r], b->lps[r], sizeof(float) * a->len[r]));
    CHECK(!strcmp(a->text[r], b->text[r]));
  }
  long total = 0;
  for (int r = 0; r < nreq; r++) total += a->len[r];
  CHECK(st.tokens == total);
  CHECK(st.rounds + nreq + st.accepted == total);  // a prefill's token, then each pass's own + kept guesses
  CHECK(st.accepted + st.rejected <= st.drafted && st.rejected <= st.rounds);
  fprintf(stderr, "  %ld tokens in %ld verifying passes (+%d prefills): %ld of %ld guesses kept, %ld wrong\n",
          st.tokens, st.rounds, nreq, st.accepted, st.drafted, st.rejected);
  ct_engine_free(e);
  ct_spec_free(&sm);
  ct_infer_free(&w);
  if (out) *out = *a;
  free(a);
  free(b);
  return st;
}

static ct_spec_stats spec_matches_plain(const ct_model *m, const char *dir, const ct_tokenizer *tok,
                                        const ct_gen_request *reqs, int nreq, int max_len, int max_tokens,
                                        results_t *out) {
  return spec_matches_plain_as(m, dir, tok, reqs, nreq, max_len, max_tokens, out, CT_PACK_F32);
}

static int sprompts[5][40];

// Five greedy requests of various lengths; stop_id (or -1) ends a sample.
static void spec_requests(ct_gen_request *reqs, int V, const int *stop_id) {
  const int plens[5] = {3, 9, 1, 17, 33};
  for (int r = 0; r < 5; r++) {
    for (int i = 0; i < plens[r]; i++) sprompts[r][i] = (r * 37 + i * 11) % V;
    reqs[r] = (ct_gen_request){.prompt = sprompts[r], .prompt_len = plens[r], .n = 1, .seed = 7,
                               .sp = {0, 0, 1.0f, 0.0f, r == 1 ? 1.3f : 1.0f}, .max_new_tokens = 20 + 7 * r,
                               .stop_ids = stop_id, .n_stop_ids = stop_id ? 1 : 0};
  }
}

static void save_depths(const ct_model *m, char *dir) {
  strcpy(dir + strlen(dir) - 6, "XXXXXX");
  CHECK(mkdtemp(dir) != NULL);
  CHECK_OK(ct_mtp_save(m, m->params, dir, CT_DT_F32));
}

static void remove_depths(const char *dir) {
  char p[CT_PATH_MAX];
  snprintf(p, sizeof p, "%s/mtp.safetensors", dir);
  unlink(p);
  rmdir(dir);
}

// Random depths: almost every guess is wrong (the rejection path), output unchanged.
static void test_speculative_greedy_equals_plain_with_random_depths(void) {
  ct_tokenizer *tok;
  CHECK_OK(ct_tokenizer_bytes(&tok));
  ct_model_config c = mini_config();
  c.vocab_size = ct_tokenizer_vocab_size(tok);
  c.hidden_size = 32, c.intermediate_size = 48, c.head_dim = 8, c.max_position_embeddings = 128;
  c.mtp_layers = 2;
  ct_model m;
  CHECK_OK(ct_model_init(&m, &c, 1));
  ct_model_init_random(&m, 8, 0.4f);
  char dir[] = "/tmp/ctune-spec-XXXXXX";
  save_depths(&m, dir);
  ct_gen_request reqs[5];
  spec_requests(reqs, 256, NULL);
  ct_spec_stats st = spec_matches_plain(&m, dir, tok, reqs, 5, 96, 64, NULL);
  CHECK(st.rejected > 0);  // the rejection path was taken
  spec_matches_plain(&m, dir, tok, reqs, 5, 60, 8, NULL);  // prefills in chunks; guesses cut at the cache's end
  remove_depths(dir);
  ct_model_free(&m);
  ct_tokenizer_free(tok);
}

// Depths built to agree with the model: with o_proj and down_proj zero every layer (the
// depths' too) passes its input through, so the model's greedy token after t is f(t) =
// argmax head · norm(emb(t)), and depth k, whose eh_proj reads the embedding of token
// p + k only, guesses f(token p + k): the model's own next choice. Every guess is kept
// (the acceptance path); a small weight on the hidden-state half makes some guesses
// wrong again (a mix of both), and a stop id ends samples inside a round.
static void kept_model(ct_model *mp, const ct_tokenizer *tok) {
  ct_model_config c = mini_config();
  ct_model *m = mp;
  c.vocab_size = ct_tokenizer_vocab_size(tok);
  c.hidden_size = 32, c.intermediate_size = 48, c.head_dim = 8, c.max_position_embeddings = 128;
  c.tie_word_embeddings = false;
  c.mtp_layers = 3;
  CHECK_OK(ct_model_init(m, &c, 1));
  ct_model_init_random(m, 9, 0.5f);
  int C = c.hidden_size;
  for (int l = 0; l < c.num_layers + c.mtp_layers; l++) {
    const ct_layer_weights *L = l < c.num_layers ? &m->w.layers[l] : &m->w.mtp[l - c.num_layers].block;
    memset(L->wo, 0, sizeof(float) * C * c.num_heads * c.head_dim);
    memset(L->wdown, 0, sizeof(float) * C * c.intermediate_size);
  }
  for (int k = 0; k < c.mtp_layers; k++) {
    float *M = m->w.mtp[k].eh_proj;  // (C, 2C) = [I | 0]
    memset(M, 0, sizeof(float) * 2 * C * C);
    for (int i = 0; i < C; i++) M[(long)i * 2 * C + i] = 1;
  }
}

// The kept-guesses model's requests: spec_requests without request 1's repetition penalty
// (a penalty changes the model's choice, not the guess).
static void kept_requests(ct_gen_request *reqs) {
  spec_requests(reqs, 256, NULL);
  reqs[1].sp.repetition_penalty = 1.0f;
}

// What the speculative tests below start from: the byte tokenizer (returned), the
// kept-guesses model, its depths saved under dir (a mkdtemp template) and the five requests.
static ct_tokenizer *kept_setup(ct_model *m, char *dir, ct_gen_request *reqs) {
  ct_tokenizer *tok;
  CHECK_OK(ct_tokenizer_bytes(&tok));
  kept_model(m, tok);
  save_depths(m, dir);
  kept_requests(reqs);
  return tok;
}

static void test_speculative_greedy_equals_plain_when_guesses_are_kept(void) {
  ct_model m;
  char dir[] = "/tmp/ctune-spec-XXXXXX";
  ct_gen_request reqs[5];
  ct_tokenizer *tok = kept_setup(&m, dir, reqs);
  ct_model_config c = m.cfg;
  int C = c.hidden_size;
  ct_spec_stats st = spec_matches_plain(&m, dir, tok, reqs, 5, 96, 64, NULL);
  CHECK(st.rejected == 0 && st.accepted > 100);
  // some guesses wrong: the hidden-state half weighs in
  ct_rng r;
  ct_rng_seed(&r, 4);
  for (int k = 0; k < c.mtp_layers; k++)
    for (int i = 0; i < C; i++)
      for (int j = 0; j < C; j++) m.w.mtp[k].eh_proj[(long)i * 2 * C + C + j] = (float)(0.05 * ct_rng_normal(&r));
  remove_depths(dir);
  save_depths(&m, dir);
  results_t *res = malloc(sizeof *res);
  st = spec_matches_plain(&m, dir, tok, reqs, 5, 96, 64, res);
  CHECK(st.accepted > 10 && st.rejected > 10);
  int stop = res->ids[3][6], stopped = 0;  // a token the samples reach
  spec_requests(reqs, 256, &stop);
  spec_matches_plain(&m, dir, tok, reqs, 5, 96, 64, res);
  for (int q = 0; q < 5; q++) stopped += res->finish[q] == CT_FINISH_STOP;
  CHECK(stopped >= 1 && res->ids[3][res->len[3] - 1] == stop);
  free(res);
  remove_depths(dir);
  ct_model_free(&m);
  ct_tokenizer_free(tok);
}

// The kept-guesses model again: a stop string ends samples in the middle of a round (the
// text cut where it starts, the tokens up to the one that completed it kept), as plain
// decoding ends them; and with int8 or bf16 weights the depths run in that format, the
// output still the plain decoding's in the same format, most guesses still kept.
static void test_speculative_stop_strings_and_quantized_depths(void) {
  ct_model m;
  char dir[] = "/tmp/ctune-spec-XXXXXX";
  ct_gen_request reqs[5];
  ct_tokenizer *tok = kept_setup(&m, dir, reqs);
  results_t *res = malloc(sizeof *res);
  spec_matches_plain(&m, dir, tok, reqs, 5, 96, 64, res);
  char stop[3] = {res->text[3][7], res->text[3][8], 0};  // two bytes sample 3 reaches at 7
  int full = res->len[3];
  CHECK(full > 9 && stop[0] && stop[1]);
  const char *stops[2] = {"never in a byte model's \x01 text", stop};
  for (int r = 0; r < 5; r++) reqs[r].stop_strings = stops, reqs[r].n_stop_strings = 2;
  ct_spec_stats st = spec_matches_plain(&m, dir, tok, reqs, 5, 96, 64, res);
  CHECK(st.accepted > 50);  // (rounds did run past a single token)
  int stopped = 0;
  for (int r = 0; r < 5; r++) {
    stopped += res->finish[r] == CT_FINISH_STOP;
    CHECK(res->finish[r] != CT_FINISH_STOP || !strstr(res->text[r], stop));
  }
  CHECK(res->finish[3] == CT_FINISH_STOP && strlen(res->text[3]) <= 7 && res->len[3] < full);
  CHECK(stopped >= 1);
  kept_requests(reqs);
  st = spec_matches_plain_as(&m, dir, tok, reqs, 5, 96, 64, NULL, CT_PACK_INT8);
  CHECK(st.accepted > 100);
  if (ct_panel16_native()) {
    st = spec_matches_plain_as(&m, dir, tok, reqs, 5, 96, 64, NULL, CT_PACK_BF16);
    CHECK(st.accepted > 100);
  }
  free(res);
  remove_depths(dir);
  ct_model_free(&m);
  ct_tokenizer_free(tok);
}

// The drafting rule: depths whose guesses are kept draft every round; wrong ones stop
// drafting once 32 guesses were checked, except every 16th round (the output unchanged).
static void test_speculative_drafts_only_depths_that_pay(void) {
  ct_model m;
  char dir[] = "/tmp/ctune-spec-XXXXXX";
  ct_gen_request reqs[5];
  ct_tokenizer *tok = kept_setup(&m, dir, reqs);
  ct_spec_stats st = spec_matches_plain(&m, dir, tok, reqs, 5, 96, 64, NULL);
  CHECK(st.drafted == 3 * st.rounds && st.rejected == 0);  // all three depths, every round
  remove_depths(dir);
  ct_model_free(&m);
  ct_model_config c = mini_config();  // random depths: almost every guess wrong
  c.vocab_size = ct_tokenizer_vocab_size(tok);
  c.hidden_size = 32, c.intermediate_size = 48, c.head_dim = 8, c.max_position_embeddings = 256;
  c.mtp_layers = 2;
  CHECK_OK(ct_model_init(&m, &c, 1));
  ct_model_init_random(&m, 8, 0.4f);
  save_depths(&m, dir);
  for (int r = 0; r < 5; r++) reqs[r].max_new_tokens = 200;
  st = spec_matches_plain(&m, dir, tok, reqs, 5, 256, 64, NULL);
  // both draft in the first 32 rounds (depth 2's share has had no 32 checks: it is only
  // checked after a kept guess), then in rounds 48, 64, ...
  long want = 2 * (32 + (st.rounds - 32 + 15) / 16);
  CHECK(st.rounds > 900 && st.drafted == want);
  remove_depths(dir);
  ct_model_free(&m);
  ct_tokenizer_free(tok);
}

// The sampler's depth-1 guess after each prefix is the trained depth's argmax (the float64
// reference of the training path) at that position: the draft runs the depths as trained.
static void test_speculative_guesses_are_the_trained_depths_argmax(void) {
  ct_model_config c = mini_config();
  c.mtp_layers = 2;
  c.qk_norm = true;
  c.tie_word_embeddings = false;
  ct_model m;
  make_model(&m, c);
  batch_t b = {.B = 1, .T = 14};
  ct_rng r;
  ct_rng_seed(&r, 21);
  for (int t = 0; t < 14; t++) b.ids[t] = (int)ct_rng_below(&r, c.vocab_size), b.pos[t] = t, b.seg[t] = 0;
  for (int t = 0; t < 14; t++) b.target[t] = t + 1 < 14 ? b.ids[t + 1] : -1;
  double *P = calloc(m.n_floats, 8);
  for (long i = 0; i < m.n_floats; i++) P[i] = m.params[i];
  ref_t ref = {&m, P};
  ref_out want = ref_total(&ref, &b, 0.1);
  char dir[] = "/tmp/ctune-spec-XXXXXX";
  save_depths(&m, dir);
  ct_infer_weights w;
  ct_spec_model sm;
  ct_engine_opts o = {1, 16, 5, false};  // (prefixes run in chunks of 5)
  CHECK_OK(ct_infer_from_model(&w, &m));
  CHECK_OK(ct_infer_pack(&w, CT_PACK_F32));
  CHECK_OK(ct_spec_load(&sm, &w, dir, &o));
  int agree = 0;
  for (int p = 0; p + 2 <= 14; p++) {  // depth 1 at position p reads token p + 1
    int g[2];
    CHECK_OK(ct_spec_guess(&sm, b.ids, p + 2, g));
    agree += g[0] == want.arg1[p];
  }
  CHECK(agree == 13);
  ct_spec_free(&sm);
  ct_infer_free(&w);
  remove_depths(dir);
  free(P);
  ct_model_free(&m);
}

int main(int argc, char **argv) {
  ct_blas_init(argc, argv);
  ct_pool_init(2);
  RUN(test_targets_stay_inside_documents);
  RUN(test_layout_appends_mtp_after_the_hugging_face_tensors);
  RUN(test_mtp_safetensors_round_trip_and_refusals);
  RUN(test_lambda_changes_trunk_gradients_linearly);
  RUN(test_one_depth_llama_tied_loss_and_gradients_match_float64_reference);
  RUN(test_gemma_directional_derivatives_match_the_gradient);
  RUN(test_two_depths_qwen3_untied_loss_and_gradients_match_float64_reference);
  RUN(test_speculative_guesses_are_the_trained_depths_argmax);
  RUN(test_speculative_greedy_equals_plain_with_random_depths);
  RUN(test_speculative_greedy_equals_plain_when_guesses_are_kept);
  RUN(test_speculative_stop_strings_and_quantized_depths);
  RUN(test_speculative_drafts_only_depths_that_pay);
  return test_summary();
}
