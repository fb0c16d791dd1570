#!/usr/bin/env python3
"""Writes docs/emulator.md (a Doxygen guide page) from emulator/README.md.

Run from anywhere after editing the README: python3 emulator/tools/readme_to_doc.py
"""
import pathlib

root = pathlib.Path(__file__).resolve().parents[2]
body = (root / 'emulator' / 'README.md').read_text().split('\n', 1)[1]
lines = []
for line in body.split('\n'):
    if line.startswith('|'):
        # Doxygen reads "::name" inside table cells as an explicit link request and
        # fails the warning-free docs build; spell the IPv4-mapped prefix out there.
        line = line.replace('`::ffff:', '`0:0:0:0:0:ffff:')
    lines.append(line)
page = ('# The emulated verbs fabric {#emulator}\n\n'
        'This page is the guide to the emulator under `emulator/` (its `README.md` has the same text).\n'
        + '\n'.join(lines))
(root / 'docs' / 'emulator.md').write_text(page)
