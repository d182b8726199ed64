// train: what every trainer shares around its own loss — the policy's train state
// (parameters, gradients, AdamW moments, step, rng, data position), set-up from a
// config, the optimizer step, the data order, metrics, and checkpoints.
//
// The train state holds exactly: parameters, optimizer moments, step, rng state and
// data position. Nothing computed in a forward pass is ever saved with it. A resumed run
// repeats an uninterrupted one bit for bit when it uses the same threads per rank and
// ranks (how a matrix product is split between threads can change its last bits).
//
// Its functions live by concern: train.c (after a step, the run's log lines, the test hooks;
// a run's start and end are app/run.c's), train_setup.c (ct_train_setup), train_memory.c
// (ct_train_memory, the activations' size, ct_train_free), train_reference.c (frozen inputs,
// the reference model), train_eval.c, train_schedule.c (steps and data order), train_update.c
// (the optimizer step, ZeRO-1, DiLoCo), train_overlap.c (ddp_bucket_cap_mb), train_save.c
// (checkpoints, the final model) with the checkpoint's train_state.c (trainer_state.json) and
// train_moments.c (the optimizer's files). What they share with each other only is in
// train_internal.h.
#pragma once
#include <stdbool.h>

#include "config.h"
#include "data.h"
#include "dist.h"
#include "head.h"
#include "frozen.h"
#include "ident.h"
#include "log.h"
#include "lora.h"
#include "model.h"
#include "optim.h"
#include "plan.h"
#include "qkclip.h"
#include "rng.h"
#include "tokenizer.h"

enum { CT_TRAIN_FROZEN_MAX = 4 };  // frozen inputs a run records (base, reference, teacher)

typedef struct {
  ct_config *cfg;
  const char *name;   // the trainer ("sft", ...): what its fatal errors start with
  int rank, world;
  ct_tokenizer *tok;
  ct_model model;     // the policy (use_peft: its frozen base); model.params are fp32 master weights
  ct_lora lora;       // use_peft: the adapters, which are what trains
  ct_layout trained;  // what the optimizer updates: the model's tensors, or the adapters'
  float *params;      // (trained.n_floats) their values: model.params or lora.params
  float *grads;       // (trained.n_floats) same layout as params
  float *mom1, *mom2; // (n_floats) AdamW moments (optimizer muon: mom1 is the matrices' momentum,
                      // their part of mom2 stays zero); with optimizer_sharding (shard.n > 0) only
                      // this rank's shard: (shard.hi - shard.lo), element 0 being shard.lo
  float *muon_work;   // optimizer muon: Newton-Schulz scratch (ct_muon_work_floats); else NULL
  ct_shard shard;     // optimizer_sharding (ZeRO-1): this rank's part of `trained`; n = 0: off
  // DiLoCo (diloco_inner_steps > 0): the weights at the last sync and the outer Nesterov
  // momentum (n_floats each, the same on every rank); outer_pending: local steps taken
  // since (a checkpoint or a stop waits for the next sync, where every rank agrees)
  float *outer_start, *outer_mom;
  bool outer_pending;
  int saved_diloco_ranks; // a resumed checkpoint's: DiLoCo's ranks that saved it (0: not DiLoCo)
  double comm0;       // ct_dist_bytes_sent() and step when training started (ct_train_schedule)
  long step0;
  ct_qkclip qkclip;   // qk_clip_threshold > 0: this step's per-head attention maxima (never saved)
  ct_weights g;       // views of grads into the model's layout (NULL members: frozen weights)
  ct_adamw adam;
  bool bf16;          // the model's matmuls run in bf16 (bf16: true, or auto on a bf16 CPU)
  int base_dtype;     // a LoRA base's storage, CT_STORE_*: base_dtype with auto resolved
  // the training activations' mode (CT_ACTS_KEEP or _RECOMPUTE) as the memory plan settled it
  // (ct_train_plan_acts, ct_train_memory), and their row of that plan (-1: none)
  int acts_mode, acts_row, acts_B, acts_T;
  int acts_kept;      // _RECOMPUTE: the top layers whose activations are kept (no recomputation)
  // position
  long step;          // optimizer steps taken
  long total_steps;
  long warmup_steps;
  long epoch;         // current epoch (0-based)
  long epoch_pos;     // sequences of the current epoch already consumed
  int n_seq;          // sequences per epoch (checked on resume)
  ct_rng rng;         // for trainers that draw random numbers (sampling); saved
  double num_tokens;  // input tokens seen so far (TRL's num_tokens)
  char resumed_from[4096];
  int lock_fd1;       // output_dir/.lock's descriptor + 1 (0: none), held until released
  uint64_t data_hash; // of the training data as tokenized (checked on resume)
  int global_batch;   // sequences (or prompts) per optimizer step (checked on resume)
  int steps_per_batch;  // optimizer steps on each batch (GRPO's num_iterations; 0 = 1)
  bool mid_batch;     // more steps will train on this batch (GRPO's rollouts, which no
                      // checkpoint holds): a checkpoint or a stop waits for its last step
  bool save_pending, stop_pending;  // ... and happens then
  ct_log log;
  int *order;         // (n_seq) this epoch's sequence order
  // Optional: writes a trainer's own files into a checkpoint directory being saved.
  int (*save_extra)(void *ctx, const char *dir);
  void *save_extra_ctx;
  double save_extra_bytes;  // what save_extra writes (for the free-space check)
  struct ct_overlap *overlap;  // ddp_bucket_cap_mb's buckets (NULL: one blocking sum)
  // the frozen inputs (ct_train_frozen_record): this run's, and those a resumed checkpoint recorded
  ct_ident frozen[CT_TRAIN_FROZEN_MAX], saved_frozen[CT_TRAIN_FROZEN_MAX];
  int n_frozen, n_saved_frozen;
} ct_train;


// Sets up from a resolved config: output_dir, threads, tokenizer, the model's shape (from
// model_path's config.json, the `model:` block, or the checkpoint when
// resume_from_checkpoint is set; tr->model has its layout but no parameters yet), the
// trainer state of a resumed run. Writes output_dir/config.yml.
int ct_train_setup(ct_train *tr, ct_config *cfg);

// The memory plan, then the train state's buffers. Adds the policy's rows (parameters,
// gradients, AdamW moments) and what the process holds already to the trainer's rows in
// p, prints the plan and refuses it (CT_ENOMEM naming `knobs`) when it does not fit.
// With dry_run it stops there (*dry = true, nothing allocated). Otherwise it allocates
// the parameters and fills them (model_path, the checkpoint, or the seeded
// initialization), the gradients and the moments (restored when resuming).
// ct_train_memory's own rows of the plan (the policy's parameters, gradients, optimizer
// state, its bf16 copy, and what the process holds already), added to p without a check:
// what a trainer sizing another row against the room (ct_plan_room) counts beside it.
int ct_train_plan_policy(const ct_train *tr, ct_plan *p);
// The adapters' config from the lora_* keys (use_peft without adapter_path).
ct_lora_config ct_train_lora_config(const ct_config *c);
int ct_train_memory(ct_train *tr, ct_plan *p, const char *knobs, bool *dry);

// The policy's forwards through a apply its adapters (use_peft) or none; training forwards
// (CT_ACTS_KEEP, CT_ACTS_RECOMPUTE) record QK-Clip's maxima when it is on.
int ct_train_attach(const ct_train *tr, ct_acts *a);
// The training activations for B x T tokens as the plan settled them (acts_mode, acts_kept),
// attached (ct_train_attach).
int ct_train_acts(const ct_train *tr, ct_acts *a, int B, int T);
// Bytes of a policy's activations in `mode` for B x T tokens (+ the adapters' work space).
double ct_train_acts_bytes(const ct_train *tr, int B, int T, int mode);
// Loads dir's tokenizer.json, saying so for a big file (2 MB and up, as every real model's
// is: one with tens of thousands of added tokens takes seconds) and, for a read of 1 s or
// more, how long it took. log NULL: the messages go to stderr from rank 0.
int ct_tokenizer_load_said(ct_log *log, ct_tokenizer **tok, const char *dir);
// Adds a training metrics line's common fields to j: epoch, learning_rate, grad_norm,
// num_tokens, tokens_per_s.
void ct_train_log_fields(const ct_train *tr, json_t *j, double lr, double grad_norm, double tokens_per_s);
// Adds the activations' rows to a memory plan: rows x T training tokens in the mode
// gradient_checkpointing picks (tr->acts_mode; with `true` ct_train_memory keeps every layer
// instead when the whole plan fits that way), and eval_rows x T forward-only ones (none when 0).
void ct_train_plan_acts(ct_train *tr, ct_plan *plan, int rows, int eval_rows, int T);
// Before a training micro-batch's forward: which LoRA dropout masks it draws (a function
// of seed, step, micro-batch and rank, so a resumed run draws the same).
void ct_train_dropout_key(ct_train *tr, int micro);
void ct_train_free(ct_train *tr);

// Fixes the schedule once the dataset is known: n_seq sequences per epoch, `global`
// sequences per optimizer step, data_hash its fingerprint (fingerprint.h). Computes
// total_steps (max_steps, or num_train_epochs worth), checks a resumed run against its
// checkpoint (same data, same global batch, not past total_steps; a checkpoint at exactly
// total_steps trains nothing and the run writes its final model), and opens the metrics log.
int ct_train_schedule(ct_train *tr, int n_seq, int global, uint64_t data_hash);
// The line that says what the run will train: "training 3 steps of 8 sequences (...)". A
// step never crosses an epoch: when the data does not fill whole steps it says what a step
// really holds. unit: "sequence", "pair" (plural adds an s).
void ct_train_log_schedule(ct_train *tr, int n_seq, int global, int B, int accum, const char *unit);
// Whether the step just taken writes a metrics line: every logging_steps, the last step,
// and step 1 with logging_first_step.
bool ct_train_log_due(const ct_train *tr);

// The next optimizer step's sequences (at most `global` of them, never crossing an
// epoch boundary) into seqs; returns how many. Advances the data position.
int ct_train_next_seqs(ct_train *tr, int *seqs, int global);

// Sums gradients across ranks, clips to max_grad_norm, takes one step of the configured
// optimizer (AdamW, or Muon with AdamW for the non-matrices: ct_muon_step) with the
// scheduled learning rate, and zeroes the gradients. Reports the pre-clip norm and the
// learning rate used. A non-finite gradient norm is an error (nothing is updated).
// qk_clip_threshold > 0: after the step, QK-Clip rescales the q/k weights of the heads whose
// largest attention logit (over this step's training forwards, all ranks but DiLoCo's)
// passed the threshold (qkclip.h), and counts them for the log's training line.
// optimizer_sharding: the sum is reduce-scattered, the norm summed from the shards, each
// rank steps its shard and the weights all-gather (the same step to float rounding).
// DiLoCo: nothing is summed; the rank steps on its own gradient taken as the mean over
// its own tokens (x world, the trainers divide by the global batch's), and every
// diloco_inner_steps steps and at the last step the ranks average θ_start − θ and take
// the outer Nesterov step (ct_nesterov_outer_step); the reported norm is this rank's.
int ct_train_update(ct_train *tr, double *grad_norm, double *lr);

// Overlap (ddp_bucket_cap_mb > 0, plain data parallel, more than one rank): called
// before this rank's last backward of the step (after which its gradients are final)
// with the activations that backward runs through, it makes that backward start each
// bucket's sum across ranks as soon as the layers it holds are done; ct_train_update
// then starts the rest and waits. Without it (or when off: a no-op) every sum starts in
// ct_train_update. The sums are the same either way.
void ct_train_overlap_arm(ct_train *tr, ct_acts *a);

// Saves output_dir/checkpoint-<step> atomically and rotates old ones (rank 0 writes every
// file). optimizer_sharding: rank 0 writes optimizer.safetensors whole (zeros), then
// patches in each rank's shard as it arrives through rank 0's gradient buffer (zero
// between steps): no rank ever holds the whole moments, and the file is the one an
// unsharded run writes, so it resumes at any number of ranks. DiLoCo: optimizer.safetensors
// also holds the outer momentum (.outer_momentum; θ_start is the saved model, a checkpoint
// being taken at a sync) and rank r > 0's own moments go to optimizer-rank<r>.safetensors.
int ct_train_save_checkpoint(ct_train *tr);
// Saves the final model in output_dir: config.json, model.safetensors (save_dtype),
// tokenizer files, each replaced atomically.
int ct_train_save_final(ct_train *tr);

// Every trainer's loop ends its step with this. It polls for a signal (ct_stop_poll: the
// executable's watch acts on it, app/watch.h), saves a checkpoint every save_steps and
// reports (true) when the run must stop now: the CT_STOP_AFTER_STEP test hook, agreed on
// by every rank, which saves a checkpoint to resume from first. While tr->mid_batch
// (GRPO's num_iterations > 1: rollouts no checkpoint holds) both wait for the batch's last
// step, so a resume always starts at a new batch.
int ct_train_after_step(ct_train *tr, bool *stop);

// The last line of a run: steps, where the model is, and peak resident memory.
void ct_train_log_done(ct_train *tr);

// Causal-LM evaluation of the policy over a whole dataset (its sequences split across ranks,
// per_device_eval_batch_size at a time, through forward-only activations a): logs
// eval_loss, eval_mean_token_accuracy, eval_entropy, eval_sequence_accuracy (the rows
// greedy decoding reproduces) and a line. seqs holds at least per_device_eval_batch_size.
int ct_train_eval_lm(ct_train *tr, ct_acts *a, ct_head *h, ct_batch *b, int *seqs, const ct_dataset *ev);

// Records a frozen input's identity (ident.h) in the train state: checkpoints list it in
// trainer_state.json (ctune.frozen.<role>). A resumed run whose checkpoint recorded the
// same role with another path key, dtype or checksum is refused (CT_EINVAL, one line
// naming the key, the old value and the new); one saved before identities were recorded
// is not checked. ct_train_memory records a LoRA base (role "base", base_dtype),
// ct_train_reference the reference ("reference", ref_dtype or a LoRA policy's base_dtype);
// distillation records its teacher or top-k file ("teacher").
int ct_train_frozen_record(ct_train *tr, const ct_ident *id);
// This run's identity of `role`, or NULL when none was recorded.
const ct_ident *ct_train_frozen_find(const ct_train *tr, const char *role);

// The frozen reference model (DPO, GRPO with beta > 0), stored as `dtype` (CT_STORE_*)
// and sized for forwards of B rows x T tokens. It is ref_model_path when set, else the
// policy's starting weights: model_path, or the seeded initialization of a model built
// from scratch. A resumed run restores it the same way, or from the checkpoint's
// ref_model.safetensors when the reference is synced during training (sync_ref_model)
// and so cannot be rebuilt. A LoRA policy's reference is its base with the adapters off,
// run through the policy's own activations: call ct_frozen_through before its passes.
int ct_train_reference(ct_train *tr, ct_frozen *ref, int dtype, int B, int T);
// The reference's row of the memory plan (a copy as ref_dtype, or with use_peft only the
// activations of a view of the base), for forwards of B x T tokens.
void ct_train_plan_reference(const ct_train *tr, ct_plan *p, int B, int T);
// The reference's settings that cannot go together (a config check, before any loading):
// sync_ref_model writes the reference's weights, so it needs ref_dtype float32.
int ct_train_check_reference(const ct_config *c);
// TR-DPO: ref <- (1 - alpha) ref + alpha policy (a float32 reference with the policy's
// architecture).
int ct_train_sync_reference(ct_train *tr, ct_frozen *ref, double alpha);
// Saves ref into the checkpoint being written at `dir` (used when it is synced).
int ct_train_save_reference(const ct_frozen *ref, const char *dir);

// Test hooks, inert unless their environment variable is set:
// CT_FAILPOINT=point[:n] sleeps at the n-th (default first) pass through `point`, so a
// test can kill the process there; CT_STOP_AFTER_STEP=k makes a trainer stop after step
// k with a checkpoint (exit 130). CT_DISK_FREE_MB stands in for the free disk space a save
// checks (fs.h); CT_PROGRESS_SECONDS for a log's longest silence (log.h).
void ct_failpoint(const char *point);
bool ct_failpoint_stop(long step);
