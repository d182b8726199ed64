# Sourced by the bench scripts: run a program with each log line stamped by the seconds
# since its launch. $T must be a temporary directory.

now() { date +%s.%N; }
# run NAME PROGRAM ARGS...: the log with each line's seconds since launch, in $T/NAME.log
run() {
  name=$1
  shift
  t0=$(now)
  "$@" 2>&1 | while IFS= read -r l; do echo "$(awk -v a="$(now)" -v b="$t0" 'BEGIN { printf "%.2f", a - b }') $l"; done >"$T/$name.log"
}
# run_ok NAME PROGRAM ARGS...: run, then stop the bench when the run did not finish
run_ok() {
  run "$@"
  grep -q "peak memory" "$T/$1.log" || { echo "bench: $1 failed:"; tail -5 "$T/$1.log"; exit 1; }
}
# metric NAME FILE: the last value of a numeric metric in a metrics.jsonl
metric() { sed -n "s|.*\"$1\":\([0-9.]*\).*|\1|p" "$2" | tail -1; }
