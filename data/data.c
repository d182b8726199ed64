// data: SFT-style JSONL rows tokenized into one flat array with label flags, packing
// (best-fit decreasing), and padded micro-batches. DPO pairs and prompts have their own
// readers (prefs.c, prompts.c) over the same JSONL reader.
#include "data.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "jsonl.h"
#include "mem.h"
#include "rowmap.h"

// ---------------------------------------------------------------------------
// Growable storage

static int grow(void **p, long *cap, long need, size_t elem) {
  if (need <= *cap) return 0;
  long c = *cap ? *cap : 1024;
  while (c < need) c *= 2;
  void *q = realloc(*p, elem * (size_t)c);
  if (!q) return ct_set_error(CT_ENOMEM, "dataset: out of memory");
  *p = q;
  *cap = c;
  return 0;
}

typedef struct {
  ct_dataset *ds;
  const ct_tokenizer *tok;
  const ct_data_opts *o;
  long cap_tokens, cap_rows;
  const json_t *row;  // the row being read (its tools and chat_template_kwargs)
  ct_ids ids;       // the row being built
  uint8_t *label;   // its labels
  long cap_label;
  int line;
} loader;

// Row-level error: "path:line: message"; CT_EFORMAT lets the caller skip the row.
#define ROW_ERROR(L, ...) ct_row_error((L)->ds->path, (L)->line, __VA_ARGS__)

// Appends ids [from, ids.n) labels with value `lab`.
static int label_to_end(loader *L, int from, uint8_t lab) {
  if (grow((void **)&L->label, &L->cap_label, L->ids.n, 1)) return CT_ENOMEM;
  for (int i = from; i < L->ids.n; i++) L->label[i] = lab;
  return 0;
}

static int ensure_eos(loader *L) {
  int eos = ct_tokenizer_eos(L->tok);
  if (eos < 0 || (L->ids.n && L->ids.v[L->ids.n - 1] == eos)) return 0;
  return ct_ids_push(&L->ids, eos);
}

// After a chat template: drop a BOS the tokenizer would add if the template wrote one.
static int chat_text(loader *L, const json_t *msgs, bool gen, const char *key, char **out) {
  return ct_row_chat(L->tok, L->row, msgs, key, gen, out) ? ROW_ERROR(L, "%s", ct_last_error()) : 0;
}

// A document's tokens: BOS when the tokenizer adds one (once, if the text has its own).
static int encode_doc(loader *L, const char *text) {
  return ct_tokenizer_encode_doc(L->tok, text, strlen(text), &L->ids) ? CT_ENOMEM : 0;
}

static int row_text(loader *L, const char *text) {
  if (encode_doc(L, text) || ensure_eos(L)) return CT_ENOMEM;
  return label_to_end(L, 0, 1);
}

// prompt + completion: tokenize prompt alone and the whole text once; the prompt's
// length marks the boundary, as TRL does, and a prompt that is not a prefix of the
// whole is counted (merges across the seam, templates that differ).
static int row_prompt_completion(loader *L, const char *prompt, const char *full, bool eos) {
  if (encode_doc(L, prompt)) return CT_ENOMEM;
  int np = L->ids.n;
  int *p = malloc(sizeof(int) * (np ? np : 1));
  if (!p) return ct_set_error(CT_ENOMEM, "dataset: out of memory");
  if (np) memcpy(p, L->ids.v, sizeof(int) * np);  // (an empty prompt's ids may be NULL)
  L->ids.n = 0;
  if (encode_doc(L, full) || (eos && ensure_eos(L))) {
    free(p);
    return CT_ENOMEM;
  }
  if (L->ids.n < np || (np && memcmp(p, L->ids.v, sizeof(int) * np) != 0)) L->ds->n_prefix_mismatch++;
  free(p);
  if (np > L->ids.n) np = L->ids.n;
  if (label_to_end(L, 0, L->o->completion_only_loss ? 0 : 1)) return CT_ENOMEM;
  return label_to_end(L, np, 1);
}

// A conversation: the chat template's text, no EOS added (the template ends turns).
// With assistant_only_loss, labels only on what the template marks {% generation %}.
static int row_messages(loader *L, const json_t *msgs, const char *key) {
  if (!L->o->assistant_only_loss) {
    char *text;
    int rc = chat_text(L, msgs, false, key, &text);
    if (!rc) rc = encode_doc(L, text);
    free(text);
    return rc ? rc : label_to_end(L, 0, 1);
  }
  if (!ct_tokenizer_chat_has_generation(L->tok))
    return ROW_ERROR(L, "assistant_only_loss needs a chat template with {%% generation %%} "
                     "markers, and this tokenizer's template has none");
  char *text;
  size_t len;
  ct_span *gen = NULL;
  int ngen = 0;
  ct_chat_opts co;
  if (ct_row_chat_opts(L->row, false, &co)) return ROW_ERROR(L, "%s", ct_last_error());
  int rc = ct_tokenizer_chat_render(L->tok, msgs, &co, &text, &len, &gen, &ngen);
  if (rc) ct_wrap_error(rc, "key '%s'", key);
  else rc = ct_row_chat_check(L->tok, msgs, &co, key);
  if (rc) {
    free(text);
    free(gen);
    return ROW_ERROR(L, "%s", ct_last_error());
  }
  ct_ids mask = {0};
  int bos = ct_tokenizer_bos(L->tok);
  bool add_bos = ct_tokenizer_add_bos(L->tok) && bos >= 0;
  if (add_bos && (rc = ct_ids_push(&L->ids, bos)) == 0) rc = ct_ids_push(&mask, 0);
  if (!rc) rc = ct_tokenizer_encode_masked(L->tok, text, len, gen, ngen, &L->ids, &mask);
  // one BOS only: drop ours when the template wrote one
  if (!rc && add_bos && L->ids.n > 1 && L->ids.v[1] == bos) {
    memmove(L->ids.v, L->ids.v + 1, sizeof(int) * (L->ids.n - 1));
    memmove(mask.v, mask.v + 1, sizeof(int) * (mask.n - 1));
    L->ids.n--;
    mask.n--;
  }
  if (!rc) rc = grow((void **)&L->label, &L->cap_label, L->ids.n, 1);
  for (int i = 0; !rc && i < L->ids.n; i++) L->label[i] = (uint8_t)mask.v[i];
  free(text);
  free(gen);
  ct_ids_free(&mask);
  return rc;
}

static char *concat(const char *a, const char *b) {
  size_t na = strlen(a), nb = strlen(b);
  char *s = malloc(na + nb + 1);
  if (!s) return NULL;
  memcpy(s, a, na);
  memcpy(s + na, b, nb + 1);
  return s;
}

// A conversational prompt/completion: the template's text for the prompt (with the
// generation prompt) and for the whole, split as row_prompt_completion does.
static int row_chat_prompt_completion(loader *L, const json_t *prompt, const json_t *comp) {
  json_t *all = json_copy((json_t *)prompt);
  if (!all || json_array_extend(all, (json_t *)comp)) {
    json_decref(all);
    return ct_set_error(CT_ENOMEM, "dataset: out of memory");
  }
  char *p = NULL, *f = NULL;
  int rc = chat_text(L, prompt, true, "prompt", &p);
  if (!rc) rc = chat_text(L, all, false, "completion", &f);
  if (!rc) rc = row_prompt_completion(L, p, f, false);
  free(p);
  free(f);
  json_decref(all);
  return rc;
}

static int push_id_list(loader *L, const json_t *list, const char *key, uint8_t lab);

static int row_pretokenized(loader *L, const json_t *row, const json_t *ids) {
  const json_t *mask = json_object_get(row, "completion_mask");
  if (mask && (!json_is_array(mask) || json_array_size(mask) != json_array_size(ids)))
    return ROW_ERROR(L, "key 'completion_mask': expected a list as long as input_ids (%zu)",
                     json_array_size(ids));
  int rc = push_id_list(L, ids, "input_ids", 1);
  if (rc || !mask || !L->o->completion_only_loss) return rc;
  for (size_t i = 0; i < json_array_size(mask); i++) {
    json_t *m = json_array_get(mask, i);
    if (!json_is_integer(m) || (json_integer_value(m) != 0 && json_integer_value(m) != 1))
      return ROW_ERROR(L, "key 'completion_mask'[%zu]: expected 0 or 1", i);
    L->label[i] = (uint8_t)json_integer_value(m);
  }
  return 0;
}

// Appends a JSON list of token ids (key names it in errors) with label `lab`.
static int push_id_list(loader *L, const json_t *list, const char *key, uint8_t lab) {
  int from = L->ids.n;
  if (ct_jsonl_ids(list, ct_tokenizer_vocab_size(L->tok), L->o->model_vocab, key, &L->ids))
    return ROW_ERROR(L, "%s", ct_last_error());
  return label_to_end(L, from, lab);
}

static int row_tokens(loader *L, const json_t *row) {
  if (!json_is_object(row)) return ROW_ERROR(L, "expected a JSON object");
  L->row = row;
  const json_t *pids = json_object_get(row, "prompt_input_ids");
  if (pids) {  // pre-tokenized prompt + completion (as TRL's DPO/GRPO columns)
    const json_t *cids = json_object_get(row, "completion_input_ids");
    if (!cids) return ROW_ERROR(L, "key 'completion_input_ids' is missing (the row has prompt_input_ids)");
    int rc = push_id_list(L, pids, "prompt_input_ids", L->o->completion_only_loss ? 0 : 1);
    return rc ? rc : push_id_list(L, cids, "completion_input_ids", 1);
  }
  const json_t *ids = json_object_get(row, "input_ids");
  if (ids) {
    return row_pretokenized(L, row, ids);
  }
  json_t *msgs;
  const char *key;
  if (ct_rowmap_messages(row, &msgs, &key)) return ROW_ERROR(L, "%s", ct_last_error());
  if (msgs) {
    int rc = json_is_array(msgs) && json_array_size(msgs)
                 ? row_messages(L, msgs, key)
                 : ROW_ERROR(L, "key 'messages': expected a non-empty list of {role, content}");
    json_decref(msgs);
    return rc;
  }
  json_t *ap, *ac;  // Alpaca
  if (ct_rowmap_alpaca(row, &ap, &ac)) return ROW_ERROR(L, "%s", ct_last_error());
  if (ap) {
    int rc = row_chat_prompt_completion(L, ap, ac);
    json_decref(ap);
    json_decref(ac);
    return rc;
  }
  const json_t *prompt = json_object_get(row, "prompt"), *comp = json_object_get(row, "completion");
  if (prompt || comp) {
    if (!prompt) return ROW_ERROR(L, "key 'prompt' is missing (the row has a completion)");
    if (!comp) return ROW_ERROR(L, "key 'completion' is missing (the row has a prompt)");
    if (json_is_string(prompt) && json_is_string(comp)) {
      char *full = concat(json_string_value(prompt), json_string_value(comp));
      if (!full) return ct_set_error(CT_ENOMEM, "dataset: out of memory");
      int rc = row_prompt_completion(L, json_string_value(prompt), full, true);
      free(full);
      return rc;
    }
    if (json_is_array(prompt) && json_is_array(comp)) return row_chat_prompt_completion(L, prompt, comp);
    return ROW_ERROR(L, "keys 'prompt' and 'completion': expected two strings or two message lists");
  }
  const json_t *text = json_object_get(row, L->o->text_field);
  if (!text)
    return ROW_ERROR(L, "no known fields: expected '%s', 'prompt'+'completion', 'messages', "
                     "'conversations', 'instruction'+'output' or 'input_ids'", L->o->text_field);
  if (!json_is_string(text)) return ROW_ERROR(L, "key '%s': expected a string", L->o->text_field);
  return row_text(L, json_string_value(text));
}

// Truncates, drops rows without labels, appends the row to the dataset.
static int keep_row(loader *L) {
  ct_dataset *ds = L->ds;
  int n = L->ids.n;
  if (n > L->o->max_length) {
    n = L->o->max_length;
    ds->n_truncated++;
  }
  long labels = 0;
  for (int i = 1; i < n; i++) labels += L->label[i];
  if (labels == 0) {
    ds->n_empty++;
    return 0;
  }
  if (ds->n_tokens + n > L->cap_tokens) {  // ids and labels grow together
    long cap = L->cap_tokens;
    if (grow((void **)&ds->ids, &cap, ds->n_tokens + n, sizeof(int))) return CT_ENOMEM;
    uint8_t *lab = realloc(ds->label, (size_t)cap);
    if (!lab) return ct_set_error(CT_ENOMEM, "dataset: out of memory");
    ds->label = lab;
    L->cap_tokens = cap;
  }
  if (ds->n_rows + 1 > L->cap_rows) {  // the three per-row arrays grow together
    long cap = L->cap_rows, c2 = cap, c3 = cap;
    if (grow((void **)&ds->row_start, &cap, ds->n_rows + 1, sizeof(long)) ||
        grow((void **)&ds->row_len, &c2, ds->n_rows + 1, sizeof(int)) ||
        grow((void **)&ds->row_line, &c3, ds->n_rows + 1, sizeof(int)))
      return CT_ENOMEM;
    L->cap_rows = cap;
  }
  memcpy(ds->ids + ds->n_tokens, L->ids.v, sizeof(int) * n);
  memcpy(ds->label + ds->n_tokens, L->label, (size_t)n);
  ds->label[ds->n_tokens] = 0;  // nothing before a document's first token predicts it
  ds->row_start[ds->n_rows] = ds->n_tokens;
  ds->row_len[ds->n_rows] = n;
  ds->row_line[ds->n_rows] = L->line;
  ds->n_rows++;
  ds->n_tokens += n;
  ds->n_label_tokens += labels;
  return 0;
}

static int load_row(void *ctx, json_t *row, int line) {
  loader *L = ctx;
  L->line = line;
  L->ids.n = 0;
  int rc = row_tokens(L, row);
  return rc ? rc : keep_row(L);
}

int ct_dataset_load(ct_dataset *ds, const char *path, const ct_tokenizer *tok,
                    const ct_data_opts *o) {
  memset(ds, 0, sizeof *ds);
  if (!(ds->path = strdup(path))) return ct_set_error(CT_ENOMEM, "%s: out of memory", path);
  loader L = {.ds = ds, .tok = tok, .o = o};
  ct_jsonl_stats st;
  int rc = ct_jsonl_read(path, o->skip_bad_rows, load_row, &L, &st);
  ds->n_lines = st.n_lines;
  ds->n_bad = st.n_bad;
  memcpy(ds->first_bad, st.first_bad, sizeof ds->first_bad);
  ct_ids_free(&L.ids);
  free(L.label);
  if (!rc && ds->n_rows == 0)
    rc = ct_set_error(CT_EFORMAT, "%s: no usable rows (%d lines, %d malformed, %d without any "
                      "trained token)", path, ds->n_lines, ds->n_bad, ds->n_empty);
  if (!rc) rc = ct_dataset_pack(ds, o->max_length, o->packing);
  if (rc) ct_dataset_free(ds);  // frees only: the error message stays
  return rc;
}

void ct_dataset_free(ct_dataset *ds) {
  ct_free_all(ds->path, ds->ids, ds->label, ds->row_start, ds->row_len, ds->row_line, ds->seq_first,
              ds->seq_count, ds->seq_rows, ds->seq_len);
  memset(ds, 0, sizeof *ds);
}

// ---------------------------------------------------------------------------
// Packing: best-fit decreasing. Rows are placed longest first, each into the open bin
// with the least room that still fits it; a segment tree over "room left" finds that
// bin in O(log max_length).

typedef struct {
  int size;   // leaves: room values 0..size-1
  int *cnt;   // (2*size) bins with room in each subtree
} room_tree;

static void room_add(room_tree *t, int room, int d) {
  for (int i = room + t->size; i >= 1; i >>= 1) t->cnt[i] += d;
}

// Smallest room >= need that some bin has, or -1.
static int room_find(const room_tree *t, int need, int node, int lo, int hi) {
  if (hi < need || t->cnt[node] == 0) return -1;
  if (lo == hi) return lo;
  int mid = (lo + hi) / 2;
  int r = room_find(t, need, 2 * node, lo, mid);
  return r >= 0 ? r : room_find(t, need, 2 * node + 1, mid + 1, hi);
}

static const int *sort_len;
static int by_len_desc(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  if (sort_len[x] != sort_len[y]) return sort_len[y] - sort_len[x];
  return x - y;
}

int ct_dataset_pack(ct_dataset *ds, int max_length, bool packing) {
  int n = ds->n_rows;
  free(ds->seq_first);
  free(ds->seq_count);
  free(ds->seq_rows);
  free(ds->seq_len);
  ds->seq_first = malloc(sizeof(int) * n);
  ds->seq_count = malloc(sizeof(int) * n);
  ds->seq_rows = malloc(sizeof(int) * n);
  ds->seq_len = malloc(sizeof(int) * n);
  if (!ds->seq_first || !ds->seq_count || !ds->seq_rows || !ds->seq_len)
    return ct_set_error(CT_ENOMEM, "dataset: out of memory");
  if (!packing) {
    for (int i = 0; i < n; i++) {
      ds->seq_first[i] = ds->seq_rows[i] = i;
      ds->seq_count[i] = 1;
      ds->seq_len[i] = ds->row_len[i];
    }
    ds->n_seq = n;
    return 0;
  }
  int *order = malloc(sizeof(int) * n), *bin_of = malloc(sizeof(int) * n);
  int *bin_len = calloc(n, sizeof(int)), *bin_next = malloc(sizeof(int) * n);
  int *room_head = NULL;  // bins with a given room: a stack through bin_next
  room_tree t = {0};
  int size = 1;
  while (size < max_length + 1) size *= 2;
  t.size = size;
  t.cnt = calloc(2 * size, sizeof(int));
  room_head = malloc(sizeof(int) * (max_length + 1));
  if (!order || !bin_of || !bin_len || !bin_next || !t.cnt || !room_head) {
    free(order); free(bin_of); free(bin_len); free(bin_next); free(t.cnt); free(room_head);
    return ct_set_error(CT_ENOMEM, "dataset: out of memory");
  }
  for (int r = 0; r <= max_length; r++) room_head[r] = -1;
  for (int i = 0; i < n; i++) order[i] = i;
  sort_len = ds->row_len;
  qsort(order, n, sizeof(int), by_len_desc);
  int nbins = 0;
  for (int k = 0; k < n; k++) {
    int row = order[k], len = ds->row_len[row];
    int room = room_find(&t, len, 1, 0, size - 1), bin;
    if (room >= 0) {  // take the bin off its room stack
      bin = room_head[room];
      room_head[room] = bin_next[bin];
      room_add(&t, room, -1);
    } else {
      bin = nbins++;
      room = max_length;
    }
    bin_of[row] = bin;
    bin_len[bin] += len;
    room -= len;
    bin_next[bin] = room_head[room];
    room_head[room] = bin;
    room_add(&t, room, +1);
  }
  // Lay bins out in order of their first row so that packing is stable.
  for (int b = 0; b < nbins; b++) ds->seq_count[b] = 0;
  for (int r = 0; r < n; r++) ds->seq_count[bin_of[r]]++;
  int off = 0;
  for (int b = 0; b < nbins; b++) {
    ds->seq_first[b] = off;
    off += ds->seq_count[b];
    ds->seq_count[b] = 0;
    ds->seq_len[b] = bin_len[b];
  }
  for (int r = 0; r < n; r++) {
    int b = bin_of[r];
    ds->seq_rows[ds->seq_first[b] + ds->seq_count[b]++] = r;
  }
  ds->n_seq = nbins;
  free(order); free(bin_of); free(bin_len); free(bin_next); free(t.cnt); free(room_head);
  return 0;
}

long ct_seq_labels(const ct_dataset *ds, int seq) {
  long n = 0;
  for (int k = 0; k < ds->seq_count[seq]; k++) {
    int r = ds->seq_rows[ds->seq_first[seq] + k];
    const uint8_t *lab = ds->label + ds->row_start[r];
    for (int i = 1; i < ds->row_len[r]; i++) n += lab[i];
  }
  return n;
}

// ---------------------------------------------------------------------------
// Batches

int ct_batch_init(ct_batch *b, int cap_B, int cap_T) {
  memset(b, 0, sizeof *b);
  long n = (long)cap_B * cap_T;
  b->cap_B = cap_B;
  b->cap_T = cap_T;
  b->ids = malloc(sizeof(int) * n);
  b->pos = malloc(sizeof(int) * n);
  b->seg = malloc(sizeof(int) * n);
  b->target = malloc(sizeof(int) * n);
  b->pre = malloc(sizeof(int) * n);
  b->tok_seq = malloc(sizeof(int) * n);
  b->tok_j = malloc(sizeof(int) * n);
  b->row_seq = malloc(sizeof(int) * cap_B);
  if (!b->ids || !b->pos || !b->seg || !b->target || !b->pre || !b->tok_seq || !b->tok_j || !b->row_seq) {
    ct_batch_free(b);
    return ct_set_error(CT_ENOMEM, "batch: out of memory");
  }
  return 0;
}

void ct_batch_free(ct_batch *b) {
  ct_free_all(b->ids, b->pos, b->seg, b->target, b->pre, b->tok_seq, b->tok_j, b->row_seq);
  memset(b, 0, sizeof *b);
}

void ct_batch_fill(ct_batch *b, const ct_dataset *ds, const int *seqs, int n, int pad_id) {
  int T = 1;
  for (int i = 0; i < n; i++)
    if (ds->seq_len[seqs[i]] > T) T = ds->seq_len[seqs[i]];
  b->B = n;
  b->T = T;
  b->n_target = b->n_tokens = 0;
  for (int i = 0; i < n; i++) {
    int s = seqs[i], t = 0;
    b->row_seq[i] = s;
    int *ids = b->ids + (long)i * T, *pos = b->pos + (long)i * T;
    int *seg = b->seg + (long)i * T, *tgt = b->target + (long)i * T;
    for (int k = 0; k < ds->seq_count[s]; k++) {
      int r = ds->seq_rows[ds->seq_first[s] + k], len = ds->row_len[r], doc = t;
      const int *rid = ds->ids + ds->row_start[r];
      const uint8_t *lab = ds->label + ds->row_start[r];
      for (int j = 0; j < len; j++, t++) {
        ids[t] = rid[j];
        pos[t] = j;
        seg[t] = doc;
        tgt[t] = (j + 1 < len && lab[j + 1]) ? rid[j + 1] : -1;
        b->n_target += tgt[t] >= 0;
      }
    }
    b->n_tokens += t;
    for (; t < T; t++) {  // padding: no target, attends only to itself
      ids[t] = pad_id;
      pos[t] = t;
      seg[t] = t;
      tgt[t] = -1;
    }
  }
}

void ct_batch_drop_targets(ct_batch *b, int row, int np, const unsigned char *keep, int nc) {
  int *tgt = b->target + (long)row * b->T;
  for (int j = 0; keep && j < nc; j++)  // token j is predicted at position np + j − 1
    if (!keep[j] && np + j >= 1 && tgt[np + j - 1] >= 0) {
      tgt[np + j - 1] = -1;
      b->n_target--;
    }
}

void ct_batch_row(ct_batch *b, int row, const int *prompt, int np, const int *comp, int nc,
                  int pad_id) {
  int T = b->T, *ids = b->ids + (long)row * T, *pos = b->pos + (long)row * T;
  int *seg = b->seg + (long)row * T, *tgt = b->target + (long)row * T, n = np + nc;
  if (np) memcpy(ids, prompt, sizeof(int) * np);
  if (nc) memcpy(ids + np, comp, sizeof(int) * nc);
  for (int t = 0; t < T; t++) {
    if (t >= n) ids[t] = pad_id;
    pos[t] = t;
    seg[t] = t < n ? 0 : t;
    tgt[t] = (t + 1 < n && t + 1 >= np) ? ids[t + 1] : -1;  // predicts a completion token
    b->n_target += tgt[t] >= 0;
  }
  b->n_tokens += n;
}
