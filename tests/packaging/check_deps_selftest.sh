#!/usr/bin/env bash
# The dependency check's own test (tools/check-deps.py build): a scratch Ninja build whose one
# translation unit includes a header of nlohmann-json3-dev and one no package provides, and
# links -libverbs (libibverbs-dev's libibverbs.so), checked against package lists that lack
# them and against one that has them. Exits 77 where the check cannot run (no dpkg, apt lists,
# or the packages it relies on are not installed).
#   check_deps_selftest.sh REPO WORK_DIR
set -u
repo=${1:?usage: check_deps_selftest.sh REPO WORK_DIR}
work=${2:?usage: check_deps_selftest.sh REPO WORK_DIR}
check="$repo/tools/check-deps.py"
for p in nlohmann-json3-dev libibverbs-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
    { echo "SKIPPED: $p is not installed (tools/install-deps.sh installs it)"; exit 77; }
done
rm -rf "$work" && mkdir -p "$work" || exit 1
cd "$work" || exit 1
cxx=$(command -v c++ || command -v g++) || { echo "SKIPPED: no C++ compiler"; exit 77; }
make_build() { # $1: the translation unit's includes
  printf '%s\nint main() { return 0; }\n' "$1" >t.cpp
  cat >build.ninja <<NINJA
rule cxx
  command = $cxx -MD -MF \$out.d -c \$in -o \$out
  deps = gcc
  depfile = \$out.d
rule link
  command = $cxx \$in -o \$out -libverbs
build t.o: cxx t.cpp
build t: link t.o
NINJA
  printf '[{"directory": "%s", "command": "%s -c %s/t.cpp -o t.o", "file": "%s/t.cpp", "output": "t.o"}]\n' \
    "$work" "$cxx" "$work" "$work" >compile_commands.json
}
status=0
expect() { # $1: exit code wanted, $2: packages file, then substrings the output must contain
  local want=$1 list=$2 out rc
  shift 2
  out=$(python3 "$check" build "$work" --packages-file "$list" 2>&1); rc=$?
  [ $rc -eq 77 ] && { echo "$out"; echo "SKIPPED: the check could not run"; exit 77; }
  if [ $rc -ne "$want" ]; then
    echo "FAIL: exit $rc, wanted $want, with $list:"; echo "$out"; status=1; return
  fi
  for s in "$@"; do
    case "$out" in *"$s"*) ;; *) echo "FAIL: the output lacks '$s':"; echo "$out"; status=1 ;; esac
  done
  echo "ok: exit $rc with $(tr '\n' ' ' <"$list")"
}
printf 'g++\n' >only-gxx.txt
printf 'g++\nnlohmann-json3-dev\nlibibverbs-dev\n' >all.txt
# 1. Never built: the preprocessor finds both headers; the link line names libibverbs.so.
make_build $'#include <nlohmann/json.hpp>\n#include <tbverbs_selftest_absent/none.h>'
expect 1 only-gxx.txt "nlohmann-json3-dev is not installed" "<tbverbs_selftest_absent/none.h>" \
  "libibverbs-dev is not installed"
# 2. Listed, and nothing absent: passes.
make_build '#include <nlohmann/json.hpp>'
expect 0 all.txt "nlohmann-json3-dev"
# 3. Built (Ninja's dependency log, not the preprocessor): the same verdicts.
ninja -C "$work" t.o >/dev/null 2>&1 || { echo "FAIL: the scratch build failed"; status=1; }
ninja -C "$work" -t deps | grep -q 'nlohmann/json.hpp' || { echo "FAIL: no dependency log"; status=1; }
expect 1 only-gxx.txt "nlohmann-json3-dev is not installed"
expect 0 all.txt
exit $status
