#!/bin/sh
# bin/grpo with tool calls end to end, on ctune-demo-data's multiply-tool task with make
# demo's tool-use stage (a small model SFT'd on calculator demonstrations, 30% of them wrong
# guesses without the tool): GRPO with the accuracy reward, which only the calculator's
# result earns, raises the tool use and the reward; the built-in calculator's results come
# back through the chat template into the same slot, and the logged completions are token
# for token what the template renders of the conversation, with the tool results (and only
# they) masked from the loss; the bundled tool server gives the very same run; a slow
# server's calls run concurrently; a failing, flaky, malformed, slow or key-refusing
# server becomes the tool message's error text within bounded time and the run goes on;
# resume is bit-identical; two ranks run; the replay reproduces the steps from
# completions.jsonl; bad settings fail before any rollout.
. tests/lib/common.sh
start_test tools
command -v node >/dev/null || fail "node missing (scripts/install-deps.sh test installs nodejs)"

# The SFT of make demo's tool-use stage (configs/demo/sft-tools.yml: a 4-layer, 64-wide model,
# 800 steps, the byte tokenizer plus added tokens for the template's and the call's fixed text)
"$BIN/ctune-demo-data" multiply-tool "$T/demos.jsonl" "$T/prompts.jsonl" 6000 400 3 3 0.3 >/dev/null
"$BIN/sft" configs/demo/sft-tools.yml dataset_path="$T/demos.jsonl" output_dir="$T/sft" >"$T/sft.log" 2>&1 \
  || { cat "$T/sft.log"; fail "sft on the demonstrations"; }
! grep -q "truncated" "$T/sft.log" || fail "demonstrations were cut at max_length"
G="$BIN/grpo"
common="configs/grpo.yml model_path=$T/sft dataset_path=$T/prompts.jsonl reward_funcs=accuracy,length length_target=8
        answer_field=answer tool_call_format=hermes per_device_train_batch_size=16 num_generations=8
        max_completion_length=256 logging_steps=1 save_steps=0 learning_rate=1e-4 log_completions=true"
run() {  # run NAME KEY=VALUE...: bin/grpo $common into $T/NAME (log $T/NAME.log)
  n=$1; shift
  # shellcheck disable=SC2086
  "$G" $common output_dir="$T/$n" "$@" >"$T/$n.log" 2>&1 || { cat "$T/$n.log"; fail "grpo ($n)"; }
}
metric() { grep '"step"' "$T/$1/metrics.jsonl" | field "$2" | awk '{ s += $1; n++ } END { print s / n }'; }
# rollouts NAME: each completion's ids and tool mask, in order (what training saw)
rollouts() { sed 's/.*\("completion_ids":\[[^]]*\]\).*/\1/' "$T/$1/completions.jsonl"; grep -o '"tool_mask":\[[^]]*\]' "$T/$1/completions.jsonl" || true; }
# same_step1 NAME: NAME's step-1 rollouts are those of the built-in calculator's run (the
# latter's rows also carry the calculator's schema in "tools")
same_step1() {
  [ "$(grep '"step":1,' "$T/calc/completions.jsonl" | sed 's/"tools":.*"turns"/"turns"/')" = \
    "$(grep '"step":1,' "$T/$1/completions.jsonl" | sed 's/"tools":.*"turns"/"turns"/')" ]
}
server=""
start_server() {  # start_server MODE [ARGS...]: (re)starts ctune-tool-server; sets $url
  [ -z "$server" ] || kill "$server" 2>/dev/null || true
  : >"$T/port"
  m=$1; shift
  "$BIN/ctune-tool-server" port=0 mode="$m" "$@" >"$T/port" 2>>"$T/server.log" &
  server=$!
  i=0
  while [ ! -s "$T/port" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
  [ -s "$T/port" ] || fail "the tool server did not start"
  url="http://127.0.0.1:$(head -1 "$T/port")/call"
}

echo "== the built-in calculator: calls run, their results come back, masked from the loss"
run calc tools=calculator max_steps=3
calls=$(metric calc 'tools\/call_frequency')
echo "tool calls per completion $calls, failed calls per call $(metric calc 'tools\/failure_frequency'), turns $(metric calc 'turns\/mean')"
awk -v c="$calls" 'BEGIN { exit !(c > 0.2) }' || fail "the SFT'd model calls the calculator in $calls of its completions"
for k in tools/call_frequency tools/failure_frequency turns/mean; do
  grep -q "\"$k\"" "$T/calc/metrics.jsonl" || fail "metrics lack $k"
done
grep -q '"role":"tool","name":"calculator","content":"[0-9]*"' "$T/calc/completions.jsonl" || fail "no calculator result in the logged turns"
node tests/fixtures/tools/check-mask.mjs conversations "$T/calc/completions.jsonl" "$T/conv.jsonl"
"$BIN/ctune-tokenize" chat tokenize=true tokenizer_path="$T/sft" <"$T/conv.jsonl" >"$T/conv.tok.jsonl" || fail "tokenizing the conversations"
node tests/fixtures/tools/check-mask.mjs compare "$T/calc/completions.jsonl" "$T/conv.tok.jsonl" \
  || fail "the rollouts are not what the chat template renders of their conversations"
node tests/fixtures/tools/check-mask.mjs step1-loss "$T/calc/completions.jsonl" "$T/calc/metrics.jsonl" \
  || fail "the step-1 loss is not over the model's own tokens"

echo "== GRPO with the accuracy reward, which only the calculator's result earns, raises the tool use"
# make demo's stage (configs/demo/grpo-tools.yml: 40 steps of 16 prompts x 8, lr 2e-4). Over
# six SFT seeds the model learned to copy by step 600; over GRPO seeds 2-5 on the slowest of
# them, the calls rose by 0.13-0.14 and the reward by 0.10-0.15 from steps 1-10 to 31-40
"$G" configs/demo/grpo-tools.yml model_path="$T/sft" dataset_path="$T/prompts.jsonl" output_dir="$T/learn" \
  >"$T/learn.log" 2>&1 || { cat "$T/learn.log"; fail "grpo (learn)"; }
# mean KEY FIRST|LAST: the mean of KEY over the first or the last 10 steps
mean() { grep '"step"' "$T/learn/metrics.jsonl" | { if [ "$2" = first ]; then head -10; else tail -10; fi; } |
         field "$1" | awk '{ s += $1 } END { printf "%.3f", s / NR }'; }
c0=$(mean 'tools\/call_frequency' first) c1=$(mean 'tools\/call_frequency' last)
r0=$(mean reward first) r1=$(mean reward last)
echo "steps 1-10 -> 31-40: tool calls per completion $c0 -> $c1, reward (accuracy) $r0 -> $r1"
awk -v a="$c0" -v b="$c1" 'BEGIN { exit !(b > a + 0.05) }' || fail "the tool use did not rise"
awk -v a="$r0" -v b="$r1" 'BEGIN { exit !(a > 0.2 && b > a + 0.03) }' || fail "the reward did not rise (or the model never scores)"

echo "== the tool server (tool_url) gives the very same run"
start_server ok
run remote tool_url="$url" max_steps=3
[ "$(rollouts calc)" = "$(rollouts remote)" ] || fail "the tool server's rollouts differ from the built-in calculator's"
cmp "$T/calc/model.safetensors" "$T/remote/model.safetensors" || fail "the tool server's run trained another model"

echo "== a slow server: the step's calls run concurrently, and the rollouts do not change"
start_server slow delay_ms=400
run slow tool_url="$url" max_steps=1
n=$(grep '"step":1,' "$T/slow/completions.jsonl" | sed -n 's/.*"tool_calls":\([0-9]*\).*/\1/p' | awk '{ s += $1 } END { print s }')
gen=$(grep '"step":1,' "$T/slow/metrics.jsonl" | field 'time\/generation_s')
echo "$n calls of 0.4 s each took $gen s of generation"
awk -v n="$n" -v g="$gen" 'BEGIN { exit !(n >= 4 && g < 0.5 * 0.4 * n) }' || fail "the calls did not overlap"
same_step1 slow || fail "a slow server changed the rollouts"

echo "== failures become the tool message's error text; the run goes on"
start_server 500
run s500 tool_url="$url" max_steps=1 tool_retries=1 tool_backoff=0.01
[ "$(metric s500 'tools\/failure_frequency')" = 1 ] || fail "calls to a failing server did not all fail"
grep -q '"content":"{\\"error\\":\\"tool server: HTTP 500 after 2 attempts' "$T/s500/completions.jsonl" \
  || fail "no 'HTTP 500 after 2 attempts' error in the tool messages"
start_server flaky
run flaky tool_url="$url" max_steps=3 tool_retries=2 tool_backoff=0.01
cmp "$T/calc/model.safetensors" "$T/flaky/model.safetensors" || fail "retries did not mend a flaky server"
start_server badjson
run badjson tool_url="$url" max_steps=1 tool_retries=0
grep -q 'tool server: malformed reply after 1 attempt' "$T/badjson/completions.jsonl" || fail "no 'malformed reply' error"
start_server slow delay_ms=20000
t0=$(date +%s)
run timeout tool_url="$url" max_steps=1 tool_retries=0 tool_timeout=0.3
[ $(( $(date +%s) - t0 )) -lt 15 ] || fail "a 20-second call was not cut at tool_timeout"
grep -q 'tool server: timeout after 1 attempt' "$T/timeout/completions.jsonl" || fail "no 'timeout' error"
export CT_TOOL_KEY="ct-tool-key-$$-51e0"
start_server ok api_key_env=CT_TOOL_KEY
run nokey tool_url="$url" max_steps=1 tool_retries=0 max_completion_length=384
grep -q 'HTTP 401 after 1 attempt: no API key was sent (set tool_api_key_env)' "$T/nokey/completions.jsonl" || fail "no 401 error"
run key tool_url="$url" max_steps=1 tool_api_key_env=CT_TOOL_KEY
same_step1 key || fail "the key was not accepted"
if grep -l "$CT_TOOL_KEY" "$T"/*.log "$T"/key/* 2>/dev/null; then fail "the key leaked"; fi

echo "== max_tool_calling_iterations 0: calls are read but never run"
run noiter tools=calculator max_steps=1 max_tool_calling_iterations=0
[ "$(metric noiter 'tools\/call_frequency')" = 0 ] && ! grep -q '"tool_mask"' "$T/noiter/completions.jsonl" \
  || fail "max_tool_calling_iterations=0 ran a call"

echo "== resume is bit-identical"
run straight tools=calculator max_steps=6
# shellcheck disable=SC2086
stop_and_resume "$T/resumed" "$G" $common tools=calculator max_steps=6 save_steps=2
cmp "$T/straight/model.safetensors" "$T/resumed/model.safetensors" || fail "the resumed run differs"
cmp "$T/straight/completions.jsonl" "$T/resumed/completions.jsonl" || fail "the resumed run's rollouts differ"

echo "== the replay reproduces the steps from completions.jsonl (tool results masked)"
# shellcheck disable=SC2086
"$BIN/ctune-grpo-replay" $common max_steps=3 dataset_path="$T/calc/completions.jsonl" output_dir="$T/replay" \
  >"$T/replay.log" 2>&1 || { cat "$T/replay.log"; fail "replay"; }
cmp "$T/calc/model.safetensors" "$T/replay/model.safetensors" || fail "the replayed model differs"

echo "== two ranks"
if command -v mpirun >/dev/null; then
  MPIRUN="mpirun --oversubscribe"
  [ "$(id -u)" -ne 0 ] || MPIRUN="$MPIRUN --allow-run-as-root"
  # shellcheck disable=SC2086
  $MPIRUN -np 2 "$G" $common tools=calculator tool_url="$url" tool_api_key_env=CT_TOOL_KEY max_steps=2 \
    per_device_train_batch_size=8 output_dir="$T/mpi" >"$T/mpi.log" 2>&1 || { cat "$T/mpi.log"; fail "2 ranks"; }
  awk -v c="$(metric mpi 'tools\/call_frequency')" 'BEGIN { exit !(c > 0) }' || fail "no tool calls on 2 ranks"
  [ "$(grep -c '"step":1,' "$T/mpi/completions.jsonl")" = 16 ] || fail "2 ranks did not log 16 completions"
else
  fail "mpirun missing (scripts/install-deps.sh installs openmpi-bin)"
fi

echo "== bad settings fail before any rollout"
expect 2 "key 'tools': 'abacus' is no built-in tool" "$G" $common tools=abacus output_dir="$T/x"
expect 2 "key 'tool_url': \"ftp://x\" is not an http:// or https:// URL" "$G" $common tool_url=ftp://x output_dir="$T/x"
expect 0 "tool_call_format: the chat template shows no tool-call format; reading hermes" "$G" $common tools=calculator \
  tool_call_format=auto output_dir="$T/x" max_steps=1
expect 2 "key 'max_tool_calling_iterations': configures tool calls" "$G" $common max_tool_calling_iterations=2 output_dir="$T/x"
expect 2 "environment variable CT_NO_SUCH_KEY is unset" "$G" $common tool_url="$url" tool_api_key_env=CT_NO_SUCH_KEY output_dir="$T/x"
echo "tools end-to-end: all checks passed"
