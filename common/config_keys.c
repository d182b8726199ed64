// config_keys: the key table, one row per key (name, type, trainers, field, default and
// per-trainer defaults, range or choices, base.yml's section and comment, required by),
// in base.yml's order; beside it the trainers' names and the enums' names tables.
// Adding a key: a field of ct_config (config_types.h) and a row here. Reading, checking
// and writing values by these rows is the other config_*.c files' work.
#include <math.h>
#include <stddef.h>

#include "config_internal.h"
#include "model.h"
#include "optim.h"

#define ALL CT_TRAINER_ALL
#define SAMPLER CT_TRAINER_SAMPLER
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
const char *const ct_base_dtype_names[] = {"float32", "bfloat16", "int8", "auto", NULL};
const char *const ct_gc_names[] = {"false", "true", "always", NULL};
const char *const ct_model_type_names[] = {"llama", "qwen2", "qwen3", "mistral", "gemma3_text", NULL};
const char *const ct_output_names[] = {"text", "json", NULL};
const char *const ct_quantization_names[] = {"none", "int8", "bf16", NULL};
const char *const ct_truncate_names[] = {"error", "left", NULL};
const char *const ct_speculative_names[] = {"none", "mtp", NULL};
// loss_type by trainer (test_dpo_loss checks them against dpo/loss.c and grpo/), and their union
#define DPO_LOSSES "sigmoid", "hinge", "ipo", "robust", "sft", "simpo", "exo_pair", "nca_pair", "bco_pair", \
    "sppo_hard", "apo_zero", "apo_down", "discopop", "sigmoid_norm", "orpo", "cpo", "aot", "aot_unpaired", \
    "kto", "apo_zero_unpaired", "cpo_hinge", "cpo_ipo", "cpo_simpo", "alphapo"
#define GRPO_LOSSES "grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "vespo"
const char *const ct_loss_type_names[] = {DPO_LOSSES, GRPO_LOSSES, NULL};
const char *const ct_dpo_loss_choices[] = {DPO_LOSSES, NULL};
const char *const ct_grpo_loss_choices[] = {GRPO_LOSSES, NULL};
const char *const ct_scale_rewards_names[] = {"group", "batch", "none", NULL};
const char *const ct_is_level_names[] = {"token", "sequence", NULL};
const char *const ct_moa_names[] = {"sum_then_normalize", "normalize_then_sum", NULL};
const char *const ct_is_mode_names[] = {"token_truncate", "token_mask", "sequence_truncate", "sequence_mask", NULL};
const char *const ct_advantage_estimator_names[] = {"group_norm", "rloo", "reinforce_baseline", NULL};
const char *const ct_reward_failure_names[] = {"error", "nan", NULL};
const char *const ct_tool_format_names[] = {"auto", "hermes", "llama3_json", NULL};
const char *const ct_reward_func_names[] = {"accuracy",           "format", "length", "overlong", "think_format",
                                            "repetition_penalty", "cosine", "remote", "env", NULL};
// the frozen module's storages a reward model (with its score head) can use: CT_STORE_F32, _BF16
const char *const ct_lora_module_names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                            "down_proj", "all-linear", NULL};
const char *const ct_lora_save_names[] = {"embed_tokens", "lm_head", "score", "classifier", NULL};
#define NAMES_MATCH(names, count) \
  _Static_assert(sizeof(names) / sizeof(names[0]) == (count) + 1, #names " must name every value of its enum")
NAMES_MATCH(ct_save_dtype_names, CT_DTYPE_COUNT);
NAMES_MATCH(ct_model_type_names, CT_MODEL_COUNT);
NAMES_MATCH(ct_bf16_names, CT_BF16_COUNT);
NAMES_MATCH(ct_base_dtype_names, CT_BASE_AUTO + 1);
NAMES_MATCH(ct_gc_names, CT_GC_COUNT);
NAMES_MATCH(ct_output_names, CT_OUTPUT_COUNT);
NAMES_MATCH(ct_quantization_names, CT_QUANT_COUNT);
NAMES_MATCH(ct_truncate_names, CT_TRUNCATE_COUNT);
NAMES_MATCH(ct_speculative_names, CT_SPEC_COUNT);
NAMES_MATCH(ct_scale_rewards_names, CT_SCALE_COUNT);
NAMES_MATCH(ct_is_level_names, CT_IS_COUNT);
NAMES_MATCH(ct_moa_names, CT_MOA_COUNT);
NAMES_MATCH(ct_is_mode_names, CT_ISC_COUNT);
NAMES_MATCH(ct_advantage_estimator_names, CT_ADV_COUNT);
NAMES_MATCH(ct_reward_failure_names, CT_REWARD_FAIL_COUNT);
NAMES_MATCH(ct_tool_format_names, CT_TOOLFMT_COUNT);
NAMES_MATCH(ct_reward_func_names, CT_REWARD_COUNT);

const key_def config_keys[] = {
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
    {"gradient_checkpointing", K_ENUM, ALL, OFF(gradient_checkpointing), "false", .choices = ct_gc_names,
     .bool_as = {"true", "false"},
     .comment = "Keep only each layer's input and recompute the layer in backward: activation "
                "memory of one layer instead of all, for about a third more compute. Same "
                "gradients bit for bit. true: only when the memory plan cannot hold every layer's "
                "activations (it says which); always: even when it can."},
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
    {"base_dtype", K_ENUM, ALL, OFF(base_dtype), "auto", .choices = ct_base_dtype_names,
     .comment = "With use_peft: how the frozen base is held. bfloat16 halves its layers, int8 "
                "quarters them (one scale per row; widened one layer at a time); the embeddings "
                "stay float32. auto: bfloat16 when the matmuls run in bf16 (they read the same "
                "bf16 values a float32 base would be rounded to: the same results), else float32."},

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
     .comment = "DPO: preference losses (sigmoid, hinge, ipo, robust, sft, simpo, and TRL's exo_pair, "
                "nca_pair, bco_pair, sppo_hard, apo_zero, apo_down, discopop, sigmoid_norm, aot and "
                "aot_unpaired (over the micro-batch, sorted); and, with no "
                "reference, orpo (ORPOTrainer's loss: odds ratio + NLL) and cpo (CPOTrainer's: sigmoid + "
                "cpo_alpha x NLL; its cpo_hinge, cpo_ipo, cpo_simpo, and alphapo: cpo_simpo without the NLL)), summed with "
                "loss_weights ([sigmoid, sft] is RPO); or, alone, over unpaired rows {prompt, completion, label} "
                "(TRL's KTOTrainer), kto or apo_zero_unpaired. GRPO: one of grpo, bnpo, dr_grpo, dapo "
                "(the clipped surrogate; how token losses are averaged), cispo (the clipped ratio, "
                "no gradient through it, times A and the log-prob; averaged as dapo), sapo (a "
                "sigmoid gate instead of the clip; averaged as grpo), vespo (a gamma weight of the sequence's "
                "ratio, no gradient through it, times A and the log-prob; averaged as dapo)."},
    {"loss_weights", K_FLOAT_LIST, DPO, OFF(loss_weights), "[]", FROM(0),
     .comment = "Weight of each loss_type entry. Empty = 1 each."},
    {"label_smoothing", K_FLOAT, DPO, OFF(label_smoothing), "0.0", CLOPEN(0, 0.5),
     .comment = "Probability that a preference label is flipped (cDPO, robust, simpo); exo_pair's "
                "epsilon (must be > 0 there)."},
    {"cpo_alpha", K_FLOAT, DPO, OFF(cpo_alpha), "1.0", FROM(0),
     .comment = "cpo, cpo_hinge, cpo_ipo, cpo_simpo: the weight of their NLL term on the chosen tokens."},
    {"alpha", K_FLOAT, DPO, OFF(alpha), "0.0", OPEN(-INFINITY, INFINITY),
     .comment = "The cpo losses (CPOConfig's alpha, AlphaPO): 0 compares the log-probs u themselves, else "
                "r(u) = (1 - exp(-alpha u)) / alpha."},
    {"desirable_weight", K_FLOAT, DPO, OFF(desirable_weight), "1.0", FROM(0),
     .comment = "kto, apo_zero_unpaired: the weight of a desirable example's loss (label true)."},
    {"undesirable_weight", K_FLOAT, DPO, OFF(undesirable_weight), "1.0", FROM(0),
     .comment = "kto, apo_zero_unpaired: the weight of an undesirable example's loss (label false)."},
    {"discopop_tau", K_FLOAT, DPO, OFF(discopop_tau), "0.05", OPEN(0, INFINITY),
     .comment = "discopop: the temperature of the mix between the logistic and exponential terms."},
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
    {"epsilon_high", K_FLOAT, GRPO, OFF(epsilon_high), "0.0", CLOPEN(0, 10), .null_as = "0.0",
     .comment = "Upper clipping range; 0 = epsilon (DAPO uses a larger one). cispo: the cap "
                "on the ratio itself (ScaleRL recommends 5.0)."},
    {"delta", K_FLOAT, GRPO, OFF(delta), "0.0", FROM(0), .null_as = "0.0",
     .comment = "Two-sided clipping (INTELLECT-2): the unclipped ratio is capped at delta too "
                "(use more than 1 + epsilon_high); 0 = off (TRL's None)."},
    {"importance_sampling_level", K_ENUM, GRPO, OFF(importance_sampling_level), "token",
     .choices = ct_is_level_names,
     .comment = "token: a ratio per token; sequence: one per completion, exp of the mean of its "
                "tokens' log-ratios (GSPO)."},
    {"sapo_temperature_pos", K_FLOAT, GRPO, OFF(sapo_temperature_pos), "1.0", OPEN(0, INFINITY),
     .comment = "sapo: the gate's temperature for tokens of a positive advantage."},
    {"sapo_temperature_neg", K_FLOAT, GRPO, OFF(sapo_temperature_neg), "1.05", OPEN(0, INFINITY),
     .comment = "sapo: the gate's temperature for the others."},
    {"vespo_k_pos", K_FLOAT, GRPO, OFF(vespo_k_pos), "2.0", ANY,
     .comment = "vespo: the power k of its weight for A >= 0."},
    {"vespo_lambda_pos", K_FLOAT, GRPO, OFF(vespo_lambda_pos), "3.0", ANY,
     .comment = "vespo: the decay lambda of its weight for A >= 0."},
    {"vespo_k_neg", K_FLOAT, GRPO, OFF(vespo_k_neg), "3.0", ANY,
     .comment = "vespo: the power k for A < 0."},
    {"vespo_lambda_neg", K_FLOAT, GRPO, OFF(vespo_lambda_neg), "2.0", ANY,
     .comment = "vespo: the decay lambda for A < 0."},
    {"use_bias_correction_kl", K_BOOL, GRPO, OFF(use_bias_correction_kl), "false",
     .comment = "The KL term times the importance weight (DeepSeek-V3.2's unbiased estimate)."},
    {"vllm_importance_sampling_correction", K_BOOL, GRPO, OFF(vllm_importance_sampling_correction), "false",
     .comment = "Weigh each token's policy term by how much likelier the training forward finds the "
                "sampled token than the sampler did (bf16 or int8 rollouts): exp(old - sampler "
                "log-prob), per token or per completion (the sum), as the mode says (TRL's vLLM "
                "correction; the sampler plays vLLM's part). Off as in TRL without vLLM."},
    {"vllm_importance_sampling_mode", K_ENUM, GRPO, OFF(vllm_importance_sampling_mode), "sequence_mask",
     .choices = ct_is_mode_names,
     .comment = "token_ or sequence_: a ratio per token or per completion; _truncate clamps it to "
                "[clip_min, clip_max], _mask zeroes it outside that range."},
    {"vllm_importance_sampling_clip_max", K_FLOAT, GRPO, OFF(vllm_importance_sampling_clip_max), "3.0",
     FROM(0), .nonfinite = 1, .null_as = ".inf",
     .comment = "The correction's upper bound (null: none). TRL's older name: vllm_importance_sampling_cap."},
    {"vllm_importance_sampling_clip_min", K_FLOAT, GRPO, OFF(vllm_importance_sampling_clip_min), "0.0",
     FROM(0), .null_as = "0.0", .comment = "The correction's lower bound (0 = TRL's None)."},
    {"top_entropy_quantile", K_FLOAT, GRPO, OFF(top_entropy_quantile), "1.0", IN(0, 1),
     .comment = "Train only on the micro-batch's highest-entropy completion tokens: those at or "
                "above this quantile from the top (0.2: the top 20%; Beyond the 80/20 Rule); 1 = all."},
    {"off_policy_mask_threshold", K_FLOAT, GRPO, OFF(off_policy_mask_threshold), "0.0", FROM(0), .null_as = "0.0",
     .comment = "Drop completions of negative advantage whose mean (sampler - policy) log-prob "
                "exceeds this (DeepSeek-V3.2's off-policy sequence mask); 0 = off (TRL's None)."},
    {"scale_rewards", K_ENUM, GRPO, OFF(scale_rewards), "group", .choices = ct_scale_rewards_names,
     .bool_as = {"group", "none"},
     .comment = "Advantages divided by the group's reward std (group), the batch's (batch), "
                "or not at all (none); TRL's true and false mean group and none. "
                "advantage_estimator group_norm only."},
    {"multi_objective_aggregation", K_ENUM, GRPO, OFF(multi_objective_aggregation), "sum_then_normalize",
     .choices = ct_moa_names,
     .comment = "sum_then_normalize: the weighted sum of the rewards, then advantage_estimator; "
                "normalize_then_sum (GDPO): each reward function normalized within its group, "
                "the weighted sum, then (x - mean) / (std + 1e-4) over the whole batch."},
    {"advantage_estimator", K_ENUM, GRPO, OFF(advantage_estimator), "group_norm",
     .choices = ct_advantage_estimator_names,
     .comment = "group_norm: (r - group mean) / scale_rewards' std (GRPO); rloo: r minus the "
                "mean of the group's other rewards (RLOO); reinforce_baseline: r - group mean, "
                "then whitened over all completion tokens of the step (REINFORCE++-baseline)."},
    {"normalize_advantages", K_BOOL, GRPO, OFF(normalize_advantages), "false",
     .comment = "rloo: whiten the step's advantages, (A - mean) / (std + 1e-4) over all "
                "completions (TRL's RLOO option)."},
    {"filter_groups", K_BOOL, GRPO, OFF(filter_groups), "false",
     .comment = "DAPO's dynamic sampling (verl's filter_groups): groups whose rewards are all equal "
                "are dropped and more prompts are sampled until the batch is full, at most "
                "max_num_gen_batches batches a step (the last one fills any gap with its other groups)."},
    {"max_num_gen_batches", K_INT, GRPO, OFF(max_num_gen_batches), "10", IN(1, 1000),
     .comment = "filter_groups: prompt batches generated per step at most (verl's name)."},
    {"mask_truncated_completions", K_BOOL, GRPO, OFF(mask_truncated_completions), "false",
     .comment = "Completions that never reached an end-of-turn token get no loss."},
    {"share_prompts", K_BOOL, GRPO, OFF(share_prompts), "true",
     .comment = "Training runs a micro-batch's group of completions as one row: their prompt once, "
                "each completion attending to it. The same loss and gradients within float rounding "
                "for fewer tokens; with lora_dropout the group shares one dropout draw of its prompt. "
                "false: a copy of the prompt per completion, as TRL."},
    {"reward_funcs", K_STR_LIST, GRPO, OFF(reward_funcs), "accuracy",
     .comment = "Reward functions, summed with reward_weights: accuracy, format, length, overlong, "
                "think_format, repetition_penalty, cosine, remote, env (an environment episode's reward), or "
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
    {"answer_math", K_BOOL, GRPO, OFF(answer_math), "false",
     .comment = "accuracy, cosine: compare as math answers, as TRL's math-verify accuracy_reward on "
                "GSM8K / MATH data (numbers, fractions, percentages, LaTeX forms); without "
                "answer_regex the completion's answer is its last \\boxed{} or $...$."},
    {"format_regex", K_STR, GRPO, OFF(format_regex), "",
     .comment = "format: reward 1 when this Python re pattern (PCRE2) matches somewhere in the "
                "completion (re.search; (?s) lets . match a newline)."},
    {"length_target", K_INT, GRPO, OFF(length_target), "0", FROM(0),
     .comment = "length: reward -|characters - target| / target."},
    {"overlong_buffer_len", K_INT, GRPO, OFF(overlong_buffer_len), "0", FROM(0),
     .comment = "overlong (DAPO's soft overlong punishment, TRL's get_soft_overlong_punishment with "
                "max_completion_len = max_completion_length): 0 up to max_completion_length - this many "
                "tokens, then falling linearly to -1 at max_completion_length."},
    {"repetition_ngram_size", K_INT, GRPO, OFF(repetition_ngram_size), "3", FROM(1),
     .comment = "repetition_penalty (TRL's get_repetition_penalty_reward): the n of its token n-grams."},
    {"repetition_max_penalty", K_FLOAT, GRPO, OFF(repetition_max_penalty), "-1.0", IN(-INFINITY, 0),
     .comment = "repetition_penalty: (1 - unique / all n-grams) x this (not positive)."},
    {"cosine_max_len", K_INT, GRPO, OFF(cosine_max_len), "0", FROM(0),
     .comment = "cosine (TRL's get_cosine_scaled_reward): the length that ends its schedule; 0 = "
                "max_completion_length."},
    {"cosine_min_value_wrong", K_FLOAT, GRPO, OFF(cosine_min_value_wrong), "-1.0", ANY,
     .comment = "cosine: a wrong completion's reward at length 0."},
    {"cosine_max_value_wrong", K_FLOAT, GRPO, OFF(cosine_max_value_wrong), "-0.5", ANY,
     .comment = "cosine: a wrong completion's reward at cosine_max_len."},
    {"cosine_min_value_correct", K_FLOAT, GRPO, OFF(cosine_min_value_correct), "0.5", ANY,
     .comment = "cosine: a correct completion's reward at cosine_max_len."},
    {"cosine_max_value_correct", K_FLOAT, GRPO, OFF(cosine_max_value_correct), "1.0", ANY,
     .comment = "cosine: a correct completion's reward at length 0."},
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
    {"tools", K_STR_LIST, GRPO, OFF(tools), "",
     .comment = "Built-in tools offered to every prompt that has no \"tools\" of its own: calculator "
                "(exact arithmetic). A rollout's tool calls run, their results join the conversation "
                "as tool messages, and generation goes on (the results get no loss)."},
    {"tool_url", K_STR, GRPO, OFF(tool_url), "",
     .comment = "The tool server for every tool that is not built in: POST {name, arguments, row} -> "
                "{content} (or {error}); a row's \"tools\" list declares them to the model."},
    {"tool_api_key_env", K_STR, GRPO, OFF(tool_api_key_env), "",
     .comment = "tool_url: the environment variable holding an API key (sent as a bearer key)."},
    {"tool_timeout", K_FLOAT, GRPO, OFF(tool_timeout), "30.0", ABOVE(0),
     .comment = "tool_url: seconds a call may take; a call that fails after its retries becomes the "
                "tool message's error text."},
    {"tool_connect_timeout", K_FLOAT, GRPO, OFF(tool_connect_timeout), "5.0", ABOVE(0),
     .comment = "tool_url: seconds to connect."},
    {"tool_retries", K_INT, GRPO, OFF(tool_retries), "2", IN(0, 100),
     .comment = "tool_url: attempts after the first, waiting tool_backoff seconds, doubling."},
    {"tool_backoff", K_FLOAT, GRPO, OFF(tool_backoff), "0.5", FROM(0),
     .comment = "tool_url: first wait between attempts."},
    {"tool_concurrency", K_INT, GRPO, OFF(tool_concurrency), "16", IN(1, 1024),
     .comment = "tool_url and env_url: requests in flight at once per rank (rollouts of other slots "
                "go on meanwhile)."},
    {"max_tool_calling_iterations", K_INT, GRPO, OFF(max_tool_calling_iterations), "-1", FROM(-1),
     .null_as = "-1", .comment = "Rounds of tool calls per completion at most (-1 or null: no limit "
                "but max_completion_length, which counts the tool results' tokens too)."},
    {"tool_call_format", K_ENUM, GRPO, OFF(tool_call_format), "auto", .choices = ct_tool_format_names,
     .comment = "How the model writes tool calls: hermes (<tool_call>{...}</tool_call>: Qwen2.5, "
                "Qwen3, Hermes), llama3_json (Llama 3.1/3.2's JSON), or auto (from the chat template; "
                "hermes, said on stderr, when it shows neither)."},
    {"env_url", K_STR, GRPO, OFF(env_url), "",
     .comment = "A multi-turn environment: each completion is an episode. POST env_url/reset {episode, row} "
                "-> {observation} (the first user message); each model turn is an action: POST "
                "env_url/step {episode, action} -> {observation, reward?, done}. The episode's reward "
                "(the sum of its steps') is the reward function env."},
    {"env_api_key_env", K_STR, GRPO, OFF(env_api_key_env), "",
     .comment = "env_url: the environment variable holding an API key (sent as a bearer key)."},
    {"env_timeout", K_FLOAT, GRPO, OFF(env_timeout), "30.0", ABOVE(0),
     .comment = "env_url: seconds a request may take. A step that fails after its retries ends its "
                "episode, unscored by env; a reset that fails stops the run."},
    {"env_connect_timeout", K_FLOAT, GRPO, OFF(env_connect_timeout), "5.0", ABOVE(0),
     .comment = "env_url: seconds to connect."},
    {"env_retries", K_INT, GRPO, OFF(env_retries), "2", IN(0, 100),
     .comment = "env_url: attempts after the first, waiting env_backoff seconds, doubling."},
    {"env_backoff", K_FLOAT, GRPO, OFF(env_backoff), "0.5", FROM(0),
     .comment = "env_url: first wait between attempts."},
    {"max_turns", K_INT, GRPO, OFF(max_turns), "0", FROM(0),
     .comment = "env_url: actions per episode at most (0: until the environment says done, or "
                "max_completion_length, which counts the observations' tokens too)."},
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
    {"decode_slots", K_INT, GRPO | SAMPLER, OFF(decode_slots), "0", IN(0, 4096),
     .comment = "Sequences decoded together (continuous batching). 0: GRPO decodes the rank's whole "
                "generation batch at once (per_device_train_batch_size x gradient_accumulation_steps "
                "completions), or as many as the memory plan holds beside the rest (it says which); the "
                "sampler 16."},
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
const int config_nkeys = (int)(sizeof config_keys / sizeof config_keys[0]);

const char *const config_trainer_names[NKINDS] = {"sft", "dpo", "grpo", "distill", "sampler", "reward"};
