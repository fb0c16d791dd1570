# Sourced by the scripts that start a job on an emulated fabric file of their own (ring tests, torch
# tests, the torch benchmark).

# remove_fabric_state CLI FABRIC: the emulator keeps a fabric file's shared state in a directory
# of its own (keyed by the file's path, so a new one every run); removes it, or every run leaves
# one in /dev/shm. CLI is tbverbs-emu.
remove_fabric_state() {
  local state
  [ -f "$2" ] || return 0
  state=$("$1" -f "$2" state-dir 2>/dev/null) && [ -n "$state" ] && rm -rf "$state"
}

# torchrun_compat_flags PYTHON LOG_DIR: sets the array TORCHRUN_FLAGS to what this torch's
# launcher needs to start at all. torch 1.13's launcher under Python 3.11 cannot parse its own
# default --redirects/--tee of "0" (Std.from_str returns None: an IntFlag change in 3.11) and fails
# before starting a worker; "2" (stderr) parses, and with --tee 2 stderr still reaches the
# console. Newer torch needs nothing.
torchrun_compat_flags() {
  TORCHRUN_FLAGS=()
  if ! "$1" -c 'import sys; from torch.distributed.elastic.multiprocessing.api import Std; sys.exit(Std.from_str("0") is None)' 2>/dev/null; then
    TORCHRUN_FLAGS=(--redirects 2 --tee 2 --log_dir "$2")
  fi
}

# torchrun_works PYTHON: whether this torch's torchrun can start a job. Debian 13's torch 2.6 was
# built without libuv and its torchrun asks for a libuv TCPStore: it cannot start any
# (docs/pytorch.md, "PyTorch 1.13 and 2.x").
torchrun_works() {
  "$1" -c 'import torch.distributed as d; d.TCPStore("127.0.0.1", 0, 1, True, use_libuv=True)' >/dev/null 2>&1
}

# start_ranks N PORT PYTHON SCRIPT [ARGS...]: ranks 0..N-1 of SCRIPT on this machine with the
# environment torchrun gives its workers (rendezvous on 127.0.0.1:PORT) and USE_LIBUV=0, which
# init_process_group's env:// honours; where torchrun cannot start. Returns the first non-zero
# exit status, or 0.
start_ranks() {
  local n=$1 port=$2 py=$3 pids=() r rc=0 s
  shift 3
  for ((r = 0; r < n; r++)); do
    RANK=$r LOCAL_RANK=$r GROUP_RANK=0 WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      USE_LIBUV=0 TORCHELASTIC_RUN_ID=tbverbs-$port "$py" "$@" &
    pids+=($!)
  done
  for r in "${pids[@]}"; do
    wait "$r"
    s=$?
    [ $rc -ne 0 ] || rc=$s
  done
  return $rc
}
