#!/bin/sh
# bin/distill end to end: a smaller student learns from a teacher (loss falls), the
# teacher's weights are untouched, offline top-k logits with k = V reproduce online
# distillation, on-policy / teacher-generated batches and an int8 teacher have their
# measured effects, and a wrong or missing teacher fails before any work.
. tests/lib/common.sh
start_test distill

reverse_sft "$T/train.jsonl" "$T/eval.jsonl" 50 41 6 "$T/teacher" 150 128 384
cp -r "$T/teacher" "$T/teacher.orig"
D="$BIN/distill"
student="model.hidden_size=64 model.intermediate_size=192 model.num_hidden_layers=1
         model.num_attention_heads=2 model.num_key_value_heads=1"
common="configs/distill.yml teacher_path=$T/teacher dataset_path=$T/train.jsonl $student max_length=24
        per_device_train_batch_size=32 learning_rate=3e-3 lr_scheduler_type=constant logging_steps=1 save_steps=0"
at() { sed -n "$1p" "$T/$2/metrics.jsonl" | field "$3"; }  # at STEP RUN KEY

echo "== the student's loss falls; the teacher is untouched"
"$D" $common output_dir="$T/s" max_steps=40 >"$T/s.log" 2>&1 || { cat "$T/s.log"; fail "distill run"; }
l0=$(head -3 "$T/s/metrics.jsonl" | field loss | awk '{s+=$1} END {print s/NR}')
l1=$(tail -3 "$T/s/metrics.jsonl" | field loss | awk '{s+=$1} END {print s/NR}')
echo "loss $l0 -> $l1"
awk -v a="$l0" -v b="$l1" 'BEGIN { exit !(b < 0.6 * a) }' || fail "the loss did not fall"
for k in distill/soft_loss distill/hard_loss distill/student_perplexity distill/teacher_perplexity; do
  grep -q "\"$k\"" "$T/s/metrics.jsonl" || fail "metrics lack $k"
done
grep -q "teacher weights unchanged" "$T/s.log" || fail "no teacher checksum"
diff -r "$T/teacher" "$T/teacher.orig" >/dev/null || fail "the teacher's directory changed"

echo "== evaluation on a held-out set: eval loss is logged and falls"
"$D" $common output_dir="$T/ev" max_steps=20 eval_dataset_path="$T/eval.jsonl" eval_steps=10 eval_on_start=true \
  >"$T/ev.log" 2>&1 || { cat "$T/ev.log"; fail "distill run with eval"; }
e0=$(grep '"eval_loss"' "$T/ev/metrics.jsonl" | head -1 | field eval_loss)
e1=$(grep '"eval_loss"' "$T/ev/metrics.jsonl" | tail -1 | field eval_loss)
n=$(grep -c '"eval_loss"' "$T/ev/metrics.jsonl")
echo "eval loss $e0 -> $e1 ($n evaluations)"
[ "$n" = 3 ] || fail "expected 3 evaluations (start, 10, 20), got $n"
awk -v a="$e0" -v b="$e1" 'BEGIN { exit !(b < a) }' || fail "the eval loss did not fall"
expect 1 "nowhere.jsonl" "$D" $common output_dir="$T/x" eval_dataset_path="$T/nowhere.jsonl" eval_steps=1

echo "== offline top-k logits with k = V reproduce online distillation"
"$D" precompute $common output_dir="$T/pre" teacher_logits_path="$T/topk.safetensors" distill_top_k=100000 \
  >"$T/pre.log" 2>&1 || { cat "$T/pre.log"; fail "precompute"; }
"$D" $common output_dir="$T/off" max_steps=5 teacher_logits_path="$T/topk.safetensors" teacher_path= \
  >"$T/off.log" 2>&1 || { cat "$T/off.log"; fail "offline run"; }
"$D" $common output_dir="$T/on" max_steps=5 >"$T/on.log" 2>&1 || { cat "$T/on.log"; fail "online run"; }
field loss <"$T/on/metrics.jsonl" >"$T/a"
field loss <"$T/off/metrics.jsonl" >"$T/b"
paste "$T/a" "$T/b" | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * $1) { print; bad = 1 } } END { exit bad }' \
  || fail "offline losses differ from online ones"
# a smaller k trains too, and a stale file is refused
"$D" precompute $common output_dir="$T/pre" teacher_logits_path="$T/top8.safetensors" distill_top_k=8 \
  >/dev/null 2>&1 || fail "precompute k=8"
"$D" $common output_dir="$T/off8" max_steps=3 teacher_logits_path="$T/top8.safetensors" teacher_path= \
  >"$T/off8.log" 2>&1 || { cat "$T/off8.log"; fail "offline run, k=8"; }
expect 1 "not the teacher logits of this dataset" "$D" $common output_dir="$T/x" max_steps=1 \
  teacher_logits_path="$T/topk.safetensors" teacher_path= dataset_path="$T/eval.jsonl"

echo "== on-policy, teacher-generated and int8-teacher runs"
"$D" $common output_dir="$T/op" max_steps=3 lmbda=1 >"$T/op.log" 2>&1 || { cat "$T/op.log"; fail "lmbda=1"; }
grep -q "on-policy batches" "$T/op.log" || fail "no on-policy batches"
[ ! -e "$T/op/completions.jsonl" ] || fail "distill logged completions without log_completions=true"
# log_completions: the student's samples of each on-policy step, one row each; logging
# changes nothing in training
"$D" $common output_dir="$T/opl" max_steps=2 lmbda=1 log_completions=true num_completions_to_print=1 \
  >"$T/opl.log" 2>&1 || { cat "$T/opl.log"; fail "lmbda=1 log_completions=true"; }
head -1 "$T/opl/completions.jsonl"
for s in 1 2; do
  [ "$(grep -c "^{\"step\":$s," "$T/opl/completions.jsonl")" = 32 ] || fail "step $s lacks its 32 rows"
done
for k in prompt completion completion_ids logprobs finish_reason; do
  grep -vq "\"$k\":" "$T/opl/completions.jsonl" && fail "a row lacks $k"
done
! grep -q '"reward"' "$T/opl/completions.jsonl" || fail "distillation rows have a reward"
# as many log-probs as tokens in every row
sed 's/.*"completion_ids":\[\([^]]*\)\],"logprobs":\[\([^]]*\)\].*/\1;\2/' "$T/opl/completions.jsonl" |
  awk -F';' '{ if (split($1, a, ",") != split($2, b, ",")) bad = 1 } END { exit bad }' || fail "ids and log-probs differ in count"
[ "$(grep -c 'completion 1 of step' "$T/opl.log")" = 2 ] || fail "num_completions_to_print=1 did not print"
[ "$(at 1 opl loss)" = "$(at 1 op loss)" ] && [ "$(at 2 opl loss)" = "$(at 2 op loss)" ] || fail "logging changed the losses"
# max_new_tokens (GKDConfig's, default 128) caps every on-policy completion, and the
# sampler's KV cache is planned for the longest prompt plus it, not for max_length
"$D" $common output_dir="$T/cap" max_steps=1 lmbda=1 log_completions=true max_new_tokens=3 >"$T/cap.log" 2>&1 \
  || { cat "$T/cap.log"; fail "lmbda=1 max_new_tokens=3"; }
longest=$(sed 's/.*"completion_ids":\[\([^]]*\)\].*/\1/' "$T/cap/completions.jsonl" |
  awk -F, '{ if (NF > m) m = NF } END { print m }')
[ "$longest" = 3 ] || fail "max_new_tokens=3: the longest completion has $longest tokens"
pos=$(sed -n 's/.*KV cache of 32 slots x \([0-9]*\) positions/\1/p' "$T/cap.log")
[ -n "$pos" ] && [ "$pos" -lt 24 ] || fail "max_new_tokens=3: the KV cache is planned for '$pos' positions (max_length 24)"
"$D" $common output_dir="$T/sk" max_steps=3 lmbda=1 seq_kd=true >"$T/sk.log" 2>&1 || { cat "$T/sk.log"; fail "seq_kd"; }
"$D" $common output_dir="$T/q8" max_steps=3 teacher_dtype=int8 >"$T/q8.log" 2>&1 || { cat "$T/q8.log"; fail "int8 teacher"; }
"$D" $common output_dir="$T/b16" max_steps=3 teacher_dtype=bfloat16 >"$T/b16.log" 2>&1 || { cat "$T/b16.log"; fail "bf16 teacher"; }
# Measured effects, against the lmbda=0 fp32-teacher run "on" (same seed and config). The
# step-1 metrics come before any update: a function of the batch and the teacher only.
tp='distill\/teacher_perplexity'
ppl_on=$(at 1 on "$tp") ppl_op=$(at 1 op "$tp") ppl_sk=$(at 1 sk "$tp")
echo "step-1 teacher perplexity: dataset $ppl_on, student-generated $ppl_op, teacher-generated $ppl_sk"
echo "step-1 loss: lmbda=0 $(at 1 on loss), lmbda=1 $(at 1 op loss), seq_kd $(at 1 sk loss)"
# lmbda=1 trains on the (untrained) student's own samples: other losses than on the
# dataset, and text the teacher finds far less likely than the dataset's
[ "$(at 1 op loss)" != "$(at 1 on loss)" ] || fail "lmbda=1 gives the lmbda=0 loss: no on-policy batch"
awk -v a="$ppl_op" -v b="$ppl_on" 'BEGIN { exit !(a > 10 * b) }' \
  || fail "on-policy teacher perplexity $ppl_op is not >> the dataset's $ppl_on"
# seq_kd: the teacher writes the completions, so it finds them likely (unlike the student's)
[ "$(at 1 sk loss)" != "$(at 1 on loss)" ] || fail "seq_kd gives the lmbda=0 loss: no generated batch"
awk -v a="$ppl_sk" -v b="$ppl_op" 'BEGIN { exit !(a * 10 < b) }' \
  || fail "teacher-generated perplexity $ppl_sk is not << the student-generated $ppl_op"
# int8 and bf16 teachers: the same batches scored by the narrowed teacher, close but not
# bit-equal
for q in q8 b16; do
  same=0
  for s in 1 2 3; do
    a=$(at $s $q "$tp") b=$(at $s on "$tp")
    echo "step $s teacher perplexity: $q $a, fp32 $b"
    awk -v a="$a" -v b="$b" 'BEGIN { d = (a - b) / b; exit !(d < 0.02 && d > -0.02) }' \
      || fail "$q teacher perplexity $a is not within 2% of fp32's $b"
    [ "$a" != "$b" ] || same=$((same + 1))
  done
  [ "$same" -lt 3 ] || fail "the $q teacher gives bit-equal perplexities: not narrowed"
done

echo "== bad input fails before any work"
cp -r "$T/teacher" "$T/other"
# the same size of vocabulary, but 'a' and 'b' trade ids
sed 's/"a": 97,/"a": 98,/; t; s/"b": 98,/"b": 97,/' "$T/teacher/tokenizer.json" >"$T/other/tokenizer.json"
expect 1 "tokenizers differ at token id 97" "$D" $common output_dir="$T/x" teacher_path="$T/other"
expect 2 "seq_kd generates with the teacher" "$D" $common output_dir="$T/x" lmbda=1 seq_kd=true teacher_dtype=bfloat16
expect 2 "key 'teacher_path' is required" "$D" $common output_dir="$T/x" teacher_path=
expect 1 "teacher_path" "$D" $common output_dir="$T/x" teacher_path="$T/nowhere"
echo "distill end-to-end: all checks passed"
