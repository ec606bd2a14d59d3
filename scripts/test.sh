#!/usr/bin/env bash
# Installs what the build needs, builds everything (with ccache, -j2) and runs
# the test suite. GPU tests carry the ctest label `gpu` and skip, saying so,
# where no device is present. The container test (label `container`: the
# image built and the manifests run with podman, minutes) is left out: run
# it with `ctest --test-dir build -L container`.
#   scripts/test.sh              release build in build/, all tests
#   scripts/test.sh --sanitize   ASan + UBSan build in build-asan/, all tests
#   scripts/test.sh --tsan       ThreadSanitizer build in build-tsan/ (no CUDA),
#                                all tests, over an instrumented Abseil
#                                (scripts/tsan_abseil.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)
case "${1:-}" in
  --sanitize)
    build_dir=build-asan
    cmake_args=(-DCMAKE_BUILD_TYPE=Debug -DKVTIER_SANITIZE=ON -DKVTIER_BUILD_BENCHMARKS=OFF)
    ;;
  --tsan)
    build_dir=build-tsan
    cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVTIER_TSAN=ON -DKVTIER_CUDA=OFF -DKVTIER_BUILD_BENCHMARKS=OFF)
    ;;
  "") ;;
  *)
    echo "usage: scripts/test.sh [--sanitize | --tsan]" >&2
    exit 2
    ;;
esac

bash scripts/setup.sh
if [ "$build_dir" = build-asan ]; then
  export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp"
fi
if [ "$build_dir" = build-tsan ]; then
  bash scripts/tsan_abseil.sh
  # The build runs test binaries to list their cases: they load it too.
  export LD_LIBRARY_PATH="$PWD/build-tsan/absl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # A race fails the test that ran into it.
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan.supp"
fi
cmake -S . -B "$build_dir" -G Ninja "${cmake_args[@]}"
cmake --build "$build_dir" -j2
ctest --test-dir "$build_dir" -j2 --output-on-failure -LE container
