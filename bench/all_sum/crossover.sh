#!/usr/bin/env bash
# Where the latency algorithm (or, MESH=1, the mesh) stops beating the ring: ring_all_sum
# --algorithm ring and --algorithm latency (mesh) over the same sizes, at each rank count, on one link model; prints both times per size and
# the crossover (the largest size at which latency was faster, every smaller size faster too).
# The figures behind latency_crossover_bytes() in include/tbverbs/collective/choice.hpp.
#
#   bench/all_sum/crossover.sh [BUILD_DIR]     (default build/release; configured as run.sh does)
#
# Environment: RANKS ("2 3 4 8"), MIN_SIZE (4K), MAX_SIZE (1M: the latency algorithm's largest sum),
# LINK_GBPS (0.25; 0: unpaced), LINK_LATENCY_US (150: Thunderbolt 5 slowed 37.6x, see run.sh),
# ITERS (20), MESH (0; 1: a fully connected fabric, and the mesh algorithm against the ring).
# Not part of the test suite.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$(pwd)
build=${1:-$root/build/release}
ranks_list=${RANKS:-2 3 4 8}
gbps=${LINK_GBPS:-0.25}
lat_us=${LINK_LATENCY_US:-150}
iters=${ITERS:-20}
if [ ! -f "$build/CMakeCache.txt" ]; then
  if [ "$build" = "$root/build/release" ] && cmake --preset release >/dev/null 2>&1; then :; else
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTBVERBS_BUILD_TESTS=OFF >/dev/null
  fi
fi
cmake --build "$build" --parallel "$(nproc 2>/dev/null || echo 2)" --target ring_all_sum >/dev/null
ring="$build/examples/ring_all_sum/ring_all_sum"
link=()
awk -v b="$gbps" 'BEGIN { exit !(b > 0) }' && link=(--link-gbps "$gbps" --link-latency-us "$lat_us")
fast=latency
[ "${MESH:-0}" = 1 ] && { fast=mesh; link+=(--mesh); }
work=$(mktemp -d /tmp/tbverbs-crossover-XXXXXX)
trap 'rm -rf "$work"' EXIT

echo "link: ${link[*]:-unpaced}, $fast against ring; $iters iterations per size; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for n in $ranks_list; do
  for a in ring $fast; do
    "$ring" --local "$n" --algorithm "$a" -b "${MIN_SIZE:-4K}" -e "${MAX_SIZE:-1M}" -n "$iters" --place out --csv \
      --quiet --timeout 60000 "${link[@]}" >"$work/$n-$a.txt" 2>&1 || { cat "$work/$n-$a.txt"; exit 1; }
    sed -nE 's/^\[rank 0\] ([0-9]+),[0-9]+,[a-z0-9]+,sum,out,([0-9.]+),.*,0$/\1 \2/p' "$work/$n-$a.txt" >"$work/$n-$a.dat"
  done
  echo "== $n ranks: size, ring us, $fast us, $fast / ring"
  join "$work/$n-ring.dat" "$work/$n-$fast.dat" | awk -v n="$n" '
    { printf "  %9d %10.1f %10.1f %6.2f\n", $1, $2, $3, $3 / $2
      if ($3 < $2 && !lost) cross = $1; else lost = 1 }
    END { printf "crossover %d ranks: %d bytes\n", n, cross }'
done
