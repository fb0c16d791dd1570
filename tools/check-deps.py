#!/usr/bin/env python3
"""Does the one package list (tools/install-deps.sh) give a fresh Debian machine everything the build used?

  tools/check-deps.py build BUILD_DIR [--against install-deps|debian/control] [--packages-file F]
      Takes every system header and library a Ninja build of tbverbs used: the headers from
      Ninja's dependency log (`ninja -t deps`), and for every translation unit without one (not
      built yet, or failed, e.g. because a header is missing) from the preprocessor itself
      (`-M -MG`, which also names the headers it cannot find); the libraries from the link lines
      (`ninja -t commands`: -lNAME and absolute paths). Finds the Debian package owning each file
      (dpkg's file lists) and requires it to be listed, or pulled in by a listed package
      (`apt-cache depends --recurse`), or part of every Debian system (Essential or required).
      --against install-deps (default): the packages `tools/install-deps.sh --list` prints;
      --against debian/control: its Build-Depends plus build-essential (what a package build has);
      --packages-file F: the packages listed in F, one a line (the self-test's lists).
  tools/check-deps.py lists [REPO]
      debian/control's Build-Depends and the apt-get line of docs/packaging.md name exactly the
      `build` and `package` packages of tools/install-deps.sh (plus build-essential in the docs).

Exit status: 0 when nothing is missing, 1 when something is (each missing package is printed
with a file of it that the build used and a translation unit that used it), 77 when it cannot
tell (no dpkg or apt-cache, no Ninja build, no package lists), 2 on bad usage.
"""
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

SKIP = 77


def skip(why):
    print(f"check-deps: skipped: {why}")
    sys.exit(SKIP)


def repo_root():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def listed_packages(repo):
    """[(package, role)] of the one list, tools/install-deps.sh's role arrays (--list ROLE)."""
    out = []
    for role in ("build", "package", "backports", "test"):
        r = run([os.path.join(repo, "tools", "install-deps.sh"), "--list", role])
        if r.returncode != 0:
            raise SystemExit(f"check-deps: tools/install-deps.sh --list {role} failed: {r.stderr.strip()}")
        out.extend((p, role) for p in r.stdout.split())
    return out


def build_depends(control_path):
    """Package names of debian/control's Build-Depends (versions and architectures dropped)."""
    text = open(control_path).read()
    m = re.search(r"^Build-Depends:(.*?)(?=^\S)", text, re.S | re.M)
    if not m:
        return []
    names = []
    for item in m.group(1).replace("\n", " ").split(","):
        for alt in item.split("|"):
            alt = re.sub(r"\(.*?\)|\[.*?\]|<.*?>", "", alt).strip()
            if alt:
                names.append(alt)
    return names


def docs_apt_line(md_path):
    """The packages of the first `apt-get install` command in a Markdown file (with continuations)."""
    lines = open(md_path).read().splitlines()
    for i, line in enumerate(lines):
        if "apt-get install" in line:
            cmd = line
            while cmd.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd.rstrip()[:-1] + " " + lines[i]
            words = cmd.split("apt-get install", 1)[1].split()
            return [w for w in words if not w.startswith("-") and re.match(r"^[a-z0-9][a-z0-9.+-]+$", w)]
    return None


def check_lists(repo):
    entries = listed_packages(repo)
    build = {p for p, r in entries if r == "build"}
    package = {p for p, r in entries if r == "package"}
    problems = []
    # debian/control: debhelper is spelled debhelper-compat there (the compatibility level).
    control = set(build_depends(os.path.join(repo, "debian", "control")))
    want = set(build) | ({"debhelper-compat"} if "debhelper" in package else set())
    for p in sorted(want - control):
        problems.append(f"debian/control: Build-Depends lacks {p} (tools/install-deps.sh role build)")
    for p in sorted(control - want):
        problems.append(f"debian/control: Build-Depends names {p}, which tools/install-deps.sh does not list as build")
    apt = docs_apt_line(os.path.join(repo, "docs", "packaging.md"))
    if apt is None:
        problems.append("docs/packaging.md: no apt-get install line")
    else:
        want = build | package | {"build-essential"}
        for p in sorted(want - set(apt)):
            problems.append(f"docs/packaging.md: the apt-get line lacks {p}")
        for p in sorted(set(apt) - want):
            problems.append(f"docs/packaging.md: the apt-get line names {p}, which tools/install-deps.sh does not list as build or package")
    for p in problems:
        print(f"check-deps: {p}")
    if not problems:
        print(f"check-deps: debian/control and docs/packaging.md name the {len(build)} build and "
              f"{len(package)} package packages of tools/install-deps.sh")
    return 1 if problems else 0


# ---------------------------------------------------------------------------------------------
# Which system files did the build use?

def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def ninja_deps(build_dir):
    """{object path (relative to the build dir): [dependency paths]} from Ninja's log."""
    r = run(["ninja", "-C", build_dir, "-t", "deps"])
    deps, current = {}, None
    for line in r.stdout.splitlines():
        if not line.startswith(" ") and ":" in line:
            current = line.split(":", 1)[0]
            deps[current] = [] if "(VALID)" in line or "(STALE)" in line else None
        elif line.strip() and current is not None and deps.get(current) is not None:
            deps[current].append(line.strip())
    return {k: v for k, v in deps.items() if v}


def preprocessor_deps(entry):
    """Dependencies of one compile_commands.json entry from the compiler's -M -MG: every header it
    includes, and (as written in the source) the ones it cannot find."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out, skip_next = [], False
    for a in args:
        if skip_next:
            skip_next = False
            continue
        if a in ("-o", "-MT", "-MF", "-MQ"):
            skip_next = True
            continue
        if a in ("-c", "-MD", "-MMD") or a.startswith("-o"):
            continue
        out.append(a)
    r = run(out + ["-M", "-MG"], cwd=entry["directory"])
    text = r.stdout.replace("\\\n", " ")
    if ":" not in text:
        return [], r.stderr.strip().splitlines()[:3]
    return text.split(":", 1)[1].split(), []


LIB_DIRS = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib", "/lib/x86_64-linux-gnu",
            "/lib/aarch64-linux-gnu", "/lib"] + sorted(glob.glob("/usr/lib/gcc/*/*"), reverse=True)


def link_files(build_dir):
    """{file: link command's output} for the libraries the link lines name."""
    r = run(["ninja", "-C", build_dir, "-t", "commands"])
    found = {}
    for line in r.stdout.splitlines():
        if " -o " not in line or (".so" not in line and " -l" not in line and ".a " not in line):
            continue
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        target = words[words.index("-o") + 1] if "-o" in words and words.index("-o") + 1 < len(words) else "?"
        for w in words:
            if w.startswith("-l") and len(w) > 2:
                name = w[2:]
                for d in LIB_DIRS:
                    for cand in (f"{d}/lib{name}.so", f"{d}/lib{name}.a"):
                        if os.path.exists(cand):
                            found.setdefault(cand, target)
                            break
                    else:
                        continue
                    break
            elif w.startswith("/") and re.search(r"\.(so(\.[0-9]+)*|a)$", w) and os.path.exists(w):
                found.setdefault(w, target)
    return found


def system_files(build_dir):
    """({system file: a translation unit or link output that used it}, [missing header lines])."""
    cc_path = os.path.join(build_dir, "compile_commands.json")
    if not os.path.exists(cc_path):
        skip(f"{build_dir} has no compile_commands.json (configure with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON)")
    entries = json.load(open(cc_path))
    logged = ninja_deps(build_dir)
    used, missing = {}, []
    for e in entries:
        obj = e.get("output")
        if obj is None:
            args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
            obj = args[args.index("-o") + 1] if "-o" in args else None
        unit = os.path.relpath(e["file"], repo_root()) if e["file"].startswith(repo_root()) else e["file"]
        deps = logged.get(obj) if obj else None
        if deps is None:
            deps, errors = preprocessor_deps(e)
            if not deps and errors:
                missing.append(f"{unit}: the preprocessor failed: {' '.join(errors)}")
        for d in deps:
            if d.startswith("/"):
                if not d.startswith(repo_root() + "/") and not d.startswith(os.path.abspath(build_dir) + "/"):
                    used.setdefault(os.path.normpath(d), unit)
            elif d.endswith((".h", ".hpp", ".hh", ".hxx", ".inl", ".ipp")) or "/" in d:
                # -MG names a header it could not find as written in the #include.
                if not os.path.exists(os.path.join(e["directory"], d)):
                    missing.append(f"{unit} includes <{d}>, which no installed package provides")
    for f, target in link_files(build_dir).items():
        used.setdefault(os.path.normpath(f), target)
    return used, sorted(set(missing))


def dpkg_owners(paths):
    """{path: package} from dpkg's file lists (a path reached through a symlink by its target too)."""
    want = {}
    for p in paths:
        want.setdefault(p, p)
        real = os.path.realpath(p)
        want.setdefault(real, p)
        # /usr-merged systems list /lib/... files that are reached as /usr/lib/... and the reverse.
        for a, b in (("/usr/lib/", "/lib/"), ("/lib/", "/usr/lib/")):
            for q in (p, real):
                if q.startswith(a):
                    want.setdefault(b + q[len(a):], p)
    owners = {}
    for lst in glob.glob("/var/lib/dpkg/info/*.list"):
        pkg = os.path.basename(lst)[:-5].split(":")[0]
        with open(lst, errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                if line in want:
                    owners.setdefault(want[line], pkg)
    return owners


def closure(packages):
    """The packages, every package they depend on (recursively, without recommends), and every
    Essential or required package (what any Debian system has)."""
    out = set(packages)
    if packages:
        r = run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
                 "--no-breaks", "--no-replaces", "--no-enhances"] + sorted(packages))
        for line in r.stdout.splitlines():
            s = line.strip()
            if not s:
                continue
            if not line.startswith(" "):
                out.add(s.strip("<>").split(":")[0])
            elif s.startswith(("Depends:", "PreDepends:", "|Depends:", "|PreDepends:")):
                out.add(s.split(":", 1)[1].strip().strip("<>").split(":")[0])
    r = run(["dpkg-query", "-W", "-f=${Package} ${Essential} ${Priority}\n"])
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) >= 3 and (f[1] == "yes" or f[2] == "required"):
            out.add(f[0])
    # A virtual package (debhelper-compat) is provided by a real one.
    if "debhelper-compat" in out:
        out.add("debhelper")
    return out


def check_build(build_dir, against, packages_file):
    if not shutil.which("dpkg-query") or not shutil.which("apt-cache"):
        skip("no dpkg-query or apt-cache here (not a Debian system)")
    if not os.path.exists(os.path.join(build_dir, "build.ninja")) or not shutil.which("ninja"):
        skip(f"{build_dir} is not a Ninja build")
    if "Depends" not in run(["apt-cache", "depends", "g++"]).stdout:
        skip("apt has no package lists here (run apt-get update once)")
    repo = repo_root()
    if packages_file:
        listed = [l.split("#", 1)[0].strip() for l in open(packages_file)]
        listed = [l for l in listed if l]
        source = packages_file
    elif against == "debian/control":
        listed = build_depends(os.path.join(repo, "debian", "control")) + ["build-essential"]
        source = "debian/control's Build-Depends"
    else:
        r = run([os.path.join(repo, "tools", "install-deps.sh"), "--list"])
        listed = r.stdout.split()
        source = "tools/install-deps.sh"
    used, missing = system_files(build_dir)
    if not used and not missing:
        skip(f"{build_dir}: no dependency information (build or configure it first)")
    owners = dpkg_owners(used.keys())
    have = closure(listed)
    bad = {}
    for path, pkg in sorted(owners.items()):
        if pkg not in have:
            bad.setdefault(pkg, (path, used[path]))
    for pkg, (path, unit) in sorted(bad.items()):
        print(f"check-deps: {pkg} is not installed by {source} (the build used {path}, from {unit})")
    for m in missing:
        print(f"check-deps: {m}: add the package that has it to tools/install-deps.sh")
    if bad or missing:
        return 1
    pkgs = sorted(set(owners.values()))
    print(f"check-deps: every system file the build used ({len(used)} files, {len(pkgs)} packages: "
          f"{' '.join(pkgs)}) comes from {source}")
    return 0


def main(argv):
    if len(argv) >= 2 and argv[1] == "lists":
        return check_lists(argv[2] if len(argv) > 2 else repo_root())
    if len(argv) >= 3 and argv[1] == "build":
        against, packages_file, rest = "install-deps", None, argv[3:]
        while rest:
            if rest[0] == "--against" and len(rest) > 1:
                against, rest = rest[1], rest[2:]
            elif rest[0] == "--packages-file" and len(rest) > 1:
                packages_file, rest = rest[1], rest[2:]
            else:
                print(__doc__)
                return 2
        if against not in ("install-deps", "debian/control"):
            print(__doc__)
            return 2
        return check_build(argv[2], against, packages_file)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
