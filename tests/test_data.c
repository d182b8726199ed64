// data: every row format, labels, truncation, packing and batches; malformed rows fail
// with file:line and the key, or are skipped and counted when asked.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "chat_template.h"
#include "data.h"
#include "error.h"
#include "scratch.h"
#include "test.h"
#include "tools_template.h"

static ct_tokenizer *tok;

// name, gzip-compressed (n bytes of text: it may hold NUL bytes).
static const char *write_gz(const char *name, const char *text, size_t n) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", scratch_dir, name);
  gzFile f = gzopen(path, "wb");
  gzwrite(f, text, (unsigned)n);
  gzclose(f);
  return path;
}

static ct_data_opts opts(void) {
  return (ct_data_opts){.max_length = 64, .completion_only_loss = true, .text_field = "text"};
}

static void test_text_row_gets_eos_and_labels_all_but_first(void) {
  ct_dataset ds;
  ct_data_opts o = opts();
  CHECK_OK(ct_dataset_load(&ds, write_file("a.jsonl", "{\"text\": \"hi\"}\n"), tok, &o));
  CHECK(ds.n_rows == 1 && ds.row_len[0] == 3);
  CHECK(ds.ids[0] == 'h' && ds.ids[1] == 'i' && ds.ids[2] == ct_tokenizer_eos(tok));
  CHECK(ds.label[0] == 0 && ds.label[1] == 1 && ds.label[2] == 1);
  CHECK(ds.n_label_tokens == 2);
  ct_dataset_free(&ds);
}

static void test_prompt_completion_labels_only_completion_and_eos(void) {
  ct_dataset ds;
  ct_data_opts o = opts();
  CHECK_OK(ct_dataset_load(&ds, write_file("b.jsonl", "{\"prompt\": \"1+2=\", \"completion\": \"3\"}\n"), tok, &o));
  CHECK(ds.row_len[0] == 6);  // 1 + 2 = 3 <eos>
  int want[6] = {0, 0, 0, 0, 1, 1};
  for (int i = 0; i < 6; i++) CHECK(ds.label[i] == want[i]);
  ct_dataset_free(&ds);
  o.completion_only_loss = false;  // then every token after the first
  CHECK_OK(ct_dataset_load(&ds, write_file("b.jsonl", "{\"prompt\": \"1+2=\", \"completion\": \"3\"}\n"), tok, &o));
  CHECK(ds.n_label_tokens == 5);
  ct_dataset_free(&ds);
}

static void test_pretokenized_rows_use_completion_mask_and_add_no_eos(void) {
  ct_dataset ds;
  ct_data_opts o = opts();
  CHECK_OK(ct_dataset_load(&ds, write_file("c.jsonl",
                           "{\"input_ids\": [5, 6, 7, 8], \"completion_mask\": [0, 0, 1, 1]}\n"
                           "{\"input_ids\": [9, 10]}\n"), tok, &o));
  CHECK(ds.n_rows == 2 && ds.row_len[0] == 4 && ds.row_len[1] == 2);
  CHECK(ds.label[1] == 0 && ds.label[2] == 1 && ds.label[3] == 1);
  CHECK(ds.n_label_tokens == 3);
  ct_dataset_free(&ds);
}

static void test_prompt_and_completion_input_ids_label_the_completion(void) {
  ct_dataset ds;
  ct_data_opts o = opts();
  CHECK_OK(ct_dataset_load(&ds, write_file("pc.jsonl",
           "{\"prompt_input_ids\": [5, 6, 7], \"completion_input_ids\": [8, 9]}\n"), tok, &o));
  CHECK(ds.row_len[0] == 5 && ds.ids[3] == 8 && ds.n_label_tokens == 2);
  CHECK(ds.label[2] == 0 && ds.label[3] == 1 && ds.label[4] == 1);
  ct_dataset_free(&ds);
  ct_set_error(CT_OK, "%s", "");  // a stale message cannot satisfy the check below
  CHECK(ct_dataset_load(&ds, write_file("pc.jsonl", "{\"prompt_input_ids\": [5]}\n"), tok, &o) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "completion_input_ids") != NULL);
}

// Ids are checked against the tokenizer; the message names both sizes and which one held.
static void test_token_id_error_names_tokenizer_and_model_sizes(void) {
  ct_dataset ds;
  ct_data_opts o = opts();
  o.model_vocab = 131072;
  int V = ct_tokenizer_vocab_size(tok);
  const char *path = write_file("ids.jsonl", "{\"input_ids\": [1, 2]}\n{\"input_ids\": [1, 99999]}\n");
  ct_set_error(CT_OK, "%s", "");  // a stale message cannot satisfy the check below
  CHECK(ct_dataset_load(&ds, path, tok, &o) == CT_EFORMAT);
  char want[700];
  snprintf(want, sizeof want, "%s:2: key 'input_ids'[1]: token id 99999 is not below the tokenizer's %d "
           "tokens (the model's vocab_size is 131072; ids are checked against the tokenizer)", path, V);
  if (strcmp(ct_last_error(), want)) fprintf(stderr, "  got  '%s'\n  want '%s'\n", ct_last_error(), want);
  CHECK(strcmp(ct_last_error(), want) == 0);
  // unknown model size: said so, not a made-up number
  o.model_vocab = 0;
  CHECK(ct_dataset_load(&ds, path, tok, &o) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "vocab_size is not known") != NULL);
}

static void test_messages_render_chatml_and_train_on_every_token(void) {
  ct_dataset ds;
  ct_data_opts o = opts();
  o.max_length = 256;
  CHECK_OK(ct_dataset_load(&ds, write_file("d.jsonl",
           "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n"),
           tok, &o));
  CHECK(ds.n_rows == 1);
  CHECK(ds.ids[0] == ct_tokenizer_token_id(tok, "<|im_start|>"));
  // every token is a label but the first (nothing before it predicts it): user turn,
  // template tokens and the assistant reply alike
  CHECK(ds.n_rows == 1 && ds.row_len[0] > 10);
  CHECK(ds.n_label_tokens == ds.row_len[0] - 1);
  int unlabelled = 0;
  for (int i = 1; i < ds.row_len[0]; i++) unlabelled += ds.label[ds.row_start[0] + i] != 1;
  CHECK(ds.label[ds.row_start[0]] == 0 && unlabelled == 0);
  ct_dataset_free(&ds);
}

// A row's tools and chat_template_kwargs reach the template (TRL passes both to
// apply_chat_template); without them the template sees neither.
static void test_rows_pass_tools_and_template_kwargs_to_the_template(void) {
  ct_tokenizer *t = tools_tokenizer();
  ct_dataset ds;
  ct_data_opts o = opts();
  CHECK_OK(ct_dataset_load(&ds, write_file("tools.jsonl",
           "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"name\": \"calc\"}], "
           "\"chat_template_kwargs\": {\"flag\": true}}\n"
           "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": null}\n"), t, &o));
  const char *want[] = {"[calc]<flag>hi;", "hi;"};
  CHECK(ds.n_rows == 2);
  for (int r = 0; r < ds.n_rows && r < 2; r++) {
    char *text;
    size_t len;
    CHECK_OK(ct_tokenizer_decode(t, ds.ids + ds.row_start[r], ds.row_len[r], &text, &len));
    if (!strstr(text, want[r])) fprintf(stderr, "  row %d: '%s' lacks '%s'\n", r, text, want[r]);
    CHECK(strstr(text, want[r]) != NULL);
    free(text);
  }
  ct_dataset_free(&ds);
  ct_tokenizer_free(t);
}

// assistant_only_loss: labels exactly on the assistant reply and its <|im_end|>.
static void test_assistant_only_loss_labels_only_assistant_turns(void) {
  ct_dataset ds;
  ct_data_opts o = opts();
  o.max_length = 256;
  o.assistant_only_loss = true;
  CHECK_OK(ct_dataset_load(&ds, write_file("g.jsonl",
           "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, "
           "{\"role\": \"assistant\", \"content\": \"yo\"}, {\"role\": \"user\", \"content\": \"ok\"}, "
           "{\"role\": \"assistant\", \"content\": \"z\"}]}\n"), tok, &o));
  int end = ct_tokenizer_token_id(tok, "<|im_end|>");
  // labelled tokens, in order: y o <|im_end|> z <|im_end|>
  int want[] = {'y', 'o', end, 'z', end}, k = 0;
  for (int i = 0; i < ds.row_len[0]; i++)
    if (ds.label[i]) {
      CHECK(k < 5 && ds.ids[i] == want[k]);
      k++;
    }
  CHECK(k == 5 && ds.n_label_tokens == 5);
  ct_dataset_free(&ds);
}

static void test_truncation_keeps_first_tokens_and_drops_rows_without_labels(void) {
  ct_dataset ds;
  ct_data_opts o = opts();
  o.max_length = 4;
  // row 1: prompt fills max_length -> no completion token survives -> dropped
  CHECK_OK(ct_dataset_load(&ds, write_file("e.jsonl",
           "{\"prompt\": \"abcdef\", \"completion\": \"g\"}\n{\"text\": \"abcdefgh\"}\n"), tok, &o));
  CHECK(ds.n_rows == 1 && ds.n_empty == 1 && ds.n_truncated == 2);
  CHECK(ds.row_len[0] == 4 && ds.ids[3] == 'd' && ds.row_line[0] == 2);
  ct_dataset_free(&ds);
}

static void test_blank_lines_are_ignored_and_line_numbers_kept(void) {
  ct_dataset ds;
  ct_data_opts o = opts();
  CHECK_OK(ct_dataset_load(&ds, write_file("f.jsonl", "\n{\"text\": \"a\"}\n  \n{\"text\": \"b\"}\n"), tok, &o));
  CHECK(ds.n_rows == 2 && ds.row_line[0] == 2 && ds.row_line[1] == 4);
  ct_dataset_free(&ds);
}

// Each malformed row must fail naming "file:line" and, where there is one, the key.
static void test_malformed_rows_name_file_line_and_key(void) {
  struct { const char *row, *want; } cases[] = {
      {"{\"text\": 5}", "key 'text'"},
      {"{\"text\": \"a\"", "invalid JSON"},
      {"[1, 2]", "expected a JSON object"},
      {"{\"prompt\": \"a\"}", "key 'completion' is missing"},
      {"{\"completion\": \"a\"}", "key 'prompt' is missing"},
      {"{\"prompt\": \"a\", \"completion\": 3}", "'prompt' and 'completion'"},
      {"{\"input_ids\": [1, -2]}", "key 'input_ids'[1]"},
      {"{\"input_ids\": [1, 99999]}", "key 'input_ids'[1]"},
      {"{\"input_ids\": \"abc\"}", "key 'input_ids'"},
      {"{\"input_ids\": [1, 2], \"completion_mask\": [1]}", "key 'completion_mask'"},
      {"{\"input_ids\": [1, 2], \"completion_mask\": [1, 2]}", "key 'completion_mask'[1]"},
      {"{\"messages\": []}", "key 'messages'"},
      {"{\"messages\": [{\"role\": \"user\"}]}", "content"},
      {"{\"other\": \"x\"}", "no known fields"},
      {"{\"text\": \"a\", \"text\": \"b\"}", "invalid JSON"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": \"calc\"}", "key 'tools'"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"chat_template_kwargs\": [1]}",
       "key 'chat_template_kwargs'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char text[512];
    snprintf(text, sizeof text, "{\"text\": \"fine\"}\n%s\n", cases[i].row);
    const char *path = write_file("bad.jsonl", text);
    ct_dataset ds;
    ct_data_opts o = opts();
    ct_set_error(CT_OK, "%s", "");  // a stale message cannot satisfy the check below
    int rc = ct_dataset_load(&ds, path, tok, &o);
    CHECK(rc == CT_EFORMAT);
    char where[600];
    snprintf(where, sizeof where, "%s:2:", path);
    if (!strstr(ct_last_error(), where) || !strstr(ct_last_error(), cases[i].want))
      fprintf(stderr, "  case %zu: message '%s' lacks '%s' or '%s'\n", i, ct_last_error(), where, cases[i].want);
    CHECK(strstr(ct_last_error(), where) && strstr(ct_last_error(), cases[i].want));
    // with skip_bad_rows the row is counted and the good one kept
    o.skip_bad_rows = true;
    CHECK_OK(ct_dataset_load(&ds, path, tok, &o));
    CHECK(ds.n_rows == 1 && ds.n_bad == 1 && strstr(ds.first_bad, where));
    ct_dataset_free(&ds);
  }
}

static void test_missing_file_and_empty_file_fail_clearly(void) {
  ct_dataset ds;
  ct_data_opts o = opts();
  ct_set_error(CT_OK, "%s", "");  // a stale message cannot satisfy the check below
  CHECK(ct_dataset_load(&ds, "/nonexistent/x.jsonl", tok, &o) == CT_EIO);
  CHECK(strstr(ct_last_error(), "/nonexistent/x.jsonl") != NULL);
  ct_set_error(CT_OK, "%s", "");  // a stale message cannot satisfy the check below
  CHECK(ct_dataset_load(&ds, write_file("empty.jsonl", "\n\n"), tok, &o) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "no usable rows") != NULL);
  // a NUL byte inside a line is an error, not a silently shortened row
  char path[512];
  snprintf(path, sizeof path, "%s/nul.jsonl", scratch_dir);
  FILE *f = fopen(path, "w");
  fwrite("{\"text\": \"a\0b\"}\n", 1, 16, f);
  fclose(f);
  ct_set_error(CT_OK, "%s", "");  // a stale message cannot satisfy the check below
  CHECK(ct_dataset_load(&ds, path, tok, &o) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), ":1:") && strstr(ct_last_error(), "NUL"));
}

// The data shapes people have: JSONL or a JSON array, either gzip-compressed, read alike.
static void test_json_arrays_and_gzip_files_read_as_jsonl(void) {
  const char *jsonl = "{\"text\": \"ab\"}\n\n{\"prompt\": \"1+2=\", \"completion\": \"3\"}\n";
  const char *array = " [{\"text\": \"ab\"},\n {\"prompt\": \"1+2=\", \"completion\": \"3\"}]\n";
  const char *paths[4];
  char keep[4][512];
  snprintf(keep[0], 512, "%s", write_file("plain.jsonl", jsonl));
  snprintf(keep[1], 512, "%s", write_gz("rows.jsonl.gz", jsonl, strlen(jsonl)));
  snprintf(keep[2], 512, "%s", write_file("rows.json", array));
  snprintf(keep[3], 512, "%s", write_gz("rows.json.gz", array, strlen(array)));
  ct_dataset ref;
  ct_data_opts o = opts();
  CHECK_OK(ct_dataset_load(&ref, keep[0], tok, &o));
  CHECK(ref.n_rows == 2 && ref.row_line[1] == 3);
  for (int k = 1; k < 4; k++) {
    paths[k] = keep[k];
    ct_dataset ds;
    CHECK_OK(ct_dataset_load(&ds, paths[k], tok, &o));
    CHECK(ds.n_rows == 2 && ds.n_tokens == ref.n_tokens && ds.n_label_tokens == ref.n_label_tokens);
    CHECK(ds.n_rows == 2 && !memcmp(ds.ids, ref.ids, sizeof(int) * ref.n_tokens) &&
          !memcmp(ds.label, ref.label, (size_t)ref.n_tokens));
    ct_dataset_free(&ds);
  }
  ct_dataset_free(&ref);
  // rows of an array are named by their index; a compressed file's lines by their number
  ct_dataset ds;
  const char *bad = write_file("bad.json", "[{\"text\": \"a\"}, {\"text\": 5}]");
  ct_set_error(CT_OK, "%s", "");  // a stale message cannot satisfy the check below
  CHECK(ct_dataset_load(&ds, bad, tok, &o) == CT_EFORMAT);
  char want[600];
  snprintf(want, sizeof want, "%s: row 2: key 'text'", bad);
  CHECK(strstr(ct_last_error(), want) != NULL);
  o.skip_bad_rows = true;
  CHECK_OK(ct_dataset_load(&ds, bad, tok, &o));
  CHECK(ds.n_rows == 1 && ds.n_bad == 1 && strstr(ds.first_bad, want));
  ct_dataset_free(&ds);
  o.skip_bad_rows = false;
  const char *two = "{\"text\": \"a\"}\n{\"text\": 5}\n";
  const char *badgz = write_gz("bad.jsonl.gz", two, strlen(two));
  CHECK(ct_dataset_load(&ds, badgz, tok, &o) == CT_EFORMAT);
  snprintf(want, sizeof want, "%s:2: key 'text'", badgz);
  CHECK(strstr(ct_last_error(), want) != NULL);
  // an array that does not parse is a file error (not a skippable row), naming line and column
  o.skip_bad_rows = true;
  CHECK(ct_dataset_load(&ds, write_file("broken.json", "[{\"text\": \"a\"},\n {\"text\": }]"), tok, &o) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "broken.json: invalid JSON at line 2") && strstr(ct_last_error(), "JSON array"));
  // a NUL byte in a compressed line is still a row error; a cut-off gzip stream a read error
  o.skip_bad_rows = false;
  CHECK(ct_dataset_load(&ds, write_gz("nul.jsonl.gz", "{\"text\": \"a\0b\"}\n", 16), tok, &o) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "nul.jsonl.gz:1: line contains a NUL byte") != NULL);
  char big[4000];
  size_t n = 0;
  for (int i = 0; i < 100; i++) n += (size_t)snprintf(big + n, sizeof big - n, "{\"text\": \"row %d\"}\n", i);
  const char *gz = write_gz("cut.jsonl.gz", big, n);
  struct stat sb;
  CHECK(stat(gz, &sb) == 0 && truncate(gz, sb.st_size / 2) == 0);
  int rc = ct_dataset_load(&ds, gz, tok, &o);
  if (rc != CT_EIO) fprintf(stderr, "  cut gzip: rc %d: %s\n", rc, ct_last_error());
  if (rc == 0) ct_dataset_free(&ds);
  CHECK(rc == CT_EIO && strstr(ct_last_error(), "cut.jsonl.gz: read error"));
}

// Loads one row from `text` and compares its tokens and labels with those of `ref`.
static int same_as(const char *text, const char *ref) {
  ct_dataset a, b;
  ct_data_opts o = opts();
  if (ct_dataset_load(&a, write_file("same_a.jsonl", text), tok, &o)) {
    fprintf(stderr, "  %s\n", ct_last_error());
    return 0;
  }
  if (ct_dataset_load(&b, write_file("same_b.jsonl", ref), tok, &o)) {
    ct_dataset_free(&a);
    return 0;
  }
  int ok = a.n_tokens == b.n_tokens && !memcmp(a.ids, b.ids, sizeof(int) * a.n_tokens) &&
           !memcmp(a.label, b.label, (size_t)a.n_tokens) && a.n_label_tokens > 0;
  ct_dataset_free(&a);
  ct_dataset_free(&b);
  return ok;
}

// Loading `text` fails at line 1 with a message holding `want`.
static int fails_with(const char *text, const char *want) {
  ct_dataset ds;
  ct_data_opts o = opts();
  ct_set_error(CT_OK, "%s", "");  // a stale message cannot satisfy the check below
  int rc = ct_dataset_load(&ds, write_file("fails.jsonl", text), tok, &o);
  if (rc == 0) ct_dataset_free(&ds);
  int ok = rc == CT_EFORMAT && strstr(ct_last_error(), "fails.jsonl:1: ") && strstr(ct_last_error(), want);
  if (!ok) fprintf(stderr, "  rc %d: '%s' lacks '%s'\n", rc, ct_last_error(), want);
  return ok;
}

// ShareGPT rows (Axolotl, LLaMA-Factory) train exactly as the same conversation in messages.
static void test_sharegpt_conversations_map_to_messages(void) {
  const char *msgs = "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
                     "{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}, "
                     "{\"role\": \"tool\", \"content\": \"42\"}]}\n";
  CHECK(same_as("{\"conversations\": [{\"from\": \"system\", \"value\": \"Be brief.\"}, {\"from\": \"human\", "
                "\"value\": \"hi\"}, {\"from\": \"gpt\", \"value\": \"yo\"}, {\"from\": \"tool\", \"value\": \"42\"}]}\n",
                msgs));
  // role/content inside conversations, and LLaMA-Factory's top-level system column
  CHECK(same_as("{\"system\": \"Be brief.\", \"conversations\": [{\"role\": \"user\", \"content\": \"hi\"}, "
                "{\"from\": \"gpt\", \"value\": \"yo\"}, {\"from\": \"tool\", \"value\": \"42\"}]}\n", msgs));
  CHECK(fails_with("{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"bob\", \"value\": \"b\"}]}\n",
                   "key 'conversations'[1]: unknown speaker \"from\": \"bob\""));
  CHECK(fails_with("{\"conversations\": [{\"from\": \"human\"}]}\n", "key 'conversations'[0]"));
  CHECK(fails_with("{\"conversations\": []}\n", "key 'conversations'"));
}

// Alpaca rows: LLaMA-Factory's mapping, the user turn = instruction + "\n" + input.
static void test_alpaca_rows_map_to_a_conversational_prompt_and_completion(void) {
  CHECK(same_as("{\"instruction\": \"Add.\", \"input\": \"1 2\", \"output\": \"3\"}\n",
                "{\"prompt\": [{\"role\": \"user\", \"content\": \"Add.\\n1 2\"}], "
                "\"completion\": [{\"role\": \"assistant\", \"content\": \"3\"}]}\n"));
  CHECK(same_as("{\"instruction\": \"Say hi.\", \"input\": \"\", \"output\": \"hi\", \"system\": \"S\"}\n",
                "{\"prompt\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Say hi.\"}], "
                "\"completion\": [{\"role\": \"assistant\", \"content\": \"hi\"}]}\n"));
  // the loss is on the output only (completion_only_loss): the prompt's tokens carry no label
  ct_dataset ds;
  ct_data_opts o = opts();
  CHECK_OK(ct_dataset_load(&ds, write_file("al.jsonl", "{\"instruction\": \"Q\", \"output\": \"A\"}\n"), tok, &o));
  CHECK(ds.n_rows == 1 && ds.n_label_tokens < ds.n_tokens / 2);
  ct_dataset_free(&ds);
  CHECK(fails_with("{\"instruction\": \"Q\"}\n", "key 'output'"));
  CHECK(fails_with("{\"instruction\": \"Q\", \"input\": 3, \"output\": \"A\"}\n", "key 'input'"));
}

// A message whose role the template does not render is an error naming row, key and role;
// a template that folds the system message into the first user turn passes.
static void test_messages_the_template_drops_are_errors(void) {
  char path[512];
  snprintf(path, sizeof path, "%s/ua.jinja", scratch_dir);
  FILE *f = fopen(path, "w");
  fputs("{% for m in messages %}{% if m.role == 'user' %}U: {{ m.content | trim }}\n{% elif m.role == 'assistant' %}"
        "A: {{ m.content }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}A:{% endif %}", f);
  fclose(f);
  ct_tokenizer *saved = tok, *t;
  CHECK_OK(ct_tokenizer_bytes(&t));
  CHECK_OK(ct_tokenizer_load_chat_template(t, path));
  tok = t;
  CHECK(fails_with("{\"messages\": [{\"role\": \"user\", \"content\": \" hi \"}, {\"role\": \"assistant\", \"content\": "
                   "\"yo\"}, {\"role\": \"tool\", \"content\": \"42\"}]}\n",
                   "key 'messages'[2]: the chat template renders nothing of this message (role 'tool')"));
  CHECK(fails_with("{\"prompt\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Q\"}], "
                   "\"completion\": [{\"role\": \"assistant\", \"content\": \"A\"}]}\n", "key 'prompt'[0]"));
  CHECK(fails_with("{\"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}, {\"from\": \"tool\", \"value\": \"1\"}]}\n",
                   "key 'conversations'[1]"));
  ct_dataset ds;
  ct_data_opts o = opts();
  CHECK_OK(ct_dataset_load(&ds, write_file("ua.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \" hi \"}, "
                                           "{\"role\": \"assistant\", \"content\": \"\"}]}\n"), tok, &o));
  ct_dataset_free(&ds);
  f = fopen(path, "w");
  fputs("{% if messages[0].role == 'system' %}{% set sys = messages[0].content + ' ' %}{% set rest = messages[1:] %}"
        "{% else %}{% set sys = '' %}{% set rest = messages %}{% endif %}{% for m in rest %}{{ m.role }}: "
        "{% if loop.first %}{{ sys }}{% endif %}{{ m.content }}\n{% endfor %}", f);
  fclose(f);
  CHECK_OK(ct_tokenizer_load_chat_template(t, path));
  CHECK_OK(ct_dataset_load(&ds, write_file("fold.jsonl", "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, "
                                           "{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n"), tok, &o));
  ct_dataset_free(&ds);
  tok = saved;
  ct_tokenizer_free(t);
}

// Parquet, Arrow and datasets directories: one line naming the format and the conversion.
static void test_parquet_arrow_and_datasets_dirs_fail_with_the_conversion(void) {
  struct { const char *name, *bytes, *format, *load; } cases[] = {
      {"x.parquet", "PAR1\x15\x04", "a Parquet file", "load_dataset('parquet', data_files='"},
      {"x.arrow", "ARROW1\0\0", "an Arrow file", "load_dataset('arrow', data_files='"},
      {"data-00000-of-00001.arrow", "\xff\xff\xff\xff\x10\0", "an Arrow file", "load_dataset('arrow'"},
  };
  ct_data_opts o = opts();
  ct_dataset ds;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *path = write_file(cases[i].name, cases[i].bytes);
    ct_set_error(CT_OK, "%s", "");  // a stale message cannot satisfy the check below
    CHECK(ct_dataset_load(&ds, path, tok, &o) == CT_EFORMAT);
    const char *e = ct_last_error();
    if (!strstr(e, cases[i].format) || !strstr(e, cases[i].load) || !strstr(e, ".to_json('") || strchr(e, '\n'))
      fprintf(stderr, "  case %zu: '%s'\n", i, e);
    CHECK(strstr(e, path) == e && strstr(e, cases[i].format) && strstr(e, cases[i].load) &&
          strstr(e, ".jsonl')") && !strchr(e, '\n'));
  }
  char hf[512], info[600];
  snprintf(hf, sizeof hf, "%s/hfds", scratch_dir);
  CHECK(mkdir(hf, 0700) == 0);
  snprintf(info, sizeof info, "%s/hfds/state.json", scratch_dir);
  FILE *f = fopen(info, "w");
  fputs("{}", f);
  fclose(f);
  CHECK(ct_dataset_load(&ds, hf, tok, &o) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "Hugging Face datasets directory") &&
        strstr(ct_last_error(), "load_from_disk('") && strstr(ct_last_error(), "hfds.jsonl')"));
  CHECK(ct_dataset_load(&ds, scratch_dir, tok, &o) == CT_EIO);
  CHECK(strstr(ct_last_error(), "is a directory") != NULL);
}

// Packing: every row in exactly one bin, no bin over max_length, bins well filled
// (best-fit decreasing: at most one bin less than half full).
static void test_packing_places_every_row_once_within_max_length(void) {
  char *text = malloc(200000);
  size_t used = 0;
  srand(3);
  for (int i = 0; i < 300; i++) {
    int len = 1 + rand() % 40;
    used += (size_t)sprintf(text + used, "{\"text\": \"");
    for (int k = 0; k < len; k++) text[used++] = (char)('a' + rand() % 26);
    used += (size_t)sprintf(text + used, "\"}\n");
  }
  text[used] = 0;
  ct_dataset ds;
  ct_data_opts o = opts();
  o.max_length = 48;
  o.packing = true;
  CHECK_OK(ct_dataset_load(&ds, write_file("p.jsonl", text), tok, &o));
  free(text);
  int *seen = calloc(ds.n_rows, sizeof(int)), half_empty = 0;
  long tokens = 0;
  for (int s = 0; s < ds.n_seq; s++) {
    int len = 0;
    for (int k = 0; k < ds.seq_count[s]; k++) {
      int r = ds.seq_rows[ds.seq_first[s] + k];
      seen[r]++;
      len += ds.row_len[r];
    }
    CHECK(len == ds.seq_len[s] && len <= 48);
    half_empty += len < 24;
    tokens += len;
  }
  for (int r = 0; r < ds.n_rows; r++) CHECK(seen[r] == 1);
  CHECK(tokens == ds.n_tokens);
  CHECK(half_empty <= 1);
  CHECK(ds.n_seq < ds.n_rows / 2);
  free(seen);
  ct_dataset_free(&ds);
}

// A packed bin: positions restart and attention segments start at each document, the
// first token of each document has no target, padding has none either.
static void test_batch_of_packed_bin_resets_positions_and_masks_document_starts(void) {
  ct_dataset ds;
  ct_data_opts o = opts();
  o.max_length = 14;  // 11 tokens fill bin 0 (room 3); 5 and 4 share bin 1
  o.packing = true;
  CHECK_OK(ct_dataset_load(&ds, write_file("q.jsonl", "{\"text\": \"abcd\"}\n{\"text\": \"xyz\"}\n{\"text\": \"0123456789\"}\n"), tok, &o));
  CHECK(ds.n_seq == 2);
  ct_batch b;
  CHECK_OK(ct_batch_init(&b, 2, 16));
  int seqs[2] = {0, 1};
  ct_batch_fill(&b, &ds, seqs, 2, ct_tokenizer_pad(tok));
  // bin 0 holds the 11-token row (10 chars + eos); bin 1 the 5- and 4-token rows
  CHECK(b.T == 11);
  const int *pos = b.pos + b.T, *seg = b.seg + b.T, *tgt = b.target + b.T, *ids = b.ids + b.T;
  int first_len = ds.row_len[ds.seq_rows[ds.seq_first[1]]];
  CHECK(pos[0] == 0 && pos[first_len] == 0 && pos[first_len + 1] == 1);
  CHECK(seg[first_len - 1] == 0 && seg[first_len] == first_len);
  CHECK(tgt[first_len - 1] == -1);              // last token of doc 1 does not predict doc 2
  CHECK(tgt[0] == ids[1] && tgt[first_len] == ids[first_len + 1]);
  CHECK(tgt[9] == -1 && tgt[10] == -1 && ids[10] == ct_tokenizer_pad(tok));  // padding
  CHECK(b.n_target == 10 + 4 + 3);  // each document: its length minus one
  CHECK(b.n_tokens == 11 + 9);
  ct_batch_free(&b);
  ct_dataset_free(&ds);
}

int main(void) {
  if (scratch_make("/tmp/ct_test_data_XXXXXX") || ct_tokenizer_bytes(&tok)) return 1;
  RUN(test_text_row_gets_eos_and_labels_all_but_first);
  RUN(test_prompt_completion_labels_only_completion_and_eos);
  RUN(test_pretokenized_rows_use_completion_mask_and_add_no_eos);
  RUN(test_prompt_and_completion_input_ids_label_the_completion);
  RUN(test_token_id_error_names_tokenizer_and_model_sizes);
  RUN(test_messages_render_chatml_and_train_on_every_token);
  RUN(test_rows_pass_tools_and_template_kwargs_to_the_template);
  RUN(test_assistant_only_loss_labels_only_assistant_turns);
  RUN(test_truncation_keeps_first_tokens_and_drops_rows_without_labels);
  RUN(test_blank_lines_are_ignored_and_line_numbers_kept);
  RUN(test_malformed_rows_name_file_line_and_key);
  RUN(test_missing_file_and_empty_file_fail_clearly);
  RUN(test_json_arrays_and_gzip_files_read_as_jsonl);
  RUN(test_parquet_arrow_and_datasets_dirs_fail_with_the_conversion);
  RUN(test_sharegpt_conversations_map_to_messages);
  RUN(test_alpaca_rows_map_to_a_conversational_prompt_and_completion);
  RUN(test_messages_the_template_drops_are_errors);
  RUN(test_packing_places_every_row_once_within_max_length);
  RUN(test_batch_of_packed_bin_resets_positions_and_masks_document_starts);
  ct_tokenizer_free(tok);
  if (scratch_remove()) return 1;
  return test_summary();
}
