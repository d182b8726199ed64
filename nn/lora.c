// lora: the adapters' layout (PEFT names), initialization, adapter_config.json and
// adapter_model.safetensors in and out, and merging into a base. Running them is
// forward.c's; training them is the trainers' (the adapters are their ct_layout).
#include "lora.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "fs.h"
#include "hf.h"
#include "hfjson.h"
#include "matmul.h"
#include "mem.h"

const char *const ct_lora_target_names[] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                            "gate_proj", "up_proj", "down_proj", NULL};
_Static_assert(sizeof ct_lora_target_names / sizeof *ct_lora_target_names == CT_LORA_TARGETS + 1,
               "ct_lora_target_names must name every CT_LORA_* value");
static const char *const module_of[CT_LORA_TARGETS] = {"self_attn", "self_attn", "self_attn", "self_attn",
                                                       "mlp", "mlp", "mlp"};
#define EMBED_NAME "base_model.model.model.embed_tokens.weight"
#define HEAD_NAME "base_model.model.lm_head.weight"
#define SCORE_NAME "base_model.model.score.weight"

void ct_lora_dims(const ct_model_config *c, int t, int *in, int *out, int *row0) {
  int C = c->hidden_size, F = c->intermediate_size, Hd = c->num_heads * c->head_dim;
  int KVd = c->num_kv_heads * c->head_dim;
  int ins[CT_LORA_TARGETS] = {C, C, C, Hd, C, C, F};
  int outs[CT_LORA_TARGETS] = {Hd, KVd, KVd, C, F, F, C};
  int rows[CT_LORA_TARGETS] = {0, Hd, Hd + KVd, 0, 0, F, 0};
  *in = ins[t];
  *out = outs[t];
  *row0 = rows[t];
}

int ct_lora_config_check(const ct_lora_config *lc, const ct_model_config *mc) {
  if (lc->r < 1) return ct_set_error(CT_ECONFIG, "lora: r must be at least 1 (it is %d)", lc->r);
  if (!(lc->alpha > 0)) return ct_set_error(CT_ECONFIG, "lora: lora_alpha must be positive");
  if (!(lc->dropout >= 0 && lc->dropout < 1)) return ct_set_error(CT_ECONFIG, "lora: lora_dropout must be in [0, 1)");
  if (lc->save_score && !mc->num_labels)
    return ct_set_error(CT_ECONFIG, "lora: modules_to_save score is a sequence classifier's head (a SEQ_CLS "
                        "adapter), and this %s model is a causal LM: load it as a reward model", mc->model_type);
  if (!lc->targets && !lc->save_embed && !lc->save_head && !lc->save_score)
    return ct_set_error(CT_ECONFIG, "lora: no target module and no module to save: nothing would train");
  if (mc->tie_word_embeddings && (lc->save_embed || lc->save_head))
    return ct_set_error(CT_ECONFIG, "lora: modules_to_save with tied embeddings (%s): the embedding is "
                        "also the LM head, so a trained copy of one would untie them; train them in "
                        "full without LoRA instead", mc->model_type);
  return 0;
}

typedef struct {
  ct_tensor_info *t;
  int n, cap;
  long off;
} table;

static int table_add(table *tb, const char *name, long d0, long d1) {
  if (tb->n == tb->cap) {
    int cap = tb->cap ? 2 * tb->cap : 64;
    ct_tensor_info *t = realloc(tb->t, sizeof *t * cap);
    if (!t) return ct_set_error(CT_ENOMEM, "lora: out of memory");
    tb->t = t;
    tb->cap = cap;
  }
  ct_tensor_info *t = &tb->t[tb->n++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  tb->off = (tb->off + 15) / 16 * 16;  // every tensor on a 64-byte boundary
  t->offset = tb->off;
  t->ndim = 2;
  t->shape[0] = d0;
  t->shape[1] = d1;
  t->numel = d0 * d1;
  t->decay = true;  // matrices, as HF Trainer decays them
  tb->off += t->numel;
  return 0;
}

// The tensor table: per layer, per target, A then B; then the modules_to_save copies.
static int build_table(table *tb, const ct_lora_config *lc, const ct_model_config *mc) {
  char nm[96];
  int rc = 0;
  for (int l = 0; l < mc->num_layers && !rc; l++)
    for (int t = 0; t < CT_LORA_TARGETS && !rc; t++) {
      if (!(lc->targets >> t & 1)) continue;
      int in, out, row0;
      ct_lora_dims(mc, t, &in, &out, &row0);
      snprintf(nm, sizeof nm, "base_model.model.model.layers.%d.%s.%s.lora_A.weight", l, module_of[t],
               ct_lora_target_names[t]);
      rc = table_add(tb, nm, lc->r, in);
      snprintf(nm, sizeof nm, "base_model.model.model.layers.%d.%s.%s.lora_B.weight", l, module_of[t],
               ct_lora_target_names[t]);
      if (!rc) rc = table_add(tb, nm, out, lc->r);
    }
  if (!rc && lc->save_embed) rc = table_add(tb, EMBED_NAME, mc->vocab_size, mc->hidden_size);
  if (!rc && lc->save_head) rc = table_add(tb, HEAD_NAME, mc->vocab_size, mc->hidden_size);
  if (!rc && lc->save_score) rc = table_add(tb, SCORE_NAME, mc->num_labels, mc->hidden_size);
  return rc;
}

double ct_lora_bytes(const ct_lora_config *lc, const ct_model_config *mc) {
  table tb = {0};
  int rc = build_table(&tb, lc, mc);
  free(tb.t);
  return rc ? 0 : sizeof(float) * (double)((tb.off + 15) / 16 * 16);
}

// Views of buf (params or grads) for every adapted projection and saved module.
static void bind(const ct_lora *lo, float *buf, ct_lora_ab (*v)[CT_LORA_TARGETS], float **embed, float **head,
                 float **score) {
  int k = 0;
  for (int l = 0; l < lo->mc.num_layers; l++)
    for (int t = 0; t < CT_LORA_TARGETS; t++) {
      if (!(lo->cfg.targets >> t & 1)) {
        v[l][t] = (ct_lora_ab){NULL, NULL};
        continue;
      }
      v[l][t].A = buf + lo->tensors[k++].offset;
      v[l][t].B = buf + lo->tensors[k++].offset;
    }
  *embed = lo->cfg.save_embed ? buf + lo->tensors[k++].offset : NULL;
  *head = lo->cfg.save_head ? buf + lo->tensors[k++].offset : NULL;
  *score = lo->cfg.save_score ? buf + lo->tensors[k++].offset : NULL;
}

int ct_lora_init(ct_lora *lo, const ct_lora_config *lc, const ct_model_config *mc) {
  memset(lo, 0, sizeof *lo);
  int rc = ct_lora_config_check(lc, mc);
  if (rc) return rc;
  lo->cfg = *lc;
  lo->mc = *mc;
  lo->scale = (float)(lc->rslora ? lc->alpha / sqrt((double)lc->r) : lc->alpha / lc->r);
  table tb = {0};
  if ((rc = build_table(&tb, lc, mc))) {
    free(tb.t);
    return rc;
  }
  lo->tensors = tb.t;
  lo->n_tensors = tb.n;
  lo->n_floats = (tb.off + 15) / 16 * 16;
  lo->params = ct_big_alloc(sizeof(float) * lo->n_floats);
  lo->w = calloc(mc->num_layers, sizeof *lo->w);
  lo->g = calloc(mc->num_layers, sizeof *lo->g);
  if (!lo->params || !lo->w || !lo->g) {
    double mb = lo->n_floats * 4e-6;  // (ct_lora_free clears the struct)
    ct_lora_free(lo);
    return ct_set_error(CT_ENOMEM, "lora: cannot allocate %.1f MB of adapters", mb);
  }
  bind(lo, lo->params, lo->w, &lo->embed, &lo->head, &lo->score);
  return 0;
}

void ct_lora_free(ct_lora *lo) {
  ct_big_free(lo->params);
  ct_free_all(lo->tensors, lo->w, lo->g);
  memset(lo, 0, sizeof *lo);
}

int ct_lora_bind_grads(ct_lora *lo, float *grads) {
  lo->grads = grads;
  bind(lo, grads, lo->g, &lo->g_embed, &lo->g_head, &lo->g_score);
  return 0;
}

void ct_lora_attach(const ct_lora *lo, ct_model *m) {
  if (lo->embed) {
    bool tied = m->w.lm_head == m->w.embed;
    m->w.embed = lo->embed;
    if (tied) m->w.lm_head = lo->embed;  // (config_check refuses this; kept consistent)
  }
  if (lo->head) m->w.lm_head = lo->head;
  if (lo->score) m->w.score = lo->score;
}

// Kaiming-uniform with a = sqrt(5), as torch.nn.init.kaiming_uniform_ gives nn.Linear:
// bound = sqrt(6 / ((1 + a²) · fan_in)) = 1 / sqrt(fan_in). Value k of tensor i is a hash
// of (seed, i, k): the same for any thread count.
static float uniform_of(uint64_t key, uint64_t k) {
  uint64_t z = key + k * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return (float)(z >> 40) * 0x1p-24f;  // [0, 1)
}

void ct_lora_init_weights(ct_lora *lo, const ct_model *base, uint64_t seed) {
  for (int i = 0; i < lo->n_tensors; i++) {
    const ct_tensor_info *t = &lo->tensors[i];
    float *p = lo->params + t->offset;
    if (strstr(t->name, ".lora_A.")) {
      float bound = 1.0f / sqrtf((float)t->shape[1]);
      uint64_t key = seed * 0xd1b54a32d192ed03ULL + (uint64_t)(i + 1) * 0x8cb92ba72f3d8dd7ULL;
      for (long k = 0; k < t->numel; k++) p[k] = (2.0f * uniform_of(key, (uint64_t)k) - 1.0f) * bound;
    } else if (strstr(t->name, ".lora_B.")) {
      memset(p, 0, sizeof(float) * t->numel);
    }
  }
  long VC = (long)lo->mc.vocab_size * lo->mc.hidden_size;
  if (lo->embed) memcpy(lo->embed, base->w.embed, sizeof(float) * VC);
  if (lo->head) memcpy(lo->head, base->w.lm_head, sizeof(float) * VC);
  long SC = (long)lo->mc.num_labels * lo->mc.hidden_size;  // (num_labels, C)
  if (lo->score && base->w.score) memcpy(lo->score, base->w.score, sizeof(float) * SC);
}

// ---------------------------------------------------------------------------
// adapter_config.json

static int target_index(const char *name) {
  for (int t = 0; t < CT_LORA_TARGETS; t++)
    if (!strcmp(name, ct_lora_target_names[t])) return t;
  return -1;
}

int ct_lora_read_config(ct_lora_config *lc, const char *dir) {
  char path[CT_PATH_MAX];
  json_t *j;
  int rc = ct_hfjson_read(dir, "adapter_config.json", path, sizeof path, &j);
  if (rc) return rc;
  memset(lc, 0, sizeof *lc);
  const char *type = json_string_value(json_object_get(j, "peft_type"));
  json_t *tm = json_object_get(j, "target_modules"), *ms = json_object_get(j, "modules_to_save");
  const char *bias = json_string_value(json_object_get(j, "bias"));
  json_t *rank_pattern = json_object_get(j, "rank_pattern"), *alpha_pattern = json_object_get(j, "alpha_pattern");
  if (!type || strcmp(type, "LORA")) {
    rc = ct_set_error(CT_EFORMAT, "%s: key 'peft_type' is %s, not LORA", path, type ? type : "missing");
  } else if (!json_is_integer(json_object_get(j, "r")) || !json_is_number(json_object_get(j, "lora_alpha"))) {
    rc = ct_set_error(CT_EFORMAT, "%s: keys 'r' (an integer) and 'lora_alpha' are required", path);
  } else if (json_is_true(json_object_get(j, "use_dora")) || json_is_true(json_object_get(j, "fan_in_fan_out")) ||
             (bias && strcmp(bias, "none")) || (json_is_object(rank_pattern) && json_object_size(rank_pattern)) ||
             (json_is_object(alpha_pattern) && json_object_size(alpha_pattern)) ||
             (json_object_get(j, "layers_to_transform") && !json_is_null(json_object_get(j, "layers_to_transform")))) {
    rc = ct_set_error(CT_EFORMAT, "%s: use_dora, fan_in_fan_out, bias, rank_pattern, alpha_pattern and "
                      "layers_to_transform are not supported (plain LoRA only)", path);
  } else {
    lc->r = (int)json_integer_value(json_object_get(j, "r"));
    lc->alpha = json_number_value(json_object_get(j, "lora_alpha"));
    lc->dropout = json_number_value(json_object_get(j, "lora_dropout"));
    lc->rslora = json_is_true(json_object_get(j, "use_rslora"));
    if (json_is_string(tm) && !strcmp(json_string_value(tm), "all-linear")) lc->targets = (1u << CT_LORA_TARGETS) - 1;
    for (size_t i = 0; json_is_array(tm) && i < json_array_size(tm) && !rc; i++) {
      const char *nm = json_string_value(json_array_get(tm, i));
      int t = nm ? target_index(nm) : -1;
      if (t < 0) rc = ct_set_error(CT_EFORMAT, "%s: target module '%s' is not one of q_proj, k_proj, v_proj, "
                                   "o_proj, gate_proj, up_proj, down_proj", path, nm ? nm : "?");
      else lc->targets |= 1u << t;
    }
    for (size_t i = 0; json_is_array(ms) && i < json_array_size(ms) && !rc; i++) {
      const char *nm = json_string_value(json_array_get(ms, i));
      if (nm && !strcmp(nm, "embed_tokens")) lc->save_embed = true;
      else if (nm && !strcmp(nm, "lm_head")) lc->save_head = true;
      else if (nm && !strcmp(nm, "score")) lc->save_score = true;
      else if (nm && !strcmp(nm, "classifier")) continue;  // PEFT's SEQ_CLS lists it; our classifiers have none
      else rc = ct_set_error(CT_EFORMAT, "%s: modules_to_save '%s': only embed_tokens, lm_head and score", path,
                             nm ? nm : "?");
    }
  }
  json_decref(j);
  return rc;
}

int ct_lora_save(const ct_lora *lo, const char *dir, const char *base_name) {
  json_t *tm = json_array(), *ms = json_array();
  for (int t = 0; t < CT_LORA_TARGETS; t++)
    if (lo->cfg.targets >> t & 1) json_array_append_new(tm, json_string(ct_lora_target_names[t]));
  if (lo->cfg.save_embed) json_array_append_new(ms, json_string("embed_tokens"));
  if (lo->cfg.save_head) json_array_append_new(ms, json_string("lm_head"));
  if (lo->cfg.save_score) {  // as PeftModelForSequenceClassification extends the list
    json_array_append_new(ms, json_string("classifier"));
    json_array_append_new(ms, json_string("score"));
  }
  // PEFT's LoraConfig types (lora_alpha an int, lora_dropout a float), keys sorted as PEFT writes them
  double a = lo->cfg.alpha;
  json_t *alpha = a == (double)(json_int_t)a ? json_integer((json_int_t)a) : json_real(a);
  json_t *j = json_pack("{s:s?,s:s,s:b,s:b,s:b,s:o,s:f,s:o,s:s,s:i,s:o,s:s,s:b,s:b}", "base_model_name_or_path",
                        base_name, "bias", "none", "fan_in_fan_out", 0, "inference_mode", 1, "init_lora_weights", 1,
                        "lora_alpha", alpha, "lora_dropout", lo->cfg.dropout, "modules_to_save",
                        json_array_size(ms) ? ms : (json_decref(ms), json_null()), "peft_type", "LORA", "r",
                        lo->cfg.r, "target_modules", tm, "task_type", lo->cfg.save_score ? "SEQ_CLS" : "CAUSAL_LM",
                        "use_dora", 0, "use_rslora", lo->cfg.rslora);
  char p[CT_PATH_MAX];
  int rc = ct_path_join(p, sizeof p, dir, "adapter_config.json");
  if (!rc) rc = j ? ct_hfjson_write(j, p) : ct_set_error(CT_ENOMEM, "%s: out of memory", p);
  json_decref(j);
  const float *bufs[] = {lo->params};
  if (!rc) rc = ct_path_join(p, sizeof p, dir, "adapter_model.safetensors");
  if (!rc) rc = ct_save_tensors(&ct_lora_tensors(lo), 1, bufs, NULL, p, CT_DT_F32);
  return rc;
}

int ct_lora_load(ct_lora *lo, const char *dir, const ct_model_config *mc) {
  ct_lora_config lc;
  char p[CT_PATH_MAX];
  int rc = ct_lora_read_config(&lc, dir);
  if (!rc) rc = ct_lora_init(lo, &lc, mc);
  if (!rc) rc = ct_path_join(p, sizeof p, dir, "adapter_model.safetensors");
  if (rc) return ct_wrap_error(rc, "adapter %s", dir);
  ct_safetensors st = {0};
  if ((rc = ct_st_open(&st, p))) {
    ct_lora_free(lo);
    return rc;
  }
  for (int i = 0; i < lo->n_tensors && !rc; i++) {
    const ct_tensor_info *ti = &lo->tensors[i];
    const ct_st_tensor *t = ct_st_find(&st, ti->name);
    if (!t)
      rc = ct_set_error(CT_EFORMAT, "%s: tensor '%s' is missing (the adapter does not fit this base model)", p, ti->name);
    else if (t->ndim != 2 || t->shape[0] != ti->shape[0] || t->shape[1] != ti->shape[1])
      rc = ct_set_error(CT_EFORMAT, "%s: tensor '%s' has shape [%lld, %lld] but this base model needs [%ld, %ld]",
                        p, ti->name, (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0),
                        ti->shape[0], ti->shape[1]);
    else
      rc = ct_st_read_f32(&st, t, lo->params + ti->offset, ti->numel);
  }
  for (int i = 0; i < st.n && !rc; i++) {  // a tensor this base has no place for
    bool known = false;
    for (int k = 0; k < lo->n_tensors && !known; k++) known = !strcmp(st.tensors[i].name, lo->tensors[k].name);
    if (!known) rc = ct_set_error(CT_EFORMAT, "%s: tensor '%s' does not fit this base model", p, st.tensors[i].name);
  }
  ct_st_close(&st);
  if (rc) ct_lora_free(lo);
  return rc;
}

// ---------------------------------------------------------------------------

int ct_lora_merge(const ct_lora *lo, ct_model *base) {
  if (!base->params) return ct_set_error(CT_EINVAL, "lora: merging needs the base in float32");
  const ct_model_config *c = &base->cfg;
  for (int l = 0; l < c->num_layers; l++) {
    const ct_layer_weights *w = &base->w.layers[l];
    float *mats[CT_LORA_TARGETS] = {w->wqkv, w->wqkv, w->wqkv, w->wo, w->wgu, w->wgu, w->wdown};
    for (int t = 0; t < CT_LORA_TARGETS; t++) {
      const ct_lora_ab *ab = &lo->w[l][t];
      if (!ab->A) continue;
      int in, out, row0;
      ct_lora_dims(c, t, &in, &out, &row0);
      // W[row0 : row0 + out] (out, in) += s · B (out, r) · A (r, in)
      ct_sgemm('N', 'N', out, in, lo->cfg.r, lo->scale, ab->B, lo->cfg.r, ab->A, in, 1,
               mats[t] + (long)row0 * in, in);
    }
  }
  long VC = (long)c->vocab_size * c->hidden_size;
  if (lo->embed) memcpy(base->w.embed, lo->embed, sizeof(float) * VC);
  if (lo->head) memcpy(base->w.lm_head, lo->head, sizeof(float) * VC);
  if (lo->score && base->w.score) memcpy(base->w.score, lo->score, sizeof(float) * c->num_labels * c->hidden_size);
  return 0;
}

const char *ct_lora_tokenizer_dir(const char *adapter, const char *base) {
  return adapter && adapter[0] && ct_path_has_file(adapter, "tokenizer.json") ? adapter : base;
}
