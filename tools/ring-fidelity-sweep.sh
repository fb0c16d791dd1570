#!/usr/bin/env bash
# The long fidelity runs of the ring all_sum on the emulated Thunderbolt fabric, outside the test
# suite (they take minutes): every contested reading of Apple's driver (docs/emulator.md) from
# 4 KiB to 256 MiB per rank, and 1 GiB per rank in and out of place (where the user buffers need
# more memory regions than Apple's ~100 per device and the ring stages them).
#
#   tools/ring-fidelity-sweep.sh [BUILD_DIR]     (default: build/release, configured if missing)
#
# Environment: RANKS (default 4), QUIRKS (default: every value), MAX_SIZE (256M), GIB=0 to skip
# the 1 GiB runs. Exits non-zero when any run is not verified; prints one line per run.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
root=$(pwd)
build=${1:-$root/build/release}
ranks=${RANKS:-4}
max_size=${MAX_SIZE:-256M}
quirks=${QUIRKS:-empty_rq=wait empty_rq=drop empty_rq=kill macos=26.3 macos=26.2 mr_access=any mr_access=local_write_only mr_access=remote_required completion_channels=off completion_channels=on}

if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTBVERBS_BUILD_TESTS=OFF >/dev/null || exit 2
fi
cmake --build "$build" --parallel "$(nproc 2>/dev/null || echo 2)" --target ring_all_sum >/dev/null || exit 2
ring="$build/examples/ring_all_sum/ring_all_sum"

status=0
log=$(mktemp /tmp/tbverbs-sweep-XXXXXX)
trap 'rm -f "$log"' EXIT
run() {  # label, ring arguments...
  local label=$1; shift
  local t0=$SECONDS
  # Verified: exit 0, no mismatch, and the result table's footer counting no wrong element.
  if "$ring" "$@" >"$log" 2>&1 && ! grep -Eq "MISMATCH|FAILED" "$log" && grep -q "# Wrong elements       : 0 OK" "$log"; then
    echo "ok    $label ($((SECONDS - t0)) s): $(grep -Ec '^\[rank 0\] +[0-9]+ +[0-9]+ ' "$log") result rows, #wrong 0"
    grep -E '^\[rank 0\] +(#  |[0-9])' "$log" | sed 's/^\[rank 0\] /      /'
  else
    echo "FAIL  $label ($((SECONDS - t0)) s)"
    tail -20 "$log" | sed 's/^/      /'
    status=1
  fi
}

for q in $quirks; do
  run "$ranks ranks, $q, 4K..$max_size" --local "$ranks" --quirk "$q" --size 4K --max-size "$max_size" --iters 2 --quiet
done
if [ "${GIB:-1}" != 0 ]; then
  for place in out in; do
    run "$ranks ranks, 1 GiB per rank, $place-place (memory auto)" --local "$ranks" --size 1G --place "$place" --iters 1 --warmup 0
  done
fi
[ $status -eq 0 ] && echo "ring-fidelity-sweep: all runs verified" || echo "ring-fidelity-sweep: FAILED"
exit $status
