#!/usr/bin/env bash
# The GPU checks, for the device machine (nvcc, cmake and ninja; no gRPC,
# protobuf or gtest): the CUDA codec check (bytes equal to the CPU codecs')
# and its GB/s table; the paged MLA decode attention check (against float64
# and the CPU) and its table of GB/s against the device-to-device copy
# bandwidth; V3.2's indexer scores, top-k choice and latent gather against
# the CPU, and its sparse decode step against the dense one at 64k tokens;
# V4's attention with sinks against float64 and the CPU, and its decode
# step at V4-Flash's shape; RMSNorm/RoPE and the cuBLAS projections and MoE against the CPU; the
# device tier slab with its spill and promotion rates against
# pinned cudaMemcpy. Then, when a device-bundle/ made by
# scripts/device_bundle.sh came along (carried), the services' GPU tests
# from it: --device cuda against the CPU (cuda_forward_test, `kvtier run
# --device cuda` and V4's presets included), the fast path to GPU clients and spills from
# a GPU tier (fast_path_gpu_test); the CPU kernels on its CPU
# (kernels_test); batched decode steps on the CPU and the
# GPU against their roofline (decode_bench; the GPU's again with every
# launch waited for, and at 1-64 sequences); the store's tier moves with
# the device tier in the GPU against pinned cudaMemcpy (tier_move_bench);
# the cache service's Get and Put against Redis with its device tier in
# the GPU and in host memory (cache_bench, a worker's load in four
# streams and in one); TLS against plaintext and Redis over TLS, and a
# worker's load over TLS in four streams (tls_bench); stores into
# segments fast path readers had, with their memfds made ahead on a
# spare core (segment_reuse_bench: no GPU, but the 16 cores this machine
# lacks); and `kvtier up --device cuda`, on the trained model and on a V4
# preset.
#
# The check programs come prebuilt in device-bundle/checks/ when they run
# there, and are built here otherwise. Each step has a time limit inside
# DEADLINE seconds (default 450) for the whole script, so that a hang still
# leaves the rest of the log; a check that fails is run again, without its
# benchmark, under compute-sanitizer's memcheck. A table of every step's
# exit code and seconds ends the output. CHECKS="codecs slab" runs only
# those checks; SERVICES=0 skips the bundle's tests.
# Usage, from the repository root: bash kernels/cuda/device_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$SECONDS
deadline=${DEADLINE:-450}
summary=()
status=0

# Runs "$@" with at most `cap` seconds (less when the deadline is near) and
# records its exit code: 0 pass, 77 skipped, 124 timed out, else failed.
step() {
  local name=$1 cap=$2
  shift 2
  local left=$((deadline - (SECONDS - start) - 10))
  if ((left < 5)); then
    summary+=("$(printf '%-34s %6s %6s' "$name" "-" "not run (deadline)")")
    status=1
    return 1
  fi
  ((cap > left)) && cap=$left
  echo
  echo "=== $name (at most ${cap} s)"
  local t0=$SECONDS rc=0
  timeout --kill-after=5 "$cap" "$@" || rc=$?
  summary+=("$(printf '%-34s %6d %6d' "$name" "$rc" $((SECONDS - t0)))")
  if ((rc != 0 && rc != 77)); then status=1; fi
  return $rc
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
read -r -a checks <<<"${CHECKS:-codecs mla_attention sparse_mla v4_attention layers matmul slab}"

bin=device-bundle/checks
probe=127
[ -x "$bin/kvtier_cuda_check_layers" ] && { "$bin/kvtier_cuda_check_layers" >/dev/null 2>&1; probe=$?; }
if ((probe == 126 || probe == 127)); then  # absent, or the loader refused it
  echo "no runnable prebuilt checks in $bin: building them here"
  build=${BUILD_DIR:-build-device}
  bin=$build/kernels
  step "build the CUDA checks" 240 bash -c "cmake -S . -B '$build' -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DKVTIER_KERNELS_ONLY=ON -DKVTIER_CUDA=ON >/dev/null && cmake --build '$build' -j$(nproc) --target \
    $(printf 'kvtier_cuda_check_%s ' "${checks[@]}")"
fi
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for c in "${checks[@]}"; do
  rc=0
  step "check $c" 150 "$bin/kvtier_cuda_check_$c" || rc=$?
  if ((rc != 0 && rc != 77)) && [ -x "$sanitizer" ]; then
    step "memcheck $c (no benchmark)" 90 "$sanitizer" --tool memcheck --print-limit 20 \
      "$bin/kvtier_cuda_check_$c" --no-benchmark
  fi
done
if [ "${SERVICES:-1}" = 0 ]; then
  echo "SERVICES=0: the bundle's tests not run"
elif [ -d device-bundle ]; then
  export LD_LIBRARY_PATH="$PWD/device-bundle/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
  export KVTIER_BINARY="$PWD/device-bundle/kvtier" KVTIER_CACHE_BINARY="$PWD/device-bundle/kvtier-cache"
  export KVTIER_MODELS_DIR="$PWD/models"
  if ! step "cuda_forward_test" 120 device-bundle/cuda_forward_test; then
    # Passing with every launch waited for would point at the queued pass
    # (a host buffer freed or a scratch reused too early), not the math.
    step "cuda_forward_test, launches waited" 120 env CUDA_LAUNCH_BLOCKING=1 device-bundle/cuda_forward_test
  fi
  step "fast_path_gpu_test" 60 device-bundle/fast_path_gpu_test
  # The CPU kernels on this machine's CPU: where it has AVX-512, Gemm's
  # wide tiles against DotTile's bits, which a CPU without it cannot test.
  step "kernels_test" 60 device-bundle/kernels_test --gtest_brief=1
  step "decode_bench" 90 device-bundle/decode_bench
  # The same GPU steps with every kernel launch waited for (CUDA's own
  # switch): what the decode step cost when each op waited for its stream.
  # bf16 weights only: the GPU dequantizes FP8 ones to bf16 at load.
  step "decode_bench, launches waited" 60 env CUDA_LAUNCH_BLOCKING=1 device-bundle/decode_bench --cuda-only --weights bf16
  # 1 to 64 sequences: how the step grows with the batch, each against its
  # roofline (every layer uploads each sequence's float tail).
  step "decode_bench, 1-64 sequences" 90 device-bundle/decode_bench --cuda-only --weights bf16 --sequences 1,8,16,32,64
  step "tier_move_bench" 60 device-bundle/tier_move_bench --rounds 5
  # The cache service over loopback TCP and the fast path with its device
  # tier in the GPU, beside Redis and memcpy (issue 3's table).
  step "cache_bench, device tier in the GPU" 150 device-bundle/cache_bench --cache-binary \
    device-bundle/kvtier-cache --redis-binary device-bundle/redis-server --rounds 11 --clients 1,4
  # The same with the device tier in host memory: issue 44's Put against
  # Get on 16 cores, without the GPU slab's staging in the way.
  step "cache_bench, device tier in host memory" 90 device-bundle/cache_bench --cache-binary \
    device-bundle/kvtier-cache --redis-binary device-bundle/redis-server --rounds 7 --clients 1,4 \
    --device-memory host
  # Its worker loads read each prefix in one stream for every four cores
  # (4 here); the same with one stream, to set beside them.
  step "cache_bench, device tier in host memory, one stream a load" 60 device-bundle/cache_bench --cache-binary \
    device-bundle/kvtier-cache --redis-binary device-bundle/redis-server --rounds 7 --clients 1 \
    --device-memory host --fetch-streams 1
  # And without room kept ahead (Puts demote for themselves): what keeping
  # it ahead buys on 16 cores.
  step "cache_bench, device tier in host memory, no room ahead" 90 device-bundle/cache_bench --cache-binary \
    device-bundle/kvtier-cache --redis-binary device-bundle/redis-server --rounds 7 --clients 1,4 \
    --device-memory host --cache-flags=--no-demote-ahead
  # TLS against plaintext and Redis over TLS on 16 cores, and a worker's
  # load (64 blocks: four streams of 8 MiB or more); the bundle's openssl
  # only where the machine has none.
  step "tls_bench" 60 env PATH="$PATH:$PWD/device-bundle" device-bundle/tls_bench \
    --cache-binary device-bundle/kvtier-cache --redis-binary device-bundle/redis-server --rounds 5 --blocks 64
  step "segment_reuse_bench" 40 device-bundle/segment_reuse_bench --rounds 3
  # The whole system with the model on the GPU, as the README's first
  # command runs it on the CPU.
  step "kvtier up --device cuda" 60 device-bundle/kvtier up --device cuda --model "$PWD/models/jargon-mla" \
    --dir /tmp/kvtier-up-cuda
  # DeepSeek-V4 through the services with its products, indexer and
  # attention on the GPU (its second turn restores from the cache).
  step "kvtier up v4-tiny --device cuda" 60 device-bundle/kvtier up --device cuda --preset v4-tiny \
    --dir /tmp/kvtier-up-v4-cuda
else
  echo "no device-bundle/: the services' GPU tests (scripts/device_bundle.sh) not run"
fi
echo
echo "=== summary ($((SECONDS - start)) s in all)"
printf '%-34s %6s %6s\n' step rc s
printf '%s\n' "${summary[@]}"
exit $status
