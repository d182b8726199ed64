// distill/log: the metrics.jsonl line of a logging window (MaxText's and TRL's names:
// distill/soft_loss, distill/hard_loss, the student's and teacher's perplexities).
#include <math.h>

#include "distill/distill.h"
#include "error.h"

int ct_distill_log_step(ct_distill *d, const ct_distill_stats *win, double lr, double norm, double tokens_per_s) {
  ct_train *tr = d->tr;
  double alpha = d->alpha, tau = d->tau, tok = win->tokens > 0 ? win->tokens : 1;
  json_t *j = json_pack("{s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}", "step", (json_int_t)tr->step,
                        "loss", (alpha * tau * tau * win->soft + (1 - alpha) * win->hard) / tok,
                        "distill/soft_loss", win->soft / tok, "distill/hard_loss", win->hard / tok,
                        "distill/student_perplexity", exp(win->hard / tok), "mean_token_accuracy",
                        win->correct / tok, "learning_rate", lr, "grad_norm", norm,
                        "num_tokens", tr->num_tokens, "tokens_per_s", tokens_per_s);
  if (!d->offline) json_object_set_new(j, "distill/teacher_perplexity", json_real(exp(win->teacher_nll / tok)));
  return ct_log_metrics(&tr->log, j);
}
