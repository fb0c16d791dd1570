#!/usr/bin/env bash
# The torch.distributed backend against the collectives layer called from C++ and against Gloo, in
# one sitting on one emulated ring (issue 23's target: the backend at least 0.9x the layer's
# 64 MiB all_reduce bandwidth). Not part of the suite (about a minute of 2 busy cores).
#   bench/torch/compare.sh BUILD_DIR [RANKS] [BYTES] [ITERS]
# BUILD_DIR: a build with the emulator, examples, tests and the backend (an optimized one gives the
# figures that mean something: cmake --preset release && cmake --build --preset release).
set -eu
build=$(cd "${1:?usage: compare.sh BUILD_DIR [RANKS] [BYTES] [ITERS]}" && pwd)
ranks=${2:-4}; bytes=${3:-$((64 << 20))}; iters=${4:-10}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../../tests/common/emulated_job.sh"
# The Python the backend was built for (python/CMakeLists.txt caches it).
py=$(sed -n 's/^TBVERBS_TORCH_PYTHON_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
[ -x "${py:-}" ] || { echo "compare.sh: $build has no torch backend (no Python with torch at configure)" >&2; exit 2; }
work=$(mktemp -d /tmp/tbverbs-torch-bench-XXXXXX)
fabric=$work/fabric.json
trap 'remove_fabric_state "$build/emulator/bin/tbverbs-emu" "$fabric"; rm -rf "$work"' EXIT
"$build/examples/ring_all_sum/ring_all_sum" --local "$ranks" --write-fabric "$fabric" >/dev/null
emu=$build/emulator/lib/libtbverbs_emu.so

echo "== the layer from C++ (tests/collective/comm_check --bench), $ranks ranks"
"$build/tests/collective/tbverbs_comm_check" --local "$ranks" --bench "$bytes" --iters "$iters" 2>&1 |
  grep -E "^(\[rank 0\] )?bench:" | sed 's/^\[rank 0\] //' | tee "$work/layer.txt"

echo "== torch.distributed: tbverbs, then Gloo, $ranks ranks"
torchrun_compat_flags "$py" "$work/logs"
export PYTHONPATH="$build/python" TBVERBS_LIBRARY="$emu" TBVERBS_EMU_FABRIC="$fabric" TBVERBS_EMU_HOST='host{rank}' \
  OMP_NUM_THREADS=1 BENCH_BYTES="$bytes" BENCH_ITERS="$iters" GLOO_SOCKET_IFNAME=lo
if torchrun_works "$py"; then
  "$py" -m torch.distributed.run --standalone --nproc_per_node "$ranks" --monitor_interval 1 "${TORCHRUN_FLAGS[@]}" \
    "$here/allreduce.py" 2>&1 | tee "$work/torch.log" | grep -E "^torch " | tee "$work/torch.txt"
else # Debian 13's torch: the ranks as torchrun would start them
  source "$here/../../tests/common/ports.sh"
  start_ranks "$ranks" "$(free_port)" "$py" "$here/allreduce.py" 2>&1 | tee "$work/torch.log" | grep -E "^torch " | tee "$work/torch.txt"
fi

[ -s "$work/torch.txt" ] || { echo "compare.sh: the torch job printed no figure:" >&2; tail -20 "$work/torch.log" >&2; exit 1; }
layer=$(sed -nE 's/.*busbw ([0-9.]+) GB\/s.*/\1/p' "$work/layer.txt")
ours=$(sed -nE 's/^torch tbverbs: .*busbw ([0-9.]+) GB\/s.*/\1/p' "$work/torch.txt")
gloo=$(sed -nE 's/^torch gloo: .*busbw ([0-9.]+) GB\/s.*/\1/p' "$work/torch.txt")
awk -v l="$layer" -v o="$ours" -v g="$gloo" 'BEGIN {
  printf "backend / layer from C++: %.2f (target >= 0.9)\nbackend / Gloo: %.2f\n", o / l, o / g }'
