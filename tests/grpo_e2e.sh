#!/bin/sh
# bin/grpo end to end: the mean reward rises on a toy task (fixed seed), the KL to the
# reference starts at 0 and then grows, rollouts are reused with num_iterations, resume is
# bit-identical, the remote reward works against the bundled server (and its failures
# stop the run or give NaN as configured), and bad settings fail before any rollout.
. tests/lib/common.sh
grpo_test grpo 200 128 384
common="$policy
        per_device_train_batch_size=32 num_generations=8 max_completion_length=10 logging_steps=1
        save_steps=0 learning_rate=1e-4"

echo "== the mean reward rises (length reward, target 2 characters)"
"$G" $common output_dir="$T/len" max_steps=40 reward_funcs=length length_target=2 >"$T/len.log" 2>&1 \
  || { cat "$T/len.log"; fail "grpo run"; }
r0=$(head -3 "$T/len/metrics.jsonl" | field reward | awk '{s+=$1} END {print s/NR}')
r1=$(tail -3 "$T/len/metrics.jsonl" | field reward | awk '{s+=$1} END {print s/NR}')
echo "reward $r0 -> $r1"
awk -v a="$r0" -v b="$r1" 'BEGIN { exit !(b > a + 0.5) }' || fail "the reward did not rise"
for k in reward_std frac_reward_zero_std kl clip_ratio/low_mean clip_ratio/high_mean \
         completions/mean_length completions/clipped_ratio entropy rewards/length/mean time/generation_s; do
  grep -q "\"$k\"" "$T/len/metrics.jsonl" || fail "metrics lack $k"
done

echo "== decode_slots 0 decodes the step's 32 completions together; the rollouts are those of 4 slots, bit for bit"
grep -q "decode_slots: 32, the rank's 4 prompts x 8 completions decoding together" "$T/len.log" \
  || { cat "$T/len.log"; fail "decode_slots 0 did not take the generation batch"; }
"$G" $common output_dir="$T/s4" max_steps=3 reward_funcs=length length_target=2 decode_slots=4 \
  log_completions=true >"$T/s4.log" 2>&1 || { cat "$T/s4.log"; fail "grpo, 4 slots"; }
"$G" $common output_dir="$T/sall" max_steps=3 reward_funcs=length length_target=2 \
  log_completions=true >"$T/sall.log" 2>&1 || { cat "$T/sall.log"; fail "grpo, decode_slots 0"; }
cmp "$T/s4/completions.jsonl" "$T/sall/completions.jsonl" && cmp "$T/s4/model.safetensors" "$T/sall/model.safetensors" \
  || fail "the rollouts depend on the slots beside them"

echo "== reward_weights weigh the reward functions; eval scores greedy completions"
head -8 "$T/prompts.jsonl" >"$T/evalp.jsonl"
"$G" $common output_dir="$T/w" max_steps=2 reward_funcs=length,accuracy reward_weights=0.5,-1 length_target=2 \
  eval_dataset_path="$T/evalp.jsonl" eval_steps=2 >"$T/w.log" 2>&1 || { cat "$T/w.log"; fail "weighted run"; }
# the logged reward is the weighted sum of the per-function means, on every step
grep '"reward"' "$T/w/metrics.jsonl" | while read -r line; do
  r=$(echo "$line" | field reward) a=$(echo "$line" | field 'rewards\/length\/mean') b=$(echo "$line" | field 'rewards\/accuracy\/mean')
  [ -n "$b" ] || fail "no rewards/accuracy/mean in: $line"
  awk -v r="$r" -v a="$a" -v b="$b" 'BEGIN { d = r - (0.5 * a - b); exit !(d < 1e-4 && d > -1e-4) }' \
    || fail "reward $r is not 0.5 * $a - $b"
done || exit 1
for k in eval_reward eval_rewards/length/mean eval_rewards/accuracy/mean eval_completions/mean_length; do
  grep -q "\"$k\"" "$T/w/metrics.jsonl" || fail "metrics lack $k"
done
expect 2 "needs one weight per reward function" "$G" $common output_dir="$T/x" reward_funcs=length,accuracy reward_weights=1
expect 1 "nowhere.jsonl" "$G" $common output_dir="$T/x" eval_dataset_path="$T/nowhere.jsonl" eval_steps=1

echo "== with beta > 0 the reference is loaded and the KL starts at 0"
# the length reward varies within groups, so the policy moves (accuracy would be all 0 here);
# the RoPE tables start at one position in GRPO and grow to prompt + completion
"$G" $common output_dir="$T/kl" max_steps=3 beta=0.05 reward_funcs=length length_target=2 >"$T/kl.log" 2>&1 \
  || { cat "$T/kl.log"; fail "beta run"; }
grep -q "reference loaded" "$T/kl.log" || fail "no reference model"
kl0=$(head -1 "$T/kl/metrics.jsonl" | field kl)
[ "$kl0" = "0.0" ] || fail "first-step KL is $kl0, not 0"
# ... and is measured: once the policy has moved it is no longer 0
for s in 2 3; do
  kl=$(sed -n ${s}p "$T/kl/metrics.jsonl" | field kl)
  echo "kl at step $s: $kl"
  awk -v k="$kl" 'BEGIN { exit !(k + 0 > 0) }' || fail "step-$s KL is '$kl', not > 0"
done

echo "== gradient_checkpointing and a bf16 reference"
# recomputing each layer in backward gives the same gradients, so the same run to the bit
"$G" $common output_dir="$T/klgc" max_steps=3 beta=0.05 reward_funcs=length length_target=2 \
  gradient_checkpointing=always >"$T/klgc.log" 2>&1 || { cat "$T/klgc.log"; fail "gradient_checkpointing run"; }
strip() { sed 's/"time\/[a-z_]*":[-0-9.e+]*//g' "$1"; }
[ "$(strip "$T/kl/metrics.jsonl")" = "$(strip "$T/klgc/metrics.jsonl")" ] || fail "gradient_checkpointing changed the run"
# a bf16 reference: the first KL is the reference's rounding, small but not 0
"$G" $common output_dir="$T/klbf" max_steps=1 beta=0.05 reward_funcs=length length_target=2 \
  ref_dtype=bfloat16 >"$T/klbf.log" 2>&1 || { cat "$T/klbf.log"; fail "bf16 reference run"; }
kl=$(head -1 "$T/klbf/metrics.jsonl" | field kl)
echo "step-1 KL to a bf16 reference: $kl"
awk -v k="$kl" 'BEGIN { exit !(k > 0 && k < 1e-3) }' || fail "step-1 KL to a bf16 reference is $kl"

echo "== num_iterations=2 generates every other step"
"$G" $common output_dir="$T/mu" max_steps=4 num_iterations=2 >"$T/mu.log" 2>&1 || { cat "$T/mu.log"; fail "mu run"; }
gens=$(grep -c '"time/generation_s":0.0,' "$T/mu/metrics.jsonl" || true)
[ "$gens" = 2 ] || fail "expected 2 steps without generation, got $gens"

echo "== in epochs, num_iterations multiplies the steps before warmup_ratio takes its share"
head -8 "$T/prompts.jsonl" >"$T/p8.jsonl"  # 2 steps of 4 prompts, each trained twice: 4 steps, warmup 2
"$G" $common dataset_path="$T/p8.jsonl" output_dir="$T/wu" num_train_epochs=1 num_iterations=2 warmup_ratio=0.5 \
  lr_scheduler_type=constant_with_warmup >"$T/wu.log" 2>&1 || { cat "$T/wu.log"; fail "warmup run"; }
lrs=$(field learning_rate <"$T/wu/metrics.jsonl" | tr '\n' ' ')
[ "$lrs" = "0.0 5e-5 0.0001 0.0001 " ] || fail "learning rates $lrs, expected 0.0 5e-5 0.0001 0.0001 (warmup 2 of 4)"

# resume_exact NAME CHECKPOINT ARGS...: 6 steps straight == stopped after step 3 (the
# checkpoint it leaves is CHECKPOINT), then resumed: same metrics, same weights.
resume_exact() {
  name=$1 ckpt=$2
  shift 2
  args="$common max_steps=6 save_steps=3 $*"
  "$G" $args output_dir="$T/$name.1" >"$T/$name.1.log" 2>&1 || { cat "$T/$name.1.log"; fail "$name: straight run"; }
  rc=0
  CT_STOP_AFTER_STEP=3 "$G" $args output_dir="$T/$name.2" >"$T/$name.2.log" 2>&1 || rc=$?
  [ "$rc" = 130 ] || { cat "$T/$name.2.log"; fail "$name: interrupted run exited $rc"; }
  [ "$(cd "$T/$name.2" && ls -d checkpoint-*)" = "$ckpt" ] || { ls "$T/$name.2"; fail "$name: expected only $ckpt"; }
  "$G" $args output_dir="$T/$name.2" resume_from_checkpoint=latest >"$T/$name.3.log" 2>&1 \
    || { cat "$T/$name.3.log"; fail "$name: resume"; }
  sed 's/,"time.*//' "$T/$name.1/metrics.jsonl" >"$T/m1"
  sed 's/,"time.*//' "$T/$name.2/metrics.jsonl" >"$T/m2"
  diff "$T/m1" "$T/m2" || fail "$name: metrics differ after resuming"
  cmp "$T/$name.1/model.safetensors" "$T/$name.2/model.safetensors" || fail "$name: weights differ after resuming"
}

echo "== resume: 6 steps straight == 3 steps, stop, resume"
resume_exact s checkpoint-3
echo "== num_iterations=2: a stop (or checkpoint) mid-batch waits for the batch's last step; resume is exact"
resume_exact i checkpoint-4 num_iterations=2

echo "== filter_groups: groups whose rewards are all equal are dropped and more prompts sampled"
"$G" $common output_dir="$T/fg" max_steps=4 reward_funcs=accuracy filter_groups=true max_num_gen_batches=3 \
  log_completions=true >"$T/fg.log" 2>&1 || { cat "$T/fg.log"; fail "filter_groups run"; }
# every step trains on its 32 completions; the groups of 8 whose rewards are all equal are only
# those the last batch allowed kept (kept_zero_std_groups), and at least one group was dropped
sed 's/.*"step":\([0-9]*\),.*"reward":\([-0-9.e+]*\),.*/\1 \2/' "$T/fg/completions.jsonl" |
  awk '{ i = c[$1] + 0; c[$1] = i + 1; k = $1 ":" int(i / 8); if (!(k in lo) || $2 < lo[k]) lo[k] = $2; if (!(k in hi) || $2 > hi[k]) hi[k] = $2 }
       END { for (k in lo) { n++; z += lo[k] == hi[k] } for (s in c) if (c[s] != 32) bad = 1
             print n " groups trained, " z " of them of equal rewards"; print z >"/dev/stderr"; exit bad || n != 16 }' \
  2>"$T/fg.z" || fail "filter_groups: a step did not train on 32 completions"
kept=$(field 'filter_groups\/kept_zero_std_groups' <"$T/fg/metrics.jsonl" | awk '{ s += $1 } END { print s }')
zero=$(field 'filter_groups\/zero_std_groups' <"$T/fg/metrics.jsonl" | awk '{ s += $1 } END { print s }')
batches=$(field 'filter_groups\/num_gen_batches' <"$T/fg/metrics.jsonl" | tr '\n' ' ')
echo "zero-std groups generated $zero, kept $kept; batches per step: $batches"
[ "$(cat "$T/fg.z")" = "$kept" ] || fail "filter_groups: $(cat "$T/fg.z") trained groups of equal rewards, $kept counted as kept"
awk -v z="$zero" -v k="$kept" 'BEGIN { exit !(z > k) }' || fail "filter_groups dropped nothing (no group of equal rewards?)"
expect 2 "key 'max_num_gen_batches': caps filter_groups' batches, and filter_groups is false" \
  "$G" $common output_dir="$T/x" max_num_gen_batches=2
echo "== filter_groups: resume is exact (the extra batches' data position is in the checkpoint)"
resume_exact fgr checkpoint-3 reward_funcs=accuracy filter_groups=true max_num_gen_batches=3

echo "== remote reward against the bundled server"
start_server() {  # start_server MODE: sets $server and $port (a port file of its own)
  "$BIN/ctune-reward-server" port=0 mode="$1" >"$T/port.$1" 2>"$T/server.log" &
  server=$!
  i=0
  while [ ! -s "$T/port.$1" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
  port=$(head -1 "$T/port.$1")
  [ -n "$port" ] || fail "the reward server did not start"
}
start_server ok
"$G" $common output_dir="$T/remote" max_steps=2 reward_funcs=remote reward_url="http://127.0.0.1:$port/score" \
  >"$T/remote.log" 2>&1 || { cat "$T/remote.log"; fail "remote reward run"; }
grep -q '"rewards/remote/mean"' "$T/remote/metrics.jsonl" || fail "no remote reward metric"
grep -q "POST" "$T/server.log" || fail "the server saw no request"
kill $server; wait $server 2>/dev/null || true; server=""
start_server 500
expect 1 "HTTP 500" "$G" $common output_dir="$T/x" max_steps=1 reward_funcs=remote \
  reward_url="http://127.0.0.1:$port/score" reward_retries=1 reward_backoff=0.01
"$G" $common output_dir="$T/nan" max_steps=1 reward_funcs=remote reward_url="http://127.0.0.1:$port/score" \
  reward_retries=0 reward_failure=nan >"$T/nan.log" 2>&1 || { cat "$T/nan.log"; fail "reward_failure=nan run"; }
kill $server; wait $server 2>/dev/null || true; server=""

echo "== bad settings fail before any rollout"
expect 2 "reward_funcs" "$G" $common output_dir="$T/x" reward_funcs=magic
expect 2 "answer_regex" "$G" $common output_dir="$T/x" answer_regex="(unclosed"
expect 2 "num_generations" "$G" $common output_dir="$T/x" num_generations=5
expect 1 "max_prompt_length 3" "$G" $common output_dir="$T/x" max_prompt_length=3
expect 2 "key 'loss_type': 'sigmoid' is not one of grpo, bnpo, dr_grpo, dapo" "$G" $common output_dir="$T/x" loss_type=sigmoid
echo "grpo end-to-end: all checks passed"
