#!/bin/sh
# Overlap (ddp_bucket_cap_mb): the gradient sum across ranks in buckets, each started
# (MPI_Iallreduce) by backward's per-layer hook as soon as its layers are done. At 2 ranks
# a sum of two has one order, so the overlapped run takes bit for bit the steps of the
# blocking one (ddp_bucket_cap_mb=0): the same losses, grad norms and saved weights, with
# one micro-batch per step and with gradient accumulation (the hook armed for the last
# micro-batch only); the log shows the buckets started during backward. Clipping on. At 3
# ranks (where MPI's non-blocking and blocking sums may add in another order) the losses
# agree to float rounding. dpo, which does not arm the hook, sums the same buckets after
# backward: the same steps.
. tests/lib/common.sh
mpi_test mpi_overlap
args="configs/sft.yml dataset_path=$T/train.jsonl model.hidden_size=64 model.intermediate_size=128
      model.num_hidden_layers=3 model.num_attention_heads=2 max_length=24 max_steps=5 logging_steps=1
      learning_rate=1e-3 max_grad_norm=0.5 save_steps=0 num_threads=1 per_device_train_batch_size=4"
# same NAME_A NAME_B: identical loss and grad_norm texts at every step, identical weights
same() {
  grep '"loss"' "$T/$1/metrics.jsonl" | sed 's/.*\("step":[0-9]*\).*\("loss":[^,]*\).*\("grad_norm":[^,]*\).*/\1 \2 \3/' >"$T/a"
  grep '"loss"' "$T/$2/metrics.jsonl" | sed 's/.*\("step":[0-9]*\).*\("loss":[^,]*\).*\("grad_norm":[^,]*\).*/\1 \2 \3/' >"$T/b"
  [ "$(wc -l <"$T/a")" = 5 ] || { cat "$T/a"; fail "$1: expected 5 logged steps"; }
  cmp -s "$T/a" "$T/b" || { paste "$T/a" "$T/b"; fail "losses or norms differ: $1 vs $2"; }
  cmp -s "$T/$1/model.safetensors" "$T/$2/model.safetensors" || fail "weights differ: $1 vs $2"
}
# started NAME: "S N" from the overlap log line (S of the N bucket sums handed to MPI
# during backward)
started() { sed -n 's/.*overlap: step 1 handed \([0-9]*\) of \([0-9]*\) bucket sums.*/\1 \2/p' "$T/$1.log"; }

mpi_sft blocking 2 ddp_bucket_cap_mb=0
mpi_sft overlap 2 ddp_bucket_cap_mb=0.01
grep -q "overlap:" "$T/blocking.log" && fail "ddp_bucket_cap_mb=0 still overlaps"
set -- $(started overlap)
[ "${2:-0}" -ge 4 ] || { cat "$T/overlap.log"; fail "expected several buckets at 0.01 MB, got '${2:-}'"; }
[ "$1" = "$2" ] || fail "only $1 of $2 bucket sums started during backward"
same blocking overlap
echo "overlap: $2 buckets, all started during backward; losses, norms and weights equal the blocking sum's"

mpi_sft blocking_acc 2 ddp_bucket_cap_mb=0 gradient_accumulation_steps=2
mpi_sft overlap_acc 2 ddp_bucket_cap_mb=0.01 gradient_accumulation_steps=2
set -- $(started overlap_acc)
[ "$1" = "$2" ] || fail "accumulation: $1 of $2 bucket sums started during the last backward"
same blocking_acc overlap_acc
echo "overlap: with 2 accumulated micro-batches, the same steps as the blocking sum"

mpi_sft blocking3 3 ddp_bucket_cap_mb=0
mpi_sft overlap3 3 ddp_bucket_cap_mb=0.01
losses "$T/blocking3/metrics.jsonl" >"$T/a"
losses "$T/overlap3/metrics.jsonl" >"$T/b"
[ "$(wc -l <"$T/a")" = 5 ] || fail "3 ranks: expected 5 logged steps"
paste "$T/a" "$T/b" | awk '{ d = $2 - $4; if (d < 0) d = -d; if (d > 1e-5 * $2) { print "step " $1 ": " $2 " vs " $4; bad = 1 } }
                           END { exit bad }' || fail "3 ranks: losses differ beyond float rounding"
echo "overlap: at 3 ranks the losses match the blocking sum's to float rounding"

# dpo never arms the hook: every bucket is handed over in ct_train_update, the same sums
"$BIN/ctune-demo-data" reverse-prefs "$T/prefs.jsonl" "$T/prefs_eval.jsonl" 200 10 22 6
"$BIN/sft" $args output_dir="$T/base" max_steps=2 >"$T/base.log" 2>&1 || { cat "$T/base.log"; fail "sft base"; }
dpo_args="configs/dpo.yml model_path=$T/base dataset_path=$T/prefs.jsonl max_length=24 logging_steps=1
          per_device_train_batch_size=4 max_steps=3 save_steps=0 num_threads=1 max_grad_norm=0.5"
for cap in 0 0.01; do
  # shellcheck disable=SC2086
  $MPIRUN -np 2 "$BIN/dpo" $dpo_args output_dir="$T/dpo$cap" ddp_bucket_cap_mb=$cap >"$T/dpo$cap.log" 2>&1 ||
    { cat "$T/dpo$cap.log"; fail "dpo at 2 ranks, ddp_bucket_cap_mb=$cap"; }
done
set -- $(sed -n 's/.*overlap: step 1 handed \([0-9]*\) of \([0-9]*\) bucket sums.*/\1 \2/p' "$T/dpo0.01.log")
[ "${1:-x}" = 0 ] && [ "${2:-0}" -ge 4 ] || { cat "$T/dpo0.01.log"; fail "dpo: expected 0 of several buckets during backward"; }
grep '"loss"' "$T/dpo0/metrics.jsonl" | sed 's/,"learning_rate.*//' >"$T/a"
grep '"loss"' "$T/dpo0.01/metrics.jsonl" | sed 's/,"learning_rate.*//' >"$T/b"
[ "$(wc -l <"$T/a")" = 3 ] && cmp -s "$T/a" "$T/b" || { paste "$T/a" "$T/b"; fail "dpo: losses differ with the buckets"; }
cmp -s "$T/dpo0/model.safetensors" "$T/dpo0.01/model.safetensors" || fail "dpo: weights differ with the buckets"
echo "overlap: dpo (buckets handed over after backward) takes the same steps as the blocking sum"

# the buckets overlap plain data parallel's all-reduce: with ZeRO-1 or DiLoCo the key is refused
expect 2 "key 'ddp_bucket_cap_mb' overlaps .* optimizer_sharding" "$BIN/sft" $args output_dir="$T/x" \
  ddp_bucket_cap_mb=25 optimizer_sharding=true
expect 2 "key 'ddp_bucket_cap_mb' overlaps .* diloco_inner_steps" "$BIN/sft" $args output_dir="$T/x" \
  ddp_bucket_cap_mb=25 diloco_inner_steps=4
echo "overlap: refused with optimizer_sharding and with DiLoCo"
