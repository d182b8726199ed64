// chat_template: reading a chat template named by chat_template_path (see the header).
#include "chat_template.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "error.h"
#include "fs.h"

int ct_chat_template_pick(const json_t *v, const char *file, const char **out) {
  *out = NULL;
  if (json_is_array(v)) {
    const json_t *pick = NULL;
    for (size_t i = 0; i < json_array_size(v); i++) {
      const json_t *e = json_array_get(v, i);
      if (!json_is_string(json_object_get(e, "name")) || !json_is_string(json_object_get(e, "template")))
        return ct_set_error(CT_EFORMAT, "%s: chat_template[%zu]: expected {\"name\", \"template\"}", file, i);
      if (!pick || !strcmp(json_string_value(json_object_get(e, "name")), "default")) pick = e;
    }
    v = pick ? json_object_get(pick, "template") : NULL;
  }
  if (!v || json_is_null(v)) return 0;
  if (!json_is_string(v)) return ct_set_error(CT_EFORMAT, "%s: chat_template: expected a string", file);
  *out = json_string_value(v);
  return 0;
}

// A tokenizer directory's template: chat_template.jinja (what transformers writes since
// 4.47), else tokenizer_config.json's chat_template.
static int from_dir(const char *dir, char **src, size_t *len) {
  char path[CT_PATH_MAX];
  bool missing;
  int rc = ct_path_join(path, sizeof path, dir, "chat_template.jinja");
  if (!rc) rc = ct_read_file(path, src, len, &missing);
  if (rc || !missing) return rc;
  char *text;
  size_t n;
  if ((rc = ct_path_join(path, sizeof path, dir, "tokenizer_config.json")) ||
      (rc = ct_read_file(path, &text, &n, &missing)))
    return rc;
  if (missing)
    return ct_set_error(CT_EFORMAT, "%s holds neither chat_template.jinja nor tokenizer_config.json", dir);
  json_error_t err;
  json_t *cfg = json_loadb(text, n, JSON_DECODE_INT_AS_REAL, &err);
  free(text);
  if (!cfg) return ct_set_error(CT_EFORMAT, "%s:%d:%d: %s", path, err.line, err.column, err.text);
  const char *s;
  rc = ct_chat_template_pick(json_object_get(cfg, "chat_template"), path, &s);
  if (!rc && !s) rc = ct_set_error(CT_EFORMAT, "%s has no chat_template", path);
  if (!rc && !(*src = strdup(s))) rc = ct_set_error(CT_ENOMEM, "out of memory");
  if (!rc) *len = strlen(s);
  json_decref(cfg);
  return rc;
}

int ct_chat_template_read(const char *path, char **src, size_t *len) {
  struct stat st;
  if (stat(path, &st) != 0) return ct_set_error(CT_EIO, "%s does not exist", path);
  int rc = S_ISDIR(st.st_mode) ? from_dir(path, src, len) : ct_read_file(path, src, len, NULL);
  if (!rc && *len == 0) {
    free(*src);
    return ct_set_error(CT_EFORMAT, "%s is empty: no chat template", path);
  }
  return rc;
}
