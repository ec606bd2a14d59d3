#!/usr/bin/env python3
"""Store a prefix's blocks in a kvtier-cache, then match and read them back.

    kvtier-cache --listen 127.0.0.1:7070 --device-capacity 64MiB --host-capacity 64MiB &
    PYTHONPATH=build/python python3 clients/python/examples/store_and_read.py 127.0.0.1:7070
"""
import sys

import numpy as np

from kvtier import CacheClient, LatentLayout, block_hashes, encode_record, parse_record


def main(target):
    layout = LatentLayout("example-model", num_layers=4, kv_lora_rank=512, rope_dim=64, tokens_per_block=64,
                          codec="int8")
    prompt = list(range(1000, 1000 + 3 * 64 + 10))  # three full blocks and 10 tokens more
    hashes = block_hashes("example", layout, prompt)
    # Latents as a model would give them: [layers][tokens][kv_lora_rank + rope_dim].
    latents = np.random.default_rng(0).standard_normal((layout.num_layers, len(prompt), layout.dim), np.float32)
    records = [encode_record(layout, 0, latents[:, b * 64:(b + 1) * 64]) for b in range(len(hashes))]
    with CacheClient(target) as cache:
        put = cache.put("example", layout, zip(hashes, records))
        print(f"stored {put.blocks_stored} blocks ({put.blocks_deduplicated} already there)")
        print(f"longest cached prefix: {cache.match('example', layout, hashes).matched_blocks} blocks")
        back = cache.get("example", layout, hashes)
        error = np.abs(parse_record(back[0]).latents() - latents[:, :64]).max()
        print(f"read back byte for byte: {back == records}; int8 error of block 0 at most {error:.4f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7070")
