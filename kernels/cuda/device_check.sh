#!/usr/bin/env bash
# The GPU checks, for the device machine (nvcc, cmake and ninja; no gRPC,
# protobuf or gtest): builds kernels/ with CUDA standalone, then runs the
# CUDA codec check (bytes equal to the CPU codecs') and its GB/s table, and
# the paged MLA decode attention check (against float64 and the CPU) and its
# table of GB/s against the device-to-device copy bandwidth; RMSNorm/RoPE and
# the cuBLAS projections and MoE against the CPU; the device tier slab with
# its spill and promotion rates against pinned cudaMemcpy. Then, when a
# device-bundle/ made by scripts/device_bundle.sh came along (carried), the
# services' GPU tests from it: --device cuda against the CPU (cuda_forward_test,
# `kvtier run --device cuda` included) and the fast path to GPU clients; and
# batched decode steps on the CPU and the GPU (decode_bench).
# Usage, from the repository root: bash kernels/cuda/device_check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build-device}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVTIER_KERNELS_ONLY=ON -DKVTIER_CUDA=ON
cmake --build "$build" -j"$(nproc)" --target kvtier_cuda_check_codecs kvtier_cuda_check_layers kvtier_cuda_check_matmul kvtier_cuda_check_mla_attention kvtier_cuda_check_slab
status=0
"$build"/kernels/kvtier_cuda_check_codecs || status=$?
"$build"/kernels/kvtier_cuda_check_layers || status=$?
"$build"/kernels/kvtier_cuda_check_matmul || status=$?
"$build"/kernels/kvtier_cuda_check_mla_attention || status=$?
"$build"/kernels/kvtier_cuda_check_slab || status=$?
if [ -d device-bundle ]; then
  export LD_LIBRARY_PATH="$PWD/device-bundle/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
  export KVTIER_BINARY="$PWD/device-bundle/kvtier" KVTIER_CACHE_BINARY="$PWD/device-bundle/kvtier-cache"
  device-bundle/cuda_forward_test || status=$?
  device-bundle/fast_path_gpu_test || status=$?
  device-bundle/decode_bench || status=$?
else
  echo "no device-bundle/: the services' GPU tests (scripts/device_bundle.sh) not run"
fi
exit $status
