// config_types: the resolved configuration as one typed struct (ct_config), the trainer
// kinds, and the enums its keys hold with their names tables (defined beside the key table
// in config_keys.c). Callers include config.h, which includes this; the config_*.c files'
// shared header (config_internal.h) includes only this, so that no module includes itself.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum {
  CT_TRAINER_SFT = 1,
  CT_TRAINER_DPO = 2,
  CT_TRAINER_GRPO = 4,
  CT_TRAINER_DISTILL = 8,
  CT_TRAINER_SAMPLER = 16,  // bin/sampler: not a trainer, but configured the same way
  CT_TRAINER_REWARD = 32,   // bin/reward: a reward model from preference pairs
} ct_trainer_kind;
#define CT_TRAINER_ALL 47u  // mask: a key every trainer accepts (all but the sampler)

// Enum keys hold an index into their NULL-terminated names table. Each enum is declared
// once, ends in a _COUNT, and its table's definition is checked against it by a
// _Static_assert. lr_scheduler_type's and optimizer's enums are optim.h's (CT_LR_*, CT_OPT_*).
enum { CT_DTYPE_FLOAT32, CT_DTYPE_BFLOAT16, CT_DTYPE_COUNT };
// base_dtype: a LoRA base held as CT_STORE_* (model.h), or auto (ct_base_dtype_names' last):
// bfloat16 when the matmuls run in bf16, else float32 (the trainer resolves it: ct_train.base_dtype)
#define CT_BASE_AUTO 3
extern const char *const ct_base_dtype_names[];
extern const char *const ct_save_dtype_names[];
// bf16: matmuls of the trained model in bfloat16 (oneDNN) or float32 (OpenBLAS)
enum { CT_BF16_FALSE, CT_BF16_TRUE, CT_BF16_AUTO, CT_BF16_COUNT };
extern const char *const ct_bf16_names[];
// gradient_checkpointing: false keeps every layer's activations; true recomputes unless the
// memory plan holds them all anyway; always recomputes.
enum { CT_GC_FALSE, CT_GC_TRUE, CT_GC_ALWAYS, CT_GC_COUNT };
extern const char *const ct_gc_names[];
enum { CT_MODEL_LLAMA, CT_MODEL_QWEN2, CT_MODEL_QWEN3, CT_MODEL_MISTRAL, CT_MODEL_GEMMA3, CT_MODEL_COUNT };
extern const char *const ct_model_type_names[];
enum { CT_OUTPUT_TEXT, CT_OUTPUT_JSON, CT_OUTPUT_COUNT };
extern const char *const ct_output_names[];
enum { CT_QUANT_NONE, CT_QUANT_INT8, CT_QUANT_BF16, CT_QUANT_COUNT };
extern const char *const ct_quantization_names[];
enum { CT_SPEC_NONE, CT_SPEC_MTP, CT_SPEC_COUNT };  // the sampler's speculative decoding
extern const char *const ct_speculative_names[];
enum { CT_TRUNCATE_ERROR, CT_TRUNCATE_LEFT, CT_TRUNCATE_COUNT };
extern const char *const ct_truncate_names[];
enum { CT_SCALE_GROUP, CT_SCALE_BATCH, CT_SCALE_NONE, CT_SCALE_COUNT };
extern const char *const ct_scale_rewards_names[];
enum { CT_IS_TOKEN, CT_IS_SEQUENCE, CT_IS_COUNT };
extern const char *const ct_is_level_names[];
enum { CT_MOA_SUM_THEN_NORMALIZE, CT_MOA_NORMALIZE_THEN_SUM, CT_MOA_COUNT };
extern const char *const ct_moa_names[];
enum { CT_ISC_TOKEN_TRUNCATE, CT_ISC_TOKEN_MASK, CT_ISC_SEQUENCE_TRUNCATE, CT_ISC_SEQUENCE_MASK, CT_ISC_COUNT };
extern const char *const ct_is_mode_names[];
// advantage_estimator (grpo/advantage.h has the formulas; OpenRLHF's names).
enum { CT_ADV_GROUP_NORM, CT_ADV_RLOO, CT_ADV_REINFORCE_BASELINE, CT_ADV_COUNT };
extern const char *const ct_advantage_estimator_names[];
enum { CT_REWARD_FAIL_ERROR, CT_REWARD_FAIL_NAN, CT_REWARD_FAIL_COUNT };
extern const char *const ct_reward_failure_names[];
// tool_call_format: how a model's turn writes tool calls (text/toolcall.h), auto = from the
// chat template
enum { CT_TOOLFMT_AUTO, CT_TOOLFMT_HERMES, CT_TOOLFMT_LLAMA3_JSON, CT_TOOLFMT_COUNT };
extern const char *const ct_tool_format_names[];
// The built-in reward functions (grpo/reward.c implements them).
enum {
  CT_REWARD_ACCURACY, CT_REWARD_FORMAT, CT_REWARD_LENGTH, CT_REWARD_OVERLONG, CT_REWARD_THINK_FORMAT,
  CT_REWARD_REPETITION, CT_REWARD_COSINE, CT_REWARD_REMOTE, CT_REWARD_ENV, CT_REWARD_COUNT
};
extern const char *const ct_reward_func_names[];
// lora_target_modules items (lora.h's names, and all-linear), lora_modules_to_save items.
extern const char *const ct_lora_module_names[];
extern const char *const ct_lora_save_names[];
// loss_type accepts the union of DPO's losses (dpo/loss.h) and GRPO's aggregations
// (grpo/advantage.h); each trainer checks its own list, and a test keeps the union equal
// to the two lists.
extern const char *const ct_loss_type_names[];
extern const char *const ct_dpo_loss_choices[], *const ct_grpo_loss_choices[];  // loss_type by trainer

// List values: `n` items, owned by the config.
typedef struct {
  char **v;
  int n;
} ct_str_list;
typedef struct {
  double *v;
  int n;
} ct_float_list;

// The `model:` block: a Hugging Face config.json, used when model_path is empty.
// Fields keep the config.json names. All fields before set_mask must be 4 or 8 bytes
// wide: each field's bit in set_mask is its offset / 4.
typedef struct {
  int model_type;  // CT_MODEL_*
  int tie_word_embeddings;
  int attention_bias;  // q/k/v projections have biases (Qwen2)
  int use_qk_norm;     // per-head RMSNorm on q and k before RoPE (Qwen3)
  int64_t vocab_size;  // 0 = the tokenizer's size
  int64_t hidden_size;
  int64_t intermediate_size;
  int64_t num_hidden_layers;
  int64_t num_attention_heads;
  int64_t num_key_value_heads;  // 0 = num_attention_heads
  int64_t head_dim;             // 0 = hidden_size / num_attention_heads
  int64_t max_position_embeddings;
  double rope_theta;
  double rms_norm_eps;
  double initializer_range;
  int64_t sliding_window;          // gemma3_text: sliding layers' window (0 = every layer full)
  int64_t sliding_window_pattern;  // gemma3_text: layer l is full when (l + 1) % pattern == 0
  // Which keys the user set (in a yml or on the command line), so that the model
  // module can tell "left at the default" from "chosen": model_type qwen2 implies
  // attention_bias unless attention_bias was set. Test with CT_MODEL_SPEC_IS_SET.
  uint64_t set_mask;
} ct_model_spec;

_Static_assert(offsetof(ct_model_spec, set_mask) <= 64 * 4, "ct_model_spec: set_mask has 64 bits");
#define CT_MODEL_SPEC_BIT(field) (UINT64_C(1) << (offsetof(ct_model_spec, field) / 4))
#define CT_MODEL_SPEC_IS_SET(spec, field) (((spec)->set_mask & CT_MODEL_SPEC_BIT(field)) != 0)

// The resolved configuration. Field names are the yml key names (TRL / Hugging Face
// TrainingArguments names); see configs/base.yml for what each means. Integers are
// int64_t, floats double, bools and enums int, strings never NULL ("" when unset).
typedef struct {
  ct_trainer_kind trainer;

  // paths
  char *model_path;
  char *tokenizer_path;
  char *dataset_path;
  char *eval_dataset_path;
  char *output_dir;
  char *run_name;  // recorded in config.yml
  char *resume_from_checkpoint;  // "" = fresh, "latest" = newest checkpoint-* in output_dir

  // schedule and batch
  int64_t seed;
  int64_t max_steps;  // -1 = derive from num_train_epochs
  double num_train_epochs;
  int64_t per_device_train_batch_size;
  int64_t per_device_eval_batch_size;
  int64_t gradient_accumulation_steps;

  // optimizer
  int optimizer;  // CT_OPT_*
  double muon_momentum;
  double learning_rate;
  int lr_scheduler_type;  // CT_LR_*
  int64_t warmup_steps;
  double warmup_ratio;
  double weight_decay;
  double adam_beta1;
  double adam_beta2;
  double adam_epsilon;
  double max_grad_norm;  // 0 = no clipping
  double qk_clip_threshold;  // QK-Clip's tau; 0 = off

  // data
  int64_t max_length;
  int packing;
  int completion_only_loss;
  int assistant_only_loss;
  char *dataset_text_field;
  int shuffle_dataset;
  int skip_bad_rows;

  // logging and checkpoints
  int64_t logging_steps;
  int logging_first_step;
  int log_completions;
  int64_t num_completions_to_print;
  int64_t save_steps;        // 0 = no checkpoints (the final model is saved anyway)
  int64_t save_total_limit;  // 0 = keep all
  int64_t eval_steps;        // 0 = only at the end
  int eval_on_start;         // also evaluate before the first step
  int save_dtype;            // CT_DTYPE_*

  // loss and compute
  int64_t num_vocab_tiling;
  double z_loss_multiplier;
  int64_t mtp_num_layers;          // multi-token prediction depths D (0 = off)
  double mtp_loss_scaling_factor;  // λ: the loss adds λ · mean_k CE_k
  int64_t num_threads;  // 0 = all cores, divided among local MPI ranks
  int gradient_checkpointing;  // CT_GC_*
  int bf16;                  // CT_BF16_*
  int dry_run;

  // across ranks (MPI)
  int optimizer_sharding;        // ZeRO-1: each rank holds 1/N of the AdamW moments
  int64_t diloco_inner_steps;    // DiLoCo's H: local steps between syncs (0 = off)
  double ddp_bucket_cap_mb;      // overlapped gradient sum's bucket size (0 = blocking sum)
  double diloco_outer_lr;
  double diloco_outer_momentum;  // Nesterov

  // LoRA
  int use_peft;
  int64_t lora_r;
  double lora_alpha;
  double lora_dropout;
  ct_str_list lora_target_modules;
  int use_rslora;
  ct_str_list lora_modules_to_save;
  char *adapter_path;
  int base_dtype;  // CT_STORE_* (model.h) or CT_BASE_AUTO

  // distillation
  char *teacher_path;
  int teacher_dtype;  // CT_STORE_* (model.h)
  char *teacher_logits_path;
  int64_t distill_top_k;
  double distill_alpha;
  double lmbda;
  int seq_kd;

  // reward model (bin/reward) and GRPO's reward models
  double center_rewards_coefficient;  // 0 = off
  int reward_model_dtype;             // CT_STORE_* (model.h): GRPO's reward models

  // GRPO
  int64_t num_generations;
  int64_t num_iterations;
  double epsilon;
  double epsilon_high;
  int scale_rewards;  // CT_SCALE_*
  double delta;                      // 0 = off
  int importance_sampling_level;     // CT_IS_*
  double sapo_temperature_pos, sapo_temperature_neg;
  double vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg;
  int use_bias_correction_kl;
  double off_policy_mask_threshold;  // 0 = off
  double top_entropy_quantile;       // 1 = every token
  int vllm_importance_sampling_correction;
  int vllm_importance_sampling_mode;  // CT_ISC_*
  double vllm_importance_sampling_clip_max, vllm_importance_sampling_clip_min;
  int advantage_estimator;  // CT_ADV_*
  int multi_objective_aggregation;  // CT_MOA_*
  int normalize_advantages;
  int mask_truncated_completions;
  int share_prompts;
  int filter_groups;
  int64_t max_num_gen_batches;
  ct_str_list reward_funcs;
  ct_float_list reward_weights;
  char *answer_field;
  char *answer_regex;
  int answer_numeric;
  int answer_math;
  char *format_regex;
  int64_t length_target;
  int64_t overlong_buffer_len;
  int64_t repetition_ngram_size;
  double repetition_max_penalty;
  int64_t cosine_max_len;
  double cosine_min_value_wrong, cosine_max_value_wrong, cosine_min_value_correct, cosine_max_value_correct;
  char *chat_template_path;
  char *reward_url;
  char *reward_api_key_env;
  double reward_timeout;
  double reward_connect_timeout;
  int64_t reward_retries;
  double reward_backoff;
  int reward_failure;  // CT_REWARD_FAIL_*
  int64_t reward_batch;
  ct_str_list tools;              // built-in tools offered to every prompt (calculator)
  char *tool_url;                 // the tool server: POST {name, arguments, row} -> {content}
  char *tool_api_key_env;
  double tool_timeout;
  double tool_connect_timeout;
  int64_t tool_retries;
  double tool_backoff;
  int64_t tool_concurrency;       // tool server requests in flight at once, per rank
  int64_t max_tool_calling_iterations;  // -1: no limit (TRL's None)
  int tool_call_format;           // CT_TOOLFMT_*
  char *env_url;                  // the environment server: POST /reset, /step
  char *env_api_key_env;
  double env_timeout;
  double env_connect_timeout;
  int64_t env_retries;
  double env_backoff;
  int64_t max_turns;              // environment steps per episode at most (0: no limit)

  // sampling (GRPO and bin/sampler)
  double temperature;
  int64_t top_k;
  double top_p;
  double min_p;
  double repetition_penalty;

  // bin/sampler
  char *prompt;
  char *prompts_path;
  char *data;
  int64_t n;
  int64_t max_new_tokens;
  ct_str_list stop;
  int output;             // CT_OUTPUT_*
  int add_generation_prompt;
  int quantization;       // CT_QUANT_*
  char *save_quantized;
  int64_t decode_slots;
  int64_t max_prefill_length;
  int64_t max_target_length;
  int truncate_prompt;    // CT_TRUNCATE_*
  int speculative;        // CT_SPEC_*

  // DPO and GRPO
  double beta;
  int64_t max_prompt_length;
  int64_t max_completion_length;
  char *ref_model_path;
  int ref_dtype;  // CT_STORE_* (model.h)
  int sync_ref_model;
  double ref_model_mixup_alpha;
  int64_t ref_model_sync_steps;

  // DPO
  ct_str_list loss_type;       // items from ct_dpo_loss_type_names, summed
  ct_float_list loss_weights;  // empty = 1 for each loss_type
  double label_smoothing;
  double simpo_gamma;
  double discopop_tau;
  double desirable_weight, undesirable_weight;
  double alpha;  // AlphaPO's reward shape (the cpo losses)
  double cpo_alpha;
  int precompute_ref_log_probs;

  ct_model_spec model;

  char **origin_;  // private: per table row, NULL = default; use ct_config_origin()
  char *ignored_;  // private: use ct_config_ignored()
} ct_config;
