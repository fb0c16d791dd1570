#!/usr/bin/env bash
# A rank of a 4-rank communicator is killed while the others run all_reduces: every other rank
# must get an Error (not hang, not crash) within a few seconds, and the errors must name a rank.
# usage: kill_test.sh COMM_CHECK
set -u
check=$1
out=$(timeout 120 "$check" --local 4 --kill-rank 2 --kill-after-ms 1500 --expect-error 2>&1)
rc=$?
printf '%s\n' "$out"
[ "$rc" -eq 124 ] && { echo "FAILED: the job hung (killed by timeout after 120 s)"; exit 1; }
grep -q 'launcher: rank 2 was killed by signal 9' <<<"$out" || { echo "FAILED: rank 2 was not killed"; exit 1; }
expected=$(grep -cE '^\[rank [013]\] all_reduce [0-9]+ failed after [0-9.]+ s as expected: .*rank [0-9]' <<<"$out")
[ "$expected" -eq 3 ] || { echo "FAILED: $expected of the 3 surviving ranks reported an error naming a rank"; exit 1; }
# No survivor may take longer than 10 s after the kill (1.5 s) to report it.
slow=$(grep -oE 'failed after [0-9.]+ s' <<<"$out" | awk '$3 > 11.5' | wc -l)
[ "$slow" -eq 0 ] || { echo "FAILED: $slow ranks took more than 10 s after the kill to fail"; exit 1; }
echo "kill_test: the 3 surviving ranks failed with errors naming a rank"
