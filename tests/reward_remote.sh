#!/bin/sh
# bin/grpo's remote reward end to end, against the bundled server: the API key named by
# reward_api_key_env is sent and accepted; a missing or wrong key is HTTP 401 and stops
# the run with a one-line error; the key is never in a log or in output_dir/config.yml;
# an unset variable is a config error before any rollout; a reply with the wrong count or
# a string reward is a clear error after its retries (or NaN with reward_failure=nan); a
# non-finite reward (Python's bare NaN, -Infinity; 1e400) stops the run without a retry
# (or is NaN for that completion alone with reward_failure=nan), and null is NaN; an
# https URL to a server without a trusted certificate fails with a TLS error, and one whose
# certificate is trusted through CURL_CA_BUNDLE scores the run.
. tests/lib/common.sh
start_test reward_remote

"$BIN/ctune-demo-data" reverse "$T/sft.jsonl" "$T/prompts.jsonl" 300 32 31 6 >/dev/null
"$BIN/sft" configs/sft.yml dataset_path="$T/sft.jsonl" output_dir="$T/sft" max_steps=10 \
  model.hidden_size=64 model.intermediate_size=128 model.num_hidden_layers=2 \
  model.num_attention_heads=4 model.num_key_value_heads=2 max_length=24 \
  per_device_train_batch_size=16 save_steps=0 >"$T/sft.log" 2>&1 || { cat "$T/sft.log"; fail "sft"; }
G="$BIN/grpo"
common="configs/grpo.yml model_path=$T/sft dataset_path=$T/prompts.jsonl answer_field=completion
        per_device_train_batch_size=8 num_generations=4 max_completion_length=6 logging_steps=1
        save_steps=0 max_steps=1 reward_funcs=remote reward_retries=1 reward_backoff=0.01"
# keys no log or file may hold
export CT_REWARD_KEY="ct-e2e-key-$$-9c41d7" CT_WRONG_KEY="ct-e2e-wrong-$$-3be802"
secret_free() {  # secret_free FILE...: neither key occurs in any of the files
  if grep -l -e "$CT_REWARD_KEY" -e "$CT_WRONG_KEY" "$@" 2>/dev/null; then fail "a key leaked into the files above"; fi
}
one_line() {  # one_line PATTERN: exactly one line of the last expect's log holds PATTERN
  [ "$(grep -c -- "$1" "$T/expect.log")" = 1 ] || { cat "$T/expect.log"; fail "'$1' is not on one line"; }
}
start_server() {  # start_server MODE [ARGS...]: sets $server and $port
  mode=$1; shift
  "$BIN/ctune-reward-server" port=0 mode="$mode" "$@" >"$T/port" 2>>"$T/server.log" &
  server=$!
  i=0
  while [ ! -s "$T/port" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
  port=$(head -1 "$T/port")
  [ -n "$port" ] || fail "the reward server did not start"
  url="http://127.0.0.1:$port/score"
}
stop_server() { kill $server; wait $server 2>/dev/null || true; server=""; rm -f "$T/port"; }
posts() { grep -c "POST /score" "$T/server.log" || true; }

echo "== the key is sent: the server (which requires it) scores every batch"
start_server ok api_key_env=CT_REWARD_KEY
"$G" $common output_dir="$T/ok" max_steps=2 reward_url="$url" reward_api_key_env=CT_REWARD_KEY \
  >"$T/ok.log" 2>&1 || { cat "$T/ok.log"; fail "a run with the right key"; }
grep -q '"rewards/remote/mean"' "$T/ok/metrics.jsonl" || fail "no remote reward metric"
[ "$(posts)" = 2 ] || { cat "$T/server.log"; fail "expected 2 requests"; }
grep -q "no valid API key, 401" "$T/server.log" && fail "the server refused the key"
grep -q "reward_api_key_env: CT_REWARD_KEY" "$T/ok/config.yml" || fail "config.yml lacks the variable's name"
secret_free "$T/ok.log" "$T/ok/config.yml" "$T/ok/metrics.jsonl" "$T/server.log"

echo "== no key, or the wrong one: HTTP 401 stops the run, with no key in its message"
expect 1 "HTTP 401 after 1 attempt" "$G" $common output_dir="$T/nokey" reward_url="$url"
one_line "HTTP 401"
grep -q "set reward_api_key_env" "$T/expect.log" || fail "no hint to set reward_api_key_env"
expect 1 "HTTP 401 after 1 attempt" "$G" $common output_dir="$T/wrong" reward_url="$url" \
  reward_api_key_env=CT_WRONG_KEY
one_line "HTTP 401"
grep -q "refused the API key in CT_WRONG_KEY" "$T/expect.log" || fail "the message does not name the variable"
cp "$T/expect.log" "$T/wrong.log"
[ -f "$T/wrong/config.yml" ] || fail "no config.yml in output_dir"
secret_free "$T/wrong.log" "$T/wrong/config.yml" "$T/server.log"
grep -c "no valid API key, 401" "$T/server.log" | grep -qx 2 || { cat "$T/server.log"; fail "expected two 401s"; }

echo "== an unset or empty variable is a config error before any rollout"
before=$(posts)
expect 2 "command line: key 'reward_api_key_env': environment variable CT_NO_SUCH_KEY is unset" \
  env -u CT_NO_SUCH_KEY "$G" $common output_dir="$T/unset" reward_url="$url" reward_api_key_env=CT_NO_SUCH_KEY
one_line "CT_NO_SUCH_KEY"
expect 2 "environment variable CT_EMPTY_KEY is empty" \
  env CT_EMPTY_KEY= "$G" $common output_dir="$T/unset" reward_url="$url" reward_api_key_env=CT_EMPTY_KEY
[ "$(posts)" = "$before" ] || fail "a request was sent despite the config error"
[ ! -e "$T/unset/metrics.jsonl" ] || fail "the run started despite the config error"
stop_server

echo "== bad replies: clear errors naming the URL, or NaN rewards with reward_failure=nan"
check_bad() {  # check_bad MODE PATTERN
  start_server "$1"
  expect 1 "$2" "$G" $common output_dir="$T/bad" reward_url="$url"
  one_line "$2"
  grep -q "remote reward $url" "$T/expect.log" || fail "the $1 error does not name the URL"
  "$G" $common output_dir="$T/nan.$1" reward_url="$url" reward_failure=nan >"$T/nan.$1.log" 2>&1 \
    || { cat "$T/nan.$1.log"; fail "reward_failure=nan with mode $1"; }
  # every reward NaN: the step has none to average
  grep -q '"rewards/remote/mean"' "$T/nan.$1/metrics.jsonl" && fail "mode $1: a reward was not NaN"
  stop_server
}
check_bad count "wrong reward count after 2 attempts: reply has 7 rewards, expected 8"
check_bad string 'reward 1 of 8 is "NaN" (a string)'

echo "== non-finite rewards (Python's json.dumps writes bare NaN, -Infinity): no retry, reward_failure decides"
check_nonfinite() {  # check_nonfinite MODE TEXT
  start_server "$1"
  before=$(posts)
  expect 1 "non-finite reward after 1 attempt: reward 1 of 8 is $2; reward_failure: nan would leave such" \
    "$G" $common output_dir="$T/bad" reward_url="$url"
  one_line "non-finite reward"
  grep -q "remote reward $url" "$T/expect.log" || fail "the $1 error does not name the URL"
  [ "$(posts)" = $((before + 1)) ] || fail "mode $1: a reply that holds $2 was retried"
  "$G" $common output_dir="$T/nan.$1" reward_url="$url" reward_failure=nan >"$T/nan.$1.log" 2>&1 \
    || { cat "$T/nan.$1.log"; fail "reward_failure=nan with mode $1"; }
  # only that completion's reward is NaN: the other seven are averaged
  grep -q '"rewards/remote/mean"' "$T/nan.$1/metrics.jsonl" || fail "mode $1: the other rewards were dropped"
  stop_server
}
check_nonfinite nan NaN
check_nonfinite inf -Infinity
check_nonfinite nonfinite 1e400
echo "== a null reward is NaN (as TRL maps a reward function's None) even with reward_failure: error"
start_server null
"$G" $common output_dir="$T/null" reward_url="$url" >"$T/null.log" 2>&1 || { cat "$T/null.log"; fail "a null reward stopped the run"; }
grep -q '"rewards/remote/mean"' "$T/null/metrics.jsonl" || fail "a null reward dropped the others"
stop_server

echo "== https: certificates are checked"
start_server ok
expect 1 "TLS handshake failed" "$G" $common output_dir="$T/tls" reward_url="https://127.0.0.1:$port/score"
one_line "TLS handshake failed"
stop_server
if command -v openssl >/dev/null; then
  # a TLS server whose certificate is self-signed: the connection must be refused
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 -keyout "$T/key.pem" \
    -out "$T/cert.pem" >"$T/openssl.log" 2>&1 || { cat "$T/openssl.log"; fail "openssl req"; }
  openssl s_server -accept 127.0.0.1:0 -cert "$T/cert.pem" -key "$T/key.pem" -www \
    >"$T/s_server.out" 2>&1 &
  server=$!
  i=0
  while ! grep -q "^ACCEPT" "$T/s_server.out" && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
  port=$(sed -n 's/^ACCEPT .*:\([0-9]*\)$/\1/p' "$T/s_server.out")
  [ -n "$port" ] || { cat "$T/s_server.out"; fail "openssl s_server did not start"; }
  expect 1 "TLS certificate not trusted after 1 attempt" "$G" $common output_dir="$T/tls" \
    reward_url="https://127.0.0.1:$port/score" reward_api_key_env=CT_REWARD_KEY
  one_line "TLS certificate"
  secret_free "$T/expect.log"
  stop_server
  # the same certificate trusted through CURL_CA_BUNDLE: a node https server that checks
  # the key and scores every completion 1 answers, and the run trains on its rewards
  cat >"$T/https.mjs" <<'EOF2'
import https from "node:https";
import fs from "node:fs";
const [cert, key, portFile, keyEnv] = process.argv.slice(2);
const server = https.createServer({ cert: fs.readFileSync(cert), key: fs.readFileSync(key) }, (req, res) => {
  let body = "";
  req.on("data", (d) => (body += d));
  req.on("end", () => {
    const ok = req.headers.authorization === `Bearer ${process.env[keyEnv]}`;
    res.writeHead(ok ? 200 : 401, { "Content-Type": "application/json" });
    res.end(ok ? JSON.stringify({ rewards: JSON.parse(body).query.map(() => 1) }) : "{}");
    console.error(`POST ${req.url} ${ok ? 200 : 401}`);
  });
});
server.listen(0, "127.0.0.1", () => fs.writeFileSync(portFile, `${server.address().port}\n`));
EOF2
  if command -v node >/dev/null; then
    node "$T/https.mjs" "$T/cert.pem" "$T/key.pem" "$T/port" CT_REWARD_KEY 2>"$T/https.log" &
    server=$!
    i=0
    while [ ! -s "$T/port" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
    port=$(head -1 "$T/port")
    [ -n "$port" ] || { cat "$T/https.log"; fail "the node https server did not start"; }
    CURL_CA_BUNDLE="$T/cert.pem" "$G" $common output_dir="$T/https" reward_url="https://127.0.0.1:$port/score" \
      reward_api_key_env=CT_REWARD_KEY >"$T/https-run.log" 2>&1 || { cat "$T/https-run.log"; fail "https with a trusted certificate"; }
    grep -q '"rewards/remote/mean":1[,}.]' "$T/https/metrics.jsonl" || { cat "$T/https/metrics.jsonl"; fail "the https server's rewards (all 1) are not in the metrics"; }
    grep -q "POST /score 200" "$T/https.log" || { cat "$T/https.log"; fail "the https server saw no accepted request"; }
    secret_free "$T/https-run.log" "$T/https/config.yml" "$T/https/metrics.jsonl"
    stop_server
  else
    echo "(no node: the trusted https case is skipped)"
  fi
else
  echo "(no openssl command: the self-signed certificate case is skipped)"
fi
echo "remote reward end-to-end: all checks passed"
