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
section() {  # section TITLE [MORE-TITLE]: a blank line, then "== TITLE" (MORE-TITLE on a line of its own)
  echo
  echo "== $1"
  [ $# -lt 2 ] || echo "   $2"
}
section "training step, Gemma 3 shapes (262,144-token vocabulary, batch 1 x 512 tokens): gemma-3-270m in full," \
  "gemma-3-1b with LoRA r 16 on every linear layer (its full fine-tune does not fit 24 GB)"
"$BIN/ctune-bench" train gemma=270m layers=18 batch=1 seq=512
"$BIN/ctune-bench" train gemma=1b layers=26 lora=16 batch=1 seq=512
section "distillation soft loss vs the cross-entropy head, Qwen3-0.6B hidden size and vocabulary"
"$BIN/ctune-bench" kd
section "sampler: prefill and decode, fp32, bf16 and int8, vs the memory-bandwidth bound"
"$BIN/sampler" bench
section "sampler: batched bf16 decode of 128 slots, Qwen2.5-0.5B shape, against the oneDNN bf16 rate (AMX tiles where present)"
"$BIN/ctune-bench" decode qwen=0.5b layers=24
section "sampler: the same with LoRA r 16 on every linear layer (GRPO's rollouts), the adapters folded into the products vs in passes of their own"
"$BIN/ctune-bench" decode qwen=0.5b layers=24 lora=16 steps=32
# scripts/bench-<name>.sh "$BIN", each under its title (the list is read from fd 3: the scripts keep stdin)
while IFS='|' read -r name title <&3; do
  section "$title"
  sh "scripts/bench-$name.sh" "$BIN"
done 3<<'EOF'
mtp|sampler: self-speculative decoding (speculative=mtp) vs plain greedy, on a model trained with MTP
memory|memory and start-up at real model sizes (Qwen2.5-0.5B, Llama-3.2-1B shapes)
tokenizer|tokenizer encoding, vs the reference implementation under node
lora|LoRA against full fine-tuning (SmolLM-135M and Qwen2.5-0.5B shapes)
reward|reward models: a GRPO step scored by a same-shape reward model; reward vs SFT training (SmolLM-135M shape)
dist|beyond one process: 2 ranks x 1 thread vs 1 rank x 2 threads, ZeRO-1 memory, DiLoCo bytes (SmolLM-135M shape)
EOF
section "the job we measure ourselves by: one GRPO step, 0.5B shape, LoRA: bf16 as a user writes it, bf16 tuned, float32 tuned"
# The user's form runs two steps and measures the second (the first also printed): a run of
# many steps pays the first writes of the activations' fresh pages once, and on a VM that
# first touch cost 23 s of a 192 s first training step (2 cores, kernel clear_page).
STEPS=2 sh scripts/bench-grpo.sh "$BIN" user bf16=true
for args in "tuned bf16=true" tuned; do
  sh scripts/bench-grpo.sh "$BIN" $args  # word-split on purpose: a mode and its keys
done
