#!/bin/sh
# Two MPI ranks with one micro-batch each take the same optimizer steps as one process
# accumulating two micro-batches: the same global batch, gradients summed the same way
# up to float rounding.
. tests/lib/common.sh
mpi_test mpi
args="configs/sft.yml dataset_path=$T/train.jsonl model.hidden_size=64 model.intermediate_size=128
      model.num_hidden_layers=2 model.num_attention_heads=2 max_length=24 max_steps=6 logging_steps=1
      learning_rate=1e-3 save_steps=0 per_device_train_batch_size=4"
"$BIN/sft" $args output_dir="$T/one" gradient_accumulation_steps=2 num_threads=1 >"$T/one.log" 2>&1 \
  || { cat "$T/one.log"; fail "single-process run"; }
$MPIRUN -np 2 "$BIN/sft" $args output_dir="$T/two" gradient_accumulation_steps=1 \
  num_threads=1 >"$T/two.log" 2>&1 || { cat "$T/two.log"; fail "two-rank run"; }
grep -q "x 2 ranks" "$T/two.log" || { cat "$T/two.log"; fail "the run did not see 2 ranks"; }
losses "$T/one/metrics.jsonl" >"$T/a"
losses "$T/two/metrics.jsonl" >"$T/b"
[ "$(wc -l <"$T/a")" = 6 ] && [ "$(wc -l <"$T/b")" = 6 ] || fail "expected 6 logged steps each"
paste "$T/a" "$T/b" | awk '{ d = $2 - $4; if (d < 0) d = -d; if (d > 1e-4 * $2) { print "step " $1 ": " $2 " vs " $4; bad = 1 } }
                           END { exit bad }' || fail "losses differ between 1 rank x 2 micro-batches and 2 ranks"
cat "$T/a"
echo "mpi: 2 ranks match 1 rank with gradient accumulation"
