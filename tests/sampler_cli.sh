#!/bin/sh
# bin/sampler end to end on a small trained model: streaming, JSON output in input order,
# score agreeing with generate's log-probs, int8 save/load, and clear errors.
. tests/lib/common.sh
start_test sampler

reverse_sft "$T/train.jsonl" "$T/eval.jsonl" 50 11 5 "$T/m" 150 128 384
S="$BIN/sampler"

echo "== generate: one prompt streams its completion"
out=$("$S" generate model_path="$T/m" prompt="reverse abcde:" temperature=0 max_new_tokens=12)
echo "got: '$out'"
[ -n "$out" ] || fail "empty completion"

echo "== chat_template_path replaces the model's template"
# a template that renders the user's words alone: the messages prompt is the text prompt
printf '%s' '{{ messages[0].content }}' >"$T/bare.jinja"
echo '{"messages": [{"role": "user", "content": "reverse abcde:"}]}' >"$T/bare.jsonl"
"$S" generate model_path="$T/m" prompts_path="$T/bare.jsonl" chat_template_path="$T/bare.jinja" temperature=0 \
  max_new_tokens=12 output=json >"$T/bare.out" || fail "generate with chat_template_path"
"$S" generate model_path="$T/m" prompt="reverse abcde:" temperature=0 max_new_tokens=12 output=json >"$T/plain.out"
[ "$(sed 's/.*"completion"/"completion"/' "$T/bare.out")" = "$(sed 's/.*"completion"/"completion"/' "$T/plain.out")" ] \
  || { cat "$T/bare.out" "$T/plain.out"; fail "the template was not used"; }
expect 1 "chat_template_path" "$S" generate model_path="$T/m" prompt=x chat_template_path="$T/none.jinja"

echo "== generate: JSONL prompts (text, messages, ids), n=2, output=json, in input order"
ids=$(printf 'reverse xyz:' | od -An -tu1 | tr -s ' \n' ',' | sed 's/^,//; s/,$//')
{
  echo '{"prompt": "reverse hello:"}'
  echo '{"messages": [{"role": "user", "content": "reverse abc:"}]}'
  echo "{\"prompt_input_ids\": [$ids]}"
} >"$T/prompts.jsonl"
"$S" generate model_path="$T/m" prompts_path="$T/prompts.jsonl" n=2 output=json temperature=0.8 \
  max_new_tokens=8 decode_slots=3 seed=5 >"$T/gen.jsonl" || fail "generate json"
[ "$(wc -l <"$T/gen.jsonl")" = 6 ] || { cat "$T/gen.jsonl"; fail "expected 6 lines"; }
[ "$(sed 's/.*"row":\([0-9]*\),"sample":\([0-9]*\).*/\1.\2/' "$T/gen.jsonl" | tr '\n' ' ')" = "0.0 0.1 1.0 1.1 2.0 2.1 " ] \
  || { cat "$T/gen.jsonl"; fail "rows not in input order"; }
for k in completion completion_ids logprobs finish_reason; do
  grep -q "\"$k\"" "$T/gen.jsonl" || fail "json lacks $k"
done
# the same seed gives the same lines whatever the number of slots
"$S" generate model_path="$T/m" prompts_path="$T/prompts.jsonl" n=2 output=json temperature=0.8 \
  max_new_tokens=8 decode_slots=1 seed=5 >"$T/gen1.jsonl" || fail "generate json, 1 slot"
cmp "$T/gen.jsonl" "$T/gen1.jsonl" || fail "output depends on the number of decode slots"

echo "== score agrees with generate's log-probs"
"$S" generate model_path="$T/m" prompt="reverse world:" temperature=0 max_new_tokens=10 output=json >"$T/g.jsonl"
comp=$(sed 's/.*"completion":"\([^"]*\)".*/\1/' "$T/g.jsonl")
want=$(sed 's/.*"logprobs":\[\([^]]*\)\].*/\1/' "$T/g.jsonl" | tr ',' '\n' | awk '{s+=$1} END {printf "%.6f", s}')
ncomp=$(sed 's/.*"completion_ids":\[\([^]]*\)\].*/\1/' "$T/g.jsonl" | tr ',' '\n' | wc -l)
# score the same tokens: the completion ids (with the stop token, when there is one)
cids=$(sed 's/.*"completion_ids":\[\([^]]*\)\].*/\1/' "$T/g.jsonl")
pids=$(printf 'reverse world:' | od -An -tu1 | tr -s ' \n' ',' | sed 's/^,//; s/,$//')
echo "{\"prompt_input_ids\": [$pids], \"completion_input_ids\": [$cids]}" >"$T/score.jsonl"
"$S" score model_path="$T/m" data="$T/score.jsonl" >"$T/s.jsonl" || fail "score"
got=$(sed 's/.*"logp":\([-0-9.e+]*\).*/\1/' "$T/s.jsonl" | awk '{printf "%.6f", $1}')
echo "completion '$comp' ($ncomp tokens): generate sum $want, score $got"
awk -v a="$want" -v b="$got" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-3) }' || fail "score differs from generate"

echo "== score at a temperature agrees with generate's log-probs at that temperature"
"$S" generate model_path="$T/m" prompt="reverse world:" temperature=0.7 seed=3 max_new_tokens=10 output=json >"$T/g7.jsonl"
want7=$(sed 's/.*"logprobs":\[\([^]]*\)\].*/\1/' "$T/g7.jsonl" | tr ',' '\n' | awk '{s+=$1} END {printf "%.6f", s}')
cids7=$(sed 's/.*"completion_ids":\[\([^]]*\)\].*/\1/' "$T/g7.jsonl")
echo "{\"prompt_input_ids\": [$pids], \"completion_input_ids\": [$cids7]}" >"$T/score7.jsonl"
got7=$("$S" score model_path="$T/m" data="$T/score7.jsonl" temperature=0.7 | sed 's/.*"logp":\([-0-9.e+]*\).*/\1/' | awk '{printf "%.6f", $1}')
got1=$("$S" score model_path="$T/m" data="$T/score7.jsonl" | sed 's/.*"logp":\([-0-9.e+]*\).*/\1/' | awk '{printf "%.6f", $1}')
echo "at 0.7: generate sum $want7, score $got7 (at 1: $got1)"
awk -v a="$want7" -v b="$got7" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-3) }' || fail "score at 0.7 differs from generate"

echo "== accuracy applies stop strings: stopping at any letter leaves no answer whole"
# the expected answer is the model's own greedy completion (above), so it matches without stops
printf '{"prompt": "reverse world:", "completion": "%s"}\n' "$comp" >"$T/acc.jsonl"
stops=$(printf '%s' "$comp" | fold -w1 | sort -u | tr '\n' ',' | sed 's/,$//')
a0=$("$S" accuracy model_path="$T/m" data="$T/acc.jsonl" temperature=0 | sed 's/.*"exact_match": *\([0-9.]*\).*/\1/')
a1=$("$S" accuracy model_path="$T/m" data="$T/acc.jsonl" temperature=0 "stop=[$stops]" | sed 's/.*"exact_match": *\([0-9.]*\).*/\1/')
echo "exact match $a0 without stop strings, $a1 with stop=[$stops]"
[ "$a0" = "1.0000" ] && [ "$a1" = "0.0000" ] || fail "accuracy ignores stop strings ($a0, $a1)"

echo "== int8: convert, save, load pre-quantized, same output"
"$S" generate model_path="$T/m" prompt="reverse abcde:" temperature=0 max_new_tokens=12 quantization=int8 \
  save_quantized="$T/q8" output=json >"$T/q1.jsonl" 2>"$T/q.log" || { cat "$T/q.log"; fail "int8 generate"; }
grep -q '"quant_method": "ctune-int8"' "$T/q8/config.json" || fail "no quantization_config"
"$S" generate model_path="$T/q8" prompt="reverse abcde:" temperature=0 max_new_tokens=12 output=json >"$T/q2.jsonl" \
  || fail "loading the int8 model"
cmp "$T/q1.jsonl" "$T/q2.jsonl" || fail "the saved int8 model generates differently"

echo "== bf16: the trained task still decodes right, and save_quantized is int8-only"
"$S" accuracy model_path="$T/m" data="$T/acc.jsonl" temperature=0 quantization=bf16 >"$T/b.json" 2>"$T/b.log" \
  || { cat "$T/b.log"; fail "bf16 accuracy"; }
grep -q '"exact_match": *1.0000' "$T/b.json" || fail "bf16 decoding loses the greedy answer: $(cat "$T/b.json")"
expect 2 "needs quantization=int8" "$S" generate model_path="$T/m" prompt=x quantization=bf16 save_quantized="$T/qb"

echo "== bad input"
expect 1 "more than max_prefill_length 5" "$S" generate model_path="$T/m" prompt="reverse abcde:" max_prefill_length=5
"$S" generate model_path="$T/m" prompt="reverse abcde:" max_prefill_length=5 truncate_prompt=left \
  max_new_tokens=3 >/dev/null || fail "truncate_prompt=left"
expect 1 "leaves no room" "$S" generate model_path="$T/m" prompt="reverse abcde:" max_target_length=10
expect 1 "no-such" "$S" generate model_path="$T/no-such" prompt=x
expect 2 "unknown key 'temprature'" "$S" generate model_path="$T/m" prompt=x temprature=1
expect 2 "key 'top_p'" "$S" generate model_path="$T/m" prompt=x top_p=0
printf '{"prompt": "a"}\n{"nothing": 1}\n' >"$T/badp.jsonl"
expect 1 "badp.jsonl:2" "$S" generate model_path="$T/m" prompts_path="$T/badp.jsonl"
expect 2 "usage" "$S" nonsense
echo "sampler cli: all checks passed"
