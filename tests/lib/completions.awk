# Recomputes GRPO's step metrics from output_dir/completions.jsonl (as TRL defines them)
# and compares them with metrics.jsonl, and each row's advantage with the one recomputed
# from the step's logged rewards (and, for reinforce_baseline, completion lengths).
# usage: awk -v G=8 [-v E=rloo] [-v NORM=1] -f completions.awk completions.jsonl metrics.jsonl
# (G: the group size; E: advantage_estimator, group_norm when not given; NORM=1: rloo's
# normalize_advantages). Prints each mismatch; exits 1 after any (1e-5 relative, metrics
# are written with 8 digits).
function num(line, key,    i, s) {  # the number after "key": (the row's fields after its text)
  i = index(line, "\"" key "\":")
  if (!i) return "none"
  s = substr(line, i + length(key) + 3)
  match(s, /^-?[0-9.e+-]+|^null/)
  return substr(s, 1, RLENGTH)
}
function check(step, name, want, got,    d) {
  if (got == "none") { printf "step %d: %s missing\n", step, name; bad = 1; return }
  d = want - got; if (d < 0) d = -d
  if (d > 1e-5 * (want < 0 ? -want : want) + 1e-7) { printf "step %d: %s %s, recomputed %s\n", step, name, got, want; bad = 1 }
  checked++
}
function std(s, sq, n) { return n > 1 ? sqrt((sq - s * s / n) / (n - 1) > 0 ? (sq - s * s / n) / (n - 1) : 0) : 0 }
FNR == NR {  # completions.jsonl
  st = num($0, "step"); tail = substr($0, index($0, "\"completion_ids\":"))
  ids = substr(tail, 19, index(tail, "]") - 19); n = ids == "" ? 0 : split(ids, _, ",")
  tail = substr($0, index($0, "\"finish_reason\":"))
  rows[st]++; len[st] += n
  if (!(st in mn) || n < mn[st]) mn[st] = n
  if (!(st in mx) || n > mx[st]) mx[st] = n
  if (tail ~ /^"finish_reason":"length"/) clip[st]++
  else { term[st]++; tlen[st] += n; if (!(st in tmn) || n < tmn[st]) tmn[st] = n; if (!(st in tmx) || n > tmx[st]) tmx[st] = n }
  for (k = 1; k <= 2; k++) {
    v = num(tail, f[k] = (k == 1 ? "length" : "accuracy"))
    if (v != "none" && v != "null") { rs[st, k] += v; rsq[st, k] += v * v; rn[st, k]++ }
  }
  r = num(tail, "reward"); a = num(tail, "advantage")
  rsum[st] += r
  i = rows[st]; rw[st, i] = r; ad[st, i] = a; ln[st, i] = n
  next
}
/"reward"/ {  # metrics.jsonl
  st = num($0, "step"); if (!(st in rows)) next
  c = rows[st]; t = term[st] + 0
  check(st, "reward", rsum[st] / c, num($0, "reward"))
  check(st, "completions/mean_length", len[st] / c, num($0, "completions/mean_length"))
  check(st, "completions/min_length", mn[st], num($0, "completions/min_length"))
  check(st, "completions/max_length", mx[st], num($0, "completions/max_length"))
  check(st, "completions/clipped_ratio", clip[st] / c, num($0, "completions/clipped_ratio"))
  check(st, "completions/mean_terminated_length", t ? tlen[st] / t : 0, num($0, "completions/mean_terminated_length"))
  check(st, "completions/min_terminated_length", t ? tmn[st] : 0, num($0, "completions/min_terminated_length"))
  check(st, "completions/max_terminated_length", t ? tmx[st] : 0, num($0, "completions/max_terminated_length"))
  for (k = 1; k <= 2; k++) {
    check(st, "rewards/" f[k] "/mean", rs[st, k] / rn[st, k], num($0, "rewards/" f[k] "/mean"))
    check(st, "rewards/" f[k] "/std", std(rs[st, k], rsq[st, k], rn[st, k]), num($0, "rewards/" f[k] "/std"))
  }
  steps++
}
# The advantages of step st's rows from their rewards, as advantage_estimator E says:
# group_norm (r - mean) / (Bessel std + 1e-4); rloo r - mean of the others; reinforce_baseline
# r - mean; a group whose rewards are all equal gets 0. Then rloo with NORM whitens over the
# step's completions (Bessel std + 1e-4), reinforce_baseline over its tokens (each row
# weighs its length; population variance held at 1e-8 or more).
function step_advantages(st,    g, i, m, sq, sd, same, w, mu, v, r) {
  for (g = 0; g < rows[st]; g += G) {
    m = 0; sq = 0; same = 1
    for (i = 1; i <= G; i++) { m += rw[st, g + i]; sq += rw[st, g + i] ^ 2; same = same && rw[st, g + i] == rw[st, g + 1] }
    sd = std(m, sq, G)
    for (i = 1; i <= G; i++) {
      r = rw[st, g + i]
      if (same) want[g + i] = 0
      else if (E == "rloo") want[g + i] = r - (m - r) / (G - 1)
      else if (E == "reinforce_baseline") want[g + i] = r - m / G
      else want[g + i] = (r - m / G) / (sd + 1e-4)
    }
  }
  if (!(E == "reinforce_baseline" || (E == "rloo" && NORM))) return
  w = 0; mu = 0; v = 0
  for (i = 1; i <= rows[st]; i++) { g = E == "rloo" ? 1 : ln[st, i]; w += g; mu += g * want[i] }
  if (w == 0) return
  mu /= w
  for (i = 1; i <= rows[st]; i++) { g = E == "rloo" ? 1 : ln[st, i]; v += g * (want[i] - mu) ^ 2 }
  sd = E == "rloo" ? (w > 1 ? sqrt(v / (w - 1)) : 0) + 1e-4 : sqrt(v / w > 1e-8 ? v / w : 1e-8)
  for (i = 1; i <= rows[st]; i++) want[i] = (want[i] - mu) / sd
}
END {
  for (st in rows) {
    step_advantages(st)
    for (i = 1; i <= rows[st]; i++) check(st, "advantage", want[i], ad[st, i])
  }
  printf "%d values of %d steps match\n", checked, steps; exit bad || !steps }
