// hf: Hugging Face model directories — config.json <-> ct_model_config, and every tensor
// of a model layout to and from safetensors (one file or a sharded index) with HF names.
// Checkpoint directories (atomic saves, rotation) are ckpt's; this only reads and writes files.
#include "hf.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "fs.h"

// ---------------------------------------------------------------------------
// config.json

typedef struct {
  const char *path;
  json_t *j;
} cfg_reader;

static int get_int(const cfg_reader *r, const char *key, long def, bool required, int *out) {
  json_t *v = json_object_get(r->j, key);
  if (!v || json_is_null(v)) {
    if (required) return ct_set_error(CT_EFORMAT, "%s: key '%s' is missing", r->path, key);
    *out = (int)def;
    return 0;
  }
  if (!json_is_integer(v) || json_integer_value(v) < -1 || json_integer_value(v) > (1 << 30))
    return ct_set_error(CT_EFORMAT, "%s: key '%s': expected an integer", r->path, key);
  *out = (int)json_integer_value(v);
  return 0;
}

static int get_float(const cfg_reader *r, const char *key, double def, float *out) {
  json_t *v = json_object_get(r->j, key);
  if (!v || json_is_null(v)) {
    *out = (float)def;
    return 0;
  }
  if (!json_is_number(v)) return ct_set_error(CT_EFORMAT, "%s: key '%s': expected a number", r->path, key);
  *out = (float)json_number_value(v);
  return 0;
}

static int get_bool(const cfg_reader *r, const char *key, bool def, bool *out) {
  json_t *v = json_object_get(r->j, key);
  if (!v || json_is_null(v)) {
    *out = def;
    return 0;
  }
  if (!json_is_boolean(v)) return ct_set_error(CT_EFORMAT, "%s: key '%s': expected true or false", r->path, key);
  *out = json_is_true(v);
  return 0;
}

// eos_token_id may be one id or a list (Llama 3.1); the first is kept.
static int get_token_id(const cfg_reader *r, const char *key, int *out) {
  json_t *v = json_object_get(r->j, key);
  if (json_is_array(v)) v = json_array_get(v, 0);
  *out = json_is_integer(v) ? (int)json_integer_value(v) : -1;
  return 0;
}

static int read_rope_scaling(const cfg_reader *r, ct_model_config *c) {
  json_t *rs = json_object_get(r->j, "rope_scaling");
  c->rope_type = 0;
  if (!rs || json_is_null(rs)) return 0;
  const char *type = json_string_value(json_object_get(rs, "rope_type"));
  if (!type) type = json_string_value(json_object_get(rs, "type"));
  if (type && strcmp(type, "default") == 0) return 0;
  cfg_reader sub = {r->path, rs};
  if (type && strcmp(type, "linear") == 0) {
    c->rope_type = 2;
    return get_float(&sub, "factor", 1, &c->rope_factor);
  }
  if (!type || strcmp(type, "llama3") != 0)
    return ct_set_error(CT_EFORMAT, "%s: rope_scaling type '%s' is not supported (llama3, linear)",
                        r->path, type ? type : "?");
  c->rope_type = 1;
  int rc = get_float(&sub, "factor", 8, &c->rope_factor);
  if (!rc) rc = get_float(&sub, "low_freq_factor", 1, &c->rope_low_freq_factor);
  if (!rc) rc = get_float(&sub, "high_freq_factor", 4, &c->rope_high_freq_factor);
  if (!rc) rc = get_int(&sub, "original_max_position_embeddings", 8192, false, &c->rope_original_max_pos);
  return rc;
}

// A *ForSequenceClassification architecture has num_labels outputs: the key when written,
// else id2label's size, else 2 (transformers' default). ctune runs reward models only: 1.
static int read_num_labels(const cfg_reader *r, int *num_labels) {
  json_t *a = json_object_get(r->j, "architectures");
  const char *arch = json_string_value(json_array_get(a, 0));
  *num_labels = 0;
  if (!arch || !strstr(arch, "ForSequenceClassification")) return 0;
  json_t *n = json_object_get(r->j, "num_labels"), *labels = json_object_get(r->j, "id2label");
  int k = json_is_integer(n) ? (int)json_integer_value(n) : json_is_object(labels) ? (int)json_object_size(labels) : 2;
  if (k != 1)
    return ct_set_error(CT_EFORMAT, "%s: %s with num_labels %d (id2label): a reward model has one output, "
                        "num_labels 1 (id2label {\"0\": \"LABEL_0\"})", r->path, arch, k);
  *num_labels = 1;
  return 0;
}

// Gemma 3's own keys: attention scale, sliding-window layers and their RoPE base,
// softcapping, the MLP's activation.
static int read_gemma(const cfg_reader *r, ct_model_config *c) {
  json_t *j = r->j;
  const char *act = json_string_value(json_object_get(j, "hidden_activation"));
  if (!act) act = json_string_value(json_object_get(j, "hidden_act"));
  if (act && strcmp(act, "gelu_pytorch_tanh") != 0)
    return ct_set_error(CT_EFORMAT, "%s: hidden_activation '%s' is not supported (gelu_pytorch_tanh)", r->path, act);
  bool bidir = false;
  int rc = get_bool(r, "use_bidirectional_attention", false, &bidir);
  if (!rc && bidir) return ct_set_error(CT_EFORMAT, "%s: use_bidirectional_attention is not supported", r->path);
  json_t *fs = json_object_get(j, "final_logit_softcapping");
  if (!rc && fs && !json_is_null(fs))
    return ct_set_error(CT_EFORMAT, "%s: key 'final_logit_softcapping': softcapping the LM head's logits is "
                        "not supported (Gemma 3 checkpoints set it to null)", r->path);
  int pattern = 6;
  if (rc || (rc = get_float(r, "query_pre_attn_scalar", 256, &c->query_pre_attn_scalar)) ||
      (rc = get_float(r, "attn_logit_softcapping", 0, &c->attn_softcap)) ||
      (rc = get_float(r, "rope_local_base_freq", 10000, &c->rope_local_theta)) ||
      (rc = get_int(r, "sliding_window", 0, false, &c->sliding_window)) ||
      (rc = get_int(r, "sliding_window_pattern", 6, false, &pattern)))
    return rc;
  if (c->num_layers > CT_MAX_LAYERS)
    return ct_set_error(CT_EFORMAT, "%s: num_hidden_layers %d: at most %d for gemma3_text", r->path, c->num_layers,
                        CT_MAX_LAYERS);
  json_t *lt = json_object_get(j, "layer_types");
  if (lt && !json_is_null(lt) && (!json_is_array(lt) || (int)json_array_size(lt) != c->num_layers))
    return ct_set_error(CT_EFORMAT, "%s: key 'layer_types': expected a list of num_hidden_layers (%d) strings",
                        r->path, c->num_layers);
  if (pattern < 1) return ct_set_error(CT_EFORMAT, "%s: key 'sliding_window_pattern' must be positive", r->path);
  for (int l = 0; l < c->num_layers; l++) {
    if (!lt || json_is_null(lt)) {  // transformers' rule: layer l is full when (l + 1) % pattern == 0
      c->sliding[l] = (l + 1) % pattern != 0;
      continue;
    }
    const char *t = json_string_value(json_array_get(lt, l));
    if (t && strcmp(t, "sliding_attention") == 0) c->sliding[l] = 1;
    else if (!t || strcmp(t, "full_attention") != 0)
      return ct_set_error(CT_EFORMAT, "%s: layer_types[%d] '%s': expected sliding_attention or full_attention",
                          r->path, l, t ? t : "?");
  }
  if (c->sliding_window <= 0) memset(c->sliding, 0, sizeof c->sliding);  // no window: every layer full
  c->gemma = c->qk_norm = true;
  return 0;
}

int ct_hf_config_read(ct_model_config *c, const char *path) {
  memset(c, 0, sizeof *c);
  json_error_t err;
  json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
  if (!j) {
    if (err.line < 1) return ct_set_error(CT_EIO, "%s: %s", path, err.text);
    return ct_set_error(CT_EFORMAT, "%s:%d: %s", path, err.line, err.text);
  }
  cfg_reader r = {path, j};
  int rc = 0;
  if (!json_is_object(j)) {
    rc = ct_set_error(CT_EFORMAT, "%s: expected a JSON object", path);
    goto done;
  }
  const char *type = json_string_value(json_object_get(j, "model_type"));
  if (!type) {
    rc = ct_set_error(CT_EFORMAT, "%s: key 'model_type' is missing", path);
    goto done;
  }
  bool qwen2 = strcmp(type, "qwen2") == 0, qwen3 = strcmp(type, "qwen3") == 0;
  bool gemma = strcmp(type, "gemma3_text") == 0;
  if (!qwen2 && !qwen3 && !gemma && strcmp(type, "llama") && strcmp(type, "mistral")) {
    rc = ct_set_error(CT_EFORMAT, "%s: model_type '%s' is not supported (llama, qwen2, qwen3, mistral, "
                      "gemma3_text)", path, type);
    goto done;
  }
  snprintf(c->model_type, sizeof c->model_type, "%s", type);
  const char *act = json_string_value(json_object_get(j, "hidden_act"));
  if (!gemma && act && strcmp(act, "silu") != 0) {
    rc = ct_set_error(CT_EFORMAT, "%s: hidden_act '%s' is not supported (silu)", path, act);
    goto done;
  }
  if ((rc = get_int(&r, "vocab_size", 0, true, &c->vocab_size)) ||
      (rc = get_int(&r, "hidden_size", 0, true, &c->hidden_size)) ||
      (rc = get_int(&r, "intermediate_size", 0, true, &c->intermediate_size)) ||
      (rc = get_int(&r, "num_hidden_layers", 0, true, &c->num_layers)) ||
      (rc = get_int(&r, "num_attention_heads", 0, true, &c->num_heads)) ||
      (rc = get_int(&r, "num_key_value_heads", c->num_heads, false, &c->num_kv_heads)) ||
      (rc = get_int(&r, "head_dim", c->num_heads ? c->hidden_size / c->num_heads : 0, false, &c->head_dim)) ||
      (rc = get_int(&r, "max_position_embeddings", 2048, false, &c->max_position_embeddings)) ||
      (rc = get_float(&r, "rope_theta", gemma ? 1e6 : 10000, &c->rope_theta)) ||
      (rc = get_float(&r, "rms_norm_eps", 1e-6, &c->rms_norm_eps)) ||
      (rc = get_bool(&r, "tie_word_embeddings", gemma, &c->tie_word_embeddings)) ||
      (rc = read_rope_scaling(&r, c)) || (gemma && (rc = read_gemma(&r, c))))
    goto done;
  bool attention_bias = false, mlp_bias = false, sliding = false;
  if ((rc = get_bool(&r, "attention_bias", false, &attention_bias)) ||
      (rc = get_bool(&r, "mlp_bias", false, &mlp_bias)) ||
      (rc = get_bool(&r, "use_sliding_window", false, &sliding)))
    goto done;
  if (attention_bias) {  // Llama/Qwen3 put it on o_proj as well: not this model
    rc = ct_set_error(CT_EFORMAT, "%s: attention_bias (biases on q/k/v and o_proj) is not supported", path);
    goto done;
  }
  if (mlp_bias) {
    rc = ct_set_error(CT_EFORMAT, "%s: mlp_bias is not supported", path);
    goto done;
  }
  json_t *sw = json_object_get(j, "sliding_window");
  if (!gemma && json_object_get(j, "attn_logit_softcapping") && !json_is_null(json_object_get(j, "attn_logit_softcapping"))) {
    rc = ct_set_error(CT_EFORMAT, "%s: key 'attn_logit_softcapping' is only supported for gemma3_text", path);
    goto done;
  }
  if (sliding || (strcmp(type, "mistral") == 0 && json_is_integer(sw))) {
    rc = ct_set_error(CT_EFORMAT, "%s: key '%s': sliding-window attention is not supported", path,
                      sliding ? "use_sliding_window" : "sliding_window");
    goto done;
  }
  c->qkv_bias = qwen2;
  c->qk_norm = qwen3 || gemma;
  get_token_id(&r, "bos_token_id", &c->bos_token_id);
  get_token_id(&r, "eos_token_id", &c->eos_token_id);
  get_token_id(&r, "pad_token_id", &c->pad_token_id);
  if ((rc = read_num_labels(&r, &c->num_labels))) goto done;
  if (ct_model_config_check(c)) rc = ct_wrap_error(CT_EFORMAT, "%s", path);
done:
  json_decref(j);
  return rc;
}

static const char *architecture(const char *type, bool seq_cls) {
  if (strcmp(type, "qwen2") == 0) return seq_cls ? "Qwen2ForSequenceClassification" : "Qwen2ForCausalLM";
  if (strcmp(type, "qwen3") == 0) return seq_cls ? "Qwen3ForSequenceClassification" : "Qwen3ForCausalLM";
  if (strcmp(type, "mistral") == 0) return seq_cls ? "MistralForSequenceClassification" : "MistralForCausalLM";
  if (strcmp(type, "gemma3_text") == 0) return seq_cls ? "Gemma3ForSequenceClassification" : "Gemma3ForCausalLM";
  return seq_cls ? "LlamaForSequenceClassification" : "LlamaForCausalLM";
}

// A float field as the double whose shortest decimal reads back as that float (1e-6f ->
// 1e-06, not 9.9999999747524271e-07); dumped with JSON_REAL_PRECISION(9) it prints as
// that shortest decimal, so a config.json read and written again keeps its values.
static json_t *json_float(float f) {
  char buf[32];
  for (int p = 1; p <= 9; p++) {
    snprintf(buf, sizeof buf, "%.*g", p, (double)f);
    if ((float)strtod(buf, NULL) == f) break;
  }
  return json_real(strtod(buf, NULL));
}

// Gemma 3's keys (read_gemma's), with layer_types and, when the layers follow it,
// sliding_window_pattern (what transformers before layer_types reads).
static void write_gemma(json_t *j, const ct_model_config *c) {
  json_object_set_new(j, "hidden_activation", json_string("gelu_pytorch_tanh"));
  json_object_set_new(j, "query_pre_attn_scalar", json_float(c->query_pre_attn_scalar));
  json_object_set_new(j, "rope_local_base_freq", json_float(c->rope_local_theta));
  json_object_set_new(j, "sliding_window", c->sliding_window > 0 ? json_integer(c->sliding_window) : json_null());
  json_object_set_new(j, "final_logit_softcapping", json_null());
  json_object_set_new(j, "attn_logit_softcapping", c->attn_softcap > 0 ? json_float(c->attn_softcap) : json_null());
  json_object_set_new(j, "use_bidirectional_attention", json_false());
  json_t *lt = json_array();
  for (int l = 0; l < c->num_layers; l++)
    json_array_append_new(lt, json_string(ct_layer_window(c, l) ? "sliding_attention" : "full_attention"));
  json_object_set_new(j, "layer_types", lt);
  for (int p = 1; p <= c->num_layers + 1 && c->sliding_window > 0; p++) {
    bool fits = true;
    for (int l = 0; l < c->num_layers; l++) fits &= (bool)c->sliding[l] == ((l + 1) % p != 0);
    if (fits) {
      json_object_set_new(j, "sliding_window_pattern", json_integer(p));
      break;
    }
  }
}

int ct_hf_config_write(const ct_model_config *c, const char *path, const char *torch_dtype) {
  json_t *j = json_object();
  json_object_set_new(j, "architectures", json_pack("[s]", architecture(c->model_type, c->num_labels > 0)));
  if (c->num_labels == 1) {  // what transformers writes for num_labels=1
    json_object_set_new(j, "id2label", json_pack("{s:s}", "0", "LABEL_0"));
    json_object_set_new(j, "label2id", json_pack("{s:i}", "LABEL_0", 0));
  }
  json_object_set_new(j, "model_type", json_string(c->model_type));
  json_object_set_new(j, "vocab_size", json_integer(c->vocab_size));
  json_object_set_new(j, "hidden_size", json_integer(c->hidden_size));
  json_object_set_new(j, "intermediate_size", json_integer(c->intermediate_size));
  json_object_set_new(j, "num_hidden_layers", json_integer(c->num_layers));
  json_object_set_new(j, "num_attention_heads", json_integer(c->num_heads));
  json_object_set_new(j, "num_key_value_heads", json_integer(c->num_kv_heads));
  json_object_set_new(j, "head_dim", json_integer(c->head_dim));
  if (c->gemma) write_gemma(j, c);
  else json_object_set_new(j, "hidden_act", json_string("silu"));
  json_object_set_new(j, "max_position_embeddings", json_integer(c->max_position_embeddings));
  json_object_set_new(j, "rms_norm_eps", json_float(c->rms_norm_eps));
  json_object_set_new(j, "rope_theta", json_float(c->rope_theta));
  json_object_set_new(j, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
  json_object_set_new(j, "attention_bias", json_false());
  json_object_set_new(j, "attention_dropout", json_real(0));
  if (strcmp(c->model_type, "llama") == 0) json_object_set_new(j, "mlp_bias", json_false());
  if (strcmp(c->model_type, "qwen2") == 0 || strcmp(c->model_type, "qwen3") == 0)
    json_object_set_new(j, "use_sliding_window", json_false());
  if (strcmp(c->model_type, "mistral") == 0) json_object_set_new(j, "sliding_window", json_null());
  if (c->rope_type == 1)
    json_object_set_new(j, "rope_scaling",
                        json_pack("{s:s,s:o,s:o,s:o,s:i}", "rope_type", "llama3", "factor",
                                  json_float(c->rope_factor), "low_freq_factor",
                                  json_float(c->rope_low_freq_factor), "high_freq_factor",
                                  json_float(c->rope_high_freq_factor),
                                  "original_max_position_embeddings", c->rope_original_max_pos));
  else if (c->rope_type == 2)
    json_object_set_new(j, "rope_scaling", json_pack("{s:s,s:o}", "rope_type", "linear", "factor",
                                                     json_float(c->rope_factor)));
  else
    json_object_set_new(j, "rope_scaling", json_null());
  const char *ids[] = {"bos_token_id", "eos_token_id", "pad_token_id"};
  int vals[] = {c->bos_token_id, c->eos_token_id, c->pad_token_id};
  for (int i = 0; i < 3; i++)
    json_object_set_new(j, ids[i], vals[i] >= 0 ? json_integer(vals[i]) : json_null());
  json_object_set_new(j, "torch_dtype", json_string(torch_dtype));
  json_object_set_new(j, "use_cache", json_true());
  int rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_REAL_PRECISION(9));  // see json_float
  json_decref(j);
  return rc ? ct_set_error(CT_EIO, "%s: cannot write: %s", path, strerror(errno)) : 0;
}

// ---------------------------------------------------------------------------
// Tensors

static void tensor_name(char *out, size_t n, const ct_tensor_info *t, const char *suffix) {
  snprintf(out, n, "%s%s", t->name, suffix ? suffix : "");
}

// new_score: d holds a causal LM read into a sequence classifier, whose score.weight is
// new (left as buf has it) and whose LM head goes unread.
static int load_from_dir(const ct_model *m, float *buf, const ct_st_dir *d, bool new_score) {
  for (int i = 0; i < m->n_hf_tensors; i++) {  // (multi-token prediction's are mtp.h's)
    const ct_tensor_info *ti = &m->tensors[i];
    const char *name = ti->name;
    const ct_safetensors *st;
    const ct_st_tensor *t;
    if (new_score && strcmp(name, "score.weight") == 0) continue;
    int rc = ct_st_dir_find(d, name, &st, &t);
    if (rc) return rc;
    bool ok = t->ndim == ti->ndim && t->shape[0] == ti->shape[0] &&
              (ti->ndim == 1 || t->shape[1] == ti->shape[1]);
    if (!ok) {
      char got[128] = "", want[64];
      for (int k = 0, n = 0; k < t->ndim && n < (int)sizeof got; k++)
        n += snprintf(got + n, sizeof got - n, "%s%lld", k ? ", " : "", (long long)t->shape[k]);
      if (ti->ndim == 1) snprintf(want, sizeof want, "%ld", ti->shape[0]);
      else snprintf(want, sizeof want, "%ld, %ld", ti->shape[0], ti->shape[1]);
      return ct_set_error(CT_EFORMAT, "%s: tensor '%s' has shape [%s] but config.json implies [%s]",
                          st->path, name, got, want);
    }
    if ((rc = ct_st_read_f32(st, t, buf + ti->offset, ti->numel))) return rc;
  }
  // Anything else in the files is a tensor this model would silently ignore.
  for (int i = 0; i < d->n; i++) {
    const char *nm = d->entries[i].name;
    if (strstr(nm, "rotary_emb.inv_freq")) continue;
    // a tied head some checkpoints still store: the embedding is the head
    if ((m->cfg.tie_word_embeddings || new_score) && strcmp(nm, "lm_head.weight") == 0) continue;
    if (!ct_model_find_tensor(m, nm))
      return ct_set_error(CT_EFORMAT, "%s: tensor '%s' is not part of a %s model with this "
                          "config.json", d->path, nm, m->cfg.model_type);
  }
  return 0;
}

int ct_model_load_weights(const ct_model *m, float *buf, const char *dir) {
  ct_st_dir d = {0};
  ct_model_config have = {0};
  int rc = m->cfg.num_labels ? ct_model_read_config(&have, dir) : 0;
  if (!rc) rc = ct_st_dir_open(&d, dir);
  if (!rc) rc = load_from_dir(m, buf, &d, m->cfg.num_labels && !have.num_labels);
  ct_st_dir_close(&d);
  return rc;
}

int ct_model_read_config(ct_model_config *c, const char *dir) {
  char path[CT_PATH_MAX];
  int rc = ct_path_join(path, sizeof path, dir, "config.json");
  return rc ? rc : ct_hf_config_read(c, path);
}

int ct_model_load(ct_model *m, const char *dir, int max_pos) {
  ct_model_config c;
  int rc = ct_model_read_config(&c, dir);
  if (rc) return rc;
  if ((rc = ct_model_init(m, &c, max_pos))) return rc;
  if ((rc = ct_model_load_weights(m, m->params, dir))) ct_model_free(m);
  return rc;
}

int ct_save_tensors(const ct_layout *m, int nbuf, const float *const *bufs,
                    const char *const *suffixes, const char *path, ct_dtype dtype) {
  int cap = m->n_tensors * nbuf;
  ct_st_entry *e = calloc(cap, sizeof *e);
  char (*names)[128] = calloc(cap, sizeof *names);
  if (!e || !names) {
    free(e);
    free(names);
    return ct_set_error(CT_ENOMEM, "%s: out of memory", path);
  }
  int n = 0;
  for (int b = 0; b < nbuf; b++)
    for (int i = 0; i < m->n_tensors; i++) {
      const ct_tensor_info *ti = &m->tensors[i];
      tensor_name(names[n], sizeof names[n], ti, suffixes ? suffixes[b] : NULL);
      e[n] = (ct_st_entry){.name = names[n], .dtype = dtype, .ndim = ti->ndim,
                           .data_f32 = bufs[b] + ti->offset};
      e[n].shape[0] = ti->shape[0];
      e[n].shape[1] = ti->shape[1];
      n++;
    }
  const char *mk[] = {"format"}, *mv[] = {"pt"};  // transformers expects format=pt
  int rc = ct_st_write(path, e, n, mk, mv, 1);
  free(e);
  free(names);
  return rc;
}

int ct_load_tensors(const ct_layout *m, float *buf, const char *path, const char *suffix) {
  ct_safetensors st = {0};
  int rc = ct_st_open(&st, path);
  char name[128];
  for (int i = 0; i < m->n_tensors && !rc; i++) {
    const ct_tensor_info *ti = &m->tensors[i];
    tensor_name(name, sizeof name, ti, suffix);
    const ct_st_tensor *t = ct_st_find(&st, name);
    if (!t) {
      rc = ct_set_error(CT_EFORMAT, "%s: tensor '%s' is missing", path, name);
      break;
    }
    rc = ct_st_read_f32(&st, t, buf + ti->offset, ti->numel);
  }
  ct_st_close(&st);
  return rc;
}

// ---------------------------------------------------------------------------
// Directories
