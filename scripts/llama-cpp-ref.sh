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
. "$(dirname "$0")/npm-cache.sh"
npm_cache llama-cpp-ref "$dir" "$pkgs" node-llama-cpp '{"name":"ctune-llama-cpp-ref","private":true,"type":"module"}' --omit=optional
