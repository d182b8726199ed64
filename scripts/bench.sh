#!/bin/sh
# make bench: throughput figures, each next to a reference measured in the same run.
# usage: scripts/bench.sh BUILD_DIR BIN_DIR
set -eu
BIN=${2:-bin}
echo "== training step, SmolLM-135M shape (fp32, batch 4 x 256 tokens), vs this machine's sgemm"
"$BIN/ctune-bench" train
echo
echo "== distillation soft loss vs the cross-entropy head, Qwen3-0.6B hidden size and vocabulary"
"$BIN/ctune-bench" kd
echo
echo "== sampler: prefill and decode, fp32 and int8, vs the memory-bandwidth bound"
"$BIN/sampler" bench
echo
echo "== memory and start-up at real model sizes (Qwen2.5-0.5B, Llama-3.2-1B shapes)"
sh scripts/bench-memory.sh "$BIN"
echo
echo "== tokenizer encoding, vs the reference implementation under node"
sh scripts/bench-tokenizer.sh "$BIN"
echo
echo "== LoRA against full fine-tuning (SmolLM-135M and Qwen2.5-0.5B shapes)"
sh scripts/bench-lora.sh "$BIN"
echo
echo "== the job we measure ourselves by: one GRPO step, 0.5B shape, LoRA"
sh scripts/bench-grpo.sh "$BIN"
