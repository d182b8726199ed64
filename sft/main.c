// sft: supervised fine-tuning, as TRL's SFTTrainer.
//
//   bin/sft configs/sft.yml model_path=DIR dataset_path=train.jsonl output_dir=out
//
// Each optimizer step takes per_device_train_batch_size x gradient_accumulation_steps x
// ranks sequences. Loss = Σ cross-entropy over labeled tokens (+ z_loss_multiplier·lse²)
// ÷ the number of labeled tokens in the WHOLE step, counted before any backward pass.
// With mtp_num_layers D > 0 (nn/mtp.h) it adds mtp_loss_scaling_factor · mean_k CE_k, each
// depth's cross-entropy ÷ that depth's targets in the whole step, counted the same way.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fingerprint.h"
#include "ckpt.h"
#include "config.h"
#include "die.h"
#include "dist.h"
#include "error.h"
#include "lm.h"
#include "loop.h"
#include "matmul.h"
#include "mtp.h"
#include "pool.h"
#include "run.h"
#include "train.h"
#include "watch.h"
#include "window.h"

static ct_data_opts data_opts(const ct_config *c, bool packing, int model_vocab) {
  return (ct_data_opts){.max_length = (int)c->max_length,
                        .completion_only_loss = c->completion_only_loss,
                        .assistant_only_loss = c->assistant_only_loss,
                        .skip_bad_rows = c->skip_bad_rows,
                        .packing = packing,
                        .text_field = c->dataset_text_field,
                        .model_vocab = model_vocab};
}

static void describe(ct_train *tr, const char *what, const ct_dataset *ds) {
  ct_log_info(&tr->log, "%s: %s: %d rows, %ld tokens (%ld trained), %d sequences%s", what, ds->path,
              ds->n_rows, ds->n_tokens, ds->n_label_tokens, ds->n_seq,
              ds->n_seq != ds->n_rows ? " after packing" : "");
  if (ds->n_truncated) ct_log_info(&tr->log, "%s: %d rows truncated to max_length", what, ds->n_truncated);
  if (ds->n_empty) ct_log_info(&tr->log, "%s: %d rows dropped: no trained token left", what, ds->n_empty);
  if (ds->n_bad) ct_log_info(&tr->log, "%s: %d malformed rows skipped; first: %s", what, ds->n_bad, ds->first_bad);
  if (ds->n_prefix_mismatch)
    ct_log_info(&tr->log, "%s: %d rows whose tokenized prompt is not a prefix of prompt+completion "
                "(the completion starts after the prompt's tokens, as in TRL)", what, ds->n_prefix_mismatch);
}

typedef struct {
  ct_acts acts;       // training micro-batches: kept (or recomputed) for backward
  ct_acts eval_acts;  // evaluation batches: forward only
  ct_head head;
  ct_batch batch;
  int *seqs;
  ct_mtp mtp, eval_mtp;  // multi-token prediction's depths (mtp_num_layers > 0)
} workspace;

static void workspace_free(workspace *w) {
  ct_acts_free(&w->acts);
  ct_acts_free(&w->eval_acts);
  ct_head_free(&w->head);
  ct_batch_free(&w->batch);
  free(w->seqs);
  if (w->mtp.D) ct_mtp_free(&w->mtp);
  if (w->eval_mtp.D) ct_mtp_free(&w->eval_mtp);
}

// Multi-token prediction's work space, attached to the activations ct_lm_step runs through.
static int mtp_setup(ct_train *tr, workspace *w, int B, int Be, int T) {
  int rc = ct_mtp_init(&w->mtp, &tr->model, B, T, true);
  if (!rc && Be) rc = ct_mtp_init(&w->eval_mtp, &tr->model, Be, T, false);
  w->acts.mtp = &w->mtp;
  if (Be) w->eval_acts.mtp = &w->eval_mtp;
  return rc;
}

// Each depth's weight for this step's n sequences: λ / (D · its targets in the whole step).
static void mtp_scale(ct_train *tr, workspace *w, const ct_dataset *ds, int n) {
  double counts[CT_MTP_MAX] = {0};
  for (int i = 0; i < n; i++) {  // (the batch is filled again for training)
    ct_batch_fill(&w->batch, ds, w->seqs + i, 1, ct_tokenizer_pad(tr->tok));
    ct_mtp_count(w->batch.target, w->batch.seg, 1, w->batch.T, w->mtp.D, counts);
  }
  ct_mtp_set_scale(&w->mtp, (float)tr->cfg->mtp_loss_scaling_factor, counts);
}

static void evaluate(ct_train *tr, workspace *w, const ct_dataset *ev) {
  if (ct_train_eval_lm(tr, &w->eval_acts, &w->head, &w->batch, w->seqs, ev)) ct_die(1, "eval");
}

// The train set and the eval set (when eval_dataset_path is set: never packed), said.
static void load_data(ct_train *tr, ct_dataset *train, ct_dataset *eval) {
  const ct_config *cfg = tr->cfg;
  int vocab = tr->model.cfg.vocab_size;
  ct_data_opts o = data_opts(cfg, cfg->packing, vocab);
  if (ct_dataset_load(train, cfg->dataset_path, tr->tok, &o)) ct_die(1, NULL);
  describe(tr, "train", train);
  if (cfg->eval_dataset_path[0]) {
    ct_data_opts eo = data_opts(cfg, false, vocab);
    if (ct_dataset_load(eval, cfg->eval_dataset_path, tr->tok, &eo)) ct_die(1, NULL);
    describe(tr, "eval", eval);
  }
}

// SFT's rows of the memory plan: activations of B x T training and Be x T eval tokens, the
// fused LM head, multi-token prediction's depths. Returns the head's rows at a time.
static int plan_rows(ct_train *tr, ct_plan *plan, int B, int Be, int T) {
  const ct_model_config *mc = &tr->model.cfg;
  int V = mc->vocab_size, C = mc->hidden_size, tiles = (int)tr->cfg->num_vocab_tiling, Bmax = B > Be ? B : Be;
  ct_train_plan_acts(tr, plan, B, Be, T);
  int hrows = ct_head_chunk_rows(B * T, V, CT_HEAD_MIN_ROWS);  // the fused head's rows at a time (ct_lm_step)
  ct_plan_addf(plan, ct_head_bytes(Bmax * T, hrows, V, C, tiles),
               "LM head: logits of %d of %d x %d tokens at a time / %d chunks", hrows, B, T, tiles);
  int D = mc->mtp_layers;
  if (D)
    ct_plan_addf(plan, ct_mtp_bytes(&tr->model, B, T, true) + (Be ? ct_mtp_bytes(&tr->model, Be, T, false) : 0),
                 "multi-token prediction: activations of %d depth%s", D, D > 1 ? "s" : "");
  return hrows;
}

// The work space the plan counted: seqs for a whole step (`global`).
static void workspace_init(ct_train *tr, workspace *w, int B, int Be, int T, int hrows, int global) {
  const ct_model_config *mc = &tr->model.cfg;
  int Bmax = B > Be ? B : Be;
  w->seqs = malloc(sizeof(int) * (global > Bmax ? global : Bmax));
  if (!w->seqs || ct_train_acts(tr, &w->acts, B, T) ||
      (Be && (ct_acts_init(&w->eval_acts, &tr->model, Be, T, CT_ACTS_FORWARD) || ct_train_attach(tr, &w->eval_acts))) ||
      ct_head_init(&w->head, Bmax * T, hrows, mc->vocab_size, mc->hidden_size, (int)tr->cfg->num_vocab_tiling) ||
      ct_batch_init(&w->batch, Bmax, T) || (mc->mtp_layers && mtp_setup(tr, w, B, Be, T)))
    ct_die(1, NULL);
}

// One optimizer step's gradients from its n sequences (w->seqs), this rank's micro-batches
// of B; their statistics summed into st (this rank's).
static void train_step(ct_train *tr, workspace *w, const ct_dataset *ds, int n, int B, ct_lm_stats *st) {
  const ct_config *cfg = tr->cfg;
  int accum = (int)cfg->gradient_accumulation_steps;
  long labels = 0;  // the denominator: every labeled token of this optimizer step
  for (int i = 0; i < n; i++) labels += ct_seq_labels(ds, w->seqs[i]);
  float scale = labels ? 1.0f / (float)labels : 0.0f;
  if (tr->model.cfg.mtp_layers) mtp_scale(tr, w, ds, n);
  ct_loop_phase(tr, 0, accum, 0);  // (the heartbeat's line)
  for (int k = 0, first, m; k < accum && (m = ct_loop_micro(tr, k, B, n, &first)); k++) {
    ct_batch_fill(&w->batch, ds, w->seqs + first, m, ct_tokenizer_pad(tr->tok));
    ct_train_dropout_key(tr, k);
    if (ct_loop_micro_last(tr, k, accum, B, n)) ct_train_overlap_arm(tr, &w->acts);
    if (ct_lm_step(&tr->model, &w->acts, &w->head, &w->batch, &tr->g, scale, (float)cfg->z_loss_multiplier, st))
      ct_die(1, NULL);
    ct_loop_phase(tr, k + 1, accum, st->tokens);
  }
}

// The metrics line of the logging window (win: its summed statistics).
static void log_metrics(ct_train *tr, const ct_window *w, const ct_lm_stats *win, double lr, double tok_s) {
  const ct_config *cfg = tr->cfg;
  int D = tr->model.cfg.mtp_layers;
  double t = win->targets > 0 ? win->targets : 1;
  json_t *m = json_pack("{s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}", "step", (json_int_t)tr->step,
                        "epoch", tr->epoch + (double)tr->epoch_pos / tr->n_seq, "loss", ct_window_loss(w),
                        "learning_rate", lr, "grad_norm", ct_window_norm(w), "mean_token_accuracy",
                        win->correct / t, "entropy", win->entropy / t, "num_tokens", tr->num_tokens,
                        "tokens_per_s", tok_s);
  if (cfg->z_loss_multiplier > 0) json_object_set_new(m, "z_loss", json_real(cfg->z_loss_multiplier * win->z / t));
  if (D) json_object_set_new(m, "mtp_loss", json_real(ct_mtp_mean_loss(&win->mtp, D)));
  if (ct_log_metrics(&tr->log, m)) ct_die(1, NULL);
}

int main(int argc, char **argv) {
  ct_config cfg;
  ct_train tr;
  ct_train_start(&tr, &cfg, CT_TRAINER_SFT, argc, argv, NULL);
  ct_dataset train, eval = {0};
  load_data(&tr, &train, &eval);

  int B = (int)cfg.per_device_train_batch_size, accum = (int)cfg.gradient_accumulation_steps;
  int Be = cfg.eval_dataset_path[0] ? (int)cfg.per_device_eval_batch_size : 0;
  int global = B * accum * tr.world, T = (int)cfg.max_length, D = tr.model.cfg.mtp_layers;
  if (ct_train_schedule(&tr, train.n_seq, global, ct_dataset_fingerprint(&train))) ct_die(1, NULL);
  ct_plan plan = {0};
  int hrows = plan_rows(&tr, &plan, B, Be, T);
  if (ct_loop_memory(&tr, &plan, "gradient_checkpointing=true, num_vocab_tiling (more chunks), a smaller "
                     "per_device_train_batch_size or max_length")) {
    ct_dataset_free(&train);
    ct_dataset_free(&eval);
    ct_train_release(&tr);
    return 0;
  }
  workspace w = {0};
  workspace_init(&tr, &w, B, Be, T, hrows, global);
  ct_train_log_schedule(&tr, train.n_seq, global, B, accum, "sequence");
  ct_train_watch_signals(&tr);

  if (ct_loop_eval_on_start(&tr)) evaluate(&tr, &w, &eval);
  ct_lm_stats win;  // the logging window's sums
  ct_window lw;
  ct_window_init(&lw, &win, sizeof win);
  bool stop = false;
  while (tr.step < tr.total_steps && !stop) {
    int n = ct_train_next_seqs(&tr, w.seqs, global);
    ct_lm_stats st = {0};
    train_step(&tr, &w, &train, n, B, &st);
    double norm, lr;
    ct_loop_update(&tr, &st, sizeof st, &norm, &lr);
    tr.num_tokens += st.tokens;
    double step_loss = (st.loss + cfg.z_loss_multiplier * st.z) / (st.targets > 0 ? st.targets : 1) +
                       cfg.mtp_loss_scaling_factor * ct_mtp_mean_loss(&st.mtp, D);
    ct_window_add(&lw, &st, step_loss, norm);
    double tok_s = ct_window_rate(&lw, win.tokens);
    ct_log_progress(&tr.log, tr.step, step_loss, tok_s);
    if (ct_train_log_due(&tr)) {
      log_metrics(&tr, &lw, &win, lr, tok_s);
      ct_window_reset(&lw);
    }
    if (ct_loop_eval_after_step(&tr)) evaluate(&tr, &w, &eval);
    if (ct_train_after_step(&tr, &stop)) ct_die(1, NULL);
  }
  if (ct_loop_eval_at_end(&tr, stop)) evaluate(&tr, &w, &eval);
  workspace_free(&w);
  ct_dataset_free(&train);
  ct_dataset_free(&eval);
  return ct_train_finish(&tr, stop);
}
