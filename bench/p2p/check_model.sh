#!/usr/bin/env bash
# Runs tbverbs_p2p_bench on a paced link and holds what it measures to the link model
# (docs/emulator.md, "Link pacing"): the bandwidth of every size within 5% of B, and the latency
# (one-way time minus bytes / B) no lower than L (the model never delivers early) and at most 10%
# above it.
#   usage: check_model.sh BENCH GBPS LATENCY_US [more bench options]
# Exit 0 when every row is within its tolerance, 1 (naming the rows) when not, 2 on a usage or
# bench failure.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 BENCH GBPS LATENCY_US [bench options]" >&2; exit 2; }
bench=$1 gbps=$2 lat=$3
shift 3
out=$("$bench" --link-gbps "$gbps" --link-latency-us "$lat" "$@") || { echo "check_model: the bench failed" >&2; exit 2; }
echo "$out"
# Columns: kind,bytes,count,seconds,measured,...,model (8),ratio_to_model (9).
# The machine's load goes into a failure message: a timing bound fails under other work.
echo "$out" | awk -F, -v load="$(cut -d' ' -f1-4 /proc/loadavg 2>/dev/null)" -v cpus="$(nproc 2>/dev/null)" '
  $1 == "bw"   { n_bw++; if ($9 < 0.95 || $9 > 1.05) { bad = bad sprintf("  bw %s bytes: %s GB/s is %s of the model %s (allowed 0.95 to 1.05)\n", $2, $5, $9, $8) } }
  $1 == "link" { n_lat++; if ($9 < 1.0 || $9 > 1.10) { bad = bad sprintf("  latency: %s us is %s of the model %s (allowed 1.00 to 1.10)\n", $5, $9, $8) } }
  END {
    if (n_bw == 0 || n_lat == 0) { print "check_model: the bench printed no bw or link rows"; exit 2 }
    if (bad != "") { printf "check_model: outside the model (load average %s, %s CPUs):\n%s", load, cpus, bad; exit 1 }
    printf "check_model: %d bandwidth rows within 5%% of the model, latency within 10%%\n", n_bw
  }'
