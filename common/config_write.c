// config_write: yml written from the key table: a run's output_dir/config.yml (every key
// the trainer takes, with its origin; reloads to the same config) and configs/base.yml
// (every key with its default, comment and facts: range, choices, trainers).
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "config_internal.h"
#include "error.h"

// Strings that read back as themselves without quotes (in block and flow context).
static int plain_safe(const char *s) {
  static const char *const special[] = {"~", "null", "true", "false", "yes", "no", "on", "off",
                                        "y", "n"};
  if (!*s || !strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./", *s))
    return 0;
  for (const char *p = s; *p; p++)
    if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./+@=-", *p))
      return 0;
  for (size_t i = 0; i < sizeof special / sizeof *special; i++)
    if (!strcasecmp(s, special[i])) return 0;
  return 1;
}

static void write_str(FILE *f, const char *s) {
  if (plain_safe(s)) {
    fputs(s, f);
    return;
  }
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    // YAML reads NEL, LS and PS as line breaks even inside quotes (and folds them): escaped
    if (p[0] == 0xC2 && p[1] == 0x85) {
      fputs("\\N", f), p++;
      continue;
    }
    if (p[0] == 0xE2 && p[1] == 0x80 && (p[2] == 0xA8 || p[2] == 0xA9)) {
      fputs(p[2] == 0xA8 ? "\\L" : "\\P", f), p += 2;
      continue;
    }
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else if (*p == '\n') fputs("\\n", f);
    else if (*p == '\t') fputs("\\t", f);
    else if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\x%02x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

void config_write_value(FILE *f, const ct_config *c, const key_def *k) {
  const void *v = cfield_of(c, k);
  char buf[40];
  switch (k->type) {
    case K_BOOL: fputs(*(const int *)v ? "true" : "false", f); break;
    case K_INT: fprintf(f, "%" PRId64, *(const int64_t *)v); break;
    case K_FLOAT:
      config_fmt_double(*(const double *)v, buf, sizeof buf);
      fputs(buf, f);
      break;
    case K_STR: write_str(f, *(char *const *)v); break;
    case K_ENUM: fputs(k->choices[*(const int *)v], f); break;
    case K_STR_LIST: {
      const ct_str_list *l = v;
      fputc('[', f);
      for (int i = 0; i < l->n; i++) {
        if (i) fputs(", ", f);
        write_str(f, l->v[i]);
      }
      fputc(']', f);
      break;
    }
    case K_FLOAT_LIST: {
      const ct_float_list *l = v;
      fputc('[', f);
      for (int i = 0; i < l->n; i++) {
        config_fmt_double(l->v[i], buf, sizeof buf);
        fprintf(f, "%s%s", i ? ", " : "", buf);
      }
      fputc(']', f);
      break;
    }
    case K_INCLUDE: fputs("\"\"", f); break;
  }
}

#define NBSP '\001'  // a space that write_comment never breaks a line at

// Writes "# text" wrapped at 88 columns, each line indented.
static void write_comment(FILE *f, const char *indent, const char *text) {
  const int width = 88 - (int)strlen(indent) - 2;
  while (*text) {
    int len = (int)strlen(text), cut = len;
    if (len > width) {
      for (cut = width; cut > 0 && text[cut] != ' '; cut--) {}
      if (cut == 0) cut = width;
    }
    fprintf(f, "%s# ", indent);
    for (int i = 0; i < cut; i++) fputc(text[i] == NBSP ? ' ' : text[i], f);
    fputc('\n', f);
    text += cut;
    while (*text == ' ') text++;
  }
}

static int has_per_trainer(const key_def *k) {
  for (int i = 0; i < NKINDS; i++)
    if (k->per_trainer[i]) return 1;
  return 0;
}

// The extra facts base.yml states after each comment, all taken from the table.
static void key_facts(const key_def *k, char *buf, size_t n) {
  size_t len = 0;
  buf[0] = 0;
#define ADD(...) (len += (size_t)snprintf(buf + len, len < n ? n - len : 0, __VA_ARGS__))
  if (k->type == K_ENUM || (k->type == K_STR_LIST && k->choices)) {
    ADD(k->type == K_ENUM ? " One of:" : " Items from:");
    for (int i = 0; k->choices[i]; i++) ADD("%s %s", i ? " |" : "", k->choices[i]);
    ADD(".");
  }
  if (k->type == K_INT || k->type == K_FLOAT || k->type == K_FLOAT_LIST) {
    char r[96];
    config_fmt_range(k, r, sizeof r);
    for (char *p = r; *p; p++)
      if (*p == ' ') *p = NBSP;  // keep "[2, 1048576]" on one line
    ADD(" Range%c%s.", NBSP, r);
  }
  if ((k->trainers & CT_TRAINER_ALL) != CT_TRAINER_ALL) {
    char l[64];
    config_trainer_list(k->trainers, l, sizeof l);
    ADD(" Only for %s.", l);
  }
  if (has_per_trainer(k)) {
    ADD(" Default per trainer:");
    const char *sep = " ";
    for (int i = 0; i < NKINDS; i++)
      if (k->trainers & (1u << i)) {
        ADD("%s%s %s", sep, config_trainer_names[i], k->per_trainer[i] ? k->per_trainer[i] : k->def);
        sep = ", ";
      }
    ADD(".");
  }
#undef ADD
}

// Keys that base.yml must not set for every trainer (see config.h).
static int base_commented(const key_def *k) {
  return k->type == K_INCLUDE || (k->trainers & CT_TRAINER_ALL) != CT_TRAINER_ALL || has_per_trainer(k) ||
         is_model_key(k);
}

static const char BASE_HEADER[] =
    "# ctune base configuration: every key with its built-in default.\n"
    "# Generated by `ctune-config base` from the key table in common/config_keys.c: change\n"
    "# the table, then regenerate this file (a test checks that the two agree).\n"
    "#\n"
    "# A trainer yml starts with `base_config: base.yml` and sets what it changes; any key\n"
    "# can also be set on the command line: bin/sft configs/sft.yml learning_rate=1e-5\n"
    "# model.hidden_size=64. Keys written here as comments are left unset on purpose:\n"
    "# they apply to some trainers only, have a per-trainer default, or are model.* keys,\n"
    "# where a key left unset may take a value implied by model_type.\n";

int ct_config_write_base_yaml(FILE *f) {
  ct_config d;
  int rc = config_init_for(&d, 0);
  if (rc) return rc;
  fputs(BASE_HEADER, f);
  int in_model = 0;
  for (int i = 0; i < config_nkeys; i++) {
    const key_def *k = &config_keys[i];
    const char *name = k->name, *indent = "";
    if (k->section) fprintf(f, "\n# --- %s ---\n", k->section);
    if (is_model_key(k)) {
      if (!in_model) fputs("model:\n", f), in_model = 1;
      name += strlen(MODEL_PREFIX), indent = "  ";
    }
    char text[1024];
    key_facts(k, text + snprintf(text, sizeof text, "%s", k->comment),
              sizeof text - strlen(k->comment));
    write_comment(f, indent, text);
    fprintf(f, "%s%s%s: ", indent, base_commented(k) ? "# " : "", name);
    config_write_value(f, &d, k);
    fputc('\n', f);
  }
  ct_config_free(&d);
  return ferror(f) ? ct_set_error(CT_EIO, "writing base.yml: %s", strerror(errno)) : 0;
}

int ct_config_dump(const ct_config *c, FILE *f) {
  const char *tn = ct_trainer_name(c->trainer);
  if (!tn || !c->origin_) return ct_set_error(CT_EINVAL, "ct_config_dump: config not initialized");
  fprintf(f, "# ctune configuration, resolved for %s. Load it again with: bin/%s <this file>\n"
             "# After each value: where it came from. model.* keys left at their default are\n"
             "# written as comments, so that they stay unset when this file is loaded.\n",
          tn, tn);
  int in_model = 0;
  const char *section = NULL;  // printed before the first key of it that is written
  for (int i = 0; i < config_nkeys; i++) {
    const key_def *k = &config_keys[i];
    if (k->section) section = k->section;
    if (k->type == K_INCLUDE || !(k->trainers & (unsigned)c->trainer)) continue;
    const char *name = k->name, *indent = "", *origin = c->origin_[i];
    if (section) fprintf(f, "\n# --- %s ---\n", section), section = NULL;
    if (is_model_key(k)) {
      if (!in_model) fputs("model:\n", f), in_model = 1;
      name += strlen(MODEL_PREFIX), indent = "  ";
    }
    int unset = is_model_key(k) && !(c->model.set_mask & model_bit(k));
    fprintf(f, "%s%s%s: ", indent, unset ? "# " : "", name);
    config_write_value(f, c, k);
    fputs("  # ", f);
    // An origin is a path or "command line": keep it on this comment line.
    for (const char *p = origin ? origin : "default"; *p; p++) fputc(*p == '\n' ? ' ' : *p, f);
    fputc('\n', f);
  }
  return ferror(f) ? ct_set_error(CT_EIO, "writing config: %s", strerror(errno)) : 0;
}

int ct_config_write_yaml(const ct_config *c, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) return ct_set_error(CT_EIO, "%s: cannot write: %s", path, strerror(errno));
  int rc = ct_config_dump(c, f);
  if (fclose(f) && !rc) rc = ct_set_error(CT_EIO, "%s: cannot write: %s", path, strerror(errno));
  if (rc) return ct_wrap_error(rc, "%s", path);
  return 0;
}
