#!/usr/bin/env bash
# ring_all_sum and tbverbs-probe started as the common launchers start them (issue 13;
# tools/common/launcher_env.hpp): two ranks by hand on the emulated fabric, with only the
# variables that launcher sets (plus a coordinator where it has none of its own).
#   launchers_test.sh RING PROBE EMU_LIBRARY CASE
# CASE: torchrun | openmpi | pmi | slurm | mpirun_in_slurm | refusals | probe_torchrun
set -u
RING=$1 PROBE=$2 LIB=$3 CASE=$4
WORK=$(mktemp -d /tmp/tbverbs-launchers-test-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
OUT=$WORK/out.txt
FABRIC=$WORK/fabric.json
fail() { echo "---- output ----"; cat "$OUT" 2>/dev/null; echo "----------------"; echo "FAIL: $*"; exit 1; }
expect() { grep -Eq -- "$1" "$OUT" || fail "expected a line matching: $1"; }
expect_not() { ! grep -Eq -- "$1" "$OUT" || fail "unexpected line matching: $1"; }
# Every launcher variable unset, so the test sees only what it sets (ctest may run under one).
LAUNCHER_VARS=(JACCL_RANK MLX_RANK MLX_WORLD_SIZE JACCL_COORDINATOR MLX_JACCL_COORDINATOR JACCL_IBV_DEVICES
               MLX_IBV_DEVICES TBVERBS_RANKS RANK WORLD_SIZE MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK
               OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE SLURM_PROCID SLURM_NTASKS)
UNSET=()
for v in "${LAUNCHER_VARS[@]}"; do UNSET+=(-u "$v"); done
source "$(dirname "$0")/../../tests/common/ports.sh"
PORT=$(free_port)  # for the refusals (nothing listens); two_ranks picks its own

"$RING" --local 2 --write-fabric "$FABRIC" >/dev/null || fail "cannot write the fabric"
EMU_ENV=(TBVERBS_EMU_FABRIC="$FABRIC" TBVERBS_LIBRARY="$LIB" TBVERBS_EMU_STATE_DIR="$WORK/state")

# two_ranks PROGRAM "VARS for rank 0" "VARS for rank 1" [args...]: both ranks in the background,
# each on its own host of the fabric, each with a 60 s bound; @PORT@ in VARS and args is the
# coordinator's port (another one if it was taken); fails if a rank exits non-zero.
two_ranks() {
  retry_on_port_taken start_two_ranks "$@" || fail "a rank exited non-zero"
}
start_two_ranks() {
  local prog=$1 vars0=$2 vars1=$3; shift 3
  local pids=() r rcs=0 vars args=("${@//@PORT@/$PORT}")
  for r in 0 1; do
    vars=$vars0; [ $r -eq 1 ] && vars=$vars1
    vars=${vars//@PORT@/$PORT}
    # shellcheck disable=SC2086
    env "${UNSET[@]}" "${EMU_ENV[@]}" TBVERBS_EMU_HOST=host$r $vars timeout 60 "$prog" "${args[@]}" >"$WORK/rank$r.txt" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rcs=1; done
  cat "$WORK/rank0.txt" "$WORK/rank1.txt" >"$OUT"
  return $rcs
}
ring_two_ranks() {
  two_ranks "$RING" "$@" --size 1M --iters 1 --timeout 20000
  expect "^rank 0: ring order 0 -> 1 -> 0 \(discovered, no device file\)"
  expect "# Wrong elements       : 0 OK"
  expect_not "MISMATCH|FAILED"
}
# refuse "REGEX" VARS [args...]: one ring process with VARS must exit non-zero saying REGEX.
refuse() {
  local want=$1 vars=$2; shift 2
  # shellcheck disable=SC2086
  env "${UNSET[@]}" "${EMU_ENV[@]}" TBVERBS_EMU_HOST=host0 $vars timeout 60 "$RING" --size 1M --iters 1 "$@" >"$OUT" 2>&1
  local rc=$?
  [ $rc -ne 0 ] || fail "exited 0 with $vars"
  expect "$want"
  echo "ok: [$vars] refused: $(grep -Em1 -- "$want" "$OUT")"
}

case "$CASE" in
  torchrun)
    # torchrun: RANK, WORLD_SIZE (the number of ranks: no --ranks), MASTER_ADDR and MASTER_PORT.
    ring_two_ranks "RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=@PORT@" \
                   "RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=@PORT@"
    echo "ok: RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, two ranks, verified"
    ;;
  openmpi)
    # mpirun: OMPI_COMM_WORLD_RANK and _SIZE; the coordinator from the command line.
    ring_two_ranks "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2" "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2" \
                   --coordinator 127.0.0.1:@PORT@
    echo "ok: OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE with --coordinator, two ranks, verified"
    ;;
  pmi)
    # PMI (MPICH's Hydra, srun --mpi=pmi2): PMI_RANK and PMI_SIZE; the coordinator as torchrun's.
    ring_two_ranks "PMI_RANK=0 PMI_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=@PORT@" \
                   "PMI_RANK=1 PMI_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=@PORT@"
    echo "ok: PMI_RANK / PMI_SIZE with MASTER_ADDR / MASTER_PORT, two ranks, verified"
    ;;
  slurm)
    # srun: SLURM_PROCID and SLURM_NTASKS; the coordinator as mlx.launch's.
    ring_two_ranks "SLURM_PROCID=0 SLURM_NTASKS=2 JACCL_COORDINATOR=127.0.0.1:@PORT@" \
                   "SLURM_PROCID=1 SLURM_NTASKS=2 JACCL_COORDINATOR=127.0.0.1:@PORT@"
    echo "ok: SLURM_PROCID / SLURM_NTASKS with JACCL_COORDINATOR, two ranks, verified"
    ;;
  mpirun_in_slurm)
    # mpirun inside a Slurm allocation: every rank inherits the batch step's SLURM_PROCID=0 and
    # SLURM_NTASKS=1; Open MPI's own numbers must win.
    ring_two_ranks "SLURM_PROCID=0 SLURM_NTASKS=1 OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=@PORT@" \
                   "SLURM_PROCID=0 SLURM_NTASKS=1 OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=@PORT@"
    echo "ok: Open MPI's rank and size over the inherited Slurm ones, verified"
    ;;
  refusals)
    # No rank at all: the line names the program, not "rank -1" (issue 13), and lists the variables.
    refuse "^ring_all_sum: FAILED during configuration: .*no rank: pass --rank or set JACCL_RANK or MLX_RANK \(mlx.launch\), RANK \(torchrun\), OMPI_COMM_WORLD_RANK \(mpirun\)" ""
    expect_not "rank -1"
    refuse "no coordinator: pass --coordinator host:port or set JACCL_COORDINATOR, or MASTER_ADDR and MASTER_PORT \(Open MPI gave the rank, not the coordinator\)" \
      "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2"
    refuse "^ring_all_sum: FAILED during configuration: RANK=3 is outside WORLD_SIZE=2 \(torchrun\)" \
      "RANK=3 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT"
    refuse "MASTER_ADDR is set without MASTER_PORT \(torchrun sets both\)" "RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1"
    refuse "PMI_RANK=\"-1\" \(PMI\) is not a rank number" "PMI_RANK=-1"
    refuse "SLURM_NTASKS=\"0\" \(Slurm\) is not a number of ranks" "SLURM_PROCID=0 SLURM_NTASKS=0"
    refuse "MASTER_PORT=\"http\" is not a TCP port" "RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=http"
    echo '[[null, "rdma_en1"], ["rdma_en1", null]]' >"$WORK/devices.json"
    refuse "WORLD_SIZE=3 \(torchrun\) but .*devices.json lists 2 ranks" \
      "RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT JACCL_IBV_DEVICES=$WORK/devices.json"
    echo "ok: every malformed or missing launcher variable refused with a clear error"
    ;;
  probe_torchrun)
    # tbverbs-probe under torchrun: rank 0 serves, rank 1 connects, at MASTER_ADDR:MASTER_PORT.
    two_ranks "$PROBE" "RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=@PORT@" \
              "RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=@PORT@" --quick --json
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["max_qps"] == 10, d["max_qps"]' "$WORK/rank1.txt" 2>/dev/null ||
      grep -q '"max_qps": *10' "$WORK/rank1.txt" || fail "rank 1's report has no max_qps 10"
    # Outside 2 ranks the probe refuses, naming the variable.
    env "${UNSET[@]}" RANK=2 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT "$PROBE" --quick >"$OUT" 2>&1 &&
      fail "the probe accepted WORLD_SIZE=3"
    expect "WORLD_SIZE=3 \(torchrun\): the probe measures between exactly 2 ranks"
    echo "ok: tbverbs-probe with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT measured (max_qps 10), WORLD_SIZE=3 refused"
    ;;
  *) echo "unknown case $CASE"; exit 2 ;;
esac
