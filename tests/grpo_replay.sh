#!/bin/sh
# A GRPO update is reproducible from its logged rollouts alone: bin/ctune-grpo-replay
# recomputes each step's loss and AdamW step from the starting weights and
# completions.jsonl (prompts, completion_ids, advantages), without the trainer's rollout
# path, and must give the logged loss and grad_norm (1e-5 relative) and the very same
# saved model. The step-1 loss is also recomputed here from the rows alone (ratio 1, KL 0).
. tests/lib/common.sh
grpo_test grpo_replay 40 64 192
keys="configs/grpo.yml model_path=$T/sft answer_field=completion per_device_train_batch_size=8
      gradient_accumulation_steps=2 num_generations=8 max_completion_length=6 logging_steps=1 save_steps=0
      learning_rate=1e-3 reward_funcs=length,accuracy length_target=3 max_steps=2 beta=0.04
      mask_truncated_completions=true"
# run_and_replay DIR KEYS...: bin/grpo into $T/DIR, its replay into $T/DIR.replay; the
# logged loss and grad_norm (1e-5 relative), the saved model (bit for bit) and the logged
# log-probs must match
run_and_replay() {
  d=$1
  shift
  "$BIN/grpo" "$@" dataset_path="$T/prompts.jsonl" output_dir="$T/$d" >"$T/run.log" 2>&1 \
    || { cat "$T/run.log"; fail "grpo run ($d)"; }
  "$BIN/ctune-grpo-replay" "$@" dataset_path="$T/$d/completions.jsonl" output_dir="$T/$d.replay" >"$T/replay.log" 2>&1 \
    || { cat "$T/replay.log"; fail "replay ($d)"; }
  for k in loss grad_norm; do
    field $k "$T/$d/metrics.jsonl" >"$T/a"
    field $k "$T/$d.replay/metrics.jsonl" >"$T/b"
    [ "$(wc -l <"$T/b")" = 2 ] || fail "the replay logged $(wc -l <"$T/b") steps, not 2 ($d)"
    paste "$T/a" "$T/b" | awk -v k=$k '{ d = $1 - $2; if (d < 0) d = -d; print k ": logged " $1 ", replayed " $2;
                                         if (d > 1e-5 * ($1 < 0 ? -$1 : $1)) bad = 1 } END { exit bad }' \
      || fail "replayed $k differs from the logged one ($d)"
  done
  cmp "$T/$d/model.safetensors" "$T/$d.replay/model.safetensors" || fail "the replayed model differs from the trained one ($d)"
  # the sampler's logged log-probs are the ones training computes (same numerics)
  field 'replay\/max_logprob_diff' "$T/$d.replay/metrics.jsonl" | awk '{ print "max |sampling - training log-prob|: " $1;
    if ($1 > 1e-4) bad = 1 } END { exit bad }' || fail "logged log-probs differ from the training forward's ($d)"
}
field() { sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p" "$2"; }
run_and_replay run $keys
# a group's completions train in one row behind their prompt (share_prompts): step 1 (the
# same rollouts) has the loss and grad_norm of one row per completion, within float rounding
grep -q "share_prompts: a prompt's completions train in one row" "$T/run.log" || fail "the run did not share its prompts"
"$BIN/grpo" $keys share_prompts=false dataset_path="$T/prompts.jsonl" output_dir="$T/alone" >"$T/alone.log" 2>&1 \
  || { cat "$T/alone.log"; fail "grpo run (share_prompts=false)"; }
! grep -q "share_prompts:" "$T/alone.log" || fail "share_prompts=false still shares"
grep '^{"step":1,' "$T/run/completions.jsonl" >"$T/c1"
grep '^{"step":1,' "$T/alone/completions.jsonl" | cmp - "$T/c1" || fail "step 1's rollouts differ with share_prompts=false"
for k in loss grad_norm; do
  a=$(field $k "$T/run/metrics.jsonl" | head -1) b=$(field $k "$T/alone/metrics.jsonl" | head -1)
  echo "step 1 $k: shared prompts $a, one row per completion $b"
  awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 2e-5 * (b < 0 ? -b : b) + 1e-7) }' \
    || fail "step 1's $k differs with shared prompts"
done
# step 1 from the rows alone: dapo at ratio 1 with the policy still the reference (KL 0) is
# -Σ A·n / Σ n over completions not masked (finish_reason length are masked here)
grep '^{"step":1,' "$T/run/completions.jsonl" | sed 's/.*"completion_ids":\[\([^]]*\)\].*"finish_reason":"\([a-z]*\)".*"advantage":\([-0-9.e+]*\).*/\1 \2 \3/' |
  awk -v logged="$(field loss "$T/run/metrics.jsonl" | head -1)" '
    $2 == "stop" { n = split($1, _, ","); s += $3 * n; t += n }
    END { l = -s / t; d = l - logged; if (d < 0) d = -d; print "step-1 loss from the rows: " l ", logged " logged
          exit !(t > 0 && d <= 1e-5 * (l < 0 ? -l : l) + 1e-7) }' || fail "step-1 loss from the rows differs"
# GSPO's sequence-level ratio with SAPO's gate, the KL with its bias correction and the
# off-policy mask: these need every token of a completion before any coefficient, so the
# head runs unfused; the replay must agree all the same. At step 1 (ratio 1, policy = its
# reference) each completion's token loss is -sigmoid(0)*4/tau*A = -2A/tau (tau 1 for A > 0,
# else 1.05), averaged as grpo over all 16 completions, truncated ones counting 0
run_and_replay sapo $keys loss_type=sapo importance_sampling_level=sequence use_bias_correction_kl=true \
  off_policy_mask_threshold=0.5 vllm_importance_sampling_correction=true vllm_importance_sampling_mode=sequence_truncate
# the sampler against the training forward, in float32: the same numerics, ratios of 1
for k in sampling/sampling_logp_difference/max sampling/importance_sampling_ratio/min \
         sampling/importance_sampling_ratio/max; do
  field "$(echo $k | sed 's|/|\\/|g')" "$T/sapo/metrics.jsonl" | awk -v k=$k '{ d = $1; if (k ~ /ratio/) d -= 1; if (d < 0) d = -d
    if (d > 1e-4) bad = 1; n++ } END { print k ": within 1e-4 of " (k ~ /ratio/ ? 1 : 0) " at every step"; exit bad || n != 2 }' \
    || fail "$k is off in a float32 run"
done
grep '^{"step":1,' "$T/sapo/completions.jsonl" | sed 's/.*"finish_reason":"\([a-z]*\)".*"advantage":\([-0-9.e+]*\).*/\1 \2/' |
  awk -v logged="$(field loss "$T/sapo/metrics.jsonl" | head -1)" '
    { n++ } $1 == "stop" { s += -2 * $2 / ($2 > 0 ? 1 : 1.05) }
    END { l = s / n; d = l - logged; if (d < 0) d = -d; print "sapo step-1 loss from the rows: " l ", logged " logged
          exit !(n == 16 && d <= 1e-5 * (l < 0 ? -l : l) + 1e-7) }' || fail "sapo's step-1 loss from the rows differs"
# vespo: its weight φ needs the whole completion's log-ratios; at step 1 (ratios 1) φ = 1 and
# the loss is −Σ A·lp / Σ n over the completions not masked (its log-probs are the logged ones)
run_and_replay vespo $keys loss_type=vespo vllm_importance_sampling_correction=true \
  vllm_importance_sampling_mode=token_truncate
grep -q '"vespo/phi_seq_mean"' "$T/vespo/metrics.jsonl" || fail "vespo logs no vespo/phi_seq_mean"
grep '^{"step":1,' "$T/vespo/completions.jsonl" |
  sed 's/.*"logprobs":\[\([^]]*\)\].*"finish_reason":"\([a-z]*\)".*"advantage":\([-0-9.e+]*\).*/\1 \2 \3/' |
  awk -v logged="$(field loss "$T/vespo/metrics.jsonl" | head -1)" '
    $2 == "stop" { n = split($1, lp, ","); for (i = 1; i <= n; i++) s -= $3 * lp[i]; t += n }
    END { l = s / t; d = l - logged; if (d < 0) d = -d; print "vespo step-1 loss from the rows: " l ", logged " logged
          exit !(t > 0 && d <= 1e-4 * (l < 0 ? -l : l) + 1e-6) }' || fail "vespo's step-1 loss from the rows differs"
# the entropy mask's quantile spans the micro-batch: computed before any coefficient, as GSPO
run_and_replay entropy $keys top_entropy_quantile=0.3 vllm_importance_sampling_correction=true \
  vllm_importance_sampling_mode=token_mask
expect 1 "not a completions.jsonl row" "$BIN/ctune-grpo-replay" $keys dataset_path="$T/prompts.jsonl" output_dir="$T/x"
expect 1 "not the same number for every step" "$BIN/ctune-grpo-replay" $keys dataset_path="$T/run/completions.jsonl" \
  output_dir="$T/x" max_steps=3
# completion ids are bounded by the model's vocab_size (what its sampler draws), not the tokenizer's
V=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$T/sft/config.json")
sed '1s/"completion_ids":\[[0-9]*/"completion_ids":['"$V"'/' "$T/run/completions.jsonl" >"$T/big.jsonl"
expect 1 "big.jsonl:1: key 'completion_ids'\[0\]: token id $V is not below the model's vocab_size $V" \
  "$BIN/ctune-grpo-replay" $keys dataset_path="$T/big.jsonl" output_dir="$T/x"
expect 2 "num_iterations" "$BIN/ctune-grpo-replay" $keys dataset_path="$T/run/completions.jsonl" output_dir="$T/x" \
  num_iterations=2
echo "grpo replay: loss, grad_norm and the model match"
