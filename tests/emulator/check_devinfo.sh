#!/bin/sh
# Runs the unmodified Debian `ibv_devinfo -v` over the emulator and checks that it
# shows every published Thunderbolt cap (docs/field-reports.md section 4b). Each
# expectation is an extended regex matched against one line; all must match.
# usage: check_devinfo.sh <ibv_devinfo> <expected port_lid>
set -u
devinfo=$1 lid=$2
out=$("$devinfo" -v 2>&1) || { echo "$out"; echo "ibv_devinfo failed"; exit 1; }
echo "$out"
missing=0
check() {
  if ! printf '%s\n' "$out" | grep -Eq "$1"; then
    echo "MISSING: $1"
    missing=$((missing + 1))
  fi
}
check '^[[:space:]]*transport:[[:space:]]+.*\(100\)$'
check '^[[:space:]]*max_mr_size:[[:space:]]+0xfa0000$'
check '^[[:space:]]*max_qp:[[:space:]]+11$'
check '^[[:space:]]*max_qp_wr:[[:space:]]+4095$'
check '^[[:space:]]*max_sge:[[:space:]]+1$'
check '^[[:space:]]*max_cq:[[:space:]]+11$'
check '^[[:space:]]*max_cqe:[[:space:]]+4096$'
check '^[[:space:]]*max_mr:[[:space:]]+100$'
check '^[[:space:]]*max_pd:[[:space:]]+11$'
check '^[[:space:]]*max_qp_rd_atom:[[:space:]]+0$'
check '^[[:space:]]*max_srq:[[:space:]]+0$'
check '^[[:space:]]*phys_port_cnt:[[:space:]]+1$'
check '^[[:space:]]*max_mtu:[[:space:]]+4096 \(5\)$'
check '^[[:space:]]*active_mtu:[[:space:]]+4096 \(5\)$'
check "^[[:space:]]*port_lid:[[:space:]]+$lid\$"
check '^[[:space:]]*link_layer:[[:space:]]+(Unknown|Thunderbolt)'
check '^[[:space:]]*max_msg_sz:[[:space:]]+0xfff000$'
check '^[[:space:]]*GID\[  1\]:[[:space:]]+::ffff:10\.99\.0\.'
if [ $missing -ne 0 ]; then echo "ibv_devinfo -v lacks $missing published cap(s)"; exit 1; fi
echo "all published caps shown"
