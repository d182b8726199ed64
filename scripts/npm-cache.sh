# npm-cache: sourced by the scripts that fetch pinned npm packages into a cache outside the
# repo (tokenizer-refs.sh, llama-cpp-ref.sh). One function:
#   npm_cache NAME DIR "PKGS" MARKER PACKAGE_JSON [npm install flags...]
# prints DIR once PKGS are installed there (MARKER: a path under node_modules that shows
# they are); installs Debian's nodejs and npm first when missing. Idempotent.
npm_cache() {
  name=$1 dir=$2 pkgs=$3 marker=$4 pkgjson=$5
  shift 5
  stamp="$dir/.ctune-refs"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pkgs" ] && [ -e "$dir/node_modules/$marker" ]; then
    echo "$dir"
    return 0
  fi
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "$name: installing Debian's nodejs and npm" >&2
    if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -q >/dev/null || true
    $sudo apt-get install -y -q --no-install-recommends nodejs npm >/dev/null
  fi
  mkdir -p "$dir"
  [ -f "$dir/package.json" ] || echo "$pkgjson" > "$dir/package.json"
  echo "$name: fetching $pkgs into $dir" >&2
  # shellcheck disable=SC2086
  if ! (cd "$dir" && npm install "$@" --no-audit --no-fund --loglevel=error $pkgs >&2); then
    echo "$name: npm install failed (is the npm registry reachable?)" >&2
    return 1
  fi
  echo "$pkgs" > "$stamp"
  echo "$dir"
}
