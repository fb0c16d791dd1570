#!/usr/bin/env bash
# The README's API tour (issue 13): the program in the README is examples/tour/tour.cpp, and the
# README's "Run it on the emulator" commands build the program copied out of the README and run
# it to the end.
#
#   tour_test.sh match README TOUR_CPP
#       the README's ```cpp block under "## API tour" is the file, byte for byte
#   tour_test.sh run README INCLUDE_DIR EMU_LIBDIR WORK_DIR
#       in WORK_DIR, laid out as the repository's top directory (include/ and
#       build/release/emulator/lib/ are links to this build's), with tour.cpp copied out of the
#       README, runs the README's ```sh block under "### Run it on the emulator" with bash. The
#       only change to the commands is the port (a free one per attempt, so runs of the suite on
#       one machine do not collide); the emulator state goes to WORK_DIR (TBVERBS_EMU_STATE_DIR),
#       not the shared default. Both ranks must print their endpoint and the peer's message and
#       the commands must exit 0.
#   tour_test.sh built TOUR EMU_LIBRARY WORK_DIR
#       this build's tour binary (the sanitizers of the asan and tsan presets included), the two
#       ranks on the emulator's built-in fabric, with the same checks
set -uo pipefail

fail() { echo "tour_test: FAIL: $*" >&2; exit 1; }

source "$(dirname "$0")/../../tests/common/ports.sh"
# Runs `bash SCRIPT` in DIR with the emulator state in DIR (SCRIPT_TEMPLATE has 127.0.0.1:18515,
# replaced by a free port; another one if it was taken), then checks both ranks' lines. Sets rc.
run_ranks() {
  local dir=$1 template=$2
  OUT=$dir/out.log
  retry_on_port_taken run_script "$dir" "$template"; rc=$?
  rm -rf "$dir/emu-state"
  [ "$rc" -eq 0 ] || fail "the commands exited $rc"
  local r
  for r in 0 1; do
    grep -Eq "^rank $r: QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, .*GID ::ffff:10\.99\.0\.$((r + 1)), port 1, MTU 1024, UC" "$dir/out.log" ||
      fail "rank $r did not print its endpoint"
    grep -q "^rank $r: received \"hello from rank $((1 - r))\"$" "$dir/out.log" ||
      fail "rank $r did not receive rank $((1 - r))'s message"
  done
}

run_script() {  # DIR TEMPLATE, on $PORT
  local dir=$1 template=$2 rc
  sed "s/127\.0\.0\.1:18515/127.0.0.1:$PORT/g" "$template" >"$dir/run.sh"
  rm -rf "$dir/emu-state"
  (cd "$dir" && TBVERBS_EMU_STATE_DIR="$dir/emu-state" timeout 120 bash "$dir/run.sh") >"$OUT" 2>&1
  rc=$?
  echo "---- port $PORT: exit $rc"; cat "$OUT"
  return $rc
}

# The first fenced block of language $2 after the line "$1" in README $3.
block_after() {
  awk -v head="$1" -v lang="$2" '
    $0 == head { found = 1; next }
    found && !inside && $0 == "```" lang { inside = 1; next }
    inside && $0 == "```" { exit }
    inside { print }
  ' "$3"
}

mode=${1:-}
case "$mode" in
match)
  readme=$2 tour=$3
  diff -u "$tour" <(block_after "## API tour" cpp "$readme") >&2 ||
    fail "the README's API tour differs from $tour (diff above: - the file, + the README)"
  [ -s "$tour" ] || fail "$tour is empty"
  echo "tour_test: the README's API tour is $tour ($(wc -l <"$tour") lines)"
  ;;
run)
  readme=$2 include=$3 emu_libdir=$4 work=$5
  rm -rf "$work" && mkdir -p "$work/build/release/emulator" || fail "cannot make $work"
  ln -s "$include" "$work/include"
  ln -s "$emu_libdir" "$work/build/release/emulator/lib"
  block_after "## API tour" cpp "$readme" >"$work/tour.cpp"
  block_after "### Run it on the emulator" sh "$readme" >"$work/commands.sh"
  [ -s "$work/tour.cpp" ] || fail "no API tour program in $readme"
  grep -q '127\.0\.0\.1:18515' "$work/commands.sh" || fail "no run commands (with 127.0.0.1:18515) in $readme"
  echo "---- the README's commands:"; cat "$work/commands.sh"
  run_ranks "$work" "$work/commands.sh"
  echo "tour_test: the README's tour, copied out and built as the README says, ran to the end on the emulator"
  ;;
built)
  tour=$2 emu_library=$3 work=$4
  rm -rf "$work" && mkdir -p "$work" || fail "cannot make $work"
  cat >"$work/commands.sh" <<SCRIPT
export TBVERBS_LIBRARY=$emu_library
TBVERBS_EMU_HOST=host0 $tour 0 127.0.0.1:18515 & rank0=\$!
TBVERBS_EMU_HOST=host1 $tour 1 127.0.0.1:18515 && wait \$rank0
SCRIPT
  run_ranks "$work" "$work/commands.sh"
  echo "tour_test: $tour ran to the end on the emulator"
  ;;
trace)
  # Issue 20: the tour with TBVERBS_EMU_TRACE=1 prints emu-trace lines for both ranks' posts,
  # deliveries and completions; with TBVERBS_EMU_TRACE=FILE both ranks append to one file, which
  # `tbverbs-emu trace` prints as a per-QP timeline (and refuses when a trace line is corrupt).
  tour=$2 emu_library=$3 emu_cli=$4 work=$5
  rm -rf "$work" && mkdir -p "$work" || fail "cannot make $work"
  cat >"$work/commands.sh" <<SCRIPT
export TBVERBS_LIBRARY=$emu_library TBVERBS_EMU_TRACE=1
TBVERBS_EMU_HOST=host0 $tour 0 127.0.0.1:18515 & rank0=\$!
TBVERBS_EMU_HOST=host1 $tour 1 127.0.0.1:18515 && wait \$rank0
SCRIPT
  run_ranks "$work" "$work/commands.sh"
  for h in host0 host1; do
    for ev in "modify_qp state=RTR" post_recv "post_send wr_id=[0-9]+ op=SEND" "deliver wr_id=[0-9]+ op=SEND len=[0-9]+ to=host[01]:" \
              "complete wr_id=[0-9]+ status=IBV_WC_SUCCESS opcode=RECV" "complete wr_id=[0-9]+ status=IBV_WC_SUCCESS opcode=SEND"; do
      grep -Eq "^emu-trace [0-9]+ $h rdma_en1 qp=0x[0-9a-f]{6} $ev" "$OUT" || fail "no '$ev' trace line for $h"
    done
  done
  echo "tour_test: both ranks traced their posts, deliveries and completions on stderr"

  sed -i "s|TBVERBS_EMU_TRACE=1|TBVERBS_EMU_TRACE=$work/trace.txt|" "$work/commands.sh"
  run_ranks "$work" "$work/commands.sh"
  if grep -q '^emu-trace ' "$OUT"; then fail "TBVERBS_EMU_TRACE=FILE still wrote trace lines to stderr"; fi
  "$emu_cli" trace "$work/trace.txt" >"$work/timeline.txt" 2>&1 || { cat "$work/timeline.txt"; fail "tbverbs-emu trace failed"; }
  cat "$work/timeline.txt"
  [ "$(grep -Ec '^host[01] rdma_en1 qp=0x[0-9a-f]{6}$' "$work/timeline.txt")" -eq 2 ] ||
    fail "the timeline does not have one section per QP (two QPs)"
  lines=$(grep -c '^emu-trace ' "$work/trace.txt")
  grep -q "^$lines events on 2 QPs" "$work/timeline.txt" || fail "the timeline does not count the file's $lines events"
  echo "emu-trace 12x host0 rdma_en1 qp=0x000001 post_send" >>"$work/trace.txt"
  if "$emu_cli" trace "$work/trace.txt" >"$work/bad.txt" 2>&1; then fail "a corrupt trace line was accepted"; fi
  grep -q "did not parse" "$work/bad.txt" || fail "the corrupt line was not reported"
  echo "tour_test: one trace file for both ranks, printed as a per-QP timeline; a corrupt line is refused"
  ;;
*)
  echo "usage: readme_test.sh match README TOUR_CPP | run README INCLUDE_DIR EMU_LIBDIR WORK_DIR" >&2
  exit 2
  ;;
esac
