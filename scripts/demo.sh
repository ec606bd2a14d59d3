#!/usr/bin/env bash
# The main job at this stage of kvtier: install, build, then compare the latent
# codecs with the seed reports' quantization baselines on synthetic DeepSeek-V2
# latents (4,096 tokens x (512 + 64), outlier channels).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j2 --target kvtier
./build/services/kvtier quant-eval --synthetic "$@"
