#!/usr/bin/env bash
# ring_all_sum on the emulated rdma-core profiles (issue 11): mlx5 RoCE (every address as a RoCE v1
# and a RoCE v2 entry) and InfiniBand (LIDs, no IPv4 GIDs), and the ring's transport on RC (SEND/RECV
# or RDMA WRITE with immediate). Asserts on the launcher's exit code and on the set-up lines, which
# name each chosen GID's index and type and the transport.
#   ring_profile_test.sh <ring_all_sum> <case> <ranks> [ring args...]
set -u
RING=$1; CASE=$2; N=$3; shift 3
WORK=$(mktemp -d /tmp/tbverbs-ring-profile-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
OUT=$WORK/out.txt
fail() { echo "---- output ----"; cat "$OUT"; echo "----------------"; echo "FAIL: $*"; exit 1; }
expect() { grep -Eq -- "$1" "$OUT" || fail "expected a line matching: $1"; }
expect_not() { ! grep -Eq -- "$1" "$OUT" || fail "unexpected line matching: $1"; }
expect_count() {
  local got; got=$(grep -Ec -- "$1" "$OUT"); [ "$got" -eq "$2" ] || fail "expected $2 lines matching '$1', got $got"
}
run() { echo "+ $RING $*" >"$OUT"; "$RING" "$@" >>"$OUT" 2>&1; RC=$?; }
# Every row of the result table (nccl-tests' layout: size, count, type, redop, algorithm, then time,
# algbw, busbw and #wrong out of place and in place) has #wrong 0 ("-": a placement not run), and
# the footer counts no wrong value.
verified() {
  [ $RC -eq 0 ] || fail "launcher exited $RC"
  expect "launcher: all $N ranks exited 0"
  expect_not "MISMATCH|FAILED"
  local rows bad
  rows=$(sed -nE 's/^\[rank 0\] +([0-9]+ +[0-9]+ +[a-z0-9]+ +sum +[a-z]+ .*)$/\1/p' "$OUT")
  [ -n "$rows" ] || fail "no result rows"
  bad=$(echo "$rows" | awk 'NF != 13 || ($9 != "0" && $9 != "-") || ($13 != "0" && $13 != "-")')
  [ -z "$bad" ] || fail "result rows malformed or with wrong elements: $bad"
  expect "# all_sum over $N ranks; "
  expect "# Wrong elements       : 0 OK"
}

case "$CASE" in
  roce)
    # Default selection: the RoCE v2 IPv4 entry (index 3 of fe80 v1/v2, ::ffff v1/v2), never v1.
    run --local "$N" --profile rdma-core-roce "$@"
    verified
    expect_count "cable 0 to rank [0-9]+: mlx5_[01] port 1 GID\[3\] ::ffff:[0-9.]+ RoCE v2 netdev mlx5_[01]p1 \(first RoCE v2 IPv4 entry\)" $((2 * N))
    expect_not "RoCE v1"
    ;;
  roce_v1_asked)
    # TBVERBS_ROCE_VERSION=1 on every rank (a fabric set up for v1, one L2 segment): index 2, RoCE v1.
    TBVERBS_ROCE_VERSION=1 run --local "$N" --profile rdma-core-roce "$@"
    verified
    expect_count "GID\[2\] ::ffff:[0-9.]+ RoCE v1 .*TBVERBS_ROCE_VERSION=1" $((2 * N))
    ;;
  ib)
    # InfiniBand: the port GID at index 0, addressed by LID.
    run --local "$N" --profile rdma-core-ib "$@"
    verified
    expect_count "GID\[0\] fe80:[0-9a-f:]+ IB LID [1-9][0-9]* \(InfiniBand port GID \(addressing by LID\)\)" $((2 * N))
    expect_not "::ffff:"
    ;;
  ib_no_subnet_manager)
    # One host's ports have LID 0 (no opensm): that rank fails with the no-subnet-manager remedy,
    # the others stop on their own (no hang).
    "$RING" --local "$N" --profile rdma-core-ib --write-fabric "$WORK/fabric.json" >"$OUT" 2>&1 || fail "write-fabric"
    python3 - "$WORK/fabric.json" <<'PY' || fail "could not edit the fabric"
import json, sys
p = sys.argv[1]; f = json.load(open(p))
for h in f["hosts"]:
    if h["name"] == "host1":
        for d in h["devices"]:
            for port in d["ports"]: port["lid"] = 0
json.dump(f, open(p, "w"))
PY
    TBVERBS_EMU_STATE_DIR="$WORK/state" run --local "$N" --profile rdma-core-ib --fabric "$WORK/fabric.json" "$@"
    [ $RC -ne 0 ] || fail "the launcher succeeded on a port without a LID"
    expect "\[rank 1\] FAILED during .*PORT_INIT"
    expect "\[rank 1\]   cause: No subnet manager"
    # The others name rank 1 and quote its claim; the diagnosis is rank 1's alone (issue 19,
    # finding 8: a peer's abort is the peer's, never a local "port not active").
    for ((r = 0; r < N; r++)); do
      [ $r -eq 1 ] && continue
      expect "\[rank $r\] FAILED during .*peer aborted: rank 1 aborted: .*state PORT_INIT \(its error: port not active\)"
    done
    expect_count "cause: No subnet manager" 1
    expect_count "cause: Another rank of the job gave up" $((N - 1))
    expect "opensm"
    expect_not "still running .* after the first failure"
    ;;
  rc_write)
    # RDMA WRITE with immediate on RC (issue 11 item 6): every rank says so, exchanges its targets,
    # verifies, and every cable carries the messages.
    run --local "$N" --profile rdma-core-rc --transport write "$@"
    verified
    expect_count "transport: RDMA WRITE with immediate \(asked for\)" "$N"
    expect_count "RDMA WRITE targets exchanged" "$N"
    expect_not "SEND/RECV"
    expect_not " 0 messages sent| 0 received"
    ;;
  rc_send)
    run --local "$N" --profile rdma-core-rc --transport send "$@"
    verified
    expect_count "transport: SEND/RECV \(asked for\)" "$N"
    expect_not "RDMA WRITE targets"
    ;;
  rc_auto)
    # auto names what it took and the figures it was chosen from.
    run --local "$N" --profile rdma-core-rc "$@"
    verified
    expect_count "transport: SEND/RECV \(RDMA WRITE with immediate measured no faster on the emulator" "$N"
    ;;
  thunderbolt_write)
    # Apple's driver accepts RDMA WRITE but does not execute it: --transport write sends instead, and says why.
    run --local "$N" --transport write "$@"
    verified
    expect_count "transport: SEND/RECV \(RDMA WRITE asked for, but Apple's Thunderbolt driver is UC and executes SEND only" "$N"
    expect_not "RDMA WRITE targets"
    ;;
  usb4)
    # Linux hosts on Thunderbolt (issue 21): usb4_rdma devices, their RoCE v2 IPv4 entry at index 1,
    # and RC on every link (both ends run RC).
    run --local "$N" --profile usb4-rdma "$@"
    verified
    expect_count "cable 0 to rank [0-9]+: usb4_rdma[01] port 1 GID\[1\] ::ffff:[0-9.]+ RoCE v2 netdev thunderbolt[01]" $((2 * N))
    expect_count "link [0-9]+ to rank [0-9]+: recipe RC on usb4_rdma[01]: both ends run RC" $((2 * N))
    expect_not "recipe UC"
    ;;
  mixed)
    # Macs and Linux hosts alternating: every cable joins a Mac and a Linux host, and every link is
    # Apple's UC, chosen for the Mac's reason on both ends; the ring verifies.
    run --local "$N" --profile thunderbolt,usb4-rdma "$@"
    verified
    expect_count "link [0-9]+ to rank [0-9]+: recipe UC on rdma_en[12]: this end's rdma_en[12] \(Apple's Thunderbolt driver\) runs UC only" "$N"
    expect_count "link [0-9]+ to rank [0-9]+: recipe UC on usb4_rdma[01]: the peer's rdma_en[12] \(Apple's Thunderbolt driver\) runs UC only" "$N"
    expect_not "recipe RC"
    ;;
  mixed_one_job)
    # Two Macs then two Linux hosts: one job with Mac-Mac (UC), Mac-Linux (UC) and Linux-Linux (RC)
    # links, each end of each link on the same recipe.
    run --local 4 --profile thunderbolt,thunderbolt,usb4-rdma,usb4-rdma "$@"
    N=4 verified
    expect_count "recipe RC on usb4_rdma[01]: both ends run RC" 2
    expect_count "recipe UC on rdma_en[12]: both ends run UC only" 2
    expect_count "recipe UC on (rdma_en[12]: this end's|usb4_rdma[01]: the peer's) rdma_en[12] \(Apple's Thunderbolt driver\) runs UC only" 4
    ;;
  *) echo "unknown case $CASE"; exit 2 ;;
esac
echo "PASS: $CASE"
