#!/usr/bin/env bash
# all_sum benchmark on the emulated Thunderbolt fabric: the ring all_sum of examples/ring_all_sum
# from 4 KiB to 256 MiB per rank at 2, 3, 4 and 8 ranks, with algorithm and bus bandwidth in the
# conventions of nccl-tests (algbw = bytes / time, busbw = algbw * 2(n-1)/n), and the emulator's
# point-to-point bandwidth (bench/p2p) measured in the same run, before and after the sweep.
#
#   bench/all_sum/run.sh [BUILD_DIR] [OUT_DIR]
#     BUILD_DIR  a configured build tree (default: build/release; configured with the release
#                preset, or a plain Release tree, when it does not exist)
#     OUT_DIR    where all_sum.csv, p2p.csv, busbw.svg/.png and summary.md go (default:
#                BUILD_DIR/bench/all_sum)
#
# Environment: RANKS (default "2 3 4 8"), MIN_SIZE (4K), MAX_SIZE (256M), DTYPE (float32),
# EXTRA (more ring_all_sum arguments, e.g. "--message-bytes 128K --window 4").
# Not part of the test suite: it takes minutes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$(pwd)
build=${1:-$root/build/release}
ranks_list=${RANKS:-2 3 4 8}
min_size=${MIN_SIZE:-4K}
max_size=${MAX_SIZE:-256M}
dtype=${DTYPE:-float32}
extra=${EXTRA:-}

if [ ! -f "$build/CMakeCache.txt" ]; then
  if [ "$build" = "$root/build/release" ] && cmake --preset release >/dev/null 2>&1; then :; else
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTBVERBS_BUILD_TESTS=OFF >/dev/null
  fi
fi
cmake --build "$build" --parallel "$(nproc 2>/dev/null || echo 2)" --target ring_all_sum tbverbs_p2p_bench >/dev/null
out=${2:-$build/bench/all_sum}
mkdir -p "$out"
ring="$build/examples/ring_all_sum/ring_all_sum"
p2p="$build/bench/p2p/tbverbs_p2p_bench"
for b in "$ring" "$p2p"; do [ -x "$b" ] || { echo "run.sh: $b was not built" >&2; exit 1; }; done

csv="$out/all_sum.csv"
p2pcsv="$out/p2p.csv"
echo "ranks,bytes,dtype,inplace,iters,time_us,algbw_GBps,busbw_GBps,check" >"$csv"
echo "pass,kind,bytes,count,seconds,emu_GBps,memcpy_GBps,ratio" >"$p2pcsv"

p2p_pass() {  # $1 = pass name
  echo "== point-to-point (bench/p2p), $1"
  "$p2p" --max 67108864 | tee "$out/p2p-$1.txt" | grep -E '^bw,(4194304|67108864),|ratio' || true
  grep -E '^bw,' "$out/p2p-$1.txt" | sed "s/^/$1,/" >>"$p2pcsv"
}

p2p_pass before
for n in $ranks_list; do
  echo "== all_sum, $n ranks, $min_size .. $max_size ($dtype, out of place)"
  # shellcheck disable=SC2086
  "$ring" --local "$n" --size "$min_size" --max-size "$max_size" --dtype "$dtype" --place out --csv --quiet \
    --timeout 120000 $extra | tee "$out/all_sum-$n.txt" | grep -E 'all_sum|FAILED|launcher: FAILED' | sed 's/^\[rank 0\] //'
  grep -E '^\[rank 0\] csv,' "$out/all_sum-$n.txt" | sed 's/^\[rank 0\] csv,//' >>"$csv"
  if ! grep -q "launcher: all $n ranks exited 0" "$out/all_sum-$n.txt"; then
    echo "run.sh: the $n-rank sweep failed; see $out/all_sum-$n.txt" >&2
    exit 1
  fi
done
p2p_pass after

# The reference: the emulator's point-to-point bandwidth with 64 MiB messages (the same bytes as
# the 64 MiB all_sum), the mean of the two passes; and its peak over message sizes.
p2p64=$(awk -F, '$2=="bw" && $3==67108864 {s+=$6; n++} END {if (n) printf "%.3f", s/n}' "$p2pcsv")
p2ppeak=$(awk -F, '$2=="bw" && $6>m {m=$6} END {printf "%.3f", m}' "$p2pcsv")
bus64=$(awk -F, '$1==4 && $2==67108864 {print $8}' "$csv")

{
  echo "# all_sum on the emulated Thunderbolt fabric"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs ($(lscpu 2>/dev/null | sed -n 's/^Model name: *//p')), $dtype, out of place."
  echo "busbw = algbw x 2(n-1)/n (nccl-tests). Point-to-point: bench/p2p, one sender and one receiver process."
  echo
  printf '| size |'; for n in $ranks_list; do printf ' %s ranks algbw | %s ranks busbw |' "$n" "$n"; done; echo
  printf '|---:|'; for n in $ranks_list; do printf -- '---:|---:|'; done; echo
  awk -F, -v list="$ranks_list" 'NR > 1 { a[$2","$1] = $7; b[$2","$1] = $8; if (!($2 in seen)) { seen[$2] = 1; order[++k] = $2 } }
    END {
      n = split(list, R, " ")
      for (i = 1; i <= k; i++) {
        s = order[i]; u = s + 0
        if (u >= 1048576) lab = (u / 1048576) " MiB"; else if (u >= 1024) lab = (u / 1024) " KiB"; else lab = u " B"
        printf "| %s |", lab
        for (j = 1; j <= n; j++) printf " %s | %s |", a[s "," R[j]], b[s "," R[j]]
        printf "\n"
      }
    }' "$csv"
  echo
  echo "GB/s = 10^9 bytes per second."
  echo
  echo "- point-to-point bandwidth, 64 MiB messages (mean of the passes before and after): **$p2p64 GB/s**; peak over sizes: $p2ppeak GB/s"
  if [ -n "$bus64" ] && [ -n "$p2p64" ]; then
    echo "- 4 ranks, 64 MiB: busbw **$bus64 GB/s** = **$(awk -v a="$bus64" -v b="$p2p64" 'BEGIN{printf "%.2f", a/b}')** of the point-to-point bandwidth (target 0.7); $(awk -v a="$bus64" -v b="$p2ppeak" 'BEGIN{printf "%.2f", a/b}') of the peak"
  fi
} >"$out/summary.md"

if command -v gnuplot >/dev/null 2>&1; then
  plot() {  # $1 = terminal, $2 = file
    gnuplot <<GP
set terminal $1 size 900,560
set output "$2"
set datafile separator ","
set logscale x 2
set format x "%.0b%B"
set xlabel "bytes per rank"
set ylabel "bus bandwidth (GB/s)"
set title "ring all\\\\_sum on the emulated Thunderbolt fabric ($dtype, busbw = algbw x 2(n-1)/n)"
set key right bottom
set grid
p2p = ${p2p64:-0}
plot $(first=1; for n in $ranks_list; do [ $first -eq 1 ] || printf ', '; first=0; printf '"%s" using ($1==%s ? $2 : 1/0):8 every ::1 with linespoints title "%s ranks"' "$csv" "$n" "$n"; done), p2p with lines dashtype 2 title "point-to-point, 64 MiB messages"
GP
  }
  plot "svg" "$out/busbw.svg" && plot "pngcairo" "$out/busbw.png" || true
fi

echo
cat "$out/summary.md"
echo
echo "files: $csv $p2pcsv $out/summary.md $out/busbw.svg $out/busbw.png"
