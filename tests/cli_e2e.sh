#!/bin/sh
# The command line as a user meets it: values read as YAML, trainer configs given to the
# sampler, TRL key names, every bad key reported at once, --help on every binary, and
# config.json values kept as written. Run by tests/run.sh (CT_BIN = binaries).
. tests/lib/common.sh
start_test cli_e2e

echo "== config.json keeps rms_norm_eps as given (no float32 noise)"
"$BIN/ctune-demo-data" reverse "$T/train.jsonl" "$T/eval.jsonl" 8 4 7 6
"$BIN/sft" configs/sft.yml dataset_path="$T/train.jsonl" output_dir="$T/eps" max_steps=1 \
  model.hidden_size=32 model.intermediate_size=64 model.num_hidden_layers=1 model.num_attention_heads=2 \
  model.rms_norm_eps=1e-6 max_length=24 save_steps=0 per_device_train_batch_size=16 >"$T/eps.log" 2>&1 || { cat "$T/eps.log"; fail "training"; }
grep '"rms_norm_eps"' "$T/eps/config.json"
grep -Eq '"rms_norm_eps": 1e-0?6,' "$T/eps/config.json" || fail "config.json: rms_norm_eps is not 1e-06"
grep -Eq '"rope_theta": 10000(\.0)?,' "$T/eps/config.json" || fail "config.json: rope_theta is not 10000"


echo "== the log says what a step holds when the data is smaller than a step"
grep -q "training 1 step of 8 sequences each: the data holds 8, fewer than a full step's 16" "$T/eps.log" \
  || { grep training "$T/eps.log"; fail "the plan line does not say a step holds the 8 rows"; }

echo "== a sub-command survives the restart that picks OpenBLAS's kernel (the restart re-ran argv shifted past it)"
expect 2 "eval: model_path=DIR (a reward model) is required" env -u OPENBLAS_CORETYPE CT_BLAS_FORCE_RESTART=1 "$BIN/reward" eval
grep -q "restarting with OPENBLAS_CORETYPE=" "$T/expect.log" || fail "CT_BLAS_FORCE_RESTART=1 did not restart"
expect 2 "precompute needs teacher_logits_path" env -u OPENBLAS_CORETYPE CT_BLAS_FORCE_RESTART=1 "$BIN/distill" precompute configs/distill.yml \
  dataset_path="$T/train.jsonl" teacher_path="$T/eps" model_path="$T/eps" max_length=24

echo "== --help and -h on every binary; no arguments prints the usage"
for b in sft dpo grpo distill sampler reward ctune-config ctune-ckpt ctune-tokenize ctune-demo-data \
         ctune-report ctune-reward-server ctune-bench ctune-grpo-replay; do
  for h in --help -h; do
    "$BIN/$b" $h >"$T/help.out" 2>"$T/help.err" || { cat "$T/help.err"; fail "$b $h exited non-zero"; }
    head -1 "$T/help.out" | grep -q "^usage: $b " || fail "$b $h printed no usage of its own on stdout"
  done
done
"$BIN/sft" --help >"$T/help.out"
grep -q "dataset_path=\"\"  (required)" "$T/help.out" || fail "sft --help lacks dataset_path (required)"
grep -q "^  packing=false" "$T/help.out" || fail "sft --help lacks packing and its default"
grep -q "configs/base.yml" "$T/help.out" || fail "sft --help does not say where the other keys are"
"$BIN/dpo" -h | grep -q "^  loss_type=\[sigmoid\]" || fail "dpo -h lacks loss_type"
"$BIN/distill" precompute --help | grep -q "^  teacher_path=" || fail "distill precompute --help lacks teacher_path"
"$BIN/sampler" generate --help | grep -q "^  stop=\[\]" || fail "sampler generate --help lacks stop"
expect 2 "^usage: sft" "$BIN/sft"
expect 2 "^usage: grpo" "$BIN/grpo"
expect 2 "^usage: sampler" "$BIN/sampler"

echo "== command-line values are YAML where quoted or a list"
R="$BIN/ctune-config resolve sampler"
$R 'stop=["e", "a"]' | grep -q '^stop: \[e, a\]' || fail "stop=[\"e\", \"a\"] kept its quotes"
$R 'stop=["\n"]' | grep -q '^stop: \["\\n"\]' || fail "stop=[\"\\n\"] is not a newline"
$R 'stop=[\n]' | grep -q '^stop: \["\\\\n"\]' || fail "stop=[\\n] is not backslash-n"
$R 'stop=["a,b"]' | grep -q '^stop: \["a,b"\]' || fail "stop=[\"a,b\"] is not one string"
$BIN/ctune-config resolve sft 'output_dir="my out"' | grep -q '^output_dir: "my out"' || fail "output_dir kept its quotes"
expect 2 "command line: key 'output_dir': YAML syntax error" "$BIN/sft" dataset_path=x 'output_dir="my out'
expect 2 "key 'eval_steps' evaluates on eval_dataset_path, which is not set" "$BIN/sft" dataset_path=x eval_steps=5
expect 2 "key 'eval_on_start' evaluates on eval_dataset_path" "$BIN/grpo" dataset_path=x eval_on_start=true

echo "== TRL names, and every bad key at once"
"$BIN/sft" configs/sft.yml dataset_path="$T/train.jsonl" output_dir="$T/trl" max_steps=2 max_seq_length=20 \
  per_gpu_train_batch_size=4 save_strategy=no eval_strategy=steps optim=adamw_torch torch_dtype=float32 \
  run_name="tiny run" model.hidden_size=32 model.intermediate_size=64 model.num_hidden_layers=1 \
  model.num_attention_heads=2 >"$T/trl.log" 2>&1 || { cat "$T/trl.log"; fail "training with TRL names"; }
grep -q '^max_length: 20  # command line' "$T/trl/config.yml" || fail "max_seq_length did not set max_length"
grep -q '^per_device_train_batch_size: 4' "$T/trl/config.yml" || fail "per_gpu_train_batch_size ignored"
grep -q '^save_steps: 0' "$T/trl/config.yml" || fail "save_strategy=no did not turn checkpoints off"
grep -q '^run_name: "tiny run"' "$T/trl/config.yml" || fail "run_name is not in config.yml"
printf 'dataset_path: x.jsonl\nseed: abc\nevaluation_strategy: epoch\nfp16: true\n' >"$T/bad.yml"
expect 2 "bad.yml:2: key 'seed'" "$BIN/sft" "$T/bad.yml" optim=sgd torch_dtype=bfloat16 lerning_rate=1
for pat in "bad.yml:3: key 'evaluation_strategy': 'epoch'" "bad.yml:4: key 'fp16'" "key 'optim': 'sgd'" \
           "key 'torch_dtype': 'bfloat16'" "did you mean 'learning_rate'"; do
  grep -q "$pat" "$T/expect.log" || { cat "$T/expect.log"; fail "the bad-key report lacks: $pat"; }
done
[ "$(wc -l <"$T/expect.log")" -ge 6 ] || { cat "$T/expect.log"; fail "expected one line per bad key"; }

echo "== the sampler takes its keys from a trainer's yml or a run's config.yml"
for yml in configs/sft.yml "$T/eps/config.yml"; do
  "$BIN/sampler" generate "$yml" model_path="$T/eps" prompt="abc" max_new_tokens=3 temperature=0 \
    >"$T/gen.out" 2>"$T/gen.err" || { cat "$T/gen.err"; fail "sampler generate $yml"; }
  grep -q "skipped keys the sampler does not use: .*dataset_path" "$T/gen.err" \
    || { cat "$T/gen.err"; fail "no line naming the skipped keys for $yml"; }
  [ "$(grep -c skipped "$T/gen.err")" = 1 ] || fail "the skipped keys take more than one line"
done
expect 2 "key 'dataset_path' does not apply to sampler" "$BIN/sampler" generate model_path="$T/eps" \
  prompt=abc dataset_path=x.jsonl
"$BIN/sampler" generate model_path="$T/eps" prompt="abc" max_new_tokens=4 temperature=0 'stop=["e", "a"]' \
  >/dev/null 2>"$T/gen.err" || { cat "$T/gen.err"; fail "generate with a YAML stop list"; }

echo "== score takes prompt/completion rows"
printf '{"prompt": "ab", "completion": "ba"}\n' >"$T/rows.jsonl"
"$BIN/sampler" score model_path="$T/eps" data="$T/rows.jsonl" >"$T/score.out" 2>"$T/score.err" \
  || { cat "$T/score.err"; fail "score"; }
grep -q '"logp"' "$T/score.out" || fail "score wrote no logp"

echo "all cli_e2e checks passed"
