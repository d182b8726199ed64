#!/bin/sh
# GRPO's built-in rewards end to end, on a tiny model taught to answer " answer is 42":
# answer_regex and format_regex are Python re patterns (\d, \s, named groups: what a TRL
# user writes scores what it scores in Python), and a bad pattern is refused before any
# rollout naming its key and where it was set; a dataset field a reward function reads
# that no row has is refused naming the key, the field and the file; a row without it
# (or with a reference that is no number under answer_numeric) names file:line, or is
# skipped and counted with skip_bad_rows.
. tests/lib/common.sh
start_test grpo_rewards

for i in $(seq 1 200); do echo "{\"prompt\": \"q$((i % 50)):\", \"completion\": \" answer is 42\"}"; done >"$T/sft.jsonl"
"$BIN/sft" configs/sft.yml dataset_path="$T/sft.jsonl" output_dir="$T/sft" max_steps=80 \
  model.hidden_size=64 model.intermediate_size=128 model.num_hidden_layers=2 model.num_attention_heads=4 \
  model.num_key_value_heads=2 max_length=24 per_device_train_batch_size=16 learning_rate=3e-3 save_steps=0 \
  >"$T/sft.log" 2>&1 || { cat "$T/sft.log"; fail "sft"; }
for i in $(seq 1 16); do echo "{\"prompt\": \"q$i:\", \"answer\": \"42\"}"; done >"$T/p.jsonl"
G="$BIN/grpo"
common="configs/grpo.yml model_path=$T/sft per_device_train_batch_size=16 num_generations=4
        max_completion_length=16 temperature=0.3 max_steps=1 logging_steps=1 save_steps=0"
# mean REWARD DIR: the step's mean of reward function REWARD
mean() { field "rewards\/$1\/mean" <"$2/metrics.jsonl"; }
above() { awk -v x="$1" -v y="$2" 'BEGIN { exit !(x + 0 > y) }'; }

echo "== answer_regex and format_regex are Python re patterns"
"$G" $common dataset_path="$T/p.jsonl" output_dir="$T/d" 'answer_regex=answer is (\d+)' >"$T/d.log" 2>&1 \
  || { cat "$T/d.log"; fail "answer_regex run"; }
a=$(mean accuracy "$T/d")
echo "accuracy with 'answer is (\\d+)': $a"
above "$a" 0.5 || fail "accuracy $a with answer_regex='answer is (\\d+)' (POSIX regexes matched nothing here)"
"$G" $common dataset_path="$T/p.jsonl" output_dir="$T/n" 'answer_regex=(?P<answer>\d+)\s*$' answer_numeric=true \
  >"$T/n.log" 2>&1 || { cat "$T/n.log"; fail "named-group run"; }
a=$(mean accuracy "$T/n")
above "$a" 0.5 || fail "accuracy $a with a named group"
"$G" $common dataset_path="$T/p.jsonl" output_dir="$T/f" reward_funcs=format 'format_regex=^\s*answer\s+is\s+\d+$' \
  >"$T/f.log" 2>&1 || { cat "$T/f.log"; fail "format_regex run"; }
a=$(mean format "$T/f")
above "$a" 0.5 || fail "format reward $a with format_regex='^\\s*answer\\s+is\\s+\\d+\$'"

echo "== a bad pattern stops the run before any rollout, naming the key and where it was set"
expect 2 "command line: key 'answer_regex': cannot compile \"answer is (.d+\": missing closing parenthesis" \
  "$G" $common dataset_path="$T/p.jsonl" output_dir="$T/x" 'answer_regex=answer is (\d+'
printf 'base_config: %s/configs/grpo.yml\nreward_funcs: [format]\nformat_regex: "a{2,1}"\n' "$(pwd)" >"$T/bad.yml"
expect 2 "bad.yml:3: key 'format_regex': cannot compile \"a{2,1}\": numbers out of order" \
  "$G" "$T/bad.yml" model_path="$T/sft" dataset_path="$T/p.jsonl" output_dir="$T/x"
[ ! -e "$T/x/metrics.jsonl" ] || fail "the run started despite the bad pattern"

echo "== the field a reward function reads: no row has it, a row lacks it, skip_bad_rows"
expect 2 "command line: key 'answer_field': no row of $T/p.jsonl has the field 'solution', which the accuracy reward reads (its first row has: prompt, answer)" \
  "$G" $common dataset_path="$T/p.jsonl" output_dir="$T/x" answer_field=solution
sed '5s/"answer"/"solution"/' "$T/p.jsonl" >"$T/p5.jsonl"
expect 1 "$T/p5.jsonl:5: no field 'answer', which the accuracy reward reads (answer_field); fix the row, or set skip_bad_rows" \
  "$G" $common dataset_path="$T/p5.jsonl" output_dir="$T/x"
"$G" $common dataset_path="$T/p5.jsonl" output_dir="$T/s" skip_bad_rows=true >"$T/s.log" 2>&1 \
  || { cat "$T/s.log"; fail "skip_bad_rows run"; }
grep -q "$T/p5.jsonl: 1 rows skipped (skip_bad_rows); the first: $T/p5.jsonl:5: no field 'answer'" "$T/s.log" \
  || { cat "$T/s.log"; fail "the skipped row is not counted and named"; }
grep -q "prompts: $T/p5.jsonl: 15 rows" "$T/s.log" || { cat "$T/s.log"; fail "the skipped row is still a prompt"; }
# skip_bad_rows also skips rows the prompt loader cannot read (here: no prompt)
sed '7s/"prompt"/"question"/' "$T/p5.jsonl" >"$T/p57.jsonl"
"$G" $common dataset_path="$T/p57.jsonl" output_dir="$T/s2" skip_bad_rows=true >"$T/s2.log" 2>&1 \
  || { cat "$T/s2.log"; fail "skip_bad_rows run with a row without a prompt"; }
grep -q "prompts: $T/p57.jsonl: 14 rows" "$T/s2.log" || { cat "$T/s2.log"; fail "expected 14 prompts left"; }
sed '2s/"42"/"forty-two"/' "$T/p.jsonl" >"$T/p2.jsonl"
expect 1 "$T/p2.jsonl:2: field 'answer' is \"forty-two\", not a number (answer_numeric is true)" \
  "$G" $common dataset_path="$T/p2.jsonl" output_dir="$T/x" answer_numeric=true
sed 's/, "answer": "42"//' "$T/p.jsonl" >"$T/bare.jsonl"
expect 2 "key 'answer_field': no row of $T/bare.jsonl has the field 'answer'" \
  "$G" $common dataset_path="$T/p.jsonl" output_dir="$T/x" eval_dataset_path="$T/bare.jsonl" eval_steps=1
# the remote reward sends answer_field as labels: once set, every row must have it
expect 2 "no row of $T/p.jsonl has the field 'solution', which the remote reward reads" \
  "$G" $common dataset_path="$T/p.jsonl" output_dir="$T/x" reward_funcs=remote \
  reward_url=http://127.0.0.1:9/score answer_field=solution
[ ! -e "$T/x/metrics.jsonl" ] || fail "a run started despite a bad field"
echo "== overlong: every completion's reward is DAPO's soft punishment of its token count"
"$G" $common dataset_path="$T/p.jsonl" output_dir="$T/ol" reward_funcs=overlong overlong_buffer_len=6 \
  max_completion_length=10 temperature=1.5 >"$T/ol.log" 2>&1 || { cat "$T/ol.log"; fail "overlong run"; }
sed 's/.*"completion_ids":\[\([^]]*\)\].*"overlong":\([-0-9.e+]*\).*/\1 \2/' "$T/ol/completions.jsonl" |
  awk '{ n = split($1, _, ","); want = n <= 4 ? 0 : n <= 10 ? (4 - n) / 6 : -1; d = $2 - want; if (d < 0) d = -d
         if (d > 1e-9) bad = 1; seen[n > 4] = 1; k++ }
       END { print k " completions: rewards as (L - B - n) / B past L - B = 4"; exit bad || !seen[0] || !seen[1] }' \
  || fail "overlong rewards differ from the formula (or all completions fell on one side of the buffer)"
echo "== repetition_penalty, cosine and think_format: each completion's reward is TRL's formula"
"$G" $common dataset_path="$T/p.jsonl" output_dir="$T/rc" reward_funcs=accuracy,repetition_penalty,cosine,think_format \
  repetition_ngram_size=2 temperature=1.2 'answer_regex=answer is (\d+)' >"$T/rc.log" 2>&1 || { cat "$T/rc.log"; fail "rc run"; }
sed 's/.*"completion_ids":\[\([^]]*\)\].*"accuracy":\([-0-9.e+]*\),"repetition_penalty":\([-0-9.e+]*\),"cosine":\([-0-9.e+]*\),"think_format":\([-0-9.e+]*\).*/\1 \2 \3 \4 \5/' \
  "$T/rc/completions.jsonl" | awk '
  { n = split($1, id, ","); seen = 0; u = 0; delete g
    for (i = 1; i + 1 <= n; i++) { k = id[i] "," id[i + 1]; if (!(k in g)) u++; g[k] = 1 }
    rep = n < 2 ? 0 : (1 - u / (n - 1)) * -1; if (rep == 0) rep = 0
    p = n / 16; if (p > 1) p = 1; c = cos(p * 3.14159265358979)
    cosr = $2 > 0 ? 0.5 + 0.25 * (1 + c) : -0.5 - 0.25 * (1 + c)
    d1 = $3 - rep; d2 = $4 - cosr; if (d1 < 0) d1 = -d1; if (d2 < 0) d2 = -d2
    if (d1 > 1e-9 || d2 > 1e-9 || $5 != 0) { bad = 1; print "row " NR ": " $0 " (want " rep ", " cosr ")" }
    r += $3 < 0; k2++ }
  END { print k2 " completions: repetition_penalty (" r " below 0), cosine and think_format as the formulas"; exit bad || k2 != 16 }' \
  || fail "repetition_penalty / cosine / think_format differ from TRL's formulas"
expect 2 "key 'answer_math': compares as math answers, and answer_numeric as plain numbers: set one" \
  "$G" $common dataset_path="$T/p.jsonl" output_dir="$T/x" answer_math=true answer_numeric=true
expect 2 "key 'cosine_max_len': the cosine reward's, and reward_funcs has no cosine" \
  "$G" $common dataset_path="$T/p.jsonl" output_dir="$T/x" cosine_max_len=8
expect 2 "key 'overlong_buffer_len': the overlong reward's, and reward_funcs has no overlong" \
  "$G" $common dataset_path="$T/p.jsonl" output_dir="$T/x" overlong_buffer_len=4
expect 2 "key 'overlong_buffer_len': the overlong reward needs 0 < overlong_buffer_len <= max_completion_length (10; got 0)" \
  "$G" $common dataset_path="$T/p.jsonl" output_dir="$T/x" reward_funcs=overlong max_completion_length=10
echo "grpo rewards end-to-end: all checks passed"
