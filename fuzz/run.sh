#!/usr/bin/env bash
# Builds and runs tbverbs' libFuzzer harnesses (clang++-19, -fsanitize=fuzzer,address,undefined).
#
#   fuzz/run.sh [SECONDS] [HARNESS...]      (default: 10 seconds each, every harness)
#
# Each harness fuzz/fuzz_NAME.cpp runs for SECONDS on a working copy of fuzz/corpus/NAME (the
# committed seeds are never modified); a crash, leak or sanitizer report fails the run and its
# input is kept under the work directory (printed). Prints one line per harness: executions,
# corpus size, crashes. Environment: FUZZ_WORK (default build/fuzz), CLANGXX (default clang++-19),
# FUZZ_PREBUILT_DIR (the harnesses the build made, fuzz_NAME there: run, not built; the test suite
# sets it). Exits 77 (reported as skipped by ctest) when clang++-19 or its libFuzzer runtime is
# missing and a harness would have to be built.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
seconds=${1:-10}
shift || true
work=${FUZZ_WORK:-$root/build/fuzz}
cxx=${CLANGXX:-clang++-19}
case "$seconds" in '' | *[!0-9]*) echo "run.sh: SECONDS must be a number" >&2; exit 2 ;; esac
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in "$here"/fuzz_*.cpp; do n=$(basename "$f" .cpp); names+=("${n#fuzz_}"); done
fi
mkdir -p "$work"
prebuilt=${FUZZ_PREBUILT_DIR:-}
have_prebuilt() { [ -n "$prebuilt" ] && [ -x "$prebuilt/fuzz_$1" ]; }

# Is a compiler needed (some harness not prebuilt), and can it link libFuzzer?
need_cxx=0
for n in "${names[@]}"; do have_prebuilt "$n" || need_cxx=1; done
if [ $need_cxx -eq 1 ]; then
  if ! command -v "$cxx" >/dev/null 2>&1; then
    echo "FUZZ SKIPPED: $cxx not found (tools/install-deps.sh installs clang-19 and libclang-rt-19-dev)"
    exit 77
  fi
  printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' >"$work/probe.cpp"
  if ! "$cxx" -fsanitize=fuzzer "$work/probe.cpp" -o "$work/probe" >"$work/probe.log" 2>&1; then
    echo "FUZZ SKIPPED: $cxx cannot link libFuzzer (install libclang-rt-19-dev): $(head -c 300 "$work/probe.log")"
    exit 77
  fi
fi

# Builds harness $1 into $2. A harness may name more sources and include directories (relative to
# the repository) in "// fuzz-sources:" and "// fuzz-includes:" lines, e.g. the emulator's loader;
# source patterns are expanded under the repository (emulator/src/*.cpp: every source it has).
build_harness() {
  local src="$here/fuzz_$1.cpp" f g d extra=()
  for f in $(set -f; sed -nE 's|^// fuzz-sources: (.*)|\1|p' "$src"); do
    for g in "$root"/$f; do extra+=("$g"); done
  done
  for d in $(sed -nE 's|^// fuzz-includes: (.*)|\1|p' "$src"); do extra+=(-I "$root/$d"); done
  "$cxx" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I "$root/include" "${extra[@]}" "$src" -o "$2" -lpthread >"$work/$1.build.log" 2>&1
}

status=0
for n in "${names[@]}"; do
  [ -f "$here/fuzz_$n.cpp" ] || { echo "run.sh: no harness $here/fuzz_$n.cpp" >&2; exit 2; }
  if have_prebuilt "$n"; then
    bin="$prebuilt/fuzz_$n"
  else
    bin="$work/fuzz_$n"
    if ! build_harness "$n" "$bin"; then
      echo "FAIL  $n: does not build"; cat "$work/$n.build.log"; status=1; continue
    fi
  fi
  corpus="$work/corpus/$n"
  artifacts="$work/artifacts/$n/"
  rm -rf "$artifacts"
  mkdir -p "$corpus" "$artifacts"
  [ -d "$here/corpus/$n" ] && cp -n "$here/corpus/$n"/* "$corpus"/ 2>/dev/null
  log="$work/$n.log"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts" "$corpus" >"$log" 2>&1
  rc=$?
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log" | tail -1)
  units=$(ls "$corpus" | wc -l)
  crashes=$(ls "$artifacts" 2>/dev/null | wc -l)
  if [ $rc -eq 0 ] && [ "$crashes" -eq 0 ]; then
    echo "ok    $n: ${execs:-?} executions in ${seconds} s, corpus $units inputs, 0 crashes"
  else
    echo "FAIL  $n: exit $rc, ${execs:-?} executions, $crashes crash input(s) in $artifacts"
    grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$log" | head -10
    status=1
  fi
done
exit $status
