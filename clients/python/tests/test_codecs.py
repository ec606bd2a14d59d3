"""The codecs on their own: every element within its codec's bound of the
input, on fresh random latents with outlier channels; bad input refused;
and kvtier._native's (the C++ codecs) against numpy's, byte for byte and
bit for bit, on fresh random latents of many shapes. (Records against the
C++ services': test_wire_contract.)"""
import numpy as np
import pytest

from kvtier import dequantize, encoded_bytes, quantize
from kvtier.codecs import FP8_TILE, NATIVE, bf16_to_float, numpy_dequantize, numpy_quantize


def latents(rng, tokens, dim):
    x = rng.standard_normal((tokens, dim)).astype(np.float32)
    x[:, rng.integers(0, dim, size=4)] *= 60
    return x


@pytest.fixture
def rng():
    return np.random.default_rng()


@pytest.mark.parametrize("tokens,latent,rope", [(64, 512, 64), (5, 129, 7), (1, 3, 0)])
def test_integer_codecs_stay_within_half_a_step(rng, tokens, latent, rope):
    x = latents(rng, tokens, latent + rope)
    dim = latent + rope
    for codec in ("int8", "int4"):
        payload = quantize(codec, x, latent, rope)
        assert len(payload) == encoded_bytes(codec, tokens, latent, rope)
        y = dequantize(codec, payload, tokens, latent, rope)
        step = bf16_to_float(np.frombuffer(payload[:2 * dim], dtype="<u2"))
        zero = bf16_to_float(np.frombuffer(payload[2 * dim:4 * dim], dtype="<u2")) if codec == "int4" else 0
        # Half the stored step, plus float32's rounding of the operands (a
        # few ulps of the values involved).
        bound = step * (0.5 + 2.0 ** -20) + (np.abs(x) + np.abs(y) + np.abs(zero)) * 2.0 ** -21
        error = np.abs(y.astype(np.float64) - x)
        assert (error <= bound).all(), (codec, np.max(error - step / 2))


def test_bf16_is_round_to_nearest_and_fp8_within_its_step(rng):
    tokens, latent, rope = 16, 300, 20
    x = latents(rng, tokens, latent + rope)
    y = dequantize("bf16", quantize("bf16", x, latent, rope), tokens, latent, rope)
    assert (np.abs(y - x) <= np.abs(x) * 2.0 ** -8).all()
    y = dequantize("fp8", quantize("fp8", x, latent, rope), tokens, latent, rope)
    assert (np.abs(y[:, latent:] - x[:, latent:]) <= np.abs(x[:, latent:]) * 2.0 ** -8).all()  # rope in bf16
    for tile in range(0, latent, FP8_TILE):
        part = slice(tile, min(tile + FP8_TILE, latent))
        amax = np.abs(x[:, part]).max(axis=1, keepdims=True)
        # e4m3: 3 mantissa bits (relative 2^-4), scale at most 2x the amax's.
        assert (np.abs(y[:, part] - x[:, part]) <= np.maximum(np.abs(x[:, part]) * 2.0 ** -3, amax * 2.0 ** -9)).all()


@pytest.mark.parametrize("quantize_with,dequantize_with", [(quantize, dequantize), (numpy_quantize, numpy_dequantize)])
def test_bad_input_is_refused(quantize_with, dequantize_with):
    x = np.ones((4, 10), dtype=np.float32)
    x[2, 3] = np.nan
    with pytest.raises(ValueError, match="non-finite input nan at token 2, channel 3"):
        quantize_with("int8", x, 8, 2)
    with pytest.raises(ValueError, match="overflows bf16"):
        quantize_with("bf16", np.full((1, 2), 3.4e38, dtype=np.float32), 2, 0)
    with pytest.raises(ValueError, match="too wide for the int4 codec"):
        quantize_with("int4", np.array([[-3e38, 0], [3e38, 0]], dtype=np.float32), 1, 1)
    with pytest.raises(ValueError, match="shape"):
        quantize_with("int4", np.ones((4, 9), dtype=np.float32), 8, 2)
    with pytest.raises(ValueError, match="unknown codec"):
        quantize_with("int3", np.ones((4, 10), dtype=np.float32), 8, 2)
    with pytest.raises(ValueError, match="bytes"):
        dequantize_with("int8", b"\0" * 7, 4, 8, 2)


def test_the_cpp_codecs_are_the_ones_used():
    assert NATIVE  # built by CMake into build/python, as by pip where g++ and python3-dev are


@pytest.mark.parametrize("codec", ["bf16", "fp8", "int8", "int4"])
def test_cpp_and_numpy_codecs_agree_bit_for_bit(rng, codec):
    shapes = [(64, 512, 64), (1, 1, 0), (3, 129, 7), (17, 257, 1), (128, 300, 20), (5, 6, 1)]
    shapes += [(int(rng.integers(1, 70)), int(rng.integers(1, 700)), int(rng.integers(0, 70))) for _ in range(6)]
    for tokens, latent, rope in shapes:
        x = latents(rng, tokens, latent + rope)
        if rng.random() < 0.5:
            x = np.asfortranarray(x)  # taken as any array numpy can make contiguous
        payload = quantize(codec, x, latent, rope)
        assert isinstance(payload, bytes) and payload == numpy_quantize(codec, x, latent, rope), (tokens, latent, rope)
        y, y_numpy = dequantize(codec, payload, tokens, latent, rope), numpy_dequantize(codec, payload, tokens, latent,
                                                                                      rope)
        assert y.shape == y_numpy.shape == (tokens, latent + rope) and y.dtype == np.float32
        assert np.array_equal(y.view(np.uint32), y_numpy.view(np.uint32)), (tokens, latent, rope)
        y[0, 0] = 1  # writable, as numpy's are


def test_a_missing_package_is_named_with_how_to_get_it():
    """A python3 that lacks numpy (a pyenv one first on PATH) is told which
    package and which interpreter, not a bare ModuleNotFoundError."""
    import subprocess
    import sys
    blocked = subprocess.run([sys.executable, "-c", "import sys; sys.modules['numpy'] = None; import kvtier"],
                             capture_output=True, text=True)
    assert blocked.returncode != 0
    assert "kvtier needs numpy" in blocked.stderr, blocked.stderr
    assert "apt-get install python3-numpy" in blocked.stderr, blocked.stderr
    assert "/usr/bin/python3" in blocked.stderr, blocked.stderr


def test_records_print_what_they_hold():
    from kvtier import LatentLayout, encode_record, parse_record
    layout = LatentLayout("repr", num_layers=3, kv_lora_rank=64, rope_dim=16, tokens_per_block=8, codec="int8")
    record = parse_record(encode_record(layout, first_layer=1, latents=np.zeros((2, 8, 80), np.float32)), layout)
    assert repr(record) == f"Record(int8, layout {layout.layout_id:016x}, 8 tokens x (64 + 16), layers [1, 3))"
