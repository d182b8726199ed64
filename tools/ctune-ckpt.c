// ctune-ckpt: checkpoint and model-directory tools.
//
//   bin/ctune-ckpt merge-lora base=DIR adapter=DIR out=DIR [dtype=float32|bfloat16]
//   bin/ctune-ckpt gguf in=DIR out=FILE.gguf [type=f32|f16|bf16|q8_0] [adapter=DIR] [name=NAME]
//
// merge-lora writes a plain Hugging Face model equal to base + adapter (W + s·B·A, and the
// adapter's modules_to_save in place of the base's): config.json, model.safetensors and
// the tokenizer files (the adapter directory's, else the base's).
//
// gguf writes a model directory or checkpoint (in=, optionally merged with a LoRA adapter
// on the way) as one GGUF file llama.cpp and Ollama load: llama.cpp's architecture
// metadata and tensor names (nn/gguf.h), and the tokenizer (tokenizer.json's vocabulary,
// merges and special tokens; tokenizer_config.json's chat template). type (default f16)
// is how matrices are stored; norms and biases stay f32. Without an adapter the tensors
// stream from the safetensors files one at a time.
//
//   bin/ctune-ckpt inspect DIR|FILE
//   bin/ctune-ckpt convert in=DIR out=DIR dtype=bfloat16|float16|float32
//   bin/ctune-ckpt compare a=DIR|FILE b=DIR|FILE [rtol=1e-5] [atol=1e-8]
//   bin/ctune-ckpt shard in=DIR out=DIR [max_shard_size=5GB]
//
// inspect lists each tensor (dtype, shape, bytes), the files' metadata and the parameter
// count (a training checkpoint's optimizer state is named, not counted). convert writes
// the model's floating-point tensors as dtype (config.json's torch_dtype follows) and the
// model's other files; from a training checkpoint it leaves the training state out, which
// gives a plain Hugging Face model. compare prints each tensor's largest absolute and
// relative difference and exits 1 when a tensor is missing, has another shape, or has an
// element past atol + rtol·|b| (numpy.allclose's rule and defaults); 2 on bad input.
// shard splits the tensors into model-0000N-of-0000M.safetensors files of at most
// max_shard_size ("2GB" = 2·10^9 bytes, "2GiB" = 2^31, as transformers reads them) plus
// model.safetensors.index.json, as save_pretrained does (one shard: model.safetensors).
// These four stream tensor by tensor, piece by piece (see "streaming" below).
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "chat_template.h"
#include "config.h"
#include "error.h"
#include "fs.h"
#include "gguf.h"
#include "gguf_read.h"
#include "hf.h"
#include "lora.h"
#include "matmul.h"
#include "pool.h"
#include "tokenizer.h"

static int usage(FILE *f) {
  fprintf(f, "usage: ctune-ckpt merge-lora base=DIR adapter=DIR out=DIR [dtype=float32|bfloat16]\n"
             "       ctune-ckpt gguf in=DIR out=FILE.gguf [type=f32|f16|bf16|q8_0] [adapter=DIR] [name=NAME]\n"
             "       ctune-ckpt inspect DIR|FILE\n"
             "       ctune-ckpt convert in=DIR out=DIR dtype=bfloat16|float16|float32\n"
             "       ctune-ckpt compare a=DIR|FILE b=DIR|FILE [rtol=1e-5] [atol=1e-8]\n"
             "       ctune-ckpt shard in=DIR out=DIR [max_shard_size=5GB]\n");
  return f == stdout ? 0 : 2;  // --help: exit 0
}

static __attribute__((noreturn)) void die(int code) {
  fprintf(stderr, "ctune-ckpt: %s\n", ct_last_error());
  exit(code);
}

// value of key=... among the arguments, or NULL
static const char *arg(int argc, char **argv, const char *key) {
  size_t n = strlen(key);
  for (int i = 2; i < argc; i++)
    if (!strncmp(argv[i], key, n) && argv[i][n] == '=') return argv[i] + n + 1;
  return NULL;
}

// 0 when every argument is one of the keys (NULL-terminated, "key="); else a usage error
static int check_args(int argc, char **argv, const char *const *known) {
  for (int i = 2; i < argc; i++) {
    bool ok = false;
    for (int k = 0; known[k]; k++) ok |= !strncmp(argv[i], known[k], strlen(known[k]));
    if (!ok) {
      fprintf(stderr, "ctune-ckpt: %s: unknown argument '%s'\n", argv[1], argv[i]);
      return usage(stderr);
    }
  }
  return 0;
}

// base + adapter merged into m (loaded here)
static int load_merged(ct_model *m, ct_lora *lo, const char *base, const char *adapter) {
  int rc = ct_model_load(m, base, 1);
  if (rc) return rc;
  if ((rc = ct_lora_load(lo, adapter, &m->cfg))) return ct_model_free(m), rc;
  if ((rc = ct_lora_merge(lo, m))) ct_lora_free(lo), ct_model_free(m);
  return rc;
}

static int merge_lora(int argc, char **argv) {
  static const char *const known[] = {"base=", "adapter=", "out=", "dtype=", NULL};
  if (check_args(argc, argv, known)) return 2;
  const char *base = arg(argc, argv, "base"), *adapter = arg(argc, argv, "adapter"), *out = arg(argc, argv, "out");
  const char *dtype = arg(argc, argv, "dtype");
  if (!base || !adapter || !out) return usage(stderr);
  if (dtype && strcmp(dtype, "float32") && strcmp(dtype, "bfloat16")) {
    fprintf(stderr, "ctune-ckpt: merge-lora: dtype '%s' is not float32 or bfloat16\n", dtype);
    return 2;
  }
  bool bf16 = dtype && !strcmp(dtype, "bfloat16");
  ct_model m;
  ct_lora lo;
  ct_tokenizer *tok;
  char p[CT_PATH_MAX];
  if (load_merged(&m, &lo, base, adapter)) die(1);
  const char *tdir = ct_lora_tokenizer_dir(adapter, base);
  const float *bufs[] = {m.params};
  if (ct_mkdirs(out) || ct_tokenizer_load(&tok, tdir) || ct_path_join(p, sizeof p, out, "config.json") ||
      ct_hf_config_write(&m.cfg, p, bf16 ? "bfloat16" : "float32", base) ||
      ct_path_join(p, sizeof p, out, "model.safetensors") ||
      ct_save_tensors(&ct_model_tensors(&m), 1, bufs, NULL, p, bf16 ? CT_DT_BF16 : CT_DT_F32) ||
      ct_tokenizer_save(tok, out))
    die(1);
  fprintf(stderr, "ctune-ckpt: %s + %s (rank %d, %s) merged into %s\n", base, adapter, lo.cfg.r,
          lo.cfg.save_embed || lo.cfg.save_head ? "with modules_to_save" : "adapters only", out);
  ct_tokenizer_free(tok);
  ct_lora_free(&lo);
  ct_model_free(&m);
  return 0;
}

// ---- gguf ----

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

static int gguf(int argc, char **argv) {
  static const char *const known[] = {"in=", "out=", "type=", "adapter=", "name=", NULL};
  if (check_args(argc, argv, known)) return 2;
  const char *in = arg(argc, argv, "in"), *out = arg(argc, argv, "out"), *adapter = arg(argc, argv, "adapter");
  const char *tname = arg(argc, argv, "type"), *name = arg(argc, argv, "name");
  if (!in || !out) {
    fprintf(stderr, "ctune-ckpt: gguf: %s= is required\n", in ? "out" : "in");
    return usage(stderr);
  }
  ct_gguf_type type = CT_GGUF_F16;
  if (tname && ct_gguf_type_parse(tname, &type)) {
    fprintf(stderr, "ctune-ckpt: gguf: %s\n", ct_last_error());
    return 2;
  }
  ct_model_config cfg;
  if (ct_model_read_config(&cfg, in) || !ct_gguf_arch(&cfg)) die(1);
  ct_model m = {0};
  ct_lora lo = {0};
  tensor_src src = {0};
  if (adapter) {
    if (load_merged(&m, &lo, in, adapter)) die(1);
    src.m = &m;
  } else if (ct_st_dir_open(&src.dir, in)) {
    die(1);
  }
  const char *tdir = ct_lora_tokenizer_dir(adapter, in);
  ct_tokenizer *tok;
  gguf_tok g;
  if (!name) name = strrchr(in, '/') && strrchr(in, '/')[1] ? strrchr(in, '/') + 1 : in;
  if (ct_tokenizer_load(&tok, tdir) || tok_open(&g, tdir, tok, cfg.vocab_size) ||
      ct_gguf_export(&cfg, type, name, read_tensor, &src, tok_kv, &g, out))
    die(1);
  fprintf(stderr, "ctune-ckpt: %s%s%s (%s) written to %s as %s\n", in, adapter ? " + " : "", adapter ? adapter : "",
          cfg.model_type, out, ct_gguf_type_name(type));
  tok_close(&g);
  ct_st_dir_close(&src.dir);
  if (adapter) ct_lora_free(&lo), ct_model_free(&m);
  return 0;
}

// ---- streaming: inspect, convert, compare, shard ----
//
// These read tensors piece by piece through one buffer of CT_CKPT_BUFFER bytes (default
// 64 MiB; a test sets it small) and drop the pages they read from the input's mapping,
// so resident memory stays near the buffers whatever the model's size. Outputs are
// written into OUT.tmp-<pid> next to OUT and renamed into place when complete.

static size_t buffer_bytes(void) {
  const char *s = getenv("CT_CKPT_BUFFER");
  long long v = s ? atoll(s) : 64LL << 20;
  return v < 4096 ? 4096 : (size_t)v;
}

// The last line of a streaming command: resident memory at its peak.
static double peak_mib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);  // ru_maxrss: KiB on Linux
  return ru.ru_maxrss / 1024.0;
}

static bool is_dir(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

// A model directory (model.safetensors or its shards), an adapter directory with
// allow_adapter, or one .safetensors file.
static int open_tensors(ct_st_dir *d, const char *path, bool allow_adapter) {
  if (!is_dir(path)) {
    if (access(path, R_OK)) return ct_set_error(CT_EIO, "%s: cannot open: %s", path, strerror(errno));
    return ct_st_dir_open_file(d, path);
  }
  bool model = ct_path_has_file(path, "model.safetensors") || ct_path_has_file(path, "model.safetensors.index.json");
  if (!model && ct_path_has_file(path, "adapter_model.safetensors")) {
    char p[CT_PATH_MAX];
    if (!allow_adapter)
      return ct_set_error(CT_EINVAL, "%s is a LoRA adapter (adapter_model.safetensors), not a model; "
                          "merge it first: ctune-ckpt merge-lora base=DIR adapter=%s out=DIR", path, path);
    return ct_path_join(p, sizeof p, path, "adapter_model.safetensors") ? CT_EINVAL : ct_st_dir_open_file(d, p);
  }
  return ct_st_dir_open(d, path);
}

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

// Is tensor t of file f one the directory maps (an index may leave a shard's extras out)?
static bool mapped(const ct_st_dir *d, int f, const ct_st_tensor *t) {
  const ct_safetensors *st;
  const ct_st_tensor *hit;
  return ct_st_dir_find(d, t->name, &st, &hit) == 0 && st == &d->files[f] && hit == t;
}

static bool is_float(ct_dtype dt) {
  return dt == CT_DT_F32 || dt == CT_DT_F16 || dt == CT_DT_BF16 || dt == CT_DT_F64;
}

static void fmt_dims(char *buf, size_t n, const ct_st_tensor *t) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < t->ndim && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

static const ct_st_dir *sort_dir;  // (qsort has no context argument)
static int cmp_file_names(const void *a, const void *b) {
  return strcmp(base_name(sort_dir->files[*(const int *)a].path), base_name(sort_dir->files[*(const int *)b].path));
}

// order (n_files): d's files by name (shard 00001 first), or NULL when out of memory.
static int *file_order(const ct_st_dir *d) {
  int *order = malloc(sizeof(int) * (size_t)(d->n_files ? d->n_files : 1));
  if (!order) return ct_set_error(CT_ENOMEM, "out of memory"), NULL;
  for (int f = 0; f < d->n_files; f++) order[f] = f;
  sort_dir = d;
  qsort(order, (size_t)d->n_files, sizeof *order, cmp_file_names);
  return order;
}

// ---- inspect ----

static void inspect_file(const ct_st_dir *d, int f, int64_t *params, uint64_t *bytes, long *by_dtype) {
  const ct_safetensors *st = &d->files[f];
  printf("%s: %d tensors, %zu bytes\n", st->path, st->n, st->file_size);
  if (st->n_meta) {
    printf("  metadata:");
    for (int i = 0; i < st->n_meta; i++) printf(" %s=%s", st->meta_keys[i], st->meta_vals[i]);
    printf("\n");
  }
  for (int i = 0; i < st->n; i++) {
    const ct_st_tensor *t = &st->tensors[i];
    if (!mapped(d, f, t)) continue;
    char dims[160];
    fmt_dims(dims, sizeof dims, t);
    printf("  %-48s %-5s %-16s %12llu\n", t->name, ct_dtype_name(t->dtype), dims, (unsigned long long)(t->end - t->begin));
    *params += t->numel;
    *bytes += t->end - t->begin;
    by_dtype[t->dtype]++;
  }
}

// What a training checkpoint holds besides the model (parameters only are counted).
static void inspect_training_files(const char *dir) {
  if (!is_dir(dir)) return;
  DIR *dp = opendir(dir);
  struct dirent *e;
  while (dp && (e = readdir(dp))) {
    const char *n = e->d_name;
    if (strncmp(n, "optimizer", 9) && strcmp(n, "ref_model.safetensors")) continue;
    char p[CT_PATH_MAX];
    ct_safetensors st;
    if (ct_path_join(p, sizeof p, dir, n) || ct_st_open(&st, p)) continue;
    printf("training state (not counted): %s: %d tensors, %zu bytes\n", n, st.n, st.file_size);
    ct_st_close(&st);
  }
  if (dp) closedir(dp);
  char p[CT_PATH_MAX];
  json_t *j = ct_path_join(p, sizeof p, dir, "trainer_state.json") ? NULL : json_load_file(p, 0, NULL);
  if (j) printf("training state (not counted): trainer_state.json at step %lld\n",
                (long long)json_integer_value(json_object_get(j, "global_step")));
  json_decref(j);
}

// A GGUF file (ctune-ckpt gguf's output, or llama.cpp's): its header, tensor by tensor.
static int inspect_gguf(const char *path) {
  ct_gguf_info g;
  if (ct_gguf_read_info(path, &g)) die(1);
  printf("%s: GGUF v%u, %llu bytes, architecture %s", path, g.version, (unsigned long long)g.file_size,
         g.arch[0] ? g.arch : "(none)");
  if (g.name[0]) printf(", name \"%s\"", g.name);
  if (g.has_file_type) printf(", file type %u", g.file_type);
  printf(", %llu key/values, %d tensors\n", (unsigned long long)g.n_kv, g.n_tensors);
  uint64_t params = 0, bytes = 0;
  for (int i = 0; i < g.n_tensors; i++) {
    const ct_gguf_tinfo *t = &g.t[i];
    char dims[160] = "", type[16], nbytes[24] = "?";
    for (int d = 0; d < t->ndim; d++)  // ne[0] varies fastest: shown last, as a row-major shape
      snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", d ? ", " : "[", (long long)t->ne[t->ndim - 1 - d]);
    snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "]");
    const char *tn = ct_gguf_type_name((ct_gguf_type)t->type);
    uint64_t nb = ct_gguf_nbytes((ct_gguf_type)t->type, (int64_t)t->numel);
    if (!strcmp(tn, "?")) snprintf(type, sizeof type, "type %u", t->type);
    else snprintf(type, sizeof type, "%s", tn);
    if (nb) snprintf(nbytes, sizeof nbytes, "%llu", (unsigned long long)nb);
    printf("  %-48s %-7s %-16s %12s\n", t->name, type, dims, nbytes);
    params += t->numel;
    bytes += nb;
  }
  printf("total: %d tensors, %llu parameters (%.2f M), %llu bytes of tensor data (of the types this reads)\n",
         g.n_tensors, (unsigned long long)params, params / 1e6, (unsigned long long)bytes);
  ct_gguf_info_free(&g);
  return 0;
}

static int inspect(int argc, char **argv) {
  if (argc != 3 || strchr(argv[2], '=')) {
    fprintf(stderr, "ctune-ckpt: inspect takes one DIR or FILE\n");
    return usage(stderr);
  }
  if (!is_dir(argv[2]) && ct_gguf_is_file(argv[2])) return inspect_gguf(argv[2]);
  ct_st_dir d;
  if (open_tensors(&d, argv[2], true)) die(1);
  int64_t params = 0;
  uint64_t bytes = 0;
  long by_dtype[CT_DT_BOOL + 1] = {0};
  int *order = file_order(&d);
  if (!order) die(1);
  for (int k = 0; k < d.n_files; k++) inspect_file(&d, order[k], &params, &bytes, by_dtype);
  free(order);
  printf("total: %d tensors, %lld parameters (%.2f M), %llu bytes of tensor data;", d.n, (long long)params,
         params / 1e6, (unsigned long long)bytes);
  for (int t = 0; t <= CT_DT_BOOL; t++)
    if (by_dtype[t]) printf(" %s x %ld", ct_dtype_name((ct_dtype)t), by_dtype[t]);
  printf("\n");
  inspect_training_files(argv[2]);
  fprintf(stderr, "ctune-ckpt: inspect: peak memory %.1f MiB\n", peak_mib());
  ct_st_dir_close(&d);
  return 0;
}

// ---- output directories ----

// out must not exist, or be an empty directory; tmp gets "<out>.tmp-<pid>", created empty.
static int out_begin(const char *out, char *tmp, size_t n) {
  if (is_dir(out)) {
    DIR *dp = opendir(out);
    struct dirent *e;
    int entries = 0;
    while (dp && (e = readdir(dp))) entries += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (dp) closedir(dp);
    if (entries) return ct_set_error(CT_EINVAL, "out=%s exists and is not empty; remove it or give another directory", out);
  } else if (access(out, F_OK) == 0) {
    return ct_set_error(CT_EINVAL, "out=%s exists and is not a directory", out);
  }
  if ((size_t)snprintf(tmp, n, "%s.tmp-%ld", out, (long)getpid()) >= n) return ct_set_error(CT_EINVAL, "out=%s: path too long", out);
  int rc = ct_remove_tree(tmp);
  return rc ? rc : ct_mkdirs(tmp);
}

// Every file of tmp and tmp itself reach the disk; then tmp becomes out.
static int out_commit(const char *tmp, const char *out) {
  DIR *dp = opendir(tmp);
  struct dirent *e;
  char p[CT_PATH_MAX];
  int rc = dp ? 0 : ct_set_error(CT_EIO, "%s: cannot open: %s", tmp, strerror(errno));
  while (!rc && (e = readdir(dp)))
    if (e->d_name[0] != '.') rc = ct_path_join(p, sizeof p, tmp, e->d_name) || ct_fsync_path(p, false);
  if (dp) closedir(dp);
  if (!rc) rc = ct_fsync_path(tmp, true);
  if (!rc && rename(tmp, out)) rc = ct_set_error(CT_EIO, "%s: cannot rename to %s: %s", tmp, out, strerror(errno));
  char parent[CT_PATH_MAX];
  snprintf(parent, sizeof parent, "%s", out);
  char *slash = strrchr(parent, '/');
  if (!rc) rc = ct_fsync_path(slash ? (slash == parent ? "/" : (*slash = 0, parent)) : ".", true);
  return rc;
}

static int copy_file(const char *from, const char *to) {
  char *buf;
  size_t len;
  int rc = ct_read_file(from, &buf, &len, NULL);
  if (rc) return rc;
  FILE *f = fopen(to, "wb");
  if (!f || fwrite(buf, 1, len, f) != len) rc = ct_set_error(CT_EIO, "%s: cannot write: %s", to, strerror(errno));
  if (f && fclose(f) && !rc) rc = ct_set_error(CT_EIO, "%s: cannot write: %s", to, strerror(errno));
  free(buf);
  return rc;
}

// config.json with its dtype key ("torch_dtype", or transformers 4.56+'s "dtype") set to
// `name`; every other byte as it was.
static int write_config_dtype(const char *from, const char *to, const char *name) {
  char *s;
  size_t len;
  int rc = ct_read_file(from, &s, &len, NULL);
  if (rc) return rc;
  json_error_t je;
  json_t *j = json_loads(s, 0, &je);
  if (!json_is_object(j)) {
    json_decref(j);
    free(s);
    return ct_set_error(CT_EFORMAT, "%s:%d: not a JSON object: %s", from, je.line, je.text);
  }
  json_decref(j);
  FILE *f = fopen(to, "wb");
  if (!f) {
    free(s);
    return ct_set_error(CT_EIO, "%s: cannot write: %s", to, strerror(errno));
  }
  bool found = false;
  size_t at = 0;
  for (const char *k = s; (k = strstr(k, "dtype\"")); k++) {
    if (k == s || (k[-1] != '"' && (k - s < 7 || strncmp(k - 7, "\"torch_", 7)))) continue;
    const char *v = k + 6;
    while (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r') v++;
    if (*v++ != ':') continue;
    while (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r') v++;
    const char *end = *v == '"' ? strchr(v + 1, '"') : NULL;
    if (!end) continue;
    fwrite(s + at, 1, (size_t)(v - s) - at, f);
    fprintf(f, "\"%s\"", name);
    at = (size_t)(end + 1 - s);
    found = true;
  }
  if (!found) {  // none: add torch_dtype after the opening brace
    const char *brace = strchr(s, '{');
    at = (size_t)(brace - s) + 1;
    fwrite(s, 1, at, f);
    fprintf(f, "\n  \"torch_dtype\": \"%s\",", name);
  }
  fwrite(s + at, 1, len - at, f);
  if (fclose(f)) rc = ct_set_error(CT_EIO, "%s: cannot write: %s", to, strerror(errno));
  free(s);
  return rc;
}

// What a model directory needs besides its tensors: every regular file but the tensors,
// the index, and the training state (optimizer moments, trainer_state.json, logs, the
// resolved config.yml). config.json gets dtype when non-NULL.
static bool training_file(const char *n) {
  size_t l = strlen(n);
  return n[0] == '.' || !strcmp(n, "trainer_state.json") || !strcmp(n, "config.yml") ||
         (l > 6 && !strcmp(n + l - 6, ".jsonl")) || (l > 12 && !strcmp(n + l - 12, ".safetensors")) ||
         !strcmp(n, "model.safetensors.index.json");
}

static int copy_model_files(const char *in, const char *tmp, const char *dtype) {
  DIR *dp = opendir(in);
  struct dirent *e;
  int rc = dp ? 0 : ct_set_error(CT_EIO, "%s: cannot open: %s", in, strerror(errno));
  char from[CT_PATH_MAX], to[CT_PATH_MAX], skipped[1024] = "";
  while (!rc && (e = readdir(dp))) {
    if (ct_path_join(from, sizeof from, in, e->d_name) || ct_path_join(to, sizeof to, tmp, e->d_name)) return CT_EINVAL;
    struct stat sb;
    if (stat(from, &sb) || !S_ISREG(sb.st_mode)) continue;
    if (training_file(e->d_name)) {
      bool model = !strncmp(e->d_name, "model", 5) && strstr(e->d_name, ".safetensors");
      if (!model && e->d_name[0] != '.' && strlen(skipped) + strlen(e->d_name) + 2 < sizeof skipped)
        strcat(strcat(skipped, " "), e->d_name);
      continue;
    }
    rc = dtype && !strcmp(e->d_name, "config.json") ? write_config_dtype(from, to, dtype) : copy_file(from, to);
  }
  if (dp) closedir(dp);
  if (!rc && skipped[0]) fprintf(stderr, "ctune-ckpt: left out (training state, not the model):%s\n", skipped);
  return rc;
}

// ---- writing tensors through the buffer ----

typedef struct {
  uint8_t *raw;  // (cap) bytes
  float *f;      // (cap / 4) floats
  size_t cap;
} stream_buf;

static int stream_buf_init(stream_buf *b) {
  b->cap = buffer_bytes() / 8 * 8;
  b->raw = malloc(b->cap);
  b->f = malloc(b->cap);
  return b->raw && b->f ? 0 : ct_set_error(CT_ENOMEM, "cannot allocate the %zu-byte buffers (CT_CKPT_BUFFER)", b->cap);
}

static void stream_buf_free(stream_buf *b) {
  free(b->raw);
  free(b->f);
}

// Tensor t of st appended to w as dtype `to` (its bytes as they are when to == t->dtype).
static int stream_tensor(ct_st_writer *w, const ct_safetensors *st, const ct_st_tensor *t, ct_dtype to, stream_buf *b) {
  const uint8_t *src = ct_st_data(st, t);
  if (to == t->dtype) {
    for (uint64_t i = 0, n = t->end - t->begin; i < n; i += b->cap) {
      size_t k = n - i < b->cap ? (size_t)(n - i) : b->cap;
      int rc = ct_st_writer_put(w, src + i, k);
      ct_st_drop(src + i, k);
      if (rc) return rc;
    }
    return 0;
  }
  size_t per = b->cap / 4;
  for (int64_t i = 0; i < t->numel; i += (int64_t)per) {
    size_t k = t->numel - i < (int64_t)per ? (size_t)(t->numel - i) : per;
    int rc = ct_st_read_f32_range(st, t, i, (int64_t)k, b->f);
    if (rc) return rc;
    uint16_t *h = (uint16_t *)(void *)b->raw;
    if (to == CT_DT_F32) memcpy(b->raw, b->f, 4 * k);
    else if (to == CT_DT_BF16) for (size_t j = 0; j < k; j++) h[j] = ct_f32_to_bf16(b->f[j]);
    else for (size_t j = 0; j < k; j++) h[j] = ct_f32_to_f16(b->f[j]);
    if ((rc = ct_st_writer_put(w, b->raw, k * ct_dtype_size(to)))) return rc;
  }
  return 0;
}

// One output file: tensors list[0..n) (of d), each as dtype `to` (-1: as stored; floats
// only are converted), with src's metadata.
typedef struct {
  int file;
  const ct_st_tensor *t;
} tensor_ref;

static int write_stream_file(const char *path, const ct_st_dir *d, const tensor_ref *list, int n, int to,
                             const ct_safetensors *meta, stream_buf *b, uint64_t *total) {
  ct_st_entry *e = calloc(n ? (size_t)n : 1, sizeof *e);
  if (!e) return ct_set_error(CT_ENOMEM, "%s: out of memory", path);
  for (int i = 0; i < n; i++) {
    const ct_st_tensor *t = list[i].t;
    e[i] = (ct_st_entry){.name = t->name, .ndim = t->ndim, .data = "",
                         .dtype = to >= 0 && is_float(t->dtype) ? (ct_dtype)to : t->dtype};
    memcpy(e[i].shape, t->shape, sizeof e[i].shape);
    *total += (uint64_t)t->numel * ct_dtype_size(e[i].dtype);
  }
  ct_st_writer w;
  int rc = ct_st_writer_open(&w, path, e, n, (const char *const *)meta->meta_keys,
                             (const char *const *)meta->meta_vals, meta->n_meta);
  for (int i = 0; i < n && !rc; i++) rc = stream_tensor(&w, &d->files[list[i].file], list[i].t, e[i].dtype, b);
  if (rc) ct_st_writer_abort(&w);
  else rc = ct_st_writer_close(&w);
  free(e);
  return rc;
}

// Every mapped tensor of d, file by file (by name: shard 00001 first) in data order.
static tensor_ref *tensor_list(const ct_st_dir *d, int *n) {
  tensor_ref *list = malloc(sizeof *list * (d->n ? (size_t)d->n : 1));
  int *order = file_order(d);
  *n = 0;
  if (!list || !order) {
    free(list);
    free(order);
    ct_set_error(CT_ENOMEM, "out of memory");
    return NULL;
  }
  for (int k = 0; k < d->n_files; k++)
    for (int f = order[k], i = 0; i < d->files[f].n; i++)
      if (mapped(d, f, &d->files[f].tensors[i])) list[(*n)++] = (tensor_ref){f, &d->files[f].tensors[i]};
  free(order);
  return list;
}


// model.safetensors.index.json as transformers writes it: total_size, then weight_map
// sorted by name (json.dumps(indent=2, sort_keys=True)).
static int write_index(const char *dir, const char *const *names, const char *const *files, int n, uint64_t total) {
  json_t *j = json_pack("{s:{s:I},s:{}}", "metadata", "total_size", (json_int_t)total, "weight_map");
  json_t *wm = json_object_get(j, "weight_map");
  for (int i = 0; i < n; i++) json_object_set_new(wm, names[i], json_string(files[i]));
  char p[CT_PATH_MAX];
  int rc = ct_path_join(p, sizeof p, dir, "model.safetensors.index.json");
  char *text = rc ? NULL : json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
  FILE *f = text ? fopen(p, "w") : NULL;
  if (!rc && (!f || fprintf(f, "%s\n", text) < 0)) rc = ct_set_error(CT_EIO, "%s: cannot write: %s", p, strerror(errno));
  if (f && fclose(f) && !rc) rc = ct_set_error(CT_EIO, "%s: cannot write: %s", p, strerror(errno));
  free(text);
  json_decref(j);
  return rc;
}

static const struct {
  const char *name;
  ct_dtype dt;
} out_dtypes[] = {{"float32", CT_DT_F32}, {"bfloat16", CT_DT_BF16}, {"float16", CT_DT_F16}};

// ---- convert ----

static int convert_files(const ct_st_dir *d, const char *tmp, ct_dtype to, stream_buf *b) {
  int n, rc = 0;
  tensor_ref *list = tensor_list(d, &n);
  if (!list) return CT_ENOMEM;
  const char **names = malloc(sizeof *names * (n ? n : 1)), **files = malloc(sizeof *files * (n ? n : 1));
  if (!names || !files) rc = ct_set_error(CT_ENOMEM, "out of memory");
  uint64_t total = 0;
  for (int at = 0; at < n && !rc;) {  // one output file per input file, in list order
    int f = list[at].file, k = 0;
    while (at + k < n && list[at + k].file == f) {
      names[at + k] = list[at + k].t->name;
      files[at + k] = base_name(d->files[f].path);
      k++;
    }
    char p[CT_PATH_MAX];
    rc = ct_path_join(p, sizeof p, tmp, base_name(d->files[f].path));
    if (!rc) rc = write_stream_file(p, d, list + at, k, (int)to, &d->files[f], b, &total);
    at += k;
  }
  bool index = d->n_files > 1 || strcmp(base_name(d->files[0].path), "model.safetensors");
  if (!rc && index) rc = write_index(tmp, names, files, n, total);
  free(names);
  free(files);
  free(list);
  return rc;
}

static int convert(int argc, char **argv) {
  static const char *const known[] = {"in=", "out=", "dtype=", NULL};
  if (check_args(argc, argv, known)) return 2;
  const char *in = arg(argc, argv, "in"), *out = arg(argc, argv, "out"), *dname = arg(argc, argv, "dtype");
  if (!in || !out || !dname) {
    fprintf(stderr, "ctune-ckpt: convert: %s= is required\n", !in ? "in" : !out ? "out" : "dtype");
    return usage(stderr);
  }
  int k = 0;
  while (k < 3 && strcmp(dname, out_dtypes[k].name)) k++;
  if (k == 3) {
    fprintf(stderr, "ctune-ckpt: convert: dtype '%s' is not bfloat16, float16 or float32\n", dname);
    return 2;
  }
  if (!is_dir(in)) {
    fprintf(stderr, "ctune-ckpt: convert: in=%s is not a directory\n", in);
    return 2;
  }
  ct_st_dir d;
  stream_buf b = {0};
  char tmp[CT_PATH_MAX] = "";
  if (open_tensors(&d, in, false) || out_begin(out, tmp, sizeof tmp) || stream_buf_init(&b) ||
      convert_files(&d, tmp, out_dtypes[k].dt, &b) || copy_model_files(in, tmp, dname) || out_commit(tmp, out)) {
    fprintf(stderr, "ctune-ckpt: %s\n", ct_last_error());
    if (tmp[0]) ct_remove_tree(tmp);
    exit(1);
  }
  fprintf(stderr, "ctune-ckpt: %s (%d tensors) written to %s as %s; peak memory %.1f MiB\n", in, d.n, out, dname,
          peak_mib());
  stream_buf_free(&b);
  ct_st_dir_close(&d);
  return 0;
}

// ---- compare ----

typedef struct {
  double max_abs, max_rel;
  int64_t bad;  // elements past atol + rtol·|b| (or NaN in one only)
} diff_stats;

static void diff_chunk(const float *a, const float *b, size_t n, double rtol, double atol, diff_stats *s) {
  for (size_t i = 0; i < n; i++) {
    double x = a[i], y = b[i];
    if (isnan(x) || isnan(y)) {
      if (isnan(x) != isnan(y)) s->bad++, s->max_abs = INFINITY, s->max_rel = INFINITY;
      continue;
    }
    if (x == y) continue;  // (equal infinities too)
    double d = fabs(x - y), r = y != 0 ? d / fabs(y) : INFINITY;
    if (isnan(d)) d = r = INFINITY;  // inf vs -inf
    s->max_abs = d > s->max_abs ? d : s->max_abs;
    s->max_rel = r > s->max_rel ? r : s->max_rel;
    if (!(d <= atol + rtol * fabs(y))) s->bad++;
  }
}

// Integer and boolean tensors: equal bytes, or every element counts as differing.
static void compare_bytes(const ct_safetensors *sa, const ct_st_tensor *ta, const ct_safetensors *sb,
                          const ct_st_tensor *tb, size_t per, diff_stats *s) {
  const uint8_t *a = ct_st_data(sa, ta), *b = ct_st_data(sb, tb);
  uint64_t n = ta->end - ta->begin;
  bool same = ta->dtype == tb->dtype;
  for (uint64_t i = 0; i < n && same; i += per) {
    size_t k = n - i < per ? (size_t)(n - i) : per;
    same = !memcmp(a + i, b + i, k);
    ct_st_drop(a + i, k), ct_st_drop(b + i, k);
  }
  if (!same) s->bad = ta->numel, s->max_abs = s->max_rel = NAN;
}

static int compare_tensor(const ct_safetensors *sa, const ct_st_tensor *ta, const ct_safetensors *sb,
                          const ct_st_tensor *tb, float *fa, float *fb, size_t per, double rtol, double atol,
                          diff_stats *s) {
  if (!is_float(ta->dtype) || !is_float(tb->dtype)) return compare_bytes(sa, ta, sb, tb, 4 * per, s), 0;
  for (int64_t i = 0; i < ta->numel; i += (int64_t)per) {
    size_t k = ta->numel - i < (int64_t)per ? (size_t)(ta->numel - i) : per;
    int rc = ct_st_read_f32_range(sa, ta, i, (int64_t)k, fa);
    if (!rc) rc = ct_st_read_f32_range(sb, tb, i, (int64_t)k, fb);
    if (rc) return rc;
    diff_chunk(fa, fb, k, rtol, atol, s);
  }
  return 0;
}

static bool parse_tol(const char *s, double *v) {
  char *end;
  if (!s) return true;
  *v = strtod(s, &end);
  return *s && !*end && *v >= 0 && isfinite(*v);
}

// Tensors of a missing from b and the other way: printed; their count
static int compare_names(const ct_st_dir *a, const ct_st_dir *b, const char *na, const char *nb) {
  int missing = 0;
  for (int i = 0; i < a->n; i++)
    if (ct_st_dir_find(b, a->entries[i].name, NULL, NULL)) printf("%-48s only in %s\n", a->entries[i].name, na), missing++;
  for (int i = 0; i < b->n; i++)
    if (ct_st_dir_find(a, b->entries[i].name, NULL, NULL)) printf("%-48s only in %s\n", b->entries[i].name, nb), missing++;
  return missing;
}

static bool same_shape(const ct_st_tensor *a, const ct_st_tensor *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

static int compare(int argc, char **argv) {
  static const char *const known[] = {"a=", "b=", "rtol=", "atol=", NULL};
  if (check_args(argc, argv, known)) return 2;
  const char *pa = arg(argc, argv, "a"), *pb = arg(argc, argv, "b");
  double rtol = 1e-5, atol = 1e-8;  // numpy.allclose's
  if (!pa || !pb) {
    fprintf(stderr, "ctune-ckpt: compare: %s= is required\n", pa ? "b" : "a");
    return usage(stderr);
  }
  if (!parse_tol(arg(argc, argv, "rtol"), &rtol) || !parse_tol(arg(argc, argv, "atol"), &atol)) {
    fprintf(stderr, "ctune-ckpt: compare: rtol and atol must be finite numbers >= 0\n");
    return 2;
  }
  ct_st_dir a, b;
  if (open_tensors(&a, pa, true) || open_tensors(&b, pb, true)) die(2);
  size_t per = buffer_bytes() / 8;
  float *fa = malloc(per * 4), *fb = malloc(per * 4);
  if (!fa || !fb) die((ct_set_error(CT_ENOMEM, "cannot allocate the buffers (CT_CKPT_BUFFER)"), 2));
  int failed = compare_names(&a, &b, pa, pb), compared = 0;
  printf("%-48s %-11s %12s %12s %s\n", "tensor", "dtypes", "max_abs", "max_rel", "");
  for (int i = 0; i < a.n; i++) {
    const ct_safetensors *sa, *sb;
    const ct_st_tensor *ta, *tb;
    if (ct_st_dir_find(&b, a.entries[i].name, &sb, &tb)) continue;
    ct_st_dir_find(&a, a.entries[i].name, &sa, &ta);
    char dt[16];
    snprintf(dt, sizeof dt, "%s/%s", ct_dtype_name(ta->dtype), ct_dtype_name(tb->dtype));
    if (!same_shape(ta, tb)) {
      char da[160], db[160];
      fmt_dims(da, sizeof da, ta), fmt_dims(db, sizeof db, tb);
      printf("%-48s %-11s shapes differ: %s vs %s\n", ta->name, dt, da, db);
      failed++;
      continue;
    }
    diff_stats s = {0};
    if (compare_tensor(sa, ta, sb, tb, fa, fb, per, rtol, atol, &s)) die(2);
    printf("%-48s %-11s %12.4g %12.4g %s\n", ta->name, dt, s.max_abs, s.max_rel, s.bad ? "DIFFERS" : "ok");
    if (s.bad && isnan(s.max_abs)) printf("%-48s not floating-point: their bytes differ\n", "");
    else if (s.bad) printf("%-48s %lld of %lld elements past atol + rtol * |b|\n", "", (long long)s.bad, (long long)ta->numel);
    failed += s.bad > 0;
    compared++;
  }
  printf("%s: %d tensors compared, %d differ or are missing (rtol %g, atol %g)\n", failed ? "DIFFERENT" : "SAME",
         compared, failed, rtol, atol);
  fprintf(stderr, "ctune-ckpt: compare: peak memory %.1f MiB\n", peak_mib());
  free(fa);
  free(fb);
  ct_st_dir_close(&a);
  ct_st_dir_close(&b);
  return failed ? 1 : 0;
}

// ---- shard ----

// "2GB" (10^9, as transformers), "500MiB" (2^20), "1000" bytes; 0 when malformed.
static uint64_t parse_size(const char *s) {
  static const struct {
    const char *unit;
    double mult;
  } units[] = {{"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
               {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  char *end;
  double v = strtod(s, &end);
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (!strcasecmp(end, units[i].unit) && end != s && v > 0 && isfinite(v)) return (uint64_t)(v * units[i].mult);
  return 0;
}

// The shards: tensors in data order, a new shard when the next one would pass max (a
// tensor larger than max gets a shard of its own), as huggingface_hub splits state dicts.
static int plan_shards(const tensor_ref *list, int n, uint64_t max, int *shard_of) {
  int s = 0;
  uint64_t size = 0;
  for (int i = 0; i < n; i++) {
    uint64_t nb = list[i].t->end - list[i].t->begin;
    if (i > 0 && size + nb > max) s++, size = 0;
    shard_of[i] = s;
    size += nb;
  }
  return n ? s + 1 : 1;
}

static int shard_files(const ct_st_dir *d, const char *tmp, uint64_t max, stream_buf *b, int *n_shards) {
  int n, rc = 0;
  tensor_ref *list = tensor_list(d, &n);
  if (!list) return CT_ENOMEM;
  int *shard_of = malloc(sizeof(int) * (n ? n : 1));
  const char **names = malloc(sizeof *names * (n ? n : 1)), **files = malloc(sizeof *files * (n ? n : 1));
  char (*fname)[64] = NULL;
  if (!shard_of || !names || !files) rc = ct_set_error(CT_ENOMEM, "out of memory");
  int S = rc ? 0 : plan_shards(list, n, max, shard_of);
  if (!rc && !(fname = calloc((size_t)S, sizeof *fname))) rc = ct_set_error(CT_ENOMEM, "out of memory");
  uint64_t total = 0;
  for (int s = 0, at = 0; s < S && !rc; s++) {
    if (S == 1) snprintf(fname[s], sizeof fname[s], "model.safetensors");  // one shard: no index, as transformers
    else snprintf(fname[s], sizeof fname[s], "model-%05d-of-%05d.safetensors", s + 1, S);
    int k = 0;
    while (at + k < n && shard_of[at + k] == s) names[at + k] = list[at + k].t->name, files[at + k] = fname[s], k++;
    char p[CT_PATH_MAX];
    rc = ct_path_join(p, sizeof p, tmp, fname[s]);
    if (!rc) rc = write_stream_file(p, d, list + at, k, -1, &d->files[k ? list[at].file : 0], b, &total);
    at += k;
  }
  if (!rc && S > 1) rc = write_index(tmp, names, files, n, total);
  *n_shards = S;
  free(fname);
  free(names);
  free(files);
  free(shard_of);
  free(list);
  return rc;
}

static int shard(int argc, char **argv) {
  static const char *const known[] = {"in=", "out=", "max_shard_size=", NULL};
  if (check_args(argc, argv, known)) return 2;
  const char *in = arg(argc, argv, "in"), *out = arg(argc, argv, "out"), *ms = arg(argc, argv, "max_shard_size");
  if (!in || !out) {
    fprintf(stderr, "ctune-ckpt: shard: %s= is required\n", in ? "out" : "in");
    return usage(stderr);
  }
  uint64_t max = parse_size(ms ? ms : "5GB");  // transformers' default for save_pretrained
  if (!max) {
    fprintf(stderr, "ctune-ckpt: shard: max_shard_size '%s' is not a size like 2GB, 500MB, 1GiB or a byte count\n", ms);
    return 2;
  }
  if (!is_dir(in)) {
    fprintf(stderr, "ctune-ckpt: shard: in=%s is not a directory\n", in);
    return 2;
  }
  ct_st_dir d;
  stream_buf b = {0};
  char tmp[CT_PATH_MAX] = "";
  int S = 0;
  if (open_tensors(&d, in, false) || out_begin(out, tmp, sizeof tmp) || stream_buf_init(&b) ||
      shard_files(&d, tmp, max, &b, &S) || copy_model_files(in, tmp, NULL) || out_commit(tmp, out)) {
    fprintf(stderr, "ctune-ckpt: %s\n", ct_last_error());
    if (tmp[0]) ct_remove_tree(tmp);
    exit(1);
  }
  fprintf(stderr, "ctune-ckpt: %s (%d tensors) written to %s as %d shard%s of at most %llu bytes; peak memory %.1f MiB\n",
          in, d.n, out, S, S == 1 ? "" : "s", (unsigned long long)max, peak_mib());
  stream_buf_free(&b);
  ct_st_dir_close(&d);
  return 0;
}

int main(int argc, char **argv) {
  if (ct_config_help_asked(argc, argv)) return usage(stdout);
  ct_blas_init(argc, argv);
  if (argc < 2) return usage(stderr);
  if (ct_pool_init(0) || ct_blas_room(ct_pool_threads(), 0, NULL, NULL)) die(1);
  int rc = !strcmp(argv[1], "merge-lora") ? merge_lora(argc, argv)
           : !strcmp(argv[1], "gguf")     ? gguf(argc, argv)
           : !strcmp(argv[1], "inspect")  ? inspect(argc, argv)
           : !strcmp(argv[1], "convert")  ? convert(argc, argv)
           : !strcmp(argv[1], "compare")  ? compare(argc, argv)
           : !strcmp(argv[1], "shard")    ? shard(argc, argv)
                                          : usage(stderr);
  ct_pool_free();
  return rc;
}
