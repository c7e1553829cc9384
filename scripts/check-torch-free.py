#!/usr/bin/env python3
"""DESIGN.md: launcher/ and transport/ never include torch headers.

For every translation unit of those folders in BUILD_DIR/compile_commands.json,
asks the compiler for the headers it reads (`-M`, with the build's own flags,
force-included precompiled headers among them) and fails on any torch, ATen or
c10 header. Run by CTest as `torch_free_check`.

Usage: scripts/check-torch-free.py [BUILD_DIR]
"""
import json, os, re, shlex, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("launcher", "transport")
TORCH = re.compile(r"/(torch|ATen|c10)/")


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TROUPE_BUILD_DIR", "build")
    db = os.path.join(build, "compile_commands.json")
    if not os.path.exists(db):
        sys.exit(f"check-torch-free: {db} not found (configure the build first)")
    checked, bad = 0, 0
    for e in json.load(open(db)):
        rel = os.path.relpath(e["file"], ROOT)
        if rel.split(os.sep)[0] not in FOLDERS:
            continue
        args = shlex.split(e["command"]) if "command" in e else list(e["arguments"])
        cmd, i = [], 0
        while i < len(args):
            if args[i] in ("-o", "-c"):
                i += 2
                continue
            if args[i].startswith("-Winvalid-pch"):
                i += 1
                continue
            cmd.append(args[i])
            i += 1
        # -M reads every header textually, those of a precompiled header too.
        r = subprocess.run(cmd + ["-M", e["file"]], cwd=e["directory"], capture_output=True,
                           text=True)
        checked += 1
        if r.returncode != 0:
            bad += 1
            print(f"torch-free: {rel}: the compiler failed\n{r.stderr[:2000]}", flush=True)
            continue
        torch = sorted({h for h in r.stdout.replace("\\\n", " ").split() if TORCH.search(h)})
        if torch:
            bad += 1
            print(f"torch-free: {rel} includes {len(torch)} torch headers, e.g. {torch[0]}",
                  flush=True)
    print(f"torch-free: {checked} translation units of {', '.join(FOLDERS)}, {bad} failing")
    if checked == 0:
        sys.exit("check-torch-free: no translation unit checked")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
