#!/bin/sh
# The command line as a user meets it: values read as YAML, trainer configs given to the
# sampler, TRL key names, every bad key reported at once, --help on every binary, and
# config.json values kept as written. Run by tests/run.sh (CT_BIN = binaries).
. tests/lib/common.sh
start_test cli_e2e

echo "== config.json keeps rms_norm_eps as given (no float32 noise)"
"$BIN/ctune-demo-data" reverse "$T/train.jsonl" "$T/eval.jsonl" 8 4 7 6
"$BIN/sft" configs/sft.yml dataset_path="$T/train.jsonl" output_dir="$T/eps" max_steps=1 \
  model.hidden_size=32 model.intermediate_size=64 model.num_hidden_layers=1 model.num_attention_heads=2 \
  model.rms_norm_eps=1e-6 max_length=24 save_steps=0 >"$T/eps.log" 2>&1 || { cat "$T/eps.log"; fail "training"; }
grep '"rms_norm_eps"' "$T/eps/config.json"
grep -Eq '"rms_norm_eps": 1e-0?6,' "$T/eps/config.json" || fail "config.json: rms_norm_eps is not 1e-06"
grep -Eq '"rope_theta": 10000(\.0)?,' "$T/eps/config.json" || fail "config.json: rope_theta is not 10000"

echo "all cli_e2e checks passed"
