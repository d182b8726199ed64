#!/bin/sh
# bin/grpo's logs a TRL user reads: completions.jsonl (one row per completion per step,
# with rewards and advantages; num_completions_to_print on stderr; a resumed run appends
# without duplicating steps; the same rows under 2 MPI ranks) and the metrics TRL logs
# (rewards/<name>/std, completions/{min,max}_length, completions/*_terminated_length),
# all recomputed here from the logged completions.
. tests/lib/common.sh
grpo_test grpo_logs 40 64 192  # a few steps: some completions stop, some run out
common="$policy
        per_device_train_batch_size=16 num_generations=8 max_completion_length=6 logging_steps=1
        save_steps=0 learning_rate=1e-4 reward_funcs=length,accuracy length_target=3"

echo "== completions.jsonl and the metrics recomputed from it"
"$G" $common output_dir="$T/a" max_steps=4 save_steps=2 num_completions_to_print=2 >"$T/a.log" 2>&1 \
  || { cat "$T/a.log"; fail "grpo run"; }
rows=$(wc -l <"$T/a/completions.jsonl")
[ "$rows" = 64 ] || fail "expected 4 steps x 16 completions, got $rows rows"
for s in 1 2 3 4; do
  [ "$(grep -c "^{\"step\":$s," "$T/a/completions.jsonl")" = 16 ] || fail "step $s lacks its 16 rows"
done
head -1 "$T/a/completions.jsonl"
for k in prompt completion completion_ids logprobs finish_reason length accuracy reward advantage; do
  head -1 "$T/a/completions.jsonl" | grep -q "\"$k\":" || fail "rows lack $k"
done
grep -q '"finish_reason":"stop"' "$T/a/completions.jsonl" || fail "no completion stopped (the check below needs some)"
grep -q '"finish_reason":"length"' "$T/a/completions.jsonl" || fail "no completion ran out (the check below needs some)"
awk -v G=8 -f tests/lib/completions.awk "$T/a/completions.jsonl" "$T/a/metrics.jsonl" || fail "metrics differ from the completions"
# each logged step shows its first 2 completions: prompt, completion, reward
[ "$(grep -c 'completion 2 of step' "$T/a.log")" = 4 ] || { cat "$T/a.log"; fail "num_completions_to_print=2 did not print 2 per step"; }
grep -q '^  prompt: reverse ' "$T/a.log" || fail "printed completions lack their prompt"

echo "== resume appends without duplicating steps; the rows match the uninterrupted run"
"$G" $common output_dir="$T/a" max_steps=4 save_steps=2 resume_from_checkpoint="$T/a/checkpoint-2" >"$T/r.log" 2>&1 \
  || { cat "$T/r.log"; fail "resumed run"; }
cp "$T/a/completions.jsonl" "$T/resumed.jsonl"
"$G" $common output_dir="$T/b" max_steps=4 >"$T/b.log" 2>&1 || { cat "$T/b.log"; fail "straight run"; }
cmp "$T/b/completions.jsonl" "$T/resumed.jsonl" || fail "resumed completions.jsonl differs from an uninterrupted run's"

echo "== log_completions=false writes none"
"$G" $common output_dir="$T/off" max_steps=1 log_completions=false >"$T/off.log" 2>&1 || { cat "$T/off.log"; fail "run"; }
[ ! -e "$T/off/completions.jsonl" ] || fail "log_completions=false wrote completions.jsonl"
expect 2 "num_completions_to_print" "$G" $common output_dir="$T/x" num_completions_to_print=-1

echo "== 2 MPI ranks: rank 0 writes every rank's completions"
if command -v mpirun >/dev/null; then
  root=""
  [ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
  mpirun $root --oversubscribe -np 2 "$G" $common output_dir="$T/two" max_steps=2 per_device_train_batch_size=8 \
    num_threads=1 >"$T/two.log" 2>&1 || { cat "$T/two.log"; fail "two-rank run"; }
  ids() { sed 's/"logprobs".*"finish_reason"/"finish_reason"/' "$1"; }  # log-probs: float rounding
  ids "$T/two/completions.jsonl" >"$T/two.ids"
  head -32 "$T/b/completions.jsonl" | ids /dev/stdin >"$T/one.ids"
  cmp "$T/one.ids" "$T/two.ids" || fail "2 ranks logged other completions than 1 rank"
  awk -v G=8 -f tests/lib/completions.awk "$T/two/completions.jsonl" "$T/two/metrics.jsonl" || fail "2-rank metrics"
else
  echo "mpirun missing: skipped"
fi
echo "grpo logs: all checks passed"
