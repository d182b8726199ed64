#!/bin/sh
# make demo: the whole suite on a bundled synthetic task (write a word backwards,
# "reverse kqxmb:" -> "bmxqk", generated with a fixed seed; a tenth of the training
# demonstrations carry a plausible mistake, the held-out words and the preference pairs'
# chosen answers are right), on a 3.2M-parameter model trained from scratch with the
# byte tokenizer:
#   1. SFT from scratch          held-out accuracy before (the initialization, saved by
#                                one step at learning rate 0) / after
#   2. DPO (RPO) from the SFT    reward accuracy and held-out accuracy before / after
#   3. GRPO from the SFT         reward per step, accuracy before / after; then a short
#                                run scored by the bundled remote reward server
#   4. distillation              teacher / distilled student / undistilled student
#   5. tool use                  another task, products of two 3-digit numbers: SFT on
#                                calculator demonstrations, then GRPO with the built-in
#                                calculator (configs/demo/*-tools.yml); sampled accuracy and
#                                tool calls per completion, the first and last quarter of
#                                GRPO's steps
#   then the four runs' curves on one page: demo-out/report.html (and, when chromium is
#   installed, a screenshot of it: demo-out/report.png)
# Accuracy = exact answers on 500 held-out words: greedy, and sampled at temperature 1.
# Every figure in the results table is measured by this run; the last line is its
# wall-clock time.
# usage: scripts/demo.sh BIN_DIR [quick]
# quick: every stage, binary and config of the full run, with a tenth of the data and a few steps each
# (tests/demo_quick.sh runs it in `make test`; its figures mean nothing, the README's table is the full run's).
set -eu
BIN=${1:-bin}
out=demo-out
start=$(date +%s)
if [ "${2:-}" = quick ]; then
  n_train=2000 n_eval=40 n_prefs=500 n_prefs_eval=20
  sft_q="max_steps=12 eval_steps=6 logging_steps=3 save_steps=6 warmup_steps=2"
  dpo_q="max_steps=4 logging_steps=2 warmup_steps=1" grpo_q="max_steps=2 logging_steps=1 per_device_train_batch_size=32"
  remote_q="max_steps=2 logging_steps=1 per_device_train_batch_size=32" kd_q="max_steps=6 logging_steps=3 warmup_steps=2"
  student_q="max_steps=6 warmup_steps=2"
  n_tools=2000 n_tools_eval=40 sft_tools_q="max_steps=20 logging_steps=10" grpo_tools_q="max_steps=2 per_device_train_batch_size=32"
else
  n_train=20000 n_eval=500 n_prefs=5000 n_prefs_eval=200
  sft_q="" dpo_q="" grpo_q="" remote_q="max_steps=6 logging_steps=3" kd_q="" student_q=""
  n_tools=6000 n_tools_eval=400 sft_tools_q="" grpo_tools_q=""
fi
mkdir -p "$out/data"
"$BIN/ctune-demo-data" reverse "$out/data/train.jsonl" "$out/data/eval.jsonl" $n_train $n_eval 1234 8 0.1
"$BIN/ctune-demo-data" reverse-prefs "$out/data/prefs.jsonl" "$out/data/prefs_eval.jsonl" $n_prefs $n_prefs_eval 55
"$BIN/ctune-demo-data" multiply-tool "$out/data/tools-demos.jsonl" "$out/data/tools-prompts.jsonl" $n_tools $n_tools_eval 3 3 0.3
acc() {  # acc MODEL TEMPERATURE -> exact-match fraction on the held-out words (stops the demo on failure)
  a=$("$BIN/sampler" accuracy model_path="$1" data="$out/data/eval.jsonl" temperature="$2" seed=7) ||
    { echo "demo: bin/sampler accuracy on $1 failed" >&2; exit 1; }
  echo "$a" | sed 's/.*"exact_match": *\([0-9.]*\).*/\1/'
}
# (a run's output goes to its log first: a failure in a pipeline would not stop the demo)
run_log() {  # run_log LOG CMD ARGS... -> runs it, its output in LOG; on failure shows LOG and stops
  log=$1; shift
  "$@" >"$log" 2>&1 || { cat "$log"; echo "demo: $1 failed (log: $log)" >&2; exit 1; }
}
pct() { awk -v x="$1" 'BEGIN { printf "%.1f%%", 100 * x }'; }
field() { grep "\"$2\"" "$1" | sed -n "$3" | sed "s|.*\"$2\": *\([-0-9.e+]*\).*|\1|"; }
steps() { grep -o '"step":[0-9]*' "$1/metrics.jsonl" | tail -1 | cut -d: -f2; }  # steps a run trained
params() { sed -n 's/.*, \([0-9.]*M\) parameters.*/\1/p' "$1" | head -1; }  # from a bin/sft log

echo "== 1. SFT: a 3.2M-parameter model from scratch learns to reverse words of 3-8 letters"
echo "   from demonstrations of which a tenth are wrong (a letter swapped or dropped, or not reversed)"
# before training: the same model as initialized (same seed), saved by one step at learning rate 0
"$BIN/sft" configs/demo/sft.yml output_dir="$out/init" max_steps=1 learning_rate=0 eval_dataset_path= \
  eval_steps=0 eval_on_start=false save_steps=0 >"$out/init.log" 2>&1 || { cat "$out/init.log"; exit 1; }
init_g=$(acc "$out/init" 0) init_s=$(acc "$out/init" 1)
"$BIN/sft" configs/demo/sft.yml $sft_q
sft_g=$(acc "$out/sft" 0) sft_s=$(acc "$out/sft" 1)

echo "== 2. DPO (RPO) from the SFT model, on pairs: right answer vs a plausible mistake"
"$BIN/dpo" configs/demo/dpo.yml $dpo_q
dpo_g=$(acc "$out/dpo" 0) dpo_s=$(acc "$out/dpo" 1)
ra0=$(field "$out/dpo/metrics.jsonl" "eval_rewards/accuracies" 1p)
ra1=$(field "$out/dpo/metrics.jsonl" "eval_rewards/accuracies" '$p')

echo "== 3. GRPO from the SFT model, with the accuracy reward (reward per step below)"
run_log "$out/grpo.log" "$BIN/grpo" configs/demo/grpo.yml $grpo_q
grep -o '"step":[0-9]*,"loss":[^,]*,"reward":[^,]*' "$out/grpo.log" |
  sed 's/"step":\([0-9]*\),"loss":[^,]*,"reward":\(.*\)/  step \1: mean reward \2/'
grpo_g=$(acc "$out/grpo" 0) grpo_s=$(acc "$out/grpo" 1)
echo "   ... and $(echo "$remote_q" | sed 's/.*max_steps=\([0-9]*\).*/\1/') steps scored by the bundled reward server (tools/ctune-reward-server, loopback)"
: >"$out/server.port"  # (the last run's port must not pass for this server's)
"$BIN/ctune-reward-server" port=0 >"$out/server.port" 2>"$out/server.log" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
i=0
while [ ! -s "$out/server.port" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
run_log "$out/grpo-remote.log" "$BIN/grpo" configs/demo/grpo.yml output_dir="$out/grpo-remote" $remote_q \
  reward_funcs=remote reward_url="http://127.0.0.1:$(head -1 "$out/server.port")/score"
grep -o '"rewards/remote/mean":[-0-9.e+]*' "$out/grpo-remote.log" | sed 's/^/   /'
kill $server 2>/dev/null || true

echo "== 4. distillation into a student with half the layers and half the width"
"$BIN/distill" configs/demo/distill.yml $kd_q
# the same student trained without a teacher, for as many steps
"$BIN/sft" configs/demo/sft.yml output_dir="$out/student-sft" model.hidden_size=128 \
  model.intermediate_size=384 model.num_hidden_layers=2 model.num_attention_heads=2 \
  model.num_key_value_heads=1 warmup_steps=50 eval_dataset_path= eval_steps=0 eval_on_start=false save_steps=0 \
  $student_q >"$out/student-sft.log" 2>&1 || { cat "$out/student-sft.log"; exit 1; }
kd_g=$(acc "$out/distill" 0) und_g=$(acc "$out/student-sft" 0)

echo "== 5. tool use: products of two 3-digit numbers, which a small model cannot compute but can look up"
echo "   SFT on calculator demonstrations (30% answer at once with a wrong guess instead), then GRPO"
echo "   with the built-in calculator and the accuracy reward (reward and tool calls per step below)"
"$BIN/sft" configs/demo/sft-tools.yml $sft_tools_q
run_log "$out/grpo-tools.log" "$BIN/grpo" configs/demo/grpo-tools.yml $grpo_tools_q
grep -o '"step":[0-9]*,"loss":[^,]*,"reward":[^,]*' "$out/grpo-tools.log" | sed -n '1p;10p;20p;30p;40p' |
  sed 's/"step":\([0-9]*\),"loss":[^,]*,"reward":\(.*\)/  step \1: mean reward \2/'
tmean() {  # tmean KEY FIRST|LAST: KEY's mean over the tool-use GRPO's first or last quarter of steps
  grep '"step"' "$out/grpo-tools/metrics.jsonl" | grep -o "\"$1\":[-0-9.e+]*" | cut -d: -f2 |
    awk -v w="$2" '{ v[NR] = $1 } END { q = int((NR + 3) / 4); for (i = 1; i <= q; i++) s += v[w == "first" ? i : NR - q + i]; print s / q }'
}
tq=$(( ($(steps "$out/grpo-tools") + 3) / 4 ))

row() { printf '  %-44s %s\n' "$1" "$2"; }
echo
echo "demo results: exact answers on $n_eval held-out words (greedy / sampled at temperature 1)"
row "0. before training (the initialization)" "$(pct "$init_g") / $(pct "$init_s")"
row "1. SFT, $(steps "$out/sft") steps" "$(pct "$sft_g") / $(pct "$sft_s")"
row "2. SFT + DPO (RPO), $(steps "$out/dpo") steps" \
  "$(pct "$dpo_g") / $(pct "$dpo_s")   (held-out reward accuracy $(pct "$ra0") -> $(pct "$ra1"))"
row "3. SFT + GRPO, $(steps "$out/grpo") steps" "$(pct "$grpo_g") / $(pct "$grpo_s")"
row "4. distilled student, $(steps "$out/distill") steps" "$(pct "$kd_g")   (teacher: the SFT model, $(pct "$sft_g"))"
echo "     (half the layers and half the width: $(params "$out/student-sft.log") parameters; the teacher $(params "$out/init.log"))"
row "   the same student without a teacher" "$(pct "$und_g")"
echo "tool use: exact products among GRPO's samples, its first $tq steps -> its last $tq (after $(steps "$out/sft-tools") SFT steps)"
calls0=$(tmean 'tools\/call_frequency' first) calls1=$(tmean 'tools\/call_frequency' last)
row "5. SFT + GRPO with the calculator, $(steps "$out/grpo-tools") steps" \
  "$(pct "$(tmean reward first)") -> $(pct "$(tmean reward last)")   (tool calls per completion $(printf '%.2f -> %.2f' "$calls0" "$calls1"))"
echo "models (Hugging Face format) and metrics.jsonl in $out/{sft,dpo,grpo,distill,sft-tools,grpo-tools}"
"$BIN/ctune-report" "$out/sft" "$out/dpo" "$out/grpo" "$out/distill" out="$out/report.html" >/dev/null
echo "training curves of the four runs (one HTML page, no script): $out/report.html"
if command -v chromium >/dev/null; then  # optional: a picture of the page
  timeout 60 chromium --headless --no-sandbox --disable-gpu --user-data-dir="$out/.chromium" --window-size=1200,3000 \
    --screenshot="$out/report.png" "file://$(pwd)/$out/report.html" >/dev/null 2>&1 && echo "a screenshot of it: $out/report.png"
  rm -rf "$out/.chromium"
fi
"$BIN/ctune-report" "$out/grpo-tools" out="$out/report-tools.html" >/dev/null
echo "the tool-use GRPO run's curves (tools/call_frequency among them): $out/report-tools.html"
echo "demo time: $(( $(date +%s) - start )) s wall clock"
