#!/bin/sh
# LoRA (use_peft) end to end, every trainer: SFT adapters improve held-out accuracy and
# save as a PEFT directory; resume is bit-identical; merge-lora gives a model that
# samples exactly as base + adapter_path; DPO starts at log 2 with the base as reference
# and its reward accuracy rises; GRPO's first KL to the base is 0 and its reward rises;
# distillation trains a student's adapters; modules_to_save trains the head; a bf16 or
# int8 base gives nearly the float32 losses; bad adapters and keys fail before any work.
. tests/lib/common.sh
start_test lora

reverse_sft "$T/sft.jsonl" "$T/eval.jsonl" 50 21 6 "$T/base" 200 128 384
lora="use_peft=true lora_r=8 max_length=24 save_steps=0 logging_steps=1"

echo "== SFT: adapters on the frozen base raise held-out accuracy"
sft="configs/sft.yml model_path=$T/base dataset_path=$T/sft.jsonl per_device_train_batch_size=32 learning_rate=2e-3 $lora"
"$BIN/sft" $sft output_dir="$T/s" max_steps=80 eval_dataset_path="$T/eval.jsonl" eval_on_start=true \
  eval_steps=80 >"$T/s.log" 2>&1 || { cat "$T/s.log"; fail "sft lora"; }
a0=$(grep eval_loss "$T/s/metrics.jsonl" | head -1 | field eval_sequence_accuracy)
a1=$(grep eval_loss "$T/s/metrics.jsonl" | tail -1 | field eval_sequence_accuracy)
echo "held-out sequence accuracy: base $a0 -> adapters $a1"
awk -v a="$a0" -v b="$a1" 'BEGIN { exit !(b >= a + 0.04) }' || fail "the adapters did not raise accuracy"
for f in adapter_config.json adapter_model.safetensors tokenizer.json; do [ -s "$T/s/$f" ] || fail "no $f"; done
[ ! -e "$T/s/model.safetensors" ] || fail "a LoRA run wrote a full model"
grep -q '"peft_type": "LORA"' "$T/s/adapter_config.json" || fail "adapter_config.json is not PEFT's"
grep -q 'base_model.model.model.layers.1.mlp.down_proj.lora_B.weight' "$T/s/adapter_model.safetensors" \
  || fail "tensor names are not PEFT's"

echo "== resume: 30 steps straight == 12, stop, resume (dropout masks included)"
"$BIN/sft" $sft output_dir="$T/r1" max_steps=30 save_steps=12 >"$T/r1.log" 2>&1 || { cat "$T/r1.log"; fail "straight"; }
CT_STOP_AFTER_STEP=12 "$BIN/sft" $sft output_dir="$T/r2" max_steps=30 save_steps=12 >"$T/r2.log" 2>&1 && fail "no stop"
[ -s "$T/r2/checkpoint-12/adapter_model.safetensors" ] || fail "the checkpoint holds no adapters"
"$BIN/sft" $sft output_dir="$T/r2" max_steps=30 save_steps=12 resume_from_checkpoint=latest >"$T/r3.log" 2>&1 \
  || { cat "$T/r3.log"; fail "resume"; }
cmp -s "$T/r1/adapter_model.safetensors" "$T/r2/adapter_model.safetensors" || fail "resumed adapters differ"

echo "== merge-lora: the merged model samples exactly as base + adapter_path"
merge_matches_adapter "$T/base" "$T/s" "$T/eval.jsonl"

echo "== DPO: the base (adapters off) is the reference; reward accuracy rises"
"$BIN/ctune-demo-data" reverse-prefs "$T/prefs.jsonl" "$T/prefs_eval.jsonl" 800 100 22 6
"$BIN/dpo" configs/dpo.yml model_path="$T/base" dataset_path="$T/prefs.jsonl" output_dir="$T/d" max_steps=40 \
  per_device_train_batch_size=8 learning_rate=1e-3 lr_scheduler_type=constant eval_dataset_path="$T/prefs_eval.jsonl" \
  eval_on_start=true $lora >"$T/d.log" 2>&1 || { cat "$T/d.log"; fail "dpo lora"; }
grep -q "reference: the base, adapters off" "$T/d.log" && ! grep -q "reference model (" "$T/d.log" ||
  fail "a reference copy was planned"
first=$(grep '"rewards/accuracies"' "$T/d/metrics.jsonl" | grep -v eval_ | head -1 | field loss)
acc=$(grep eval_loss "$T/d/metrics.jsonl" | tail -1 | field 'eval_rewards\/accuracies')
echo "first loss $first; held-out reward accuracy 0 -> $acc"
awk -v l="$first" 'BEGIN { d = l - log(2); exit !(d < 1e-6 && d > -1e-6) }' || fail "first loss $first is not log 2"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.6) }' || fail "reward accuracy did not rise"

echo "== GRPO: KL to the base starts at 0; the reward rises"
"$BIN/grpo" configs/grpo.yml model_path="$T/base" dataset_path="$T/eval.jsonl" answer_field=completion \
  per_device_train_batch_size=32 num_generations=8 max_completion_length=10 learning_rate=1e-3 output_dir="$T/g" \
  max_steps=20 reward_funcs=length length_target=2 beta=0.05 $(echo $lora | sed "s/max_length=24 //") >"$T/g.log" 2>&1 || { cat "$T/g.log"; fail "grpo lora"; }
kl0=$(head -1 "$T/g/metrics.jsonl" | field kl)
r0=$(head -3 "$T/g/metrics.jsonl" | field reward | awk '{s+=$1} END {print s/NR}')
r1=$(tail -3 "$T/g/metrics.jsonl" | field reward | awk '{s+=$1} END {print s/NR}')
echo "first KL $kl0; reward $r0 -> $r1"
[ "$kl0" = "0.0" ] || fail "first-step KL is $kl0"
awk -v a="$r0" -v b="$r1" 'BEGIN { exit !(b > a + 0.3) }' || fail "the reward did not rise"

echo "== GRPO on a base stored in bfloat16: the sampler serves it packed, the reward rises"
"$BIN/grpo" configs/grpo.yml model_path="$T/base" dataset_path="$T/eval.jsonl" answer_field=completion \
  per_device_train_batch_size=32 num_generations=8 max_completion_length=10 learning_rate=1e-3 output_dir="$T/gb" \
  max_steps=20 reward_funcs=length length_target=2 base_dtype=bfloat16 $(echo $lora | sed "s/max_length=24 //") \
  >"$T/gb.log" 2>&1 || { cat "$T/gb.log"; fail "grpo lora on a bfloat16 base"; }
r0=$(head -3 "$T/gb/metrics.jsonl" | field reward | awk '{s+=$1} END {print s/NR}')
r1=$(tail -3 "$T/gb/metrics.jsonl" | field reward | awk '{s+=$1} END {print s/NR}')
echo "bfloat16 base: reward $r0 -> $r1"
awk -v a="$r0" -v b="$r1" 'BEGIN { exit !(b > a + 0.3) }' || fail "the reward did not rise on a bfloat16 base"

echo "== distillation: a weaker student's adapters learn from the teacher"
small_sft "$T/sft.jsonl" "$T/student" 40 128 384
"$BIN/distill" configs/distill.yml teacher_path="$T/base" model_path="$T/student" dataset_path="$T/sft.jsonl" \
  output_dir="$T/k" max_steps=100 per_device_train_batch_size=32 learning_rate=5e-3 $lora >"$T/k.log" 2>&1 \
  || { cat "$T/k.log"; fail "distill lora"; }
k0=$(head -3 "$T/k/metrics.jsonl" | field 'distill\/soft_loss' | awk '{s+=$1} END {print s/NR}')
k1=$(tail -3 "$T/k/metrics.jsonl" | field 'distill\/soft_loss' | awk '{s+=$1} END {print s/NR}')
echo "soft loss $k0 -> $k1"
awk -v a="$k0" -v b="$k1" 'BEGIN { exit !(b < 0.85 * a) }' || fail "the soft loss did not fall"

echo "== modules_to_save: an untied model's head trains with the adapters and is saved"
"$BIN/sft" configs/sft.yml dataset_path="$T/sft.jsonl" output_dir="$T/u" max_steps=40 model.hidden_size=64 \
  model.intermediate_size=128 model.num_hidden_layers=2 model.num_attention_heads=4 model.num_key_value_heads=2 \
  model.tie_word_embeddings=false max_length=24 per_device_train_batch_size=32 learning_rate=2e-3 save_steps=0 \
  >"$T/u.log" 2>&1 || { cat "$T/u.log"; fail "untied base"; }
"$BIN/sft" configs/sft.yml model_path="$T/u" dataset_path="$T/sft.jsonl" output_dir="$T/h" max_steps=20 \
  per_device_train_batch_size=32 learning_rate=2e-3 lora_modules_to_save=lm_head lora_target_modules=q_proj \
  $lora >"$T/h.log" 2>&1 || { cat "$T/h.log"; fail "modules_to_save"; }
grep -q 'base_model.model.lm_head.weight' "$T/h/adapter_model.safetensors" || fail "the head is not saved"
grep -q '"lm_head"' "$T/h/adapter_config.json" || fail "modules_to_save not in adapter_config.json"
"$BIN/ctune-ckpt" merge-lora base="$T/u" adapter="$T/h" out="$T/hm" >/dev/null 2>&1 || fail "merge with a head"
"$BIN/sft" configs/sft.yml model_path="$T/u" dataset_path="$T/sft.jsonl" output_dir="$T/h0" max_steps=20 \
  per_device_train_batch_size=32 learning_rate=2e-3 lora_target_modules=q_proj $lora >"$T/h0.log" 2>&1 || fail "q only"
l_head=$(tail -1 "$T/h/metrics.jsonl" | field loss) l_q=$(tail -1 "$T/h0/metrics.jsonl" | field loss)
echo "loss after 20 steps: q_proj adapters + trained head $l_head, q_proj adapters only $l_q"
awk -v a="$l_head" -v b="$l_q" 'BEGIN { exit !(a < b) }' || fail "training the head changed nothing"

echo "== a bfloat16 or int8 base gives the float32 base's losses up to its rounding"
for q in bfloat16 int8; do
  "$BIN/sft" $sft output_dir="$T/$q" max_steps=3 base_dtype=$q >"$T/$q.log" 2>&1 || { cat "$T/$q.log"; fail "$q base"; }
  b=$(head -1 "$T/$q/metrics.jsonl" | field loss) f=$(head -1 "$T/r1/metrics.jsonl" | field loss)
  echo "step-1 loss: $q base $b, float32 base $f"
  awk -v a="$b" -v b="$f" 'BEGIN { d = (a - b) / b; exit !(a != b && d < 0.02 && d > -0.02) }' \
    || fail "$q base loss $b is not within 2% of $f (or equal: not narrowed)"
done

echo "== bad adapters and keys fail before any work"
expect 2 "key 'lora_r'" "$BIN/sft" $sft output_dir="$T/x" lora_r=0
expect 2 "'qq_proj' is not one of" "$BIN/sft" $sft output_dir="$T/x" lora_target_modules=qq_proj
expect 2 "key 'base_dtype' needs use_peft" "$BIN/sft" configs/sft.yml model_path="$T/base" dataset_path="$T/sft.jsonl" \
  output_dir="$T/x" base_dtype=bfloat16
expect 2 "tied embeddings" "$BIN/sft" $sft output_dir="$T/x" lora_modules_to_save=lm_head
expect 2 "not int8" "$BIN/grpo" configs/grpo.yml model_path="$T/base" dataset_path="$T/eval.jsonl" \
  output_dir="$T/x" base_dtype=int8 $(echo $lora | sed "s/max_length=24 //")
expect 2 "reference is the base model itself" "$BIN/dpo" configs/dpo.yml model_path="$T/base" \
  dataset_path="$T/prefs.jsonl" output_dir="$T/x" use_peft=true ref_model_path="$T/base"
expect 1 "but this base model needs \[8, 64\]" "$BIN/sft" configs/sft.yml model_path="$T/u" dataset_path="$T/sft.jsonl" \
  output_dir="$T/x" use_peft=true adapter_path="$T/s"
expect 2 "key 'lora_r' differs from the adapter in $T/s, whose adapter_config.json decides (r 8" \
  "$BIN/sft" $sft output_dir="$T/x" adapter_path="$T/s" lora_r=4
expect 2 "key 'save_dtype': with use_peft the adapters are saved in float32" "$BIN/sft" $sft output_dir="$T/x" \
  save_dtype=bfloat16
mkdir -p "$T/ia3"
echo '{"peft_type": "IA3", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}' >"$T/ia3/adapter_config.json"
expect 1 "'peft_type' is IA3, not LORA" "$BIN/sft" $sft output_dir="$T/x" adapter_path="$T/ia3"
echo "lora end-to-end: all checks passed"
