#!/bin/sh
# The library's floors only ever include downward:
#   base/  <  text/ nn/  <  data/ infer/  <  common/  <  app/  <  executables
# (text/ and nn/ never include each other, nor data/ and infer/). An executable's folder (sft dpo
# grpo reward distill sampler tools) includes the library and its own files, never another
# executable's. And no module (x.c + x.h) reaches itself through its includes: 0 cycles.
# Fails naming the file and the header that breaks a rule, or the modules of a cycle.
cd "$(dirname "$0")/.." || exit 1
LIB="base text nn data infer common app"
EXE="sft dpo grpo reward distill sampler tools tools/ckpt"
floor() {
  case "$1" in
    base) echo 0 ;; text|nn) echo 1 ;; data|infer) echo 2 ;; common) echo 3 ;; app) echo 4 ;; *) echo 9 ;;
  esac
}
bad=0 edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
for dir in $LIB $EXE; do
  [ -d "$dir" ] || continue
  for f in "$dir"/*.c "$dir"/*.h; do
    [ -f "$f" ] || continue
    for h in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f"); do
      # where the compiler finds it: the file's own folder, then -I base text nn data infer common app .
      home="" path=""
      for d in "$dir" $LIB .; do
        [ -f "$d/$h" ] && { path="$d/$h"; break; }
      done
      [ -n "$path" ] || continue  # a system header in quotes
      home=${path%%/*}
      case "$h" in */*) home=${h%%/*} ;; esac
      echo "${f%.*} ${path%.*}" >>"$edges"
      [ "$home" = "$dir" ] || [ "${path%/*}" = "$dir" ] && continue
      case " $EXE " in
        *" $home "*) echo "layers: $f includes $h: an executable's folder ($home/) is not library code"; bad=1; continue ;;
      esac
      if [ "$(floor "$home")" -ge "$(floor "$dir")" ]; then
        echo "layers: $f includes $home/$h (a $dir/ file may include only from the floors below it)"; bad=1
      fi
    done
  done
done
# module cycles: x.c and x.h are one module; a depth-first search over "module -> module" edges
awk '$1 != $2 { e[$1] = e[$1] " " $2; n[$1] = 1; n[$2] = 1 }
  function visit(m,   k, i, parts, c) {
    state[m] = 1; stack[++depth] = m
    k = split(e[m], parts, " ")
    for (i = 1; i <= k; i++) {
      if (state[parts[i]] == 1) {
        c = parts[i]; for (j = depth; j >= 1 && stack[j] != parts[i]; j--) c = stack[j] " -> " c
        print "layers: module cycle: " parts[i] " -> " c; found = 1
      } else if (!state[parts[i]]) visit(parts[i])
    }
    depth--; state[m] = 2
  }
  END { for (m in n) if (!state[m]) visit(m); exit found }' "$edges" || bad=1
# folder cycles among the library's floors follow from the floor rule above
[ $bad = 0 ] && echo "layers: floors $LIB and executables $EXE: no upward or sideways include, no module cycle"
exit $bad
