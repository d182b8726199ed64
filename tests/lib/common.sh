# Shared by the end-to-end test scripts (sourced, not run).
set -eu
BIN=${CT_BIN:-bin}
# Every binary restarts itself once as it does where Debian's OpenBLAS picks a generic kernel
# (recent Xeons), so that the tests run that path on every CPU (the restart once dropped
# `bin/reward eval`'s and `bin/distill precompute`'s sub-command on those Xeons only).
export CT_BLAS_FORCE_RESTART=1
# ... onto the kernel ctune picks, whatever the caller's shell sets: a session's shell here set
# OPENBLAS_CORETYPE=Haswell on a Zen that runs SKYLAKEX, whose sgemm bits then moved with a
# batch's row count, and kto_e2e and tools_e2e compare two such runs' losses and rollouts
# exactly (the tests that check the override set it themselves)
unset OPENBLAS_CORETYPE
server=""  # a background server's pid, stopped at exit

# start_test NAME: a fresh temporary directory $T, removed (and $server stopped) at exit.
start_test() {
  T=$(mktemp -d "/tmp/ct_$1.XXXXXX")
  trap '[ -z "$server" ] || kill $server 2>/dev/null || true; [ -n "${CT_KEEP_TMP:-}" ] || rm -rf "$T"' EXIT
}

# fail MESSAGE: print and exit 1.
fail() { echo "FAIL: $*" >&2; exit 1; }

# expect CODE PATTERN PROGRAM ARGS...: PROGRAM must exit with CODE and print PATTERN
# (a one-line error that names what is wrong). Uses $T for its log.
expect() {
  code=$1 pat=$2
  shift 2
  rc=0
  "$@" >"$T/expect.log" 2>&1 || rc=$?
  [ "$rc" = "$code" ] || { cat "$T/expect.log"; fail "exit $rc (expected $code) for: $*"; }
  grep -q -- "$pat" "$T/expect.log" || { cat "$T/expect.log"; fail "message lacks '$pat' for: $*"; }
}

# field KEY: the number KEY holds in each JSON line on stdin (metrics.jsonl rows).
field() { sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p"; }

# tiny_sft [YAML LINES...]: the reverse task's data ($T/train.jsonl, $T/eval.jsonl) and
# $T/tiny.yml, a 2-layer model from scratch on it, with the given lines appended.
tiny_sft() {
  "$BIN/ctune-demo-data" reverse "$T/train.jsonl" "$T/eval.jsonl" 3000 100 7 6 >/dev/null
  cat > "$T/tiny.yml" <<YML
base_config: $(pwd)/configs/sft.yml
model:
  hidden_size: 128
  intermediate_size: 384
  num_hidden_layers: 2
  num_attention_heads: 4
  num_key_value_heads: 2
dataset_path: $T/train.jsonl
eval_dataset_path: $T/eval.jsonl
max_length: 24
per_device_train_batch_size: 16
learning_rate: 3e-3
lr_scheduler_type: cosine
warmup_steps: 5
YML
  for line in "$@"; do echo "$line" >> "$T/tiny.yml"; done
}

# micro_sft: $T/train.jsonl (400 rows of the reverse task) and $tiny, bin/sft's arguments
# for a 1-layer, 32-wide model on it (a step takes milliseconds).
micro_sft() {
  "$BIN/ctune-demo-data" reverse "$T/train.jsonl" "$T/eval.jsonl" 400 10 7 6 >/dev/null
  tiny="configs/sft.yml dataset_path=$T/train.jsonl model.hidden_size=32 model.intermediate_size=64
        model.num_hidden_layers=1 model.num_attention_heads=2 model.num_key_value_heads=1 max_length=24
        per_device_train_batch_size=8"
}

# mpi_test NAME: start_test after checking mpirun is installed; $MPIRUN runs mpirun the way
# these tests do (oversubscribed; as root when root); $T/train.jsonl is a small reverse task.
mpi_test() {
  command -v mpirun >/dev/null || { echo "mpirun missing (scripts/install-deps.sh installs openmpi-bin)"; exit 1; }
  start_test "$1"
  MPIRUN="mpirun --oversubscribe"
  if [ "$(id -u)" -eq 0 ]; then MPIRUN="$MPIRUN --allow-run-as-root"; fi
  "$BIN/ctune-demo-data" reverse "$T/train.jsonl" "$T/eval.jsonl" 400 50 3 6
}

# mpi_sft NAME RANKS KEY=VALUE...: bin/sft with $args on RANKS ranks into $T/NAME (log
# $T/NAME.log, printed if it fails).
mpi_sft() {
  name=$1 np=$2
  shift 2
  # shellcheck disable=SC2086
  $MPIRUN -np "$np" "$BIN/sft" $args output_dir="$T/$name" "$@" >"$T/$name.log" 2>&1 ||
    { cat "$T/$name.log"; fail "$name ($np ranks)"; }
}

# stop_and_resume DIR PROGRAM ARGS...: PROGRAM ARGS output_dir=DIR stopped after step 4
# (CT_STOP_AFTER_STEP: exit 130), then resumed from its latest checkpoint.
stop_and_resume() {
  d=$1
  shift
  rc=0
  CT_STOP_AFTER_STEP=4 "$@" output_dir="$d" >"$d.stop.log" 2>&1 || rc=$?
  [ "$rc" = 130 ] || { cat "$d.stop.log"; fail "interrupted run exited $rc"; }
  "$@" output_dir="$d" resume_from_checkpoint=latest >"$d.resume.log" 2>&1 || { cat "$d.resume.log"; fail "resume of $d"; }
}

# losses FILE: "step loss" for each logged step of a metrics.jsonl.
losses() { grep '"loss"' "$1" | sed 's/.*"step":\([0-9]*\).*"loss":\([-0-9.e+]*\).*/\1 \2/'; }

# small_sft DATA OUT STEPS HIDDEN INTERMEDIATE: trains a 2-layer model from scratch on
# DATA (a reverse-task file from ctune-demo-data) into OUT; its log goes to OUT.log and
# is printed if training fails. Uses $BIN.
small_sft() {
  "$BIN/sft" configs/sft.yml dataset_path="$1" output_dir="$2" max_steps="$3" \
    model.hidden_size="$4" model.intermediate_size="$5" model.num_hidden_layers=2 \
    model.num_attention_heads=4 model.num_key_value_heads=2 max_length=24 \
    per_device_train_batch_size=32 learning_rate=2e-3 lr_scheduler_type=cosine warmup_steps=5 \
    save_steps=0 >"$2.log" 2>&1 || { cat "$2.log"; fail "training the model in $2"; }
}

# reverse_sft TRAIN EVAL N_EVAL SEED MAX_LEN OUT STEPS HIDDEN INTERMEDIATE: the reverse task
# from ctune-demo-data (3000 training rows in TRAIN, N_EVAL in EVAL, words of up to MAX_LEN
# letters drawn with SEED; its summary printed) and small_sft's model trained on TRAIN in OUT.
reverse_sft() {
  "$BIN/ctune-demo-data" reverse "$1" "$2" 3000 "$3" "$4" "$5"
  small_sft "$1" "$6" "$7" "$8" "$9"
}

# grpo_test NAME STEPS HIDDEN INTERMEDIATE: start_test NAME, then the GRPO tests' policy:
# STEPS of small_sft on the reverse task ($T/sft.jsonl; 200 prompts in $T/prompts.jsonl)
# in $T/sft. $G runs bin/grpo; $policy starts its arguments (the policy and its prompts).
grpo_test() {
  start_test "$1"
  reverse_sft "$T/sft.jsonl" "$T/prompts.jsonl" 200 31 6 "$T/sft" "$2" "$3" "$4"
  G="$BIN/grpo"
  policy="configs/grpo.yml model_path=$T/sft dataset_path=$T/prompts.jsonl answer_field=completion"
}

# learned DIR FACTOR RISE LOSS_FAILURE: DIR's metrics.jsonl shows learning: the mean loss of
# its last 5 logged steps is below FACTOR x that of its first 5 (else fail LOSS_FAILURE) and
# the held-out token accuracy rose by more than RISE from the first eval to the last. Prints
# both; sets $acc1 (the last eval's accuracy).
learned() {
  first=$(grep '"loss"' "$1/metrics.jsonl" | head -5 | field loss | awk '{s+=$1} END {print s/NR}')
  last=$(grep '"loss"' "$1/metrics.jsonl" | tail -5 | field loss | awk '{s+=$1} END {print s/NR}')
  acc0=$(grep eval_loss "$1/metrics.jsonl" | head -1 | field eval_mean_token_accuracy)
  acc1=$(grep eval_loss "$1/metrics.jsonl" | tail -1 | field eval_mean_token_accuracy)
  echo "loss $first -> $last, eval token accuracy $acc0 -> $acc1"
  awk -v a="$first" -v b="$last" -v f="$2" 'BEGIN { exit !(b < f * a) }' || fail "$4"
  awk -v a="$acc0" -v b="$acc1" -v r="$3" 'BEGIN { exit !(b > a + r) }' || fail "accuracy did not rise by $3"
}

# straight_and_stopped STEP: bin/sft $T/tiny.yml $common into $T/straight (log $T/a.log), and
# into $T/resumed stopped after STEP (CT_STOP_AFTER_STEP: exit 130; log $T/b.log).
straight_and_stopped() {
  # shellcheck disable=SC2086
  "$BIN/sft" "$T/tiny.yml" output_dir="$T/straight" $common >"$T/a.log" 2>&1 || { cat "$T/a.log"; fail "straight run"; }
  rc=0
  # shellcheck disable=SC2086
  CT_STOP_AFTER_STEP=$1 "$BIN/sft" "$T/tiny.yml" output_dir="$T/resumed" $common >"$T/b.log" 2>&1 || rc=$?
  [ "$rc" = 130 ] || { cat "$T/b.log"; fail "interrupted run exited $rc, expected 130"; }
}

# resume_stopped: the stopped run in $T/resumed resumed from its latest checkpoint (log $T/c.log).
resume_stopped() {
  # shellcheck disable=SC2086
  "$BIN/sft" "$T/tiny.yml" output_dir="$T/resumed" $common resume_from_checkpoint=latest >"$T/c.log" 2>&1 \
    || { cat "$T/c.log"; fail "resumed run"; }
}

# resumed_equals_straight LIST N WHAT: LIST (a function: FILE -> one line a logged step) gives
# N lines (WHAT names them) for $T/straight, the same for $T/resumed (in $T/l1, $T/l2), and
# the two final models are the same bytes.
resumed_equals_straight() {
  $1 "$T/straight/metrics.jsonl" >"$T/l1"
  $1 "$T/resumed/metrics.jsonl" >"$T/l2"
  [ "$(wc -l <"$T/l1")" = "$2" ] || fail "straight run logged $(wc -l <"$T/l1") $3, expected $2"
  diff "$T/l1" "$T/l2" || fail "per-step losses differ after resuming"
  cmp "$T/straight/model.safetensors" "$T/resumed/model.safetensors" || fail "final weights differ after resuming"
}

# merge_matches_adapter BASE ADAPTER EVAL: merges ADAPTER into BASE as $T/merged and fails
# unless the merged model's greedy completions of EVAL's first 8 rows equal base + adapter.
merge_matches_adapter() {
  "$BIN/ctune-ckpt" merge-lora base="$1" adapter="$2" out="$T/merged" >"$T/m.log" 2>&1 || { cat "$T/m.log"; fail "merge"; }
  head -8 "$3" >"$T/p.jsonl"
  "$BIN/sampler" generate model_path="$T/merged" prompts_path="$T/p.jsonl" temperature=0 output=json \
    max_new_tokens=8 2>/dev/null | sed 's/"logprobs":\[[^]]*\]//' >"$T/g1"
  "$BIN/sampler" generate model_path="$1" adapter_path="$2" prompts_path="$T/p.jsonl" temperature=0 \
    output=json max_new_tokens=8 2>/dev/null | sed 's/"logprobs":\[[^]]*\]//' >"$T/g2"
  [ -s "$T/g1" ] && cmp -s "$T/g1" "$T/g2" || { diff "$T/g1" "$T/g2"; fail "merged != base + adapter"; }
}
