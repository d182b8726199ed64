#!/bin/sh
# make bench: throughput figures, each next to a reference measured in the same run.
# usage: scripts/bench.sh BUILD_DIR BIN_DIR
set -eu
BIN=${2:-bin}
echo "== training step, SmolLM-135M shape (batch 4 x 256 tokens): fp32 vs sgemm, bf16 vs oneDNN bf16"
echo "OpenBLAS kernel: ${OPENBLAS_CORETYPE:-chosen by ctune for this CPU}"
"$BIN/ctune-bench" train | tee "${TMPDIR:-/tmp}/ct-bench-fp32.txt"
"$BIN/ctune-bench" train bf16=1 | tee "${TMPDIR:-/tmp}/ct-bench-bf16.txt"
t32=$(sed -n 's/^train: \([0-9]*\) tokens.*/\1/p' "${TMPDIR:-/tmp}/ct-bench-fp32.txt")
t16=$(sed -n 's/^train: \([0-9]*\) tokens.*/\1/p' "${TMPDIR:-/tmp}/ct-bench-bf16.txt")
awk -v a="$t32" -v b="$t16" 'BEGIN { printf "bf16 / fp32 training tokens/s: %.2f\n", b / a }'
echo
echo "== training step, Gemma 3 shapes (262,144-token vocabulary, batch 1 x 512 tokens): gemma-3-270m in full,"
echo "   gemma-3-1b with LoRA r 16 on every linear layer (its full fine-tune does not fit 24 GB)"
"$BIN/ctune-bench" train gemma=270m layers=18 batch=1 seq=512
"$BIN/ctune-bench" train gemma=1b layers=26 lora=16 batch=1 seq=512
echo
echo "== distillation soft loss vs the cross-entropy head, Qwen3-0.6B hidden size and vocabulary"
"$BIN/ctune-bench" kd
echo
echo "== sampler: prefill and decode, fp32, bf16 and int8, vs the memory-bandwidth bound"
"$BIN/sampler" bench
echo
echo "== sampler: self-speculative decoding (speculative=mtp) vs plain greedy, on a model trained with MTP"
sh scripts/bench-mtp.sh "$BIN"
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
echo "== reward models: a GRPO step scored by a same-shape reward model; reward vs SFT training (SmolLM-135M shape)"
sh scripts/bench-reward.sh "$BIN"
echo
echo "== beyond one process: 2 ranks x 1 thread vs 1 rank x 2 threads, ZeRO-1 memory, DiLoCo bytes (SmolLM-135M shape)"
sh scripts/bench-dist.sh "$BIN"
echo
echo "== the job we measure ourselves by: one GRPO step, 0.5B shape, LoRA: bf16 as a user writes it, bf16 tuned, float32 tuned"
sh scripts/bench-grpo.sh "$BIN" user bf16=true
sh scripts/bench-grpo.sh "$BIN" tuned bf16=true
sh scripts/bench-grpo.sh "$BIN" tuned
