"""Block records (docs/protocol.md, "Records"; services/kvblock/block_format.md).

A record holds consecutive layers of one block: a header (32 bytes in
format 1; 40 in format 2, whose layers carry DeepSeek-V3.2's indexer keys
after their latents), the layers' payloads, and the CRC32C (Castagnoli) of
everything before it. Format 3 holds a DeepSeek-V4 block or restore point,
every layer, behind format 1's 32 bytes (byte 7 its kind, bytes 28-31 the
whole payload's size). parse_record checks what the C++ ParseBlock checks,
in the same order, and raises KvtierError with the status code the server
would answer.
"""
import dataclasses
import struct

import grpc
import numpy as np

from kvtier.codecs import NATIVE, dequantize, encoded_bytes, quantize

if NATIVE:  # the services' CRC32C, in hardware where the CPU has it (native/crc32c.cc)
    from kvtier._native import crc32c
else:
    from crc32c import crc32c
from kvtier.errors import KvtierError, invalid
from kvtier.layout import (BLOCK_FORMAT_VERSION, CODEC_NAMES, FP8, INDEXED_BLOCK_FORMAT_VERSION, INDEXER_FP8,
                           INDEXER_NONE, MAX_INDEXER_DIM, V4_BLOCK_FORMAT_VERSION, indexer_part_bytes)

MAGIC = b"KVTB"
HEADER = struct.Struct("<4sHBBQIHHHHI")
INDEXER_HEADER = struct.Struct("<HBBI")  # format 2: dim, encoding, reserved, bytes per layer
HEADER_BYTES, INDEXED_HEADER_BYTES, TRAILER_BYTES = 32, 40, 4
MAX_LAYERS = 1024
MAX_TOKENS, MAX_LATENT_DIM = 4096, 16384
# A format 3 record's kind (its byte 7).
V4_BLOCK, V4_RESTORE_POINT = 0, 1


@dataclasses.dataclass(frozen=True)
class Record:
    """A parsed record: its header fields and its layers' parts."""
    codec: int
    layout_id: int
    tokens: int
    first_layer: int
    layer_count: int
    latent_dim: int
    rope_dim: int
    payloads: tuple  # each layer's latents in the codec: one memoryview (or bytes) a layer
    indexer_dim: int = 0
    indexer_parts: tuple = ()  # format 2: each layer's indexer keys, codes then f32 scales

    def __repr__(self):
        indexer = f", indexer keys of dim {self.indexer_dim}" if self.indexer_dim else ""
        return (f"Record({CODEC_NAMES[self.codec]}, layout {self.layout_id:016x}, {self.tokens} tokens x "
                f"({self.latent_dim} + {self.rope_dim}), layers [{self.first_layer}, "
                f"{self.first_layer + self.layer_count}){indexer})")

    def latents(self):
        """The float32 latents, [layer_count][tokens][latent_dim + rope_dim]."""
        return np.stack([dequantize(self.codec, p, self.tokens, self.latent_dim, self.rope_dim)
                         for p in self.payloads])

    def indexer_keys(self):
        """Format 2: the indexer keys' e4m3fn codes, uint8 [layer_count][tokens][indexer_dim], and their
        scales, float32 [layer_count][tokens]."""
        codes = self.tokens * self.indexer_dim
        return (np.stack([np.frombuffer(p, np.uint8, codes).reshape(self.tokens, self.indexer_dim)
                          for p in self.indexer_parts]),
                np.stack([np.frombuffer(p, "<f4", self.tokens, codes) for p in self.indexer_parts]))


@dataclasses.dataclass(frozen=True)
class V4Part:
    """A parsed format 3 record: a DeepSeek-V4 block or restore point
    (services/runtime/v4_cache_parts.h's bytes, every layer)."""
    kind: int  # V4_BLOCK or V4_RESTORE_POINT
    layout_id: int
    tokens: int
    layer_count: int
    head_dim: int
    rope_dim: int
    payload: memoryview

    @property
    def first_layer(self):
        return 0  # a V4 record holds every layer

    @property
    def boundary(self):
        """A restore point's boundary: the tokens before it."""
        return struct.unpack_from("<Q", self.payload)[0] if self.kind == V4_RESTORE_POINT else None


def _v4_size_problem(kind, layout, payload):
    """Why `payload` is not a `kind` of `layout` (None when it is)."""
    if kind == V4_BLOCK:
        want = layout.v4_block_bytes()
        return None if len(payload) == want else (f"block payload of {len(payload)} bytes, the layout's blocks take "
                                                  f"{want}")
    boundary, = struct.unpack_from("<Q", payload)
    if boundary == 0 or boundary % layout.tokens_per_block or boundary > 1 << 40:
        return f"restore point at token {boundary}, not a block boundary of {layout.tokens_per_block} tokens"
    want = layout.v4_restore_point_bytes(boundary)
    return None if len(payload) == want else (f"restore point payload of {len(payload)} bytes, the layout's points "
                                              f"there take {want}")


def encode_v4_record(layout, kind, payload):
    """A format 3 record of a DeepSeek-V4 `layout` holding `payload`, a block
    or a restore point, checked for its size as parse_record checks it."""
    payload = bytes(payload)
    if not layout.is_v4:
        raise invalid("a DeepSeek-V4 record needs a V4 layout")
    if kind not in (V4_BLOCK, V4_RESTORE_POINT):
        raise invalid(f"block header: record kind {kind} (format 3 takes 0, a block, or 1, a restore point)")
    if kind == V4_RESTORE_POINT and len(payload) < 8:
        raise invalid(f"block header: a restore point of {len(payload)} bytes has no boundary")
    if problem := _v4_size_problem(kind, layout, payload):
        raise invalid(problem)
    body = HEADER.pack(MAGIC, V4_BLOCK_FORMAT_VERSION, layout.codec, kind, layout.layout_id, layout.tokens_per_block,
                       0, layout.num_layers, layout.kv_lora_rank, layout.rope_dim, len(payload)) + payload
    return body + struct.pack("<I", crc32c(body))


def _check_shape(tokens, latent, rope, first, count):
    """A header's shape and layer range within what any reader takes."""
    if not (1 <= tokens <= MAX_TOKENS and 1 <= latent <= MAX_LATENT_DIM and rope <= MAX_LATENT_DIM):
        raise invalid(f"block header: shape {tokens} tokens x ({latent} + {rope}) out of range")
    if count < 1 or first + count > MAX_LAYERS:
        raise invalid(f"block header: layers [{first}, {first + count}) empty or beyond {MAX_LAYERS}")


def _check_length_and_crc(record, want):
    """The record is `want` bytes and its CRC32C holds."""
    if len(record) != want:
        raise invalid(f"block record {'truncated' if len(record) < want else 'oversized'}: {len(record)} bytes, "
                      f"header says {want}")
    stored, = struct.unpack_from("<I", record, want - TRAILER_BYTES)
    computed = crc32c(record[:want - TRAILER_BYTES])  # a view: no copy
    if stored != computed:
        raise KvtierError(grpc.StatusCode.DATA_LOSS,
                          f"block checksum mismatch: stored {stored:08x}, computed {computed:08x}")


def _layout_mismatch(layout, layout_id, shape, layouts_shape):
    """Why a record of `layout_id` and `shape` is not `layout`'s (None when it is)."""
    if layout_id != layout.layout_id:
        return f"block has layout id {layout_id:016x}, expected {layout.layout_id:016x}"
    return None if shape == layouts_shape else "block's codec or shape differs from the layout's"


def _parse_v4(record, layout, fields):
    """parse_record's format 3: the checks of the C++ ParseBlock, in order."""
    _, _, codec, kind, layout_id, tokens, first, count, head, rope, size = fields
    if codec not in CODEC_NAMES:
        raise invalid(f"block header: unknown codec {codec}")
    _check_shape(tokens, head, rope, first, count)
    if kind not in (V4_BLOCK, V4_RESTORE_POINT):
        raise invalid(f"block header: record kind {kind} (format 3 takes 0, a block, or 1, a restore point)")
    if codec != FP8 or first != 0:
        raise invalid("block header: a format 3 record is FP8 entries of every layer from layer 0")
    if kind == V4_RESTORE_POINT and size < 8:
        raise invalid(f"block header: a restore point of {size} bytes has no boundary")
    _check_length_and_crc(record, HEADER_BYTES + size + TRAILER_BYTES)
    payload = record[HEADER_BYTES:HEADER_BYTES + size]
    if layout is not None:
        mismatch = _layout_mismatch(layout, layout_id, (codec, tokens, head, rope),
                                    (layout.codec, layout.tokens_per_block, layout.kv_lora_rank, layout.rope_dim))
        if mismatch is None and count != layout.num_layers:
            mismatch = f"a DeepSeek-V4 record holds {count} layers, layout has {layout.num_layers}"
        if mismatch:
            raise KvtierError(grpc.StatusCode.FAILED_PRECONDITION, mismatch)
        if problem := _v4_size_problem(kind, layout, payload):
            raise invalid(problem)
    return V4Part(kind, layout_id, tokens, count, head, rope, payload)


def encode_payloads(layout, first_layer, payloads, indexer_parts=None):
    """A record of already-encoded layer payloads, from `first_layer` on; for
    a layout with indexer keys, each layer's keys from `indexer_parts`
    (layout.indexer_part_bytes each: codes, then scales, as the model rounds
    them)."""
    payloads = [bytes(p) for p in payloads]
    per = encoded_bytes(layout.codec, layout.tokens_per_block, layout.kv_lora_rank, layout.rope_dim)
    if not payloads or first_layer < 0 or first_layer + len(payloads) > layout.num_layers:
        raise invalid(f"layers [{first_layer}, {first_layer + len(payloads)}) not within the "
                      f"{layout.num_layers} of the layout")
    for i, p in enumerate(payloads):
        if len(p) != per:
            raise invalid(f"layer {first_layer + i}: payload is {len(p)} bytes, the layout's is {per}")
    keys = layout.indexer_part_bytes
    indexer_parts = [bytes(p) for p in indexer_parts or []]
    if len(indexer_parts) != (len(payloads) if keys else 0) or any(len(p) != keys for p in indexer_parts):
        raise invalid(f"a layout {'with' if keys else 'without'} indexer keys takes "
                      f"{len(payloads) if keys else 0} indexer parts of {keys} bytes")
    header = HEADER.pack(MAGIC, layout.block_format_version, layout.codec, 0, layout.layout_id,
                         layout.tokens_per_block, first_layer, len(payloads), layout.kv_lora_rank, layout.rope_dim,
                         per + keys)
    if keys:
        header += INDEXER_HEADER.pack(layout.indexer_dim, layout.indexer_encoding, 0, keys)
        payloads = [p + k for p, k in zip(payloads, indexer_parts)]
    body = header + b"".join(payloads)
    return body + struct.pack("<I", crc32c(body))


def encode_record(layout, first_layer, latents, indexer_parts=None):
    """A record of float32 latents, [layers][tokens][dim], quantized with the
    layout's codec (and, for a layout with indexer keys, `indexer_parts` as
    encode_payloads takes them)."""
    latents = np.asarray(latents, dtype=np.float32)
    if latents.ndim == 2:
        latents = latents[None]
    if latents.ndim != 3 or latents.shape[1] != layout.tokens_per_block:
        raise invalid(f"latents must be [layers][{layout.tokens_per_block} tokens][dim], got shape {latents.shape}")
    try:
        payloads = [quantize(layout.codec, layer, layout.kv_lora_rank, layout.rope_dim) for layer in latents]
    except ValueError as e:
        raise invalid(str(e)) from None
    return encode_payloads(layout, first_layer, payloads, indexer_parts)


def parse_record(record, layout=None):
    """Checks and splits a record; with `layout`, also that it belongs to it.
    The parts are memoryviews into `record` (no copy). A format 1 or 2
    record gives a Record; format 3 (DeepSeek-V4) a V4Part."""
    record = memoryview(record).cast("B")
    if len(record) < HEADER_BYTES + TRAILER_BYTES:
        raise invalid(f"block record truncated: {len(record)} bytes, smaller than header and checksum")
    fields = HEADER.unpack_from(record)
    magic, version, codec, flags, layout_id, tokens, first, count, latent, rope, per = fields
    if bytes(magic) != MAGIC:
        raise invalid("block record has bad magic (not a KVTB record)")
    if version not in (BLOCK_FORMAT_VERSION, INDEXED_BLOCK_FORMAT_VERSION, V4_BLOCK_FORMAT_VERSION):
        raise KvtierError(grpc.StatusCode.FAILED_PRECONDITION, f"block format version {version} is not supported")
    if version == V4_BLOCK_FORMAT_VERSION:
        return _parse_v4(record, layout, fields)
    header_bytes = INDEXED_HEADER_BYTES if version == INDEXED_BLOCK_FORMAT_VERSION else HEADER_BYTES
    if len(record) < header_bytes + TRAILER_BYTES:
        raise invalid(f"block record truncated: {len(record)} bytes, smaller than a format {version} header and "
                      "checksum")
    indexer_dim, encoding, reserved, keys = (INDEXER_HEADER.unpack_from(record, HEADER_BYTES)
                                             if version == INDEXED_BLOCK_FORMAT_VERSION else (0, INDEXER_NONE, 0, 0))
    if codec not in CODEC_NAMES:
        raise invalid(f"block header: unknown codec {codec}")
    if flags != 0:
        raise invalid(f"block header: unknown flags {flags}")
    if reserved != 0:
        raise invalid(f"block header: reserved byte 35 is {reserved}, not 0")
    _check_shape(tokens, latent, rope, first, count)
    if version == INDEXED_BLOCK_FORMAT_VERSION and (encoding != INDEXER_FP8 or not 1 <= indexer_dim <= MAX_INDEXER_DIM):
        raise invalid(f"block header: indexer encoding {encoding} of dim {indexer_dim}")
    if keys != indexer_part_bytes(encoding, tokens, indexer_dim):
        raise invalid(f"block header: {keys} indexer bytes per layer, but {tokens} keys of dim {indexer_dim} take "
                      f"{indexer_part_bytes(encoding, tokens, indexer_dim)}")
    latent_bytes = encoded_bytes(codec, tokens, latent, rope)
    if per != latent_bytes + keys:
        raise invalid(f"block header: {per} bytes per layer, but {CODEC_NAMES[codec]} takes {latent_bytes}"
                      + (f" + {keys} of indexer keys" if keys else ""))
    _check_length_and_crc(record, header_bytes + count * per + TRAILER_BYTES)
    if layout is not None:
        mismatch = _layout_mismatch(layout, layout_id, (codec, tokens, latent, rope, indexer_dim),
                                    (layout.codec, layout.tokens_per_block, layout.kv_lora_rank, layout.rope_dim,
                                     layout.indexer_dim))
        if mismatch is None and first + count > layout.num_layers:
            mismatch = f"block holds layers [{first}, {first + count}), layout has {layout.num_layers}"
        if mismatch:
            raise KvtierError(grpc.StatusCode.FAILED_PRECONDITION, mismatch)
    layers = [record[header_bytes + i * per:header_bytes + (i + 1) * per] for i in range(count)]
    return Record(codec, layout_id, tokens, first, count, latent, rope, tuple(p[:latent_bytes] for p in layers),
                  indexer_dim, tuple(p[latent_bytes:] for p in layers) if keys else ())
