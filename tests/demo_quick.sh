#!/bin/sh
# make demo's quick form (scripts/demo.sh BIN quick): every stage, binary and config the full demo
# uses, with a tenth of the data and a few steps each, in a scratch directory. The full run's table
# (README) is not checked here: its figures need the full step counts. What is checked: the demo
# exits 0, prints every row of its results table with figures, writes every model and the report page.
# A key the configs or the script use that a trainer refuses (as eval_steps without an eval set once
# did) fails here.
. tests/lib/common.sh
start_test demo_quick
top=$(pwd) BIN=$(cd "$BIN" && pwd)
ln -s "$top/configs" "$T/configs"
(cd "$T" && sh "$top/scripts/demo.sh" "$BIN" quick) >"$T/demo.log" 2>&1 || { tail -n 60 "$T/demo.log"; fail "make demo (quick) failed"; }
cat "$T/demo.log" | sed -n '/^demo results/,$p'
for row in "0. before training" "1. SFT, 12 steps" "2. SFT + DPO (RPO), 4 steps" "3. SFT + GRPO, 2 steps" \
           "4. distilled student, 6 steps" "the same student without a teacher"; do
  grep -q -- "$row .*[0-9]%" "$T/demo.log" || { cat "$T/demo.log"; fail "results table lacks row '$row'"; }
done
grep -q "reward accuracy [0-9.]*% -> [0-9.]*%" "$T/demo.log" || fail "DPO row lacks its held-out reward accuracy"
grep -q "rewards/remote/mean\":[-0-9.]" "$T/demo.log" || fail "the remote-reward GRPO run printed no reward"
grep -q "half the width: [0-9.]*M parameters; the teacher [0-9.]*M" "$T/demo.log" || fail "parameter counts missing"
grep -q "5. SFT + GRPO with the calculator, 2 steps .*[0-9.]*% -> [0-9.]*%   (tool calls per completion [0-9.]* -> [0-9.]*)" \
  "$T/demo.log" || fail "no tool-use row"
for m in init sft dpo grpo grpo-remote distill student-sft sft-tools grpo-tools; do
  [ -s "$T/demo-out/$m/model.safetensors" ] || fail "demo-out/$m/model.safetensors missing"
done
grep -q "<svg" "$T/demo-out/report.html" || fail "report page has no chart"
grep -q "tools/call_frequency" "$T/demo-out/report-tools.html" || fail "the tool-use report has no tools/call_frequency chart"
grep -q "demo time: [0-9]* s wall clock" "$T/demo.log" || fail "no wall-clock line"
echo "demo (quick): all checks passed"
