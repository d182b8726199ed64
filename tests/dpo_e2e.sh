#!/bin/sh
# bin/dpo end to end: loss log 2 at step 0, reward accuracy rising, TRL's metrics (and
# eval_ ones), logits/* independent of num_vocab_tiling, RPO's nll_loss = its sft term,
# precomputed reference log-probs == a resident reference, bit-identical resume (also
# with a synced reference), SimPO without a reference, and clear errors for bad input.
. tests/lib/common.sh
start_test dpo

reverse_sft "$T/sft.jsonl" "$T/sft_eval.jsonl" 20 21 6 "$T/sft" 200 128 384
"$BIN/ctune-demo-data" reverse-prefs "$T/prefs.jsonl" "$T/prefs_eval.jsonl" 800 100 22 6
D="$BIN/dpo"
common="configs/dpo.yml model_path=$T/sft dataset_path=$T/prefs.jsonl max_length=24 logging_steps=1
        per_device_train_batch_size=8 learning_rate=2e-4 lr_scheduler_type=constant save_steps=0"
steps() { grep '"rewards/accuracies"' "$1" | grep -v eval_; }

echo "== step 0 loss is log 2; held-out reward accuracy rises"
"$D" $common output_dir="$T/a" max_steps=40 eval_dataset_path="$T/prefs_eval.jsonl" eval_on_start=true \
  >"$T/a.log" 2>&1 || { cat "$T/a.log"; fail "dpo run"; }
grep -q "training 40 steps of up to 8 pairs (8 per device x 1 accumulation x 1 ranks); each epoch of 800 pairs" "$T/a.log" \
  || grep -q "training 40 steps of 8 pairs (8 per device" "$T/a.log" || { cat "$T/a.log"; fail "no plan line for pairs"; }
first=$(steps "$T/a/metrics.jsonl" | head -1 | field loss)
awk -v l="$first" 'BEGIN { d = l - log(2); exit !(d < 1e-6 && d > -1e-6) }' || fail "first loss $first is not log 2"
acc1=$(grep eval_loss "$T/a/metrics.jsonl" | tail -1 | field 'eval_rewards\/accuracies')
loss1=$(grep eval_loss "$T/a/metrics.jsonl" | tail -1 | field eval_loss)
echo "first loss $first; held-out rewards/accuracies 0 (policy = reference) -> $acc1, eval loss $loss1"
awk -v a="$acc1" -v l="$loss1" 'BEGIN { exit !(a >= 0.6 && l < log(2) - 0.03) }' || fail "reward accuracy did not rise"
for k in rewards/chosen rewards/rejected rewards/margins logps/chosen logps/rejected grad_norm \
         logits/chosen logits/rejected entropy mean_token_accuracy; do
  grep -q "\"$k\"" "$T/a/metrics.jsonl" || fail "metrics lack $k"
  [ $k = grad_norm ] || grep -q "\"eval_$k\"" "$T/a/metrics.jsonl" || fail "metrics lack eval_$k"
done
! grep -q nll_loss "$T/a/metrics.jsonl" || fail "nll_loss logged without an sft term"

echo "== logits/chosen does not depend on num_vocab_tiling"
"$D" $common output_dir="$T/vt" max_steps=1 num_vocab_tiling=4 >"$T/vt.log" 2>&1 || { cat "$T/vt.log"; fail "num_vocab_tiling=4"; }
for k in chosen rejected; do
  a=$(steps "$T/a/metrics.jsonl" | head -1 | field "logits\/$k")
  v=$(steps "$T/vt/metrics.jsonl" | head -1 | field "logits\/$k")
  echo "step-1 logits/$k: $a untiled, $v in 4 vocabulary chunks"
  awk -v a="$a" -v v="$v" 'BEGIN { d = a - v; if (d < 0) d = -d; exit !(a != "" && d < 1e-5) }' \
    || fail "logits/$k $v with num_vocab_tiling=4, $a without"
done

echo "== RPO (loss_type sigmoid,sft) logs nll_loss: at step 1 (policy = reference) it is loss - log 2"
"$D" $common output_dir="$T/rpo" max_steps=2 loss_type=sigmoid,sft eval_dataset_path="$T/prefs_eval.jsonl" \
  >"$T/rpo.log" 2>&1 || { cat "$T/rpo.log"; fail "rpo run"; }
l=$(steps "$T/rpo/metrics.jsonl" | head -1 | field loss)
nll=$(steps "$T/rpo/metrics.jsonl" | head -1 | field nll_loss)
echo "step-1 loss $l, nll_loss $nll"
awk -v l="$l" -v n="$nll" 'BEGIN { d = l - log(2) - n; exit !(n > 0.1 && d < 1e-5 && d > -1e-5) }' \
  || fail "nll_loss $nll is not the sft term of loss $l"
grep -q '"eval_nll_loss"' "$T/rpo/metrics.jsonl" || fail "no eval_nll_loss"

echo "== gradient_checkpointing gives the same steps, bit for bit"
"$D" $common output_dir="$T/gc" max_steps=5 gradient_checkpointing=always >"$T/gc.log" 2>&1 || { cat "$T/gc.log"; fail "gc run"; }
[ "$(steps "$T/a/metrics.jsonl" | head -5 | sed 's/"tokens_per_s":[0-9.e+]*//; s/"epoch":[0-9.e+]*//')" = \
  "$(steps "$T/gc/metrics.jsonl" | sed 's/"tokens_per_s":[0-9.e+]*//; s/"epoch":[0-9.e+]*//')" ] \
  || fail "gradient_checkpointing changed the steps"

echo "== precomputed reference log-probs give the same losses"
losses() { steps "$1" | sed 's/.*"loss":\([-0-9.e+]*\).*"step":\([0-9]*\).*/\2 \1/'; }
"$D" $common output_dir="$T/p" max_steps=40 precompute_ref_log_probs=true >"$T/p.log" 2>&1 \
  || { cat "$T/p.log"; fail "precompute run"; }
grep -q "reference log-probs: one pass" "$T/p.log" || fail "no precompute pass"
[ -s "$T/p/ref_logps_train.safetensors" ] || fail "no cache file"
losses "$T/a/metrics.jsonl" >"$T/l1"
losses "$T/p/metrics.jsonl" >"$T/l2"
paste "$T/l1" "$T/l2" | awk '{ d = $2 - $4; if (d < 0) d = -d; if (d > 1e-5) { print; bad = 1 } } END { exit bad }' \
  || fail "losses differ with precomputed reference log-probs"

echo "== resume: straight == stopped + resumed, with a resident and with a synced reference"
for extra in "" "sync_ref_model=true ref_model_sync_steps=2"; do
  args="$common max_steps=10 save_steps=3 $extra"
  rm -rf "$T/s1" "$T/s2"
  "$D" $args output_dir="$T/s1" >"$T/s1.log" 2>&1 || { cat "$T/s1.log"; fail "straight run ($extra)"; }
  rc=0
  CT_STOP_AFTER_STEP=4 "$D" $args output_dir="$T/s2" >"$T/s2.log" 2>&1 || rc=$?
  [ "$rc" = 130 ] || { cat "$T/s2.log"; fail "interrupted run exited $rc"; }
  if [ -n "$extra" ]; then [ -s "$T/s2/checkpoint-4/ref_model.safetensors" ] || fail "the synced reference was not saved"; fi
  "$D" $args output_dir="$T/s2" resume_from_checkpoint=latest >"$T/s3.log" 2>&1 || { cat "$T/s3.log"; fail "resume ($extra)"; }
  losses "$T/s1/metrics.jsonl" >"$T/r1"
  losses "$T/s2/metrics.jsonl" >"$T/r2"
  diff "$T/r1" "$T/r2" || fail "losses differ after resuming ($extra)"
  cmp "$T/s1/model.safetensors" "$T/s2/model.safetensors" || fail "weights differ after resuming ($extra)"
done

echo "== a bf16 or int8 reference: step 0 is log 2 up to the reference's rounding"
for q in bfloat16 int8; do
  "$D" $common output_dir="$T/r$q" max_steps=2 ref_dtype=$q >"$T/r$q.log" 2>&1 || { cat "$T/r$q.log"; fail "ref_dtype=$q"; }
  l=$(steps "$T/r$q/metrics.jsonl" | head -1 | field loss)
  echo "ref_dtype $q: step-1 loss $l (float32 reference: $first)"
  awk -v l="$l" -v q=$q 'BEGIN { d = l - log(2); if (d < 0) d = -d; tol = q == "int8" ? 0.05 : 0.01; exit !(d > 0 && d < tol) }' \
    || fail "ref_dtype=$q: the first loss $l is not log 2 up to rounding (or exactly log 2: not narrowed)"
done

echo "== SimPO needs no reference model"
# a ref_model_path that does not exist stops any run that loads a reference ...
expect 1 "ref_model_path" "$D" $common output_dir="$T/x" max_steps=1 ref_model_path="$T/nowhere"
# ... but not SimPO, which never opens one
"$D" $common output_dir="$T/simpo" max_steps=3 loss_type=simpo ref_model_path="$T/nowhere" >"$T/simpo.log" 2>&1 \
  || { cat "$T/simpo.log"; fail "simpo"; }
grep -q "no reference model" "$T/simpo.log" || fail "simpo loaded a reference"
# its implicit rewards are β·mean log-prob, not β·(log-prob − the reference's): at step 1
# (policy = starting model) a reference would make them exactly 0, as in the sigmoid run
rc1=$(steps "$T/simpo/metrics.jsonl" | head -1 | field 'rewards\/chosen')
ra1=$(steps "$T/a/metrics.jsonl" | head -1 | field 'rewards\/chosen')
echo "step-1 rewards/chosen: simpo $rc1, sigmoid $ra1"
awk -v r="$rc1" -v a="$ra1" 'BEGIN { exit !(r < 0 && a == 0) }' || fail "simpo's step-1 rewards $rc1 are relative to a reference"

echo "== TRL's other pair losses: at step 1 (policy = reference, every log-ratio 0) each is its closed form"
b=0.1  # the run's beta (checked below against its config.yml)
for lw in "exo_pair 0.5*(log(0.5)-log(1-0.001))+0.5*(log(0.5)-log(0.001))" "nca_pair 2*log(2)" "bco_pair 2*log(2)" \
          "sppo_hard 2*(0.5/$b)^2" "apo_zero 1" "apo_down 1" "discopop 0.5*log(2)+0.5" "sigmoid_norm log(2)" \
          "aot log(2)" "aot_unpaired log(2)"; do
  l=${lw%% *} want=${lw#* }
  "$D" $common output_dir="$T/l_$l" max_steps=1 loss_type=$l label_smoothing=0.001 >"$T/l.log" 2>&1 \
    || { cat "$T/l.log"; fail "dpo loss_type=$l"; }
  got=$(steps "$T/l_$l/metrics.jsonl" | head -1 | field loss)
  grep -q "^beta: $b" "$T/l_$l/config.yml" || fail "the run's beta is not $b"
  awk -v g="$got" -v l=$l "BEGIN { w = $want; d = g - w; if (d < 0) d = -d; printf \"%s: step-1 loss %s, formula %.6g\\n\", l, g, w
                                   exit !(g != \"\" && d <= 1e-5 * (w < 0 ? -w : w) + 1e-6) }" || fail "$l's step-1 loss"
done
echo "== ORPO and CPO's losses (alphapo: AlphaPO's reward shape): no reference model, their NLL term logged, and they learn the preferences"
for l in orpo cpo cpo_hinge cpo_ipo "cpo_simpo beta=2" "alphapo alpha=0.25 beta=2"; do  # (SimPO's beta)
  # shellcheck disable=SC2086
  "$D" $common output_dir="$T/${l%% *}" max_steps=80 loss_type=$l ref_model_path="$T/nowhere" \
    eval_dataset_path="$T/prefs_eval.jsonl" \
    eval_on_start=true >"$T/${l%% *}.log" 2>&1 || { cat "$T/${l%% *}.log"; fail "$l"; }
  l=${l%% *}
  grep -q "no reference model" "$T/$l.log" || fail "$l loaded a reference"
  if [ $l = alphapo ]; then  # (TRL's alphapo: simpo with cpo_alpha 0)
    ! grep -q '"nll_loss"' "$T/$l/metrics.jsonl" || fail "alphapo logs an nll_loss"
  else
    grep -q '"nll_loss"' "$T/$l/metrics.jsonl" || fail "$l logs no nll_loss"
  fi
  if [ $l = orpo ]; then  # TRL's metrics of the odds ratio: log_odds_ratio = mean log σ(log_odds_chosen pair by pair)
    for k in log_odds_ratio log_odds_chosen eval_log_odds_ratio eval_log_odds_chosen; do
      grep -q "\"$k\"" "$T/$l/metrics.jsonl" || fail "orpo logs no $k"
    done
    # (log σ is concave: the mean of log σ is at most log σ of the mean)
    steps "$T/$l/metrics.jsonl" | head -1 | awk '{ match($0, /"log_odds_ratio":[-0-9.e+]*/); r = substr($0, RSTART + 17, RLENGTH - 17) + 0
      match($0, /"log_odds_chosen":[-0-9.e+]*/); c = substr($0, RSTART + 18, RLENGTH - 18) + 0
      print "orpo step 1: log_odds_chosen " c ", log_odds_ratio " r; exit !(r < 0 && r <= -log(1 + exp(-c)) + 1e-6) }' \
      || fail "orpo's log_odds_ratio is no mean log-sigmoid of its log odds"
  else
    ! grep -q log_odds "$T/$l/metrics.jsonl" || fail "$l logs ORPO's log_odds metrics"
  fi
  # the starting SFT model already ranks chosen above rejected (accuracy ~1 without a reference):
  # learning shows as the held-out loss and margin
  l0=$(grep eval_loss "$T/$l/metrics.jsonl" | head -1 | field eval_loss)
  l1=$(grep eval_loss "$T/$l/metrics.jsonl" | tail -1 | field eval_loss)
  m0=$(grep eval_loss "$T/$l/metrics.jsonl" | head -1 | field 'eval_rewards\/margins')
  m1=$(grep eval_loss "$T/$l/metrics.jsonl" | tail -1 | field 'eval_rewards\/margins')
  echo "$l: held-out loss $l0 -> $l1, rewards/margins $m0 -> $m1"
  awk -v a="$l0" -v b="$l1" -v c="$m0" -v d="$m1" 'BEGIN { exit !(b < 0.93 * a && d > 1.05 * c) }' || fail "$l did not learn"
done
expect 2 "key 'cpo_alpha': cpo's, and loss_type has no cpo" "$D" $common output_dir="$T/x" cpo_alpha=0.5
expect 2 "key 'alpha': the cpo losses' AlphaPO reward shape" "$D" $common output_dir="$T/x" alpha=0.25
expect 2 "key 'label_smoothing': exo_pair divides by it" "$D" $common output_dir="$T/x" loss_type=exo_pair
expect 2 "key 'discopop_tau': discopop's, and loss_type has no discopop" "$D" $common output_dir="$T/x" discopop_tau=0.1

echo "== bad input"
printf '{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "rejected": "c"}\n' >"$T/bad.jsonl"
expect 1 "bad.jsonl:2: key 'chosen' is missing" "$D" $common output_dir="$T/x" dataset_path="$T/bad.jsonl"
"$D" $common output_dir="$T/skip" dataset_path="$T/bad.jsonl" skip_bad_rows=true max_steps=1 >"$T/skip.log" 2>&1 \
  || { cat "$T/skip.log"; fail "skip_bad_rows"; }
grep -q "1 malformed rows skipped" "$T/skip.log" || fail "skipped row not counted"
printf '{"prompt": "a", "chosen": "", "rejected": "c"}\n' >"$T/empty.jsonl"
expect 1 "empty.jsonl:1: key 'chosen': the completion is empty" "$D" $common output_dir="$T/x" dataset_path="$T/empty.jsonl"
expect 1 "leaves no room" "$D" $common output_dir="$T/x" max_length=5
expect 2 "key 'loss_weights'" "$D" $common output_dir="$T/x" loss_type=sigmoid,sft loss_weights=1
expect 2 "precomputed" "$D" $common output_dir="$T/x" sync_ref_model=true precompute_ref_log_probs=true
expect 2 "key 'ref_dtype': sync_ref_model" "$D" $common output_dir="$T/x" sync_ref_model=true ref_dtype=bfloat16
expect 2 "does not apply to dpo" "$D" $common output_dir="$T/x" packing=true
echo "dpo end-to-end: all checks passed"
