#!/usr/bin/env bash
# tbverbs' test command (README "Quick start"; .ci/run calls it).
#
#   1. installs the Debian packages the build and the tests need (tools/install-deps.sh);
#   2. configures, builds and runs the whole ctest suite with the `dev` preset;
#   3. does the same with the `asan` preset (AddressSanitizer + UndefinedBehaviorSanitizer; without
#      the compile, consumer, packaging and printing checks, which compile and configure but run no
#      instrumented code: the dev preset runs them) and the `tsan` preset (ThreadSanitizer, over the
#      unit, emulator and emulated tests, without the printing checks and the `large` ones that move
#      tens of MiB per rank). Sanitized builds leave out what would only repeat the dev preset: the
#      per-header compile check, the fuzz harnesses (they carry their own sanitizers), the
#      torch.distributed backend and the paced timing tests (whose figures mean nothing there);
#   4. prints each preset's ctest summary and exits non-zero if anything failed.
#
# Environment: TBVERBS_TEST_PRESETS (default "dev asan tsan"), TBVERBS_JOBS (default: number of CPUs),
# TBVERBS_SKIP_DEPS=1 to skip step 1 on a machine that already has everything.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
root=$(pwd)

read -r -a presets <<<"${TBVERBS_TEST_PRESETS:-dev asan tsan}"
jobs=${TBVERBS_JOBS:-$(nproc 2>/dev/null || echo 2)}

section() { printf '\n==== %s ====\n' "$*"; }

if [ "${TBVERBS_SKIP_DEPS:-0}" != "1" ]; then
  section "installing dependencies (tools/install-deps.sh)"
  if ! "$root/tools/install-deps.sh"; then
    echo "test.sh: tools/install-deps.sh failed" >&2
    exit 1
  fi
fi

status=0
declare -A outcome
start_all=$SECONDS

for preset in "${presets[@]}"; do
  start=$SECONDS
  log="$root/build/$preset-ctest.log"
  mkdir -p "$root/build"
  : >"$log"

  section "$preset: configure"
  if ! cmake --preset "$preset"; then
    outcome[$preset]="configure FAILED"
    status=1
    continue
  fi
  section "$preset: build"
  if ! cmake --build --preset "$preset" --parallel "$jobs"; then
    outcome[$preset]="build FAILED"
    status=1
    continue
  fi
  section "$preset: test"
  ctest --preset "$preset" --parallel "$jobs" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    status=1
    outcome[$preset]="tests FAILED (ctest exit $rc)"
  else
    outcome[$preset]="passed"
  fi
  outcome[$preset]+=" in $((SECONDS - start)) s"
done

section "summary ($((SECONDS - start_all)) s)"
for preset in "${presets[@]}"; do
  printf '%-8s %s\n' "$preset" "${outcome[$preset]:-not run}"
  log="$root/build/$preset-ctest.log"
  if [ -s "$log" ]; then
    # ctest's own summary: "N% tests passed, ..." and the list of failed tests, if any.
    sed -n -E -e '/^[0-9]+% tests passed/p' -e '/The following tests FAILED/,/^Errors while running CTest/p' "$log" |
      sed 's/^/    /'
  fi
done

if [ "$status" -ne 0 ]; then
  echo "test.sh: FAILED" >&2
else
  echo "test.sh: all presets passed"
fi
exit "$status"
