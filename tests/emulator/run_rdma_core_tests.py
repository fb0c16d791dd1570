#!/usr/bin/env python3
"""Runs rdma-core's Python tests (Debian's python3-pyverbs ships them as documentation) on
the emulator, unmodified, and reports unittest's verdict.

Their package __init__ imports every test module, the mlx5 and EFA ones too, whose pyverbs
provider modules need libmlx5's and libefa's full direct-verbs ABI; the emulated fabric has
neither kind of device (the emulator's libmlx5/libefa only satisfy perftest). So the tests
are copied into a temporary package whose __init__ loads nothing, and the modules named on
the command line are run from it. Skips are the tests' own, by capability: each one raises
unittest.SkipTest when a verb answers EOPNOTSUPP or the device reports a feature absent.

usage: run_rdma_core_tests.py [--src DIR] [--dev NAME] [--gid N] MODULE...
"""
import argparse
import gzip
import os
import shutil
import sys
import tempfile
import unittest


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--src', default='/usr/share/doc/rdma-core/tests')
    ap.add_argument('--dev', required=True)
    ap.add_argument('--gid', type=int)
    ap.add_argument('modules', nargs='+')
    opts = ap.parse_args()
    if not os.path.isdir(opts.src):
        print(f'rdma-core tests not found in {opts.src} (install python3-pyverbs)')
        return 2
    work = tempfile.mkdtemp(prefix='tbverbs-rdma-core-tests-')
    try:
        pkg = os.path.join(work, 'tests')
        os.mkdir(pkg)
        for name in os.listdir(opts.src):
            src = os.path.join(opts.src, name)
            if name == '__init__.py':
                continue
            if name.endswith('.py.gz'):
                with gzip.open(src, 'rb') as f, open(os.path.join(pkg, name[:-3]), 'wb') as out:
                    shutil.copyfileobj(f, out)
            elif name.endswith('.py'):
                shutil.copy(src, pkg)
        with open(os.path.join(pkg, '__init__.py'), 'w') as f:
            f.write('# Loads no test module on import (see run_rdma_core_tests.py).\n')
        # The modules import each other as tests.X, and args_parser at top level (run_tests.py
        # puts their directory on the path).
        sys.path[:0] = [work, pkg]
        from args_parser import parser  # the tests read their options from it
        sys.argv = [sys.argv[0], '--dev', opts.dev] + (['--gid', str(opts.gid)] if opts.gid is not None else [])
        parser.parse_args()
        suite = unittest.defaultTestLoader.loadTestsFromNames(['tests.' + m for m in opts.modules])
        result = unittest.TextTestRunner(verbosity=2).run(suite)
        ran = result.testsRun - len(result.skipped)
        print(f'rdma-core tests: {ran} ran, {len(result.skipped)} skipped, '
              f'{len(result.failures)} failed, {len(result.errors)} errors')
        if ran == 0:
            print('no test ran')
            return 1
        return 0 if result.wasSuccessful() else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
