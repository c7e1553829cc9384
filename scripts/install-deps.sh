#!/usr/bin/env bash
# Installs the Debian 12 packages Troupe needs to build, test and run.
# Idempotent: checks each package first and calls apt only for what is missing,
# so a machine that already has everything never touches apt (CI stays fast).
# Works as root or through sudo; never prompts.
set -euo pipefail

PACKAGES=(
  # toolchain (a fresh Debian 12 has none of it)
  build-essential cmake pkg-config git ccache ninja-build
  # transport
  libzmq3-dev cppzmq-dev capnproto libcapnp-dev libsodium-dev
  # engine / trainer (libtorch 1.13 CPU with c10d + Gloo) and a fast BLAS
  libtorch-dev libopenblas0-pthread
  # Gloo headers: libtorch's ProcessGroupGloo.hpp includes them (weight broadcast)
  libgloo-dev
  # HF tokenizer.json: pre-tokenizer regexes (PCRE2), Unicode normalization (ICU), hash maps
  # (abseil), fast JSON for the 10 MB vocabulary files (simdjson)
  libpcre2-dev libicu-dev libabsl-dev libsimdjson-dev
  # logging, CLI, config, JSON
  libspdlog-dev libfmt-dev libcli11-dev libyaml-cpp-dev nlohmann-json3-dev
  # HTTP client/server for external reward services
  libcpp-httplib-dev libcurl4-openssl-dev
  # fuzzing the message decoders (clang's libFuzzer runtime)
  clang libclang-rt-14-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev python3 procps iproute2
  # the Python peer of the default-job benchmark (a plain PyTorch GRPO loop)
  python3-torch
  # gRPC + protobuf: the peer the transport benchmark is measured against
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  # multi-node tests: real sshd and Slurm daemons on network-namespace hosts
  openssh-server openssh-client slurm-wlm munge
  # the dashboard's tests: a real browser (headless Chromium), a real Prometheus server and
  # promtool, and an independent reader of the TensorBoard event files (Python protobuf, crcmod)
  chromium prometheus python3-protobuf python3-crcmod
  # CRC32C of the TensorBoard record framing (Boost.CRC, header-only)
  libboost-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

install_apt() {
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
      echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1
    fi
  fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq </dev/null
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}" </dev/null
  # Daemons from the packages above must not keep running on the build machine;
  # tests start their own instances in namespaces.
  for svc in ssh slurmctld slurmd munge prometheus; do
    $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || true
  done
  echo "install-deps: done"
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
else
  install_apt
fi
# The npm references of the parity tests (Node from Debian when missing; it checks itself).
"$(dirname "$0")/install-npm-reference.sh"
