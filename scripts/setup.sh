#!/usr/bin/env bash
# Installs every Debian package kvtier needs to build, test and benchmark.
# Idempotent: when everything is already installed it changes nothing and
# does not touch the network.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libssl-dev nlohmann-json3-dev
  # integration tests and benchmarks: a real Prometheus scrapes the cache,
  # Redis is the peer the cache is measured against
  prometheus redis-server libhiredis-dev curl
  # the Kubernetes manifests' check; the Python client (clients/python),
  # its tests and its pip install
  python3 python3-yaml python3-grpcio python3-protobuf python3-crc32c python3-numpy python3-pytest
  python3-setuptools python3-pip
  # the thread-safety analysis (scripts/thread_safety_check.sh)
  clang
  # certificates for the TLS tests and `kvtier up --tls`
  openssl
  # a real DNS server for the discovery tests (SRV records, as Kubernetes)
  dnsmasq-base
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "setup: need root to install: ${missing[*]}" >&2
  exit 1
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends "${packages[@]}"
