#!/bin/sh
# Runs every unit test binary, then every integration test script; exits 1 if any fail.
# usage: tests/run.sh BUILD_DIR BIN_DIR
B=${1:-build}; BIN=${2:-bin}
export CT_BIN="$(cd "$BIN" && pwd)" CT_BUILD="$(cd "$B" && pwd)"
failed=""
start=$(date +%s)
for t in "$B"/tests/test_*; do
  [ -x "$t" ] || continue
  case "$t" in *.d|*.o) continue ;; esac
  name=$(basename "$t")
  t0=$(date +%s)
  # CT_WRAP runs each unit test under a tool (make valgrind)
  if ${CT_WRAP:-} "$t" >"$B/tests/$name.log" 2>&1; then
    echo "PASS $name ($(( $(date +%s) - t0 ))s)"
  else
    echo "FAIL $name"; cat "$B/tests/$name.log"; failed="$failed $name"
  fi
done
# run_sh NAME: one integration test; its result line on stdout, its name in $fails on failure
fails=$(mktemp)
run_sh() {
  t0=$(date +%s)
  if sh "tests/$1.sh" >"$B/tests/$1.log" 2>&1; then
    echo "PASS $1 ($(( $(date +%s) - t0 ))s)"
  else
    echo "FAIL $1"; tail -n 40 "$B/tests/$1.log"; echo "$1" >>"$fails"
  fi
}
# The longest tests (node, llama.cpp, the fuzzers, the tool and environment servers' SFT'd
# models: half of the time) run in a lane of their own beside the others; the tests that
# time something (signals, timeouts, a slow server) wait for that lane to end, so they run
# on an otherwise idle machine. CT_SERIAL=1: one at a time.
lane="gguf_e2e tokenizer_ref tools_e2e env_e2e fuzz_smoke" timed="signals mpi_fault memory_limits reward_remote run_safety"
[ -n "${CT_SERIAL:-}" ] && lane=""
if [ -z "${CT_SKIP_SH:-}" ]; then
  lane_out=$(mktemp)
  (for n in $lane; do run_sh "$n"; done >"$lane_out") &
  lane_pid=$!
  later=""
  for t in tests/*.sh; do
    name=$(basename "$t" .sh)
    case " run $lane " in *" $name "*) continue ;; esac
    case " $timed " in *" $name "*) [ -n "$lane" ] && { later="$later $name"; continue; } ;; esac
    run_sh "$name"
  done
  wait "$lane_pid"
  cat "$lane_out"
  rm -f "$lane_out"
  for name in $later; do run_sh "$name"; done
fi
failed="$failed$(tr '\n' ' ' <"$fails" | sed 's/^/ /; s/ $//')"
rm -f "$fails"
echo "total $(( $(date +%s) - start ))s"
if [ -n "$failed" ]; then echo "failed:$failed"; exit 1; fi
echo "all tests passed"
