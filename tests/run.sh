#!/bin/sh
# Runs every unit test binary, then every integration test script; exits 1 if any fail.
# usage: tests/run.sh BUILD_DIR BIN_DIR
B=${1:-build}; BIN=${2:-bin}
export CT_BIN="$(cd "$BIN" && pwd)" CT_BUILD="$(cd "$B" && pwd)"
start=$(date +%s)
fails=$(mktemp)
# run_unit NAME: one unit test binary (CT_WRAP runs it under a tool: make valgrind)
run_unit() {
  t0=$(date +%s)
  if ${CT_WRAP:-} "$B/tests/$1" >"$B/tests/$1.log" 2>&1; then
    echo "PASS $1 ($(( $(date +%s) - t0 ))s)"
  else
    echo "FAIL $1"; cat "$B/tests/$1.log"; echo "$1" >>"$fails"
  fi
}
# run_sh NAME: one integration test; its result line on stdout, its name in $fails on failure
run_sh() {
  t0=$(date +%s)
  if sh "tests/$1.sh" >"$B/tests/$1.log" 2>&1; then
    echo "PASS $1 ($(( $(date +%s) - t0 ))s)"
  else
    echo "FAIL $1"; tail -n 40 "$B/tests/$1.log"; echo "$1" >>"$fails"
  fi
}
# The longest tests (node, llama.cpp, the fuzzers, the tool and environment servers' SFT'd
# models, DPO's and LoRA's: about half of the time) run in a lane of their own beside everything else,
# unit tests included (most of those use one core); the tests that time something (signals, timeouts,
# a slow server; test_reward's remote-reward deadlines) wait for that lane to end, so they
# run on an otherwise idle machine. CT_SERIAL=1: one at a time. CT_SKIP_SH=1: unit tests only.
lane="gguf_e2e tokenizer_ref tools_e2e env_e2e fuzz_smoke dpo_e2e lora_e2e" timed="signals mpi_fault memory_limits reward_remote run_safety"
timed_units="test_reward"
[ -n "${CT_SERIAL:-}" ] && lane=""
[ -n "${CT_SKIP_SH:-}" ] && lane=""
lane_out=$(mktemp)
lane_pid=""
if [ -n "$lane" ]; then
  (for n in $lane; do run_sh "$n"; done >"$lane_out") &
  lane_pid=$!
fi
later_units=""
for t in "$B"/tests/test_*; do
  [ -x "$t" ] || continue
  case "$t" in *.d|*.o) continue ;; esac
  name=$(basename "$t")
  case " $timed_units " in *" $name "*) [ -n "$lane" ] && { later_units="$later_units $name"; continue; } ;; esac
  run_unit "$name"
done
later=""
if [ -z "${CT_SKIP_SH:-}" ]; then
  for t in tests/*.sh; do
    name=$(basename "$t" .sh)
    case " run $lane " in *" $name "*) continue ;; esac
    case " $timed " in *" $name "*) [ -n "$lane" ] && { later="$later $name"; continue; } ;; esac
    run_sh "$name"
  done
fi
if [ -n "$lane_pid" ]; then
  wait "$lane_pid"
  cat "$lane_out"
fi
rm -f "$lane_out"
for name in $later_units; do run_unit "$name"; done
for name in $later; do run_sh "$name"; done
failed="$(tr '\n' ' ' <"$fails" | sed 's/^/ /; s/ $//')"
rm -f "$fails"
echo "total $(( $(date +%s) - start ))s"
if [ -n "$failed" ] && [ "$failed" != " " ]; then echo "failed:$failed"; exit 1; fi
echo "all tests passed"
