#!/usr/bin/env bash
# Packs Troupe's dependencies other than torch, CUDA and NCCL for a GPU machine that has no
# package registry: Debian 12 packages, fetched with `apt-get download` (nothing is installed
# here), unpacked into one prefix and packed as .gpu-deps/troupe-deps.tar.gz, which
# scripts/gpu/build-and-check.sh unpacks anywhere on the GPU machine and relocates.
#
#   scripts/gpu/prepare-deps.sh          # on a Debian 12 machine where install-deps.sh ran
#
# What goes in: the -dev packages the configure step needs (headers, CMake and pkg-config
# files, the capnp and protoc compilers, pkgconf), plus every shared library they and those
# tools load, found with ldd on this machine and mapped to their packages (dpkg -S), minus
# glibc, libgcc and libstdc++ (the GPU machine's own compiler brings those). Boost is cut to
# the headers <boost/crc.hpp> includes (the only Boost header Troupe uses). Static libraries
# are dropped except GoogleTest's. libgloo-dev (2022 headers) is a fallback for a torch whose
# wheel ships no gloo headers.
#
# Relocation: absolute paths into the prefix inside .pc and CMake files become @TROUPE_DEPS@
# (listed in .relocate; build-and-check.sh substitutes the real place), Requires.private
# lines are dropped (shared linking needs none, and their -dev packages are not shipped), and
# bin/ holds wrappers for pkg-config, capnp, capnpc-c++ and protoc that find their libraries
# and the prefix's .pc files relative to themselves.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
D=$ROOT/.gpu-deps
STAGE=$D/stage
DEBS=$D/debs
TARBALL=$D/troupe-deps.tar.gz
LIMIT_MB=${GPU_DEPS_LIMIT_MB:-48}  # the device run carries at most 64 MiB with the tree

DEV=(
  libzmq3-dev cppzmq-dev capnproto libcapnp-dev libsodium-dev   # transport
  libpcre2-dev libicu-dev libabsl-dev libsimdjson-dev           # tokenizer, jinja
  libspdlog-dev libfmt-dev libcli11-dev libyaml-cpp-dev nlohmann-json3-dev
  libcpp-httplib-dev libcurl4-openssl-dev libssl-dev            # envs, launcher
  libprotobuf-dev protobuf-compiler libboost1.74-dev libboost-dev  # launcher (TensorBoard)
  libgtest-dev libgmock-dev                                     # tests
  pkgconf pkgconf-bin                                           # pkg-config for cmake
  libgloo-dev                                                   # fallback gloo headers
)
EXCLUDE="libc6 libgcc-s1 libstdc++6"

for p in "${DEV[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || {
    echo "prepare-deps: $p is not installed here (run scripts/install-deps.sh first)" >&2
    exit 1
  }
done
mkdir -p "$DEBS"

# ---- 1. the package set: DEV plus the packages of every library they or their tools load
mapfile -t PKGS < <(python3 - "$EXCLUDE" "${DEV[@]}" <<'PY'
import os, subprocess, sys
exclude = set(sys.argv[1].split())
dev = sys.argv[2:]

# Which package owns a file: dpkg's own file lists, read once (dpkg -S per file is slow).
owners = {}
info = "/var/lib/dpkg/info"
for name in os.listdir(info):
    if name.endswith(".list"):
        pkg = name[:-5].split(":")[0]
        for line in open(os.path.join(info, name), errors="replace"):
            owners.setdefault(line.rstrip("\n"), pkg)

def owner(path):
    # usrmerge: a package may list /lib/... for what is found as /usr/lib/... and back
    for p in (path, path.replace("/usr/lib/", "/lib/", 1), path.replace("/lib/", "/usr/lib/", 1)):
        if p in owners:
            return owners[p]
    return None

def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False

seeds = set()
for pkg in dev:
    for f in subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True).stdout.split():
        if ("/bin/" in f or ".so" in os.path.basename(f)) and os.path.exists(f):
            r = os.path.realpath(f)
            if os.path.isfile(r) and is_elf(r):
                seeds.add(r)
pkgs = set(dev)
for elf in sorted(seeds):
    o = owner(elf)
    if o: pkgs.add(o)
    out = subprocess.run(["ldd", elf], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "=>" in line and "/" in line.split("=>")[1]:
            lib = os.path.realpath(line.split("=>")[1].split()[0])
            o = owner(lib)
            if o: pkgs.add(o)
for p in sorted(pkgs - exclude):
    print(p)
PY
)
echo "prepare-deps: ${#PKGS[@]} packages (${#DEV[@]} named, the rest their libraries)"

# ---- 2. download the installed versions (apt's own cache folder; nothing is installed)
# (An installed version the mirror no longer serves falls back to apt's candidate.)
for p in "${PKGS[@]}"; do
  ls "$DEBS/${p}_"*.deb >/dev/null 2>&1 && continue
  v=$(dpkg-query -W -f='${Version}' "$p")
  (cd "$DEBS" && { apt-get -o APT::Sandbox::User=root download -qq "$p=$v" 2>/dev/null ||
    apt-get -o APT::Sandbox::User=root download -qq "$p"; })
done

# ---- 3. unpack into one prefix and prune
rm -rf "$STAGE"
mkdir -p "$STAGE"
for p in "${PKGS[@]}"; do dpkg-deb -x "$(ls "$DEBS/${p}_"*.deb | head -1)" "$STAGE"; done
rm -rf "$STAGE"/usr/share/{doc,man,info,lintian,bug,locale,bash-completion} "$STAGE"/etc
find "$STAGE" -name '*.a' ! -name 'libgtest*' ! -name 'libgmock*' -delete
# Boost: only what <boost/crc.hpp> pulls in.
keep=$(printf '#include <boost/crc.hpp>\n' |
  g++ -std=c++17 -M -x c++ -I"$STAGE/usr/include" - | tr ' \\' '\n\n' |
  grep "^$STAGE/usr/include/boost/" | sort -u)
find "$STAGE/usr/include/boost" -type f | sort >"$D/boost-all.txt"
comm -23 "$D/boost-all.txt" <(echo "$keep") | xargs -r rm -f
find "$STAGE/usr/include/boost" -type d -empty -delete
echo "prepare-deps: boost cut to $(echo "$keep" | wc -l) headers"

# ---- 4. relocation: absolute paths into the prefix become @TROUPE_DEPS@
python3 - "$STAGE" <<'PY'
import os, re, sys
stage = sys.argv[1]
rewritten = []
# An absolute path starts a word: after a blank, = " ' ( ; : or a -I/-L flag (not ${prefix}/lib).
path_re = re.compile(r'(?:^|(?<=[\s="\'(;:])|(?<=-[IL]))(/(?:usr|lib)(?:/[^\s"\';)}]*)?)', re.M)
for dirpath, _, files in os.walk(stage):
    for name in files:
        full = os.path.join(dirpath, name)
        rel = os.path.relpath(full, stage)
        pc = name.endswith(".pc")
        cm = "/cmake/" in "/" + rel and (name.endswith(".cmake") or name.endswith(".txt"))
        if not (pc or cm) or os.path.islink(full):
            continue
        text = open(full, encoding="utf-8", errors="surrogateescape").read()
        def sub(m):
            p = m.group(1)
            # only paths the prefix has (a reference to a system library stays as it is)
            return "@TROUPE_DEPS@" + p if os.path.lexists(stage + p) else p
        new = path_re.sub(sub, text)
        if pc:
            new = "\n".join(l for l in new.split("\n") if not l.startswith("Requires.private:"))
        if name == "CapnProtoConfig.cmake":  # the compilers through their wrappers (bin/)
            new = new.replace("@TROUPE_DEPS@/usr/bin/capnp", "@TROUPE_DEPS@/bin/capnp")
        if new != text:
            open(full, "w", encoding="utf-8", errors="surrogateescape").write(new)
            rewritten.append(rel)
with open(os.path.join(stage, ".relocate"), "w") as f:
    f.write("\n".join(sorted(rewritten)) + "\n")
print(f"prepare-deps: {len(rewritten)} .pc/CMake files made relocatable")
PY
mkdir -p "$STAGE/bin"
wrap() {  # wrap NAME REAL: a tool that finds its libraries and .pc files beside itself
  cat >"$STAGE/bin/$1" <<EOF
#!/bin/sh
# Troupe's GPU-machine prefix: runs $2 with the prefix's libraries and .pc files.
D=\$(cd "\$(dirname "\$0")/.." && pwd)
export LD_LIBRARY_PATH="\$D/usr/lib/x86_64-linux-gnu:\$D/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PKG_CONFIG_LIBDIR="\$D/usr/lib/x86_64-linux-gnu/pkgconfig:\$D/usr/share/pkgconfig"
exec "\$D/$2" "\$@"
EOF
  chmod +x "$STAGE/bin/$1"
}
wrap pkg-config usr/bin/pkgconf
wrap capnp usr/bin/capnp
wrap capnpc-c++ usr/bin/capnpc-c++
wrap protoc usr/bin/protoc
for t in pkgconf capnp capnpc-c++; do
  [ -x "$STAGE/usr/bin/$t" ] || { echo "prepare-deps: usr/bin/$t missing" >&2; exit 1; }
done

# ---- 5. pack
tar -C "$STAGE" -czf "$TARBALL" .
mb=$(( $(stat -c %s "$TARBALL") / 1048576 ))
echo "prepare-deps: $TARBALL: ${mb} MiB ($(du -sm "$STAGE" | cut -f1) MiB unpacked)"
if [ "$mb" -gt "$LIMIT_MB" ]; then
  echo "prepare-deps: larger than ${LIMIT_MB} MiB: it would not travel with the tree" >&2
  exit 1
fi
