"""kvtier._native's CRC32C, which records are checked with, against
Debian's python3-crc32c (an independent implementation) on fresh random
bytes: every length to 600 (the crc32 instruction's tail and the
carry-less path from 256), megabytes (checked with the GIL released),
unaligned views and continued values; bad arguments refused, to it and to
its codecs (which test_codecs holds to numpy's). And the package without
the module (hidden, or pip's build of it failing): the same records,
checked with python3-crc32c and made by numpy's codecs."""
import os
import subprocess
import sys

import crc32c as reference
import numpy as np
import pytest

from conftest import pip_install_copy
from kvtier import LatentLayout, encode_record, parse_record
from kvtier import _native
from kvtier._native import crc32c
from kvtier.codecs import NATIVE


@pytest.fixture
def rng():
    return np.random.default_rng()


def test_the_build_uses_the_module():
    assert NATIVE


def test_the_standard_check_value():
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0 and crc32c(b"", 0x1234) == 0x1234


def test_every_short_length_and_alignment(rng):
    data = rng.integers(0, 256, size=1024, dtype=np.uint8).tobytes()
    view = memoryview(data)
    for length in range(601):
        offset = int(rng.integers(0, 64))
        piece = view[offset:offset + length]
        assert crc32c(piece) == reference.crc32c(bytes(piece)), (offset, length)


@pytest.mark.parametrize("size", [64 * 1024 - 1, 64 * 1024, 1026468, 3 << 20])
def test_large_buffers(rng, size):
    data = rng.integers(0, 256, size=size + 7, dtype=np.uint8)
    piece = data[7:]  # an unaligned start
    assert crc32c(piece) == reference.crc32c(piece.tobytes())
    assert crc32c(bytearray(piece.tobytes())) == crc32c(memoryview(piece.tobytes()))


def test_a_value_continues_over_pieces(rng):
    data = rng.integers(0, 256, size=200000, dtype=np.uint8).tobytes()
    for cut in (0, 1, 255, 256, 4097, 65536, 199999):
        assert crc32c(data[cut:], crc32c(data[:cut])) == reference.crc32c(data)
    start = int(rng.integers(0, 2**32))
    assert crc32c(data, start) == reference.crc32c(data, start)


def test_bad_arguments():
    with pytest.raises(TypeError):
        crc32c("text")
    with pytest.raises(TypeError):
        crc32c()
    with pytest.raises(TypeError):
        crc32c(b"a", 0, 0)
    with pytest.raises(OverflowError):
        crc32c(b"a", 2**32)
    with pytest.raises(OverflowError):
        crc32c(b"a", -1)
    with pytest.raises(BufferError):
        crc32c(memoryview(bytes(8))[::2])  # not contiguous


def test_the_codecs_refuse_bad_arguments():
    x = np.ones((4, 10), dtype=np.float32)
    assert len(_native.quantize(3, x, 4, 8, 2)) == 10 * 2 + 4 * 10
    with pytest.raises(TypeError):
        _native.quantize(3, x, 4, 8)
    with pytest.raises(TypeError):
        _native.quantize("int8", x, 4, 8, 2)
    with pytest.raises(ValueError, match="unknown codec 9"):
        _native.quantize(9, x, 4, 8, 2)
    with pytest.raises(OverflowError, match="tokens"):
        _native.quantize(3, x, 2**40, 8, 2)
    with pytest.raises(ValueError, match="token count 0"):
        _native.quantize(3, x, 0, 8, 2)
    with pytest.raises(ValueError, match="latents of 160 bytes"):
        _native.quantize(3, x, 5, 8, 2)
    with pytest.raises(ValueError, match="not aligned"):
        _native.quantize(3, memoryview(bytearray(161))[1:], 4, 8, 2)
    with pytest.raises(ValueError, match="non-finite input"):
        _native.quantize(3, np.full((4, 10), np.inf, dtype=np.float32), 4, 8, 2)
    with pytest.raises(ValueError, match="is 60 bytes, got 59"):
        _native.dequantize(3, bytes(59), 4, 8, 2)


@pytest.mark.parametrize("codec", ["bf16", "fp8", "int8", "int4"])
def test_the_package_without_the_module(rng, tmp_path, codec):
    """With kvtier._native missing (a build without a compiler) records are
    made with numpy's codecs and checked with python3-crc32c: the same
    bytes, the same errors."""
    layout = LatentLayout("m", num_layers=2, kv_lora_rank=160, rope_dim=8, tokens_per_block=5, codec=codec)
    latents = rng.standard_normal((2, 5, 168)).astype(np.float32)
    np.save(tmp_path / "latents.npy", latents)
    record = encode_record(layout, 0, latents)
    (tmp_path / "record").write_bytes(record)
    script = f"""
import sys
sys.modules["kvtier._native"] = None  # import fails, as in a build without it
import grpc, numpy as np, kvtier, kvtier.codecs, kvtier.records
assert not kvtier.codecs.NATIVE
record = open({str(tmp_path / "record")!r}, "rb").read()
layout = kvtier.LatentLayout("m", num_layers=2, kv_lora_rank=160, rope_dim=8, tokens_per_block=5, codec={codec!r})
latents = np.load({str(tmp_path / "latents.npy")!r})
assert kvtier.encode_record(layout, 0, latents) == record, "numpy's bytes differ from the C++ codecs'"
parsed = kvtier.parse_record(record, layout)
assert kvtier.encode_payloads(layout, 0, parsed.payloads) == record
broken = bytearray(record)
broken[40] ^= 1
try:
    kvtier.parse_record(bytes(broken), layout)
    sys.exit("a flipped bit was not found")
except kvtier.KvtierError as e:
    assert e.code == grpc.StatusCode.DATA_LOSS, e
"""
    subprocess.run([sys.executable, "-c", script], check=True, env=dict(os.environ))
    assert parse_record(record, layout).layer_count == 2


def test_pip_installs_the_package_without_a_compiler(tmp_path):
    """Where kvtier._native cannot be compiled (no g++ or python3-dev: here
    a compiler that always fails) pip still installs the package, which
    then says it has no module and makes the same records without it."""
    target, run = pip_install_copy(tmp_path, CC="/bin/false", CXX="/bin/false")
    assert not list((target / "kvtier").glob("_native*"))
    made = run("import kvtier, kvtier.codecs, numpy as np; print(kvtier.codecs.NATIVE, "
               "kvtier.encode_record(kvtier.LatentLayout('m', 1, 8, 2, 2, 'int4'), 0, "
               "np.arange(20, dtype=np.float32).reshape(1, 2, 10)).hex())")
    layout = LatentLayout("m", 1, 8, 2, 2, "int4")
    expected = encode_record(layout, 0, np.arange(20, dtype=np.float32).reshape(1, 2, 10)).hex()
    assert made.split() == ["False", expected]
