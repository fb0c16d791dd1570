#!/usr/bin/env bash
# Installs the Debian packages tbverbs' build, tests, examples and benchmarks need. The arrays below
# are the one list: debian/control's Build-Depends and the apt-get line of docs/packaging.md are
# checked against them (packaging.lists_agree), and the build's real use of headers and libraries
# too (packaging.deps_of_this_build). Catch2 v3 is only in bookworm-backports (role `backports`):
# the suite is added to the machine's existing Debian apt source (its URI is reused, never written
# here).
#
#   tools/install-deps.sh                 install what is missing (as root, or through sudo)
#   tools/install-deps.sh --list [ROLE]   print the packages it installs (of one role), one a line
set -euo pipefail

# Role build: the package build compiles with them (debian/control Build-Depends).
#   cmake (3.20+; the presets need 3.23, Debian 12 has 3.25); ninja-build, the presets' and
#   debian/rules' generator; g++ (GCC 12); libibverbs-dev, <infiniband/verbs.h> for the emulator's
#   ABI and the ABI tests; librdmacm-dev, <rdma/rdma_cma.h> for the emulator's librdmacm;
#   nlohmann-json3-dev, the emulator's fabric files, the tools and examples; libcli11-dev, the
#   command lines of the tools, examples and emulator CLI.
build_packages=(
  cmake ninja-build g++ libibverbs-dev librdmacm-dev nlohmann-json3-dev libcli11-dev
)
# Role package: dpkg-buildpackage itself (debhelper-compat 13; dpkg's file lists, which
# tools/check-deps.py reads).
package_packages=(
  debhelper dpkg-dev
)
# Role backports: test packages that only <codename>-backports has: Catch2 v3 for the unit and
# emulated tests (Debian 12's own libcatch2-dev is 2.x).
backports_packages=(
  libcatch2-dev
)
# Role test: the suite, benchmarks, fuzzers and docs.
#   libibverbs1, rdma-core's loader for the loading, ABI and no-device tests; ibverbs-utils,
#   perftest, rdmacm-utils and python3-pyverbs, unmodified rdma-core clients run on the emulator;
#   python3 for tools/check-deps.py; clang and libclang-rt-14-dev, the headers and consumer tests
#   with Clang 14; clang-19, libclang-rt-19-dev, libc++-19-dev and libc++abi-19-dev, C++23 with
#   libc++ and the libFuzzer harnesses; valgrind, bench/overhead's instruction counts; doxygen
#   and graphviz, the API reference; pkg-config, the pkg-config consumer test; iproute2, the
#   network namespaces of the side-channel tests; gnuplot-nox, the benchmarks' plots;
#   python3-torch, libtorch-dev (PyTorch 1.13's C++ package and c10d headers; it brings python3-dev)
#   and pybind11-dev, the torch.distributed backend (python/) and its torchrun tests; debootstrap,
#   the Debian 13 chroot in which tools/torch2.sh builds and tests the backend on torch 2.6.
test_packages=(
  libibverbs1 ibverbs-utils perftest rdmacm-utils python3-pyverbs python3 clang libclang-rt-14-dev
  clang-19 libclang-rt-19-dev libc++-19-dev libc++abi-19-dev valgrind doxygen graphviz pkg-config
  iproute2 gnuplot-nox python3-torch libtorch-dev pybind11-dev debootstrap
)

# The packages of one role (build, package, test, backports), or of all.
packages_of() {
  case "${1:-}" in
    build) printf '%s\n' "${build_packages[@]}" ;;
    package) printf '%s\n' "${package_packages[@]}" ;;
    test) printf '%s\n' "${test_packages[@]}" ;;
    backports) printf '%s\n' "${backports_packages[@]}" ;;
    "") printf '%s\n' "${build_packages[@]}" "${package_packages[@]}" "${backports_packages[@]}" "${test_packages[@]}" ;;
    *) echo "install-deps: unknown role $1 (build, package, test, backports)" >&2; return 2 ;;
  esac
}

if [ "${1:-}" = "--list" ]; then
  packages_of "${2:-}"
  exit $?
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")

add_backports() {
  local src uri
  if grep -rqs "${codename}-backports" /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null; then
    return 0
  fi
  src=/etc/apt/sources.list.d/debian.sources
  if [ -f "$src" ]; then
    uri=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' "$src")
  else
    uri=$(awk '$1=="deb" && $0 !~ /security/ {for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list)
  fi
  if [ -z "$uri" ]; then
    echo "install-deps: cannot find the Debian apt source to add ${codename}-backports to" >&2
    return 1
  fi
  printf 'Types: deb\nURIs: %s\nSuites: %s-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$uri" "$codename" | $SUDO tee /etc/apt/sources.list.d/tbverbs-backports.sources >/dev/null
}

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
# Catch2 must be version 3 (Debian 12's own libcatch2-dev is 2.x).
backport_ok() { [ "$1" != libcatch2-dev ] || dpkg-query -W -f='${Version}' libcatch2-dev 2>/dev/null | grep -q '^3'; }

missing=() missing_backports=()
for p in "${build_packages[@]}" "${package_packages[@]}" "${test_packages[@]}"; do installed "$p" || missing+=("$p"); done
for p in "${backports_packages[@]}"; do { installed "$p" && backport_ok "$p"; } || missing_backports+=("$p"); done

if [ ${#missing[@]} -gt 0 ] || [ ${#missing_backports[@]} -gt 0 ]; then
  [ ${#missing_backports[@]} -eq 0 ] || add_backports
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  if [ ${#missing_backports[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing_backports[*]} from ${codename}-backports"
    $SUDO apt-get install -y -qq --no-install-recommends -t "${codename}-backports" "${missing_backports[@]}"
  fi
fi
