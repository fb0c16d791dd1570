#!/usr/bin/env bash
# What the Debian package build compiles needs only debian/control's Build-Depends: configures the
# source tree as debian/rules does (tests, benchmarks, docs and the torch backend off) in a scratch directory and runs
# tools/check-deps.py on it against debian/control (nothing is built: the preprocessor gives each
# translation unit's headers). Exits 77 where the check cannot run.
#   package_build_deps.sh REPO WORK_DIR [GENERATOR]
set -u
repo=${1:?usage: package_build_deps.sh REPO WORK_DIR}
work=${2:?usage: package_build_deps.sh REPO WORK_DIR}
command -v dpkg-query >/dev/null || { echo "SKIPPED: no dpkg here"; exit 77; }
rm -rf "$work"
if ! cmake -S "$repo" -B "$work" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
    -DTBVERBS_BUILD_TESTS=OFF -DTBVERBS_BUILD_BENCH=OFF -DTBVERBS_BUILD_DOCS=OFF -DTBVERBS_BUILD_PYTHON=OFF >"$work.configure.log" 2>&1; then
  cat "$work.configure.log"; echo "FAIL: the package build's configure failed"; exit 1
fi
python3 "$repo/tools/check-deps.py" build "$work" --against debian/control
rc=$?
rm -rf "$work" "$work.configure.log"
exit $rc
