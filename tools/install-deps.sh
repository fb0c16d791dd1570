#!/usr/bin/env bash
# Installs the Debian packages tbverbs' build, tests, examples and benchmarks need: every line of
# tools/deps.txt, the one list (debian/control and docs/packaging.md are checked against it).
# Catch2 v3 is only in bookworm-backports (role `backports`): the suite is added to the machine's
# existing Debian apt source (its URI is reused, never written here).
#
#   tools/install-deps.sh                 install what is missing (as root, or through sudo)
#   tools/install-deps.sh --list [ROLE]   print the packages it installs (of one role), one a line
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
list="$here/deps.txt"

# The packages of tools/deps.txt, optionally of one role (build, package, test, backports).
packages_of() {
  awk -v role="${1:-}" '!/^[[:space:]]*(#|$)/ && (role == "" || $2 == role) {print $1}' "$list"
}

if [ "${1:-}" = "--list" ]; then
  packages_of "${2:-}"
  exit 0
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
while read -r p; do installed "$p" || missing+=("$p"); done < <(awk '!/^[[:space:]]*(#|$)/ && $2 != "backports" {print $1}' "$list")
while read -r p; do { installed "$p" && backport_ok "$p"; } || missing_backports+=("$p"); done < <(packages_of backports)

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
