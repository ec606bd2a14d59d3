#!/usr/bin/env python3
"""The Python client's codecs: kvtier._native's (the C++ codecs) against
numpy's, which a package built without the module uses. One DeepSeek-V2-Lite
block (27 layers of 64 tokens x (512 + 64) float32, fresh random values
with outlier channels) quantized layer by layer as encode_record does, and
dequantized back as Record.latents() does; the median of --rounds rounds,
the two interleaved in each.

  PYTHONPATH=build/python /usr/bin/python3 load/python_codec_bench.py --rounds 9
"""
import argparse
import statistics
import time

import numpy as np

from kvtier import codecs

LAYERS, TOKENS, LATENT, ROPE = 27, 64, 512, 64
WAYS = {"kvtier._native": (codecs.quantize, codecs.dequantize),
        "numpy": (codecs.numpy_quantize, codecs.numpy_dequantize)}


def block():
    x = np.random.default_rng().standard_normal((LAYERS, TOKENS, LATENT + ROPE)).astype(np.float32)
    x[:, :, np.random.default_rng().integers(0, LATENT + ROPE, size=8)] *= 60
    return x


def timed(f):
    start = time.perf_counter()
    out = f()
    return out, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    assert codecs.NATIVE, "kvtier was built without kvtier._native"
    x = block()
    print(f"one DeepSeek-V2-Lite block: {LAYERS} layers x {TOKENS} tokens x ({LATENT} + {ROPE}) float32, "
          f"{x.nbytes / 1e6:.1f} MB; medians of {args.rounds} rounds, interleaved\n")
    print("codec   quantize ms, C++ / numpy   dequantize ms, C++ / numpy   numpy / C++ (median of per-round ratios)")
    for codec in ("bf16", "fp8", "int8", "int4"):
        times = {way: ([], []) for way in WAYS}
        for _ in range(args.rounds):
            for way, (quantize, dequantize) in WAYS.items():
                payloads, seconds = timed(lambda: [quantize(codec, layer, LATENT, ROPE) for layer in x])
                times[way][0].append(seconds)
                _, seconds = timed(lambda: [dequantize(codec, p, TOKENS, LATENT, ROPE) for p in payloads])
                times[way][1].append(seconds)
        native, numpy = times["kvtier._native"], times["numpy"]
        ms = [f"{statistics.median(native[k]) * 1e3:.2f} / {statistics.median(numpy[k]) * 1e3:.2f}" for k in (0, 1)]
        ratios = [statistics.median(n / c for n, c in zip(numpy[k], native[k])) for k in (0, 1)]
        print(f"{codec:6s}  {ms[0]:>25s}   {ms[1]:>27s}   quantize {ratios[0]:.1f}x, dequantize {ratios[1]:.1f}x")


if __name__ == "__main__":
    main()
