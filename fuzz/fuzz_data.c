// Fuzzes the JSONL dataset readers (data/data.c, prefs.c, prompts.c, jsonl.c): the
// input is a JSONL file, read with the byte tokenizer (its ChatML template marks the
// assistant turns) as an SFT dataset (twice: packed with completion-only loss, and
// unpacked with assistant-only loss, skipping bad rows), as DPO pairs and as prompts.
// What loads is cut into batches: every length within its limit, every id in the vocab.
#include "data.h"
#include "fuzz.h"
#include "prefs.h"
#include "prompts.h"

static ct_tokenizer *tok;
static int V;

static void check_id(int id, bool target) {
  if (id >= V || id < (target ? -1 : 0)) {
    fprintf(stderr, "fuzz: %s %d outside the vocab of %d\n", target ? "target" : "id", id, V);
    abort();
  }
}

static void sft(const char *path, const ct_data_opts *o) {
  ct_dataset ds;
  fuzz_clear_error();
  int rc = ct_dataset_load(&ds, path, tok, o);
  fuzz_check_error(rc, "ct_dataset_load");
  if (rc) return;
  ct_batch b;
  if (ct_batch_init(&b, 4, o->max_length)) abort();
  for (int s = 0; s < ds.n_seq; s += 4) {
    int seqs[4], n = 0;
    for (; n < 4 && s + n < ds.n_seq; n++) {
      seqs[n] = s + n;
      if (ds.seq_len[s + n] > o->max_length || ds.seq_len[s + n] < 1) abort();
      ct_seq_labels(&ds, s + n);
    }
    ct_batch_fill(&b, &ds, seqs, n, ct_tokenizer_pad(tok));
    for (long i = 0; i < (long)b.B * b.T; i++) check_id(b.ids[i], false), check_id(b.target[i], true);
  }
  ct_batch_free(&b);
  ct_dataset_free(&ds);
}

// Pairs, or (unpaired) KTO's rows or pairs made unpaired, with their KL rows.
static void prefs(const char *path, bool unpaired) {
  ct_pref_opts o = {.max_length = 48, .max_prompt_length = 16, .max_completion_length = 32, .skip_bad_rows = true,
                    .unpaired = unpaired};
  ct_pref_dataset ds;
  fuzz_clear_error();
  int rc = ct_pref_load(&ds, path, tok, &o);
  fuzz_check_error(rc, "ct_pref_load");
  if (rc) return;
  int T = ct_pref_max_len(&ds);
  if (T > o.max_length) abort();
  ct_batch b;
  if (ct_batch_init(&b, 6, T > 0 ? T : 1)) abort();
  for (int p = 0; p < ds.n; p += 3) {
    int rows[3] = {p, p + 1 < ds.n ? p + 1 : p, p + 2 < ds.n ? p + 2 : p};
    if (unpaired) ct_pref_batch_unpaired(&b, &ds, rows, 3, true, ct_tokenizer_pad(tok));
    else ct_pref_batch(&b, &ds, rows, 2, ct_tokenizer_pad(tok));
    if (b.T > T) abort();
    for (long i = 0; i < (long)b.B * b.T; i++) check_id(b.ids[i], false), check_id(b.target[i], true);
  }
  ct_batch_free(&b);
  ct_pref_free(&ds);
}

static void prompts(const char *path) {
  ct_prompt_opts o = {.add_generation_prompt = true, .max_length = 24, .truncate_left = true,
                      .length_key = "max_prompt_length"};
  ct_prompt_set s;
  fuzz_clear_error();
  int rc = ct_prompt_set_load(&s, path, tok, &o);
  fuzz_check_error(rc, "ct_prompt_set_load");
  if (rc) return;
  for (int i = 0; i < s.n; i++) {
    if (s.ids[i].n > o.max_length) abort();
    for (int k = 0; k < s.ids[i].n; k++) check_id(s.ids[i].v[k], false);
  }
  ct_prompt_set_free(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!tok) {
    if (ct_tokenizer_bytes(&tok)) abort();
    V = ct_tokenizer_vocab_size(tok);
  }
  const char *path = fuzz_write("fuzz.jsonl", data, size);
  ct_data_opts packed = {.max_length = 32, .completion_only_loss = true, .packing = true, .text_field = "text"};
  ct_data_opts rows = {.max_length = 12, .assistant_only_loss = true, .skip_bad_rows = true, .text_field = "content"};
  sft(path, &packed);
  sft(path, &rows);
  prefs(path, false);
  prefs(path, true);
  prompts(path);
  return 0;
}
