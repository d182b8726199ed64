#!/bin/sh
# Peak memory of DPO with and without its reference model, SmolLM-135M shape (fp32):
# the reference should add its parameters (538 MB) and a forward's transient
# activations, nothing more. usage: scripts/bench-memory.sh BIN_DIR
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
peak() { sed -n 's/.*peak memory \([0-9]*\) MB.*/\1/p' "$1"; }
run() {  # run LOSS_TYPE LOG
  "$BIN/dpo" configs/dpo.yml model_path="$T/m" dataset_path="$T/p.jsonl" output_dir="$T/d" max_steps=2 \
    per_device_train_batch_size=4 loss_type="$1" max_length=64 save_steps=0 >"$2" 2>&1 || { cat "$2"; exit 1; }
}
run simpo "$T/a.log"
run sigmoid "$T/b.log"
a=$(peak "$T/a.log") b=$(peak "$T/b.log")
echo "DPO peak memory, 4 pairs x 64 tokens: policy only (simpo) $a MB; with the reference (sigmoid) $b MB"
awk -v a="$a" -v b="$b" 'BEGIN { printf "the reference adds %d MB = %.2f x its 538 MB of parameters\n", b - a, (b - a) / 538 }'
