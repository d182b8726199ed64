#!/bin/sh
# Installs the Debian packages ctune builds against. Idempotent: prints nothing and
# touches nothing when every package is already present.
#   install-deps.sh         what the build needs
#   install-deps.sh fuzz    and clang with its sanitizer + libFuzzer runtimes (make fuzz)
#   install-deps.sh test    both, and chromium: tests/report.sh has a real browser draw a
#                           ctune-report page (make test)
set -eu
pkgs="build-essential pkg-config libopenblas-dev libopenmpi-dev openmpi-bin libyaml-dev libjansson-dev libcurl4-openssl-dev libpcre2-dev zlib1g-dev libdnnl-dev"
case "${1:-}" in
  fuzz) pkgs="$pkgs clang libclang-rt-dev" ;;
  test) pkgs="$pkgs clang libclang-rt-dev chromium nodejs" ;;
esac
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "install-deps: installing$missing" >&2
if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q >/dev/null || true
# shellcheck disable=SC2086
$sudo apt-get install -y -q --no-install-recommends $missing >/dev/null
