// tokenizer: building a tokenizer from its files (tokenizer.json, tokenizer_config.json,
// generation_config.json, chat_template.jinja) or the built-in byte tokenizer, freeing it,
// fitting it to a model's vocab_size, and the queries (ids of special tokens, stop ids).
// The parts live beside it: tokenizer_model.c, tokenizer_pipeline.c and tokenizer_config.c
// read the files, tokenizer_encode.c and tokenizer_decode.c run it.
#include "tokenizer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "fs.h"
#include "jinja.h"
#include "tokenizer_internal.h"

static void free_ops(ct_sp_op *ops, int n) {
  for (int i = 0; i < n; i++) {
    free(ops[i].a);
    free(ops[i].b);
  }
  free(ops);
}

void ct_tokenizer_free(ct_tokenizer *t) {
  if (!t) return;
  free(t->bytes);
  free(t->tok_off);
  free(t->tok_len);
  free(t->tok_kind);
  free(t->tok_special);
  free(t->vslot);
  free(t->mslot);
  free_ops(t->ops, t->nops);
  free_ops(t->drep, t->ndrep);
  free(t->dec_off);
  free(t->dec_len);
  free(t->jslot);
  free(t->added);
  ct_tok_free_added_index(t);
  for (int i = 0; i < t->nsteps; i++) ct_regex_free(t->steps[i].re);
  free(t->steps);
  free(t->template_src);
  ct_jinja_free(t->tmpl);
  free(t->template_err);
  free(t->bos_str);
  free(t->eos_str);
  free(t->pad_str);
  free(t->unk_str);
  free(t->stops);
  free(t->json_text);
  free(t->cfg_text);
  pthread_mutex_destroy(&t->cache_mu);
  ct_tok_cache_free(&t->cache);
  ct_tok_scratch_free(t, &t->scratch);
  free(t);
}

// ===========================================================================
// Loading

int ct_tok_parse_json(const char *file, const char *text, size_t len, json_t **out) {
  json_error_t err;
  *out = json_loadb(text, len, 0, &err);
  // Python writes integers of any size (model_max_length = 1e30): read them as reals.
  if (!*out && strstr(err.text, "too big integer")) *out = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &err);
  if (!*out) return FAIL(CT_EFORMAT, "%s:%d:%d: %s", file, err.line, err.column, err.text);
  return 0;
}

// Builds a tokenizer from the text of its files (cfg/gen may be NULL). Takes ownership
// of json_text and cfg_text. `dir` is for messages.
static int build(ct_tokenizer **out, const char *dir, char *json_text, size_t json_len, char *cfg_text,
                 size_t cfg_len, const json_t *gencfg) {
  *out = NULL;
  ct_tok_gpt2_init();
  ct_tokenizer *t = calloc(1, sizeof *t);
  if (!t) {
    free(json_text);
    free(cfg_text);
    return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  }
  pthread_mutex_init(&t->cache_mu, NULL);
  t->json_text = json_text;
  t->json_len = json_len;
  t->cfg_text = cfg_text;
  t->cfg_len = cfg_len;
  t->bos = t->eos = t->pad = t->unk = -1;
  char file[4200], cfgfile[4200];
  snprintf(file, sizeof file, "%s/tokenizer.json", dir);
  snprintf(cfgfile, sizeof cfgfile, "%s/tokenizer_config.json", dir);
  loadctx L = {file};
  json_t *j = NULL, *cfg = NULL;
  int rc = ct_tok_parse_json(file, json_text, json_len, &j);
  if (!rc && !json_is_object(j)) rc = FAIL(CT_EFORMAT, "%s: expected a JSON object", file);
  // A file with no ByteLevel anywhere is SentencePiece-style: its vocabulary is text.
  t->sp = !rc && !ct_tok_has_byte_level(json_object_get(j, "pre_tokenizer")) && !ct_tok_has_byte_level(json_object_get(j, "decoder"));
  if (!rc) rc = ct_tok_load_model(t, &L, json_object_get(j, "model"));
  if (!rc) rc = ct_tok_load_added(t, &L, json_object_get(j, "added_tokens"));
  if (!rc) rc = ct_tok_load_normalizer(t, &L, json_object_get(j, "normalizer"), "normalizer");
  if (!rc) rc = ct_tok_load_pretok(t, &L, json_object_get(j, "pre_tokenizer"), "pre_tokenizer");
  if (!rc) rc = ct_tok_load_decoder(t, &L, json_object_get(j, "decoder"), "decoder");
  if (!rc && t->sp) rc = ct_tok_build_dec(t);
  int lead = -1, trail = -1;
  if (!rc) ct_tok_post_template(t, json_object_get(j, "post_processor"), &lead, &trail);
  if (!rc && cfg_text) rc = ct_tok_parse_json(cfgfile, cfg_text, cfg_len, &cfg);
  if (!rc && cfg) {
    rc = ct_tok_load_config(t, cfgfile, cfg, lead, trail);
    char where[4300];
    snprintf(where, sizeof where, "%s: chat_template", cfgfile);
    if (!rc) rc = ct_tok_compile_template(t, where);
  } else if (!rc) {
    t->add_bos = lead >= 0;
    if (lead >= 0) t->bos = lead;
  }
  if (!rc) rc = ct_tok_collect_stops(t, gencfg);
  json_decref(j);
  json_decref(cfg);
  if (rc) {
    ct_tokenizer_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

int ct_tokenizer_load(ct_tokenizer **out, const char *dir) {
  *out = NULL;
  char path[4200];
  char *json_text, *cfg_text, *gen_text;
  size_t json_len, cfg_len, gen_len;
  bool missing;
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  int rc = ct_read_file(path, &json_text, &json_len, NULL);
  if (rc) return rc;
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  rc = ct_read_file(path, &cfg_text, &cfg_len, &missing);
  if (rc) {
    free(json_text);
    return rc;
  }
  json_t *gen = NULL;
  snprintf(path, sizeof path, "%s/generation_config.json", dir);
  rc = ct_read_file(path, &gen_text, &gen_len, &missing);
  if (!rc && gen_text) {
    rc = ct_tok_parse_json(path, gen_text, gen_len, &gen);
    free(gen_text);
  }
  if (rc) {
    free(json_text);
    free(cfg_text);
    return rc;
  }
  rc = build(out, dir, json_text, json_len, cfg_text, cfg_len, gen);
  json_decref(gen);
  // transformers (4.47+) saves the template as chat_template.jinja, which then wins over
  // tokenizer_config.json's
  snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
  if (!rc && access(path, F_OK) == 0 && (rc = ct_tokenizer_load_chat_template(*out, path))) {
    ct_tokenizer_free(*out);
    *out = NULL;
  }
  return rc;
}

// The byte tokenizer's special tokens, in id order after the 256 bytes.
static const char *const byte_specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"};

// ChatML. Assistant replies and their <|im_end|> sit in {% generation %} blocks, the
// markers transformers (return_assistant_tokens_mask) and assistant_only_loss use.
static const char chatml_template[] =
    "{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\\n' }}{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// The byte tokenizer's files: a byte-level BPE with no merges whose vocabulary maps id b
// to GPT-2's printable stand-in for byte b, so Hugging Face encodes every byte to its
// own id, as ctune does.
static int byte_files(char **tok_text, char **cfg_text) {
  ct_tok_gpt2_init();
  json_t *vocab = json_object(), *added = json_array();
  char ch[8];
  for (int b = 0; b < 256; b++) {
    ch[ct_utf8_put(ch, (uint32_t)ct_tok_gpt2_byte_char(b))] = 0;
    json_object_set_new(vocab, ch, json_integer(b));
  }
  for (int s = 0; s < 4; s++) {
    json_object_set_new(vocab, byte_specials[s], json_integer(256 + s));
    json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 256 + s, "content",
                                           byte_specials[s], "single_word", 0, "lstrip", 0, "rstrip", 0,
                                           "normalized", 0, "special", 1));
  }
  json_t *tok = json_pack(
      "{s:s,s:n,s:n,s:o,s:n,s:{s:s,s:b,s:b,s:b},s:n,s:{s:s,s:b,s:b,s:b},"
      "s:{s:s,s:n,s:n,s:n,s:n,s:b,s:b,s:b,s:o,s:o}}",
      "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "pre_tokenizer", "type",
      "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0, "post_processor", "decoder",
      "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0, "model", "type", "BPE",
      "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
      "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", json_array());
  json_t *cfg = json_pack("{s:s,s:s,s:s,s:b,s:s,s:i,s:s}", "bos_token", byte_specials[0], "eos_token",
                          byte_specials[0], "pad_token", byte_specials[3], "add_bos_token", 0, "chat_template",
                          chatml_template, "model_max_length", 1 << 20, "tokenizer_class",
                          "PreTrainedTokenizerFast");
  *tok_text = tok ? json_dumps(tok, JSON_INDENT(2) | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER) : NULL;
  *cfg_text = cfg ? json_dumps(cfg, JSON_INDENT(2) | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER) : NULL;
  json_decref(tok);
  json_decref(cfg);
  if (!*tok_text || !*cfg_text) {
    free(*tok_text);
    free(*cfg_text);
    return FAIL(CT_ENOMEM, "tokenizer: cannot build the byte tokenizer");
  }
  return 0;
}

int ct_tokenizer_bytes(ct_tokenizer **out) {
  char *tok, *cfg;
  int rc = byte_files(&tok, &cfg);
  if (rc) return rc;
  return build(out, "(byte tokenizer)", tok, strlen(tok), cfg, strlen(cfg), NULL);
}

// ===========================================================================
// Queries

int ct_tokenizer_fit(ct_tokenizer *t, int V, int *dropped) {
  *dropped = 0;
  if (t->vocab_size <= V) return 0;
  for (int id = V; id < t->vocab_size; id++)
    if (t->tok_kind[id] == TOK_VOCAB)
      return ct_set_error(CT_EINVAL, "the tokenizer's vocabulary has id %d ('%.*s'), past the model's vocab_size %d",
                          id, (int)t->tok_len[id], t->bytes + t->tok_off[id], V);
  int specials[] = {t->bos, t->eos, t->pad, t->unk};
  for (int i = 0; i < 4; i++)
    if (specials[i] >= V)
      return ct_set_error(CT_EINVAL, "the tokenizer's special token %d is past the model's vocab_size %d",
                          specials[i], V);
  int k = 0;
  for (int i = 0; i < t->nadded; i++)
    if (t->added[i].id < V) t->added[k++] = t->added[i];
  *dropped = t->nadded - k;
  t->nadded = k;
  int n = 0;
  for (int i = 0; i < t->nstops; i++)
    if (t->stops[i] < V) t->stops[n++] = t->stops[i];
  t->nstops = n;
  t->vocab_size = V;
  if (!*dropped) return 0;
  ct_tok_free_added_index(t);
  return ct_tok_index_added(t);
}

int ct_tokenizer_vocab_size(const ct_tokenizer *t) { return t->vocab_size; }
int ct_tokenizer_bos(const ct_tokenizer *t) { return t->bos; }
int ct_tokenizer_eos(const ct_tokenizer *t) { return t->eos; }
int ct_tokenizer_pad(const ct_tokenizer *t) { return t->pad >= 0 ? t->pad : t->eos; }
bool ct_tokenizer_add_bos(const ct_tokenizer *t) { return t->add_bos; }
bool ct_tokenizer_add_eos(const ct_tokenizer *t) { return t->add_eos; }

int ct_tokenizer_stop_ids(const ct_tokenizer *t, const int **ids) {
  *ids = t->stops;
  return t->nstops;
}

bool ct_tokenizer_is_stop(const ct_tokenizer *t, int id) {
  for (int i = 0; i < t->nstops; i++)
    if (t->stops[i] == id) return true;
  return false;
}

bool ct_tokenizer_is_special(const ct_tokenizer *t, int id) {
  return id >= 0 && id < t->vocab_size && t->tok_special[id];
}

int ct_tokenizer_token_id(const ct_tokenizer *t, const char *token) {
  if (!token) return -1;
  size_t n = strlen(token);
  int k = ct_tok_added_find(t, token, n);
  if (k >= 0) return t->added[k].id;
  // a vocabulary entry, spelled as in tokenizer.json (byte-level characters)
  char buf[256] = "";
  long w = n < sizeof buf && !t->sp ? ct_tok_gpt2_decode(token, n, buf) : -1;
  int id = w >= 0 ? ct_tok_vocab_find(t, buf, (size_t)w) : -1;
  if (id < 0) id = ct_tok_vocab_find(t, token, n);
  return id;
}
