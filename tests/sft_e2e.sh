#!/bin/sh
# bin/sft end to end: learning, outputs, bit-identical resume, a kill -9 in the middle of
# a checkpoint, and clear errors for bad input. Run by tests/run.sh (CT_BIN = binaries).
. tests/lib/common.sh
start_test sft_e2e

tiny_sft 'logging_steps: 1'


echo "== learning: loss falls and held-out accuracy rises"
"$BIN/sft" "$T/tiny.yml" output_dir="$T/learn" max_steps=300 eval_on_start=true eval_steps=0 \
  save_steps=0 >"$T/learn.log" 2>&1 || { cat "$T/learn.log"; fail "training failed"; }
learned "$T/learn" 0.5 0.3 "loss did not halve"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json config.yml metrics.jsonl; do
  [ -s "$T/learn/$f" ] || fail "output_dir lacks $f"
done
grep -q '"architectures": \[' "$T/learn/config.json" || fail "config.json has no architectures"
grep -q '"mean_token_accuracy"' "$T/learn/metrics.jsonl" || fail "metrics lack mean_token_accuracy"
# The saved model loads back: continue from it as model_path and evaluate only.
"$BIN/sft" "$T/tiny.yml" model_path="$T/learn" output_dir="$T/reload" max_steps=1 learning_rate=0 \
  >"$T/reload.log" 2>&1 || { cat "$T/reload.log"; fail "reloading the saved model failed"; }
acc2=$(grep eval_loss "$T/reload/metrics.jsonl" | tail -1 | field eval_mean_token_accuracy)
[ "$acc2" = "$acc1" ] || fail "the reloaded model evaluates differently ($acc2 vs $acc1)"

echo "== resume: 12 steps straight == 5 steps, stop, resume, 7 steps (bit for bit)"
common="max_steps=12 save_steps=3 eval_dataset_path= per_device_train_batch_size=8 gradient_accumulation_steps=2"
straight_and_stopped 5
[ -f "$T/resumed/checkpoint-5/trainer_state.json" ] || fail "no checkpoint-5 after the interruption"
resume_stopped
grep -q "resumed from" "$T/c.log" || fail "the resumed run does not say it resumed"
resumed_equals_straight losses 12 steps
# Resuming at the last step (as a restart wrapper would after a kill before the final
# save) trains nothing and writes the same final model; past max_steps is an error.
"$BIN/sft" "$T/tiny.yml" output_dir="$T/resumed" $common resume_from_checkpoint=latest >"$T/d.log" 2>&1 \
  || { cat "$T/d.log"; fail "resuming a finished run"; }
grep -q "at the last step (12): writing the final model" "$T/d.log" || { cat "$T/d.log"; fail "resuming a finished run: no word"; }
cmp "$T/straight/model.safetensors" "$T/resumed/model.safetensors" || fail "resuming a finished run changed the model"
rc=0
"$BIN/sft" "$T/tiny.yml" output_dir="$T/resumed" $common max_steps=10 resume_from_checkpoint=latest >"$T/d.log" 2>&1 || rc=$?
[ "$rc" = 1 ] && grep -q "past the 10 steps this run would train; raise max_steps" "$T/d.log" \
  || { cat "$T/d.log"; fail "resuming past max_steps"; }

echo "== kill -9 while a checkpoint is being written leaves the previous one usable"
CT_FAILPOINT=checkpoint:2 "$BIN/sft" "$T/tiny.yml" output_dir="$T/killed" $common >"$T/k.log" 2>&1 &
pid=$!
i=0
while [ ! -f "$T/killed/.tmp-checkpoint-6/model.safetensors" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
[ -f "$T/killed/.tmp-checkpoint-6/model.safetensors" ] || { kill -9 $pid; cat "$T/k.log"; fail "never reached the second save"; }
kill -9 $pid
wait $pid 2>/dev/null || true
[ ! -e "$T/killed/checkpoint-6" ] || fail "a half-written checkpoint-6 was published"
[ -f "$T/killed/checkpoint-3/trainer_state.json" ] || fail "checkpoint-3 is gone"
"$BIN/sft" "$T/tiny.yml" output_dir="$T/killed" $common resume_from_checkpoint=latest >"$T/r.log" 2>&1 \
  || { cat "$T/r.log"; fail "resuming after kill -9"; }
grep -q "checkpoint-3" "$T/r.log" || fail "did not resume from checkpoint-3"
losses "$T/killed/metrics.jsonl" >"$T/l3"
diff "$T/l1" "$T/l3" || fail "losses after kill -9 and resume differ from the straight run"

echo "== bad input: one clear line, exit 2 for configuration, 1 for data"
expect 2 "unknown key 'learning_rat'" "$BIN/sft" "$T/tiny.yml" learning_rat=1
expect 2 "key 'max_steps'" "$BIN/sft" "$T/tiny.yml" max_steps=ten
expect 2 "key 'learning_rate'" "$BIN/sft" "$T/tiny.yml" learning_rate=-1
printf 'base_config: %s\nlearning_rate: fast\n' "$T/tiny.yml" >"$T/bad.yml"
expect 2 "bad.yml:2" "$BIN/sft" "$T/bad.yml"
expect 2 "key 'dataset_path' is required" "$BIN/sft" "$T/tiny.yml" dataset_path= output_dir="$T/x"
printf '{"text": "ok"}\n{"prompt": "a"}\n' >"$T/bad.jsonl"
expect 1 "bad.jsonl:2: key 'completion' is missing" "$BIN/sft" "$T/tiny.yml" dataset_path="$T/bad.jsonl" output_dir="$T/x"
expect 1 "no-such-dir" "$BIN/sft" "$T/tiny.yml" model_path="$T/no-such-dir" output_dir="$T/x"
mkdir -p "$T/broken"
cp "$T/learn/config.json" "$T/learn/tokenizer.json" "$T/broken/"
head -c 100 "$T/learn/model.safetensors" >"$T/broken/model.safetensors"
expect 1 "model.safetensors" "$BIN/sft" "$T/tiny.yml" model_path="$T/broken" output_dir="$T/x"
# skip_bad_rows trains on the good rows and says how many it skipped
"$BIN/sft" "$T/tiny.yml" dataset_path="$T/bad.jsonl" skip_bad_rows=true output_dir="$T/skip" \
  max_steps=1 eval_dataset_path= >"$T/s.log" 2>&1 || { cat "$T/s.log"; fail "skip_bad_rows run"; }
grep -q "1 malformed rows skipped" "$T/s.log" || { cat "$T/s.log"; fail "skip count not reported"; }
echo "== chat_template_path: a training template brings {% generation %} markers"
printf '%s\n' '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}' \
  '{"messages": [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "ba"}]}' >"$T/chat.jsonl"
chat="dataset_path=$T/chat.jsonl eval_dataset_path= max_steps=1 max_length=64 assistant_only_loss=true"
# a stock ChatML template has no markers: assistant_only_loss cannot work with it
expect 1 "generation" "$BIN/sft" "$T/tiny.yml" $chat output_dir="$T/x" \
  chat_template_path=tests/fixtures/tokenizer/templates/chatml.jinja
"$BIN/sft" "$T/tiny.yml" $chat output_dir="$T/tpl" chat_template_path=templates/chatml_training.jinja \
  >"$T/tpl.log" 2>&1 || { cat "$T/tpl.log"; fail "training with chat_template_path"; }
# the template is saved with the model, as TRL saves it
grep -q 'endgeneration' "$T/tpl/tokenizer_config.json" || fail "the output tokenizer lacks the training template"
expect 1 "key 'chat_template_path'" "$BIN/sft" "$T/tiny.yml" $chat output_dir="$T/x" chat_template_path="$T/none.jinja"

echo "sft end-to-end: all checks passed"
