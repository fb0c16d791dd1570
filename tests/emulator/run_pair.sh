#!/bin/sh
# Runs an unmodified RDMA program pair over the emulator (server on hostA, client on hostB)
# through LD_LIBRARY_PATH: perftest, rdmacm-utils and the like, whose client and server take
# different arguments. Every wait is bounded; the last line says both exit codes.
# usage: run_pair.sh <libdir> <cli> <fabric.json> [--cm-port N] <server command...> --client <client command...>
# --cm-port: the server listens through the emulated rdma_cm on port N; the client starts once
# the listener exists in the state directory, and is not retried (a retried rdma_cm client can
# meet a server that already took part of an earlier attempt's connection).
set -u
libdir=$1 cli=$2 fabric=$3
shift 3
cm_port=""
if [ "${1:-}" = "--cm-port" ]; then cm_port=$2; shift 2; fi
server=""
while [ $# -gt 0 ] && [ "$1" != "--client" ]; do server="$server '$1'"; shift; done
[ $# -gt 0 ] || { echo "run_pair.sh: no --client"; exit 2; }
shift
client=""
for a in "$@"; do client="$client '$a'"; done
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TBVERBS_EMU_FABRIC="$fabric"
# perftest's latency tests time with the CPU's cycle counter, whose rate they first estimate; on a
# loaded machine the estimate can fail ("Correlation coefficient r^2: 0.88 < 0.9") and every
# figure is then "inf" although every exchange went through. That is perftest's clock, not the
# run: such a run (and only such a run) is run again, up to 3 runs in all; each one's output is
# printed (a repeated one with a prefix).
for run in 1 2 3; do
  "$cli" --fabric "$fabric" reset || exit 1
  slog=$(mktemp) clog=$(mktemp)
  eval "TBVERBS_EMU_HOST=hostA timeout 60 $server" >"$slog" 2>&1 &
  spid=$!
  attempts="1 2 3 4 5 6 7 8 9 10"
  if [ -n "$cm_port" ]; then
    state=$("$cli" --fabric "$fabric" state-dir) || exit 1
    for i in $(seq 1 100); do  # 10 s at most
      ls "$state"/cm-*-"$cm_port" >/dev/null 2>&1 && break
      kill -0 $spid 2>/dev/null || break
      sleep 0.1
    done
    attempts=1
  fi
  # Otherwise the client fails while the server is not listening yet: retry a few times.
  rc=1
  for i in $attempts; do
    sleep 0.3
    echo "[attempt $i]" >>"$clog"
    if eval "TBVERBS_EMU_HOST=hostB timeout 60 $client" >>"$clog" 2>&1; then rc=0; break; fi
    kill -0 $spid 2>/dev/null || break
  done
  wait $spid
  src=$?
  again=0
  [ $run -lt 3 ] && grep -q "Correlation coefficient r^2: .* < 0.9" "$clog" "$slog" && again=1
  # A run that is repeated is printed with a prefix, so the tests' expressions (result rows at the
  # start of a line, "client rc=0 server rc=0") only ever match the run that counts.
  prefix=""
  [ $again -eq 1 ] && prefix="[run $run, repeated] "
  { echo "--- client output (every attempt):"; cat "$clog"; echo "--- server output:"; cat "$slog"; } | sed "s/^/$prefix/"
  rm -f "$slog" "$clog"
  [ $again -eq 1 ] || break
  echo "[perftest could not estimate its clock rate (r^2 < 0.9): run $((run + 1)) of at most 3]"
done
echo "client rc=$rc server rc=$src"
[ $rc -eq 0 ] && [ $src -eq 0 ]
