// frozen: the forward-only model behind DPO's and GRPO's reference and distillation's
// teacher — float32 or bfloat16 through the training forward (no activations kept), int8
// through the inference engine. It has no backward and never writes its weights.
#include "frozen.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "hash.h"
#include "hf.h"
#include "lm.h"
#include "matmul.h"
#include "mem.h"

static ct_engine_opts engine_opts(int B, int T) { return (ct_engine_opts){B, T, B * T, false}; }

double ct_frozen_bytes(const ct_model_config *c, int dtype, int B, int T) {
  if (dtype == CT_STORE_INT8) {
    ct_engine_opts eo = engine_opts(B, T);
    return ct_infer_int8_bytes(c) + ct_engine_bytes(c, &eo) + 3.0 * sizeof(int) * B * T;
  }
  ct_model lay;
  if (ct_model_layout(&lay, c)) return 0;
  double b = (dtype == CT_STORE_BF16 ? ct_model_bf16_bytes(&lay, false) : ct_model_param_bytes(&lay, false)) +
             ct_acts_bytes(c, B, T, CT_ACTS_FORWARD);
  ct_model_free(&lay);
  return b;
}

// The engine pass of the int8 path: one slot per row, N tokens.
// The int8 path's engine and its index arrays, freed (engine_init makes them).
static void engine_release(ct_frozen *f) {
  ct_engine_free(f->engine);
  ct_free_all(f->slot, f->pos, f->outs);
  f->engine = NULL;
  f->slot = f->pos = f->outs = NULL;
}

static int engine_init(ct_frozen *f) {
  long N = (long)f->B * f->T;
  ct_engine_opts eo = engine_opts(f->B, f->T);
  f->slot = malloc(sizeof(int) * N);
  f->pos = malloc(sizeof(int) * N);
  f->outs = malloc(sizeof(int) * N);
  if (!f->slot || !f->pos || !f->outs) return ct_set_error(CT_ENOMEM, "frozen model: out of memory");
  return ct_engine_init(&f->engine, &f->iw, &eo);
}

int ct_frozen_init(ct_frozen *f, ct_model *m, int dtype, int B, int T) {
  memset(f, 0, sizeof *f);
  f->dtype = dtype;
  f->cfg = m->cfg;
  f->B = B;
  f->T = T;
  f->model = *m;  // ownership moves here
  memset(m, 0, sizeof *m);
  int rc;
  if (dtype == CT_STORE_INT8) {
    rc = ct_infer_quantize(&f->iw, &f->model);
    ct_model_free(&f->model);  // the int8 copy is all that is needed
    if (!rc) rc = engine_init(f);
  } else {
    rc = ct_model_rope_reserve(&f->model, T);
    if (!rc) rc = ct_acts_init(&f->acts, &f->model, B, T, CT_ACTS_FORWARD);
    if (!rc && dtype == CT_STORE_BF16) rc = ct_model_to_bf16(&f->model, false);
    else if (!rc) rc = ct_infer_from_model(&f->iw, &f->model);
  }
  if (rc) ct_frozen_free(f);
  return rc;
}

int ct_frozen_open(ct_frozen *f, const char *dir, int dtype, int B, int T) {
  memset(f, 0, sizeof *f);
  if (dtype != CT_STORE_INT8) {
    ct_model m;
    int rc = ct_model_load(&m, dir, T);
    if (!rc && m.cfg.num_labels > 0) {
      ct_model_free(&m);
      return ct_set_error(CT_EINVAL, "%s is a reward model (*ForSequenceClassification): a reference or teacher "
                          "must be a causal language model", dir);
    }
    return rc ? rc : ct_frozen_init(f, &m, dtype, B, T);
  }
  // int8: the engine's loader reads a ctune int8 directory as it is, or quantizes a
  // full-precision one without keeping its float32 matrices.
  f->dtype = dtype;
  f->B = B;
  f->T = T;
  int rc = ct_infer_load(&f->iw, dir, true);
  if (!rc) {
    f->cfg = f->iw.cfg;
    rc = engine_init(f);
  }
  if (rc) ct_frozen_free(f);
  return rc;
}

// f's forward activations allocated again for rows of T tokens (after a change of T or of
// the model's compute dtype).
static int acts_again(ct_frozen *f, int T) {
  ct_acts_free(&f->acts);
  int rc = ct_acts_init(&f->acts, &f->model, f->B, T, CT_ACTS_FORWARD);
  return rc ? rc : ct_acts_long_rows(&f->acts, &f->model, f->row_T);
}

int ct_frozen_long_rows(ct_frozen *f, int T_row) {
  if (f->view || f->dtype == CT_STORE_INT8) return 0;
  f->row_T = T_row;
  return ct_acts_long_rows(&f->acts, &f->model, T_row);
}

int ct_frozen_reserve(ct_frozen *f, int T) {
  if (T <= f->T) return 0;
  if (f->view) return ct_set_error(CT_EINVAL, "frozen model: cannot grow a view's buffers");
  if (f->dtype == CT_STORE_INT8) {  // a new engine for rows of T; the int8 weights stay
    engine_release(f);
    f->T = T;
    int rc = engine_init(f);
    if (rc) f->T = 0;  // no engine: any later batch must fail, not find a NULL one
    return rc;
  }
  int rc = ct_model_rope_reserve(&f->model, T);
  if (rc) return rc;
  if ((rc = acts_again(f, T))) return rc;
  f->T = T;
  return 0;
}

int ct_frozen_view(ct_frozen *f, const ct_model *m, int B, int T) {
  memset(f, 0, sizeof *f);
  f->view = true;
  f->dtype = m->params16 ? CT_STORE_BF16 : CT_STORE_F32;  // (an int8 LoRA base runs this path too)
  f->cfg = m->cfg;
  f->B = B;
  f->T = T;
  f->model = *m;  // shares every buffer; the rope table must already cover T
  if (m->rope_max_pos < T)
    return ct_set_error(CT_EINVAL, "frozen view: the model's RoPE table covers %d positions, not %d",
                        m->rope_max_pos, T);
  int rc = B > 0 ? ct_acts_init(&f->acts, &f->model, B, T, CT_ACTS_FORWARD) : 0;
  if (rc) memset(f, 0, sizeof *f);
  return rc;
}

void ct_frozen_through(ct_frozen *f, const ct_acts *a) {
  if (!f->view) return;
  if (!f->borrowed) ct_acts_free(&f->acts);
  // a's storage read as a forward-only pass: one slot per layer buffer and the residual
  // updated in place fit inside what any mode allocated for the same B x T
  f->acts = *a;
  f->acts.mode = CT_ACTS_FORWARD;
  f->acts.keep = false;
  f->acts.lora = NULL;
  f->acts.lora_mem = NULL;
  f->acts.qk_max = NULL;
  f->acts.grad_ready = NULL;
  f->acts.mtp = NULL;
  f->acts.dx_top = NULL;
  f->borrowed = true;
  f->B = a->B;
  f->T = a->T;
}

void ct_frozen_free(ct_frozen *f) {
  if (f->view) {  // the buffers are the model's
    if (!f->borrowed) ct_acts_free(&f->acts);
    memset(f, 0, sizeof *f);
    return;
  }
  engine_release(f);
  ct_infer_free(&f->iw);
  ct_acts_free(&f->acts);
  ct_model_free(&f->model);
  memset(f, 0, sizeof *f);
}

float *ct_frozen_params(ct_frozen *f) { return f->dtype == CT_STORE_F32 ? f->model.params : NULL; }

void ct_frozen_params_changed(ct_frozen *f) {
  if (f->dtype == CT_STORE_F32 && !f->view) ct_model_bf16_refresh(&f->model);
}

double ct_frozen_bf16_bytes(const ct_model_config *c, int dtype, int B, int T) {
  if (dtype == CT_STORE_INT8) return 0;
  ct_model lay;
  if (ct_model_layout(&lay, c)) return 0;
  double b = (dtype == CT_STORE_F32 ? ct_model_param_bytes(&lay, true) : 0) + ct_acts_bf16_bytes(c, B, T);
  ct_model_free(&lay);
  return b;
}

int ct_frozen_compute_bf16(ct_frozen *f) {
  if (f->dtype == CT_STORE_INT8 || f->view || f->model.compute16) return 0;  // a view shares the policy's
  int rc = ct_model_bf16_compute(&f->model);
  if (rc) return rc;
  return acts_again(f, f->T);  // now with the bf16 inputs of the matmuls
}

uint64_t ct_frozen_checksum(const ct_frozen *f) {
  if (f->dtype != CT_STORE_INT8) return ct_model_checksum(&f->model);
  // the engine's int8 weights: the matrices, then their row scales and the vectors (smem,
  // laid out as ct_model_to_int8's s8)
  const ct_model *lay = &f->iw.layout;
  const ct_tensor_info *t = &lay->tensors[lay->n_tensors - 1];
  long smem = f->iw.soff[lay->n_tensors - 1] + (t->ndim == 2 ? t->shape[0] : t->numel);
  uint64_t h = ct_xxh64_blocks(f->iw.qmem, (size_t)lay->n_floats, 0);
  return ct_xxh64_blocks(f->iw.smem, sizeof(float) * smem, h);
}

// int8: one engine pass over b (row i in slot i), the final hidden states of the target
// tokens into out.
static int engine_hidden(ct_frozen *f, const ct_batch *b, float *out) {
  int N = b->B * b->T, n = 0;
  if (b->B > f->B || b->T > f->T)
    return ct_set_error(CT_EINVAL, "batch of %d x %d tokens exceeds the frozen model's %d x %d",
                        b->B, b->T, f->B, f->T);
  for (int i = 0; i < N; i++) {
    f->slot[i] = i / b->T;
    f->pos[i] = i % b->T;
    if (b->target[i] >= 0) f->outs[n++] = i;
  }
  int rc = ct_engine_forward_hidden(f->engine, N, b->ids, f->slot, f->pos, f->outs, n, out);
  return rc ? rc : n;
}

int ct_frozen_hidden(ct_frozen *f, const ct_batch *b, float *out) {
  if (f->dtype == CT_STORE_INT8) return engine_hidden(f, b, out);
  int rc = ct_forward_batch(&f->model, &f->acts, b);
  if (rc) return rc;
  int N = b->B * b->T, n = 0, C = f->cfg.hidden_size;
  for (int i = 0; i < N; i++)
    if (b->target[i] >= 0) memcpy(out + (long)n++ * C, f->acts.lnf + (long)i * C, sizeof(float) * C);
  return n;
}

void ct_frozen_logits(const ct_frozen *f, const float *hidden, int n, int v0, int nv, float *out) {
  int C = f->cfg.hidden_size;
  if (f->dtype != CT_STORE_INT8) {
    ct_model_logits(&f->model, hidden, n, v0, nv, out);
    return;
  }
  const ct_linear *h = &f->iw.lm_head;  // rows [v0, v0 + nv) of the int8 head
  ct_linear part = {.rows = nv, .cols = h->cols, .q = h->q + (long)v0 * h->cols, .scale = h->scale + v0,
                    .rowsum = h->rowsum + v0};
  ct_linear_forward(&part, hidden, C, n, out, nv, 0);
}

static void logits_fn(void *ctx, const float *hidden, int n, int v0, int nv, float *out) {
  ct_frozen_logits(ctx, hidden, n, v0, nv, out);
}

int ct_frozen_logps(ct_frozen *f, const ct_batch *b, ct_head *h) {
  // float32: exactly the policy's path (ct_lm_forward), so equal weights give equal log-probs
  if (f->dtype != CT_STORE_INT8) return ct_lm_forward(&f->model, &f->acts, h, b);
  if (b->B * b->T > h->cap)
    return ct_set_error(CT_EINVAL, "LM head: %d tokens exceed the %d rows it was sized for",
                        b->B * b->T, h->cap);
  int n = engine_hidden(f, b, h->hc);
  if (n < 0) return n;
  ct_head_adopt(h, b->target, b->B * b->T);
  ct_head_forward_fn(h, logits_fn, f);
  return n;
}
