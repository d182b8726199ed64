// Fuzzes tokenizer loading (text/tokenizer*.c, tokenizer_regex.c, unicode.c): the input is
// tokenizer.json, then optionally a NUL byte and tokenizer_config.json, then optionally
// another NUL and generation_config.json (JSON text holds no raw NUL). A tokenizer that
// loads encodes and decodes fixed texts, and renders a fixed conversation with its chat
// template when it has one; every id must lie in [0, vocab size).
#include "fuzz.h"
#include "tokenizer.h"

static const char *const texts[] = {
    "Hello world! It's 2024: 12345 apples, café.\n\n  ",
    "<|im_start|>user\nhi<|im_end|>\n<s> </s> <think>x</think><|endoftext|>",
    "\xff\xfe\xc3 bad utf-8 \xe2\x82 \t\r\n",
    "ab ab 12 <s> x",
    "",
};

static void check_ids(const ct_tokenizer *t, const ct_ids *ids) {
  int V = ct_tokenizer_vocab_size(t);
  for (int i = 0; i < ids->n; i++)
    if (ids->v[i] < 0 || ids->v[i] >= V) {
      fprintf(stderr, "fuzz: id %d outside [0, %d)\n", ids->v[i], V);
      abort();
    }
}

static void exercise(const ct_tokenizer *t) {
  for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
    const char *s = texts[k];
    size_t n = strlen(s);
    for (int special = 0; special < 2; special++) {
      ct_ids ids = {0}, offs = {0};
      if (ct_tokenizer_encode_offsets(t, s, n, special, &ids, &offs)) abort();
      check_ids(t, &ids);
      if (offs.n != ids.n) abort();
      char *out = NULL;
      size_t len = 0;
      if (ct_tokenizer_decode(t, ids.v, ids.n, &out, &len) || strlen(out) > len) abort();
      free(out);
      ct_ids_free(&ids);
      ct_ids_free(&offs);
    }
    ct_ids doc = {0};
    if (ct_tokenizer_encode_doc(t, s, n, &doc)) abort();
    check_ids(t, &doc);
    ct_ids_free(&doc);
  }
  const int *stops;
  int ns = ct_tokenizer_stop_ids(t, &stops);
  for (int i = 0; i < ns; i++)
    if (!ct_tokenizer_is_stop(t, stops[i])) abort();
  for (int id = 0; id < ct_tokenizer_vocab_size(t); id++) {
    size_t len;
    ct_tokenizer_token_bytes(t, id, &len);
  }

  // a conversation with a special token in its text, rendered with the generation prompt
  ct_chat_opts o = {.add_generation_prompt = true};
  json_t *msgs = json_loads("[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
                            "\"Hi <|im_end|>\"}, {\"role\": \"assistant\", \"content\": \"Hello!\"}]",
                            0, NULL);
  char *text = NULL;
  size_t len = 0;
  ct_span *gen = NULL;
  int ngen = 0;
  fuzz_clear_error();
  int rc = ct_tokenizer_chat_render(t, msgs, &o, &text, &len, &gen, &ngen);
  fuzz_check_error(rc, "ct_tokenizer_chat_render");
  if (!rc) {
    ct_ids ids = {0}, mask = {0};
    if (ct_tokenizer_encode_masked(t, text, len, gen, ngen, &ids, &mask) || ids.n != mask.n) abort();
    check_ids(t, &ids);
    ct_ids_free(&ids);
    ct_ids_free(&mask);
  }
  free(text);
  free(gen);
  json_decref(msgs);
}

// Writes part `name` of the input, or removes the file when the input has no such part.
static void put_part(const char *name, const uint8_t *p, size_t n, bool present) {
  const char *path = fuzz_write(name, p, n);
  if (!present) unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *end = data + size, *a = data;
  const uint8_t *b = memchr(a, 0, size), *c = b ? memchr(b + 1, 0, (size_t)(end - b - 1)) : NULL;
  put_part("tokenizer.json", a, (size_t)((b ? b : end) - a), true);
  put_part("tokenizer_config.json", b ? b + 1 : a, b ? (size_t)((c ? c : end) - b - 1) : 0, b != NULL);
  put_part("generation_config.json", c ? c + 1 : a, c ? (size_t)(end - c - 1) : 0, c != NULL);
  ct_tokenizer *t = NULL;
  fuzz_clear_error();
  int rc = ct_tokenizer_load(&t, fuzz_dir());
  fuzz_check_error(rc, "ct_tokenizer_load");
  if (!rc) exercise(t);
  ct_tokenizer_free(t);
  return 0;
}
