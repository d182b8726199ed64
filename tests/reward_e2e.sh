#!/bin/sh
# bin/reward end to end, and GRPO scoring with the reward model it trains: on a toy
# preference task (the reversed word over the word copied) the held-out pair accuracy
# reaches 90%; TRL's metrics (and eval_ ones); the saved directory is a Hugging Face
# sequence classifier; `bin/reward eval` and `score` agree with training's eval; the margin
# column enters the loss; pre-tokenized pairs train as their text does; long pairs are
# dropped and counted; resume and gradient_checkpointing are bit-identical; GRPO with the
# reward model raises its mean reward (and reward_weights and bfloat16 storage act);
# use_peft (LoRA + the score head, saved as PEFT's SEQ_CLS adapter) reaches 90% too, its
# adapter reloads to training's rewards (alone or as model_path + adapter_path), resumes
# bit for bit and scores GRPO's rollouts; bad reward models and settings fail before any work.
. tests/lib/common.sh
start_test reward

"$BIN/ctune-demo-data" reverse "$T/sft.jsonl" "$T/sft_eval.jsonl" 3000 20 21 6 >/dev/null
small_sft "$T/sft.jsonl" "$T/sft" 200 128 384
# the toy task: "reverse abc:" prefers "cba" to "abc" (palindromes left out)
"$BIN/ctune-demo-data" reverse "$T/w.jsonl" "$T/we.jsonl" 1200 200 23 6 >/dev/null
pairs() { awk -F'"' '{w=$4; sub(/^reverse /,"",w); sub(/:$/,"",w);
  if (w != $8) printf "{\"prompt\": \"%s\", \"chosen\": \"%s\", \"rejected\": \"%s\"}\n", $4, $8, w}' "$1"; }
pairs "$T/w.jsonl" >"$T/pairs.jsonl"
pairs "$T/we.jsonl" >"$T/pairs_eval.jsonl"
R="$BIN/reward"
common="configs/reward.yml model_path=$T/sft dataset_path=$T/pairs.jsonl max_length=24 save_steps=0
        per_device_train_batch_size=8 learning_rate=5e-4 lr_scheduler_type=cosine warmup_steps=10"
steps() { grep '"accuracy"' "$1" | grep -v eval_; }

echo "== held-out pair accuracy reaches 90%; TRL's metrics"
"$R" $common output_dir="$T/rm" num_train_epochs=2 logging_steps=50 eval_dataset_path="$T/pairs_eval.jsonl" \
  eval_on_start=true >"$T/rm.log" 2>&1 || { cat "$T/rm.log"; fail "reward run"; }
acc0=$(grep eval_accuracy "$T/rm/metrics.jsonl" | head -1 | field eval_accuracy)
acc=$(grep eval_accuracy "$T/rm/metrics.jsonl" | tail -1 | field eval_accuracy)
echo "held-out pair accuracy $acc0 (new head) -> $acc"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.9) }' || { cat "$T/rm.log"; fail "held-out accuracy $acc < 0.9"; }
grep -q "score head: new, \[1, 128\], normal(0, 0.02)" "$T/rm.log" || fail "no new score head"
for k in loss accuracy margin min_reward mean_reward max_reward num_tokens; do
  grep -q "\"$k\"" "$T/rm/metrics.jsonl" || fail "metrics lack $k"
  grep -q "\"eval_$k\"" "$T/rm/metrics.jsonl" || fail "metrics lack eval_$k"
done

echo "== the model directory is a Hugging Face sequence classifier"
grep -q '"LlamaForSequenceClassification"' "$T/rm/config.json" || fail "architectures"
grep -q '"LABEL_0"' "$T/rm/config.json" || fail "id2label"
grep -q '"pad_token_id": 259' "$T/rm/config.json" || fail "pad_token_id not set"
head -c 20000 "$T/rm/model.safetensors" | grep -q '"score.weight":{"dtype":"F32","shape":\[1,128\]' || fail "score.weight [1, 128]"
! head -c 20000 "$T/rm/model.safetensors" | grep -q 'lm_head' || fail "a classifier has no lm_head"

echo "== bin/reward eval gives training's held-out accuracy; score ranks chosen over rejected"
"$R" eval model_path="$T/rm" eval_dataset_path="$T/pairs_eval.jsonl" max_length=24 >"$T/eval.out" 2>"$T/eval.log" \
  || { cat "$T/eval.log"; fail "reward eval"; }
e=$(sed -n 's/.*"eval_accuracy": \([0-9.]*\).*/\1/p' "$T/eval.out")
echo "bin/reward eval: $e (training's last eval: $acc)"
awk -v a="$acc" -v e="$e" 'BEGIN { d = a - e; if (d < 0) d = -d; exit !(d <= 0.011) }' || fail "eval $e vs $acc"
awk -F'"' '{printf "{\"prompt\": \"%s\", \"completion\": \"%s\"}\n{\"prompt\": \"%s\", \"completion\": \"%s\"}\n", $4, $8, $4, $12}' \
  "$T/pairs_eval.jsonl" >"$T/rows.jsonl"
"$R" score model_path="$T/rm" data="$T/rows.jsonl" max_length=24 >"$T/scores.jsonl" 2>"$T/score.log" \
  || { cat "$T/score.log"; fail "reward score"; }
[ "$(wc -l <"$T/scores.jsonl")" = "$(wc -l <"$T/rows.jsonl")" ] || fail "one score line per row"
head -1 "$T/scores.jsonl" | grep -q '^{"row": 0, "reward": [-0-9.e]*}$' || fail "score line format: $(head -1 "$T/scores.jsonl")"
s=$(sed 's/.*"reward": //; s/}//' "$T/scores.jsonl" | paste - - | awk '{n++; w += $1 > $2} END {print w / n}')
echo "score: chosen over rejected in $s of the pairs"
awk -v a="$e" -v s="$s" 'BEGIN { d = a - s; if (d < 0) d = -d; exit !(d <= 0.011) }' || fail "score ranks $s, eval $e"

echo "== the margin column: margin 100 on every pair makes the first loss about 100"
sed 's/}$/, "margin": 100}/' "$T/pairs.jsonl" >"$T/margin.jsonl"
"$R" $common output_dir="$T/mg" dataset_path="$T/margin.jsonl" max_steps=1 logging_steps=1 >"$T/mg.log" 2>&1 \
  || { cat "$T/mg.log"; fail "margin run"; }
l=$(steps "$T/mg/metrics.jsonl" | field loss)
echo "step-1 loss with margin 100: $l"
awk -v l="$l" 'BEGIN { exit !(l > 99 && l < 101) }' || fail "margin not in the loss ($l)"

echo "== pre-tokenized chosen_ids / rejected_ids train as the text pairs do"
head -64 "$T/pairs.jsonl" >"$T/p64.jsonl"
awk -F'"' '{printf "{\"text\": \"%s%s\"}\n", $4, $8}' "$T/p64.jsonl" | "$BIN/ctune-tokenize" encode tokenizer_path="$T/sft" \
  | sed 's/.*\[\(.*\)\].*/\1, 256/' >"$T/c.ids"
awk -F'"' '{printf "{\"text\": \"%s%s\"}\n", $4, $12}' "$T/p64.jsonl" | "$BIN/ctune-tokenize" encode tokenizer_path="$T/sft" \
  | sed 's/.*\[\(.*\)\].*/\1, 256/' >"$T/r.ids"
paste -d'|' "$T/c.ids" "$T/r.ids" | awk -F'|' '{printf "{\"chosen_ids\": [%s], \"rejected_input_ids\": [%s]}\n", $1, $2}' >"$T/ids.jsonl"
"$R" $common output_dir="$T/t1" dataset_path="$T/p64.jsonl" max_steps=4 logging_steps=1 shuffle_dataset=false >"$T/t1.log" 2>&1 || { cat "$T/t1.log"; fail "text pairs"; }
"$R" $common output_dir="$T/t2" dataset_path="$T/ids.jsonl" max_steps=4 logging_steps=1 shuffle_dataset=false >"$T/t2.log" 2>&1 || { cat "$T/t2.log"; fail "id pairs"; }
losses "$T/t1/metrics.jsonl" >"$T/l1"
losses "$T/t2/metrics.jsonl" >"$T/l2"
diff "$T/l1" "$T/l2" || fail "pre-tokenized pairs train differently"

echo "== pairs longer than max_length are dropped and counted (prompt + answer + EOS = 2w + 10 tokens)"
want=$(awk -F'"' '{w=$4; sub(/^reverse /,"",w); sub(/:$/,"",w); if (2 * length(w) + 10 > 16) n++} END {print n}' "$T/pairs.jsonl")
"$R" $common output_dir="$T/dr" max_length=16 max_steps=1 >"$T/dr.log" 2>&1 || { cat "$T/dr.log"; fail "max_length 16"; }
grep -q "train: $want pairs dropped: longer than max_length 16" "$T/dr.log" || { cat "$T/dr.log"; fail "expected $want dropped"; }

echo "== resume and gradient_checkpointing: the same steps, bit for bit"
args="$common max_steps=8 save_steps=3 logging_steps=1"
"$R" $args output_dir="$T/s1" >"$T/s1.log" 2>&1 || { cat "$T/s1.log"; fail "straight run"; }
stop_and_resume "$T/s2" "$R" $args
losses "$T/s1/metrics.jsonl" >"$T/r1"
losses "$T/s2/metrics.jsonl" >"$T/r2"
diff "$T/r1" "$T/r2" || fail "losses differ after resuming"
cmp "$T/s1/model.safetensors" "$T/s2/model.safetensors" || fail "weights differ after resuming"
"$R" $args output_dir="$T/gc" gradient_checkpointing=always save_steps=0 >"$T/gc.log" 2>&1 || { cat "$T/gc.log"; fail "gc run"; }
cmp "$T/s1/model.safetensors" "$T/gc/model.safetensors" || fail "gradient_checkpointing changed the weights"

echo "== a reward model continues from its own directory (its head is kept)"
"$R" $common model_path="$T/rm" output_dir="$T/cont" max_steps=1 >"$T/cont.log" 2>&1 || { cat "$T/cont.log"; fail "continue"; }
! grep -q "score head: new" "$T/cont.log" || fail "the head of a reward model was replaced"

echo "== use_peft: LoRA on every projection + the score head in full (PEFT's SEQ_CLS) reaches 90%"
"$R" $common output_dir="$T/lora" use_peft=true learning_rate=2e-3 num_train_epochs=2 logging_steps=50 \
  eval_dataset_path="$T/pairs_eval.jsonl" >"$T/lora.log" 2>&1 || { cat "$T/lora.log"; fail "LoRA reward run"; }
la=$(grep eval_accuracy "$T/lora/metrics.jsonl" | tail -1 | field eval_accuracy)
lm=$(grep eval_accuracy "$T/lora/metrics.jsonl" | tail -1 | field eval_margin)
ll=$(grep eval_accuracy "$T/lora/metrics.jsonl" | tail -1 | field eval_loss)
echo "LoRA held-out pair accuracy $la (margin $lm, loss $ll)"
awk -v a="$la" 'BEGIN { exit !(a >= 0.9) }' || { cat "$T/lora.log"; fail "LoRA held-out accuracy $la < 0.9"; }
grep -q "score head: new, \[1, 128\]" "$T/lora.log" || fail "no new score head under LoRA"
grep -q '"task_type": "SEQ_CLS"' "$T/lora/adapter_config.json" || fail "task_type"
tr -d ' \n' <"$T/lora/adapter_config.json" | grep -q '"modules_to_save":\["classifier","score"\]' || fail "modules_to_save"
grep -q "\"base_model_name_or_path\": \"$T/sft\"" "$T/lora/adapter_config.json" || fail "base_model_name_or_path"
head -c 20000 "$T/lora/adapter_model.safetensors" | grep -q '"base_model.model.score.weight":{"dtype":"F32","shape":\[1,128\]' \
  || fail "base_model.model.score.weight [1, 128]"
head -c 20000 "$T/lora/adapter_model.safetensors" | grep -q 'layers.1.mlp.down_proj.lora_B.weight' || fail "adapters"
[ ! -e "$T/lora/model.safetensors" ] || fail "a LoRA run saves the adapters only"

echo "== the saved adapter reloads to training's rewards: alone (its base_model_name_or_path) or model_path + adapter_path"
for how in "model_path=$T/lora" "model_path=$T/sft adapter_path=$T/lora"; do
  "$R" eval $how eval_dataset_path="$T/pairs_eval.jsonl" max_length=24 >"$T/le.out" 2>"$T/le.log" \
    || { cat "$T/le.log"; fail "reward eval $how"; }
  e=$(sed -n 's/.*"eval_accuracy": \([0-9.]*\).*/\1/p' "$T/le.out")
  m=$(sed -n 's/.*"eval_margin": \([-0-9.e]*\).*/\1/p' "$T/le.out")
  l=$(sed -n 's/.*"eval_loss": \([-0-9.e]*\).*/\1/p' "$T/le.out")
  echo "bin/reward eval $how: accuracy $e, margin $m, loss $l"
  awk -v a="$la" -v e="$e" -v m="$m" -v lm="$lm" -v l="$l" -v ll="$ll" 'BEGIN { d = a - e; dm = m - lm; dl = l - ll
    exit !(d * d < 1e-12 && dm * dm <= 1e-8 * lm * lm + 1e-10 && dl * dl <= 1e-8 * ll * ll + 1e-10) }' \
    || fail "reloaded adapter: accuracy $e margin $m loss $l, training's $la $lm $ll"
done
"$R" score model_path="$T/lora" data="$T/rows.jsonl" max_length=24 >"$T/ls1.jsonl" 2>"$T/ls.log" || { cat "$T/ls.log"; fail "score"; }
"$R" score model_path="$T/sft" adapter_path="$T/lora" data="$T/rows.jsonl" max_length=24 >"$T/ls2.jsonl" 2>"$T/ls.log" \
  || { cat "$T/ls.log"; fail "score with adapter_path"; }
cmp "$T/ls1.jsonl" "$T/ls2.jsonl" || fail "the two ways of naming the adapter score differently"

echo "== use_peft: resume is bit-identical; an adapter continues with its own head"
largs="$common use_peft=true lora_modules_to_save=score learning_rate=2e-3 max_steps=6 save_steps=3 logging_steps=1"
"$R" $largs output_dir="$T/ls1" >"$T/ls1.log" 2>&1 || { cat "$T/ls1.log"; fail "LoRA straight run"; }
stop_and_resume "$T/ls2" "$R" $largs
cmp "$T/ls1/adapter_model.safetensors" "$T/ls2/adapter_model.safetensors" || fail "adapters differ after resuming"
"$R" $common use_peft=true adapter_path="$T/lora" output_dir="$T/lc" max_steps=1 >"$T/lc.log" 2>&1 || { cat "$T/lc.log"; fail "continue adapter"; }
! grep -q "score head: new" "$T/lc.log" || fail "the head of a LoRA reward model was replaced"

echo "== GRPO with the reward model raises its mean reward"
G="$BIN/grpo"
gcommon="configs/grpo.yml model_path=$T/sft dataset_path=$T/we.jsonl per_device_train_batch_size=32 num_generations=8
         max_completion_length=10 logging_steps=1 save_steps=0 learning_rate=1e-4 temperature=1.5"
"$G" $gcommon output_dir="$T/g" max_steps=20 reward_funcs="$T/rm" >"$T/g.log" 2>&1 || { cat "$T/g.log"; fail "grpo with a reward model"; }
r0=$(head -5 "$T/g/metrics.jsonl" | field 'rewards\/rm\/mean' | awk '{s+=$1} END {print s/NR}')
r1=$(tail -5 "$T/g/metrics.jsonl" | field 'rewards\/rm\/mean' | awk '{s+=$1} END {print s/NR}')
echo "rewards/rm/mean: first 5 steps $r0, last 5 steps $r1"
awk -v a="$r0" -v b="$r1" 'BEGIN { exit !(b > a + 0.3) }' || fail "the reward model's mean reward did not rise"
for k in 'rewards/rm/std' 'time/scoring_s'; do grep -q "\"$k\"" "$T/g/metrics.jsonl" || fail "metrics lack $k"; done
grep -q "reward model $T/rm (float32)" "$T/g.log" || fail "the memory plan has no reward-model row"

echo "== GRPO scores with a LoRA reward model named by its adapter directory"
"$G" $gcommon output_dir="$T/gl" max_steps=1 reward_funcs="$T/lora" >"$T/gl.log" 2>&1 || { cat "$T/gl.log"; fail "grpo with a LoRA reward model"; }
grep -q '"rewards/lora/mean"' "$T/gl/metrics.jsonl" || fail "metrics lack rewards/lora/mean"
grep -q "reward model $T/lora (float32)" "$T/gl.log" || fail "the memory plan has no row for the LoRA reward model"

echo "== reward_weights applies; bfloat16 and int8 storage score the same rollouts within rounding"
"$G" $gcommon output_dir="$T/gw" max_steps=1 reward_funcs="$T/rm,length" reward_weights=0.5,0 length_target=3 \
  >"$T/gw.log" 2>&1 || { cat "$T/gw.log"; fail "grpo weighted"; }
rw=$(field reward <"$T/gw/metrics.jsonl" | head -1)
rm_mean=$(field 'rewards\/rm\/mean' <"$T/gw/metrics.jsonl")
awk -v r="$rw" -v m="$rm_mean" 'BEGIN { d = r - 0.5 * m; if (d < 0) d = -d; exit !(d < 1e-4) }' || fail "reward $rw != 0.5 x $rm_mean"
"$G" $gcommon output_dir="$T/gb" max_steps=1 reward_funcs="$T/rm" reward_model_dtype=bfloat16 >"$T/gb.log" 2>&1 \
  || { cat "$T/gb.log"; fail "grpo bf16 reward model"; }
b=$(field 'rewards\/rm\/mean' <"$T/gb/metrics.jsonl")
echo "step-1 rewards/rm/mean: float32 $rm_mean, bfloat16 $b"
awk -v a="$rm_mean" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.05 * (1 + (a < 0 ? -a : a))) }' || fail "bf16 rewards"
"$G" $gcommon output_dir="$T/g8" max_steps=1 reward_funcs="$T/rm" reward_model_dtype=int8 >"$T/g8.log" 2>&1 \
  || { cat "$T/g8.log"; fail "grpo int8 reward model"; }
grep -q "reward model $T/rm (int8)" "$T/g8.log" || fail "the memory plan has no int8 row for the reward model"
i8=$(field 'rewards\/rm\/mean' <"$T/g8/metrics.jsonl")
echo "step-1 rewards/rm/mean: float32 $rm_mean, int8 $i8"
awk -v a="$rm_mean" -v b="$i8" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.1 * (1 + (a < 0 ? -a : a))) }' || fail "int8 rewards"

echo "== bad inputs fail before any work"
mkdir -p "$T/bad2" "$T/nohead" "$T/notok"
cp "$T/rm/"* "$T/bad2/" && sed -i 's/"id2label": {/"id2label": {"1": "LABEL_1", /' "$T/bad2/config.json"
cp "$T/rm/config.json" "$T/nohead/" && cp "$T/sft/model.safetensors" "$T/sft/tokenizer"* "$T/nohead/"
cp "$T/rm/config.json" "$T/rm/model.safetensors" "$T/notok/"
expect 2 "not a \*ForSequenceClassification" "$G" $gcommon output_dir="$T/x" reward_funcs="$T/sft"
expect 2 "num_labels 2" "$G" $gcommon output_dir="$T/x" reward_funcs="$T/bad2"
expect 2 "has no score.weight" "$G" $gcommon output_dir="$T/x" reward_funcs="$T/nohead"
expect 2 "tokenizer cannot be loaded" "$G" $gcommon output_dir="$T/x" reward_funcs="$T/notok"
expect 2 "not a directory" "$G" $gcommon output_dir="$T/x" reward_funcs="$T/nothing/"
expect 2 "\"magic\" does not exist" "$G" $gcommon output_dir="$T/x" reward_funcs=magic
# a reward model where a causal LM belongs: the sampler, GGUF export, a DPO reference
for q in "$BIN/sampler generate model_path=$T/rm prompt=hi" "$BIN/ctune-ckpt gguf in=$T/rm out=$T/rm.gguf"; do
  $q >"$T/lm.log" 2>&1 && fail "accepted a reward model: $q"
  grep -q "reward model" "$T/lm.log" || { cat "$T/lm.log"; fail "no reason given: $q"; }
done
expect 2 "'foo_proj' is not one of q_proj" "$R" $common output_dir="$T/x" use_peft=true lora_target_modules=foo_proj
expect 2 "a reward model has no lm_head" "$R" $common output_dir="$T/x" use_peft=true lora_modules_to_save=lm_head
expect 2 "'score' is a sequence classifier's head; only bin/reward trains one" "$BIN/sft" configs/sft.yml \
  model_path="$T/sft" dataset_path="$T/sft.jsonl" output_dir="$T/x" use_peft=true lora_modules_to_save=score
expect 1 "sequence classifier's head" "$BIN/sampler" generate model_path="$T/sft" adapter_path="$T/lora" prompt=hi
expect 2 "num_vocab_tiling" "$R" $common output_dir="$T/x" num_vocab_tiling=4
"$R" --help | grep -q "^usage: reward" || fail "reward --help"
expect 2 "sequence-classification model" "$BIN/sft" configs/sft.yml model_path="$T/rm" dataset_path="$T/sft.jsonl" output_dir="$T/x"
expect 2 "reward_model_dtype" "$G" $gcommon output_dir="$T/x" reward_funcs="$T/rm" reward_model_dtype=int4
expect 1 "no usable preference pairs" "$R" $common output_dir="$T/x" max_length=8
echo '{"prompt": "a", "chosen": "b", "rejected": "c", "margin": "big"}' >"$T/badm.jsonl"
expect 1 "margin" "$R" $common output_dir="$T/x" dataset_path="$T/badm.jsonl"
echo '{"chosen_ids": [1, 2]}' >"$T/badi.jsonl"
expect 1 "rejected_ids" "$R" $common output_dir="$T/x" dataset_path="$T/badi.jsonl"
expect 2 "data=" "$R" score model_path="$T/rm"
echo "reward_e2e: all passed"
