#!/bin/sh
# Absurd sizes in a model's config.json are refused from config.json alone, in bounded
# time and memory, with one line naming the key (and the tensor and both shapes where the
# weights contradict config.json): through sft's dry run and the sampler, each under a
# 1.5 GB address-space limit and a 20 s timeout. Before, 10^9 layers grew to 9 GB building
# the layout and head_dim 10^9 crashed the sampler (SIGSEGV in the RoPE tables). A model
# built from `model:` keys too big for the machine is refused naming the keys that made it.
. tests/lib/common.sh
start_test bounds

tiny_sft
"$BIN/sft" "$T/tiny.yml" output_dir="$T/m" max_steps=1 save_steps=0 eval_steps=0 model.hidden_size=64 \
  model.intermediate_size=128 >"$T/m.log" 2>&1 || { cat "$T/m.log"; fail "making the tiny model"; }

# limited CMD...: CMD under the memory limit and the timeout, its output in $T/out.
limited() {
  rc=0
  (ulimit -v 1500000 && exec timeout 20 "$@") >"$T/out" 2>&1 || rc=$?
}

# refused KEY VALUE PATTERN: a copy of the model whose config.json sets KEY to VALUE (JSON text)
# is refused by sft's dry run and by the sampler with exit 1 and a line matching PATTERN.
refused() {
  d="$T/bad" && rm -rf "$d" && mkdir -p "$d" && cp "$T/m/"* "$d/"
  sed -i "s/\"$1\": [^,]*,/\"$1\": $2,/" "$d/config.json"
  grep -q "\"$1\": $2," "$d/config.json" || fail "no $1 in config.json"
  # (num_threads=1: each pool thread needs 128 MiB of address space for OpenBLAS, so that the
  # limit holds the same on a machine of any core count)
  for run in "sft configs/sft.yml dataset_path=$T/train.jsonl model_path=$d output_dir=$T/o dry_run=true num_threads=1" \
             "sampler generate model_path=$d prompt=abc max_new_tokens=2 num_threads=1"; do
    # shellcheck disable=SC2086
    limited "$BIN/"$run
    [ "$rc" = 1 ] || { cat "$T/out"; fail "$1=$2: exit $rc (want 1) for ${run%% *}"; }
    grep -q -- "$3" "$T/out" || { cat "$T/out"; fail "$1=$2: ${run%% *} does not say '$3'"; }
    [ "$(grep -c -v '^ctune: \(OpenBLAS\|OPENBLAS_CORETYPE=\|tokenizer\)' "$T/out")" -le 1 ] || { cat "$T/out"; fail "not one line"; }
  done
  echo "$1=$2: $(tail -1 "$T/out")"
}

refused num_hidden_layers 1000000000 "config.json: key 'num_hidden_layers' is 1000000000, more than 256"
refused head_dim 1000000000 "config.json: key 'head_dim' is 1000000000, more than 1024"
refused vocab_size 100000000000 "config.json: key 'vocab_size' is 100000000000: out of range"
refused intermediate_size -3 "config.json: key 'intermediate_size' is -3: must be at least 1"
refused hidden_size 64.0 "config.json: key 'hidden_size' is 64.0: expected an integer"
refused rope_theta 1e39 "config.json: key 'rope_theta' is inf"
refused num_key_value_heads 8 "config.json: key 'num_key_value_heads' is 8, more than 4"
# within the bounds but contradicted by the weights: named by the key and the tensor's shapes
refused num_hidden_layers 200 "config.json's num_hidden_layers is 200 but the weights have no layer 2"
refused hidden_size 100000 "tensor 'model.embed_tokens.weight' has shape \[260, 64\] but config.json's hidden_size implies \[260, 100000\]"
refused vocab_size 4000000 "config.json's vocab_size implies \[4000000, 64\]"
refused intermediate_size 1000000 "mlp.gate_proj.weight' has shape \[128, 64\] but config.json's intermediate_size"

echo "== a model from \`model:\` keys too big for the machine: the refusal names its keys"
limited "$BIN/sft" "$T/tiny.yml" output_dir="$T/huge" dry_run=true model.hidden_size=65536 \
  model.intermediate_size=262144 model.num_hidden_layers=256 model.num_attention_heads=512 model.head_dim=128
[ "$rc" = 1 ] || { cat "$T/out"; fail "exit $rc for the huge model"; }
grep -q "the \`model:\` keys: .* billion parameters: num_hidden_layers 256 x .* a layer (hidden_size 65536, intermediate_size 262144.*: the memory plan needs .* MiB" "$T/out" \
  || { cat "$T/out"; fail "the huge model's refusal does not name its keys"; }
echo "config bounds: all checks passed"
