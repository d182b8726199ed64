#!/bin/sh
# make demo: the whole suite on a bundled synthetic task (write a word backwards,
# "reverse kqxmb:" -> "bmxqk", generated with a fixed seed), on a 3.4M-parameter model
# trained from scratch with the byte tokenizer:
#   1. SFT from scratch          held-out accuracy before / after
#   2. DPO (RPO) from the SFT    reward accuracy and held-out accuracy before / after
#   3. GRPO from the SFT         reward per step, accuracy before / after; then a short
#                                run scored by the bundled remote reward server
#   4. distillation              teacher / distilled student / undistilled student
# Accuracy = exact answers on 500 held-out words: greedy, and sampled at temperature 1.
# usage: scripts/demo.sh BIN_DIR
set -eu
BIN=${1:-bin}
out=demo-out
mkdir -p "$out/data"
"$BIN/ctune-demo-data" reverse "$out/data/train.jsonl" "$out/data/eval.jsonl" 20000 500 1234
"$BIN/ctune-demo-data" reverse-prefs "$out/data/prefs.jsonl" "$out/data/prefs_eval.jsonl" 5000 200 55
acc() {  # acc MODEL TEMPERATURE -> exact-match fraction on the held-out words
  "$BIN/sampler" accuracy model_path="$1" data="$out/data/eval.jsonl" temperature="$2" seed=7 |
    sed 's/.*"exact_match": *\([0-9.]*\).*/\1/'
}
pct() { awk -v x="$1" 'BEGIN { printf "%.1f%%", 100 * x }'; }
field() { grep "\"$2\"" "$1" | sed -n "$3" | sed "s|.*\"$2\": *\([-0-9.e+]*\).*|\1|"; }

echo "== 1. SFT: a 3.4M-parameter model from scratch learns to reverse words of 3-8 letters"
"$BIN/sft" configs/demo/sft.yml output_dir="$out/sft"
sft_g=$(acc "$out/sft" 0) sft_s=$(acc "$out/sft" 1)

echo "== 2. DPO (RPO) on pairs: right answer vs a plausible mistake"
"$BIN/dpo" configs/demo/dpo.yml
dpo_g=$(acc "$out/dpo" 0) dpo_s=$(acc "$out/dpo" 1)
ra0=$(field "$out/dpo/metrics.jsonl" "eval_rewards/accuracies" 1p)
ra1=$(field "$out/dpo/metrics.jsonl" "eval_rewards/accuracies" '$p')

echo "== 3. GRPO with the accuracy reward (reward per step below)"
"$BIN/grpo" configs/demo/grpo.yml 2>&1 | grep -o '"step":[0-9]*,"loss":[^,]*,"reward":[^,]*' |
  sed 's/"step":\([0-9]*\),"loss":[^,]*,"reward":\(.*\)/  step \1: mean reward \2/'
grpo_g=$(acc "$out/grpo" 0) grpo_s=$(acc "$out/grpo" 1)
echo "   ... and 6 steps scored by the bundled reward server (tools/ctune-reward-server, loopback)"
"$BIN/ctune-reward-server" port=0 >"$out/server.port" 2>"$out/server.log" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
i=0
while [ ! -s "$out/server.port" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
"$BIN/grpo" configs/demo/grpo.yml output_dir="$out/grpo-remote" max_steps=6 logging_steps=3 \
  reward_funcs=remote reward_url="http://127.0.0.1:$(head -1 "$out/server.port")/score" 2>&1 |
  grep -o '"rewards/remote/mean":[-0-9.e+]*' | sed 's/^/   /'
kill $server 2>/dev/null || true

echo "== 4. distillation into a student with half the layers and half the width"
"$BIN/distill" configs/demo/distill.yml
# the same student trained without a teacher, for as many steps
"$BIN/sft" configs/demo/sft.yml output_dir="$out/student-sft" model.hidden_size=128 \
  model.intermediate_size=384 model.num_hidden_layers=2 model.num_attention_heads=2 \
  model.num_key_value_heads=1 warmup_steps=50 eval_dataset_path= save_steps=0 >"$out/student-sft.log" 2>&1
kd_g=$(acc "$out/distill" 0) und_g=$(acc "$out/student-sft" 0)

echo
echo "demo results: exact answers on 500 held-out words (greedy / sampled at temperature 1)"
echo "  before training                           0.0%"
echo "  1. SFT, 380 steps                         $(pct "$sft_g") / $(pct "$sft_s")"
echo "  2. + DPO (RPO), 200 steps                 $(pct "$dpo_g") / $(pct "$dpo_s")   (held-out reward accuracy $(pct "$ra0") -> $(pct "$ra1"))"
echo "  3. + GRPO, 150 steps                      $(pct "$grpo_g") / $(pct "$grpo_s")"
echo "  4. distilled student (half size)          $(pct "$kd_g")   (teacher: the SFT model, $(pct "$sft_g"))"
echo "     the same student without a teacher     $(pct "$und_g")"
echo "models (Hugging Face format) and metrics.jsonl in $out/{sft,dpo,grpo,distill}"
