#!/bin/sh
# bf16: true end to end through bin/sft: on the same weights, losses and gradient norm within what
# bf16 rounding explains of fp32's; a bf16 run learns; bit-identical resume in bf16 mode with fp32
# checkpoints; DPO's bf16 reference; and
# the CPU check (DNNL_MAX_CPU_ISA=AVX2 stands in for a CPU without bf16 hardware).
. tests/lib/common.sh
start_test bf16_e2e

tiny_sft 'logging_steps: 10' 'save_steps: 0'
if DNNL_MAX_CPU_ISA=ALL "$BIN/sft" "$T/tiny.yml" output_dir="$T/probe" bf16=true max_steps=1 eval_dataset_path= \
     >"$T/probe.log" 2>&1; then
  echo "== the same weights, bf16 against fp32: differences within what bf16 rounding explains"
  # A 300-step fp32 model evaluated (held-out loss) and stepped once at learning rate 0 (training loss,
  # gradient norm) in both modes. bf16 rounds each product's inputs to 8 significant bits (relative
  # error <= 2^-9 each), accumulating in fp32: the losses may move by a small multiple of 2^-9
  # relative, the gradient norm (whose terms the rounding hits in forward and backward) by more.
  # Bounds: 2^-8 relative for losses, 2^-5 for the gradient norm. Measured: <= 1e-4 and 2.2e-3 with AMX
  # and with AVX512_BF16 alone (ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16). A comparison after training
  # in bf16 is no such bound (a short run is chaotic: held-out accuracy 0.53 vs 0.61 on one CPU).
  "$BIN/sft" "$T/tiny.yml" output_dir="$T/f32" max_steps=300 eval_steps=0 >"$T/f32.log" 2>&1 \
    || { cat "$T/f32.log"; fail "fp32 training failed"; }
  for b in false true; do
    "$BIN/sft" "$T/tiny.yml" model_path="$T/f32" output_dir="$T/same-$b" max_steps=1 learning_rate=0 \
      eval_on_start=true logging_steps=1 save_steps=0 bf16=$b >"$T/same-$b.log" 2>&1 \
      || { cat "$T/same-$b.log"; fail "bf16=$b on the fp32 model failed"; }
  done
  grep -q "matmuls in bfloat16" "$T/same-true.log" || fail "bf16 run does not say it multiplies in bf16"
  rel() {  # rel KEY BOUND [differ]: prints both values; fails when |bf16 - fp32| > BOUND * |fp32|
    a=$(grep "\"$1\"" "$T/same-false/metrics.jsonl" | head -1 | field "$1")
    b=$(grep "\"$1\"" "$T/same-true/metrics.jsonl" | head -1 | field "$1")
    echo "$1: fp32 $a, bf16 $b"
    awk -v a="$a" -v b="$b" -v t="$2" -v differ="${3:-}" 'BEGIN { d = b - a; if (d < 0) d = -d; m = a < 0 ? -a : a
      exit !(a != "" && b != "" && d <= t * m && (differ == "" || d > 0)) }' || fail "$1: bf16 $b vs fp32 $a (bound $2 relative)"
  }
  rel eval_loss 0.00390625
  rel loss 0.00390625
  rel grad_norm 0.03125 differ  # (equal would mean no bf16: it differs in the third digit)

  echo "== bf16 training learns: the held-out loss of a run from scratch falls below half its start"
  "$BIN/sft" "$T/tiny.yml" output_dir="$T/acc-true" max_steps=300 eval_steps=0 eval_on_start=true bf16=true \
    >"$T/acc-true.log" 2>&1 || { cat "$T/acc-true.log"; fail "bf16=true training failed"; }
  e0=$(grep eval_loss "$T/acc-true/metrics.jsonl" | head -1 | field eval_loss)
  e1=$(grep eval_loss "$T/acc-true/metrics.jsonl" | tail -1 | field eval_loss)
  e32=$(grep eval_loss "$T/f32/metrics.jsonl" | tail -1 | field eval_loss)
  echo "bf16 held-out loss $e0 -> $e1 (fp32's run: $e32)"
  awk -v a="$e0" -v b="$e1" 'BEGIN { exit !(b < 0.5 * a) }' || fail "bf16 held-out loss $e0 -> $e1"
  grep -q "bf16 weight copy" "$T/acc-true.log" || fail "the memory plan does not count the bf16 weight copy"

  echo "== resume in bf16: 8 steps straight == 3, stop, resume, 5 (bit for bit); checkpoints are fp32"
  common="max_steps=8 save_steps=3 eval_dataset_path= bf16=true gradient_accumulation_steps=2 per_device_train_batch_size=8 logging_steps=1"
  straight_and_stopped 3
  resume_stopped
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
