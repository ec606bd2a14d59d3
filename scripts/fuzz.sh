#!/usr/bin/env bash
# Fuzzes kvtier's parsers (tests/fuzz) with libFuzzer: clang 14, every file
# built with ASan and UBSan in build-fuzz/. Each target starts from its
# seeds and the inputs saved under tests/fuzz/found/<target>/, and its
# corpus grows in build-fuzz/corpus/<target>/. An input that crashes or
# breaks a property is written as build-fuzz/found-<target>-crash-...:
# once the parser is fixed, save it under tests/fuzz/found/<target>/ so
# that ctest replays it in every build.
#   scripts/fuzz.sh [SECONDS] [TARGET ...]   default: 60 seconds each, all targets
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
[ $# -gt 0 ] && shift
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(sed -n 's/^kvtier_fuzz_target(\([a-z0-9_]*\) .*/\1/p' tests/fuzz/CMakeLists.txt)
fi

bash scripts/setup.sh
if [ ! -e /usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.fuzzer-x86_64.a ]; then
  apt-get update -q && apt-get install -y -q libfuzzer-14-dev
fi
cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVTIER_FUZZ=ON \
  -DKVTIER_CUDA=OFF -DKVTIER_BUILD_BENCHMARKS=OFF
ninja -C build-fuzz -j2 "${targets[@]/#/fuzz_}"

export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp"
for t in "${targets[@]}"; do
  binary=build-fuzz/tests/fuzz/fuzz_$t
  corpus=build-fuzz/corpus/$t
  KVTIER_FUZZ_WRITE_SEEDS=$corpus "$binary"
  saved=()
  [ -d "tests/fuzz/found/$t" ] && saved=("tests/fuzz/found/$t")
  echo "fuzz.sh: $t for $seconds s"
  "$binary" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="build-fuzz/found-$t-" \
    "$corpus" "${saved[@]}"
done
