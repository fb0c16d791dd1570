#!/usr/bin/env python3
"""Runs rdma-core's Python tests, unmodified, on the emulator: their own run_tests.py over the
copy Debian's python3-pyverbs ships as documentation (some files gzipped there). Prints
unittest's output and a summary line; fails when a test fails or errs, or when none ran.

Skips are the tests' own, by capability: a test raises unittest.SkipTest when a verb answers
EOPNOTSUPP or the device reports the feature absent (no UD, device memory, ODP, atomics; no
mlx5 or EFA device; no kernel netdev behind an emulated port for the rdma_cm tests).

usage: run_rdma_core_tests.py [--src DIR] -- RUN_TESTS_ARGS...   (e.g. --dev mlx5_0)
"""
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile


def main():
    args = sys.argv[1:]
    src = '/usr/share/doc/rdma-core/tests'
    if len(args) >= 2 and args[0] == '--src':
        src, args = args[1], args[2:]
    if args and args[0] == '--':
        args = args[1:]
    if not os.path.isfile(os.path.join(src, 'run_tests.py')):
        print(f'rdma-core tests not found in {src} (install python3-pyverbs)')
        return 77
    work = tempfile.mkdtemp(prefix='tbverbs-rdma-core-tests-')
    try:
        pkg = os.path.join(work, 'tests')
        os.mkdir(pkg)
        for name in os.listdir(src):
            path = os.path.join(src, name)
            if name.endswith('.py.gz'):
                with gzip.open(path, 'rb') as f, open(os.path.join(pkg, name[:-3]), 'wb') as out:
                    shutil.copyfileobj(f, out)
            elif name.endswith('.py'):
                shutil.copy(path, pkg)
        # Bounded: the suite takes well under a second on the emulator.
        r = subprocess.run([sys.executable, os.path.join(pkg, 'run_tests.py'), '-v'] + args,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        out = r.stdout
        print(out)
        ran = re.search(r'^Ran (\d+) tests?', out, re.M)
        skipped = re.search(r'skipped=(\d+)', out)
        n = int(ran.group(1)) if ran else 0
        s = int(skipped.group(1)) if skipped else 0
        print(f'rdma-core tests: {n - s} passed, {s} skipped, exit {r.returncode}')
        if n - s <= 0:
            print('no test ran')
            return 1
        return r.returncode
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
