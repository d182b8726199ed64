#!/bin/sh
# bin/grpo with a multi-turn environment end to end, against ctune-env-server's guessing
# game (a small model SFT'd on ctune-demo-data guess-env's games): every sample is an
# episode whose prompt is the environment's first observation; each model turn is an
# action and each observation comes back as the next user message, masked from the loss,
# token for token as the chat template renders the conversation; the episode's reward is
# reward_funcs env; max_turns caps the actions; a slow server's steps run concurrently; a
# failing step ends its episode unscored, a failing reset stops the run with a clear
# error; resume is bit-identical (also after Ctrl-C while episodes wait on the server), the
# replay reproduces the steps, two ranks run; bad
# settings fail before any rollout.
. tests/lib/common.sh
start_test env
command -v node >/dev/null || fail "node missing (scripts/install-deps.sh test installs nodejs)"

"$BIN/ctune-demo-data" guess-env "$T/games.jsonl" "$T/rows.jsonl" 2000 64 5 >/dev/null
"$BIN/sft" configs/sft.yml dataset_path="$T/games.jsonl" output_dir="$T/sft" max_steps=120 \
  model.hidden_size=96 model.intermediate_size=256 model.num_hidden_layers=2 model.num_attention_heads=4 \
  model.num_key_value_heads=2 max_length=192 per_device_train_batch_size=32 learning_rate=3e-3 \
  lr_scheduler_type=cosine warmup_steps=10 save_steps=0 assistant_only_loss=true >"$T/sft.log" 2>&1 \
  || { cat "$T/sft.log"; fail "sft on the games"; }
G="$BIN/grpo"
common="configs/grpo.yml model_path=$T/sft dataset_path=$T/rows.jsonl reward_funcs=env,length length_target=2
        per_device_train_batch_size=16 num_generations=8 max_completion_length=160 max_prompt_length=64
        logging_steps=1 save_steps=0 learning_rate=1e-4 log_completions=true"
run() {  # run NAME KEY=VALUE...: bin/grpo $common into $T/NAME (log $T/NAME.log)
  n=$1; shift
  # shellcheck disable=SC2086
  "$G" $common output_dir="$T/$n" "$@" >"$T/$n.log" 2>&1 || { cat "$T/$n.log"; fail "grpo ($n)"; }
}
metric() { grep '"step"' "$T/$1/metrics.jsonl" | field "$2" | awk '{ s += $1; n++ } END { print s / n }'; }
server=""
start_server() {  # start_server MODE [ARGS...]: (re)starts ctune-env-server; sets $url
  [ -z "$server" ] || kill "$server" 2>/dev/null || true
  : >"$T/port"
  m=$1; shift
  "$BIN/ctune-env-server" port=0 mode="$m" "$@" >"$T/port" 2>>"$T/server.log" &
  server=$!
  i=0
  while [ ! -s "$T/port" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
  [ -s "$T/port" ] || fail "the environment server did not start"
  url="http://127.0.0.1:$(head -1 "$T/port")"
}

echo "== episodes: observations come back as user messages, masked from the loss"
start_server ok
run ok env_url="$url" max_steps=3
steps=$(metric ok 'env\/steps_mean')
echo "actions per episode $steps, env reward $(metric ok 'rewards\/env\/mean'), turns $(metric ok 'turns\/mean')"
awk -v s="$steps" 'BEGIN { exit !(s > 1.5) }' || fail "episodes took $steps actions: no multi-turn play"
grep -q '"prompt":\[{"role":"user","content":"Guess my number from 1 to 100."}\]' "$T/ok/completions.jsonl" \
  || fail "the first observation is not the prompt"
grep -q '{"role":"user","content":"\(Higher\|Lower\)."}' "$T/ok/completions.jsonl" || fail "no observation in the turns"
node tests/fixtures/tools/check-mask.mjs conversations "$T/ok/completions.jsonl" "$T/conv.jsonl"
"$BIN/ctune-tokenize" chat tokenize=true <"$T/conv.jsonl" >"$T/conv.tok.jsonl" || fail "tokenizing the conversations"
node tests/fixtures/tools/check-mask.mjs compare "$T/ok/completions.jsonl" "$T/conv.tok.jsonl" \
  || fail "the episodes are not what the chat template renders of their conversations"
node tests/fixtures/tools/check-mask.mjs step1-loss "$T/ok/completions.jsonl" "$T/ok/metrics.jsonl" \
  || fail "the step-1 loss is not over the model's own tokens"
# the env reward of each episode is 1 when it ended on "Correct!" (its last action the target)
n=$(grep -c '"step":1,' "$T/ok/completions.jsonl")
won=$(grep '"step":1,' "$T/ok/completions.jsonl" | grep -c '"env":1.0')
echo "$won of $n step-1 episodes won"

echo "== max_turns caps the actions"
run capped env_url="$url" max_steps=1 max_turns=2
awk -v s="$(metric capped 'env\/steps_mean')" 'BEGIN { exit !(s <= 2 && s >= 1) }' || fail "max_turns 2 did not cap the actions"

echo "== a slow server: the episodes' steps run concurrently"
start_server slow delay_ms=300
run slow env_url="$url" max_steps=1
n=$(grep '"step":1,' "$T/slow/completions.jsonl" | sed -n 's/.*"env_steps":\([0-9]*\).*/\1/p' | awk '{ s += $1 } END { print s }')
gen=$(field 'time\/generation_s' <"$T/slow/metrics.jsonl")
echo "$n steps of 0.3 s each took $gen s of generation"
awk -v n="$n" -v g="$gen" 'BEGIN { exit !(n >= 16 && g < 0.4 * 0.3 * n) }' || fail "the steps did not overlap"
[ "$(grep '"step":1,' "$T/ok/completions.jsonl")" = "$(cat "$T/slow/completions.jsonl")" ] || fail "a slow server changed the episodes"

echo "== a failing step ends its episode unscored; a failing reset stops the run"
start_server 500
run s500 env_url="$url" max_steps=1 env_retries=1 env_backoff=0.01
[ "$(metric s500 'env\/failed_episodes')" = 1 ] || fail "episodes survived a failing server"
grep -q '"role":"environment","error":"environment server http://127.0.0.1:[0-9]*/step: HTTP 500 after 2 attempts' \
  "$T/s500/completions.jsonl" || fail "no 'HTTP 500 after 2 attempts' in the turns"
grep -q '"env":null' "$T/s500/completions.jsonl" || fail "a failed episode has an env reward"
start_server nodone
run nodone env_url="$url" max_steps=1 env_retries=0
grep -q 'malformed reply after 1 attempt: no \\"done\\"' "$T/nodone/completions.jsonl" || fail "no 'no \"done\"' error"
start_server reset500
expect 1 "rows.jsonl:1: episode train-1-0-[0-9]*-0: environment server $url/reset: HTTP 500 after 1 attempt" \
  "$G" $common output_dir="$T/x" env_url="$url" max_steps=1 env_retries=0
[ ! -e "$T/x/model.safetensors" ] || fail "a failed run saved a model"

echo "== resume is bit-identical (also after Ctrl-C mid-episode); the replay reproduces the steps"
start_server ok
run straight env_url="$url" max_steps=6
# shellcheck disable=SC2086
stop_and_resume "$T/resumed" "$G" $common env_url="$url" max_steps=6 save_steps=2
cmp "$T/straight/model.safetensors" "$T/resumed/model.safetensors" || fail "the resumed run differs"
cmp "$T/straight/completions.jsonl" "$T/resumed/completions.jsonl" || fail "the resumed run's episodes differ"
# Ctrl-C while a step's episodes wait on a slow server: the run stops at once (nothing of the
# step saved), and its resume from the step before is the straight run
start_server slow delay_ms=300
# shellcheck disable=SC2086
CT_PROGRESS_SECONDS=0 "$G" $common env_url="$url" max_steps=6 save_steps=2 output_dir="$T/int" >"$T/int.log" 2>&1 &
pid=$!
i=0
until grep -q "^ctune: step 3/6: rollouts" "$T/int.log" 2>/dev/null; do
  i=$((i + 1)); [ $i -lt 1200 ] || { cat "$T/int.log"; fail "the run never reached step 3's rollouts"; }; sleep 0.05
done
kill -INT $pid
rc=0
wait $pid || rc=$?
[ $rc = 130 ] || { tail -5 "$T/int.log"; fail "Ctrl-C mid-episode exited $rc, not 130"; }
[ -d "$T/int/checkpoint-2" ] && [ ! -d "$T/int/checkpoint-4" ] || fail "the interrupted run's checkpoints are not step 2's"
start_server ok
# shellcheck disable=SC2086
"$G" $common env_url="$url" max_steps=6 save_steps=2 output_dir="$T/int" resume_from_checkpoint=latest \
  >"$T/int2.log" 2>&1 || { cat "$T/int2.log"; fail "resume after Ctrl-C"; }
cmp "$T/straight/model.safetensors" "$T/int/model.safetensors" || fail "the run resumed after Ctrl-C differs"
cmp "$T/straight/completions.jsonl" "$T/int/completions.jsonl" || fail "the episodes resumed after Ctrl-C differ"
# shellcheck disable=SC2086
"$BIN/ctune-grpo-replay" $common max_steps=3 dataset_path="$T/ok/completions.jsonl" output_dir="$T/replay" \
  >"$T/replay.log" 2>&1 || { cat "$T/replay.log"; fail "replay"; }
cmp "$T/ok/model.safetensors" "$T/replay/model.safetensors" || fail "the replayed model differs"

echo "== two ranks"
command -v mpirun >/dev/null || fail "mpirun missing (scripts/install-deps.sh installs openmpi-bin)"
MPIRUN="mpirun --oversubscribe"
[ "$(id -u)" -ne 0 ] || MPIRUN="$MPIRUN --allow-run-as-root"
# shellcheck disable=SC2086
$MPIRUN -np 2 "$G" $common env_url="$url" max_steps=2 per_device_train_batch_size=8 output_dir="$T/mpi" \
  >"$T/mpi.log" 2>&1 || { cat "$T/mpi.log"; fail "2 ranks"; }
[ "$(grep -c '"step":1,' "$T/mpi/completions.jsonl")" = 16 ] || fail "2 ranks did not log 16 episodes"
[ "$(grep '"step":1,' "$T/mpi/completions.jsonl" | sed 's/.*"env_steps":\([0-9]*\).*/\1/' | sort -u | wc -l)" -ge 1 ] || fail "no steps"

echo "== bad settings fail before any rollout"
expect 2 "key 'max_turns': configures an environment, and env_url is not set" "$G" $common max_turns=3 output_dir="$T/x"
expect 2 "key 'max_prompt_length': env_url needs a limit" "$G" $common env_url="$url" max_prompt_length=0 output_dir="$T/x"
expect 2 "key 'env_url': \"localhost\" is not an http:// or https:// URL" "$G" $common env_url=localhost output_dir="$T/x"
printf '{"prompt": "a text prompt", "target": 5}\n' >"$T/text.jsonl"
expect 1 "text.jsonl:1: key 'prompt': env_url needs a message list" "$G" $common env_url="$url" dataset_path="$T/text.jsonl" \
  output_dir="$T/x" per_device_train_batch_size=8
echo "environment end-to-end: all checks passed"
