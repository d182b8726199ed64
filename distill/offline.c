// distill/offline: the teacher known by its top-k logits per labeled token (offline mode):
// `bin/distill precompute` writes them (distill/topk.h holds the file format), a training
// run reads them back, refusing a file made from other data, and gathers a batch's rows.
#include <stdlib.h>

#include "distill/distill.h"
#include "dnnl.h"
#include "error.h"
#include "hash.h"
#include "ident.h"
#include "matmul.h"
#include "mem.h"
#include "sample.h"

static uint64_t data_hash(const ct_dataset *ds) {
  uint64_t h = ct_fnv1a(ds->ids, sizeof(int) * (size_t)ds->n_tokens, CT_FNV1A_INIT);
  return ct_fnv1a(ds->label, (size_t)ds->n_tokens, h);
}

static long *label_offsets(const ct_dataset *ds) {
  long *off = malloc(sizeof(long) * (ds->n_rows + 1));
  if (!off) return NULL;
  off[0] = 0;
  for (int r = 0; r < ds->n_rows; r++) {
    long c = 0;
    for (int j = 1; j < ds->row_len[r]; j++) c += ds->label[ds->row_start[r] + j];
    off[r + 1] = off[r] + c;
  }
  return off;
}

void ct_distill_label_index(const ct_dataset *ds, const ct_batch *b, const long *off, long *out) {
  int q = 0;
  for (int i = 0; i < b->B; i++) {
    int s = b->row_seq[i];
    for (int d = 0; d < ds->seq_count[s]; d++) {
      int r = ds->seq_rows[ds->seq_first[s] + d];
      long k = off[r];
      for (int j = 1; j < ds->row_len[r]; j++)
        if (ds->label[ds->row_start[r] + j]) out[q++] = k++;
    }
  }
}

int ct_distill_precompute(const ct_config *cfg, ct_train *tr, const ct_tokenizer *tok, const ct_dataset *ds) {
  int B = (int)cfg->per_device_eval_batch_size, T = (int)cfg->max_length, rc;
  ct_distill_teacher t;
  if ((rc = ct_distill_teacher_load(&t, cfg, B, T))) return rc;
  if (tr->bf16 && (rc = ct_frozen_compute_bf16(&t.f))) return ct_distill_teacher_free(&t), rc;
  int V = t.f.cfg.vocab_size, C = t.f.cfg.hidden_size, k = (int)cfg->distill_top_k < V ? (int)cfg->distill_top_k : V;
  long *off = label_offsets(ds);
  if (!off) return ct_distill_teacher_free(&t), ct_set_error(CT_ENOMEM, "out of memory");
  long total = off[ds->n_rows];
  enum { ROWS = 32 };  // teacher logits of ROWS labeled tokens at a time
  int *idx = malloc(sizeof(int) * (size_t)total * k), *ord = malloc(sizeof(int) * k);
  float *lg = malloc(sizeof(float) * (size_t)total * k), *rows = malloc(sizeof(float) * ROWS * (size_t)V);
  long *where = malloc(sizeof(long) * B * T);
  ct_batch b;
  int *seqs = malloc(sizeof(int) * B);
  rc = !idx || !ord || !lg || !rows || !where || !seqs ? ct_set_error(CT_ENOMEM, "out of memory")
                                                      : ct_batch_init(&b, B, T);
  if (rc) return ct_free_all(idx, ord, lg, rows, where, seqs, off), ct_distill_teacher_free(&t), rc;
  ct_log_info(&tr->log, "teacher top-%d logits for %ld labeled tokens of %s", k, total, ds->path);
  for (int first = 0; first < ds->n_seq && !rc; first += B) {
    int n = 0;
    for (int s = first; s < ds->n_seq && n < B; s++) seqs[n++] = s;
    ct_batch_fill(&b, ds, seqs, n, ct_tokenizer_pad(tok));
    if ((rc = ct_distill_teacher_forward(&t, &b))) break;
    ct_distill_label_index(ds, &b, off, where);
    for (long q0 = 0; q0 < b.n_target; q0 += ROWS) {
      int nr = b.n_target - q0 < ROWS ? (int)(b.n_target - q0) : ROWS;
      ct_frozen_logits(&t.f, t.hidden + q0 * C, nr, 0, V, rows);
      for (int i = 0; i < nr; i++) {
        const float *row = rows + (long)i * V;
        long w = where[q0 + i] * k;
        ct_top_k_ids(row, V, k, ord);
        for (int j = 0; j < k; j++) idx[w + j] = ord[j], lg[w + j] = row[ord[j]];
      }
    }
  }
  if (!rc) rc = ct_dnnl_check();  // (bf16: a failed product left NaN logits; write no file of them)
  ct_topk file = {.k = k, .n = total, .idx = idx, .logit = lg, .data_hash = data_hash(ds)};
  if (!rc) rc = ct_topk_write(cfg->teacher_logits_path, &file, cfg->teacher_path);
  if (!rc) ct_log_info(&tr->log, "wrote %s", cfg->teacher_logits_path);
  ct_free_all(idx, ord, lg, rows, where, seqs, off);
  ct_batch_free(&b);
  ct_distill_teacher_free(&t);
  return rc;
}

int ct_distill_topk_load(ct_train *tr, const ct_dataset *ds, ct_distill_topk *tk) {
  const char *path = tr->cfg->teacher_logits_path;
  int rc = ct_topk_load(&tk->f, path, tr->model.cfg.vocab_size);
  if (rc) return rc;
  tk->row_off = label_offsets(ds);
  if (!tk->row_off) return ct_set_error(CT_ENOMEM, "out of memory");
  if (tk->f.data_hash != data_hash(ds) || tk->f.n != tk->row_off[ds->n_rows])
    return ct_set_error(CT_EFORMAT, "%s: not the teacher logits of this dataset (run `bin/distill "
                        "precompute` with the same data and max_length)", path);
  ct_ident id;
  ct_ident_set(&id, "teacher", "teacher_logits_path", path, NULL, NULL, tk->f.sum);
  return ct_train_frozen_record(tr, &id);
}
