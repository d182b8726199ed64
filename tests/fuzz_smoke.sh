#!/bin/sh
# Builds the libFuzzer targets (make fuzz-build: clang, ASan + UBSan) and runs each one
# briefly: the past crashers in fuzz/regress/ must pass and a few seconds of fresh
# fuzzing must find nothing. `make fuzz` is the long run (10^6 inputs per target).
set -eu
cd "$(dirname "$0")/.."
if ! command -v clang >/dev/null 2>&1; then
  echo "fuzz_smoke: clang is missing (sh scripts/install-deps.sh fuzz)" >&2
  exit 1
fi
make --no-print-directory fuzz-build >/tmp/ct_fuzz_build.$$ 2>&1 || { cat /tmp/ct_fuzz_build.$$; exit 1; }
rm -f /tmp/ct_fuzz_build.$$
sh fuzz/run.sh build-fuzz -max_total_time="${CT_FUZZ_SECONDS:-5}"
