#!/bin/sh
# bin/sft with optimizer: muon end to end: it learns the tiny reverse task (faster than the
# loss-halving bar sft_e2e sets AdamW), a stopped and resumed run equals a straight one bit
# for bit (the momentum lives in optimizer.safetensors' exp_avg), and the combinations
# Muon cannot serve are one-line errors before any work. Run by tests/run.sh.
. tests/lib/common.sh
start_test muon_e2e

tiny_sft 'logging_steps: 1' 'optimizer: muon'


echo "== learning: 150 Muon steps take the loss below 0.4 x its start, accuracy up by 0.2"
"$BIN/sft" "$T/tiny.yml" output_dir="$T/learn" max_steps=150 eval_on_start=true save_steps=0 \
  >"$T/learn.log" 2>&1 || { cat "$T/learn.log"; fail "training failed"; }
grep -q "Muon momentum + AdamW moments" "$T/learn.log" || fail "the memory plan does not count Muon's state"
learned "$T/learn" 0.4 0.2 "loss did not fall below 0.4 x its start"

echo "== resume: 12 steps straight == 5 steps, stop, resume, 7 steps (bit for bit)"
common="max_steps=12 save_steps=3 eval_dataset_path= per_device_train_batch_size=8 gradient_accumulation_steps=2"
straight_and_stopped 5
grep -q '"optimizer": *"muon"' "$T/resumed/checkpoint-5/trainer_state.json" || fail "trainer_state.json does not say muon"
resume_stopped
resumed_equals_straight losses 12 steps
cmp "$T/straight/checkpoint-12/optimizer.safetensors" "$T/resumed/checkpoint-12/optimizer.safetensors" \
  || fail "optimizer state differs after resuming"
# The same run with AdamW ends elsewhere: the option is really in effect.
"$BIN/sft" "$T/tiny.yml" output_dir="$T/adamw" $common optimizer=adamw >"$T/e.log" 2>&1 \
  || { cat "$T/e.log"; fail "adamw run"; }
! cmp -s "$T/straight/model.safetensors" "$T/adamw/model.safetensors" || fail "muon and adamw give the same model"

echo "== clear errors before any work"
S="$BIN/sft $T/tiny.yml output_dir=$T/err"
expect 2 "muon_momentum' acts on Muon's matrices, and optimizer is adamw" $S optimizer=adamw muon_momentum=0.9
expect 2 "key 'optimizer': muon orthogonalizes whole matrices, and LoRA" $S use_peft=true
expect 2 "key 'optimizer': muon orthogonalizes whole matrices, and ZeRO-1's shards" $S optimizer_sharding=true
expect 2 "key 'optimizer': 'sgd' is not one of" $S optimizer=sgd
expect 2 "the checkpoint's optimizer state is muon's, and optimizer is adamw; resume with optimizer: muon" \
  $S optimizer=adamw $common resume_from_checkpoint="$T/resumed/checkpoint-5"
expect 2 "the checkpoint's optimizer state is adamw's, and optimizer is muon; resume with optimizer: adamw" \
  $S $common resume_from_checkpoint="$T/adamw/checkpoint-3"
printf 'base_config: %s\noptim: muon\n' "$T/tiny.yml" >"$T/trl.yml"
"$BIN/ctune-config" resolve sft "$T/trl.yml" | grep -q '^optimizer: muon' || fail "TRL's optim: muon is not optimizer: muon"
if command -v mpirun >/dev/null; then
  echo "== DiLoCo with Muon inner steps (2 ranks): a stop and resume repeats the straight run"
  root=""
  [ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
  dl="max_steps=12 save_steps=4 diloco_inner_steps=4 eval_dataset_path= per_device_train_batch_size=4 num_threads=1"
  mpirun $root --oversubscribe -np 2 "$BIN/sft" "$T/tiny.yml" output_dir="$T/dl" $dl >"$T/dl.log" 2>&1 \
    || { cat "$T/dl.log"; fail "DiLoCo straight run"; }
  grep -q "DiLoCo: 4 local Muon steps between syncs of 2 ranks" "$T/dl.log" || fail "DiLoCo does not say Muon"
  rc=0
  CT_STOP_AFTER_STEP=5 mpirun $root --oversubscribe -np 2 "$BIN/sft" "$T/tiny.yml" output_dir="$T/dr" $dl \
    >"$T/dr1.log" 2>&1 || rc=$?
  [ "$rc" = 130 ] || { cat "$T/dr1.log"; fail "interrupted DiLoCo run exited $rc, expected 130"; }
  mpirun $root --oversubscribe -np 2 "$BIN/sft" "$T/tiny.yml" output_dir="$T/dr" $dl resume_from_checkpoint=latest \
    >"$T/dr2.log" 2>&1 || { cat "$T/dr2.log"; fail "DiLoCo resumed run"; }
  cmp "$T/dl/model.safetensors" "$T/dr/model.safetensors" || fail "DiLoCo + Muon: weights differ after resuming"
else
  echo "(mpirun missing: DiLoCo + Muon not checked)"
fi
echo "muon e2e: all checks passed"
