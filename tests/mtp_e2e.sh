#!/bin/sh
# Multi-token prediction (mtp_num_layers) end to end through bin/sft: mtp_loss falls and the
# eval acceptance rate rises, model.safetensors stays a plain Hugging Face model with the
# depths in mtp.safetensors, save -> reload -> resume is bit-exact, and bad values are refused before any work. Run by tests/run.sh.
. tests/lib/common.sh
start_test mtp_e2e

tiny_sft 'logging_steps: 10'

echo "== learning: mtp_loss falls, eval_mtp_acceptance_rate rises"
"$BIN/sft" "$T/tiny.yml" output_dir="$T/learn" max_steps=150 mtp_num_layers=2 eval_on_start=true \
  save_steps=0 >"$T/learn.log" 2>&1 || { cat "$T/learn.log"; fail "training with mtp_num_layers=2 failed"; }
first=$(grep '"mtp_loss"' "$T/learn/metrics.jsonl" | head -1 | field mtp_loss)
last=$(grep '"mtp_loss"' "$T/learn/metrics.jsonl" | tail -1 | field mtp_loss)
acc0=$(grep eval_mtp_acceptance_rate "$T/learn/metrics.jsonl" | head -1 | field eval_mtp_acceptance_rate)
acc1=$(grep eval_mtp_acceptance_rate "$T/learn/metrics.jsonl" | tail -1 | field eval_mtp_acceptance_rate)
echo "mtp_loss $first -> $last, eval_mtp_acceptance_rate $acc0 -> $acc1"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.7 * a) }' || fail "mtp_loss did not fall by 30%"
awk -v a="$acc0" -v b="$acc1" 'BEGIN { exit !(b > a + 0.2) }' || fail "acceptance rate did not rise by 0.2"
grep -q '"eval_mtp_acceptance_rate_2"' "$T/learn/metrics.jsonl" || fail "no per-depth acceptance rate"
[ -s "$T/learn/mtp.safetensors" ] || fail "no mtp.safetensors beside the model"
! grep -aq 'mtp\.layers' "$T/learn/model.safetensors" || fail "model.safetensors holds MTP tensors"
grep -aq 'mtp\.layers\.1\.eh_proj\.weight' "$T/learn/mtp.safetensors" || fail "mtp.safetensors lacks depth 2"
! grep -q mtp "$T/learn/config.json" || fail "config.json mentions MTP"

echo "== bin/sampler speculative=mtp: the depths draft, one pass verifies; the same greedy output"
head -40 "$T/eval.jsonl" >"$T/p.jsonl"
gen() { "$BIN/sampler" generate model_path="$T/learn" prompts_path="$T/p.jsonl" temperature=0 output=json \
  max_new_tokens=12 "$@"; }
for q in none int8; do
  gen quantization=$q >"$T/plain.$q" 2>"$T/plain.err" || { cat "$T/plain.err"; fail "plain generate ($q)"; }
  gen quantization=$q speculative=mtp >"$T/spec.$q" 2>"$T/spec.err" || { cat "$T/spec.err"; fail "speculative generate ($q)"; }
  [ "$(wc -l <"$T/plain.$q")" = 40 ] || fail "plain generate wrote $(wc -l <"$T/plain.$q") lines"
  cmp "$T/plain.$q" "$T/spec.$q" || { diff "$T/plain.$q" "$T/spec.$q" | head; fail "speculative=mtp changed the output ($q)"; }
  grep "guesses kept" "$T/spec.err"
done
"$BIN/sampler" bench speculative=mtp model_path="$T/learn" prompts_path="$T/p.jsonl" max_new_tokens=12 \
  max_target_length=64 max_prefill_length=32 >"$T/bench.out" 2>&1 || { cat "$T/bench.out"; fail "bench speculative=mtp"; }
cat "$T/bench.out" | grep -v OPENBLAS
grep -q "identical tokens" "$T/bench.out" || fail "bench speculative=mtp did not compare the outputs"
expect 2 "key 'temperature': speculative=mtp decodes greedily" gen temperature=0.7 speculative=mtp
expect 2 "key 'n'" gen n=2 speculative=mtp

echo "== reload: the saved depths are read back (same eval), or dropped with mtp_num_layers 0"
"$BIN/sft" "$T/tiny.yml" model_path="$T/learn" output_dir="$T/reload" max_steps=1 learning_rate=0 \
  mtp_num_layers=2 eval_on_start=true >"$T/reload.log" 2>&1 || { cat "$T/reload.log"; fail "reloading with MTP"; }
! grep -q "initialized" "$T/reload.log" || fail "the saved depths were not read"
acc2=$(grep eval_mtp_acceptance_rate "$T/reload/metrics.jsonl" | head -1 | field eval_mtp_acceptance_rate)
[ "$acc2" = "$acc1" ] || fail "the reloaded depths evaluate differently ($acc2 vs $acc1)"
"$BIN/sft" "$T/tiny.yml" model_path="$T/learn" output_dir="$T/off" max_steps=1 learning_rate=0 \
  >"$T/off.log" 2>&1 || { cat "$T/off.log"; fail "reloading with MTP off"; }
! grep -q mtp "$T/off/metrics.jsonl" || fail "MTP metrics with mtp_num_layers 0"
[ ! -e "$T/off/mtp.safetensors" ] || fail "mtp.safetensors written with mtp_num_layers 0"
grep -q "has multi-token prediction depths (mtp.safetensors); mtp_num_layers is 0, so they are neither trained nor saved" \
  "$T/off.log" || { cat "$T/off.log"; fail "depths dropped without a word"; }
# a plain model (no mtp.safetensors) gets new depths, seeded
"$BIN/sft" "$T/tiny.yml" model_path="$T/off" output_dir="$T/fresh" max_steps=1 mtp_num_layers=1 \
  >"$T/fresh.log" 2>&1 || { cat "$T/fresh.log"; fail "adding MTP to a plain model"; }
grep -q "has no mtp.safetensors; 1 new depth initialized" "$T/fresh.log" || { cat "$T/fresh.log"; fail "no word of new depths"; }
[ -s "$T/fresh/mtp.safetensors" ] || fail "the new depths were not saved"
expect 1 "mtp.safetensors" "$BIN/sampler" generate model_path="$T/off" prompt=abc temperature=0 speculative=mtp

# a run without MTP, whose checkpoint the refusals below resume (MTP off = the unchanged
# gradient: test_mtp's lambda-0 check and test_train_ref)
common="max_steps=4 save_steps=2 eval_dataset_path= logging_steps=1"
"$BIN/sft" "$T/tiny.yml" output_dir="$T/none" $common >"$T/none.log" 2>&1 || { cat "$T/none.log"; fail "plain run"; }

echo "== resume: 9 steps straight == 4 steps, stop, resume, 5 steps (bit for bit, MTP weights too)"
common="max_steps=9 save_steps=3 logging_steps=1 eval_dataset_path= mtp_num_layers=2 mtp_loss_scaling_factor=0.3 gradient_accumulation_steps=2"
straight_and_stopped 4
[ -s "$T/resumed/checkpoint-4/mtp.safetensors" ] || fail "the checkpoint lacks mtp.safetensors"
grep -aq 'mtp\.layers\.0\.eh_proj\.weight\.exp_avg' "$T/resumed/checkpoint-4/optimizer.safetensors" \
  || fail "the checkpoint lacks the MTP weights' moments"
resume_stopped
mtp_losses() { grep '"mtp_loss"' "$1" | sed 's/.*"step":\([0-9]*\).*"loss":\([-0-9.e+]*\).*"mtp_loss":\([-0-9.e+]*\).*/\1 \2 \3/'; }
resumed_equals_straight mtp_losses 9 "MTP steps"
cmp "$T/straight/mtp.safetensors" "$T/resumed/mtp.safetensors" || fail "final MTP weights differ after resuming"
# λ is in the gradient: another λ, another model
"$BIN/sft" "$T/tiny.yml" output_dir="$T/lambda" $common mtp_loss_scaling_factor=0.6 max_steps=2 save_steps=0 \
  >"$T/lam.log" 2>&1 || { cat "$T/lam.log"; fail "lambda run"; }
"$BIN/sft" "$T/tiny.yml" output_dir="$T/lambda2" $common max_steps=2 save_steps=0 \
  >"$T/lam2.log" 2>&1 || { cat "$T/lam2.log"; fail "lambda run"; }
! cmp -s "$T/lambda/model.safetensors" "$T/lambda2/model.safetensors" || fail "λ did not change the trained model"

echo "== bad values: one clear line, exit 2, before any work"
expect 2 "key 'mtp_num_layers'" "$BIN/sft" "$T/tiny.yml" mtp_num_layers=-1
expect 2 "no sequence of max_length 6 tokens has a target for; use at most 4" \
  "$BIN/sft" "$T/tiny.yml" mtp_num_layers=5 max_length=6 output_dir="$T/x"
expect 2 "key 'mtp_num_layers': 17 is out of range" "$BIN/sft" "$T/tiny.yml" mtp_num_layers=17 output_dir="$T/x"
expect 2 "key 'mtp_loss_scaling_factor'" "$BIN/sft" "$T/tiny.yml" mtp_num_layers=1 mtp_loss_scaling_factor=-0.1
expect 2 "mtp_num_layers is 0" "$BIN/sft" "$T/tiny.yml" mtp_loss_scaling_factor=0.5 output_dir="$T/x"
expect 2 "use_peft trains adapters only" "$BIN/sft" "$T/tiny.yml" mtp_num_layers=1 use_peft=true output_dir="$T/x"
expect 2 "key 'mtp_num_layers' does not apply to dpo (only to sft)" \
  "$BIN/dpo" configs/dpo.yml dataset_path="$T/train.jsonl" mtp_num_layers=1 output_dir="$T/x"
[ ! -e "$T/x" ] || fail "a refused config created output_dir"
echo "== files that do not fit: exit 1 naming the file"
expect 1 "saved by a run without multi-token prediction" "$BIN/sft" "$T/tiny.yml" output_dir="$T/none" \
  max_steps=4 eval_dataset_path= mtp_num_layers=1 resume_from_checkpoint="$T/none/checkpoint-2"
expect 1 "is not one of 1 multi-token prediction depths" "$BIN/sft" "$T/tiny.yml" model_path="$T/learn" \
  output_dir="$T/y" max_steps=1 mtp_num_layers=1
echo "all mtp_e2e checks passed"
