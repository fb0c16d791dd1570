# Sourced by the test scripts that start ranks by hand with a coordinator address (host:port).
#
# free_port prints a TCP port for a coordinator to listen on. A port picked at random from
# anywhere can be held at that moment by an outgoing connection of a test running beside it (the
# kernel hands those out from its ephemeral range, 32768-60999 on Linux by default): CI saw rank 0
# of one test refused with EADDRINUSE on such a port. So the port is random below the ephemeral
# range and not bound by any socket now (/proc/net/tcp*, where there is one). Two tests can still
# draw the same port in the same instant; the callers retry on EADDRINUSE (retry_on_port_taken).
free_port() {
  local lo=32768 hi base=20000 span p hex used=""
  if [ -r /proc/sys/net/ipv4/ip_local_port_range ]; then
    read -r lo hi </proc/sys/net/ipv4/ip_local_port_range || lo=32768
  fi
  # An ephemeral range starting low (a tuned kernel) leaves [1024, lo); none at all below: above it.
  if [ "$lo" -le $((base + 1000)) ]; then base=1024; fi
  span=$((lo - base))
  if [ "$span" -lt 1000 ]; then base=$((hi + 1)); span=$((65536 - base)); fi
  [ -r /proc/net/tcp ] && used=$(awk 'NR > 1 { split($2, a, ":"); print a[2] }' /proc/net/tcp /proc/net/tcp6 2>/dev/null)
  for _ in 1 2 3 4 5 6 7 8; do
    p=$((base + (RANDOM * 32768 + RANDOM) % span))
    printf -v hex '%04X' "$p"
    grep -qx "$hex" <<<"$used" || break
  done
  echo "$p"
}

# retry_on_port_taken FUNCTION [args...]: sets PORT to free_port and runs FUNCTION (which starts
# the ranks and leaves what they printed in $OUT); again with a new port, up to 3 attempts in
# all, while $OUT says a rank could not listen (EADDRINUSE). Returns FUNCTION's status.
retry_on_port_taken() {
  local attempt rc
  for attempt in 1 2 3; do
    PORT=$(free_port)
    "$@"; rc=$?
    grep -q "EADDRINUSE" "$OUT" 2>/dev/null || break
    echo "note: attempt $attempt: port $PORT was taken; again on another port" >&2
  done
  return $rc
}
