#!/usr/bin/env bash
# Two builds of ring_all_sum side by side on the same emulated fabric, interleaved, so that the
# machine's load falls on both alike: the way a change to the collectives layer is measured
# against what it replaces (before/after), in one sitting.
#
#   bench/compare/compare.sh A_BINARY B_BINARY [EMU_LIBRARY]
#     A_BINARY, B_BINARY  ring_all_sum executables (e.g. one built from the previous commit:
#                         git worktree add /tmp/before HEAD~1, then build its ring_all_sum)
#     EMU_LIBRARY         the emulated verbs library both run on (default: build/dev's)
#
# Environment: RANKS (default 4), SIZES (default "4K 64M"), REPS (interleaved repetitions,
# default 5), ITERS_SMALL (iterations per run below 1 MiB, default 2000), ITERS_LARGE (default 5),
# EXTRA (more ring_all_sum arguments for both, e.g. "--memory registered"), and the emulator's own
# (TBVERBS_EMU_PAGE_CHECK=off, TBVERBS_EMU_LINK="gbytes_per_s=0.25,latency_us=150" for a paced link).
# Prints, per size, each run's time (the slowest rank's mean, out of place), the medians and the
# ratio B / A (above 1: B is slower). Not part of the test suite: it takes minutes.
set -euo pipefail
a=${1:?usage: compare.sh A_BINARY B_BINARY [EMU_LIBRARY]}
b=${2:?usage: compare.sh A_BINARY B_BINARY [EMU_LIBRARY]}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
emu=${3:-$root/build/dev/emulator/lib/libtbverbs_emu.so}
ranks=${RANKS:-4}
read -r -a sizes <<<"${SIZES:-4K 64M}"
reps=${REPS:-5}
extra=${EXTRA:-}

for bin in "$a" "$b"; do [ -x "$bin" ] || { echo "compare.sh: $bin is not an executable" >&2; exit 2; }; done
[ -f "$emu" ] || { echo "compare.sh: no emulated library at $emu" >&2; exit 2; }

# One run: prints the time in microseconds of the out-of-place column.
run() {
  local bin=$1 size=$2 iters=$3
  # shellcheck disable=SC2086
  "$bin" --local "$ranks" --emu-library "$emu" --size "$size" -n "$iters" $extra 2>&1 |
    awk '/^\[rank 0\] +[0-9]+ +[0-9]+ / { print $8; found = 1 } END { if (!found) exit 1 }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

printf '%-8s %-40s %-40s %8s %8s %7s\n' size "A runs (us)" "B runs (us)" "A med" "B med" "B/A"
for size in "${sizes[@]}"; do
  bytes=$(numfmt --from=iec "$size")
  iters=${ITERS_SMALL:-2000}
  [ "$bytes" -ge 1048576 ] && iters=${ITERS_LARGE:-5}
  ta=() tb=()
  for ((r = 0; r < reps; ++r)); do
    # Alternate which goes first, so neither always meets a warmer or busier machine.
    if ((r % 2 == 0)); then
      ta+=("$(run "$a" "$size" "$iters")") tb+=("$(run "$b" "$size" "$iters")")
    else
      tb+=("$(run "$b" "$size" "$iters")") ta+=("$(run "$a" "$size" "$iters")")
    fi
  done
  ma=$(printf '%s\n' "${ta[@]}" | median)
  mb=$(printf '%s\n' "${tb[@]}" | median)
  printf '%-8s %-40s %-40s %8.1f %8.1f %7.3f\n' "$size" "${ta[*]}" "${tb[*]}" "$ma" "$mb" "$(awk -v x="$ma" -v y="$mb" 'BEGIN { print y / x }')"
done
