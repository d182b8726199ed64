// prefs: DPO preference pairs as strings, conversations and token ids; truncation;
// batches (chosen rows first, targets only on completion tokens); malformed rows fail
// with file:line and the key, or are skipped and counted when asked.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "prefs.h"
#include "prompts.h"
#include "scratch.h"
#include "test.h"
#include "tools_template.h"

static ct_tokenizer *tok;
static int EOS, PAD, IM_START, IM_END;

static ct_pref_opts opts(void) { return (ct_pref_opts){.max_length = 64}; }

// The pair's prompt, chosen and rejected tokens.
static const int *P(const ct_pref_dataset *ds, int k) { return ds->ids + ds->start[k]; }
static const int *C(const ct_pref_dataset *ds, int k) { return P(ds, k) + ds->p_len[k]; }
static const int *R(const ct_pref_dataset *ds, int k) { return C(ds, k) + ds->c_len[k]; }

// ids[0, n) == want[0, n), printing both when not.
static int same(const int *ids, int n, const int *want, int nwant) {
  int ok = n == nwant;
  for (int i = 0; ok && i < n; i++) ok = ids[i] == want[i];
  if (!ok) {
    fprintf(stderr, "  got  [");
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, " ]\n  want [");
    for (int i = 0; i < nwant; i++) fprintf(stderr, " %d", want[i]);
    fprintf(stderr, " ]\n");
  }
  return ok;
}

// The byte tokenizer's ids of a plain string.
static int bytes(const char *s, int *out) {
  int n = (int)strlen(s);
  for (int i = 0; i < n; i++) out[i] = (unsigned char)s[i];
  return n;
}

static void test_string_rows_tokenize_prompt_and_completions_separately_with_eos(void) {
  ct_pref_dataset ds;
  ct_pref_opts o = opts();
  CHECK_OK(ct_pref_load(&ds, write_file("a.jsonl",
           "{\"prompt\": \"1+2=\", \"chosen\": \"3\", \"rejected\": \"4!\"}\n"
           "\n"
           "{\"prompt\": \"say hi\", \"chosen\": \" hi\", \"rejected\": \" no<|im_end|>\"}\n"), tok, &o));
  CHECK(ds.n == 2 && ds.n_lines == 3 && ds.n_bad == 0 && ds.n_truncated == 0);
  CHECK(ds.line[0] == 1 && ds.line[1] == 3);
  int want[32], n;
  n = bytes("1+2=", want);
  CHECK(same(P(&ds, 0), ds.p_len[0], want, n));
  n = bytes("3", want);
  want[n++] = EOS;
  CHECK(same(C(&ds, 0), ds.c_len[0], want, n));
  n = bytes("4!", want);
  want[n++] = EOS;
  CHECK(same(R(&ds, 0), ds.r_len[0], want, n));
  n = bytes("say hi", want);
  CHECK(same(P(&ds, 1), ds.p_len[1], want, n));
  n = bytes(" hi", want);
  want[n++] = EOS;
  CHECK(same(C(&ds, 1), ds.c_len[1], want, n));
  // special-token text in a completion becomes its id; EOS still follows
  n = bytes(" no", want);
  want[n++] = IM_END;
  want[n++] = EOS;
  CHECK(same(R(&ds, 1), ds.r_len[1], want, n));
  // pairs lie back to back
  CHECK(ds.start[0] == 0 && ds.start[1] == 4 + 2 + 3);
  CHECK(ds.n_tokens == 4 + 2 + 3 + 6 + 4 + 5);
  CHECK(ct_pref_max_len(&ds) == 6 + 5);
  ct_pref_free(&ds);
}

// Every row of a batch against what it must hold: prompt then completion then padding,
// the position before each completion token predicts it, nothing else has a target.
static void check_row(const ct_batch *b, int row, const int *p, int np, const int *c, int nc) {
  const int *ids = b->ids + (long)row * b->T, *tgt = b->target + (long)row * b->T;
  const int *pos = b->pos + (long)row * b->T;
  int bad = 0, n_tgt = 0;
  for (int t = 0; t < b->T; t++) {
    int want_id = t < np ? p[t] : t < np + nc ? c[t - np] : PAD;
    int want_tgt = t >= np - 1 && t < np + nc - 1 ? c[t + 1 - np] : -1;
    bad += ids[t] != want_id || tgt[t] != want_tgt || pos[t] != t;
    n_tgt += tgt[t] >= 0;
  }
  if (bad) fprintf(stderr, "  batch row %d: %d wrong positions\n", row, bad);
  CHECK(bad == 0);
  CHECK(n_tgt == nc);
}

static void test_batch_puts_chosen_rows_first_and_targets_only_completion_tokens(void) {
  ct_pref_dataset ds;
  ct_pref_opts o = opts();
  CHECK_OK(ct_pref_load(&ds, write_file("b.jsonl",
           "{\"prompt\": \"ab\", \"chosen\": \"cde\", \"rejected\": \"f\"}\n"
           "{\"prompt\": \"long prompt\", \"chosen\": \"x\", \"rejected\": \"yz\"}\n"
           "{\"prompt\": \"q\", \"chosen\": \"0123456789\", \"rejected\": \"!\"}\n"), tok, &o));
  CHECK(ds.n == 3);
  ct_batch b;
  CHECK_OK(ct_batch_init(&b, 6, ct_pref_max_len(&ds)));
  int pairs[3] = {1, 0, 2};
  ct_pref_batch(&b, &ds, pairs, 3, PAD);
  CHECK(b.B == 6);
  CHECK(b.T == 11 + 3 && b.T == ct_pref_max_len(&ds));  // "long prompt" + "yz" + EOS
  long want_targets = 0, want_tokens = 0;
  for (int i = 0; i < 3; i++) {
    int k = pairs[i];
    CHECK(b.row_seq[i] == k && b.row_seq[3 + i] == k);
    check_row(&b, i, P(&ds, k), ds.p_len[k], C(&ds, k), ds.c_len[k]);      // chosen rows first
    check_row(&b, 3 + i, P(&ds, k), ds.p_len[k], R(&ds, k), ds.r_len[k]);  // then rejected
    want_targets += ds.c_len[k] + ds.r_len[k];
    want_tokens += 2 * ds.p_len[k] + ds.c_len[k] + ds.r_len[k];
  }
  CHECK(b.n_target == want_targets);
  CHECK(b.n_tokens == want_tokens);
  // the last prompt token predicts the first completion token
  CHECK(b.target[0 * b.T + 10] == 'x' && b.target[3 * b.T + 10] == 'y');
  CHECK(b.target[0 * b.T + 11] == EOS && b.target[0 * b.T + 12] == -1);
  // a batch of one pair after a bigger one: T shrinks, counts restart
  int one = 0;
  ct_pref_batch(&b, &ds, &one, 1, PAD);
  CHECK(b.B == 2 && b.T == 6);
  check_row(&b, 0, P(&ds, 0), 2, C(&ds, 0), 4);
  check_row(&b, 1, P(&ds, 0), 2, R(&ds, 0), 2);
  CHECK(b.n_target == 4 + 2 && b.n_tokens == 6 + 4);
  ct_batch_free(&b);
  ct_pref_free(&ds);
}

// Renders messages with the chat template and encodes the text (special tokens as ids).
static int render(const char *messages_json, const char *more_json, bool gen, ct_ids *out, char **text) {
  json_error_t err;
  json_t *m = json_loads(messages_json, 0, &err);
  if (more_json) {
    json_t *more = json_loads(more_json, 0, &err);
    json_array_extend(m, more);
    json_decref(more);
  }
  int rc = ct_tokenizer_chat(tok, m, gen, text);
  json_decref(m);
  if (!rc) rc = ct_tokenizer_encode(tok, *text, strlen(*text), true, out);
  return rc;
}

// TRL's split: completion = render(prompt + completion) minus render(prompt, generation prompt).
static void expected_completion(const char *prompt, const char *comp, ct_ids *out) {
  ct_ids ignore = {0};
  char *ptext = NULL, *full = NULL;
  CHECK_OK(render(prompt, NULL, true, &ignore, &ptext));
  CHECK_OK(render(prompt, comp, false, &ignore, &full));
  size_t np = strlen(ptext);
  CHECK(strncmp(full, ptext, np) == 0);
  CHECK_OK(ct_tokenizer_encode(tok, full + np, strlen(full + np), true, out));
  free(ptext);
  free(full);
  ct_ids_free(&ignore);
}

static void test_conversational_rows_split_completion_off_the_rendered_prompt(void) {
  const char *prompt = "[{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", \"content\": \"hi\"}]";
  const char *chosen = "[{\"role\": \"assistant\", \"content\": \"yo\"}]";
  const char *rejected = "[{\"role\": \"assistant\", \"content\": \"go away\"}]";
  char row[1024];
  snprintf(row, sizeof row, "{\"prompt\": %s, \"chosen\": %s, \"rejected\": %s}\n", prompt, chosen, rejected);
  ct_pref_dataset ds;
  ct_pref_opts o = opts();
  o.max_length = 256;
  CHECK_OK(ct_pref_load(&ds, write_file("c.jsonl", row), tok, &o));
  CHECK(ds.n == 1);
  // the prompt is the template's rendering with the generation prompt
  ct_ids p = {0}, c = {0}, r = {0};
  char *ptext = NULL;
  CHECK_OK(render(prompt, NULL, true, &p, &ptext));
  CHECK(strcmp(ptext, "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                      "<|im_start|>assistant\n") == 0);
  CHECK(same(P(&ds, 0), ds.p_len[0], p.v, p.n));
  CHECK(ds.p_len[0] > 0 && P(&ds, 0)[0] == IM_START);
  expected_completion(prompt, chosen, &c);
  expected_completion(prompt, rejected, &r);
  CHECK(same(C(&ds, 0), ds.c_len[0], c.v, c.n));
  CHECK(same(R(&ds, 0), ds.r_len[0], r.v, r.n));
  // spelled out: y o <|im_end|> \n — the template ends the turn, no EOS is appended
  int want[] = {'y', 'o', IM_END, '\n'};
  CHECK(same(C(&ds, 0), ds.c_len[0], want, 4));
  CHECK(ds.r_len[0] == 7 + 2 && R(&ds, 0)[ds.r_len[0] - 1] != EOS);
  ct_pref_free(&ds);
  // the same conversation as an unpaired (KTO) row: the same prompt and completion tokens
  snprintf(row, sizeof row, "{\"prompt\": %s, \"completion\": %s, \"label\": false}\n", prompt, rejected);
  o.unpaired = true;
  CHECK_OK(ct_pref_load(&ds, write_file("cu.jsonl", row), tok, &o));
  CHECK(ds.n == 1 && ds.label[0] == 0 && ds.r_len[0] == 0);
  CHECK(same(P(&ds, 0), ds.p_len[0], p.v, p.n));
  CHECK(same(C(&ds, 0), ds.c_len[0], r.v, r.n));
  free(ptext);
  ct_ids_free(&p);
  ct_ids_free(&c);
  ct_ids_free(&r);
  ct_pref_free(&ds);
}

static void test_pretokenized_rows_are_used_as_given_without_eos(void) {
  ct_pref_dataset ds;
  ct_pref_opts o = opts();
  CHECK_OK(ct_pref_load(&ds, write_file("d.jsonl",
           "{\"prompt_input_ids\": [5, 6, 7], \"chosen_input_ids\": [8, 9], \"rejected_input_ids\": [259]}\n"
           "{\"prompt_input_ids\": [0], \"chosen_input_ids\": [1, 2, 3], \"rejected_input_ids\": [4, 256]}\n"),
           tok, &o));
  CHECK(ds.n == 2);
  int p0[] = {5, 6, 7}, c0[] = {8, 9}, r0[] = {259}, p1[] = {0}, c1[] = {1, 2, 3}, r1[] = {4, 256};
  CHECK(same(P(&ds, 0), ds.p_len[0], p0, 3));
  CHECK(same(C(&ds, 0), ds.c_len[0], c0, 2));
  CHECK(same(R(&ds, 0), ds.r_len[0], r0, 1));
  CHECK(same(P(&ds, 1), ds.p_len[1], p1, 1));
  CHECK(same(C(&ds, 1), ds.c_len[1], c1, 3));
  CHECK(same(R(&ds, 1), ds.r_len[1], r1, 2));
  ct_pref_free(&ds);
}

static void test_max_prompt_length_keeps_the_last_prompt_tokens(void) {
  ct_pref_dataset ds;
  ct_pref_opts o = opts();
  o.max_prompt_length = 3;
  CHECK_OK(ct_pref_load(&ds, write_file("e.jsonl",
           "{\"prompt\": \"abcdef\", \"chosen\": \"x\", \"rejected\": \"y\"}\n"
           "{\"prompt\": \"abc\", \"chosen\": \"x\", \"rejected\": \"y\"}\n"
           "{\"prompt_input_ids\": [1, 2, 3, 4], \"chosen_input_ids\": [5], \"rejected_input_ids\": [6]}\n"),
           tok, &o));
  CHECK(ds.n == 3 && ds.n_truncated == 2);
  int want[] = {'d', 'e', 'f'}, want2[] = {'a', 'b', 'c'}, want3[] = {2, 3, 4};
  CHECK(same(P(&ds, 0), ds.p_len[0], want, 3));
  CHECK(same(P(&ds, 1), ds.p_len[1], want2, 3));
  CHECK(same(P(&ds, 2), ds.p_len[2], want3, 3));
  CHECK(C(&ds, 0)[0] == 'x' && ds.c_len[0] == 2 && R(&ds, 0)[0] == 'y' && ds.r_len[0] == 2);
  ct_pref_free(&ds);
}

static void test_max_completion_length_keeps_the_first_completion_tokens(void) {
  ct_pref_dataset ds;
  ct_pref_opts o = opts();
  o.max_completion_length = 3;
  CHECK_OK(ct_pref_load(&ds, write_file("f.jsonl",
           "{\"prompt\": \"p\", \"chosen\": \"12345\", \"rejected\": \"9\"}\n"
           "{\"prompt\": \"p\", \"chosen\": \"12\", \"rejected\": \"ab\"}\n"), tok, &o));
  CHECK(ds.n == 2 && ds.n_truncated == 1);  // "12" + EOS is exactly 3: not truncated
  int c0[] = {'1', '2', '3'}, r0[] = {'9', EOS}, c1[] = {'1', '2', EOS}, r1[] = {'a', 'b', EOS};
  CHECK(same(C(&ds, 0), ds.c_len[0], c0, 3));  // the EOS is cut with the tail
  CHECK(same(R(&ds, 0), ds.r_len[0], r0, 2));
  CHECK(same(C(&ds, 1), ds.c_len[1], c1, 3));
  CHECK(same(R(&ds, 1), ds.r_len[1], r1, 3));
  ct_pref_free(&ds);
}

static void test_max_length_cuts_completions_so_prompt_and_completion_fit(void) {
  ct_pref_dataset ds;
  ct_pref_opts o = opts();
  o.max_length = 6;
  CHECK_OK(ct_pref_load(&ds, write_file("g.jsonl",
           "{\"prompt\": \"abcd\", \"chosen\": \"xyz\", \"rejected\": \"q\"}\n"   // chosen 4 -> 2
           "{\"prompt\": \"ab\", \"chosen\": \"xyz\", \"rejected\": \"qr\"}\n"    // 2 + 4 fits exactly
           "{\"prompt\": \"abcde\", \"chosen\": \"x\", \"rejected\": \"y\"}\n"),  // both 2 -> 1
           tok, &o));
  CHECK(ds.n == 3 && ds.n_truncated == 2);
  int c0[] = {'x', 'y'}, r0[] = {'q', EOS}, c1[] = {'x', 'y', 'z', EOS}, c2[] = {'x'}, r2[] = {'y'};
  CHECK(ds.p_len[0] == 4 && same(C(&ds, 0), ds.c_len[0], c0, 2) && same(R(&ds, 0), ds.r_len[0], r0, 2));
  CHECK(ds.p_len[1] == 2 && same(C(&ds, 1), ds.c_len[1], c1, 4) && ds.r_len[1] == 3);
  CHECK(ds.p_len[2] == 5 && same(C(&ds, 2), ds.c_len[2], c2, 1) && same(R(&ds, 2), ds.r_len[2], r2, 1));
  for (int k = 0; k < ds.n; k++) CHECK(ds.p_len[k] + ds.c_len[k] <= 6 && ds.p_len[k] + ds.r_len[k] <= 6);
  CHECK(ct_pref_max_len(&ds) == 6);
  ct_pref_free(&ds);
  // max_prompt_length first, then max_length: "ghij" + completions cut to 2
  o.max_prompt_length = 4;
  CHECK_OK(ct_pref_load(&ds, write_file("g.jsonl",
           "{\"prompt\": \"abcdefghij\", \"chosen\": \"xyz\", \"rejected\": \"q\"}\n"), tok, &o));
  int p[] = {'g', 'h', 'i', 'j'};
  CHECK(ds.n == 1 && ds.n_truncated == 1);
  CHECK(same(P(&ds, 0), ds.p_len[0], p, 4) && same(C(&ds, 0), ds.c_len[0], c0, 2) &&
        same(R(&ds, 0), ds.r_len[0], r0, 2));
  ct_pref_free(&ds);
}

// Each malformed row must fail naming "file:line" and the key; with skip_bad_rows it is
// counted and the good row kept.
static void test_malformed_rows_name_file_line_and_key(void) {
  const char *user = "[{\"role\": \"user\", \"content\": \"q\"}]";
  const char *asst = "[{\"role\": \"assistant\", \"content\": \"a\"}]";
  char conv[8][256];
  snprintf(conv[0], sizeof conv[0], "{\"prompt\": %s, \"chosen\": [], \"rejected\": %s}", user, asst);
  snprintf(conv[1], sizeof conv[1], "{\"prompt\": %s, \"chosen\": %s, \"rejected\": []}", user, asst);
  snprintf(conv[2], sizeof conv[2], "{\"prompt\": %s, \"chosen\": [{\"role\": \"assistant\"}], \"rejected\": %s}",
           user, asst);
  snprintf(conv[3], sizeof conv[3], "{\"prompt\": %s, \"chosen\": \"a\", \"rejected\": %s}", user, asst);
  snprintf(conv[4], sizeof conv[4], "{\"prompt\": %s, \"chosen\": %s, \"rejected\": [5]}", user, asst);
  snprintf(conv[5], sizeof conv[5], "{\"prompt\": [{\"content\": \"q\"}], \"chosen\": %s, \"rejected\": %s}", asst,
           asst);
  char longp[256];
  snprintf(longp, sizeof longp, "{\"prompt\": \"%0*d\", \"chosen\": \"a\", \"rejected\": \"b\"}", 70, 0);
  char exactp[256];  // 64 prompt tokens leave no room within max_length 64
  snprintf(exactp, sizeof exactp, "{\"prompt\": \"%0*d\", \"chosen\": \"a\", \"rejected\": \"b\"}", 64, 0);
  struct { const char *row, *want, *want2; } cases[] = {
      {"{\"prompt\": \"a\", \"rejected\": \"b\"}", "key 'chosen'", "missing"},
      {"{\"prompt\": \"a\", \"chosen\": \"b\"}", "key 'rejected'", "missing"},
      {"{\"chosen\": \"a\", \"rejected\": \"b\"}", "key 'prompt'", "missing"},
      {"{\"prompt\": \"a\", \"chosen\": \"\", \"rejected\": \"b\"}", "key 'chosen'", "empty"},
      {"{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"\"}", "key 'rejected'", "empty"},
      {conv[0], "key 'chosen'", "empty"},
      {conv[1], "key 'rejected'", "empty"},
      {conv[2], "key 'chosen'", "content"},
      {conv[3], "'chosen'", "message lists"},
      {conv[4], "key 'rejected'", ""},
      {conv[5], "key 'prompt'", "role"},
      {"{\"prompt\": \"a\", \"chosen\": 5, \"rejected\": \"b\"}", "'chosen'", "three strings"},
      {"{\"prompt\": 5, \"chosen\": \"a\", \"rejected\": \"b\"}", "'prompt'", "three strings"},
      {"{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": null}", "'rejected'", "three strings"},
      {"[1, 2]", "expected a JSON object", ""},
      {"{\"prompt_input_ids\": [1], \"chosen_input_ids\": [2, 260], \"rejected_input_ids\": [3]}",
       "key 'chosen_input_ids'[1]", ""},
      {"{\"prompt_input_ids\": [1], \"chosen_input_ids\": [2], \"rejected_input_ids\": [-1]}",
       "key 'rejected_input_ids'[0]", ""},
      {"{\"prompt_input_ids\": [99999], \"chosen_input_ids\": [2], \"rejected_input_ids\": [3]}",
       "key 'prompt_input_ids'[0]", ""},
      {"{\"prompt_input_ids\": [1], \"chosen_input_ids\": [2.5], \"rejected_input_ids\": [3]}",
       "key 'chosen_input_ids'[0]", ""},
      {"{\"prompt_input_ids\": [1], \"chosen_input_ids\": \"ab\", \"rejected_input_ids\": [3]}",
       "key 'chosen_input_ids'", ""},
      {"{\"prompt_input_ids\": [1], \"rejected_input_ids\": [3]}", "key 'chosen_input_ids'", ""},
      {"{\"prompt_input_ids\": [1], \"chosen_input_ids\": [2]}", "key 'rejected_input_ids'", ""},
      {"{\"prompt_input_ids\": [1], \"chosen_input_ids\": [], \"rejected_input_ids\": [3]}", "'chosen'", ""},
      {"{\"prompt\": \"a\", \"chosen\": \"b\"", "invalid JSON", ""},
      {"{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\", \"chosen\": \"d\"}", "invalid JSON", ""},
      {longp, "prompt", "max_length"},
      {exactp, "prompt", "max_length"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char text[1024];
    snprintf(text, sizeof text, "{\"prompt\": \"p\", \"chosen\": \"c\", \"rejected\": \"r\"}\n%s\n", cases[i].row);
    const char *path = write_file("bad.jsonl", text);
    ct_pref_dataset ds;
    ct_pref_opts o = opts();
    int rc = ct_pref_load(&ds, path, tok, &o);
    char where[600];
    snprintf(where, sizeof where, "%s:2:", path);
    const char *msg = ct_last_error();
    int ok = rc == CT_EFORMAT && strstr(msg, where) && strstr(msg, cases[i].want) && strstr(msg, cases[i].want2);
    if (!ok)
      fprintf(stderr, "  case %zu (%s): rc %d, message '%s' lacks '%s', '%s' or '%s'\n", i, cases[i].row, rc, msg,
              where, cases[i].want, cases[i].want2);
    CHECK(ok);
    if (rc == 0) ct_pref_free(&ds);
    o.skip_bad_rows = true;
    CHECK_OK(ct_pref_load(&ds, path, tok, &o));
    CHECK(ds.n == 1 && ds.n_bad == 1 && ds.line[0] == 1 && ds.p_len[0] == 1);
    CHECK(strstr(ds.first_bad, where) && strstr(ds.first_bad, cases[i].want));
    ct_pref_free(&ds);
  }
}

static void test_skip_bad_rows_counts_every_bad_row_and_keeps_the_first_message(void) {
  ct_pref_dataset ds;
  ct_pref_opts o = opts();
  o.skip_bad_rows = true;
  const char *path = write_file("h.jsonl",
                                "{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\n"
                                "{\"prompt\": \"a\", \"rejected\": \"c\"}\n"
                                "not json\n"
                                "{\"prompt\": \"d\", \"chosen\": \"e\", \"rejected\": \"f\"}\n"
                                "{\"prompt\": \"a\", \"chosen\": \"\", \"rejected\": \"c\"}\n");
  CHECK_OK(ct_pref_load(&ds, path, tok, &o));
  CHECK(ds.n == 2 && ds.n_bad == 3 && ds.n_lines == 5);
  CHECK(ds.line[0] == 1 && ds.line[1] == 4 && P(&ds, 1)[0] == 'd');
  char where[600];
  snprintf(where, sizeof where, "%s:2:", path);
  CHECK(strstr(ds.first_bad, where) && strstr(ds.first_bad, "key 'chosen'"));
  ct_pref_free(&ds);
}

static void test_all_bad_empty_and_missing_files_fail_clearly(void) {
  ct_pref_dataset ds;
  ct_pref_opts o = opts();
  o.skip_bad_rows = true;
  CHECK(ct_pref_load(&ds, write_file("i.jsonl", "{\"prompt\": \"a\"}\n[]\n"), tok, &o) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "no usable preference pairs") != NULL);
  CHECK(strstr(ct_last_error(), "i.jsonl") != NULL);
  CHECK(ct_pref_load(&ds, write_file("j.jsonl", "\n  \n"), tok, &o) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "no usable preference pairs") != NULL);
  CHECK(ct_pref_load(&ds, "/nonexistent/prefs.jsonl", tok, &o) == CT_EIO);
  CHECK(strstr(ct_last_error(), "/nonexistent/prefs.jsonl") != NULL);
  // a NUL byte inside a line is an error, not a silently shortened row
  o.skip_bad_rows = false;
  char path[512];
  snprintf(path, sizeof path, "%s/nul.jsonl", scratch_dir);
  FILE *f = fopen(path, "w");
  const char row[] = "{\"prompt\": \"a\0b\", \"chosen\": \"c\", \"rejected\": \"d\"}\n";
  fwrite(row, 1, sizeof row - 1, f);
  fclose(f);
  CHECK(ct_pref_load(&ds, path, tok, &o) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), ":1:") && strstr(ct_last_error(), "NUL"));
}

// Pair and prompt ids past the tokenizer's size: both sizes named, the tokenizer's used.
static void test_token_id_errors_name_tokenizer_and_model_sizes(void) {
  ct_pref_dataset ds;
  ct_pref_opts o = opts();
  o.model_vocab = 70000;
  char size[64];
  snprintf(size, sizeof size, "the tokenizer's %d tokens", ct_tokenizer_vocab_size(tok));
  ct_set_error(CT_OK, "%s", "");  // a stale message cannot satisfy the check below
  CHECK(ct_pref_load(&ds, write_file("ids.jsonl", "{\"prompt_input_ids\": [1], \"chosen_input_ids\": [2], "
                                     "\"rejected_input_ids\": [65000]}\n"), tok, &o) == CT_EFORMAT);
  const char *e = ct_last_error();
  CHECK(strstr(e, "ids.jsonl:1: key 'rejected_input_ids'[0]: token id 65000") && strstr(e, size) &&
        strstr(e, "model's vocab_size is 70000") && strstr(e, "checked against the tokenizer"));
  ct_prompt_opts po = {true, 0, false, "max_prompt_length", 70000, false, NULL, false};
  json_t *row = json_loads("{\"prompt_input_ids\": [3, 65001]}", 0, NULL);
  ct_ids ids = {0};
  ct_set_error(CT_OK, "%s", "");
  CHECK(ct_prompt_tokens(tok, row, "p.jsonl:4", &po, &ids) == CT_EFORMAT);
  e = ct_last_error();
  CHECK(strstr(e, "p.jsonl:4: key 'prompt_input_ids'[1]: token id 65001") && strstr(e, size) &&
        strstr(e, "model's vocab_size is 70000"));
  ct_ids_free(&ids);
  json_decref(row);
}

// GRPO/sampler prompts: ShareGPT conversations read as messages, an Alpaca instruction
// (+ "\n" input) as the user turn; the row keeps "output" for answer_field=output.
static void test_prompts_accept_sharegpt_and_alpaca_rows(void) {
  const char *rows[][2] = {
      {"{\"conversations\": [{\"from\": \"human\", \"value\": \"2+2?\"}]}",
       "{\"messages\": [{\"role\": \"user\", \"content\": \"2+2?\"}]}"},
      {"{\"instruction\": \"Add.\", \"input\": \"2 2\", \"output\": \"4\"}",
       "{\"prompt\": [{\"role\": \"user\", \"content\": \"Add.\\n2 2\"}]}"},
  };
  ct_prompt_opts po = {true, 0, false, "max_prompt_length", 0, false, NULL, false};
  for (int k = 0; k < 2; k++) {
    json_t *a = json_loads(rows[k][0], 0, NULL), *b = json_loads(rows[k][1], 0, NULL);
    ct_ids ia = {0}, ib = {0};
    CHECK_OK(ct_prompt_tokens(tok, a, "a:1", &po, &ia));
    CHECK_OK(ct_prompt_tokens(tok, b, "b:1", &po, &ib));
    CHECK(ia.n > 0 && same(ia.v, ia.n, ib.v, ib.n));
    ct_ids_free(&ia);
    ct_ids_free(&ib);
    json_decref(a);
    json_decref(b);
  }
  json_t *bad = json_loads("{\"instruction\": 7}", 0, NULL);
  ct_ids ids = {0};
  CHECK(ct_prompt_tokens(tok, bad, "p.jsonl:3", &po, &ids) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "p.jsonl:3: key 'instruction'") != NULL);
  ct_ids_free(&ids);
  json_decref(bad);
}

// Loads one pair from each text; true when both give the same prompt/chosen/rejected tokens.
static int same_pair(const char *implicit, const char *explicit_) {
  ct_pref_dataset a, b;
  ct_pref_opts o = opts();
  if (ct_pref_load(&a, write_file("imp.jsonl", implicit), tok, &o)) {
    fprintf(stderr, "  %s\n", ct_last_error());
    return 0;
  }
  CHECK_OK(ct_pref_load(&b, write_file("exp.jsonl", explicit_), tok, &o));
  int ok = a.n == 1 && b.n == 1 && same(P(&a, 0), a.p_len[0], P(&b, 0), b.p_len[0]) &&
           same(C(&a, 0), a.c_len[0], C(&b, 0), b.c_len[0]) && same(R(&a, 0), a.r_len[0], R(&b, 0), b.r_len[0]);
  ct_pref_free(&a);
  ct_pref_free(&b);
  return ok;
}

// TRL's implicit prompt: rows with chosen/rejected and no prompt take their shared start.
static void test_implicit_prompt_is_the_shared_start_as_trl_extracts_it(void) {
  // strings: to the first differing character, the space before it going to the completions
  CHECK(same_pair("{\"chosen\": \"The sky is blue.\", \"rejected\": \"The sky is green.\"}\n",
                  "{\"prompt\": \"The sky is\", \"chosen\": \" blue.\", \"rejected\": \" green.\"}\n"));
  // compared by code point: é and è share their first byte
  CHECK(same_pair("{\"chosen\": \"Q: \u00e91\", \"rejected\": \"Q: \u00e82\"}\n",
                  "{\"prompt\": \"Q:\", \"chosen\": \" \u00e91\", \"rejected\": \" \u00e82\"}\n"));
  // one a prefix of the other: TRL's loop ends on the last shared character
  CHECK(same_pair("{\"chosen\": \"abc\", \"rejected\": \"abcd\"}\n",
                  "{\"prompt\": \"ab\", \"chosen\": \"c\", \"rejected\": \"cd\"}\n"));
  // conversations: the longest common run of whole messages
  const char *u = "{\"role\": \"user\", \"content\": \"Sky?\"}", *a1 = "{\"role\": \"assistant\", \"content\": \"Blue.\"}",
             *a2 = "{\"role\": \"assistant\", \"content\": \"Green.\"}";
  char imp[600], exp[600];
  snprintf(imp, sizeof imp, "{\"chosen\": [%s, %s], \"rejected\": [%s, %s]}\n", u, a1, u, a2);
  snprintf(exp, sizeof exp, "{\"prompt\": [%s], \"chosen\": [%s], \"rejected\": [%s]}\n", u, a1, a2);
  CHECK(same_pair(imp, exp));
  // a string prompt beside conversations is ignored, as TRL's maybe_extract_prompt does
  snprintf(imp, sizeof imp, "{\"prompt\": \"Sky?\", \"chosen\": [%s, %s], \"rejected\": [%s, %s]}\n", u, a1, u, a2);
  CHECK(same_pair(imp, exp));
  ct_pref_dataset ds;
  ct_pref_opts o = opts();
  ct_set_error(CT_OK, "%s", "");  // a stale message cannot satisfy the check below
  CHECK(ct_pref_load(&ds, write_file("none.jsonl", "{\"chosen\": \"yes\", \"rejected\": \"no\"}\n"), tok, &o) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "none.jsonl:1: key 'prompt' is missing") && strstr(ct_last_error(), "share no start"));
  CHECK(ct_pref_load(&ds, write_file("mix.jsonl", "{\"chosen\": \"yes\", \"rejected\": [1]}\n"), tok, &o) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "mix.jsonl:1: keys 'chosen' and 'rejected'") != NULL);
}

// A tokenizer that adds BOS (Llama-style): the prompt starts with exactly one BOS, also
// when its text already begins with the BOS string; completions get none.
static void test_bos_tokenizer_prepends_one_bos_to_the_prompt_only(void) {
  char tdir[300], cfg[400];
  snprintf(tdir, sizeof tdir, "%s/bos_tok", scratch_dir);
  snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", tdir);
  CHECK(mkdir(tdir, 0700) == 0);
  CHECK_OK(ct_tokenizer_save(tok, tdir));
  FILE *f = fopen(cfg, "r");
  char text[1 << 14];
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  if (f) fclose(f);
  text[n] = 0;
  char *at = strstr(text, "\"add_bos_token\": false");
  CHECK(at != NULL);
  if (!at) return;
  f = fopen(cfg, "w");
  fprintf(f, "%.*s\"add_bos_token\": true%s", (int)(at - text), text, at + strlen("\"add_bos_token\": false"));
  fclose(f);
  ct_tokenizer *bt;
  CHECK_OK(ct_tokenizer_load(&bt, tdir));
  CHECK(ct_tokenizer_add_bos(bt) && ct_tokenizer_bos(bt) == EOS);
  int BOS = ct_tokenizer_bos(bt);
  ct_pref_dataset ds;
  ct_pref_opts o = opts();
  CHECK_OK(ct_pref_load(&ds, write_file("bos.jsonl",
           "{\"prompt\": \"hi\", \"chosen\": \"a\", \"rejected\": \"b\"}\n"
           "{\"prompt\": \"<|endoftext|>hi\", \"chosen\": \"a\", \"rejected\": \"b\"}\n"), bt, &o));
  int p[] = {BOS, 'h', 'i'}, c[] = {'a', EOS}, r[] = {'b', EOS};
  CHECK(ds.n == 2);
  for (int k = 0; k < ds.n; k++)
    CHECK(same(P(&ds, k), ds.p_len[k], p, 3) && same(C(&ds, k), ds.c_len[k], c, 2) &&
          same(R(&ds, k), ds.r_len[k], r, 2));
  ct_pref_free(&ds);
  // GRPO and the sampler read prompts the same way: one BOS, whether the text has it or not
  ct_prompt_opts po = {true, 0, false, "max_prompt_length", 0, false, NULL, false};
  const char *texts[] = {"hi", "<|endoftext|>hi"};
  for (int k = 0; k < 2; k++) {
    json_t *row = json_pack("{s:s}", "prompt", texts[k]);
    ct_ids ids = {0};
    CHECK_OK(ct_prompt_tokens(bt, row, "test:1", &po, &ids));
    CHECK(same(ids.v, ids.n, p, 3));
    ct_ids_free(&ids);
    json_decref(row);
  }
  ct_tokenizer_free(bt);
}

// Preference pairs and prompts (GRPO, the sampler) pass a row's tools and
// chat_template_kwargs to the template too.
static void test_pairs_and_prompts_pass_tools_and_template_kwargs(void) {
  ct_tokenizer *t = tools_tokenizer();
  const char *row = "{\"prompt\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                    "\"chosen\": [{\"role\": \"assistant\", \"content\": \"a\"}], "
                    "\"rejected\": [{\"role\": \"assistant\", \"content\": \"b\"}], "
                    "\"tools\": [{\"name\": \"calc\"}], \"chat_template_kwargs\": {\"flag\": 1}}";
  char line[1024];
  snprintf(line, sizeof line, "%s\n", row);
  ct_pref_dataset ds;
  ct_pref_opts o = opts();
  CHECK_OK(ct_pref_load(&ds, write_file("tools.jsonl", line), t, &o));
  char *text;
  size_t len;
  CHECK(ds.n == 1);
  CHECK_OK(ct_tokenizer_decode(t, P(&ds, 0), ds.p_len[0], &text, &len));
  CHECK(strstr(text, "[calc]<flag>hi;") != NULL);
  free(text);
  CHECK_OK(ct_tokenizer_decode(t, C(&ds, 0), ds.c_len[0], &text, &len));
  CHECK(!strcmp(text, "a;"));
  free(text);
  ct_pref_free(&ds);
  json_t *j = json_loads(row, 0, NULL);
  ct_prompt_opts po = {true, 0, false, "max_prompt_length", 0, false, NULL, false};
  ct_ids ids = {0};
  CHECK_OK(ct_prompt_tokens(t, j, "test:1", &po, &ids));
  CHECK_OK(ct_tokenizer_decode(t, ids.v, ids.n, &text, &len));
  CHECK(strstr(text, "[calc]<flag>hi;") != NULL);
  free(text);
  ct_ids_free(&ids);
  // a wrong type is refused naming the key
  json_object_set_new(j, "tools", json_string("calc"));
  ct_ids_free(&ids);
  CHECK(ct_prompt_tokens(t, j, "test:1", &po, &ids) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "test:1") && strstr(ct_last_error(), "key 'tools'"));
  ct_ids_free(&ids);
  json_decref(j);
  ct_tokenizer_free(t);
}

// A pair whose prompt has no tokens (an empty prompt string or prompt_input_ids [], and no
// BOS) leaves nothing to predict its first completion token: that token is silently not
// scored, and a one-token completion gets no target at all (the trainer then divides by a
// length of 0). Either the row is refused naming 'prompt', or every completion token of
// every loaded pair has a target.
static void test_every_completion_token_is_predicted_even_with_an_empty_prompt(void) {
  const char *rows[] = {
      "{\"prompt\": \"\", \"chosen\": \"a\", \"rejected\": \"bc\"}\n",
      "{\"prompt_input_ids\": [], \"chosen_input_ids\": [5], \"rejected_input_ids\": [6, 7]}\n",
  };
  for (int i = 0; i < 2; i++) {
    const char *path = write_file("emptyp.jsonl", rows[i]);
    ct_pref_dataset ds;
    ct_pref_opts o = opts();
    int rc = ct_pref_load(&ds, path, tok, &o);
    if (rc) {
      char where[600];
      snprintf(where, sizeof where, "%s:1:", path);
      CHECK(rc == CT_EFORMAT && strstr(ct_last_error(), where) && strstr(ct_last_error(), "prompt"));
      continue;
    }
    ct_batch b;
    CHECK_OK(ct_batch_init(&b, 2, ct_pref_max_len(&ds)));
    int k = 0;
    ct_pref_batch(&b, &ds, &k, 1, PAD);
    if (b.n_target != ds.c_len[0] + ds.r_len[0])
      fprintf(stderr, "  row %d: prompt %d tokens, completions %d + %d tokens, %ld targets\n", i, ds.p_len[0],
              ds.c_len[0], ds.r_len[0], b.n_target);
    CHECK(b.n_target == ds.c_len[0] + ds.r_len[0]);
    ct_batch_free(&b);
    ct_pref_free(&ds);
  }
}


// KTO's unpaired rows: the label kept, one completion (with EOS), the KL rows of a batch the
// prompt of example i with example i − 1's completion (the first with the last), cut to
// max_length; a file of pairs unpaired as TRL's unpair_preference_dataset orders it; bad rows.
static void test_unpaired_rows_their_kl_rows_and_unpaired_pairs(void) {
  ct_pref_dataset ds;
  ct_pref_opts o = opts();
  o.unpaired = true;
  o.max_length = 9;
  CHECK_OK(ct_pref_load(&ds, write_file("u.jsonl",
           "{\"prompt\": \"ab\", \"completion\": \"cde\", \"label\": true}\n"
           "{\"prompt\": \"fghij\", \"completion\": \"k\", \"label\": false}\n"
           "{\"prompt\": \"l\", \"completion\": \"mnopqr\", \"label\": true}\n"), tok, &o));
  CHECK(ds.n == 3 && ds.label && ds.label[0] == 1 && ds.label[1] == 0 && ds.label[2] == 1);
  CHECK(ds.r_len[0] == 0 && ds.c_len[0] == 4 && C(&ds, 0)[3] == EOS);
  CHECK(ct_pref_max_len(&ds) == 9);  // 5 + 7 capped by max_length
  ct_batch b;
  CHECK_OK(ct_batch_init(&b, 6, ct_pref_max_len(&ds)));
  int rows[3] = {0, 1, 2};
  ct_pref_batch_unpaired(&b, &ds, rows, 3, true, PAD);
  CHECK(b.B == 6 && b.T == 9);
  for (int i = 0; i < 3; i++) {
    int k = rows[i], j = rows[(i + 2) % 3], nk = ds.c_len[j];
    if (ds.p_len[k] + nk > 9) nk = 9 - ds.p_len[k];
    CHECK(b.row_seq[i] == k && b.row_seq[3 + i] == k);
    check_row(&b, i, P(&ds, k), ds.p_len[k], C(&ds, k), ds.c_len[k]);
    check_row(&b, 3 + i, P(&ds, k), ds.p_len[k], C(&ds, j), nk);  // "fghij" + "mnop" (cut), ...
  }
  ct_pref_batch_unpaired(&b, &ds, rows, 2, false, PAD);  // apo_zero_unpaired: no KL rows
  CHECK(b.B == 2 && b.T == 7);  // "fghij" + "k" + EOS
  check_row(&b, 1, P(&ds, 1), 5, C(&ds, 1), 2);
  ct_batch_free(&b);
  ct_pref_free(&ds);
  // pairs: the chosen answers of the block first, then the rejected ones (TRL's order)
  o.max_length = 64;
  CHECK_OK(ct_pref_load(&ds, write_file("p.jsonl",
           "{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\n"
           "{\"prompt\": \"d\", \"chosen\": \"e\", \"rejected\": \"f\"}\n"), tok, &o));
  CHECK(ds.n == 4 && ds.label[0] == 1 && ds.label[1] == 1 && ds.label[2] == 0 && ds.label[3] == 0);
  int order[4] = {'b', 'e', 'c', 'f'};
  for (int k = 0; k < 4; k++) CHECK(ds.p_len[k] == 1 && ds.c_len[k] == 2 && C(&ds, k)[0] == order[k]);
  CHECK(P(&ds, 2)[0] == 'a' && P(&ds, 3)[0] == 'd' && ds.line[3] == 2);
  ct_pref_free(&ds);
  // bad rows name the file, the line and the key
  const char *bad[][2] = {
      {"{\"prompt\": \"a\", \"completion\": \"b\", \"label\": 1}\n", "u1.jsonl:1: key 'label': expected true or false"},
      {"{\"prompt\": \"a\", \"label\": true}\n", "u1.jsonl:1: key 'completion' is missing"},
      {"{\"completion\": \"a\", \"label\": true}\n", "u1.jsonl:1: key 'prompt' is missing"},
      {"{\"prompt\": \"a\", \"completion\": \"\", \"label\": true}\n", "u1.jsonl:1: key 'completion': the completion is empty"},
      {"{\"prompt\": \"a\", \"completion\": \"b\", \"label\": true}\n{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\n",
       "u1.jsonl:2: a paired row in a file of unpaired rows"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK(ct_pref_load(&ds, write_file("u1.jsonl", bad[i][0]), tok, &o) == CT_EFORMAT);
    if (!strstr(ct_last_error(), bad[i][1])) fprintf(stderr, "  got: %s\n  want: %s\n", ct_last_error(), bad[i][1]);
    CHECK(strstr(ct_last_error(), bad[i][1]) != NULL);
  }
}

int main(void) {
  if (scratch_make("/tmp/ct_test_prefs_XXXXXX") || ct_tokenizer_bytes(&tok)) return 1;
  EOS = ct_tokenizer_eos(tok);
  PAD = ct_tokenizer_pad(tok);
  IM_START = ct_tokenizer_token_id(tok, "<|im_start|>");
  IM_END = ct_tokenizer_token_id(tok, "<|im_end|>");
  if (EOS < 256 || PAD < 256 || IM_START < 256 || IM_END < 256 || ct_tokenizer_add_bos(tok)) return 1;
  RUN(test_string_rows_tokenize_prompt_and_completions_separately_with_eos);
  RUN(test_batch_puts_chosen_rows_first_and_targets_only_completion_tokens);
  RUN(test_conversational_rows_split_completion_off_the_rendered_prompt);
  RUN(test_pretokenized_rows_are_used_as_given_without_eos);
  RUN(test_max_prompt_length_keeps_the_last_prompt_tokens);
  RUN(test_max_completion_length_keeps_the_first_completion_tokens);
  RUN(test_max_length_cuts_completions_so_prompt_and_completion_fit);
  RUN(test_malformed_rows_name_file_line_and_key);
  RUN(test_skip_bad_rows_counts_every_bad_row_and_keeps_the_first_message);
  RUN(test_all_bad_empty_and_missing_files_fail_clearly);
  RUN(test_token_id_errors_name_tokenizer_and_model_sizes);
  RUN(test_prompts_accept_sharegpt_and_alpaca_rows);
  RUN(test_implicit_prompt_is_the_shared_start_as_trl_extracts_it);
  RUN(test_bos_tokenizer_prepends_one_bos_to_the_prompt_only);
  RUN(test_pairs_and_prompts_pass_tools_and_template_kwargs);
  RUN(test_every_completion_token_is_predicted_even_with_an_empty_prompt);
  RUN(test_unpaired_rows_their_kl_rows_and_unpaired_pairs);
  ct_tokenizer_free(tok);
  if (scratch_remove()) return 1;
  return test_summary();
}
