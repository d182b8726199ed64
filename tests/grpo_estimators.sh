#!/bin/sh
# advantage_estimator end to end: a GRPO run with each of group_norm, rloo (with and
# without normalize_advantages) and reinforce_baseline trains (the mean reward rises, the
# loss stays finite), its config.yml records the estimator, and every logged advantage in
# completions.jsonl equals the formula recomputed from the step's logged rewards (and
# lengths: reinforce_baseline whitens over tokens) — under 2 MPI ranks too, where the
# whitening's statistics must span both ranks' completions (and top_entropy_quantile's). Keys that would do nothing
# with the chosen estimator are refused.
. tests/lib/common.sh
grpo_test grpo_estimators 40 64 192
common="$policy
        per_device_train_batch_size=32 num_generations=8 max_completion_length=8 logging_steps=1
        save_steps=0 learning_rate=1e-3 reward_funcs=length,accuracy length_target=2"
field() { sed -n "s/.*\"$1\":\([-0-9.e+a-z]*\).*/\1/p"; }

run() {  # run NAME STEPS KEYS...: trains, then checks rewards, loss and advantages
  name=$1 steps=$2
  shift 2
  "$G" $common output_dir="$T/$name" max_steps="$steps" "$@" >"$T/$name.log" 2>&1 || { cat "$T/$name.log"; fail "$name run"; }
  est=$(sed -n 's/^advantage_estimator: *\([a-z_]*\).*/\1/p' "$T/$name/config.yml")
  norm=$(sed -n 's/^normalize_advantages: *\([a-z]*\).*/\1/p' "$T/$name/config.yml")
  echo "$name: config.yml says advantage_estimator $est, normalize_advantages $norm"
  [ -n "$est" ] || fail "$name: config.yml lacks advantage_estimator"
  awk -v G=8 -v E="$est" -v NORM=$([ "$norm" = true ] && echo 1 || echo 0) -f tests/lib/completions.awk \
    "$T/$name/completions.jsonl" "$T/$name/metrics.jsonl" || fail "$name: advantages or metrics differ from the completions"
  field loss <"$T/$name/metrics.jsonl" | awk '{ if ($1 != $1 + 0 || $1 ~ /nan|inf/) bad = 1 } END { exit bad || !NR }' \
    || fail "$name: a loss is not a finite number"
}
rises() {  # rises NAME: the mean reward of the last 5 steps beats the first 5's by 0.3
  r0=$(head -5 "$T/$1/metrics.jsonl" | field reward | awk '{s+=$1} END {print s/NR}')
  r1=$(tail -5 "$T/$1/metrics.jsonl" | field reward | awk '{s+=$1} END {print s/NR}')
  echo "$1: reward $r0 -> $r1"
  awk -v a="$r0" -v b="$r1" 'BEGIN { exit !(b > a + 0.3) }' || fail "$1: the reward did not rise"
}

echo "== each estimator trains, and logs the advantages its formula gives"
run group_norm 30
rises group_norm
run rloo 30 advantage_estimator=rloo
rises rloo
run rloo_norm 3 advantage_estimator=rloo normalize_advantages=true
run reinforce_baseline 30 advantage_estimator=reinforce_baseline
rises reinforce_baseline
# the estimators differ: the same first rollouts, other advantages
a1=$(head -1 "$T/group_norm/completions.jsonl" | field advantage)
a2=$(head -1 "$T/rloo/completions.jsonl" | field advantage)
a3=$(head -1 "$T/reinforce_baseline/completions.jsonl" | field advantage)
echo "first row's advantage: group_norm $a1, rloo $a2, reinforce_baseline $a3"
[ "$a1" != "$a2" ] && [ "$a2" != "$a3" ] && [ "$a1" != "$a3" ] || fail "the estimators logged the same advantage"

echo "== 2 MPI ranks: the whitening spans both ranks' tokens"
if command -v mpirun >/dev/null; then
  root=""
  [ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
  for e in reinforce_baseline rloo; do
    mpirun $root --oversubscribe -np 2 "$G" $common output_dir="$T/two_$e" max_steps=2 per_device_train_batch_size=16 \
      num_threads=1 advantage_estimator=$e $([ $e = rloo ] && echo normalize_advantages=true) >"$T/two.log" 2>&1 \
      || { cat "$T/two.log"; fail "two-rank $e run"; }
    awk -v G=8 -v E=$e -v NORM=1 -f tests/lib/completions.awk "$T/two_$e/completions.jsonl" "$T/two_$e/metrics.jsonl" \
      || fail "2 ranks, $e: advantages differ from the step's whitening"
  done
  # top_entropy_quantile's threshold is the quantile of both ranks' tokens at once (TRL
  # gathers them): 2 ranks x 16 completions give the first step's loss of 1 rank x 32
  for np in 1 2; do
    mpirun $root --oversubscribe -np $np "$G" $common output_dir="$T/ent$np" max_steps=1 num_threads=1 \
      per_device_train_batch_size=$((32 / np)) top_entropy_quantile=0.3 >"$T/ent.log" 2>&1 \
      || { cat "$T/ent.log"; fail "$np-rank run with top_entropy_quantile"; }
  done
  # filter_groups under 2 ranks: they draw batches together until both are full; every step
  # trains on its 32 completions, each group of them with unequal rewards unless kept to fill
  mpirun $root --oversubscribe -np 2 "$G" $common output_dir="$T/fg2" max_steps=2 num_threads=1 \
    per_device_train_batch_size=16 filter_groups=true max_num_gen_batches=4 >"$T/fg2.log" 2>&1 \
    || { cat "$T/fg2.log"; fail "2-rank run with filter_groups"; }
  kept=$(field 'filter_groups\/kept_zero_std_groups' <"$T/fg2/metrics.jsonl" | awk '{ s += $1 } END { print s }')
  sed 's/.*"step":\([0-9]*\),.*"reward":\([-0-9.e+]*\),.*/\1 \2/' "$T/fg2/completions.jsonl" |
    awk -v kept="$kept" '{ i = c[$1] + 0; c[$1] = i + 1; k = $1 ":" int(i / 8)
           if (!(k in lo) || $2 < lo[k]) lo[k] = $2; if (!(k in hi) || $2 > hi[k]) hi[k] = $2 }
         END { for (k in lo) { n++; z += lo[k] == hi[k] } for (s in c) if (c[s] != 32) bad = 1
               print "2 ranks, filter_groups: " n " groups trained, " z " of equal rewards, " kept " counted as kept"
               exit bad || n != 8 || z != kept }' || fail "filter_groups under 2 ranks"
  l1=$(field loss <"$T/ent1/metrics.jsonl") l2=$(field loss <"$T/ent2/metrics.jsonl")
  echo "top_entropy_quantile 0.3: loss $l1 on 1 rank, $l2 on 2"
  awk -v a="$l1" -v b="$l2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != 0 && d <= 1e-5 * (a < 0 ? -a : a)) }' \
    || fail "the entropy quantile does not span both ranks (loss $l1 vs $l2)"
else
  echo "mpirun missing: skipped"
fi

echo "== multi_objective_aggregation normalize_then_sum: the step's advantages are whitened over the batch"
"$G" $common output_dir="$T/nts" max_steps=1 multi_objective_aggregation=normalize_then_sum >"$T/nts.log" 2>&1 \
  || { cat "$T/nts.log"; fail "normalize_then_sum run"; }
sed 's/.*"advantage":\([-0-9.e+]*\).*/\1/' "$T/nts/completions.jsonl" |
  awk '{ s += $1; q += $1 * $1; n++ } END { m = s / n; sd = sqrt((q - n * m * m) / (n - 1))
         printf "%d advantages: mean %.2g, std %.6f\n", n, m, sd
         exit !(n == 32 && m < 1e-9 && m > -1e-9 && sd > 0.999 && sd < 1) }' \
  || fail "normalize_then_sum's advantages are not whitened over the batch"
expect 2 "key 'scale_rewards': multi_objective_aggregation normalize_then_sum normalizes the rewards itself" \
  "$G" $common output_dir="$T/x" multi_objective_aggregation=normalize_then_sum scale_rewards=batch

echo "== keys that would do nothing with the chosen estimator are refused"
expect 2 "key 'scale_rewards': 'batch' scales group_norm's advantages, and advantage_estimator is rloo" \
  "$G" $common output_dir="$T/x" advantage_estimator=rloo scale_rewards=batch
expect 2 "key 'normalize_advantages': whitens rloo's advantages, and advantage_estimator is reinforce_baseline" \
  "$G" $common output_dir="$T/x" advantage_estimator=reinforce_baseline normalize_advantages=true
expect 2 "key 'normalize_advantages'" "$G" $common output_dir="$T/x" normalize_advantages=true
expect 2 "advantage_estimator" "$G" $common output_dir="$T/x" advantage_estimator=gae
echo "grpo estimators: all checks passed"
