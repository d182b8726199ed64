#!/bin/sh
# A full disk: a save whose size does not fit the free space is refused before anything
# is written ("No space left on device (N MB free, the checkpoint needs M MB)"); a write
# that fails says errno's text; either way the previous checkpoint stays intact, nothing
# of the failed save is left behind, and the run resumes from the previous checkpoint.
# How the full disk is made, so that it runs on any CI machine: CT_DISK_FREE_MB (a test
# hook: the free space the check sees) for the check; RLIMIT_FSIZE (`ulimit -f`, with
# SIGXFSZ ignored) for a write that really fails (EFBIG) after the check passed; and,
# where user namespaces allow an unprivileged mount, a real 1 MB tmpfs (mount needs
# root, which CI containers rarely grant; elsewhere that part says it is skipped).
. tests/lib/common.sh
start_test disk_full

micro_sft
S="$BIN/sft"
tiny="$tiny save_steps=2"
"$S" $tiny output_dir="$T/o" max_steps=2 >"$T/first.log" 2>&1 || { cat "$T/first.log"; fail "first run"; }

# unchanged DIR: checkpoint-2 as saved, the only checkpoint, no save left half-done
unchanged() {
  diff -r "$1/checkpoint-2" "$T/c2" >/dev/null || fail "checkpoint-2 changed"
  [ "$(ls -d "$1"/checkpoint-* "$1"/.tmp-* 2>/dev/null)" = "$1/checkpoint-2" ] || fail "left behind: $(ls -a "$1")"
}

echo "== too little free space: refused before writing, with the figures"
cp -r "$T/o/checkpoint-2" "$T/c2"
CT_DISK_FREE_MB=0.1 "$S" $tiny output_dir="$T/o" max_steps=4 resume_from_checkpoint=latest >"$T/full.log" 2>&1 \
  && fail "a save past the free space succeeded"
cat "$T/full.log" | tail -1
grep -q "^sft: saving a checkpoint: $T/o: No space left on device (0.1 MB free, the checkpoint needs 0.[3-9] MB)$" \
  "$T/full.log" || { cat "$T/full.log"; fail "no clear message"; }
unchanged "$T/o"
rm -r "$T/c2"
echo "== the final model too"
CT_DISK_FREE_MB=0.1 "$S" $tiny output_dir="$T/f" max_steps=1 save_steps=0 >"$T/final.log" 2>&1 && fail "final save"
grep -q "^sft: saving the model: $T/f: No space left on device (0.1 MB free, the model needs 0.[1-9] MB)$" \
  "$T/final.log" || { cat "$T/final.log"; fail "no clear message for the final model"; }
[ ! -e "$T/f/model.safetensors" ] && [ ! -e "$T/f/.tmp-final" ] || fail "the refused final save wrote files"

echo "== a write that fails: errno's text, the previous checkpoint intact"
# a model of 13 MB against a file-size limit of 8 MB (512-byte blocks), which leaves
# room for MPI's 4 MB shared-memory files
wide="model.hidden_size=512 model.intermediate_size=1536"
"$S" $tiny $wide output_dir="$T/w" max_steps=2 >"$T/w.log" 2>&1 || { cat "$T/w.log"; fail "wide run"; }
cp -r "$T/w/checkpoint-2" "$T/c2"
(trap '' XFSZ; ulimit -f 16384; exec "$S" $tiny $wide output_dir="$T/w" max_steps=4 resume_from_checkpoint=latest) \
  >"$T/big.log" 2>&1 && fail "a write past RLIMIT_FSIZE succeeded"
tail -1 "$T/big.log"
grep -q "^sft: saving a checkpoint: .*model.safetensors: write failed: File too large$" "$T/big.log" \
  || { cat "$T/big.log"; fail "the failed write does not say why"; }
unchanged "$T/w"
"$S" $tiny $wide output_dir="$T/w" max_steps=4 resume_from_checkpoint=latest >"$T/resume.log" 2>&1 \
  || { cat "$T/resume.log"; fail "resume after the failed save"; }
grep -q "resumed from $T/w/checkpoint-2" "$T/resume.log" || fail "did not resume from checkpoint-2"

echo "== a real full filesystem (a 1 MB tmpfs)"
mkdir "$T/mnt"
if unshare -rm sh -c "mount -t tmpfs -o size=1m tmpfs '$T/mnt'" 2>/dev/null; then
  # shellcheck disable=SC2086
  unshare -rm sh -c 'mount -t tmpfs -o size=1m tmpfs "$1" && shift && exec "$@"' sh "$T/mnt" \
    "$S" $tiny output_dir="$T/mnt/o" max_steps=2 model.hidden_size=128 model.intermediate_size=256 \
    >"$T/tmpfs.log" 2>&1 && { cat "$T/tmpfs.log"; fail "a 1 MB filesystem held the checkpoint"; }
  tail -1 "$T/tmpfs.log"
  grep -q "^sft: saving a checkpoint: $T/mnt/o: No space left on device (1.0 MB free, the checkpoint needs [1-9].[0-9] MB)$" \
    "$T/tmpfs.log" || { cat "$T/tmpfs.log"; fail "no clear message on a full tmpfs"; }
else
  echo "skipped: this machine allows no unprivileged mount (unshare -rm)"
fi
echo "disk full: all checks passed"
