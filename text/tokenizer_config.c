// tokenizer_config.json (bos/eos/pad/unk tokens, add_bos_token, add_eos_token,
// chat_template), generation_config.json's eos ids (the stop ids), saving both files back,
// and the chat template: replacing it, rendering a conversation with it.
#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "error.h"
#include "jinja.h"
#include "tokenizer_internal.h"

// A token field is a string or {"__type": "AddedToken", "content": ...}.
static const char *token_field(const json_t *cfg, const char *key) {
  const json_t *v = json_object_get(cfg, key);
  if (json_is_object(v)) v = json_object_get(v, "content");
  return json_string_value(v);
}

static int dup_str(char **dst, const char *s) {
  if (!s) return 0;
  *dst = strdup(s);
  return *dst ? 0 : FAIL(CT_ENOMEM, "tokenizer: out of memory");
}

int ct_tok_load_config(ct_tokenizer *t, const char *file, const json_t *cfg, int lead, int trail) {
  if (!json_is_object(cfg)) return FAIL(CT_EFORMAT, "%s: expected a JSON object", file);
  const char *keys[] = {"bos_token", "eos_token", "pad_token", "unk_token"};
  char **dst[] = {&t->bos_str, &t->eos_str, &t->pad_str, &t->unk_str};
  int *ids[] = {&t->bos, &t->eos, &t->pad, &t->unk};
  for (int k = 0; k < 4; k++) {
    const json_t *v = json_object_get(cfg, keys[k]);
    if (!v || json_is_null(v)) continue;
    const char *s = token_field(cfg, keys[k]);
    if (!s) return FAIL(CT_EFORMAT, "%s: %s: expected a string, an AddedToken object or null", file, keys[k]);
    if (dup_str(dst[k], s)) return CT_ENOMEM;
    int id = ct_tokenizer_token_id(t, s);
    if (id < 0) return FAIL(CT_EFORMAT, "%s: %s: '%s' is not a token of tokenizer.json", file, keys[k], s);
    *ids[k] = id;
  }
  const json_t *ab = json_object_get(cfg, "add_bos_token");
  if (ab && !json_is_boolean(ab) && !json_is_null(ab)) return FAIL(CT_EFORMAT, "%s: add_bos_token: expected true or false", file);
  t->add_bos = json_is_boolean(ab) ? json_is_true(ab) : (lead >= 0 && lead == t->bos);
  if (t->bos < 0) t->add_bos = false;
  const json_t *ae = json_object_get(cfg, "add_eos_token");
  if (ae && !json_is_boolean(ae) && !json_is_null(ae)) return FAIL(CT_EFORMAT, "%s: add_eos_token: expected true or false", file);
  t->add_eos = json_is_boolean(ae) ? json_is_true(ae) : (trail >= 0 && trail == t->eos);
  if (t->eos < 0) t->add_eos = false;

  const char *tpl;
  int rc = ct_chat_template_pick(json_object_get(cfg, "chat_template"), file, &tpl);
  if (rc) return rc;
  return tpl && dup_str(&t->template_src, tpl) ? CT_ENOMEM : 0;
}

// Compiles the chat template; a template that does not parse leaves the tokenizer
// usable for encoding and makes ct_tokenizer_chat fail with the parse error.
int ct_tok_compile_template(ct_tokenizer *t, const char *where) {
  if (!t->template_src) return 0;
  int rc = ct_jinja_parse(&t->tmpl, t->template_src, strlen(t->template_src), where);
  if (rc == CT_ENOMEM) return rc;
  if (rc) return dup_str(&t->template_err, ct_last_error());
  return 0;
}

// Special tokens that end a turn or a document in common chat formats.
static const char *const stop_names[] = {
    "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "</s>",
    "<end_of_turn>", "<|end|>", "<|return|>", "<|end▁of▁sentence|>", "<|EOT|>", "<eos>",
};

static int add_stop(ct_tokenizer *t, int id) {
  if (id < 0 || id >= t->vocab_size) return 0;
  for (int i = 0; i < t->nstops; i++)
    if (t->stops[i] == id) return 0;
  int *s = realloc(t->stops, sizeof *s * (size_t)(t->nstops + 1));
  if (!s) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  t->stops = s;
  int i = t->nstops++;
  while (i > 0 && s[i - 1] > id) {
    s[i] = s[i - 1];
    i--;
  }
  s[i] = id;
  return 0;
}

int ct_tok_collect_stops(ct_tokenizer *t, const json_t *gencfg) {
  if (add_stop(t, t->eos)) return CT_ENOMEM;
  const json_t *e = json_object_get(gencfg, "eos_token_id");
  int id;
  if (ct_tok_get_id(e, &id) && add_stop(t, id)) return CT_ENOMEM;
  for (size_t i = 0; json_is_array(e) && i < json_array_size(e); i++)
    if (ct_tok_get_id(json_array_get(e, i), &id) && add_stop(t, id)) return CT_ENOMEM;
  for (size_t k = 0; k < sizeof stop_names / sizeof stop_names[0]; k++) {
    id = ct_tokenizer_token_id(t, stop_names[k]);
    if (id >= 0 && t->tok_kind[id] == TOK_ADDED && t->tok_special[id] && add_stop(t, id)) return CT_ENOMEM;
  }
  return 0;
}

// ===========================================================================
// Saving

static int write_file(const char *dir, const char *name, const char *text, size_t len) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) return FAIL(CT_EIO, "%s: cannot write: %s", path, strerror(errno));
  int err = fwrite(text, 1, len, f) == len ? 0 : errno;
  if (fclose(f) && !err) err = errno;  // (a full disk may show only here, at the flush)
  return err ? FAIL(CT_EIO, "%s: write failed: %s", path, strerror(err)) : 0;
}

double ct_tokenizer_saved_bytes(const ct_tokenizer *t) {
  // a replaced chat template goes into the config too
  return (double)t->json_len + (double)t->cfg_len + (t->template_overridden && t->template_src ? strlen(t->template_src) : 0);
}

int ct_tokenizer_save(const ct_tokenizer *t, const char *dir) {
  int rc = write_file(dir, "tokenizer.json", t->json_text, t->json_len);
  if (rc || (!t->cfg_text && !t->template_overridden)) return rc;
  if (!t->template_overridden) return write_file(dir, "tokenizer_config.json", t->cfg_text, t->cfg_len);
  // A replaced chat template goes into the saved config, so the checkpoint renders alike.
  json_t *cfg = NULL;
  if (t->cfg_text) ct_tok_parse_json("tokenizer_config.json", t->cfg_text, t->cfg_len, &cfg);  // parsed at load
  if (!cfg) cfg = json_object();
  char *text = NULL;
  if (cfg && !json_object_set_new(cfg, "chat_template", json_string(t->template_src)))
    text = json_dumps(cfg, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  json_decref(cfg);
  if (!text) return FAIL(CT_ENOMEM, "tokenizer: cannot write tokenizer_config.json");
  rc = write_file(dir, "tokenizer_config.json", text, strlen(text));
  free(text);
  return rc;
}

// ===========================================================================
// Chat templates

int ct_tokenizer_set_chat_template(ct_tokenizer *t, const char *src, size_t len, const char *where) {
  ct_jinja *tpl;
  int rc = ct_jinja_parse(&tpl, src, len, where);
  if (rc) return rc;
  char *copy = malloc(len + 1);
  if (!copy) {
    ct_jinja_free(tpl);
    return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  }
  memcpy(copy, src, len);
  copy[len] = 0;
  ct_jinja_free(t->tmpl);
  free(t->template_src);
  free(t->template_err);
  t->tmpl = tpl;
  t->template_src = copy;
  t->template_err = NULL;
  t->template_overridden = true;
  return 0;
}

int ct_tokenizer_load_chat_template(ct_tokenizer *t, const char *path) {
  char *src;
  size_t len;
  int rc = ct_chat_template_read(path, &src, &len);
  if (rc) return rc;
  rc = ct_tokenizer_set_chat_template(t, src, len, path);
  free(src);
  return rc;
}

const char *ct_tokenizer_chat_template_src(const ct_tokenizer *t) { return t->tmpl ? t->template_src : NULL; }

bool ct_tokenizer_chat_has_generation(const ct_tokenizer *t) { return t->tmpl && ct_jinja_has_generation(t->tmpl); }

int ct_tokenizer_chat_render(const ct_tokenizer *t, const json_t *messages, const ct_chat_opts *opts,
                             char **out, size_t *len, ct_span **gen, int *ngen) {
  *out = NULL;
  if (gen) {
    *gen = NULL;
    *ngen = 0;
  }
  if (!json_is_array(messages)) return FAIL(CT_EFORMAT, "messages: expected a list");
  for (size_t i = 0; i < json_array_size(messages); i++) {
    const json_t *m = json_array_get(messages, i), *c = json_object_get(m, "content");
    if (!json_is_string(json_object_get(m, "role")))
      return FAIL(CT_EFORMAT, "messages[%zu]: needs a string 'role'", i);
    if (!(json_is_string(c) || json_is_array(c) || (json_is_null(c) && json_object_get(m, "tool_calls")) ||
          (!c && json_object_get(m, "tool_calls"))))
      return FAIL(CT_EFORMAT, "messages[%zu]: needs a string 'content'", i);
  }
  if (!t->tmpl) {
    if (t->template_err) return FAIL(CT_EFORMAT, "%s", t->template_err);
    return FAIL(CT_EINVAL, "tokenizer: no chat_template in tokenizer_config.json");
  }
  json_t *vars = json_object();
  if (!vars) return FAIL(CT_ENOMEM, "tokenizer: out of memory");
  if (opts && opts->extra) {
    if (!json_is_object(opts->extra)) {
      json_decref(vars);
      return FAIL(CT_EINVAL, "chat: extra template variables must be a JSON object");
    }
    json_object_update(vars, (json_t *)opts->extra);
  }
  json_object_set(vars, "messages", (json_t *)messages);
  json_object_set_new(vars, "add_generation_prompt", json_boolean(opts && opts->add_generation_prompt));
  if (opts && opts->tools) json_object_set(vars, "tools", (json_t *)opts->tools);
  // the tokenizer's special tokens, unless the extra variables set them
  const char *names[] = {"bos_token", "eos_token", "pad_token", "unk_token"};
  const char *vals[] = {t->bos_str, t->eos_str, t->pad_str, t->unk_str};
  for (int i = 0; i < 4; i++)
    if (vals[i] && !json_object_get(vars, names[i])) json_object_set_new(vars, names[i], json_string(vals[i]));
  size_t n = 0;
  int rc = ct_jinja_render(t->tmpl, vars, out, &n, gen, ngen);
  json_decref(vars);
  if (len) *len = n;
  return rc;
}

int ct_tokenizer_chat(const ct_tokenizer *t, const json_t *messages, bool add_generation_prompt, char **out) {
  ct_chat_opts o = {.add_generation_prompt = add_generation_prompt};
  return ct_tokenizer_chat_render(t, messages, &o, out, NULL, NULL, NULL);
}
