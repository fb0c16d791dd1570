#!/usr/bin/env bash
# Installs the Debian packages tbverbs' build, tests, examples and benchmarks need.
# Catch2 v3 is only in bookworm-backports: the suite is added to the machine's existing
# Debian apt source (its URI is reused, never written here).
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

add_backports() {
  local codename src uri
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
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

need_catch2() { ! dpkg-query -W -f='${Version}' libcatch2-dev 2>/dev/null | grep -q '^3'; }

packages=(cmake ninja-build g++ clang libclang-rt-14-dev clang-19 libclang-rt-19-dev doxygen graphviz
          libibverbs-dev libibverbs1 ibverbs-utils nlohmann-json3-dev libcli11-dev
          valgrind iproute2 gnuplot-nox pkg-config libc++-19-dev libc++abi-19-dev
          perftest rdmacm-utils python3-pyverbs)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ] || need_catch2; then
  add_backports
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  if [ ${#missing[@]} -gt 0 ]; then
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  if need_catch2; then
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
    $SUDO apt-get install -y -qq --no-install-recommends -t "${codename}-backports" libcatch2-dev
  fi
fi
