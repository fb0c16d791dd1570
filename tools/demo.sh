#!/usr/bin/env bash
# tbverbs' demo (the README's first command): on a fresh Debian 12 machine (as root, or a user
# with sudo) it installs what the build needs, builds tbverbs' emulated Thunderbolt fabric (with
# tbverbs-emu) and the ring all_sum example in Release, and runs a verified 4-rank all_sum on an emulated ring of four
# Macs, printing the result check and the bandwidth.
#
#   tools/demo.sh                 # 4 ranks, 64 MiB of float32 per rank
#   tools/demo.sh --size 256M     # extra arguments go to ring_all_sum (see --help)
#
# Environment: TBVERBS_SKIP_DEPS=1 skips the package installation; TBVERBS_DEMO_RANKS (default 4);
# TBVERBS_JOBS (default: number of CPUs).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
ranks=${TBVERBS_DEMO_RANKS:-4}
jobs=${TBVERBS_JOBS:-$(nproc 2>/dev/null || echo 2)}
section() { printf '\n==== %s ====\n' "$*"; }

if [ "${TBVERBS_SKIP_DEPS:-0}" != "1" ]; then
  section "installing dependencies (tools/install-deps.sh)"
  "$root/tools/install-deps.sh"
fi

section "configure and build (Release)"
build=""
if [ -f "$root/CMakePresets.json" ] && cmake --list-presets 2>/dev/null | grep -q '"release"'; then
  if cmake --preset release >/dev/null; then
    build="$root/build/release"
  else
    echo "demo: 'cmake --preset release' failed; falling back to a plain build directory" >&2
  fi
fi
if [ -z "$build" ]; then
  build="$root/build/demo"
  generator=()
  command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTBVERBS_BUILD_TESTS=OFF >/dev/null
fi
# Only what the demo runs: the emulated verbs library, its launcher and control CLI tbverbs-emu
# (ring_all_sum --local execs `tbverbs-emu run`), and the example (not the test suite).
cmake --build "$build" --parallel "$jobs" --target ring_all_sum tbverbs_emu tbverbs-emu
ring="$build/examples/ring_all_sum/ring_all_sum"
if [ ! -x "$ring" ]; then
  echo "demo: $ring was not built (CLI11 or nlohmann/json missing? run tools/install-deps.sh)" >&2
  exit 1
fi

section "a ${ranks}-rank ring all_sum on the emulated Thunderbolt fabric"
echo "+ $ring --local $ranks --size 64M $*"
set +e
"$ring" --local "$ranks" --size 64M "$@" | tee "$build/demo.log"
rc=${PIPESTATUS[0]}
set -e

section "result"
if [ "$rc" -eq 0 ] && grep -q '# Wrong elements       : 0 OK' "$build/demo.log"; then
  grep -E '^\[rank 0\] +(#|[0-9])' "$build/demo.log" | sed 's/^\[rank 0\] //'
  echo "demo: every rank checked its result against the closed-form sum: VERIFIED ($ranks ranks)"
  echo "demo: run it yourself: $ring --local $ranks --size 64M --dtype all --place both"
  echo "demo: run your own program on $ranks emulated ranks: $build/emulator/bin/tbverbs-emu run -n $ranks -- ./my_program"
else
  echo "demo: FAILED (exit $rc); see the lines above" >&2
  exit 1
fi
