#!/usr/bin/env python3
"""The Python client's get() against the C++ decode worker's load of the
same prefix, in one run: a 4,096-token DeepSeek-V2-Lite int8 prefix (64
blocks x 27 layers, 1,026,468 B a block, 65.7 MB) stored in a kvtier-cache
started here, then read back by

  python get(), verified   CacheClient.get: gRPC Get, each record parsed
                           (header, CRC32C, layout) as it arrives
  python get(), unverified the same without parsing
  python stub only         the generated stub's Get stream, answers
                           iterated and dropped: gRPC Python alone
  ..., freed heap kept     get() in a process that called
                           kvtier.keep_freed_heap() and read the prefix
                           once before: a child process each round, the
                           median of three reads of each kind, interleaved
  ... with python3-crc32c  the same, the records checked with Debian's
                           python3-crc32c (as a build without
                           kvtier._native checks them)
  worker load, TCP         cache_bench's row (its own cache, the same
                           prefix): ShardSet::Fetch over TCP, every record
                           appended to a sequence cache, as a decode
                           worker does; the median of its three rounds,
                           since its first lands in memory the process
                           never had

interleaved round by round (cache_bench's rows between the Python ones).

  PYTHONPATH=build/python python3 load/python_get_bench.py \\
      --cache-binary build/services/kvtier-cache --cache-bench build/load/cache_bench --rounds 5
"""
import argparse
import re
import statistics
import subprocess
import sys
import time

import crc32c as package_crc32c
import numpy as np

from kvtier import CacheClient, LatentLayout, block_hashes, encode_record, keep_freed_heap
from kvtier import records as kvtier_records
from kvtier.codecs import NATIVE
from kvtier.v1 import cache_pb2

BLOCKS, TOKENS = 64, 64
LAYOUT = LatentLayout("deepseek-v2-lite-bench", 27, 512, 64, TOKENS, "int8")


def prefix_hashes():
    rng = np.random.default_rng(1)
    tokens = [int(t) for t in rng.integers(0, 100000, size=BLOCKS * TOKENS)]
    return block_hashes("bench", LAYOUT, tokens)


def start_cache(binary):
    cache = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--device-capacity", "1GiB",
                              "--host-capacity", "64MiB", "--no-fast-path"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    for line in cache.stdout:
        if line.startswith("listening on "):
            return cache, line.split()[-1]
    sys.exit("kvtier-cache did not start")


def worker_load_gbps(cache_bench, cache_binary):
    out = subprocess.run([cache_bench, "--cache-binary", cache_binary, "--rounds", "3", "--clients", "1"],
                         capture_output=True, text=True, check=True).stdout
    row = re.search(r"^worker load, TCP\s+1\s+([0-9.]+)", out, re.M)
    return float(row.group(1))


def read_with_kept_heap(target):
    """Prints get()'s rate verified, verified with python3-crc32c and
    unverified in this process with the freed heap kept, after one untimed
    read: the median of three reads of each, interleaved."""
    assert keep_freed_heap(), "the C library refused the setting"
    client = CacheClient(target, timeout=120)
    hashes = prefix_hashes()
    total = sum(map(len, client.get("bench", LAYOUT, hashes)))
    kinds = ((True, kvtier_records.crc32c), (True, package_crc32c.crc32c), (False, kvtier_records.crc32c))
    rates = [[] for _ in kinds]
    for _ in range(3):
        for (verify, crc32c), kind_rates in zip(kinds, rates):
            kvtier_records.crc32c = crc32c  # what the records are checked with
            start = time.perf_counter()
            client.get("bench", LAYOUT, hashes, verify=verify)
            kind_rates.append(total / (time.perf_counter() - start) / 1e9)
    print(*map(statistics.median, rates))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-binary")
    parser.add_argument("--cache-bench")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--read-with-kept-heap", metavar="TARGET", help=argparse.SUPPRESS)  # the child's part
    args = parser.parse_args()

    if args.read_with_kept_heap:
        read_with_kept_heap(args.read_with_kept_heap)
        return
    if not args.cache_binary or not args.cache_bench:
        parser.error("--cache-binary and --cache-bench are required")
    assert NATIVE, "kvtier was built without kvtier._native"
    layout, hashes = LAYOUT, prefix_hashes()
    layer = np.random.default_rng(2).standard_normal((layout.num_layers, TOKENS, layout.dim)).astype(np.float32)
    records = []
    for b in range(BLOCKS):  # distinct blocks: one latent varies with the block
        layer[0, 0, 0] = b
        records.append(encode_record(layout, 0, layer))
    total = sum(len(r) for r in records)

    cache, target = start_cache(args.cache_binary)
    try:
        client = CacheClient(target, timeout=120)
        assert client.put("bench", layout, zip(hashes, records)).blocks_stored == BLOCKS
        request = cache_pb2.GetRequest(kv_namespace="bench", layout=layout.to_proto(), block_hashes=hashes)

        def stub_only():
            for _ in client._stub.Get(request, timeout=120):
                pass

        paths = {"python get(), verified": lambda: client.get("bench", layout, hashes),
                 "python get(), unverified": lambda: client.get("bench", layout, hashes, verify=False),
                 "python stub only": stub_only}
        kept = ["python get(), verified, freed heap kept", "python get(), verified with python3-crc32c, heap kept",
                "python get(), unverified, freed heap kept"]
        rates = {name: [] for name in [*paths, *kept, "worker load, TCP"]}
        for _ in range(args.rounds):
            for name, fetch in paths.items():
                start = time.perf_counter()
                fetch()
                rates[name].append(total / (time.perf_counter() - start) / 1e9)
            child = subprocess.run([sys.executable, __file__, "--read-with-kept-heap", target], capture_output=True,
                                   text=True, check=True)
            for name, rate in zip(kept, child.stdout.split()):
                rates[name].append(float(rate))
            rates["worker load, TCP"].append(worker_load_gbps(args.cache_bench, args.cache_binary))
    finally:
        cache.terminate()
        cache.wait()

    print(f"4,096-token prefix, DeepSeek-V2-Lite int8: {BLOCKS} blocks, {total / 1e6:.1f} MB; loopback TCP, "
          f"one client; {args.rounds} rounds, interleaved; records checked with kvtier._native unless named\n")
    width = max(map(len, rates))
    print(f"{'path':{width}s} {'GB/s median':>11s}   per round")
    for name, values in rates.items():
        print(f"{name:{width}s} {statistics.median(values):11.2f}   {' '.join(f'{v:.2f}' for v in values)}")
    worker = rates["worker load, TCP"]
    for name in [*paths, *kept]:
        ratio = statistics.median(p / w for p, w in zip(rates[name], worker))
        print(f"{name} / worker load, TCP, median of per-round ratios: {ratio:.2f}x")


if __name__ == "__main__":
    main()
