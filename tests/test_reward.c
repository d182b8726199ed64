// reward: the built-in GRPO rewards (accuracy exact and numeric, format, length), option
// checks that name the option, and the remote reward client against
// $CT_BIN/ctune-reward-server in each of its modes: right rewards, retries, bounded time
// on a slow server, clear errors (HTTP 500, malformed JSON, closed connection, wrong
// count, bad or non-finite rewards (Python's bare NaN and Infinity too), refused
// connection, TLS to a plain-HTTP server),
// NaN rewards when failure_nan is set, and the API key: sent as a bearer token, HTTP 401
// without it, and never in a message.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "error.h"
#include "grpo/rewards.h"
#include "test.h"

// ---------------------------------------------------------------------------------------
// helpers

static ct_reward *make(int kind, ct_reward_opts o) {
  ct_reward *r = NULL;
  CHECK_OK(ct_reward_init(&r, kind, &o));
  return r;
}

// The reward of one completion against a row given as JSON text (NULL: no row).
static double score1(ct_reward *r, const char *completion, const char *row_json) {
  json_t *row = row_json ? json_loads(row_json, 0, NULL) : NULL;
  CHECK(!row_json || row);
  ct_reward_item it = {.prompt = "Q: ", .completion = completion, .row = row};
  double x = -123;
  CHECK_OK(ct_reward_score(r, &it, 1, &x));
  json_decref(row);
  return x;
}

static int init_fails(int kind, ct_reward_opts o, int code, const char *want1,
                      const char *want2) {
  ct_reward *r = (ct_reward *)1;
  int rc = ct_reward_init(&r, kind, &o);
  const char *msg = ct_last_error();
  int ok = rc == code && r == NULL && strstr(msg, want1) && (!want2 || strstr(msg, want2));
  if (!ok) fprintf(stderr, "  rc %d, message: %s\n", rc, msg);
  return ok;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---------------------------------------------------------------------------------------
// accuracy

static void test_accuracy_exact_compares_the_trimmed_completion(void) {
  ct_reward *r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_field = "answer"});
  CHECK(score1(r, "  42 \n", "{\"answer\": \"42\"}") == 1);
  CHECK(score1(r, "42", "{\"answer\": \" 42\\n\"}") == 1);
  CHECK(score1(r, "43", "{\"answer\": \"42\"}") == 0);
  CHECK(score1(r, "the answer is 42", "{\"answer\": \"42\"}") == 0);
  CHECK(score1(r, "42.0", "{\"answer\": \"42\"}") == 0);  // strings, not numbers
  CHECK(score1(r, "", "{\"answer\": \"\"}") == 1);
  ct_reward_free(r);
}

static void test_accuracy_missing_or_ill_typed_answer_is_nan(void) {
  ct_reward *r = make(CT_REWARD_ACCURACY, (ct_reward_opts){0});  // field defaults to "answer"
  CHECK(isnan(score1(r, "42", "{\"solution\": \"42\"}")));
  CHECK(isnan(score1(r, "42", "{\"answer\": null}")));
  CHECK(isnan(score1(r, "true", "{\"answer\": true}")));
  CHECK(isnan(score1(r, "42", "{\"answer\": [42]}")));
  CHECK(isnan(score1(r, "42", "[\"answer\"]")));
  CHECK(isnan(score1(r, "42", NULL)));
  CHECK(isnan(score1(r, NULL, "{\"answer\": \"42\"}")));
  CHECK(score1(r, "42", "{\"answer\": \"42\"}") == 1);
  ct_reward_free(r);
  r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_field = "solution"});
  CHECK(score1(r, "42", "{\"solution\": \"42\"}") == 1);
  CHECK(isnan(score1(r, "42", "{\"answer\": \"42\"}")));
  ct_reward_free(r);
}

static void test_accuracy_numeric_answer_field_is_compared_as_its_text(void) {
  ct_reward *r = make(CT_REWARD_ACCURACY, (ct_reward_opts){0});
  CHECK(score1(r, "42", "{\"answer\": 42}") == 1);
  CHECK(score1(r, "-7", "{\"answer\": -7}") == 1);
  CHECK(score1(r, "0.1", "{\"answer\": 0.1}") == 1);  // shortest text, not 0.1000000000000000055
  CHECK(score1(r, "2.5", "{\"answer\": 2.5}") == 1);
  CHECK(score1(r, "42.0", "{\"answer\": 42}") == 0);
  ct_reward_free(r);
}

static void test_accuracy_regex_takes_the_last_match(void) {
  ct_reward *r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "[0-9]+"});
  CHECK(score1(r, "3 apples and 4 pears make 7", "{\"answer\": \"7\"}") == 1);
  CHECK(score1(r, "3 apples and 4 pears make 7", "{\"answer\": \"3\"}") == 0);
  CHECK(score1(r, "no digits here", "{\"answer\": \"7\"}") == 0);      // no match: 0
  ct_reward_free(r);
}

static void test_accuracy_regex_uses_the_first_group_else_the_whole_match(void) {
  ct_reward *g = make(CT_REWARD_ACCURACY,
                      (ct_reward_opts){.answer_regex = "<answer>([^<]*)</answer>"});
  ct_reward *w = make(CT_REWARD_ACCURACY,
                      (ct_reward_opts){.answer_regex = "<answer>[^<]*</answer>"});
  const char *c = "<think>maybe <answer>5</answer>?</think> <answer> 6 </answer>";
  CHECK(score1(g, c, "{\"answer\": \"6\"}") == 1);  // the group, trimmed, of the last match
  CHECK(score1(g, c, "{\"answer\": \"5\"}") == 0);
  CHECK(score1(w, c, "{\"answer\": \"6\"}") == 0);
  CHECK(score1(w, c, "{\"answer\": \"<answer> 6 </answer>\"}") == 1);
  // a group that does not take part in the match is an empty answer
  ct_reward *opt = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "=(x)?"});
  CHECK(score1(opt, "a=", "{\"answer\": \"\"}") == 1);
  CHECK(score1(opt, "a=x", "{\"answer\": \"x\"}") == 1);
  ct_reward_free(g);
  ct_reward_free(w);
  ct_reward_free(opt);
}

static void test_accuracy_regex_anchors_and_empty_matches_behave(void) {
  // ^ still means the start of the completion on later matches
  ct_reward *r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "^([0-9]+)"});
  CHECK(score1(r, "12 and 34", "{\"answer\": \"12\"}") == 1);
  ct_reward_free(r);
  // a regex that matches the empty string ends (last match: the empty one at the end)
  r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "[0-9]*"});
  CHECK(score1(r, "ab 12", "{\"answer\": \"12\"}") == 0);
  CHECK(score1(r, "ab 12", "{\"answer\": \"\"}") == 1);
  CHECK(score1(r, "", "{\"answer\": \"\"}") == 1);
  ct_reward_free(r);
}

static void test_accuracy_numeric_ignores_commas_and_tolerates_1e6_relative(void) {
  ct_reward *r = make(CT_REWARD_ACCURACY,
                      (ct_reward_opts){.numeric = true, .answer_regex = "(-?[0-9][0-9,.]*)"});
  CHECK(score1(r, "so the total is 1,234.", "{\"answer\": \"1234\"}") == 1);
  CHECK(score1(r, "1234", "{\"answer\": \"1,234.00\"}") == 1);
  CHECK(score1(r, "1234", "{\"answer\": 1234}") == 1);
  CHECK(score1(r, "first 1 then 2", "{\"answer\": 2}") == 1);
  CHECK(score1(r, "first 1 then 2", "{\"answer\": 1}") == 0);
  CHECK(score1(r, "1000000.5", "{\"answer\": 1000000}") == 1);  // |diff| <= 1e-6 * 1e6
  CHECK(score1(r, "1000001.5", "{\"answer\": 1000000}") == 0);
  CHECK(score1(r, "0.0000005", "{\"answer\": 0}") == 1);  // max(1, |b|): absolute near 0
  CHECK(score1(r, "0.000002", "{\"answer\": 0}") == 0);
  CHECK(score1(r, "-3.5", "{\"answer\": \"-3.50\"}") == 1);
  CHECK(score1(r, "no number", "{\"answer\": 3}") == 0);
  CHECK(score1(r, "1.2.3", "{\"answer\": 3}") == 0);           // unparsable: 0
  CHECK(isnan(score1(r, "3", "{\"answer\": \"three\"}")));     // answer unparsable: NaN
  CHECK(isnan(score1(r, "3", "{\"answer\": \"inf\"}")));
  CHECK(isnan(score1(r, "3", "{\"missing\": 3}")));
  ct_reward_free(r);
  // without a regex the whole trimmed completion must be the number
  r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.numeric = true});
  CHECK(score1(r, " 2,500 \n", "{\"answer\": 2500}") == 1);
  CHECK(score1(r, "2500 apples", "{\"answer\": 2500}") == 0);
  CHECK(score1(r, "nan", "{\"answer\": 2500}") == 0);
  ct_reward_free(r);
}

// ---------------------------------------------------------------------------------------
// format and length

static void test_format_is_one_when_the_regex_matches_anywhere(void) {
  // as Python's re.search: '.' stops at a newline unless the pattern says (?s)
  ct_reward *r = make(CT_REWARD_FORMAT,
      (ct_reward_opts){.format_regex = "(?s)^<think>.*</think>[^<]*<answer>.+</answer>$"});
  CHECK(score1(r, "<think>a\nb</think>\n<answer>42</answer>", NULL) == 1);
  CHECK(score1(r, "<answer>42</answer>", NULL) == 0);
  CHECK(score1(r, "", NULL) == 0);
  CHECK(strcmp(ct_reward_name(r), "format") == 0);
  ct_reward_free(r);
  r = make(CT_REWARD_FORMAT, (ct_reward_opts){.format_regex = "[0-9]+"});
  CHECK(score1(r, "the answer is 7, I think", NULL) == 1);
  CHECK(score1(r, "seven", NULL) == 0);
  ct_reward_free(r);
  r = make(CT_REWARD_FORMAT,
           (ct_reward_opts){.format_regex = "^<think>.*</think>[^<]*<answer>.+</answer>$"});
  CHECK(score1(r, "<think>a\nb</think>\n<answer>42</answer>", NULL) == 0);
  CHECK(score1(r, "<think>ab</think>\n<answer>42</answer>", NULL) == 1);
  ct_reward_free(r);
  // (?m): ^ at every line; \s \d; a completion cut inside a character still matches
  r = make(CT_REWARD_FORMAT, (ct_reward_opts){.format_regex = "(?m)^Answer:\\s\\d+$"});
  CHECK(score1(r, "work\nAnswer: 12\nbye", NULL) == 1);
  CHECK(score1(r, "\xff\xc3 work\nAnswer:\t7", NULL) == 1);
  CHECK(score1(r, "work Answer: 12", NULL) == 0);
  ct_reward_free(r);
}

// answer_regex is Python's re: what TRL users write matches what it matches in Python.
static void test_regex_is_pythons_re(void) {
  ct_reward *r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "answer is (\\d+)"});
  CHECK(score1(r, "I think the answer is 12, no, the answer is 42.", "{\"answer\": \"42\"}") == 1);
  CHECK(score1(r, "the answer is forty-two", "{\"answer\": \"42\"}") == 0);
  CHECK(score1(r, "the answer is \xd9\xa3", "{\"answer\": \"\xd9\xa3\"}") == 1);  // \d: Unicode digits
  ct_reward_free(r);
  r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "total:\\s(\\S+)"});
  CHECK(score1(r, "total:\n9", "{\"answer\": \"9\"}") == 1);  // \s takes a newline
  ct_reward_free(r);
  // non-greedy: the last <a>...</a>; greedy: from the first <a> to the last </a>
  ct_reward *lazy = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "<a>(.*?)</a>"});
  ct_reward *greedy = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "<a>(.*)</a>"});
  CHECK(score1(lazy, "<a>1</a> and <a>2</a>", "{\"answer\": \"2\"}") == 1);
  CHECK(score1(greedy, "<a>1</a> and <a>2</a>", "{\"answer\": \"1</a> and <a>2\"}") == 1);
  // '.' stops at a newline, as in Python: "#### (.*)" takes the rest of the line
  ct_reward *hash = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "#### (.*)"});
  CHECK(score1(hash, "#### 42\nthanks", "{\"answer\": \"42\"}") == 1);
  ct_reward_free(lazy);
  ct_reward_free(greedy);
  ct_reward_free(hash);
  // named groups: (?P<name>...) is a group; one named "answer" is the answer
  r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "(?P<n>\\d+)"});
  CHECK(score1(r, "x 5 y 6", "{\"answer\": \"6\"}") == 1);
  ct_reward_free(r);
  r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "(?P<unit>[a-z]+)=(?P<answer>\\d+)"});
  CHECK(score1(r, "kg=5", "{\"answer\": \"5\"}") == 1);
  CHECK(score1(r, "kg=5", "{\"answer\": \"kg\"}") == 0);
  ct_reward_free(r);
  // UTF-8: \w spans multibyte letters; the empty matches of [0-9]* step by characters
  r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "\xe7\xad\x94\xe3\x81\x88\xef\xbc\x9a(\\w+)"});
  CHECK(score1(r, "\xe7\xad\x94\xe3\x81\x88\xef\xbc\x9a\xe6\x9d\xb1\xe4\xba\xac \xe3\x80\x82",
               "{\"answer\": \"\xe6\x9d\xb1\xe4\xba\xac\"}") == 1);
  ct_reward_free(r);
  r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "[0-9]*"});
  CHECK(score1(r, "\xc3\xa9" "1", "{\"answer\": \"\"}") == 1);
  ct_reward_free(r);
  r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "(?i)ANSWER: (\\w+)"});
  CHECK(score1(r, "answer: caf\xc3\xa9", "{\"answer\": \"caf\xc3\xa9\"}") == 1);
  ct_reward_free(r);
  // \Z is the end of the text (PCRE2's own \Z also matches before a final newline);
  // after an escaped backslash it is left alone ([\\Z] is an error in both)
  r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "(\\d+)\\Z"});
  CHECK(score1(r, "it is 7", "{\"answer\": \"7\"}") == 1);
  CHECK(score1(r, "it is 7\n", "{\"answer\": \"7\"}") == 0);  // Python: re.search(r'(\d+)\Z', 'it is 7\n') is None
  ct_reward_free(r);
  r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "(\\\\Z)"});  // a backslash, then Z
  CHECK(score1(r, "a\\Zb", "{\"answer\": \"\\\\Z\"}") == 1);
  ct_reward_free(r);
}

static void test_length_penalizes_distance_from_the_target_in_bytes(void) {
  ct_reward *r = make(CT_REWARD_LENGTH, (ct_reward_opts){.target_length = 10});
  CHECK_NEAR(score1(r, "hello", NULL), -0.5, 1e-12);
  CHECK_NEAR(score1(r, "0123456789", NULL), 0.0, 1e-12);
  CHECK_NEAR(score1(r, "0123456789012345678901234", NULL), -1.5, 1e-12);
  CHECK_NEAR(score1(r, "", NULL), -1.0, 1e-12);
  CHECK_NEAR(score1(r, "\xc3\xa9", NULL), -0.8, 1e-12);  // "é" is 2 bytes
  CHECK(isnan(score1(r, NULL, NULL)));
  ct_reward_free(r);
}

// DAPO's soft overlong punishment as TRL's get_soft_overlong_punishment(100, 20) computes it:
// 0 up to 80 tokens, (80 − n) / 20 from 81 to 100 (its docstring's 90 tokens: −0.5), −1 past.
static void test_overlong_is_trls_soft_punishment(void) {
  ct_reward *r = make(CT_REWARD_OVERLONG, (ct_reward_opts){.overlong_max_len = 100, .overlong_buffer = 20});
  int n[] = {0, 1, 79, 80, 81, 90, 99, 100, 101, 150};
  for (size_t i = 0; i < sizeof n / sizeof *n; i++) {
    ct_reward_item it = {.completion = "", .completion_tokens = n[i]};
    double out, want = n[i] <= 80 ? 0.0 : n[i] <= 100 ? (80.0 - n[i]) / 20.0 : -1.0;
    CHECK_OK(ct_reward_score(r, &it, 1, &out));
    CHECK_NEAR(out, want, 1e-15);
  }
  ct_reward_item it = {.completion_tokens = 90};
  double out;
  CHECK_OK(ct_reward_score(r, &it, 1, &out));
  CHECK(out == -0.5);
  ct_reward_free(r);
  // the buffer must lie within max_completion_length, and be set at all
  CHECK(init_fails(CT_REWARD_OVERLONG, (ct_reward_opts){.overlong_max_len = 100, .overlong_buffer = 0}, CT_ECONFIG,
                   "overlong_buffer_len", "the overlong reward needs 0 < overlong_buffer_len <= max_completion_length (100; got 0)"));
  CHECK(init_fails(CT_REWARD_OVERLONG, (ct_reward_opts){.overlong_max_len = 10, .overlong_buffer = 11}, CT_ECONFIG,
                   "overlong_buffer_len", "got 11"));
}

// TRL's think_format_reward: its docstring's two cases, then the pattern's corners — a second
// <think> anywhere, no closing tag, text before the opening one, newlines inside.
static void test_think_format_is_trls_pattern(void) {
  ct_reward *r = make(CT_REWARD_THINK_FORMAT, (ct_reward_opts){0});
  CHECK(score1(r, "<think>\nThis is my reasoning.\n</think>\nThis is my answer.", NULL) == 1);
  CHECK(score1(r, "<think>\nThis is my reasoning.\nThis is my answer.", NULL) == 0);
  CHECK(score1(r, "<think></think>", NULL) == 1);
  CHECK(score1(r, "<think>a</think>b<think>c</think>", NULL) == 0);  // (?!.*<think>)
  CHECK(score1(r, " <think>a</think>", NULL) == 0);                   // re.match: at the start
  CHECK(score1(r, "<think>a\n\nb</think>\n\n42", NULL) == 1);
  CHECK(score1(r, "</think><think>", NULL) == 0);
  CHECK(isnan(score1(r, NULL, NULL)));
  ct_reward_free(r);
}

// The share of distinct n-grams counted one pair of positions at a time.
static double repetition_brute(const int *ids, int n, int g, double p) {
  if (n < g) return 0;
  int total = n - g + 1, unique = 0;
  for (int i = 0; i < total; i++) {
    bool seen = false;
    for (int j = 0; j < i && !seen; j++) seen = !memcmp(ids + i, ids + j, sizeof(int) * g);
    unique += !seen;
  }
  double scaling = 1 - (double)unique / total;
  return scaling ? scaling * p : 0;
}

// TRL's get_repetition_penalty_reward(ngram_size, max_penalty) over token ids: its docstring's
// example ([1, 2, 3, 4] → 0, [5, 5, 5, 5, 5] → −0.75 with n = 2), then random ids of a small
// alphabet against a pairwise count, for n 1 to 4.
static void test_repetition_penalty_is_trls_ngram_share(void) {
  ct_reward *r = make(CT_REWARD_REPETITION, (ct_reward_opts){.ngram = 2, .max_penalty = -1.0});
  int a[] = {1, 2, 3, 4}, b[] = {5, 5, 5, 5, 5};
  ct_reward_item it[2] = {{.completion = "", .completion_tokens = 4, .completion_ids = a},
                          {.completion = "", .completion_tokens = 5, .completion_ids = b}};
  double out[2];
  CHECK_OK(ct_reward_score(r, it, 2, out));
  CHECK(out[0] == 0.0 && out[1] == -0.75);
  ct_reward_free(r);
  unsigned x = 7;
  for (int g = 1; g <= 4; g++) {
    r = make(CT_REWARD_REPETITION, (ct_reward_opts){.ngram = g, .max_penalty = -0.5});
    for (int n = 0; n < 40; n++) {
      int ids[40];
      for (int i = 0; i < n; i++) x = x * 1103515245u + 12345u, ids[i] = (int)(x >> 16) % 3;
      ct_reward_item one = {.completion = "", .completion_tokens = n, .completion_ids = ids};
      double got;
      CHECK_OK(ct_reward_score(r, &one, 1, &got));
      CHECK_NEAR(got, repetition_brute(ids, n, g, -0.5), 1e-15);
    }
    ct_reward_free(r);
  }
  CHECK(init_fails(CT_REWARD_REPETITION, (ct_reward_opts){.ngram = 3, .max_penalty = 0.5}, CT_ECONFIG,
                   "repetition_max_penalty", "must not be positive"));
}

// TRL's get_cosine_scaled_reward(max_len 100) with its default bounds, over the accuracy
// verdict: correct 1.0 at length 0 falling to 0.5 at 100 (and past it), wrong −1.0 rising
// to −0.5; its docstring's 50-token pair; NaN where accuracy has no reference.
static void test_cosine_scales_accuracy_by_length_as_trl(void) {
  ct_reward *r = make(CT_REWARD_COSINE, (ct_reward_opts){.cosine_max_len = 100, .min_value_wrong = -1.0,
                                                          .max_value_wrong = -0.5, .min_value_correct = 0.5,
                                                          .max_value_correct = 1.0});
  json_t *row = json_loads("{\"answer\": \"42\"}", 0, NULL);
  int lens[] = {0, 1, 25, 50, 99, 100, 150};
  for (size_t i = 0; i < sizeof lens / sizeof *lens; i++)
    for (int right = 0; right < 2; right++) {
      ct_reward_item it = {.completion = right ? "42" : "41", .row = row, .completion_tokens = lens[i]};
      double got, c = cos(fmin(lens[i] / 100.0, 1.0) * M_PI);
      double lo = right ? 0.5 : -0.5, hi = right ? 1.0 : -1.0;
      CHECK_OK(ct_reward_score(r, &it, 1, &got));
      CHECK_NEAR(got, lo + 0.5 * (hi - lo) * (1 + c), 1e-15);
    }
  ct_reward_item half = {.completion = "42", .row = row, .completion_tokens = 50};
  double got;
  CHECK_OK(ct_reward_score(r, &half, 1, &got));
  CHECK_NEAR(got, 0.75, 1e-15);  // the docstring's correct one; the wrong one −0.75
  ct_reward_item none = {.completion = "42", .row = NULL, .completion_tokens = 50};
  CHECK_OK(ct_reward_score(r, &none, 1, &got));
  CHECK(isnan(got));
  json_decref(row);
  ct_reward_free(r);
}

// answer_math: TRL's accuracy_reward on MATH-style rows — the boxed answer against the
// reference as math; no boxed or math span is 0; answer_regex picks the answer instead; an
// empty reference is NaN (TRL: None, the example skipped); integers from JSON read as numbers.
static void test_accuracy_with_answer_math_compares_boxed_answers_as_math(void) {
  ct_reward *r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.math = true});
  CHECK(score1(r, "so \\boxed{0.5}", "{\"answer\": \"\\\\frac{1}{2}\"}") == 1);
  CHECK(score1(r, "so \\boxed{\\dfrac{1}{2}}.", "{\"answer\": \"0.5\"}") == 1);
  CHECK(score1(r, "it is $50\\%$", "{\"answer\": \"0.5\"}") == 1);
  CHECK(score1(r, "\\boxed{1,200}", "{\"answer\": 1200}") == 1);
  CHECK(score1(r, "\\boxed{3}", "{\"answer\": \"4\"}") == 0);
  CHECK(score1(r, "the answer is 0.5", "{\"answer\": \"0.5\"}") == 0);
  CHECK(isnan(score1(r, "\\boxed{1}", "{\"answer\": \"\"}")));
  ct_reward_free(r);
  r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.math = true, .answer_regex = "#### (.*)"});
  CHECK(score1(r, "work...\n#### 1,000", "{\"answer\": \"1000\"}") == 1);
  ct_reward_free(r);
}

static void test_score_fills_every_item(void) {
  ct_reward *r = make(CT_REWARD_LENGTH, (ct_reward_opts){.target_length = 2});
  ct_reward_item it[3] = {{.completion = "a"}, {.completion = "ab"}, {.completion = "abcd"}};
  double out[3];
  CHECK_OK(ct_reward_score(r, it, 3, out));
  CHECK(out[0] == -0.5 && out[1] == 0 && out[2] == -1);
  CHECK_OK(ct_reward_score(r, it, 0, out));
  ct_reward_free(r);
}

// ---------------------------------------------------------------------------------------
// the dataset field a reward reads

// check_rows REWARD SKIP ROWS...: ct_reward_check_rows over rows given as JSON texts
// (lines 1..n of "d.jsonl"); bad (n) receives the marks.
static int check_rows(const ct_reward *r, bool skip, bool *bad, int n, const char *const *texts) {
  json_t *rows[8] = {0};
  int lines[8] = {0};
  for (int i = 0; i < n; i++) rows[i] = json_loads(texts[i], 0, NULL), lines[i] = i + 1, bad[i] = false;
  int rc = ct_reward_check_rows(r, rows, lines, n, "d.jsonl", skip, bad);
  for (int i = 0; i < n; i++) json_decref(rows[i]);
  return rc;
}

static void test_check_rows_names_the_key_the_field_and_the_row(void) {
  ct_reward *r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_field = "solution"});
  CHECK(strcmp(ct_reward_field(r), "solution") == 0);
  bool bad[4];
  const char *none[] = {"{\"prompt\": \"a\", \"answer\": \"1\"}", "{\"prompt\": \"b\", \"answer\": 2}"};
  CHECK(check_rows(r, true, bad, 2, none) == CT_ECONFIG);  // even with skip_bad_rows
  CHECK(strstr(ct_last_error(), "key 'answer_field': no row of d.jsonl has the field 'solution', which the "
                                "accuracy reward reads (its first row has: prompt, answer)"));
  const char *some[] = {"{\"solution\": \"1\"}", "{\"answer\": \"2\"}", "{\"solution\": [3]}",
                        "{\"solution\": 4.5}"};
  CHECK(check_rows(r, false, bad, 4, some) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "d.jsonl:2: no field 'solution', which the accuracy reward reads"));
  CHECK(check_rows(r, true, bad, 4, some) == 2);
  CHECK(!bad[0] && bad[1] && bad[2] && !bad[3]);
  CHECK(strstr(ct_last_error(), "d.jsonl:2: no field 'solution'"));  // the first skipped row
  const char *list[] = {"{\"solution\": \"1\"}", "{\"solution\": null}"};
  CHECK(check_rows(r, false, bad, 2, list) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "d.jsonl:2: field 'solution' is null; it must be a string or a number"));
  ct_reward_free(r);
  // answer_numeric: a reference that is no number would score NaN on every completion
  r = make(CT_REWARD_ACCURACY, (ct_reward_opts){.numeric = true});
  const char *num[] = {"{\"answer\": \"1,200\"}", "{\"answer\": \"twelve\"}"};
  CHECK(check_rows(r, false, bad, 2, num) == CT_EFORMAT);
  CHECK(strstr(ct_last_error(), "d.jsonl:2: field 'answer' is \"twelve\", not a number (answer_numeric is true)"));
  ct_reward_free(r);
  // rewards that read no field, and remote without labels_required, check nothing
  r = make(CT_REWARD_LENGTH, (ct_reward_opts){.target_length = 3});
  CHECK(ct_reward_field(r) == NULL && check_rows(r, false, bad, 2, none) == 0);
  ct_reward_free(r);
  ct_reward_opts o = {.url = "http://127.0.0.1:9/score", .connect_timeout_s = 1, .timeout_s = 1,
                      .answer_field = "solution"};
  r = make(CT_REWARD_REMOTE, o);
  CHECK(ct_reward_field(r) == NULL && check_rows(r, false, bad, 2, none) == 0);
  ct_reward_free(r);
  o.labels_required = true;
  r = make(CT_REWARD_REMOTE, o);
  CHECK(check_rows(r, false, bad, 2, none) == CT_ECONFIG);
  CHECK(strstr(ct_last_error(), "which the remote reward reads"));
  ct_reward_free(r);
}

// ---------------------------------------------------------------------------------------
// options

static void test_kind_parses_the_eight_names_and_lists_the_choices(void) {
  const char *names[] = {"accuracy", "format", "length", "overlong", "think_format", "repetition_penalty", "cosine",
                         "remote"};
  for (int k = 0; k < 8; k++) {
    int kind = -1;
    CHECK_OK(ct_reward_kind(names[k], &kind));
    CHECK(kind == k);
  }
  int kind = -1;
  CHECK(ct_reward_kind("acuracy", &kind) == CT_ECONFIG && kind == -1);
  CHECK(strstr(ct_last_error(), "\"acuracy\"") && strstr(ct_last_error(), "accuracy, format"));
  CHECK(ct_reward_kind("", &kind) == CT_ECONFIG);
  CHECK(ct_reward_kind("Accuracy", &kind) == CT_ECONFIG);
}

static void test_init_rejects_bad_options_naming_the_option(void) {
  CHECK(init_fails(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "(unclosed"},
                   CT_ECONFIG, "answer_regex", "(unclosed"));
  // the message carries PCRE2's reason and where in the pattern
  CHECK(init_fails(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "a{2,1}"},
                   CT_ECONFIG, "answer_regex", "numbers out of order in {} quantifier at character 5"));
  CHECK(init_fails(CT_REWARD_ACCURACY, (ct_reward_opts){.answer_regex = "\xc3\xa9(?P<x"},
                   CT_ECONFIG, "answer_regex", "at character 6"));  // characters, not bytes
  // Python escapes PCRE2 lacks are errors, not literal letters
  CHECK(init_fails(CT_REWARD_FORMAT, (ct_reward_opts){.format_regex = "\\U0001F600"}, CT_ECONFIG,
                   "format_regex", "\\U"));
  CHECK(init_fails(CT_REWARD_FORMAT, (ct_reward_opts){.format_regex = "[abc"}, CT_ECONFIG,
                   "format_regex", "[abc"));
  CHECK(init_fails(CT_REWARD_FORMAT, (ct_reward_opts){0}, CT_ECONFIG, "format_regex", NULL));
  CHECK(init_fails(CT_REWARD_LENGTH, (ct_reward_opts){.target_length = 0}, CT_ECONFIG,
                   "length_target", "> 0"));
  CHECK(init_fails(CT_REWARD_LENGTH, (ct_reward_opts){.target_length = -5}, CT_ECONFIG,
                   "length_target", "-5"));
  ct_reward_opts o = {.url = "http://127.0.0.1:9/score", .connect_timeout_s = 1,
                      .timeout_s = 1, .retries = 1, .backoff_s = 0.1};
  ct_reward_opts bad = o;
  bad.url = "ftp://127.0.0.1/score";
  CHECK(init_fails(CT_REWARD_REMOTE, bad, CT_ECONFIG, "reward_url", "ftp://127.0.0.1/score"));
  bad.url = "127.0.0.1:8000";
  CHECK(init_fails(CT_REWARD_REMOTE, bad, CT_ECONFIG, "reward_url", "http://"));
  bad.url = "http://[::1:80/score";
  CHECK(init_fails(CT_REWARD_REMOTE, bad, CT_ECONFIG, "reward_url", "not a valid URL"));
  bad.url = NULL;
  CHECK(init_fails(CT_REWARD_REMOTE, bad, CT_ECONFIG, "reward_url", NULL));
  bad = o, bad.timeout_s = 0;
  CHECK(init_fails(CT_REWARD_REMOTE, bad, CT_ECONFIG, "reward_timeout", NULL));
  bad = o, bad.connect_timeout_s = -1;
  CHECK(init_fails(CT_REWARD_REMOTE, bad, CT_ECONFIG, "reward_connect_timeout", NULL));
  bad = o, bad.retries = -1;
  CHECK(init_fails(CT_REWARD_REMOTE, bad, CT_ECONFIG, "reward_retries", NULL));
  bad = o, bad.backoff_s = NAN;
  CHECK(init_fails(CT_REWARD_REMOTE, bad, CT_ECONFIG, "reward_backoff", NULL));
  CHECK(init_fails(CT_REWARD_MODEL + 1, o, CT_EINVAL, "kind", NULL));
  // options that are fine do not contact the server
  ct_reward *r = make(CT_REWARD_REMOTE, o);
  CHECK(r && strcmp(ct_reward_name(r), "remote") == 0);
  CHECK(r && ct_reward_failed_batches(r) == 0 && !strcmp(ct_reward_last_failure(r), ""));
  ct_reward_free(r);
  ct_reward_free(NULL);
}

// ---------------------------------------------------------------------------------------
// remote: against bin/ctune-reward-server

static char server_path[1024], server_log[64], server_said[4096];
static pid_t server_pid;

// Starts the server in `mode` (requiring the key in environment variable key_env unless
// it is NULL); its port, or 0 (with a failed check) when it cannot start.
static int start_server(const char *mode, int delay_ms, const char *key_env) {
  snprintf(server_log, sizeof server_log, "/tmp/ct-reward-XXXXXX");
  int log = mkstemp(server_log);
  int fds[2];
  if (log < 0 || pipe(fds)) {
    CHECK(!"cannot create the server's log file or pipe");
    return 0;
  }
  char a_mode[64], a_delay[64], a_key[128];
  snprintf(a_mode, sizeof a_mode, "mode=%s", mode);
  snprintf(a_delay, sizeof a_delay, "delay_ms=%d", delay_ms);
  snprintf(a_key, sizeof a_key, "api_key_env=%s", key_env ? key_env : "");
  fflush(NULL);
  server_pid = fork();
  if (server_pid == 0) {
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive a test that crashed
#endif
    dup2(fds[1], 1);
    dup2(log, 2);
    close(fds[0]);
    close(fds[1]);
    close(log);
    execl(server_path, server_path, "port=0", a_mode, a_delay, key_env ? a_key : (char *)NULL,
          (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  close(log);
  char line[32] = "";
  size_t n = 0;
  struct pollfd p = {.fd = fds[0], .events = POLLIN};
  while (n + 1 < sizeof line && !memchr(line, '\n', n) && poll(&p, 1, 5000) == 1) {
    ssize_t k = read(fds[0], line + n, sizeof line - 1 - n);
    if (k <= 0) break;
    n += (size_t)k;
    line[n] = 0;
  }
  close(fds[0]);
  int port = atoi(line);
  CHECK(server_pid > 0 && port > 0);
  if (port <= 0) fprintf(stderr, "  %s mode=%s printed no port\n", server_path, mode);
  return port;
}

// Stops the server; returns how many requests it logged (its log is in server_said).
static int stop_server(void) {
  if (server_pid > 0) {
    kill(server_pid, SIGTERM);
    waitpid(server_pid, NULL, 0);
    server_pid = 0;
  }
  int requests = 0;
  FILE *f = fopen(server_log, "r");
  size_t n = f ? fread(server_said, 1, sizeof server_said - 1, f) : 0;
  server_said[n] = 0;
  for (const char *p = server_said; (p = strstr(p, "POST ")); p++) requests++;
  if (f) fclose(f);
  unlink(server_log);
  return requests;
}

static ct_reward_opts remote_opts(int port) {
  static char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/score", port);
  return (ct_reward_opts){.url = url, .connect_timeout_s = 1, .timeout_s = 0.2,
                          .retries = 2, .backoff_s = 0.02};
}

// Four items whose right rewards are 1, 0, 1, 0 under the server's "ends with the label".
static json_t *rows[4];
static ct_reward_item items[4];

static void make_items(void) {
  const char *r[4] = {"{\"answer\": \"42\"}", "{\"answer\": \"42\"}", "{\"answer\": 7}",
                      "{\"other\": \"x\"}"};
  const char *c[4] = {" so 40 + 2 = 42<|im_end|>\n", " it is 41", " seven is 7 ",
                      " x"};
  for (int i = 0; i < 4; i++) {
    rows[i] = json_loads(r[i], 0, NULL);
    items[i] = (ct_reward_item){.prompt = "Q: what is it?", .completion = c[i], .row = rows[i]};
  }
}

// Scores the items against a server in `mode`; returns the rc, with the rewards in out,
// the seconds taken in *secs and the number of requests the server saw in *requests.
static int run_remote(const char *mode, int delay_ms, ct_reward_opts *tweak, double *out,
                      double *secs, int *requests) {
  int port = start_server(mode, delay_ms, NULL);
  if (!port) {
    stop_server();
    return -100;
  }
  ct_reward_opts o = remote_opts(port);
  if (tweak) {
    tweak->url = o.url;
    o = *tweak;
  }
  ct_reward *r = make(CT_REWARD_REMOTE, o);
  if (!r) {
    stop_server();
    return -100;
  }
  double t0 = now_s();
  int rc = ct_reward_score(r, items, 4, out);
  *secs = now_s() - t0;
  if (rc == 0 && o.failure_nan) {
    CHECK(ct_reward_failed_batches(r) >= 1);
    CHECK(strstr(ct_reward_last_failure(r), o.url) != NULL);
  }
  ct_reward_free(r);
  *requests = stop_server();
  return rc;
}

static int has(const char *what) {
  if (strstr(ct_last_error(), what)) return 1;
  fprintf(stderr, "  message lacks \"%s\": %s\n", what, ct_last_error());
  return 0;
}

static bool server_ok(void) {
  if (access(server_path, X_OK) == 0) return true;
  fprintf(stderr, "  cannot run %s (set CT_BIN to the directory with ctune-reward-server)\n",
          server_path);
  CHECK(!"ctune-reward-server missing");
  return false;
}

static void test_remote_ok_returns_the_servers_rewards_and_reuses_the_handle(void) {
  if (!server_ok()) return;
  int port = start_server("ok", 0, NULL);
  if (!port) return;
  ct_reward_opts o = remote_opts(port);
  ct_reward *r = make(CT_REWARD_REMOTE, o);
  double out[4] = {-1, -1, -1, -1};
  CHECK_OK(ct_reward_score(r, items, 4, out));
  CHECK(out[0] == 1 && out[1] == 0 && out[2] == 1 && out[3] == 0);
  out[0] = -1;
  CHECK_OK(ct_reward_score(r, items, 4, out));  // the same handle, a second time
  CHECK(out[0] == 1 && out[1] == 0 && out[2] == 1 && out[3] == 0);
  CHECK(ct_reward_failed_batches(r) == 0);
  ct_reward_free(r);
  CHECK(stop_server() == 2);
  CHECK(strstr(server_said, "POST /score HTTP/1.1") && strstr(server_said, "application/json"));
}

static void test_remote_sends_batches_of_the_configured_size(void) {
  if (!server_ok()) return;
  int port = start_server("ok", 0, NULL);
  if (!port) return;
  ct_reward_opts o = remote_opts(port);
  o.batch = 3;
  ct_reward *r = make(CT_REWARD_REMOTE, o);
  double out[4] = {-1, -1, -1, -1};
  CHECK_OK(ct_reward_score(r, items, 4, out));  // requests of 3 and 1
  CHECK(out[0] == 1 && out[1] == 0 && out[2] == 1 && out[3] == 0);
  ct_reward_free(r);
  CHECK(stop_server() == 2);
}

static void test_remote_slow_server_times_out_within_the_bound(void) {
  if (!server_ok()) return;
  double out[4], secs;
  int requests;
  // 3 attempts x 0.2 s + 0.02 + 0.04 s of backoff: well under 3 s
  int rc = run_remote("slow", 2000, NULL, out, &secs, &requests);
  CHECK(rc == CT_EIO && has("timeout after 3 attempts") && has("http://127.0.0.1:"));
  CHECK(secs >= 0.6 && secs < 3.0);
  CHECK(isnan(out[0]) && isnan(out[3]));
  ct_reward_opts o = remote_opts(0);
  o.failure_nan = true;
  rc = run_remote("slow", 2000, &o, out, &secs, &requests);
  CHECK(rc == 0 && isnan(out[0]) && isnan(out[1]) && isnan(out[2]) && isnan(out[3]));
  CHECK(secs < 3.0);
  if (secs >= 3.0) fprintf(stderr, "  took %.2f s\n", secs);
}

static void test_remote_http_500_is_retried_then_reported(void) {
  if (!server_ok()) return;
  double out[4], secs;
  int requests;
  int rc = run_remote("500", 0, NULL, out, &secs, &requests);
  CHECK(rc == CT_EIO && has("HTTP 500 after 3 attempts") && has("/score"));
  CHECK(requests == 3);
  ct_reward_opts o = remote_opts(0);
  o.failure_nan = true;
  rc = run_remote("500", 0, &o, out, &secs, &requests);
  CHECK(rc == 0 && isnan(out[0]) && isnan(out[3]) && requests == 3);
}

static void test_remote_http_400_is_not_retried(void) {
  if (!server_ok()) return;
  double out[4], secs;
  int requests;
  int rc = run_remote("400", 0, NULL, out, &secs, &requests);
  CHECK(rc == CT_EIO && has("HTTP 400 after 1 attempt:") && has("bad request"));
  CHECK(requests == 1);
}

static void test_remote_malformed_json_is_retried_then_reported(void) {
  if (!server_ok()) return;
  double out[4], secs;
  int requests;
  int rc = run_remote("badjson", 0, NULL, out, &secs, &requests);
  CHECK(rc == CT_EIO && has("malformed JSON") && has("after 3 attempts"));
  CHECK(requests == 3);
}

static void test_remote_closed_connection_is_retried_then_reported(void) {
  if (!server_ok()) return;
  double out[4], secs;
  int requests;
  int rc = run_remote("close", 0, NULL, out, &secs, &requests);
  CHECK(rc == CT_EIO && has("closed without a reply") && has("after 3 attempts"));
  CHECK(requests == 3);
  CHECK(secs < 3.0);
}

static void test_remote_wrong_count_is_reported_with_both_counts(void) {
  if (!server_ok()) return;
  double out[4], secs;
  int requests;
  int rc = run_remote("count", 0, NULL, out, &secs, &requests);
  CHECK(rc == CT_EIO && has("3 rewards, expected 4"));
  CHECK(requests == 3);
  CHECK(isnan(out[0]));
}

static void test_remote_unreachable_port_fails_fast(void) {
  // a port that was free a moment ago: nobody listens there
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  CHECK(s >= 0 && !bind(s, (struct sockaddr *)&a, sizeof a) &&
        !getsockname(s, (struct sockaddr *)&a, &len));
  close(s);
  ct_reward_opts o = remote_opts(ntohs(a.sin_port));
  o.retries = 1;
  ct_reward *r = make(CT_REWARD_REMOTE, o);
  double out[4];
  double t0 = now_s();
  int rc = ct_reward_score(r, items, 4, out);
  double secs = now_s() - t0;
  CHECK(rc == CT_EIO && has("cannot connect after 2 attempts") && has(o.url));
  CHECK(secs < 1.0);
  CHECK(ct_reward_failed_batches(r) == 1);
  ct_reward_free(r);
}

static void test_remote_string_or_list_reward_is_an_error_naming_its_index(void) {
  if (!server_ok()) return;
  double out[4], secs;
  int requests;
  int rc = run_remote("string", 0, NULL, out, &secs, &requests);
  CHECK(rc == CT_EIO && has("bad reward in the reply after 3 attempts") &&
        has("reward 1 of 4 is \"NaN\" (a string)") && has("http://127.0.0.1:"));
  CHECK(requests == 3 && isnan(out[0]) && isnan(out[1]));
  rc = run_remote("nested", 0, NULL, out, &secs, &requests);
  CHECK(rc == CT_EIO && has("reward 1 of 4 is [1.0] (a list)"));
  ct_reward_opts o = remote_opts(0);
  o.failure_nan = true;
  rc = run_remote("string", 0, &o, out, &secs, &requests);
  CHECK(rc == 0 && isnan(out[0]) && isnan(out[1]) && isnan(out[2]) && isnan(out[3]));
}

static void test_remote_non_finite_reward_is_an_error_naming_the_value(void) {
  if (!server_ok()) return;
  double out[4], secs;
  int requests;
  // Python's json.dumps writes float('nan') as a bare NaN and float('-inf') as -Infinity
  // (not JSON); 1e400 is JSON but no double. Each is a non-finite reward: with
  // reward_failure: error the run stops at once, naming it (the server has answered: no
  // retry); with nan that completion's reward is NaN and the others stand.
  const char *modes[] = {"nan", "inf", "nonfinite"};
  const char *texts[] = {"reward 1 of 4 is NaN;", "reward 1 of 4 is -Infinity;", "reward 1 of 4 is 1e400;"};
  for (int m = 0; m < 3; m++) {
    int rc = run_remote(modes[m], 0, NULL, out, &secs, &requests);
    CHECK(rc == CT_EIO && has("non-finite reward after 1 attempt: ") && has(texts[m]) && has("/score") &&
          has("reward_failure: nan would leave such completions out"));
    CHECK(requests == 1 && isnan(out[1]));
    ct_reward_opts o = remote_opts(0);
    o.failure_nan = true;
    out[1] = 0;
    rc = run_remote(modes[m], 0, &o, out, &secs, &requests);
    CHECK(rc == 0 && requests == 1 && out[0] == 1 && isnan(out[1]) && out[2] == 1 && out[3] == 0);
  }
}

static void test_remote_null_reward_is_nan_for_that_completion_only(void) {
  if (!server_ok()) return;
  double out[4] = {-1, -1, -1, -1}, secs;
  int requests;
  // a null reward is NaN (TRL maps a reward function's None to NaN) whatever
  // reward_failure says: the server chose to give none, nothing failed
  int rc = run_remote("null", 0, NULL, out, &secs, &requests);
  CHECK(rc == 0 && out[0] == 1 && isnan(out[1]) && out[2] == 1 && out[3] == 0);
  CHECK(requests == 1);
}

static void test_remote_https_to_a_plain_http_server_is_a_tls_error(void) {
  if (!server_ok()) return;
  int port = start_server("ok", 0, NULL);
  if (!port) return;
  ct_reward_opts o = remote_opts(port);
  char url[64];
  snprintf(url, sizeof url, "https://127.0.0.1:%d/score", port);
  o.url = url;
  o.retries = 0;
  o.timeout_s = 10;  // loading the CA certificates takes a while under sanitizers
  ct_reward *r = make(CT_REWARD_REMOTE, o);
  double out[4] = {-1, -1, -1, -1};
  int rc = ct_reward_score(r, items, 4, out);
  CHECK(rc == CT_EIO && has("TLS handshake failed after 1 attempt") && has(url));
  CHECK(isnan(out[0]));
  ct_reward_free(r);
  CHECK(stop_server() == 0);  // the server never saw an HTTP request
  CHECK(strstr(server_said, "not an HTTP request") != NULL);
}

// ---------------------------------------------------------------------------------------
// remote: the API key

#define KEY_ENV "CT_TEST_REWARD_KEY"
#define KEY "ct-test-key-5f2c9a0e"  // no message may contain it
#define WRONG_ENV "CT_TEST_REWARD_WRONG_KEY"
#define WRONG "ct-wrong-key-77e1b3"

static bool no_key_in(const char *msg) {
  if (!strstr(msg, KEY) && !strstr(msg, WRONG)) return true;
  fprintf(stderr, "  a message holds the key: %s\n", msg);
  return false;
}

static void test_init_rejects_an_unset_empty_or_multiline_key_naming_the_variable(void) {
  ct_reward_opts o = {.url = "http://127.0.0.1:9/score", .connect_timeout_s = 1,
                      .timeout_s = 1, .api_key_env = KEY_ENV};
  unsetenv(KEY_ENV);
  CHECK(init_fails(CT_REWARD_REMOTE, o, CT_ECONFIG, "reward_api_key_env",
                   "variable " KEY_ENV " is unset"));
  CHECK(!strchr(ct_last_error(), '\n'));  // one line
  setenv(KEY_ENV, "", 1);
  CHECK(init_fails(CT_REWARD_REMOTE, o, CT_ECONFIG, "reward_api_key_env",
                   "variable " KEY_ENV " is empty"));
  setenv(KEY_ENV, KEY "\r\nX-Injected: 1", 1);  // would add a header of its own
  CHECK(init_fails(CT_REWARD_REMOTE, o, CT_ECONFIG, "reward_api_key_env", "control character"));
  CHECK(no_key_in(ct_last_error()));
  // a key that is set is fine, and init contacts no server
  setenv(KEY_ENV, KEY, 1);
  ct_reward *r = make(CT_REWARD_REMOTE, o);
  ct_reward_free(r);
  // no variable named: no key needed
  unsetenv(KEY_ENV);
  o.api_key_env = "";
  r = make(CT_REWARD_REMOTE, o);
  ct_reward_free(r);
  // the key matters only to the remote reward
  r = make(CT_REWARD_LENGTH, (ct_reward_opts){.target_length = 2, .api_key_env = KEY_ENV});
  ct_reward_free(r);
}

static void test_remote_sends_the_key_as_a_bearer_token(void) {
  if (!server_ok()) return;
  setenv(KEY_ENV, KEY, 1);  // the same variable names the key for server and client
  int port = start_server("ok", 0, KEY_ENV);
  if (!port) return;
  ct_reward_opts o = remote_opts(port);
  o.api_key_env = KEY_ENV;
  ct_reward *r = make(CT_REWARD_REMOTE, o);
  double out[4] = {-1, -1, -1, -1};
  CHECK_OK(ct_reward_score(r, items, 4, out));
  CHECK(out[0] == 1 && out[1] == 0 && out[2] == 1 && out[3] == 0);
  CHECK_OK(ct_reward_score(r, items, 4, out));  // every request carries it
  ct_reward_free(r);
  CHECK(stop_server() == 2);
  CHECK(!strstr(server_said, "401") && no_key_in(server_said));
  unsetenv(KEY_ENV);
}

static void test_remote_missing_or_wrong_key_is_http_401_without_the_key_in_messages(void) {
  if (!server_ok()) return;
  setenv(KEY_ENV, KEY, 1);  // the server's
  setenv(WRONG_ENV, WRONG, 1);
  int port = start_server("ok", 0, KEY_ENV);
  if (!port) return;
  ct_reward_opts o = remote_opts(port);
  double out[4] = {-1, -1, -1, -1};
  ct_reward *r = make(CT_REWARD_REMOTE, o);  // no key
  int rc = ct_reward_score(r, items, 4, out);
  CHECK(rc == CT_EIO && has("HTTP 401 after 1 attempt") && has(o.url) &&
        has("no API key was sent (set reward_api_key_env)"));
  CHECK(isnan(out[0]));
  ct_reward_free(r);
  o.api_key_env = WRONG_ENV;
  r = make(CT_REWARD_REMOTE, o);
  rc = ct_reward_score(r, items, 4, out);
  CHECK(rc == CT_EIO && has("HTTP 401 after 1 attempt") &&
        has("refused the API key in " WRONG_ENV " (reward_api_key_env)"));
  CHECK(no_key_in(ct_last_error()) && no_key_in(ct_reward_last_failure(r)));
  ct_reward_free(r);
  o.failure_nan = true;
  r = make(CT_REWARD_REMOTE, o);
  CHECK(ct_reward_score(r, items, 4, out) == 0 && isnan(out[0]) && isnan(out[3]));
  CHECK(strstr(ct_reward_last_failure(r), "HTTP 401") && no_key_in(ct_reward_last_failure(r)));
  ct_reward_free(r);
  CHECK(stop_server() == 3);  // 4xx: one attempt each
  CHECK(no_key_in(server_said));
  unsetenv(KEY_ENV);
  unsetenv(WRONG_ENV);
}

static void test_remote_reply_quoting_the_key_is_withheld_from_messages(void) {
  if (!server_ok()) return;
  setenv(KEY_ENV, KEY, 1);
  int port = start_server("echo", 0, NULL);  // answers 400 quoting the Authorization header
  if (!port) return;
  ct_reward_opts o = remote_opts(port);
  o.api_key_env = KEY_ENV;
  ct_reward *r = make(CT_REWARD_REMOTE, o);
  double out[4];
  int rc = ct_reward_score(r, items, 4, out);
  CHECK(rc == CT_EIO && has("HTTP 400 after 1 attempt") && has("reply withheld"));
  CHECK(no_key_in(ct_last_error()) && no_key_in(ct_reward_last_failure(r)));
  ct_reward_free(r);
  o.api_key_env = NULL;  // without a key the reply is quoted as usual
  r = make(CT_REWARD_REMOTE, o);
  rc = ct_reward_score(r, items, 4, out);
  CHECK(rc == CT_EIO && has("you sent Authorization: none"));
  ct_reward_free(r);
  stop_server();
  unsetenv(KEY_ENV);
}

int main(void) {
  // a proxy from the environment must not carry loopback requests elsewhere
  const char *proxies[] = {"http_proxy",  "HTTP_PROXY", "https_proxy",
                           "HTTPS_PROXY", "ALL_PROXY",  "all_proxy"};
  for (size_t i = 0; i < sizeof proxies / sizeof *proxies; i++) unsetenv(proxies[i]);
  const char *bin = getenv("CT_BIN");
  snprintf(server_path, sizeof server_path, "%s/ctune-reward-server", bin && *bin ? bin : "bin");
  make_items();

  RUN(test_accuracy_exact_compares_the_trimmed_completion);
  RUN(test_accuracy_missing_or_ill_typed_answer_is_nan);
  RUN(test_accuracy_numeric_answer_field_is_compared_as_its_text);
  RUN(test_accuracy_regex_takes_the_last_match);
  RUN(test_accuracy_regex_uses_the_first_group_else_the_whole_match);
  RUN(test_accuracy_regex_anchors_and_empty_matches_behave);
  RUN(test_accuracy_numeric_ignores_commas_and_tolerates_1e6_relative);
  RUN(test_format_is_one_when_the_regex_matches_anywhere);
  RUN(test_regex_is_pythons_re);
  RUN(test_length_penalizes_distance_from_the_target_in_bytes);
  RUN(test_overlong_is_trls_soft_punishment);
  RUN(test_think_format_is_trls_pattern);
  RUN(test_repetition_penalty_is_trls_ngram_share);
  RUN(test_cosine_scales_accuracy_by_length_as_trl);
  RUN(test_accuracy_with_answer_math_compares_boxed_answers_as_math);
  RUN(test_score_fills_every_item);
  RUN(test_check_rows_names_the_key_the_field_and_the_row);
  RUN(test_kind_parses_the_eight_names_and_lists_the_choices);
  RUN(test_init_rejects_bad_options_naming_the_option);
  RUN(test_remote_ok_returns_the_servers_rewards_and_reuses_the_handle);
  RUN(test_remote_sends_batches_of_the_configured_size);
  RUN(test_remote_slow_server_times_out_within_the_bound);
  RUN(test_remote_http_500_is_retried_then_reported);
  RUN(test_remote_http_400_is_not_retried);
  RUN(test_remote_malformed_json_is_retried_then_reported);
  RUN(test_remote_closed_connection_is_retried_then_reported);
  RUN(test_remote_wrong_count_is_reported_with_both_counts);
  RUN(test_remote_unreachable_port_fails_fast);
  RUN(test_remote_string_or_list_reward_is_an_error_naming_its_index);
  RUN(test_remote_non_finite_reward_is_an_error_naming_the_value);
  RUN(test_remote_null_reward_is_nan_for_that_completion_only);
  RUN(test_remote_https_to_a_plain_http_server_is_a_tls_error);
  RUN(test_init_rejects_an_unset_empty_or_multiline_key_naming_the_variable);
  RUN(test_remote_sends_the_key_as_a_bearer_token);
  RUN(test_remote_missing_or_wrong_key_is_http_401_without_the_key_in_messages);
  RUN(test_remote_reply_quoting_the_key_is_withheld_from_messages);

  for (int i = 0; i < 4; i++) json_decref(rows[i]);
  return test_summary();
}
