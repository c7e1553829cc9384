#!/usr/bin/env python3
"""Clang's thread-safety analysis over the project's annotated code.

The annotations in core/include/troupe/core/thread_annotations.h
(TROUPE_GUARDED_BY, TROUPE_REQUIRES, Mutex, MutexLock, CondVar) compile to
nothing with gcc. This compiles, syntax only, every project translation unit
that uses them (directly or through a project header it includes) with
`clang++ -Wthread-safety -Werror=thread-safety` and the flags of the real build
(build/compile_commands.json), and fails on the first finding.

Usage: scripts/check-thread-safety.py [BUILD_DIR] [--jobs N] [--all]
  --all   every project translation unit, not only the annotated ones
Run by CTest as `thread_safety_check` (part of scripts/test.sh).
"""
import argparse, json, os, re, shlex, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("core", "transport", "engine", "envs", "trainer", "broadcast", "actors", "launcher",
           "jinja")
ANNOTATED = re.compile(r"TROUPE_(GUARDED_BY|PT_GUARDED_BY|REQUIRES|ACQUIRE|RELEASE|EXCLUDES)|"
                       r"\bMutexLock\b")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def include_dirs():
    dirs = []
    for f in FOLDERS:
        for sub in ("include", "src"):
            d = os.path.join(ROOT, f, sub)
            if os.path.isdir(d):
                dirs.append(d)
    return dirs


def uses_annotations(path, dirs, seen):
    """True if `path` or a project header it includes (transitively) uses them."""
    if path in seen:
        return False
    seen.add(path)
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError:
        return False
    if ANNOTATED.search(text):
        return True
    for inc in INCLUDE.findall(text):
        for base in [os.path.dirname(path)] + dirs:
            cand = os.path.join(base, inc)
            if os.path.isfile(cand):
                if uses_annotations(os.path.abspath(cand), dirs, seen):
                    return True
                break
    return False


def clang_command(entry):
    args = shlex.split(entry["command"]) if "command" in entry else entry["arguments"]
    out = ["clang++", "-fsyntax-only", "-Wno-everything", "-Wthread-safety",
           "-Werror=thread-safety"]
    i = 1
    while i < len(args):
        a = args[i]
        if a in ("-o", "-c"):
            i += 2
            continue
        if a.startswith(("-D", "-I", "-std=")):
            out.append(a)
        elif a in ("-isystem", "-include", "-iquote"):
            # gcc's precompiled torch header (troupe_torch_pch) is not clang's: include the
            # headers themselves.
            if not (a == "-include" and args[i + 1].endswith("cmake_pch.hxx")):
                out += [a, args[i + 1]]
            i += 1
        i += 1
    return out + [entry["file"]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=os.environ.get("TROUPE_BUILD_DIR", "build"))
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("TROUPE_TEST_JOBS", "2")))
    ap.add_argument("--all", action="store_true")
    a = ap.parse_args()
    db = os.path.join(a.build, "compile_commands.json")
    if not os.path.exists(db):
        sys.exit(f"check-thread-safety: {db} not found (configure the build first)")
    dirs = include_dirs()
    todo = []
    for e in json.load(open(db)):
        rel = os.path.relpath(e["file"], ROOT)
        if rel.split(os.sep)[0] not in FOLDERS:
            continue
        if a.all or uses_annotations(os.path.abspath(e["file"]), dirs, set()):
            todo.append((rel, clang_command(e), e["directory"]))
    t0 = time.time()

    def run(job):
        rel, cmd, cwd = job
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        return rel, r.returncode, r.stderr

    failed = 0
    with ThreadPoolExecutor(max(1, a.jobs)) as ex:
        for rel, rc, err in ex.map(run, todo):
            if rc != 0:
                failed += 1
                print(f"thread-safety: {rel}\n{err}", flush=True)
    print(f"thread-safety: {len(todo)} translation units, {failed} with findings "
          f"({time.time() - t0:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
