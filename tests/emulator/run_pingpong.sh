#!/bin/sh
# Runs an unmodified ibverbs-utils pingpong (server on hostA, client on hostB) over
# the emulator through LD_LIBRARY_PATH. Every wait is bounded.
# usage: run_pingpong.sh <libdir> <cli> <fabric.json> <program> <tcp-port> [pingpong args...]
set -u
libdir=$1 cli=$2 fabric=$3 prog=$4 port=$5
shift 5
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TBVERBS_EMU_FABRIC="$fabric"
"$cli" --fabric "$fabric" reset || exit 1
log=$(mktemp)
TBVERBS_EMU_HOST=hostA timeout 60 "$prog" -p "$port" "$@" >"$log" 2>&1 &
server=$!
# The client fails if it connects before the server listens: retry a few times.
rc=1
for i in 1 2 3 4 5 6 7 8 9 10; do
  sleep 0.3
  TBVERBS_EMU_HOST=hostB timeout 60 "$prog" -p "$port" "$@" localhost && { rc=0; break; }
  kill -0 $server 2>/dev/null || break
done
wait $server
src=$?
echo "--- server output:"
cat "$log"
rm -f "$log"
echo "client rc=$rc server rc=$src"
[ $rc -eq 0 ] && [ $src -eq 0 ]
