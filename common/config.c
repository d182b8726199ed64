// config: the key table, value parsing, yml loading (libyaml document API), and the
// yml writers for configs/base.yml and output_dir/config.yml.
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "error.h"
#include "model.h"
#include "optim.h"

// ---------------------------------------------------------------------------------
// The key table
// ---------------------------------------------------------------------------------

enum {
  K_BOOL,
  K_INT,    // int64_t
  K_FLOAT,  // double
  K_STR,    // char *
  K_ENUM,   // int, index into choices
  K_STR_LIST,
  K_FLOAT_LIST,
  K_INCLUDE,  // base_config: read by the file loader, stored nowhere
};

typedef struct {
  const char *name;  // as written in yml; model.* keys live in the `model:` block
  int type;
  unsigned trainers;  // CT_TRAINER_* mask of the trainers that accept the key
  size_t offset;      // of the field in ct_config
  const char *def;    // built-in default, written as in a yml
  const char *per_trainer[6];  // default for sft, dpo, grpo, distill, sampler, reward; NULL = def
  double lo, hi;               // range of numbers (and of float-list items)
  int lo_open, hi_open;
  int nonfinite;                // floats: inf and nan are allowed
  const char *const *choices;   // enum values, or allowed string-list items
  const char *const *per_trainer_choices[6];  // string-list items one trainer takes; NULL = choices
  const char *section;          // this row starts a section of base.yml
  const char *comment;          // one sentence or two for base.yml
  unsigned required;            // CT_TRAINER_* mask of the trainers that cannot run without it
  const char *bool_as[2];       // string and enum keys TRL also takes as booleans: the
                                // values true and false stand for ({true, false})
} key_def;

#define ALL CT_TRAINER_ALL
#define SAMPLER CT_TRAINER_SAMPLER
#define NKINDS 6  // sft, dpo, grpo, distill, sampler, reward
#define SFT CT_TRAINER_SFT
#define DPO CT_TRAINER_DPO
#define GRPO CT_TRAINER_GRPO
#define DISTILL CT_TRAINER_DISTILL
#define REWARD CT_TRAINER_REWARD
#define OFF(field) offsetof(ct_config, field)
// Ranges: IN [a, b]; FROM [a, inf); ABOVE (a, inf); OPEN (a, b); CLOPEN [a, b).
#define IN(a, b) .lo = (a), .hi = (b)
#define FROM(a) .lo = (a), .hi = INFINITY, .hi_open = 1
#define ABOVE(a) .lo = (a), .lo_open = 1, .hi = INFINITY, .hi_open = 1
#define OPEN(a, b) .lo = (a), .lo_open = 1, .hi = (b), .hi_open = 1
#define CLOPEN(a, b) .lo = (a), .hi = (b), .hi_open = 1
#define ANY .lo = -INFINITY, .lo_open = 1, .hi = INFINITY, .hi_open = 1  // every finite number

const char *const ct_save_dtype_names[] = {"float32", "bfloat16", NULL};
const char *const ct_bf16_names[] = {"false", "true", "auto", NULL};
const char *const ct_model_type_names[] = {"llama", "qwen2", "qwen3", "mistral", "gemma3_text", NULL};
const char *const ct_output_names[] = {"text", "json", NULL};
const char *const ct_quantization_names[] = {"none", "int8", "bf16", NULL};
const char *const ct_truncate_names[] = {"error", "left", NULL};
const char *const ct_speculative_names[] = {"none", "mtp", NULL};
const char *const ct_loss_type_names[] = {"sigmoid", "hinge", "ipo", "robust", "sft", "simpo",
                                          "grpo", "bnpo", "dr_grpo", "dapo", NULL};
// the same names by trainer (test_dpo_loss checks them against dpo/loss.c and grpo/)
const char *const ct_dpo_loss_choices[] = {"sigmoid", "hinge", "ipo", "robust", "sft", "simpo", NULL};
const char *const ct_grpo_loss_choices[] = {"grpo", "bnpo", "dr_grpo", "dapo", NULL};
const char *const ct_scale_rewards_names[] = {"group", "batch", "none", NULL};
const char *const ct_advantage_estimator_names[] = {"group_norm", "rloo", "reinforce_baseline", NULL};
const char *const ct_reward_failure_names[] = {"error", "nan", NULL};
const char *const ct_reward_func_names[] = {"accuracy", "format", "length", "remote", NULL};
// the frozen module's storages a reward model (with its score head) can use: CT_STORE_F32, _BF16
const char *const ct_lora_module_names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                            "down_proj", "all-linear", NULL};
const char *const ct_lora_save_names[] = {"embed_tokens", "lm_head", "score", "classifier", NULL};
#define NAMES_MATCH(names, count) \
  _Static_assert(sizeof(names) / sizeof(names[0]) == (count) + 1, #names " must name every value of its enum")
NAMES_MATCH(ct_save_dtype_names, CT_DTYPE_COUNT);
NAMES_MATCH(ct_model_type_names, CT_MODEL_COUNT);
NAMES_MATCH(ct_bf16_names, CT_BF16_COUNT);
NAMES_MATCH(ct_output_names, CT_OUTPUT_COUNT);
NAMES_MATCH(ct_quantization_names, CT_QUANT_COUNT);
NAMES_MATCH(ct_truncate_names, CT_TRUNCATE_COUNT);
NAMES_MATCH(ct_speculative_names, CT_SPEC_COUNT);
NAMES_MATCH(ct_scale_rewards_names, CT_SCALE_COUNT);
NAMES_MATCH(ct_advantage_estimator_names, CT_ADV_COUNT);
NAMES_MATCH(ct_reward_failure_names, CT_REWARD_FAIL_COUNT);
NAMES_MATCH(ct_reward_func_names, CT_REWARD_COUNT);

static const key_def KEYS[] = {
    {"base_config", K_INCLUDE, ALL, 0, "", .section = "Files",
     .comment = "Another yml loaded first, its path relative to the directory of the file "
                "that names it; this file's keys override it. Chains are allowed."},
    {"model_path", K_STR, ALL | SAMPLER, OFF(model_path), "",
     .comment = "Hugging Face model directory: config.json + model.safetensors or a sharded "
                "index. Empty = build a new model from the `model:` block."},
    {"tokenizer_path", K_STR, ALL | SAMPLER, OFF(tokenizer_path), "",
     .comment = "Directory with tokenizer.json. Empty = model_path's, or the built-in byte "
                "tokenizer when training from scratch."},
    {"chat_template_path", K_STR, ALL | SAMPLER, OFF(chat_template_path), "",
     .comment = "Replaces the tokenizer's chat template (and is saved with the model): a Jinja "
                "file such as templates/qwen3_training.jinja, or a tokenizer directory."},
    {"dataset_path", K_STR, ALL, OFF(dataset_path), "", .required = ALL,
     .comment = "Training data: a JSONL file in TRL format."},
    {"eval_dataset_path", K_STR, ALL, OFF(eval_dataset_path), "",
     .comment = "Evaluation data in the same format. Empty = no evaluation."},
    {"output_dir", K_STR, ALL, OFF(output_dir), "out",
     .comment = "Where checkpoint-<step>/ directories, metrics.jsonl and the resolved "
                "config.yml are written."},
    {"run_name", K_STR, ALL, OFF(run_name), "",
     .comment = "A name for the run (TRL's run_name), recorded in output_dir/config.yml."},
    {"resume_from_checkpoint", K_STR, ALL, OFF(resume_from_checkpoint), "", .bool_as = {"latest", ""},
     .comment = "Empty = start fresh; latest = the newest checkpoint-* in output_dir; "
                "anything else = a checkpoint directory. TRL's true and false mean latest and empty."},

    {"seed", K_INT, ALL | SAMPLER, OFF(seed), "42", IN(0, 2147483647), .section = "Steps and batches",
     .comment = "Seed for initialization, shuffling and sampling."},
    {"max_steps", K_INT, ALL, OFF(max_steps), "-1", FROM(-1),
     .comment = "Optimizer steps to run. -1 = derive from num_train_epochs."},
    {"num_train_epochs", K_FLOAT, ALL, OFF(num_train_epochs), "3.0", ABOVE(0),
     .comment = "Passes over the training data (fractions allowed), used when max_steps "
                "is -1."},
    {"per_device_train_batch_size", K_INT, ALL, OFF(per_device_train_batch_size), "8",
     IN(1, 65536), .comment = "Rows per training micro-batch on each MPI rank."},
    {"per_device_eval_batch_size", K_INT, SFT | DPO | DISTILL | REWARD, OFF(per_device_eval_batch_size), "8",
     IN(1, 65536), .comment = "Rows per evaluation batch on each MPI rank."},
    {"gradient_accumulation_steps", K_INT, ALL, OFF(gradient_accumulation_steps), "1",
     IN(1, 65536),
     .comment = "Micro-batches per optimizer step. Global batch = "
                "per_device_train_batch_size x gradient_accumulation_steps x ranks."},

    {"optimizer", K_ENUM, ALL, OFF(optimizer), "adamw", .choices = ct_optimizer_names,
     .section = "Optimizer and learning-rate schedule",
     .comment = "adamw, or muon: Muon (momentum orthogonalized by 5 Newton-Schulz iterations, "
                "update scaled by 0.2 x sqrt(max(rows, cols)) as Moonlight's, so the AdamW learning "
                "rate and weight decay carry over) for the decoder layers' matrices, AdamW for "
                "embeddings, LM head, norms and biases. TRL's optim: muon is the same."},
    {"muon_momentum", K_FLOAT, ALL, OFF(muon_momentum), "0.95", CLOPEN(0, 1),
     .comment = "Muon's Nesterov momentum (the matrices' first moment)."},
    {"learning_rate", K_FLOAT, ALL, OFF(learning_rate), "5e-5", FROM(0),
     .per_trainer = {"2e-5", "1e-6", "1e-6", "2e-5", NULL, "1e-4"},
     .comment = "Peak learning rate, reached at the end of warmup."},
    {"lr_scheduler_type", K_ENUM, ALL, OFF(lr_scheduler_type), "linear",
     .choices = ct_lr_scheduler_names, .comment = "Decay after warmup."},
    {"warmup_steps", K_INT, ALL, OFF(warmup_steps), "0", FROM(0),
     .comment = "Steps of linear warmup from 0. When > 0 it overrides warmup_ratio."},
    {"warmup_ratio", K_FLOAT, ALL, OFF(warmup_ratio), "0.0", IN(0, 1),
     .comment = "Warmup as a fraction of the total steps."},
    {"weight_decay", K_FLOAT, ALL, OFF(weight_decay), "0.0", FROM(0),
     .comment = "Decoupled (AdamW) weight decay."},
    {"adam_beta1", K_FLOAT, ALL, OFF(adam_beta1), "0.9", CLOPEN(0, 1),
     .comment = "Decay of the first-moment (mean) estimate."},
    {"adam_beta2", K_FLOAT, ALL, OFF(adam_beta2), "0.999", CLOPEN(0, 1),
     .comment = "Decay of the second-moment (variance) estimate."},
    {"adam_epsilon", K_FLOAT, ALL, OFF(adam_epsilon), "1e-8", ABOVE(0),
     .comment = "Added to the root of the second moment."},
    {"max_grad_norm", K_FLOAT, ALL, OFF(max_grad_norm), "1.0", FROM(0),
     .comment = "Clip the global gradient norm to this. 0 = no clipping."},
    {"qk_clip_threshold", K_FLOAT, ALL, OFF(qk_clip_threshold), "0.0", FROM(0),
     .comment = "QK-Clip (Kimi K2) threshold tau; 0 = off. After each optimizer step, an attention head "
                "whose largest pre-softmax logit in the step's forwards exceeded tau has its query and key "
                "weights rescaled so that logit becomes tau, other heads' logits unchanged (with q/k norms, "
                "Qwen3: the layer's shared norm weights, so its whole layer scales). Metrics "
                "max_attention_logit (before clipping) and clipped_heads (summed over the logging window). "
                "Not with use_peft (the q/k weights are the frozen base)."},

    {"max_length", K_INT, SFT | DPO | DISTILL | REWARD, OFF(max_length), "1024", IN(2, 1048576), .section = "Data",
     .comment = "Longest sequence in tokens; longer rows keep their first max_length "
                "tokens (reward: pairs with a longer answer are dropped and counted, as TRL does)."},
    {"packing", K_BOOL, SFT | DISTILL, OFF(packing), "false",
     .comment = "Pack several rows into each max_length sequence; attention never crosses "
                "rows."},
    {"completion_only_loss", K_BOOL, SFT | DISTILL, OFF(completion_only_loss), "true",
     .comment = "For prompt/completion rows, train on the completion tokens only."},
    {"assistant_only_loss", K_BOOL, SFT | DISTILL, OFF(assistant_only_loss), "false",
     .comment = "For messages rows, train on the assistant turns only."},
    {"dataset_text_field", K_STR, SFT | DISTILL, OFF(dataset_text_field), "text",
     .comment = "The field that holds the text of plain-text rows."},
    {"shuffle_dataset", K_BOOL, ALL, OFF(shuffle_dataset), "true",
     .comment = "Shuffle the training rows every epoch."},
    {"skip_bad_rows", K_BOOL, SFT | DPO | GRPO | DISTILL | REWARD, OFF(skip_bad_rows), "false",
     .comment = "Skip and count malformed rows instead of stopping at the first one (GRPO: also "
                "rows without the answer_field a reward function reads)."},

    {"center_rewards_coefficient", K_FLOAT, REWARD, OFF(center_rewards_coefficient), "0.0", FROM(0),
     .section = "Reward model",
     .comment = "Adds this x mean((r_chosen + r_rejected)^2) to the pair loss, pulling rewards toward "
                "0 (0 = off; 0.01 is the paper's value)."},

    {"logging_steps", K_INT, ALL, OFF(logging_steps), "10", FROM(1),
     .section = "Logging and checkpoints",
     .comment = "Write a line to metrics.jsonl every this many steps."},
    {"logging_first_step", K_BOOL, ALL, OFF(logging_first_step), "false",
     .comment = "Also log step 1 (TRL's logging_first_step)."},
    {"log_completions", K_BOOL, GRPO | DISTILL, OFF(log_completions), "false",
     .per_trainer = {NULL, NULL, "true", "false"},
     .comment = "Append every generated completion (GRPO: with its rewards and advantage; "
                "distillation: the on-policy samples) to output_dir/completions.jsonl."},
    {"num_completions_to_print", K_INT, GRPO | DISTILL, OFF(num_completions_to_print), "0", FROM(0),
     .comment = "With log_completions: show this many completions of each logged step on stderr."},
    {"eval_steps", K_INT, ALL, OFF(eval_steps), "0", FROM(0),
     .comment = "Evaluate every this many steps. 0 = only at the end."},
    {"eval_on_start", K_BOOL, ALL, OFF(eval_on_start), "false",
     .comment = "Also evaluate before the first step (a baseline to compare with)."},
    {"save_steps", K_INT, ALL, OFF(save_steps), "500", FROM(0),
     .comment = "Save a checkpoint every this many steps. 0 = none; the final model is saved in "
                "output_dir either way."},
    {"save_total_limit", K_INT, ALL, OFF(save_total_limit), "0", FROM(0),
     .comment = "Keep at most this many checkpoints, deleting the oldest. 0 = keep all."},
    {"save_dtype", K_ENUM, ALL, OFF(save_dtype), "float32", .choices = ct_save_dtype_names,
     .comment = "Type of the saved model weights (optimizer state is always float32)."},

    {"num_vocab_tiling", K_INT, ALL, OFF(num_vocab_tiling), "1", IN(1, 4096),
     .section = "Loss and compute",
     .comment = "Compute logits and cross-entropy in this many vocabulary chunks, so that "
                "B x T x V logits never sit in memory at once; results match untiled."},
    {"z_loss_multiplier", K_FLOAT, SFT, OFF(z_loss_multiplier), "0.0", FROM(0),
     .comment = "Add this x log(Z)^2 per token to keep the softmax normalizer near 1. "
                "0 = off."},
    {"mtp_num_layers", K_INT, SFT, OFF(mtp_num_layers), "0", IN(0, 16),
     .comment = "Multi-token prediction (DeepSeek-V3, MaxText's key): this many extra depths, depth k a "
                "projection of [norm(embedding of token i+k); norm(depth k-1's hidden state)] through one "
                "extra decoder layer, predicting token i+k+1 with the shared final norm and LM head. Saved "
                "apart in mtp.safetensors (model.safetensors stays a plain Hugging Face model). Metrics "
                "mtp_loss, eval_mtp_acceptance_rate. 0 = off. sft only, not with use_peft."},
    {"mtp_loss_scaling_factor", K_FLOAT, SFT, OFF(mtp_loss_scaling_factor), "0.1", FROM(0),
     .comment = "lambda: the loss adds lambda x the mean over depths of each depth's mean cross-entropy "
                "(MaxText's default 0.1)."},
    {"num_threads", K_INT, ALL | SAMPLER, OFF(num_threads), "0", IN(0, 4096),
     .comment = "Compute threads per process. 0 = all cores, divided among the MPI ranks "
                "on each machine."},
    {"gradient_checkpointing", K_BOOL, ALL, OFF(gradient_checkpointing), "false",
     .comment = "Keep only each layer's input and recompute the layer in backward: activation "
                "memory of one layer instead of all, for about a third more compute. Same "
                "gradients bit for bit."},
    {"bf16", K_ENUM, ALL, OFF(bf16), "false", .choices = ct_bf16_names, .bool_as = {"true", "false"},
     .comment = "Matrix products of the trained model in bfloat16 (oneDNN, fp32 sums and outputs; "
                "about twice fp32's speed on CPUs with AVX512_BF16 or AMX); weights, gradients, "
                "optimizer state, norms, softmax and the loss stay float32. true is an error on "
                "a CPU without bf16 hardware; auto falls back to float32 there and says so."},
    {"dry_run", K_BOOL, ALL, OFF(dry_run), "false",
     .comment = "Print the memory plan (every big buffer, the total, what the machine has) "
                "and stop before allocating."},

    {"optimizer_sharding", K_BOOL, ALL, OFF(optimizer_sharding), "false", .section = "Across ranks (MPI)",
     .comment = "ZeRO-1: each of the N ranks keeps 1/N of the AdamW moments and updates only its "
                "part of the weights; gradients reduce-scatter, weights all-gather. Same steps as "
                "without, to float rounding; checkpoints resume at any number of ranks."},
    {"diloco_inner_steps", K_INT, ALL, OFF(diloco_inner_steps), "0", IN(0, 1000000),
     .comment = "DiLoCo: each rank takes this many AdamW steps on its own data, then the ranks "
                "average their change (the pseudo-gradient) and take one outer Nesterov step: "
                "communication falls by this factor. 0 = off (gradients summed every step)."},
    {"diloco_outer_lr", K_FLOAT, ALL, OFF(diloco_outer_lr), "0.7", ABOVE(0),
     .comment = "DiLoCo's outer learning rate (the paper's 0.7)."},
    {"diloco_outer_momentum", K_FLOAT, ALL, OFF(diloco_outer_momentum), "0.9", CLOPEN(0, 1),
     .comment = "DiLoCo's outer Nesterov momentum (the paper's 0.9)."},
    {"ddp_bucket_cap_mb", K_FLOAT, ALL, OFF(ddp_bucket_cap_mb), "0", IN(0, 65536),
     .comment = "Overlap: the gradient sum across ranks goes in buckets of this many MB, each "
                "handed to MPI (MPI_Iallreduce, one in flight at a time) as soon as backward has "
                "finished its layers, while it goes on with the layers below (sft; the other "
                "trainers hand them over after backward). The same sums: bit for bit at 2 ranks, "
                "to float rounding at more. 0 = one blocking sum after backward (the default: "
                "on one machine the overlap measured no faster; try HF's 25 across machines). "
                "Plain data parallel only (not optimizer_sharding or DiLoCo)."},

    {"use_peft", K_BOOL, ALL, OFF(use_peft), "false", .section = "LoRA (PEFT)",
     .comment = "Train LoRA adapters on a frozen base instead of every weight. The output is a "
                "PEFT adapter directory; with DPO and GRPO the reference is the base (adapters off)."},
    {"lora_r", K_INT, ALL, OFF(lora_r), "16", IN(1, 65536), .comment = "The adapters' rank."},
    {"lora_alpha", K_FLOAT, ALL, OFF(lora_alpha), "32", ABOVE(0),
     .comment = "The adapters' scale is lora_alpha / lora_r (lora_alpha / sqrt(lora_r) with use_rslora)."},
    {"lora_dropout", K_FLOAT, ALL, OFF(lora_dropout), "0.05", CLOPEN(0, 1),
     .comment = "Dropout on the adapters' input during training forwards."},
    {"lora_target_modules", K_STR_LIST, ALL, OFF(lora_target_modules), "all-linear",
     .choices = ct_lora_module_names,
     .comment = "Projections that get adapters: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                "down_proj, or all-linear (all seven)."},
    {"use_rslora", K_BOOL, ALL, OFF(use_rslora), "false", .comment = "Rank-stabilized scale alpha / sqrt(r)."},
    {"lora_modules_to_save", K_STR_LIST, ALL, OFF(lora_modules_to_save), "", .choices = ct_lora_save_names,
     .comment = "Modules trained in full and saved with the adapter: embed_tokens, lm_head (models "
                "with untied embeddings); score or classifier (PEFT's SEQ_CLS names: bin/reward's head, "
                "which it saves so anyway)."},
    {"adapter_path", K_STR, ALL | SAMPLER, OFF(adapter_path), "",
     .comment = "A PEFT LoRA adapter directory: training continues it (its adapter_config.json "
                "decides r, alpha and targets); bin/sampler serves base + adapter."},
    {"base_dtype", K_ENUM, ALL, OFF(base_dtype), "float32", .choices = ct_store_names,
     .comment = "With use_peft: how the frozen base is held. bfloat16 halves its layers, int8 "
                "quarters them (one scale per row; widened one layer at a time); the embeddings "
                "stay float32."},

    {"beta", K_FLOAT, DPO | GRPO | DISTILL, OFF(beta), "0.1", FROM(0), .section = "Preference and RL",
     .per_trainer = {NULL, "0.1", "0.0", "0.5"},
     .comment = "DPO: the inverse temperature of the implicit reward (with loss_type simpo "
                "the default is 2.0). GRPO: the weight of the KL term; 0 loads no reference. "
                "Distillation: the generalized JSD's interpolation, 0 = forward KL(teacher || "
                "student), 1 = reverse KL."},
    {"max_prompt_length", K_INT, DPO | GRPO, OFF(max_prompt_length), "512", FROM(0),
     .comment = "Prompts keep their last this-many tokens; 0 = no limit."},
    {"max_completion_length", K_INT, DPO | GRPO, OFF(max_completion_length), "0", FROM(0),
     .per_trainer = {NULL, "0", "256"},
     .comment = "DPO: completions keep their first this-many tokens (0 = no limit). GRPO: the "
                "longest completion generated."},
    {"ref_model_path", K_STR, DPO | GRPO, OFF(ref_model_path), "",
     .comment = "The frozen reference model's directory; empty = a copy of the starting "
                "policy."},
    {"ref_dtype", K_ENUM, DPO | GRPO, OFF(ref_dtype), "float32", .choices = ct_store_names,
     .comment = "How the reference's weights are held: float32; bfloat16 (half the memory, "
                "widened one layer at a time); int8 (a quarter, through the sampler's engine)."},
    {"loss_type", K_STR_LIST, DPO | GRPO, OFF(loss_type), "sigmoid", .section = "DPO",
     .per_trainer = {NULL, "sigmoid", "dapo"}, .choices = ct_loss_type_names,
     .per_trainer_choices = {NULL, ct_dpo_loss_choices, ct_grpo_loss_choices},
     .comment = "DPO: preference losses (sigmoid, hinge, ipo, robust, sft, simpo), summed with "
                "loss_weights ([sigmoid, sft] is RPO). GRPO: one of grpo, bnpo, dr_grpo, dapo "
                "(how token losses are averaged)."},
    {"loss_weights", K_FLOAT_LIST, DPO, OFF(loss_weights), "[]", FROM(0),
     .comment = "Weight of each loss_type entry. Empty = 1 each."},
    {"label_smoothing", K_FLOAT, DPO, OFF(label_smoothing), "0.0", CLOPEN(0, 0.5),
     .comment = "Probability that a preference label is flipped (cDPO, robust, simpo)."},
    {"simpo_gamma", K_FLOAT, DPO, OFF(simpo_gamma), "0.5", FROM(0),
     .comment = "SimPO's target reward margin."},
    {"precompute_ref_log_probs", K_BOOL, DPO, OFF(precompute_ref_log_probs), "false",
     .comment = "Compute the reference's log-probs in one pass before training (cached in "
                "output_dir, reused while reference, ref_dtype, compute and data match), then free "
                "the reference."},
    {"sync_ref_model", K_BOOL, DPO | GRPO, OFF(sync_ref_model), "false",
     .comment = "TR-DPO: every ref_model_sync_steps, ref <- (1 - alpha) ref + alpha policy."},
    {"ref_model_mixup_alpha", K_FLOAT, DPO | GRPO, OFF(ref_model_mixup_alpha), "0.6", IN(0, 1),
     .comment = "alpha of the reference sync."},
    {"ref_model_sync_steps", K_INT, DPO | GRPO, OFF(ref_model_sync_steps), "512", FROM(1),
     .comment = "Optimizer steps between reference syncs."},

    {"teacher_path", K_STR, DISTILL, OFF(teacher_path), "", .section = "Distillation",
     .comment = "The teacher's Hugging Face directory (same tokenizer as the student). Not "
                "needed when teacher_logits_path holds precomputed logits."},
    {"teacher_dtype", K_ENUM, DISTILL, OFF(teacher_dtype), "float32", .choices = ct_store_names,
     .comment = "How the teacher's weights are held: float32, bfloat16 or int8 (as ref_dtype)."},
    {"teacher_logits_path", K_STR, DISTILL, OFF(teacher_logits_path), "",
     .comment = "Offline mode: the teacher's top-k logits per token, written by `bin/distill "
                "precompute` and read by training, which then loads no teacher."},
    {"distill_top_k", K_INT, DISTILL, OFF(distill_top_k), "128", IN(1, 1 << 24),
     .comment = "Logits per token that `bin/distill precompute` stores."},
    {"distill_alpha", K_FLOAT, DISTILL, OFF(distill_alpha), "0.5", IN(0, 1),
     .comment = "Weight of the soft (teacher) loss; 1 - alpha weighs the hard cross-entropy."},
    {"lmbda", K_FLOAT, DISTILL, OFF(lmbda), "0.0", IN(0, 1),
     .comment = "On-policy fraction (GKD): the probability that a step's completions are "
                "generated by the student (or the teacher with seq_kd) instead of read."},
    {"seq_kd", K_BOOL, DISTILL, OFF(seq_kd), "false",
     .comment = "Generated completions come from the teacher (sequence-level KD)."},
    {"num_generations", K_INT, GRPO, OFF(num_generations), "8", IN(2, 4096), .section = "GRPO",
     .comment = "Completions sampled per prompt; a prompt's completions form one group. The "
                "completions of a step (per_device_train_batch_size x accumulation x ranks) "
                "must be a multiple of it."},
    {"num_iterations", K_INT, GRPO, OFF(num_iterations), "1", IN(1, 1024),
     .comment = "Optimizer steps taken on each batch of rollouts (TRL's mu)."},
    {"epsilon", K_FLOAT, GRPO, OFF(epsilon), "0.2", OPEN(0, 1),
     .comment = "Lower clipping range of the probability ratio."},
    {"epsilon_high", K_FLOAT, GRPO, OFF(epsilon_high), "0.0", CLOPEN(0, 10),
     .comment = "Upper clipping range; 0 = epsilon (DAPO uses a larger one)."},
    {"scale_rewards", K_ENUM, GRPO, OFF(scale_rewards), "group", .choices = ct_scale_rewards_names,
     .bool_as = {"group", "none"},
     .comment = "Advantages divided by the group's reward std (group), the batch's (batch), "
                "or not at all (none); TRL's true and false mean group and none. "
                "advantage_estimator group_norm only."},
    {"advantage_estimator", K_ENUM, GRPO, OFF(advantage_estimator), "group_norm",
     .choices = ct_advantage_estimator_names,
     .comment = "group_norm: (r - group mean) / scale_rewards' std (GRPO); rloo: r minus the "
                "mean of the group's other rewards (RLOO); reinforce_baseline: r - group mean, "
                "then whitened over all completion tokens of the step (REINFORCE++-baseline)."},
    {"normalize_advantages", K_BOOL, GRPO, OFF(normalize_advantages), "false",
     .comment = "rloo: whiten the step's advantages, (A - mean) / (std + 1e-4) over all "
                "completions (TRL's RLOO option)."},
    {"mask_truncated_completions", K_BOOL, GRPO, OFF(mask_truncated_completions), "false",
     .comment = "Completions that never reached an end-of-turn token get no loss."},
    {"reward_funcs", K_STR_LIST, GRPO, OFF(reward_funcs), "accuracy",
     .comment = "Reward functions, summed with reward_weights: accuracy, format, length, remote, or "
                "the directory of a sequence-classification reward model (e.g. one bin/reward "
                "trained), run in-process; its metrics are named after the directory's last part."},
    {"reward_model_dtype", K_ENUM, GRPO, OFF(reward_model_dtype), "float32", .choices = ct_store_names,
     .comment = "How reward models in reward_funcs store their weights: float32, bfloat16 (half the "
                "memory, widened a layer at a time) or int8 (a quarter: the sampler's engine, as ref_dtype)."},
    {"reward_weights", K_FLOAT_LIST, GRPO, OFF(reward_weights), "[]", ANY,
     .comment = "Weight of each reward function (negative: a penalty). Empty = 1 each."},
    {"answer_field", K_STR, GRPO, OFF(answer_field), "answer",
     .comment = "accuracy and remote: the dataset field with the reference answer; every row must have "
                "it (remote: once the key is set; unset, a row without it sends a null label)."},
    {"answer_regex", K_STR, GRPO, OFF(answer_regex), "",
     .comment = "accuracy: a Python re pattern (PCRE2) whose last match in the completion gives its "
                "answer: the group named answer, else the first group, else the whole match; "
                "empty = the whole completion."},
    {"answer_numeric", K_BOOL, GRPO, OFF(answer_numeric), "false",
     .comment = "accuracy: compare answers as numbers."},
    {"format_regex", K_STR, GRPO, OFF(format_regex), "",
     .comment = "format: reward 1 when this Python re pattern (PCRE2) matches somewhere in the "
                "completion (re.search; (?s) lets . match a newline)."},
    {"length_target", K_INT, GRPO, OFF(length_target), "0", FROM(0),
     .comment = "length: reward -|characters - target| / target."},
    {"reward_url", K_STR, GRPO, OFF(reward_url), "",
     .comment = "remote: the reward server (POST {query, prompts, labels} -> {rewards})."},
    {"reward_api_key_env", K_STR, GRPO, OFF(reward_api_key_env), "",
     .comment = "remote: the environment variable holding an API key, sent as "
                "\"Authorization: Bearer KEY\" (the key itself never goes in a config or log)."},
    {"reward_timeout", K_FLOAT, GRPO, OFF(reward_timeout), "30.0", ABOVE(0),
     .comment = "remote: seconds a request may take."},
    {"reward_connect_timeout", K_FLOAT, GRPO, OFF(reward_connect_timeout), "5.0", ABOVE(0),
     .comment = "remote: seconds to connect."},
    {"reward_retries", K_INT, GRPO, OFF(reward_retries), "3", IN(0, 100),
     .comment = "remote: attempts after the first, waiting reward_backoff seconds, doubling."},
    {"reward_backoff", K_FLOAT, GRPO, OFF(reward_backoff), "0.5", FROM(0),
     .comment = "remote: first wait between attempts."},
    {"reward_failure", K_ENUM, GRPO, OFF(reward_failure), "error", .choices = ct_reward_failure_names,
     .comment = "remote: after the last retry, or on a non-finite reward (NaN, Infinity), stop the run "
                "(error) or give those completions NaN rewards (nan; they are left out). A null reward "
                "is NaN either way (TRL's None)."},
    {"reward_batch", K_INT, GRPO, OFF(reward_batch), "0", FROM(0),
     .comment = "remote: completions per request; 0 = all of a step's."},
    {"prompt", K_STR, SAMPLER, OFF(prompt), "", .section = "Sampler (bin/sampler)",
     .comment = "generate: one text prompt (streamed to stdout)."},
    {"prompts_path", K_STR, SAMPLER, OFF(prompts_path), "",
     .comment = "generate: JSONL rows with prompt (text), messages (chat template) or "
                "prompt_input_ids."},
    {"data", K_STR, SAMPLER | REWARD, OFF(data), "",
     .comment = "score: JSONL rows with prompt and completion (or prompt_input_ids and "
                "completion_input_ids; bin/reward score: or messages)."},
    {"n", K_INT, SAMPLER, OFF(n), "1", IN(1, 65536),
     .comment = "Completions per prompt; they share one prefill."},
    {"max_new_tokens", K_INT, DISTILL | SAMPLER, OFF(max_new_tokens), "256", IN(1, 1048576),
     .per_trainer = {NULL, NULL, NULL, "128", "256"},
     .comment = "Most tokens generated per completion. Distillation (GKDConfig's name): the "
                "cap of an on-policy (lmbda) completion, within max_length."},
    {"temperature", K_FLOAT, GRPO | DISTILL | SAMPLER, OFF(temperature), "1.0", FROM(0),
     .comment = "Sampling temperature; 0 = greedy. Log-probs are reported (and `sampler score` "
                "scores) at this temperature, at 1 when it is 0. Distillation: both models' "
                "logits are divided by it (tau; above 0)."},
    {"top_k", K_INT, GRPO | SAMPLER, OFF(top_k), "0", FROM(0),
     .comment = "Sample among the k most likely tokens; 0 = off."},
    {"top_p", K_FLOAT, GRPO | SAMPLER, OFF(top_p), "1.0", IN(0, 1), .lo_open = 1,
     .comment = "Nucleus sampling: the smallest set with this much probability; 1 = off."},
    {"min_p", K_FLOAT, GRPO | SAMPLER, OFF(min_p), "0.0", CLOPEN(0, 1),
     .comment = "Drop tokens less likely than min_p x the most likely one; 0 = off."},
    {"repetition_penalty", K_FLOAT, GRPO | SAMPLER, OFF(repetition_penalty), "1.0", ABOVE(0),
     .comment = "Penalty on tokens already in the prompt or completion (Hugging Face's); "
                "1 = off."},
    {"stop", K_STR_LIST, SAMPLER, OFF(stop), "",
     .comment = "Stop strings: a completion ends where one appears (not included). The "
                "tokenizer's end-of-turn tokens always stop."},
    {"output", K_ENUM, SAMPLER, OFF(output), "text", .choices = ct_output_names,
     .comment = "generate: text streams completions; json writes one line per completion "
                "(row, sample, completion, completion_ids, logprobs, finish_reason)."},
    {"add_generation_prompt", K_BOOL, SAMPLER, OFF(add_generation_prompt), "true",
     .comment = "messages rows: end the chat template with the assistant's turn opening."},
    {"quantization", K_ENUM, SAMPLER, OFF(quantization), "none", .choices = ct_quantization_names,
     .comment = "none: float32 weights. bf16: matrices rounded to bfloat16 (half the bytes "
                "per decoded token; needs AVX512_BF16), products summed in float32. int8: "
                "matrices in int8 with one scale per output row (a model saved that way "
                "loads as int8 directly)."},
    {"save_quantized", K_STR, SAMPLER, OFF(save_quantized), "",
     .comment = "With quantization=int8: also write the int8 model to this directory."},
    {"decode_slots", K_INT, GRPO | SAMPLER, OFF(decode_slots), "16", IN(1, 4096),
     .comment = "Sequences decoded together (continuous batching)."},
    {"max_prefill_length", K_INT, SAMPLER, OFF(max_prefill_length), "1024", IN(1, 1048576),
     .comment = "Longest prompt, in tokens; also the tokens one packed prefill pass holds."},
    {"max_target_length", K_INT, SAMPLER, OFF(max_target_length), "2048", IN(2, 1048576),
     .comment = "KV-cache positions per slot: prompt + completion."},
    {"speculative", K_ENUM, SAMPLER, OFF(speculative), "none", .choices = ct_speculative_names,
     .comment = "generate: mtp drafts with the model's multi-token prediction depths (mtp.safetensors, "
                "trained with mtp_num_layers) and verifies each round's guesses in one pass: the same "
                "greedy output in fewer passes. Needs temperature 0 and n 1; requests run one at a time."},
    {"truncate_prompt", K_ENUM, GRPO | SAMPLER, OFF(truncate_prompt), "error",
     .choices = ct_truncate_names,
     .comment = "A prompt longer than max_prefill_length (GRPO: max_prompt_length): error, or "
                "keep its last tokens (left)."},
    {"model.model_type", K_ENUM, ALL, OFF(model.model_type), "llama",
     .choices = ct_model_type_names,
     .section = "Model (used when model_path is empty; Hugging Face config.json names)",
     .comment = "Architecture family (llama covers Llama 2/3 and SmolLM)."},
    {"model.vocab_size", K_INT, ALL, OFF(model.vocab_size), "0", IN(0, CT_MAX_VOCAB),
     .comment = "Vocabulary size. 0 = the tokenizer's size."},
    {"model.hidden_size", K_INT, ALL, OFF(model.hidden_size), "256", IN(1, CT_MAX_HIDDEN),
     .comment = "Width of the residual stream."},
    {"model.intermediate_size", K_INT, ALL, OFF(model.intermediate_size), "768", IN(1, CT_MAX_INTERMEDIATE),
     .comment = "Width of the SwiGLU MLP."},
    {"model.num_hidden_layers", K_INT, ALL, OFF(model.num_hidden_layers), "4", IN(1, CT_MAX_LAYERS),
     .comment = "Transformer blocks."},
    {"model.num_attention_heads", K_INT, ALL, OFF(model.num_attention_heads), "4", IN(1, CT_MAX_HEADS),
     .comment = "Query heads."},
    {"model.num_key_value_heads", K_INT, ALL, OFF(model.num_key_value_heads), "0", IN(0, CT_MAX_HEADS),
     .comment = "Key/value heads (grouped-query attention). 0 = num_attention_heads."},
    {"model.head_dim", K_INT, ALL, OFF(model.head_dim), "0", IN(0, CT_MAX_HEAD_DIM),
     .comment = "Width of each head. 0 = hidden_size / num_attention_heads."},
    {"model.rope_theta", K_FLOAT, ALL, OFF(model.rope_theta), "10000.0", ABOVE(0),
     .comment = "RoPE base frequency."},
    {"model.rms_norm_eps", K_FLOAT, ALL, OFF(model.rms_norm_eps), "1e-6", OPEN(0, 1),
     .comment = "Epsilon inside every RMSNorm."},
    {"model.tie_word_embeddings", K_BOOL, ALL, OFF(model.tie_word_embeddings), "true",
     .comment = "The LM head reuses the token-embedding matrix."},
    {"model.attention_bias", K_BOOL, ALL, OFF(model.attention_bias), "false",
     .comment = "Biases on the q/k/v projections, as in Qwen2."},
    {"model.use_qk_norm", K_BOOL, ALL, OFF(model.use_qk_norm), "false",
     .comment = "Per-head RMSNorm on q and k, as in Qwen3."},
    {"model.max_position_embeddings", K_INT, ALL, OFF(model.max_position_embeddings), "2048",
     IN(1, CT_MAX_POSITIONS), .comment = "Longest position the model is built for."},
    {"model.initializer_range", K_FLOAT, ALL, OFF(model.initializer_range), "0.02", ABOVE(0),
     .comment = "Standard deviation of the normal initialization of new weights."},
    {"model.sliding_window", K_INT, ALL, OFF(model.sliding_window), "0", IN(0, CT_MAX_POSITIONS),
     .comment = "gemma3_text: keys a sliding-window layer's query sees (itself included). 0 = every layer full."},
    {"model.sliding_window_pattern", K_INT, ALL, OFF(model.sliding_window_pattern), "6", FROM(1),
     .comment = "gemma3_text: layer l is a full-attention layer when (l + 1) % pattern == 0, else sliding."},
};
#define NKEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

#define MODEL_PREFIX "model."
#define MAX_INCLUDE_DEPTH 16

static const char *const TRAINER_NAMES[NKINDS] = {"sft", "dpo", "grpo", "distill", "sampler", "reward"};

// ---------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------

const char *ct_trainer_name(ct_trainer_kind t) {
  for (int i = 0; i < NKINDS; i++)
    if ((unsigned)t == 1u << i) return TRAINER_NAMES[i];
  return NULL;
}

int ct_trainer_from_name(const char *name, ct_trainer_kind *out) {
  for (int i = 0; i < NKINDS; i++)
    if (!strcmp(name, TRAINER_NAMES[i])) {
      *out = (ct_trainer_kind)(1u << i);
      return 0;
    }
  return ct_set_error(CT_EINVAL, "unknown trainer '%s' (expected sft, dpo, grpo, distill, sampler or reward)",
                      name);
}

static int trainer_index(ct_trainer_kind t) {
  for (int i = 0; i < NKINDS; i++)
    if ((unsigned)t == 1u << i) return i;
  return -1;
}

// "sft, distill"
static void trainer_list(unsigned mask, char *buf, size_t n) {
  buf[0] = 0;
  for (int i = 0; i < NKINDS; i++)
    if (mask & (1u << i))
      snprintf(buf + strlen(buf), n - strlen(buf), "%s%s", buf[0] ? ", " : "",
               TRAINER_NAMES[i]);
}

static int is_model_key(const key_def *k) {
  return !strncmp(k->name, MODEL_PREFIX, strlen(MODEL_PREFIX));
}

static uint64_t model_bit(const key_def *k) {
  return UINT64_C(1) << ((k->offset - offsetof(ct_config, model)) / 4);
}

static void *field_of(ct_config *c, const key_def *k) { return (char *)c + k->offset; }
static const void *cfield_of(const ct_config *c, const key_def *k) {
  return (const char *)c + k->offset;
}

static int key_index(const char *name) {
  for (int i = 0; i < NKEYS; i++)  // the first byte before strcmp: most keys differ there
    if (KEYS[i].name[0] == name[0] && !strcmp(KEYS[i].name, name)) return i;
  return -1;
}

// A value quoted for a one-line message: at most 60 bytes, control characters as '?'.
static const char *show(const char *s, char *buf, size_t n) {
  size_t len = strlen(s), max = n - 4 < 60 ? n - 4 : 60, i;
  for (i = 0; i < len && i < max; i++)
    buf[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
  if (i < len) buf[i++] = '.', buf[i++] = '.', buf[i++] = '.';
  buf[i] = 0;
  return buf;
}

// YAML 1.1 null: ~, null, Null, NULL, or nothing at all.
static int is_null_word(const char *s) {
  return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
         !strcmp(s, "NULL");
}

// Copy of s without leading and trailing blanks (NULL when out of memory).
static char *trimmed(const char *s, size_t len) {
  while (len && (*s == ' ' || *s == '\t')) s++, len--;
  while (len && (s[len - 1] == ' ' || s[len - 1] == '\t')) len--;
  char *r = malloc(len + 1);
  if (r) memcpy(r, s, len), r[len] = 0;
  return r;
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *r = malloc(n);
  if (r) memcpy(r, s, n);
  return r;
}

// Shortest text that strtod reads back as exactly v, always recognisable as a float:
// "3.0", "10000.0", "0.999", "5e-5", ".inf".
static void fmt_double(double v, char *buf, size_t n) {
  if (isnan(v)) {
    snprintf(buf, n, ".nan");
    return;
  }
  if (isinf(v)) {
    snprintf(buf, n, v > 0 ? ".inf" : "-.inf");
    return;
  }
  if (v == floor(v) && fabs(v) < 1e15) {
    snprintf(buf, n, "%.1f", v);
    return;
  }
  for (int p = 1; p <= 17; p++) {
    snprintf(buf, n, "%.*g", p, v);
    if (strtod(buf, NULL) == v) break;
  }
  // "5e-05" -> "5e-5", "1.5e+20" -> "1.5e20"
  char *e = strchr(buf, 'e');
  if (e) {
    char *d = e + 1, *s = d;
    if (*s == '+') s++;
    else if (*s == '-') d++, s++;
    while (*s == '0' && s[1]) s++;
    memmove(d, s, strlen(s) + 1);
  }
  if (!strpbrk(buf, ".e")) snprintf(buf + strlen(buf), n - strlen(buf), ".0");
}

// Range bounds print without a trailing ".0": "[0, inf)", "[1, 65536]".
static void fmt_bound(double v, char *buf, size_t n) {
  if (isinf(v)) {
    snprintf(buf, n, v > 0 ? "inf" : "-inf");
    return;
  }
  fmt_double(v, buf, n);
  size_t len = strlen(buf);
  if (len > 2 && !strcmp(buf + len - 2, ".0")) buf[len - 2] = 0;
}

static void fmt_range(const key_def *k, char *buf, size_t n) {
  char lo[40], hi[40];
  fmt_bound(k->lo, lo, sizeof lo);
  fmt_bound(k->hi, hi, sizeof hi);
  snprintf(buf, n, "%s%s, %s%s", k->lo_open ? "(" : "[", lo, hi, k->hi_open ? ")" : "]");
}

static int in_range(const key_def *k, double v) {
  if (isnan(v)) return 1;  // allowed only where nonfinite is set; checked there
  if (k->lo_open ? !(v > k->lo) : !(v >= k->lo)) return isinf(v) && isinf(k->lo) && v < 0;
  if (k->hi_open ? !(v < k->hi) : !(v <= k->hi)) return isinf(v) && isinf(k->hi) && v > 0;
  return 1;
}

// Edit distance (insert, delete, substitute) between short strings, exact up to `limit`:
// any distance above it comes back as limit + 1 (the distance is at least the length
// difference and at least the smallest entry of each row, so those end the work early).
static int edit_distance(const char *a, const char *b, int limit) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 63 || lb > 63 || (la > lb ? la - lb : lb - la) > (size_t)limit) return limit + 1;
  int row[64];
  for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    int diag = row[0], low = (int)i;
    row[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int up = row[j];
      int best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
      if (best < low) low = best;
    }
    if (low > limit) return limit + 1;
  }
  return row[lb] <= limit ? row[lb] : limit + 1;
}

// The known key closest to a misspelt one, preferring keys this trainer accepts:
// small edit distance to the full name or to the name inside the model block, else a
// known key that contains it ("batch_size" -> per_device_train_batch_size).
static const char *suggest_key(const char *name, ct_trainer_kind t) {
  for (int pass = 0; pass < 2; pass++) {
    const char *best = NULL;
    int best_score = 1000;
    size_t len = strlen(name);
    int limit = len < 6 ? 1 : len < 12 ? 2 : 3;
    for (int i = 0; i < NKEYS; i++) {
      const key_def *k = &KEYS[i];
      if (pass == 0 && !(k->trainers & (unsigned)t)) continue;
      int d = edit_distance(name, k->name, limit);
      if (is_model_key(k)) {
        int d2 = edit_distance(name, k->name + strlen(MODEL_PREFIX), limit);
        if (d2 < d) d = d2;
      }
      int score = d <= limit ? d : len >= 4 && strstr(k->name, name) ? limit + 1 : 1000;
      if (score < best_score) best_score = score, best = k->name;
    }
    if (best) return best;
  }
  return NULL;
}

// ---------------------------------------------------------------------------------
// Parsing and storing one value
// ---------------------------------------------------------------------------------

static int parse_bool(const char *s, int *out) {
  static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
  for (int i = 0; i < 3; i++) {
    if (!strcasecmp(s, yes[i])) return *out = 1, 0;
    if (!strcasecmp(s, no[i])) return *out = 0, 0;
  }
  return -1;
}

// 0 ok, -1 not an integer, -2 too large for int64_t.
static int parse_int(const char *s, int64_t *out) {
  const char *p = s;
  if (*p == '+' || *p == '-') p++;
  if (!*p) return -1;
  for (; *p; p++)
    if (*p < '0' || *p > '9') return -1;
  errno = 0;
  long long v = strtoll(s, NULL, 10);
  if (errno == ERANGE) return -2;
  *out = v;
  return 0;
}

// 0 ok, -1 not a number, -2 too large for a double. inf/nan words give inf/nan.
static int parse_float(const char *s, double *out) {
  const char *p = s + (*s == '+' || *s == '-');
  double sign = *s == '-' ? -1.0 : 1.0;
  if (!strcasecmp(p, ".inf") || !strcasecmp(p, "inf") || !strcasecmp(p, "infinity"))
    return *out = sign * INFINITY, 0;
  if (p == s && (!strcasecmp(p, ".nan") || !strcasecmp(p, "nan"))) return *out = NAN, 0;
  // strtod would also take hex, "nan(...)" and "infinity" spelt other ways: decimal only.
  if (!*p) return -1;
  for (const char *q = p; *q; q++)
    if (!strchr("0123456789.eE+-", *q)) return -1;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end) return -1;
  if (errno == ERANGE && isinf(v)) return -2;
  *out = v;
  return 0;
}

// Records where key k's value came from (where == NULL: the default).
static int set_origin(ct_config *c, int k, const char *where) {
  char *o = NULL;
  if (where && !(o = dup_str(where))) return ct_set_error(CT_ENOMEM, "out of memory");
  free(c->origin_[k]);
  c->origin_[k] = o;
  if (is_model_key(&KEYS[k])) {
    if (where) c->model.set_mask |= model_bit(&KEYS[k]);
    else c->model.set_mask &= ~model_bit(&KEYS[k]);
  }
  return 0;
}

#define WHERE(w) ((w) ? (w) : "default")

// One number, checked against the key's range; `text` has no surrounding blanks.
static int parse_number(const key_def *k, const char *text, const char *where, int64_t *iv,
                        double *dv) {
  char b[64];
  const char *what = k->type == K_INT ? "an integer" : "a number";
  double v;
  int rc;
  if (k->type == K_INT) {
    rc = parse_int(text, iv);
    v = (double)*iv;
  } else {
    rc = parse_float(text, dv);
    v = *dv;
  }
  if (rc == -1)
    return ct_set_error(CT_ECONFIG, "%s: key '%s': expected %s, got '%s'", WHERE(where),
                        k->name, what, show(text, b, sizeof b));
  if (rc == -2 || !in_range(k, v)) {
    char range[96];
    fmt_range(k, range, sizeof range);
    return ct_set_error(CT_ECONFIG, "%s: key '%s': %s is out of range %s", WHERE(where),
                        k->name, show(text, b, sizeof b), range);
  }
  if (k->type != K_INT && !isfinite(v) && !k->nonfinite)
    return ct_set_error(CT_ECONFIG, "%s: key '%s': expected a finite number, got '%s'",
                        WHERE(where), k->name, show(text, b, sizeof b));
  return 0;
}

static int trainer_index(ct_trainer_kind t);

// The values key k takes from `trainer` (a CT_TRAINER_* bit; 0: any trainer's).
static const char *const *choices_of(const key_def *k, unsigned trainer) {
  int ti = trainer_index((ct_trainer_kind)trainer);
  return ti >= 0 && k->per_trainer_choices[ti] ? k->per_trainer_choices[ti] : k->choices;
}

static int check_choice(const key_def *k, unsigned trainer, const char *text, const char *where, int *index) {
  const char *const *ch = choices_of(k, trainer);
  for (int i = 0; ch[i]; i++)
    if (!strcmp(text, ch[i])) return *index = i, 0;
  char b[64], list[256] = "";
  for (int i = 0; ch[i]; i++)
    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", ch[i]);
  return ct_set_error(CT_ECONFIG, "%s: key '%s': '%s' is not one of %s", WHERE(where),
                      k->name, show(text, b, sizeof b), list);
}

static void free_list(const key_def *k, void *f) {
  if (k->type == K_STR_LIST) {
    ct_str_list *l = f;
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
  } else {
    free(((ct_float_list *)f)->v);
  }
}

// A list key from its items (already split and trimmed).
static int set_list(ct_config *c, int ki, char **items, int n, const char *where) {
  const key_def *k = &KEYS[ki];
  for (int i = 0; i < n; i++)
    if (!items[i][0])
      return ct_set_error(CT_ECONFIG, "%s: key '%s': item %d of the list is empty",
                          WHERE(where), k->name, i + 1);
  if (k->type == K_STR_LIST) {
    int dummy;
    for (int i = 0; i < n; i++)
      if (k->choices && check_choice(k, c->trainer, items[i], where, &dummy)) return CT_ECONFIG;
    ct_str_list l = {calloc((size_t)n + 1, sizeof(char *)), n};
    if (!l.v) return ct_set_error(CT_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++)
      if (!(l.v[i] = dup_str(items[i]))) {
        free_list(k, &l);
        return ct_set_error(CT_ENOMEM, "out of memory");
      }
    free_list(k, field_of(c, k));
    *(ct_str_list *)field_of(c, k) = l;
  } else {
    ct_float_list l = {malloc(((size_t)n + 1) * sizeof(double)), n};
    if (!l.v) return ct_set_error(CT_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
      int64_t unused;
      if (parse_number(k, items[i], where, &unused, &l.v[i])) {
        free(l.v);
        return CT_ECONFIG;
      }
    }
    free_list(k, field_of(c, k));
    *(ct_float_list *)field_of(c, k) = l;
  }
  return set_origin(c, ki, where);
}

// Splits "a, b,c" or "[a, b, c]" at commas into trimmed items, then set_list.
static int set_list_text(ct_config *c, int ki, const char *text, const char *where) {
  size_t len = strlen(text);
  char *s = trimmed(text, len);
  if (!s) return ct_set_error(CT_ENOMEM, "out of memory");
  len = strlen(s);
  char *body = s;
  if (len >= 2 && s[0] == '[' && s[len - 1] == ']') body[len - 1] = 0, body++;
  int n = 0, rc;
  char **items = NULL;
  char *t = trimmed(body, strlen(body));
  if (!t) {
    free(s);
    return ct_set_error(CT_ENOMEM, "out of memory");
  }
  if (*t && !is_null_word(t)) {
    n = 1;
    for (char *p = t; *p; p++) n += *p == ',';
    items = calloc((size_t)n, sizeof *items);
    if (!items) {
      free(s), free(t);
      return ct_set_error(CT_ENOMEM, "out of memory");
    }
    char *p = t;
    for (int i = 0; i < n; i++) {
      char *comma = strchr(p, ',');
      size_t l = comma ? (size_t)(comma - p) : strlen(p);
      if (!(items[i] = trimmed(p, l))) {
        n = i;
        rc = ct_set_error(CT_ENOMEM, "out of memory");
        goto done;
      }
      p += l + (comma != NULL);
    }
  }
  rc = set_list(c, ki, items, n, where);
done:
  for (int i = 0; i < n; i++) free(items[i]);
  free(items), free(s), free(t);
  return rc;
}

// A scalar value for key ki. `plain`: an unquoted scalar, where ~, null and nothing are
// null, true and false may stand for a TRL spelling (bool_as), and a list key's text
// splits at commas; a quoted scalar is the string itself (one item of a list key).
static int set_scalar(ct_config *c, int ki, const char *text, int plain, const char *where) {
  const key_def *k = &KEYS[ki];
  char b[64];
  void *f = field_of(c, k);
  int truth, is_null = plain && is_null_word(text);
  if (k->bool_as[0] && plain && !is_null && !parse_bool(text, &truth)) text = k->bool_as[truth ? 0 : 1];
  if (k->type == K_STR) {
    char *s = dup_str(is_null ? "" : text);
    if (!s) return ct_set_error(CT_ENOMEM, "out of memory");
    free(*(char **)f);
    *(char **)f = s;
    return set_origin(c, ki, where);
  }
  if ((k->type == K_STR_LIST || k->type == K_FLOAT_LIST) && !plain) {
    char *one[] = {(char *)text};
    return set_list(c, ki, one, 1, where);
  }
  if (k->type == K_STR_LIST || k->type == K_FLOAT_LIST)
    return set_list_text(c, ki, is_null ? "" : text, where);
  char *t = trimmed(text, strlen(text));
  if (!t) return ct_set_error(CT_ENOMEM, "out of memory");
  int rc = 0, iv = 0;
  int64_t i64 = 0;
  double d = 0;
  switch (k->type) {
    case K_BOOL:
      if (parse_bool(t, &iv))
        rc = ct_set_error(CT_ECONFIG, "%s: key '%s': expected a boolean (true or false), got '%s'",
                          WHERE(where), k->name, show(t, b, sizeof b));
      else *(int *)f = iv;
      break;
    case K_INT:
      if (!(rc = parse_number(k, t, where, &i64, &d))) *(int64_t *)f = i64;
      break;
    case K_FLOAT:
      if (!(rc = parse_number(k, t, where, &i64, &d))) *(double *)f = d;
      break;
    case K_ENUM:
      if (!(rc = check_choice(k, 0, t, where, &iv))) *(int *)f = iv;
      break;
    default:
      rc = ct_set_error(CT_ECONFIG, "%s: key '%s' can only be given in a yml file", WHERE(where),
                        k->name);
  }
  free(t);
  return rc ? rc : set_origin(c, ki, where);
}

// The row for `name` if this trainer accepts it; a message naming the closest key otherwise.
static int lookup(const ct_config *c, const char *name, const char *where) {
  char b[64];
  int i = key_index(name);
  if (i < 0 && !strcmp(name, "model"))
    return ct_set_error(CT_ECONFIG, "%s: key 'model' is a block: set its keys as "
                        "model.<key>=value", WHERE(where));
  if (i < 0) {
    const char *s = suggest_key(name, c->trainer);
    if (s)
      return ct_set_error(CT_ECONFIG, "%s: unknown key '%s' (did you mean '%s'?)",
                          WHERE(where), show(name, b, sizeof b), s);
    return ct_set_error(CT_ECONFIG, "%s: unknown key '%s' (configs/base.yml lists every key)",
                        WHERE(where), show(name, b, sizeof b));
  }
  if (!(KEYS[i].trainers & (unsigned)c->trainer)) {
    char list[64];
    trainer_list(KEYS[i].trainers, list, sizeof list);
    return ct_set_error(CT_ECONFIG, "%s: key '%s' does not apply to %s (only to %s)",
                        WHERE(where), name, ct_trainer_name(c->trainer), list);
  }
  return i;
}

// ---------------------------------------------------------------------------------
// Init, set, free, compare
// ---------------------------------------------------------------------------------

void ct_config_free(ct_config *c) {
  if (!c) return;
  for (int i = 0; i < NKEYS; i++) {
    const key_def *k = &KEYS[i];
    if (k->type == K_STR) free(*(char **)field_of(c, k));
    if (k->type == K_STR_LIST || k->type == K_FLOAT_LIST) free_list(k, field_of(c, k));
    if (c->origin_) free(c->origin_[i]);
  }
  free(c->origin_);
  free(c->ignored_);
  memset(c, 0, sizeof *c);
}

// Defaults for `t`; t == 0 gives the built-in defaults alone (for base.yml).
static int init_for(ct_config *c, unsigned t) {
  memset(c, 0, sizeof *c);
  c->trainer = (ct_trainer_kind)t;
  if (!(c->origin_ = calloc(NKEYS, sizeof *c->origin_)))
    return ct_set_error(CT_ENOMEM, "out of memory");
  int ti = trainer_index((ct_trainer_kind)t);
  for (int i = 0; i < NKEYS; i++) {
    const key_def *k = &KEYS[i];
    if (k->type == K_INCLUDE) continue;
    const char *def = ti >= 0 && k->per_trainer[ti] ? k->per_trainer[ti] : k->def;
    int rc = set_scalar(c, i, def, 1, NULL);
    if (rc) {
      ct_config_free(c);
      return ct_wrap_error(rc, "built-in default of '%s'", k->name);
    }
  }
  return 0;
}

int ct_config_init(ct_config *c, ct_trainer_kind trainer) {
  if (trainer_index(trainer) < 0) {
    memset(c, 0, sizeof *c);
    return ct_set_error(CT_EINVAL, "ct_config_init: %d is not one trainer", (int)trainer);
  }
  return init_for(c, (unsigned)trainer);
}

static int apply_text(ct_config *c, const char *name, const char *text, const char *where,
                      const char *path);

int ct_config_set(ct_config *c, const char *key, const char *value, const char *origin) {
  return apply_text(c, key, value ? value : "", origin ? origin : "command line", NULL);
}

int ct_config_check_required(const ct_config *c) {
  for (int i = 0; i < NKEYS; i++) {
    const key_def *k = &KEYS[i];
    if (!(k->required & c->trainer) || k->type != K_STR) continue;
    if (!(*(char *const *)((const char *)c + k->offset))[0])
      return ct_set_error(CT_ECONFIG, "%s: key '%s' is required (%s)", ct_config_origin(c, k->name),
                          k->name, k->comment);
  }
  return 0;
}

const char *ct_config_ignored(const ct_config *c) { return c->ignored_ ? c->ignored_ : ""; }

bool ct_config_is_set(const ct_config *c, const char *key) {
  const char *o = ct_config_origin(c, key);
  return o && strcmp(o, "default") != 0;
}

const char *ct_config_origin(const ct_config *c, const char *key) {
  int i = key_index(key);
  if (i < 0) return NULL;
  return c->origin_ && c->origin_[i] ? c->origin_[i] : "default";
}

int ct_config_num_keys(void) { return NKEYS; }
const char *ct_config_key_name(int i) { return i >= 0 && i < NKEYS ? KEYS[i].name : NULL; }

static int same_double(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

const char *ct_config_diff(const ct_config *a, const ct_config *b) {
  if (a->trainer != b->trainer) return "trainer";
  for (int i = 0; i < NKEYS; i++) {
    const key_def *k = &KEYS[i];
    const void *fa = cfield_of(a, k), *fb = cfield_of(b, k);
    int same = 1;
    switch (k->type) {
      case K_BOOL:
      case K_ENUM: same = *(const int *)fa == *(const int *)fb; break;
      case K_INT: same = *(const int64_t *)fa == *(const int64_t *)fb; break;
      case K_FLOAT: same = same_double(*(const double *)fa, *(const double *)fb); break;
      case K_STR: same = !strcmp(*(char *const *)fa, *(char *const *)fb); break;
      case K_STR_LIST: {
        const ct_str_list *la = fa, *lb = fb;
        same = la->n == lb->n;
        for (int j = 0; same && j < la->n; j++) same = !strcmp(la->v[j], lb->v[j]);
        break;
      }
      case K_FLOAT_LIST: {
        const ct_float_list *la = fa, *lb = fb;
        same = la->n == lb->n;
        for (int j = 0; same && j < la->n; j++) same = same_double(la->v[j], lb->v[j]);
        break;
      }
      default: break;
    }
    if (!same) return k->name;
  }
  if (a->model.set_mask != b->model.set_mask) return "model.set_mask";
  return NULL;
}

static void write_value(FILE *f, const ct_config *c, const key_def *k);

// ---------------------------------------------------------------------------------
// --help
// ---------------------------------------------------------------------------------

static const char *const USAGE[NKINDS] = {
    "usage: sft [config.yml] [key=value ...]\n"
    "Supervised fine-tuning on TRL rows: text, prompt/completion or messages.\n",
    "usage: dpo [config.yml] [key=value ...]\n"
    "Preference tuning (DPO, IPO, SimPO, RPO, ...) on prompt/chosen/rejected rows.\n",
    "usage: grpo [config.yml] [key=value ...]\n"
    "Reinforcement learning with rewards (GRPO, DAPO, Dr. GRPO) on prompt rows.\n",
    "usage: distill [precompute] [config.yml] [key=value ...]\n"
    "Knowledge distillation from teacher_path on SFT rows; `precompute` writes the teacher's\n"
    "top-k logits to teacher_logits_path for offline training.\n",
    "usage: sampler generate|score|accuracy|bench [config.yml] [key=value ...]\n"
    "  generate: model_path=DIR and prompt=TEXT or prompts_path=FILE.jsonl\n"
    "  score:    model_path=DIR data=FILE.jsonl (prompt/completion rows): log-probs\n"
    "  accuracy: model_path=DIR data=FILE.jsonl: completions == 'completion' (temperature=0: greedy)\n"
    "  bench:    speed of prefill and decode, fp32 and int8\n"
    "config.yml may be a trainer's yml or a run's config.yml: the keys the sampler uses are\n"
    "taken, the others named and skipped.\n",
    "usage: reward [score|eval] [config.yml] [key=value ...]\n"
    "Reward-model training (TRL's RewardTrainer) on prompt?/chosen/rejected(/margin) rows.\n"
    "  score: model_path=RM data=FILE.jsonl (prompt + completion, or messages): {row, reward} lines\n"
    "  eval:  model_path=RM eval_dataset_path=PAIRS.jsonl: held-out pair accuracy\n",
};

// The keys --help lists for t: those not every trainer takes, or with a default of t's own.
static int help_lists(const key_def *k, ct_trainer_kind t) {
  int ti = trainer_index(t);
  if (!(k->trainers & (unsigned)t) || k->type == K_INCLUDE || is_model_key(k)) return 0;
  return t == CT_TRAINER_SAMPLER || (k->trainers & ALL) != ALL || k->per_trainer[ti] || (k->required & t);
}

int ct_config_write_help(FILE *f, ct_trainer_kind t) {
  int ti = trainer_index(t);
  if (ti < 0) return ct_set_error(CT_EINVAL, "ct_config_write_help: %d is not one trainer", (int)t);
  ct_config d;
  int rc = ct_config_init(&d, t);
  if (rc) return rc;
  fprintf(f, "%s\nKeys of %s (key=default: what it does; required keys first):\n", USAGE[ti],
          TRAINER_NAMES[ti]);
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < NKEYS; i++) {
      const key_def *k = &KEYS[i];
      if (!help_lists(k, t) || (pass == 0) != ((k->required & t) != 0)) continue;
      fprintf(f, "  %s=", k->name);
      write_value(f, &d, k);
      const char *dot = strstr(k->comment, ". ");  // the first sentence
      int len = dot ? (int)(dot - k->comment) + 1 : (int)strlen(k->comment);
      fprintf(f, "%s\n      %.*s\n", pass ? "" : "  (required)", len, k->comment);
    }
  if (t != CT_TRAINER_SAMPLER)
    fputs("\nEvery other key (model_path, max_steps, per_device_train_batch_size, the model: block,\n"
          "...) is listed with its default and meaning in configs/base.yml, or run\n"
          "`bin/ctune-config base`.", f);
  else
    fputs("\nThe full descriptions: configs/base.yml (Sampler section), or `bin/ctune-config base`.", f);
  fputs(" Values are YAML where quoted or a list:\noutput_dir=\"my out\", 'stop=[\"\\n\", \"a,b\"]'.\n", f);
  ct_config_free(&d);
  return ferror(f) ? ct_set_error(CT_EIO, "writing the help: %s", strerror(errno)) : 0;
}

int ct_config_help_asked(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
  return 0;
}

int ct_config_usage(ct_trainer_kind t, int argc, char **argv) {
  if (ct_config_help_asked(argc, argv)) return ct_config_write_help(stdout, t) || fflush(stdout) ? 1 : 0;
  if (argc < 2) return ct_config_write_help(stderr, t) ? 1 : 2;
  return -1;
}

// ---------------------------------------------------------------------------------
// Loading yml files
// ---------------------------------------------------------------------------------

typedef struct {
  const char *name;  // canonical: "seed", "model.hidden_size"; "model" marks the block
  char *owned;       // name storage for model.* entries
  int line;          // 1-based line of the key
  yaml_node_t *value;
} entry;

typedef struct {
  const char *path[MAX_INCLUDE_DEPTH + 1];  // as shown in messages
  char *real[MAX_INCLUDE_DEPTH + 1];        // realpath, to detect cycles
  int depth;
} include_chain;

typedef struct bad_keys bad_keys;
static int load_file(ct_config *c, const char *path, include_chain *chain, const char *from,
                     bad_keys *bad);

static const char *node_kind(const yaml_node_t *n) {
  return n->type == YAML_SEQUENCE_NODE ? "a list" : n->type == YAML_MAPPING_NODE ? "a mapping"
                                                                                 : "a value";
}

static int scalar_is_null(const yaml_node_t *n) {
  return n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
         is_null_word((const char *)n->data.scalar.value);
}

static int scalar_ok(const yaml_node_t *n, const char *where, const char *key) {
  if (strlen((const char *)n->data.scalar.value) != n->data.scalar.length)
    return ct_set_error(CT_ECONFIG, "%s: key '%s': value contains a NUL character", where, key);
  return 0;
}

static int apply_node(ct_config *c, const char *name, const yaml_node_t *v, yaml_document_t *doc,
                      const char *where, const char *path);

// A lone plain scalar outside any document (a command-line value typed as it is).
static yaml_node_t plain_node(const char *text) {
  yaml_node_t n;
  memset(&n, 0, sizeof n);
  n.type = YAML_SCALAR_NODE;
  n.data.scalar.value = (yaml_char_t *)text;
  n.data.scalar.length = strlen(text);
  n.data.scalar.style = YAML_PLAIN_SCALAR_STYLE;
  return n;
}

// key = text, as a plain scalar from the same place (a TRL key's mapping sets keys so).
static int apply_text(ct_config *c, const char *name, const char *text, const char *where,
                      const char *path) {
  yaml_node_t n = plain_node(text);
  return apply_node(c, name, &n, NULL, where, path);
}

// ---------------------------------------------------------------------------------
// TRL / transformers key names
// ---------------------------------------------------------------------------------

// A TrainingArguments (or TRL config) name ctune does not use: renamed to `ctune`, or
// its value mapped by `map`, or rejected with `note` (what to use instead).
typedef struct {
  const char *name;
  const char *ctune;
  int (*map)(ct_config *c, const char *name, const char *value, const char *where, const char *path);
  const char *note;
} trl_key;

static int is_word(const char *v, const char *a, const char *b) {
  return !strcmp(v, a) || (b && !strcmp(v, b));
}

// eval_strategy, save_strategy, logging_strategy: steps (the *_steps key decides), no
// (off, as ctune says it), epoch (not supported: ctune counts steps).
static int map_strategy(ct_config *c, const char *name, const char *v, const char *where,
                        const char *path) {
  char b[64];
  const char *steps = name[0] == 's' ? "save_steps" : name[0] == 'l' ? "logging_steps" : "eval_steps";
  if (is_word(v, "steps", NULL)) return 0;
  if (is_word(v, "no", "false") && name[0] == 's') return apply_text(c, "save_steps", "0", where, path);
  if (is_word(v, "no", "false") && name[0] != 'l')  // no evaluation: no eval data
    return apply_text(c, "eval_dataset_path", "", where, path);
  if (is_word(v, "no", "false"))
    return ct_set_error(CT_ECONFIG, "%s: key '%s': 'no' has no equivalent: ctune always writes "
                        "metrics.jsonl, every logging_steps steps", where, name);
  if (is_word(v, "epoch", NULL))
    return ct_set_error(CT_ECONFIG, "%s: key '%s': 'epoch' is not supported: ctune counts in steps; "
                        "set %s", where, name, steps);
  return ct_set_error(CT_ECONFIG, "%s: key '%s': '%s' is not one of steps, no (set %s)", where,
                      name, show(v, b, sizeof b), steps);
}

static int map_optim(ct_config *c, const char *name, const char *v, const char *where, const char *path) {
  char b[64];
  if (is_word(v, "adamw_torch", "adamw_torch_fused") || is_word(v, "adamw_hf", NULL))
    return apply_text(c, "optimizer", "adamw", where, path);
  if (is_word(v, "muon", NULL)) return apply_text(c, "optimizer", "muon", where, path);
  return ct_set_error(CT_ECONFIG, "%s: key '%s': '%s' is not supported: ctune's optimizers are AdamW "
                      "(adamw_torch, adamw_torch_fused, adamw_hf) and muon (see the key optimizer)", where,
                      name, show(v, b, sizeof b));
}

static int map_torch_dtype(ct_config *c, const char *name, const char *v, const char *where,
                           const char *path) {
  (void)c, (void)path;
  char b[64];
  if (is_word(v, "float32", "auto") || is_null_word(v)) return 0;
  return ct_set_error(CT_ECONFIG, "%s: key '%s': '%s' is not supported: ctune trains in float32 "
                      "(only float32 or auto); save_dtype sets the saved weights' type, base_dtype, "
                      "ref_dtype and teacher_dtype the frozen weights'", where, name, show(v, b, sizeof b));
}

#define NO_EQ(name, note) {name, NULL, NULL, note}
static const trl_key TRL_KEYS[] = {
    {"max_seq_length", "max_length", NULL, NULL},
    {"per_gpu_train_batch_size", "per_device_train_batch_size", NULL, NULL},
    {"per_gpu_eval_batch_size", "per_device_eval_batch_size", NULL, NULL},
    {"model_name_or_path", "model_path", NULL, NULL},
    {"evaluation_strategy", NULL, map_strategy, NULL},
    {"eval_strategy", NULL, map_strategy, NULL},
    {"save_strategy", NULL, map_strategy, NULL},
    {"logging_strategy", NULL, map_strategy, NULL},
    {"optim", NULL, map_optim, NULL},
    {"torch_dtype", NULL, map_torch_dtype, NULL},
    {"dtype", NULL, map_torch_dtype, NULL},
    NO_EQ("fp16", "use bf16: true (bfloat16 matmuls); save_dtype sets the saved weights' type"),
    NO_EQ("tf32", "ctune computes in float32 on the CPU"),
    NO_EQ("dataset_name", "use dataset_path (a local JSONL file in TRL format)"),
    NO_EQ("dataset_train_split", "use dataset_path (a local JSONL file)"),
    NO_EQ("dataset_test_split", "use eval_dataset_path (a local JSONL file)"),
    NO_EQ("do_train", "every run trains"),
    NO_EQ("do_eval", "evaluation runs when eval_dataset_path is set"),
    NO_EQ("report_to", "metrics go to output_dir/metrics.jsonl"),
    NO_EQ("logging_dir", "metrics go to output_dir/metrics.jsonl"),
    NO_EQ("overwrite_output_dir", "no equivalent"),
    NO_EQ("push_to_hub", "the model is saved in output_dir in Hugging Face layout"),
    NO_EQ("hub_model_id", "the model is saved in output_dir in Hugging Face layout"),
    NO_EQ("load_best_model_at_end", "no equivalent: the last step's model is saved"),
    NO_EQ("metric_for_best_model", "no equivalent: the last step's model is saved"),
    NO_EQ("lr_scheduler_kwargs", "no equivalent; lr_scheduler_type picks the schedule"),
    NO_EQ("gradient_checkpointing_kwargs", "no equivalent; gradient_checkpointing turns it on"),
    NO_EQ("dataloader_num_workers", "no equivalent; num_threads sets the compute threads"),
    NO_EQ("dataset_num_proc", "no equivalent; num_threads sets the compute threads"),
    NO_EQ("data_seed", "no equivalent; seed seeds everything"),
    NO_EQ("deepspeed", "no equivalent; run under mpirun for several processes"),
    NO_EQ("fsdp", "no equivalent; run under mpirun for several processes"),
    NO_EQ("use_vllm", "no equivalent; generation uses ctune's built-in sampler (decode_slots)"),
    NO_EQ("attn_implementation", "no equivalent"),
    NO_EQ("use_liger_kernel", "no equivalent"),
    NO_EQ("torch_compile", "no equivalent"),
    NO_EQ("load_in_4bit", "no equivalent; base_dtype: int8 holds a LoRA base in int8"),
    NO_EQ("load_in_8bit", "use base_dtype: int8 (with use_peft)"),
    NO_EQ("eval_accumulation_steps", "no equivalent"),
    NO_EQ("remove_unused_columns", "no equivalent; extra fields are kept for rewards"),
};
#undef NO_EQ

static const trl_key *trl_find(const char *name) {
  for (size_t i = 0; i < sizeof TRL_KEYS / sizeof *TRL_KEYS; i++)
    if (!strcmp(TRL_KEYS[i].name, name)) return &TRL_KEYS[i];
  return NULL;
}

// A TRL key's value (a scalar), renamed, mapped or rejected.
static int apply_trl(ct_config *c, const trl_key *t, const yaml_node_t *v, yaml_document_t *doc,
                     const char *where, const char *path) {
  if (t->ctune) return apply_node(c, t->ctune, v, doc, where, path);
  if (t->note)
    return ct_set_error(CT_ECONFIG, "%s: key '%s' (TRL/transformers) is not a ctune key: %s", where,
                        t->name, t->note);
  if (v->type != YAML_SCALAR_NODE)
    return ct_set_error(CT_ECONFIG, "%s: key '%s': expected one value, got %s", where, t->name,
                        node_kind(v));
  return t->map(c, t->name, (const char *)v->data.scalar.value, where, path);
}

// ---------------------------------------------------------------------------------
// Applying values
// ---------------------------------------------------------------------------------

// bin/sampler reads a trainer's yml or a run's config.yml for the keys it uses: a key
// from a file that only trainers take is skipped (and listed by ct_config_ignored).
static int sampler_skips(const ct_config *c, const char *name, const char *path) {
  if (!path || c->trainer != CT_TRAINER_SAMPLER) return 0;
  int i = key_index(name);
  if (i >= 0) return !(KEYS[i].trainers & CT_TRAINER_SAMPLER);
  const trl_key *t = trl_find(name);
  return t && !(t->ctune && (KEYS[key_index(t->ctune)].trainers & CT_TRAINER_SAMPLER));
}

static int note_ignored(ct_config *c, const char *name) {
  size_t len = c->ignored_ ? strlen(c->ignored_) : 0, n = strlen(name);
  for (const char *p = c->ignored_; p && (p = strstr(p, name)); p += n)
    if ((p == c->ignored_ || p[-1] == ' ') && (!p[n] || p[n] == ',')) return 0;  // listed
  char *r = realloc(c->ignored_, len + n + 3);
  if (!r) return ct_set_error(CT_ENOMEM, "out of memory");
  snprintf(r + len, n + 3, "%s%s", len ? ", " : "", name);
  c->ignored_ = r;
  return 0;
}

// Applies one value (a scalar, or a sequence of `doc`) to key `name`. `path`: the file
// the node comes from (list items name their own line), NULL for the command line.
static int apply_node(ct_config *c, const char *name, const yaml_node_t *v, yaml_document_t *doc,
                      const char *where, const char *path) {
  if (sampler_skips(c, name, path)) return note_ignored(c, name);
  const trl_key *t = key_index(name) < 0 ? trl_find(name) : NULL;
  if (t) return apply_trl(c, t, v, doc, where, path);
  int ki = lookup(c, name, where);
  if (ki < 0) return ki;
  const key_def *k = &KEYS[ki];
  if (k->type == K_INCLUDE)
    return ct_set_error(CT_ECONFIG, "%s: key 'base_config' can only be given in a yml file", where);
  int is_list = k->type == K_STR_LIST || k->type == K_FLOAT_LIST;
  if (v->type == YAML_SCALAR_NODE) {
    if (scalar_ok(v, where, k->name)) return CT_ECONFIG;
    return set_scalar(c, ki, (const char *)v->data.scalar.value,
                      v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE, where);
  }
  if (v->type == YAML_SEQUENCE_NODE && is_list) {
    int n = (int)(v->data.sequence.items.top - v->data.sequence.items.start), rc = 0;
    char **items = calloc((size_t)n + 1, sizeof *items);
    if (!items) return ct_set_error(CT_ENOMEM, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
      yaml_node_t *it = yaml_document_get_node(doc, v->data.sequence.items.start[i]);
      char iwhere[PATH_MAX + 32];
      if (path) snprintf(iwhere, sizeof iwhere, "%s:%lu", path, (unsigned long)it->start_mark.line + 1);
      else snprintf(iwhere, sizeof iwhere, "%s", where);
      if (it->type != YAML_SCALAR_NODE)
        rc = ct_set_error(CT_ECONFIG, "%s: key '%s': list items must be values, got %s",
                          iwhere, k->name, node_kind(it));
      else if (!(rc = scalar_ok(it, iwhere, k->name)))
        items[i] = (char *)it->data.scalar.value;  // as YAML gives it: quoted blanks stay
    }
    if (!rc) rc = set_list(c, ki, items, n, where);
    free(items);
    return rc;
  }
  static const char *const expected[] = {
      [K_BOOL] = "a boolean", [K_INT] = "an integer", [K_FLOAT] = "a number",
      [K_STR] = "a string",   [K_ENUM] = "one value", [K_STR_LIST] = "a list",
      [K_FLOAT_LIST] = "a list", [K_INCLUDE] = "a file name"};
  return ct_set_error(CT_ECONFIG, "%s: key '%s': expected %s, got %s", where, k->name,
                      expected[k->type], node_kind(v));
}

// Applies one `key: value` pair of a file.
static int apply_entry(ct_config *c, const entry *e, yaml_document_t *doc, const char *path) {
  char where[PATH_MAX + 32];
  snprintf(where, sizeof where, "%s:%d", path, e->line);
  return apply_node(c, e->name, e->value, doc, where, path);
}

// Every bad key of a run, one line each, reported together (up to what a message holds).
struct bad_keys {
  char text[900];
  int n, dropped;
};

// rc == CT_ECONFIG: the message joins the list and loading goes on (returns 0); any
// other failure stops it (returned as is).
static int bad_note(bad_keys *b, int rc) {
  if (rc != CT_ECONFIG) return rc;
  size_t len = strlen(b->text), need = strlen(ct_last_error()) + (len > 0);
  if (len && len + need >= sizeof b->text) b->dropped++;
  else snprintf(b->text + len, sizeof b->text - len, "%s%s", len ? "\n" : "", ct_last_error());
  b->n++;
  return 0;
}

static int bad_result(const bad_keys *b) {
  if (!b->n) return 0;
  if (b->dropped) return ct_set_error(CT_ECONFIG, "%s\n(and %d more)", b->text, b->dropped);
  return ct_set_error(CT_ECONFIG, "%s", b->text);
}

// base_config is relative to the directory of the file that names it.
static char *join_relative(const char *file, const char *rel) {
  const char *slash = strrchr(file, '/');
  size_t dir = rel[0] == '/' || !slash ? 0 : (size_t)(slash - file) + 1;
  char *r = malloc(dir + strlen(rel) + 1);
  if (r) memcpy(r, file, dir), strcpy(r + dir, rel);
  return r;
}

static int add_entry(entry **es, int *n, int *cap, const entry *e, const char *path) {
  for (int i = 0; i < *n; i++)
    if (!strcmp((*es)[i].name, e->name))
      return ct_set_error(CT_ECONFIG, "%s:%d: duplicate key '%s' (first at line %d)", path,
                          e->line, e->name, (*es)[i].line);
  if (*n == *cap) {
    int nc = *cap ? 2 * *cap : 32;
    entry *ne = realloc(*es, (size_t)nc * sizeof *ne);
    if (!ne) return ct_set_error(CT_ENOMEM, "out of memory");
    *es = ne, *cap = nc;
  }
  (*es)[(*n)++] = *e;
  return 0;
}

// Flattens the document into entries (the model block becomes model.* entries),
// rejecting duplicates and anything that is not a mapping of names.
static int collect_entries(yaml_document_t *doc, const char *path, entry **es, int *n) {
  yaml_node_t *root = yaml_document_get_root_node(doc);
  int cap = 0, rc = 0;
  *es = NULL, *n = 0;
  if (!root) return 0;  // an empty file
  if (root->type != YAML_MAPPING_NODE) {
    if (scalar_is_null(root)) return 0;
    return ct_set_error(CT_ECONFIG, "%s:%lu: expected `key: value` lines at the top level, got %s",
                        path, (unsigned long)root->start_mark.line + 1,
                        root->type == YAML_SEQUENCE_NODE ? "a list" : "a lone value");
  }
  for (yaml_node_pair_t *p = root->data.mapping.pairs.start;
       !rc && p < root->data.mapping.pairs.top; p++) {
    yaml_node_t *kn = yaml_document_get_node(doc, p->key);
    yaml_node_t *vn = yaml_document_get_node(doc, p->value);
    int line = (int)kn->start_mark.line + 1;
    if (kn->type != YAML_SCALAR_NODE)
      return ct_set_error(CT_ECONFIG, "%s:%d: a key must be a name, got %s", path, line,
                          node_kind(kn));
    const char *name = (const char *)kn->data.scalar.value;
    entry e = {name, NULL, line, vn};
    if (strcmp(name, "model") != 0) {
      rc = add_entry(es, n, &cap, &e, path);
      continue;
    }
    e.value = NULL;  // marks the block, so that a second `model:` is a duplicate
    if ((rc = add_entry(es, n, &cap, &e, path))) break;
    if (scalar_is_null(vn)) continue;  // `model:` with every key commented out
    if (vn->type != YAML_MAPPING_NODE)
      return ct_set_error(CT_ECONFIG, "%s:%d: key 'model': expected a block of model.* keys, "
                          "got %s", path, line, node_kind(vn));
    for (yaml_node_pair_t *q = vn->data.mapping.pairs.start;
         !rc && q < vn->data.mapping.pairs.top; q++) {
      yaml_node_t *sk = yaml_document_get_node(doc, q->key);
      int sline = (int)sk->start_mark.line + 1;
      if (sk->type != YAML_SCALAR_NODE)
        return ct_set_error(CT_ECONFIG, "%s:%d: a key must be a name, got %s", path, sline,
                            node_kind(sk));
      const char *sub = (const char *)sk->data.scalar.value;
      entry se = {NULL, malloc(strlen(MODEL_PREFIX) + strlen(sub) + 1), sline,
                  yaml_document_get_node(doc, q->value)};
      if (!se.owned) return ct_set_error(CT_ENOMEM, "out of memory");
      strcpy(se.owned, MODEL_PREFIX), strcat(se.owned, sub);
      se.name = se.owned;
      if ((rc = add_entry(es, n, &cap, &se, path))) free(se.owned);
    }
  }
  return rc;
}

static int yaml_error(yaml_parser_t *p, const char *path) {
  if (p->error == YAML_MEMORY_ERROR) return ct_set_error(CT_ENOMEM, "%s: out of memory", path);
  if (p->error == YAML_READER_ERROR)
    return ct_set_error(CT_ECONFIG, "%s: byte %lu: %s (a yml file must be UTF-8 text)", path,
                        (unsigned long)p->problem_offset, p->problem ? p->problem : "bad input");
  char ctx[128] = "";
  if (p->context)
    snprintf(ctx, sizeof ctx, " (%s, from line %lu)", p->context,
             (unsigned long)p->context_mark.line + 1);
  return ct_set_error(CT_ECONFIG, "%s:%lu: YAML syntax error: %s%s", path,
                      (unsigned long)p->problem_mark.line + 1,
                      p->problem ? p->problem : "invalid YAML", ctx);
}

// Loads base_config (if any) into c, then this file's keys. `from` is where this file
// was named ("a.yml:1"), NULL for the file given by the user. A bad key joins `bad` and
// the keys after it still load; the file's own errors (syntax, a missing base) return.
static int load_file(ct_config *c, const char *path, include_chain *chain, const char *from,
                     bad_keys *bad) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (from)
      return ct_set_error(CT_ECONFIG, "%s: base_config: cannot open %s: %s", from, path,
                          strerror(errno));
    return ct_set_error(CT_ECONFIG, "%s: cannot open: %s", path, strerror(errno));
  }
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
    fclose(f);
    if (from) return ct_set_error(CT_ECONFIG, "%s: base_config: %s is a directory", from, path);
    return ct_set_error(CT_ECONFIG, "%s: cannot open: is a directory", path);
  }
  char *real = realpath(path, NULL);
  if (!real) real = dup_str(path);
  if (!real) {
    fclose(f);
    return ct_set_error(CT_ENOMEM, "out of memory");
  }
  for (int i = 0; i < chain->depth; i++) {
    if (strcmp(chain->real[i], real) != 0) continue;
    char cyc[1024] = "";
    for (int j = i; j < chain->depth; j++)
      snprintf(cyc + strlen(cyc), sizeof cyc - strlen(cyc), "%s -> ", chain->path[j]);
    snprintf(cyc + strlen(cyc), sizeof cyc - strlen(cyc), "%s", path);
    free(real), fclose(f);
    return ct_set_error(CT_ECONFIG, "%s: base_config cycle: %s", from, cyc);
  }
  if (chain->depth == MAX_INCLUDE_DEPTH) {
    free(real), fclose(f);
    return ct_set_error(CT_ECONFIG, "%s: base_config chain is deeper than %d files", from,
                        MAX_INCLUDE_DEPTH);
  }
  chain->path[chain->depth] = path;
  chain->real[chain->depth++] = real;

  yaml_parser_t parser;
  yaml_document_t doc, extra;
  int rc = 0, have_doc = 0, n = 0;
  entry *es = NULL;
  char *base = NULL;
  if (!yaml_parser_initialize(&parser)) {
    rc = ct_set_error(CT_ENOMEM, "out of memory");
    goto out_file;
  }
  yaml_parser_set_input_file(&parser, f);
  if (!yaml_parser_load(&parser, &doc)) {
    rc = yaml_error(&parser, path);
    goto out_parser;
  }
  have_doc = 1;
  // A config file is one document: a second `---` is most likely a mistake.
  if (!yaml_parser_load(&parser, &extra)) {
    rc = yaml_error(&parser, path);
    goto out_parser;
  }
  yaml_node_t *extra_root = yaml_document_get_root_node(&extra);
  if (extra_root)
    rc = ct_set_error(CT_ECONFIG, "%s:%lu: a config file holds one YAML document; this is a "
                      "second one", path, (unsigned long)extra_root->start_mark.line + 1);
  yaml_document_delete(&extra);
  if (rc || (rc = collect_entries(&doc, path, &es, &n))) goto out_parser;

  // The base first, wherever base_config appears, so that this file's keys win.
  for (int i = 0; i < n && !rc; i++) {
    if (strcmp(es[i].name, "base_config") != 0) continue;
    char where[PATH_MAX + 32];
    snprintf(where, sizeof where, "%s:%d", path, es[i].line);
    yaml_node_t *v = es[i].value;
    if (v->type != YAML_SCALAR_NODE) {
      rc = ct_set_error(CT_ECONFIG, "%s: key 'base_config': expected a file name, got %s", where,
                        node_kind(v));
      break;
    }
    if (scalar_is_null(v) || !v->data.scalar.value[0]) continue;
    if (!(base = join_relative(path, (const char *)v->data.scalar.value))) {
      rc = ct_set_error(CT_ENOMEM, "out of memory");
      break;
    }
    rc = bad_note(bad, load_file(c, base, chain, where, bad));
  }
  for (int i = 0; i < n && !rc; i++)
    if (es[i].value && strcmp(es[i].name, "base_config") != 0)
      rc = bad_note(bad, apply_entry(c, &es[i], &doc, path));

out_parser:
  for (int i = 0; i < n; i++) free(es[i].owned);
  free(es);
  free(base);
  if (have_doc) yaml_document_delete(&doc);
  yaml_parser_delete(&parser);
out_file:
  fclose(f);
  free(chain->real[--chain->depth]);
  return rc;
}

int ct_config_load_file(ct_config *c, const char *path) {
  include_chain chain = {.depth = 0};
  bad_keys bad = {.n = 0};
  int rc = bad_note(&bad, load_file(c, path, &chain, NULL, &bad));
  return rc ? rc : bad_result(&bad);
}

// A command-line value is YAML where YAML syntax says what plain text would not: a
// quoted scalar ("my out", "\n") for any key, a flow sequence ([a, "b,c"]) for a list
// key. Anything else is taken as typed, as a plain scalar: regexes, prompts holding ": "
// or " #", paths (where YAML would read a comment, a mapping or an error).
static int cli_is_yaml(const char *name, const char *text) {
  int i = key_index(name);
  const trl_key *t = i < 0 ? trl_find(name) : NULL;
  if (t && t->ctune) i = key_index(t->ctune);
  int list = i >= 0 && (KEYS[i].type == K_STR_LIST || KEYS[i].type == K_FLOAT_LIST);
  while (*text == ' ' || *text == '\t') text++;
  return *text == '"' || *text == '\'' || (*text == '[' && list);
}

// The value text of a command-line key=value as one YAML node, through libyaml.
static int cli_yaml_value(const char *name, const char *text, yaml_document_t *doc) {
  yaml_parser_t p;
  yaml_document_t extra;
  if (!yaml_parser_initialize(&p)) return ct_set_error(CT_ENOMEM, "out of memory");
  yaml_parser_set_input_string(&p, (const unsigned char *)text, strlen(text));
  int rc = 0, loaded = yaml_parser_load(&p, doc);
  if (loaded && yaml_parser_load(&p, &extra)) {
    if (yaml_document_get_root_node(&extra))
      rc = ct_set_error(CT_ECONFIG, "command line: key '%s': the value is more than one YAML value", name);
    yaml_document_delete(&extra);
  } else if (p.error == YAML_MEMORY_ERROR) {
    rc = ct_set_error(CT_ENOMEM, "out of memory");
  } else {
    rc = ct_set_error(CT_ECONFIG, "command line: key '%s': YAML syntax error in the value at "
                      "column %lu: %s", name, (unsigned long)p.problem_mark.column + 1,
                      p.problem ? p.problem : "invalid YAML");
  }
  if (loaded && rc) yaml_document_delete(doc);
  yaml_parser_delete(&p);
  return rc;
}

// One command-line argument, key=value.
static int apply_arg(ct_config *c, const char *arg) {
  char b[64];
  const char *eq = strchr(arg, '=');
  if (!eq)
    return ct_set_error(CT_ECONFIG, "command line: argument '%s' is not key=value (only the "
                        "first argument may be a yml file)", show(arg, b, sizeof b));
  char *key = malloc((size_t)(eq - arg) + 1);
  if (!key) return ct_set_error(CT_ENOMEM, "out of memory");
  memcpy(key, arg, (size_t)(eq - arg));
  key[eq - arg] = 0;
  int rc;
  if (cli_is_yaml(key, eq + 1)) {
    yaml_document_t doc;
    if (!(rc = cli_yaml_value(key, eq + 1, &doc))) {
      rc = apply_node(c, key, yaml_document_get_root_node(&doc), &doc, "command line", NULL);
      yaml_document_delete(&doc);
    }
  } else {
    rc = apply_text(c, key, eq + 1, "command line", NULL);
  }
  free(key);
  return rc;
}

// Defaults that depend on another key, applied once every key is read, so that the run,
// its config.yml and its resume all see the value used: DPO's beta is 2.0 when loss_type
// holds simpo (SimPO's paper and torchtune's SimPOLoss; TRL's CPOConfig keeps 0.1).
static int resolve_dependent_defaults(ct_config *c) {
  if (c->trainer != CT_TRAINER_DPO || ct_config_is_set(c, "beta")) return 0;
  for (int k = 0; k < c->loss_type.n; k++)
    if (!strcmp(c->loss_type.v[k], "simpo")) {
      c->beta = 2.0;
      return set_origin(c, key_index("beta"), "default with loss_type simpo");
    }
  return 0;
}

int ct_config_from_args(ct_config *c, ct_trainer_kind t, int argc, char **argv) {
  int rc = ct_config_init(c, t), i = 1;
  if (rc) return rc;
  bad_keys bad = {.n = 0};
  if (argc > 1 && !strchr(argv[1], '=')) {
    const char *ext = strrchr(argv[1], '.');
    int yml_name = ext && (!strcmp(ext, ".yml") || !strcmp(ext, ".yaml"));
    if (!yml_name && access(argv[1], F_OK) != 0) {
      char b[64];
      rc = ct_set_error(CT_ECONFIG, "command line: '%s' is neither key=value nor a yml file",
                        show(argv[1], b, sizeof b));
      goto fail;
    }
    include_chain chain = {.depth = 0};
    if ((rc = bad_note(&bad, load_file(c, argv[1], &chain, NULL, &bad)))) goto fail;
    i = 2;
  }
  for (; i < argc; i++)
    if ((rc = bad_note(&bad, apply_arg(c, argv[i])))) goto fail;
  if (!(rc = bad_result(&bad)) && !(rc = resolve_dependent_defaults(c))) return 0;
fail:
  ct_config_free(c);
  return rc;
}

// ---------------------------------------------------------------------------------
// Writing yml
// ---------------------------------------------------------------------------------

// Strings that read back as themselves without quotes (in block and flow context).
static int plain_safe(const char *s) {
  static const char *const special[] = {"~", "null", "true", "false", "yes", "no", "on", "off",
                                        "y", "n"};
  if (!*s || !strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./", *s))
    return 0;
  for (const char *p = s; *p; p++)
    if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./+@=-", *p))
      return 0;
  for (size_t i = 0; i < sizeof special / sizeof *special; i++)
    if (!strcasecmp(s, special[i])) return 0;
  return 1;
}

static void write_str(FILE *f, const char *s) {
  if (plain_safe(s)) {
    fputs(s, f);
    return;
  }
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    // YAML reads NEL, LS and PS as line breaks even inside quotes (and folds them): escaped
    if (p[0] == 0xC2 && p[1] == 0x85) {
      fputs("\\N", f), p++;
      continue;
    }
    if (p[0] == 0xE2 && p[1] == 0x80 && (p[2] == 0xA8 || p[2] == 0xA9)) {
      fputs(p[2] == 0xA8 ? "\\L" : "\\P", f), p += 2;
      continue;
    }
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else if (*p == '\n') fputs("\\n", f);
    else if (*p == '\t') fputs("\\t", f);
    else if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\x%02x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

static void write_value(FILE *f, const ct_config *c, const key_def *k) {
  const void *v = cfield_of(c, k);
  char buf[40];
  switch (k->type) {
    case K_BOOL: fputs(*(const int *)v ? "true" : "false", f); break;
    case K_INT: fprintf(f, "%" PRId64, *(const int64_t *)v); break;
    case K_FLOAT:
      fmt_double(*(const double *)v, buf, sizeof buf);
      fputs(buf, f);
      break;
    case K_STR: write_str(f, *(char *const *)v); break;
    case K_ENUM: fputs(k->choices[*(const int *)v], f); break;
    case K_STR_LIST: {
      const ct_str_list *l = v;
      fputc('[', f);
      for (int i = 0; i < l->n; i++) {
        if (i) fputs(", ", f);
        write_str(f, l->v[i]);
      }
      fputc(']', f);
      break;
    }
    case K_FLOAT_LIST: {
      const ct_float_list *l = v;
      fputc('[', f);
      for (int i = 0; i < l->n; i++) {
        fmt_double(l->v[i], buf, sizeof buf);
        fprintf(f, "%s%s", i ? ", " : "", buf);
      }
      fputc(']', f);
      break;
    }
    case K_INCLUDE: fputs("\"\"", f); break;
  }
}

#define NBSP '\001'  // a space that write_comment never breaks a line at

// Writes "# text" wrapped at 88 columns, each line indented.
static void write_comment(FILE *f, const char *indent, const char *text) {
  const int width = 88 - (int)strlen(indent) - 2;
  while (*text) {
    int len = (int)strlen(text), cut = len;
    if (len > width) {
      for (cut = width; cut > 0 && text[cut] != ' '; cut--) {}
      if (cut == 0) cut = width;
    }
    fprintf(f, "%s# ", indent);
    for (int i = 0; i < cut; i++) fputc(text[i] == NBSP ? ' ' : text[i], f);
    fputc('\n', f);
    text += cut;
    while (*text == ' ') text++;
  }
}

static int has_per_trainer(const key_def *k) {
  for (int i = 0; i < NKINDS; i++)
    if (k->per_trainer[i]) return 1;
  return 0;
}

// The extra facts base.yml states after each comment, all taken from the table.
static void key_facts(const key_def *k, char *buf, size_t n) {
  size_t len = 0;
  buf[0] = 0;
#define ADD(...) (len += (size_t)snprintf(buf + len, len < n ? n - len : 0, __VA_ARGS__))
  if (k->type == K_ENUM || (k->type == K_STR_LIST && k->choices)) {
    ADD(k->type == K_ENUM ? " One of:" : " Items from:");
    for (int i = 0; k->choices[i]; i++) ADD("%s %s", i ? " |" : "", k->choices[i]);
    ADD(".");
  }
  if (k->type == K_INT || k->type == K_FLOAT || k->type == K_FLOAT_LIST) {
    char r[96];
    fmt_range(k, r, sizeof r);
    for (char *p = r; *p; p++)
      if (*p == ' ') *p = NBSP;  // keep "[2, 1048576]" on one line
    ADD(" Range%c%s.", NBSP, r);
  }
  if ((k->trainers & ALL) != ALL) {
    char l[64];
    trainer_list(k->trainers, l, sizeof l);
    ADD(" Only for %s.", l);
  }
  if (has_per_trainer(k)) {
    ADD(" Default per trainer:");
    const char *sep = " ";
    for (int i = 0; i < NKINDS; i++)
      if (k->trainers & (1u << i)) {
        ADD("%s%s %s", sep, TRAINER_NAMES[i], k->per_trainer[i] ? k->per_trainer[i] : k->def);
        sep = ", ";
      }
    ADD(".");
  }
#undef ADD
}

// Keys that base.yml must not set for every trainer (see config.h).
static int base_commented(const key_def *k) {
  return k->type == K_INCLUDE || (k->trainers & ALL) != ALL || has_per_trainer(k) || is_model_key(k);
}

static const char BASE_HEADER[] =
    "# ctune base configuration: every key with its built-in default.\n"
    "# Generated by `ctune-config base` from the key table in common/config.c: change the\n"
    "# table, then regenerate this file (a test checks that the two agree).\n"
    "#\n"
    "# A trainer yml starts with `base_config: base.yml` and sets what it changes; any key\n"
    "# can also be set on the command line: bin/sft configs/sft.yml learning_rate=1e-5\n"
    "# model.hidden_size=64. Keys written here as comments are left unset on purpose:\n"
    "# they apply to some trainers only, have a per-trainer default, or are model.* keys,\n"
    "# where a key left unset may take a value implied by model_type.\n";

int ct_config_write_base_yaml(FILE *f) {
  ct_config d;
  int rc = init_for(&d, 0);
  if (rc) return rc;
  fputs(BASE_HEADER, f);
  int in_model = 0;
  for (int i = 0; i < NKEYS; i++) {
    const key_def *k = &KEYS[i];
    const char *name = k->name, *indent = "";
    if (k->section) fprintf(f, "\n# --- %s ---\n", k->section);
    if (is_model_key(k)) {
      if (!in_model) fputs("model:\n", f), in_model = 1;
      name += strlen(MODEL_PREFIX), indent = "  ";
    }
    char text[1024];
    key_facts(k, text + snprintf(text, sizeof text, "%s", k->comment),
              sizeof text - strlen(k->comment));
    write_comment(f, indent, text);
    fprintf(f, "%s%s%s: ", indent, base_commented(k) ? "# " : "", name);
    write_value(f, &d, k);
    fputc('\n', f);
  }
  ct_config_free(&d);
  return ferror(f) ? ct_set_error(CT_EIO, "writing base.yml: %s", strerror(errno)) : 0;
}

int ct_config_dump(const ct_config *c, FILE *f) {
  const char *tn = ct_trainer_name(c->trainer);
  if (!tn || !c->origin_) return ct_set_error(CT_EINVAL, "ct_config_dump: config not initialized");
  fprintf(f, "# ctune configuration, resolved for %s. Load it again with: bin/%s <this file>\n"
             "# After each value: where it came from. model.* keys left at their default are\n"
             "# written as comments, so that they stay unset when this file is loaded.\n",
          tn, tn);
  int in_model = 0;
  const char *section = NULL;  // printed before the first key of it that is written
  for (int i = 0; i < NKEYS; i++) {
    const key_def *k = &KEYS[i];
    if (k->section) section = k->section;
    if (k->type == K_INCLUDE || !(k->trainers & (unsigned)c->trainer)) continue;
    const char *name = k->name, *indent = "", *origin = c->origin_[i];
    if (section) fprintf(f, "\n# --- %s ---\n", section), section = NULL;
    if (is_model_key(k)) {
      if (!in_model) fputs("model:\n", f), in_model = 1;
      name += strlen(MODEL_PREFIX), indent = "  ";
    }
    int unset = is_model_key(k) && !(c->model.set_mask & model_bit(k));
    fprintf(f, "%s%s%s: ", indent, unset ? "# " : "", name);
    write_value(f, c, k);
    fputs("  # ", f);
    // An origin is a path or "command line": keep it on this comment line.
    for (const char *p = origin ? origin : "default"; *p; p++) fputc(*p == '\n' ? ' ' : *p, f);
    fputc('\n', f);
  }
  return ferror(f) ? ct_set_error(CT_EIO, "writing config: %s", strerror(errno)) : 0;
}

int ct_config_write_yaml(const ct_config *c, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) return ct_set_error(CT_EIO, "%s: cannot write: %s", path, strerror(errno));
  int rc = ct_config_dump(c, f);
  if (fclose(f) && !rc) rc = ct_set_error(CT_EIO, "%s: cannot write: %s", path, strerror(errno));
  if (rc) return ct_wrap_error(rc, "%s", path);
  return 0;
}
