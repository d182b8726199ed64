// ctune-ckpt gguf: a model directory or checkpoint (maybe merged with a LoRA adapter) as
// one GGUF file: the tensors through nn/gguf's writer (streamed from the safetensors
// files, or copied from the merged model) and the tokenizer as llama.cpp reads it.
#include <malloc.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <jansson.h>

#include "chat_template.h"
#include "ckpt.h"
#include "error.h"
#include "fs.h"
#include "gguf.h"
#include "hf.h"
#include "lora.h"
#include "tokenizer.h"

// Where the tensors come from: the safetensors files of a directory (streamed), or a
// merged model in memory.
typedef struct {
  ct_st_dir dir;
  const ct_model *m;  // non-NULL: copy from m->params
} tensor_src;

static int read_tensor(void *ctx, const ct_tensor_info *ti, float *dst) {
  tensor_src *s = ctx;
  if (s->m) return memcpy(dst, s->m->params + ti->offset, ti->numel * sizeof(float)), 0;
  const ct_safetensors *st;
  const ct_st_tensor *t;
  int rc = ct_st_dir_find(&s->dir, ti->name, &st, &t);
  if (rc) return rc;
  if (t->ndim != ti->ndim || t->shape[0] != ti->shape[0] || (ti->ndim == 2 && t->shape[1] != ti->shape[1]))
    return ct_set_error(CT_EFORMAT, "%s: tensor '%s' does not have the shape config.json implies", st->path,
                        ti->name);
  if ((rc = ct_st_read_f32(st, t, dst, ti->numel))) return rc;
  // the tensor's pages of the read-only mapping are not read again: let them go, so
  // resident memory holds one tensor at a time
  long page = sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)ct_st_data(st, t), b = a + (t->end - t->begin);
  a = (a + page - 1) / page * page, b = b / page * page;
  if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
  return 0;
}

// The tokenizer as llama.cpp reads it, from tokenizer.json (+ tokenizer_config.json).
typedef struct {
  const char *dir;
  char file[CT_PATH_MAX];  // dir/tokenizer.json, for messages
  json_t *root, *model;
  ct_tokenizer *tok;        // owned: freed with the rest once the key/values are written
  int V;                   // the model's vocabulary: the token arrays' length
  const char **text;       // (V) each id's token string in tokenizer.json, or NULL (unused id)
  size_t *len;
  int *type;               // (V) CT_TOK_*
  bool spm;                // SentencePiece-style (tokenizer.ggml.model "llama"), else byte-level ("gpt2")
} gguf_tok;

// does j (a pre-tokenizer or decoder, maybe a Sequence) contain a step of this type?
static bool has_step(const json_t *j, const char *type) {
  if (!json_is_object(j)) return false;
  const char *t = json_string_value(json_object_get(j, "type"));
  if (t && !strcmp(t, type)) return true;
  static const char *const lists[] = {"pretokenizers", "decoders", "normalizers"};
  for (int k = 0; k < 3; k++) {
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(j, lists[k]), i, e) if (has_step(e, type)) return true;
  }
  return false;
}

// the Split regex of a byte-level pre-tokenizer, or NULL
static const char *split_regex(const json_t *j) {
  if (!json_is_object(j)) return NULL;
  const char *t = json_string_value(json_object_get(j, "type"));
  if (t && !strcmp(t, "Split")) return json_string_value(json_object_get(json_object_get(j, "pattern"), "Regex"));
  size_t i;
  json_t *e;
  json_array_foreach(json_object_get(j, "pretokenizers"), i, e) {
    const char *r = split_regex(e);
    if (r) return r;
  }
  return NULL;
}

// llama.cpp's name for a byte-level pre-tokenizer (tokenizer.ggml.pre), by its regex
static int pre_name(const gguf_tok *g, const char **out) {
  static const char *const llama3 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  static const char *const qwen2 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const json_t *pre = json_object_get(g->root, "pre_tokenizer");
  const char *re = split_regex(pre);
  if (!re && !has_step(pre, "Digits")) return *out = "gpt-2", 0;  // ByteLevel's own GPT-2 regex
  if (!re) return *out = "smollm", 0;  // digits one by one, then GPT-2's regex (SmolLM)
  if (re && !strcmp(re, llama3)) return *out = "llama-bpe", 0;
  if (re && !strcmp(re, qwen2)) return *out = "qwen2", 0;
  return ct_set_error(CT_EFORMAT, "%s: pre_tokenizer: no llama.cpp pre-tokenizer is known to match it "
                      "(known: GPT-2, SmolLM, Llama 3, Qwen2)", g->file);
}

static bool is_byte_token(const char *s, size_t n) {
  return n == 6 && !strncmp(s, "<0x", 3) && s[5] == '>' && strchr("0123456789ABCDEFabcdef", s[3]) &&
         strchr("0123456789ABCDEFabcdef", s[4]) && s[3] && s[4];
}

static int tok_set(gguf_tok *g, int id, const char *s, size_t n, int type) {
  if (id < 0 || id >= g->V)
    return ct_set_error(CT_EFORMAT, "%s: token id %d ('%.*s') is outside the model's vocab_size %d", g->file, id,
                        (int)(n < 40 ? n : 40), s, g->V);
  g->text[id] = s, g->len[id] = n, g->type[id] = type;
  return 0;
}

// tokenizer.json -> g->text/len/type
static int tok_vocab(gguf_tok *g) {
  json_t *vocab = json_object_get(g->model, "vocab");
  if (!json_is_object(vocab)) return ct_set_error(CT_EFORMAT, "%s: model.vocab is not an object", g->file);
  const char *unk = json_string_value(json_object_get(g->model, "unk_token"));
  const char *key;
  json_t *v;
  json_object_foreach(vocab, key, v) {
    size_t n = strlen(key);
    int type = unk && !strcmp(key, unk) ? CT_TOK_UNKNOWN : g->spm && is_byte_token(key, n) ? CT_TOK_BYTE : CT_TOK_NORMAL;
    int rc = tok_set(g, (int)json_integer_value(v), key, n, type);
    if (rc) return rc;
  }
  size_t i;
  json_array_foreach(json_object_get(g->root, "added_tokens"), i, v) {
    const char *s = json_string_value(json_object_get(v, "content"));
    if (!s) return ct_set_error(CT_EFORMAT, "%s: added_tokens[%zu].content is not a string", g->file, i);
    int id = (int)json_integer_value(json_object_get(v, "id"));
    if (id >= g->V) {  // the model has no row for it (Gemma 3's <image_soft_token> 262144 in a 262,144-token
      // model): left out, as llama.cpp's convert_hf_to_gguf.py does
      fprintf(stderr, "ctune-ckpt: gguf: %s: added token %d '%s' is past the model's vocab_size %d: left out\n",
              g->file, id, s, g->V);
      continue;
    }
    int type = unk && !strcmp(s, unk) ? CT_TOK_UNKNOWN
               : json_is_true(json_object_get(v, "special")) ? CT_TOK_CONTROL : CT_TOK_USER_DEFINED;
    int rc = tok_set(g, id, s, strlen(s), type);
    if (rc) return rc;
  }
  return 0;
}

// merge i as "a b" into buf (the array form ["a", "b"] or the string form)
static const char *merge_text(const json_t *m, char **buf, size_t *cap, size_t *len) {
  if (json_is_string(m)) return *len = json_string_length(m), json_string_value(m);
  const char *a = json_string_value(json_array_get(m, 0)), *b = json_string_value(json_array_get(m, 1));
  if (!a || !b) return NULL;
  size_t na = strlen(a), nb = strlen(b);
  if (na + nb + 2 > *cap) {
    char *p = realloc(*buf, *cap = 2 * (na + nb + 2));
    if (!p) return NULL;
    *buf = p;
  }
  memcpy(*buf, a, na);
  (*buf)[na] = ' ';
  memcpy(*buf + na + 1, b, nb + 1);
  *len = na + nb + 1;
  return *buf;
}

static int kv_merges(gguf_tok *g, ct_gguf_writer *w) {
  json_t *merges = json_object_get(g->model, "merges");
  size_t n = json_array_size(merges), cap = 0, len, i;
  char *buf = NULL;
  int rc = ct_gguf_arr_begin(w, "tokenizer.ggml.merges", CT_GGUF_V_STR, n);
  json_t *m;
  json_array_foreach(merges, i, m) {
    if (rc) break;
    const char *s = merge_text(m, &buf, &cap, &len);
    rc = s ? ct_gguf_arr_str(w, s, len) : ct_set_error(CT_EFORMAT, "%s: model.merges[%zu] is not a pair", g->file, i);
  }
  free(buf);
  return rc;
}

// SentencePiece scores, which llama.cpp's merging ranks by (highest first): -rank of the
// first merge that makes the token, so its merging is the BPE's; tokens no merge makes
// rank below all of them, by id.
static int spm_scores(gguf_tok *g, float *score) {
  json_t *vocab = json_object_get(g->model, "vocab"), *merges = json_object_get(g->model, "merges");
  size_t nm = json_array_size(merges), cap = 0, len, i;
  for (int id = 0; id < g->V; id++) score[id] = g->type[id] == CT_TOK_NORMAL ? -(float)(nm + id) : 0;
  char *buf = NULL, *joined = NULL;
  json_t *m;
  int rc = 0;
  json_array_foreach(merges, i, m) {
    const char *s = merge_text(m, &buf, &cap, &len);
    const char *sp = s ? memchr(s, ' ', len) : NULL;
    if (!sp) {
      rc = ct_set_error(CT_EFORMAT, "%s: model.merges[%zu] is not a pair", g->file, i);
      break;
    }
    char *j = realloc(joined, len);
    if (!j) {
      rc = ct_set_error(CT_ENOMEM, "%s: out of memory", g->file);
      break;
    }
    joined = j;
    size_t na = sp - s;
    memcpy(joined, s, na);
    memcpy(joined + na, sp + 1, len - na - 1);
    joined[len - 1] = 0;
    json_t *id = json_object_get(vocab, joined);
    json_int_t k = json_integer_value(id);
    if (id && k >= 0 && k < g->V && score[k] < -(float)i) score[k] = -(float)i;
  }
  free(buf);
  free(joined);
  return rc;
}

// Prepend("▁") among the normalizers, or a Metaspace that prepends
static bool spm_adds_space(const gguf_tok *g) {
  if (has_step(json_object_get(g->root, "normalizer"), "Prepend")) return true;
  const json_t *pre = json_object_get(g->root, "pre_tokenizer");
  if (!has_step(pre, "Metaspace")) return false;
  const char *scheme = json_string_value(json_object_get(pre, "prepend_scheme"));
  return scheme ? strcmp(scheme, "never") != 0 : json_is_true(json_object_get(pre, "add_prefix_space"));
}

static int kv_tokens(gguf_tok *g, ct_gguf_writer *w) {
  char pad[32];
  int rc = ct_gguf_arr_begin(w, "tokenizer.ggml.tokens", CT_GGUF_V_STR, g->V);
  for (int id = 0; id < g->V && !rc; id++) {
    // an id tokenizer.json does not use (the model's vocabulary is larger): as convert_hf_to_gguf.py names it
    int n = g->text[id] ? 0 : snprintf(pad, sizeof pad, "[PAD%d]", id);
    rc = g->text[id] ? ct_gguf_arr_str(w, g->text[id], g->len[id]) : ct_gguf_arr_str(w, pad, n);
  }
  if (!rc) rc = ct_gguf_arr_begin(w, "tokenizer.ggml.token_type", CT_GGUF_V_I32, g->V);
  for (int id = 0; id < g->V && !rc; id++) rc = ct_gguf_arr_i32(w, g->text[id] ? g->type[id] : CT_TOK_UNUSED);
  return rc;
}

static int kv_special(gguf_tok *g, ct_gguf_writer *w) {
  int rc = 0;
  const char *unk = json_string_value(json_object_get(g->model, "unk_token"));
  int ids[4] = {ct_tokenizer_bos(g->tok), ct_tokenizer_eos(g->tok), unk ? ct_tokenizer_token_id(g->tok, unk) : -1,
                ct_tokenizer_pad(g->tok)};
  static const char *const keys[4] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                      "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"};
  for (int k = 0; k < 4 && !rc; k++)
    if (ids[k] >= 0) rc = ct_gguf_kv_u32(w, keys[k], ids[k]);
  if (!rc) rc = ct_gguf_kv_bool(w, "tokenizer.ggml.add_bos_token", ct_tokenizer_add_bos(g->tok));
  if (!rc) rc = ct_gguf_kv_bool(w, "tokenizer.ggml.add_eos_token", ct_tokenizer_add_eos(g->tok));
  return rc;
}

// chat_template.jinja when present (transformers 4.47+), else tokenizer_config.json's
static int kv_chat_template(gguf_tok *g, ct_gguf_writer *w) {
  char p[CT_PATH_MAX];
  char *src = NULL;
  size_t len;
  bool missing = false;
  int rc = ct_path_join(p, sizeof p, g->dir, "chat_template.jinja");
  if (!rc) rc = ct_read_file(p, &src, &len, &missing);
  if (!rc && !missing) {
    rc = ct_gguf_kv_str(w, "tokenizer.chat_template", src);
    free(src);
    return rc;
  }
  free(src);
  if ((rc = ct_path_join(p, sizeof p, g->dir, "tokenizer_config.json"))) return rc;
  if (access(p, R_OK)) return 0;
  json_error_t e;
  json_t *cfg = json_load_file(p, JSON_DECODE_INT_AS_REAL, &e);  // model_max_length may be 1e30
  if (!cfg) return ct_set_error(CT_EFORMAT, "%s:%d: %s", p, e.line, e.text);
  const char *tpl = NULL;
  rc = ct_chat_template_pick(json_object_get(cfg, "chat_template"), p, &tpl);
  if (!rc && tpl) rc = ct_gguf_kv_str(w, "tokenizer.chat_template", tpl);
  json_decref(cfg);
  return rc;
}

static void tok_close(gguf_tok *g) {
  json_decref(g->root);
  ct_tokenizer_free(g->tok);
  free(g->text);
  free(g->len);
  free(g->type);
  g->root = NULL, g->tok = NULL, g->text = NULL, g->len = NULL, g->type = NULL;
}

static int tok_kv(void *ctx, ct_gguf_writer *w) {
  gguf_tok *g = ctx;
  int rc = tok_vocab(g);
  const char *pre = NULL;
  if (!rc && !g->spm) rc = pre_name(g, &pre);
  if (rc || (rc = ct_gguf_kv_str(w, "tokenizer.ggml.model", g->spm ? "llama" : "gpt2"))) return rc;
  if (pre && (rc = ct_gguf_kv_str(w, "tokenizer.ggml.pre", pre))) return rc;
  if ((rc = kv_tokens(g, w))) return rc;
  if (g->spm) {
    float *score = malloc(g->V * sizeof *score);
    if (!score) return ct_set_error(CT_ENOMEM, "%s: out of memory", g->file);
    rc = spm_scores(g, score);
    if (!rc) rc = ct_gguf_arr_begin(w, "tokenizer.ggml.scores", CT_GGUF_V_F32, g->V);
    for (int id = 0; id < g->V && !rc; id++) rc = ct_gguf_arr_f32(w, score[id]);
    free(score);
    if (!rc) rc = ct_gguf_kv_bool(w, "tokenizer.ggml.add_space_prefix", spm_adds_space(g));
  } else {
    rc = kv_merges(g, w);
  }
  if (!rc) rc = kv_special(g, w);
  if (!rc) rc = kv_chat_template(g, w);
  tok_close(g);  // the vocabulary's tables are not needed while the tensors stream
  malloc_trim(0);  // (their many small blocks would otherwise stay with the process)
  return rc;
}

static int tok_open(gguf_tok *g, const char *dir, ct_tokenizer *tok, int V) {
  memset(g, 0, sizeof *g);
  g->dir = dir, g->tok = tok, g->V = V;
  int rc = ct_path_join(g->file, sizeof g->file, dir, "tokenizer.json");
  if (rc) return rc;
  json_error_t e;
  if (!(g->root = json_load_file(g->file, 0, &e))) return ct_set_error(CT_EFORMAT, "%s:%d: %s", g->file, e.line, e.text);
  g->model = json_object_get(g->root, "model");
  const char *type = json_string_value(json_object_get(g->model, "type"));
  if (!type || strcmp(type, "BPE"))
    return ct_set_error(CT_EFORMAT, "%s: model.type '%s' cannot be written to GGUF (BPE only)", g->file,
                        type ? type : "?");
  g->spm = !has_step(json_object_get(g->root, "pre_tokenizer"), "ByteLevel") &&
           !has_step(json_object_get(g->root, "decoder"), "ByteLevel");
  g->text = calloc(V, sizeof *g->text);
  g->len = calloc(V, sizeof *g->len);
  g->type = calloc(V, sizeof *g->type);
  if (!g->text || !g->len || !g->type) return ct_set_error(CT_ENOMEM, "%s: out of memory", g->file);
  return 0;
}

int ckpt_gguf(int argc, char **argv) {
  static const char *const known[] = {"in=", "out=", "type=", "adapter=", "name=", NULL};
  const char *v[5];
  if (ckpt_args(argc, argv, known, 2, v)) return 2;
  const char *in = v[0], *out = v[1], *tname = v[2], *adapter = v[3], *name = v[4];
  ct_gguf_type type = CT_GGUF_F16;
  if (tname && ct_gguf_type_parse(tname, &type)) {
    fprintf(stderr, "ctune-ckpt: gguf: %s\n", ct_last_error());
    return 2;
  }
  ct_model_config cfg;
  if (ct_model_read_config(&cfg, in) || !ct_gguf_arch(&cfg)) ckpt_die(1);
  ct_model m = {0};
  ct_lora lo = {0};
  tensor_src src = {0};
  if (adapter) {
    if (ckpt_load_merged(&m, &lo, in, adapter)) ckpt_die(1);
    src.m = &m;
  } else if (ct_st_dir_open(&src.dir, in)) {
    ckpt_die(1);
  }
  const char *tdir = ct_lora_tokenizer_dir(adapter, in);
  ct_tokenizer *tok;
  gguf_tok g;
  if (!name) name = strrchr(in, '/') && strrchr(in, '/')[1] ? strrchr(in, '/') + 1 : in;
  if (ct_tokenizer_load(&tok, tdir) || tok_open(&g, tdir, tok, cfg.vocab_size) ||
      ct_gguf_export(&cfg, type, name, read_tensor, &src, tok_kv, &g, out))
    ckpt_die(1);
  fprintf(stderr, "ctune-ckpt: %s%s%s (%s) written to %s as %s\n", in, adapter ? " + " : "", adapter ? adapter : "",
          cfg.model_type, out, ct_gguf_type_name(type));
  tok_close(&g);
  ct_st_dir_close(&src.dir);
  if (adapter) ct_lora_free(&lo), ct_model_free(&m);
  return 0;
}
