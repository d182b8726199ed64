// prefs: DPO preference pairs from JSONL into flat token arrays (prompt, chosen,
// rejected per pair) with TRL's truncation, and the packed micro-batch of 2m rows.
#include "prefs.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "jsonl.h"
#include "mem.h"

typedef struct {
  ct_pref_dataset *ds;
  const ct_tokenizer *tok;
  const ct_pref_opts *o;
  int line;
  const json_t *row;  // the row being read (its tools and chat_template_kwargs)
  long cap_tokens, cap_rows;
  ct_ids p, c, r;  // the row being built
  float margin;    // its margin (reward pairs)
  long cap_margin;
  int label;       // unpaired: the row's label (1, 0), or -1 for a pair (unpaired after loading)
  int kinds;       // unpaired: bit 0 a row of pairs seen, bit 1 an unpaired row seen
  long cap_label;
} loader;

// Row-level error: "path:line: message"; CT_EFORMAT lets the caller skip the row.
#define ROW_ERROR(L, ...) ct_row_error((L)->ds->path, (L)->line, __VA_ARGS__)

static int encode(loader *L, const char *text, ct_ids *out) {
  return ct_tokenizer_encode(L->tok, text, strlen(text), true, out);
}

static int ids_list(loader *L, const json_t *list, const char *key, ct_ids *out) {
  if (ct_jsonl_ids(list, ct_tokenizer_vocab_size(L->tok), L->o->model_vocab, key, out))
    return ROW_ERROR(L, "%s", ct_last_error());
  return 0;
}

// Prompt tokens: BOS when the tokenizer adds one and the text does not start with it.
static int encode_prompt(loader *L, const char *text) {
  return ct_tokenizer_encode_doc(L->tok, text, strlen(text), &L->p) ? CT_ENOMEM : 0;
}

// A conversational completion: the template's text for prompt + completion, minus the
// text it renders for the prompt with the generation prompt (TRL's string split).
static int chat_completion(loader *L, const json_t *prompt, const char *ptext, const json_t *comp,
                           const char *key, ct_ids *out) {
  json_t *all = json_copy((json_t *)prompt);
  json_array_extend(all, (json_t *)comp);
  char *full;
  int rc = ct_row_chat(L->tok, L->row, all, key, false, &full);
  json_decref(all);
  if (rc) return ROW_ERROR(L, "%s", ct_last_error());
  size_t np = strlen(ptext);
  if (strncmp(full, ptext, np) != 0)
    rc = ROW_ERROR(L, "key '%s': the chat template renders the prompt differently once the "
                   "completion follows it, so the completion cannot be split off", key);
  else
    rc = encode(L, full + np, out);
  free(full);
  return rc;
}

// Where TRL's extract_prompt splits chosen and rejected strings: a byte offset. It walks
// both by code point to the first that differs, and leaves a space before it to the
// completions; when one string is a prefix of the other its loop ends on the last common
// code point, which then starts the completions (kept, as TRL does: no completion is empty).
static size_t shared_text(const char *c, const char *r) {
  size_t nc = strlen(c), nr = strlen(r), i = 0, last = 0;
  while (i < nc && i < nr) {
    unsigned char b = (unsigned char)c[i];
    size_t k = b < 0x80 ? 1 : b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 1;
    if (i + k > nc || i + k > nr || memcmp(c + i, r + i, k)) return i > 0 && c[i - 1] == ' ' ? i - 1 : i;
    last = i;
    i += k;
  }
  return last;
}

// The same for message lists: whole messages, compared as JSON values.
static size_t shared_messages(const json_t *c, const json_t *r) {
  size_t n = json_array_size(c) < json_array_size(r) ? json_array_size(c) : json_array_size(r);
  for (size_t i = 0; i < n; i++)
    if (!json_equal(json_array_get(c, i), json_array_get(r, i))) return i;
  return n ? n - 1 : 0;
}

static json_t *slice(const json_t *a, size_t from, size_t to) {
  json_t *s = json_array();
  for (size_t i = from; s && i < to; i++) json_array_append(s, json_array_get(a, i));
  return s;
}

// TRL's implicit prompt (maybe_extract_prompt): chosen and rejected hold the whole
// conversation or text, and their shared start is the prompt. New references in x[3].
static int extract_prompt(loader *L, const json_t *c, const json_t *r, json_t *x[3]) {
  size_t n;
  if (json_is_string(c) && json_is_string(r)) {
    const char *cs = json_string_value(c), *rs = json_string_value(r);
    n = shared_text(cs, rs);
    x[0] = json_stringn(cs, n), x[1] = json_string(cs + n), x[2] = json_string(rs + n);
  } else if (json_is_array(c) && json_is_array(r)) {
    n = shared_messages(c, r);
    x[0] = slice(c, 0, n), x[1] = slice(c, n, json_array_size(c)), x[2] = slice(r, n, json_array_size(r));
  } else {
    return ROW_ERROR(L, "keys 'chosen' and 'rejected': expected two strings or two message lists");
  }
  if (!x[0] || !x[1] || !x[2]) return ct_set_error(CT_ENOMEM, "preference data: out of memory");
  if (n == 0)
    return ROW_ERROR(L, "key 'prompt' is missing and 'chosen' and 'rejected' share no start to take "
                     "as the prompt (TRL's implicit prompt)");
  return 0;
}

static int pair(loader *L, const json_t *j, const json_t *p, const json_t *c, const json_t *r);

// One whole reward-model answer: the prompt (NULL: none) and the answer as one text (with
// EOS appended when missing) or one conversation through the chat template (no generation
// prompt), tokenized as a document (one BOS).
static int reward_answer(loader *L, const json_t *p, const json_t *a, const char *key, ct_ids *out) {
  char *text = NULL;
  int rc = 0;
  if (json_is_string(a) && (!p || json_is_string(p))) {
    const char *ps = p ? json_string_value(p) : "", *as = json_string_value(a);
    if (!*as) return ROW_ERROR(L, "key '%s': the answer is empty", key);
    size_t np = strlen(ps), na = strlen(as);
    if (!(text = malloc(np + na + 1))) return ct_set_error(CT_ENOMEM, "preference data: out of memory");
    memcpy(text, ps, np);
    memcpy(text + np, as, na + 1);
  } else if (json_is_array(a) && (!p || json_is_array(p))) {
    if (!json_array_size(a)) return ROW_ERROR(L, "key '%s': the answer is empty", key);
    json_t *all = p ? json_copy((json_t *)p) : json_array();
    json_array_extend(all, (json_t *)a);
    rc = ct_row_chat(L->tok, L->row, all, key, false, &text);
    json_decref(all);
    if (rc) return ROW_ERROR(L, "%s", ct_last_error());
  } else {
    return ROW_ERROR(L, "keys 'prompt' and '%s': expected strings or message lists (both of one kind)", key);
  }
  rc = ct_tokenizer_encode_doc(L->tok, text, strlen(text), out) ? CT_ENOMEM : 0;
  int eos = ct_tokenizer_eos(L->tok);
  if (!rc && json_is_string(a) && eos >= 0 && (out->n == 0 || out->v[out->n - 1] != eos)) rc = ct_ids_push(out, eos);
  free(text);
  return rc;
}

// A reward pair (TRL's RewardTrainer): the margin, then pre-tokenized answers (TRL's
// chosen_ids / rejected_ids, or the older chosen_input_ids / rejected_input_ids, after
// prompt_input_ids when given) or prompt + each answer as a whole sequence. The prompt
// list stays empty: each answer holds the whole sequence.
static int reward_row(loader *L, const json_t *j, const json_t *pi) {
  const json_t *m = json_object_get(j, "margin");
  if (m && !json_is_number(m)) return ROW_ERROR(L, "key 'margin': expected a number");
  L->margin = m ? (float)json_number_value(m) : 0.0f;
  const char *ck = json_object_get(j, "chosen_ids") ? "chosen_ids" : "chosen_input_ids";
  const char *rk = json_object_get(j, "rejected_ids") ? "rejected_ids" : "rejected_input_ids";
  const json_t *c = json_object_get(j, ck), *r = json_object_get(j, rk);
  if (c || r) {
    if (!c || !r) {  // the missing key, in the naming the present one uses
      bool older = c ? !strcmp(ck, "chosen_input_ids") : !strcmp(rk, "rejected_input_ids");
      const char *miss = c ? (older ? "rejected_input_ids" : "rejected_ids") : (older ? "chosen_input_ids" : "chosen_ids");
      return ROW_ERROR(L, "key '%s' is missing (a pre-tokenized pair gives both answers)", miss);
    }
    int rc = pi ? ids_list(L, pi, "prompt_input_ids", &L->p) : 0;
    if (!rc) rc = ids_list(L, c, ck, &L->c);
    if (!rc) rc = ids_list(L, r, rk, &L->r);
    return rc;
  }
  const json_t *p = json_object_get(j, "prompt");
  c = json_object_get(j, "chosen"), r = json_object_get(j, "rejected");
  const char *missing = !c ? "chosen" : !r ? "rejected" : NULL;
  if (missing) return ROW_ERROR(L, "key '%s' is missing", missing);
  int rc = reward_answer(L, p, c, "chosen", &L->c);
  if (!rc) rc = reward_answer(L, p, r, "rejected", &L->r);
  return rc;
}

// An unpaired row (TRL's KTO format): prompt and completion (strings, or message lists
// through the chat template as a pair's completions are), and a boolean label.
static int unpaired_row(loader *L, const json_t *j) {
  const json_t *p = json_object_get(j, "prompt"), *c = json_object_get(j, "completion"),
               *lab = json_object_get(j, "label");
  const char *missing = !p ? "prompt" : !c ? "completion" : !lab ? "label" : NULL;
  if (missing) return ROW_ERROR(L, "key '%s' is missing (an unpaired row is {\"prompt\", \"completion\", "
                                "\"label\": true or false})", missing);
  if (!json_is_boolean(lab)) return ROW_ERROR(L, "key 'label': expected true or false");
  L->label = json_is_true(lab);
  if (json_is_string(p) && json_is_string(c)) {
    if (!*json_string_value(c)) return ROW_ERROR(L, "key 'completion': the completion is empty");
    int eos = ct_tokenizer_eos(L->tok);
    int rc = encode_prompt(L, json_string_value(p));
    if (!rc) rc = encode(L, json_string_value(c), &L->c);
    if (!rc && eos >= 0) rc = ct_ids_push(&L->c, eos);
    return rc;
  }
  if (json_is_array(p) && json_is_array(c)) {
    if (!json_array_size(c)) return ROW_ERROR(L, "key 'completion': the completion is empty");
    char *ptext;
    int rc = ct_row_chat(L->tok, j, p, "prompt", true, &ptext);
    if (rc) return ROW_ERROR(L, "%s", ct_last_error());
    rc = encode_prompt(L, ptext);
    if (!rc) rc = chat_completion(L, p, ptext, c, "completion", &L->c);
    free(ptext);
    return rc;
  }
  return ROW_ERROR(L, "keys 'prompt' and 'completion': expected two strings or two message lists");
}

static int row(loader *L, const json_t *j) {
  if (!json_is_object(j)) return ROW_ERROR(L, "expected a JSON object");
  L->row = j;
  if (L->o->unpaired) {  // unpaired rows, or pairs to unpair; not both in one file
    bool un = json_object_get(j, "completion") || json_object_get(j, "label");
    int kind = un ? 2 : 1;
    if (L->kinds && !(L->kinds & kind))
      return ROW_ERROR(L, "%s row in a file of %s rows: use one kind per file", un ? "an unpaired" : "a paired",
                       un ? "paired" : "unpaired");
    L->kinds |= kind;
    L->label = -1;
    if (un) return unpaired_row(L, j);
  }
  const json_t *pi = json_object_get(j, "prompt_input_ids");
  if (L->o->reward) return reward_row(L, j, pi);
  if (pi) {
    int rc = ids_list(L, pi, "prompt_input_ids", &L->p);
    if (!rc) rc = ids_list(L, json_object_get(j, "chosen_input_ids"), "chosen_input_ids", &L->c);
    if (!rc) rc = ids_list(L, json_object_get(j, "rejected_input_ids"), "rejected_input_ids", &L->r);
    return rc;
  }
  const json_t *p = json_object_get(j, "prompt"), *c = json_object_get(j, "chosen"),
               *r = json_object_get(j, "rejected");
  const char *missing = !c ? "chosen" : !r ? "rejected" : NULL;
  if (missing) return ROW_ERROR(L, "key '%s' is missing", missing);
  // as TRL: no prompt, or a prompt of another kind than the completions (a string beside
  // conversations), means the prompt is inside chosen and rejected
  if (p && json_is_array(p) == json_is_array(c)) return pair(L, j, p, c, r);
  json_t *x[3] = {NULL, NULL, NULL};
  int rc = extract_prompt(L, c, r, x);
  if (!rc) rc = pair(L, j, x[0], x[1], x[2]);
  for (int k = 0; k < 3; k++) json_decref(x[k]);
  return rc;
}

// A pair from its prompt, chosen and rejected (strings, or message lists).
static int pair(loader *L, const json_t *j, const json_t *p, const json_t *c, const json_t *r) {
  if (json_is_string(p) && json_is_string(c) && json_is_string(r)) {
    if (!*json_string_value(c) || !*json_string_value(r))
      return ROW_ERROR(L, "key '%s': the completion is empty", *json_string_value(c) ? "rejected" : "chosen");
    int eos = ct_tokenizer_eos(L->tok);
    int rc = encode_prompt(L, json_string_value(p));
    if (!rc) rc = encode(L, json_string_value(c), &L->c);
    if (!rc) rc = encode(L, json_string_value(r), &L->r);
    if (!rc && eos >= 0 && (rc = ct_ids_push(&L->c, eos)) == 0) rc = ct_ids_push(&L->r, eos);
    return rc;
  }
  if (json_is_array(p) && json_is_array(c) && json_is_array(r)) {
    if (!json_array_size(c) || !json_array_size(r))
      return ROW_ERROR(L, "key '%s': the completion is empty", json_array_size(c) ? "rejected" : "chosen");
    char *ptext;
    int rc = ct_row_chat(L->tok, j, p, "prompt", true, &ptext);
    if (rc) return ROW_ERROR(L, "%s", ct_last_error());
    rc = encode_prompt(L, ptext);
    if (!rc) rc = chat_completion(L, p, ptext, c, "chosen", &L->c);
    if (!rc) rc = chat_completion(L, p, ptext, r, "rejected", &L->r);
    free(ptext);
    return rc;
  }
  return ROW_ERROR(L, "keys 'prompt', 'chosen', 'rejected': expected three strings or three "
                   "message lists");
}

static int grow(void **p, long *cap, long need, size_t elem) {
  if (need <= *cap) return 0;
  long c = *cap ? *cap : 1024;
  while (c < need) c *= 2;
  void *q = realloc(*p, elem * (size_t)c);
  if (!q) return ct_set_error(CT_ENOMEM, "preference data: out of memory");
  *p = q;
  *cap = c;
  return 0;
}

// Truncates as TRL does and appends the pair.
static int keep(loader *L) {
  const ct_pref_opts *o = L->o;
  ct_pref_dataset *ds = L->ds;
  int np = L->p.n, nc = L->c.n, nr = L->r.n;
  const int *pv = L->p.v;
  bool cut = false;
  if (o->max_prompt_length > 0 && np > o->max_prompt_length) {  // keep the end of the prompt
    pv += np - o->max_prompt_length;
    np = o->max_prompt_length;
    cut = true;
  }
  bool one = o->unpaired && L->label >= 0;  // an unpaired row: one completion
  if (nc == 0 || (nr == 0 && !one))
    return ROW_ERROR(L, "key '%s': the completion has no tokens", one ? "completion" : nc ? "rejected" : "chosen");
  // the first completion token is predicted from the token before it
  if (np == 0 && !o->reward) return ROW_ERROR(L, "key 'prompt': the prompt has no tokens, so nothing predicts "
                                "the first completion token");
  if (o->reward && (np + nc > o->max_length || np + nr > o->max_length)) {  // TRL drops these
    ds->n_dropped++;
    return 0;
  }
  if (o->max_completion_length > 0) {
    if (nc > o->max_completion_length) nc = o->max_completion_length, cut = true;
    if (nr > o->max_completion_length) nr = o->max_completion_length, cut = true;
  }
  if (np >= o->max_length)
    return ROW_ERROR(L, "the prompt has %d tokens, which leaves no room for the completion "
                     "within max_length %d (raise max_length or set max_prompt_length)", np, o->max_length);
  if (np + nc > o->max_length) nc = o->max_length - np, cut = true;
  if (np + nr > o->max_length) nr = o->max_length - np, cut = true;
  ds->n_truncated += cut;
  long need = ds->n_tokens + np + nc + nr;
  long cr = L->cap_rows, c2 = cr, c3 = cr, c4 = cr, c5 = cr;
  if (grow((void **)&ds->ids, &L->cap_tokens, need, sizeof(int)) ||
      grow((void **)&ds->start, &cr, ds->n + 1, sizeof(long)) ||
      grow((void **)&ds->p_len, &c2, ds->n + 1, sizeof(int)) ||
      grow((void **)&ds->c_len, &c3, ds->n + 1, sizeof(int)) ||
      grow((void **)&ds->r_len, &c4, ds->n + 1, sizeof(int)) ||
      grow((void **)&ds->line, &c5, ds->n + 1, sizeof(int)))
    return CT_ENOMEM;
  L->cap_rows = cr;
  if (o->reward) {
    long cm = L->cap_margin;
    if (grow((void **)&ds->margin, &cm, ds->n + 1, sizeof(float))) return CT_ENOMEM;
    L->cap_margin = cm;
    ds->margin[ds->n] = L->margin;
  }
  if (o->unpaired) {
    long cl = L->cap_label;
    if (grow((void **)&ds->label, &cl, ds->n + 1, 1)) return CT_ENOMEM;
    L->cap_label = cl;
    ds->label[ds->n] = (signed char)L->label;
  }
  int *dst = ds->ids + ds->n_tokens;
  if (np) memcpy(dst, pv, sizeof(int) * np);
  memcpy(dst + np, L->c.v, sizeof(int) * nc);
  if (nr) memcpy(dst + np + nc, L->r.v, sizeof(int) * nr);  // (an unpaired row has none)
  ds->start[ds->n] = ds->n_tokens;
  ds->p_len[ds->n] = np;
  ds->c_len[ds->n] = nc;
  ds->r_len[ds->n] = nr;
  ds->line[ds->n] = L->line;
  ds->n++;
  ds->n_tokens = need;
  return 0;
}

static int load_row(void *ctx, json_t *j, int line) {
  loader *L = ctx;
  L->line = line;
  L->p.n = L->c.n = L->r.n = 0;
  int rc = row(L, j);
  return rc ? rc : keep(L);
}

// A file of pairs made unpaired as TRL's unpair_preference_dataset does (a batched map of
// 1000 rows): per block of 1000 pairs, each pair's prompt + chosen (desirable), then each
// one's prompt + rejected (undesirable).
static int unpair(ct_pref_dataset *ds) {
  int n = 2 * ds->n;
  long tokens = 0;
  for (int k = 0; k < ds->n; k++) tokens += 2L * ds->p_len[k] + ds->c_len[k] + ds->r_len[k];
  int *ids = malloc(sizeof(int) * (tokens > 0 ? tokens : 1)), *p_len = malloc(sizeof(int) * n);
  int *c_len = malloc(sizeof(int) * n), *r_len = calloc(n, sizeof(int)), *line = malloc(sizeof(int) * n);
  long *start = malloc(sizeof(long) * n);
  signed char *label = malloc(n);
  if (!ids || !p_len || !c_len || !r_len || !line || !start || !label) {
    ct_free_all(ids, p_len, c_len, r_len, line, start, label);
    return ct_set_error(CT_ENOMEM, "%s: out of memory", ds->path);
  }
  long at = 0;
  int e = 0;
  for (int b0 = 0; b0 < ds->n; b0 += 1000) {
    int b1 = ds->n - b0 < 1000 ? ds->n : b0 + 1000;
    for (int chosen = 1; chosen >= 0; chosen--)
      for (int k = b0; k < b1; k++, e++) {
        const int *p = ds->ids + ds->start[k], *c = p + ds->p_len[k] + (chosen ? 0 : ds->c_len[k]);
        int np = ds->p_len[k], nc = chosen ? ds->c_len[k] : ds->r_len[k];
        memcpy(ids + at, p, sizeof(int) * np);
        memcpy(ids + at + np, c, sizeof(int) * nc);
        start[e] = at, p_len[e] = np, c_len[e] = nc, line[e] = ds->line[k], label[e] = (signed char)chosen;
        at += np + nc;
      }
  }
  ct_free_all(ds->ids, ds->p_len, ds->c_len, ds->r_len, ds->line, ds->start, ds->label);
  char first_bad[sizeof ds->first_bad];
  memcpy(first_bad, ds->first_bad, sizeof first_bad);
  *ds = (ct_pref_dataset){.path = ds->path, .n = n, .ids = ids, .n_tokens = at, .start = start, .p_len = p_len,
                          .c_len = c_len, .r_len = r_len, .line = line, .label = label, .n_lines = ds->n_lines,
                          .n_bad = ds->n_bad, .n_truncated = ds->n_truncated, .n_dropped = ds->n_dropped,
                          .max_length = ds->max_length};
  memcpy(ds->first_bad, first_bad, sizeof first_bad);
  return 0;
}

int ct_pref_load(ct_pref_dataset *ds, const char *path, const ct_tokenizer *tok,
                 const ct_pref_opts *o) {
  memset(ds, 0, sizeof *ds);
  if (!(ds->path = strdup(path))) return ct_set_error(CT_ENOMEM, "%s: out of memory", path);
  loader L = {.ds = ds, .tok = tok, .o = o};
  ct_jsonl_stats st;
  int rc = ct_jsonl_read(path, o->skip_bad_rows, load_row, &L, &st);
  ds->n_lines = st.n_lines;
  ds->n_bad = st.n_bad;
  memcpy(ds->first_bad, st.first_bad, sizeof ds->first_bad);
  ct_ids_free(&L.p);
  ct_ids_free(&L.c);
  ct_ids_free(&L.r);
  if (!rc && ds->n == 0)
    rc = ct_set_error(CT_EFORMAT, "%s: no usable preference %s (%d lines, %d malformed%s)", path,
                      o->unpaired ? "rows" : "pairs", ds->n_lines, ds->n_bad,
                      ds->n_dropped ? ", the rest longer than max_length" : "");
  ds->max_length = o->max_length;
  if (!rc && o->unpaired && L.kinds == 1) rc = unpair(ds);
  if (rc) ct_pref_free(ds);  // frees only: the error message stays
  return rc;
}

void ct_pref_free(ct_pref_dataset *ds) {
  ct_free_all(ds->path, ds->ids, ds->start, ds->p_len, ds->c_len, ds->r_len, ds->line, ds->margin, ds->label);
  memset(ds, 0, sizeof *ds);
}

int ct_pref_max_len(const ct_pref_dataset *ds) {
  int m = 1;
  if (ds->label) {  // any prompt beside any completion (the KL rows), up to max_length
    int mp = 0, mc = 0;
    for (int i = 0; i < ds->n; i++) {
      mp = ds->p_len[i] > mp ? ds->p_len[i] : mp;
      mc = ds->c_len[i] > mc ? ds->c_len[i] : mc;
    }
    m = mp + mc;
    return ds->max_length > 0 && m > ds->max_length ? ds->max_length : m;
  }
  for (int i = 0; i < ds->n; i++) {
    int a = ds->p_len[i] + ds->c_len[i], b = ds->p_len[i] + ds->r_len[i];
    m = a > m ? a : m;
    m = b > m ? b : m;
  }
  return m;
}


void ct_pref_batch(ct_batch *b, const ct_pref_dataset *ds, const int *pairs, int n, int pad_id) {
  int T = 1;
  for (int i = 0; i < n; i++) {
    int k = pairs[i], a = ds->p_len[k] + ds->c_len[k], r = ds->p_len[k] + ds->r_len[k];
    T = a > T ? a : T;
    T = r > T ? r : T;
  }
  b->B = 2 * n;
  b->T = T;
  b->n_target = b->n_tokens = 0;
  for (int i = 0; i < n; i++) {
    int k = pairs[i];
    const int *p = ds->ids + ds->start[k], *c = p + ds->p_len[k], *r = c + ds->c_len[k];
    b->row_seq[i] = b->row_seq[n + i] = k;
    ct_batch_row(b, i, p, ds->p_len[k], c, ds->c_len[k], pad_id);
    ct_batch_row(b, n + i, p, ds->p_len[k], r, ds->r_len[k], pad_id);
  }
}

void ct_pref_batch_unpaired(ct_batch *b, const ct_pref_dataset *ds, const int *rows, int n, bool kl, int pad_id) {
  b->B = kl ? 2 * n : n;
  b->T = 1;
  b->n_target = b->n_tokens = 0;
  for (int pass = 0; pass < 2; pass++)  // the width first, then the rows
    for (int i = 0; i < n; i++) {
      int k = rows[i], j = rows[(i + n - 1) % n], np = ds->p_len[k];
      const int *p = ds->ids + ds->start[k];
      int nk = ds->c_len[j];  // the KL row: prompt k, example j's completion, within max_length
      if (ds->max_length > 0 && np + nk > ds->max_length) nk = ds->max_length - np;
      if (pass == 0) {
        int w = np + ds->c_len[k] > (kl ? np + nk : 0) ? np + ds->c_len[k] : np + nk;
        b->T = w > b->T ? w : b->T;
        continue;
      }
      b->row_seq[i] = k;
      ct_batch_row(b, i, p, np, p + np, ds->c_len[k], pad_id);
      if (!kl) continue;
      b->row_seq[n + i] = k;
      ct_batch_row(b, n + i, p, np, ds->ids + ds->start[j] + ds->p_len[j], nk, pad_id);
    }
}
