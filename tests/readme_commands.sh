#!/bin/sh
# Every `bin/...` command line the README shows in a code block, run exactly as written (the line is
# read from README.md, so an edit there is what runs here), in a scratch directory holding the files
# those lines name: ./my-hf-model, train.jsonl, prefs.jsonl, prompts.jsonl, out/sft, out/big, ...
# made small (a tiny model, a few dozen rows) so that each runs in seconds. `[...]` marks an optional
# part (after a blank; `k=[a,b]` is a list): the line runs without it, then with it. A README command line no scenario below runs fails
# the test, so a new one cannot go unrun. Run by tests/run.sh (CT_BIN = binaries).
. tests/lib/common.sh
start_test readme_commands
top=$(pwd) BIN=$(cd "$BIN" && pwd)
W="$T/w"
mkdir -p "$W/fixtures"
ln -s "$BIN" "$W/bin"
ln -s "$top/configs" "$W/configs"

# --- the files the lines name, made once (in fixtures/) and copied into each scenario's directory
F="$W/fixtures"
"$BIN/ctune-demo-data" reverse "$F/train.jsonl" "$F/eval.jsonl" 64 16 3 6 >/dev/null
"$BIN/ctune-demo-data" reverse-prefs "$F/prefs.jsonl" "$F/heldout.jsonl" 24 8 5 6 >/dev/null
"$BIN/ctune-demo-data" reverse-kto "$F/kto.jsonl" "$F/kto_heldout.jsonl" 24 8 7 6 >/dev/null
cp "$F/prefs.jsonl" "$F/pairs.jsonl"
cp "$F/train.jsonl" "$F/data.jsonl"
head -8 "$F/train.jsonl" >"$F/rows.jsonl"
head -2 "$F/eval.jsonl" | sed 's/"completion"/"answer"/' >"$F/prompts.jsonl"
model() {  # model DIR HIDDEN LAYERS [KEY=VALUE]: a model from scratch (byte tokenizer), one step of SFT
  "$BIN/sft" configs/sft.yml dataset_path="$F/train.jsonl" output_dir="$1" max_steps=1 save_steps=0 ${4:-} \
    model.hidden_size="$2" model.intermediate_size=$(($2 * 2)) model.num_hidden_layers="$3" \
    model.num_attention_heads=2 model.num_key_value_heads=1 model.max_position_embeddings=128 max_length=64 \
    >"$T/model.log" 2>&1 || { cat "$T/model.log"; fail "making fixture model $1"; }
}
model "$F/my-hf-model" 32 1
# teacher and student share a tokenizer that is not the built-in byte tokenizer (one merge more):
# `precompute` without model_path once tokenized with the byte tokenizer and refused the teacher's
mkdir -p "$T/tok"
sed -e 's/"vocab": {/"vocab": {"re": 260,/' -e 's/"merges": \[\]/"merges": ["r e"]/' \
  "$F/my-hf-model/tokenizer.json" >"$T/tok/tokenizer.json"
cp "$F/my-hf-model/tokenizer_config.json" "$T/tok/"
model "$F/big" 48 2 tokenizer_path="$T/tok"
model "$F/small" 32 1 tokenizer_path="$T/tok"
grep -q '"vocab_size": 261' "$F/big/config.json" || fail "the teacher's tokenizer did not get its extra token"

ran="$T/ran"  # the README lines run so far
: >"$ran"
scenario() {  # scenario NAME: a fresh directory with the fixtures; out/ holds what the lines expect
  S="$W/$1"
  mkdir -p "$S/out"
  cp -r "$F"/* "$S/"
  ln -s "$BIN" "$S/bin"
  ln -s "$top/configs" "$S/configs"
  echo "== $1"
}
# line TEXT: the README line that starts with TEXT (after its 4-space indent), run in $S as written
line() {
  l=$(grep -F -- "    $1" "$top/README.md" | head -1 | sed 's/^    //')
  [ -n "$l" ] || fail "README has no command line starting '$1'"
  echo "$l" >>"$ran"
  plain=$(echo "$l" | sed 's/ \[[^]]*\]//g')  # ( [x=1] after a blank is optional; k=[a,b] a list)
  run_line "$plain"
  full=$(echo "$l" | sed 's/ \[\([^]]*\)\]/ \1/g')
  [ "$full" = "$plain" ] || run_line "$full"
}
run_line() {
  echo "\$ $1"
  (cd "$S" && sh -c "$1") >"$T/line.log" 2>&1 || { tail -n 20 "$T/line.log"; fail "README command failed: $1"; }
}

scenario fine-tune  # out: a full model trained by the first command
line "bin/sft configs/sft.yml model_path=./my-hf-model dataset_path=train.jsonl output_dir=out max_steps=200"
line "bin/sampler generate model_path=out prompt=\"reverse hello:\" temperature=0"
line "bin/sampler generate model_path=out prompts_path=prompts.jsonl n=4 output=json"
line "bin/sampler score    model_path=out data=rows.jsonl"
line "bin/sampler generate out/config.yml model_path=out prompt=\"reverse hello:\""
line "bin/sampler accuracy model_path=out data=eval.jsonl temperature=0"
line "bin/ctune-ckpt inspect out  "
line "bin/ctune-ckpt convert in=out out=out-bf16 dtype=bfloat16"
rm -rf "$S/other" && cp -r "$S/out" "$S/other"  # (compare exits 1 when they differ: the same model here)
line "bin/ctune-ckpt compare a=out b=other"
line "bin/ctune-ckpt shard in=out out=out-sharded max_shard_size=2GB"
line "bin/ctune-ckpt gguf in=out out=model.gguf type=q8_0"

scenario lora  # out: a LoRA adapter over ./my-hf-model (base: the same model)
line "bin/sft configs/sft.yml model_path=./my-hf-model dataset_path=train.jsonl output_dir=out use_peft=true"
line "bin/ctune-ckpt merge-lora base=./my-hf-model adapter=out out=merged"
line "bin/sampler generate model_path=./my-hf-model adapter_path=out prompt=\"...\""
cp -r "$S/my-hf-model" "$S/base"
rm -rf "$S/merged"
line "bin/ctune-ckpt merge-lora base=base adapter=out out=merged"
line "bin/ctune-ckpt gguf in=base adapter=out out=model.gguf"

scenario preference  # out/sft: a model to start from
cp -r "$S/my-hf-model" "$S/out/sft"
line "bin/dpo configs/dpo.yml model_path=out/sft dataset_path=prefs.jsonl output_dir=out/dpo"
line "bin/dpo configs/kto.yml model_path=out/sft dataset_path=kto.jsonl output_dir=out/kto"
line "bin/grpo configs/grpo.yml model_path=out/sft dataset_path=prompts.jsonl output_dir=out/grpo"
line "bin/reward configs/reward.yml model_path=out/sft dataset_path=pairs.jsonl output_dir=out/rm"
line "bin/reward score model_path=out/rm data=rows.jsonl"
line "bin/reward eval  model_path=out/rm data=heldout.jsonl"
line "bin/grpo configs/grpo.yml model_path=out/sft dataset_path=prompts.jsonl reward_funcs=[accuracy,out/rm]"

scenario agents  # out/sft: a model to start from; the bundled tool and environment servers on 8001, 8002
cp -r "$S/my-hf-model" "$S/out/sft"
"$BIN/ctune-demo-data" guess-env "$S/games-demos.jsonl" "$S/games.jsonl" 8 4 3 >/dev/null
line "bin/grpo configs/grpo.yml model_path=out/sft dataset_path=prompts.jsonl output_dir=out/tools tools=calculator"
line "bin/ctune-tool-server port=8001 &"
line "bin/grpo configs/grpo.yml model_path=out/sft dataset_path=prompts.jsonl output_dir=out/tools tool_url="
line "bin/ctune-env-server port=8002 &"
line "bin/grpo configs/grpo.yml model_path=out/sft dataset_path=games.jsonl output_dir=out/env env_url="
pkill -f "ctune-tool-server port=8001" || true
pkill -f "ctune-env-server port=8002" || true

scenario distill  # out/big, out/small: teacher and student with one tokenizer
cp -r "$S/big" "$S/out/big"
cp -r "$S/small" "$S/out/small"
line "bin/distill configs/distill.yml teacher_path=out/big model_path=out/small dataset_path=data.jsonl"
line "bin/distill precompute configs/distill.yml teacher_path=out/big dataset_path=data.jsonl teacher_logits_path=topk.safetensors"

echo "== every README command line ran"
grep '^    bin/' "$top/README.md" | sed 's/^    //' | while IFS= read -r l; do
  grep -qxF -- "$l" "$ran" || fail "README command not run by this test: $l"
done
echo "readme_commands: all checks passed"
