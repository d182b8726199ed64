#!/bin/sh
# Gemma 3 (gemma3_text) end to end: a small one built from scratch (sliding layers with a
# window shorter than the rows) learns with SFT and is saved in Hugging Face's layout;
# LoRA adapters on it raise held-out accuracy and merge into a model that samples as base
# + adapter; DPO, GRPO, distillation and a reward model run on it; the sampler decodes the trained task
# in fp32, bf16 and int8 (a saved int8 model generates the same).
. tests/lib/common.sh
start_test gemma

tiny_sft 'logging_steps: 1'
gemma="model.model_type=gemma3_text model.sliding_window=6 model.sliding_window_pattern=2 model.head_dim=32"

echo "== SFT from scratch: loss falls, accuracy rises, HF layout"
"$BIN/sft" "$T/tiny.yml" $gemma output_dir="$T/base" max_steps=300 eval_on_start=true eval_steps=0 \
  save_steps=0 >"$T/base.log" 2>&1 || { cat "$T/base.log"; fail "training failed"; }
learned "$T/base" 0.5 0.3 "loss did not halve"
c="$T/base/config.json"
grep -q '"model_type": "gemma3_text"' "$c" && grep -q '"Gemma3ForCausalLM"' "$c" && grep -q '"sliding_window": 6' "$c" \
  && grep -q '"sliding_window_pattern": 2' "$c" && grep -q '"hidden_activation": "gelu_pytorch_tanh"' "$c" \
  || { cat "$c"; fail "config.json is not a gemma3_text one"; }
for n in model.layers.1.pre_feedforward_layernorm.weight model.layers.1.post_feedforward_layernorm.weight \
  model.layers.0.self_attn.q_norm.weight model.layers.0.post_attention_layernorm.weight; do
  grep -q "$n" "$T/base/model.safetensors" || fail "model.safetensors lacks $n"
done
! grep -q "lm_head.weight" "$T/base/model.safetensors" || fail "a tied Gemma saved lm_head.weight"

echo "== sampler: greedy decoding (windowed cache) agrees with the training forward's accuracy"
seq=$(grep eval_loss "$T/base/metrics.jsonl" | tail -1 | field eval_sequence_accuracy)
"$BIN/sampler" accuracy model_path="$T/base" data="$T/eval.jsonl" temperature=0 >"$T/a32.json" 2>"$T/a.log" \
  || { cat "$T/a.log"; fail "sampler accuracy"; }
em=$(sed 's/.*"exact_match": *\([0-9.]*\).*/\1/' "$T/a32.json")
echo "training eval sequence accuracy $seq, sampler exact match $em"
awk -v a="$seq" -v b="$em" 'BEGIN { d = a - b; exit !(d < 1e-6 && d > -1e-6) }' || fail "sampler and training forward disagree"
for q in bf16 int8; do
  "$BIN/sampler" accuracy model_path="$T/base" data="$T/eval.jsonl" temperature=0 quantization=$q >"$T/a$q.json" \
    2>"$T/a.log" || { cat "$T/a.log"; fail "sampler accuracy $q"; }
  eq=$(sed 's/.*"exact_match": *\([0-9.]*\).*/\1/' "$T/a$q.json")
  echo "$q exact match $eq"
  awk -v a="$em" -v b="$eq" 'BEGIN { exit !(b > a - 0.1) }' || fail "$q decoding loses accuracy ($eq vs $em)"
done
"$BIN/sampler" generate model_path="$T/base" prompt="reverse abcde:" temperature=0 max_new_tokens=12 quantization=int8 \
  save_quantized="$T/q8" output=json >"$T/q1.jsonl" 2>"$T/q.log" || { cat "$T/q.log"; fail "int8 generate"; }
"$BIN/sampler" generate model_path="$T/q8" prompt="reverse abcde:" temperature=0 max_new_tokens=12 output=json \
  >"$T/q2.jsonl" || fail "loading the int8 model"
cmp "$T/q1.jsonl" "$T/q2.jsonl" || fail "the saved int8 Gemma generates differently"

echo "== LoRA: adapters raise held-out accuracy; merged == base + adapter"
lora="use_peft=true lora_r=8 max_length=24 save_steps=0 logging_steps=1"
"$BIN/sft" configs/sft.yml model_path="$T/base" dataset_path="$T/train.jsonl" per_device_train_batch_size=32 \
  learning_rate=5e-3 $lora output_dir="$T/s" max_steps=150 eval_dataset_path="$T/eval.jsonl" eval_on_start=true \
  eval_steps=150 >"$T/s.log" 2>&1 || { cat "$T/s.log"; fail "sft lora"; }
a0=$(grep eval_loss "$T/s/metrics.jsonl" | head -1 | field eval_sequence_accuracy)
a1=$(grep eval_loss "$T/s/metrics.jsonl" | tail -1 | field eval_sequence_accuracy)
echo "held-out sequence accuracy: base $a0 -> adapters $a1"
awk -v a="$a0" -v b="$a1" 'BEGIN { exit !(b >= a + 0.04) }' || fail "the adapters did not raise accuracy"
grep -q 'base_model.model.model.layers.1.mlp.down_proj.lora_B.weight' "$T/s/adapter_model.safetensors" \
  || fail "tensor names are not PEFT's"
merge_matches_adapter "$T/base" "$T/s" "$T/eval.jsonl"
grep -q '"model_type": "gemma3_text"' "$T/merged/config.json" || fail "the merged model is not gemma3_text"

echo "== every trainer runs on it: full SFT continued, DPO, GRPO, distillation (LoRA)"
"$BIN/sft" configs/sft.yml model_path="$T/base" dataset_path="$T/train.jsonl" output_dir="$T/full" max_steps=5 \
  max_length=24 save_steps=0 per_device_train_batch_size=8 >"$T/full.log" 2>&1 || { cat "$T/full.log"; fail "full sft"; }
cmp -s "$T/base/config.json" "$T/full/config.json" || { diff "$T/base/config.json" "$T/full/config.json"; fail "config.json changed"; }
"$BIN/ctune-demo-data" reverse-prefs "$T/prefs.jsonl" "$T/prefs_eval.jsonl" 200 20 22 6 >/dev/null
"$BIN/dpo" configs/dpo.yml model_path="$T/base" dataset_path="$T/prefs.jsonl" output_dir="$T/d" max_steps=6 \
  per_device_train_batch_size=8 learning_rate=1e-3 $lora >"$T/d.log" 2>&1 || { cat "$T/d.log"; fail "dpo"; }
first=$(grep '"rewards/accuracies"' "$T/d/metrics.jsonl" | head -1 | field loss)
awk -v l="$first" 'BEGIN { d = l - log(2); exit !(d < 1e-6 && d > -1e-6) }' || fail "DPO's first loss $first is not log 2"
"$BIN/grpo" configs/grpo.yml model_path="$T/base" dataset_path="$T/eval.jsonl" answer_field=completion \
  per_device_train_batch_size=8 num_generations=4 max_completion_length=10 learning_rate=1e-3 output_dir="$T/g" \
  max_steps=3 reward_funcs=length length_target=2 beta=0.05 use_peft=true lora_r=8 save_steps=0 logging_steps=1 \
  >"$T/g.log" 2>&1 || { cat "$T/g.log"; fail "grpo"; }
kl0=$(head -1 "$T/g/metrics.jsonl" | field kl)
[ "$kl0" = "0.0" ] || fail "GRPO's first-step KL to the base is $kl0"
"$BIN/distill" configs/distill.yml teacher_path="$T/base" model_path="$T/base" dataset_path="$T/train.jsonl" \
  output_dir="$T/k" max_steps=3 per_device_train_batch_size=8 $lora >"$T/k.log" 2>&1 || { cat "$T/k.log"; fail "distill"; }
k0=$(head -1 "$T/k/metrics.jsonl" | field 'distill\/soft_loss')
echo "DPO first loss $first, GRPO first KL $kl0, distillation (student = teacher) first soft loss $k0"
awk -v k="$k0" 'BEGIN { exit !(k < 1e-4 && k > -1e-4) }' || fail "a student equal to its teacher has soft loss $k0"
# a reward model on the Gemma backbone (Gemma3ForSequenceClassification), scored back
"$BIN/reward" configs/reward.yml model_path="$T/base" dataset_path="$T/prefs.jsonl" output_dir="$T/rm" max_steps=6 \
  per_device_train_batch_size=8 save_steps=0 >"$T/rm.log" 2>&1 || { cat "$T/rm.log"; fail "reward"; }
grep -q '"Gemma3ForSequenceClassification"' "$T/rm/config.json" || { cat "$T/rm/config.json"; fail "not saved as Gemma3ForSequenceClassification"; }
"$BIN/reward" eval model_path="$T/rm" eval_dataset_path="$T/prefs_eval.jsonl" >"$T/rme.log" 2>&1 || { cat "$T/rme.log"; fail "reward eval"; }
echo "gemma e2e: ok"
