// Tokenizer, regex, NFC and chat-template unit tests that need no network: the byte
// tokenizer, a small byte-level BPE built here, malformed files, and brief fuzzing of the
// JSON loader and the template parser. Agreement with Hugging Face's own files and the
// reference implementations is tests/tokenizer_ref.sh.
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "jinja.h"
#include "scratch.h"
#include "test.h"
#include "tokenizer.h"
#include "tokenizer_regex.h"
#include "unicode.h"


static void write_text(const char *dir, const char *name, const char *text) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

// ids as "1 2 3" into buf (cap bytes, cut short when full).
static void format_ids(const ct_ids *ids, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = 0;
  for (int i = 0; i < ids->n && n < cap - 16; i++)
    n += (size_t)snprintf(buf + n, cap - n, i ? " %d" : "%d", ids->v[i]);
}

static char *encode_str(const ct_tokenizer *t, const char *s, bool special) {
  ct_ids ids = {0};
  static char buf[4096];
  buf[0] = 0;
  if (ct_tokenizer_encode(t, s, strlen(s), special, &ids)) return strcpy(buf, "ERROR");
  format_ids(&ids, buf, sizeof buf);
  ct_ids_free(&ids);
  return buf;
}

static bool roundtrips(const ct_tokenizer *t, const char *s) {
  ct_ids ids = {0};
  char *out = NULL;
  size_t len = 0;
  bool ok = !ct_tokenizer_encode(t, s, strlen(s), true, &ids) && !ct_tokenizer_decode(t, ids.v, ids.n, &out, &len) &&
            len == strlen(s) && !memcmp(out, s, len);
  free(out);
  ct_ids_free(&ids);
  return ok;
}

// ---------------------------------------------------------------------------
// A small byte-level BPE: the byte tokenizer's 256 byte tokens, a few merges, added
// tokens with every flag, Qwen's Split pattern, NFC.

static const char *merges_json =
    "[\"Ġ t\", \"h e\", \"Ġt he\", \"l l\", \"e ll\", \"h ell\", \"Ġ w\", \"o r\", \"Ġw or\", "
    "\"Ġwor l\", \"Ġworl d\", \"c a\", \"ca f\", \"caf Ã\", \"cafÃ ©\"]";
static const char *merges_pairs_json =
    "[[\"Ġ\", \"t\"], [\"h\", \"e\"], [\"Ġt\", \"he\"], [\"l\", \"l\"], [\"e\", \"ll\"], [\"h\", \"ell\"], "
    "[\"Ġ\", \"w\"], [\"o\", \"r\"], [\"Ġw\", \"or\"], [\"Ġwor\", \"l\"], [\"Ġworl\", \"d\"], [\"c\", \"a\"], "
    "[\"ca\", \"f\"], [\"caf\", \"Ã\"], [\"cafÃ\", \"©\"]]";

// Builds DIR/tokenizer.json from the byte tokenizer's vocabulary plus the pieces above.
static int make_tiny(const char *dir, const char *merges, bool ignore_merges, const char *extra_cfg) {
  ct_tokenizer *b;
  if (ct_tokenizer_bytes(&b) || ct_tokenizer_save(b, dir)) return -1;
  ct_tokenizer_free(b);
  char path[1024];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  json_error_t err;
  json_t *j = json_load_file(path, 0, &err);
  if (!j) return -1;
  json_t *model = json_object_get(j, "model"), *vocab = json_object_get(model, "vocab");
  const char *newtok[] = {"Ġt", "he", "Ġthe", "ll", "ell", "hell", "Ġw", "or", "Ġwor", "Ġworl", "Ġworld", "ca",
                          "caf", "cafÃ", "cafÃ©"};
  int id = 300;
  for (size_t i = 0; i < sizeof newtok / sizeof newtok[0]; i++) json_object_set_new(vocab, newtok[i], json_integer(id++));
  json_object_set_new(model, "merges", json_loads(merges, 0, &err));
  json_object_set_new(model, "ignore_merges", json_boolean(ignore_merges));
  json_t *added = json_object_get(j, "added_tokens");
  json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 400, "content", "<think>", "single_word", 0,
                                         "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 0));
  json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 401, "content", "<L>", "single_word", 0,
                                         "lstrip", 1, "rstrip", 0, "normalized", 0, "special", 1));
  json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 402, "content", "<R>", "single_word", 0,
                                         "lstrip", 0, "rstrip", 1, "normalized", 0, "special", 1));
  json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 403, "content", "WORD", "single_word", 1,
                                         "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 0));
  json_object_set_new(j, "normalizer", json_pack("{s:s}", "type", "NFC"));
  json_object_set_new(
      j, "pre_tokenizer",
      json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b,s:b}]}", "type", "Sequence", "pretokenizers", "type", "Split",
                "pattern", "Regex",
                "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
                "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
                "use_regex", 0));
  int rc = json_dump_file(j, path, JSON_INDENT(1));
  json_decref(j);
  if (extra_cfg) write_text(dir, "tokenizer_config.json", extra_cfg);
  return rc;
}

static ct_tokenizer *load_tiny(const char *sub, const char *merges, bool ignore_merges, const char *cfg) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/%s", scratch_dir, sub);
  mkdir(dir, 0700);
  ct_tokenizer *t = NULL;
  if (make_tiny(dir, merges, ignore_merges, cfg) || ct_tokenizer_load(&t, dir)) {
    fprintf(stderr, "load_tiny: %s\n", ct_last_error());
    return NULL;
  }
  return t;
}

// ---------------------------------------------------------------------------

static void test_byte_tokenizer_maps_bytes_and_special_tokens() {
  ct_tokenizer *t;
  CHECK_OK(ct_tokenizer_bytes(&t));
  CHECK(ct_tokenizer_vocab_size(t) == 260);
  CHECK(ct_tokenizer_bos(t) == 256 && ct_tokenizer_eos(t) == 256 && ct_tokenizer_pad(t) == 259);
  CHECK(!ct_tokenizer_add_bos(t));
  CHECK(ct_tokenizer_token_id(t, "<|im_start|>") == 257 && ct_tokenizer_token_id(t, "<|im_end|>") == 258);
  CHECK(!strcmp(encode_str(t, "hi<|im_end|>", true), "104 105 258"));
  CHECK(!strcmp(encode_str(t, "<|pad|>", false), "60 124 112 97 100 124 62"));
  CHECK(!strcmp(encode_str(t, "é", true), "195 169"));
  CHECK(roundtrips(t, "any bytes \xff\xfe and <|endoftext|> text"));
  const int *stops;
  int n = ct_tokenizer_stop_ids(t, &stops);
  CHECK(n == 2 && stops[0] == 256 && stops[1] == 258);
  char *s = NULL;
  json_error_t err;
  json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, &err);
  CHECK_OK(ct_tokenizer_chat(t, msgs, true, &s));
  CHECK(s && !strcmp(s, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"));
  free(s);
  json_decref(msgs);
  ct_tokenizer_free(t);
}

static void test_byte_tokenizer_saved_files_load_back_as_the_same_mapping() {
  ct_tokenizer *t, *u;
  char dir[512];
  snprintf(dir, sizeof dir, "%s/bytes", scratch_dir);
  mkdir(dir, 0700);
  CHECK_OK(ct_tokenizer_bytes(&t));
  CHECK_OK(ct_tokenizer_save(t, dir));
  CHECK_OK(ct_tokenizer_load(&u, dir));
  if (!u) return;
  CHECK(ct_tokenizer_vocab_size(u) == 260 && ct_tokenizer_eos(u) == 256 && ct_tokenizer_pad(u) == 259);
  const char *texts[] = {"Hello, world! <|im_start|>user\n", "\x01\x7f\x80\xff", "日本語 😀 <|pad|>"};
  for (int i = 0; i < 3; i++) {
    char a[4096];
    strcpy(a, encode_str(t, texts[i], true));
    CHECK(!strcmp(a, encode_str(u, texts[i], true)));
  }
  for (int b = 0; b < 256; b++) {
    size_t len;
    const char *p = ct_tokenizer_token_bytes(u, b, &len);
    CHECK(p && len == 1 && (unsigned char)p[0] == b);
  }
  // saving a loaded tokenizer writes its files back unchanged
  char dir2[512];
  snprintf(dir2, sizeof dir2, "%s/bytes2", scratch_dir);
  mkdir(dir2, 0700);
  CHECK_OK(ct_tokenizer_save(u, dir2));
  ct_tokenizer *w;
  CHECK_OK(ct_tokenizer_load(&w, dir2));
  if (w) CHECK(!strcmp(encode_str(w, "abc<|endoftext|>", true), "97 98 99 256"));
  ct_tokenizer_free(w);
  ct_tokenizer_free(t);
  ct_tokenizer_free(u);
}

// A write that fails (here a full device: tokenizer.json is a link to /dev/full, whose
// writes fail with ENOSPC) says why, with errno's text, not only "write failed".
static void test_a_failed_save_says_why() {
  ct_tokenizer *t;
  char dir[512], link[600];
  snprintf(dir, sizeof dir, "%s/full", scratch_dir);
  snprintf(link, sizeof link, "%s/tokenizer.json", dir);
  mkdir(dir, 0700);
  CHECK(symlink("/dev/full", link) == 0);
  CHECK_OK(ct_tokenizer_bytes(&t));
  CHECK(ct_tokenizer_save(t, dir) == CT_EIO);
  CHECK(strstr(ct_last_error(), "tokenizer.json: write failed: No space left on device") != NULL);
  // what a save writes, for the free-space check before it
  CHECK(ct_tokenizer_saved_bytes(t) > 1000);
  ct_tokenizer_free(t);
}

static void test_bpe_merges_by_rank_with_string_and_pair_merges_alike() {
  ct_tokenizer *a = load_tiny("tiny_str", merges_json, false, NULL);
  ct_tokenizer *b = load_tiny("tiny_pair", merges_pairs_json, false, NULL);
  CHECK(a && b);
  if (!a || !b) return;
  // "the" -> t he (no Ġ); " hello" -> Ġ he ll o ("h ell" needs "ell", which "h e" took); " world" -> Ġworld
  CHECK(!strcmp(encode_str(a, "the hello world", true), "116 301 32 301 303 111 310"));
  const char *texts[] = {"the hello world", "Hello WORLD, the the  the\n\n", "café CAFÉ", "x'S y'll", "123 4567"};
  for (int i = 0; i < 5; i++) {
    char x[4096];
    strcpy(x, encode_str(a, texts[i], true));
    CHECK(!strcmp(x, encode_str(b, texts[i], true)));
    CHECK(roundtrips(a, texts[i]));
  }
  // digits are single pieces (\p{N}), contractions split case-insensitively
  CHECK(!strcmp(encode_str(a, "12", true), "49 50"));
  CHECK(!strcmp(encode_str(a, "I'M", true), "73 39 77"));
  ct_tokenizer_free(a);
  ct_tokenizer_free(b);
}

static void test_ignore_merges_takes_whole_words_from_the_vocabulary() {
  // "cafÃ©" is in the vocabulary; merges alone would reach it too, so remove the last
  // merge: only ignore_merges can produce it.
  const char *short_merges = "[\"c a\", \"ca f\"]";
  ct_tokenizer *with = load_tiny("tiny_ign", short_merges, true, NULL);
  ct_tokenizer *without = load_tiny("tiny_noign", short_merges, false, NULL);
  CHECK(with && without);
  if (!with || !without) return;
  CHECK(!strcmp(encode_str(with, "café", true), "314"));
  CHECK(!strcmp(encode_str(without, "café", true), "312 195 169"));
  ct_tokenizer_free(with);
  ct_tokenizer_free(without);
}

static void test_added_tokens_follow_special_lstrip_rstrip_and_single_word() {
  ct_tokenizer *t = load_tiny("tiny_added", merges_json, false, NULL);
  CHECK(t != NULL);
  if (!t) return;
  // non-special <think> matches with and without `special`
  CHECK(!strcmp(encode_str(t, "<think>", false), "400"));
  CHECK(!strcmp(encode_str(t, "<think>", true), "400"));
  // <L> eats the spaces before it, <R> the spaces after it; special ones only with `special`
  CHECK(!strcmp(encode_str(t, "a  <L>b", true), "97 401 98"));
  CHECK(!strcmp(encode_str(t, "a<R>  b", true), "97 402 98"));
  CHECK(strcmp(encode_str(t, "a<R>b", false), "97 402 98") != 0);
  // WORD is single_word: not inside a longer word
  CHECK(!strcmp(encode_str(t, "a WORD b", true), "97 32 403 32 98"));
  CHECK(strstr(encode_str(t, "aWORDb", true), "403") == NULL);
  CHECK(ct_tokenizer_is_special(t, 401) && !ct_tokenizer_is_special(t, 400));
  ct_tokenizer_free(t);
}

// A model with fewer rows than the tokenizer has ids (Gemma 3's <image_soft_token> at
// 262144 in a 262,144-row model): added tokens past it are dropped and read as text;
// a model.vocab id past it is an error.
static void test_fit_drops_added_tokens_past_the_model_and_refuses_vocabulary_ones() {
  ct_tokenizer *t = load_tiny("tiny_fit", merges_json, false, NULL);
  CHECK(t != NULL);
  if (!t) return;
  int dropped = -1;
  CHECK_OK(ct_tokenizer_fit(t, 500, &dropped));
  CHECK(dropped == 0 && ct_tokenizer_vocab_size(t) == 404);
  CHECK_OK(ct_tokenizer_fit(t, 402, &dropped));
  CHECK(dropped == 2 && ct_tokenizer_vocab_size(t) == 402);
  CHECK(!strcmp(encode_str(t, "<think>", false), "400"));  // still an added token
  CHECK(!strcmp(encode_str(t, "a<R>", true), "97 60 82 62"));  // now plain text
  CHECK(ct_tokenizer_token_bytes(t, 402, &(size_t){0}) == NULL);
  CHECK(ct_tokenizer_fit(t, 310, &dropped) == CT_EINVAL);  // 310..314 are merges' tokens
  CHECK(strstr(ct_last_error(), "id 310") && strstr(ct_last_error(), "vocab_size 310"));
  ct_tokenizer_free(t);
}

static void test_nfc_normalizer_composes_and_offsets_point_into_the_original_text() {
  ct_tokenizer *t = load_tiny("tiny_nfc", merges_json, false, NULL);
  CHECK(t != NULL);
  if (!t) return;
  // "cafe\u0301" normalizes to "café" -> the merged token 314
  CHECK(!strcmp(encode_str(t, "cafe\xcc\x81", true), "314"));
  const char *text = "the cafe\xcc\x81 <think>x";
  ct_ids ids = {0}, offs = {0};
  CHECK_OK(ct_tokenizer_encode_offsets(t, text, strlen(text), true, &ids, &offs));
  CHECK(ids.n == offs.n);
  // t he Ġ café Ġ <think> x: the space before <think> is byte 10 of the original text
  // ("the cafe" + a 2-byte accent) but byte 9 of the normalized one; <think> is at 11
  bool found_think = false;
  for (int i = 0; i < ids.n; i++) {
    CHECK(offs.v[i] >= 0 && offs.v[i] <= (int)strlen(text));
    if (i) CHECK(offs.v[i] >= offs.v[i - 1]);
    if (ids.v[i] == 400) found_think = offs.v[i] == 11 && i > 0 && ids.v[i - 1] == 32 && offs.v[i - 1] == 10;
  }
  CHECK(found_think);
  ct_ids_free(&ids);
  ct_ids_free(&offs);
  // the unicode module itself
  char *out = NULL;
  size_t len = 0, cap = 0;
  const char *decomposed = "A\xcc\x8a \xe1\x84\x80\xe1\x85\xa1";
  CHECK_OK(ct_uc_nfc(decomposed, strlen(decomposed), &out, &len, &cap, NULL));
  CHECK(len == 6 && !memcmp(out, "\xc3\x85 \xea\xb0\x80", 6));  // Å, 가
  free(out);
  CHECK(ct_uc_nfc_quick("plain ascii and é", 18));
  CHECK(!ct_uc_nfc_quick("e\xcc\x81", 3));
  ct_tokenizer_free(t);
}

// Offsets bisect the NFC change map: with many changed stretches every token still points
// at its own bytes of the original text.
static void test_nfc_offsets_stay_exact_across_many_changed_stretches() {
  ct_tokenizer *t = load_tiny("tiny_nfc_many", merges_json, false, NULL);
  CHECK(t != NULL);
  if (!t) return;
  enum { REPS = 300, UNIT = 7 };  // "cafe" + U+0301 (2 bytes) + " ": 6 bytes once composed
  char text[REPS * UNIT + 1];
  for (int r = 0; r < REPS; r++) memcpy(text + r * UNIT, "cafe\xcc\x81 ", UNIT);
  text[REPS * UNIT] = 0;
  ct_ids ids = {0}, offs = {0};
  CHECK_OK(ct_tokenizer_encode_offsets(t, text, strlen(text), true, &ids, &offs));
  CHECK(ids.n == offs.n);
  int cafes = 0, bad = 0;
  for (int i = 0; i < ids.n; i++) {
    if (ids.v[i] == 314) bad += offs.v[i] != UNIT * cafes++;     // café at the start of its unit
    else if (ids.v[i] == 32) bad += offs.v[i] % UNIT != UNIT - 1;  // the space ends its unit
    else bad++;
  }
  CHECK(cafes == REPS && bad == 0);
  ct_ids_free(&ids);
  ct_ids_free(&offs);
  ct_tokenizer_free(t);
}

// ct_utf8_prev steps back over one whole code point, or one byte that is not part of one.
static void test_utf8_prev_steps_back_one_code_point_or_one_stray_byte(void) {
  const char s[] = "a\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x98\x80";  // a é 你 😀
  CHECK(ct_utf8_prev(s, 0, 10) == 6 && ct_utf8_prev(s, 0, 6) == 3 && ct_utf8_prev(s, 0, 3) == 1);
  CHECK(ct_utf8_prev(s, 0, 1) == 0);
  CHECK(ct_utf8_prev(s, 2, 3) == 2);               // not below lo: the cut é is a stray byte
  CHECK(ct_utf8_prev("a\x80", 0, 2) == 1);         // a lone continuation byte
  CHECK(ct_utf8_prev("a\xC3", 0, 2) == 1);         // a truncated sequence
  CHECK(ct_utf8_prev("\xC3\xA9\x80", 0, 3) == 2);  // a continuation byte too many
  CHECK(ct_utf8_prev("\xC0\x80", 0, 2) == 1);      // an overlong form
}

// Splits s with the pattern; returns pieces joined by '|'.
static const char *split_with(const char *pat, const char *s) {
  static char out[2048];
  ct_regex *re;
  if (ct_regex_compile(&re, pat, strlen(pat))) return "COMPILE ERROR";
  ct_regex_text rt = {0};
  ct_regex_text_set(&rt, s, strlen(s));
  size_t w = 0, at = 0, gap = 0;
  out[0] = 0;
  while (at < rt.n) {
    long m = ct_regex_match(re, &rt, at, rt.n);
    if (m <= (long)at) {
      at++;
      continue;
    }
    if (gap < at) w += (size_t)snprintf(out + w, sizeof out - w, "%s[%.*s]", w ? "|" : "", (int)(rt.off[at] - rt.off[gap]), s + rt.off[gap]);
    w += (size_t)snprintf(out + w, sizeof out - w, "%s%.*s", w ? "|" : "", (int)(rt.off[m] - rt.off[at]), s + rt.off[at]);
    at = gap = (size_t)m;
  }
  if (gap < rt.n) snprintf(out + w, sizeof out - w, "%s[%.*s]", w ? "|" : "", (int)(rt.off[rt.n] - rt.off[gap]), s + rt.off[gap]);
  ct_regex_text_free(&rt);
  ct_regex_free(re);
  return out;
}

static void test_regex_engine_matches_pretokenizer_patterns() {
  const char *gpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
  CHECK(!strcmp(split_with(gpt2, "Hello world's  end!!  "), "Hello| world|'s| | end|!!|  "));
  const char *llama = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  CHECK(!strcmp(split_with(llama, "I'LL pay 12345 €\n\nok"), "I|'LL| pay| |123|45| €\n\n|ok"));
  // (?i:) folds like Oniguruma: long s matches 's
  CHECK(!strcmp(split_with("(?i:'s)", "'\xc5\xbf"), "'\xc5\xbf"));
  CHECK(!strcmp(split_with("a+?b", "aaab"), "aaab"));
  CHECK(!strcmp(split_with("[a-b]{2}", "abcabc"), "ab|[c]|ab|[c]"));
  CHECK(!strcmp(split_with("x(?=y)", "xyxz"), "x|[yxz]"));
  CHECK(!strcmp(split_with("\\d+|\\s", "a 42"), "[a]| |42"));
  ct_regex *re;
  const char *bad[] = {"(abc", "[a-", "a{3,1}", "\\p{Greek}", "(?<name>x)", "*a", "a**", "\\b", "(a*)*"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = ct_regex_compile(&re, bad[i], strlen(bad[i]));
    CHECK(rc == CT_EFORMAT && strstr(ct_last_error(), "position"));
    if (!rc) ct_regex_free(re);
  }
}

static void test_chat_generation_spans_mask_exactly_the_assistant_tokens() {
  ct_tokenizer *t;
  CHECK_OK(ct_tokenizer_bytes(&t));
  const char *tpl =
      "{%- for m in messages %}\n"
      "{{- '<|im_start|>' + m.role + '\\n' }}\n"
      "{%- if m.role == 'assistant' %}\n"
      "{%- generation %}{{ m.content }}<|im_end|>{% endgeneration %}\n"
      "{%- else %}{{ m.content }}<|im_end|>{% endif %}\n"
      "{{- '\\n' }}\n"
      "{%- endfor %}";
  CHECK_OK(ct_tokenizer_set_chat_template(t, tpl, strlen(tpl), "test template"));
  CHECK(ct_tokenizer_chat_has_generation(t));
  // the replaced template travels with a saved checkpoint
  char dir[512];
  snprintf(dir, sizeof dir, "%s/gen_tpl", scratch_dir);
  mkdir(dir, 0700);
  ct_tokenizer *u = NULL;
  CHECK_OK(ct_tokenizer_save(t, dir));
  CHECK_OK(ct_tokenizer_load(&u, dir));
  CHECK(u && ct_tokenizer_chat_has_generation(u));
  ct_tokenizer_free(u);
  json_error_t err;
  json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Yo\"},"
                            "{\"role\":\"user\",\"content\":\"Q\"},{\"role\":\"assistant\",\"content\":\"A!\"}]",
                            0, &err);
  char *s = NULL;
  size_t len = 0;
  ct_span *gen = NULL;
  int ngen = 0;
  ct_chat_opts o = {0};
  CHECK_OK(ct_tokenizer_chat_render(t, msgs, &o, &s, &len, &gen, &ngen));
  CHECK(s && !strcmp(s, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n"
                        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA!<|im_end|>\n"));
  CHECK(ngen == 2);
  if (s && ngen == 2) {
    CHECK(!strncmp(s + gen[0].start, "Yo<|im_end|>", gen[0].end - gen[0].start) && gen[0].end - gen[0].start == 12);
    CHECK(!strncmp(s + gen[1].start, "A!<|im_end|>", gen[1].end - gen[1].start));
    ct_ids ids = {0}, mask = {0};
    CHECK_OK(ct_tokenizer_encode_masked(t, s, len, gen, ngen, &ids, &mask));
    CHECK(ids.n == mask.n);
    // masked tokens are exactly Y o <|im_end|> A ! <|im_end|>
    int want[] = {'Y', 'o', 258, 'A', '!', 258}, k = 0;
    bool ok = true;
    for (int i = 0; i < ids.n; i++)
      if (mask.v[i]) ok = ok && k < 6 && ids.v[i] == want[k++];
    CHECK(ok && k == 6);
    ct_ids_free(&ids);
    ct_ids_free(&mask);
  }
  free(s);
  free(gen);
  json_decref(msgs);
  ct_tokenizer_free(t);
}

static void test_config_sets_special_tokens_add_bos_and_stop_ids() {
  const char *cfg =
      "{\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<|endoftext|>\"}, \"eos_token\": \"<|im_end|>\","
      " \"pad_token\": null, \"add_bos_token\": true, \"model_max_length\": 1000000000000000019884624838656,"
      " \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\", \"template\": \"D{{ bos_token }}\"}]}";
  ct_tokenizer *t = load_tiny("tiny_cfg", merges_json, false, cfg);
  CHECK(t != NULL);
  if (!t) return;
  CHECK(ct_tokenizer_bos(t) == 256 && ct_tokenizer_eos(t) == 258 && ct_tokenizer_pad(t) == 258);
  CHECK(ct_tokenizer_add_bos(t));
  CHECK(ct_tokenizer_is_stop(t, 258) && ct_tokenizer_is_stop(t, 256) && !ct_tokenizer_is_stop(t, 257));
  json_t *msgs = json_array();
  char *s = NULL;
  CHECK_OK(ct_tokenizer_chat(t, msgs, false, &s));
  CHECK(s && !strcmp(s, "D<|endoftext|>"));
  free(s);
  json_decref(msgs);
  ct_tokenizer_free(t);
}

static void test_template_errors_name_the_file_line_and_column() {
  struct {
    const char *src, *want;
  } cases[] = {
      {"ok\n{% if x %}\nno end", "t.jinja:2:4: unclosed 'if'"},
      {"{{ x | wordwrap }}", "t.jinja:1:6: unsupported filter 'wordwrap'"},
      {"a\n  {% while x %}{% endwhile %}", "t.jinja:2:6: unsupported statement 'while'"},
      {"{{ 'abc }}", "t.jinja:1:4: unterminated string literal"},
      {"{{ raise_exception('bad conversation') }}", "t.jinja:1:4: raise_exception: bad conversation"},
      {"{{ x.y.z() }}", "t.jinja:1:4: cannot call an undefined value"},
      {"{{ 1 + }}", "t.jinja:1:8: unexpected '}}'"},
      {"{# never closed", "t.jinja:1:1: missing end of comment"},
      {"{{ [1, 2] | tojson(indent=2) | foo }}", "t.jinja:1:30: unsupported filter 'foo'"},
      {"{% for a, b in [1] %}{% endfor %}", "t.jinja:1:8: cannot unpack"},
      {"{{ \"\\q\" }}", "t.jinja:1:6: unexpected escaped character 'q'"},
      {"{{ messages[0].content * 2 }}", "t.jinja:1:24: unsupported operator '*' between a string and an integer"},
  };
  json_error_t err;
  json_t *vars = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", 0, &err);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ct_jinja *tpl = NULL;
    int rc = ct_jinja_parse(&tpl, cases[i].src, strlen(cases[i].src), "t.jinja");
    if (!rc) {
      char *out = NULL;
      size_t len;
      rc = ct_jinja_render(tpl, vars, &out, &len, NULL, NULL);
      free(out);
      ct_jinja_free(tpl);
    }
    CHECK(rc == CT_EFORMAT);
    if (!strstr(ct_last_error(), cases[i].want)) {
      fprintf(stderr, "  case %zu: '%s' lacks '%s'\n", i, ct_last_error(), cases[i].want);
      CHECK(0);
    }
  }
  json_decref(vars);
}

// Only a failed allocation is CT_ENOMEM: an error that merely says "out of memory" (in
// the template's name, or in raise_exception's message) stays a template error.
static void test_template_errors_that_say_out_of_memory_stay_format_errors() {
  ct_jinja *tpl = NULL;
  const char *bad = "{{ 1 + }}";
  CHECK(ct_jinja_parse(&tpl, bad, strlen(bad), "out of memory.jinja") == CT_EFORMAT);
  CHECK(tpl == NULL && strstr(ct_last_error(), "out of memory.jinja:1:8:"));
  const char *src = "{{ raise_exception('out of memory') }}";
  CHECK_OK(ct_jinja_parse(&tpl, src, strlen(src), "t.jinja"));
  if (!tpl) return;
  json_t *vars = json_object();
  char *out = NULL;
  size_t len;
  CHECK(ct_jinja_render(tpl, vars, &out, &len, NULL, NULL) == CT_EFORMAT);
  CHECK(out == NULL && strstr(ct_last_error(), "raise_exception: out of memory"));
  json_decref(vars);
  ct_jinja_free(tpl);
}

// ---------------------------------------------------------------------------
// A small SentencePiece-style BPE: characters with ▁ for spaces, <0xNN> byte tokens.
// ids: <unk> 0, <s> 1, </s> 2, <0x00>..<0xFF> 3..258, then the words below from 259.

static const char *const sp_words[] = {"▁", "a", "b", "▁a", "ab", "▁ab", "é", "b▁"};
enum { SP_SPACE = 259, SP_A, SP_B, SP_SA, SP_AB, SP_SAB, SP_E, SP_BS };
#define SP_BYTE(b) (3 + (b))

// DIR/tokenizer.json: Llama 2's legacy form (Prepend + Replace normalizers) unless
// `pretok` (a Metaspace pre-tokenizer's JSON) replaces the normalizer; `decoder` (JSON)
// replaces Llama 2's Replace/ByteFallback/Fuse/Strip.
static ct_tokenizer *load_sp_dec(const char *sub, const char *pretok, bool byte_fallback, bool fuse_unk,
                                 const char *decoder) {
  json_error_t err;
  json_t *vocab = json_pack("{s:i,s:i,s:i}", "<unk>", 0, "<s>", 1, "</s>", 2);
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    json_object_set_new(vocab, name, json_integer(SP_BYTE(b)));
  }
  for (int i = 0; i < (int)(sizeof sp_words / sizeof sp_words[0]); i++)
    json_object_set_new(vocab, sp_words[i], json_integer(SP_SPACE + i));
  json_t *added = json_array();
  const char *specials[] = {"<unk>", "<s>", "</s>"};
  for (int i = 0; i < 3; i++)
    json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", i, "content", specials[i],
                                           "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
  json_t *j = json_pack(
      "{s:{s:s,s:o,s:[s,s,s,s],s:s,s:b,s:b},s:o}", "model", "type", "BPE", "vocab", vocab, "merges", "▁ a", "a b",
      "▁a b", "b ▁", "unk_token", "<unk>", "byte_fallback", byte_fallback, "fuse_unk", fuse_unk, "added_tokens", added);
  json_object_set_new(j, "normalizer",
                      pretok ? json_null()
                             : json_loads("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": "
                                          "\"▁\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"▁\"}]}",
                                          0, &err));
  json_object_set_new(j, "pre_tokenizer", pretok ? json_loads(pretok, 0, &err) : json_null());
  json_object_set_new(j, "decoder",
                      json_loads(decoder ? decoder
                                         : "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": "
                                           "{\"String\": \"▁\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": "
                                           "\"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}",
                                 0, &err));
  char dir[512], path[600];
  snprintf(dir, sizeof dir, "%s/%s", scratch_dir, sub);
  mkdir(dir, 0700);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  ct_tokenizer *t = NULL;
  if (json_dump_file(j, path, 0) || ct_tokenizer_load(&t, dir)) fprintf(stderr, "load_sp: %s\n", ct_last_error());
  json_decref(j);
  return t;
}

// Compares strings, showing both when they differ (got is copied first: IDS reuses a buffer).
#define CHECK_STR(got, want)                                                             \
  do {                                                                                   \
    char g_[512];                                                                        \
    snprintf(g_, sizeof g_, "%s", (got));                                                \
    const char *w_ = (want);                                                             \
    if (strcmp(g_, w_)) fprintf(stderr, "  line %d: got '%s', want '%s'\n", __LINE__, g_, w_); \
    CHECK(!strcmp(g_, w_));                                                              \
  } while (0)

static ct_tokenizer *load_sp(const char *sub, const char *pretok, bool byte_fallback, bool fuse_unk) {
  return load_sp_dec(sub, pretok, byte_fallback, fuse_unk, NULL);
}

static char *ids_str(int n, const int *v) {
  static char buf[512];
  ct_ids ids = {(int *)v, n, n};
  format_ids(&ids, buf, sizeof buf);
  return buf;
}
#define IDS(...) ids_str((int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), (int[]){__VA_ARGS__})

static void test_sentencepiece_bpe_merges_characters_and_falls_back_to_bytes() {
  ct_tokenizer *t = load_sp("sp", NULL, true, true);
  CHECK(t != NULL);
  if (!t) return;
  CHECK_STR(encode_str(t, "ab", false), IDS(SP_SAB));  // ▁ a b -> ▁a b -> ▁ab, by rank
  CHECK_STR(encode_str(t, "a é", false), IDS(SP_SA, SP_SPACE, SP_E));
  // ü (C3 BC) is not in the vocabulary: its UTF-8 bytes
  CHECK_STR(encode_str(t, "ü", false), IDS(SP_SPACE, SP_BYTE(0xC3), SP_BYTE(0xBC)));
  // legacy: every section after a special token gets its own ▁
  CHECK_STR(encode_str(t, "<s>a", true), IDS(1, SP_SA));
  CHECK_STR(encode_str(t, "b b", false), IDS(SP_SPACE, SP_BS, SP_B));  // merges cross ▁ without a split
  // decode: ▁ reads as a space, byte tokens as bytes, the leading space cut (Strip)
  int ids[] = {SP_SPACE, SP_BYTE(0xC3), SP_BYTE(0xBC), SP_SA};
  char *out = NULL;
  size_t len = 0;
  CHECK_OK(ct_tokenizer_decode(t, ids, 4, &out, &len));
  CHECK_STR(out, "ü a");
  free(out);
  size_t n;
  const char *b = ct_tokenizer_token_bytes(t, SP_BYTE(0x41), &n);
  CHECK(n == 1 && b[0] == 'A');
  CHECK(ct_tokenizer_token_id(t, "▁ab") == SP_SAB);
  // offsets point into the original text: "a ü" -> ▁a (0), ▁ (the space, 1), ü's bytes (2, 3)
  ct_ids got = {0}, offs = {0};
  CHECK_OK(ct_tokenizer_encode_offsets(t, "a ü", strlen("a ü"), false, &got, &offs));
  CHECK_STR(ids_str(got.n, got.v), IDS(SP_SA, SP_SPACE, SP_BYTE(0xC3), SP_BYTE(0xBC)));
  CHECK_STR(ids_str(offs.n, offs.v), "0 1 2 3");
  ct_ids_free(&got);
  ct_ids_free(&offs);
  ct_tokenizer_free(t);

  // without byte fallback a missing character is unk; fuse_unk makes a run one unk
  t = load_sp("sp_unk", NULL, false, true);
  CHECK(t && !strcmp(encode_str(t, "üüa", false), IDS(SP_SPACE, 0, SP_A)));
  ct_tokenizer_free(t);
  t = load_sp("sp_unk2", NULL, false, false);
  CHECK(t && !strcmp(encode_str(t, "üüa", false), IDS(SP_SPACE, 0, 0, SP_A)));
  ct_tokenizer_free(t);
}

static void test_metaspace_prepends_per_scheme_and_splits_before_each_space() {
  ct_tokenizer *t = load_sp("ms_first", "{\"type\": \"Metaspace\", \"replacement\": \"▁\", \"prepend_scheme\": \"first\", \"split\": false}", true, true);
  CHECK(t != NULL);
  if (!t) return;
  CHECK_STR(encode_str(t, "a", false), IDS(SP_SA));
  CHECK_STR(encode_str(t, "<s>a", true), IDS(1, SP_A));  // not at the start of the input: no ▁
  CHECK_STR(encode_str(t, "b b", false), IDS(SP_SPACE, SP_BS, SP_B));
  ct_tokenizer_free(t);
  t = load_sp("ms_always", "{\"type\": \"Metaspace\", \"replacement\": \"▁\", \"prepend_scheme\": \"always\", \"split\": true}", true, true);
  CHECK(t != NULL);
  if (!t) return;
  CHECK_STR(encode_str(t, "<s>a", true), IDS(1, SP_SA));
  CHECK_STR(encode_str(t, "b b", false), IDS(SP_SPACE, SP_B, SP_SPACE, SP_B));  // split: "▁b" "▁b", no b▁
  CHECK_STR(encode_str(t, " a", false), IDS(SP_SA));  // already starts with ▁: none added
  ct_tokenizer_free(t);
  // the Metaspace decoder reads ▁ as a space and cuts the first one unless the scheme is never
  const char *schemes[] = {"always", "never"}, *want[] = {"a b", " a b"};
  for (int k = 0; k < 2; k++) {
    char dec[160], sub[32];
    snprintf(dec, sizeof dec, "{\"type\": \"Metaspace\", \"replacement\": \"▁\", \"prepend_scheme\": \"%s\"}", schemes[k]);
    snprintf(sub, sizeof sub, "ms_dec_%s", schemes[k]);
    ct_tokenizer *d = load_sp_dec(sub, "{\"type\": \"Metaspace\", \"prepend_scheme\": \"always\"}", true, true, dec);
    int ids[] = {SP_SA, SP_SPACE, SP_B};
    char *out = NULL;
    size_t len;
    CHECK(d && !ct_tokenizer_decode(d, ids, 3, &out, &len));
    if (out) CHECK_STR(out, want[k]);
    free(out);
    ct_tokenizer_free(d);
  }
  t = load_sp("ms_never", "{\"type\": \"Metaspace\", \"replacement\": \"▁\", \"prepend_scheme\": \"never\", \"split\": true}", true, true);
  CHECK(t && !strcmp(encode_str(t, "a", false), IDS(SP_A)));
  ct_tokenizer_free(t);
}

// ---------------------------------------------------------------------------
// Malformed files: each must fail with a message naming the file and the field.

// A tiny tokenizer (merges_json) made in dir = scratch_dir/name, path = its tokenizer.json;
// that file parsed (NULL, failing a check, when it does not parse).
static json_t *tiny_tokenizer_json(const char *name, char dir[512], char path[600]) {
  snprintf(dir, 512, "%s/%s", scratch_dir, name);
  mkdir(dir, 0700);
  CHECK_OK(make_tiny(dir, merges_json, false, NULL));
  snprintf(path, 600, "%s/tokenizer.json", dir);
  json_error_t err;
  json_t *j = json_load_file(path, 0, &err);
  CHECK(j != NULL);
  return j;
}

static void test_malformed_tokenizer_files_fail_with_clear_errors() {
  char base[512], path[600];
  json_t *good = tiny_tokenizer_json("base", base, path);
  if (!good) return;
  json_error_t err;
  struct {
    const char *what, *set_path, *value, *want;
  } cases[] = {
      {"not JSON", NULL, "{\"model\": ", "tokenizer.json:1:"},
      {"model missing", "model", NULL, "model: missing"},
      {"WordPiece", "model.type", "\"WordPiece\"", "model.type: 'WordPiece' is not supported"},
      {"vocab a list", "model.vocab", "[1, 2]", "model.vocab: expected an object"},
      {"negative id", "model.vocab.a", "-4", "model.vocab['a']: id must be an integer"},
      {"merge of unknown token", "model.merges", "[\"zz qq\"]", "model.merges[0]: token 'zz' is not in the vocabulary"},
      {"merge without space", "model.merges", "[\"Ġt\"]", "model.merges[0]: expected \"left right\""},
      {"merge a number", "model.merges", "[7]", "model.merges[0]: expected a string or a pair"},
      {"dropout", "model.dropout", "0.1", "model.dropout: BPE dropout is not supported"},
      {"added id a string", "added_tokens", "[{\"id\": \"x\", \"content\": \"<a>\"}]", "added_tokens[0].id"},
      {"added content empty", "added_tokens", "[{\"id\": 5, \"content\": \"\"}]", "added_tokens[0].content"},
      {"bad regex", "pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(ab\"}, \"behavior\": \"Isolated\"}",
       "pre_tokenizer.pattern: position 0: unbalanced parenthesis"},
      {"unknown pre-tokenizer", "pre_tokenizer", "{\"type\": \"Whitespace\"}", "pre_tokenizer.type: pre-tokenizer 'Whitespace' is not supported"},
      {"split behavior", "pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Contiguous\"}",
       "pre_tokenizer.behavior: 'Contiguous' is not supported"},
      {"Unigram", "model.type", "\"Unigram\"", "model.type: 'Unigram' is not supported (only BPE models"},
      {"metaspace scheme", "pre_tokenizer", "{\"type\": \"Metaspace\", \"prepend_scheme\": \"sometimes\"}",
       "pre_tokenizer.prepend_scheme: 'sometimes' is not one of always, first, never"},
      {"replace regex", "normalizer", "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \" +\"}, \"content\": \"_\"}",
       "normalizer.pattern: a Regex pattern is not supported in Replace"},
      {"normalizer", "normalizer", "{\"type\": \"Lowercase\"}", "normalizer.type: normalizer 'Lowercase' is not supported"},
      {"decoder", "decoder", "{\"type\": \"WordPiece\"}", "decoder.type: decoder 'WordPiece' is not supported"},
      {"suffix", "model.end_of_word_suffix", "\"</w>\"", "model.end_of_word_suffix: not supported"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/bad%zu", scratch_dir, i);
    mkdir(dir, 0700);
    if (!cases[i].set_path) {
      write_text(dir, "tokenizer.json", cases[i].value);
    } else {
      json_t *j = json_deep_copy(good), *obj = j;
      char key[128];
      snprintf(key, sizeof key, "%s", cases[i].set_path);
      char *dot;
      char *k = key;
      while ((dot = strchr(k, '.'))) {
        *dot = 0;
        obj = json_object_get(obj, k);
        k = dot + 1;
      }
      if (cases[i].value) json_object_set_new(obj, k, json_loads(cases[i].value, JSON_DECODE_ANY, &err));
      else json_object_del(obj, k);
      char p2[700];
      snprintf(p2, sizeof p2, "%s/tokenizer.json", dir);
      json_dump_file(j, p2, 0);
      json_decref(j);
    }
    ct_tokenizer *t = NULL;
    int rc = ct_tokenizer_load(&t, dir);
    CHECK(rc == CT_EFORMAT && t == NULL);
    if (!strstr(ct_last_error(), cases[i].want) || !strstr(ct_last_error(), "tokenizer.json")) {
      fprintf(stderr, "  %s: '%s' lacks '%s'\n", cases[i].what, ct_last_error(), cases[i].want);
      CHECK(0);
    }
    ct_tokenizer_free(t);
  }
  // tokenizer_config.json problems
  struct {
    const char *cfg, *want;
  } cfgs[] = {
      {"{\"eos_token\": \"<|nope|>\"}", "tokenizer_config.json: eos_token: '<|nope|>' is not a token"},
      {"{\"add_bos_token\": \"yes\"}", "tokenizer_config.json: add_bos_token: expected true or false"},
      {"[1, 2]", "tokenizer_config.json: expected a JSON object"},
      {"{\"bos_token\": 5}", "tokenizer_config.json: bos_token: expected a string"},
      {"{\"chat_template\": 7}", "tokenizer_config.json: chat_template: expected a string"},
      {"{\"a\": }", "tokenizer_config.json:1:"},
  };
  for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/badcfg%zu", scratch_dir, i);
    mkdir(dir, 0700);
    CHECK_OK(make_tiny(dir, merges_json, false, cfgs[i].cfg));
    ct_tokenizer *t = NULL;
    int rc = ct_tokenizer_load(&t, dir);
    CHECK(rc == CT_EFORMAT);
    if (!strstr(ct_last_error(), cfgs[i].want)) {
      fprintf(stderr, "  config %zu: '%s' lacks '%s'\n", i, ct_last_error(), cfgs[i].want);
      CHECK(0);
    }
    ct_tokenizer_free(t);
  }
  // a chat template that does not parse: the tokenizer loads (encoding works), chat fails
  char dir[600];
  snprintf(dir, sizeof dir, "%s/badtpl", scratch_dir);
  mkdir(dir, 0700);
  CHECK_OK(make_tiny(dir, merges_json, false, "{\"chat_template\": \"{% for m in messages %}\\n{{ m.content }\"}"));
  ct_tokenizer *t = NULL;
  CHECK_OK(ct_tokenizer_load(&t, dir));
  if (t) {
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"x\"}]", 0, &err);
    char *s = NULL;
    CHECK(ct_tokenizer_chat(t, msgs, false, &s) == CT_EFORMAT);
    CHECK(strstr(ct_last_error(), "tokenizer_config.json: chat_template:2:") != NULL);
    json_decref(msgs);
    ct_tokenizer_free(t);
  }
  // a missing directory
  CHECK(ct_tokenizer_load(&t, "/nonexistent/dir") == CT_EIO && strstr(ct_last_error(), "/nonexistent/dir/tokenizer.json"));
  json_decref(good);
}

// ---------------------------------------------------------------------------
// Fuzzing: mutated inputs must load or fail cleanly, never crash or leak.

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 16);
}

static size_t mutate(char *buf, size_t n, size_t cap) {
  static const char *const pieces[] = {"{", "}", "[", "]", "\"", ",", ":", "null", "-1", "1e999", "\\u0000", "{%", "%}",
                                       "{{", "}}", "(", ")", "|", "-", "\xff", "é", "\\", "'", "\n", " if ", "endfor"};
  int edits = 1 + (int)(rnd() % 4);
  for (int e = 0; e < edits; e++) {
    size_t at = n ? rnd() % n : 0;
    switch (rnd() % 4) {
      case 0:
        if (n) buf[at] = (char)rnd();
        break;
      case 1: {  // delete a run
        size_t len = 1 + rnd() % 8;
        if (at + len > n) len = n - at;
        memmove(buf + at, buf + at + len, n - at - len);
        n -= len;
        break;
      }
      case 2: {  // insert a piece
        const char *p = pieces[rnd() % (sizeof pieces / sizeof pieces[0])];
        size_t len = strlen(p);
        if (n + len < cap) {
          memmove(buf + at + len, buf + at, n - at);
          memcpy(buf + at, p, len);
          n += len;
        }
        break;
      }
      default:  // truncate
        n = at;
    }
  }
  return n;
}

static void test_fuzz_tokenizer_json_loader_never_crashes() {
  // A small tokenizer.json so that each load is cheap.
  const char *tiny =
      "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":5,\"content\":\"<s>\",\"special\":true,\"lstrip\":true}],"
      "\"normalizer\":{\"type\":\"NFC\"},\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
      "\"pattern\":{\"Regex\":\"\\\\p{L}+|\\\\s+(?!\\\\S)|\\\\s+|[^\\\\s\\\\p{L}]+\"},\"behavior\":\"Isolated\"},"
      "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":false},{\"type\":\"Digits\",\"individual_digits\":true}]},"
      "\"decoder\":{\"type\":\"ByteLevel\"},\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
      "{\"id\":\"<s>\"}},{\"Sequence\":{\"id\":\"A\"}}]},\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,"
      "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"Ġ\":3,\"Ġab\":4,\"1\":6},\"merges\":[\"a b\",[\"Ġ\",\"ab\"]]}}";
  char dir[600];
  snprintf(dir, sizeof dir, "%s/fuzz", scratch_dir);
  mkdir(dir, 0700);
  char path[700];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  size_t cap = strlen(tiny) + 512;
  char *buf = malloc(cap);
  int loaded = 0;
  for (int it = 0; it < 1500; it++) {
    size_t n = strlen(tiny);
    memcpy(buf, tiny, n);
    n = mutate(buf, n, cap);
    FILE *f = fopen(path, "wb");
    if (!f) break;
    fwrite(buf, 1, n, f);
    fclose(f);
    ct_tokenizer *t = NULL;
    ct_set_error(CT_OK, "%s", "");  // a failure must say why, not leave an old message
    if (ct_tokenizer_load(&t, dir) == 0) {
      loaded++;
      const char *texts[] = {"ab ab 12 <s> x", "", "\xff\xfe ab\n\n  "};
      for (int k = 0; k < 3; k++) {
        ct_ids ids = {0};
        if (!ct_tokenizer_encode(t, texts[k], strlen(texts[k]), true, &ids)) {
          char *s = NULL;
          size_t len;
          if (!ct_tokenizer_decode(t, ids.v, ids.n, &s, &len)) free(s);
        }
        ct_ids_free(&ids);
      }
      ct_tokenizer_free(t);
    } else {
      CHECK(ct_last_error()[0] != 0);
    }
  }
  free(buf);
  CHECK(loaded > 0);
}

static char *read_file_or(const char *path, const char *fallback) {
  FILE *f = fopen(path, "rb");
  if (!f) return strdup(fallback);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  if (fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
  s[n] = 0;
  fclose(f);
  return s;
}

static void test_fuzz_template_parser_and_renderer_never_crash() {
  const char *files[] = {"tests/fixtures/tokenizer/templates/qwen2.5.jinja", "tests/fixtures/tokenizer/templates/features.jinja",
                         "tests/fixtures/tokenizer/templates/llama3.3-generation.jinja",
                         "tests/fixtures/tokenizer/templates/smollm3-generation.jinja"};
  const char *fallback =
      "{%- set ns = namespace(n=0) %}{% for m in messages if m.role != 'x' %}{{- '<|im_start|>' + m['role'] + '\\n' }}"
      "{% generation %}{{ m.content | trim }}{% endgeneration %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"
      "{{ messages[::-1] | map(attribute='role') | join(', ') }}{% if add_generation_prompt %}x{% endif %}";
  json_error_t err;
  json_t *vars = json_loads("{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"hi\"},"
                            "{\"role\": \"assistant\", \"content\": \"yo\"}], \"add_generation_prompt\": true,"
                            "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]}",
                            0, &err);
  int parsed = 0;
  for (size_t fi = 0; fi < sizeof files / sizeof files[0]; fi++) {
    char *src = read_file_or(files[fi], fallback);
    size_t n0 = strlen(src), cap = n0 + 256;
    char *buf = malloc(cap);
    for (int it = 0; it < 700; it++) {
      memcpy(buf, src, n0);
      size_t n = mutate(buf, n0, cap);
      ct_jinja *tpl = NULL;
      if (ct_jinja_parse(&tpl, buf, n, "fuzz") == 0) {
        parsed++;
        char *out = NULL;
        size_t len;
        ct_span *gen = NULL;
        int ngen = 0;
        if (ct_jinja_render(tpl, vars, &out, &len, &gen, &ngen) == 0) {
          for (int g = 0; g < ngen; g++) CHECK(gen[g].start <= gen[g].end && gen[g].end <= len);
        }
        free(out);
        free(gen);
        ct_jinja_free(tpl);
      } else {
        CHECK(strstr(ct_last_error(), "fuzz:") != NULL);
      }
    }
    free(buf);
    free(src);
  }
  json_decref(vars);
  CHECK(parsed > 0);
}

// ---------------------------------------------------------------------------

typedef struct {
  const ct_tokenizer *t;
  const char *text;
  const char *want;   // the single-threaded encoding
  int differ;         // encodes that gave anything else
  char result[4096];  // the last encoding
} thread_arg;

static void *encode_thread(void *p) {
  thread_arg *a = p;
  a->result[0] = 0;
  a->differ = 0;
  for (int r = 0; r < 50; r++) {
    ct_ids ids = {0};
    if (ct_tokenizer_encode(a->t, a->text, strlen(a->text), true, &ids)) strcpy(a->result, "ERROR");
    else format_ids(&ids, a->result, sizeof a->result);
    a->differ += strcmp(a->result, a->want) != 0;
    ct_ids_free(&ids);
  }
  return NULL;
}

static void test_concurrent_encodes_agree_with_a_single_thread() {
  ct_tokenizer *t = load_tiny("tiny_threads", merges_json, false, NULL);
  CHECK(t != NULL);
  if (!t) return;
  const char *text = "the hello world café the the hello <think> WORD 123 hell world";
  char want[4096];  // encoded alone, with a cold word cache
  strcpy(want, encode_str(t, text, true));
  CHECK(want[0] && strcmp(want, "ERROR"));
  thread_arg a[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    a[i].t = t;
    a[i].text = text;
    a[i].want = want;
    pthread_create(&th[i], NULL, encode_thread, &a[i]);
  }
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  for (int i = 1; i < 4; i++) CHECK(!strcmp(a[0].result, a[i].result));
  for (int i = 0; i < 4; i++) CHECK(a[i].differ == 0 && !strcmp(a[i].result, want));
  CHECK(!strcmp(encode_str(t, text, true), want));  // and alone again, with a warm cache
  ct_tokenizer_free(t);
}

// Thousands of added tokens (one first byte for most, as in vocabularies extended with
// <extra_N> tokens): leftmost-longest matching, special ones only with `special`, the
// first of two with the same content, and lookups by name.
static void test_many_added_tokens_match_by_content() {
  char dir[512], path[600];
  json_t *j = tiny_tokenizer_json("many_added", dir, path);
  if (!j) return;
  json_t *added = json_object_get(j, "added_tokens");
  enum { N = 3000 };
  char content[64];
  for (int i = 0; i < N; i++) {  // <extra_i> = 1000 + i; every third one not special
    snprintf(content, sizeof content, "<extra_%d>", i);
    json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", 1000 + i, "content", content,
                                           "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special",
                                           i % 3 != 0));
  }
  json_array_append_new(added, json_pack("{s:i,s:s,s:b}", "id", 4000, "content", "<extra_1", "special", 0));
  json_array_append_new(added, json_pack("{s:i,s:s,s:b}", "id", 4001, "content", "<extra_5>", "special", 1));
  for (int i = 0; i < 100; i++) {  // #tagI = 4100 + i
    snprintf(content, sizeof content, "#tag%d", i);
    json_array_append_new(added, json_pack("{s:i,s:s,s:b}", "id", 4100 + i, "content", content, "special", 0));
  }
  CHECK(json_dump_file(j, path, JSON_INDENT(1)) == 0);
  json_decref(j);
  ct_tokenizer *t = NULL;
  CHECK_OK(ct_tokenizer_load(&t, dir));
  if (!t) return;
  CHECK(ct_tokenizer_vocab_size(t) == 4200);
  CHECK(ct_tokenizer_token_id(t, "<extra_2999>") == 3999 && ct_tokenizer_token_id(t, "<extra_0>") == 1000);
  CHECK(ct_tokenizer_token_id(t, "<extra_5>") == 1005);  // the first with that content
  CHECK(ct_tokenizer_token_id(t, "<extra_1") == 4000 && ct_tokenizer_token_id(t, "<extra_3000>") < 0);
  CHECK(ct_tokenizer_token_id(t, "<think>") == 400 && ct_tokenizer_token_id(t, "<|im_end|>") == 258);
  CHECK(!strcmp(encode_str(t, "a<extra_0>b<extra_2999> <extra_1234><extra_12><think>", true),
                "97 1000 98 3999 32 2234 1012 400"));
  CHECK(!strcmp(encode_str(t, "<extra_5><extra_1x<extra_1>", true), "1005 4000 120 1001"));  // longest first
  CHECK(!strcmp(encode_str(t, "#tag7 #tag77<|im_end|>", true), "4107 32 4177 258"));
  // without special: <extra_3> (not special) still matches, <extra_4> is text
  CHECK(!strcmp(encode_str(t, "<extra_4>", false), "60 101 120 116 114 97 95 52 62"));
  CHECK(!strcmp(encode_str(t, "<extra_3><extra_4>", false), "1003 60 101 120 116 114 97 95 52 62"));
  CHECK(!strcmp(encode_str(t, "<extra_1234>", false), "4000 50 51 52 62"));  // "<extra_1", then text
  CHECK(roundtrips(t, "x <extra_7>y<extra_700><<extra_2>> #tag3#tag99 <extra_"));
  ct_tokenizer_free(t);
}

// Generated text can stop inside a multi-byte character: JSON writers get U+FFFD for
// every byte that is not part of a well-formed sequence, and valid text unchanged.
static void test_utf8_lossy_replaces_only_invalid_bytes(void) {
  const char in[] = "ok \xC3\xA9 \xE4\xBD\xA0 cut \xE4\xBD";  // é 你, then a cut 你
  size_t n;
  char *out = ct_utf8_lossy(in, sizeof in - 1, &n);
  const char want[] = "ok \xC3\xA9 \xE4\xBD\xA0 cut \xEF\xBF\xBD\xEF\xBF\xBD";
  CHECK(out && n == sizeof want - 1 && memcmp(out, want, n) == 0 && ct_utf8_valid(out, n));
  free(out);
  out = ct_utf8_lossy("\xFF\xC0\x80", 3, &n);  // not UTF-8 at all, and an overlong form
  CHECK(out && n == 9 && ct_utf8_valid(out, n));
  free(out);
}

int main(void) {
  if (scratch_make("/tmp/ct_test_tokenizer_XXXXXX")) return 1;
  RUN(test_utf8_lossy_replaces_only_invalid_bytes);
  RUN(test_byte_tokenizer_maps_bytes_and_special_tokens);
  RUN(test_byte_tokenizer_saved_files_load_back_as_the_same_mapping);
  RUN(test_a_failed_save_says_why);
  RUN(test_bpe_merges_by_rank_with_string_and_pair_merges_alike);
  RUN(test_ignore_merges_takes_whole_words_from_the_vocabulary);
  RUN(test_fit_drops_added_tokens_past_the_model_and_refuses_vocabulary_ones);
  RUN(test_added_tokens_follow_special_lstrip_rstrip_and_single_word);
  RUN(test_many_added_tokens_match_by_content);
  RUN(test_nfc_normalizer_composes_and_offsets_point_into_the_original_text);
  RUN(test_nfc_offsets_stay_exact_across_many_changed_stretches);
  RUN(test_utf8_prev_steps_back_one_code_point_or_one_stray_byte);
  RUN(test_regex_engine_matches_pretokenizer_patterns);
  RUN(test_chat_generation_spans_mask_exactly_the_assistant_tokens);
  RUN(test_config_sets_special_tokens_add_bos_and_stop_ids);
  RUN(test_template_errors_name_the_file_line_and_column);
  RUN(test_template_errors_that_say_out_of_memory_stay_format_errors);
  RUN(test_sentencepiece_bpe_merges_characters_and_falls_back_to_bytes);
  RUN(test_metaspace_prepends_per_scheme_and_splits_before_each_space);
  RUN(test_malformed_tokenizer_files_fail_with_clear_errors);
  RUN(test_fuzz_tokenizer_json_loader_never_crashes);
  RUN(test_fuzz_template_parser_and_renderer_never_crash);
  RUN(test_concurrent_encodes_agree_with_a_single_thread);
  scratch_remove();
  return test_summary();
}
