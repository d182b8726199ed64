# Recomputes GRPO's step metrics from output_dir/completions.jsonl (as TRL defines them)
# and compares them with metrics.jsonl. usage: awk -f completions.awk G completions.jsonl metrics.jsonl
# (the first file is given as the variable G: the group size). Prints each comparison;
# exits 1 on the first mismatch (1e-5 relative, metrics are written with 8 digits).
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
  gi = (rows[st] - 1) % G; grp_r[gi] = r; grp_a[gi] = a
  if (gi == G - 1) {  # a whole group: A = (r - mean) / (std + 1e-4), or 0 when all equal
    m = 0; sq = 0; same = 1
    for (i = 0; i < G; i++) { m += grp_r[i]; sq += grp_r[i] * grp_r[i]; same = same && grp_r[i] == grp_r[0] }
    sd = std(m, sq, G); m /= G
    for (i = 0; i < G; i++) check(st, "advantage", same ? 0 : (grp_r[i] - m) / (sd + 1e-4), grp_a[i])
  }
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
END { printf "%d values of %d steps match\n", checked, steps; exit bad || !steps }
