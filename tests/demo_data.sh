#!/bin/sh
# The demo's task generator: `reverse ... noise` puts that fraction of mistaken
# demonstrations into the training rows only (the held-out rows stay right), and
# noise 0 (the default) writes only right answers. Run by tests/run.sh.
. tests/lib/common.sh
start_test demo_data

# wrong FILE: how many rows' completion is not the prompt's word written backwards
wrong() {
  awk -F'"' '{ w = substr($4, 9, length($4) - 9); r = ""
               for (i = length(w); i > 0; i--) r = r substr(w, i, 1)
               if (r != $8) n++ } END { print n + 0 }' "$1"
}

echo "== noise 0.1: about a tenth of the training rows are mistakes, no held-out row is"
"$BIN/ctune-demo-data" reverse "$T/train.jsonl" "$T/eval.jsonl" 4000 300 5 8 0.1
n=$(wrong "$T/train.jsonl")
[ "$n" -ge 320 ] && [ "$n" -le 480 ] || fail "$n of 4000 training rows are wrong (expected about 400)"
[ "$(wrong "$T/eval.jsonl")" = 0 ] || fail "held-out rows carry mistakes"

echo "== without noise every row is right"
"$BIN/ctune-demo-data" reverse "$T/train.jsonl" "$T/eval.jsonl" 4000 300 5 8
[ "$(wrong "$T/train.jsonl")" = 0 ] || fail "noise 0 wrote mistakes"

echo "== noise outside [0, 1) or on another task is refused, saying the ranges"
expect 2 "noise in \[0, 1) and for reverse and multiply-tool only" "$BIN/ctune-demo-data" reverse "$T/a" "$T/b" 10 5 1 8 1.5
expect 2 "noise in \[0, 1) and for reverse and multiply-tool only" "$BIN/ctune-demo-data" addition "$T/a" "$T/b" 10 5 1 3 0.1

echo "== multiply-tool: right products, demonstrations with the calculator or (noise) a wrong guess"
"$BIN/ctune-demo-data" multiply-tool "$T/mt.jsonl" "$T/mte.jsonl" 400 50 5 3 0.25
n=$(grep -c '<tool_call>' "$T/mt.jsonl")
[ "$n" -ge 250 ] && [ "$n" -le 350 ] || fail "$n of 400 demonstrations call the calculator (expected about 300)"
# every prompt's answer is its product; every calculator demonstration answers its tool's result
sed 's/.*"content": "\([0-9]*\)\*\([0-9]*\)=".*"answer": "\([0-9]*\)".*/\1 \2 \3/' "$T/mte.jsonl" |
  awk '$1 * $2 != $3 || length($1) != 3 { bad++ } END { exit bad > 0 || NR != 50 }' || fail "a held-out answer is not the product"
grep '<tool_call>' "$T/mt.jsonl" | sed 's/.*"expression\\": \\"\([0-9]*\)\*\([0-9]*\)\\".*"tool", "name": "calculator", "content": "\([0-9]*\)"}, {"role": "assistant", "content": "\([0-9]*\)".*/\1 \2 \3 \4/' |
  awk '$1 * $2 != $3 || $3 != $4 { bad++ } END { exit bad > 0 || NR == 0 }' || fail "a calculator demonstration is wrong"

echo "== guess-env: binary-search games that end on the target; rows name targets in 1..100"
"$BIN/ctune-demo-data" guess-env "$T/ge.jsonl" "$T/gee.jsonl" 50 20 5
[ "$(grep -c '"Guess my number from 1 to 100."' "$T/ge.jsonl")" = 50 ] || fail "a game does not start with the server's line"
grep -q '^{"target": \(100\|[1-9][0-9]\?\)}$' "$T/gee.jsonl" && [ "$(wc -l <"$T/gee.jsonl")" = 20 ] || fail "bad target rows"
! grep -q '"Higher."}]}$\|"Lower."}]}$' "$T/ge.jsonl" || fail "a game ends on the user's line, not the right guess"

echo "== name=value arguments (the usage's form) equal the positional ones; a bad one is named"
"$BIN/ctune-demo-data" reverse "$T/p.jsonl" "$T/pe.jsonl" 50 7 5 6 0.1
"$BIN/ctune-demo-data" reverse "$T/n.jsonl" "$T/ne.jsonl" noise=0.1 seed=5 n_eval=7 max_len=6 n_train=50
cmp "$T/p.jsonl" "$T/n.jsonl" && cmp "$T/pe.jsonl" "$T/ne.jsonl" || fail "name=value arguments gave other rows"
"$BIN/ctune-demo-data" reverse "$T/n.jsonl" "$T/ne.jsonl" 50 7 6 6 0.1
cmp -s "$T/p.jsonl" "$T/n.jsonl" && fail "seed 6 gave the rows of seed 5"
expect 2 "seed: 'x' is not a whole number" "$BIN/ctune-demo-data" reverse "$T/a" "$T/b" seed=x
expect 2 "n_train: '2.5' is not a whole number" "$BIN/ctune-demo-data" reverse "$T/a" "$T/b" n_train=2.5
expect 2 "'sed=5': expected one of n_train=" "$BIN/ctune-demo-data" reverse "$T/a" "$T/b" sed=5
expect 2 "'6': expected at most 5 numbers" "$BIN/ctune-demo-data" reverse "$T/a" "$T/b" 1 2 3 4 5 6
echo "PASS demo_data"
