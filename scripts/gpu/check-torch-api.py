#!/usr/bin/env python3
"""Compiles Troupe's torch-using code against another libtorch's headers (syntax only).

The CPU build uses Debian 12's libtorch 1.13; a GPU machine builds against a PyTorch 2.x
wheel's libtorch. This checks, on a machine without that wheel, that every translation unit
that includes torch (those whose compile command carries torch's include directory in
BUILD/compile_commands.json) still compiles against another torch's headers, with the real
build's flags (-Werror included), `g++ -fsyntax-only`. No object is written, nothing links.

  scripts/gpu/check-torch-api.py --torch DIR        # DIR/include holds ATen/, c10/, torch/
  scripts/gpu/check-torch-api.py --debian-trixie    # Debian 13's libtorch-dev (torch 2.6) +
                                                    # libgloo-dev, fetched with apt-get download
Options: --build DIR (default build), --gloo DIR (gloo headers: DIR/gloo/...), --jobs N,
--only REGEX (files to check), --keep-going. DIR may be a wheel's torch/ folder, or the
torch-headers.tgz that scripts/gpu/build-and-check.sh leaves in its results, unpacked.

What it proves: the C++ API Troupe calls exists with these signatures in that torch.
What it does not: linking, run-time behaviour, CUDA code paths needing CUDA headers.
"""
import argparse, json, os, re, shlex, subprocess, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRIXIE = os.path.join(ROOT, ".gpu-deps", "trixie-torch")


def apt_download_trixie(dest):
    """Debian 13's libtorch-dev and libgloo-dev, unpacked into dest (apt with its own lists)."""
    if os.path.isfile(os.path.join(dest, "usr/include/torch/csrc/api/include/torch/version.h")):
        return os.path.join(dest, "usr")
    work = os.path.join(dest, ".apt")
    for d in ("lists/partial", "cache/archives/partial", "debs"):
        os.makedirs(os.path.join(work, d), exist_ok=True)
    src = os.path.join(work, "sources.list")
    with open(src, "w") as f:
        f.write("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
                "http://deb.debian.org/debian trixie main\n")
    # Own source list, lists and cache: the machine's apt state is never touched.
    opts = ["-o", f"Dir::Etc::SourceList={src}", "-o", "Dir::Etc::SourceParts=/nonexistent",
            "-o", f"Dir::State::Lists={work}/lists", "-o", f"Dir::Cache={work}/cache",
            "-o", "APT::Architecture=amd64", "-o", "APT::Sandbox::User=root"]
    subprocess.run(["apt-get", *opts, "update", "-qq"], check=True)
    subprocess.run(["apt-get", *opts, "download", "-qq", "libtorch-dev", "libgloo-dev"],
                   check=True, cwd=os.path.join(work, "debs"))
    for deb in sorted(os.listdir(os.path.join(work, "debs"))):
        subprocess.run(["dpkg-deb", "-x", os.path.join(work, "debs", deb), dest], check=True)
    return os.path.join(dest, "usr")


def torch_version(include):
    text = open(os.path.join(include, "torch/csrc/api/include/torch/version.h")).read()
    m = re.search(r'#define TORCH_VERSION\s*\\?\s*"([^"]+)"', text)
    return m.group(1) if m else "unknown"


def command_for(entry, include, gloo):
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a == "-c" or a.startswith("-O") or a == "-Winvalid-pch":
            continue
        # The build's precompiled header was made from this build's torch: leave it out (the
        # sources include what they use; the header only speeds the build up).
        if a == "-include" and i + 1 < len(args) and "cmake_pch" in args[i + 1]:
            skip = True
            continue
        if a == "-isystem" and i + 1 < len(args) and args[i + 1].endswith("torch/csrc/api/include"):
            out += ["-isystem", os.path.join(include, "torch/csrc/api/include"),
                    "-isystem", include]
            if gloo:
                out += ["-isystem", gloo]
            skip = True
            continue
        out.append(a)
    if out and "ccache" in os.path.basename(out[0]):
        out = out[1:]
    return out + ["-O0", "-fsyntax-only"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--torch", help="folder whose include/ holds the other torch's headers")
    g.add_argument("--debian-trixie", action="store_true",
                   help="use Debian 13's libtorch-dev (fetched into .gpu-deps/trixie-torch)")
    p.add_argument("--gloo", help="gloo headers (the folder holding gloo/)")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--jobs", type=int, default=int(os.environ.get("TROUPE_JOBS", "2")))
    p.add_argument("--only", help="regex on the file path")
    a = p.parse_args()

    if a.debian_trixie:
        prefix = apt_download_trixie(TRIXIE)
        include, gloo = os.path.join(prefix, "include"), a.gloo or os.path.join(prefix, "include")
    else:
        include = os.path.join(os.path.abspath(a.torch), "include")
        gloo = a.gloo
        if not gloo and os.path.isdir(os.path.join(include, "gloo")):
            gloo = include
    for d in ("ATen", "c10", "torch/csrc/api/include/torch"):
        if not os.path.isdir(os.path.join(include, d)):
            sys.exit(f"check-torch-api: {include}/{d} missing: not a torch include folder")
    cc_path = os.path.join(a.build, "compile_commands.json")
    try:
        entries = json.load(open(cc_path))
    except OSError as e:
        sys.exit(f"check-torch-api: {cc_path}: {e.strerror} (configure the build first)")
    only = re.compile(a.only) if a.only else None
    todo = [e for e in entries if "torch/csrc/api/include" in e.get("command", " ".join(
        e.get("arguments", []))) and (not only or only.search(e["file"]))
            and "cmake_pch" not in os.path.basename(e["file"])]
    version = torch_version(include)
    print(f"check-torch-api: {len(todo)} translation units against torch {version} "
          f"({include}), gloo {'from ' + gloo if gloo else 'none'}, {a.jobs} jobs", flush=True)

    def run(e):
        t0 = time.time()
        r = subprocess.run(command_for(e, include, gloo), cwd=e["directory"],
                           capture_output=True, text=True)
        return e["file"], r.returncode, r.stderr, time.time() - t0

    failed = []
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for f, rc, err, dt in pool.map(run, todo):
            rel = os.path.relpath(f, ROOT)
            if rc == 0:
                print(f"  ok    {rel} ({dt:.0f} s)", flush=True)
                continue
            failed.append(rel)
            first = [l for l in err.splitlines() if ": error: " in l or ": warning: " in l]
            print(f"  FAIL  {rel}", flush=True)
            for line in (first or err.splitlines())[:8]:
                print(f"        {line.replace(ROOT + '/', '')}", flush=True)
    print(f"check-torch-api: torch {version}: {len(todo) - len(failed)} of {len(todo)} "
          f"translation units compile" + (f"; failed: {' '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
