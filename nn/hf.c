// hf: Hugging Face model directories — config.json <-> ct_model_config, and every tensor
// of a model layout to and from safetensors (one file or a sharded index) with HF names.
// Checkpoint directories (atomic saves, rotation) are ckpt's; this only reads and writes files.
#include "hf.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "fs.h"
#include "hfjson.h"

// ---------------------------------------------------------------------------
// config.json

typedef struct {
  const char *path;
  json_t *j;
  const char *in;  // "" or the enclosing key and a dot ("rope_scaling."), for messages
} cfg_reader;

// A JSON value as short text for a message.
static void shown_value(const json_t *v, char *buf, size_t n) {
  char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
  snprintf(buf, n, "%.40s%s", t ? t : "?", t && strlen(t) > 40 ? "..." : "");
  free(t);
}

// key's value, or NULL when it is absent or null (the key takes its default).
static json_t *given(const cfg_reader *r, const char *key) {
  json_t *v = json_object_get(r->j, key);
  return json_is_null(v) ? NULL : v;
}

// An integer key; its range is ct_model_config_check's (which names the key).
static int get_int(const cfg_reader *r, const char *key, long def, bool required, int *out) {
  json_t *v = given(r, key);
  if (!v) {
    if (required) return ct_set_error(CT_EFORMAT, "%s: key '%s%s' is missing", r->path, r->in, key);
    *out = (int)def;
    return 0;
  }
  char text[48];
  shown_value(v, text, sizeof text);
  if (!json_is_integer(v))
    return ct_set_error(CT_EFORMAT, "%s: key '%s%s' is %s: expected an integer", r->path, r->in, key, text);
  if (json_integer_value(v) < INT_MIN || json_integer_value(v) > INT_MAX)
    return ct_set_error(CT_EFORMAT, "%s: key '%s%s' is %s: out of range for any model", r->path, r->in, key, text);
  *out = (int)json_integer_value(v);
  return 0;
}

static int get_float(const cfg_reader *r, const char *key, double def, float *out) {
  json_t *v = given(r, key);
  if (!v) return *out = (float)def, 0;
  if (!json_is_number(v))
    return ct_set_error(CT_EFORMAT, "%s: key '%s%s': expected a number", r->path, r->in, key);
  *out = (float)json_number_value(v);
  return 0;
}

static int get_bool(const cfg_reader *r, const char *key, bool def, bool *out) {
  json_t *v = given(r, key);
  if (!v) return *out = def, 0;
  if (!json_is_boolean(v))
    return ct_set_error(CT_EFORMAT, "%s: key '%s%s': expected true or false", r->path, r->in, key);
  *out = json_is_true(v);
  return 0;
}

// bos/eos/pad_token_id: absent, null or negative (older configs write -1) is none;
// eos_token_id may be a list (Llama 3.1), whose first id is kept.
static int get_token_id(const cfg_reader *r, const char *key, int *out) {
  json_t *v = json_object_get(r->j, key);
  if (json_is_array(v)) v = json_array_get(v, 0);
  *out = -1;
  if (!v || json_is_null(v)) return 0;
  char text[48];
  shown_value(v, text, sizeof text);
  if (!json_is_integer(v) || json_integer_value(v) > INT_MAX)
    return ct_set_error(CT_EFORMAT, "%s: key '%s' is %s: expected a token id", r->path, key, text);
  if (json_integer_value(v) >= 0) *out = (int)json_integer_value(v);
  return 0;
}

// A rope_scaling object (or transformers 5's rope_parameters, named `key`): llama3 or linear.
static int read_rope_scaling(const cfg_reader *r, json_t *rs, const char *key, ct_model_config *c) {
  c->rope_type = 0;
  if (!rs || json_is_null(rs)) return 0;
  if (!json_is_object(rs)) return ct_set_error(CT_EFORMAT, "%s: key '%s': expected an object", r->path, key);
  const char *type = json_string_value(json_object_get(rs, "rope_type"));
  if (!type) type = json_string_value(json_object_get(rs, "type"));
  if (type && strcmp(type, "default") == 0) return 0;
  char in[64];
  snprintf(in, sizeof in, "%s.", key);
  cfg_reader sub = {r->path, rs, in};
  if (type && strcmp(type, "linear") == 0) {
    c->rope_type = 2;
    return get_float(&sub, "factor", 1, &c->rope_factor);
  }
  if (!type || strcmp(type, "llama3") != 0)
    return ct_set_error(CT_EFORMAT, "%s: %s type '%s' is not supported (default, llama3, linear)", r->path, key,
                        type ? type : "?");
  c->rope_type = 1;
  int rc = get_float(&sub, "factor", 8, &c->rope_factor);
  if (!rc) rc = get_float(&sub, "low_freq_factor", 1, &c->rope_low_freq_factor);
  if (!rc) rc = get_float(&sub, "high_freq_factor", 4, &c->rope_high_freq_factor);
  if (!rc) rc = get_int(&sub, "original_max_position_embeddings", 8192, false, &c->rope_original_max_pos);
  return rc;
}

// RoPE: transformers 4's rope_theta and rope_scaling (Gemma: rope_local_base_freq), or
// transformers 5's rope_parameters {"rope_type", "rope_theta", "factor", ...} — Gemma 3's
// one per layer type, {"full_attention": {...}, "sliding_attention": {...}} — which wins
// where both are written (as transformers 5 reads them).
static int read_rope(const cfg_reader *r, ct_model_config *c, bool gemma) {
  int rc = get_float(r, "rope_theta", gemma ? 1e6 : 10000, &c->rope_theta);
  if (!rc && gemma) rc = get_float(r, "rope_local_base_freq", 10000, &c->rope_local_theta);
  if (rc) return rc;
  json_t *rp = json_object_get(r->j, "rope_parameters");
  if (!rp || json_is_null(rp)) return read_rope_scaling(r, json_object_get(r->j, "rope_scaling"), "rope_scaling", c);
  if (!json_is_object(rp)) return ct_set_error(CT_EFORMAT, "%s: key 'rope_parameters': expected an object", r->path);
  json_t *full = json_object_get(rp, "full_attention"), *local = json_object_get(rp, "sliding_attention");
  if (full || local) {
    if (!gemma)
      return ct_set_error(CT_EFORMAT, "%s: key 'rope_parameters': one per layer type is gemma3_text's", r->path);
    ct_model_config lc = *c;
    cfg_reader sub = {r->path, local, "rope_parameters.sliding_attention."};
    if (local && ((rc = get_float(&sub, "rope_theta", c->rope_local_theta, &c->rope_local_theta)) ||
                  (rc = read_rope_scaling(r, local, "rope_parameters.sliding_attention", &lc))))
      return rc;
    if (lc.rope_type)
      return ct_set_error(CT_EFORMAT, "%s: key 'rope_parameters.sliding_attention': RoPE scaling on the "
                          "sliding-window layers is not supported", r->path);
    if (!(rp = full)) return 0;
  }
  cfg_reader sub = {r->path, rp, full ? "rope_parameters.full_attention." : "rope_parameters."};
  rc = get_float(&sub, "rope_theta", c->rope_theta, &c->rope_theta);
  return rc ? rc : read_rope_scaling(r, rp, full ? "rope_parameters.full_attention" : "rope_parameters", c);
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
      (rc = get_int(r, "sliding_window", 0, false, &c->sliding_window)) ||
      (rc = get_int(r, "sliding_window_pattern", 6, false, &pattern)))
    return rc;
  if (!(c->query_pre_attn_scalar > 0))
    return ct_set_error(CT_EFORMAT, "%s: key 'query_pre_attn_scalar' is %g: must be positive", r->path,
                        (double)c->query_pre_attn_scalar);
  if (c->num_layers > CT_MAX_LAYERS || c->num_layers < 0)  // (c->sliding's size; ct_model_config_check says more)
    return ct_set_error(CT_EFORMAT, "%s: key 'num_hidden_layers' is %d: at most %d", r->path, c->num_layers,
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
  cfg_reader r = {path, j, ""};
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
      (rc = get_int(&r, "head_dim", c->num_heads > 0 ? c->hidden_size / c->num_heads : 0, false, &c->head_dim)) ||
      (rc = get_int(&r, "max_position_embeddings", 2048, false, &c->max_position_embeddings)) ||
      (rc = get_float(&r, "rms_norm_eps", 1e-6, &c->rms_norm_eps)) ||
      (rc = get_bool(&r, "tie_word_embeddings", gemma, &c->tie_word_embeddings)) ||
      (rc = read_rope(&r, c, gemma)) || (gemma && (rc = read_gemma(&r, c))))
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
  if ((rc = get_token_id(&r, "bos_token_id", &c->bos_token_id)) ||
      (rc = get_token_id(&r, "eos_token_id", &c->eos_token_id)) ||
      (rc = get_token_id(&r, "pad_token_id", &c->pad_token_id)) || (rc = read_num_labels(&r, &c->num_labels)))
    goto done;
  if (ct_model_config_check(c)) rc = ct_wrap_error(CT_EFORMAT, "%s", path);
  json_t *hd = json_object_get(j, "head_dim");
  if (!rc && (!hd || json_is_null(hd)) && c->hidden_size % c->num_heads)
    rc = ct_set_error(CT_EFORMAT, "%s: key 'hidden_size' (%d) is not a multiple of num_attention_heads (%d), and "
                      "there is no head_dim", path, c->hidden_size, c->num_heads);
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
// 1e-06, not 9.9999999747524271e-07), which ct_hfjson_write prints as that decimal.
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
  float q = c->query_pre_attn_scalar;  // an int in transformers' Gemma3TextConfig (strict in 5.x)
  json_object_set_new(j, "query_pre_attn_scalar", q == (float)(int)q ? json_integer((int)q) : json_float(q));
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

// What transformers writes for a model of this config from scratch.
static json_t *fresh_config(const ct_model_config *c, const char *torch_dtype, const char *dtype_key) {
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
  json_object_set_new(j, dtype_key, json_string(torch_dtype));
  json_object_set_new(j, "use_cache", json_true());
  return j;
}

json_t *ct_hf_config_json(const ct_model_config *c, const char *torch_dtype, const char *source_dir) {
  char p[CT_PATH_MAX];
  json_t *src = source_dir && source_dir[0] && !ct_path_join(p, sizeof p, source_dir, "config.json")
                    ? json_load_file(p, 0, NULL) : NULL;
  if (!json_is_object(src)) {
    json_decref(src);
    return fresh_config(c, torch_dtype, "torch_dtype");
  }
  // transformers 5 writes dtype, 4 torch_dtype; a reward model from a causal LM gets its
  // architecture and labels, pad_token_id its tokenizer's (transformers pools with it)
  bool v5 = json_object_get(src, "dtype") && !json_object_get(src, "torch_dtype");
  json_t *fresh = fresh_config(c, torch_dtype, v5 ? "dtype" : "torch_dtype");
  const char *add[] = {"architectures", "id2label", "label2id", "torch_dtype", "dtype", "pad_token_id", NULL};
  json_t *j = ct_hfjson_merge(src, fresh, add);
  json_decref(fresh);
  json_decref(src);
  return j;
}

int ct_hf_config_write(const ct_model_config *c, const char *path, const char *torch_dtype, const char *source_dir) {
  json_t *j = ct_hf_config_json(c, torch_dtype, source_dir);
  int rc = j ? ct_hfjson_write(j, path) : ct_set_error(CT_ENOMEM, "%s: out of memory", path);
  json_decref(j);
  return rc;
}

// ---------------------------------------------------------------------------
// Tensors

static void tensor_name(char *out, size_t n, const ct_tensor_info *t, const char *suffix) {
  snprintf(out, n, "%s%s", t->name, suffix ? suffix : "");
}

// The config.json keys behind dimension k of a tensor, by the end of its name.
static const char *dim_key(const char *name, int k) {
  static const struct { const char *suffix, *d0, *d1; } dims[] = {
      {"embed_tokens.weight", "vocab_size", "hidden_size"},
      {"lm_head.weight", "vocab_size", "hidden_size"},
      {"score.weight", "num_labels", "hidden_size"},
      {"q_proj.weight", "num_attention_heads x head_dim", "hidden_size"},
      {"k_proj.weight", "num_key_value_heads x head_dim", "hidden_size"},
      {"v_proj.weight", "num_key_value_heads x head_dim", "hidden_size"},
      {"q_proj.bias", "num_attention_heads x head_dim", NULL},
      {"k_proj.bias", "num_key_value_heads x head_dim", NULL},
      {"v_proj.bias", "num_key_value_heads x head_dim", NULL},
      {"o_proj.weight", "hidden_size", "num_attention_heads x head_dim"},
      {"q_norm.weight", "head_dim", NULL},
      {"k_norm.weight", "head_dim", NULL},
      {"gate_proj.weight", "intermediate_size", "hidden_size"},
      {"up_proj.weight", "intermediate_size", "hidden_size"},
      {"down_proj.weight", "hidden_size", "intermediate_size"},
      {"eh_proj.weight", "hidden_size", "2 x hidden_size"},
  };
  size_t n = strlen(name);
  for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) {
    size_t m = strlen(dims[i].suffix);
    if (n >= m && strcmp(name + n - m, dims[i].suffix) == 0) return k ? (dims[i].d1 ? dims[i].d1 : "?") : dims[i].d0;
  }
  return k ? "?" : "hidden_size";  // the norms
}

// A tensor whose shape is not the layout's: both shapes and the key behind the dimension
// that differs (or all of them, when the number of dimensions differs).
static int shape_error(const char *path, const ct_tensor_info *ti, const ct_st_tensor *t) {
  char got[128] = "", want[64];
  for (int k = 0, n = 0; k < t->ndim && n < (int)sizeof got; k++)
    n += snprintf(got + n, sizeof got - n, "%s%lld", k ? ", " : "", (long long)t->shape[k]);
  if (ti->ndim == 1) snprintf(want, sizeof want, "%ld", ti->shape[0]);
  else snprintf(want, sizeof want, "%ld, %ld", ti->shape[0], ti->shape[1]);
  int k = 0;
  while (t->ndim == ti->ndim && k < ti->ndim - 1 && t->shape[k] == ti->shape[k]) k++;
  if (t->ndim == ti->ndim)
    return ct_set_error(CT_EFORMAT, "%s: tensor '%s' has shape [%s] but config.json's %s implies [%s]", path,
                        ti->name, got, dim_key(ti->name, k), want);
  return ct_set_error(CT_EFORMAT, "%s: tensor '%s' has shape [%s] but config.json implies [%s] (%s%s%s)", path,
                      ti->name, got, want, dim_key(ti->name, 0), ti->ndim > 1 ? ", " : "",
                      ti->ndim > 1 ? dim_key(ti->name, 1) : "");
}

// Layer l of a name "model.layers.<l>....", or -1.
static int layer_of(const char *name) {
  int l, n = 0;
  return sscanf(name, "model.layers.%d.%n", &l, &n) == 1 && n > 0 ? l : -1;
}

// A tensor of the layout that d lacks: when its whole layer is missing, the layer count is wrong.
static int missing_error(const ct_model *m, const ct_st_dir *d, const char *name) {
  int l = layer_of(name);
  for (int i = 0; l >= 0 && i < d->n; i++)
    if (layer_of(d->entries[i].name) == l) l = -1;  // the layer is there: only this tensor is missing
  if (l >= 0)
    return ct_set_error(CT_EFORMAT, "%s: config.json's num_hidden_layers is %d but the weights have no layer %d "
                        "(no tensor '%s')", d->path, m->cfg.num_layers, l, name);
  if (strcmp(name, "score.weight") == 0)
    return ct_set_error(CT_EFORMAT, "%s: config.json names a sequence classifier but %s has no score.weight (the "
                        "classification head)", d->path, d->path);
  return ct_st_dir_find(d, name, NULL, NULL);
}

int ct_model_check_weights(const ct_model *m, const ct_st_dir *d, bool new_score, bool others_ok) {
  for (int i = 0; i < m->n_hf_tensors; i++) {  // (multi-token prediction's are mtp.h's)
    const ct_tensor_info *ti = &m->tensors[i];
    const ct_safetensors *st;
    const ct_st_tensor *t;
    if (new_score && strcmp(ti->name, "score.weight") == 0) continue;
    if (ct_st_dir_find(d, ti->name, &st, &t)) return missing_error(m, d, ti->name);
    if (t->ndim != ti->ndim || t->shape[0] != ti->shape[0] || (ti->ndim == 2 && t->shape[1] != ti->shape[1]))
      return shape_error(st->path, ti, t);
  }
  // Anything else in the files is a tensor this model would silently ignore.
  for (int i = 0; i < d->n && !others_ok; i++) {
    const char *nm = d->entries[i].name;
    if (strstr(nm, "rotary_emb.inv_freq")) continue;
    // a tied head some checkpoints still store: the embedding is the head
    if ((m->cfg.tie_word_embeddings || new_score) && strcmp(nm, "lm_head.weight") == 0) continue;
    if (layer_of(nm) >= m->cfg.num_layers)
      return ct_set_error(CT_EFORMAT, "%s: config.json's num_hidden_layers is %d but the weights hold tensor '%s'",
                          d->path, m->cfg.num_layers, nm);
    if (!ct_model_find_tensor(m, nm))
      return ct_set_error(CT_EFORMAT, "%s: tensor '%s' is not part of a %s model with this "
                          "config.json", d->path, nm, m->cfg.model_type);
  }
  return 0;
}

// new_score: d holds a causal LM read into a sequence classifier, whose score.weight is
// new (left as buf has it) and whose LM head goes unread.
static int load_from_dir(const ct_model *m, float *buf, const ct_st_dir *d, bool new_score) {
  int rc = ct_model_check_weights(m, d, new_score, false);
  for (int i = 0; i < m->n_hf_tensors && !rc; i++) {
    const ct_tensor_info *ti = &m->tensors[i];
    const ct_safetensors *st;
    const ct_st_tensor *t;
    if (new_score && strcmp(ti->name, "score.weight") == 0) continue;
    if (!(rc = ct_st_dir_find(d, ti->name, &st, &t))) rc = ct_st_read_f32(st, t, buf + ti->offset, ti->numel);
  }
  return rc;
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

// config.json, then the weights' names and shapes against it (their headers only), so
// that a config.json the weights contradict is refused before anything is allocated.
int ct_model_read_config(ct_model_config *c, const char *dir) {
  char path[CT_PATH_MAX];
  int rc = ct_path_join(path, sizeof path, dir, "config.json");
  if (rc || (rc = ct_hf_config_read(c, path))) return rc;
  ct_model lay;
  ct_st_dir d = {0};
  if ((rc = ct_model_layout(&lay, c))) return rc;
  if (!(rc = ct_st_dir_open(&d, dir))) rc = ct_model_check_weights(&lay, &d, false, false);
  ct_st_dir_close(&d);
  ct_model_free(&lay);
  return rc;
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
