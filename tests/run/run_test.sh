#!/usr/bin/env bash
# `tbverbs-emu run`'s promises, each case a test: run_test.sh TBVERBS_EMU YOUR_PROGRAM CASE.
# The program runs with a clean environment (env -i): everything it needs comes from the launcher.
set -uo pipefail
EMU=$1 PROG=$2 CASE=$3
OUT=$(mktemp /tmp/tbverbs-run-test-XXXXXX)
trap 'rm -f "$OUT"' EXIT
fail() { echo "FAIL: $*"; echo "---- output ----"; cat "$OUT"; exit 1; }
expect() { grep -Eq -- "$1" "$OUT" || fail "expected a line matching: $1"; }
expect_not() { ! grep -Eq -- "$1" "$OUT" || fail "unexpected line matching: $1"; }
# A rank that returns from main waits in its communicator's close for the others, up to their
# timeout (docs/collectives.md, "Leaving"); the failure cases set 3 s (TIMEOUT_ENV) to stay short.
TIMEOUT_ENV=()
run() { # runs the launcher with a clean environment; sets RC and SECONDS_TAKEN
  echo "+ tbverbs-emu $*" >"$OUT"
  local t0=$(date +%s.%N)
  env -i PATH=/usr/bin:/bin HOME="${HOME:-/root}" "${TIMEOUT_ENV[@]}" "$EMU" "$@" >>"$OUT" 2>&1; RC=$?
  SECONDS_TAKEN=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
}
# The launcher's own directories, from its first line ("fabric DIR/fabric.json ... state STATE").
own_dirs() { sed -nE 's|^local .* fabric (/tmp/tbverbs-ring-[A-Za-z0-9]+)/fabric.json.*, state ([^ ]+)$|\1 \2|p' "$OUT"; }
gone() { # every directory the launcher named is gone
  local dirs; dirs=$(own_dirs)
  [ -n "$dirs" ] || fail "the launcher did not name its directories"
  for d in $dirs; do [ ! -e "$d" ] || fail "left behind: $d"; done
}

case "$CASE" in
  verified)
    # Three ranks, nothing set but PATH: every rank verifies, every line names its rank.
    run run -n 3 -- "$PROG"
    [ $RC -eq 0 ] || fail "exit $RC"
    for r in 0 1 2; do expect "^\[rank $r\] rank $r of 3: all_reduce of 65536 floats verified \(6\)$"; done
    expect "^launcher: all 3 ranks exited 0$"
    # Every line of the output is the launcher's or a rank's.
    bad=$(grep -Ev '^(\+ |local (ring|mesh) of|\[rank [0-9]+\] |launcher: )' "$OUT" | head -1)
    [ -z "$bad" ] || fail "a line neither prefixed nor the launcher's: $bad"
    echo "ok: 3 ranks verified, output prefixed, in $SECONDS_TAKEN s"
    ;;
  first_failure_ends_the_job)
    # Rank 1 exits 3 after its all_reduce while the others sleep 60 s: the job ends with status 3
    # after its close (3 s) and the grace (2 s here), not after 60 s.
    TIMEOUT_ENV=(TBVERBS_TIMEOUT_MS=3000)
    run run -n 3 --grace-ms 2000 -- "$PROG" --exit-on-rank 1 3 --sleep 60
    [ $RC -eq 3 ] || fail "exit $RC, not 3 (the first failure's status)"
    awk -v t="$SECONDS_TAKEN" 'BEGIN { exit !(t < 20) }' || fail "took $SECONDS_TAKEN s: the others were not ended"
    expect "^launcher: rank 1 exited with status 3 at"
    expect "^launcher: rank [02] still running 2.0 s after the first failure: stopping it"
    echo "ok: a rank's exit 3 ended the job with status 3 in $SECONDS_TAKEN s (the others slept 60 s)"
    ;;
  sigint)
    # SIGINT to the launcher reaches every rank; the launcher exits 130 and leaves nothing behind.
    echo "+ tbverbs-emu run -n 3 -- PROG --sleep 60 (SIGINT once every rank verified)" >"$OUT"
    env -i PATH=/usr/bin:/bin TBVERBS_TIMEOUT_MS=3000 "$EMU" run -n 3 -- "$PROG" --sleep 60 >>"$OUT" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do [ "$(grep -c 'verified' "$OUT")" -ge 3 ] && break; sleep 0.1; done
    [ "$(grep -c 'verified' "$OUT")" -ge 3 ] || { kill -KILL $pid; fail "the ranks did not start"; }
    kill -INT $pid
    wait $pid; RC=$?
    [ $RC -eq 130 ] || fail "exit $RC after SIGINT, not 130"
    expect "^launcher: Interrupt: stopping the ranks and removing the temporary state$"
    expect_not "still running .* after the first failure"
    gone
    echo "ok: SIGINT forwarded, exit 130, no /tmp or /dev/shm state left"
    ;;
  no_leftovers)
    # A run that passes and one that fails leave no directory in /tmp or /dev/shm.
    run run -n 2 -- "$PROG"
    [ $RC -eq 0 ] || fail "exit $RC"
    gone
    TIMEOUT_ENV=(TBVERBS_TIMEOUT_MS=3000)
    run run -n 2 --grace-ms 500 -- "$PROG" --exit-on-rank 0 7 --sleep 30
    [ $RC -eq 7 ] || fail "exit $RC, not 7"
    gone
    # --keep keeps it, and says where.
    run run -n 2 --keep -- "$PROG"
    dir=$(sed -nE 's|.*fabric (/tmp/tbverbs-ring-[A-Za-z0-9]+)/fabric.json.*|\1|p' "$OUT" | head -1)
    [ -n "$dir" ] && [ -f "$dir/fabric.json" ] || fail "--keep: no fabric file kept"
    rm -rf $(own_dirs)
    echo "ok: no state left behind after a passing and a failing run; --keep keeps it"
    ;;
  refusals)
    # What the launcher cannot honour is a usage error (exit 2), before anything starts.
    refuse() {
      local want=$1; shift
      run "$@"
      [ $RC -eq 2 ] || fail "exit $RC, not 2, for: $*"
      expect "$want"
    }
    refuse "number of ranks must be 2..64" run -n 1 -- "$PROG"
    refuse "number of ranks must be 2..64" run -n 65 -- "$PROG"
    refuse "program" run -n 2
    refuse "unknown profile \"infiniband\"" run -n 2 --profile infiniband -- "$PROG"
    refuse "--mesh has one cable between every pair of hosts" run -n 3 --mesh --cables 2 -- "$PROG"
    refuse "--quirk empty_rq is given twice" run -n 2 --quirk empty_rq=drop --quirk empty_rq=wait -- "$PROG"
    refuse "is not a rank of 0..1" run -n 2 --kill-rank 5 -- "$PROG"
    refuse "excludes" run -n 2 --kill-rank 1 --stop-rank 1 -- "$PROG"
    refuse "no emulated verbs library" run -n 2 --emu-library /nonexistent.so -- "$PROG"
    run run -n 2 -- /nonexistent/program
    [ $RC -eq 127 ] || fail "exit $RC for a program that does not exist, not 127"
    expect "cannot start /nonexistent/program"
    echo "ok: every bad run refused before it started"
    ;;
  fault_after_line)
    # The fault fires on an event: once a rank said it verified, rank 2 is killed; the launcher
    # reports the kill and the job's status is the killed rank's (128 + 9).
    TIMEOUT_ENV=(TBVERBS_TIMEOUT_MS=3000)
    run run -n 3 --grace-ms 2000 --kill-rank 2 --kill-after-line "verified" -- "$PROG" --sleep 30
    [ $RC -eq 137 ] || fail "exit $RC, not 137"
    expect "^launcher: killing rank 2 \(SIGKILL\) at [0-9.]+ s, after its job said it was running$"
    expect "^launcher: rank 2 was killed by signal 9"
    line=$(grep -n "verified" "$OUT" | head -1 | cut -d: -f1)
    kill_line=$(grep -n "^launcher: killing rank 2" "$OUT" | cut -d: -f1)
    [ "$line" -lt "$kill_line" ] || fail "the kill came before any rank said it verified"
    echo "ok: the fault fired after the line, not on a clock"
    ;;
  *) echo "unknown case $CASE"; exit 2 ;;
esac
