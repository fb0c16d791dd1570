#!/usr/bin/env bash
# all_sum benchmark on the emulated Thunderbolt fabric: ring_all_sum (examples/ring_all_sum) from
# 4 KiB to 256 MiB per rank at 2, 3, 4 and 8 ranks on a paced fabric (every cable direction B GB/s
# with L us of latency), reported in nccl-tests' conventions (algbw = bytes / time, busbw = algbw x
# 2(n-1)/n) and against the link model's ideal; and the emulator's unpaced point-to-point bandwidth
# (bench/p2p), the CPUs' limit, before and after the sweep.
#
#   bench/all_sum/run.sh [BUILD_DIR] [OUT_DIR]
#     BUILD_DIR  a configured build tree (default: build/release; configured with the release
#                preset, or a plain Release tree, when it does not exist)
#     OUT_DIR    where all_sum.csv, p2p.csv, busbw.svg/.png, time.svg/.png and summary.md go
#                (default: BUILD_DIR/bench/all_sum)
#
# Environment: RANKS (default "2 3 4 8"), MIN_SIZE (4K), MAX_SIZE (256M), DTYPE (float32),
# LINK_GBPS (0.25; 0: unpaced, no model), LINK_LATENCY_US (150), EXTRA (more ring_all_sum
# arguments, e.g. "--algorithm ring" or "--message-bytes 128K --window 4").
# The default link is Thunderbolt 5's (9.4 GB/s, 4 us: docs/field-reports.md section 4b) slowed
# down 37.6 times, bandwidth and latency alike: the CPUs of one machine are then not the limit,
# and the bandwidth-delay product (37.6 KB), which places the algorithms' crossover, is the real
# link's.
# Not part of the test suite: it takes minutes. Progress goes to the terminal as it happens.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$(pwd)
build=${1:-$root/build/release}
ranks_list=${RANKS:-2 3 4 8}
min_size=${MIN_SIZE:-4K}
max_size=${MAX_SIZE:-256M}
dtype=${DTYPE:-float32}
gbps=${LINK_GBPS:-0.25}
lat_us=${LINK_LATENCY_US:-150}
extra=${EXTRA:-}
paced=$(awk -v b="$gbps" 'BEGIN { print (b > 0) ? 1 : 0 }')

if [ ! -f "$build/CMakeCache.txt" ]; then
  if [ "$build" = "$root/build/release" ] && cmake --preset release >/dev/null 2>&1; then :; else
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTBVERBS_BUILD_TESTS=OFF >/dev/null
  fi
fi
echo "== building ring_all_sum and tbverbs_p2p_bench in $build"
cmake --build "$build" --parallel "$(nproc 2>/dev/null || echo 2)" --target ring_all_sum tbverbs_p2p_bench >/dev/null
out=${2:-$build/bench/all_sum}
mkdir -p "$out"
ring="$build/examples/ring_all_sum/ring_all_sum"
p2p="$build/bench/p2p/tbverbs_p2p_bench"
for b in "$ring" "$p2p"; do [ -x "$b" ] || { echo "run.sh: $b was not built" >&2; exit 1; }; done

csv="$out/all_sum.csv"
p2pcsv="$out/p2p.csv"
# ring_all_sum's --csv columns, after the rank count; then the algorithm, the model's ideal time
# and the ratio of the measured time to it (1 = the model's floor; lower is impossible).
echo "ranks,size_bytes,count,type,redop,place,time_us,algbw_gbps,busbw_gbps,wrong,algorithm,ideal_us,time_over_ideal" >"$csv"
echo "pass,kind,bytes,count,seconds,emu_GBps,memcpy_GBps,ratio" >"$p2pcsv"

p2p_pass() {  # $1 = pass name
  echo "== point-to-point (bench/p2p, unpaced: the CPUs' limit), $1"
  "$p2p" --max 67108864 >"$out/p2p-$1.txt"
  grep -E '^bw,(4194304|67108864),|ratio' "$out/p2p-$1.txt" || true
  grep -E '^bw,' "$out/p2p-$1.txt" | sed "s/^/$1,/" >>"$p2pcsv"
}

# The model's floor for an all_sum of s bytes per rank on a ring of n: every rank sends at least
# 2(n-1)/n x s over its two outgoing cable directions (time (n-1)s/(nB)), and the vector of the
# rank floor(n/2) hops away must reach it (time floor(n/2) L). Unpaced: no model (0).
ideal_us() {  # n, bytes
  awk -v n="$1" -v s="$2" -v b="$gbps" -v l="$lat_us" 'BEGIN {
    if (b <= 0) { print 0; exit }
    bw = (n - 1) * s / (n * b * 1e3); lt = int(n / 2) * l
    printf "%.3f", (bw > lt ? bw : lt) }'
}

link_args=()
if [ "$paced" = 1 ]; then
  link_args=(--link-gbps "$gbps" --link-latency-us "$lat_us")
  echo "== link model: every cable direction B = $gbps GB/s, L = $lat_us us; ideal ring busbw 2B = $(awk -v b="$gbps" 'BEGIN{print 2*b}') GB/s"
fi
p2p_pass before
for n in $ranks_list; do
  echo "== all_sum, $n ranks, $min_size .. $max_size ($dtype, out of place and in place)"
  log="$out/all_sum-$n.txt"
  # The table as it comes (line-buffered: one row per size as soon as it is measured) ...
  # shellcheck disable=SC2086
  "$ring" --local "$n" -b "$min_size" -e "$max_size" --dtype "$dtype" --quiet --timeout 120000 "${link_args[@]}" \
    $extra | tee "$log" | grep --line-buffered -E '^\[rank 0\] |FAILED|^link model' | sed -u 's/^\[rank 0\] //'
  if ! grep -q "launcher: all $n ranks exited 0" "$log" || ! grep -q "# Wrong elements       : 0 OK" "$log"; then
    echo "run.sh: the $n-rank sweep failed; see $log" >&2
    exit 1
  fi
  # ... then the same sizes as CSV for the files (a short second run would double the time: the
  # rows are taken from the table instead).
  awk -v n="$n" '/^\[rank 0\] +[0-9]+ +[0-9]+ +[a-z0-9]+ +sum / {
      sub(/^\[rank 0\] +/, "")
      if ($6 != "-") printf "%d,%s,%s,%s,%s,out,%s,%s,%s,%s,%s\n", n, $1, $2, $3, $4, $6, $7, $8, $9, $5
      if ($10 != "-") printf "%d,%s,%s,%s,%s,in,%s,%s,%s,%s,%s\n", n, $1, $2, $3, $4, $10, $11, $12, $13, $5
    }' "$log" | while IFS=, read -r rn size count type redop place t alg bus wrong algo; do
      ideal=$(ideal_us "$rn" "$size")
      ratio=$(awk -v t="$t" -v i="$ideal" 'BEGIN { if (i > 0) printf "%.3f", t / i; else print "" }')
      echo "$rn,$size,$count,$type,$redop,$place,$t,$alg,$bus,$wrong,$algo,$ideal,$ratio"
    done >>"$csv"
done
p2p_pass after

# The unpaced reference: the emulator's point-to-point bandwidth with 64 MiB messages, the mean of
# the two passes; and its peak over message sizes.
p2p64=$(awk -F, '$2=="bw" && $3==67108864 {s+=$6; n++} END {if (n) printf "%.3f", s/n}' "$p2pcsv")
p2ppeak=$(awk -F, '$2=="bw" && $6>m {m=$6} END {printf "%.3f", m}' "$p2pcsv")
big=$(awk -F, 'NR > 1 && $6 == "out" && $2 > m {m = $2} END {print m + 0}' "$csv")
small=$(awk -F, 'NR > 1 && $6 == "out" && (m == "" || $2 < m) {m = $2} END {print m + 0}' "$csv")

{
  echo "# all_sum on the emulated Thunderbolt fabric"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs ($(lscpu 2>/dev/null | sed -n 's/^Model name: *//p')), $dtype, load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)."
  if [ "$paced" = 1 ]; then
    echo "Link model: every cable direction B = $gbps GB/s, L = $lat_us us. busbw = algbw x 2(n-1)/n (nccl-tests);"
    echo "the model's floor of an all_sum of s bytes per rank is max((n-1)s/(nB), floor(n/2) L): busbw at most 2B."
  else
    echo "Unpaced fabric (the CPUs are the limit). busbw = algbw x 2(n-1)/n (nccl-tests)."
  fi
  echo
  echo "Out of place, busbw in GB/s (algorithm; time over the model's floor in brackets when paced):"
  echo
  printf '| size |'; for n in $ranks_list; do printf ' %s ranks |' "$n"; done; echo
  printf '|---:|'; for n in $ranks_list; do printf -- '---:|'; done; echo
  awk -F, -v list="$ranks_list" 'NR > 1 && $6 == "out" { v[$2","$1] = $9 " (" $11 ($13 != "" ? "; " $13 : "") ")"; if (!($2 in seen)) { seen[$2] = 1; order[++k] = $2 } }
    END {
      n = split(list, R, " ")
      for (i = 1; i <= k; i++) {
        s = order[i]; u = s + 0
        if (u >= 1048576) lab = (u / 1048576) " MiB"; else if (u >= 1024) lab = (u / 1024) " KiB"; else lab = u " B"
        printf "| %s |", lab
        for (j = 1; j <= n; j++) printf " %s |", v[s "," R[j]]
        printf "\n"
      }
    }' "$csv"
  echo
  echo "GB/s = 10^9 bytes per second. Every run verified by every rank (#wrong 0)."
  echo
  if [ "$paced" = 1 ]; then
    echo "Ratios to the model:"
    echo
    for n in $ranks_list; do
      awk -F, -v n="$n" -v big="$big" -v small="$small" -v b="$gbps" -v l="$lat_us" '
        NR > 1 && $1 == n && $6 == "out" && $2 == big { bb = $9 }
        NR > 1 && $1 == n && $6 == "out" && $2 == small { st = $7 }
        END {
          printf "- %d ranks: %d bytes: busbw %.4f GB/s = **%.3f** of 2B; %d bytes: %.1f us = **%.3f** of floor(n/2) L = %.0f us, %.3f of 2L\n",
            n, big, bb, bb / (2 * b), small, st, st / (int(n / 2) * l), int(n / 2) * l, st / (2 * l)
        }' "$csv"
    done
    echo
  fi
  echo "- unpaced point-to-point bandwidth, 64 MiB messages (mean of the passes before and after): $p2p64 GB/s; peak over sizes: $p2ppeak GB/s"
} >"$out/summary.md"

if command -v gnuplot >/dev/null 2>&1; then
  # One data file per rank count, out of place: size, time, busbw, the model's floor (time, busbw).
  for n in $ranks_list; do
    awk -F, -v n="$n" 'NR > 1 && $1 == n && $6 == "out" {
      printf "%s %s %s %s %s\n", $2, $7, $9, $12, ($12 > 0 ? $2 * 2 * (n - 1) / n / ($12 * 1e3) : "NaN") }' "$csv" >"$out/plot-$n.dat"
  done
  plot() {  # terminal, file, column (3 busbw, 2 time), y label
    local curves="" first=1 n
    for n in $ranks_list; do
      [ $first -eq 1 ] || curves+=", "; first=0
      curves+="'$out/plot-$n.dat' using 1:$3 with linespoints title '$n ranks'"
      [ "$paced" = 1 ] && curves+=", '$out/plot-$n.dat' using 1:$(($3 + 2)) with lines dashtype 2 title 'model floor, $n ranks'"
    done
    gnuplot <<GP
set terminal $1 size 900,560
set output "$2"
set logscale x 2
set logscale y 10
set format x "%.0b%B"
set xlabel "bytes per rank"
set ylabel "$4"
set title "all\\\\_sum on the emulated Thunderbolt fabric, $model ($dtype, out of place)"
set key left top
set grid
plot $curves
GP
  }
  model=$([ "$paced" = 1 ] && echo "B = $gbps GB/s, L = $lat_us us per cable direction" || echo "unpaced")
  { plot svg "$out/busbw.svg" 3 "bus bandwidth (GB/s)" && plot pngcairo "$out/busbw.png" 3 "bus bandwidth (GB/s)" &&
    plot svg "$out/time.svg" 2 "time (us)" && plot pngcairo "$out/time.png" 2 "time (us)"; } ||
    echo "run.sh: gnuplot failed; the CSV and the summary are complete" >&2
else
  echo "run.sh: no gnuplot (apt-get install gnuplot-nox); no plots" >&2
fi

echo
cat "$out/summary.md"
echo
echo "files: $csv $p2pcsv $out/summary.md $out/busbw.svg $out/busbw.png $out/time.svg $out/time.png"
