#!/bin/sh
# The library's layers only ever include downward:
#   base/ <- text/, nn/ <- sampler/ (the engine library) <- common/ <- trainers and tools.
# Fails naming the file and the header that reaches up (or sideways between text/ and nn/).
cd "$(dirname "$0")/.." || exit 1
allowed() {  # folder -> folders its files may include from
  case "$1" in
    base) echo "base" ;;
    text) echo "base text" ;;
    nn) echo "base nn" ;;
    sampler) echo "base text nn sampler" ;;
    common) echo "base text nn sampler common" ;;
  esac
}
bad=0
for dir in base text nn sampler common; do
  ok=$(allowed $dir)
  for f in $dir/*.c $dir/*.h; do
    case "$f" in sampler/main.c|sampler/bench.c) continue ;; esac  # the sampler executable
    for h in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f"); do
      home=""
      for d in base text nn sampler common; do [ -f "$d/$h" ] && home=$d; done
      [ -n "$home" ] || continue  # a trainer-local header ("dpo/loss.h") is checked below
      case " $ok " in *" $home "*) ;; *) echo "layers: $f includes $home/$h (a $dir/ file may include only: $ok)"; bad=1 ;; esac
    done
    if grep -q '^#include "[a-z]*/' "$f"; then echo "layers: $f includes a trainer's header"; bad=1; fi
  done
done
exit $bad
