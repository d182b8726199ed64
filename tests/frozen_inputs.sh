#!/bin/sh
# What a run reads and never trains is part of it. A resume refuses another LoRA base
# (model_path, base_dtype), DPO reference (ref_model_path, ref_dtype), teacher (teacher_path,
# teacher_dtype) or teacher top-k file, naming the key with the old and the new value; DPO's cached reference log-probs
# are recomputed, saying why, when their contents, their reference's dtype or weights
# changed; a damaged top-k file is refused before training.
. tests/lib/common.sh
start_test frozen

"$BIN/ctune-demo-data" reverse "$T/train.jsonl" "$T/eval.jsonl" 200 20 7 6 >/dev/null
"$BIN/ctune-demo-data" reverse-prefs "$T/prefs.jsonl" "$T/prefs_eval.jsonl" 64 8 22 6 >/dev/null
shape="model.hidden_size=32 model.intermediate_size=64 model.num_hidden_layers=1 model.num_attention_heads=2
       model.num_key_value_heads=1"
tiny="max_length=24 per_device_train_batch_size=8 save_steps=2 logging_steps=1"
for s in 1 2; do  # two models of one shape and vocabulary, other weights
  "$BIN/sft" configs/sft.yml dataset_path="$T/train.jsonl" output_dir="$T/m$s" max_steps=1 seed=$s $shape $tiny \
    >"$T/m$s.log" 2>&1 || { cat "$T/m$s.log"; fail "model $s"; }
done
# stopped PROGRAM ARGS...: a fresh run into $T/run, stopped after step 2 (checkpoint-2) of 3
stopped() {
  rm -rf "$T/run"
  rc=0
  CT_STOP_AFTER_STEP=2 "$@" output_dir="$T/run" max_steps=3 >"$T/run.log" 2>&1 || rc=$?
  [ "$rc" = 130 ] || { cat "$T/run.log"; fail "the stopped run exited $rc"; }
}
# resume PROGRAM ARGS...: that run resumed
resume() { "$@" output_dir="$T/run" max_steps=3 resume_from_checkpoint=latest; }
resumes() { resume "$@" >"$T/ok.log" 2>&1 || { cat "$T/ok.log"; fail "resume with the same inputs: $*"; }; }

echo "== LoRA: another base or base_dtype is refused; the same one resumes"
L="$BIN/sft configs/sft.yml dataset_path=$T/train.jsonl use_peft=true lora_r=4 $tiny"
stopped $L model_path="$T/m1"
expect 1 "key 'model_path': the LoRA base differs (xxh64 [0-9a-f]* from $T/m1, now [0-9a-f]* from $T/m2)" \
  resume $L model_path="$T/m2"
expect 1 "key 'base_dtype': the LoRA base was float32, now bfloat16" resume $L model_path="$T/m1" base_dtype=bfloat16
resumes $L model_path="$T/m1"
grep -q "\"base_model_name_or_path\": \"$T/m1\"" "$T/run/adapter_config.json" || fail "the adapter names another base"

echo "== distillation: another teacher, teacher_dtype or top-k file is refused"
D="$BIN/distill configs/distill.yml dataset_path=$T/train.jsonl $shape $tiny"
stopped $D teacher_path="$T/m1"
grep -q '"teacher_path": "'"$T/m1"'"' "$T/run/checkpoint-2/trainer_state.json" || fail "trainer_state.json lacks the teacher"
expect 1 "key 'teacher_path': the teacher differs" resume $D teacher_path="$T/m2"
expect 1 "key 'teacher_dtype': the teacher was float32, now int8" resume $D teacher_path="$T/m1" teacher_dtype=int8
resumes $D teacher_path="$T/m1"
for s in 1 2; do
  "$BIN/distill" precompute configs/distill.yml dataset_path="$T/train.jsonl" $shape $tiny teacher_path="$T/m$s" \
    output_dir="$T/pre" teacher_logits_path="$T/top$s.safetensors" distill_top_k=8 >"$T/pre.log" 2>&1 \
    || { cat "$T/pre.log"; fail "precompute with teacher $s"; }
done
stopped $D teacher_path= teacher_logits_path="$T/top1.safetensors"
expect 1 "key 'teacher_logits_path': the teacher differs" resume $D teacher_path= teacher_logits_path="$T/top2.safetensors"
expect 1 "key 'teacher_path': the teacher was teacher_logits_path" resume $D teacher_path="$T/m1"
resumes $D teacher_path= teacher_logits_path="$T/top1.safetensors"

echo "== DPO: another reference (ref_model_path, ref_dtype) is refused on resume"
R="$BIN/dpo configs/dpo.yml dataset_path=$T/prefs.jsonl model_path=$T/m1 max_length=24 per_device_train_batch_size=4
   save_steps=2 logging_steps=1"
stopped $R ref_model_path="$T/m1"
expect 1 "key 'ref_model_path': the reference model differs" resume $R ref_model_path="$T/m2"
expect 1 "key 'ref_dtype': the reference model was float32, now bfloat16" resume $R ref_model_path="$T/m1" ref_dtype=bfloat16
resumes $R ref_model_path="$T/m1"

# data_start FILE: the byte where a safetensors file's data section starts (8 + header length)
data_start() { echo $(( 8 + $(od -An -t u8 -N8 "$1" | tr -d ' ') )); }
# poke FILE OFFSET OCTAL: one byte of FILE replaced
poke() { printf "\\$3" | dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null; }

echo "== a top-k file whose first index became 10^9 is refused (its checksum)"
cp "$T/top1.safetensors" "$T/bad.safetensors"
at=$(data_start "$T/bad.safetensors")
poke "$T/bad.safetensors" "$at" 000; poke "$T/bad.safetensors" $((at + 1)) 312
poke "$T/bad.safetensors" $((at + 2)) 232; poke "$T/bad.safetensors" $((at + 3)) 073  # 0x3b9aca00
expect 1 "bad.safetensors: its contents changed since it was written" \
  "$BIN/distill" configs/distill.yml dataset_path="$T/train.jsonl" $shape $tiny output_dir="$T/x" max_steps=1 \
  teacher_path= teacher_logits_path="$T/bad.safetensors"

echo "== DPO: the reference log-prob cache is recomputed when its contents, ref_dtype or reference changed"
P="$BIN/dpo configs/dpo.yml dataset_path=$T/prefs.jsonl max_length=24 per_device_train_batch_size=4 save_steps=0
   max_steps=1 logging_steps=1 precompute_ref_log_probs=true model_path=$T/m1 output_dir=$T/dpo"
cache="$T/dpo/ref_logps_train.safetensors"
loss1() { grep '"loss"' "$T/dpo.log" | head -1 | field loss; }
dpo() { $P "$@" >"$T/dpo.log" 2>&1 || { cat "$T/dpo.log"; fail "dpo $*"; }; }
dpo
grep -q "reference log-probs: one pass" "$T/dpo.log" || fail "no reference pass"
l0=$(loss1)
dpo
grep -q "reference log-probs: reusing" "$T/dpo.log" || fail "the cache was not reused by the same run"
# the first pair's chosen sum, negated (its sign byte): a loss of 0.693 would become ~6
at=$(( $(data_start "$cache") + 3 ))
poke "$cache" "$at" "$(printf %03o $(( $(od -An -t u1 -j "$at" -N1 "$cache") ^ 128 )))"
dpo
grep -q "does not fit this run (.*contents changed since it was written.*): recomputing" "$T/dpo.log" \
  || { cat "$T/dpo.log"; fail "flipped cache values were reused"; }
[ "$(loss1)" = "$l0" ] || fail "step-1 loss $(loss1) after recomputing, $l0 before"
dpo ref_dtype=int8
dpo  # a float32 run after an int8 one
grep -q "does not fit this run (key 'ref_dtype': the reference model was int8, now float32): recomputing" "$T/dpo.log" \
  || { cat "$T/dpo.log"; fail "an int8 reference's cache was reused by a float32 run"; }
[ "$(loss1)" = "$l0" ] || fail "step-1 loss $(loss1) after recomputing, $l0 before"
dpo ref_model_path="$T/m1"
grep -q "the reference model was model_path $T/m1, now ref_model_path $T/m1" "$T/dpo.log" || fail "no recompute"
dpo ref_model_path="$T/m2"
grep -q "key 'ref_model_path': the reference model differs (xxh64 [0-9a-f]* from $T/m1, now [0-9a-f]* from $T/m2)" \
  "$T/dpo.log" || { cat "$T/dpo.log"; fail "another ref_model_path reused the cache"; }
echo "frozen inputs: ok"
