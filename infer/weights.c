// weights: the engine's view of a model — fp32 views of training parameters, int8
// quantization of them, and ctune's int8 model directory format (save and load).
#include "weights.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "bf16.h"
#include "fs.h"
#include "error.h"
#include "hf.h"
#include "hfjson.h"
#include "mem.h"
#include "panel.h"
#include "pool.h"
#include "safetensors.h"
#include "thin.h"

#define QUANT_METHOD "ctune-int8"

// Walks the tensor table in layout order (as ct_weights_bind does) and points the
// engine's matrices and vectors at fp32 (f32 != NULL), bf16 matrices (b16 != NULL; the
// vectors in smem) or int8 + scale storage.
static int bind(ct_infer_weights *w, const ct_model *lay, const float *f32, const uint16_t *b16,
                const int8_t *q, const float *smem, const int32_t *rmem, const long *soff) {
  const ct_model_config *c = &lay->cfg;
  w->cfg = *c;
  w->layers = calloc(c->num_layers, sizeof *w->layers);
  if (!w->layers) return ct_set_error(CT_ENOMEM, "sampler: out of memory");
  int i = 0;
#define MAT(rows_)                                                                       \
  (f32   ? (ct_linear){.rows = (int)(rows_), .cols = (int)lay->tensors[i].shape[1],         \
                       .f32 = f32 + lay->tensors[i].offset}                                \
   : b16 ? (ct_linear){.rows = (int)(rows_), .cols = (int)lay->tensors[i].shape[1],         \
                       .b16 = b16 + lay->tensors[i].offset}                                \
         : (ct_linear){.rows = (int)(rows_), .cols = (int)lay->tensors[i].shape[1],         \
                       .q = q + lay->tensors[i].offset, .scale = smem + soff[i], .rowsum = rmem + soff[i]})
#define VEC() (f32 ? f32 + lay->tensors[i].offset : smem + soff[i])
  long C = c->hidden_size, F = c->intermediate_size;
  long QKV = (long)(c->num_heads + 2 * c->num_kv_heads) * c->head_dim;
  w->embed = MAT(c->vocab_size);
  i++;
  for (int l = 0; l < c->num_layers; l++) {
    ct_infer_layer *L = &w->layers[l];
    L->ln1 = VEC();
    i++;
    L->qkv = MAT(QKV);
    i += 3;
    if (c->qkv_bias) {
      L->bqkv = VEC();
      i += 3;
    }
    if (c->qk_norm) {
      L->qnorm = VEC();
      i++;
      L->knorm = VEC();
      i++;
    }
    L->o = MAT(C);
    i++;
    if (c->gemma) {
      L->post_attn = VEC();
      i++;
    }
    L->ln2 = VEC();
    i++;
    if (c->gemma) {
      L->post_ff = VEC();
      i++;
    }
    L->gu = MAT(2 * F);
    i += 2;
    L->down = MAT(C);
    i++;
  }
  w->norm = VEC();
  i++;
  w->lm_head = c->tie_word_embeddings ? w->embed : MAT(c->vocab_size);
#undef MAT
#undef VEC
  return 0;
}

int ct_infer_attach_lora(ct_infer_weights *w, const ct_lora *lo) {
  if (lo && (lo->embed || lo->head) && w->int8)
    return ct_set_error(CT_EINVAL, "sampler: adapters with modules_to_save need float32 weights");
  if (lo && (lo->embed || lo->head) && w->packed)
    return ct_set_error(CT_EINVAL, "sampler: attach adapters with modules_to_save before packing the weights");
  w->lora = lo;
  if (lo && lo->embed) w->embed.f32 = lo->embed;
  if (lo && lo->head) w->lm_head.f32 = lo->head;
  return 0;
}

// ---------------------------------------------------------------------------
// Panels

// Whether two matrices are the same storage (a tied head is the embedding).
static bool same_matrix(const ct_linear *a, const ct_linear *b) { return a->f32 == b->f32 && a->b16 == b->b16; }

// The distinct matrices the engine multiplies by (a tied head is the embedding), minus
// modules_to_save copies; returns how many were written to out.
static int pack_list(ct_infer_weights *w, ct_linear **out) {
  int n = 0;
  const ct_lora *lo = w->lora;
  if (!(lo && lo->embed)) out[n++] = &w->embed;
  if (!(lo && lo->head) && !same_matrix(&w->lm_head, &w->embed)) out[n++] = &w->lm_head;
  for (int l = 0; l < w->cfg.num_layers; l++) {
    ct_infer_layer *L = &w->layers[l];
    out[n++] = &L->qkv, out[n++] = &L->o, out[n++] = &L->gu, out[n++] = &L->down;
  }
  return n;
}

static long pack_size(const ct_linear *L, int mode) {
  return mode == CT_PACK_BF16 ? 2 * ct_panel16_size(L->rows, L->cols + L->ext) : 4L * L->rows * L->cols;
}

// Extension columns (linear.h) of layer l's matrix that holds LoRA targets [t0, t1] in bf16
// panels: 16 per target, rounded up to 32 where the products run on AMX (its k step), when
// any of them has an adapter at thin.h's rank; else 0.
static int lora_ext(const ct_infer_weights *w, int l, int t0, int t1) {
  const ct_lora *lo = w->lora;
  if (!lo || !ct_thin_takes(lo->cfg.r)) return 0;
  bool any = false;
  for (int t = t0; t <= t1; t++) any |= lo->w[l][t].A != NULL;
  int step = ct_amx_ready() ? 32 : CT_THIN_R;
  return any ? (CT_THIN_R * (t1 - t0 + 1) + step - 1) / step * step : 0;
}

double ct_infer_lora_ext_bytes(const ct_model_config *c) {
  long C = c->hidden_size, F = c->intermediate_size, hd = c->head_dim;
  long QKV = (c->num_heads + 2L * c->num_kv_heads) * hd;
  return 2.0 * c->num_layers * (QKV * 64 + C * 32 + 2 * F * 32 + C * 32);
}

double ct_infer_pack_bytes(const ct_model_config *c, int mode) {
  if (mode == CT_PACK_NONE) return 0;
  long C = c->hidden_size, F = c->intermediate_size, hd = c->head_dim;
  long QKV = (c->num_heads + 2L * c->num_kv_heads) * hd, Hd = (long)c->num_heads * hd;
  ct_linear m[5] = {{.rows = c->vocab_size, .cols = (int)C}, {.rows = (int)QKV, .cols = (int)C},
                    {.rows = (int)C, .cols = (int)Hd}, {.rows = (int)(2 * F), .cols = (int)C},
                    {.rows = (int)C, .cols = (int)F}};
  double b = (c->tie_word_embeddings ? 1 : 2) * (double)pack_size(&m[0], mode);
  for (int i = 1; i < 5; i++) b += (double)c->num_layers * pack_size(&m[i], mode);
  return b;
}

typedef struct {
  const ct_linear *L;
  void *dst;       // the packed matrix (a copy), or NULL: in place
  float *scratch;  // in place: one panel per thread
  int mode, parts;
} pack_job;

// Panels [p0, p1) of one matrix: rows [32p0, 32p1) pack into the same span of panels.
static void pack_task(void *ctx, int part, int thread) {
  const pack_job *j = ctx;
  const ct_linear *L = j->L;
  long p0, p1, K = L->cols, K2 = (K + L->ext + 1) / 2;
  ct_chunk_range((L->rows + CT_PANEL - 1) / CT_PANEL, 1, j->parts, part, &p0, &p1);
  if (p1 <= p0) return;
  int r0 = (int)(p0 * CT_PANEL), rows = (int)((p1 * CT_PANEL < L->rows ? p1 * CT_PANEL : L->rows) - r0);
  if (L->b16) {  // bf16 rows: copied into bf16 panels, or widened panel by panel
    const uint16_t *s16 = L->b16 + (long)r0 * K;
    if (j->mode == CT_PACK_BF16) {
      ct_panel_pack16_from16_ext(s16, rows, (int)K, L->ext, (uint16_t *)j->dst + (long)r0 * 2 * K2);
      return;
    }
    float *tmp = j->scratch + (long)thread * CT_PANEL * K;
    for (int p = 0; p * CT_PANEL < rows; p++) {
      int w = rows - p * CT_PANEL < CT_PANEL ? rows - p * CT_PANEL : CT_PANEL;
      ct_bf16_widen(tmp, s16 + (long)p * CT_PANEL * K, (long)w * K);
      ct_panel_pack(tmp, w, (int)K, (float *)j->dst + ((long)r0 + (long)p * CT_PANEL) * K);
    }
    return;
  }
  const float *src = L->f32 + (long)r0 * K;
  if (j->mode == CT_PACK_BF16)
    ct_panel_pack16_ext(src, rows, (int)K, L->ext, (uint16_t *)j->dst + (long)r0 * 2 * K2);
  else if (j->dst)
    ct_panel_pack(src, rows, (int)K, (float *)j->dst + (long)r0 * K);
  else
    ct_panel_pack_inplace((float *)src, rows, (int)K, j->scratch + (long)thread * CT_PANEL * K);
}

// int8: in place, each matrix whose width is a multiple of 4.
static int pack_int8(ct_infer_weights *w) {
  if (w->packed) return 0;
  ct_linear *list[4 * w->cfg.num_layers + 2];
  int n = pack_list(w, list);
  long maxK = 0;
  for (int i = 0; i < n; i++) maxK = list[i]->cols > maxK ? list[i]->cols : maxK;
  int8_t *scratch = malloc((size_t)CT_PANEL * maxK);
  if (!scratch) return ct_set_error(CT_ENOMEM, "sampler: out of memory packing the weights");
  bool tied = w->lm_head.q == w->embed.q;
  for (int i = 0; i < n; i++) {
    ct_linear *L = list[i];
    if (L->cols % 4) continue;
    ct_panel8_pack_inplace((int8_t *)L->q, L->rows, L->cols, scratch);
    L->p8 = L->q;
    L->q = NULL;
  }
  free(scratch);
  if (tied) w->lm_head = w->embed;
  w->packed = CT_PACK_INT8;
  return 0;
}

int ct_infer_pack(ct_infer_weights *w, int mode) {
  if (w->int8) return mode == CT_PACK_NONE ? 0 : pack_int8(w);
  if (mode == CT_PACK_NONE)
    return w->layers && w->layers[0].qkv.b16 ? ct_set_error(CT_EINVAL, "sampler: a model stored in bfloat16 runs "
                                                            "from packed weights (float32 or bfloat16 panels)") : 0;
  if (w->packed && w->packed != mode)
    return ct_set_error(CT_EINVAL, "sampler: the weights are already packed for another precision");
  bool inplace = mode == CT_PACK_F32 && w->model;
  if (inplace && w->packed) return 0;  // an owned model never changes
  for (int l = 0; mode == CT_PACK_BF16 && !w->packed && l < w->cfg.num_layers; l++) {  // room for the adapters' B
    ct_infer_layer *L = &w->layers[l];
    L->qkv.ext = lora_ext(w, l, CT_LORA_Q, CT_LORA_V), L->o.ext = lora_ext(w, l, CT_LORA_O, CT_LORA_O);
    L->gu.ext = lora_ext(w, l, CT_LORA_GATE, CT_LORA_UP), L->down.ext = lora_ext(w, l, CT_LORA_DOWN, CT_LORA_DOWN);
  }
  ct_linear *list[4 * w->cfg.num_layers + 2];
  int n = pack_list(w, list);
  long total = 0;
  for (int i = 0; i < n; i++) total += pack_size(list[i], mode);
  if (!inplace && !w->pmem) {
    if (!(w->pmem = ct_big_alloc((size_t)total)))
      return ct_set_error(CT_ENOMEM, "sampler: cannot allocate %.1f MB for the packed weights", total / 1e6);
    w->pmem_bytes = total;
  }
  long maxK = 0;
  for (int i = 0; i < n; i++) maxK = list[i]->cols > maxK ? list[i]->cols : maxK;
  bool widen = mode == CT_PACK_F32 && w->layers[0].qkv.b16;  // bf16 rows into fp32 panels
  float *scratch = inplace || widen ? malloc(sizeof(float) * CT_PANEL * maxK * ct_pool_threads()) : NULL;
  if ((inplace || widen) && !scratch) return ct_set_error(CT_ENOMEM, "sampler: out of memory packing the weights");
  bool tied = same_matrix(&w->lm_head, &w->embed);
  char *at = w->pmem;
  for (int i = 0; i < n; i++) {
    ct_linear *L = list[i];
    pack_job j = {L, inplace ? NULL : at, scratch, mode, ct_pool_parts((L->rows + CT_PANEL - 1) / CT_PANEL)};
    ct_parallel_for(j.parts, pack_task, &j);
    if (mode == CT_PACK_BF16) L->p16 = j.dst;
    else L->p32 = inplace ? L->f32 : j.dst;
    if (inplace) L->f32 = NULL;  // no longer row-major
    at += inplace ? 0 : pack_size(L, mode);
  }
  free(scratch);
  if (tied) w->lm_head = w->embed;  // the same panels
  w->packed = mode;
  return 0;
}

// A model stored in bf16 (ct_model_to_bf16): matrices stay in params16 until packed, the
// vectors are widened into smem, and a float32 embedding / head kept in emb32 is used.
static int from_bf16_model(ct_infer_weights *w, const ct_model *m) {
  w->soff = malloc(sizeof(long) * m->n_tensors);
  long total = 0;
  for (int i = 0; w->soff && i < m->n_tensors; i++) {
    w->soff[i] = total;
    total += m->tensors[i].ndim == 1 ? m->tensors[i].numel : 0;
  }
  w->smem = malloc(sizeof(float) * (total ? total : 1));
  if (!w->soff || !w->smem) return ct_set_error(CT_ENOMEM, "sampler: out of memory");
  for (int i = 0; i < m->n_tensors; i++)
    if (m->tensors[i].ndim == 1) ct_bf16_widen(w->smem + w->soff[i], m->params16 + m->tensors[i].offset, m->tensors[i].numel);
  int rc = bind(w, m, NULL, m->params16, NULL, w->smem, NULL, w->soff);
  if (!rc && m->w.embed) w->embed = (ct_linear){.rows = w->embed.rows, .cols = w->embed.cols, .f32 = m->w.embed};
  if (!rc && m->w.lm_head)
    w->lm_head = m->w.lm_head == m->w.embed ? w->embed
                                             : (ct_linear){.rows = w->lm_head.rows, .cols = w->lm_head.cols, .f32 = m->w.lm_head};
  return rc;
}

int ct_infer_from_model(ct_infer_weights *w, const ct_model *m) {
  memset(w, 0, sizeof *w);
  int rc = m->params ? bind(w, m, m->params, NULL, NULL, NULL, NULL, NULL) : from_bf16_model(w, m);
  if (rc) ct_infer_free(w);
  return rc;
}

double ct_infer_int8_bytes(const ct_model_config *c) {
  ct_model lay;
  if (ct_model_layout(&lay, c)) return 0;
  double b = (double)lay.n_floats;  // one byte per weight
  for (int i = 0; i < lay.n_tensors; i++)  // scales and row sums (matrices) or values (vectors)
    b += 8.0 * (lay.tensors[i].ndim == 2 ? lay.tensors[i].shape[0] : lay.tensors[i].numel);
  ct_model_free(&lay);
  return b;
}

// Offsets in smem: a matrix's row scales, a vector's values, in table order.
static int alloc_int8(ct_infer_weights *w) {
  const ct_model *lay = &w->layout;
  w->soff = malloc(sizeof(long) * lay->n_tensors);
  long total = 0;
  for (int i = 0; w->soff && i < lay->n_tensors; i++) {
    w->soff[i] = total;
    total += lay->tensors[i].ndim == 2 ? lay->tensors[i].shape[0] : lay->tensors[i].numel;
  }
  w->qmem = calloc((size_t)lay->n_floats, 1);  // alignment gaps stay zero
  w->smem = malloc(sizeof(float) * (total ? total : 1));
  w->rmem = calloc(total ? total : 1, sizeof(int32_t));
  if (!w->soff || !w->qmem || !w->smem || !w->rmem)
    return ct_set_error(CT_ENOMEM, "sampler: cannot allocate %.1f MB of int8 weights", lay->n_floats / 1e6);
  w->int8 = true;
  return 0;
}

int ct_infer_quantize(ct_infer_weights *w, const ct_model *m) {
  memset(w, 0, sizeof *w);
  int rc = ct_model_layout(&w->layout, &m->cfg);
  if (!rc) rc = alloc_int8(w);
  for (int i = 0; !rc && i < w->layout.n_tensors; i++) {
    const ct_tensor_info *t = &w->layout.tensors[i];
    if (t->ndim == 2)
      ct_quantize_rows(m->params + t->offset, (int)t->shape[0], (int)t->shape[1],
                       w->qmem + t->offset, w->smem + w->soff[i], w->rmem + w->soff[i]);
    else
      memcpy(w->smem + w->soff[i], m->params + t->offset, sizeof(float) * t->numel);
  }
  if (!rc) rc = bind(w, &w->layout, NULL, NULL, w->qmem, w->smem, w->rmem, w->soff);
  if (rc) ct_infer_free(w);
  return rc;
}

static bool is_int8_dir(const char *dir) {
  char p[CT_PATH_MAX];
  if (ct_path_join(p, sizeof p, dir, "config.json")) return false;
  json_t *j = json_load_file(p, 0, NULL);
  const char *m = json_string_value(json_object_get(json_object_get(j, "quantization_config"), "quant_method"));
  bool yes = m && strcmp(m, QUANT_METHOD) == 0;
  json_decref(j);
  return yes;
}

static int load_int8(ct_infer_weights *w, const char *dir) {
  char p[CT_PATH_MAX];
  ct_model_config c;
  int rc = ct_path_join(p, sizeof p, dir, "config.json");
  if (!rc) rc = ct_hf_config_read(&c, p);
  if (!rc) rc = ct_model_layout(&w->layout, &c);
  if (rc) return rc;
  ct_st_dir d = {0};
  rc = ct_st_dir_open(&d, dir);
  if (!rc) rc = ct_model_check_weights(&w->layout, &d, false, true);  // (shapes first: the scales are more)
  if (!rc) rc = alloc_int8(w);
  char name[160];
  for (int i = 0; !rc && i < w->layout.n_tensors; i++) {
    const ct_tensor_info *ti = &w->layout.tensors[i];
    const ct_safetensors *st;
    const ct_st_tensor *t;
    if ((rc = ct_st_dir_find(&d, ti->name, &st, &t))) break;
    if (ti->ndim == 1) {
      rc = ct_st_read_f32(st, t, w->smem + w->soff[i], ti->numel);
      continue;
    }
    if (t->dtype != CT_DT_I8 || t->ndim != 2 || t->shape[0] != ti->shape[0] || t->shape[1] != ti->shape[1]) {
      rc = ct_set_error(CT_EFORMAT, "%s: tensor '%s' must be I8 [%ld, %ld] in an int8 model", st->path,
                        ti->name, ti->shape[0], ti->shape[1]);
      break;
    }
    memcpy(w->qmem + ti->offset, ct_st_data(st, t), (size_t)ti->numel);
    ct_rowsums(w->qmem + ti->offset, (int)ti->shape[0], (int)ti->shape[1], w->rmem + w->soff[i]);
    snprintf(name, sizeof name, "%s_scale", ti->name);
    if ((rc = ct_st_dir_find(&d, name, &st, &t))) break;
    rc = ct_st_read_f32(st, t, w->smem + w->soff[i], ti->shape[0]);
  }
  ct_st_dir_close(&d);
  if (!rc) rc = bind(w, &w->layout, NULL, NULL, w->qmem, w->smem, w->rmem, w->soff);
  return rc;
}

int ct_infer_load(ct_infer_weights *w, const char *dir, bool int8) {
  memset(w, 0, sizeof *w);
  int rc;
  if (is_int8_dir(dir)) {
    rc = load_int8(w, dir);
  } else {
    ct_model *m = calloc(1, sizeof *m);
    if (!m) return ct_set_error(CT_ENOMEM, "sampler: out of memory");
    rc = ct_model_load(m, dir, 1);
    if (!rc && m->cfg.num_labels > 0) {
      ct_model_free(m);
      rc = ct_set_error(CT_EINVAL, "%s is a reward model (*ForSequenceClassification, a score head and no LM "
                        "head): the sampler runs causal language models", dir);
    }
    if (rc) {
      free(m);
      return rc;
    }
    if (int8) {  // convert, then let the fp32 copy go
      rc = ct_infer_quantize(w, m);
      ct_model_free(m);
      free(m);
    } else {
      rc = ct_infer_from_model(w, m);
      w->model = m;
    }
  }
  if (rc) ct_infer_free(w);
  return rc;
}

int ct_infer_save_int8(const ct_infer_weights *w, const char *dir, const char *source_dir) {
  if (!w->int8) return ct_set_error(CT_EINVAL, "sampler: only int8 weights are saved by ct_infer_save_int8");
  if (w->packed) return ct_set_error(CT_EINVAL, "sampler: save an int8 model before packing it");
  const ct_model *lay = &w->layout;
  int n = 0, rc = ct_mkdirs(dir);
  ct_st_entry *e = calloc(2 * lay->n_tensors, sizeof *e);
  char (*names)[160] = calloc(lay->n_tensors, sizeof *names);
  if (!e || !names) rc = ct_set_error(CT_ENOMEM, "sampler: out of memory");
  for (int i = 0; !rc && i < lay->n_tensors; i++) {
    const ct_tensor_info *t = &lay->tensors[i];
    if (t->ndim == 1) {
      e[n++] = (ct_st_entry){.name = t->name, .dtype = CT_DT_F32, .ndim = 1,
                             .shape = {t->numel}, .data = w->smem + w->soff[i]};
      continue;
    }
    e[n++] = (ct_st_entry){.name = t->name, .dtype = CT_DT_I8, .ndim = 2,
                           .shape = {t->shape[0], t->shape[1]}, .data = w->qmem + t->offset};
    snprintf(names[i], sizeof names[i], "%s_scale", t->name);
    e[n++] = (ct_st_entry){.name = names[i], .dtype = CT_DT_F32, .ndim = 1,
                           .shape = {t->shape[0]}, .data = w->smem + w->soff[i]};
  }
  char p[CT_PATH_MAX];
  if (!rc) rc = ct_path_join(p, sizeof p, dir, "model.safetensors");
  const char *mk[] = {"format"}, *mv[] = {"pt"};
  if (!rc) rc = ct_st_write(p, e, n, mk, mv, 1);
  free(e);
  free(names);
  if (!rc) rc = ct_path_join(p, sizeof p, dir, "config.json");
  if (rc) return rc;
  json_t *j = ct_hf_config_json(&w->cfg, "int8", source_dir);  // with the quantization_config block
  json_object_set_new(j, "quantization_config",
                      json_pack("{s:s,s:i,s:s,s:b}", "quant_method", QUANT_METHOD, "bits", 8,
                                "granularity", "per-output-row absmax", "symmetric", 1));
  rc = ct_hfjson_write(j, p);
  json_decref(j);
  return rc;
}

void ct_infer_free(ct_infer_weights *w) {
  ct_free_all(w->layers, w->qmem, w->smem, w->rmem, w->soff);
  ct_big_free(w->pmem);
  ct_model_free(&w->layout);
  if (w->model) {
    ct_model_free(w->model);
    free(w->model);
  }
  memset(w, 0, sizeof *w);
}
