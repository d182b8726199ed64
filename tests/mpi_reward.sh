#!/bin/sh
# bin/reward on two MPI ranks of 4 pairs each takes the same steps as one process with 8
# pairs: loss, accuracy and the reward extremes (a maximum over ranks) agree up to float
# rounding.
. tests/lib/common.sh
mpi_test mpi_reward
# pairs: the reversed word over the word copied
awk -F'"' '{w=$4; sub(/^reverse /,"",w); sub(/:$/,"",w);
  if (w != $8) printf "{\"prompt\": \"%s\", \"chosen\": \"%s\", \"rejected\": \"%s\"}\n", $4, $8, w}' \
  "$T/train.jsonl" >"$T/pairs.jsonl"
args="configs/reward.yml dataset_path=$T/pairs.jsonl model.hidden_size=64 model.intermediate_size=128
      model.num_hidden_layers=2 model.num_attention_heads=2 max_length=24 max_steps=5 logging_steps=1
      learning_rate=1e-3 save_steps=0 num_threads=1"
"$BIN/reward" $args output_dir="$T/one" per_device_train_batch_size=8 >"$T/one.log" 2>&1 \
  || { cat "$T/one.log"; fail "single-process run"; }
$MPIRUN -np 2 "$BIN/reward" $args output_dir="$T/two" per_device_train_batch_size=4 >"$T/two.log" 2>&1 \
  || { cat "$T/two.log"; fail "two-rank run"; }
grep -q "x 2 ranks" "$T/two.log" || { cat "$T/two.log"; fail "the run did not see 2 ranks"; }
for k in loss accuracy min_reward max_reward; do
  field "$k" <"$T/one/metrics.jsonl" >"$T/a"
  field "$k" <"$T/two/metrics.jsonl" >"$T/b"
  [ "$(wc -l <"$T/a")" = 5 ] && [ "$(wc -l <"$T/b")" = 5 ] || fail "expected 5 logged steps each"
  paste "$T/a" "$T/b" | awk -v k="$k" '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * (1 + ($1 < 0 ? -$1 : $1))) {
                                  print k " at step " NR ": " $1 " vs " $2; bad = 1 } } END { exit bad }' \
    || fail "$k differs between 1 rank and 2 ranks"
done
echo "mpi_reward: 2 ranks match 1 rank"
