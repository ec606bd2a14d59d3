#!/usr/bin/env bash
# Builds Debian's Abseil (the same version and patches as libabsl-dev) with
# ThreadSanitizer into build-tsan/absl/lib, for `scripts/test.sh --tsan`.
# Why: absl::Mutex in Debian's uninstrumented library is invisible to TSan,
# which then reports every access guarded by one as a race; the instrumented
# library, found first through LD_LIBRARY_PATH, is what gRPC and kvtier both
# load. Needs Debian's source packages (adds a deb-src entry for them).
# Idempotent: does nothing when the library is already built.
set -euo pipefail
cd "$(dirname "$0")/.."

out=build-tsan/absl
if [ -f "$out/lib/libabsl_synchronization.so.20220623" ]; then
  echo "tsan_abseil: instrumented Abseil already in $out/lib"
  exit 0
fi
if [ ! -f /etc/apt/sources.list.d/debian-src.sources ]; then
  sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > /etc/apt/sources.list.d/debian-src.sources
  apt-get update
fi
mkdir -p "$out/src"
(cd "$out/src" && apt-get source abseil)
src=$(find "$out/src" -maxdepth 1 -type d -name 'abseil-*' | head -1)
cmake -S "$src" -B "$out/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_SHARED_LIBS=ON \
  -DCMAKE_CXX_STANDARD=17 -DABSL_PROPAGATE_CXX_STD=ON \
  -DCMAKE_CXX_FLAGS=-fsanitize=thread -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread
cmake --build "$out/build" -j2
mkdir -p "$out/lib"
find "$out/build" -name 'libabsl_*.so.20220623*' -exec cp -a {} "$out/lib/" \;
echo "tsan_abseil: instrumented Abseil in $out/lib"
