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
