#!/bin/sh
# ZeRO-1 (optimizer_sharding): each rank keeps 1/N of the AdamW moments, gradients
# reduce-scatter, weights all-gather. Without clipping, 2 sharded ranks take bit for bit
# the steps of 2 unsharded ones and save the same optimizer.safetensors (rank 0 gathers
# the moments); at 3 ranks (uneven shards, clipping on) losses and weights match one
# process accumulating 3 micro-batches to float rounding; LoRA adapters and bf16 weights
# shard bit for bit as the 2-rank case; a sharded checkpoint resumes at 3 ranks and at 1;
# the memory plan shows the shard.
. tests/lib/common.sh
mpi_test mpi_zero
args="configs/sft.yml dataset_path=$T/train.jsonl model.hidden_size=64 model.intermediate_size=128
      model.num_hidden_layers=2 model.num_attention_heads=2 max_length=24 max_steps=6 logging_steps=1
      learning_rate=1e-3 save_steps=3 num_threads=1"
# same_losses A B: the steps both logged have losses within 1e-5 relative
same_losses() {
  losses "$T/$1/metrics.jsonl" >"$T/la"
  losses "$T/$2/metrics.jsonl" >"$T/lb"
  [ -s "$T/la" ] || fail "$1 logged no loss"
  join "$T/la" "$T/lb" | awk -v a="$1" -v b="$2" '{ d = $2 - $3; if (d < 0) d = -d; n++
      if (d > 1e-5 * $2) { print "step " $1 ": " a " " $2 ", " b " " $3; bad = 1 } }
      END { if (n == 0) { print "no common step"; bad = 1 } exit bad }' || fail "losses differ: $1 vs $2"
}
# floats FILE: a safetensors file's values (all float32), one per line
floats() {
  n=$(od -An -tu8 -N8 "$1" | tr -d ' ')
  tail -c +$((9 + n)) "$1" | od -An -v -tf4 | tr -s ' ' '\n' | sed '/^$/d'
}
# close FILE_A FILE_B: the same tensors, every value within 1e-6 + 1e-4 |a| (float rounding
# of sums in another order, amplified by a few AdamW steps); prints the largest gap
close() {
  floats "$1" >"$T/fa"
  floats "$2" >"$T/fb"
  [ "$(wc -l <"$T/fa")" = "$(wc -l <"$T/fb")" ] && [ -s "$T/fa" ] || fail "$1 and $2 differ in size"
  paste "$T/fa" "$T/fb" | awk -v f="$1" '{ d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1
      if (d > m) m = d; if (d > 1e-6 + 1e-4 * a) bad++ }
      END { printf "  largest gap %.3g over %d values%s\n", m, NR, bad ? " (" bad " too far)" : ""; exit bad > 0 }' ||
    fail "$1 vs $2: values differ by more than float rounding"
}

echo "== 2 ranks, no clipping: sharded = unsharded bit for bit, the same checkpoint files"
mpi_sft dp2 2 max_grad_norm=0
mpi_sft z2 2 max_grad_norm=0 optimizer_sharding=true
grep -q "AdamW moments (2 x float32), shard 1 of 2" "$T/z2.log" || fail "z2 did not shard its moments"
cmp "$T/dp2/model.safetensors" "$T/z2/model.safetensors" || fail "sharded weights differ from unsharded"
cmp "$T/dp2/checkpoint-3/optimizer.safetensors" "$T/z2/checkpoint-3/optimizer.safetensors" ||
  fail "the gathered moments differ from the unsharded run's"
[ "$(ls "$T/z2/checkpoint-3")" = "$(ls "$T/dp2/checkpoint-3")" ] || fail "the checkpoints hold other files"
same_losses dp2 z2

echo "== 3 ranks (uneven shards), clipping on: as one process accumulating 3 micro-batches"
mpi_sft one 1 gradient_accumulation_steps=3 per_device_train_batch_size=4
mpi_sft z3 3 per_device_train_batch_size=4 optimizer_sharding=true
grep -q "x 3 ranks" "$T/z3.log" || fail "the run did not see 3 ranks"
same_losses one z3
close "$T/one/model.safetensors" "$T/z3/model.safetensors"
close "$T/one/checkpoint-3/optimizer.safetensors" "$T/z3/checkpoint-3/optimizer.safetensors"

echo "== a sharded checkpoint resumes at another number of ranks"
# z2's global batch is 2 x 8 = 16: 1 rank x 8 x 2 micro-batches, unsharded, reads the same files
mpi_sft r1 1 resume_from_checkpoint="$T/z2/checkpoint-3" max_grad_norm=0 gradient_accumulation_steps=2
grep -q "resumed from" "$T/r1.log" || fail "r1 did not resume"
same_losses z2 r1
close "$T/z2/model.safetensors" "$T/r1/model.safetensors"
# 2 -> 4 ranks sharded (4 x 4 = 16)
mpi_sft r4 4 resume_from_checkpoint="$T/z2/checkpoint-3" max_grad_norm=0 per_device_train_batch_size=4 \
  optimizer_sharding=true
same_losses z2 r4
close "$T/z2/model.safetensors" "$T/r4/model.safetensors"

echo "== LoRA: the adapters' moments shard the same way"
mpi_sft ldp 2 max_grad_norm=0 use_peft=true lora_r=4 learning_rate=1e-2
mpi_sft lz 2 max_grad_norm=0 use_peft=true lora_r=4 learning_rate=1e-2 optimizer_sharding=true
cmp "$T/ldp/adapter_model.safetensors" "$T/lz/adapter_model.safetensors" || fail "sharded adapters differ"
cmp "$T/ldp/checkpoint-3/optimizer.safetensors" "$T/lz/checkpoint-3/optimizer.safetensors" ||
  fail "the adapters' gathered moments differ"

if grep -q avx512_bf16 /proc/cpuinfo; then
  # Two ranks sum each gradient in one order whether they reduce or reduce-scatter, so the
  # runs agree bit for bit: a rank that computed with a stale bf16 copy of the shard its
  # peer updated would change the next step's loss and every weight after it. (Three ranks
  # sum in other orders sharded and not, and six AdamW steps can turn that rounding into a
  # step-sized difference for a weight whose gradient is near zero: not a bound rounding
  # explains.)
  echo "== bf16: each rank narrows the shard it did not update as its owner did"
  mpi_sft bdp 2 max_grad_norm=0 bf16=true
  mpi_sft bz 2 max_grad_norm=0 bf16=true optimizer_sharding=true
  grep -q "shard 1 of 2" "$T/bz.log" || fail "bz did not shard its moments"
  cmp "$T/bdp/model.safetensors" "$T/bz/model.safetensors" || fail "sharded bf16 weights differ from unsharded"
  same_losses bdp bz
fi

echo "== the memory plan (SmolLM-135M's shape): each rank's share of the moments"
smol="model.hidden_size=576 model.intermediate_size=1536 model.num_hidden_layers=30 model.num_attention_heads=9
      model.num_key_value_heads=3 model.vocab_size=49152 model.tie_word_embeddings=true dry_run=true"
mpi_sft plan1 1 $smol
mpi_sft plan2 2 $smol optimizer_sharding=true
m1=$(sed -n 's/^[a-z]*: *\([0-9]*\)  AdamW moments (2 x float32)$/\1/p' "$T/plan1.log")
m2=$(sed -n 's/^[a-z]*: *\([0-9]*\)  AdamW moments (2 x float32), shard 1 of 2$/\1/p' "$T/plan2.log")
[ -n "$m1" ] && [ -n "$m2" ] || { cat "$T/plan1.log" "$T/plan2.log"; fail "no moments row in the plan"; }
echo "  moments per rank: $m1 MiB at 1 rank, $m2 MiB sharded over 2"
[ $((m1 - 2 * m2)) -le 1 ] && [ $((2 * m2 - m1)) -le 1 ] || fail "2 shards should hold half the moments each"

echo "mpi_zero: all checks passed"
