// train_schedule: the step schedule and the data order: total and warmup steps, a resumed
// run checked against its checkpoint's data and batch, and each epoch's seeded shuffle from
// which ct_train_next_seqs hands out every step's sequences.
#include "train.h"

#include <math.h>
#include <stdlib.h>

#include "error.h"

// This epoch's order: a seeded shuffle of 0..n-1 (seed and epoch alone decide it, so a
// resumed run sees the same order).
static void epoch_order(ct_train *tr) {
  int n = tr->n_seq;
  for (int i = 0; i < n; i++) tr->order[i] = i;
  if (!tr->cfg->shuffle_dataset) return;
  ct_rng r;
  ct_rng_seed(&r, (uint64_t)tr->cfg->seed ^ ((uint64_t)(tr->epoch + 1) << 32));
  for (int i = n - 1; i > 0; i--) {
    int j = (int)ct_rng_below(&r, (uint64_t)i + 1);
    int t = tr->order[i];
    tr->order[i] = tr->order[j];
    tr->order[j] = t;
  }
}

// A resumed run against its checkpoint: the same data (count and content) and the same
// global batch, or the promised data order would silently not hold.
static int check_resume_plan(const ct_train *tr, int n_seq, int global, uint64_t data_hash) {
  const char *from = tr->resumed_from;
  if (tr->n_seq != n_seq)
    return ct_set_error(CT_EINVAL, "%s was saved with %d training sequences per epoch, the "
                        "dataset now gives %d: resuming would not continue the same data order",
                        from, tr->n_seq, n_seq);
  if (tr->data_hash && tr->data_hash != data_hash)
    return ct_set_error(CT_EINVAL, "%s was saved training on other data (the same number of "
                        "sequences, different tokens or order): resuming would not continue the "
                        "same data order; give the dataset (and tokenizer, template, max_length) it "
                        "was trained with", from);
  if (tr->global_batch && tr->global_batch != global)
    return ct_set_error(CT_EINVAL, "%s was saved with a global batch of %d, this run's is %d "
                        "(per_device_train_batch_size x gradient_accumulation_steps x %d ranks): "
                        "resuming would change the data order; keep the product at %d",
                        from, tr->global_batch, global, tr->world, tr->global_batch);
  if (tr->step > tr->total_steps)
    return ct_set_error(CT_EINVAL, "%s is at step %ld, past the %ld steps this run would train; "
                        "raise max_steps or num_train_epochs to continue", from, tr->step, tr->total_steps);
  return 0;
}

int ct_train_schedule(ct_train *tr, int n_seq, int global, uint64_t data_hash) {
  const ct_config *c = tr->cfg;
  long per_epoch = (n_seq + global - 1) / global * (tr->steps_per_batch > 1 ? tr->steps_per_batch : 1);
  tr->total_steps = c->max_steps > 0 ? c->max_steps : (long)ceil(c->num_train_epochs * per_epoch);
  tr->warmup_steps = c->warmup_steps > 0 ? c->warmup_steps : (long)ceil(c->warmup_ratio * tr->total_steps);
  int rc = tr->resumed_from[0] ? check_resume_plan(tr, n_seq, global, data_hash) : 0;
  if (rc) return rc;
  if (tr->resumed_from[0] && tr->step == tr->total_steps)  // killed before its final save
    ct_log_info(&tr->log, "%s is at the last step (%ld): writing the final model", tr->resumed_from, tr->step);
  tr->n_seq = n_seq;
  tr->data_hash = data_hash;
  tr->global_batch = global;
  tr->order = malloc(sizeof(int) * (n_seq > 0 ? n_seq : 1));
  if (!tr->order) return ct_set_error(CT_ENOMEM, "out of memory");
  epoch_order(tr);
  tr->comm0 = ct_dist_bytes_sent();
  tr->step0 = tr->step;
  return ct_log_open(&tr->log, c->output_dir, tr->step, tr->total_steps, tr->rank == 0);
}

int ct_train_next_seqs(ct_train *tr, int *seqs, int global) {
  if (tr->epoch_pos >= tr->n_seq) {
    tr->epoch++;
    tr->epoch_pos = 0;
    epoch_order(tr);
  }
  int n = 0;
  while (n < global && tr->epoch_pos < tr->n_seq) seqs[n++] = tr->order[tr->epoch_pos++];
  return n;
}
