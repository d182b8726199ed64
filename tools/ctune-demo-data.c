// ctune-demo-data: writes the demo's synthetic tasks as TRL prompt/completion JSONL.
//
//   ctune-demo-data reverse       TRAIN.jsonl EVAL.jsonl [n_train] [n_eval] [seed] [max_len] [noise]
//   ctune-demo-data reverse-prefs TRAIN.jsonl EVAL.jsonl [n_train] [n_eval] [seed] [max_len]
//   ctune-demo-data reverse-kto   TRAIN.jsonl EVAL.jsonl [n_train] [n_eval] [seed] [max_len]
//   ctune-demo-data addition      TRAIN.jsonl EVAL.jsonl [n_train] [n_eval] [seed] [digits]
//   ctune-demo-data multiply-tool TRAIN.jsonl EVAL.jsonl [n_train] [n_eval] [seed] [digits] [noise]
//   ctune-demo-data guess-env     TRAIN.jsonl EVAL.jsonl [n_train] [n_eval] [seed]
//
// reverse:  {"prompt": "reverse kqxmb:", "completion": "bmxqk"}: lowercase words of
//           3..max_len letters (default 8), written backwards. With noise > 0 (default 0),
//           that fraction of the training rows (never the held-out ones) carries a
//           plausible mistake instead, as in the prefs' rejected answers: demonstrations
//           that are mostly but not always right.
// reverse-prefs: {"prompt": "reverse kqxmb:", "chosen": "bmxqk", "rejected": "bmqxk"}:
//           DPO pairs whose rejected answer is a plausible mistake (two neighbouring
//           letters swapped, a letter dropped, or the word not reversed).
// reverse-kto: {"prompt": "reverse kqxmb:", "completion": "bmqxk", "label": false}: the
//           prefs' unpaired version (TRL's KTO format): each prompt once, with its right
//           answer (label true) or, one time in two, a plausible mistake (label false).
// addition: {"prompt": "357+048=", "completion": "0405"}: two numbers of up to `digits`
//           digits (default 3), at fixed width.
// multiply-tool: a task a small model cannot do without its calculator — the product of
//           two numbers of `digits` digits (default 6). TRAIN holds SFT demonstrations as
//           conversations: the user's "123456*654321=", the assistant's calculator call
//           <tool_call>{"name": "calculator", "arguments": {"expression": "123456*654321"}}
//           </tool_call>, the tool's result, and the assistant's answer, the result; with
//           noise > 0 that fraction of them answers at once instead, with a guess (the
//           product with one digit changed), as a model that has not learned to use the
//           tool would. EVAL holds GRPO prompts: {"prompt": [{"role": "user", "content":
//           "123456*654321="}], "answer": "80779853376"} (reward_funcs: accuracy).
// guess-env: ctune-env-server's game, "guess the number" from 1 to 100. TRAIN holds SFT
//           demonstrations: whole games as conversations (the server's lines as the user's,
//           binary-search guesses as the assistant's, ending with the right one). EVAL holds
//           GRPO rows {"target": 37} with no prompt: the environment gives it (env_url,
//           reward_funcs: env).
// Held-out rows never repeat a training row. The seed fixes the output on every machine
// (ctune's own generator, not libc's rand).
#include <stdio.h>
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "rng.h"

static int usage(FILE *f) {
  fprintf(f, "usage: ctune-demo-data reverse|reverse-prefs|reverse-kto|addition|multiply-tool|guess-env TRAIN.jsonl EVAL.jsonl [n_train=20000] "
                  "[n_eval=500] [seed=1234] [max_len=8 | digits=3 (6 for multiply-tool)] [noise=0 (reverse, multiply-tool)]\n"
             "The numbers are given in this order, or as name=value in any order.\n");
  return f == stdout ? 0 : 2;  // --help: exit 0
}

// Rows already written, as 64-bit keys in an open-addressing set.
typedef struct {
  unsigned long long *slot;
  long cap;
} keyset;

static int keyset_add(keyset *k, unsigned long long key) {  // 1 if new
  key |= 1;  // 0 marks an empty slot
  long h = (long)((key * 0x9e3779b97f4a7c15ULL) >> 20) & (k->cap - 1);
  while (k->slot[h] && k->slot[h] != key) h = (h + 1) & (k->cap - 1);
  if (k->slot[h]) return 0;
  k->slot[h] = key;
  return 1;
}

// One row into prompt/completion; returns a key identifying it.
static unsigned long long make_reverse(ct_rng *r, int max_len, char *prompt, char *completion) {
  int len = 3 + (int)ct_rng_below(r, (uint64_t)(max_len - 2));
  char w[32];
  unsigned long long key = (unsigned long long)len;
  for (int i = 0; i < len; i++) {
    w[i] = (char)('a' + ct_rng_below(r, 26));
    key = key * 31 + (unsigned long long)w[i];
  }
  w[len] = 0;
  sprintf(prompt, "reverse %s:", w);
  for (int i = 0; i < len; i++) completion[i] = w[len - 1 - i];
  completion[len] = 0;
  return key << 1;
}

// A plausible wrong reversal of w (reversed: the right one).
static void near_miss(ct_rng *r, const char *w, const char *reversed, char *out) {
  int len = (int)strlen(reversed), kind = (int)ct_rng_below(r, 3);
  strcpy(out, reversed);
  if (kind == 0) {  // swap two neighbours that differ
    int i = (int)ct_rng_below(r, (uint64_t)(len - 1));
    for (int k = 0; k < len - 1 && out[i] == out[i + 1]; k++) i = (i + 1) % (len - 1);
    char t = out[i];
    out[i] = out[i + 1];
    out[i + 1] = t;
  } else if (kind == 1) {  // drop a letter
    int i = (int)ct_rng_below(r, (uint64_t)len);
    memmove(out + i, out + i + 1, (size_t)(len - i));
  } else {
    strcpy(out, w);
  }
  if (strcmp(out, reversed) == 0) {  // a palindrome-like case: add a letter instead
    out[len] = (char)(out[len - 1] == 'a' ? 'b' : 'a');
    out[len + 1] = 0;
  }
}

// a × b of `digits` digits each (no leading zero): the prompt "a*b=" and the product.
static unsigned long long make_product(ct_rng *r, int digits, char *prompt, char *product) {
  long lo = 1;
  for (int i = 1; i < digits; i++) lo *= 10;
  long a = lo + (long)ct_rng_below(r, (uint64_t)(9 * lo)), b = lo + (long)ct_rng_below(r, (uint64_t)(9 * lo));
  sprintf(prompt, "%ld*%ld=", a, b);
  sprintf(product, "%lld", (long long)a * b);
  return ((unsigned long long)a * 1000000007ULL + (unsigned long long)b) << 1;
}

// One guess-env row: a binary-search game for `target` (train), or the row an episode of
// it starts from. The lines are ctune-env-server's.
static void write_game(FILE *out, int target, bool train) {
  if (!train) {
    fprintf(out, "{\"target\": %d}\n", target);
    return;
  }
  fprintf(out, "{\"messages\": [{\"role\": \"user\", \"content\": \"Guess my number from 1 to 100.\"}");
  for (int lo = 1, hi = 100;;) {
    int g = (lo + hi) / 2;
    fprintf(out, ", {\"role\": \"assistant\", \"content\": \"%d\"}", g);
    if (g == target) break;
    fprintf(out, ", {\"role\": \"user\", \"content\": \"%s\"}", g < target ? "Higher." : "Lower.");
    if (g < target) lo = g + 1;
    else hi = g - 1;
  }
  fprintf(out, "]}\n");
}

// One multiply-tool row: a demonstration (train) or a GRPO prompt with its answer.
static void write_product(FILE *out, ct_rng *r, const char *prompt, const char *product, bool train, double noise) {
  if (!train) {
    fprintf(out, "{\"prompt\": [{\"role\": \"user\", \"content\": \"%s\"}], \"answer\": \"%s\"}\n", prompt, product);
    return;
  }
  if (noise > 0 && ct_rng_uniform(r) < noise) {  // a guess, no tool
    char guess[32];
    strcpy(guess, product);
    int i = (int)ct_rng_below(r, strlen(guess));
    guess[i] = (char)('0' + (guess[i] - '0' + 1 + (int)ct_rng_below(r, 8)) % 10);
    if (i == 0 && guess[0] == '0') guess[0] = '1';
    fprintf(out, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}, {\"role\": \"assistant\", "
            "\"content\": \"%s\"}]}\n", prompt, guess);
    return;
  }
  char expr[32];
  snprintf(expr, sizeof expr, "%.*s", (int)strlen(prompt) - 1, prompt);  // without the "="
  fprintf(out, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}, {\"role\": \"assistant\", \"content\": "
          "\"<tool_call>{\\\"name\\\": \\\"calculator\\\", \\\"arguments\\\": {\\\"expression\\\": \\\"%s\\\"}}"
          "</tool_call>\"}, {\"role\": \"tool\", \"name\": \"calculator\", \"content\": \"%s\"}, "
          "{\"role\": \"assistant\", \"content\": \"%s\"}]}\n", prompt, expr, product, product);
}

static unsigned long long make_addition(ct_rng *r, int digits, char *prompt, char *completion) {
  long range = 1;
  for (int i = 0; i < digits; i++) range *= 10;
  long a = (long)ct_rng_below(r, (uint64_t)range), b = (long)ct_rng_below(r, (uint64_t)range);
  // fixed width: every digit sits at the same position in every row
  int w = digits < 1 ? 1 : digits > 9 ? 9 : digits;  // (main allows 1-9; the bound shows the buffers suffice)
  sprintf(prompt, "%0*ld+%0*ld=", w, a, w, b);
  sprintf(completion, "%0*ld", w + 1, a + b);
  return ((unsigned long long)a * (unsigned long long)range + (unsigned long long)b) << 1;
}

typedef struct {
  bool prefs, kto, reverse;  // reverse-prefs, reverse-kto, reverse (or addition)
  bool tool;                 // multiply-tool
  bool guess;                // guess-env
  long n_train, n_eval;
  unsigned long long seed;
  int size;                // max_len (reverse) or digits (addition)
  double noise;
} opts;

// n_train n_eval seed max_len|digits noise: in this order, or as name=value in any order.
// 0, or the exit code after its message.
static int parse_args(int argc, char **argv, opts *o) {
  const char *names[] = {"n_train", "n_eval", "seed", o->reverse ? "max_len" : "digits", "noise"};
  unsigned long long v[4] = {20000, 500, 1234, o->reverse ? 8 : o->tool ? 6 : 3};
  o->noise = 0;
  for (int a = 4, pos = 0; a < argc; a++) {
    const char *eq = strchr(argv[a], '='), *text = eq ? eq + 1 : argv[a];
    int k = eq ? -1 : pos++;
    for (int j = 0; eq && j < 5; j++)
      if ((size_t)(eq - argv[a]) == strlen(names[j]) && !strncmp(argv[a], names[j], strlen(names[j]))) k = j;
    if (k < 0 || k > 4) {
      fprintf(stderr, "ctune-demo-data: '%s': expected %s\n", argv[a],
              eq ? "one of n_train=, n_eval=, seed=, max_len= (reverse) or digits= (addition), noise=" : "at most 5 numbers");
      return 2;
    }
    char *end;
    errno = 0;
    if (k < 4) v[k] = strtoull(text, &end, 10);
    else o->noise = strtod(text, &end);
    if (end == text || *end || errno || (k < 4 && !isdigit((unsigned char)text[0]))) {
      fprintf(stderr, "ctune-demo-data: %s: '%s' is not %s\n", names[k], text, k < 4 ? "a whole number" : "a number");
      return 2;
    }
  }
  o->n_train = v[0] > (1ull << 40) ? -1 : (long)v[0];
  o->n_eval = v[1] > (1ull << 40) ? -1 : (long)v[1];
  o->seed = v[2];
  o->size = v[3] > 64 ? -1 : (int)v[3];
  return 0;
}

// The values' ranges, and room for that many distinct rows. 0, or 2 after the message.
static int check_opts(const opts *o) {
  if (o->n_train < 1 || o->n_eval < 1 || (o->reverse && (o->size < 3 || o->size > 30)) ||
      (!o->reverse && (o->size < 1 || o->size > 9)) || !(o->noise >= 0 && o->noise < 1) ||
      (o->noise > 0 && (o->prefs || o->kto || (!o->reverse && !o->tool)))) {
    fprintf(stderr, "ctune-demo-data: out of range: n_train and n_eval >= 1, max_len 3-30 (reverse) or digits 1-9 "
            "(addition, multiply-tool), noise in [0, 1) and for reverse and multiply-tool only\n");
    return 2;
  }
  double distinct = 1;  // how many different rows exist
  for (int i = 0; i < (o->reverse ? o->size : 2 * o->size); i++)  // (multiply-tool: no leading zeros)
    distinct *= o->reverse ? 26 : o->tool && i % o->size == 0 ? 9 : 10;
  if (!o->guess && (double)(o->n_train + o->n_eval) > 0.5 * distinct) {
    fprintf(stderr, "ctune-demo-data: %ld rows would repeat: make the task larger\n", o->n_train + o->n_eval);
    return 2;
  }
  return 0;
}

// count rows not in `seen` into path (train: noisy demonstrations when o->noise > 0). 0 or 1.
static int write_rows(const opts *o, const char *path, long count, bool train, ct_rng *r, keyset *seen) {
  char prompt[64], completion[64], rejected[64];
  FILE *out = fopen(path, "w");
  if (!out) {
    fprintf(stderr, "ctune-demo-data: cannot write %s\n", path);
    return 1;
  }
  for (long i = 0; i < count;) {
    unsigned long long key = o->guess     ? 0
                             : o->reverse ? make_reverse(r, o->size, prompt, completion)
                             : o->tool  ? make_product(r, o->size, prompt, completion)
                                        : make_addition(r, o->size, prompt, completion);
    if (!o->guess && !keyset_add(seen, key)) continue;
    if (o->tool) {
      write_product(out, r, prompt, completion, train, o->noise);
      i++;
      continue;
    }
    if (o->guess) {  // (targets repeat: 100 of them)
      write_game(out, 1 + (int)ct_rng_below(r, 100), train);
      i++;
      continue;
    }
    char word[40];  // the prompt is "reverse <word>:"
    if (o->reverse) snprintf(word, sizeof word, "%.*s", (int)strlen(completion), prompt + 8);
    if (o->noise > 0 && train && ct_rng_uniform(r) < o->noise) {  // a mistaken demonstration
      near_miss(r, word, completion, rejected);
      strcpy(completion, rejected);
    }
    if (o->kto) {
      bool good = ct_rng_uniform(r) < 0.5;
      if (!good) near_miss(r, word, completion, rejected);
      fprintf(out, "{\"prompt\": \"%s\", \"completion\": \"%s\", \"label\": %s}\n", prompt,
              good ? completion : rejected, good ? "true" : "false");
    } else if (o->prefs) {
      near_miss(r, word, completion, rejected);
      fprintf(out, "{\"prompt\": \"%s\", \"chosen\": \"%s\", \"rejected\": \"%s\"}\n", prompt,
              completion, rejected);
    } else {
      fprintf(out, "{\"prompt\": \"%s\", \"completion\": \"%s\"}\n", prompt, completion);
    }
    i++;
  }
  if (fclose(out)) {
    fprintf(stderr, "ctune-demo-data: cannot write %s\n", path);
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (ct_config_help_asked(argc, argv)) return usage(stdout);
  if (argc < 4) return usage(stderr);
  opts o = {0};
  o.prefs = strcmp(argv[1], "reverse-prefs") == 0;
  o.kto = strcmp(argv[1], "reverse-kto") == 0;
  o.reverse = o.prefs || o.kto || strcmp(argv[1], "reverse") == 0;
  o.tool = strcmp(argv[1], "multiply-tool") == 0;
  o.guess = strcmp(argv[1], "guess-env") == 0;
  if (!o.reverse && !o.tool && !o.guess && strcmp(argv[1], "addition") != 0) return usage(stderr);
  int rc = parse_args(argc, argv, &o);
  if (rc || (rc = check_opts(&o))) return rc;
  keyset seen = {NULL, 1};
  while (seen.cap < 4 * (o.n_train + o.n_eval)) seen.cap *= 2;
  seen.slot = calloc((size_t)seen.cap, sizeof *seen.slot);
  if (!seen.slot) return 1;
  ct_rng r;
  ct_rng_seed(&r, o.seed);
  rc = write_rows(&o, argv[2], o.n_train, true, &r, &seen);
  if (!rc) rc = write_rows(&o, argv[3], o.n_eval, false, &r, &seen);
  free(seen.slot);
  return rc;
}
