#!/usr/bin/env python3
"""What a kvtier-cache stop costs with --save-on-stop-ms: its memory tiers
(512 MiB each by default) filled with DeepSeek-V2-Lite int8 blocks
(1,026,468 B each, 27 layers of 64 tokens) through the Python client, the
file system synced, then SIGTERM; the cache logs how many bytes it moved to
its disk tier and in how long. Beside it in the same round, one stream's
limit: the same number of bytes written to one file in the same directory
1 MiB at a time (as `dd bs=1M` does), each MiB from memory of its own,
already touched, in 4 KiB pages as the cache's tiers are. Rounds
interleaved; the ratio is the save's rate over the plain write's (the
save writes four files at once, the plain write one stream: above 1 is
what the threads add).

Then the next start on that disk tier: seconds until it listens, with the
page cache dropped first (cold; as root) and again warm, against reading
every file of the tier whole with the page cache dropped (what a start
that checked each record's bytes would read).

  PYTHONPATH=build/python python3 load/save_on_stop_bench.py \\
      --cache-binary build/services/kvtier-cache --dir /var/tmp/kvtier-save --rounds 3
"""
import argparse
import mmap
import os
import re
import shutil
import subprocess
import time

import numpy as np

from kvtier import CacheClient, LatentLayout, block_hashes, encode_record

LAYOUT = LatentLayout("deepseek-v2-lite-bench", 27, 512, 64, 64, "int8")
BATCH = 64  # blocks a Put


def fill(target, memory_bytes):
    """Stores a batch of blocks more than `memory_bytes` hold."""
    rng = np.random.default_rng(1)
    latents = rng.standard_normal((LAYOUT.num_layers, 64, 576)).astype(np.float32)
    blocks = memory_bytes // len(encode_record(LAYOUT, first_layer=0, latents=latents)) + BATCH
    with CacheClient(target) as cache:
        for first in range(0, blocks, BATCH):
            tokens = list(range(first * 64, (first + BATCH) * 64))
            hashes = block_hashes("bench", LAYOUT, tokens)
            records = [encode_record(LAYOUT, first_layer=0, latents=latents + i) for i in range(len(hashes))]
            cache.put("bench", LAYOUT, zip(hashes, records))


def start_cache(args, disk, memory, save_on_stop_ms):
    """A kvtier-cache on the disk tier `disk`, with memory tiers of
    `memory` each, and its port once it listens."""
    cache = subprocess.Popen([args.cache_binary, "--listen", "127.0.0.1:0", "--metrics-listen", "",
                              "--device-capacity", memory, "--host-capacity", memory, "--disk-dir", disk,
                              "--disk-capacity", "64GiB", "--save-on-stop-ms", str(save_on_stop_ms)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in cache.stdout:
        if line.startswith("listening on "):
            return cache, line.rsplit(":", 1)[1].strip()
    raise SystemExit("kvtier-cache did not start: " + cache.stderr.read())


def save_round(args, disk):
    """(bytes saved, seconds) of one stop."""
    shutil.rmtree(disk, ignore_errors=True)
    cache, port = start_cache(args, disk, args.memory, 600000)
    fill("127.0.0.1:" + port, 2 * parse_size(args.memory))  # both memory tiers full
    os.sync()
    cache.terminate()
    _, log = cache.communicate(timeout=700)
    saved = re.search(r"saved \d+ blocks \((\d+) bytes\).* in (\d+) ms", log)
    if saved is None:
        raise SystemExit("no 'saved' line in the cache's log:\n" + log)
    return int(saved.group(1)), int(saved.group(2)) / 1000


def drop_page_cache():
    """Whether the page cache could be dropped (root only)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def start_seconds(args, disk):
    """Seconds from starting a cache on `disk` to its listening."""
    start = time.perf_counter()
    cache, _ = start_cache(args, disk, "64MiB", 0)
    elapsed = time.perf_counter() - start
    cache.terminate()
    cache.communicate(timeout=60)
    return elapsed


def read_seconds(disk):
    """Seconds to read every file under `disk` whole."""
    start = time.perf_counter()
    for root, _, files in os.walk(disk):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                while f.read(1 << 20):
                    pass
    return time.perf_counter() - start


def write_round(path, size):
    """Seconds to write `size` bytes of memory to a new file, 1 MiB at a
    time, from memory as the save reads it: every MiB its own (one buffer
    written again and again would come from the CPU's caches), touched
    beforehand, in 4 KiB pages as the cache's tiers are (an anonymous
    mmap, which the kernel backs with huge pages only when asked: numpy
    asks for large arrays, and the same copy from those ran twice as
    fast here)."""
    memory = mmap.mmap(-1, size)
    np.frombuffer(memory, dtype=np.uint8)[:] = 1
    source = memoryview(memory)
    chunk = 1 << 20
    os.sync()
    start = time.perf_counter()
    with open(path, "wb") as out:
        for at in range(0, size, chunk):
            out.write(source[at:at + chunk])
    elapsed = time.perf_counter() - start
    os.unlink(path)
    source.release()
    memory.close()
    return elapsed


def parse_size(text):
    units = {"MiB": 1 << 20, "GiB": 1 << 30}
    return int(text[:-3]) * units[text[-3:]]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-binary", default="build/services/kvtier-cache")
    parser.add_argument("--dir", default="/var/tmp/kvtier-save", help="where the disk tier and the plain file go")
    parser.add_argument("--memory", default="512MiB", help="each memory tier's capacity (MiB or GiB)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    disk = os.path.join(args.dir, "disk")
    print(f"{'round':>5} {'saved MB':>9} {'save MB/s':>10} {'write MB/s':>11} {'ratio':>6} "
          f"{'start cold s':>13} {'warm s':>7} {'read all cold s':>16}")
    for r in range(args.rounds):
        size, save_s = save_round(args, disk)
        write_s = write_round(os.path.join(args.dir, "plain.bin"), size)
        cold = drop_page_cache()
        start_cold = start_seconds(args, disk)
        start_warm = start_seconds(args, disk)
        read_all = read_seconds(disk) if drop_page_cache() and cold else float("nan")
        save_rate, write_rate = size / save_s / 1e6, size / write_s / 1e6
        print(f"{r + 1:>5} {size / 1e6:>9.0f} {save_rate:>10.0f} {write_rate:>11.0f} {save_rate / write_rate:>6.2f} "
              f"{start_cold if cold else float('nan'):>13.2f} {start_warm:>7.2f} {read_all:>16.2f}")
    shutil.rmtree(disk, ignore_errors=True)


if __name__ == "__main__":
    main()
