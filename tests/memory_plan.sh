#!/bin/sh
# The memory plan: printed before anything big is allocated, within 10% of the peak
# resident memory a run then reaches (with and without recomputation), gradient_checkpointing:
# true recomputing only when the plan cannot keep every layer, a dry
# run that stops after it, and a model too big for the machine refused before any
# allocation, naming the knobs that shrink it.
. tests/lib/common.sh
start_test plan

"$BIN/ctune-demo-data" reverse "$T/train.jsonl" "$T/eval.jsonl" 400 50 3 6
# a 41.6M-parameter model (667 MB of train state): big enough that the plan's rows, not
# the process's fixed overhead, make the peak; packed full rows, every token trained, so
# the activations and logits the plan counts are all touched
shape="configs/sft.yml dataset_path=$T/train.jsonl model.vocab_size=32000 model.hidden_size=512
       model.intermediate_size=1536 model.num_hidden_layers=8 model.num_attention_heads=8
       model.num_key_value_heads=4 max_length=128 per_device_train_batch_size=4 save_steps=0
       packing=true completion_only_loss=false"
for gc in false always; do
  "$BIN/sft" $shape output_dir="$T/o$gc" max_steps=2 gradient_checkpointing=$gc >"$T/$gc.log" 2>&1 \
    || { cat "$T/$gc.log"; fail "sft run"; }
  plan=$(sed -n 's/.* \([0-9][0-9]*\)  total, of .*/\1/p' "$T/$gc.log")
  peak=$(sed -n 's/.*peak memory \([0-9]*\) MiB.*/\1/p' "$T/$gc.log")
  echo "gradient_checkpointing=$gc: plan $plan MiB, peak resident $peak MiB"
  awk -v p="$plan" -v r="$peak" 'BEGIN { d = (r - p) / r; exit !(d < 0.1 && d > -0.1) }' \
    || fail "the plan ($plan MiB) is not within 10% of the peak ($peak MiB)"
  eval "plan_$gc=$plan"
done
awk -v a="$plan_always" -v b="$plan_false" 'BEGIN { exit !(a < b - 50) }' \
  || fail "gradient_checkpointing does not shrink the plan ($plan_false -> $plan_always MiB)"

echo "== gradient_checkpointing: true recomputes only when the plan cannot keep every layer"
"$BIN/sft" $shape output_dir="$T/keep" max_steps=2 gradient_checkpointing=true dry_run=true >"$T/keep.log" 2>&1 \
  || { cat "$T/keep.log"; fail "dry run, gradient_checkpointing true"; }
grep -q "gradient_checkpointing: every layer's activations fit .*: kept, no recomputation" "$T/keep.log" &&
  grep -q "activations, 4 x 128 tokens (every layer)" "$T/keep.log" || { cat "$T/keep.log"; fail "true did not keep them in ample room"; }
room=$((plan_false * 10 / 9 - 20))  # the kept plan needs a tenth spare: this room holds only the recomputing one
CT_MEM_AVAILABLE_MB=$room "$BIN/sft" $shape output_dir="$T/tight" max_steps=2 gradient_checkpointing=true dry_run=true \
  >"$T/tight.log" 2>&1 || { cat "$T/tight.log"; fail "dry run, gradient_checkpointing true, $room MiB"; }
# ... there the top layers' activations are kept, as many as fit, and the others recomputed
kept=$(sed -n "s/.*gradient_checkpointing: the top \([0-9]*\) of 8 layers' activations fit .*the other \([0-9]*\) recomputed.*/\1 \2/p" "$T/tight.log")
echo "in $room MiB: top layers kept, recomputed: $kept"
! grep -q "kept, no recomputation" "$T/tight.log" && set -- $kept && [ "$1" -ge 1 ] && [ "$1" -le 7 ] &&
  [ $(($1 + $2)) = 8 ] && grep -q "activations, 4 x 128 tokens (inputs, top $1 layers)" "$T/tight.log" \
  || { cat "$T/tight.log"; fail "true did not keep the top layers that fit in $room MiB"; }
# and training so gives the model recomputing every layer gives, bit for bit
room=$((plan_false * 10 / 9 - 20))
CT_MEM_AVAILABLE_MB=$room "$BIN/sft" $shape output_dir="$T/part" max_steps=2 gradient_checkpointing=true save_steps=0 \
  >"$T/part.log" 2>&1 || { cat "$T/part.log"; fail "training with the top layers kept"; }
"$BIN/sft" $shape output_dir="$T/all" max_steps=2 gradient_checkpointing=always save_steps=0 >"$T/all.log" 2>&1 \
  || { cat "$T/all.log"; fail "training recomputing every layer"; }
grep -q "gradient_checkpointing: the top [0-9]* of 8 layers" "$T/part.log" || { cat "$T/part.log"; fail "no layer kept"; }
cmp "$T/part/model.safetensors" "$T/all/model.safetensors" || fail "keeping the top layers changed the trained model"
room=$((plan_always * 10 / 9 + 2))  # the recomputing plan with its tenth spare, not a layer more
CT_MEM_AVAILABLE_MB=$room "$BIN/sft" $shape output_dir="$T/tighter" max_steps=2 gradient_checkpointing=true dry_run=true \
  >"$T/tighter.log" 2>&1 || { cat "$T/tighter.log"; fail "dry run, gradient_checkpointing true, $room MiB"; }
! grep -q "gradient_checkpointing: .* fit" "$T/tighter.log" && grep -q "(layer inputs + one layer)" "$T/tighter.log" \
  || { cat "$T/tighter.log"; fail "true kept layers in $room MiB"; }
echo "gradient_checkpointing=true: every layer kept in ample room, recomputed in $room MiB"

echo "== dry_run prints the plan and allocates nothing"
"$BIN/sft" $shape output_dir="$T/dry" max_steps=2 dry_run=true >"$T/dry.log" 2>&1 || { cat "$T/dry.log"; fail "dry run"; }
grep -q "AdamW moments" "$T/dry.log" && grep -q "dry run: nothing allocated" "$T/dry.log" || fail "no plan in the dry run"
[ ! -e "$T/dry/model.safetensors" ] || fail "the dry run trained"
peak=$(sed -n 's/.*peak memory \([0-9]*\) MiB.*/\1/p' "$T/dry.log")
[ -z "$peak" ] || fail "the dry run printed a training summary"

echo "== a plan that does not fit stops before allocating, naming the knobs"
# 3 x 8192-wide, 64-layer model: ~55B floats of train state, far past any machine here
/usr/bin/time -f "%M" -o "$T/rss" "$BIN/sft" $shape output_dir="$T/big" model.hidden_size=8192 model.intermediate_size=28672 \
  model.num_hidden_layers=64 model.num_attention_heads=64 model.num_key_value_heads=8 >"$T/big.log" 2>&1 && fail "a huge model ran"
grep -q "the memory plan needs .* MiB but .* MiB are available; shrink it with gradient_checkpointing" "$T/big.log" \
  || { cat "$T/big.log"; fail "no clear refusal"; }
rss=$(cat "$T/rss" | tail -1)
[ "$rss" -lt 200000 ] || fail "the refused run still reached $rss KiB"
echo "== GRPO's decode_slots 0: the rank's whole generation batch, or as many KV caches as the plan holds"
# 4 KiB of KV cache per position (4 layers x 2 kv heads x 64 x K and V, float32): 4 MiB a slot
# at 1 + 1024 positions, so 16 slots and 64 differ by ~190 MiB, far past the run's own noise
"$BIN/sft" configs/sft.yml dataset_path="$T/train.jsonl" output_dir="$T/q" max_steps=1 learning_rate=0 save_steps=0 \
  model.hidden_size=256 model.intermediate_size=512 model.num_hidden_layers=4 model.num_attention_heads=4 \
  model.num_key_value_heads=2 model.max_position_embeddings=2048 max_length=32 >"$T/q.log" 2>&1 \
  || { cat "$T/q.log"; fail "the GRPO policy"; }
grpo_dry() {  # grpo_dry NAME [key=value ...]: a dry run of 8 prompts x 8 completions a step
  name=$1; shift
  "$BIN/grpo" configs/grpo.yml model_path="$T/q" dataset_path="$T/train.jsonl" answer_field=completion output_dir="$T/$name" \
    per_device_train_batch_size=16 gradient_accumulation_steps=4 num_generations=8 max_completion_length=1024 \
    dry_run=true "$@" >"$T/$name.log" 2>&1
}
grpo_dry g16 decode_slots=16 || { cat "$T/g16.log"; fail "GRPO dry run, 16 slots"; }
total16=$(sed -n 's/.* \([0-9][0-9]*\)  total, of .*/\1/p' "$T/g16.log")
grpo_dry gall || { cat "$T/gall.log"; fail "GRPO dry run, decode_slots 0"; }
grep -q "decode_slots: 64, the rank's 8 prompts x 8 completions decoding together" "$T/gall.log" &&
  grep -q "sampler: KV cache of 64 slots" "$T/gall.log" || { cat "$T/gall.log"; fail "decode_slots 0 did not take 64 slots"; }
CT_MEM_AVAILABLE_MB=$((total16 + 100)) grpo_dry gsome || { cat "$T/gsome.log"; fail "GRPO dry run in $((total16 + 100)) MiB"; }
some=$(sed -n "s/.*decode_slots: \([0-9]*\) of the rank's 64 completions: the memory plan holds no more.*/\1/p" "$T/gsome.log")
[ -n "$some" ] && [ "$some" -gt 16 ] && [ "$some" -lt 64 ] || { cat "$T/gsome.log"; fail "in $((total16 + 100)) MiB: not 16 < slots < 64"; }
grep -q "sampler: KV cache of $some slots" "$T/gsome.log" || fail "the plan's KV cache is not $some slots"
echo "16 slots: plan $total16 MiB; 64 slots in any room; $some slots in $((total16 + 100)) MiB"
CT_MEM_AVAILABLE_MB=$((total16 - 100)) grpo_dry gnone && fail "a plan over the room ran"
grep -q "decode_slots: 16 of the rank's 64" "$T/gnone.log" && grep -q "the memory plan needs .* MiB but" "$T/gnone.log" \
  || { cat "$T/gnone.log"; fail "too little room: not 16 slots and a refusal"; }
echo "memory plan: all checks passed"
