#!/usr/bin/env bash
# The torch 2.x test path (docs/pytorch.md, "torch 2.x"): a Debian 13 (trixie) chroot made with
# debootstrap from this machine's own Debian apt source (its URI is read from /etc/apt, never
# written here), Debian 13's python3-torch (2.6) and the build dependencies installed in it, this
# tree built inside it (build/torch2) and the torch tests (ctest -L torch) run there.
#
#   tools/torch2.sh prepare    create the chroot, or install what it lacks (as root)
#   tools/torch2.sh test       prepare, then build and run the torch tests inside it
#   tools/torch2.sh run CMD    CMD inside it, in this tree (e.g. bench/torch/compare.sh build/torch2)
#
# Exit 77 (ctest's "skipped"), with the reason on stderr, where it cannot run: not root, no
# debootstrap, no Debian apt source to read, the archive unreachable. The chroot lives outside the
# clone (TBVERBS_TORCH2_ROOT, default /var/cache/tbverbs/trixie-torch2) so a machine makes it once:
# about 5 minutes and 2.5 GB the first time, seconds after. The ctest `torch2.suite` (label torch2)
# runs `test`.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
src=$(pwd)
root=${TBVERBS_TORCH2_ROOT:-/var/cache/tbverbs/trixie-torch2}
suite=trixie
packages=(
  cmake ninja-build g++ python3 python3-dev python3-torch libtorch-dev pybind11-dev libibverbs-dev librdmacm-dev
  nlohmann-json3-dev libcli11-dev libcatch2-dev iproute2 procps
)

skip() { echo "torch2: skipped: $*" >&2; exit 77; }

# The first Debian archive URI of this machine's apt sources (not the security one).
mirror() {
  local uri=""
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    uri=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
    uri=$(awk '$1=="deb" && $0 !~ /security/ {for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list)
  fi
  printf '%s' "$uri"
}

in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }

mounted=()
mount_into() { # source target-in-root [bind options]
  mkdir -p "$root$2"
  mountpoint -q "$root$2" || { mount --bind "$1" "$root$2" && mounted+=("$root$2"); }
}
unmount_all() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null; done
  mounted=()
}
trap unmount_all EXIT

# Deletes the chroot, never through a mount a killed run (or debootstrap) left in it: /tmp, /dev
# and the tree are bound there while the tests run.
remove_root() {
  if awk -v r="$root/" 'index($2 "/", r) == 1 {found = 1} END {exit !found}' /proc/self/mounts; then
    skip "mounts remain under $root from an earlier run: umount them first"
  fi
  rm -rf "$root"
}

prepare() {
  [ "$(id -u)" -eq 0 ] || skip "needs root (debootstrap and chroot)"
  command -v debootstrap >/dev/null || skip "no debootstrap (tools/install-deps.sh installs it)"
  local uri
  uri=$(mirror)
  [ -n "$uri" ] || skip "no Debian apt source in /etc/apt to make the chroot from"
  if [ ! -x "$root/usr/bin/apt-get" ]; then
    echo "torch2: debootstrap $suite from $uri into $root"
    remove_root
    mkdir -p "$root"
    if ! debootstrap --variant=minbase "$suite" "$root" "$uri" >"$root.debootstrap.log" 2>&1; then
      tail -5 "$root.debootstrap.log" >&2
      remove_root
      skip "debootstrap $suite from $uri failed (log: $root.debootstrap.log)"
    fi
  fi
  local missing=() p
  for p in "${packages[@]}"; do
    in_root dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "torch2: installing ${missing[*]} in the chroot"
  mount_into /proc /proc
  in_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq || { unmount_all; skip "apt-get update in the chroot failed"; }
  in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    { unmount_all; echo "torch2: installing ${missing[*]} in the chroot failed" >&2; exit 1; }
  unmount_all
}

# The tree at its own path inside the chroot; the emulator's state (/dev/shm), the tests' /tmp.
mount_all() {
  mount_into /proc /proc
  mount_into /dev /dev
  mount_into /dev/shm /dev/shm
  mount_into /tmp /tmp
  mount_into "$src" "$src"
}

run_tests() {
  prepare
  mount_all
  local build="$src/build/torch2" version
  version=$(in_root python3 -c 'import torch; print(torch.__version__)') || { echo "torch2: torch does not import in the chroot" >&2; exit 1; }
  echo "torch2: torch $version in Debian 13; building $build"
  in_root cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTBVERBS_BUILD_BENCH=OFF \
    -DTBVERBS_BUILD_DOCS=OFF >"$src/build/torch2-configure.log" 2>&1 || { tail -20 "$src/build/torch2-configure.log"; exit 1; }
  in_root cmake --build "$build" --target tbverbs_emu tbverbs-emu ring_all_sum tbverbs_torch ||
    { echo "torch2: the build failed" >&2; exit 1; }
  in_root ctest --test-dir "$build" -L '^torch$' --output-on-failure
}

case "${1:-}" in
  prepare) prepare ;;
  test) run_tests ;;
  run)
    shift
    prepare
    mount_all
    in_root bash -c 'cd "$1" && shift && "$@"' _ "$src" "$@"
    ;;
  *) echo "usage: tools/torch2.sh prepare|test|run COMMAND..." >&2; exit 2 ;;
esac
