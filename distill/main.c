// distill: a student learns from a teacher, as MaxText's distillation and TRL's GKD.
//
//   bin/distill configs/distill.yml teacher_path=DIR model_path=DIR dataset_path=data.jsonl
//   bin/distill precompute configs/distill.yml teacher_path=DIR dataset_path=data.jsonl
//               teacher_logits_path=topk.safetensors
//
// Data as SFT. Loss per labeled token: α·τ²·soft + (1 − α)·hard, soft the generalized JSD
// between teacher and student at temperature τ (distill/kd.h), hard the cross-entropy;
// both averaged over the step's labeled tokens. The teacher runs forward only, before
// the student's pass, and keeps only its final hidden states for the step; offline mode
// reads its precomputed top-k logits instead and loads no teacher. With probability
// lmbda a batch's completions are generated first (by the student, or the teacher with
// seq_kd), and those get the soft loss only.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "die.h"
#include "dist.h"
#include "distill/distill.h"
#include "error.h"
#include "fingerprint.h"
#include "hf.h"
#include "ident.h"
#include "lm.h"
#include "loop.h"
#include "mem.h"
#include "policy_engine.h"
#include "rng.h"
#include "run.h"
#include "watch.h"
#include "window.h"

static bool precompute_mode;  // `bin/distill precompute ...`: write the teacher's top-k logits

// Distillation's own checks of the config, before anything is loaded.
static int check_config(const ct_config *c) {
  bool offline = !precompute_mode && c->teacher_logits_path[0];
  if (!offline && !c->teacher_path[0])
    return ct_set_error(CT_ECONFIG, "%s: key 'teacher_path' is required (or teacher_logits_path "
                        "for precomputed logits)", ct_config_origin(c, "teacher_path"));
  if (offline && c->lmbda > 0)
    return ct_set_error(CT_ECONFIG, "%s: key 'lmbda': on-policy distillation needs the teacher "
                        "itself, not precomputed logits", ct_config_origin(c, "lmbda"));
  const char *on_policy = c->seq_kd ? "seq_kd" : c->log_completions ? "log_completions"
                          : c->num_completions_to_print ? "num_completions_to_print"
                          : ct_config_is_set(c, "max_new_tokens") ? "max_new_tokens" : NULL;
  if (c->lmbda == 0 && on_policy)
    return ct_set_error(CT_ECONFIG, "%s: key '%s' acts on generated batches, and lmbda is 0 (none are "
                        "generated); set lmbda > 0 or drop the key", ct_config_origin(c, on_policy), on_policy);
  if (c->temperature <= 0)
    return ct_set_error(CT_ECONFIG, "%s: key 'temperature': distillation divides logits by it (and samples "
                        "at it); give a value above 0", ct_config_origin(c, "temperature"));
  if ((c->lmbda > 0 || c->teacher_dtype == CT_STORE_INT8) && c->packing)
    return ct_set_error(CT_ECONFIG, "%s: key 'packing' cannot be combined with lmbda or an int8 "
                        "teacher", ct_config_origin(c, "packing"));
  if (c->lmbda > 0 && !c->seq_kd && c->use_peft && c->base_dtype == CT_STORE_INT8)
    return ct_set_error(CT_ECONFIG, "%s: key 'base_dtype': on-policy batches are sampled by the sampler's "
                        "engine, which runs a float32 or bfloat16 student, not int8", ct_config_origin(c, "base_dtype"));
  if (c->lmbda > 0 && c->seq_kd && c->teacher_dtype == CT_STORE_BF16)
    return ct_set_error(CT_ECONFIG, "%s: key 'teacher_dtype': seq_kd generates with the teacher through "
                        "the sampler's engine, which runs float32 or int8 weights, not bfloat16",
                        ct_config_origin(c, "teacher_dtype"));
  return 0;
}

// The train (and eval) data. `precompute` without a student (no model_path nor
// tokenizer_path) tokenizes with the teacher's tokenizer, returned (else NULL): the student
// it will train must share it anyway, and the one built from scratch (the byte tokenizer)
// would not.
static ct_tokenizer *load_data(ct_distill *d) {
  const ct_config *cfg = d->cfg;
  ct_train *tr = d->tr;
  ct_tokenizer *teacher_tok = NULL;
  int vocab = tr->model.cfg.vocab_size;
  if (precompute_mode && !cfg->model_path[0] && !cfg->tokenizer_path[0]) {
    if (ct_tokenizer_load_said(NULL, &teacher_tok, cfg->teacher_path))
      ct_die(1, (ct_wrap_error(CT_EIO, "%s: key 'teacher_path'", ct_config_origin(cfg, "teacher_path")), NULL));
    vocab = ct_tokenizer_vocab_size(teacher_tok);
  } else if (!d->offline && ct_distill_check_vocabularies(cfg, tr->tok)) {
    ct_die(1, NULL);
  }
  const ct_tokenizer *tok = teacher_tok ? teacher_tok : tr->tok;
  ct_data_opts o = {(int)cfg->max_length, cfg->completion_only_loss, cfg->assistant_only_loss,
                    cfg->skip_bad_rows, cfg->packing, cfg->dataset_text_field, vocab};
  if (ct_dataset_load(&d->train, cfg->dataset_path, tok, &o)) ct_die(1, NULL);
  d->have_eval = cfg->eval_dataset_path[0] && !precompute_mode;
  ct_data_opts eo = o;
  eo.packing = false;
  if (d->have_eval && ct_dataset_load(&d->eval, cfg->eval_dataset_path, tr->tok, &eo)) ct_die(1, NULL);
  ct_log_info(&tr->log, "train: %s: %d rows, %ld trained tokens", d->train.path, d->train.n_rows,
              d->train.n_label_tokens);
  return teacher_tok;
}

// `bin/distill precompute`: the teacher's top-k logits of the train data are the output.
static int precompute(ct_distill *d, ct_tokenizer *teacher_tok) {
  const ct_config *cfg = d->cfg;
  if (!cfg->teacher_logits_path[0])
    ct_die(2, (ct_set_error(CT_ECONFIG, "precompute needs teacher_logits_path=FILE (where to write)"), NULL));
  if (ct_distill_precompute(cfg, d->tr, teacher_tok ? teacher_tok : d->tr->tok, &d->train)) ct_die(1, NULL);
  ct_dataset_free(&d->train);
  ct_tokenizer_free(teacher_tok);
  ct_train_release(d->tr);  // nothing to save
  return 0;
}

// The step's shape, the teacher's (or its logits'), and the memory plan; true: a dry run
// (the plan printed, nothing more to do).
static bool plan(ct_distill *d) {
  const ct_config *cfg = d->cfg;
  ct_train *tr = d->tr;
  int B = d->B = (int)cfg->per_device_train_batch_size, accum = d->accum = (int)cfg->gradient_accumulation_steps;
  int T = d->T = (int)cfg->max_length;
  d->global = B * accum * tr->world;
  const ct_model_config *mc = &tr->model.cfg;
  ct_model_config tc = *mc;  // the teacher's shape
  if (d->offline && ct_distill_topk_load(tr, &d->train, &d->tk)) ct_die(1, NULL);
  else if (!d->offline && ct_model_read_config(&tc, cfg->teacher_path)) ct_die(1, "teacher");
  int V = mc->vocab_size, Vt = tc.vocab_size, C = mc->hidden_size, tiles = (int)cfg->num_vocab_tiling;
  if (Vt != V)
    ct_log_info(&tr->log, "teacher vocab_size %d, student %d: the soft loss uses the first %d logits",
                Vt, V, Vt < V ? Vt : V);
  if (Vt < V) V = Vt;
  d->V = V;
  if (ct_train_schedule(tr, d->train.n_seq, d->global, ct_dataset_fingerprint(&d->train))) ct_die(1, NULL);
  int Tg = ct_distill_generation_positions(&d->train, cfg->max_new_tokens, T);  // on-policy generation
  d->geo = (ct_engine_opts){B, Tg, Tg > B ? Tg : B, false};  // (the teacher's engine too: float32 keys)
  ct_plan plan = {0};
  int Be = d->Be = d->have_eval ? (int)cfg->per_device_eval_batch_size : 0, Bmax = B > Be ? B : Be;
  ct_train_plan_acts(tr, &plan, B, Be, T);
  ct_plan_addf(&plan, ct_head_bytes(Bmax * T, B * T, mc->vocab_size, C, tiles) + ct_kd_bytes(B * T, V, C, tiles),
               "LM head and soft loss: %d x %d tokens / %d chunks", B, T, tiles);
  if (!d->offline)
    ct_plan_addf(&plan, ct_frozen_bytes(&tc, (int)cfg->teacher_dtype, B, T) + 4.0 * B * T * tc.hidden_size +
                            (tr->bf16 ? ct_frozen_bf16_bytes(&tc, (int)cfg->teacher_dtype, B, T) : 0),
                 "teacher (%s%s)", ct_store_names[cfg->teacher_dtype], tr->bf16 ? ", bf16 compute" : "");
  else
    ct_plan_addf(&plan, 8.0 * B * T * d->tk.f.k, "teacher top-%d logits of a batch", d->tk.f.k);
  if (cfg->lmbda > 0)  // the engine over the teacher (seq_kd) or the student, packed
    ct_policy_engine_plan(&plan, cfg->seq_kd ? &tc : mc, &d->geo, ct_policy_engine_pack(tr),
                          cfg->seq_kd ? NULL : "the student", !cfg->seq_kd && cfg->use_peft ? tr : NULL);
  return ct_loop_memory(tr, &plan, "gradient_checkpointing=true, teacher_dtype=bfloat16 or int8, "
                        "num_vocab_tiling, a smaller per_device_train_batch_size or max_length");
}

// What the plan counted: the teacher (and its identity, checked at the end), the student's
// buffers, the on-policy batches and the engine that samples them.
static void build(ct_distill *d) {
  const ct_config *cfg = d->cfg;
  ct_train *tr = d->tr;
  const ct_model_config *mc = &tr->model.cfg;
  int B = d->B, T = d->T, Be = d->Be, Bmax = B > Be ? B : Be, accum = d->accum, C = mc->hidden_size;
  int tiles = (int)cfg->num_vocab_tiling;
  if (!d->offline && (ct_distill_teacher_load(&d->teacher, cfg, B, T) ||
                      (tr->bf16 && ct_frozen_compute_bf16(&d->teacher.f))))
    ct_die(1, NULL);
  d->teacher_sum = d->offline ? 0 : ct_frozen_checksum(&d->teacher.f);
  if (!d->offline) {  // the teacher's identity: a resumed run must distil from the same one
    ct_ident id;
    ct_ident_set(&id, "teacher", "teacher_path", cfg->teacher_path, "teacher_dtype",
                 ct_store_names[cfg->teacher_dtype], d->teacher_sum);
    if (ct_train_frozen_record(tr, &id)) ct_die(1, NULL);
  }
  d->seqs = malloc(sizeof(int) * (d->global > Bmax ? d->global : Bmax));
  if (d->have_eval && (ct_acts_init(&d->eval_acts, &tr->model, Be, T, CT_ACTS_FORWARD) ||
                       ct_train_attach(tr, &d->eval_acts)))
    ct_die(1, NULL);
  d->where = malloc(sizeof(long) * B * T);
  if (d->offline) {
    d->tk.b_idx = malloc(sizeof(int) * (size_t)B * T * d->tk.f.k);
    d->tk.b_logit = malloc(sizeof(float) * (size_t)B * T * d->tk.f.k);
    if (!d->tk.b_idx || !d->tk.b_logit) ct_die(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  }
  if (!d->seqs || !d->where || ct_train_acts(tr, &d->acts, B, T) ||
      ct_batch_init(&d->batch, Bmax, T) || ct_head_init(&d->head, Bmax * T, B * T, mc->vocab_size, C, tiles) ||
      ct_kd_init(&d->kd, B * T, d->V, C, tiles))
    ct_die(1, NULL);
  d->gen_batches = cfg->lmbda > 0 ? calloc((size_t)accum, sizeof *d->gen_batches) : NULL;
  if (cfg->lmbda > 0 && !d->gen_batches) ct_die(1, (ct_set_error(CT_ENOMEM, "out of memory"), NULL));
  d->gen_rows = calloc((size_t)B * accum, sizeof *d->gen_rows);
  if (!d->gen_rows || ct_completions_open(&d->log, cfg->output_dir, cfg->lmbda > 0 && cfg->log_completions,
                                          (int)cfg->num_completions_to_print, tr->step, &tr->log))
    ct_die(1, NULL);
  for (int k = 0; cfg->lmbda > 0 && k < accum; k++)
    if (ct_batch_init(&d->gen_batches[k], B, T)) ct_die(1, NULL);
  if (cfg->lmbda > 0 && cfg->seq_kd) {  // the teacher's engine view
    if (ct_engine_init(&d->teacher_gen, &d->teacher.f.iw, &d->geo)) ct_die(1, NULL);
    d->gen = d->teacher_gen;
  } else if (cfg->lmbda > 0) {
    if (ct_policy_engine_init(&d->student, tr, ct_policy_engine_pack(tr), &d->geo)) ct_die(1, NULL);
    d->gen = d->student.engine;
  }
  d->ko = (ct_kd_opts){(float)cfg->temperature, (float)cfg->beta, 0, false};
  d->tau = d->ko.tau;
  d->alpha = cfg->distill_alpha;
}

static void distill_free(ct_distill *d) {
  if (d->teacher_gen) ct_engine_free(d->teacher_gen);
  ct_policy_engine_free(&d->student);
  for (int k = 0; d->cfg->lmbda > 0 && k < d->accum; k++) ct_batch_free(&d->gen_batches[k]);
  free(d->gen_batches);
  free(d->gen_rows);
  if (!d->offline) ct_distill_teacher_free(&d->teacher);
  ct_topk_free(&d->tk.f);
  ct_free_all(d->tk.row_off, d->tk.b_idx, d->tk.b_logit, d->seqs, d->where);
  ct_acts_free(&d->acts);
  ct_head_free(&d->head);
  ct_kd_free(&d->kd);
  ct_batch_free(&d->batch);
  ct_acts_free(&d->eval_acts);
  ct_dataset_free(&d->train);
  ct_dataset_free(&d->eval);
}

// The student's cross-entropy and greedy sequence accuracy on the eval set.
static void evaluate(ct_distill *d) {
  if (ct_train_eval_lm(d->tr, &d->eval_acts, &d->head, &d->batch, d->seqs, &d->eval)) ct_die(1, "eval");
}

int main(int argc, char **argv) {
  precompute_mode = argc > 1 && !strcmp(argv[1], "precompute");
  if (precompute_mode) argv++, argc--;
  ct_config cfg;
  ct_train tr;
  ct_train_start(&tr, &cfg, CT_TRAINER_DISTILL, argc, argv, check_config);
  ct_distill d = {.cfg = &cfg, .tr = &tr, .offline = !precompute_mode && cfg.teacher_logits_path[0]};
  ct_tokenizer *teacher_tok = load_data(&d);
  if (precompute_mode) return precompute(&d, teacher_tok);
  if (plan(&d)) {
    ct_topk_free(&d.tk.f);
    free(d.tk.row_off);
    ct_dataset_free(&d.train);
    ct_train_release(&tr);
    return 0;
  }
  build(&d);
  ct_log_info(&tr.log, "training %ld steps; teacher %s; alpha %g, beta %g, temperature %g%s",
              tr.total_steps - tr.step, d.offline ? "offline top-k logits" : cfg.teacher_path, d.alpha,
              cfg.beta, d.tau, cfg.lmbda > 0 ? (cfg.seq_kd ? ", teacher-generated batches" : ", on-policy batches") : "");
  ct_train_watch_signals(&tr);
  if (ct_loop_eval_on_start(&tr)) evaluate(&d);
  bool stop = false;
  ct_distill_stats win = {0};
  ct_window w;
  ct_window_init(&w, &win, sizeof win);
  while (tr.step < tr.total_steps && !stop) {
    int n = ct_train_next_seqs(&tr, d.seqs, d.global);
    // on-policy for this step? one draw from the train state's rng (saved, so resumable)
    bool generated = cfg.lmbda > 0 && ct_rng_uniform(&tr.rng) < cfg.lmbda;
    long labels = 0;  // the step's labeled tokens (all ranks): the losses' denominator
    if (generated && ct_distill_generate(&d, d.seqs, n, &labels)) ct_die(1, NULL);  // all completions first
    for (int i = 0; !generated && i < n; i++) labels += ct_seq_labels(&d.train, d.seqs[i]);
    ct_distill_stats st = {0};
    if (ct_distill_train_pass(&d, n, generated, labels, &st)) ct_die(1, NULL);
    double norm, lr;
    ct_loop_update(&tr, &st, sizeof st, &norm, &lr);
    tr.num_tokens += st.input_tokens;
    double step_loss = (d.alpha * d.tau * d.tau * st.soft + (1 - d.alpha) * st.hard) / (st.tokens > 0 ? st.tokens : 1);
    ct_window_add(&w, &st, step_loss, norm);
    ct_log_progress(&tr.log, tr.step, step_loss, ct_window_rate(&w, win.input_tokens));
    if (ct_train_log_due(&tr)) {
      if (ct_distill_log_step(&d, &win, lr, norm, ct_window_rate(&w, win.input_tokens))) ct_die(1, NULL);
      ct_window_reset(&w);
    }
    if (ct_loop_eval_after_step(&tr)) evaluate(&d);
    if (ct_train_after_step(&tr, &stop)) ct_die(1, NULL);
  }
  if (ct_loop_eval_at_end(&tr, stop)) evaluate(&d);
  if (!stop && !d.offline) {
    if (ct_frozen_checksum(&d.teacher.f) != d.teacher_sum)
      ct_die(1, (ct_set_error(CT_EINVAL, "the teacher's weights changed during training"), NULL));
    ct_log_info(&tr.log, "teacher weights unchanged (checksum %016llx)", (unsigned long long)d.teacher_sum);
  }
  distill_free(&d);
  return ct_train_finish(&tr, stop);
}
