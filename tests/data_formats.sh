#!/bin/sh
# Data shapes through the executables: a JSON array, gzip JSONL and gzip JSON train as the
# JSONL; ShareGPT and Alpaca rows train as their TRL equivalents (same losses, bit for
# bit); Parquet/Arrow/datasets directories, ids past the tokenizer and roles the template
# drops fail with one clear line; DPO rows without a prompt train as their explicit form;
# GRPO reads Alpaca prompts with answer_field=output.
. tests/lib/common.sh
start_test data_formats

cat > "$T/tiny.yml" <<YML
base_config: $(pwd)/configs/sft.yml
model:
  hidden_size: 32
  intermediate_size: 64
  num_hidden_layers: 1
  num_attention_heads: 2
  num_key_value_heads: 1
max_length: 64
per_device_train_batch_size: 4
learning_rate: 1e-3
logging_steps: 1
save_steps: 0
YML
losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/.*"loss":\([-0-9.e+]*\).*/\1/'; }
sft() {
  out=$1
  shift
  "$BIN/sft" "$T/tiny.yml" output_dir="$T/$out" max_steps=3 "$@" >"$T/$out.log" 2>&1 || { cat "$T/$out.log"; fail "sft $out"; }
}
same_losses() { [ "$(losses "$T/$1")" = "$(losses "$T/$2")" ] && [ -n "$(losses "$T/$1")" ] || fail "$2 trained unlike $1"; }
rows() {  # rows LINE: 12 rows, @ in LINE replaced by the row's number
  for i in 1 2 3 4 5 6 7 8 9 10 11 12; do printf '%s\n' "$1" | sed "s/@/$i/g"; done
}

echo "== JSON array, gzip JSONL and gzip JSON array train as the JSONL"
rows '{"messages": [{"role": "user", "content": "hi @"}, {"role": "assistant", "content": "yo @"}]}' >"$T/msgs.jsonl"
{ echo "["; sed '$!s/$/,/' "$T/msgs.jsonl"; echo "]"; } >"$T/msgs.json"
gzip -c "$T/msgs.jsonl" >"$T/msgs.jsonl.gz"
gzip -c "$T/msgs.json" >"$T/msgs.json.gz"
sft msgs dataset_path="$T/msgs.jsonl"
for f in msgs.json msgs.jsonl.gz msgs.json.gz; do
  sft "$f.out" dataset_path="$T/$f"
  same_losses msgs "$f.out"
done

echo "== ShareGPT rows train as messages rows"
rows '{"conversations": [{"from": "human", "value": "hi @"}, {"from": "gpt", "value": "yo @"}]}' >"$T/sg.jsonl"
sft sg dataset_path="$T/sg.jsonl"
same_losses msgs sg

echo "== Alpaca rows train as conversational prompt/completion rows"
rows '{"instruction": "say @", "input": "now", "output": "ok @"}' >"$T/alpaca.jsonl"
rows '{"prompt": [{"role": "user", "content": "say @\nnow"}], "completion": [{"role": "assistant", "content": "ok @"}]}' >"$T/pc.jsonl"
sft alpaca dataset_path="$T/alpaca.jsonl"
sft pc dataset_path="$T/pc.jsonl"
same_losses pc alpaca

echo "== formats ctune does not read say how to convert them"
printf 'PAR1\025\004' >"$T/x.parquet"
expect 1 "x.parquet: this is a Parquet file.*load_dataset('parquet', data_files='$T/x.parquet')\['train'\].to_json('$T/x.jsonl')" \
  "$BIN/sft" "$T/tiny.yml" output_dir="$T/e" dataset_path="$T/x.parquet"
mkdir "$T/hfds" && echo '{}' >"$T/hfds/dataset_info.json"
expect 1 "Hugging Face datasets directory.*load_from_disk('$T/hfds').to_json('$T/hfds.jsonl')" \
  "$BIN/sft" "$T/tiny.yml" output_dir="$T/e" dataset_path="$T/hfds"

echo "== ids past the tokenizer: both sizes named"
echo '{"input_ids": [5, 300, 7]}' >"$T/ids.jsonl"
expect 1 "ids.jsonl:1: key 'input_ids'\[1\]: token id 300 is not below the tokenizer's [0-9]* tokens (the model's vocab_size is 512; ids are checked against the tokenizer)" \
  "$BIN/sft" "$T/tiny.yml" output_dir="$T/e" dataset_path="$T/ids.jsonl" model.vocab_size=512

echo "== a role the chat template drops is an error, not an empty row"
printf "{%% for m in messages %%}{%% if m.role == 'user' %%}U: {{ m.content }}\n{%% elif m.role == 'assistant' %%}A: {{ m.content }}\n{%% endif %%}{%% endfor %%}" >"$T/ua.jinja"
rows '{"messages": [{"role": "user", "content": "hi @"}, {"role": "tool", "content": "42"}, {"role": "assistant", "content": "yo @"}]}' >"$T/tool.jsonl"
expect 1 "tool.jsonl:1: key 'messages'\[1\]: the chat template renders nothing of this message (role 'tool')" \
  "$BIN/sft" "$T/tiny.yml" output_dir="$T/e" dataset_path="$T/tool.jsonl" chat_template_path="$T/ua.jinja"

echo "== DPO rows without a prompt train as their explicit form (TRL's implicit prompt)"
rows '{"chosen": "Q@: the answer is yes", "rejected": "Q@: the answer is no"}' >"$T/imp.jsonl"
rows '{"prompt": "Q@: the answer is", "chosen": " yes", "rejected": " no"}' >"$T/exp.jsonl"
rows '{"chosen": [{"role": "user", "content": "Q@"}, {"role": "assistant", "content": "yes"}], "rejected": [{"role": "user", "content": "Q@"}, {"role": "assistant", "content": "no"}]}' >"$T/impc.jsonl"
rows '{"prompt": [{"role": "user", "content": "Q@"}], "chosen": [{"role": "assistant", "content": "yes"}], "rejected": [{"role": "assistant", "content": "no"}]}' >"$T/expc.jsonl"
for d in imp exp impc expc; do
  "$BIN/dpo" configs/dpo.yml model_path="$T/msgs" dataset_path="$T/$d.jsonl" output_dir="$T/dpo_$d" max_steps=2 \
    max_length=64 per_device_train_batch_size=4 logging_steps=1 save_steps=0 >"$T/dpo_$d.log" 2>&1 \
    || { cat "$T/dpo_$d.log"; fail "dpo on $d.jsonl"; }
done
same_losses dpo_exp dpo_imp
same_losses dpo_expc dpo_impc
first=$(losses "$T/dpo_imp" | head -1)
awk -v l="$first" 'BEGIN { d = l - log(2); exit !(d < 1e-6 && d > -1e-6) }' || fail "first DPO loss $first is not log 2"

echo "== GRPO: Alpaca prompts, the output as the answer (answer_field=output)"
rows '{"instruction": "say @", "output": "yo @"}' >"$T/gal.jsonl"
rows '{"prompt": [{"role": "user", "content": "say @"}], "output": "yo @"}' >"$T/gpc.jsonl"
for d in gal gpc; do
  "$BIN/grpo" configs/grpo.yml model_path="$T/msgs" dataset_path="$T/$d.jsonl" output_dir="$T/grpo_$d" \
    answer_field=output per_device_train_batch_size=4 num_generations=4 max_completion_length=4 max_steps=2 \
    logging_steps=1 save_steps=0 >"$T/grpo_$d.log" 2>&1 || { cat "$T/grpo_$d.log"; fail "grpo on $d.jsonl"; }
done
same_losses grpo_gpc grpo_gal
echo "data formats: ok"
