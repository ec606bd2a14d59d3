"""How latent blocks are laid out, and the layout id that fingerprints it.

The id is the first 8 bytes (little-endian) of SHA-256 over
"kvtier.layout.v1" || u32 len(model_id) || model_id || u32 num_layers ||
u32 kv_lora_rank || u32 rope_dim || u32 tokens_per_block || u32 codec ||
u32 block_format_version, then, for a layout with indexer keys
(DeepSeek-V3.2, V4), u32 indexer_dim || u32 indexer_encoding, then, for a
DeepSeek-V4 layout, u32 len(compress_ratios) || u32 each ratio || u32
sliding_window (docs/protocol.md, "Layouts and the layout id").
"""
import dataclasses
import hashlib
import json
import pathlib
import struct

from kvtier.v1 import layout_pb2

# Block format 1 holds latents alone; 2 adds each layer's indexer keys; 3
# is DeepSeek-V4's blocks and restore points.
BLOCK_FORMAT_VERSION, INDEXED_BLOCK_FORMAT_VERSION, V4_BLOCK_FORMAT_VERSION = 1, 2, 3
# How a block carries indexer keys (kvtier.v1.IndexerEncoding): none; per
# layer [tokens][dim] e4m3fn codes then [tokens] f32 scales (V3.2); or
# DeepSeek-V4's MXFP4 keys, dim / 2 bytes of E2M1 codes and dim / 32 E8M0
# scales each.
INDEXER_NONE, INDEXER_FP8, INDEXER_MXFP4 = 0, 1, 2
MAX_INDEXER_DIM = 4096
MAX_BLOCK_TOKENS = 4096


def indexer_part_bytes(encoding, tokens, dim):
    """Bytes of one layer's indexer keys for `tokens` tokens (0 without)."""
    if encoding == INDEXER_FP8:
        return tokens * (dim + 4)
    return tokens * (dim // 2 + dim // 32) if encoding == INDEXER_MXFP4 else 0

# Codec numbers: the codec byte of a record and kvtier.v1.KvCodec.
BF16, FP8, INT8, INT4 = 1, 2, 3, 4
CODECS = {"bf16": BF16, "fp8": FP8, "int8": INT8, "int4": INT4}
CODEC_NAMES = {number: name for name, number in CODECS.items()}


def codec_number(codec):
    """A codec given as its name ("int8") or number (3), as its number."""
    if isinstance(codec, str):
        if codec not in CODECS:
            raise ValueError(f"unknown codec {codec!r}; one of {sorted(CODECS)}")
        return CODECS[codec]
    if codec not in CODEC_NAMES:
        raise ValueError(f"unknown codec number {codec}")
    return int(codec)


@dataclasses.dataclass(frozen=True)
class LatentLayout:
    """Everything that changes the bytes of a block (kvtier.v1.LatentLayout)."""
    model_id: str
    num_layers: int
    kv_lora_rank: int = 512
    rope_dim: int = 64
    tokens_per_block: int = 64
    codec: int = INT8
    # None: the version the layout's blocks have (2 with indexer keys, else 1).
    block_format_version: int = None
    # DeepSeek-V3.2: each token's indexer key (dim and INDEXER_FP8) beside
    # its latent in every layer.
    indexer_dim: int = 0
    indexer_encoding: int = INDEXER_NONE
    # DeepSeek-V4 (format 3): each layer's compress ratio (0: window only)
    # and the sliding window; kv_lora_rank is then the entries' head_dim,
    # rope_dim their rotated dims, codec FP8 (the model's own entries), and
    # the indexer INDEXER_MXFP4 where a layer has ratio 4.
    compress_ratios: tuple = ()
    sliding_window: int = 0

    def __post_init__(self):
        object.__setattr__(self, "codec", codec_number(self.codec))
        if not 1 <= len(self.model_id.encode()) <= 256:
            raise ValueError("model_id must be 1..256 bytes")
        for name in ("num_layers", "kv_lora_rank", "tokens_per_block"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.indexer_encoding not in (INDEXER_NONE, INDEXER_FP8, INDEXER_MXFP4):
            raise ValueError(f"unknown indexer_encoding {self.indexer_encoding}")
        if (self.indexer_encoding == INDEXER_NONE) != (self.indexer_dim == 0) or not \
                0 <= self.indexer_dim <= MAX_INDEXER_DIM:
            raise ValueError("indexer_dim and indexer_encoding: both unset or both set, the dim at most "
                             f"{MAX_INDEXER_DIM}")
        object.__setattr__(self, "compress_ratios", tuple(int(r) for r in self.compress_ratios))
        if self.compress_ratios:
            self._check_v4()
            return
        if self.sliding_window or self.indexer_encoding == INDEXER_MXFP4:
            raise ValueError("sliding_window and MXFP4 indexer keys belong to DeepSeek-V4 layouts "
                             "(compress_ratios set)")
        version = INDEXED_BLOCK_FORMAT_VERSION if self.indexer_dim else BLOCK_FORMAT_VERSION
        if self.block_format_version is None:
            object.__setattr__(self, "block_format_version", version)
        elif self.block_format_version != version:
            raise ValueError(f"block_format_version {self.block_format_version}: blocks "
                             f"{'with' if self.indexer_dim else 'without'} indexer keys are format {version}")

    def _check_v4(self):
        if self.block_format_version is None:
            object.__setattr__(self, "block_format_version", V4_BLOCK_FORMAT_VERSION)
        elif self.block_format_version != V4_BLOCK_FORMAT_VERSION:
            raise ValueError(f"block_format_version {self.block_format_version}: DeepSeek-V4 layouts are format "
                             f"{V4_BLOCK_FORMAT_VERSION}")
        if len(self.compress_ratios) != self.num_layers:
            raise ValueError(f"compress_ratios has {len(self.compress_ratios)} entries for {self.num_layers} layers")
        for r in self.compress_ratios:
            if r < 0 or r > self.tokens_per_block or (r and self.tokens_per_block % r):
                raise ValueError(f"compress_ratios: {r} does not divide tokens_per_block {self.tokens_per_block}")
        if not 1 <= self.sliding_window <= MAX_BLOCK_TOKENS:
            raise ValueError(f"sliding_window {self.sliding_window} outside 1..{MAX_BLOCK_TOKENS}")
        if self.codec != FP8 or not 0 <= self.rope_dim < self.kv_lora_rank or (self.kv_lora_rank - self.rope_dim) % 64:
            raise ValueError("DeepSeek-V4 entries are the model's FP8 (codec fp8) of head_dim kv_lora_rank; "
                             "its dims other than rope_dim must be whole blocks of 64")
        csa = 4 in self.compress_ratios
        if csa != (self.indexer_encoding == INDEXER_MXFP4) or (csa and self.indexer_dim % 32):
            raise ValueError("a DeepSeek-V4 layout with ratio-4 layers keeps MXFP4 indexer keys (dim a multiple "
                             "of 32), one without them none")
        if max(self.v4_block_bytes(), self.v4_restore_point_bytes(self.sliding_window)) > 0xFFFFFFFF:
            raise ValueError("a DeepSeek-V4 block or restore point of this layout does not fit a record "
                             "(at most 4 GiB - 1 bytes)")

    @property
    def dim(self):
        return self.kv_lora_rank + self.rope_dim

    @property
    def is_v4(self):
        return bool(self.compress_ratios)

    def v4_block_bytes(self):
        """A DeepSeek-V4 block's payload: per layer its closed groups'
        entries and, on ratio-4 layers, their indexer keys."""
        entry, key = self._v4_entry_and_key()
        return sum(self.tokens_per_block // r * (entry + (key if r == 4 else 0)) for r in self.compress_ratios if r)

    def v4_restore_point_bytes(self, boundary):
        """A DeepSeek-V4 restore point's payload after `boundary` tokens: 8
        bytes of boundary, per layer the window's entries before it and, on
        ratio-4 layers, both compressors' 4 + 4 float32 rows."""
        entry, _ = self._v4_entry_and_key()
        rows = 4 * 2 * 4 * (self.kv_lora_rank + self.indexer_dim)
        return 8 + sum(min(self.sliding_window, boundary) * entry + (rows if r == 4 else 0)
                       for r in self.compress_ratios)

    def _v4_entry_and_key(self):
        plain = self.kv_lora_rank - self.rope_dim
        return plain + plain // 64 + 2 * self.rope_dim + 1, self.indexer_dim // 2 + self.indexer_dim // 32

    @property
    def indexer_part_bytes(self):
        """Bytes of one layer's indexer keys in one block (0 without them)."""
        return indexer_part_bytes(self.indexer_encoding, self.tokens_per_block, self.indexer_dim)

    @property
    def layout_id(self):
        model = self.model_id.encode()
        canonical = b"kvtier.layout.v1" + struct.pack("<I", len(model)) + model + struct.pack(
            "<IIIIII", self.num_layers, self.kv_lora_rank, self.rope_dim, self.tokens_per_block, self.codec,
            self.block_format_version)
        if self.indexer_encoding != INDEXER_NONE:  # format 1 layouts keep their ids
            canonical += struct.pack("<II", self.indexer_dim, self.indexer_encoding)
        if self.compress_ratios:  # and format 2 ones theirs
            canonical += struct.pack(f"<I{len(self.compress_ratios)}II", len(self.compress_ratios),
                                     *self.compress_ratios, self.sliding_window)
        return struct.unpack("<Q", hashlib.sha256(canonical).digest()[:8])[0]

    def to_proto(self):
        return layout_pb2.LatentLayout(model_id=self.model_id, num_layers=self.num_layers,
                                       kv_lora_rank=self.kv_lora_rank, rope_dim=self.rope_dim,
                                       tokens_per_block=self.tokens_per_block, codec=self.codec,
                                       block_format_version=self.block_format_version, layout_id=self.layout_id,
                                       indexer_dim=self.indexer_dim, indexer_encoding=self.indexer_encoding,
                                       compress_ratios=self.compress_ratios, sliding_window=self.sliding_window)

    @classmethod
    def from_proto(cls, p):
        return cls(model_id=p.model_id, num_layers=p.num_layers, kv_lora_rank=p.kv_lora_rank, rope_dim=p.rope_dim,
                   tokens_per_block=p.tokens_per_block, codec=p.codec, block_format_version=p.block_format_version,
                   indexer_dim=p.indexer_dim, indexer_encoding=p.indexer_encoding,
                   compress_ratios=tuple(p.compress_ratios), sliding_window=p.sliding_window)


def model_id_of(checkpoint_dir):
    """The model_id kvtier's servers derive from a checkpoint directory:
    config.json's model_type ("deepseek_v2", "deepseek_v3", "kimi_k2",
    "deepseek_v32"), "-",
    and 16 hex digits of SHA-256 over, for config.json and then each
    *.safetensors file by name: "NAME:SIZE:", its first MiB, and its last
    MiB (what follows the first, for files under 2 MiB)."""
    d = pathlib.Path(checkpoint_dir)
    model_type = json.loads((d / "config.json").read_text())["model_type"]
    files = [d / "config.json"] + sorted(d.glob("*.safetensors"), key=lambda p: p.name.encode())
    edge = 1 << 20
    digest = hashlib.sha256()
    for path in files:
        size = path.stat().st_size
        with open(path, "rb") as f:
            digest.update(f"{path.name}:{size}:".encode())
            digest.update(f.read(edge))
            if size > edge:
                tail = min(size - edge, edge)
                f.seek(size - tail)
                digest.update(f.read(tail))
    return model_type + "-" + digest.hexdigest()[:16]
