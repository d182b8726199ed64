#!/bin/sh
# bf16: true end to end through bin/sft: the same held-out accuracy as fp32 (within 2
# points) on the demo task, bit-identical resume in bf16 mode with fp32 checkpoints, and
# the CPU check (DNNL_MAX_CPU_ISA=AVX2 stands in for a CPU without bf16 hardware).
. tests/lib/common.sh
start_test bf16_e2e

tiny_sft 'logging_steps: 10' 'save_steps: 0'
if DNNL_MAX_CPU_ISA=ALL "$BIN/sft" "$T/tiny.yml" output_dir="$T/probe" bf16=true max_steps=1 eval_dataset_path= \
     >"$T/probe.log" 2>&1; then
  echo "== held-out accuracy: bf16 within 2 points of fp32"
  for b in false true; do
    "$BIN/sft" "$T/tiny.yml" output_dir="$T/acc-$b" max_steps=300 eval_steps=0 bf16=$b >"$T/acc-$b.log" 2>&1 \
      || { cat "$T/acc-$b.log"; fail "bf16=$b training failed"; }
  done
  a32=$(grep eval_loss "$T/acc-false/metrics.jsonl" | tail -1 | field eval_mean_token_accuracy)
  a16=$(grep eval_loss "$T/acc-true/metrics.jsonl" | tail -1 | field eval_mean_token_accuracy)
  echo "eval token accuracy: fp32 $a32, bf16 $a16"
  awk -v a="$a32" -v b="$a16" 'BEGIN { d = b - a; exit !(a > 0.3 && d <= 0.02 && d >= -0.02) }' || fail "bf16 accuracy $a16 vs fp32 $a32"
  grep -q "bf16 weight copy" "$T/acc-true.log" || fail "the memory plan does not count the bf16 weight copy"
  grep -q "matmuls in bfloat16" "$T/acc-true.log" || fail "bf16 run does not say it multiplies in bf16"

  echo "== resume in bf16: 8 steps straight == 3, stop, resume, 5 (bit for bit); checkpoints are fp32"
  common="max_steps=8 save_steps=3 eval_dataset_path= bf16=true gradient_accumulation_steps=2 per_device_train_batch_size=8 logging_steps=1"
  "$BIN/sft" "$T/tiny.yml" output_dir="$T/straight" $common >"$T/a.log" 2>&1 || { cat "$T/a.log"; fail "straight run"; }
  rc=0
  CT_STOP_AFTER_STEP=3 "$BIN/sft" "$T/tiny.yml" output_dir="$T/resumed" $common >"$T/b.log" 2>&1 || rc=$?
  [ "$rc" = 130 ] || { cat "$T/b.log"; fail "interrupted run exited $rc, expected 130"; }
  "$BIN/sft" "$T/tiny.yml" output_dir="$T/resumed" $common resume_from_checkpoint=latest >"$T/c.log" 2>&1 \
    || { cat "$T/c.log"; fail "resumed run"; }
  cmp "$T/straight/model.safetensors" "$T/resumed/model.safetensors" || fail "bf16 resume is not bit-identical"
  grep -q '"dtype": *"F32"\|"dtype":"F32"' "$T/resumed/checkpoint-3/model.safetensors" 2>/dev/null ||
    head -c 2000 "$T/resumed/checkpoint-3/model.safetensors" | grep -q F32 || fail "checkpoint is not float32"

  echo "== DPO in bf16: the reference multiplies in bf16 too, so step 1's policy == reference exactly"
  "$BIN/ctune-demo-data" reverse-prefs "$T/prefs.jsonl" "$T/prefs_eval.jsonl" 200 10 22 7 >/dev/null
  "$BIN/dpo" configs/dpo.yml model_path="$T/acc-true" dataset_path="$T/prefs.jsonl" max_length=24 logging_steps=1 \
    per_device_train_batch_size=8 max_steps=2 save_steps=0 bf16=true output_dir="$T/dpo" >"$T/dpo.log" 2>&1 \
    || { cat "$T/dpo.log"; fail "DPO with bf16"; }
  grep -q "reference model (float32, bf16 compute)" "$T/dpo.log" || fail "the plan does not show the bf16 reference"
  m1=$(head -1 "$T/dpo/metrics.jsonl" | field 'rewards\/margins')
  echo "step 1 rewards/margins: $m1"
  awk -v m="$m1" 'BEGIN { exit !(m != "" && m + 0 == 0) }' || fail "step 1 margins $m1: the bf16 reference differs from the bf16 policy"
else
  grep -q "AVX512_BF16" "$T/probe.log" || { cat "$T/probe.log"; fail "bf16=true failed for another reason"; }
  echo "this CPU has no bf16 hardware: only the refusal is checked"
fi

echo "== no bf16 hardware: true is a one-line error naming the key, auto falls back and says so"
rc=0
DNNL_MAX_CPU_ISA=AVX2 "$BIN/sft" "$T/tiny.yml" output_dir="$T/nohw" bf16=true max_steps=1 >"$T/nohw.log" 2>&1 || rc=$?
[ "$rc" != 0 ] || fail "bf16=true ran without bf16 hardware"
grep -q "key 'bf16'.*AVX512_BF16.*bf16: auto" "$T/nohw.log" || { cat "$T/nohw.log"; fail "unclear bf16 error"; }
DNNL_MAX_CPU_ISA=AVX2 "$BIN/sft" "$T/tiny.yml" output_dir="$T/auto" bf16=auto max_steps=2 eval_dataset_path= \
  >"$T/auto.log" 2>&1 || { cat "$T/auto.log"; fail "bf16=auto did not fall back"; }
grep -q "bf16: auto: .*computing in float32" "$T/auto.log" || fail "bf16=auto does not say it fell back"
echo "bf16 end-to-end: all checks passed"
