#!/bin/sh
# Reward models, from one run on the SmolLM-135M shape (hidden 576, 30 layers, 9/3 heads,
# intermediate 1536, vocabulary 49,152, tied: 134.5M parameters; the Llama-2 tokenizer;
# initialized from scratch):
#   - one GRPO step (LoRA r 16 policy, 4 prompts x 8 completions x 48 new tokens) scored by
#     a reward model of the same shape (float32), its time split into rollouts /
#     reward-model scoring / training (the target: scoring <= 15% of the step);
#   - bin/reward's training tokens/s next to bin/sft's on the same shape and the same
#     sequences: reward step k trains on pair k (prompt + chosen, prompt + rejected, ~110
#     tokens each), SFT step k on the same two texts as rows (full fine-tuning both).
# usage: scripts/bench-reward.sh BIN_DIR   (~3 minutes on 2 busy cores)
set -eu
BIN=${1:-bin}
. scripts/bench-lib.sh

smol="tokenizer_path=$NPM/tokenizer-llama2/models model.model_type=llama model.vocab_size=49152
      model.hidden_size=576 model.intermediate_size=1536 model.num_hidden_layers=30
      model.num_attention_heads=9 model.num_key_value_heads=3 model.tie_word_embeddings=true"
awk 'BEGIN { srand(5); for (r = 0; r < 8; r++) { p = ""; c = ""; j = "";
  for (i = 0; i < 12; i++) p = p sprintf(" w%d", int(rand() * 5000));
  for (i = 0; i < 10; i++) { c = c sprintf(" a%d", int(rand() * 5000)); j = j sprintf(" b%d", int(rand() * 5000)) }
  printf("{\"prompt\":\"%s\",\"chosen\":\"%s\",\"rejected\":\"%s\"}\n", p, c, j) } }' >"$T/pairs.jsonl"
awk -F'"' '{ printf "{\"text\":\"%s%s\"}\n{\"text\":\"%s%s\"}\n", $4, $8, $4, $12 }' "$T/pairs.jsonl" >"$T/texts.jsonl"
"$BIN/ctune-demo-data" reverse "$T/w.jsonl" "$T/prompts.jsonl" 16 4 5 8 >/dev/null

# the policy: its seeded initialization, saved by one step at learning rate 0
run_ok init "$BIN/sft" configs/sft.yml dataset_path="$T/sft.jsonl" output_dir="$T/s" max_steps=1 learning_rate=0 \
  per_device_train_batch_size=1 max_length=64 save_steps=0 $smol
steps="max_length=512 max_steps=4 logging_steps=1 save_steps=0 shuffle_dataset=false"
run_ok rm "$BIN/reward" configs/reward.yml model_path="$T/s" dataset_path="$T/pairs.jsonl" output_dir="$T/rm" \
  per_device_train_batch_size=1 $steps
run_ok sft "$BIN/sft" configs/sft.yml model_path="$T/s" dataset_path="$T/texts.jsonl" output_dir="$T/x" \
  per_device_train_batch_size=2 packing=false completion_only_loss=false $steps
run_ok grpo "$BIN/grpo" configs/grpo.yml model_path="$T/s" dataset_path="$T/prompts.jsonl" output_dir="$T/g" \
  max_steps=1 use_peft=true lora_r=16 lora_alpha=32 num_generations=8 per_device_train_batch_size=8 \
  gradient_accumulation_steps=4 max_completion_length=48 decode_slots=32 reward_funcs="$T/rm" logging_steps=1 \
  save_steps=0

m="$T/g/metrics.jsonl"
gen=$(metric time/generation_s "$m") score=$(metric time/scoring_s "$m") train=$(metric time/training_s "$m")
len=$(metric completions/mean_length "$m")
echo "OpenBLAS kernel: ${OPENBLAS_CORETYPE:-chosen by ctune for this CPU}"
echo "GRPO step, SmolLM-135M shape, LoRA r 16 policy + a same-shape reward model, 4 prompts x 8 completions (mean length $len tokens):"
awk -v g="$gen" -v s="$score" -v t="$train" 'BEGIN { w = g + s + t
  printf "  rollouts %.1f s + reward-model scoring %.1f s + training %.1f s: scoring %.1f%% of the step (target <= 15%%)\n",
         g, s, t, 100 * s / w }'
rt=$(toks rm) st=$(toks sft) n=$(sed -n 's/.*pairs.jsonl: 8 pairs, \([0-9]*\) tokens.*/\1/p' "$T/rm.log")
awk -v r="$rt" -v s="$st" -v n="$n" 'BEGIN {
  printf "training tokens/s (mean after step 1), same sequences (1 pair = 2 rows, %.0f tokens a row): bin/reward %.0f, bin/sft %.0f: ratio %.2f\n",
         n / 16, r, s, r / s }'
