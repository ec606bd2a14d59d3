#!/usr/bin/env bash
# Installs every Debian package kvtier needs to build, test and benchmark;
# with --build-only, only what compiling the binaries needs (the image's
# build stage: cmake -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_BENCHMARKS=OFF).
# Idempotent: when everything is already installed it changes nothing and
# does not touch the network.
set -euo pipefail

build_only=false
case "${1:-}" in
  "") ;;
  --build-only) build_only=true ;;
  *) echo "usage: scripts/setup.sh [--build-only]" >&2; exit 2 ;;
esac

packages=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libssl-dev nlohmann-json3-dev
)
if ! $build_only; then packages+=(
  ccache git
  libgtest-dev libgmock-dev libbenchmark-dev
  # integration tests and benchmarks: a real Prometheus scrapes the cache,
  # Redis is the peer the cache is measured against
  prometheus redis-server libhiredis-dev curl
  # the Kubernetes manifests' check; the Python client (clients/python),
  # its tests and its pip install
  python3 python3-yaml python3-jsonpatch python3-grpcio python3-protobuf python3-crc32c python3-numpy python3-pytest
  python3-setuptools python3-pip python3-dev
  # load/plot_hit_rate.py's pictures
  python3-matplotlib
  # the thread-safety analysis (scripts/thread_safety_check.sh) and the
  # sources' checks (scripts/check_sources.sh)
  clang clang-format python3-pyflakes
  # certificates for the TLS tests and `kvtier up --tls`
  openssl
  # a real DNS server for the discovery tests (SRV records, as Kubernetes)
  dnsmasq-base
); fi

# Node.js and npm (the manifests' schema test, tests/deploy) come from
# Debian unless the machine has a Node.js already: another distribution's
# package of it conflicts with Debian's npm.
if ! $build_only && ! command -v npm >/dev/null; then
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
else
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "${packages[@]}"
fi
$build_only && exit 0

# The Kubernetes schemas, as pinned by tests/deploy/package-lock.json.
deploy_tests="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/deploy"
if [ ! -d "$deploy_tests/node_modules/kubernetes-models" ]; then
  echo "setup: installing the Kubernetes schemas (npm ci in tests/deploy)"
  npm ci --prefix "$deploy_tests" --no-audit --no-fund --loglevel=error
fi
