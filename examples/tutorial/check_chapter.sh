#!/usr/bin/env bash
# Runs one tutorial program the way its chapter does and checks what it printed.
#
#   check_chapter.sh WORK_DIR [--env VAR=VALUE]... [--exit 0|nonzero] [--match ERE]... [--no-match ERE]...
#                    [--trace TBVERBS_EMU_CLI] -- PROGRAM [ARGS...]
#
# The program's stdout and stderr together must match every --match (grep -E, anywhere in the
# output) and no --no-match, and its exit status must be --exit (default 0). The emulator's
# variables of the caller's shell are dropped first, so a test sees only what it sets; the
# emulator's state goes to WORK_DIR (a single-process program on the built-in fabric would
# otherwise share /dev/shm's default state with every other user of it).
#
# --trace CLI runs the program with TBVERBS_EMU_TRACE=WORK_DIR/trace (the chapter's "On the wire"),
# then `CLI trace WORK_DIR/trace`, whose per-QP timeline is checked together with the output. An
# emulator without a trace mode writes no `emu-trace` line: the test is then skipped (exit 77).
set -uo pipefail

fail() { echo "check_chapter: FAIL: $*" >&2; exit 1; }

work=$1
shift
envs=() matches=() no_matches=() expect=0 trace_cli=""
while [ $# -gt 0 ]; do
  case "$1" in
  --env) envs+=("$2"); shift 2 ;;
  --exit) expect=$2; shift 2 ;;
  --match) matches+=("$2"); shift 2 ;;
  --no-match) no_matches+=("$2"); shift 2 ;;
  --trace) trace_cli=$2; shift 2 ;;
  --) shift; break ;;
  *) fail "unknown option $1" ;;
  esac
done
[ $# -gt 0 ] || fail "no program after --"

rm -rf "$work" && mkdir -p "$work" || fail "cannot make $work"
unset TBVERBS_EMU_FABRIC TBVERBS_EMU_HOST TBVERBS_EMU_QUIRKS TBVERBS_EMU_TRACE TBVERBS_EMU_LINK \
      TBVERBS_GID_INDEX TBVERBS_LIBRARY TBVERBS_DEVICE JACCL_RANK JACCL_COORDINATOR JACCL_IBV_DEVICES
export TBVERBS_EMU_STATE_DIR=$work/emu-state
[ -n "$trace_cli" ] && export TBVERBS_EMU_TRACE=$work/trace
out=$work/output.txt
env "${envs[@]}" timeout 100 "$@" >"$out" 2>&1
rc=$?
echo "---- $* (exit $rc):"
cat "$out"
if [ -n "$trace_cli" ]; then
  if ! grep -q '^emu-trace ' "$work/trace" 2>/dev/null; then
    echo "check_chapter: skipped: TBVERBS_EMU_TRACE wrote no emu-trace line (an emulator without trace mode)"
    rm -rf "$work"
    exit 77
  fi
  echo "---- $trace_cli trace $work/trace:"
  "$trace_cli" trace "$work/trace" >"$work/timeline.txt" 2>&1 || { cat "$work/timeline.txt"; fail "tbverbs-emu trace failed"; }
  tee -a "$out" <"$work/timeline.txt"
fi

case "$expect" in
0) [ "$rc" -eq 0 ] || fail "exit status $rc, expected 0" ;;
nonzero) [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "exit status $rc, expected a failure (not 0, not the timeout's 124)" ;;
*) [ "$rc" -eq "$expect" ] || fail "exit status $rc, expected $expect" ;;
esac
for re in "${matches[@]}"; do
  grep -Eq -- "$re" "$out" || fail "no line matches: $re"
done
for re in "${no_matches[@]}"; do
  if grep -Eq -- "$re" "$out"; then fail "a line matches what must not appear: $re"; fi
done
rm -rf "$work"
echo "check_chapter: passed"
