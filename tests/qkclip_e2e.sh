#!/bin/sh
# QK-Clip (qk_clip_threshold) end to end: a threshold no head reaches changes nothing (the
# model equals a run without it, byte for byte); at tau = 8 the reverse task's attention
# maxima, which pass 14 unclipped, stay near 8 while the loss keeps up; a stopped and
# resumed run equals a straight one (the maxima are no part of the saved state); DPO,
# GRPO, distillation and Muon runs clip and log it too; bad values are one-line errors.
# Run by tests/run.sh.
. tests/lib/common.sh
start_test qkclip

tiny_sft 'logging_steps: 1' 'save_steps: 0'
S="$BIN/sft $T/tiny.yml eval_dataset_path="
col() { grep -o "\"$2\":[-0-9.e+]*" "$1" | cut -d: -f2; }  # col METRICS KEY: one value a line
last5() { col "$1" "$2" | tail -5 | awk '{s+=$1} END {print s/NR}'; }

echo "== a threshold no head reaches: the same model as without QK-Clip"
$S output_dir="$T/off" max_steps=20 >"$T/off.log" 2>&1 || { cat "$T/off.log"; fail "run without QK-Clip"; }
$S output_dir="$T/high" max_steps=20 qk_clip_threshold=1e9 >"$T/high.log" 2>&1 || { cat "$T/high.log"; fail "tau 1e9"; }
# (an evaluation's line carries no training statistic)
$S output_dir="$T/ev" max_steps=2 qk_clip_threshold=1e9 eval_dataset_path="$T/eval.jsonl" eval_on_start=true \
  >"$T/ev.log" 2>&1 || { cat "$T/ev.log"; fail "run with evaluation"; }
! grep eval_loss "$T/ev/metrics.jsonl" | grep -q max_attention_logit || fail "an eval line carries max_attention_logit"
cmp "$T/off/model.safetensors" "$T/high/model.safetensors" || fail "a threshold never reached changed the model"
! grep -q max_attention_logit "$T/off/metrics.jsonl" || fail "QK-Clip's metrics logged while it is off"
[ "$(col "$T/high/metrics.jsonl" max_attention_logit | wc -l)" = 20 ] || fail "max_attention_logit is not on every line"
[ "$(col "$T/high/metrics.jsonl" clipped_heads | sort -u)" = 0 ] || fail "heads clipped below the threshold"

echo "== tau = 8: the maxima stay near 8 (unclipped they pass 14), the loss keeps up"
$S output_dir="$T/free" max_steps=100 qk_clip_threshold=1e9 >"$T/free.log" 2>&1 || fail "unclipped run"
$S output_dir="$T/clip" max_steps=100 qk_clip_threshold=8 >"$T/clip.log" 2>&1 || { cat "$T/clip.log"; fail "tau 8"; }
free_max=$(col "$T/free/metrics.jsonl" max_attention_logit | sort -g | tail -1)
clip_max=$(col "$T/clip/metrics.jsonl" max_attention_logit | sort -g | tail -1)
clip_last=$(last5 "$T/clip/metrics.jsonl" max_attention_logit)
clipped=$(col "$T/clip/metrics.jsonl" clipped_heads | awk '{s+=$1} END {print s}')
lf=$(last5 "$T/free/metrics.jsonl" loss) lc=$(last5 "$T/clip/metrics.jsonl" loss)
echo "max_attention_logit: unclipped up to $free_max; tau 8 up to $clip_max (last 5 steps $clip_last), $clipped head clips;" \
     "loss (last 5) $lf unclipped, $lc clipped"
awk -v f="$free_max" 'BEGIN { exit !(f > 14) }' || fail "the unclipped run's logits never grew past 14: the test proves nothing"
# a step's maximum is measured before that step's clip, after an optimizer step moved the weights
awk -v c="$clip_max" -v l="$clip_last" 'BEGIN { exit !(c < 12 && l < 9) }' || fail "the maxima were not held near 8"
[ "$clipped" -gt 0 ] || fail "no head was clipped"
awk -v f="$lf" -v c="$lc" 'BEGIN { exit !(c < f + 0.1) }' || fail "clipping hurt the loss: $lc vs $lf"

echo "== resume: 50 steps straight == 45, stop, resume (clipping throughout)"
$S output_dir="$T/straight" max_steps=50 qk_clip_threshold=4 save_steps=15 >"$T/st.log" 2>&1 || fail "straight run"
rc=0
CT_STOP_AFTER_STEP=45 $S output_dir="$T/res" max_steps=50 qk_clip_threshold=4 save_steps=15 >"$T/r1.log" 2>&1 || rc=$?
[ $rc = 130 ] || { cat "$T/r1.log"; fail "the stopped run exited $rc"; }
$S output_dir="$T/res" max_steps=50 qk_clip_threshold=4 save_steps=15 resume_from_checkpoint=latest >"$T/r2.log" 2>&1 \
  || { cat "$T/r2.log"; fail "resumed run"; }
[ "$(col "$T/straight/metrics.jsonl" clipped_heads | awk '{s+=$1} END {print s}')" -gt 0 ] || fail "no clips before step 50"
cmp "$T/straight/model.safetensors" "$T/res/model.safetensors" || fail "resuming changed the model"
"$BIN/ctune-ckpt" inspect "$T/res/checkpoint-45" >"$T/inspect.txt" 2>/dev/null
grep -q "^total: 20 tensors" "$T/inspect.txt" && grep -q "optimizer.safetensors: 40 tensors" "$T/inspect.txt" \
  || { cat "$T/inspect.txt"; fail "the checkpoint holds more than the model and its moments"; }
! grep -qi "qk\|attention" "$T/res/checkpoint-45/trainer_state.json" || fail "trainer_state.json holds QK-Clip state"

echo "== every trainer clips: DPO, GRPO, distillation (and SFT with Muon)"
m=$T/clip  # the tau-8 model: its heads reach ~8, so tau 2 clips
"$BIN/ctune-demo-data" reverse-prefs "$T/prefs.jsonl" "$T/prefs_eval.jsonl" 64 8 22 6 >/dev/null
"$BIN/dpo" configs/dpo.yml model_path="$m" dataset_path="$T/prefs.jsonl" max_length=24 per_device_train_batch_size=8 \
  output_dir="$T/dpo" max_steps=3 logging_steps=1 save_steps=0 qk_clip_threshold=2 >"$T/dpo.log" 2>&1 \
  || { cat "$T/dpo.log"; fail "dpo"; }
head -32 "$T/train.jsonl" >"$T/prompts.jsonl"
"$BIN/grpo" configs/grpo.yml model_path="$m" dataset_path="$T/prompts.jsonl" answer_field=completion \
  per_device_train_batch_size=16 num_generations=4 max_completion_length=8 output_dir="$T/grpo" max_steps=2 \
  logging_steps=1 save_steps=0 qk_clip_threshold=2 >"$T/grpo.log" 2>&1 || { cat "$T/grpo.log"; fail "grpo"; }
"$BIN/distill" configs/distill.yml teacher_path="$m" dataset_path="$T/train.jsonl" max_length=24 \
  model.hidden_size=64 model.intermediate_size=192 model.num_hidden_layers=1 model.num_attention_heads=2 \
  model.num_key_value_heads=1 per_device_train_batch_size=16 output_dir="$T/distill" max_steps=3 logging_steps=1 \
  save_steps=0 qk_clip_threshold=0.05 >"$T/distill.log" 2>&1 || { cat "$T/distill.log"; fail "distill"; }
$S output_dir="$T/muon" max_steps=10 optimizer=muon qk_clip_threshold=0.15 >"$T/muon.log" 2>&1 || { cat "$T/muon.log"; fail "muon"; }
for r in dpo grpo distill muon; do
  n=$(col "$T/$r/metrics.jsonl" clipped_heads | awk '{s+=$1} END {print s + 0}')
  mx=$(col "$T/$r/metrics.jsonl" max_attention_logit | sort -g | tail -1)
  echo "$r: $n head clips, max_attention_logit up to $mx"
  [ "$n" -gt 0 ] || fail "$r logged no clipped heads"
done

echo "== bad values are config errors before any work"
expect 2 "qk_clip_threshold" $S output_dir="$T/e1" qk_clip_threshold=-1
expect 2 "key 'qk_clip_threshold': QK-Clip rescales the query and key weights, which with use_peft are the frozen base" \
  $S output_dir="$T/e2" qk_clip_threshold=8 use_peft=true
expect 2 "qk_clip_threshold" $S output_dir="$T/e3" qk_clip_threshold=high
echo "qkclip e2e: all checks passed"
