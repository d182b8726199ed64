#!/bin/sh
# Self-speculative decoding (bin/sampler speculative=mtp) on a model trained with
# multi-token prediction: a 29M-parameter Llama-style model (hidden 512, 8 layers, 8/4
# heads, intermediate 1536; the byte tokenizer: 116 MB of float32 weights, decoding at
# batch 1 reads them all once per token) trained briefly from scratch with
# configs/sft-mtp.yml (mtp_num_layers 1) on the demo's reverse task, its examples joined
# into text rows ("reverse vrw: wrv\nreverse ...") so that greedy decoding runs on for
# the whole max_new_tokens. Then `bin/sampler bench speculative=mtp` on held-out prompts:
# plain greedy vs speculative=mtp tokens/s in the same process (best of 3 each, the
# same tokens checked), the ratio, and the share of guesses kept; float32 and int8
# weights, on every core and on one.
# usage: scripts/bench-mtp.sh BIN_DIR   (~4 minutes on 2 busy cores)
set -eu
BIN=${1:-bin}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. scripts/bench-run.sh
"$BIN/ctune-demo-data" reverse "$T/rows.jsonl" "$T/eval.jsonl" 4000 10 1234 8 >/dev/null
# 4 examples a text row (~110 bytes); the held-out words' prompts to decode from
awk -F'"' '{ s = s $4 " " $8 "\\n"; if (NR % 4 == 0) { printf "{\"text\":\"%s\"}\n", s; s = "" } }' \
  "$T/rows.jsonl" >"$T/text.jsonl"
shape="model.model_type=llama model.hidden_size=512 model.intermediate_size=1536 model.num_hidden_layers=8
       model.num_attention_heads=8 model.num_key_value_heads=4 model.max_position_embeddings=256
       model.tie_word_embeddings=true"
train="max_steps=80 per_device_train_batch_size=8 max_length=128 learning_rate=1e-3 warmup_steps=10
       lr_scheduler_type=cosine mtp_loss_scaling_factor=0.3 completion_only_loss=false logging_steps=10
       save_steps=0"
started=$(date +%s)
run_ok sft "$BIN/sft" configs/sft-mtp.yml dataset_path="$T/text.jsonl" output_dir="$T/m" $shape $train
echo "OpenBLAS kernel: ${OPENBLAS_CORETYPE:-chosen by ctune for this CPU}"
echo "model: $(sed -n 's/.*ctune: model: \(.*\)/\1/p' "$T/sft.log" | head -1), byte tokenizer;" \
  "trained from scratch in $(( $(date +%s) - started )) s:" $train "(mtp_num_layers 1, configs/sft-mtp.yml)"
echo "  training mtp_loss $(sed -n 's/.*"mtp_loss":\([0-9.]*\).*/\1/p' "$T/sft.log" | head -1) ->" \
  "$(sed -n 's/.*"mtp_loss":\([0-9.]*\).*/\1/p' "$T/sft.log" | tail -1)"
gen="model_path=$T/m prompts_path=$T/eval.jsonl max_new_tokens=64 max_target_length=128 max_prefill_length=32"
for threads in 0 1; do
  for q in none int8; do
    echo "bin/sampler bench speculative=mtp $gen quantization=$q num_threads=$threads" | sed "s|$T/|\$T/|g"
    "$BIN/sampler" bench speculative=mtp $gen quantization=$q num_threads=$threads >"$T/b.txt" 2>&1 ||
      { cat "$T/b.txt"; exit 1; }
    grep -v OPENBLAS "$T/b.txt"
  done
done
