#!/bin/sh
# Runs an unmodified RDMA program pair over the emulator (server on hostA, client on hostB)
# through LD_LIBRARY_PATH: perftest, rdmacm-utils and the like, whose client and server take
# different arguments. Every wait is bounded; the last line says both exit codes.
# usage: run_pair.sh <libdir> <cli> <fabric.json> <server command...> --client <client command...>
set -u
libdir=$1 cli=$2 fabric=$3
shift 3
server=""
while [ $# -gt 0 ] && [ "$1" != "--client" ]; do server="$server '$1'"; shift; done
[ $# -gt 0 ] || { echo "run_pair.sh: no --client"; exit 2; }
shift
client=""
for a in "$@"; do client="$client '$a'"; done
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TBVERBS_EMU_FABRIC="$fabric"
"$cli" --fabric "$fabric" reset || exit 1
slog=$(mktemp) clog=$(mktemp)
eval "TBVERBS_EMU_HOST=hostA timeout 60 $server" >"$slog" 2>&1 &
spid=$!
# The client fails while the server is not listening yet: retry a few times.
rc=1
for i in 1 2 3 4 5 6 7 8 9 10; do
  sleep 0.3
  if eval "TBVERBS_EMU_HOST=hostB timeout 60 $client" >"$clog" 2>&1; then rc=0; break; fi
  kill -0 $spid 2>/dev/null || break
done
wait $spid
src=$?
echo "--- client output:"
cat "$clog"
echo "--- server output:"
cat "$slog"
rm -f "$slog" "$clog"
echo "client rc=$rc server rc=$src"
[ $rc -eq 0 ] && [ $src -eq 0 ]
