#!/bin/sh
# bin/ctune-ckpt inspect / convert / compare / shard: on a training checkpoint of a tiny
# model (parameter count from config.json by hand; a bf16 conversion loads and leaves the
# training state out; compare's numbers on hand-made files; shards that the sampler loads
# to the same greedy output, and that join back into the original file byte for byte), on
# a 96 MiB file streamed through a 1 MiB buffer (peak memory stays below the largest
# tensor), and bad input (one clear line, no output left behind). Run by tests/run.sh.
. tests/lib/common.sh
start_test ckpt_tools
C="$BIN/ctune-ckpt"

# st FILE HEADER_JSON: a safetensors file whose data section comes from stdin
st() {
  h=$2
  while [ $(( ${#h} % 8 )) -ne 0 ]; do h="$h "; done
  n=${#h}
  {
    i=0
    while [ $i -lt 8 ]; do printf "\\$(printf %03o $(( (n >> (8 * i)) & 255 )))"; i=$((i + 1)); done
    printf '%s' "$h"
    cat
  } >"$1"
}

tiny_sft 'logging_steps: 1'
"$BIN/sft" "$T/tiny.yml" output_dir="$T/run" max_steps=2 save_steps=2 eval_dataset_path= >"$T/sft.log" 2>&1 \
  || { cat "$T/sft.log"; fail "training the tiny model"; }
ck=$T/run/checkpoint-2

echo "== inspect: every tensor, and the parameter count config.json implies"
"$C" inspect "$ck" >"$T/inspect.txt" 2>/dev/null || fail "inspect"
cat "$T/inspect.txt" | sed -n '1,3p;$p'
expected=$(tr -d ' ,' <"$ck/config.json" | awk -F: '
  { gsub(/"/, "", $1); v[$1] = $2 }
  END { C = v["hidden_size"]; F = v["intermediate_size"]; L = v["num_hidden_layers"]; H = v["num_attention_heads"];
        KV = v["num_key_value_heads"]; hd = C / H; V = v["vocab_size"]
        layer = C * H * hd * 2 + 2 * C * KV * hd + 3 * C * F + 2 * C
        print V * C + L * layer + C + (v["tie_word_embeddings"] == "true" ? 0 : V * C) }')
grep -q "^total: 20 tensors, $expected parameters" "$T/inspect.txt" || fail "inspect does not count $expected parameters"
grep -q "model.layers.1.self_attn.k_proj.weight *F32 *\[64, 128\] *32768" "$T/inspect.txt" || fail "k_proj's line"
grep -q "metadata: format=pt" "$T/inspect.txt" || fail "the metadata"
grep -q "training state (not counted): optimizer.safetensors: 40 tensors" "$T/inspect.txt" || fail "the optimizer state"
grep -q "trainer_state.json at step 2" "$T/inspect.txt" || fail "the checkpoint's step"

echo "== convert: a training checkpoint -> a bfloat16 Hugging Face model, and back to float32"
"$C" convert in="$ck" out="$T/bf16" dtype=bfloat16 2>"$T/convert.log" || { cat "$T/convert.log"; fail "convert"; }
grep -q "left out (training state, not the model): .*optimizer.safetensors" "$T/convert.log" || fail "no word on the optimizer"
[ "$(ls "$T/bf16" | tr '\n' ' ')" = "config.json model.safetensors tokenizer.json tokenizer_config.json " ] \
  || fail "bf16 dir holds $(ls "$T/bf16" | tr '\n' ' ')"
grep -q '"torch_dtype": "bfloat16"' "$T/bf16/config.json" || fail "config.json's torch_dtype"
[ "$(diff "$ck/config.json" "$T/bf16/config.json" | grep -c '^[<>]')" = 2 ] || fail "config.json changed beyond torch_dtype"
"$C" inspect "$T/bf16" 2>/dev/null | grep -q "; BF16 x 20$" || fail "the converted tensors are not all BF16"
[ $(( $(wc -c <"$ck/model.safetensors") / $(wc -c <"$T/bf16/model.safetensors") )) = 1 ] || fail "size"
rc=0; "$C" compare a="$ck" b="$T/bf16" >"$T/cmp.txt" 2>/dev/null || rc=$?
[ $rc = 1 ] || fail "float32 vs bfloat16 at numpy's default tolerance exited $rc, expected 1"
# bfloat16 keeps 8 significant bits: round to nearest is within 2^-9 of the value
"$C" compare a="$ck" b="$T/bf16" rtol=0.00391 atol=0 >"$T/cmp.txt" 2>/dev/null || { cat "$T/cmp.txt"; fail "bf16 rounding past 2^-8"; }
"$C" convert in="$T/bf16" out="$T/f32" dtype=float32 2>/dev/null || fail "convert back"
"$C" compare a="$T/bf16" b="$T/f32" rtol=0 atol=0 >/dev/null 2>&1 || fail "bf16 -> f32 is not exact"
"$BIN/sampler" generate model_path="$T/bf16" prompt="reverse abc:" temperature=0 max_new_tokens=4 >/dev/null 2>&1 \
  || fail "the bf16 model does not load"

echo "== compare: hand-computed differences"
# x = [1, 2] vs [1, 2.5]: max_abs 0.5, max_rel 0.5 / 2.5 = 0.2; y equal; z only in b
printf '\000\000\200\077\000\000\000\100\000\000\200\077' | st "$T/a.safetensors" \
  '{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}'
printf '\000\000\200\077\000\000\040\100\000\000\200\077' | st "$T/b.safetensors" \
  '{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}'
printf '\000\000\200\077\000\000\040\100\000\000\200\077\000\000' | st "$T/c.safetensors" \
  '{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"z":{"dtype":"BF16","shape":[1],"data_offsets":[12,14]}}'
rc=0; "$C" compare a="$T/a.safetensors" b="$T/b.safetensors" >"$T/cmp.txt" 2>/dev/null || rc=$?
cat "$T/cmp.txt"
[ $rc = 1 ] || fail "compare exited $rc for a difference of 0.5"
grep -q "^x  *F32/F32  *0.5  *0.2 DIFFERS" "$T/cmp.txt" || fail "x's line"
grep -q "^y  *F32/F32  *0  *0 ok" "$T/cmp.txt" || fail "y's line"
"$C" compare a="$T/a.safetensors" b="$T/b.safetensors" atol=0.5 rtol=0 >/dev/null 2>&1 || fail "atol 0.5 should pass"
"$C" compare a="$T/a.safetensors" b="$T/b.safetensors" atol=0 rtol=0.2 >/dev/null 2>&1 || fail "rtol 0.2 should pass"
rc=0; "$C" compare a="$T/b.safetensors" b="$T/c.safetensors" >"$T/cmp.txt" 2>/dev/null || rc=$?
[ $rc = 1 ] && grep -q "^z  *only in $T/c.safetensors" "$T/cmp.txt" || fail "a tensor missing from a is not a failure"

# integer tensors: compared byte for byte
printf '\001\000\000\000' | st "$T/i1.safetensors" '{"ids":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}'
printf '\002\000\000\000' | st "$T/i2.safetensors" '{"ids":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}'
"$C" compare a="$T/i1.safetensors" b="$T/i1.safetensors" >/dev/null 2>&1 || fail "equal I32 tensors differ"
rc=0; "$C" compare a="$T/i1.safetensors" b="$T/i2.safetensors" >"$T/cmp.txt" 2>/dev/null || rc=$?
[ $rc = 1 ] && grep -q "not floating-point: their bytes differ" "$T/cmp.txt" || fail "I32 1 vs 2 is not a difference"

echo "== shard: HF's layout; the sampler reads it; joined back it is the original file"
"$C" shard in="$T/run" out="$T/sh" max_shard_size=200KB 2>"$T/shard.log" || { cat "$T/shard.log"; fail "shard"; }
cat "$T/shard.log"
ls "$T/sh"
[ -f "$T/sh/model-00001-of-00009.safetensors" ] && [ -f "$T/sh/model-00009-of-00009.safetensors" ] || fail "shard names"
[ ! -e "$T/sh/model.safetensors" ] || fail "a sharded dir must not hold model.safetensors (it would win)"
for f in "$T"/sh/model-*.safetensors; do
  size=$("$C" inspect "$f" 2>/dev/null | sed -n 's/^total: .* \([0-9]*\) bytes of tensor data.*/\1/p')
  [ "$size" -le 200000 ] || fail "$f holds $size bytes of tensors, more than 200KB"
done
total=$(sed -n 's/.*"total_size": \([0-9]*\).*/\1/p' "$T/sh/model.safetensors.index.json")
[ "$total" = $(( $(wc -c <"$T/run/model.safetensors") - 8 - $(od -An -tu8 -N8 "$T/run/model.safetensors" | tr -d ' ') )) ] \
  || fail "index total_size $total is not the tensors' bytes"
[ "$(grep -c '": "model-0000' "$T/sh/model.safetensors.index.json")" = 20 ] || fail "weight_map does not name 20 tensors"
for m in run sh; do
  "$BIN/sampler" generate model_path="$T/$m" prompt="reverse abcde:" temperature=0 max_new_tokens=12 output=json \
    >"$T/$m.gen" 2>/dev/null || fail "sampler on $m"
done
cmp "$T/run.gen" "$T/sh.gen" || fail "the sharded model generates differently"
"$BIN/sft" "$T/tiny.yml" output_dir="$T/from_sh" model_path="$T/sh" max_steps=1 save_steps=0 eval_dataset_path= \
  >"$T/sft2.log" 2>&1 || { cat "$T/sft2.log"; fail "sft does not start from a sharded model"; }
"$C" shard in="$T/sh" out="$T/one" max_shard_size=1GB 2>/dev/null || fail "shard into one file"
[ ! -e "$T/one/model.safetensors.index.json" ] || fail "one shard must be a plain model.safetensors"
cmp "$T/run/model.safetensors" "$T/one/model.safetensors" || fail "sharded and joined again is not the original file"
"$C" convert in="$T/sh" out="$T/sh16" dtype=float16 2>/dev/null || fail "convert a sharded model"
[ -f "$T/sh16/model-00009-of-00009.safetensors" ] && grep -q '"total_size"' "$T/sh16/model.safetensors.index.json" \
  || fail "a sharded model converts to the same shards"
"$C" compare a="$T/run" b="$T/sh16" rtol=0.001 atol=1e-7 >/dev/null 2>&1 || fail "float16 shards differ from the model"

echo "== streaming: a 96 MiB file (three 32 MiB tensors) through a 1 MiB buffer"
mkdir "$T/big"
hdr='{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[8192,1024],"data_offsets":[0,33554432]},"b":{"dtype":"F32","shape":[8192,1024],"data_offsets":[33554432,67108864]},"c":{"dtype":"F32","shape":[8192,1024],"data_offsets":[67108864,100663296]}}'
yes | head -c 100663296 | st "$T/big/model.safetensors" "$hdr"  # every float 0x0a790a79, finite
peak() { sed -n 's/.*peak memory \([0-9.]*\) MiB.*/\1/p' "$1"; }
export CT_CKPT_BUFFER=1048576
"$C" inspect "$T/a.safetensors" >/dev/null 2>"$T/p0.log"
"$C" convert in="$T/big" out="$T/big16" dtype=bfloat16 2>"$T/p1.log" || { cat "$T/p1.log"; fail "convert big"; }
"$C" compare a="$T/big" b="$T/big16" rtol=0.004 >/dev/null 2>"$T/p2.log" || fail "compare big"
"$C" shard in="$T/big" out="$T/bigsh" max_shard_size=40MB 2>"$T/p3.log" || fail "shard big"
"$C" inspect "$T/big" >/dev/null 2>"$T/p4.log" || fail "inspect big"
unset CT_CKPT_BUFFER
base=$(peak "$T/p0.log")
echo "peak MiB: inspect of a tiny file $base; convert $(peak "$T/p1.log"), compare $(peak "$T/p2.log"), shard $(peak "$T/p3.log"), inspect $(peak "$T/p4.log")"
[ "$(ls "$T/bigsh" | grep -c '^model-0000[123]-of-00003.safetensors$')" = 3 ] || fail "three 32 MiB tensors at 40MB are 3 shards"
for k in 1 2 3 4; do
  p=$(peak "$T/p$k.log")
  # the bound the tools promise, minus a margin: the largest tensor (32 MiB) plus the buffers
  awk -v p="$p" -v b="$base" 'BEGIN { exit !(p < b + 24) }' || fail "step $k peaked at $p MiB (tiny file: $b MiB)"
done

echo "== bad input: one line, exit 2 (usage) or 1, nothing left behind"
expect 2 "dtype 'fp8' is not bfloat16, float16 or float32" "$C" convert in="$ck" out="$T/x" dtype=fp8
expect 2 "unknown argument 'size=1'" "$C" convert in="$ck" out="$T/x" dtype=float32 size=1
expect 2 "convert: in=$T/none is not a directory" "$C" convert in="$T/none" out="$T/x" dtype=float32
expect 1 "out=$T/bf16 exists and is not empty" "$C" convert in="$ck" out="$T/bf16" dtype=float32
expect 2 "max_shard_size 'lots' is not a size" "$C" shard in="$ck" out="$T/x" max_shard_size=lots
expect 2 "rtol and atol must be finite numbers >= 0" "$C" compare a="$ck" b="$ck" rtol=-1
expect 2 "cannot open" "$C" compare a="$ck" b="$T/none"
expect 1 "$T/none: cannot open" "$C" inspect "$T/none"
head -c 100 "$T/a.safetensors" >"$T/cut.safetensors"
expect 1 "cut.safetensors" "$C" inspect "$T/cut.safetensors"
mkdir "$T/empty"
expect 1 "no model.safetensors or model.safetensors.index.json" "$C" convert in="$T/empty" out="$T/x" dtype=float32
"$BIN/sft" "$T/tiny.yml" output_dir="$T/lora" max_steps=1 save_steps=0 eval_dataset_path= use_peft=true \
  >"$T/lora.log" 2>&1 || { cat "$T/lora.log"; fail "LoRA run"; }
expect 1 "is a LoRA adapter (adapter_model.safetensors), not a model; merge it first" \
  "$C" convert in="$T/lora" out="$T/x" dtype=float32
"$C" inspect "$T/lora" 2>/dev/null | grep -q "lora_A" || fail "inspect does not read an adapter"
[ ! -e "$T/x" ] && [ -z "$(ls -d "$T"/x.tmp-* 2>/dev/null)" ] || fail "a failed command left output behind"

echo "== inspect reads a GGUF file's header (it said 'not a safetensors file?')"
"$C" gguf in="$ck" out="$T/m.gguf" type=q8_0 >/dev/null 2>&1 || fail "gguf export"
"$C" inspect "$T/m.gguf" >"$T/gguf.txt" 2>"$T/gguf.err" || { cat "$T/gguf.err"; fail "inspect of a GGUF file"; }
sed -n '1,2p;$p' "$T/gguf.txt"
grep -q "m.gguf: GGUF v3, [0-9]* bytes, architecture llama, .*, 20 tensors$" "$T/gguf.txt" || fail "GGUF header line"
grep -q "blk.1.attn_k.weight *q8_0 *\[64, 128\] *8704$" "$T/gguf.txt" || fail "GGUF tensor line"
grep -q "^total: 20 tensors, $expected parameters" "$T/gguf.txt" || fail "GGUF parameter count"
head -c 200 "$T/m.gguf" >"$T/cut.gguf"
expect 1 "cut.gguf: GGUF header" "$C" inspect "$T/cut.gguf"
echo "ckpt tools: all checks passed"
