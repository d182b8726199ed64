#!/bin/sh
# bin/dpo loss_type=kto (TRL's KTOTrainer) end to end on the demo task's unpaired version
# (ctune-demo-data reverse-kto): step 1's loss is 1/2 of each example's weight (policy =
# reference, KL 0); held-out loss falls and the reward margin rises; TRL's KTO metrics (and
# eval_ ones), the KL estimate never below 0 and not always 0; a paired file unpaired as TRL
# does; apo_zero_unpaired with precomputed reference log-probs equal to a resident
# reference; LoRA + bf16; 2 MPI ranks; resume bit for bit; clear errors for bad input.
. tests/lib/common.sh
start_test kto

reverse_sft "$T/sft.jsonl" "$T/sft_eval.jsonl" 20 21 6 "$T/sft" 200 128 384
"$BIN/ctune-demo-data" reverse-kto "$T/kto.jsonl" "$T/kto_eval.jsonl" 800 100 22 6
"$BIN/ctune-demo-data" reverse-prefs "$T/prefs.jsonl" "$T/prefs_eval.jsonl" 40 10 23 6
D="$BIN/dpo"
common="configs/kto.yml model_path=$T/sft dataset_path=$T/kto.jsonl max_length=24 logging_steps=1
        per_device_train_batch_size=8 learning_rate=5e-5 lr_scheduler_type=constant save_steps=0"
steps() { grep '"rewards/' "$1" | grep -v eval_; }

echo "== step 1: every example's loss is half its weight (desirable_weight 2, undesirable 1)"
"$D" $common output_dir="$T/w" max_steps=1 shuffle_dataset=false desirable_weight=2 >"$T/w.log" 2>&1 \
  || { cat "$T/w.log"; fail "kto step 1"; }
grep -q "unpaired examples (" "$T/w.log" || { cat "$T/w.log"; fail "no data line for unpaired examples"; }
nd=$(head -8 "$T/kto.jsonl" | grep -c '"label": true' || true)
l=$(steps "$T/w/metrics.jsonl" | head -1 | field loss)
echo "first 8 rows: $nd desirable; step-1 loss $l"
awk -v l="$l" -v d="$nd" 'BEGIN { w = 0.5 * (2 * d + (8 - d)) / 8; x = l - w; exit !(x < 1e-6 && x > -1e-6) }' \
  || fail "step-1 loss $l is not 0.5 x (2 x $nd + $((8 - nd))) / 8"

echo "== held-out loss falls below 1/2 and the reward margin rises; KL never below 0"
"$D" $common output_dir="$T/a" max_steps=60 eval_dataset_path="$T/kto_eval.jsonl" eval_on_start=true \
  eval_steps=30 >"$T/a.log" 2>&1 || { cat "$T/a.log"; fail "kto run"; }
m="$T/a/metrics.jsonl"
l0=$(grep eval_loss "$m" | head -1 | field eval_loss)
l1=$(grep eval_loss "$m" | tail -1 | field eval_loss)
g1=$(grep eval_loss "$m" | tail -1 | field 'eval_rewards\/margins')
echo "held-out loss $l0 -> $l1, reward margin 0 -> $g1"
awk -v a="$l0" -v b="$l1" -v g="$g1" 'BEGIN { d = a - 0.5; exit !(d < 1e-6 && d > -1e-6 && b < 0.495 && g > 0.05) }' \
  || fail "no gain: held-out loss $l0 -> $l1, margin $g1"
for k in loss kl rewards/chosen rewards/rejected rewards/margins logps/chosen logps/rejected logits/chosen \
         logits/rejected entropy; do
  grep -q "\"$k\"" "$m" || fail "metrics lack $k"
  grep -q "\"eval_$k\"" "$m" || fail "metrics lack eval_$k"
done
! grep -q '"rewards/accuracies"\|"nll_loss"' "$m" || fail "a DPO metric in a KTO run"
kls=$(steps "$m" | field kl | sort -g)
echo "kl over the steps: $(echo "$kls" | head -1) .. $(echo "$kls" | tail -1)"
echo "$kls" | awk '$1 < 0 { bad = 1 } END { exit bad }' || fail "kl below 0"

echo "== the KL estimate: prompt 1 with completion 2 and prompt 2 with completion 1, policy against reference"
# a weaker policy (60 steps) than its reference (200): the mismatched pairs' log-ratio is > 0.
# DPO's logps/chosen at step 1 gives each model's mean log-prob of those two rows, independently.
small_sft "$T/sft.jsonl" "$T/weak" 60 128 384
get() { sed -n "$1p" "$T/kto.jsonl" | sed "s/.*\"$2\": \"\([^\"]*\)\".*/\1/"; }
p1=$(get 1 prompt) c1=$(get 1 completion) p2=$(get 2 prompt) c2=$(get 2 completion)
printf '{"prompt": "%s", "chosen": "%s", "rejected": "%s"}\n' "$p1" "$c2" "$c1" "$p2" "$c1" "$c2" >"$T/kl_rows.jsonl"
one="max_length=24 per_device_train_batch_size=2 shuffle_dataset=false max_steps=1 save_steps=0 logging_steps=1"
"$D" configs/kto.yml model_path="$T/weak" ref_model_path="$T/sft" dataset_path="$T/kto.jsonl" $one \
  output_dir="$T/kl" >"$T/kl.log" 2>&1 || { cat "$T/kl.log"; fail "kto kl run"; }
for who in weak sft; do
  "$D" configs/dpo.yml model_path="$T/$who" dataset_path="$T/kl_rows.jsonl" $one output_dir="$T/lp$who" \
    >"$T/lp$who.log" 2>&1 || { cat "$T/lp$who.log"; fail "log-probs of the KL rows ($who)"; }
done
kl=$(steps "$T/kl/metrics.jsonl" | field kl)
a=$(steps "$T/lpweak/metrics.jsonl" | field 'logps\/chosen')
b=$(steps "$T/lpsft/metrics.jsonl" | field 'logps\/chosen')
echo "kl $kl; the rows' mean log-prob: policy $a, reference $b"
awk -v k="$kl" -v a="$a" -v b="$b" 'BEGIN { w = a - b; if (w < 0) w = 0; d = k - w; if (d < 0) d = -d
  exit !(w > 0.05 && d < 1e-4 * (1 + w)) }' || fail "kl $kl is not max(0, $a - ($b))"

echo "== a paired file is unpaired as TRL does: each chosen answer desirable, each rejected one not"
"$D" $common dataset_path="$T/prefs.jsonl" output_dir="$T/pp" max_steps=2 >"$T/pp.log" 2>&1 \
  || { cat "$T/pp.log"; fail "kto on pairs"; }
grep -q "80 unpaired examples (40 desirable, 40 undesirable)" "$T/pp.log" || { cat "$T/pp.log"; fail "pairs not unpaired"; }

echo "== apo_zero_unpaired: precomputed reference log-probs give the same losses"
for p in false true; do
  "$D" $common loss_type=apo_zero_unpaired precompute_ref_log_probs=$p output_dir="$T/z$p" max_steps=6 \
    >"$T/z$p.log" 2>&1 || { cat "$T/z$p.log"; fail "apo_zero_unpaired precompute=$p"; }
done
grep -q "reference log-probs: one pass" "$T/ztrue.log" || fail "no precompute pass"
! grep -q '"kl"' "$T/zfalse/metrics.jsonl" || fail "apo_zero_unpaired logs kl (it estimates none)"
[ "$(steps "$T/zfalse/metrics.jsonl" | field loss)" = "$(steps "$T/ztrue/metrics.jsonl" | field loss)" ] ||
  fail "precomputed losses differ"

echo "== LoRA, bf16; resume bit for bit"
"$D" $common output_dir="$T/lora" max_steps=3 use_peft=true lora_r=4 bf16=true >"$T/lora.log" 2>&1 \
  || { cat "$T/lora.log"; fail "kto with LoRA and bf16"; }
[ -s "$T/lora/adapter_model.safetensors" ] || fail "no adapter saved"
"$D" $common output_dir="$T/s" max_steps=8 save_steps=4 >"$T/s.log" 2>&1 || { cat "$T/s.log"; fail "straight run"; }
stop_and_resume "$T/r" "$D" $common max_steps=8 save_steps=4
cmp "$T/s/model.safetensors" "$T/r/model.safetensors" || fail "resumed kto differs from the straight run"

if command -v mpirun >/dev/null; then
  echo "== 2 MPI ranks, and a last step (and an eval) where one rank holds fewer micro-batches: it joins the KL sums"
  MPIRUN="mpirun --oversubscribe"
  if [ "$(id -u)" -eq 0 ]; then MPIRUN="$MPIRUN --allow-run-as-root"; fi
  head -20 "$T/kto.jsonl" >"$T/k20.jsonl"  # 16 examples a step: the second step holds 4
  # shellcheck disable=SC2086
  timeout 120 $MPIRUN -np 2 "$D" $common dataset_path="$T/k20.jsonl" output_dir="$T/mpi" max_steps=-1 \
    num_train_epochs=1 per_device_train_batch_size=4 gradient_accumulation_steps=2 \
    eval_dataset_path="$T/kto_eval.jsonl" per_device_eval_batch_size=8 >"$T/mpi.log" 2>&1 \
    || { cat "$T/mpi.log"; fail "kto on 2 ranks"; }
  [ "$(steps "$T/mpi/metrics.jsonl" | wc -l)" = 2 ] || { cat "$T/mpi.log"; fail "2 ranks: not 2 steps logged"; }
  grep -q '"eval_kl"' "$T/mpi/metrics.jsonl" || { cat "$T/mpi.log"; fail "2 ranks: no eval (100 rows: 7 batches, 6 on rank 1)"; }
fi

echo "== bad input"
expect 2 "no other loss_type" "$D" $common output_dir="$T/e" loss_type=kto,sigmoid
expect 2 "cannot be precomputed" "$D" $common output_dir="$T/e" precompute_ref_log_probs=true
expect 2 "at least 2" "$D" $common output_dir="$T/e" per_device_train_batch_size=1
expect 2 "desirable_weight.*loss_type has neither" "$D" $common output_dir="$T/e" loss_type=sigmoid \
  desirable_weight=2
printf '{"prompt": "reverse ab:", "completion": "ba", "label": "yes"}\n' >"$T/bad.jsonl"
expect 1 "bad.jsonl:1: key 'label': expected true or false" "$D" $common output_dir="$T/e" dataset_path="$T/bad.jsonl"
printf '{"prompt": "reverse ab:", "label": true}\n' >"$T/bad.jsonl"
expect 1 "bad.jsonl:1: key 'completion' is missing" "$D" $common output_dir="$T/e" dataset_path="$T/bad.jsonl"
{ head -2 "$T/kto.jsonl"; head -1 "$T/prefs.jsonl"; } >"$T/mixed.jsonl"
expect 1 "mixed.jsonl:3: a paired row in a file of unpaired rows" "$D" $common output_dir="$T/e" \
  dataset_path="$T/mixed.jsonl"
echo "kto e2e: ok"
