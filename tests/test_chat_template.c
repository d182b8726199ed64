// chat_template: chat_template_path reads a Jinja file or a tokenizer directory (its
// chat_template.jinja, else tokenizer_config.json's chat_template, a string or a list of
// named templates); a tokenizer directory's chat_template.jinja wins over its config's.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chat_template.h"
#include "error.h"
#include "scratch.h"
#include "test.h"
#include "tokenizer.h"

// The text t renders for one user message "hi".
static char *render(const ct_tokenizer *t) {
  json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, NULL);
  char *s = NULL;
  CHECK_OK(ct_tokenizer_chat(t, msgs, false, &s));
  json_decref(msgs);
  return s;
}

static void check_reads(const char *path, const char *want) {
  char *src = NULL;
  size_t len = 0;
  CHECK_OK(ct_chat_template_read(path, &src, &len));
  if (src && strcmp(src, want)) fprintf(stderr, "  %s: read '%s', want '%s'\n", path, src, want);
  CHECK(src && !strcmp(src, want) && len == strlen(want));
  free(src);
}

static void check_fails(const char *path, const char *want) {
  char *src = NULL;
  size_t len = 0;
  ct_set_error(CT_OK, "%s", "");
  CHECK(ct_chat_template_read(path, &src, &len) != 0);
  if (!strstr(ct_last_error(), want)) fprintf(stderr, "  %s: '%s' lacks '%s'\n", path, ct_last_error(), want);
  CHECK(strstr(ct_last_error(), want) != NULL);
}

static void test_reads_a_file_or_a_tokenizer_directory(void) {
  write_file("t.jinja", "A{{ messages[0].content }}");
  check_reads(scratch_path("t.jinja"), "A{{ messages[0].content }}");
  // a directory: tokenizer_config.json's string, or the "default" of a list
  mkdir(scratch_path("d1"), 0700);
  write_file("d1/tokenizer_config.json", "{\"chat_template\": \"B{{ 1 }}\"}");
  check_reads(scratch_path("d1"), "B{{ 1 }}");
  mkdir(scratch_path("d2"), 0700);
  write_file("d2/tokenizer_config.json",
             "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, "
             "{\"name\": \"default\", \"template\": \"D\"}]}");
  check_reads(scratch_path("d2"), "D");
  // chat_template.jinja wins over the config's
  write_file("d2/chat_template.jinja", "J");
  check_reads(scratch_path("d2"), "J");
}

static void test_paths_without_a_template_fail_naming_the_path(void) {
  check_fails(scratch_path("none.jinja"), "none.jinja does not exist");
  write_file("empty.jinja", "");
  check_fails(scratch_path("empty.jinja"), "empty.jinja is empty");
  mkdir(scratch_path("d3"), 0700);
  check_fails(scratch_path("d3"), "neither chat_template.jinja nor tokenizer_config.json");
  write_file("d3/tokenizer_config.json", "{\"eos_token\": \"x\"}");
  check_fails(scratch_path("d3"), "has no chat_template");
  write_file("d3/tokenizer_config.json", "{\"chat_template\": 5}");
  check_fails(scratch_path("d3"), "chat_template: expected a string");
  write_file("d3/tokenizer_config.json", "{\"chat_template\": [{\"name\": 1}]}");
  check_fails(scratch_path("d3"), "chat_template[0]");
  write_file("d3/tokenizer_config.json", "{\"chat_template\": ");
  check_fails(scratch_path("d3"), "tokenizer_config.json:1:");
}

// ct_tokenizer_load_chat_template replaces the template; a tokenizer directory saved with a
// chat_template.jinja (as transformers 4.47+ saves it) loads with that template.
static void test_apply_and_a_directorys_chat_template_jinja(void) {
  ct_tokenizer *t;
  CHECK_OK(ct_tokenizer_bytes(&t));
  write_file("x.jinja", "X{{ messages[0].content }}");
  CHECK_OK(ct_tokenizer_load_chat_template(t, scratch_path("x.jinja")));
  char *s = render(t);
  CHECK(s && !strcmp(s, "Xhi"));
  free(s);
  write_file("bad.jinja", "{% if %}");
  CHECK(ct_tokenizer_load_chat_template(t, scratch_path("bad.jinja")) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "bad.jinja") != NULL);
  mkdir(scratch_path("tok"), 0700);
  CHECK_OK(ct_tokenizer_save(t, scratch_path("tok")));
  ct_tokenizer_free(t);
  write_file("tok/chat_template.jinja", "Y{{ messages[0].content }}");
  CHECK_OK(ct_tokenizer_load(&t, scratch_path("tok")));
  s = render(t);
  CHECK(s && !strcmp(s, "Yhi"));
  free(s);
  ct_tokenizer_free(t);
  write_file("tok/chat_template.jinja", "{% for %}");
  CHECK(ct_tokenizer_load(&t, scratch_path("tok")) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "chat_template.jinja") != NULL);
}

int main(void) {
  if (scratch_make("/tmp/ct_test_chat_template_XXXXXX")) return 1;
  RUN(test_reads_a_file_or_a_tokenizer_directory);
  RUN(test_paths_without_a_template_fail_naming_the_path);
  RUN(test_apply_and_a_directorys_chat_template_jinja);
  if (scratch_remove()) return 1;
  return test_summary();
}
