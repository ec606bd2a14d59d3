"""kvtier._crc32c, the CRC32C the records are checked with, against Debian's
python3-crc32c (an independent implementation) on fresh random bytes: every
length to 600 (the crc32 instruction's tail and the carry-less path from
256), megabytes (checked with the GIL released), unaligned views and
continued values; bad arguments refused. And the package without the
module: the same records, checked with python3-crc32c."""
import os
import subprocess
import sys

import crc32c as reference
import numpy as np
import pytest

from kvtier import LatentLayout, encode_record, parse_record
from kvtier._crc32c import crc32c
from kvtier.records import NATIVE_CRC32C


@pytest.fixture
def rng():
    return np.random.default_rng()


def test_the_build_uses_the_module():
    assert NATIVE_CRC32C


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


def test_the_package_without_the_module(rng, tmp_path):
    """With kvtier._crc32c missing (a build without a compiler) records are
    made and checked with python3-crc32c: the same bytes, the same errors."""
    layout = LatentLayout("m", num_layers=2, kv_lora_rank=32, rope_dim=8, tokens_per_block=4, codec="int8")
    record = encode_record(layout, 0, rng.standard_normal((2, 4, 40)).astype(np.float32))
    (tmp_path / "record").write_bytes(record)
    script = f"""
import sys
sys.modules["kvtier._crc32c"] = None  # import fails, as in a build without it
import grpc, kvtier, kvtier.records
assert not kvtier.records.NATIVE_CRC32C
record = open({str(tmp_path / "record")!r}, "rb").read()
layout = kvtier.LatentLayout("m", num_layers=2, kv_lora_rank=32, rope_dim=8, tokens_per_block=4, codec="int8")
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
