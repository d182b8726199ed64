#!/bin/sh
# For changes that must not change behaviour (moving code, splitting files): runs every trainer and
# tool on small fixed-seed jobs with two builds and compares what they wrote. metrics.jsonl is
# compared with its timing fields removed (time/..., tokens_per_s, ...); every other file a run
# saves (safetensors, config.json, trainer_state.json, completions.jsonl, checkpoints) byte for byte.
# usage: scripts/same-outputs.sh OLD_BIN NEW_BIN [WORK_DIR]   (e.g. a copy of bin/ kept from before)
# Exits 1 naming the first files that differ. Takes about two minutes on 2 cores.
set -eu
OLD=$(cd "$1" && pwd) NEW=$(cd "$2" && pwd)
W=${3:-$(mktemp -d /tmp/same-outputs.XXXXXX)}; mkdir -p "$W"
top=$(pwd)
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SKYLAKEX} OMP_NUM_THREADS=1
jobs() {  # jobs BIN DIR: every run, its outputs under DIR
  B=$1 D=$2
  mkdir -p "$D"
  q="eval_on_start=false save_steps=0"
  "$B/ctune-demo-data" reverse "$D/train.jsonl" "$D/eval.jsonl" 1500 30 1234 8 0.1 >/dev/null
  "$B/ctune-demo-data" reverse-prefs "$D/prefs.jsonl" "$D/prefs_eval.jsonl" 300 20 55 >/dev/null
  sft_model="model.hidden_size=64 model.intermediate_size=192 model.num_hidden_layers=2 model.num_attention_heads=2
             model.num_key_value_heads=1"
  "$B/sft" configs/demo/sft.yml $sft_model dataset_path="$D/train.jsonl" eval_dataset_path="$D/eval.jsonl" \
    output_dir="$D/sft" max_steps=8 eval_steps=4 logging_steps=2 save_steps=4 warmup_steps=2
  "$B/sft" configs/demo/sft.yml $sft_model dataset_path="$D/train.jsonl" eval_dataset_path= eval_steps=0 \
    output_dir="$D/sft-lora" max_steps=4 logging_steps=1 $q use_peft=true lora_r=4 bf16=true \
    gradient_checkpointing=true model_path="$D/sft"
  "$B/sft" configs/demo/sft.yml $sft_model dataset_path="$D/train.jsonl" eval_dataset_path= eval_steps=0 \
    output_dir="$D/sft-muon" max_steps=3 logging_steps=1 $q optim=muon
  "$B/dpo" configs/demo/dpo.yml model_path="$D/sft" dataset_path="$D/prefs.jsonl" \
    eval_dataset_path="$D/prefs_eval.jsonl" output_dir="$D/dpo" max_steps=4 logging_steps=2 warmup_steps=1 \
    eval_steps=2
  "$B/grpo" configs/demo/grpo.yml model_path="$D/sft" dataset_path="$D/prefs.jsonl" output_dir="$D/grpo" \
    max_steps=2 logging_steps=1 per_device_train_batch_size=16 save_steps=1
  "$B/reward" configs/reward.yml model_path="$D/sft" dataset_path="$D/prefs.jsonl" output_dir="$D/rm" \
    max_length=32 max_steps=4 logging_steps=2 per_device_train_batch_size=8 $q \
    eval_dataset_path="$D/prefs_eval.jsonl" eval_steps=2
  "$B/reward" eval model_path="$D/rm" dataset_path="$D/prefs_eval.jsonl" >"$D/rm-eval.txt"
  "$B/grpo" configs/demo/grpo.yml model_path="$D/sft" dataset_path="$D/prefs.jsonl" output_dir="$D/grpo-rm" \
    max_steps=2 logging_steps=1 per_device_train_batch_size=16 reward_funcs=reward_model reward_model_path="$D/rm"
  "$B/distill" configs/demo/distill.yml teacher_path="$D/sft" dataset_path="$D/train.jsonl" output_dir="$D/kd" \
    max_steps=4 logging_steps=2 warmup_steps=1 model.hidden_size=32 model.intermediate_size=96 model.num_hidden_layers=1
  "$B/sampler" accuracy model_path="$D/sft" data="$D/eval.jsonl" temperature=1 seed=7 >"$D/acc.txt"
  "$B/sampler" accuracy model_path="$D/sft" data="$D/eval.jsonl" temperature=0 quantize=int8 >"$D/acc-int8.txt"
  if command -v mpirun >/dev/null; then
    mpirun --oversubscribe --allow-run-as-root -np 2 "$B/sft" configs/demo/sft.yml $sft_model \
      dataset_path="$D/train.jsonl" eval_dataset_path= eval_steps=0 output_dir="$D/sft-mpi" max_steps=3 \
      logging_steps=1 $q
  fi
}
for side in old new; do
  B=$OLD; [ $side = new ] && B=$NEW
  rm -rf "$W/run" "$W/$side"  # both sides run in one path: files that name their paths compare
  (cd "$top" && jobs "$B" "$W/run") >"$W/$side.log" 2>&1 || { tail -n 30 "$W/$side.log"; echo "same-outputs: the $side build's runs failed ($W/$side.log)"; exit 1; }
  mv "$W/run" "$W/$side"
done
untimed() { sed -E 's/"(time\/[^"]*|[a-z_\/]*per_s(econd)?|[a-z_]*runtime|elapsed[a-z_]*)":[-0-9.e+]*,?//g; s/,}/}/' "$1"; }
bad=0 n=0
for f in $(cd "$W/old" && find . -type f | sort); do
  case "$f" in *.log|*/.lock) continue ;; esac
  n=$((n + 1))
  [ -f "$W/new/$f" ] || { echo "same-outputs: $f: only the old build wrote it"; bad=1; continue; }
  case "$f" in
    */metrics.jsonl) untimed "$W/old/$f" >"$W/a" && untimed "$W/new/$f" >"$W/b" && cmp -s "$W/a" "$W/b" ||
                       { echo "same-outputs: $f differs"; diff "$W/a" "$W/b" | head -4; bad=1; } ;;
    *) cmp -s "$W/old/$f" "$W/new/$f" || { echo "same-outputs: $f differs"; bad=1; } ;;
  esac
done
extra=$(cd "$W/new" && find . -type f ! -name '*.log' ! -name .lock | sort | while read -r f; do [ -f "$W/old/$f" ] || echo "$f"; done)
[ -z "$extra" ] || { echo "same-outputs: only the new build wrote: $extra"; bad=1; }
[ $bad = 0 ] && echo "same-outputs: $n files identical (metrics without timings) in $W"
exit $bad
