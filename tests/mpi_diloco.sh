#!/bin/sh
# DiLoCo (diloco_inner_steps H): H local AdamW steps per rank, then the ranks average the
# pseudo-gradient θ_start − θ and take an outer Nesterov step.
# - H = 1, outer lr 1, momentum 0 is data parallel when every rank's data is the same (the
#   local step is then DP's step: AdamW of another rank's gradient is not a mean of AdamW
#   steps, so with different data the two differ by design);
# - the reverse task converges at H = 8, and sends about 1/8 of data parallel's bytes;
# - a checkpoint or a stop waits for the next sync, and resuming repeats the straight run
#   bit for bit (the outer momentum and every rank's moments are saved);
# - the keys that cannot go together are refused before any work.
. tests/lib/common.sh
mpi_test mpi_diloco
# every block of 4 rows twice: with 4 rows per rank and no shuffling both ranks see the same rows
awk '{ b[n++] = $0 } n == 4 { for (r = 0; r < 2; r++) for (i = 0; i < 4; i++) print b[i]; n = 0 }' \
  "$T/train.jsonl" >"$T/twice.jsonl"
args="configs/sft.yml model.hidden_size=64 model.intermediate_size=128 model.num_hidden_layers=2
      model.num_attention_heads=2 max_length=24 logging_steps=1 learning_rate=1e-3 save_steps=0 num_threads=1"
floats() {  # a safetensors file's values (all float32), one per line
  n=$(od -An -tu8 -N8 "$1" | tr -d ' ')
  tail -c +$((9 + n)) "$1" | od -An -v -tf4 | tr -s ' ' '\n' | sed '/^$/d'
}

echo "== H = 1, outer lr 1, momentum 0, the same rows on both ranks: data parallel to rounding"
same="dataset_path=$T/twice.jsonl shuffle_dataset=false per_device_train_batch_size=4 max_steps=8"
mpi_sft dp 2 $same
mpi_sft h1 2 $same diloco_inner_steps=1 diloco_outer_lr=1 diloco_outer_momentum=0
grep -q "DiLoCo: 1 local AdamW steps between syncs of 2 ranks, outer Nesterov lr 1, momentum 0" "$T/h1.log" ||
  fail "h1 did not run DiLoCo"
losses "$T/dp/metrics.jsonl" >"$T/la"
losses "$T/h1/metrics.jsonl" >"$T/lb"
[ "$(wc -l <"$T/la")" = 8 ] || fail "expected 8 logged steps"
join "$T/la" "$T/lb" | awk '{ d = $2 - $3; if (d < 0) d = -d; if (d > 1e-5 * $2) { print; bad = 1 } } END { exit bad }' ||
  fail "H = 1 losses differ from data parallel"
floats "$T/dp/model.safetensors" >"$T/fa"
floats "$T/h1/model.safetensors" >"$T/fb"
paste "$T/fa" "$T/fb" | awk '{ d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; if (d > m) m = d
    if (d > 1e-6 + 1e-4 * a) bad++ } END { printf "  largest weight gap %.3g over %d values\n", m, NR; exit bad > 0 }' ||
  fail "H = 1 weights differ from data parallel by more than rounding"

echo "== H = 8 converges on the reverse task, with about 1/8 of data parallel's traffic"
toy="dataset_path=$T/train.jsonl per_device_train_batch_size=16 max_steps=96 learning_rate=5e-3 logging_steps=8
     lr_scheduler_type=cosine warmup_steps=8"
mpi_sft dp64 2 $toy
mpi_sft h8 2 $toy diloco_inner_steps=8
first=$(losses "$T/h8/metrics.jsonl" | head -1 | cut -d' ' -f2)
last=$(losses "$T/h8/metrics.jsonl" | tail -1 | cut -d' ' -f2)
dplast=$(losses "$T/dp64/metrics.jsonl" | tail -1 | cut -d' ' -f2)
echo "  H = 8: loss $first -> $last (data parallel: $dplast)"
awk -v f="$first" -v l="$last" -v d="$dplast" 'BEGIN { exit !(l < 0.6 * f && l < 1.5 * d) }' ||
  fail "H = 8 did not converge (loss $first -> $last, data parallel $dplast)"
mb() { sed -n 's/.*communication: \([0-9.]*\) MB sent per optimizer step.*/\1/p' "$1"; }
echo "  bytes per step per rank: data parallel $(mb "$T/dp64.log") MB, H = 8 $(mb "$T/h8.log") MB"
awk -v a="$(mb "$T/dp64.log")" -v b="$(mb "$T/h8.log")" 'BEGIN { exit !(b > 0 && a / b > 7 && a / b < 9) }' ||
  fail "H = 8 should send about 1/8 of data parallel's bytes"

echo "== checkpoints and stops wait for a sync; resuming is exact"
res="dataset_path=$T/train.jsonl per_device_train_batch_size=8 max_steps=12 diloco_inner_steps=4"
mpi_sft straight 2 $res
rc=0
CT_STOP_AFTER_STEP=5 $MPIRUN -np 2 "$BIN/sft" $args output_dir="$T/cut" $res save_steps=3 \
  >"$T/cut.log" 2>&1 || rc=$?
[ "$rc" = 130 ] || { cat "$T/cut.log"; fail "the interrupted run exited $rc (expected 130)"; }
[ "$(cd "$T/cut" && ls -d checkpoint-* | sort -t- -k2 -n | tr '\n' ' ')" = "checkpoint-4 checkpoint-8 " ] ||
  { ls "$T/cut"; fail "checkpoints should wait for the syncs at steps 4 and 8"; }
[ -s "$T/cut/checkpoint-8/optimizer-rank1.safetensors" ] || fail "rank 1's moments were not saved"
$MPIRUN -np 2 "$BIN/sft" $args output_dir="$T/cut" $res resume_from_checkpoint=latest \
  >"$T/resumed.log" 2>&1 || { cat "$T/resumed.log"; fail "resuming"; }
grep -q "resumed from .*checkpoint-8" "$T/resumed.log" || fail "did not resume from checkpoint-8"
cmp "$T/straight/model.safetensors" "$T/cut/model.safetensors" || fail "the resumed run differs from the straight one"
expect 2 "saved by 2 DiLoCo ranks" "$BIN/sft" $args output_dir="$T/one" $res \
  resume_from_checkpoint="$T/cut/checkpoint-8" per_device_train_batch_size=16

echo "== keys that cannot go together"
expect 2 "key 'diloco_outer_lr' acts on DiLoCo's syncs" "$BIN/sft" $args dataset_path="$T/train.jsonl" \
  output_dir="$T/x" diloco_outer_lr=0.5
expect 2 "key 'optimizer_sharding': DiLoCo" "$BIN/sft" $args dataset_path="$T/train.jsonl" output_dir="$T/x" \
  diloco_inner_steps=4 optimizer_sharding=true
echo "mpi_diloco: all checks passed"
