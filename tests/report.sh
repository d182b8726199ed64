#!/bin/sh
# bin/ctune-report: two tiny SFT runs (two learning rates) overlaid on one page, a GRPO and
# a DPO run each on its own: every chart the metrics call for, in order, with one curve
# per run holding one vertex per metrics line that has the key, a legend naming both
# runs, no script and no outside reference; the last metrics line, the log's last line
# and the resolved config on the page; gaps at NaN, escaping, and a one-line error for
# each kind of bad input. Run by tests/run.sh (CT_BIN = binaries).
. tests/lib/common.sh
start_test report
R="$BIN/ctune-report"

"$BIN/ctune-demo-data" reverse "$T/train.jsonl" "$T/eval.jsonl" 2000 40 7 6
head -8 "$T/eval.jsonl" >"$T/evalp.jsonl"
"$BIN/ctune-demo-data" reverse-prefs "$T/prefs.jsonl" "$T/prefs_eval.jsonl" 300 20 22 6
sft() {  # sft NAME LEARNING_RATE: 20 steps, an evaluation every 10; its log is NAME.log beside it
  "$BIN/sft" configs/sft.yml dataset_path="$T/train.jsonl" eval_dataset_path="$T/eval.jsonl" eval_steps=10 \
    output_dir="$T/$1" max_steps=20 learning_rate="$2" model.hidden_size=64 model.intermediate_size=192 \
    model.num_hidden_layers=2 model.num_attention_heads=4 model.num_key_value_heads=2 max_length=24 \
    per_device_train_batch_size=16 lr_scheduler_type=cosine warmup_steps=5 logging_steps=1 save_steps=0 \
    >"$T/$1.log" 2>&1 || { cat "$T/$1.log"; fail "sft run $1"; }
}
sft lr_a 3e-3
sft lr_b 1e-3
"$BIN/grpo" configs/grpo.yml model_path="$T/lr_a" dataset_path="$T/train.jsonl" answer_field=completion \
  per_device_train_batch_size=16 num_generations=4 max_completion_length=8 logging_steps=1 save_steps=0 \
  learning_rate=1e-4 output_dir="$T/grpo" max_steps=6 reward_funcs=length,accuracy length_target=2 beta=0.05 \
  eval_dataset_path="$T/evalp.jsonl" eval_steps=3 >"$T/grpo.log" 2>&1 || { cat "$T/grpo.log"; fail "grpo run"; }
"$BIN/dpo" configs/dpo.yml model_path="$T/lr_a" dataset_path="$T/prefs.jsonl" eval_dataset_path="$T/prefs_eval.jsonl" \
  eval_on_start=true eval_steps=5 max_length=24 logging_steps=1 per_device_train_batch_size=8 learning_rate=2e-4 \
  save_steps=0 output_dir="$T/dpo" max_steps=10 >"$T/dpo.log" 2>&1 || { cat "$T/dpo.log"; fail "dpo run"; }

keys() { grep -o '<svg class="chart" data-key="[^"]*"' "$1" | sed 's/.*data-key="//; s/"$//'; }
# vertices PAGE KEY RUN: the vertices of RUN's curve in KEY's chart (M and L commands)
vertices() {
  grep -F "<path class=\"line\" data-key=\"$2\" data-run=\"$3\"" "$1" | sed 's/.* d="\([^"]*\)".*/\1/' | tr -cd 'ML' | wc -c
}
# check_page PAGE RUN...: structure, and every chart of every run against its metrics.jsonl
check_page() {
  page=$1
  shift
  [ "$(head -1 "$page")" = "<!DOCTYPE html>" ] || fail "$page does not start with <!DOCTYPE html>"
  for tag in html head body svg text g title; do
    o=$(grep -o "<$tag[ >]" "$page" | wc -l) c=$(grep -o "</$tag>" "$page" | wc -l)
    [ "$o" = "$c" ] && [ "$o" -gt 0 ] || fail "$page: $o <$tag> but $c </$tag>"
  done
  if command -v xmllint >/dev/null; then xmllint --noout "$page" || fail "$page is not well-formed"; fi
  ! grep -i -E '<script|https?:|src=|href=|url\(|@import' "$page" || fail "$page loads something or runs a script"
  [ "$(keys "$page" | wc -l)" -gt 0 ] || fail "$page has no chart"
  for k in $(keys "$page"); do
    grep -q "<text class=\"title\"[^>]*>$k</text>" "$page" || fail "$page: chart $k has no title"
    for run in "$@"; do
      want=$(grep -c -F "\"$k\":" "$T/$run/metrics.jsonl" || true)
      got=$(vertices "$page" "$k" "$run")
      [ "$got" = "$want" ] || fail "$page: chart $k: $run's curve has $got vertices, metrics.jsonl has $want lines with $k"
      [ "$want" = 0 ] || grep -q "<text class=\"legend\"[^>]*><tspan[^>]*>$run</tspan>" "$page" || fail "$page: no legend entry $run"
    done
  done
  for run in "$@"; do
    grep -q -F "$(tail -1 "$T/$run/metrics.jsonl" | sed 's/"/\&quot;/g')" "$page" || fail "$page lacks $run's last metrics line"
    grep -q -F "$(grep -m1 '^output_dir:' "$T/$run/config.yml")" "$page" || fail "$page lacks $run's config.yml"
    grep -q -F "$(tail -1 "$T/$run.log")" "$page" || fail "$page lacks the last line of $run.log"
  done
}
# in_order PAGE KEY...: these charts are there, in this order
in_order() {
  page=$1
  shift
  got=$(keys "$page" | grep -x -F "$(printf '%s\n' "$@")" | tr '\n' ' ')
  [ "$got" = "$* " ] || fail "$page: charts '$got', expected '$*'"
}

echo "== two SFT runs overlaid"
"$R" "$T/lr_a" "$T/lr_b" out="$T/sft.html" >"$T/out.txt" || fail "report of the two SFT runs"
grep -q -x -F "$T/sft.html" "$T/out.txt" || fail "the path written is not printed"
check_page "$T/sft.html" lr_a lr_b
in_order "$T/sft.html" loss eval_loss learning_rate grad_norm tokens_per_s mean_token_accuracy entropy
[ "$(vertices "$T/sft.html" loss lr_a)" = 20 ] || fail "the loss curve does not have one vertex per step"
[ "$(grep -c '<text class="legend"' "$T/sft.html")" = $((2 * $(keys "$T/sft.html" | wc -l))) ] \
  || fail "every chart needs a legend entry per run"
grep -q '<summary>config.yml' "$T/sft.html" && grep -q -F 'learning_rate: 0.003' "$T/sft.html" || fail "no config"

echo "== a GRPO run and a DPO run (the page goes to DIR/report.html)"
"$R" "$T/grpo" >"$T/out.txt" || fail "report of the GRPO run"
grep -q -x -F "$T/grpo/report.html" "$T/out.txt" || fail "the GRPO page is not DIR/report.html"
check_page "$T/grpo/report.html" grpo
in_order "$T/grpo/report.html" loss learning_rate grad_norm reward eval_reward reward_std rewards/length/mean \
  eval_rewards/length/mean rewards/accuracy/mean frac_reward_zero_std kl clip_ratio/low_mean clip_ratio/high_mean \
  completions/mean_length completions/clipped_ratio entropy
"$R" "$T/dpo" out="$T/dpo.html" >/dev/null || fail "report of the DPO run"
check_page "$T/dpo.html" dpo
in_order "$T/dpo.html" loss eval_loss learning_rate grad_norm tokens_per_s rewards/margins rewards/accuracies \
  rewards/chosen rewards/rejected logps/chosen logps/rejected

echo "== gaps, escaping, an empty run, an unfinished last line"
mkdir -p "$T/gaps" "$T/a<b&c" "$T/empty" "$T/partial"
printf '{"step":1,"loss":1.0}\n{"step":2,"loss":NaN}\n{"step":3,"loss":0.5}\n{"step":4,"loss":null}\n{"step":5,"loss":0.25}\n{"step":5,"eval_loss":2}\n{"step":6,"loss":0.2}\n' \
  >"$T/gaps/metrics.jsonl"
"$R" "$T/gaps" >/dev/null || fail "report with NaN and null values"
d=$(grep -F 'data-key="loss"' "$T/gaps/report.html" | grep '<path' | sed 's/.* d="\([^"]*\)".*/\1/')
[ "$(echo "$d" | tr -cd M)" = MMM ] && [ "$(echo "$d" | tr -cd L)" = L ] || fail "NaN and null do not break the curve: $d"
printf '{"step":1,"x<y>&\\"":1}\n' >"$T/a<b&c/metrics.jsonl"
"$R" "$T/a<b&c" >/dev/null || fail "report of a run with markup in its name"
grep -q '>a&lt;b&amp;c<' "$T/a<b&c/report.html" && grep -q '>x&lt;y&gt;&amp;&quot;</text>' "$T/a<b&c/report.html" \
  && ! grep -q -F 'a<b' "$T/a<b&c/report.html" || fail "names are not escaped"
: >"$T/empty/metrics.jsonl"
"$R" "$T/empty" >/dev/null || fail "report of an empty run"
grep -q 'No metrics yet' "$T/empty/report.html" && ! grep -q '<svg class="chart"' "$T/empty/report.html" \
  || fail "an empty metrics.jsonl does not say there are no metrics yet"
printf '{"step":1,"loss":1}\n{"step":2,"loss":0.5}\n{"step":3,"lo' >"$T/partial/metrics.jsonl"
"$R" "$T/partial" >/dev/null 2>"$T/warn.txt" || fail "report of a run writing its last line"
grep -q "metrics.jsonl:3: unfinished last line skipped" "$T/warn.txt" || fail "no warning for the unfinished line"
[ "$(vertices "$T/partial/report.html" loss partial)" = 2 ] || fail "the unfinished line was not skipped"

echo "== bad input: one line naming the file and line, exit 1"
one_line() { [ "$(wc -l <"$T/expect.log")" = 1 ] || { cat "$T/expect.log"; fail "more than one line for: $*"; }; }
expect 1 "nowhere: No such file or directory" "$R" "$T/nowhere"; one_line nowhere
mkdir -p "$T/nometrics" "$T/bad"
expect 1 "nometrics/metrics.jsonl: cannot open" "$R" "$T/nometrics"; one_line nometrics
printf '{"step":1,"loss":1}\n{"step":2,"loss":}\n{"step":3,"loss":1}\n' >"$T/bad/metrics.jsonl"
expect 1 "bad/metrics.jsonl:2: not valid JSON" "$R" "$T/bad"; one_line malformed
printf '{"step":1,"loss":1}\n{"loss":1}\n' >"$T/bad/metrics.jsonl"
expect 1 'bad/metrics.jsonl:2: no integer "step"' "$R" "$T/bad"; one_line no step
printf '[1, 2]\n' >"$T/bad/metrics.jsonl"
expect 1 "bad/metrics.jsonl:1: not a JSON object" "$R" "$T/bad"; one_line array
expect 1 "report.html: cannot write" "$R" "$T/lr_a" out="$T/nowhere/report.html"; one_line unwritable
expect 2 "usage: ctune-report DIR" "$R"
expect 1 "nowhere: No such file" "$R" "$T/lr_a" "$T/nowhere"

if command -v chromium >/dev/null; then
  echo "== chromium draws the page"
  timeout 60 chromium --headless --no-sandbox --disable-gpu --user-data-dir="$T/chromium" --window-size=1200,1600 \
    --screenshot="$T/sft.png" "file://$T/sft.html" >"$T/chromium.log" 2>&1 || true
  [ "$(head -c 4 "$T/sft.png" 2>/dev/null | tail -c 3)" = PNG ] && [ "$(wc -c <"$T/sft.png")" -gt 20000 ] \
    || { cat "$T/chromium.log"; fail "chromium did not draw the page"; }
else
  echo "SKIP: chromium is not installed, the page was not drawn (scripts/install-deps.sh test installs it)"
fi
echo "report: all checks passed"
