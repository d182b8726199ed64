// distill: the state of a distillation run that its files share: the teacher (teacher.c)
// or its precomputed top-k logits (offline.c), on-policy batches (onpolicy.c), the
// student's pass against them (step.c) and the metrics (log.c). distill/main.c sets it up
// and runs the loop. Every function returns 0 or a negative error with its message set.
#ifndef CT_DISTILL_DISTILL_H
#define CT_DISTILL_DISTILL_H

#include <stdbool.h>
#include <stdint.h>

#include "completions.h"
#include "config.h"
#include "data.h"
#include "distill/topk.h"
#include "policy_engine.h"
#include "forward.h"
#include "frozen.h"
#include "head.h"
#include "kd.h"
#include "train.h"
#include "weights.h"

// The teacher: a frozen model (teacher_dtype: float32, bfloat16 or int8) and the final hidden
// states of the current batch's target rows, from which the soft loss asks for logit
// chunks.
typedef struct {
  ct_frozen f;
  float *hidden;  // (B·T, C) the gathered rows of the current batch
} ct_distill_teacher;

// Offline logits: the teacher's top-k per labeled token, in dataset order (row by row,
// labeled tokens in order), with the data's hash so a stale file is refused.
typedef struct {
  ct_topk f;       // the file's (n, k) ids and logits (distill/topk.h)
  long *row_off;   // (rows + 1) first labeled token of each dataset row
  int *b_idx;      // (B·T, k) a micro-batch's rows of idx and logit
  float *b_logit;
} ct_distill_topk;

typedef struct {
  double loss, soft, hard, hard_n, teacher_nll, tokens, input_tokens, correct;
} ct_distill_stats;

typedef struct {
  const ct_config *cfg;
  ct_train *tr;
  ct_dataset train, eval;
  bool offline;         // the teacher's top-k logits from teacher_logits_path, no teacher
  bool have_eval;
  int B, accum, global, T, Be;  // micro-batch, accumulation, sequences a step (all ranks), length, eval batch
  int V;                // the logits the soft loss compares (the smaller vocabulary)
  ct_engine_opts geo;   // on-policy generation's engine
  ct_distill_teacher teacher;
  uint64_t teacher_sum;  // its checksum at the start
  ct_distill_topk tk;
  ct_acts acts, eval_acts;
  ct_head head;
  ct_kd kd;
  ct_kd_opts ko;
  double tau, alpha;
  ct_batch batch;
  int *seqs;            // (max(global, B, Be)) the step's sequences
  long *where;          // (B·T) offline: each gathered row's index in the file
  // on-policy generation (lmbda > 0): the student's weights as they are, or the teacher's
  ct_policy_engine student;  // the engine over the student's own weights (not seq_kd)
  ct_engine *teacher_gen;    // seq_kd: the engine over the teacher's
  ct_engine *gen;            // the one that samples: either of the two
  ct_batch *gen_batches;  // (accum)
  ct_completions log;     // on-policy samples, in completions.jsonl
  json_t **gen_rows;      // (B·accum)
} ct_distill;

// teacher.c ------------------------------------------------------------------

int ct_distill_teacher_load(ct_distill_teacher *t, const ct_config *c, int B, int T);
void ct_distill_teacher_free(ct_distill_teacher *t);
// The teacher's final hidden states of b's target rows (before the student's pass).
int ct_distill_teacher_forward(ct_distill_teacher *t, const ct_batch *b);
// ct_kd_teacher_fn over a ct_distill_teacher: logits [v0, v0 + nv) of n gathered rows.
void ct_distill_teacher_chunk(void *ctx, int n, int v0, int nv, float *out);
// Checks before any work: the teacher exists and speaks the student's vocabulary.
int ct_distill_check_vocabularies(const ct_config *cfg, const ct_tokenizer *student);

// offline.c ------------------------------------------------------------------

// `bin/distill precompute`: writes the teacher's top-k logits of every labeled token of ds
// to teacher_logits_path.
int ct_distill_precompute(const ct_config *cfg, ct_train *tr, const ct_tokenizer *tok, const ct_dataset *ds);
// The file, checked whole (distill/topk.h) against the student's V tokens, then against
// this dataset; its checksum is the teacher's identity in the checkpoints.
int ct_distill_topk_load(ct_train *tr, const ct_dataset *ds, ct_distill_topk *tk);
// For each gathered row q of batch b: the index of its token in the offline file.
void ct_distill_label_index(const ct_dataset *ds, const ct_batch *b, const long *off, long *out);

// onpolicy.c -----------------------------------------------------------------

// Cache positions an on-policy completion needs: the longest prompt and max_new_tokens,
// within max_length T.
int ct_distill_generation_positions(const ct_dataset *ds, long max_new, int T);
// The step's on-policy batches (GKD): each of this rank's micro-batches of seqs (n) keeps
// its rows' prompts and gets completions sampled at temperature τ into d->gen_batches;
// *labels: their completion tokens over all ranks (collective).
int ct_distill_generate(ct_distill *d, const int *seqs, int n, long *labels);

// step.c ---------------------------------------------------------------------

// One step's gradient: every micro-batch of this rank through the teacher (or its top-k
// logits) and the student, α·τ²·soft + (1 − α)·hard over `labels` tokens, added to st.
// generated: the batches are d->gen_batches (soft loss only).
int ct_distill_train_pass(ct_distill *d, int n, bool generated, long labels, ct_distill_stats *st);

// log.c ----------------------------------------------------------------------

// The metrics.jsonl line of the logging window's sums win (lr, norm: the last step's).
int ct_distill_log_step(ct_distill *d, const ct_distill_stats *win, double lr, double norm, double tokens_per_s);

#endif
