#!/bin/sh
# What keeps a run's output_dir safe (the operator findings): one run per output_dir (a
# lock the kernel drops when a process dies), no output_dir that is one of the inputs,
# leftovers of a killed save removed, resume that checks what it resumes (model keys,
# data content, global batch, trainer_state values, every file's checksum), a checkpoint
# at the last step finishes the run, max_steps 0 and num_threads past the cores. (SIGTERM
# and Ctrl-C: tests/signals.sh.)
. tests/lib/common.sh
start_test run_safety

micro_sft
S="$BIN/sft"
tiny="$tiny logging_steps=1"
run() {  # run NAME ARGS...: a run that must succeed, log in $T/NAME.log
  name=$1; shift
  "$S" $tiny "$@" >"$T/$name.log" 2>&1 || { cat "$T/$name.log"; fail "run $name"; }
}

echo "== one run per output_dir: a second run stops at once naming the first one's pid"
CT_FAILPOINT=checkpoint "$S" $tiny output_dir="$T/o" max_steps=4 save_steps=2 >"$T/first.log" 2>&1 &
first=$!
i=0
while [ ! -d "$T/o/.tmp-checkpoint-2" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
[ -d "$T/o/.tmp-checkpoint-2" ] || { cat "$T/first.log"; fail "the first run did not reach its checkpoint"; }
expect 1 "sft: output_dir $T/o is in use by another run (pid $first" "$S" $tiny output_dir="$T/o" max_steps=2 seed=7
[ "$(grep -v OPENBLAS_CORETYPE "$T/expect.log" | grep -c .)" = 1 ] || fail "more than one line of error"
echo "== kill -9 leaves no stale lock; the next run removes the unfinished save"
kill -9 $first
wait $first 2>/dev/null || true
[ -d "$T/o/.tmp-checkpoint-2" ] || fail "no unfinished save to clean up"
run again output_dir="$T/o" max_steps=2 save_steps=0
grep -q "removed 1 unfinished save" "$T/again.log" || { cat "$T/again.log"; fail "no word about the leftover"; }
[ ! -e "$T/o/.tmp-checkpoint-2" ] || fail ".tmp-checkpoint-2 is still there"

echo "== an output_dir that is an input is refused"
expect 2 "key 'model_path' is output_dir" "$S" $tiny model_path="$T/o" output_dir="$T/o/." max_steps=1
[ -f "$T/o/model.safetensors" ] || fail "the input model was touched"

echo "== resume checks what it resumes"
run base output_dir="$T/r" max_steps=6 save_steps=2
expect 2 "key 'model.hidden_size' is 64 but the model in $T/r/checkpoint-6 has 32" \
  "$S" $tiny output_dir="$T/r" max_steps=8 resume_from_checkpoint=latest model.hidden_size=64
expect 1 "global batch of 8, this run's is 16" \
  "$S" $tiny output_dir="$T/r" max_steps=8 resume_from_checkpoint=latest per_device_train_batch_size=16
# the same rows in another order: as many sequences, other data
awk 'NR % 2 == 0' "$T/train.jsonl" >"$T/shuffled.jsonl"
awk 'NR % 2 == 1' "$T/train.jsonl" >>"$T/shuffled.jsonl"
expect 1 "saved training on other data" \
  "$S" $tiny output_dir="$T/r" max_steps=8 resume_from_checkpoint=latest dataset_path="$T/shuffled.jsonl"
# two ranks trained it: one rank would halve the global batch (8 -> 4 per step here)
root=""
[ "$(id -u)" = 0 ] && root="--allow-run-as-root"
mpirun $root --oversubscribe -np 2 "$S" $tiny output_dir="$T/mp" max_steps=2 save_steps=2 per_device_train_batch_size=4 \
  >"$T/mp.log" 2>&1 || { cat "$T/mp.log"; fail "two-rank run"; }
expect 1 "global batch of 8, this run's is 4 (per_device_train_batch_size x gradient_accumulation_steps x 1 ranks)" \
  "$S" $tiny output_dir="$T/mp" max_steps=4 per_device_train_batch_size=4 resume_from_checkpoint=latest
cp -r "$T/r/checkpoint-4" "$T/c4"
sed -i 's/"global_step": 4/"global_step": -3/' "$T/c4/trainer_state.json"
expect 1 "global_step is out of range" "$S" $tiny output_dir="$T/r2" max_steps=8 resume_from_checkpoint="$T/c4"
cp -r "$T/r/checkpoint-4" "$T/c4b"
sed -i 's/"epoch_pos": [0-9]*/"epoch_pos": 99999/' "$T/c4b/trainer_state.json"
expect 1 "ctune.epoch_pos (past the end of the data)" "$S" $tiny output_dir="$T/r2" max_steps=8 resume_from_checkpoint="$T/c4b"
cp -r "$T/r/checkpoint-4" "$T/c4c"
sed -i '0,/"[0-9a-f]\{16\}"/s//"zz"/' "$T/c4c/trainer_state.json"
expect 1 "is out of range or unreadable" "$S" $tiny output_dir="$T/r2" max_steps=8 resume_from_checkpoint="$T/c4c"
# a LoRA checkpoint resumed without use_peft, and a whole model's with it: named, not "config.json: unable to open"
run lora output_dir="$T/lo" max_steps=2 save_steps=2 model_path="$T/r" use_peft=true
expect 2 "key 'use_peft': $T/lo/checkpoint-2 holds a LoRA adapter (adapter_model.safetensors), not a model" \
  "$S" $tiny output_dir="$T/lo" max_steps=4 model_path="$T/r" resume_from_checkpoint=latest
expect 2 "key 'use_peft': $T/r/checkpoint-4 holds a whole model (model.safetensors), not LoRA adapters" \
  "$S" $tiny output_dir="$T/r3" max_steps=8 resume_from_checkpoint="$T/r/checkpoint-4" use_peft=true model_path="$T/r"
echo "== a flipped byte in a saved tensor file is named at load"
cp -r "$T/r/checkpoint-4" "$T/c4d"
printf '\001' | dd of="$T/c4d/model.safetensors" bs=1 seek=5000 conv=notrunc 2>/dev/null
expect 1 "c4d/model.safetensors: changed since it was saved" "$S" $tiny output_dir="$T/r2" max_steps=8 resume_from_checkpoint="$T/c4d"
cp -r "$T/r/checkpoint-4" "$T/c4e"
rm "$T/c4e/optimizer.safetensors"
expect 1 "c4e/optimizer.safetensors: missing" "$S" $tiny output_dir="$T/r2" max_steps=8 resume_from_checkpoint="$T/c4e"

echo "== a checkpoint at the last step (killed before the final save) finishes the run"
rm "$T/r/model.safetensors"
run finish output_dir="$T/r" max_steps=6 resume_from_checkpoint=latest
[ -f "$T/r/model.safetensors" ] || fail "no final model"
grep -q "at the last step (6): writing the final model" "$T/finish.log" || fail "no word about finishing"
cmp "$T/r/model.safetensors" "$T/r/checkpoint-6/model.safetensors" || fail "the final model is not checkpoint-6's"

echo "== a kill during rotation never leaves a partial checkpoint that resumes"
mkdir "$T/r/.tmp-delete-checkpoint-2"
run rot output_dir="$T/r" max_steps=8 resume_from_checkpoint=latest save_steps=2 save_total_limit=1
[ ! -e "$T/r/.tmp-delete-checkpoint-2" ] || fail "the half-removed checkpoint is still there"
[ "$(ls -d "$T/r"/checkpoint-* | wc -l)" = 1 ] || fail "save_total_limit=1 kept $(ls -d "$T/r"/checkpoint-*)"

echo "== bounds"
expect 2 "key 'max_steps': 0 would train nothing" "$S" $tiny output_dir="$T/b" max_steps=0
expect 1 "/dev/zero:1: line is longer than 256 MiB" "$S" $tiny output_dir="$T/z" dataset_path=/dev/zero
run threads output_dir="$T/th" max_steps=1 num_threads=4096
grep -q "num_threads 4096 is more than this machine's" "$T/threads.log" || fail "no warning for num_threads"
echo "== progress within a step: a line at most every CT_PROGRESS_SECONDS (30) when not a terminal"
CT_PROGRESS_SECONDS=0 "$S" $tiny output_dir="$T/p" max_steps=2 gradient_accumulation_steps=2 \
  per_device_train_batch_size=4 >"$T/progress.log" 2>&1 || { cat "$T/progress.log"; fail "progress run"; }
grep -q "^ctune: step 2/2: training 1/2 micro-batches, [0-9]* tok/s, phase ETA " "$T/progress.log" \
  || { cat "$T/progress.log"; fail "no progress line within a step"; }
CT_PROGRESS_SECONDS=0 "$BIN/grpo" configs/grpo.yml model_path="$T/r" dataset_path="$T/train.jsonl" \
  answer_field=completion output_dir="$T/pg" max_steps=1 per_device_train_batch_size=4 num_generations=4 \
  gradient_accumulation_steps=2 max_completion_length=4 save_steps=0 >"$T/pg.log" 2>&1 || { cat "$T/pg.log"; fail "grpo progress run"; }
grep -q "^ctune: step 1/1: rollouts 4/8 completions, [0-9]* tok/s, phase ETA " "$T/pg.log" \
  || { cat "$T/pg.log"; fail "no rollout progress line"; }
grep -q "^ctune: step 1/1: training 1/2 micro-batches, [0-9]* tok/s, phase ETA [0-9:]*, reward [0-9.]*$" "$T/pg.log" \
  || { cat "$T/pg.log"; fail "no GRPO training progress line with the reward"; }
run quiet output_dir="$T/q" max_steps=2 gradient_accumulation_steps=2 per_device_train_batch_size=4
grep -q "micro-batches" "$T/quiet.log" && fail "progress lines faster than every 30 s"
echo "== logging_first_step logs step 1 besides every logging_steps and the last"
run first output_dir="$T/lf" max_steps=3 logging_steps=10 logging_first_step=true
[ "$(grep -o '"step":[0-9]*' "$T/lf/metrics.jsonl" | tr '\n' ' ')" = '"step":1 "step":3 ' ] \
  || { cat "$T/lf/metrics.jsonl"; fail "logging_first_step: expected steps 1 and 3"; }
echo "run safety: all checks passed"
