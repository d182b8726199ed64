// prompt_rows: batches of prompts and their completions (GRPO's rollouts), one row per
// sequence, or one row per run of sequences that share a prompt (data.h).
#include <stdbool.h>
#include <string.h>

#include "data.h"

int ct_shared_row_tokens(int max_prompt, int max_completion, int per_row) {
  long t = (long)(max_prompt > 1 ? max_prompt - 1 : 0) + (long)per_row * (1 + max_completion);
  return t > 1 << 30 ? 1 << 30 : (int)t;
}

static bool same_prompt(const ct_prompt_completion *a, const ct_prompt_completion *b) {
  return a->np == b->np && (a->prompt == b->prompt || !memcmp(a->prompt, b->prompt, sizeof(int) * a->np));
}

// The run of sequences from i that share one row (at most max_run): [i, *end). Returns the
// row's tokens.
static long row_run(const ct_prompt_completion *s, int n, int i, int max_run, int *end) {
  int e = i + 1;
  while (s[i].np >= 2 && e < n && e - i < max_run && same_prompt(&s[i], &s[e])) e++;
  *end = e;
  if (e == i + 1) return (long)s[i].np + s[i].nc;
  long t = s[i].np - 1;
  for (int k = i; k < e; k++) t += 1 + s[k].nc;
  return t;
}

// Token t of a row: id, position, first key it sees, prefix it also sees, target; and for a
// target, its sequence and the completion token's index.
static void put(ct_batch *b, long at, int id, int pos, int seg, int pre) {
  b->ids[at] = id;
  b->pos[at] = pos;
  b->seg[at] = seg;
  b->pre[at] = pre;
  b->target[at] = -1;
  b->tok_seq[at] = -1;
  b->tok_j[at] = -1;
}

// Completion tokens of sequence k: the token at `at + u` predicts comp[u] when kept (u >=
// u0: without a prompt nothing predicts comp[0]).
static void targets(ct_batch *b, long at, const ct_prompt_completion *s, int k, int u0) {
  for (int u = u0; u < s[k].nc; u++) {
    if (s[k].keep && !s[k].keep[u]) continue;
    b->target[at + u] = s[k].comp[u];
    b->tok_seq[at + u] = k;
    b->tok_j[at + u] = u;
    b->n_target++;
  }
}

// Sequences [i, e) into row `row`: alone (e == i + 1) as prompt then completion; shared as
// the prompt's first np − 1 tokens, then per sequence its last prompt token and completion.
static void fill_row(ct_batch *b, int row, const ct_prompt_completion *s, int i, int e, int pad) {
  long r0 = (long)row * b->T;
  int np = s[i].np, t = 0;
  if (e == i + 1) {
    for (; t < np; t++) put(b, r0 + t, s[i].prompt[t], t, 0, 0);
    for (int u = 0; u < s[i].nc; u++, t++) put(b, r0 + t, s[i].comp[u], t, 0, 0);
    targets(b, r0 + np - 1, s, i, np >= 1 ? 0 : 1);
  } else {
    for (; t < np - 1; t++) put(b, r0 + t, s[i].prompt[t], t, 0, 0);
    for (int k = i; k < e; k++) {
      int start = t;
      put(b, r0 + t++, s[k].prompt[np - 1], np - 1, start, np - 1);
      for (int u = 0; u < s[k].nc; u++, t++) put(b, r0 + t, s[k].comp[u], np + u, start, np - 1);
      targets(b, r0 + start, s, k, 0);
    }
  }
  b->n_tokens += t;
  for (; t < b->T; t++) put(b, r0 + t, pad, 0, t, 0);  // padding sees itself only
}

bool ct_batch_completions(ct_batch *b, const ct_prompt_completion *s, int n, int pad_id, int max_run, int max_T) {
  int rows = 0, end;
  long longest = 1, alone = 1;  // the longest row shared, and one row per sequence
  for (int i = 0; i < n; i = end, rows++) {
    long len = row_run(s, n, i, max_run, &end);
    longest = len > longest ? len : longest;
  }
  for (int i = 0; i < n; i++) alone = s[i].np + s[i].nc > alone ? s[i].np + s[i].nc : alone;
  // shared rows, padded, may not outgrow one row per sequence (a run cut short by the
  // micro-batch's end beside full ones): then they go one per sequence
  bool shared = rows < n && longest <= max_T && (long)rows * longest <= (long)n * alone;
  if (!shared) max_run = 1, rows = n, longest = alone;
  int T = (int)longest;
  b->B = rows;
  b->T = T;
  b->has_pre = shared;
  b->n_target = b->n_tokens = 0;
  int row = 0;
  for (int i = 0; i < n; i = end, row++) {
    row_run(s, n, i, max_run, &end);
    fill_row(b, row, s, i, end, pad_id);
  }
  return shared;
}
