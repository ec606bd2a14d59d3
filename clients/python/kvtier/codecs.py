"""The latent codecs (kernels/include/kvtier/kernels/codec.h;
docs/protocol.md, "Codecs").

One layer of one block is `tokens` rows of `latent_dim + rope_dim` float32
values. quantize() gives the codec's payload bytes, dequantize() the float32
values back: the C++ codecs themselves (kvtier._native) where the package
was built with them, else numpy_quantize() and numpy_dequantize(). Those
are the codecs in numpy, byte for byte the C++ ones, for readers of the
contract as much as for use: every step is float32 arithmetic in the C++
order (the C++ codecs are built without FMA contraction), so the bytes are
equal.
"""
import numpy as np

from kvtier.layout import BF16, FP8, INT4, INT8, codec_number

try:
    from kvtier import _native
except ImportError:  # built without a C++ compiler or Python's headers
    _native = None
# Whether the package has kvtier._native: its codecs here, its CRC32C in
# kvtier.records.
NATIVE = _native is not None

FP8_TILE = 128
MIN_INT_SCALE = np.float32(2.0 ** -120)
_F32 = np.float32


def _bits(x):
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def _floats(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def bf16_to_float(h):
    return _floats(np.asarray(h, dtype=np.uint32) << 16)


def float_to_bf16(x):
    """Round to nearest, ties to even (finite input), as uint16 bits."""
    u = _bits(x)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _bf16_toward(x, up_when_negative):
    u = _bits(x)
    h = (u >> 16).astype(np.uint16)
    inexact = (u & 0xFFFF) != 0
    negative = (u >> 31) != 0
    bump = inexact & (negative if up_when_negative else ~negative)
    return h + bump.astype(np.uint16)


def bf16_toward_positive(x):
    return _bf16_toward(x, up_when_negative=False)


def bf16_toward_negative(x):
    return _bf16_toward(x, up_when_negative=True)


def fp8_e4m3_from_in_range(x):
    """float32 with |x| < 464 to E4M3FN codes, round to nearest even."""
    u = _bits(x)
    sign = (u >> 24) & 0x80
    a = u & 0x7FFFFFFF
    small = _floats(np.minimum(a, np.uint32(0x3C800000)))
    subnormal = (((small + _F32(16384)) - _F32(16384)) * _F32(512)).astype(np.int32).astype(np.uint32)
    with np.errstate(over="ignore"):
        normal = ((a + np.uint32(0x7FFFF) + ((a >> 20) & 1)) >> 20) - np.uint32(120 << 3)
    return (sign | np.where(a < 0x3C800000, subnormal, normal)).astype(np.uint8)


def fp8_e4m3_to_float(c):
    c = np.asarray(c, dtype=np.uint8).astype(np.uint32)
    magnitude = c & 0x7F
    normal = (magnitude << 20) + np.uint32(120 << 23)
    subnormal = _bits((c & 7).astype(np.float32) * _F32(1.0 / 512.0))
    bits = np.where(magnitude < 8, subnormal, normal)
    bits = np.where(magnitude == 0x7F, np.uint32(0x7FC00000), bits)
    return _floats(bits | ((c & 0x80) << 24))


def fp8_tile_scale(amax):
    """FlashMLA's tile scale 2^ceil(log2(max(amax / 448, 1e-4))), on the bits."""
    ratio = np.asarray(amax, dtype=np.float32) / _F32(448)
    v = np.where(ratio > _F32(1e-4), ratio, _F32(1e-4)).astype(np.float32)
    u = _bits(v)
    u = np.where((u & 0x7FFFFF) != 0, (u & 0x7F800000) + np.uint32(0x800000), u)
    return _floats(u)


def encoded_bytes(codec, tokens, latent_dim, rope_dim):
    """Bytes of one layer of one block in `codec`."""
    codec = codec_number(codec)
    dim = latent_dim + rope_dim
    if codec == BF16:
        return tokens * dim * 2
    if codec == FP8:
        return tokens * (latent_dim + 4 * -(-latent_dim // FP8_TILE) + 2 * rope_dim)
    if codec == INT8:
        return dim * 2 + tokens * dim
    return dim * 4 + tokens * ((dim + 1) // 2)


def _shaped(x, latent_dim, rope_dim):
    """x as contiguous, aligned float32 [tokens][latent_dim + rope_dim]."""
    x = np.require(x, dtype=np.float32, requirements=["C_CONTIGUOUS", "ALIGNED"])
    if x.ndim != 2 or x.shape[1] != latent_dim + rope_dim or x.shape[0] < 1:
        raise ValueError(f"latents must be [tokens][{latent_dim + rope_dim}] float32, got shape {x.shape}")
    return x


def _check(x, latent_dim, rope_dim):
    x = _shaped(x, latent_dim, rope_dim)
    if not np.isfinite(x).all():
        t, c = np.argwhere(~np.isfinite(x))[0]
        raise ValueError(f"non-finite input {x[t, c]} at token {t}, channel {c}")
    return x


def _overflow(bits16, x, what):
    bad = (bits16 & 0x7F80) == 0x7F80
    if bad.any():
        idx = np.argwhere(bad)[0]
        raise ValueError(f"value {x[tuple(idx)]} at {tuple(int(i) for i in idx)} overflows {what}")


def quantize(codec, latents, latent_dim, rope_dim):
    """One layer of one block, [tokens][latent_dim + rope_dim], as payload bytes."""
    if _native is None:
        return numpy_quantize(codec, latents, latent_dim, rope_dim)
    x = _shaped(latents, latent_dim, rope_dim)
    return _native.quantize(codec_number(codec), x, x.shape[0], latent_dim, rope_dim)


def numpy_quantize(codec, latents, latent_dim, rope_dim):
    """quantize() in numpy."""
    codec = codec_number(codec)
    x = _check(latents, latent_dim, rope_dim)
    if codec == BF16:
        h = float_to_bf16(x)
        _overflow(h, x, "bf16")
        return h.astype("<u2").tobytes()
    if codec == INT8:
        return _quantize_int8(x)
    if codec == INT4:
        return _quantize_int4(x)
    return _quantize_fp8(x, latent_dim, rope_dim)


def _quantize_int8(x):
    amax = np.abs(x).max(axis=0)
    scale_bits = bf16_toward_positive(np.maximum(amax / _F32(127), MIN_INT_SCALE))
    inv = _F32(1) / bf16_to_float(scale_bits)
    codes = np.clip(np.rint(x * inv), -127, 127).astype(np.int8)
    return scale_bits.astype("<u2").tobytes() + codes.tobytes()


def _quantize_int4(x):
    tokens, dim = x.shape
    half = (dim + 1) // 2
    lo, hi = x.min(axis=0), x.max(axis=0)
    zero_bits = bf16_toward_negative(lo)
    zero = bf16_to_float(zero_bits)
    with np.errstate(over="ignore", invalid="ignore"):
        span = hi - zero
        scale_bits = bf16_toward_positive(np.maximum(span / _F32(15), MIN_INT_SCALE))
        scale = bf16_to_float(scale_bits)
    bad = ~(np.isfinite(zero) & np.isfinite(span) & np.isfinite(scale))
    if bad.any():
        c = int(np.argwhere(bad)[0][0])
        raise ValueError(f"channel {c} spans [{lo[c]}, {hi[c]}], too wide for the int4 codec's bf16 scale")
    inv = _F32(1) / scale
    codes = np.zeros((tokens, 2 * half), dtype=np.uint8)
    codes[:, :dim] = np.clip(np.rint((x - zero) * inv), 0, 15).astype(np.uint8)
    packed = codes[:, :half] | (codes[:, half:] << 4)
    return scale_bits.astype("<u2").tobytes() + zero_bits.astype("<u2").tobytes() + packed.tobytes()


def _quantize_fp8(x, latent_dim, rope_dim):
    tokens = x.shape[0]
    tiles = -(-latent_dim // FP8_TILE)
    latent = x[:, :latent_dim]
    rounded = bf16_to_float(float_to_bf16(latent))
    _overflow(float_to_bf16(latent), latent, "bf16")
    padded = np.zeros((tokens, tiles * FP8_TILE), dtype=np.float32)
    padded[:, :latent_dim] = np.abs(rounded)
    amax = padded.reshape(tokens, tiles, FP8_TILE).max(axis=2)  # rounding is monotonic
    scale = fp8_tile_scale(amax)
    inv = np.repeat(_F32(1) / scale, FP8_TILE, axis=1)[:, :latent_dim]
    codes = fp8_e4m3_from_in_range(rounded * inv)
    rope = float_to_bf16(x[:, latent_dim:])
    _overflow(rope, x[:, latent_dim:], "bf16")
    row = np.concatenate([codes, scale.astype("<f4").view(np.uint8).reshape(tokens, 4 * tiles),
                          rope.astype("<u2").view(np.uint8).reshape(tokens, 2 * rope_dim)], axis=1)
    return row.tobytes()


def dequantize(codec, payload, tokens, latent_dim, rope_dim):
    """Payload bytes of one layer of one block back to [tokens][dim] float32."""
    if _native is None:
        return numpy_dequantize(codec, payload, tokens, latent_dim, rope_dim)
    values = _native.dequantize(codec_number(codec), payload, tokens, latent_dim, rope_dim)
    return np.frombuffer(values, dtype=np.float32).reshape(tokens, latent_dim + rope_dim)


def numpy_dequantize(codec, payload, tokens, latent_dim, rope_dim):
    """dequantize() in numpy."""
    codec = codec_number(codec)
    dim = latent_dim + rope_dim
    need = encoded_bytes(codec, tokens, latent_dim, rope_dim)
    if len(payload) != need:
        raise ValueError(f"a {tokens}-token layer in this codec is {need} bytes, got {len(payload)}")
    b = np.frombuffer(payload, dtype=np.uint8)
    if codec == BF16:
        return bf16_to_float(b.view("<u2")).reshape(tokens, dim)
    if codec == INT8:
        scale = bf16_to_float(b[:2 * dim].view("<u2"))
        return b[2 * dim:].view(np.int8).reshape(tokens, dim).astype(np.float32) * scale
    if codec == INT4:
        half = (dim + 1) // 2
        scale = bf16_to_float(b[:2 * dim].view("<u2"))
        zero = bf16_to_float(b[2 * dim:4 * dim].view("<u2"))
        packed = b[4 * dim:].reshape(tokens, half)
        codes = np.concatenate([packed & 0xF, packed >> 4], axis=1)[:, :dim].astype(np.float32)
        return zero + codes * scale
    tiles = -(-latent_dim // FP8_TILE)
    rows = b.reshape(tokens, -1)
    scale = rows[:, latent_dim:latent_dim + 4 * tiles].copy().view("<f4")
    out = np.empty((tokens, dim), dtype=np.float32)
    out[:, :latent_dim] = fp8_e4m3_to_float(rows[:, :latent_dim]) * np.repeat(scale, FP8_TILE, axis=1)[:, :latent_dim]
    out[:, latent_dim:] = bf16_to_float(rows[:, latent_dim + 4 * tiles:].copy().view("<u2"))
    return out
