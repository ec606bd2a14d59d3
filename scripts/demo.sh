#!/usr/bin/env bash
# The main job: install, build, then `kvtier up` — a generated DeepSeek-V2
# model (V2-Lite attention dims) served by kvtier-cache, kvtier-decode and
# kvtier-prefill on this machine: a two-turn conversation whose second turn
# reuses the first's latent blocks from the cache, then the cache's stats.
# Extra arguments go to `kvtier up` (see `kvtier up --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j2 --target kvtier kvtier-cache kvtier-decode kvtier-prefill
./build/services/kvtier up "$@"
