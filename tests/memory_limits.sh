#!/bin/sh
# An address-space limit (ulimit -v) is refused in one line with its figures, before MPI
# and OpenBLAS can hang or crash in it (under `ulimit -v 150000` a trainer hung for ever,
# OpenBLAS retrying a work buffer that could not fit; under 250000 Open MPI crashed): at
# start-up when even that cannot fit, by the memory plan when the run cannot. Every run
# has a timeout (SIGKILL: a trainer stops on SIGTERM only between steps), so a hang fails.
. tests/lib/common.sh
start_test memory_limits

micro_sft
# num_threads=1: each pool thread needs 128 MiB of address space for OpenBLAS's buffer, so a
# limit means the same on a machine of any core count
tiny="$tiny save_steps=0 num_threads=1"
"$BIN/sft" $tiny output_dir="$T/m" max_steps=1 >"$T/m.log" 2>&1 || { cat "$T/m.log"; fail "training the model"; }

# limited KIB NAME PROGRAM ARGS...: PROGRAM under `ulimit -v KIB` must exit 1 within 60 s
# with one error line (PROGRAM: ...), printed; $T/NAME.log has the output.
limited() {
  kib=$1 name=$2
  shift 2
  rc=0
  (ulimit -v "$kib" && exec timeout -s KILL 60 "$@") >"$T/$name.log" 2>&1 || rc=$?
  [ "$rc" = 1 ] || { cat "$T/$name.log"; fail "$name: exit $rc under ulimit -v $kib (137: killed by the timeout)"; }
  prog=$(basename "$1")
  [ "$(grep -c "^$prog: " "$T/$name.log")" = 1 ] || { cat "$T/$name.log"; fail "$name: not one error line"; }
  grep "^$prog: " "$T/$name.log"
}

start="ctune needs at least [0-9]* MiB to start ([0-9]* MiB mapped now, 1 x 128 MiB for OpenBLAS's work buffer"
for kib in 150000 250000; do
  echo "== ulimit -v $kib"
  limited $kib "sft$kib" "$BIN/sft" $tiny output_dir="$T/o$kib" max_steps=2
  grep -q "^sft: address-space limit (ulimit -v) is $((kib / 1024)) MiB; $start, 96 MiB for MPI's start); raise ulimit -v$" \
    "$T/sft$kib.log" || fail "sft under ulimit -v $kib: not the start-up refusal"
  # one thread: 214 MiB or so to start, which 244 MiB hold but for the model and its
  # 6 MB KV cache (a sampler without MPI needs less to start)
  limited $kib "sampler$kib" "$BIN/sampler" generate model_path="$T/m" prompt=abc max_new_tokens=4 num_threads=1
  grep -q "^sampler: address-space limit (ulimit -v) is $((kib / 1024)) MiB; $start); raise ulimit -v or lower num_threads$" \
    "$T/sampler$kib.log" || { [ $kib = 250000 ] && grep -Eq "^sampler: (engine|model|tokenizer).*cannot allocate [1-9]" \
    "$T/sampler$kib.log"; } || fail "sampler under ulimit -v $kib: neither the start-up refusal nor an allocation's"
done

echo "== ulimit -v 400000: start-up fits, the memory plan (a 13 MB model's) does not"
limited 400000 plan "$BIN/sft" $tiny output_dir="$T/p" max_steps=2 model.hidden_size=512 model.intermediate_size=1536 \
  model.num_hidden_layers=2 model.num_attention_heads=8 model.num_key_value_heads=4
grep -q "^sft: address-space limit (ulimit -v) is 391 MiB; the memory plan needs [0-9]* MiB of address space ([0-9]* MiB mapped now, 1[0-9][0-9] MiB of new buffers, [0-9]* x 128 MiB for OpenBLAS's work buffers, [0-9]* MiB slack); raise ulimit -v, lower num_threads or shrink the plan with gradient_checkpointing" \
  "$T/plan.log" || fail "not the memory plan's refusal"
grep -q "address space: .* of the 391 of ulimit -v" "$T/plan.log" || fail "the plan does not show the address space"
echo "== the sampler: its KV cache does not fit (the size it asked for, not 0)"
limited 400000 kv "$BIN/sampler" generate model_path="$T/m" prompt=abc max_new_tokens=4 max_target_length=65536 \
  num_threads=1
grep -q "^sampler: engine: cannot allocate [1-9][0-9]* MB (KV cache for 16 slots x 65536 positions)" "$T/kv.log" \
  || fail "not the KV cache's refusal"

echo "== a limit that holds the run: it trains (no hang)"
(ulimit -v 1200000 && exec timeout -s KILL 60 "$BIN/sft" $tiny output_dir="$T/ok" max_steps=2) >"$T/ok.log" 2>&1 \
  || { cat "$T/ok.log"; fail "a run under ulimit -v 1200000"; }
echo "memory limits: all checks passed"
