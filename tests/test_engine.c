// engine: KV-cache decoding reproduces the training forward; packing, batching and
// slot copies change no bit of any token's result; int8 weights stay close to fp32 and
// save/load byte-exactly.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bf16.h"
#include "engine.h"
#include "forward.h"
#include "matmul.h"
#include "pool.h"
#include "rng.h"
#include "test.h"
#include "tiny_model.h"
#include "weights.h"

static const char *pack_names[] = {"rows", "fp32 panels", "bf16 panels"};

// Prefills the first P of T tokens into a slot, decodes the rest one at a time with m's
// weights packed as `pack` (kv16: keys and values cached as bf16), and compares every
// logit from position P − 1 on with the training forward's: the largest difference, and
// the largest logit into *scale.
static double decode_vs_forward(const ct_model *m, int T, int P, int pack, bool kv16, uint64_t seed, double *scale) {
  int V = m->cfg.vocab_size, ids[64], slot[64], pos[64], last = P - 1, zero = 0;
  for (int t = 0; t < T; t++) ids[t] = (int)((t * 7 + seed) % V), slot[t] = 1, pos[t] = t;
  float *want = train_logits(m, ids, T), *got = malloc(sizeof(float) * T * V);
  ct_infer_weights w;
  CHECK_OK(ct_infer_from_model(&w, m));
  CHECK_OK(ct_infer_pack(&w, pack));
  ct_engine *e;
  ct_engine_opts o = {.slots = 3, .max_len = T + 8, .max_tokens = 16, .kv_bf16 = kv16};
  CHECK_OK(ct_engine_init(&e, &w, &o));
  CHECK_OK(ct_engine_forward(e, P, ids, slot, pos, &last, 1, got + (long)(P - 1) * V));
  for (int t = P; t < T; t++) CHECK_OK(ct_engine_forward(e, 1, ids + t, slot, pos + t, &zero, 1, got + (long)t * V));
  double worst = 0;
  *scale = 0;
  for (long k = (long)(P - 1) * V; k < (long)T * V; k++) {
    worst = fmax(worst, fabs(got[k] - want[k]));
    *scale = fmax(*scale, fabs(want[k]));
  }
  free(got);
  free(want);
  ct_engine_free(e);
  ct_infer_free(&w);
  return worst;
}

static void check_decode_matches_training_forward(const char *type, int pack, bool kv16) {
  ct_model m;
  tiny_model(&m, type);
  double scale, worst = decode_vs_forward(&m, 14, 5, pack, kv16, 3, &scale);
  fprintf(stderr, "  %s, %s%s: prefill + decode vs training forward, max |logit diff| %.3g (max |logit| %.3g)\n",
          type, pack_names[pack], kv16 ? ", bf16 KV cache" : "", worst, scale);
  // fp32: runs show ~4e-6, float rounding only (5x margin). bf16: every matrix input
  // rounded to 8 significant bits (relative 2^-9 each) through every layer: runs show
  // 1.3-2.1% of the largest logit (int8: 3%); 5% bounds it. A bf16 cache with fp32
  // weights rounds only the keys and values (the same 2^-9 each, a fraction of the
  // inputs): within the same bound.
  CHECK(worst < (pack == CT_PACK_BF16 || kv16 ? 0.05 * scale : 2e-5));
  ct_model_free(&m);
}

// Every packing, with float32 and bf16 caches.
static void check_decode_all(const char *type) {
  for (int p = CT_PACK_NONE; p <= CT_PACK_BF16; p++)
    for (int kv16 = 0; kv16 <= 1; kv16++) check_decode_matches_training_forward(type, p, kv16);
}

static void test_kv_cache_decode_matches_training_forward_llama(void) { check_decode_all("llama"); }
static void test_kv_cache_decode_matches_training_forward_qwen2_bias(void) { check_decode_all("qwen2"); }
static void test_kv_cache_decode_matches_training_forward_qwen3_qk_norm(void) { check_decode_all("qwen3"); }

// Gemma 3: layer 0 slides (window 4) over 14 positions, so the window is crossed; its ring
// is max_tokens + 3 rows, longer than the 14, so rows do not wrap here (test_gemma does).
static void test_kv_cache_decode_matches_training_forward_gemma3(void) { check_decode_all("gemma3_text"); }

// A qwen3-shaped tiny model with heads of width hd, room for 64 positions.
static void wide_head_model(ct_model *m, int hd) {
  ct_model_config c = tiny_config("qwen3");
  c.head_dim = hd;
  CHECK_OK(ct_model_init(m, &c, 64));
  ct_model_init_random(m, 7, 0.3f);
}

// Heads of 64 and 128 (the vectorized attention's sizes) over 40 positions (two blocks of
// 16 and a tail): prefill + decode equal the training forward to float rounding; with a
// bf16 cache, within its rounding (check_decode_matches_training_forward's bound).
static void test_wide_head_attention_matches_training_forward(void) {
  for (int hd = 64; hd <= 128; hd *= 2)
    for (int kv16 = 0; kv16 <= 1; kv16++) {
      ct_model m;
      wide_head_model(&m, hd);
      double scale, worst = decode_vs_forward(&m, 40, 3, CT_PACK_F32, kv16, 5, &scale);
      fprintf(stderr, "  head_dim %d, 40 positions%s: max |logit diff| %.3g (max |logit| %.3g)\n", hd,
              kv16 ? ", bf16 KV cache" : "", worst, scale);
      CHECK(worst < (kv16 ? 0.05 * scale : 1e-5 * fmax(1, scale)));
      ct_model_free(&m);
    }
}

// Two prompts prefilled in one packed pass give bit-identical logits and caches to two
// separate prefills; a decode step of one slot alone equals the same slot decoded next
// to others; a copied slot decodes exactly like its source.
static void check_packing_batching_and_slot_copies_change_no_bit(int pack, bool kv16) {
  ct_model m;
  tiny_model(&m, "qwen2");
  int V = m.cfg.vocab_size;
  ct_infer_weights w;
  CHECK_OK(ct_infer_from_model(&w, &m));
  CHECK_OK(ct_infer_pack(&w, pack));
  ct_engine_opts o = {.slots = 4, .max_len = 32, .max_tokens = 16, .kv_bf16 = kv16};
  ct_engine *packed, *alone;
  CHECK_OK(ct_engine_init(&packed, &w, &o));
  CHECK_OK(ct_engine_init(&alone, &w, &o));
  int a[6] = {1, 2, 3, 4, 5, 6}, b[4] = {9, 8, 7, 6};
  int ids[10], slot[10], pos[10], outs[2] = {5, 9};
  for (int i = 0; i < 6; i++) ids[i] = a[i], slot[i] = 0, pos[i] = i;
  for (int i = 0; i < 4; i++) ids[6 + i] = b[i], slot[6 + i] = 1, pos[6 + i] = i;
  float *lp = malloc(sizeof(float) * 2 * V), *la = malloc(sizeof(float) * 2 * V);
  CHECK_OK(ct_engine_forward(packed, 10, ids, slot, pos, outs, 2, lp));
  int last = 5;
  CHECK_OK(ct_engine_forward(alone, 6, ids, slot, pos, &last, 1, la));
  last = 3;
  CHECK_OK(ct_engine_forward(alone, 4, ids + 6, slot + 6, pos + 6, &last, 1, la + V));
  CHECK(memcmp(lp, la, sizeof(float) * 2 * V) == 0);
  // decode: slot 0 next to slot 1 (packed engine) vs slot 0 alone (other engine)
  int two_ids[2] = {11, 12}, two_slot[2] = {0, 1}, two_pos[2] = {6, 4}, both[2] = {0, 1}, zero = 0;
  CHECK_OK(ct_engine_forward(packed, 2, two_ids, two_slot, two_pos, both, 2, lp));
  CHECK_OK(ct_engine_forward(alone, 1, two_ids, two_slot, two_pos, &zero, 1, la));
  CHECK(memcmp(lp, la, sizeof(float) * V) == 0);
  // copy slot 1 of `alone` (6 cached positions now? no: 4 + the step above wrote none) to 3
  CHECK_OK(ct_engine_copy_slot(alone, 0, 3, 7));
  int s0 = 0, s3 = 3, p7 = 7, t = 13;
  CHECK_OK(ct_engine_forward(alone, 1, &t, &s0, &p7, &zero, 1, la));
  CHECK_OK(ct_engine_forward(alone, 1, &t, &s3, &p7, &zero, 1, la + V));
  CHECK(memcmp(la, la + V, sizeof(float) * V) == 0);
  // out-of-range positions, slots and ids are errors
  int big = 32, bad_slot = 4, bad_id = V;
  CHECK(ct_engine_forward(alone, 1, &t, &s0, &big, &zero, 1, la) == CT_EINVAL);
  CHECK(ct_engine_forward(alone, 1, &t, &bad_slot, &p7, &zero, 1, la) == CT_EINVAL);
  ct_set_error(CT_OK, "%s", "");  // a stale message cannot satisfy the check below
  CHECK(ct_engine_forward(alone, 1, &bad_id, &s0, &p7, &zero, 1, la) == CT_EINVAL);
  CHECK(strstr(ct_last_error(), "vocabulary") != NULL);
  free(lp);
  free(la);
  ct_engine_free(packed);
  ct_engine_free(alone);
  ct_infer_free(&w);
  ct_model_free(&m);
}

static void test_packing_batching_and_slot_copies_change_no_bit(void) {
  for (int p = CT_PACK_NONE; p <= CT_PACK_BF16; p++)
    for (int kv16 = 0; kv16 <= 1; kv16++) check_packing_batching_and_slot_copies_change_no_bit(p, kv16);
}

// Two prompts (40 and 21 tokens) prefilled in one pass — each cut into units of up to 16
// tokens whose queries share the key blocks, scores over the unit's furthest position —
// give every position's logits bit-identical to decoding each prompt one token at a time.
static void check_prefill_equals_decode(const ct_model *m, const char *what, bool kv16) {
  enum { NA = 40, NB = 21, N = NA + NB };
  int V = m->cfg.vocab_size, ids[N], slot[N], pos[N], outs[N], zero = 0;
  for (int i = 0; i < N; i++) {
    ids[i] = (i * 11 + 5) % V, slot[i] = i < NA ? 0 : 1, pos[i] = i < NA ? i : i - NA, outs[i] = i;
  }
  ct_infer_weights w;
  CHECK_OK(ct_infer_from_model(&w, m));
  CHECK_OK(ct_infer_pack(&w, CT_PACK_F32));
  ct_engine_opts o = {.slots = 2, .max_len = 45, .max_tokens = 64, .kv_bf16 = kv16};  // key blocks of 16, 16, 13 rows
  ct_engine *pre, *dec;
  CHECK_OK(ct_engine_init(&pre, &w, &o));
  CHECK_OK(ct_engine_init(&dec, &w, &o));
  float *lp = malloc(sizeof(float) * N * V), *ld = malloc(sizeof(float) * N * V);
  CHECK_OK(ct_engine_forward(pre, N, ids, slot, pos, outs, N, lp));
  for (int i = 0; i < N; i++) CHECK_OK(ct_engine_forward(dec, 1, ids + i, slot + i, pos + i, &zero, 1, ld + (long)i * V));
  int same = 0;
  for (int i = 0; i < N; i++) same += !memcmp(lp + (long)i * V, ld + (long)i * V, sizeof(float) * V);
  fprintf(stderr, "  %s%s: %d of %d positions' logits bit-identical, prefilled vs decoded\n", what,
          kv16 ? " (bf16 KV cache)" : "", same, N);
  CHECK(same == N);
  free(lp), free(ld);
  ct_engine_free(pre), ct_engine_free(dec);
  ct_infer_free(&w);
}

// Heads of 8 and 10 (blocks of any width), 64 and 128 (the AVX-512 sizes), and Gemma 3's
// sliding layer (a window of 4: scores from an unaligned row of a key block).
static void test_prefill_equals_token_by_token_decode(void) {
  const char *types[] = {"llama", "qwen3", "gemma3_text"};
  for (int t = 0; t < 3; t++) {
    ct_model m;
    tiny_model(&m, types[t]);
    for (int kv16 = 0; kv16 <= 1; kv16++) check_prefill_equals_decode(&m, types[t], kv16);
    ct_model_free(&m);
  }
  for (int hd = 64; hd <= 128; hd *= 2) {
    ct_model m;
    wide_head_model(&m, hd);
    for (int kv16 = 0; kv16 <= 1; kv16++) check_prefill_equals_decode(&m, hd == 64 ? "head_dim 64" : "head_dim 128", kv16);
    ct_model_free(&m);
  }
}

// Greedy continuations of the same start token by weights a and b, each on its own
// continuation: the share of agreeing tokens, and the largest logit difference (and
// logit) while every token so far agreed.
static int greedy_agreement(const ct_infer_weights *wa, const ct_infer_weights *wb, int steps, double *worst,
                            double *scale) {
  int V = wa->cfg.vocab_size;
  ct_engine_opts o = {.slots = 1, .max_len = 40, .max_tokens = 8};
  ct_engine *ea, *eb;
  CHECK_OK(ct_engine_init(&ea, wa, &o));
  CHECK_OK(ct_engine_init(&eb, wb, &o));
  float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
  int ta = 3, tb = 3, agree = 0, zero = 0;
  bool prefix = true;  // the two continuations have agreed on every token so far
  *worst = *scale = 0;
  for (int p = 0; p < steps; p++) {
    CHECK_OK(ct_engine_forward(ea, 1, &ta, &zero, &p, &zero, 1, la));
    CHECK_OK(ct_engine_forward(eb, 1, &tb, &zero, &p, &zero, 1, lb));
    int aa = 0, ab = 0;
    for (int v = 1; v < V; v++) {
      aa = la[v] > la[aa] ? v : aa;
      ab = lb[v] > lb[ab] ? v : ab;
    }
    if (prefix)  // the same context (the whole prefix, not only the last token): compare
      for (int v = 0; v < V; v++) {
        *worst = fmax(*worst, fabs(la[v] - lb[v]));
        *scale = fmax(*scale, fabs(la[v]));
      }
    agree += aa == ab;
    prefix &= aa == ab;
    ta = aa;
    tb = ab;
  }
  free(la);
  free(lb);
  ct_engine_free(ea);
  ct_engine_free(eb);
  return agree;
}

// w against fp32's wf over 30 greedy steps (printed as `what`): at least tenths/10 of the
// tokens agree, and every logit is within 5% of the largest of them.
static void check_tracks_fp32(const ct_infer_weights *wf, const ct_infer_weights *w, const char *what, int tenths) {
  double worst, scale;
  int steps = 30, agree = greedy_agreement(wf, w, steps, &worst, &scale);
  fprintf(stderr, "  %s vs fp32: greedy tokens agree %d/%d, max |logit diff| %.3g (max |logit| %.3g)\n",
          what, agree, steps, worst, scale);
  CHECK(agree >= steps * tenths / 10);
  CHECK(worst < 0.05 * scale);
}

// bf16 panels: greedy continuations agree with fp32, logits within bf16 rounding.
static void test_bf16_tracks_fp32(void) {
  ct_model m;
  tiny_model(&m, "llama");
  ct_infer_weights wf, wb;
  CHECK_OK(ct_infer_from_model(&wf, &m));
  CHECK_OK(ct_infer_from_model(&wb, &m));
  CHECK_OK(ct_infer_pack(&wb, CT_PACK_BF16));
  check_tracks_fp32(&wf, &wb, "bf16", 9);
  ct_infer_free(&wf);
  ct_infer_free(&wb);
  ct_model_free(&m);
}

// A model stored in bf16 (a LoRA base with base_dtype bfloat16) serves exactly as the fp32
// model holding the same values: packed into fp32 panels (widened) or bf16 panels (copied),
// with its embedding kept float32 or not; unpacked it is refused.
static void test_bf16_stored_model_serves_as_its_values(void) {
  for (int keep = 0; keep < 2; keep++)
    for (int pack = CT_PACK_F32; pack <= CT_PACK_BF16; pack++) {
      ct_model mf, mb;
      tiny_model(&mf, "qwen2");
      for (long i = 0; i < mf.n_floats; i++) mf.params[i] = ct_bf16_to_f32(ct_f32_to_bf16(mf.params[i]));
      tiny_model(&mb, "qwen2");
      for (long i = 0; i < mb.n_floats; i++) mb.params[i] = mf.params[i];
      CHECK_OK(ct_model_to_bf16(&mb, keep));
      CHECK(!mb.params && mb.params16);
      ct_infer_weights wf, wb;
      CHECK_OK(ct_infer_from_model(&wf, &mf));
      CHECK_OK(ct_infer_from_model(&wb, &mb));
      if (keep == 0 && pack == CT_PACK_F32) CHECK(ct_infer_pack(&wb, CT_PACK_NONE) != 0);
      CHECK_OK(ct_infer_pack(&wf, pack));
      CHECK_OK(ct_infer_pack(&wb, pack));
      double worst, scale;
      int steps = 20, agree = greedy_agreement(&wf, &wb, steps, &worst, &scale);
      CHECK(agree == steps && worst == 0);
      ct_infer_free(&wf);
      ct_infer_free(&wb);
      ct_model_free(&mf);
      ct_model_free(&mb);
    }
}

// int8: logits close to fp32, greedy continuations mostly agree; save -> load keeps
// every int8 byte and scale, and the reloaded model computes identical logits.
static void test_int8_tracks_fp32_and_round_trips_byte_exact(void) {
  ct_model m;
  tiny_model(&m, "llama");
  int V = m.cfg.vocab_size;
  ct_infer_weights wf, wq, wl;
  CHECK_OK(ct_infer_from_model(&wf, &m));
  CHECK_OK(ct_infer_quantize(&wq, &m));
  check_tracks_fp32(&wf, &wq, "int8", 8);
  ct_engine_opts o = {.slots = 1, .max_len = 40, .max_tokens = 8};
  ct_engine *eq;
  CHECK_OK(ct_engine_init(&eq, &wq, &o));
  float *lq = malloc(sizeof(float) * V);
  int zero = 0;
  char dir[] = "/tmp/ct_test_int8_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  CHECK_OK(ct_infer_save_int8(&wq, dir, NULL));
  CHECK_OK(ct_infer_load(&wl, dir, false));  // an int8 directory loads as int8
  CHECK(wl.int8);
  int same = 0;
  for (int i = 0; i < wq.layout.n_tensors; i++) {
    const ct_tensor_info *ti = &wq.layout.tensors[i];
    if (ti->ndim == 2) same += memcmp(wl.qmem + ti->offset, wq.qmem + ti->offset, (size_t)ti->numel) == 0;
    else same++;
  }
  CHECK(same == wq.layout.n_tensors);
  long ns = wq.soff[wq.layout.n_tensors - 1] + wq.layout.tensors[wq.layout.n_tensors - 1].numel;
  CHECK(memcmp(wl.smem, wq.smem, sizeof(float) * ns) == 0);
  ct_engine *el;
  CHECK_OK(ct_engine_init(&el, &wl, &o));
  float *ll = malloc(sizeof(float) * V);
  int t = 3, p = 0;
  CHECK_OK(ct_engine_forward(el, 1, &t, &zero, &p, &zero, 1, ll));
  CHECK_OK(ct_engine_forward(eq, 1, &t, &zero, &p, &zero, 1, lq));
  CHECK(memcmp(ll, lq, sizeof(float) * V) == 0);
  // packed into int8 panels (exact integer sums either way): the same logits, and a packed
  // model refuses to be saved
  ct_engine_free(el);
  CHECK_OK(ct_infer_pack(&wl, CT_PACK_INT8));
  CHECK(wl.layers[0].gu.p8 && !wl.layers[0].gu.q);
  CHECK_OK(ct_engine_init(&el, &wl, &o));
  CHECK_OK(ct_engine_forward(el, 1, &t, &zero, &p, &zero, 1, ll));
  CHECK(memcmp(ll, lq, sizeof(float) * V) == 0);
  CHECK(ct_infer_save_int8(&wl, dir, NULL) == CT_EINVAL);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
  free(lq); free(ll);
  ct_engine_free(eq); ct_engine_free(el);
  ct_infer_free(&wf); ct_infer_free(&wq); ct_infer_free(&wl);
  ct_model_free(&m);
}

int main(int argc, char **argv) {
  ct_blas_init(argc, argv);
  ct_pool_init(2);
  RUN(test_kv_cache_decode_matches_training_forward_llama);
  RUN(test_kv_cache_decode_matches_training_forward_qwen2_bias);
  RUN(test_kv_cache_decode_matches_training_forward_qwen3_qk_norm);
  RUN(test_kv_cache_decode_matches_training_forward_gemma3);
  RUN(test_wide_head_attention_matches_training_forward);
  RUN(test_packing_batching_and_slot_copies_change_no_bit);
  RUN(test_prefill_equals_token_by_token_decode);
  RUN(test_bf16_tracks_fp32);
  RUN(test_bf16_stored_model_serves_as_its_values);
  RUN(test_int8_tracks_fp32_and_round_trips_byte_exact);
  return test_summary();
}
