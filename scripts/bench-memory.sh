#!/bin/sh
# Peak memory of DPO with and without its reference model, SmolLM-135M shape (fp32):
# the reference should add its parameters and a forward's transient activations,
# nothing more. Peaks are the trainers' "peak memory" (ru_maxrss / 1024: MiB); the
# parameter bytes are read from the model.safetensors this script creates, in MiB too.
# Workload: 64 generated word-reversal pairs (byte tokenizer), 4 pairs a step, 2 steps;
# dpo pads every batch to the longest pair of the data (short here; max_length 64 caps it).
# usage: scripts/bench-memory.sh BIN_DIR
set -eu
BIN=${1:-bin}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$BIN/ctune-demo-data" reverse "$T/s.jsonl" "$T/se.jsonl" 64 8 1 8
"$BIN/ctune-demo-data" reverse-prefs "$T/p.jsonl" "$T/pe.jsonl" 64 8 1 8
shape="model.vocab_size=49152 model.hidden_size=576 model.intermediate_size=1536 model.num_hidden_layers=30
       model.num_attention_heads=9 model.num_key_value_heads=3 max_length=64"
# a model of that shape, saved as it was initialized (one step at learning rate 0)
"$BIN/sft" configs/sft.yml dataset_path="$T/s.jsonl" output_dir="$T/m" max_steps=1 learning_rate=0 \
  per_device_train_batch_size=4 save_steps=0 $shape >"$T/sft.log" 2>&1 || { cat "$T/sft.log"; exit 1; }
# its parameter bytes: the safetensors file minus its 8-byte length and JSON header
f=$T/m/model.safetensors
hdr=$(od -An -tu8 -N8 "$f" | tr -d ' ')
params=$(( $(wc -c <"$f") - 8 - hdr ))
peak() { sed -n 's/.*peak memory \([0-9]*\) M.*/\1/p' "$1"; }
run() {  # run LOSS_TYPE LOG
  "$BIN/dpo" configs/dpo.yml model_path="$T/m" dataset_path="$T/p.jsonl" output_dir="$T/d" max_steps=2 \
    per_device_train_batch_size=4 loss_type="$1" max_length=64 save_steps=0 >"$2" 2>&1 || { cat "$2"; exit 1; }
}
run simpo "$T/a.log"
run sigmoid "$T/b.log"
a=$(peak "$T/a.log") b=$(peak "$T/b.log")
[ -n "$a" ] && [ -n "$b" ] || { echo "bench-memory: no peak memory line in the dpo logs"; cat "$T/a.log" "$T/b.log"; exit 1; }
echo "DPO peak memory (MiB), 4 pairs a step of 64 short word-reversal pairs: policy only (simpo) $a MiB; with the reference (sigmoid) $b MiB"
awk -v a="$a" -v b="$b" -v p="$params" 'BEGIN {
  m = p / 1048576
  printf "the reference adds %d MiB = %.2f x its %.0f MiB of fp32 parameters (%d bytes)\n", b - a, (b - a) / m, m, p
}'
