#!/usr/bin/env bash
# Tests of tbverbs-probe on the emulated fabric: the probe's report under each quirk value must name
# what the emulator plays (docs/emulator.md), and its profile must load in the library.
#   probe_test.sh <tbverbs-probe> <case> [args...]
set -u
PROBE=$1; CASE=$2; shift 2
WORK=$(mktemp -d /tmp/tbverbs-probe-test-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
OUT=$WORK/out.txt
fail() { echo "---- output ----"; cat "$OUT"; echo "----------------"; echo "FAIL: $*"; exit 1; }
expect() { grep -Eq -- "$1" "$OUT" || fail "expected a line matching: $1"; }
expect_not() { ! grep -Eq -- "$1" "$OUT" || fail "unexpected line matching: $1"; }
run() { echo "+ $PROBE $*" >"$OUT"; "$PROBE" "$@" >>"$OUT" 2>"$WORK/err.txt"; RC=$?; cat "$WORK/err.txt" >>"$OUT"; }
# The JSON object the probe printed on stdout (the report), one key: jq-free, with python3 or grep.
json_value() {  # key -> the value as printed by `json.dumps`
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d.get(sys.argv[2])))' "$WORK/report.json" "$1"
}
run_json() {
  echo "+ $PROBE --local --json --quick $*" >"$OUT"
  "$PROBE" --local --json --quick "$@" >"$WORK/report.json" 2>"$WORK/err.txt"; RC=$?
  cat "$WORK/report.json" "$WORK/err.txt" >>"$OUT"
  [ $RC -eq 0 ] || fail "probe exited $RC"
  python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$WORK/report.json" || fail "stdout is not one JSON object"
}
is() {  # key, expected json value
  local got; got=$(json_value "$1")
  [ "$got" = "$2" ] || fail "$1: expected $2, got $got"
  echo "ok: $1 = $got"
}
common_checks() {
  is max_qps 10
  is max_mrs 100
  is max_mr_bytes 16384000
  # A driver that refuses REMOTE_WRITE registrations cannot take a write: untested, and why.
  if [ "${QUIRK:-}" = mr_access=local_write_only ]; then is rdma_write_executed '"untested"'; else is rdma_write_executed false; fi
  is path_mtu_4096_accepted true
  is frame_pairing_enforced true
  is resources_left '{"mrs": 0, "qps": 0}'
  local link; link=$(json_value link)
  echo "$link" | grep -q '"device": "rdma_en2"' || fail "discovery did not pick host0's rdma_en2 (the cabled one): $link"
  echo "$link" | grep -q '"peer_device": "rdma_en1"' || fail "discovery did not pick host1's rdma_en1: $link"
  local sg; sg=$(json_value sgid_index_honoured)
  [ "$sg" = '"untested"' ] || fail "sgid_index_honoured: expected untested (one IPv4 address per port), got $sg"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert "ifconfig" in d["details"]["sgid_index_honoured"]' \
    "$WORK/report.json" || fail "the untested sgid_index_honoured does not say how to add a second address"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert isinstance(d["latency_4k_us"], float) and d["latency_4k_us"] > 0; assert d["bandwidth"] and all("gb_per_s" in r for r in d["bandwidth"]); assert d["hosts"][0]["devices"]' \
    "$WORK/report.json" || fail "latency, bandwidth or the host description is missing"
}

case "$CASE" in
  quirk)
    q=$1; name=${q%%=*}; value=${q#*=}; QUIRK=$q
    run_json --quirk "$q"
    case "$name" in
      empty_rq) is empty_rq "\"$value\"" ;;
      completion_channels) [ "$value" = on ] && is completion_channels true || is completion_channels false ;;
      macos) [ "$value" = 26.2 ] && is max_message_bytes 4096 || is max_message_bytes 16384000 ;;
      mr_access) is mr_access "\"$value\"" ;;
    esac
    # The defaults of the other quirks.
    [ "$name" = empty_rq ] || is empty_rq '"wait"'
    [ "$name" = completion_channels ] || is completion_channels false
    [ "$name" = macos ] || is max_message_bytes 16384000
    [ "$name" = mr_access ] || is mr_access '"any"'
    common_checks
    ;;
  macos_compare)
    run_json --quirk macos=26.3; a=$(json_value max_message_bytes)
    run_json --quirk macos=26.2; b=$(json_value max_message_bytes)
    [ "$b" -lt "$a" ] || fail "max_message_bytes under 26.2 ($b) is not smaller than under 26.3 ($a)"
    echo "ok: max_message_bytes 26.2 = $b < 26.3 = $a"
    ;;
  table)
    # The table, --profile-out, and the profile read back by the library's parser (tbverbs-probe
    # re-reads it through TBVERBS_PROFILE under --explain, which prints the largest-message rule).
    run --local --quick --quirk macos=26.2 --quirk empty_rq=drop --profile-out "$WORK/profile.txt"
    [ $RC -eq 0 ] || fail "probe exited $RC"
    expect "^  item +value +how it was measured"
    expect "^  empty_rq +drop +the send that met the empty receive queue was lost"
    expect "^  max_message_bytes +4096 "
    expect "^  completion_channels +false +ibv_create_comp_channel refused"
    expect "^  resources left: 0 QPs, 0 MRs"
    expect "wrote the measured profile to $WORK/profile.txt"
    cp "$WORK/profile.txt" "$OUT"
    expect "^tbverbs_profile=1$"
    expect "^max_message_bytes=4096$"
    expect "^empty_rq=drop$"
    expect "^completion_channels=false$"
    expect "^device=rdma_en2$"
    echo "ok: table and profile"
    ;;
  profile_into_ring)
    # What the probe measured replaces the library's assumption: under macos=26.2 the probe
    # writes max_message_bytes=4096, and a ring given that profile warms up with one-frame
    # messages from its first round (without it, it asks for 256 KiB and steps down after two).
    ring=$1
    run --local --quick --quirk macos=26.2 --profile-out "$WORK/profile.txt"
    [ $RC -eq 0 ] || fail "probe exited $RC"
    echo "+ TBVERBS_PROFILE=$WORK/profile.txt $ring --local 2 --quirk macos=26.2 ..." >"$OUT"
    TBVERBS_PROFILE="$WORK/profile.txt" "$ring" --local 2 --quirk macos=26.2 --size 1M --iters 1 --timeout 20000 >>"$OUT" 2>&1
    [ $? -eq 0 ] || fail "the ring with the measured profile failed"
    expect "verified \\(messages of up to 4096 bytes both ways, round 1\\)"
    expect_not "stepping down|round [23]\\)"
    expect "^\\[rank 0\\] +1048576 +262144 +float32 +sum +[a-z]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +0 "
    expect "# Wrong elements       : 0 OK"
    echo "TBVERBS_PROFILE=/nonexistent ..." >>"$OUT"
    TBVERBS_PROFILE=/nonexistent/profile "$ring" --local 2 --size 1M --iters 1 --timeout 5000 >>"$OUT" 2>&1
    [ $? -ne 0 ] || fail "a missing TBVERBS_PROFILE must fail the ring, not be ignored"
    expect "cannot read the measured profile /nonexistent/profile"
    echo "ok: the measured profile replaced the assumed largest message; a missing one is an error"
    ;;
  usage)
    run --server --local
    [ $RC -eq 2 ] || fail "--server --local: expected exit 2, got $RC"
    expect "exactly one of --server"
    run --server --quirk empty_rq=drop
    [ $RC -eq 2 ] || fail "--quirk without --local: expected exit 2, got $RC"
    run --local --quick --quirk empty_rq=sometimes
    [ $RC -ne 0 ] || fail "an unknown quirk value must fail"
    expect "empty_rq"
    echo "ok: usage errors"
    ;;
  hostile)
    # Issue 19 item 1: `--server` against an other end that joins with the probe's token and then
    # sends garbage (HOSTILE PORT MODE), or that has another --token: exit 1 with a clear error,
    # never a terminate or a signal. The two ends are host0 and host1 of a two-host fabric.
    HOSTILE=$1; EMU=$2
    source "$(dirname "$0")/../../tests/common/ports.sh"
    cat >"$WORK/fabric.json" <<'JSON'
{"profile": "thunderbolt",
 "hosts": [{"name": "host0", "devices": [{"name": "rdma_en1", "ports": [{"port": 1, "ipv4": "10.98.0.1/30"}]}]},
           {"name": "host1", "devices": [{"name": "rdma_en1", "ports": [{"port": 1, "ipv4": "10.98.0.2/30"}]}]}],
 "cables": [["host0:rdma_en1:1", "host1:rdma_en1:1"]]}
JSON
    export TBVERBS_EMU_FABRIC=$WORK/fabric.json TBVERBS_EMU_STATE_DIR=$WORK/state TBVERBS_LIBRARY=$EMU
    one() {  # MODE WANT_TEXT [probe args...]
      local mode=$1 want=$2; shift 2
      local port; port=$(free_port)
      TBVERBS_EMU_HOST=host0 "$PROBE" --server --port "$port" --timeout 1500 "$@" >"$WORK/probe.txt" 2>&1 &
      local probe=$!
      sleep 0.3
      TBVERBS_EMU_HOST=host1 "$HOSTILE" "$port" "$mode" ${HOSTILE_TOKEN:-} >"$WORK/peer.txt" 2>&1
      local peer_rc=$?
      wait $probe; local rc=$?
      { echo "+ $mode (probe exit $rc, peer exit $peer_rc)"; cat "$WORK/probe.txt"; echo "+ peer:"; cat "$WORK/peer.txt"; } >"$OUT"
      [ $rc -eq 1 ] || fail "$mode: the probe exited $rc, expected 1 (a clear error)"
      expect_not "terminate called|Sanitizer|Aborted"
      expect "$want"
      echo "ok: $mode: exit 1, \"$want\""
    }
    one not_json "FAILED during exchanging the host descriptions: .*host description is not a JSON object"
    one device_type "FAILED during exchanging the devices: .*device message is not"
    # A peer with the public token against a probe started with a secret: refused at the rendezvous.
    one not_json "FAILED during the side-channel rendezvous" --token s3cret
    ;;
  *) echo "unknown case $CASE"; exit 2 ;;
esac
