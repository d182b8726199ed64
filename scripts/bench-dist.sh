#!/bin/sh
# Beyond one process, SmolLM-135M shape (fp32 SFT, 256-token rows, global batch 4):
#   step time, 2 ranks x 1 thread against 1 rank x 2 threads (same global batch);
#   rank 0's memory plan rows for the AdamW moments and its peak resident memory, at
#   N = 1 and N = 2 with and without optimizer_sharding (ZeRO-1);
#   bytes sent per optimizer step (ring count) for data parallel and DiLoCo H = 8.
# usage: scripts/bench-dist.sh BIN_DIR   (~4 minutes on 2 cores; needs mpirun)
set -eu
BIN=${1:-bin}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
echo "OpenBLAS kernel: ${OPENBLAS_CORETYPE:-chosen by ctune for this CPU}"
"$BIN/ctune-demo-data" reverse "$T/sft.jsonl" "$T/eval.jsonl" 400 10 3 12 >/dev/null

. scripts/bench-run.sh
steps=8
smol="configs/sft.yml dataset_path=$T/sft.jsonl model.hidden_size=576 model.intermediate_size=1536
      model.num_hidden_layers=30 model.num_attention_heads=9 model.num_key_value_heads=3
      model.vocab_size=49152 model.tie_word_embeddings=true max_length=256 packing=true
      completion_only_loss=false max_steps=$steps logging_steps=1 save_steps=0"
mpi="mpirun --oversubscribe --allow-run-as-root -np 2 --bind-to none"

run_ok one "$BIN/sft" $smol output_dir="$T/one" per_device_train_batch_size=4 num_threads=2
run_ok dp2 $mpi "$BIN/sft" $smol output_dir="$T/dp2" per_device_train_batch_size=2 num_threads=1
run_ok z2 $mpi "$BIN/sft" $smol output_dir="$T/z2" per_device_train_batch_size=2 num_threads=1 optimizer_sharding=true
run_ok dl2 $mpi "$BIN/sft" $smol output_dir="$T/dl2" per_device_train_batch_size=2 num_threads=1 diloco_inner_steps=8

# step NAME: mean seconds per step over steps 3..$steps (steps 1-2 pay for fresh pages)
step() {
  grep '"loss"' "$T/$1.log" | awk -v n=$steps 'NR == 2 { a = $1 } NR == n { b = $1 } END { printf "%.2f", (b - a) / (n - 2) }'
}
moments() { sed -n "s/.* \([0-9][0-9]*\)  AdamW moments.*/\1/p" "$T/$1.log" | head -1; }
peak() { sed -n 's/.*peak memory \([0-9]*\) MiB.*/\1/p' "$T/$1.log" | tail -1; }
sent() { sed -n 's/.*communication: \([0-9.]*\) MB sent.*/\1/p' "$T/$1.log" | tail -1; }

s1=$(step one)
s2=$(step dp2)
echo "| run ($steps steps, global batch 4 x 256 tokens) | s / step (steps 3-$steps) | AdamW moments, rank 0's plan | peak resident, rank 0 | MB sent / step / rank |"
echo "| --- | --- | --- | --- | --- |"
for r in "one:1 rank x 2 threads" "dp2:2 ranks x 1 thread" "z2:2 ranks x 1 thread, optimizer_sharding" "dl2:2 ranks x 1 thread, DiLoCo H = 8"; do
  n=${r%%:*}
  printf "| %s | %s | %s MiB | %s MiB | %s |\n" "${r#*:}" "$(step "$n")" "$(moments "$n")" "$(peak "$n")" "$(sent "$n")"
done
awk -v a="$s2" -v b="$s1" 'BEGIN { printf "2 ranks x 1 thread / 1 rank x 2 threads, step time: %.2f (target <= 1.15)\n", a / b }'
awk -v a="$(sent dp2)" -v b="$(sent dl2)" 'BEGIN { if (b > 0) printf "data parallel / DiLoCo H = 8, bytes per step: %.1fx\n", a / b }'
