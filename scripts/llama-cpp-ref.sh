#!/bin/sh
# Fetches the real llama.cpp (prebuilt, from npm) and an independent GGUF parser into a
# cache outside the repo and prints the cache directory (its node_modules holds them).
# Idempotent: when the pinned versions are already there it only prints the path.
#
#   node-llama-cpp + @node-llama-cpp/linux-x64   llama.cpp's CPU build (getLlama({gpu: false}));
#       --omit=optional keeps out ~1 GB of CUDA and Vulkan builds
#   @huggingface/gguf                            reads a GGUF header in JavaScript
#
# usage: scripts/llama-cpp-ref.sh            (CT_LLAMA_CACHE overrides the cache directory)
set -eu
dir=${CT_LLAMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ctune/llama-cpp}
pkgs="node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64@3.22.1 @huggingface/gguf@0.4.6"
stamp="$dir/.ctune-refs"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pkgs" ] && [ -d "$dir/node_modules/node-llama-cpp" ]; then
  echo "$dir"
  exit 0
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "llama-cpp-ref: installing Debian's nodejs and npm" >&2
  if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q >/dev/null || true
  $sudo apt-get install -y -q --no-install-recommends nodejs npm >/dev/null
fi
mkdir -p "$dir"
[ -f "$dir/package.json" ] || echo '{"name":"ctune-llama-cpp-ref","private":true,"type":"module"}' > "$dir/package.json"
echo "llama-cpp-ref: fetching $pkgs into $dir" >&2
# shellcheck disable=SC2086
if ! (cd "$dir" && npm install --omit=optional --no-audit --no-fund --loglevel=error $pkgs >&2); then
  echo "llama-cpp-ref: npm install failed (is the npm registry reachable?)" >&2
  exit 1
fi
echo "$pkgs" > "$stamp"
echo "$dir"
