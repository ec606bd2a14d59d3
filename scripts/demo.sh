#!/usr/bin/env bash
# The main job: install, build, then `kvtier up` — the small DeepSeek-V2
# trained on the Jargon File (models/) served by kvtier-cache, kvtier-decode
# and kvtier-prefill on this machine: a two-turn conversation in text whose
# second turn reuses the first's latent blocks from the cache, then the
# cache's stats.
# Extra arguments go to `kvtier up` (see `kvtier up --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j2 --target kvtier kvtier-cache kvtier-decode kvtier-prefill
./build/services/kvtier up "$@"
