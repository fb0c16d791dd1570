#!/bin/sh
# rdma-core's own librdmacm over the emulator's libibverbs (issue 14): it loads (every versioned
# symbol it imports is defined) and, with no kernel rdma_cm, stops cleanly where it needs one
# (its event channel cannot be created), never a crash (ibv_get_sysfs_path's signature).
# usage: check_rdmacm_without_kernel.sh EMULATOR_LIBRARY UCMATOSE WORKDIR
emu=$1 ucmatose=$2 work=$3
[ -e /dev/infiniband/rdma_cm ] && { echo "SKIP: this machine has a kernel rdma_cm"; exit 77; }
[ -e /usr/lib/x86_64-linux-gnu/librdmacm.so.1 ] || { echo "SKIP: rdma-core's librdmacm1 not installed"; exit 77; }
# Only the emulator's libibverbs on the path: librdmacm is rdma-core's.
mkdir -p "$work" && ln -sf "$emu" "$work/libibverbs.so.1" || exit 1
export LD_LIBRARY_PATH="$work" TBVERBS_EMU_STATE_DIR="$work/state"
ldd "$ucmatose" | grep -q "libibverbs.so.1 => $work/" || { echo "FAIL: ucmatose does not load $work/libibverbs.so.1"; exit 1; }
out=$(timeout 30 "$ucmatose" 2>&1)
rc=$?
rm -rf "$work/state"
echo "$out"
echo "ucmatose rc=$rc"
case $out in *"symbol lookup error"*) echo "FAIL: load failure"; exit 1 ;; esac
[ "$rc" -ge 124 ] && { echo "FAIL: ucmatose crashed or hung (rc $rc)"; exit 1; }
case $out in *"failed to create RDMA CM event channel"*) ;; *) echo "FAIL: no clean CM failure"; exit 1 ;; esac
echo "OK"
