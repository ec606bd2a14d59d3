"""Block records (docs/protocol.md, "Records"; services/kvblock/block_format.md).

A record holds consecutive layers of one block: a 32-byte header, the
layers' codec payloads, and the CRC32C (Castagnoli) of everything before it.
parse_record checks what the C++ ParseBlock checks, in the same order, and
raises KvtierError with the status code the server would answer.
"""
import dataclasses
import struct

import crc32c
import grpc
import numpy as np

from kvtier.codecs import dequantize, encoded_bytes, quantize
from kvtier.errors import KvtierError, invalid
from kvtier.layout import BLOCK_FORMAT_VERSION, CODEC_NAMES

MAGIC = b"KVTB"
HEADER = struct.Struct("<4sHBBQIHHHHI")
HEADER_BYTES, TRAILER_BYTES = 32, 4
MAX_LAYERS = 1024
MAX_TOKENS, MAX_LATENT_DIM = 4096, 16384


@dataclasses.dataclass(frozen=True)
class Record:
    """A parsed record: its header fields and its layers' payloads."""
    codec: int
    layout_id: int
    tokens: int
    first_layer: int
    layer_count: int
    latent_dim: int
    rope_dim: int
    payloads: tuple  # one memoryview (or bytes) a layer

    def latents(self):
        """The float32 latents, [layer_count][tokens][latent_dim + rope_dim]."""
        return np.stack([dequantize(self.codec, p, self.tokens, self.latent_dim, self.rope_dim)
                         for p in self.payloads])


def encode_payloads(layout, first_layer, payloads):
    """A record of already-encoded layer payloads, from `first_layer` on."""
    payloads = [bytes(p) for p in payloads]
    per = encoded_bytes(layout.codec, layout.tokens_per_block, layout.kv_lora_rank, layout.rope_dim)
    if not payloads or first_layer < 0 or first_layer + len(payloads) > layout.num_layers:
        raise invalid(f"layers [{first_layer}, {first_layer + len(payloads)}) not within the "
                      f"{layout.num_layers} of the layout")
    for i, p in enumerate(payloads):
        if len(p) != per:
            raise invalid(f"layer {first_layer + i}: payload is {len(p)} bytes, the layout's is {per}")
    body = HEADER.pack(MAGIC, layout.block_format_version, layout.codec, 0, layout.layout_id, layout.tokens_per_block,
                       first_layer, len(payloads), layout.kv_lora_rank, layout.rope_dim, per) + b"".join(payloads)
    return body + struct.pack("<I", crc32c.crc32c(body))


def encode_record(layout, first_layer, latents):
    """A record of float32 latents, [layers][tokens][dim], quantized with the layout's codec."""
    latents = np.asarray(latents, dtype=np.float32)
    if latents.ndim == 2:
        latents = latents[None]
    if latents.ndim != 3 or latents.shape[1] != layout.tokens_per_block:
        raise invalid(f"latents must be [layers][{layout.tokens_per_block} tokens][dim], got shape {latents.shape}")
    try:
        payloads = [quantize(layout.codec, layer, layout.kv_lora_rank, layout.rope_dim) for layer in latents]
    except ValueError as e:
        raise invalid(str(e)) from None
    return encode_payloads(layout, first_layer, payloads)


def parse_record(record, layout=None):
    """Checks and splits a record; with `layout`, also that it belongs to it.
    The payloads are memoryviews into `record` (no copy)."""
    record = memoryview(record).cast("B")
    if len(record) < HEADER_BYTES + TRAILER_BYTES:
        raise invalid(f"block record truncated: {len(record)} bytes, smaller than header and checksum")
    magic, version, codec, flags, layout_id, tokens, first, count, latent, rope, per = HEADER.unpack_from(record)
    if bytes(magic) != MAGIC:
        raise invalid("block record has bad magic (not a KVTB record)")
    if version != BLOCK_FORMAT_VERSION:
        raise KvtierError(grpc.StatusCode.FAILED_PRECONDITION, f"block format version {version} is not supported")
    if codec not in CODEC_NAMES:
        raise invalid(f"block header: unknown codec {codec}")
    if flags != 0:
        raise invalid(f"block header: unknown flags {flags}")
    if not (1 <= tokens <= MAX_TOKENS and 1 <= latent <= MAX_LATENT_DIM and rope <= MAX_LATENT_DIM):
        raise invalid(f"block header: shape {tokens} tokens x ({latent} + {rope}) out of range")
    if count < 1 or first + count > MAX_LAYERS:
        raise invalid(f"block header: layers [{first}, {first + count}) empty or beyond {MAX_LAYERS}")
    if per != encoded_bytes(codec, tokens, latent, rope):
        raise invalid(f"block header: {per} bytes per layer, but {CODEC_NAMES[codec]} takes "
                      f"{encoded_bytes(codec, tokens, latent, rope)}")
    want = HEADER_BYTES + count * per + TRAILER_BYTES
    if len(record) != want:
        raise invalid(f"block record {'truncated' if len(record) < want else 'oversized'}: {len(record)} bytes, "
                      f"header says {want}")
    stored, = struct.unpack_from("<I", record, want - TRAILER_BYTES)
    computed = crc32c.crc32c(record[:want - TRAILER_BYTES])  # a view: no copy
    if stored != computed:
        raise KvtierError(grpc.StatusCode.DATA_LOSS,
                          f"block checksum mismatch: stored {stored:08x}, computed {computed:08x}")
    if layout is not None:
        mismatch = None
        if layout_id != layout.layout_id:
            mismatch = f"block has layout id {layout_id:016x}, expected {layout.layout_id:016x}"
        elif (codec, tokens, latent, rope) != (layout.codec, layout.tokens_per_block, layout.kv_lora_rank,
                                               layout.rope_dim):
            mismatch = "block's codec or shape differs from the layout's"
        elif first + count > layout.num_layers:
            mismatch = f"block holds layers [{first}, {first + count}), layout has {layout.num_layers}"
        if mismatch:
            raise KvtierError(grpc.StatusCode.FAILED_PRECONDITION, mismatch)
    payloads = tuple(record[HEADER_BYTES + i * per:HEADER_BYTES + (i + 1) * per] for i in range(count))
    return Record(codec, layout_id, tokens, first, count, latent, rope, payloads)
