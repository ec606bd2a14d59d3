#!/usr/bin/env bash
# Installs what the build needs, builds everything (with ccache, -j2) and runs
# the test suite. GPU tests carry the ctest label `gpu` and skip, saying so,
# where no device is present.
#   scripts/test.sh              release build in build/, all tests
#   scripts/test.sh --sanitize   ASan + UBSan build in build-asan/, all tests
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)
if [ "${1:-}" = "--sanitize" ]; then
  build_dir=build-asan
  cmake_args=(-DCMAKE_BUILD_TYPE=Debug -DKVTIER_SANITIZE=ON -DKVTIER_BUILD_BENCHMARKS=OFF)
fi

bash scripts/setup.sh
cmake -S . -B "$build_dir" -G Ninja "${cmake_args[@]}"
cmake --build "$build_dir" -j2
ctest --test-dir "$build_dir" -j2 --output-on-failure
