#!/bin/sh
# LoRA (r 16, all linear layers) against full fine-tuning, from one run: peak resident
# memory next to each run's plan, and training tokens/s (mean after step 1), for the SmolLM-135M
# and Qwen2.5-0.5B shapes at batch 1 x 1024 tokens; DPO with LoRA (one pair: 2 rows of up
# to 512 tokens, no reference model) next to SFT with LoRA at 1 x 512.
# usage: scripts/bench-lora.sh BIN_DIR   (~5 minutes on 2 cores)
set -eu
BIN=${1:-bin}
. scripts/bench-lib.sh

smol="tokenizer_path=$NPM/tokenizer-qwen3/models model.model_type=llama model.vocab_size=151936
      model.hidden_size=576 model.intermediate_size=1536 model.num_hidden_layers=30
      model.num_attention_heads=9 model.num_key_value_heads=3"
lora="use_peft=true lora_r=16 lora_alpha=32"
long="max_length=1024 max_steps=4"
run s_init "$BIN/sft" $sft_args $smol output_dir="$T/s" max_steps=1 learning_rate=0
run s_full "$BIN/sft" $sft_args $smol model_path="$T/s" output_dir="$T/x" $long
run s_lora "$BIN/sft" $sft_args $smol model_path="$T/s" output_dir="$T/x" $long $lora
run q_init "$BIN/sft" $sft_args $qwen output_dir="$T/q" max_steps=1 learning_rate=0
run q_full "$BIN/sft" $sft_args $qwen model_path="$T/q" output_dir="$T/x" $long
run q_lora "$BIN/sft" $sft_args $qwen model_path="$T/q" output_dir="$T/x" $long $lora
run q_lora_bf16 "$BIN/sft" $sft_args $qwen model_path="$T/q" output_dir="$T/x" $long $lora base_dtype=bfloat16
run q_lora_int8 "$BIN/sft" $sft_args $qwen model_path="$T/q" output_dir="$T/x" $long $lora base_dtype=int8
run q_lora_512 "$BIN/sft" $sft_args $qwen model_path="$T/q" output_dir="$T/x" max_steps=3 $lora
run q_dpo_lora "$BIN/dpo" $dpo_args model_path="$T/q" output_dir="$T/x" max_steps=3 $lora
# the DPO step's tokens (one pair: its two rows), for one row's activations at that length
dpo_row=$(sed -n 's/.*"num_tokens":\([0-9]*\).*/\1/p' "$T/q_dpo_lora.log" | head -1)
dpo_row=$((dpo_row / 2))
run q_row "$BIN/sft" $sft_args $qwen model_path="$T/q" output_dir="$T/x" max_length=$dpo_row dry_run=true $lora

echo "| run | its plan | peak resident | launch to first step | tokens/s (mean after step 1) |"
echo "| --- | --- | --- | --- | --- |"
row "SmolLM-135M shape (Qwen3 vocabulary), SFT full, 1 x 1024" s_full
row "SmolLM-135M shape (Qwen3 vocabulary), SFT LoRA, 1 x 1024" s_lora
row "Qwen2.5-0.5B shape, SFT full, 1 x 1024" q_full
row "Qwen2.5-0.5B shape, SFT LoRA, 1 x 1024" q_lora
row "Qwen2.5-0.5B shape, SFT LoRA, bfloat16 base, 1 x 1024" q_lora_bf16
row "Qwen2.5-0.5B shape, SFT LoRA, int8 base, 1 x 1024" q_lora_int8
row "Qwen2.5-0.5B shape, SFT LoRA, 1 x 512" q_lora_512
row "Qwen2.5-0.5B shape, DPO LoRA, 2 x $dpo_row" q_dpo_lora
for m in s q; do
  fp=$(field 'peak memory \([0-9]*\) MiB' ${m}_full) lp=$(field 'peak memory \([0-9]*\) MiB' ${m}_lora)
  ft=$(toks ${m}_full) lt=$(toks ${m}_lora)
  awk -v m=$m -v fp="$fp" -v lp="$lp" -v ft="$ft" -v lt="$lt" 'BEGIN {
    printf "%s: LoRA peak = %.1f%% of full fine-tuning'"'"'s; LoRA step time = %.1f%% of full'"'"'s\n",
           m == "s" ? "SmolLM-135M shape" : "Qwen2.5-0.5B shape", 100 * lp / fp, 100 * ft / lt }'
done
fp=$(field 'peak memory \([0-9]*\) MiB' q_full)
for q in bf16 int8; do
  bp=$(field 'peak memory \([0-9]*\) MiB' q_lora_$q)
  awk -v a="$bp" -v b="$fp" -v q=$q 'BEGIN { printf "Qwen2.5-0.5B shape: LoRA on a %s base peaks at %.1f%% of full fine-tuning\n", q, 100 * a / b }'
done
a=$(field 'peak memory \([0-9]*\) MiB' q_dpo_lora) b=$(field 'peak memory \([0-9]*\) MiB' q_lora_512)
r=$(field " \([0-9][0-9]*\)  activations, 1 x $dpo_row tokens.*" q_row)
awk -v a="$a" -v b="$b" -v r="$r" -v n="$dpo_row" 'BEGIN { printf "DPO with LoRA (2 x %d tokens) peaks %d MiB above SFT with LoRA (1 x 512); one %d-token row'"'"'s activations: %d MiB\n", n, a - b, n, r }'
