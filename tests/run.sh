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
[ -n "${CT_SKIP_SH:-}" ] || for t in tests/*.sh; do
  case "$t" in tests/run.sh) continue ;; esac
  name=$(basename "$t" .sh)
  t0=$(date +%s)
  if sh "$t" >"$B/tests/$name.log" 2>&1; then
    echo "PASS $name ($(( $(date +%s) - t0 ))s)"
  else
    echo "FAIL $name"; tail -n 40 "$B/tests/$name.log"; failed="$failed $name"
  fi
done
echo "total $(( $(date +%s) - start ))s"
if [ -n "$failed" ]; then echo "failed:$failed"; exit 1; fi
echo "all tests passed"
