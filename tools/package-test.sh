#!/usr/bin/env bash
# Builds tbverbs' Debian packages from a fresh clone of the current commit and checks them
# (docs/packaging.md). Not part of the ctest suite: the package build is a whole Release-like build
# of the emulator, examples and tools (about 4 minutes on 2 cores).
#
#   tools/package-test.sh [WORK_DIR]     # default: a new directory under ${TMPDIR:-/tmp}
#   TBVERBS_PACKAGE_TEST_REUSE=1 tools/package-test.sh WORK_DIR   # check the .debs already there
#
# 1. git clone of HEAD (uncommitted changes are not in it) and `dpkg-buildpackage -us -uc -b`;
# 2. dpkg -x of both packages into one directory, and their contents: headers, CMake package,
#    tbverbs.pc and guides in libtbverbs-dev; the doctor, probe, ring, pingpong, emulator CLI and
#    the emulator library, only under the private /usr/lib/<triplet>/tbverbs/, in tbverbs-tools;
# 3. a consumer project (tests/consumer/find_package) configured with CMAKE_PREFIX_PATH set to the
#    unpacked /usr finds tbverbs with find_package, builds and runs; the same source builds with
#    the unpacked tbverbs.pc (PKG_CONFIG_PATH);
# 4. the unpacked tools run on the unpacked emulator: tbverbs-emu (through its RUNPATH), the
#    doctor, and a 2-rank tbverbs-ring-all-sum --local.
# Needs: dpkg-dev, debhelper, fakeroot is not needed (Rules-Requires-Root: no), and the build
# dependencies of debian/control (tools/install-deps.sh installs them; debhelper is installed
# here with apt-get when missing and the script runs as root).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${1:-$(mktemp -d "${TMPDIR:-/tmp}/tbverbs-package-test.XXXXXX")}
jobs=${TBVERBS_JOBS:-2}
mkdir -p "$work"
section() { printf '\n==== %s ====\n' "$*"; }
fail() { echo "package-test: FAIL: $*" >&2; exit 1; }

if ! command -v dh >/dev/null 2>&1 || ! command -v dpkg-buildpackage >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    apt-get install -y -qq --no-install-recommends debhelper dpkg-dev >/dev/null
  else
    fail "debhelper and dpkg-dev are needed: sudo apt-get install debhelper dpkg-dev"
  fi
fi

if [ "${TBVERBS_PACKAGE_TEST_REUSE:-0}" != 1 ]; then
section "fresh clone of $(git -C "$root" rev-parse --short HEAD) into $work/src"
rm -rf "$work/src" "$work"/*.deb "$work"/*.buildinfo "$work"/*.changes "$work/unpacked"
git clone --quiet --no-hardlinks "$root" "$work/src"
git -C "$work/src" checkout --quiet --detach "$(git -C "$root" rev-parse HEAD)"
if [ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ]; then
  echo "package-test: note: uncommitted changes in $root are not in the clone"
fi

section "dpkg-buildpackage -us -uc -b"
start=$(date +%s)
(cd "$work/src" && DEB_BUILD_OPTIONS="parallel=$jobs" dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1 ||
  { tail -n 60 "$work/build.log"; fail "dpkg-buildpackage failed (log: $work/build.log)"; }
grep -E "^-- tbverbs|^dpkg-deb: building" "$work/build.log" || true
echo "package build: $(($(date +%s) - start)) s"
fi
dev=$(ls "$work"/libtbverbs-dev_*_all.deb 2>/dev/null | head -n 1)
tools=$(ls "$work"/tbverbs-tools_*.deb 2>/dev/null | head -n 1)
[ -n "$dev" ] || fail "no libtbverbs-dev package in $work"
[ -n "$tools" ] || fail "no tbverbs-tools package in $work"

section "contents"
u="$work/unpacked"
rm -rf "$u"
mkdir -p "$u"
dpkg -x "$dev" "$u"
dpkg -x "$tools" "$u"
triplet=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
emu="$u/usr/lib/$triplet/tbverbs"
for f in usr/include/tbverbs/tbverbs.hpp usr/include/tbverbs/detail/wire.hpp \
         usr/share/cmake/tbverbs/tbverbsConfig.cmake usr/share/cmake/tbverbs/tbverbsConfigVersion.cmake \
         usr/share/cmake/tbverbs/tbverbsTargets.cmake usr/share/pkgconfig/tbverbs.pc \
         usr/share/doc/libtbverbs-dev/README.md.gz usr/share/doc/libtbverbs-dev/getting-started.md.gz \
         usr/share/doc/libtbverbs-dev/copyright \
         usr/bin/tbverbs-doctor usr/bin/tbverbs-probe usr/bin/tbverbs-emu usr/bin/tbverbs-ring-all-sum \
         usr/bin/tbverbs-pingpong "usr/lib/$triplet/tbverbs/libtbverbs_emu.so"; do
  [ -e "$u/$f" ] || [ -e "$u/${f%.gz}" ] || fail "$f is not in the packages"
done
for link in libibverbs.so.1 librdma.dylib; do
  [ "$(readlink "$emu/$link")" = libtbverbs_emu.so ] || fail "$emu/$link is not a link to libtbverbs_emu.so"
done
# Nothing may shadow rdma-core: none of the emulator's stand-ins for rdma-core's libraries
# (libibverbs, librdmacm, the provider libraries) anywhere on the loader's path.
if find "$u" \( -name 'libibverbs.so*' -o -name 'librdmacm.so*' -o -name 'libmlx5.so*' -o -name 'libefa.so*' \) \
     -not -path "$emu/*" | grep .; then
  fail "an rdma-core library name outside the private directory (it would shadow rdma-core)"
fi
if dpkg-deb -c "$tools" | grep -q ' \./DEBIAN/shlibs' || dpkg-deb -I "$tools" shlibs >/dev/null 2>&1; then
  fail "tbverbs-tools offers a shlibs file (it would offer libibverbs.so.1 to other packages)"
fi
grep -q "^URL: https://" "$u/usr/share/pkgconfig/tbverbs.pc" || fail "tbverbs.pc has no URL"
# --local of the installed tools loads the installed emulator (TBVERBS_EMU_RUNTIME_LIBRARY).
for b in tbverbs-ring-all-sum tbverbs-pingpong tbverbs-probe; do
  grep -aq "/usr/lib/$triplet/tbverbs/libtbverbs_emu.so" "$u/usr/bin/$b" ||
    fail "$b does not have the installed emulator path compiled in"
done
dpkg-deb -f "$dev" Package Version Architecture Homepage
dpkg-deb -f "$tools" Package Version Architecture Depends
echo "contents: ok"

section "consumer: find_package(tbverbs) from the unpacked -dev package"
cmake -S "$root/tests/consumer/find_package" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$u/usr" \
  >"$work/consumer.log" 2>&1 || { cat "$work/consumer.log"; fail "the consumer did not configure"; }
grep -E "found tbverbs" "$work/consumer.log"
grep -q "found tbverbs .* in $u/usr/share/cmake/tbverbs" "$work/consumer.log" ||
  fail "find_package found tbverbs somewhere else than the unpacked package"
cmake --build "$work/consumer" >>"$work/consumer.log" 2>&1 || { cat "$work/consumer.log"; fail "the consumer did not build"; }
"$work/consumer/tbverbs_consumer" || fail "the consumer did not run"

section "consumer: pkg-config from the unpacked -dev package"
if command -v pkg-config >/dev/null 2>&1; then
  flags=$(PKG_CONFIG_PATH="$u/usr/share/pkgconfig" pkg-config --cflags --libs tbverbs)
  echo "pkg-config --cflags --libs tbverbs: $flags"
  incdir=$(printf '%s\n' $flags | sed -n 's/^-I//p' | head -n 1)
  [ -n "$incdir" ] && [ "$(readlink -f "$incdir")" = "$(readlink -f "$u/usr/include")" ] ||
    fail "tbverbs.pc's include directory ($incdir) is not the unpacked /usr/include"
  # shellcheck disable=SC2086
  c++ -std=c++20 "$root/tests/consumer/main.cpp" $flags -o "$work/consumer-pc" || fail "the pkg-config consumer did not build"
  "$work/consumer-pc" >/dev/null || fail "the pkg-config consumer did not run"
else
  echo "pkg-config not installed: skipped"
fi

section "the unpacked tools on the unpacked emulator"
export TBVERBS_EMU_STATE_DIR="$work/emu-state"
rm -rf "$TBVERBS_EMU_STATE_DIR"
"$u/usr/bin/tbverbs-emu" --help >/dev/null || fail "tbverbs-emu does not start (RUNPATH to its library?)"
"$u/usr/bin/tbverbs-doctor" --library "$emu/libibverbs.so.1" | tail -n 3 || fail "the doctor failed on the emulator"
timeout 120 "$u/usr/bin/tbverbs-ring-all-sum" --local 2 --size 1M --emu-library "$emu/libtbverbs_emu.so" \
  >"$work/ring.log" 2>&1 || { tail -n 30 "$work/ring.log"; fail "tbverbs-ring-all-sum --local 2 failed"; }
grep -q "Wrong elements       : 0 OK" "$work/ring.log" || { tail -n 30 "$work/ring.log"; fail "the ring did not verify"; }
echo "tbverbs-ring-all-sum --local 2: verified"
rm -rf "$TBVERBS_EMU_STATE_DIR"

section "result"
ls -l "$dev" "$tools"
echo "package-test: both packages built from a fresh clone and checked (work directory: $work)"
