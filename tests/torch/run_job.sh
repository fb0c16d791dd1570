#!/usr/bin/env bash
# Runs a torchrun job of the "tbverbs" backend on an emulated ring of N Macs, as a user would:
# one environment for every rank (TBVERBS_EMU_HOST=host{rank}), the package from the build tree.
#   run_job.sh <python3> <build>/python <libtbverbs_emu.so> <ring_all_sum> <tbverbs-emu> CASE N
# CASE: collectives (check_collectives.py: every rank prints "rank R: ok"), ddp (check_ddp.py:
# gradients equal Gloo's), kill (check_kill.py: a rank is SIGKILLed, every other one raises within
# the timeout, nobody hangs). Asserts on the exit code and the lines the ranks print.
set -u
PY=$1; PKG=$2; EMU=$3; RING=$4; CLI=$5; CASE=$6; N=$7
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d /tmp/tbverbs-torch-test-XXXXXX)
FABRIC=$WORK/fabric.json
OUT=$WORK/out.txt
source "$HERE/../common/emulated_job.sh"
cleanup() {
  remove_fabric_state "$CLI" "$FABRIC"
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "---- output ----"; cat "$OUT"; echo "----------------"; echo "FAIL: $*"; exit 1; }

"$RING" --local "$N" --write-fabric "$FABRIC" >/dev/null || { echo "FAIL: cannot write the fabric"; exit 1; }

torchrun_compat_flags "$PY" "$WORK/logs"
# The launcher looks at its workers every `monitor` seconds (and only then sees them exit). In the
# kill case that is longer than the survivors need to raise by themselves: it must not be the
# launcher that stops them.
monitor=1
case "$CASE" in
  collectives) script=check_collectives.py ;;
  ddp) script=check_ddp.py ;;
  kill) script=check_kill.py; monitor=10 ;;
  *) echo "FAIL: unknown case $CASE"; exit 2 ;;
esac

# The rendezvous on 127.0.0.1 and a free port (tests run side by side), and Gloo on the loopback
# interface: nothing depends on this machine's hostname resolving (`--standalone` hands the
# workers the hostname, which a fresh chroot or container may not resolve: every rank then failed
# in c10d). Another port when the first one was taken.
source "$HERE/../common/ports.sh"
start=$SECONDS
for attempt in 1 2 3; do
  PORT=$(free_port)
  if torchrun_works "$PY"; then
    timeout -k 10 240 env PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}" TBVERBS_LIBRARY="$EMU" TBVERBS_EMU_FABRIC="$FABRIC" \
      TBVERBS_EMU_HOST='host{rank}' OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo \
      "$PY" -m torch.distributed.run --nnodes 1 --node_rank 0 --master_addr 127.0.0.1 --master_port "$PORT" \
      --nproc_per_node "$N" --monitor_interval "$monitor" "${TORCHRUN_FLAGS[@]}" \
      "$HERE/$script" >"$OUT" 2>&1
  else # as torchrun would start them (emulated_job.sh)
    PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}" TBVERBS_LIBRARY="$EMU" TBVERBS_EMU_FABRIC="$FABRIC" \
      TBVERBS_EMU_HOST='host{rank}' OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo \
      timeout -k 10 240 bash -c 'source "$1"; start_ranks "$2" "$3" "$4" "$5"' _ "$HERE/../common/emulated_job.sh" "$N" "$PORT" \
      "$PY" "$HERE/$script" >"$OUT" 2>&1
  fi
  RC=$?
  grep -qiE "address already in use|EADDRINUSE" "$OUT" || break
  echo "note: attempt $attempt: port $PORT was taken; again on another port" >&2
done
elapsed=$((SECONDS - start))
[ $RC -ne 124 ] && [ $RC -ne 137 ] || fail "the job hung: killed after $elapsed s"

case "$CASE" in
  collectives | ddp)
    [ $RC -eq 0 ] || fail "torchrun exited $RC"
    for ((r = 0; r < N; r++)); do
      grep -Eq "^rank $r: ok: " "$OUT" || fail "rank $r did not report ok"
    done
    grep -E "^rank [0-9]+: ok: " "$OUT"
    ;;
  kill)
    victim=$((N - 2))
    [ $RC -ne 0 ] || fail "torchrun exited 0 although rank $victim was killed"
    grep -Eq "^rank $victim: killing myself" "$OUT" || fail "rank $victim did not get to kill itself"
    for ((r = 0; r < N; r++)); do
      [ $r -eq $victim ] && continue
      line=$(grep -E "^rank $r: raised after " "$OUT") || fail "rank $r did not raise"
      echo "$line" | grep -q "tbverbs" || fail "rank $r raised without tbverbs' message: $line"
      echo "$line"
    done
    ;;
esac
echo "ok: $CASE on $N ranks in $elapsed s"
