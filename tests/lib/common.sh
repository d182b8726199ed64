# Shared by the end-to-end test scripts (sourced, not run).
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
