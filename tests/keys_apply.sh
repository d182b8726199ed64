#!/bin/sh
# Every key a trainer accepts does something there (the audit of base.yml): keys that
# would be silently ignored are refused before any work, naming the key and why.
. tests/lib/common.sh
start_test keys_apply

printf '{"prompt": "a", "completion": "b"}\n' >"$T/d.jsonl"
G="$BIN/grpo configs/grpo.yml model_path=$T/none dataset_path=$T/d.jsonl output_dir=$T/o answer_field=completion"
D="$BIN/distill configs/distill.yml teacher_path=$T/none dataset_path=$T/d.jsonl output_dir=$T/o"

echo "== keys a trainer does not use are not its keys"
for k in max_length=64 packing=true per_device_eval_batch_size=4 z_loss_multiplier=0.1; do
  expect 2 "key '${k%%=*}' does not apply to grpo" $G "$k"
done
expect 2 "key 'z_loss_multiplier' does not apply to dpo" "$BIN/dpo" configs/dpo.yml z_loss_multiplier=0.1
expect 2 "key 'z_loss_multiplier' does not apply to distill" $D z_loss_multiplier=0.1
expect 2 "key 'decode_slots' does not apply to distill" $D decode_slots=8

echo "== keys that only act with another key's value"
for k in ref_model_path=$T/none ref_dtype=int8 sync_ref_model=true ref_model_mixup_alpha=0.5 ref_model_sync_steps=4; do
  expect 2 "key '${k%%=*}': GRPO loads a reference only for the KL term, and beta is 0" $G "$k"
done
for k in vespo_k_pos=1 vespo_lambda_neg=1; do
  expect 2 "key '${k%%=*}': vespo's weighting takes it, and loss_type is dapo" $G "$k"
done
expect 2 "key 'vllm_importance_sampling_mode': vespo folds a token_ correction into its weight" $G loss_type=vespo \
  vllm_importance_sampling_correction=true vllm_importance_sampling_mode=sequence_mask
for k in sapo_temperature_pos=2 sapo_temperature_neg=2; do
  expect 2 "key '${k%%=*}': sapo's gate takes it, and loss_type is dapo" $G "$k"
done
expect 2 "key 'delta': caps the clipped surrogate's ratio (loss_type grpo, bnpo, dr_grpo, dapo), and loss_type is cispo" \
  $G delta=1.5 loss_type=cispo
expect 2 "key 'use_bias_correction_kl': scales the KL term, and beta is 0" $G use_bias_correction_kl=true
for k in vllm_importance_sampling_mode=token_mask vllm_importance_sampling_clip_max=2 vllm_importance_sampling_cap=2; do
  expect 2 "key 'vllm_importance_sampling_[a-z_]*': shapes the sampler correction, and vllm_importance_sampling_correction is false" $G "$k"
done
expect 2 "key 'vllm_importance_sampling_clip_min': 2 is above vllm_importance_sampling_clip_max 1.5" $G \
  vllm_importance_sampling_correction=true vllm_importance_sampling_clip_min=2 vllm_importance_sampling_clip_max=1.5
for k in seq_kd=true log_completions=true num_completions_to_print=2 max_new_tokens=16; do
  expect 2 "key '${k%%=*}' acts on generated batches, and lmbda is 0" $D "$k"
done
expect 2 "key 'temperature': distillation divides logits by it" $D temperature=0
echo "keys apply: all checks passed"
