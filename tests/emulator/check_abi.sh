#!/bin/sh
# Every symbol the installed rdma-core libibverbs.so.1 defines, under the same version node,
# default or not, function or data, is defined alike by the emulator (issue 14: one missing
# versioned symbol stops a program or library at load time).
# usage: check_abi.sh EMULATOR_LIBRARY [REAL_LIBRARY]
emu=$1
real=${2:-/usr/lib/x86_64-linux-gnu/libibverbs.so.1}
command -v objdump >/dev/null 2>&1 || { echo "SKIP: objdump not found"; exit 77; }
[ -e "$real" ] || { echo "SKIP: $real not installed (libibverbs1)"; exit 77; }
[ -e "$emu" ] || { echo "FAIL: $emu not found"; exit 1; }
# "KIND VERSION NAME" for each defined symbol of an IBVERBS node; KIND is DF (function) or DO
# (data); a non-default version prints as (NODE).
defs() {
  objdump -T "$1" | awk 'NF >= 6 && $0 !~ /\*UND\*/ && $(NF-1) ~ /IBVERBS/ && $NF != $(NF-1) { print $3, $(NF-1), $NF }' | sort -u
}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
defs "$real" >"$tmp/real"
defs "$emu" >"$tmp/emu"
n=$(wc -l <"$tmp/real")
[ "$n" -gt 100 ] || { echo "FAIL: only $n symbols read from $real"; exit 1; }
missing=$(comm -23 "$tmp/real" "$tmp/emu")
if [ -n "$missing" ]; then
  echo "FAIL: defined by $real but not (alike) by $emu:"
  echo "$missing"
  exit 1
fi
echo "OK: all $n versioned symbols of $real are defined alike by the emulator"
