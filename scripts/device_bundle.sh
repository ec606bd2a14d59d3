#!/usr/bin/env bash
# Packs, into device-bundle/ (ignored by git), what the device machine
# cannot build itself (it has nvcc, cmake and ninja but no gRPC, protobuf,
# Abseil or gtest): this machine's release build of the service binaries,
# the gpu-labelled gtest programs, kernels_test (the CPU kernels on the
# device machine's CPU, which may have AVX-512), decode_bench,
# tier_move_bench, cache_bench and tls_bench (with Debian's redis-server,
# their peer, and the openssl command line tls_bench makes certificates with) and
# segment_reuse_bench (no GPU, but many cores), and the CUDA check
# programs (in checks/: the device machine then need not build them),
# stripped, with the Debian shared libraries they load — all but glibc's,
# the C++ runtime's and CUDA's, which the device machine has (newer).
# kernels/cuda/device_check.sh runs them when the bundle is there; name
# device-bundle in the device tool's `carry`.
# Usage, from the repository root, after scripts/test.sh (which builds build/):
#   bash scripts/device_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=device-bundle
programs=(services/kvtier services/kvtier-cache services/kvtier-decode services/kvtier-prefill
          tests/cuda_forward_test tests/fast_path_gpu_test tests/kernels_test
          load/decode_bench load/tier_move_bench load/cache_bench load/tls_bench load/segment_reuse_bench)
checks=(codecs layers matmul mla_attention slab sparse_mla v4_attention)
cmake --build build -j2 --target $(for p in "${programs[@]}"; do basename "$p"; done) \
  $(printf 'kvtier_cuda_check_%s ' "${checks[@]}")
rm -rf "$out"
mkdir -p "$out/lib" "$out/checks"
for p in "${programs[@]}"; do strip -o "$out/$(basename "$p")" "build/$p"; done
# Named redis-server: the one Debian binary acts as redis-check-rdb by name.
strip -o "$out/redis-server" "$(readlink -f /usr/bin/redis-server)"
strip -o "$out/openssl" "$(readlink -f /usr/bin/openssl)"
for c in "${checks[@]}"; do strip -o "$out/checks/kvtier_cuda_check_$c" "build/kernels/kvtier_cuda_check_$c"; done
ldd "$out"/kvtier* "$out"/*_test "$out"/*_bench "$out"/redis-server "$out"/openssl "$out"/checks/* | awk '/=> \// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+)\.so|/usr/local/cuda' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
du -sh "$out"
