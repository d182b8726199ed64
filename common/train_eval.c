// train_eval: causal-LM evaluation of the policy over a whole eval set, split across ranks,
// and its metrics line (loss, token and sequence accuracy, entropy, multi-token prediction's
// acceptance). The step it runs is common/lm.c's.
#include "train.h"

#include <jansson.h>
#include <stdio.h>

#include "lm.h"
#include "mtp.h"

int ct_train_eval_lm(ct_train *tr, ct_acts *a, ct_head *h, ct_batch *b, int *seqs, const ct_dataset *ev) {
  int B = (int)tr->cfg->per_device_eval_batch_size, rc = 0;
  ct_lm_stats st = {0};
  long batches = (ev->n_seq + (long)B * tr->world - 1) / ((long)B * tr->world), done = 0;
  ct_log_phase(&tr->log, tr->step, "evaluating", 0, batches, "batches", 0, NULL);
  for (int first = tr->rank * B; first < ev->n_seq && !rc; first += B * tr->world) {
    int n = 0;
    for (int s = first; s < ev->n_seq && n < B; s++) seqs[n++] = s;
    ct_batch_fill(b, ev, seqs, n, ct_tokenizer_pad(tr->tok));
    rc = ct_lm_step(&tr->model, a, h, b, NULL, 0, 0, &st);
    ct_log_phase(&tr->log, tr->step, "evaluating", ++done, batches, "batches", st.tokens, NULL);
  }
  if (rc || (rc = ct_dist_sum_stats(&st))) return rc;
  double t = st.targets > 0 ? st.targets : 1, seq = st.seq_ok / (st.seqs > 0 ? st.seqs : 1);
  ct_log_info(&tr->log, "eval at step %ld: loss %.4f, token accuracy %.4f, sequence accuracy %.4f", tr->step,
              st.loss / t, st.correct / t, seq);
  json_t *j = json_pack("{s:I,s:f,s:f,s:f,s:f}", "step", (json_int_t)tr->step, "eval_loss", st.loss / t,
                        "eval_mean_token_accuracy", st.correct / t, "eval_entropy", st.entropy / t,
                        "eval_sequence_accuracy", seq);
  int D = a->mtp ? tr->model.cfg.mtp_layers : 0;
  if (D) {  // multi-token prediction: depth k's predictions that equal the main model's greedy token
    ct_log_info(&tr->log, "eval at step %ld: mtp loss %.4f, acceptance rate %.4f", tr->step,
                ct_mtp_mean_loss(&st.mtp, D), ct_mtp_acceptance(&st.mtp, D, 0));
    json_object_set_new(j, "eval_mtp_loss", json_real(ct_mtp_mean_loss(&st.mtp, D)));
    json_object_set_new(j, "eval_mtp_acceptance_rate", json_real(ct_mtp_acceptance(&st.mtp, D, 0)));
    for (int k = 1; k <= D && D > 1; k++) {
      char key[64];
      snprintf(key, sizeof key, "eval_mtp_acceptance_rate_%d", k);
      json_object_set_new(j, key, json_real(ct_mtp_acceptance(&st.mtp, D, k)));
    }
  }
  return ct_log_metrics(&tr->log, j);
}
