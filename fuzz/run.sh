#!/bin/sh
# Runs the libFuzzer targets built by `make fuzz-build`: first replays every input in
# fuzz/regress/<target>/ (past crashers: each must now pass), then fuzzes each target
# with the given libFuzzer flags, two at a time (or FUZZ_JOBS), starting from its corpus
# in BUILD_DIR/fuzz/corpus/<target> and the seeds (fuzz/seeds/<target>/, plus the
# repository's own configs, templates and chat cases), with the dictionaries in fuzz/dict/. Prints runs and seconds per target;
# a crash, leak or timeout fails, leaving the input in BUILD_DIR/fuzz/crash/<target>/.
#
# usage: fuzz/run.sh BUILD_DIR [libFuzzer flags, e.g. -runs=1000000 or -max_total_time=10]
#        FUZZ_TARGETS="jinja chat" fuzz/run.sh ...   runs only those targets
#        FUZZ_TIMEOUT=300 fuzz/run.sh ...   seconds one input may take (default 30). libFuzzer
#        counts wall time: under `nice -n 19` on a busy machine a process can stall that long
#        (a 213-byte safetensors input that replays in 0.1 s timed out after 43 s, in free()).
set -u
cd "$(dirname "$0")/.." || exit 1
B=${1:-build-fuzz}
shift
F="$B/fuzz"
targets=${FUZZ_TARGETS:-$(cd fuzz && ls fuzz_*.c | sed 's/^fuzz_//; s/\.c$//')}
jobs=${FUZZ_JOBS:-2}
export CT_FUZZ_ROOT="$PWD"
# leaks are errors; a failed ASan/UBSan check aborts with a stack
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# seeds TARGET DIR: fills DIR with the target's seed inputs.
seeds() {
  rm -rf "$2" && mkdir -p "$2"
  [ -d "fuzz/seeds/$1" ] && cp fuzz/seeds/"$1"/* "$2"/ 2>/dev/null
  case $1 in
    config) for f in configs/*.yml configs/demo/*.yml; do [ -f "$f" ] && cp "$f" "$2/$(echo "$f" | tr / _)"; done ;;
    jinja) for f in tests/fixtures/tokenizer/templates/*.jinja templates/*.jinja; do
             [ -f "$f" ] && cp "$f" "$2/"; done ;;
    chat | data) [ -f tests/fixtures/tokenizer/chat-cases.jsonl ] &&
             split -l 1 -a 3 tests/fixtures/tokenizer/chat-cases.jsonl "$2/chat-case-" ;;
  esac
  return 0
}

failed=""
start=$(date +%s)
for t in $targets; do
  bin="$F/fuzz_$t"
  [ -x "$bin" ] || { echo "fuzz: $bin is not built (make fuzz-build)"; exit 1; }
  if [ -d "fuzz/regress/$t" ] && [ -n "$(ls "fuzz/regress/$t")" ]; then
    if "$bin" fuzz/regress/"$t"/* >"$F/regress-$t.log" 2>&1; then
      echo "fuzz_$t: $(ls "fuzz/regress/$t" | wc -l) regression inputs pass"
    else
      echo "FAIL fuzz_$t: a regression input in fuzz/regress/$t crashes"; tail -n 40 "$F/regress-$t.log"
      failed="$failed $t"
    fi
  fi
done

# run_one TARGET FLAGS...: fuzzes one target; writes its summary to $F/TARGET.result.
run_one() {
  t=$1
  shift
  mkdir -p "$F/corpus/$t" "$F/crash/$t"
  seeds "$t" "$F/seeds/$t"
  dict="$F/$t.dict"
  case $t in safetensors | topk | tokenizer | data | chat | hfconfig) cat fuzz/dict/json.dict ;; esac >"$dict"
  [ -f "fuzz/dict/$t.dict" ] && cat "fuzz/dict/$t.dict" >>"$dict"
  [ "$t" = config ] && sed -n 's/^[# ]*\([a-z_][a-z0-9_]*\):.*/"\1"/p' configs/base.yml | sort -u >>"$dict"
  t0=$(date +%s)
  # shellcheck disable=SC2086
  "$F/fuzz_$t" -dict="$dict" -timeout="${FUZZ_TIMEOUT:-30}" -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$F/crash/$t/" "$@" "$F/corpus/$t" "$F/seeds/$t" >"$F/$t.log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$F/$t.log" | tail -n 1)
  echo "$rc ${runs:-?} $(( $(date +%s) - t0 )) $(ls "$F/corpus/$t" | wc -l)" >"$F/$t.result"
}

n=0
for t in $targets; do
  run_one "$t" "$@" &
  n=$((n + 1))
  if [ "$n" -ge "$jobs" ]; then wait; n=0; fi
done
wait

for t in $targets; do
  read -r rc runs secs corpus <"$F/$t.result"
  if [ "$rc" = 0 ]; then
    echo "fuzz_$t: $runs runs in ${secs}s (corpus $corpus)"
  else
    echo "FAIL fuzz_$t: exit $rc after $runs runs in ${secs}s; crash input in $F/crash/$t/"
    grep -E -A 30 '^==[0-9]+==ERROR|runtime error|^fuzz: ' "$F/$t.log" | head -n 50
    failed="$failed $t"
  fi
done
echo "fuzz: total $(( $(date +%s) - start ))s"
if [ -n "$failed" ]; then echo "fuzz failed:$failed"; exit 1; fi
