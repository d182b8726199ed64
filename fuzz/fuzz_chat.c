// Fuzzes rendering real chat templates (the tests' fixtures, and the repo's training
// templates) with fuzzed conversations: the input is one JSON row as the data files hold
// it — {"messages": [...], "tools"?, "chat_template_kwargs"?, "add_generation_prompt"?}
// or a bare message list. Every template renders it through ct_tokenizer_chat_render
// and the result is encoded with its assistant mask.
//
// The templates are read at start-up from the repository: run from its root, or set
// CT_FUZZ_ROOT to it.
#include <dirent.h>

#include "fuzz.h"
#include "tokenizer.h"

#define MAX_TEMPLATES 64
static ct_tokenizer *toks[MAX_TEMPLATES];  // the byte tokenizer, one template each
static int n_toks;

static void load_templates(const char *root, const char *sub) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/%s", root, sub);
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) && n_toks < MAX_TEMPLATES) {
    size_t n = strlen(e->d_name);
    if (n < 6 || strcmp(e->d_name + n - 6, ".jinja") != 0) continue;
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "rb");
    char *src = malloc(1 << 20);
    size_t len = f && src ? fread(src, 1, (1 << 20) - 1, f) : 0;
    if (f) fclose(f);
    ct_tokenizer *t;
    if (!src || ct_tokenizer_bytes(&t)) abort();
    if (ct_tokenizer_set_chat_template(t, src, len, path)) {
      fprintf(stderr, "fuzz_chat: %s\n", ct_last_error());
      abort();
    }
    toks[n_toks++] = t;
    free(src);
  }
  closedir(d);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  const char *root = getenv("CT_FUZZ_ROOT") ? getenv("CT_FUZZ_ROOT") : ".";
  load_templates(root, "tests/fixtures/tokenizer/templates");
  load_templates(root, "templates");
  if (n_toks == 0) {
    fprintf(stderr, "fuzz_chat: no templates under %s/tests/fixtures/tokenizer/templates: run from the "
                    "repository root or set CT_FUZZ_ROOT\n", root);
    exit(1);
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  json_error_t err;
  json_t *row = json_loadb((const char *)data, size, 0, &err);
  if (!row) return -1;
  const json_t *msgs = json_is_array(row) ? row : json_object_get(row, "messages");
  const json_t *tools = json_object_get(row, "tools"), *kw = json_object_get(row, "chat_template_kwargs");
  ct_chat_opts o = {.add_generation_prompt = json_is_true(json_object_get(row, "add_generation_prompt")),
                    .tools = json_is_array(tools) ? tools : NULL,
                    .extra = json_is_object(kw) ? kw : NULL};
  {
    for (int i = 0; i < n_toks; i++) {
      char *text = NULL;
      size_t len = 0;
      ct_span *gen = NULL;
      int ngen = 0;
      fuzz_clear_error();
      int rc = ct_tokenizer_chat_render(toks[i], msgs, &o, &text, &len, &gen, &ngen);
      fuzz_check_error(rc, "ct_tokenizer_chat_render");
      if (!rc) {
        ct_ids ids = {0}, mask = {0};
        if (ct_tokenizer_encode_masked(toks[i], text, len, gen, ngen, &ids, &mask) || ids.n != mask.n) abort();
        ct_ids_free(&ids);
        ct_ids_free(&mask);
      }
      free(text);
      free(gen);
    }
  }
  json_decref(row);
  return 0;
}
