#!/usr/bin/env bash
# Counts the instructions of the raw and the tbverbs post/poll loops in one callgrind run,
# against two provider models, and checks the realistic ("ring") ratio against a limit.
# Usage: run.sh path/to/tbverbs_bench_overhead [iterations] [max-ratio]
set -euo pipefail
bin=$1; iters=${2:-100000}; max=${3:-1.01}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
valgrind --tool=callgrind --separate-callers=2 --callgrind-out-file="$out/cg.out" "$bin" "$iters" >/dev/null 2>"$out/vg.log"
callgrind_annotate --inclusive=yes "$out/cg.out" > "$out/annotate.txt"
# With --separate-callers=2 each loop appears once per model, e.g. "raw_path(...)'run_model(...)'ring_model(...)".
cost() { awk -v f="$1" -v m="$2" 'index($0, f) && index($0, m) {gsub(",", "", $1); print $1; exit}' "$out/annotate.txt"; }
status=0
# Three wrapped loops per model: send() and post(SendWr::send(...)) with the fused
# poll(out, consume), held to the limit; send() with poll(out) and a second loop over the batch,
# reported only.
for model in empty ring; do
  raw=$(cost ":raw_path(" "${model}_model(")
  for loop in tbverbs builder span; do
    wrapped=$(cost ":${loop}_path(" "${model}_model(")
    if [ -z "$raw" ] || [ -z "$wrapped" ]; then echo "overhead: loops not found in callgrind output" >&2; exit 2; fi
    ratio=$(awk -v a="$wrapped" -v b="$raw" 'BEGIN {printf "%.4f", a / b}')
    per=$(awk -v a="$wrapped" -v b="$raw" -v n="$iters" 'BEGIN {printf "%.1f", (a - b) / n}')
    echo "$model provider, $loop loop: raw $raw, wrapped $wrapped instructions over $iters post+poll; ratio $ratio; +$per per iteration"
    if [ "$model" = ring ] && [ "$loop" != span ]; then awk -v r="$ratio" -v m="$max" 'BEGIN {exit !(r <= m)}' || status=1; fi
  done
done
[ $status -eq 0 ] && echo "ring-provider ratio within $max" || echo "ring-provider ratio above $max"
exit $status
