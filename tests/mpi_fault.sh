#!/bin/sh
# A rank that dies (kill -9 of rank 1 mid-training, ZeRO-1 sharded checkpoints every 2
# steps) ends the whole job within a bounded time (Open MPI's mpirun sees the death and
# stops the other ranks: no rank waits forever in a collective), with a message naming
# the rank and a non-zero exit; every checkpoint left is complete and the latest resumes.
. tests/lib/common.sh
mpi_test mpi_fault
args="configs/sft.yml dataset_path=$T/train.jsonl model.hidden_size=64 model.intermediate_size=128
      model.num_hidden_layers=2 model.num_attention_heads=2 max_length=24 save_steps=2 num_threads=1
      optimizer_sharding=true output_dir=$T/out"
(
  rc=0
  timeout 120 $MPIRUN -np 2 "$BIN/sft" $args max_steps=1000000 >"$T/run.log" 2>&1 || rc=$?
  echo "$rc" >"$T/rc"
) &
job=$!
for i in $(seq 1 300); do [ -d "$T/out/checkpoint-4" ] && break; sleep 0.1; done
[ -d "$T/out/checkpoint-4" ] || { cat "$T/run.log"; fail "no checkpoint-4 after 30 s"; }
victim=""
for p in $(pgrep -x sft); do  # rank 1 of this test's job (its output_dir is in $T)
  tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | grep -qx "output_dir=$T/out" || continue
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && victim=$p
done
[ -n "$victim" ] || { cat "$T/run.log"; fail "rank 1's process not found"; }
t0=$(date +%s)
kill -9 "$victim"
wait "$job"
took=$(( $(date +%s) - t0 ))
rc=$(cat "$T/rc")
echo "  killed rank 1 (pid $victim): the job ended in ${took} s with exit $rc"
[ "$rc" != 0 ] && [ "$rc" != 124 ] || { tail -20 "$T/run.log"; fail "exit $rc (0: it went on; 124: it hung until timeout)"; }
[ "$took" -le 30 ] || fail "the job took ${took} s to end after rank 1 died"
grep -q "rank 1 .*exited on signal 9" "$T/run.log" || { tail -20 "$T/run.log"; fail "no message naming rank 1"; }
last=0
for d in "$T"/out/checkpoint-*; do
  [ -s "$d/trainer_state.json" ] && [ -s "$d/optimizer.safetensors" ] || fail "$d is incomplete"
  s=${d##*-}
  [ "$s" -gt "$last" ] && last=$s
done
echo "  latest checkpoint: step $last"
$MPIRUN -np 2 "$BIN/sft" $args resume_from_checkpoint=latest max_steps=$((last + 1)) \
  >"$T/resume.log" 2>&1 || { cat "$T/resume.log"; fail "resuming from checkpoint-$last"; }
grep -q "resumed from .*checkpoint-$last" "$T/resume.log" || fail "did not resume from checkpoint-$last"
echo "mpi_fault: all checks passed"
